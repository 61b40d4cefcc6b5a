//! The side effect's state in the record: claims with a fencing token (taken by
//! [`Operation::claim`], which reads the whole record: `record/mod.rs`), attempts, retries,
//! parking, the operator's retry and redelivery, and the values the gate's answers report it
//! by ([`EffectReport`]; which one applies reads the whole record: `record/mod.rs`).
//!
//! Guarantees (docs/DESIGN.md, invariant 2): a claim carries a token that only grows, and only
//! the holder of the current token may finish it; a failed attempt never marks done; a done
//! effect is sent again only as a new generation an operator asked for.

use serde::{Deserialize, Serialize};

use crate::operation::alert::AlertKind;
use crate::operation::record::{is_zero, Operation, OperatorNote, OperatorRefusal};
use crate::retry::item::{apply, Item, Policy};
use crate::retry::{AttemptOutcome, Backoff, Heard, Next, Run};

/// Where a side effect stands when the gate answers. The gate never runs an attempt while a
/// command waits: every attempt runs from its alarm (one runner), so an answer never waits on
/// the destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EffectReport {
    /// Nothing owed (not terminal, or forgotten).
    NotOwed,
    /// Owed and due: the alarm that runs it is durably set.
    Scheduled,
    /// Accepted downstream (by an earlier attempt).
    Delivered,
    /// An attempt failed; the next is durably scheduled after its backoff.
    RetryScheduled,
    /// The destination refused for good.
    Parked,
    /// An attempt holds a live claim.
    InFlight,
}

/// What the destination's desk queued ([`Operation::wait_on_desk`]): the job's effect, or the
/// batch's results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queued {
    Effect,
    Results,
}

/// A held claim on the side effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// Fencing token: strictly greater than every token issued before for this operation.
    pub token: u64,
    pub expires_ms: i64,
    /// The generation it was taken for: a lapsed claim's 2xx marks done only its own
    /// generation, never a newer redelivery (0 in claims stored before it was kept).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: u32,
}

/// A side effect the destination refused for good.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Parked {
    pub at_ms: i64,
    /// The destination's answer, e.g. `400: bad request`.
    pub answer: String,
}

/// Where the side effect stands.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Effect {
    pub(super) done: bool,
    pub(super) done_at_ms: Option<i64>,
    pub(super) parked: Option<Parked>,
    /// Attempts started so far, across all generations.
    pub(super) attempts: u32,
    /// Attempts started in the current generation; drives the backoff.
    pub(super) failures_in_row: u32,
    /// 1 unless an operator asked for a deliberate redelivery.
    pub(super) generation: u32,
    /// The last fencing token issued.
    pub(super) fence: u64,
    pub(super) claim: Option<Claim>,
    /// Not before this time (Unix ms) may the next attempt start.
    pub(super) next_attempt_ms: i64,
    pub(super) last_error: Option<String>,
    /// Where the effect stands with its destination's desk, off the happy path only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) desk: Option<DeskMark>,
}

/// An effect's standing with its destination's desk (`src/destination/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "desk", rename_all = "snake_case")]
pub enum DeskMark {
    /// The desk queued it (the destination is open, over its pace, or `paused` by hand) and
    /// will make it due; until then `next_attempt_ms` is a far fallback, in case the desk is
    /// lost. While a pause holds it, it is not failing: no `effect_failing` alert is raised.
    Waiting {
        since_ms: i64,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        paused: bool,
    },
    /// The desk released it: its next attempt goes without asking, and reports back.
    Released { probe: bool },
}

impl Effect {
    /// The side effect reached its destination (this generation).
    pub fn done(&self) -> bool {
        self.done
    }

    pub fn done_at_ms(&self) -> Option<i64> {
        self.done_at_ms
    }

    /// Refused for good, and why.
    pub fn parked(&self) -> Option<&Parked> {
        self.parked.as_ref()
    }

