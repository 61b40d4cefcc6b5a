//! The operation record the gate keeps, and every transition it may make.
//!
//! Guarantees (ARCHITECTURE.md, invariants 2 and 3): state changes only through
//! [`Operation::apply`], which asks the pure reducer; a terminal outcome's side effect is
//! claimed with a TTL and a fencing token that only grows, and only the holder of the current
//! token may finish it; a failed attempt never marks done, it schedules the next attempt with
//! capped exponential backoff; a refusal the destination will repeat parks the effect instead
//! of retrying forever. Reaching a terminal state (`status`) and finishing its side effect
//! (`effect.done`) are separate facts. Time and jitter are parameters; nothing here does I/O.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::effect::normalize_details;
use crate::lifecycle::{reduce, Position, Source, Status, Verdict};
use crate::stats::{hour_of, StatEvent};
use crate::timestamp::format_rfc3339;

/// One piece of news about an operation, from any path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpEvent {
    pub status: Status,
    /// Server update time in Unix ms; 0 when the server gave none (it then loses ties).
    pub update_time_ms: i64,
    pub source: Source,
    /// Output file, error code and message, user metadata: carried to the side effect.
    #[serde(default)]
    pub details: Map<String, Value>,
    /// The `webhook-id` of the delivery that carried it, for the history.
    #[serde(default)]
    pub delivery_id: Option<String>,
}

/// A held claim on the side effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// Fencing token: strictly greater than every token issued before for this operation.
    pub token: u64,
    pub expires_ms: i64,
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
    pub done: bool,
    pub done_at_ms: Option<i64>,
    pub parked: Option<Parked>,
    /// Attempts started so far, across all generations.
    pub attempts: u32,
    /// Attempts started in the current generation; drives the backoff.
    pub failures_in_row: u32,
    /// 1 unless an operator asked for a deliberate redelivery.
    pub generation: u32,
    /// The last fencing token issued.
    pub fence: u64,
    pub claim: Option<Claim>,
    /// Not before this time (Unix ms) may the next attempt start.
    pub next_attempt_ms: i64,
    pub last_error: Option<String>,
}

/// When and why an operator acted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorNote {
    pub at_ms: i64,
    pub reason: String,
}

/// Why an operator's command was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperatorRefusal {
    /// Redelivery needs a terminal state: there is no outcome to deliver yet.
    NotTerminal,
    /// The operation was forgotten.
    Forgotten,
}

/// How one side-effect attempt ended, as the runner saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// A 2xx answer.
    Delivered,
    /// Worth retrying: timeout, network error, 5xx, 408, 409, 429.
    Retry(String),
    /// The destination will refuse again: any other answer.
    Park(String),
}

/// What [`Operation::finish`] did with an attempt's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finished {
    Done,
    RetryAt(i64),
    Parked,
    /// The token is no longer current: another attempt took over; nothing was changed.
    Fenced,
}

/// The record the gate keeps for one operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Operation {
    pub key: String,
    pub name: String,
    pub kind: Option<String>,
    pub status: Status,
    pub update_time_ms: i64,
    /// Bumped on every change; the ledger projection follows it.
    pub version: u64,
    /// True when registered through the admin API, false when a completion created it.
    pub registered: bool,
    pub submitted_at_ms: i64,
    pub settled_at_ms: Option<i64>,
    pub settled_by: Option<Source>,
    pub details: Map<String, Value>,
    pub effect: Effect,
    /// Alert kinds already sent (`stuck`, `unknown_to_gemini`, `effect_failing`).
    #[serde(default)]
    pub alerts: Vec<String>,
    /// Set when an operator stopped tracking the operation: no more polling, alerts or
    /// side-effect attempts; the record stays for the retention period.
    #[serde(default)]
    pub forgotten: Option<OperatorNote>,
    /// Deliberate redeliveries an operator asked for, newest last.
    #[serde(default)]
    pub redeliveries: Vec<OperatorNote>,
    /// Counted events not yet flushed to a stats shard, and the last sequence issued.
    #[serde(default)]
    pub pending_stats: Vec<StatEvent>,
    #[serde(default)]
    pub stats_seq: u64,
    /// Events up to this sequence may be on their way to a shard: they are never changed
    /// again, so a count is merged only into a newer event (see [`Operation::count`]).
    #[serde(default)]
    pub stats_sealed_seq: u64,
    /// The version last written to the KV ledger, and when.
    #[serde(default)]
    pub projected_version: u64,
    #[serde(default)]
    pub projected_at_ms: i64,
}

