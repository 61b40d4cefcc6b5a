//! What operators did to an operation, who and why: forgetting it, settling it by hand, and
//! the unusable status answer kept for them; [`Actor`] names who acted.
//!
//! Guarantees: each note is kept for the retention period (a tombstone keeps only when);
//! a refused command changes nothing and says why ([`OperatorRefusal`]).

use serde::{Deserialize, Serialize};
use serde_json::{json, Map};

use crate::operation::alert::AlertKind;
use crate::operation::lifecycle::{Source, Status};
use crate::operation::record::{OpEvent, Operation};

/// Who acted through the admin API: the scope of the token presented (`admin`,
/// `register`, ...) and its fingerprint (never the token). Carried by an operator's command
/// into the history row and the log line it makes, so an operator can tell who did what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actor {
    pub scope: String,
    pub fingerprint: String,
}

/// When and why an operator acted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorNote {
    pub at_ms: i64,
    pub reason: String,
}

/// The operator-facing notes of a record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct OperatorNotes {
    /// Why the last unusable status-API answer could not be used (too large, not JSON),
    /// kept for the operator who settles the operation by hand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) unusable_status: Option<String>,
    /// Set when an operator stopped tracking the operation: no more polling, alerts or
    /// side-effect attempts; the record stays for the retention period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) forgotten: Option<OperatorNote>,
    /// Deliberate redeliveries an operator asked for, newest last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) redeliveries: Vec<OperatorNote>,
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
    /// A bulk redelivery run's cut-off: the effect was sent at or after it.
    SentSinceCutoff,
    /// Retry-now on a job's effect that waits for its batch's results: it is built once they
    /// settle, so nothing would go; the results' own retry is what moves them.
    ResultsOwed,
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
            OperatorRefusal::SentSinceCutoff => {
                "the side effect was sent at or after this run's sent_before; a run with a later sent_before sends it again"
            }
            OperatorRefusal::ResultsOwed => {
                "the side effect waits for the batch's results; send them again with POST /v1/operations/{name}/results/retry"
            }
        }
    }
}

impl Operation {
    /// Refuses an operator's command on a tombstone, then on a forgotten operation: nothing
    /// runs for either any more.
    pub(super) fn refuse_untracked(&self) -> Result<(), OperatorRefusal> {
        if self.retired_at_ms.is_some() {
            return Err(OperatorRefusal::Retired);
        }
        if self.notes.forgotten.is_some() {
            return Err(OperatorRefusal::Forgotten);
        }
        Ok(())
    }

    /// Stops tracking the operation (recorded, not erased). Idempotent.
    /// Nothing runs for it afterwards: a waiting confirmation and queued alerts are dropped,
    /// and no nudge asks the status API again or raises an alert.
    pub fn forget(&mut self, now_ms: i64, reason: &str) -> bool {
        // A tombstone runs nothing any more: there is nothing to stop, and it stays as it is.
        if self.notes.forgotten.is_some() || self.retired_at_ms.is_some() {
            return false;
        }
        let (at_ms, reason) = (now_ms, reason.to_string());
        self.notes.forgotten = Some(OperatorNote { at_ms, reason });
        self.effect.claim = None;
        self.confirmation = None;
        self.pending_alerts.clear();
        self.changed();
        true
    }

    /// A status-API answer could not be used (`reason`: too large, not JSON): kept for the
    /// operator and alerted once (the alert says why). False when nothing changed.
    pub fn status_unusable(&mut self, reason: &str, age_seconds: i64, now_ms: i64) -> bool {
        if self.status.is_terminal() || self.refuse_untracked().is_err() {
            return false;
        }
        let reason: String = reason.chars().take(300).collect();
        let changed = self.notes.unusable_status.as_deref() != Some(reason.as_str());
        self.notes.unusable_status = Some(reason);
        let raised = self.raise_alert(AlertKind::StatusUnusable, age_seconds, now_ms);
        if changed && !raised {
            self.changed();
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
        self.refuse_untracked()?;
        if self.status.is_terminal() || !status.is_terminal() {
            return Err(OperatorRefusal::AlreadySettled);
        }
        let provider = json!({"operator_reason": reason});
        let details = Map::from_iter([(crate::operation::details::PROVIDER.into(), provider)]);
        let details = crate::operation::details::normalize_details(&details);
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
}
