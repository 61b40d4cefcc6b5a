//! What a pass says: its `reconcile_pass` summary and every other log line it writes, as
//! types.
//!
//! Guarantees: each line serializes (through [`PassLog::to_value`]) to one JSON object whose
//! `event` is the variant's name (the serde tag, its only spelling: see
//! [`crate::telemetry::log_event`]); the fields are the ones the
//! chaos and bench scripts, the dashboard and the tests read, with `null` for an absent
//! value except where a field is left out (`key` on a pass-level `reconcile_error`).

use serde::Serialize;
use serde_json::Value;

use super::stop::Stop;
use crate::operation::ledger::OpenCounts;
use crate::operation::lifecycle::Status;

/// What a pass did: the `reconcile_pass` log line, and the summary the lease keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PassReport {
    /// Entries returned by KV lists, index and audit together.
    pub listed: u64,
    /// KV list calls, index and audit together.
    pub kv_lists: u64,
    /// Of those, the routine walk's over `open:`.
    pub index_listed: u64,
    pub index_kv_lists: u64,
    /// Index entries decided on (the rest of the listed index waits for the next pass).
    pub visited: u64,
    /// What the listed index holds, when this pass listed it whole (`null` otherwise).
    pub open: Option<OpenCounts>,
    /// Whether the audit over `op:` ran in this pass, and what it did.
    pub audit: bool,
    pub audit_listed: u64,
    pub audit_kv_lists: u64,
    /// `op:` entries that may need work and were not in the index: acted on.
    pub audit_found: u64,
    /// Gates asked to project again: by the audit (an index entry missing, or left behind),
    /// or by the routine walk when a gate answered that the operation it was listed for is
    /// closed, its side effect done (a lost delete, or a lagging list).
    pub reindexed: u64,
    pub audit_complete: bool,
    pub bodies_read: u64,
    pub status_calls: u64,
    /// Status calls that timed out or failed to connect; their entries were skipped.
    pub status_unanswered: u64,
    pub settled: u64,
    pub effects_retried: u64,
    pub alerts: u64,
    pub gate_calls: u64,
    /// Index entries scheduled on the fan-out queue, and the `sendBatch` calls that took them
    /// (a consumer's: the entries it sent back after a wait).
    pub fed: u64,
    pub queue_sends: u64,
    /// Entries a consumer dropped unpolled: past their message's age bound, or to be sent back
    /// with no lease to record them. They stay open in the index for the next coverage.
    pub dropped: u64,
    pub errors: u64,
    pub subrequests: u32,
    pub lease_renewals: u64,
    pub complete: bool,
    /// Another pass held the lease: this one did nothing.
    #[serde(rename = "lease_busy")]
    pub skipped_busy: bool,
    pub stopped: Option<Stop>,
    pub elapsed_ms: i64,
}

/// Why a consumer dropped entries unpolled (the `reason` of its line).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JobDrop {
    /// `JOB_MAX_AGE_MS` past the message's first slot, or its wait would end there.
    Expired,
    /// They were to be sent back, but the lease could not record where their slots end.
    LeaseUnreachable,
}

