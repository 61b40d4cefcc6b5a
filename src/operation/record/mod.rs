//! The operation record the gate keeps, and every transition it may make.
//!
//! Guarantees (docs/DESIGN.md, invariants 2 and 3): state changes only through
//! [`Operation::apply`], which asks the pure reducer; a terminal outcome's side effect is
//! claimed with a TTL and a fencing token that only grows, and only the holder of the current
//! token may finish it; a failed attempt never marks done, it schedules the next attempt with
//! capped exponential backoff; a refusal the destination will repeat parks the effect instead
//! of retrying forever. Reaching a terminal state (`status`) and finishing its side effect
//! (`effect.done`) are separate facts. Time and jitter are parameters; nothing here does I/O.
//!
//! The record is split by concern, each part in its own module with the transitions that touch it:
//! the side effect ([`effect_state`]), alerts ([`alerts`]), a nudge's confirmation
//! ([`confirmation`]), operators' notes ([`operator`]), the stats outbox ([`outbox`]), the ledger
//! projection and its bookkeeping ([`ledger_mark`]). What the side effect's claim, the gate's
//! answers and its wake time read of the whole record (whether the effect or a batch's results are
//! owed, where the effect stands, and when each is due: the ledger write's included) is here,
//! beside [`Operation::apply`]. It is stored as one flat JSON object derived from [`Operation`]'s
//! one definition, whose field names never change, so every stored record still loads. Its fields
//! are private: readers outside use accessors, and the version is bumped in one place
//! (`Operation::changed`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::operation::alert::AlertKind;
use crate::operation::details::{bound, USER_METADATA};
use crate::operation::lifecycle::{reduce, Position, Source, Status, Verdict};
use crate::operation::retired_names::{moment_period_ms, RetiredName};
use crate::telemetry::counters::StatEvent;
use crate::timestamp::format_rfc3339;

pub mod alerts;
pub mod confirmation;
pub mod effect_state;
pub mod ledger_mark;
pub mod operator;
pub mod outbox;
pub mod results_mark;
mod salvage;
#[cfg(test)]
mod stored_tests;
#[cfg(test)]
mod tests;

pub use crate::retry::AttemptOutcome;
pub use alerts::PendingAlert;
pub use confirmation::Confirmation;
pub use effect_state::{Claim, DeskMark, Effect, EffectReport, Finished, Parked, Queued};
pub use operator::{Actor, OperatorNote, OperatorRefusal};
pub use results_mark::ResultsMode;

use ledger_mark::{LedgerMark, PROJECTION_SPACING_MS};
use operator::OperatorNotes;
use outbox::Outbox;

/// One piece of news about an operation, from any path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpEvent {
    pub status: Status,
    /// Server update time in Unix ms; 0 when the server gave none (it then loses ties).
    pub update_time_ms: i64,
    pub source: Source,
    /// Output file, error code and message, user metadata: carried to the side effect, in
    /// [`crate::operation::details::normalize_details`]'s shape, which whoever builds the
    /// event gives it (the record takes them as they are).
    #[serde(default)]
    pub details: Map<String, Value>,
    /// The `webhook-id` of the delivery that carried it, for the history.
    #[serde(default)]
    pub delivery_id: Option<String>,
}

/// What a registration did to an operation that already existed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KindFill {
    /// The record had no kind (its completion came first): the registration's kind is now
    /// its kind, so later attempts route by it and carry it.
    Filled,
    /// Same kind, or the registration named none.
    Unchanged,
    /// The record already has a different kind; nothing changed.
    Conflict,
    /// The record has no kind, but a side-effect attempt already went out without one: its
    /// `webhook-id` must keep meaning that body, so the kind stays unset.
    TooLate,
}

