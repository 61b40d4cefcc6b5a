//! The operation record the gate keeps, and every transition it may make.
//!
//! Guarantees (docs/DESIGN.md, invariants 2 and 3): state changes only through
//! [`Operation::apply`], which asks the pure reducer; a terminal outcome's side effect is
//! claimed with a TTL and a fencing token that only grows, and only the holder of the current
//! token may finish it; a failed attempt never marks done, it schedules the next attempt with
//! capped exponential backoff; a refusal the destination will repeat parks the effect instead
//! of retrying forever. Reaching a terminal state (`status`) and finishing its side effect
//! (`effect.done`) are separate facts. Time and jitter are parameters; nothing here does I/O.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::operation::alert::{human_age, AlertKind};
use crate::operation::effect::normalize_details;
use crate::operation::lifecycle::{reduce, Position, Source, Status, Verdict};
use crate::telemetry::counters::{hour_of, Counter, StatEvent};
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

/// A dynamic-webhook delivery waiting for Gemini's status API to confirm it. Its body is
/// unproven (the token vouches only that Google sent something), so it decides nothing: the
/// gate asks the status API and applies what that says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Confirmation {
    pub requested_at_ms: i64,
    /// Not before this time (Unix ms) is the status API asked (again).
    pub due_ms: i64,
    /// Status-API questions asked so far for this confirmation.
    pub attempts: u32,
    /// `user_metadata` (from the verified token) and `unverified_user_metadata` (from the
    /// body only), carried to the side effect with what the status API says.
    #[serde(default)]
    pub metadata: Map<String, Value>,
    /// The delivery's id (a hash of its token), for the history.
    #[serde(default)]
    pub delivery_id: Option<String>,
}

/// Status-API questions a confirmation asks at most, whether the answers say "not finished"
/// or cannot be used; then it is left to the cron (which polls every operation that is not
/// terminal) and its alerts.
pub const MAX_CONFIRM_ATTEMPTS: u32 = 5;

/// An alert raised and not yet accepted by the sink: kept in the record, so an object that
/// dies while sending it sends it later (at least once; `id` lets the sink drop repeats).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingAlert {
    pub kind: AlertKind,
    pub id: String,
    pub age_seconds: i64,
    pub attempts: u32,
    pub due_ms: i64,
}

/// Why an operator's command was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperatorRefusal {
    /// Redelivery needs a terminal state: there is no outcome to deliver yet.
    NotTerminal,
    /// The operation was forgotten.
    Forgotten,
    /// Retention ended: only a tombstone remains.
    Retired,
    /// Retry-now needs an effect that is not done (a done one is redelivered instead).
    AlreadyDone,
    /// An attempt holds a live claim: retrying now could run it twice at once.
    InFlight,
    /// A new generation needs a done effect: one not done is retried under its own id.
    NotDone,
    /// Settling by hand needs an operation with no outcome yet (terminal absorbs).
    AlreadySettled,
}

impl OperatorRefusal {
    /// What the operator is told.
    pub fn as_str(self) -> &'static str {
        match self {
            OperatorRefusal::NotTerminal => "the operation has no outcome yet",
            OperatorRefusal::Forgotten => "the operation was forgotten",
            OperatorRefusal::Retired => "retention ended; only a tombstone remains",
            OperatorRefusal::AlreadyDone => {
                "the side effect is done; redeliver it to send it again as a new generation"
            }
            OperatorRefusal::InFlight => {
                "an attempt is in flight; retry once it has finished or its claim lapsed"
            }
            OperatorRefusal::NotDone => {
                "the side effect is not done; retry it now under the same webhook-id instead"
            }
            OperatorRefusal::AlreadySettled => {
                "the operation already has an outcome; redeliver or retry its side effect instead"
            }
        }
    }
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