    /// Attempts started so far, across all generations.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Attempts started in the current generation.
    pub fn failures_in_row(&self) -> u32 {
        self.failures_in_row
    }

    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// The last fencing token issued.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    pub fn claim(&self) -> Option<Claim> {
        self.claim
    }

    /// Not before this time may the next attempt start.
    pub fn next_attempt_ms(&self) -> i64 {
        self.next_attempt_ms
    }

    /// Its standing with its destination's desk, if it has one.
    pub fn desk(&self) -> Option<DeskMark> {
        self.desk
    }

    /// The desk released it, and no run has spent the release yet.
    pub fn released(&self) -> bool {
        matches!(self.desk, Some(DeskMark::Released { .. }))
    }
}

/// What [`Operation::finish_attempt`] did with an attempt's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finished {
    Done,
    RetryAt(i64),
    Parked,
    /// The token is no longer current: another attempt took over; nothing was changed.
    Fenced,
    /// The token is no longer current, but the answer was a 2xx for the current generation:
    /// the destination has this generation's effect, so it is done (a newer claim of the same
    /// generation still in flight carries the same `webhook-id`, a repeat a receiver drops).
    LateDone,
}

/// The job's effect as the item its attempt sent ([`apply`]). Its attempts count from its
/// claims, so a lapsed claim backs off too (a result's count at its answer: a chunk cut short
/// is sent again at once under its ids). It keeps no failing clock: its `effect_failing` comes
/// from the pass, which dates it from settlement (the ledger has no failure time).
struct Attempted<'a>(&'a mut Operation);

impl Item for Attempted<'_> {
    fn run(&self) -> Run {
        let attempts = self.0.effect.failures_in_row;
        Run {
            attempts,
            ..Run::default()
        }
    }

    fn delivered(&mut self, now_ms: i64) {
        self.0.mark_done(now_ms);
    }

    fn retry_at(&mut self, at_ms: i64, _failing_since_ms: Option<i64>, why: &str) {
        self.0.effect.last_error = Some(why.to_string());
        self.0.effect.next_attempt_ms = at_ms;
    }

    fn park(&mut self, why: &str, now_ms: i64) {
        self.0.effect.last_error = Some(why.to_string());
        let answer = why.to_string();
        self.0.effect.parked = Some(Parked {
            at_ms: now_ms,
            answer,
        });
    }
}

impl Operation {
    /// The destination's desk queued the effect (or the batch's results: `queued`): it waits
    /// for the desk's release, or for `fallback_ms` (so a lost desk never strands it), its
    /// own due time moved (the effect's retry, or the results' due time: never the other's),
    /// since it first waited, and a pause's wait (`paused`) is no failure
    /// ([`Operation::held_by_pause`]). False, and nothing changes, when it is not owed (the
    /// results not running), an attempt holds a live claim (the desk's answer came too late to
    /// matter), or a release is marked: the desk released it while its `Wait` travelled back
    /// (an attempt that asked never holds a release), so the release is newer and stands.
    pub fn wait_on_desk(
        &mut self,
        queued: Queued,
        now: i64,
        fallback_ms: i64,
        paused: bool,
    ) -> bool {
        let results_due = self.results_due_ms();
        let waitable = match queued {
            Queued::Effect => {
                self.effect_owed() && self.effect.claim.is_none_or(|c| c.expires_ms <= now)
            }
            Queued::Results => results_due.is_some(),
        };
        let since_ms = match self.effect.desk {
            _ if !waitable => return false,
            Some(DeskMark::Released { .. }) => return false,
            Some(DeskMark::Waiting { since_ms, .. }) => since_ms,
            None => now,
        };
        self.effect.desk = Some(DeskMark::Waiting { since_ms, paused });
        let fallback = now + fallback_ms;
        match queued {
            // A lapsed claim (its attempt died before it committed) ends here. Kept, its
            // expiry, now past, would stay the gate's wake time (`wake_at_ms` follows a claim
            // first) and fire the alarm again and again, doing nothing, for as long as the wait
            // lasts. Its late answer is fenced as if the next claim had replaced it
            // (`finish_attempt`).
            Queued::Effect => {
                self.effect.claim = None;
                self.effect.next_attempt_ms = self.effect.next_attempt_ms.max(fallback);
            }
            Queued::Results => self.results_due_ms = results_due.map(|due| due.max(fallback)),
        }
        // The version moves for the wait, and once more for a pause's (as it always has).
        self.changed();
        if paused {
            self.changed();
        }
        true
    }