/// One log line of a pass.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum PassLog {
    /// The pass's summary, its last line.
    ReconcilePass(PassReport),
    /// A queue consumer's summary of one fan-out message.
    ReconcileJob(PassReport),
    /// Something failed: the lease, KV, a gate call. `key` names the operation, if one.
    ReconcileError {
        #[serde(skip_serializing_if = "Option::is_none")]
        key: Option<String>,
        error: String,
    },
    /// A consumer dropped entries of a fan-out message unpolled (`reason`: `expired` or
    /// `lease_unreachable`); `age_ms` is how long past its first slot, `hops` how many times
    /// it had been sent back.
    ReconcileJobDropped {
        reason: JobDrop,
        entries: u64,
        hops: u32,
        age_ms: i64,
        keys: Vec<String>,
    },
    /// A renewal was refused: another pass holds the lease, so this one saves nothing.
    ReconcileLeaseLost {
        holder: String,
    },
    /// The saved index cursor was refused by KV: the index is listed from its start.
    ReconcileCursorReset {
        error: String,
    },
    /// The audit found an operation that may need work missing from the index.
    IndexMissed {
        key: String,
    },
    /// An index entry shows an operation that is closed: its gate is asked to project again.
    IndexStale {
        key: String,
    },
    /// The Gemini webhook's state, as its listing shows it (`not_found` when absent).
    WebhookState {
        webhook: String,
        state: String,
    },
    WebhookCheckFailed {
        webhook: String,
        error: String,
    },
    /// The pass enabled the webhook again (it was `was`); `swept`: whether every open
    /// operation's poll then went on the fan-out queue (false: no queue is bound).
    WebhookEnabled {
        webhook: String,
        was: String,
        swept: bool,
    },
    /// The call enabling the webhook failed: it stays as it was, and the next pass tries again.
    WebhookEnableFailed {
        webhook: String,
        error: String,
    },
    /// A status call got no answer (`timeout`, or the network error); `backoff_secs` when
    /// this made every status call wait.
    StatusUnanswered {
        key: String,
        answer: String,
        backoff_secs: Option<i64>,
    },
    StatusNotFound {
        key: String,
    },
    /// A 429 or 5xx (`answer`): no status call until `retry_after_secs` have passed.
    StatusTransient {
        key: String,
        retry_after_secs: i64,
        answer: u16,
    },
    StatusUnusable {
        key: String,
        error: String,
    },
    StatusUnknownState {
        key: String,
        state: String,
    },
    SettledByReconcile {
        key: String,
        status: Status,
    },
}

impl PassLog {
    /// The line as it is logged.
    pub fn to_value(&self) -> Value {
        // A line that cannot serialize is reported, not lost (a pass-level error always can).
        serde_json::to_value(self).unwrap_or_else(|e| {
            serde_json::to_value(PassLog::error(e.to_string())).unwrap_or_default()
        })
    }

    /// A pass-level failure (no operation named).
    pub(crate) fn error(error: impl Into<String>) -> PassLog {
        let error = error.into();
        PassLog::ReconcileError { key: None, error }
    }
}

impl PassReport {
    /// The report as its log line and the lease's summary show it.
    pub fn to_value(&self) -> Value {
        PassLog::ReconcilePass(self.clone()).to_value()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lines_keep_their_fields() {
        assert_eq!(
            PassLog::error("lease: down").to_value(),
            json!({"event": "reconcile_error", "error": "lease: down"}),
            "no key on a pass-level error"
        );
        assert_eq!(
            PassLog::StatusUnanswered {
                key: "batches/a".into(),
                answer: "timeout".into(),
                backoff_secs: None
            }
            .to_value(),
            json!({"event": "status_unanswered", "key": "batches/a", "answer": "timeout", "backoff_secs": null})
        );
        assert_eq!(
            PassLog::SettledByReconcile {
                key: "batches/a".into(),
                status: Status::Failed
            }
            .to_value(),
            json!({"event": "settled_by_reconcile", "key": "batches/a", "status": "failed"})
        );
        assert_eq!(
            PassLog::StatusTransient {
                key: "batches/a".into(),
                retry_after_secs: 60,
                answer: 503
            }
            .to_value(),
            json!({"event": "status_transient", "key": "batches/a", "retry_after_secs": 60, "answer": 503})
        );
    }

    #[test]
    fn the_summary_line_has_every_counter_the_readers_use() {
        let report = PassReport {
            skipped_busy: true,
            stopped: Some(Stop::HeldForBackoff),
            subrequests: 3,
            ..PassReport::default()
        };
        let json = report.to_value();
        let fields: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            fields,
            [
                "alerts",
                "audit",
                "audit_complete",
                "audit_found",
                "audit_kv_lists",
                "audit_listed",
                "bodies_read",
                "complete",
                "dropped",
                "effects_retried",
                "elapsed_ms",
                "errors",
                "event",
                "fed",
                "gate_calls",
                "index_kv_lists",
                "index_listed",
                "kv_lists",
                "lease_busy",
                "lease_renewals",
                "listed",
                "open",
                "queue_sends",
                "reindexed",
                "settled",
                "status_calls",
                "status_unanswered",
                "stopped",
                "subrequests",
                "visited",
            ]
        );
        assert_eq!(json["event"], "reconcile_pass");
        assert_eq!(json["lease_busy"], true);
        assert_eq!(json["stopped"], "held_for_backoff");
        assert_eq!(json["subrequests"], 3);
        assert_eq!(
            PassReport::default().to_value()["stopped"],
            Value::Null,
            "a pass that never walked"
        );
    }
}
