//! The names of the worker's structured log lines: a documented contract that operators'
//! queries, `scripts/chaos.mjs` and `scripts/bench.mjs` read.
//!
//! Guarantees: a line is one JSON object whose `event` is one of [`LogEvent`]'s names, which
//! are unique and never overridden by a field (renaming one breaks the readers named above);
//! lines never carry a secret.

use serde_json::{Map, Value};

/// What a log line reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogEvent {
    // Webhook deliveries.
    Delivered,
    Duplicate,
    Dropped,
    Nudged,
    IgnoredUnregistered,
    Rejected,
    RejectedSummary,
    DeadLetter,
    Unavailable,
    // A nudge's confirmation with the status API.
    Confirmed,
    ConfirmWaiting,
    StatusNotFound,
    StatusUnknownState,
    // Side effects.
    EffectDelivered,
    EffectFailed,
    EffectParked,
    EffectFenced,
    // Operators.
    Registered,
    RetryNow,
    Redeliver,
    ForgottenByOperator,
    // Alerts.
    Alert,
    AlertFailed,
    // The gate's own upkeep.
    RetentionExpired,
    Reindexed,
    LedgerWriteFailed,
    StatsFlushFailed,
    GateSchemaError,
    ConfigWarning,
}

impl LogEvent {
    /// Every event, for documentation checks.
    pub const ALL: [LogEvent; 29] = [
        LogEvent::Delivered,
        LogEvent::Duplicate,
        LogEvent::Dropped,
        LogEvent::Nudged,
        LogEvent::IgnoredUnregistered,
        LogEvent::Rejected,
        LogEvent::RejectedSummary,
        LogEvent::DeadLetter,
        LogEvent::Unavailable,
        LogEvent::Confirmed,
        LogEvent::ConfirmWaiting,
        LogEvent::StatusNotFound,
        LogEvent::StatusUnknownState,
        LogEvent::EffectDelivered,
        LogEvent::EffectFailed,
        LogEvent::EffectParked,
        LogEvent::EffectFenced,
        LogEvent::Registered,
        LogEvent::RetryNow,
        LogEvent::Redeliver,
        LogEvent::ForgottenByOperator,
        LogEvent::Alert,
        LogEvent::AlertFailed,
        LogEvent::RetentionExpired,
        LogEvent::Reindexed,
        LogEvent::LedgerWriteFailed,
        LogEvent::StatsFlushFailed,
        LogEvent::GateSchemaError,
        LogEvent::ConfigWarning,
    ];

    /// The `event` field's value.
    pub fn as_str(self) -> &'static str {
        match self {
            LogEvent::Delivered => "delivered",
            LogEvent::Duplicate => "duplicate",
            LogEvent::Dropped => "dropped",
            LogEvent::Nudged => "nudged",
            LogEvent::IgnoredUnregistered => "ignored_unregistered",
            LogEvent::Rejected => "rejected",
            LogEvent::RejectedSummary => "rejected_summary",
            LogEvent::DeadLetter => "dead_letter",
            LogEvent::Unavailable => "unavailable",
            LogEvent::Confirmed => "confirmed",
            LogEvent::ConfirmWaiting => "confirm_waiting",
            LogEvent::StatusNotFound => "status_not_found",
            LogEvent::StatusUnknownState => "status_unknown_state",
            LogEvent::EffectDelivered => "effect_delivered",
            LogEvent::EffectFailed => "effect_failed",
            LogEvent::EffectParked => "effect_parked",
            LogEvent::EffectFenced => "effect_fenced",
            LogEvent::Registered => "registered",
            LogEvent::RetryNow => "retry_now",
            LogEvent::Redeliver => "redeliver",
            LogEvent::ForgottenByOperator => "forgotten_by_operator",
            LogEvent::Alert => "alert",
            LogEvent::AlertFailed => "alert_failed",
            LogEvent::RetentionExpired => "retention_expired",
            LogEvent::Reindexed => "reindexed",
            LogEvent::LedgerWriteFailed => "ledger_write_failed",
            LogEvent::StatsFlushFailed => "stats_flush_failed",
            LogEvent::GateSchemaError => "gate_schema_error",
            LogEvent::ConfigWarning => "config_warning",
        }
    }

    /// A line: `{"event": <name>, ...fields}` (fields must be a JSON object; the name wins).
    pub fn line(self, fields: Value) -> Value {
        let mut line = match fields {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        line.insert("event".into(), Value::String(self.as_str().into()));
        Value::Object(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_are_unique_snake_case() {
        let mut seen = std::collections::HashSet::new();
        for e in LogEvent::ALL {
            let name = e.as_str();
            assert!(seen.insert(name), "{name} twice");
            assert!(
                name.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{name}"
            );
        }
    }

    #[test]
    fn the_event_name_cannot_be_overridden_by_a_field() {
        let line = LogEvent::Duplicate.line(json!({"event": "x", "key": "batches/a"}));
        assert_eq!(line["event"], "duplicate");
        assert_eq!(line["key"], "batches/a");
    }
}