impl KindFill {
    /// The spelling in the registration's answer.
    pub fn as_str(self) -> &'static str {
        match self {
            KindFill::Filled => "filled",
            KindFill::Unchanged => "unchanged",
            KindFill::Conflict => "conflict",
            KindFill::TooLate => "too_late",
        }
    }
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
    /// Alert kinds already raised (each once per operation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alerts: Vec<AlertKind>,
    /// Why the last unusable status-API answer could not be used (too large, not JSON),
    /// kept for the operator who settles the operation by hand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unusable_status: Option<String>,
    /// Set when an operator stopped tracking the operation: no more polling, alerts or
    /// side-effect attempts; the record stays for the retention period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forgotten: Option<OperatorNote>,
    /// Deliberate redeliveries an operator asked for, newest last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redeliveries: Vec<OperatorNote>,
    /// Counted events not yet flushed to a stats shard, and the last sequence issued.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
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
    /// Ledger writes failed in a row, and when the next may be tried (capped backoff, so a
    /// KV outage does not become a storm of alarms).
    #[serde(default)]
    pub projection_failures: u32,
    #[serde(default)]
    pub projection_retry_at_ms: i64,
    /// An `open:` index entry may exist in KV (a put of it was tried and no delete has
    /// succeeded since): the projection that closes the operation deletes it, and retention
    /// waits for that, so a tombstone (never projected again) leaves no index entry behind.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub indexed: bool,
    /// A dynamic-webhook delivery awaiting the status API's word.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation: Option<Confirmation>,
    /// Alerts raised and not yet accepted by the sink.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_alerts: Vec<PendingAlert>,
    /// Set when retention ended: the record is a tombstone (what the outcome was and whether
    /// its effect ran), kept so that nothing runs twice however late a delivery comes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_at_ms: Option<i64>,
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
            unusable_status: None,
            forgotten: None,
            redeliveries: Vec::new(),
            pending_stats: Vec::new(),
            stats_seq: 0,
            stats_sealed_seq: 0,
            projected_version: 0,
            projected_at_ms: 0,
            projection_failures: 0,
            projection_retry_at_ms: 0,
            indexed: false,
            confirmation: None,
            pending_alerts: Vec::new(),
            retired_at_ms: None,
        }
    }

    /// An operation first heard of through its completion (it was never registered).
    pub fn unregistered(key: &str, name: &str, now_ms: i64) -> Operation {
        Operation {
            registered: false,
            ..Operation::register(key, name, None, now_ms)
        }
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

    /// Counted events not yet flushed to a stats shard, oldest first.
    pub fn pending_stats(&self) -> &[StatEvent] {
        &self.pending_stats
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

    /// Starts a deliberate redelivery of a done effect: a new generation (so `webhook-id` and
    /// `effect-generation` change and a Standard Webhooks receiver does not drop it as a
    /// duplicate; `idempotency-key` stays the key), due now. An effect not yet done is never
    /// given a new generation (its last attempt may have arrived): see [`Operation::retry_now`].
    pub fn redeliver(&mut self, now_ms: i64, reason: &str) -> Result<u32, OperatorRefusal> {
        if self.retired_at_ms.is_some() {
            return Err(OperatorRefusal::Retired);
        }
        if self.forgotten.is_some() {
            return Err(OperatorRefusal::Forgotten);
        }
        if !self.status.is_terminal() {
            return Err(OperatorRefusal::NotTerminal);
        }
        if !self.effect.done {
            return Err(OperatorRefusal::NotDone);
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
        self.alerts.retain(|a| *a != AlertKind::EffectFailing);
        self.redeliveries.push(OperatorNote {
            at_ms: now_ms,
            reason: reason.to_string(),
        });
        self.version += 1;
        Ok(self.effect.generation)
    }

    /// The operator's "retry now" on an effect not yet done: the same generation (so the same
    /// `webhook-id`: an attempt that timed out on our side may have reached the destination,
    /// which then drops the repeat), due now, un-parked. Refused while an attempt holds a
    /// live claim, and for a done effect (that is a deliberate redelivery).
    pub fn retry_now(&mut self, now_ms: i64) -> Result<(), OperatorRefusal> {
        if self.retired_at_ms.is_some() {
            return Err(OperatorRefusal::Retired);
        }
        if self.forgotten.is_some() {
            return Err(OperatorRefusal::Forgotten);
        }
        if !self.status.is_terminal() {
            return Err(OperatorRefusal::NotTerminal);
        }
        if self.effect.done {
            return Err(OperatorRefusal::AlreadyDone);
        }
        if self.effect.claim.is_some_and(|c| c.expires_ms > now_ms) {
            return Err(OperatorRefusal::InFlight);
        }
        self.effect.parked = None;
        self.effect.failures_in_row = 0;
        self.effect.next_attempt_ms = now_ms;
        self.alerts.retain(|a| *a != AlertKind::EffectFailing);
        self.version += 1;
        Ok(())
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
                self.version += 1;
                KindFill::Filled
            }
        }
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

    /// Stops tracking the operation (recorded, not erased). Idempotent.
    /// Nothing runs for it afterwards: a waiting confirmation and queued alerts are dropped,
    /// and no nudge asks the status API again or raises an alert.
    pub fn forget(&mut self, now_ms: i64, reason: &str) -> bool {
        if self.forgotten.is_some() {
            return false;
        }
        self.forgotten = Some(OperatorNote {
            at_ms: now_ms,
            reason: reason.to_string(),
        });
        self.effect.claim = None;
        self.confirmation = None;
        self.pending_alerts.clear();
        self.version += 1;
        true
    }

    /// Counts an event for `/v1/stats`; it is flushed to a stats shard later. A count joins
    /// an unsealed pending event of the same name and hour, so the record stays small however
    /// many duplicates arrive between flushes (a replayed delivery can arrive hundreds of times
    /// a second); sealed events are left alone, which keeps the shard's per-sequence dedupe
    /// exact. `dropped_*` events stay one per drop: the shard lists each as a recent drop.
    pub fn count(&mut self, counter: Counter, now_ms: i64) {
        let sealed = self.stats_sealed_seq;
        let mergeable = counter.merges();
        let name = counter.name();
        if let Some(event) = self.pending_stats.iter_mut().find(|e| {
            mergeable && e.seq > sealed && e.name == *name && hour_of(e.at_ms) == hour_of(now_ms)
        }) {
            event.count += 1;
            return;
        }
        self.stats_seq += 1;
        self.pending_stats.push(StatEvent {
            seq: self.stats_seq,
            name: name.into_owned(),
            at_ms: now_ms,
            count: 1,
        });
    }

    /// The record as a new object instance reads it from storage: any pending event may
    /// already be at a shard (the last instance may have stopped during a flush), so every one
    /// is sealed and nothing merges into it. This is why a flush need not store its seal
    /// first: within an instance the seal in memory is enough, and a new instance seals again.
    pub fn as_loaded(mut self) -> Operation {
        self.seal_stats();
        self
    }

    /// Seals the pending events before they are sent; returns the last sequence sent, if any.
    pub fn seal_stats(&mut self) -> Option<u64> {
        let last = self.pending_stats.last()?.seq;
        self.stats_sealed_seq = last;
        Some(last)
    }

    /// A flush failed: its events wait until `retry_at_ms` (the wake time follows the oldest).
    pub fn stats_flush_failed(&mut self, retry_at_ms: i64) {
        for event in &mut self.pending_stats {
            event.at_ms = event.at_ms.max(retry_at_ms);
        }
    }

    /// Forgets counted events up to `seq`, once a shard has them.
    pub fn drop_flushed_stats(&mut self, seq: u64) {
        self.pending_stats.retain(|e| e.seq > seq);
    }

    /// Marks an alert of `kind` as raised; false if one was raised before.
    fn mark_alert(&mut self, kind: AlertKind) -> bool {
        if self.alerts.contains(&kind) {
            return false;
        }
        self.alerts.push(kind);
        self.version += 1;
        true
    }

    /// The body of an alert of `kind` about this operation, `age_seconds` old.
    pub fn alert_body(&self, kind: AlertKind, alert_id: &str, age_seconds: i64) -> Value {
        let age = human_age(age_seconds);
        let status = self.status.as_str();
        let what = match kind {
            AlertKind::Stuck => {
                format!("still {status} after {age}; left open for a person to judge")
            }
            AlertKind::UnknownToGemini => {
                format!("Gemini's status API does not know it (404) after {age}")
            }
            AlertKind::EffectFailing => match (&self.effect.parked, &self.effect.last_error) {
                (Some(p), _) => format!(
                    "{status} but its side effect was refused and parked: {}",
                    p.answer
                ),
                (None, Some(e)) => format!(
                    "{status} {age} ago but its side effect is still not done after {} attempts (last: {e})",
                    self.effect.attempts
                ),
                (None, None) => {
                    format!("{status} {age} ago but its side effect is still not done")
                }
            },
            AlertKind::WebhookDisabled => format!("{status} (the webhook, not this operation)"),
            AlertKind::RecordUnreadable => format!(
                "{status}: its stored record could not be read; it was recovered and the original kept for inspection"
            ),
            // Sent after an operator settled it (queued before): say so, not "still".
            AlertKind::StatusUnusable if self.status.is_terminal() => format!(
                "{status}: Gemini's status answer could not be used ({}); it has an outcome now",
                self.unusable_status.as_deref().unwrap_or("unknown reason"),
            ),
            AlertKind::StatusUnusable => format!(
                "still {status}: Gemini's status answer cannot be used ({}); settle it by hand (POST /v1/operations/{}/settle) once its outcome is known",
                self.unusable_status.as_deref().unwrap_or("unknown reason"),
                self.key
            ),
            AlertKind::AlarmFailing => format!("{status}: its gate's alarm keeps failing"),
        };
        crate::operation::alert::body(
            kind,
            Some(alert_id),
            (Some(&self.key), &self.name, self.kind.as_deref()),
            age_seconds,
            &what,
        )
    }

    /// True once nothing more will happen: terminal, and its side effect done or parked.
    pub fn is_closed(&self) -> bool {
        self.forgotten.is_some()
            || (self.status.is_terminal() && (self.effect.done || self.effect.parked.is_some()))
    }

    /// When the gate's storage may be dropped: retention after the operation closed.
    pub fn expires_at_ms(&self, retention_ms: i64) -> Option<i64> {
        if !self.is_closed() || self.retired_at_ms.is_some() || self.indexed {
            // An index entry may still exist: the pending projection deletes it first (a
            // closed, indexed record always has one pending, see `index_written`).
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
                times.push(self.projection_due_ms());
            }
            if let Some(first) = self.pending_stats.first() {
                times.push(first.at_ms + stats_delay_ms);
            }
        }
        times.extend(self.confirmation.as_ref().map(|c| c.due_ms));
        times.extend(self.pending_alerts.iter().map(|a| a.due_ms));
        times.extend(self.expires_at_ms(retention_ms));
        times.into_iter().min()
    }

    /// When the next ledger write may be tried: one second after the last (KV's per-key write
    /// rate), or later after failures.
    pub fn projection_due_ms(&self) -> i64 {
        (self.projected_at_ms + PROJECTION_SPACING_MS).max(self.projection_retry_at_ms)
    }

    /// A ledger write of `version` succeeded at `now_ms`.
    pub fn projection_written(&mut self, version: u64, now_ms: i64) {
        self.projected_version = self.projected_version.max(version);
        self.projected_at_ms = now_ms;
        self.projection_failures = 0;
        self.projection_retry_at_ms = 0;
    }

    /// The index write that went with a projection was `write`, and it succeeded (`ok`) or
    /// not. A put, even a failed one, may have landed; only a delete that succeeded clears
    /// the mark; no write leaves it as it stands (a [`Operation::reindex`] may have set it
    /// while the write was in flight).
    pub fn index_written(&mut self, write: crate::operation::ledger::IndexWrite, ok: bool) {
        use crate::operation::ledger::IndexWrite;
        match (write, ok) {
            (IndexWrite::Put, _) => self.indexed = true,
            (IndexWrite::Delete, true) => self.indexed = false,
            _ => {}
        }
    }

    /// The reconciliation audit found the KV index out of step with this record (missing, or
    /// left behind): project it again, and treat the index entry as possibly present, so a
    /// closed record deletes it and an open one puts it back. A tombstone is never projected
    /// again (false).
    pub fn reindex(&mut self) -> bool {
        if self.retired_at_ms.is_some() {
            return false;
        }
        self.indexed = true;
        self.version += 1;
        true
    }

    /// A ledger write failed at `now_ms`: the next waits 1 s, 2 s, 4 s, ... up to
    /// [`PROJECTION_RETRY_MAX_MS`].
    pub fn projection_failed(&mut self, now_ms: i64) {
        self.projection_failures = self.projection_failures.saturating_add(1);
        let exponent = (self.projection_failures - 1).min(20);
        let wait = (PROJECTION_SPACING_MS << exponent).min(PROJECTION_RETRY_MAX_MS);
        self.projected_at_ms = now_ms;
        self.projection_retry_at_ms = now_ms + wait;
    }

    /// Records a dynamic-webhook delivery that names this operation: the status API is to be
    /// asked now. Returns false when there is nothing to confirm (already terminal: terminal
    /// absorbs, so no answer could change it; or forgotten). A confirmation already waiting
    /// keeps its schedule (a flood of replays costs no extra status calls) and gains missing
    /// metadata; when it gains none, nothing changed and the version stays.
    pub fn request_confirmation(
        &mut self,
        now_ms: i64,
        metadata: Map<String, Value>,
        delivery_id: Option<String>,
    ) -> bool {
        if self.status.is_terminal() || self.retired_at_ms.is_some() || self.forgotten.is_some() {
            return false;
        }
        // Metadata enters the record here: bounded, so the record always loads again.
        let metadata = crate::bounds::bound_members(metadata);
        match &mut self.confirmation {
            Some(waiting) => {
                let mut gained = false;
                for (k, v) in metadata {
                    if let serde_json::map::Entry::Vacant(e) = waiting.metadata.entry(k) {
                        e.insert(v);
                        gained = true;
                    }
                }
                if !gained {
                    return true;
                }
            }
            None => {
                self.confirmation = Some(Confirmation {
                    requested_at_ms: now_ms,
                    due_ms: now_ms,
                    attempts: 0,
                    metadata,
                    delivery_id,
                });
            }
        }
        self.version += 1;
        true
    }

    /// True when a confirmation is waiting and due.
    pub fn confirmation_due(&self, now_ms: i64) -> bool {
        self.confirmation
            .as_ref()
            .is_some_and(|c| c.due_ms <= now_ms)
    }

    /// Applies what the status API said in answer to a confirmation, as an event from the
    /// webhook path carrying the nudge's metadata. The confirmation ends once the operation
    /// is terminal or after [`MAX_CONFIRM_ATTEMPTS`]; otherwise it is asked again in
    /// `retry_in_ms` (Gemini may answer a moment behind its own webhook).
    pub fn confirm_with(&mut self, mut event: OpEvent, now_ms: i64, retry_in_ms: i64) -> Verdict {
        let Some(mut confirmation) = self.confirmation.take() else {
            return self.apply(&event, now_ms);
        };
        for (k, v) in &confirmation.metadata {
            event.details.entry(k.clone()).or_insert(v.clone());
        }
        event.delivery_id = event.delivery_id.or(confirmation.delivery_id.clone());
        let verdict = self.apply(&event, now_ms);
        confirmation.attempts += 1;
        if !self.status.is_terminal() && confirmation.attempts < MAX_CONFIRM_ATTEMPTS {
            confirmation.due_ms = now_ms + retry_in_ms;
            self.confirmation = Some(confirmation);
        }
        self.version += 1;
        verdict
    }

    /// The status API could not answer, or not usably (no key, 429, 5xx, timeout, an
    /// unusable body): ask again later, at most [`MAX_CONFIRM_ATTEMPTS`] questions in all,
    /// then leave the operation to the cron (which polls it) and its alerts.
    pub fn confirmation_failed(&mut self, now_ms: i64, retry_in_ms: i64) {
        if let Some(c) = &mut self.confirmation {
            c.attempts += 1;
            c.due_ms = now_ms + retry_in_ms;
            if c.attempts >= MAX_CONFIRM_ATTEMPTS {
                self.confirmation = None;
            }
            self.version += 1;
        }
    }

    /// No status API to ask (`GEMINI_API_KEY` is not set): the confirmation waits, backing
    /// off, until it is; no question was asked, so this is not one of its tries.
    pub fn confirmation_waits(&mut self, now_ms: i64, retry_in_ms: i64) {
        if let Some(c) = &mut self.confirmation {
            c.due_ms = now_ms + retry_in_ms;
            self.version += 1;
        }
    }

    /// A status-API answer could not be used (`reason`: too large, not JSON): kept for the
    /// operator and alerted once (the alert says why). False when nothing changed.
    pub fn status_unusable(&mut self, reason: &str, age_seconds: i64, now_ms: i64) -> bool {
        if self.status.is_terminal() || self.forgotten.is_some() || self.retired_at_ms.is_some() {
            return false;
        }
        let reason: String = reason.chars().take(300).collect();
        let changed = self.unusable_status.as_deref() != Some(reason.as_str());
        self.unusable_status = Some(reason);
        let raised = self.raise_alert(AlertKind::StatusUnusable, age_seconds, now_ms);
        if changed && !raised {
            self.version += 1;
        }
        changed || raised
    }

    /// An operator gives the outcome Gemini's status API could not: a terminal `status`, with
    /// `reason` under `provider.operator_reason`, applied like any event (settled by
    /// `operator`), so its side effect runs once like any other. Refused when the operation
    /// has an outcome already (terminal absorbs), was forgotten, or is a tombstone.
    pub fn settle_by_operator(
        &mut self,
        status: Status,
        reason: &str,
        now_ms: i64,
    ) -> Result<OpEvent, OperatorRefusal> {
        if self.retired_at_ms.is_some() {
            return Err(OperatorRefusal::Retired);
        }
        if self.forgotten.is_some() {
            return Err(OperatorRefusal::Forgotten);
        }
        if self.status.is_terminal() || !status.is_terminal() {
            return Err(OperatorRefusal::AlreadySettled);
        }
        let mut provider = Map::new();
        provider.insert("operator_reason".into(), Value::String(reason.to_string()));
        let mut details = Map::new();
        details.insert(
            crate::operation::effect::PROVIDER.into(),
            Value::Object(provider),
        );
        let event = OpEvent {
            status,
            update_time_ms: self.update_time_ms,
            source: Source::Operator,
            details,
            delivery_id: None,
        };
        self.apply(&event, now_ms);
        self.confirmation = None;
        Ok(event)
    }

    /// The status API does not know the operation (404): nothing to apply, nothing to ask.
    pub fn confirmation_gone(&mut self) {
        if self.confirmation.take().is_some() {
            self.version += 1;
        }
    }

    /// Raises an alert of `kind` once per operation: marked, and queued until the sink
    /// accepts it. False when one was raised before.
    /// Nothing is raised for a forgotten operation, and `stuck` is not raised on top of
    /// `unknown_to_gemini` (Gemini not knowing it is why it is stuck: one alert says it).
    pub fn raise_alert(&mut self, kind: AlertKind, age_seconds: i64, now_ms: i64) -> bool {
        if self.forgotten.is_some()
            || (kind == AlertKind::Stuck && self.alerts.contains(&AlertKind::UnknownToGemini))
        {
            return false;
        }
        if !self.mark_alert(kind) {
            return false;
        }
        self.pending_alerts.push(PendingAlert {
            kind,
            id: crate::operation::alert::alert_id(&self.key, kind, self.effect.generation),
            age_seconds,
            attempts: 0,
            due_ms: now_ms,
        });
        true
    }

    /// The sink accepted the alert of `kind`.
    pub fn alert_delivered(&mut self, kind: AlertKind) {
        let before = self.pending_alerts.len();
        self.pending_alerts.retain(|a| a.kind != kind);
        if self.pending_alerts.len() != before {
            self.version += 1;
        }
    }

    /// Sending the alert of `kind` failed: try again in `retry_in_ms`.
    pub fn alert_failed(&mut self, kind: AlertKind, now_ms: i64, retry_in_ms: i64) {
        let mut changed = false;
        for alert in self.pending_alerts.iter_mut().filter(|a| a.kind == kind) {
            alert.attempts += 1;
            alert.due_ms = now_ms + retry_in_ms;
            changed = true;
        }
        if changed {
            self.version += 1;
        }
    }

    /// Alerts whose time to be sent has come.
    pub fn due_alerts(&self, now_ms: i64) -> Vec<PendingAlert> {
        self.pending_alerts
            .iter()
            .filter(|a| a.due_ms <= now_ms)
            .cloned()
            .collect()
    }

    /// Ends retention: keeps a tombstone (key, name, kind, final status, whether the effect
    /// was done or parked, settled time, generation) and drops the rest, so a delivery that
    /// comes later is a duplicate and runs nothing. The ledger entry expires on its own TTL;
    /// the tombstone is never projected again.
    pub fn retire(&mut self, now_ms: i64) {
        self.details = Map::new();
        self.alerts.clear();
        self.pending_alerts.clear();
        self.redeliveries.clear();
        self.pending_stats.clear();
        self.confirmation = None;
        self.effect.claim = None;
        self.effect.last_error = None;
        if let Some(parked) = &mut self.effect.parked {
            parked.answer.clear();
        }
        if let Some(note) = &mut self.forgotten {
            note.reason.clear();
        }
        self.retired_at_ms = Some(now_ms);
        self.version += 1;
        self.projected_version = self.version;
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
            "unusable_status": self.unusable_status,
            "forgotten": self.forgotten.as_ref().map(|f| json!({"at": format_rfc3339(f.at_ms), "reason": f.reason})),
            "redeliveries": self.redeliveries.iter().map(|r| json!({"at": format_rfc3339(r.at_ms), "reason": r.reason})).collect::<Vec<_>>(),
            "confirming": self.confirmation.is_some(),
            "alerts_pending": self.pending_alerts.iter().map(|a| a.kind).collect::<Vec<_>>(),
            "retired_at": self.retired_at_ms.map(format_rfc3339),
            "version": self.version,
        })
    }
}