/// The record the gate keeps for one operation, declared once: its stored form (the gate's
/// SQLite row, one flat JSON object) is derived from this definition, field by field in this
/// order, with each part's fields (notes, outbox, ledger mark) flattened in place. A field
/// added later must read with its default, so every record stored before still loads
/// (`record/tests.rs` holds records as earlier versions stored them, and checks they load and
/// store back byte for byte).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Operation {
    key: String,
    name: String,
    kind: Option<String>,
    status: Status,
    update_time_ms: i64,
    /// Bumped on every change ([`Operation::changed`]); the ledger projection follows it.
    version: u64,
    registered: bool,
    submitted_at_ms: i64,
    settled_at_ms: Option<i64>,
    settled_by: Option<Source>,
    details: Map<String, Value>,
    effect: Effect,
    /// Alert kinds already raised (each once per operation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    alerts: Vec<AlertKind>,
    #[serde(flatten)]
    notes: OperatorNotes,
    #[serde(flatten)]
    outbox: Outbox,
    #[serde(flatten)]
    ledger: LedgerMark,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    confirmation: Option<Confirmation>,
    /// Alerts raised and not yet accepted by the sink (stored after the confirmation, where
    /// earlier versions put them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pending_alerts: Vec<PendingAlert>,
    /// Set when retention ended: the record is a tombstone (what the outcome was and whether
    /// its effect ran), kept so that nothing runs twice however late a delivery comes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    retired_at_ms: Option<i64>,
    /// When a confirmation last asked the status API: the next question (of this
    /// confirmation or of a later nudge's) waits `CONFIRM_INTERVAL_SECONDS` from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    confirm_asked_ms: Option<i64>,
    /// Conditions alerted that end by themselves (`stuck`, `effect_failing`) and have not
    /// ended yet: their end is alerted once each time ([`AlertKind::resolution`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    open_alerts: Vec<AlertKind>,
    /// How many spells of each condition ended before (its alert un-marked so a later spell
    /// alerts again): each spell's alerts go under their own ids ([`alerts`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    alert_spells: BTreeMap<AlertKind, u32>,
    /// `"results": "each"`: each result of the batch is its own side effect
    /// ([`results_mark`]).
    #[serde(default, skip_serializing_if = "ResultsMode::is_none")]
    results: ResultsMode,
    /// The results' counts once every result is settled: the job's effect carries them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    results_counts: Option<Value>,
    /// When the results' next step is due, while they run ([`Operation::results_due_ms`]):
    /// stored under the name of its first use (an operator's retry), so records store back
    /// as they were.
    #[serde(rename = "results_retry_at_ms")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    results_due_ms: Option<i64>,
    /// Results parked in the spell (refused, or failing past the alert threshold), as the
    /// `results_failing` alert names them.
    #[serde(default, skip_serializing_if = "is_zero")]
    results_gave_up: u64,
    /// Results waiting while the result senders answer nothing, as the
    /// `results_sender_failing` alert names them.
    #[serde(default, skip_serializing_if = "is_zero")]
    results_unanswered: u64,
    /// When the batch's results last made the job's effect due: its `effect_failing` is dated
    /// from then, not from the outcome ([`Operation::effect_due_after_results_ms`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    effect_due_after_results_ms: Option<i64>,
    /// Created by a signed delivery, and the retired names' shard not yet asked whether the
    /// name's retention ended before: the first alarm asks before anything else runs
    /// ([`crate::operation::retired_names`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    retired_unasked: bool,
}

/// A number left at zero is not stored (it reads back as its default).
pub(super) fn is_zero<T: Default + PartialEq>(n: &T) -> bool {
    *n == T::default()
}

impl Operation {
    /// A newly registered, pending operation.
    pub fn register(key: &str, name: &str, kind: Option<String>, now_ms: i64) -> Operation {
        // Everything else starts empty: pending, nothing settled, raised or owed.
        Operation {
            key: key.to_string(),
            name: name.to_string(),
            kind,
            version: 1,
            registered: true,
            submitted_at_ms: now_ms,
            effect: Effect {
                generation: 1,
                ..Effect::default()
            },
            outbox: Outbox::starting_at(now_ms),
            ..Operation::default()
        }
    }

    /// An operation first heard of through its completion (it was never registered).
    pub fn unregistered(key: &str, name: &str, now_ms: i64) -> Operation {
        Operation {
            registered: false,
            retired_unasked: true,
            ..Operation::register(key, name, None, now_ms)
        }
    }

    /// Whether the retired names' shard must be asked about this name before anything of
    /// it runs (a record a signed delivery created, not yet asked).
    pub fn retired_unasked(&self) -> bool {
        self.retired_unasked
    }

    /// The shard said the name was never retired: nothing more to ask. Kept in memory and
    /// stored with the record's next write (the claim's); asking again costs one call.
    pub fn retired_asked(&mut self) {
        self.retired_unasked = false;
    }

    /// Records a change: the version the ledger projection follows grows by one. Every
    /// transition that changes the record calls this, and nothing else bumps the version.
    fn changed(&mut self) {
        self.version += 1;
    }

    /// The operation's key (`batches/x`).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Gemini's full name for it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The kind it was registered with, if any (routes its side effect).
    pub fn kind(&self) -> Option<&str> {
        self.kind.as_deref()
    }

