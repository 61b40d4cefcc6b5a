//! The worker's own log lines outside the gate ([`crate::operation::gate_log`]), the cron
//! pass (`reconciliation/pass/lines.rs`) and the webhook route
//! ([`crate::inbound::route_log`]): configuration, storage schemas, the admin API, alerts
//! sent, status answers read, and the counters' flushes.
//!
//! Guarantees: each variant is one line whose `event` is [`WorkerLog::event`], one of
//! [`LogEvent::ALL`] (the tests check every variant), with the fields operators' queries and
//! the tests read; a line about an admin request names who made it (`by`: the token's scope
//! and fingerprint, never the token).

use serde::Serialize;
use serde_json::Value;

use crate::telemetry::counters::Tally;
use crate::telemetry::log_event::LogEvent;

/// One line of the worker outside the gate, the pass and the route.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum WorkerLog {
    /// A setting that parses but is unwise (`/healthz` lists the same warnings).
    ConfigWarning { warning: String },
    /// The cron could not start a pass (its configuration does not parse).
    ReconcileError { error: String },
    /// An admin request without a known token.
    Rejected { reason: &'static str },
    /// An admin request with a known token whose scope may not make it (403): the first of a
    /// window in full, the rest counted like any rejection.
    #[serde(rename = "rejected")]
    RejectedScope {
        reason: &'static str,
        method: String,
        path: String,
        /// The scope the request needs.
        needs: &'static str,
        /// Who asked: `{"scope", "fingerprint"}` (an `operation::Actor`).
        by: Value,
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
    /// A large status answer read through the skimmer: what it cost and what was kept.
    StatusRead {
        key: String,
        bytes_read: u64,
        bytes_kept: usize,
        max_chunk: usize,
        arrays_counted: u64,
        values_dropped: u64,
        strings_cut: u64,
        read_ms: i64,
    },
    /// A status answer the skimmer refused (past a cap, or not JSON).
    #[serde(rename = "status_read")]
    StatusReadRefused {
        key: String,
        refused: String,
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
}

impl WorkerLog {
    /// The line's event.
    pub fn event(&self) -> LogEvent {
        match self {
            WorkerLog::ConfigWarning { .. } => LogEvent::ConfigWarning,
            WorkerLog::ReconcileError { .. } => LogEvent::ReconcileError,
            WorkerLog::Rejected { .. } | WorkerLog::RejectedScope { .. } => LogEvent::Rejected,
            WorkerLog::Registered { .. } => LogEvent::Registered,
            WorkerLog::AdminAction { .. } => LogEvent::AdminAction,
            WorkerLog::Alert { .. } => LogEvent::Alert,
            WorkerLog::AlertFailed { .. } => LogEvent::AlertFailed,
            WorkerLog::AlertDropped { .. } => LogEvent::AlertDropped,
            WorkerLog::Unavailable { .. } => LogEvent::Unavailable,
            WorkerLog::StatusRead { .. } | WorkerLog::StatusReadRefused { .. } => {
                LogEvent::StatusRead
            }
            WorkerLog::RejectedSummary { .. } => LogEvent::RejectedSummary,
            WorkerLog::StatsFlushFailed { .. } => LogEvent::StatsFlushFailed,
            WorkerLog::StatsSchemaError { .. } => LogEvent::StatsSchemaError,
            WorkerLog::LeaseSchemaError { .. } => LogEvent::LeaseSchemaError,
            WorkerLog::DeskSchemaError { .. } => LogEvent::DeskSchemaError,
            WorkerLog::WatchSchemaError { .. } => LogEvent::WatchSchemaError,
        }
    }

    /// The line as printed.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn every_variant() -> Vec<WorkerLog> {
        let e = || "e".to_string();
        vec![
            WorkerLog::ConfigWarning { warning: e() },
            WorkerLog::ReconcileError { error: e() },
            WorkerLog::Rejected {
                reason: "admin_unauthorized",
            },
            WorkerLog::RejectedScope {
                reason: "admin_forbidden",
                method: "POST".into(),
                path: "/v1/bulk/redeliver".into(),
                needs: "admin",
                by: json!({"scope": "read", "fingerprint": "0a1b2c3d"}),
            },
            WorkerLog::Registered {
                key: "batches/a".into(),
                by: json!({"scope": "register", "fingerprint": "0a1b2c3d"}),
            },
            WorkerLog::AdminAction {
                method: "POST".into(),
                path: "/v1/operations/batches/a/retry".into(),
                status: 200,
                by: json!({"scope": "admin", "fingerprint": "0a1b2c3d"}),
            },
            WorkerLog::Alert {
                alert: json!("stuck"),
                key: json!("batches/a"),
                age_seconds: json!(60),
                text: json!("t"),
            },
            WorkerLog::AlertFailed {
                alert: json!("stuck"),
                key: Some(json!("batches/a")),
                answer: "500".into(),
            },
            WorkerLog::Unavailable {
                error: e(),
                key: None,
                bulk: None,
            },
            WorkerLog::StatusRead {
                key: "batches/a".into(),
                bytes_read: 1,
                bytes_kept: 1,
                max_chunk: 1,
                arrays_counted: 0,
                values_dropped: 0,
                strings_cut: 0,
                read_ms: 3,
            },
            WorkerLog::StatusReadRefused {
                key: "batches/a".into(),
                refused: e(),
                read_ms: 3,
            },
            WorkerLog::RejectedSummary {
                counts: Tally::new(),
            },
            WorkerLog::StatsFlushFailed { error: e() },
            WorkerLog::StatsSchemaError { error: e() },
            WorkerLog::LeaseSchemaError { error: e() },
            WorkerLog::DeskSchemaError { error: e() },
            WorkerLog::WatchSchemaError { error: e() },
        ]
    }

    #[test]
    fn every_line_names_a_declared_event() {
        for line in every_variant() {
            let printed = line.to_value();
            assert_eq!(printed["event"], line.event().as_str(), "{printed}");
            assert!(LogEvent::ALL.contains(&line.event()));
        }
    }

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
            WorkerLog::StatusReadRefused {
                key: "batches/a".into(),
                refused: "too large".into(),
                read_ms: 2,
            }
            .to_value(),
            json!({"event": "status_read", "key": "batches/a", "refused": "too large", "read_ms": 2})
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
