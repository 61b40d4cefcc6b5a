//! The webhook route's log lines, typed: one variant per line the route and the key-set
//! cache write.
//!
//! Guarantees: each variant serializes to one JSON object whose `event` is the variant's
//! name (the serde tag, its only spelling: see [`crate::telemetry::log_event`]); absent
//! optional fields are left out, so the lines read exactly as the contract documents them.

use serde::Serialize;

use crate::inbound::answer::Answer;

/// A refused body's size: the declared length, or `"> <cap>"` when the stream passed it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Bytes {
    Count(usize),
    Over(String),
}

/// What the route did with a delivery: the answer sent, and where it came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Handled {
    #[serde(flatten)]
    pub answer: Answer,
    #[serde(rename = "type")]
    pub event_type: String,
    pub webhook_id: String,
    /// Time from receipt to answer, when the gate was asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ms: Option<i64>,
    /// `edge` when this isolate answered without the gate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answered_by: Option<&'static str>,
    /// For `stranger_nudge`: whether the guard raised its aggregated alert.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alert: Option<bool>,
}

/// A log line of the webhook route.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum RouteLog {
    Delivered(Handled),
    Duplicate(Handled),
    Dropped(Handled),
    Nudged(Handled),
    IgnoredUnregistered(Handled),
    IgnoredForgotten(Handled),
    IgnoredTooOld(Handled),
    StrangerNudge(Handled),
    /// A signed test delivery.
    Ping {
        #[serde(rename = "type")]
        event_type: String,
        webhook_id: String,
    },
    Rejected {
        reason: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        bytes: Option<Bytes>,
        #[serde(skip_serializing_if = "Option::is_none")]
        retry_after: Option<i64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        problem: Option<&'static str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        delivery_id: Option<String>,
        #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
        event_type: Option<String>,
    },
    DeadLetter {
        reason: &'static str,
        webhook_id: String,
        kv_key: String,
    },
    JwksFetched {
        changed: bool,
        keys: usize,
    },
    JwksFetchFailed {
        error: String,
    },
    JwksCacheWriteFailed {
        error: String,
    },
    JwksImportFailed {
        kid: String,
        error: String,
    },
}

impl RouteLog {
    /// The line for a handled delivery (its event follows from the answer); `None` for an
    /// unknown type, which the route logs as a dead letter or a refusal instead.
    pub fn handled(handled: Handled) -> Option<RouteLog> {
        Some(match &handled.answer {
            Answer::Applied { .. } => RouteLog::Delivered(handled),
            Answer::Dropped {
                reason: crate::operation::lifecycle::DropReason::Duplicate,
                ..
            } => RouteLog::Duplicate(handled),
            Answer::Dropped { .. } => RouteLog::Dropped(handled),
            Answer::Confirming { .. } => RouteLog::Nudged(handled),
            Answer::IgnoredUnregistered { .. } => RouteLog::IgnoredUnregistered(handled),
            Answer::IgnoredForgotten { .. } => RouteLog::IgnoredForgotten(handled),
            Answer::IgnoredTooOld { .. } => RouteLog::IgnoredTooOld(handled),
            Answer::NotHeld { .. } => RouteLog::StrangerNudge(handled),
            Answer::IgnoredUnknownType { .. } | Answer::Pong { .. } => return None,
        })
    }

    /// The line as JSON.
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operation::gate::protocol::EffectReport;
    use crate::operation::lifecycle::{DropReason, Status};
    use serde_json::json;

    fn handled(answer: Answer) -> Handled {
        Handled {
            answer,
            event_type: "batch.succeeded".into(),
            webhook_id: "msg_1".into(),
            ms: Some(3),
            answered_by: None,
            alert: None,
        }
    }

    fn handled_line(h: Handled) -> RouteLog {
        RouteLog::handled(h).unwrap()
    }

    #[test]
    fn an_unknown_type_is_not_a_handled_line() {
        let h = handled(Answer::IgnoredUnknownType {
            event_type: "x".into(),
        });
        assert_eq!(RouteLog::handled(h), None);
    }

    #[test]
    fn handled_lines_read_as_before() {
        let line = handled_line(handled(Answer::Applied {
            key: "batches/a".into(),
            status: Status::Succeeded,
            effect: EffectReport::Scheduled,
        }));
        assert_eq!(
            line.to_value(),
            json!({"event": "delivered", "outcome": "applied", "key": "batches/a",
                   "status": "succeeded", "effect": "scheduled", "type": "batch.succeeded",
                   "webhook_id": "msg_1", "ms": 3})
        );
        let edge = handled_line(Handled {
            ms: None,
            answered_by: Some("edge"),
            ..handled(Answer::Dropped {
                reason: DropReason::Duplicate,
                key: "batches/a".into(),
                status: Status::Succeeded,
                effect: None,
            })
        });
        assert_eq!(
            edge.to_value(),
            json!({"event": "duplicate", "outcome": "dropped", "reason": "duplicate",
                   "key": "batches/a", "status": "succeeded", "effect": "not_asked",
                   "type": "batch.succeeded", "webhook_id": "msg_1", "answered_by": "edge"})
        );
        let stranger = handled_line(Handled {
            ms: None,
            alert: Some(false),
            webhook_id: "jwt_1".into(),
            ..handled(Answer::NotHeld {
                key: "batches/a".into(),
            })
        });
        assert_eq!(
            stranger.to_value(),
            json!({"event": "stranger_nudge", "outcome": "not_held",
                   "key": "batches/a", "type": "batch.succeeded", "webhook_id": "jwt_1",
                   "alert": false})
        );
    }

    #[test]
    fn a_ping_line_and_its_answer_read_as_before() {
        let line = RouteLog::Ping {
            event_type: "webhook.ping".into(),
            webhook_id: "msg_1".into(),
        };
        assert_eq!(
            line.to_value(),
            json!({"event": "ping", "type": "webhook.ping", "webhook_id": "msg_1"})
        );
        let pong = Answer::Pong {
            event_type: "webhook.ping".into(),
        };
        assert_eq!(
            serde_json::to_value(pong).unwrap(),
            json!({"outcome": "pong", "type": "webhook.ping"})
        );
    }

    #[test]
    fn key_set_and_dead_letter_lines_read_as_before() {
        assert_eq!(
            RouteLog::JwksFetched {
                changed: false,
                keys: 1
            }
            .to_value(),
            json!({"event": "jwks_fetched", "changed": false, "keys": 1})
        );
        assert_eq!(
            RouteLog::DeadLetter {
                reason: "unknown_event_type",
                webhook_id: "m".into(),
                kv_key: "dead:m".into()
            }
            .to_value(),
            json!({"event": "dead_letter", "reason": "unknown_event_type", "webhook_id": "m",
                   "kv_key": "dead:m"})
        );
    }
}
