//! The gate's log lines, typed: each variant is one line, its name under `event`, its fields
//! as operators' queries, the chaos oracle and the benchmark read them.
//!
//! Guarantees: every line the gate (its steps and its Durable Object) prints is a
//! [`GateLog`], whose `event` is the variant's name (the serde tag, its only spelling: see
//! [`crate::telemetry::log_event`]).

use serde::Serialize;
use serde_json::Value;

use crate::operation::Actor;

/// One gate log line (an operator's `by`: who asked, through the admin API).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum GateLog {
    /// A `"results": "each"` batch's results file is gone or unreadable: its unread results
    /// are parked (one alert).
    ResultsFileUnread {
        key: String,
        reason: String,
    },
    /// A batch's result senders answered nothing for `silent_ms` while `waiting` results wait
    /// (one alert; the results are sent again with backoff).
    ResultSendersSilent {
        key: String,
        waiting: u64,
        silent_ms: i64,
    },
    /// An operator put parked results back, to be sent again under their first ids.
    ResultsRetried {
        key: String,
        taken: u64,
        reason: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
    /// An operator's retry of parked results settled them with other counts than the job's
    /// effect carried: the job's effect goes again as this new generation (a new
    /// `webhook-id`), since one id has one body.
    ResultsRecounted {
        key: String,
        generation: u32,
    },
    ForgottenByOperator {
        key: String,
        reason: String,
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
        #[serde(skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
    RetryNow {
        key: String,
        generation: u32,
        reason: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
    Redeliver {
        key: String,
        generation: u32,
        reason: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
    /// Retention ended: the name is kept in its retired names' shard and the gate's storage
    /// is deleted, all of it.
    RetentionExpired {
        key: String,
    },
    /// The first alarm of a record a signed delivery created found the name retired: the
    /// gate's storage is deleted and nothing ran.
    RetiredNameRefused {
        key: String,
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
            json!({"event": "alarm_recovered", "key": null})
        );
        assert_eq!(
            GateLog::StatusNotFound {
                key: "batches/a".into(),
                path: "confirmation"
            }
            .to_value(),
            json!({"event": "status_not_found", "key": "batches/a", "path": "confirmation"})
        );
    }
}
