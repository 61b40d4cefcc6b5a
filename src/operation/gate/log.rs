//! The gate's log lines, typed: each variant is one line, its name under `event` (see
//! [`LogEvent`]), its fields as operators' queries, the chaos oracle and the benchmark read
//! them.
//!
//! Guarantees: every line the gate (its steps and its Durable Object) prints is a
//! [`GateLog`], whose `event` is the name of [`GateLog::event`], one of [`LogEvent::ALL`]
//! (the tests check both for every variant).

use serde::Serialize;
use serde_json::Value;

use crate::operation::Actor;
use crate::telemetry::log_event::LogEvent;

/// One gate log line.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum GateLog {
    ForgottenByOperator {
        key: String,
        reason: String,
        /// Who asked, through the admin API.
        #[serde(skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
    Reindexed {
        key: String,
        status: String,
    },
    SettledByOperator {
        key: String,
        status: String,
        reason: String,
        /// Who asked, through the admin API.
        #[serde(skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
    RetryNow {
        key: String,
        generation: u32,
        reason: String,
        /// Who asked, through the admin API.
        #[serde(skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
    Redeliver {
        key: String,
        generation: u32,
        reason: String,
        /// Who asked, through the admin API.
        #[serde(skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
    /// Retention ended: everything deleted but the tombstone, whose record is
    /// `tombstone_bytes` of JSON (the row it keeps for good; docs/PERFORMANCE.md counts it).
    RetentionExpired {
        key: String,
        tombstone_bytes: usize,
    },
    /// A confirmation's answer applied (or dropped) by the reducer.
    Confirmed {
        key: String,
        status: String,
        verdict: &'static str,
        still_confirming: bool,
    },
    StatusUnknownState {
        key: String,
        state: String,
    },
    StatusNotFound {
        key: String,
        path: &'static str,
    },
    StatusUnusable {
        key: String,
        path: &'static str,
        error: String,
        still_confirming: bool,
    },
    ConfirmWaiting {
        key: String,
        error: String,
        retry_in_ms: i64,
    },
    EffectDelivered(AttemptLine),
    EffectFailed(AttemptLine),
    EffectParked(AttemptLine),
    EffectFenced(AttemptLine),
    StatsFlushFailed {
        key: String,
        error: String,
    },
    LedgerWriteFailed {
        key: String,
        error: String,
        failures: u32,
    },
    /// A run of the alarm succeeded after failures.
    AlarmRecovered {
        key: Option<String>,
    },
    AlarmFailed {
        key: Option<String>,
        error: String,
        failures: u32,
        failing_since: String,
        retry_in_ms: i64,
    },
    GateSchemaError {
        error: String,
    },
    RecordRecovered {
        key: String,
        how: &'static str,
        error: String,
        raw_bytes: usize,
    },
    RecordUnreadable {
        error: String,
        raw_bytes: usize,
    },
}

/// How one side-effect attempt ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttemptLine {
    pub key: String,
    pub status: String,
    pub attempt: u32,
    pub generation: u32,
    pub answer: String,
    pub ms: i64,
    /// From the outcome's settlement (just before the delivery was answered) to this
    /// attempt's start: the answer never waits for it; the benchmark reports it.
    pub after_settled_ms: Option<i64>,
    pub next_attempt_ms: Option<i64>,
}

impl GateLog {
    /// The line's event.
    pub fn event(&self) -> LogEvent {
        match self {
            GateLog::ForgottenByOperator { .. } => LogEvent::ForgottenByOperator,
            GateLog::Reindexed { .. } => LogEvent::Reindexed,
            GateLog::SettledByOperator { .. } => LogEvent::SettledByOperator,
            GateLog::RetryNow { .. } => LogEvent::RetryNow,
            GateLog::Redeliver { .. } => LogEvent::Redeliver,
            GateLog::RetentionExpired { .. } => LogEvent::RetentionExpired,
            GateLog::Confirmed { .. } => LogEvent::Confirmed,
            GateLog::StatusUnknownState { .. } => LogEvent::StatusUnknownState,
            GateLog::StatusNotFound { .. } => LogEvent::StatusNotFound,
            GateLog::StatusUnusable { .. } => LogEvent::StatusUnusable,
            GateLog::ConfirmWaiting { .. } => LogEvent::ConfirmWaiting,
            GateLog::EffectDelivered(_) => LogEvent::EffectDelivered,
            GateLog::EffectFailed(_) => LogEvent::EffectFailed,
            GateLog::EffectParked(_) => LogEvent::EffectParked,
            GateLog::EffectFenced(_) => LogEvent::EffectFenced,
            GateLog::StatsFlushFailed { .. } => LogEvent::StatsFlushFailed,
            GateLog::LedgerWriteFailed { .. } => LogEvent::LedgerWriteFailed,
            GateLog::AlarmRecovered { .. } => LogEvent::AlarmRecovered,
            GateLog::AlarmFailed { .. } => LogEvent::AlarmFailed,
            GateLog::GateSchemaError { .. } => LogEvent::GateSchemaError,
            GateLog::RecordRecovered { .. } => LogEvent::RecordRecovered,
            GateLog::RecordUnreadable { .. } => LogEvent::RecordUnreadable,
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

    fn attempt() -> AttemptLine {
        AttemptLine {
            key: "batches/a".into(),
            status: "succeeded".into(),
            attempt: 1,
            generation: 1,
            answer: "2xx".into(),
            ms: 5,
            after_settled_ms: Some(3),
            next_attempt_ms: None,
        }
    }

    fn every_variant() -> Vec<GateLog> {
        let key = || "batches/a".to_string();
        vec![
            GateLog::ForgottenByOperator {
                key: key(),
                reason: "r".into(),
                by: None,
            },
            GateLog::Reindexed {
                key: key(),
                status: "pending".into(),
            },
            GateLog::SettledByOperator {
                key: key(),
                status: "failed".into(),
                reason: "r".into(),
                by: None,
            },
            GateLog::RetryNow {
                key: key(),
                generation: 1,
                reason: "r".into(),
                by: None,
            },
            GateLog::Redeliver {
                key: key(),
                generation: 2,
                reason: "r".into(),
                by: Some(Actor {
                    scope: "admin".into(),
                    fingerprint: "0a1b2c3d".into(),
                }),
            },
            GateLog::RetentionExpired {
                key: key(),
                tombstone_bytes: 500,
            },
            GateLog::Confirmed {
                key: key(),
                status: "succeeded".into(),
                verdict: "applied",
                still_confirming: false,
            },
            GateLog::StatusUnknownState {
                key: key(),
                state: "odd".into(),
            },
            GateLog::StatusNotFound {
                key: key(),
                path: "confirmation",
            },
            GateLog::StatusUnusable {
                key: key(),
                path: "confirmation",
                error: "too large".into(),
                still_confirming: true,
            },
            GateLog::ConfirmWaiting {
                key: key(),
                error: "GEMINI_API_KEY is not set".into(),
                retry_in_ms: 1_000,
            },
            GateLog::EffectDelivered(attempt()),
            GateLog::EffectFailed(attempt()),
            GateLog::EffectParked(attempt()),
            GateLog::EffectFenced(attempt()),
            GateLog::StatsFlushFailed {
                key: key(),
                error: "e".into(),
            },
            GateLog::LedgerWriteFailed {
                key: key(),
                error: "e".into(),
                failures: 2,
            },
            GateLog::AlarmRecovered { key: None },
            GateLog::AlarmFailed {
                key: Some(key()),
                error: "e".into(),
                failures: 3,
                failing_since: "2026-01-01T00:00:00Z".into(),
                retry_in_ms: 4_000,
            },
            GateLog::GateSchemaError { error: "e".into() },
            GateLog::RecordRecovered {
                key: key(),
                how: "pruned",
                error: "e".into(),
                raw_bytes: 9,
            },
            GateLog::RecordUnreadable {
                error: "e".into(),
                raw_bytes: 9,
            },
        ]
    }

    #[test]
    fn every_line_s_event_is_a_documented_log_event() {
        for line in every_variant() {
            let printed = line.to_value();
            assert_eq!(printed["event"], line.event().as_str(), "{printed}");
            assert!(LogEvent::ALL.contains(&line.event()), "{printed}");
        }
    }

    #[test]
    fn a_line_prints_as_the_event_with_its_fields() {
        let line = GateLog::EffectFailed(AttemptLine {
            next_attempt_ms: Some(9),
            ..attempt()
        });
        assert_eq!(
            line.to_value(),
            json!({"event": "effect_failed", "key": "batches/a", "status": "succeeded",
                "attempt": 1, "generation": 1, "answer": "2xx", "ms": 5,
                "after_settled_ms": 3, "next_attempt_ms": 9})
        );
        assert_eq!(
            GateLog::RetryNow {
                key: "batches/a".into(),
                generation: 1,
                reason: "r".into(),
                by: Some(Actor {
                    scope: "read".into(),
                    fingerprint: "0a1b2c3d".into(),
                }),
            }
            .to_value(),
            json!({"event": "retry_now", "key": "batches/a", "generation": 1, "reason": "r",
                "by": {"scope": "read", "fingerprint": "0a1b2c3d"}})
        );
        assert_eq!(
            GateLog::AlarmRecovered { key: None }.to_value(),
            LogEvent::AlarmRecovered.line(json!({ "key": null }))
        );
        assert_eq!(
            GateLog::StatusNotFound {
                key: "batches/a".into(),
                path: "confirmation"
            }
            .to_value(),
            LogEvent::StatusNotFound.line(json!({"key": "batches/a", "path": "confirmation"}))
        );
    }
}