    /// Whether its destination's pause holds the effect (or the batch's results): they
    /// wait without attempts, and `effect_failing` is not raised.
    pub fn held_by_pause(&self) -> bool {
        matches!(
            self.effect.desk,
            Some(DeskMark::Waiting { paused: true, .. })
        )
    }

    /// The destination's desk released the effect: due now, same generation and
    /// `webhook-id`. False when nothing is owed any more (the desk drops the key). A batch's
    /// results take the same release: their own due time moves too.
    pub fn destination_ready(&mut self, probe: bool, now_ms: i64) -> bool {
        let results = self.results_due_ms();
        if !self.effect_owed() && results.is_none() {
            return false;
        }
        self.effect.desk = Some(DeskMark::Released { probe });
        if self.effect_owed() {
            self.effect.next_attempt_ms = self.effect.next_attempt_ms.min(now_ms);
        }
        if let Some(due) = results {
            self.results_due_ms = Some(due.min(now_ms));
        }
        self.changed();
        true
    }

    /// Applies the answer `heard` to the attempt under `claim` ([`apply`], the job's backoff
    /// `backoff`; a job's effect is never given up: invariant 3): done, a retry at its time, or
    /// parked. An answer under a token no longer current is discarded, unless it is a 2xx for
    /// the generation still owed, which the destination now has (`Finished::LateDone`). The
    /// newer claim (if any) is left as it is; its own answer then changes nothing.
    pub fn finish_attempt(
        &mut self,
        claim: &Claim,
        heard: Heard,
        backoff: Backoff,
        now_ms: i64,
        jitter: f64,
    ) -> Finished {
        let delivered = matches!(heard, Heard::Answer(AttemptOutcome::Delivered, _));
        if self.effect.claim.is_none_or(|c| c.token != claim.token) {
            let current = claim.generation != 0 && claim.generation == self.effect.generation;
            if !delivered || !current || !self.effect_owed() {
                return Finished::Fenced;
            }
            self.effect.desk = None;
            self.mark_done(now_ms);
            self.changed();
            return Finished::LateDone;
        }
        if self.effect.done {
            // A lapsed claim's 2xx already marked this generation done: a later answer under
            // the newer claim (a failure included) changes nothing.
            return Finished::Fenced;
        }
        self.effect.claim = None;
        self.changed();
        let policy = Policy {
            backoff,
            give_up_after_ms: None,
        };
        match apply(&mut Attempted(self), heard, policy, now_ms, jitter) {
            Next::Delivered => Finished::Done,
            Next::RetryAt { at_ms, .. } => Finished::RetryAt(at_ms),
            Next::Park(_) | Next::GaveUp { .. } => Finished::Parked,
        }
    }

    fn mark_done(&mut self, now_ms: i64) {
        self.effect.done = true;
        self.effect.done_at_ms = Some(now_ms);
        self.effect.last_error = None;
        self.resolve_alert(AlertKind::EffectFailing, now_ms);
    }