    pub fn status(&self) -> &Status {
        &self.status
    }

    /// The server's update time of the state applied (0 when it gave none).
    pub fn update_time_ms(&self) -> i64 {
        self.update_time_ms
    }

    /// Bumped on every change; the ledger projection follows it.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// True when registered through the admin API, false when a completion created it.
    pub fn registered(&self) -> bool {
        self.registered
    }

    pub fn submitted_at_ms(&self) -> i64 {
        self.submitted_at_ms
    }

    pub fn settled_at_ms(&self) -> Option<i64> {
        self.settled_at_ms
    }

    pub fn settled_by(&self) -> Option<Source> {
        self.settled_by
    }

    /// The outcome's details, in the one shape the record keeps (output, error, metadata).
    pub fn details(&self) -> &Map<String, Value> {
        &self.details
    }

    /// Where the side effect stands.
    pub fn effect(&self) -> &Effect {
        &self.effect
    }

    /// Alert kinds already raised (each once per operation).
    pub fn alerts_raised(&self) -> &[AlertKind] {
        &self.alerts
    }

    /// Alerts raised and not yet accepted by the sink.
    #[cfg(test)]
    pub fn pending_alerts(&self) -> &[PendingAlert] {
        &self.pending_alerts
    }

    /// Why the last unusable status-API answer could not be used.
    #[cfg(test)]
    pub fn unusable_status(&self) -> Option<&str> {
        self.notes.unusable_status.as_deref()
    }

    /// When and why an operator stopped tracking it.
    pub fn forgotten(&self) -> Option<&OperatorNote> {
        self.notes.forgotten.as_ref()
    }

    /// Deliberate redeliveries an operator asked for, newest last.
    #[cfg(test)]
    pub fn redeliveries(&self) -> &[OperatorNote] {
        &self.notes.redeliveries
    }

    /// Counted events not yet flushed to a stats shard, oldest first.
    pub fn pending_stats(&self) -> &[StatEvent] {
        &self.outbox.pending
    }

    /// Events up to this sequence are sealed (may be on their way to a shard).
    #[cfg(test)]
    pub fn stats_sealed_seq(&self) -> u64 {
        self.outbox.sealed_seq
    }

    /// The version last written to the KV ledger.
    pub fn projected_version(&self) -> u64 {
        self.ledger.version
    }

    /// Ledger writes failed in a row.
    pub fn projection_failures(&self) -> u32 {
        self.ledger.failures
    }

    /// An `open:` index entry may exist in KV.
    pub fn indexed(&self) -> bool {
        self.ledger.indexed
    }

    /// A dynamic-webhook delivery awaiting the status API's word.
    pub fn confirmation(&self) -> Option<&Confirmation> {
        self.confirmation.as_ref()
    }

    /// When retention ended (the record is a tombstone).
    pub fn retired_at_ms(&self) -> Option<i64> {
        self.retired_at_ms
    }