impl Operation {
    /// A newly registered, pending operation.
    pub fn register(key: &str, name: &str, kind: Option<String>, now_ms: i64) -> Operation {
        Operation {
            key: key.to_string(),
            name: name.to_string(),
            kind,
            status: Status::Pending,
            update_time_ms: 0,
            version: 1,
            registered: true,
            submitted_at_ms: now_ms,
            settled_at_ms: None,
            settled_by: None,
            details: Map::new(),
            effect: Effect {
                generation: 1,
                ..Effect::default()
            },
            alerts: Vec::new(),
            forgotten: None,
            redeliveries: Vec::new(),
            pending_stats: Vec::new(),
            stats_seq: 0,
            stats_sealed_seq: 0,
            projected_version: 0,
            projected_at_ms: 0,
        }
    }

    /// An operation first heard of through its completion (it was never registered).
    pub fn unregistered(key: &str, name: &str, now_ms: i64) -> Operation {
        Operation {
            registered: false,
            ..Operation::register(key, name, None, now_ms)
        }
    }

    fn position(&self) -> Position {
        Position {
            status: self.status.clone(),
            update_time_ms: self.update_time_ms,
        }
    }

    /// Offers `event` to the reducer and applies it if the reducer allows.
    pub fn apply(&mut self, event: &OpEvent, now_ms: i64) -> Verdict {
        let incoming = Position {
            status: event.status.clone(),
            update_time_ms: event.update_time_ms,
        };
        let verdict = reduce(&self.position(), &incoming);
        if verdict == Verdict::Apply {
            self.status = event.status.clone();
            self.update_time_ms = event.update_time_ms;
            if self.status.is_terminal() {
                self.settled_at_ms = Some(now_ms);
                self.settled_by = Some(event.source);
                // Whatever path (or version) built the event, the record keeps one shape.
                self.details = normalize_details(&event.details);
                self.effect.next_attempt_ms = now_ms;
            }
            self.version += 1;
        }
        verdict
    }

    /// True when the side effect still has to run (terminal, not done, not parked).
    pub fn effect_owed(&self) -> bool {
        self.status.is_terminal()
            && !self.effect.done
            && self.effect.parked.is_none()
            && self.forgotten.is_none()
    }

    /// True when nothing can change the operation any more: terminal (which absorbs every
    /// later event) and its side effect done, parked or given up by an operator. Only a
    /// redelivery asked by an operator moves it again.
    pub fn is_settled(&self) -> bool {
        self.status.is_terminal() && !self.effect_owed()
    }

    /// Claims the side effect if it is owed, due, and not held by a live claim.
    pub fn claim(&mut self, now_ms: i64, ttl_ms: i64) -> Option<Claim> {
        if !self.effect_owed() || now_ms < self.effect.next_attempt_ms {
            return None;
        }
        if matches!(self.effect.claim, Some(c) if c.expires_ms > now_ms) {
            return None;
        }
        self.effect.fence += 1;
        let claim = Claim {
            token: self.effect.fence,
            expires_ms: now_ms + ttl_ms,
        };
        self.effect.claim = Some(claim);
        self.effect.attempts += 1;
        self.effect.failures_in_row += 1;
        self.version += 1;
        Some(claim)
    }