/// KV accepts one write per second to a key: projections of one operation are spaced by this.
pub const PROJECTION_SPACING_MS: i64 = 1_000;
/// Longest wait between ledger writes that keep failing (a KV outage, or the Free plan's
/// daily write quota spent): the gate stays the truth meanwhile.
pub const PROJECTION_RETRY_MAX_MS: i64 = 300_000;

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
    fn transitions_that_change_nothing_keep_the_version() {
        let mut op = settled();
        let version = op.version;
        op.alert_delivered(AlertKind::Stuck);
        op.alert_failed(AlertKind::Stuck, 5, 5);
        op.confirmation_failed(5, 5);
        op.confirmation_gone();
        assert!(!op.request_confirmation(5, Map::new(), None), "terminal");
        assert_eq!(op.fill_kind(None, 5), KindFill::Unchanged);
        assert_eq!(op.fill_kind(Some("k"), 5), KindFill::Unchanged);
        assert_eq!(op.version, version);
        let mut waiting = Operation::register("batches/w", "batches/w", None, 0);
        assert!(waiting.request_confirmation(1, Map::new(), None));
        let version = waiting.version;
        assert!(waiting.request_confirmation(2, Map::new(), None));
        assert_eq!(waiting.version, version, "the same nudge again");
        assert!(waiting.forget(3, "gone"));
        let version = waiting.version;
        assert!(!waiting.forget(4, "again"));
        assert!(
            !waiting.request_confirmation(5, Map::new(), None),
            "forgotten"
        );
        assert!(!waiting.raise_alert(AlertKind::Stuck, 1, 5), "forgotten");
        assert_eq!(waiting.version, version);
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
    fn redelivery_of_a_done_effect_starts_a_new_generation() {
        let mut op = settled();
        let c = op.claim(2_000, 600_000).unwrap();
        op.finish(c.token, &AttemptOutcome::Delivered, 2_100, 0);
        assert_eq!(op.redeliver(3_000, "downstream lost it"), Ok(2));
        assert!(op.effect_owed());
        assert_eq!(op.redeliveries[0].reason, "downstream lost it");
        let c2 = op.claim(3_000, 600_000).unwrap();
        assert!(c2.token > c.token);
        assert_eq!(
            op.finish(c2.token, &AttemptOutcome::Delivered, 3_100, 0),
            Finished::Done
        );
        assert_eq!(op.effect.generation, 2);
    }

    #[test]
    fn an_effect_not_done_never_gets_a_new_generation() {
        let mut op = settled();
        let c = op.claim(2_000, 600_000).unwrap();
        op.finish(
            c.token,
            &AttemptOutcome::Retry("timeout".into()),
            7_000,
            30_000,
        );
        assert_eq!(op.redeliver(8_000, "x"), Err(OperatorRefusal::NotDone));
        assert_eq!(op.effect.generation, 1);
    }

    #[test]
    fn retry_now_keeps_the_generation_unparks_and_is_due_at_once() {
        let mut op = settled();
        let c = op.claim(2_000, 600_000).unwrap();
        op.finish(c.token, &AttemptOutcome::Park("400".into()), 2_100, 0);
        op.mark_alert(AlertKind::EffectFailing);
        assert_eq!(op.retry_now(3_000), Ok(()));
        assert!(op.effect_owed());
        assert!(
            op.alerts.is_empty(),
            "it may alert again if it keeps failing"
        );
        assert_eq!(op.effect.generation, 1, "the same webhook-id");
        assert!(
            op.claim(3_000, 600_000).is_some(),
            "due now, not after a backoff"
        );
    }

    #[test]
    fn retry_now_is_refused_while_an_attempt_is_in_flight_or_once_done() {
        let mut op = settled();
        let c = op.claim(2_000, 10_000).unwrap();
        assert_eq!(op.retry_now(5_000), Err(OperatorRefusal::InFlight));
        assert_eq!(
            op.retry_now(12_000),
            Ok(()),
            "a lapsed claim is not in flight"
        );
        let mut done = settled();
        let c2 = done.claim(2_000, 10_000).unwrap();
        done.finish(c2.token, &AttemptOutcome::Delivered, 2_100, 0);
        assert_eq!(done.retry_now(3_000), Err(OperatorRefusal::AlreadyDone));
        // The retried claim's late answer is fenced off by the token, as ever.
        let again = op.claim(12_000, 10_000).unwrap();
        assert_eq!(
            op.finish(c.token, &AttemptOutcome::Delivered, 12_500, 0),
            Finished::Fenced
        );
        assert_eq!(
            op.finish(again.token, &AttemptOutcome::Delivered, 12_600, 0),
            Finished::Done
        );
    }

    #[test]
    fn a_late_registration_fills_in_the_kind_but_never_replaces_it() {
        let mut op = Operation::unregistered("batches/a", "batches/a", 0);
        assert_eq!(op.fill_kind(None, 0), KindFill::Unchanged);
        assert_eq!(op.fill_kind(Some("billing"), 0), KindFill::Filled);
        assert_eq!(op.kind.as_deref(), Some("billing"));
        assert!(op.registered);
        assert_eq!(op.fill_kind(Some("billing"), 0), KindFill::Unchanged);
        assert_eq!(op.fill_kind(Some("publish"), 0), KindFill::Conflict);
        assert_eq!(op.kind.as_deref(), Some("billing"));
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
    fn stuck_alert_names_the_operation() {
        let op = Operation::register(
            "batches/a",
            "projects/p/batches/a",
            Some("nightly".into()),
            0,
        );
        let body = op.alert_body(AlertKind::Stuck, "alert_x", 21_600);
        assert_eq!(body["alert_id"], "alert_x");
        assert_eq!(body["alert"], "stuck");
        assert_eq!(body["key"], "batches/a");
        assert_eq!(body["name"], "projects/p/batches/a");
        assert_eq!(body["kind"], "nightly");
        assert_eq!(body["age_seconds"], 21_600);
        let text = body["text"].as_str().unwrap();
        assert!(
            text.contains("projects/p/batches/a")
                && text.contains("6h 0m")
                && text.contains("pending"),
            "{text}"
        );
    }

    #[test]
    fn alerts_are_marked_once() {
        let mut op = Operation::register("batches/a", "batches/a", None, 0);
        assert!(op.mark_alert(AlertKind::Stuck));
        assert!(!op.mark_alert(AlertKind::Stuck));
        assert!(op.mark_alert(AlertKind::EffectFailing), "another kind");
    }

    #[test]
    fn wake_time_follows_what_is_pending() {
        let retention = 1_000_000;
        let mut op = settled();
        op.projected_version = op.version;
        assert_eq!(op.wake_at_ms(retention, 0), Some(2_000), "effect due");
        let c = op.claim(2_000, 600_000).unwrap();
        op.count(Counter::Deliveries, 2_000);
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
        op.count(Counter::Deliveries, 50);
        op.count(Counter::Duplicates, 60);
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
    fn a_record_read_by_a_new_instance_merges_nothing_into_what_may_have_been_sent() {
        let mut op = Operation::register("batches/a", "batches/a", None, 0);
        op.count(Counter::Deliveries, 100);
        // The last instance sealed event 1 in memory and stopped during the flush: storage
        // still shows it unsealed.
        let stored: Operation = serde_json::from_str(&serde_json::to_string(&op).unwrap()).unwrap();
        assert_eq!(stored.stats_sealed_seq, 0);
        let mut loaded = stored.as_loaded();
        loaded.count(Counter::Deliveries, 200);
        assert_eq!(loaded.pending_stats.len(), 2, "a new event, not a merge");
        assert_eq!(loaded.pending_stats[0].count, 1);
    }

    #[test]
    fn counts_merge_until_sealed_and_never_into_a_sealed_event() {
        let mut op = Operation::register("batches/a", "batches/a", None, 0);
        for i in 0..1_000 {
            op.count(Counter::Duplicates, 100 + i);
        }
        op.count(Counter::Deliveries, 2_000);
        assert_eq!(op.pending_stats.len(), 2, "a burst stays two events");
        assert_eq!(op.pending_stats[0].count, 1_000);
        let sent = op.seal_stats().unwrap();
        assert_eq!(sent, 2);
        // Counted while the flush is in flight: a new event, not a change to a sent one.
        op.count(Counter::Duplicates, 3_000);
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
        op.count(Counter::Duplicates, 3_600_000);
        assert_eq!(op.pending_stats.len(), 2);
        // Drops stay one event each: the shard lists every one as a recent drop.
        op.count(Counter::Dropped("regress_from_terminal"), 3_600_001);
        op.count(Counter::Dropped("regress_from_terminal"), 3_600_002);
        assert_eq!(op.pending_stats.len(), 4);
    }

    #[test]
    fn retention_waits_for_the_index_entry_to_be_deleted() {
        use crate::operation::ledger::IndexWrite;
        let mut op = settled();
        let c = op.claim(2_000, 600_000).unwrap();
        op.finish(c.token, &AttemptOutcome::Delivered, 3_000, 0);
        op.index_written(IndexWrite::Put, true);
        assert!(op.is_closed());
        assert_eq!(op.expires_at_ms(1_000), None, "index entry may exist");
        op.index_written(IndexWrite::Delete, false);
        assert_eq!(op.expires_at_ms(1_000), None, "failed delete keeps it");
        op.index_written(IndexWrite::None, true);
        assert!(op.indexed, "no write changes nothing");
        op.index_written(IndexWrite::Delete, true);
        assert!(op.expires_at_ms(1_000).is_some());
    }

    #[test]
    fn reindex_forces_a_projection_that_may_delete() {
        let mut op = settled();
        op.projected_version = op.version;
        assert!(op.reindex());
        assert!(op.indexed);
        assert!(op.projected_version < op.version, "a projection is pending");
        op.retire(99_000);
        assert!(!op.reindex(), "a tombstone never projects");
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

    fn status_event(status: Status, t: i64, output: &str) -> OpEvent {
        let mut details = Map::new();
        details.insert("output_file_uri".into(), json!(output));
        OpEvent {
            details,
            ..event(status, t)
        }
    }

    #[test]
    fn nudge_on_open_operation_waits_for_confirmation() {
        let mut op = Operation::register("batches/a", "batches/a", None, 0);
        let mut meta = Map::new();
        meta.insert("user_metadata".into(), json!({"job": 1}));
        assert!(op.request_confirmation(100, meta, Some("jwt_x".into())));
        assert!(op.confirmation_due(100));
        assert_eq!(
            op.status,
            Status::Pending,
            "the nudge itself applies nothing"
        );
        assert_eq!(op.wake_at_ms(1, 0), Some(100));
    }

    #[test]
    fn nudge_on_terminal_operation_has_nothing_to_confirm() {
        let mut op = settled();
        assert!(!op.request_confirmation(3_000, Map::new(), None));
        assert!(op.confirmation.is_none());
    }

    #[test]
    fn replayed_nudges_keep_the_schedule_and_add_metadata() {
        let mut op = Operation::register("batches/a", "batches/a", None, 0);
        op.request_confirmation(100, Map::new(), None);
        op.confirmation_failed(150, 10_000);
        let mut meta = Map::new();
        meta.insert("unverified_user_metadata".into(), json!("x"));
        assert!(op.request_confirmation(200, meta, None));
        let c = op.confirmation.as_ref().unwrap();
        assert_eq!(
            c.due_ms, 10_150,
            "a replay does not buy an earlier status call"
        );
        assert_eq!(c.metadata["unverified_user_metadata"], "x");
    }

    #[test]
    fn confirmation_applies_what_the_status_api_says_with_the_nudge_metadata() {
        let mut op = Operation::register("batches/a", "batches/a", None, 0);
        let mut meta = Map::new();
        meta.insert("user_metadata".into(), json!({"job": 7}));
        op.request_confirmation(100, meta, Some("jwt_x".into()));
        let v = op.confirm_with(status_event(Status::Succeeded, 50, "gs://b/o"), 200, 1_000);
        assert_eq!(v, Verdict::Apply);
        assert_eq!(op.status, Status::Succeeded);
        assert_eq!(op.settled_by, Some(Source::Webhook));
        assert_eq!(op.details["user_metadata"], json!({"job": 7}));
        assert_eq!(op.details["output_file_uri"], "gs://b/o");
        assert!(
            op.confirmation.is_none(),
            "terminal: nothing left to confirm"
        );
        assert!(op.effect_owed());
    }

    #[test]
    fn a_status_api_that_contradicts_the_nudge_wins() {
        // The body said failed; Gemini says running: running is applied, failed never is.
        let mut op = Operation::register("batches/a", "batches/a", None, 0);
        op.request_confirmation(100, Map::new(), None);
        op.confirm_with(event(Status::Running, 50), 200, 1_000);
        assert_eq!(op.status, Status::Running);
        assert!(!op.effect_owed());
        assert_eq!(
            op.confirmation.as_ref().map(|c| c.due_ms),
            Some(1_200),
            "asked again: Gemini may answer a moment behind its webhook"
        );
        for i in 1..MAX_CONFIRM_ATTEMPTS {
            op.confirm_with(event(Status::Running, 50), 1_200 + i64::from(i), 1_000);
        }
        assert!(op.confirmation.is_none(), "then left to the cron");
    }

    #[test]
    fn unknown_to_gemini_ends_the_confirmation() {
        let mut op = Operation::register("batches/a", "batches/a", None, 0);
        op.request_confirmation(100, Map::new(), None);
        op.confirmation_gone();
        assert!(op.confirmation.is_none());
        assert_eq!(op.status, Status::Pending);
    }

    #[test]
    fn alerts_stay_queued_until_the_sink_accepts_them() {
        let mut op = Operation::register("batches/a", "batches/a", None, 0);
        assert!(op.raise_alert(AlertKind::Stuck, 60, 1_000));
        op.projected_version = u64::MAX;
        assert!(
            !op.raise_alert(AlertKind::Stuck, 61, 1_001),
            "raised once per kind"
        );
        let due = op.due_alerts(1_000);
        assert_eq!(due.len(), 1);
        let id = due[0].id.clone();
        op.alert_failed(AlertKind::Stuck, 1_000, 5_000);
        assert!(op.due_alerts(2_000).is_empty());
        assert_eq!(op.wake_at_ms(1, 0), Some(6_000), "the alarm retries it");
        let retry = op.due_alerts(6_000);
        assert_eq!(retry[0].id, id, "the same alert id on every retry");
        assert_eq!(retry[0].attempts, 1);
        op.alert_delivered(AlertKind::Stuck);
        assert!(op.pending_alerts.is_empty());
        assert_eq!(op.alerts, vec![AlertKind::Stuck]);
    }

    #[test]
    fn retirement_keeps_a_tombstone_that_absorbs_late_deliveries() {
        let mut op = settled();
        let c = op.claim(2_000, 600_000).unwrap();
        op.finish(c.token, &AttemptOutcome::Delivered, 2_500, 0);
        op.projected_version = op.version;
        assert_eq!(op.expires_at_ms(10_000), Some(12_500));
        op.retire(12_500);
        assert_eq!(op.expires_at_ms(10_000), None, "a tombstone never expires");
        assert_eq!(
            op.wake_at_ms(10_000, 0),
            None,
            "and never wakes, nor projects"
        );
        // A late replay of the same completion, or a different one: nothing is owed.
        assert_eq!(
            op.apply(&event(Status::Succeeded, 0), 99_000),
            Verdict::Drop(crate::operation::lifecycle::DropReason::Duplicate)
        );
        assert_ne!(op.apply(&event(Status::Failed, 9), 99_000), Verdict::Apply);
        assert!(op.claim(99_000, 600_000).is_none());
        assert!(!op.request_confirmation(99_000, Map::new(), None));
        assert_eq!(op.redeliver(99_000, "x"), Err(OperatorRefusal::Retired));
        assert!(op.effect.done && op.status == Status::Succeeded);
    }

    #[test]
    fn tombstone_is_small() {
        let mut op = Operation::register(
            "batches/abcdefghijklmnopqrstuvwxyz0123456789",
            "projects/my-project/locations/us-central1/batches/abcdefghijklmnopqrstuvwxyz0123456789",
            Some("nightly-review".into()),
            1_700_000_000_000,
        );
        op.apply(
            &status_event(Status::Succeeded, 1_700_000_100_000, &"x".repeat(2_000)),
            1_700_000_100_500,
        );
        let c = op.claim(1_700_000_100_500, 600_000).unwrap();
        op.finish(c.token, &AttemptOutcome::Delivered, 1_700_000_101_000, 0);
        let before = serde_json::to_string(&op).unwrap().len();
        op.retire(1_701_209_701_000);
        let after = serde_json::to_string(&op).unwrap().len();
        assert!(after < before / 3, "{after} bytes vs {before}");
        // Documented in docs/RELIABILITY.md ("Tombstones"): keep the two in step.
        assert!(after <= 700, "tombstone is {after} bytes");
        println!("tombstone: {after} bytes of JSON (the record before: {before})");
    }

    #[test]
    fn failed_ledger_writes_back_off_up_to_a_cap() {
        let mut op = Operation::register("batches/a", "batches/a", None, 0);
        op.projection_failed(10_000);
        assert_eq!(op.projection_due_ms(), 11_000);
        op.projection_failed(11_000);
        assert_eq!(op.projection_due_ms(), 13_000);
        for i in 0..40 {
            op.projection_failed(20_000 + i);
        }
        assert_eq!(op.projection_due_ms(), 20_039 + PROJECTION_RETRY_MAX_MS);
        op.projection_written(op.version, 400_000);
        assert_eq!(
            op.projection_due_ms(),
            401_000,
            "a success resets the backoff"
        );
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
