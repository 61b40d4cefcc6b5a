//! The names of the worker's structured log lines: a documented contract that operators'
//! queries, `scripts/chaos.mjs` and `scripts/bench.mjs` read.
//!
//! Guarantees: a line is one JSON object whose `event` is one of [`LogEvent`]'s names, which
//! are unique and never overridden by a field (renaming one breaks the readers named above);
//! lines never carry a secret.

use serde_json::{Map, Value};

/// Declares the events once: the enum, [`LogEvent::ALL`] and the names.
macro_rules! log_events {
    ($($(#[$doc:meta])* $variant:ident => $name:literal,)*) => {
        /// What a log line reports.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum LogEvent {
            $($(#[$doc])* $variant,)*
        }

        impl LogEvent {
            /// Every event, for the contract checks.
            pub const ALL: &'static [LogEvent] = &[$(LogEvent::$variant,)*];

            /// The `event` field's value.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(LogEvent::$variant => $name,)*
                }
            }
        }
    };
}

log_events! {
    /// Webhook deliveries.
    Delivered => "delivered",
    Duplicate => "duplicate",
    Dropped => "dropped",
    Nudged => "nudged",
    IgnoredUnregistered => "ignored_unregistered",
    IgnoredForgotten => "ignored_forgotten",
    /// A completion older than retention for an operation the gate has no record of (its
    /// storage ended with retention): nothing stored, nothing run.
    IgnoredTooOld => "ignored_too_old",
    /// A nudge named an unregistered operation Gemini does not know: nothing stored.
    StrangerNudge => "stranger_nudge",
    /// A nudge named an unregistered operation and Gemini could not be asked: 503.
    Rejected => "rejected",
    RejectedSummary => "rejected_summary",
    DeadLetter => "dead_letter",
    /// A signed test delivery (Gemini's `:ping`): acknowledged, nothing kept.
    Ping => "ping",
    Unavailable => "unavailable",
    /// Dynamic-webhook keys.
    JwksFetched => "jwks_fetched",
    JwksFetchFailed => "jwks_fetch_failed",
    JwksCacheWriteFailed => "jwks_cache_write_failed",
    JwksImportFailed => "jwks_import_failed",
    /// A nudge's confirmation, and the cron's status calls.
    Confirmed => "confirmed",
    ConfirmWaiting => "confirm_waiting",
    StatusNotFound => "status_not_found",
    StatusUnknownState => "status_unknown_state",
    StatusTransient => "status_transient",
    StatusUnanswered => "status_unanswered",
    StatusUnusable => "status_unusable",
    /// A large status answer read (bytes read and kept), or one the skimmer refused.
    StatusRead => "status_read",
    SettledByReconcile => "settled_by_reconcile",
    /// Side effects.
    EffectDelivered => "effect_delivered",
    EffectFailed => "effect_failed",
    EffectParked => "effect_parked",
    EffectFenced => "effect_fenced",
    /// Operators.
    Registered => "registered",
    /// An action request through the admin API, with who made it and its answer.
    AdminAction => "admin_action",
    RetryNow => "retry_now",
    Redeliver => "redeliver",
    ForgottenByOperator => "forgotten_by_operator",
    SettledByOperator => "settled_by_operator",
    /// Alerts.
    Alert => "alert",
    AlertFailed => "alert_failed",
    /// Owed alerts dropped past their bound while the sink was down.
    AlertDropped => "alert_dropped",
    /// Reconciliation passes.
    ReconcilePass => "reconcile_pass",
    ReconcileJob => "reconcile_job",
    /// A fan-out consumer dropped entries unpolled (too old, or no lease to record them).
    ReconcileJobDropped => "reconcile_job_dropped",
    ReconcileError => "reconcile_error",
    ReconcileLeaseLost => "reconcile_lease_lost",
    ReconcileCursorReset => "reconcile_cursor_reset",
    IndexMissed => "index_missed",
    IndexStale => "index_stale",
    Reindexed => "reindexed",
    WebhookState => "webhook_state",
    WebhookCheckFailed => "webhook_check_failed",
    /// A pass enabled the webhook Gemini disabled for failed deliveries, or could not.
    WebhookEnabled => "webhook_enabled",
    WebhookEnableFailed => "webhook_enable_failed",
    /// Upkeep.
    RetentionExpired => "retention_expired",
    LedgerWriteFailed => "ledger_write_failed",
    StatsFlushFailed => "stats_flush_failed",
    GateSchemaError => "gate_schema_error",
    /// A gate's stored record did not load as it was: recovered (the original kept), or not.
    RecordRecovered => "record_recovered",
    RecordUnreadable => "record_unreadable",
    /// A gate's alarm failed and set itself again; a later run succeeded.
    AlarmFailed => "alarm_failed",
    AlarmRecovered => "alarm_recovered",
    LeaseSchemaError => "lease_schema_error",
    DeskSchemaError => "desk_schema_error",
    /// The strangers' watch could not create its table.
    WatchSchemaError => "watch_schema_error",
    StatsSchemaError => "stats_schema_error",
    ConfigWarning => "config_warning",
    /// What an object invocation used (only with `USAGE_LOG=true`).
    Usage => "usage",
}

impl LogEvent {
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