    /// Records how the attempt under `token` ended. `backoff_ms` is the wait before the next
    /// attempt should this one have failed (see [`backoff_ms`]).
    pub fn finish(
        &mut self,
        token: u64,
        outcome: &AttemptOutcome,
        now_ms: i64,
        backoff_ms: i64,
    ) -> Finished {
        match self.effect.claim {
            Some(c) if c.token == token => {}
            _ => return Finished::Fenced,
        }
        self.effect.claim = None;
        self.version += 1;
        match outcome {
            AttemptOutcome::Delivered => {
                self.effect.done = true;
                self.effect.done_at_ms = Some(now_ms);
                self.effect.last_error = None;
                Finished::Done
            }
            AttemptOutcome::Retry(why) => {
                self.effect.last_error = Some(why.clone());
                self.effect.next_attempt_ms = now_ms + backoff_ms;
                Finished::RetryAt(self.effect.next_attempt_ms)
            }
            AttemptOutcome::Park(answer) => {
                self.effect.last_error = Some(answer.clone());
                self.effect.parked = Some(Parked {
                    at_ms: now_ms,
                    answer: answer.clone(),
                });
                Finished::Parked
            }
        }
    }

    /// Starts a deliberate redelivery: a new generation (so `webhook-id` and
    /// `effect-generation` change and a Standard Webhooks receiver does not drop it as a
    /// duplicate; `idempotency-key` stays the key), due now, un-parked.
    pub fn redeliver(&mut self, now_ms: i64, reason: &str) -> Result<u32, OperatorRefusal> {
        if self.forgotten.is_some() {
            return Err(OperatorRefusal::Forgotten);
        }
        if !self.status.is_terminal() {
            return Err(OperatorRefusal::NotTerminal);
        }
        self.effect.generation += 1;
        self.effect.done = false;
        self.effect.done_at_ms = None;
        self.effect.parked = None;
        self.effect.failures_in_row = 0;
        self.effect.next_attempt_ms = now_ms;
        self.effect.last_error = None;
        // A live claim belongs to the previous generation; its commit is fenced off.
        self.effect.claim = None;
        self.alerts.retain(|a| a != crate::alert::EFFECT_FAILING);
        self.redeliveries.push(OperatorNote {
            at_ms: now_ms,
            reason: reason.to_string(),
        });
        self.version += 1;
        Ok(self.effect.generation)
    }

    /// Stops tracking the operation (recorded, not erased). Idempotent.
    pub fn forget(&mut self, now_ms: i64, reason: &str) -> bool {
        if self.forgotten.is_some() {
            return false;
        }
        self.forgotten = Some(OperatorNote {
            at_ms: now_ms,
            reason: reason.to_string(),
        });
        self.effect.claim = None;
        self.version += 1;
        true
    }

    /// Counts an event for `/v1/stats`; it is flushed to a stats shard later. A count joins
    /// an unsealed pending event of the same name and hour, so the record stays small however
    /// many duplicates arrive between flushes (a replayed delivery can arrive hundreds of times
    /// a second); sealed events are left alone, which keeps the shard's per-sequence dedupe
    /// exact. `dropped_*` events stay one per drop: the shard lists each as a recent drop.
    pub fn count(&mut self, name: &str, now_ms: i64) {
        let sealed = self.stats_sealed_seq;
        let mergeable = !name.starts_with("dropped_");
        if let Some(event) = self.pending_stats.iter_mut().find(|e| {
            mergeable && e.seq > sealed && e.name == name && hour_of(e.at_ms) == hour_of(now_ms)
        }) {
            event.count += 1;
            return;
        }
        self.stats_seq += 1;
        self.pending_stats.push(StatEvent {
            seq: self.stats_seq,
            name: name.to_string(),
            at_ms: now_ms,
            count: 1,
        });
    }

    /// Seals the pending events before they are sent; returns the last sequence sent, if any.
    pub fn seal_stats(&mut self) -> Option<u64> {
        let last = self.pending_stats.last()?.seq;
        self.stats_sealed_seq = last;
        Some(last)
    }

    /// Forgets counted events up to `seq`, once a shard has them.
    pub fn drop_flushed_stats(&mut self, seq: u64) {
        self.pending_stats.retain(|e| e.seq > seq);
    }

    /// Records that an alert of `kind` is being sent; false if one was sent before.
    pub fn mark_alert(&mut self, kind: &str) -> bool {
        if self.alerts.iter().any(|a| a == kind) {
            return false;
        }
        self.alerts.push(kind.to_string());
        self.version += 1;
        true
    }

