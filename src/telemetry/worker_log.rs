//! The worker's own log lines outside the gate ([`crate::operation::gate::log`]), the cron
//! pass (`reconciliation/pass/lines.rs`) and the webhook route
//! ([`crate::inbound::route_log`]): configuration, storage schemas, the admin API, alerts
//! sent, status answers read, and the counters' flushes.
//!
//! Guarantees: each variant is one line whose `event` is the variant's name (the serde tag,
//! its only spelling: see [`crate::telemetry::log_event`]), with the fields operators'
//! queries and the tests read; a line about an admin request names who made it (`by`: the
//! token's scope and fingerprint, never the token).

use serde::Serialize;
use serde_json::Value;

use crate::telemetry::counters::Tally;

/// One line of the worker outside the gate, the pass and the route.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum WorkerLog {
    /// A setting that parses but is unwise (`/healthz` lists the same warnings).
    ConfigWarning { warning: String },
    /// The cron could not start a pass (its configuration does not parse).
    ReconcileError { error: String },
    /// An admin request without a known token, or (`scope`) with a known token whose scope
    /// may not make it (403): the first of a window in full, the rest counted like any
    /// rejection.
    Rejected {
        reason: &'static str,
        #[serde(flatten, skip_serializing_if = "Option::is_none")]
        scope: Option<ScopeRefused>,
    },
    /// An operation registered through the admin API, and by whom (`{"scope", "fingerprint"}`).
    Registered { key: String, by: Value },
    /// An operator's action request through the admin API (retry, redeliver, forget, settle,
    /// repair, bulk), whatever its answer: who (`{"scope", "fingerprint"}`), what and how it
    /// was answered.
    AdminAction {
        method: String,
        path: String,
        status: u16,
        by: Value,
    },
    /// An alert, logged whether or not a sink is configured. The fields are the alert body's,
    /// as it carries them (`key` is null for an alert about no one operation).
    Alert {
        alert: Value,
        key: Value,
        age_seconds: Value,
        text: Value,
    },
    /// The sink did not accept an alert; it is sent again later. `key` is absent for the
    /// strangers' guard's aggregated alert.
    AlertFailed {
        alert: Value,
        #[serde(skip_serializing_if = "Option::is_none")]
        key: Option<Value>,
        answer: String,
    },
    /// Alerts owed to a sink that stayed down were dropped, the oldest first, past the bound
    /// kept for it; `owner` is what owed them (a destination's label).
    AlertDropped { owner: String, dropped: u64 },
    /// A request or call answered 503: what was unavailable.
    Unavailable {
        error: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        key: Option<String>,
        /// The bulk action that met it, if one.
        #[serde(skip_serializing_if = "Option::is_none")]
        bulk: Option<&'static str>,
    },
    /// A large status answer read through the skimmer, or one it refused.
    StatusRead {
        key: String,
        #[serde(flatten)]
        read: StatusRead,
        read_ms: i64,
    },
    /// Rejections counted since the last summary, by reason.
    RejectedSummary { counts: Tally },
    /// Counters that could not reach their stats shard (they are lost; the log says so).
    StatsFlushFailed { error: String },
    /// A stats shard could not create its tables.
    StatsSchemaError { error: String },
    /// The lease object could not create its tables.
    LeaseSchemaError { error: String },
    /// A destination's desk could not create its tables.
    DeskSchemaError { error: String },
    /// The strangers' watch could not create its table.
    WatchSchemaError { error: String },
    /// A retired names' shard could not create its table.
    RetiredSchemaError { error: String },
    /// A retired names' shard stored a batch of keeps: how many names, in how many row writes.
    RetiredNamesKept { names: usize, rows: usize },
}

/// Why a known token's request was refused: what it asked, and what it needed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScopeRefused {
    pub method: String,
    pub path: String,
    /// The scope the request needs.
    pub needs: &'static str,
    /// Who asked: `{"scope", "fingerprint"}` (an `operation::Actor`).
    pub by: Value,
}

/// What the skimmer made of a large status answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum StatusRead {
    /// Read: what it cost and what was kept.
    Kept {
        bytes_read: u64,
        bytes_kept: usize,
        max_chunk: usize,
        arrays_counted: u64,
        values_dropped: u64,
        strings_cut: u64,
    },
    /// Refused (past a cap, or not JSON).
    Refused { refused: String },
}

impl WorkerLog {
    /// The line as printed.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lines_read_as_operators_query_them() {
        assert_eq!(
            WorkerLog::AlertFailed {
                alert: json!("stranger_nudges"),
                key: None,
                answer: "configuration: x".into(),
            }
            .to_value(),
            json!({"event": "alert_failed", "alert": "stranger_nudges", "answer": "configuration: x"})
        );
        assert_eq!(
            WorkerLog::Alert {
                alert: json!("webhook_disabled"),
                key: Value::Null,
                age_seconds: Value::Null,
                text: json!("t"),
            }
            .to_value(),
            json!({"event": "alert", "alert": "webhook_disabled", "key": null, "age_seconds": null, "text": "t"})
        );
        assert_eq!(
            WorkerLog::StatusRead {
                key: "batches/a".into(),
                read: StatusRead::Refused {
                    refused: "too large".into()
                },
                read_ms: 2,
            }
            .to_value(),
            json!({"event": "status_read", "key": "batches/a", "refused": "too large", "read_ms": 2})
        );
        assert_eq!(
            WorkerLog::StatusRead {
                key: "batches/a".into(),
                read: StatusRead::Kept {
                    bytes_read: 9,
                    bytes_kept: 5,
                    max_chunk: 4,
                    arrays_counted: 1,
                    values_dropped: 2,
                    strings_cut: 3,
                },
                read_ms: 2,
            }
            .to_value(),
            json!({"event": "status_read", "key": "batches/a", "bytes_read": 9, "bytes_kept": 5,
                   "max_chunk": 4, "arrays_counted": 1, "values_dropped": 2, "strings_cut": 3,
                   "read_ms": 2})
        );
        assert_eq!(
            WorkerLog::Rejected {
                reason: "admin_unauthorized",
                scope: None
            }
            .to_value(),
            json!({"event": "rejected", "reason": "admin_unauthorized"})
        );
        assert_eq!(
            WorkerLog::Rejected {
                reason: "admin_forbidden",
                scope: Some(ScopeRefused {
                    method: "POST".into(),
                    path: "/v1/bulk/redeliver".into(),
                    needs: "admin",
                    by: json!({"scope": "read", "fingerprint": "0a1b2c3d"}),
                }),
            }
            .to_value(),
            json!({"event": "rejected", "reason": "admin_forbidden", "method": "POST",
                   "path": "/v1/bulk/redeliver", "needs": "admin",
                   "by": {"scope": "read", "fingerprint": "0a1b2c3d"}})
        );
        assert_eq!(
            WorkerLog::Unavailable {
                error: "gate down".into(),
                key: Some("batches/a".into()),
                bulk: Some("retry"),
            }
            .to_value(),
            json!({"event": "unavailable", "error": "gate down", "key": "batches/a", "bulk": "retry"})
        );
    }
}