    pub(crate) fn position(&self) -> Position {
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
                // Before an outcome the details hold only what a registration gave
                // (`fill_user_metadata`): it outlives the event's, whatever their source.
                let registered = self.details.remove(USER_METADATA);
                // Every path builds its event's details normalized where they enter (the
                // envelope, a status answer's observation, an operator's settle, a
                // confirmation's merge), so the record keeps one shape without a second pass.
                self.details = event.details.clone();
                if let Some(metadata) = registered {
                    self.details.insert(USER_METADATA.into(), metadata);
                }
                self.effect.next_attempt_ms = now_ms;
                self.results_due_ms = self.results_owed().then_some(now_ms);
                // Stuck means without an outcome: that condition, when alerted, has ended.
                if self.open_alerts.contains(&AlertKind::Stuck) {
                    self.resolve_alert(AlertKind::Stuck, now_ms);
                }
            }
            self.changed();
        }
        verdict
    }

    /// True when the side effect still has to run (terminal, not done, not parked).
    pub fn effect_owed(&self) -> bool {
        self.status.is_terminal()
            && !self.effect.done
            && self.effect.parked.is_none()
            && self.notes.forgotten.is_none()
    }

    /// Where the side effect stands, without running it (the alarm runs it): what an answer
    /// of the gate reports.
    pub fn effect_report(&self, now: i64) -> EffectReport {
        if self.effect.done {
            EffectReport::Delivered
        } else if self.effect.parked.is_some() {
            EffectReport::Parked
        } else if !self.effect_owed() {
            EffectReport::NotOwed
        } else if self.effect.claim.is_some_and(|c| c.expires_ms > now) {
            EffectReport::InFlight
        } else if self.effect.next_attempt_ms <= now {
            EffectReport::Scheduled
        } else {
            EffectReport::RetryScheduled
        }
    }

    /// Whether an attempt of the side effect may be claimed at `now_ms` ([`Operation::claim`]):
    /// owed and due, no live claim, and no batch's results ahead of it (they go first: the
    /// job's effect then carries their counts).
    pub fn claimable(&self, now_ms: i64) -> bool {
        let live_claim = matches!(self.effect.claim, Some(c) if c.expires_ms > now_ms);
        self.effect_owed()
            && now_ms >= self.effect.next_attempt_ms
            && !self.results_owed()
            && !live_claim
    }

    /// Claims the side effect if it is owed, due, and not held by a live claim.
    pub fn claim(&mut self, now_ms: i64, ttl_ms: i64) -> Option<Claim> {
        if !self.claimable(now_ms) {
            return None;
        }
        self.effect.fence += 1;
        let claim = Claim {
            token: self.effect.fence,
            expires_ms: now_ms + ttl_ms,
            generation: self.effect.generation,
        };
        self.effect.claim = Some(claim);
        self.effect.attempts += 1;
        self.effect.failures_in_row += 1;
        // A release is spent by the attempt it let go.
        self.effect.desk = None;
        self.changed();
        Some(claim)
    }

    /// True while the results' side effects are owed: a `"results": "each"` batch that
    /// succeeded, whose effect is owed and not yet tried, and whose results are not settled.
    /// The job's effect waits meanwhile ([`Operation::job_due_ms`] is none).
    pub fn results_owed(&self) -> bool {
        self.results == ResultsMode::Each
            && self.status == Status::Succeeded
            && self.effect_owed()
            && self.effect.attempts == 0
            && self.results_counts.is_none()
    }

    /// When the job's effect may be claimed next: `None` while it is not owed or waits for
    /// its batch's results (the results' due time is their own).
    pub fn job_due_ms(&self) -> Option<i64> {
        (self.effect_owed() && !self.results_owed()).then_some(self.effect.next_attempt_ms)
    }

    /// Forgotten or retired: the results run no more, whatever due time is stored.
    pub fn results_stopped(&self) -> bool {
        self.notes.forgotten.is_some() || self.retired_at_ms.is_some()
    }

    /// When the results' next step is due (`None` when they are not running: settled, or the
    /// operation forgotten or retired): a wait the step chose (a destination's `Retry-After`,
    /// the desk's queue, rows backing off) holds while the alarm runs for other work. A record
    /// stored while its results were owed by a version that kept their due time in the job
    /// effect's `next_attempt_ms` is read from there until a step stores their own.
    pub fn results_due_ms(&self) -> Option<i64> {
        if self.results_stopped() {
            return None;
        }
        let stored_before = || self.results_owed().then_some(self.effect.next_attempt_ms);
        self.results_due_ms.or_else(stored_before)
    }

    /// The counts the job's effect carries as `results`, once every result is settled.
    pub fn results_counts(&self) -> Option<&Value> {
        self.results_counts.as_ref()
    }

    /// True when nothing can change the operation any more: terminal (which absorbs every
    /// later event) and its side effect done, parked or given up by an operator. Only a
    /// redelivery asked by an operator moves it again.
    pub fn is_settled(&self) -> bool {
        self.status.is_terminal() && !self.effect_owed()
    }

    /// A registration for an operation that exists: fills in a kind the record lacks (its
    /// completion arrived first), never replaces one, and never while an attempt that went
    /// out without it may be retried (the kind routes the effect and is in its body, and one
    /// `webhook-id` means one body). A side effect held for the registration ([`Operation::hold_for_registration`])
    /// becomes due at `now_ms`.
    pub fn fill_kind(&mut self, kind: Option<&str>, now_ms: i64) -> KindFill {
        match (kind, self.kind.as_deref()) {
            (None, _) => KindFill::Unchanged,
            (Some(k), Some(have)) if k == have => KindFill::Unchanged,
            (Some(_), Some(_)) => KindFill::Conflict,
            // An attempt went out and may be retried under its `webhook-id` (once done, only
            // a redelivery sends again, under a new one).
            (Some(_), None) if self.effect.attempts > 0 && !self.effect.done => KindFill::TooLate,
            (Some(k), None) => {
                self.kind = Some(k.to_string());
                self.registered = true;
                if self.effect_owed() {
                    self.effect.next_attempt_ms = self.effect.next_attempt_ms.min(now_ms);
                }
                self.changed();
                KindFill::Filled
            }
        }
    }

    /// What a registration would change of what an earlier registration recorded, by field:
    /// `kind` when it names another kind than the recorded one, `user_metadata` when it gives
    /// another value than the recorded one (a registration's, or, when the registration gave
    /// none, the outcome's). A field the registration leaves out states nothing and never
    /// conflicts, and a record no registration has reached yet (its completion came first)
    /// conflicts on nothing: the first registration still fills it in.
    pub fn registration_conflicts(
        &self,
        kind: Option<&str>,
        metadata: Option<&Value>,
    ) -> Vec<&'static str> {
        let mut fields = Vec::new();
        if matches!((kind, self.kind.as_deref()), (Some(asked), Some(have)) if asked != have) {
            fields.push("kind");
        }
        let have = self.details.get(USER_METADATA).filter(|_| self.registered);
        // Compared as it would be stored (bounded), so the same registration again agrees.
        if matches!((metadata, have), (Some(asked), Some(have)) if &bound(asked.clone()) != have) {
            fields.push("user_metadata");
        }
        fields
    }

    /// A registration recorded something (a kind or its metadata) on a record its completion
    /// created: from now on a registration that differs from it is a conflict
    /// ([`Operation::registration_conflicts`]).
    pub fn note_registration(&mut self) {
        if !self.registered {
            self.registered = true;
            self.changed();
        }
    }

    /// A registration's `user_metadata` (authenticated, so verified): the side effect carries
    /// it, over any other source's. Before the outcome it waits in the details (which hold
    /// nothing else until then) and the first registration's stands; after it, it replaces
    /// the outcome's only while no attempt has gone out (one `webhook-id` means one body).
    /// Returns whether the record changed.
    pub fn fill_user_metadata(&mut self, metadata: Option<Value>) -> bool {
        let Some(metadata) = metadata else {
            return false;
        };
        let changed = if !self.status.is_terminal() {
            !self.details.contains_key(USER_METADATA)
        } else {
            self.effect.attempts == 0
                && !self.effect.done
                && self.details.get(USER_METADATA) != Some(&metadata)
        };
        if changed {
            self.details.insert(USER_METADATA.into(), bound(metadata));
            self.changed();
        }
        changed
    }

    /// An operation nobody registered has just settled: its first side-effect attempt waits
    /// `hold_ms` (only while routes could give it another destination, see
    /// `UNREGISTERED_HOLD_SECONDS`), so a registration racing the completion can still fill
    /// in the kind before anything is sent.
    pub fn hold_for_registration(&mut self, hold_ms: i64, now_ms: i64) {
        if hold_ms > 0
            && !self.registered
            && self.kind.is_none()
            && self.effect_owed()
            && self.effect.attempts == 0
            && self.settled_at_ms == Some(now_ms)
        {
            self.effect.next_attempt_ms = self.effect.next_attempt_ms.max(now_ms + hold_ms);
        }
    }

    /// True once nothing more will happen: terminal, and its side effect done or parked.
    pub fn is_closed(&self) -> bool {
        self.notes.forgotten.is_some()
            || (self.status.is_terminal() && (self.effect.done || self.effect.parked.is_some()))
    }

    /// When the gate's storage may be dropped: retention after the operation closed. An
    /// operator's retry of parked results that is running holds it: an accepted retry is
    /// never dropped by retention; retention ends once the results settle again.
    pub fn expires_at_ms(&self, retention_ms: i64) -> Option<i64> {
        let retry_runs = self.results_due_ms().is_some();
        if !self.is_closed() || self.retired_at_ms.is_some() || self.ledger.indexed || retry_runs {
            // An index entry may still exist: the pending projection deletes it first (a
            // closed, indexed record always has one pending, see `index_written`).
            return None;
        }
        let closed = self
            .notes
            .forgotten
            .as_ref()
            .map(|f| f.at_ms)
            .or(self.effect.done_at_ms)
            .or(self.effect.parked.as_ref().map(|p| p.at_ms))?;
        Some(closed + retention_ms)
    }

    /// When the gate retires: the first moment of its name's bucket at or after
    /// [`Self::expires_at_ms`] ([`RetiredName::moment`]), so the names of a bucket whose
    /// retention ends within a day reach their shard together and are kept in one write.
    /// Never earlier than retention's end, and less than a day later (less than the retention
    /// itself when that is shorter).
    pub fn retires_at_ms(&self, retention_ms: i64) -> Option<i64> {
        let end = self.expires_at_ms(retention_ms)?;
        Some(RetiredName::of(&self.key).moment(end, moment_period_ms(retention_ms)))
    }

    /// When the next ledger write may be tried: one second after the last (KV's per-key write
    /// rate), or later after failures (the ledger mark's backoff, `ledger_mark.rs`).
    pub fn projection_due_ms(&self) -> i64 {
        (self.ledger.at_ms + PROJECTION_SPACING_MS).max(self.ledger.retry_at_ms)
    }

    /// When the gate must wake next: a lapsed claim, the job effect's due attempt, the
    /// results' next step ([`Operation::results_due_ms`]), a deferred projection,
    /// counted events to flush (`stats_delay_ms` after the oldest, so a burst of duplicates
    /// is flushed as one) or the end of retention. `None` when nothing is pending.
    ///
    /// While a claim is held, the projection and the flush wait: the attempt commits within
    /// the effect timeout and changes the record again, and the commit sets the alarm, so a
    /// first delivery costs one alarm, one ledger write and one hand-over of counts, not two
    /// of each.
    /// If the attempt never commits, the claim's expiry wakes the gate and they follow.
    pub fn wake_at_ms(&self, retention_ms: i64, stats_delay_ms: i64) -> Option<i64> {
        let mut times = Vec::new();
        if let Some(c) = self.effect.claim {
            times.push(c.expires_ms);
        } else {
            times.extend(self.job_due_ms());
            let projection = self.ledger.version < self.version;
            times.extend(projection.then(|| self.projection_due_ms()));
            let oldest = self.outbox.pending.first();
            times.extend(oldest.map(|e| e.at_ms + stats_delay_ms));
        }
        times.extend(self.confirmation.as_ref().map(|c| c.due_ms));
        times.extend(self.pending_alerts.iter().map(|a| a.due_ms));
        times.extend(self.retires_at_ms(retention_ms));
        times.extend(self.results_due_ms());
        times.into_iter().min()
    }

    /// The tombstone an earlier version kept at retention's end (key, name, kind, final
    /// status, whether the effect was done or parked, settled time, generation), which objects
    /// retired then still hold: a delivery that comes later is a duplicate and runs nothing,
    /// and it is never projected again. Retention's end now deletes the gate's storage
    /// instead ([`crate::operation::gate::alarm::retire_if_over`]); tests build such a
    /// tombstone with this.
    #[cfg(test)]
    pub fn retire(&mut self, now_ms: i64) {
        self.details = Map::new();
        self.alerts.clear();
        self.pending_alerts.clear();
        self.notes.redeliveries.clear();
        self.outbox.pending.clear();
        self.confirmation = None;
        self.results_due_ms = None;
        self.effect.claim = None;
        self.effect.last_error = None;
        if let Some(parked) = &mut self.effect.parked {
            parked.answer.clear();
        }
        if let Some(note) = &mut self.notes.forgotten {
            note.reason.clear();
        }
        self.retired_at_ms = Some(now_ms);
        self.changed();
        self.ledger.version = self.version;
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
            "next_attempt_at": self.job_due_ms().map(format_rfc3339),
            "results_due_at": self.results_due_ms().map(format_rfc3339),
            "last_error": self.effect.last_error,
            "waiting_on_destination": matches!(self.effect.desk, Some(DeskMark::Waiting { .. })),
            "paused_at_destination": self.held_by_pause(),
            "details": self.details,
            "alerts": self.alerts,
            "unusable_status": self.notes.unusable_status,
            "forgotten": self.notes.forgotten.as_ref().map(|f| json!({"at": format_rfc3339(f.at_ms), "reason": f.reason})),
            "redeliveries": self.notes.redeliveries.iter().map(|r| json!({"at": format_rfc3339(r.at_ms), "reason": r.reason})).collect::<Vec<_>>(),
            "confirming": self.confirmation.is_some(),
            "alerts_pending": self.pending_alerts.iter().map(|a| a.kind).collect::<Vec<_>>(),
            "retired_at": self.retired_at_ms.map(format_rfc3339),
            "results": self.results.as_str(),
            "results_counts": self.results_counts,
            "version": self.version,
        })
    }
}