    /// Starts a deliberate redelivery of a done effect: a new generation (so `webhook-id` and
    /// `effect-generation` change and a Standard Webhooks receiver does not drop it as a
    /// duplicate; `idempotency-key` stays the key), due now. An effect not yet done is never
    /// given a new generation (its last attempt may have arrived): see [`Operation::retry_now`].
    pub fn redeliver(&mut self, now_ms: i64, reason: &str) -> Result<u32, OperatorRefusal> {
        self.refuse_untracked()?;
        if !self.status.is_terminal() {
            return Err(OperatorRefusal::NotTerminal);
        }
        if !self.effect.done {
            return Err(OperatorRefusal::NotDone);
        }
        self.next_generation(now_ms);
        self.notes.redeliveries.push(OperatorNote {
            at_ms: now_ms,
            reason: reason.to_string(),
        });
        Ok(self.effect.generation)
    }

    /// A new generation of the side effect, due now: a new `webhook-id` (and
    /// `effect-generation`) for a body that is not the one sent before, whether the previous
    /// generation was done, failing or parked. A live claim belongs to the previous
    /// generation; its commit is fenced off (a late 2xx of it marks nothing done).
    pub(super) fn next_generation(&mut self, now_ms: i64) {
        self.effect.generation += 1;
        self.effect.done = false;
        self.effect.done_at_ms = None;
        self.effect.parked = None;
        self.effect.failures_in_row = 0;
        self.effect.next_attempt_ms = now_ms;
        self.effect.last_error = None;
        self.effect.desk = None;
        self.effect.claim = None;
        self.rearm_alert(AlertKind::EffectFailing);
        self.changed();
    }

    /// Whether the side effect was sent at or after `cutoff_ms` (a bulk redelivery run's
    /// cut-off): accepted by its destination then (this generation's `done_at_ms`), or
    /// redelivered then (the newest redelivery's time, which a redelivery not yet accepted
    /// also has).
    pub fn sent_since(&self, cutoff_ms: i64) -> bool {
        let redelivered = self.notes.redeliveries.last().map(|r| r.at_ms);
        let sent = self.effect.done_at_ms.max(redelivered);
        sent.is_some_and(|at| at >= cutoff_ms)
    }

    /// The operator's "retry now" on an effect not yet done: the same generation (so the same
    /// `webhook-id`: an attempt that timed out on our side may have reached the destination,
    /// which then drops the repeat), due now, un-parked. Refused while an attempt holds a
    /// live claim, for a done effect (that is a deliberate redelivery), and while the effect
    /// waits for its batch's results (it is built once they settle, and nothing would go).
    pub fn retry_now(&mut self, now_ms: i64) -> Result<(), OperatorRefusal> {
        self.refuse_untracked()?;
        if !self.status.is_terminal() {
            return Err(OperatorRefusal::NotTerminal);
        }
        if self.effect.done {
            return Err(OperatorRefusal::AlreadyDone);
        }
        if self.results_owed() {
            return Err(OperatorRefusal::ResultsOwed);
        }
        if self.effect.claim.is_some_and(|c| c.expires_ms > now_ms) {
            return Err(OperatorRefusal::InFlight);
        }
        self.effect.parked = None;
        self.effect.failures_in_row = 0;
        self.effect.next_attempt_ms = now_ms;
        self.effect.desk = None;
        self.rearm_alert(AlertKind::EffectFailing);
        self.changed();
        Ok(())
    }
}

#[cfg(test)]
impl Operation {
    /// A test's shorthand: finishes the attempt under `claim` with the answer that decides
    /// `next` ([`Operation::finish_attempt`]; a retry's whole wait is its backoff's step).
    pub fn finish(&mut self, claim: &Claim, next: &Next, now_ms: i64) -> Finished {
        let (outcome, wait) = match next {
            Next::Delivered => (AttemptOutcome::Delivered, 0),
            Next::RetryAt { at_ms, why, .. } => {
                (AttemptOutcome::Retry(why.clone()), at_ms - now_ms)
            }
            Next::Park(why) | Next::GaveUp { why, .. } => (AttemptOutcome::Park(why.clone()), 0),
        };
        let heard = Heard::Answer(&outcome, None);
        self.finish_attempt(claim, heard, Backoff::new(wait, wait), now_ms, 1.0)
    }
}