    /// Withdraws the mark of an alert whose sending failed, so the next pass tries again.
    pub fn unmark_alert(&mut self, kind: &str) {
        let before = self.alerts.len();
        self.alerts.retain(|a| a != kind);
        if self.alerts.len() != before {
            self.version += 1;
        }
    }

    /// True once nothing more will happen: terminal, and its side effect done or parked.
    pub fn is_closed(&self) -> bool {
        self.forgotten.is_some()
            || (self.status.is_terminal() && (self.effect.done || self.effect.parked.is_some()))
    }

    /// When the gate's storage may be dropped: retention after the operation closed.
    pub fn expires_at_ms(&self, retention_ms: i64) -> Option<i64> {
        if !self.is_closed() {
            return None;
        }
        let closed = self
            .forgotten
            .as_ref()
            .map(|f| f.at_ms)
            .or(self.effect.done_at_ms)
            .or(self.effect.parked.as_ref().map(|p| p.at_ms))?;
        Some(closed + retention_ms)
    }

    /// When the gate must wake next: a lapsed claim, a due retry, a deferred projection,
    /// counted events to flush (`stats_delay_ms` after the oldest, so a burst of duplicates
    /// is flushed as one) or the end of retention. `None` when nothing is pending.
    ///
    /// While a claim is held, the projection and the flush wait: the attempt commits within
    /// the effect timeout and changes the record again, and the commit sets the alarm, so a
    /// first delivery costs one alarm, one ledger write and one shard call, not two of each.
    /// If the attempt never commits, the claim's expiry wakes the gate and they follow.
    pub fn wake_at_ms(&self, retention_ms: i64, stats_delay_ms: i64) -> Option<i64> {
        let mut times = Vec::new();
        if let Some(c) = self.effect.claim {
            times.push(c.expires_ms);
        } else {
            if self.effect_owed() {
                times.push(self.effect.next_attempt_ms);
            }
            if self.projected_version < self.version {
                times.push(self.projected_at_ms + PROJECTION_SPACING_MS);
            }
            if let Some(first) = self.pending_stats.first() {
                times.push(first.at_ms + stats_delay_ms);
            }
        }
        times.extend(self.expires_at_ms(retention_ms));
        times.into_iter().min()
    }

    /// The public JSON view (admin API, ledger value).
    pub fn view(&self) -> Value {
        json!({
            "key": self.key,
            "name": self.name,
            "kind": self.kind,
            "status": self.status.as_str(),
            "registered": self.registered,
            "update_time": (self.update_time_ms > 0).then(|| format_rfc3339(self.update_time_ms)),
            "submitted_at": format_rfc3339(self.submitted_at_ms),
            "settled_at": self.settled_at_ms.map(format_rfc3339),
            "settled_by": self.settled_by.map(Source::as_str),
            "effect_done": self.effect.done,
            "effect_done_at": self.effect.done_at_ms.map(format_rfc3339),
            "effect_parked": self.effect.parked.is_some(),
            "parked_answer": self.effect.parked.as_ref().map(|p| p.answer.clone()),
            "attempts": self.effect.attempts,
            "generation": self.effect.generation,
            "next_attempt_at": (self.effect_owed()).then(|| format_rfc3339(self.effect.next_attempt_ms)),
            "last_error": self.effect.last_error,
            "details": self.details,
            "alerts": self.alerts,
            "forgotten": self.forgotten.as_ref().map(|f| json!({"at": format_rfc3339(f.at_ms), "reason": f.reason})),
            "redeliveries": self.redeliveries.iter().map(|r| json!({"at": format_rfc3339(r.at_ms), "reason": r.reason})).collect::<Vec<_>>(),
            "version": self.version,
        })
    }
}

/// KV accepts one write per second to a key: projections of one operation are spaced by this.
pub const PROJECTION_SPACING_MS: i64 = 1_000;

/// Wait before attempt `failures + 1`: `base * 2^(failures - 1)`, capped, scaled by a jitter
/// factor in [0.75, 1.0] so that many operations failing together do not retry in lockstep.
/// `jitter` is a random number in [0, 1) supplied by the caller.
pub fn backoff_ms(failures: u32, base_secs: i64, max_secs: i64, jitter: f64) -> i64 {
    let exponent = failures.saturating_sub(1).min(30);
    let raw = base_secs.saturating_mul(1_i64 << exponent).min(max_secs) * 1_000;
    let factor = 0.75 + 0.25 * jitter.clamp(0.0, 1.0);
    (raw as f64 * factor) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(status: Status, t: i64) -> OpEvent {
        OpEvent {
            status,
            update_time_ms: t,
            source: Source::Webhook,
            details: Map::new(),
            delivery_id: None,
        }
    }

    fn settled() -> Operation {
        let mut op = Operation::register("batches/a", "batches/a", Some("k".into()), 1_000);
        assert_eq!(
            op.apply(&event(Status::Succeeded, 0), 2_000),
            Verdict::Apply
        );
        op
    }

    #[test]
    fn settled_means_terminal_with_nothing_owed() {
        let pending = Operation::register("batches/a", "batches/a", None, 0);
        assert!(!pending.is_settled(), "not terminal");
        let mut op = settled();
        assert!(!op.is_settled(), "terminal, effect owed");
        let c = op.claim(2_000, 600_000).unwrap();
        assert!(!op.is_settled(), "terminal, effect in flight");
        op.finish(c.token, &AttemptOutcome::Delivered, 2_500, 0);
        assert!(op.is_settled(), "terminal, effect done");
        op.redeliver(3_000, "again").unwrap();
        assert!(
            !op.is_settled(),
            "an operator's redelivery owes the effect again"
        );
        let mut parked = settled();
        let c = parked.claim(2_000, 600_000).unwrap();
        parked.finish(c.token, &AttemptOutcome::Park("410".into()), 2_500, 0);
        assert!(parked.is_settled(), "terminal, effect parked");
        let mut forgotten = settled();
        forgotten.forget(3_000, "by hand");
        assert!(forgotten.is_settled(), "terminal, given up by an operator");
    }

    #[test]
    fn terminal_event_settles_and_makes_the_effect_due() {
        let op = settled();
        assert_eq!(op.settled_at_ms, Some(2_000));
        assert_eq!(op.settled_by, Some(Source::Webhook));
        assert!(op.effect_owed());
        assert_eq!(op.effect.next_attempt_ms, 2_000);
    }

    #[test]
    fn dropped_event_changes_nothing() {
        let mut op = settled();
        let before = op.clone();
        let v = op.apply(&event(Status::Running, 99), 3_000);
        assert_ne!(v, Verdict::Apply);
        assert_eq!(op, before);
    }

    #[test]
    fn only_one_live_claim_at_a_time() {
        let mut op = settled();
        let first = op.claim(2_000, 600_000).unwrap();
        assert!(op.claim(2_001, 600_000).is_none());
        assert_eq!(first.token, 1);
    }

    #[test]
    fn lapsed_claim_can_be_taken_over_with_a_higher_token() {
        let mut op = settled();
        let first = op.claim(2_000, 1_000).unwrap();
        let second = op.claim(3_000, 1_000).unwrap();
        assert!(second.token > first.token);
        // The first holder's late answer is fenced off and changes nothing.
        let before = op.clone();
        assert_eq!(
            op.finish(first.token, &AttemptOutcome::Delivered, 3_100, 0),
            Finished::Fenced
        );
        assert_eq!(op, before);
        assert_eq!(
            op.finish(second.token, &AttemptOutcome::Delivered, 3_200, 0),
            Finished::Done
        );
        assert!(op.effect.done);
    }

    #[test]
    fn failure_never_marks_done_and_schedules_a_retry() {
        let mut op = settled();
        let c = op.claim(2_000, 600_000).unwrap();
        assert_eq!(
            op.finish(c.token, &AttemptOutcome::Retry("503".into()), 2_500, 30_000),
            Finished::RetryAt(32_500)
        );
        assert!(!op.effect.done);
        assert!(op.effect_owed());
        assert!(op.claim(10_000, 600_000).is_none(), "not due yet");
        assert!(op.claim(32_500, 600_000).is_some());
    }

    #[test]
    fn refusal_parks_and_stops_retries() {
        let mut op = settled();
        let c = op.claim(2_000, 600_000).unwrap();
        assert_eq!(
            op.finish(c.token, &AttemptOutcome::Park("400: no".into()), 2_500, 0),
            Finished::Parked
        );
        assert!(!op.effect.done);
        assert!(!op.effect_owed());
        assert!(op.is_closed());
        assert!(op.claim(9_999_999, 600_000).is_none());
    }

    #[test]
    fn non_terminal_operation_has_no_effect_to_claim() {
        let mut op = Operation::register("batches/a", "batches/a", None, 0);
        assert!(op.claim(0, 1).is_none());
        op.apply(&event(Status::Running, 5), 1);
        assert!(op.claim(1, 1).is_none());
    }

    #[test]
    fn done_effect_is_never_claimed_again() {
        let mut op = settled();
        let c = op.claim(2_000, 600_000).unwrap();
        op.finish(c.token, &AttemptOutcome::Delivered, 2_100, 0);
        assert!(op.claim(99_999_999, 600_000).is_none());
        assert_eq!(op.effect.attempts, 1);
    }

    #[test]
    fn redelivery_starts_a_new_generation_and_unparks() {
        let mut op = settled();
        let c = op.claim(2_000, 600_000).unwrap();
        op.finish(c.token, &AttemptOutcome::Park("400".into()), 2_100, 0);
        op.mark_alert(crate::alert::EFFECT_FAILING);
        assert_eq!(op.redeliver(3_000, "destination fixed"), Ok(2));
        assert!(op.effect_owed());
        assert!(op.alerts.is_empty());
        assert_eq!(op.redeliveries[0].reason, "destination fixed");
        let c2 = op.claim(3_000, 600_000).unwrap();
        assert!(c2.token > c.token);
        assert_eq!(
            op.finish(c2.token, &AttemptOutcome::Delivered, 3_100, 0),
            Finished::Done
        );
    }

    #[test]
    fn redelivery_fences_off_the_previous_generations_claim() {
        let mut op = settled();
        let old = op.claim(2_000, 600_000).unwrap();
        op.redeliver(2_500, "again").unwrap();
        assert_eq!(
            op.finish(old.token, &AttemptOutcome::Delivered, 2_600, 0),
            Finished::Fenced
        );
        assert!(!op.effect.done);
    }

    #[test]
    fn redelivery_needs_a_terminal_state() {
        let mut op = Operation::register("batches/a", "batches/a", None, 0);
        assert_eq!(op.redeliver(1, "x"), Err(OperatorRefusal::NotTerminal));
    }

    #[test]
    fn forgotten_operation_owes_nothing_and_expires() {
        let mut op = settled();
        assert!(op.forget(5_000, "duplicate job"));
        assert!(!op.forget(6_000, "again"));
        assert!(!op.effect_owed());
        assert!(op.is_closed());
        assert_eq!(op.expires_at_ms(1_000), Some(6_000));
        assert_eq!(op.redeliver(7_000, "x"), Err(OperatorRefusal::Forgotten));
    }

    #[test]
    fn alerts_are_marked_once() {
        let mut op = Operation::register("batches/a", "batches/a", None, 0);
        assert!(op.mark_alert("stuck"));
        assert!(!op.mark_alert("stuck"));
        op.unmark_alert("stuck");
        assert!(op.mark_alert("stuck"));
    }

    #[test]
    fn wake_time_follows_what_is_pending() {
        let retention = 1_000_000;
        let mut op = settled();
        op.projected_version = op.version;
        assert_eq!(op.wake_at_ms(retention, 0), Some(2_000), "effect due");
        let c = op.claim(2_000, 600_000).unwrap();
        op.count("deliveries", 2_000);
        assert_eq!(
            op.wake_at_ms(retention, 0),
            Some(602_000),
            "claim expiry: projection and flush wait for the commit"
        );
        op.finish(c.token, &AttemptOutcome::Delivered, 2_500, 0);
        assert_eq!(
            op.wake_at_ms(retention, 0),
            Some(1_000),
            "committed: projection due"
        );
        op.drop_flushed_stats(op.stats_seq);
        op.projected_version = op.version;
        assert_eq!(
            op.wake_at_ms(retention, 0),
            Some(1_002_500),
            "forget after retention"
        );
        op.projected_version = op.version - 1;
        op.projected_at_ms = 2_400;
        assert_eq!(
            op.wake_at_ms(retention, 0),
            Some(3_400),
            "deferred projection"
        );
    }

    #[test]
    fn counted_events_wake_the_gate_until_flushed() {
        let mut op = Operation::register("batches/a", "batches/a", None, 0);
        op.projected_version = op.version;
        assert_eq!(op.wake_at_ms(1, 10_000), None);
        op.count("deliveries", 50);
        op.count("duplicates_skipped", 60);
        assert_eq!(
            op.wake_at_ms(1, 10_000),
            Some(10_050),
            "the oldest event plus the delay"
        );
        assert_eq!(op.wake_at_ms(1, 0), Some(50));
        op.drop_flushed_stats(1);
        assert_eq!(op.pending_stats.len(), 1);
        assert_eq!(op.wake_at_ms(1, 0), Some(60));
        op.drop_flushed_stats(2);
        assert_eq!(op.wake_at_ms(1, 0), None);
    }

    #[test]
    fn counts_merge_until_sealed_and_never_into_a_sealed_event() {
        let mut op = Operation::register("batches/a", "batches/a", None, 0);
        for i in 0..1_000 {
            op.count("duplicates_skipped", 100 + i);
        }
        op.count("deliveries", 2_000);
        assert_eq!(op.pending_stats.len(), 2, "a burst stays two events");
        assert_eq!(op.pending_stats[0].count, 1_000);
        let sent = op.seal_stats().unwrap();
        assert_eq!(sent, 2);
        // Counted while the flush is in flight: a new event, not a change to a sent one.
        op.count("duplicates_skipped", 3_000);
        assert_eq!(op.pending_stats.len(), 3);
        assert_eq!(
            op.pending_stats[0].count, 1_000,
            "sealed events are never changed"
        );
        assert_eq!(op.pending_stats[2].seq, 3);
        op.drop_flushed_stats(sent);
        assert_eq!(op.pending_stats.len(), 1);
        assert_eq!(op.pending_stats[0].count, 1);
        // A new hour starts a new event, so the shard's hourly buckets stay right.
        op.count("duplicates_skipped", 3_600_000);
        assert_eq!(op.pending_stats.len(), 2);
        // Drops stay one event each: the shard lists every one as a recent drop.
        op.count("dropped_regress_from_terminal", 3_600_001);
        op.count("dropped_regress_from_terminal", 3_600_002);
        assert_eq!(op.pending_stats.len(), 4);
    }

    #[test]
    fn open_operation_is_never_forgotten() {
        let op = Operation::register("batches/a", "batches/a", None, 0);
        assert_eq!(op.expires_at_ms(1), None);
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        assert_eq!(backoff_ms(1, 30, 3_600, 1.0), 30_000);
        assert_eq!(backoff_ms(2, 30, 3_600, 1.0), 60_000);
        assert_eq!(backoff_ms(3, 30, 3_600, 1.0), 120_000);
        assert_eq!(backoff_ms(20, 30, 3_600, 1.0), 3_600_000);
        assert_eq!(backoff_ms(200, 30, 3_600, 1.0), 3_600_000);
        assert_eq!(backoff_ms(1, 30, 3_600, 0.0), 22_500);
    }

    #[test]
    fn record_round_trips_through_json() {
        let mut op = settled();
        op.claim(2_000, 10).unwrap();
        let text = serde_json::to_string(&op).unwrap();
        let back: Operation = serde_json::from_str(&text).unwrap();
        assert_eq!(back, op);
    }
}
