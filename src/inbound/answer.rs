//! What the webhook route answers a delivery the gate (or this isolate) handled.
//!
//! Guarantees: every 2xx body the route sends is an [`Answer`], serialized with its `outcome`
//! tag (which answer a gate's reply becomes, [`Answer::from_gate`], and when an isolate may
//! answer a duplicate itself, [`crate::inbound::intake::TerminalMemory`], are the intake's).

use serde::{Serialize, Serializer};

use crate::operation::gate::protocol::EffectReport;
use crate::operation::lifecycle::{DropReason, Status};

/// A 2xx body of `POST /webhooks/gemini`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Answer {
    Applied {
        key: String,
        status: Status,
        effect: EffectReport,
    },
    Dropped {
        reason: DropReason,
        key: String,
        status: Status,
        /// `None`: answered by this isolate, the effect's state was not asked (`not_asked`).
        #[serde(serialize_with = "effect_or_not_asked")]
        effect: Option<EffectReport>,
    },
    Confirming {
        key: String,
        status: Status,
    },
    IgnoredUnregistered {
        key: String,
    },
    IgnoredForgotten {
        key: String,
    },
    /// A completion older than retention for an operation with no record: its gate's
    /// storage ended with retention, so it is a replay; nothing ran.
    IgnoredTooOld {
        key: String,
    },
    /// A nudge named an operation this worker does not hold open (never registered, nor
    /// opened by a signed delivery; or gone with retention): nothing was stored, and nothing
    /// asked but, for a `v1a`-signed body, the status API once (it said the job is not ours).
    NotHeld {
        key: String,
    },
    IgnoredUnknownType {
        #[serde(rename = "type")]
        event_type: String,
    },
    /// A signed test delivery.
    Pong {
        #[serde(rename = "type")]
        event_type: String,
    },
}

fn effect_or_not_asked<S: Serializer>(
    effect: &Option<EffectReport>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match effect {
        Some(e) => e.serialize(s),
        None => s.serialize_str("not_asked"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inbound::intake::TerminalMemory;
    use crate::operation::gate::protocol::GateReply;
    use serde_json::json;

    fn learn(memory: &mut TerminalMemory, key: &str, reply: &GateReply) {
        if let Some(status) = TerminalMemory::settled_at(reply) {
            memory.remember(key, status);
        }
    }

    fn applied(status: Status) -> GateReply {
        GateReply::Applied {
            status,
            effect: EffectReport::Scheduled,
        }
    }

    #[test]
    fn answers_serialize_as_the_route_always_sent_them() {
        let a = Answer::from_gate("batches/a", &applied(Status::Succeeded)).unwrap();
        assert_eq!(
            serde_json::to_value(&a).unwrap(),
            json!({"outcome": "applied", "key": "batches/a", "status": "succeeded", "effect": "scheduled"})
        );
        let dropped = GateReply::Dropped {
            reason: DropReason::Duplicate,
            status: Status::Failed,
            effect: EffectReport::Delivered,
        };
        assert_eq!(
            serde_json::to_value(Answer::from_gate("batches/a", &dropped).unwrap()).unwrap(),
            json!({"outcome": "dropped", "reason": "duplicate", "key": "batches/a", "status": "failed", "effect": "delivered"})
        );
        let confirming = GateReply::Confirming {
            status: Status::Running,
        };
        assert_eq!(
            serde_json::to_value(Answer::from_gate("k/1", &confirming).unwrap()).unwrap(),
            json!({"outcome": "confirming", "key": "k/1", "status": "running"})
        );
        assert_eq!(
            serde_json::to_value(
                Answer::from_gate("k/1", &GateReply::IgnoredUnregistered).unwrap()
            )
            .unwrap(),
            json!({"outcome": "ignored_unregistered", "key": "k/1"})
        );
        assert_eq!(
            serde_json::to_value(
                Answer::from_gate("k/1", &GateReply::Forgotten { changed: false }).unwrap()
            )
            .unwrap(),
            json!({"outcome": "ignored_forgotten", "key": "k/1"})
        );
        assert_eq!(
            serde_json::to_value(Answer::IgnoredUnknownType {
                event_type: "x.y".into()
            })
            .unwrap(),
            json!({"outcome": "ignored_unknown_type", "type": "x.y"})
        );
        assert_eq!(
            serde_json::to_value(Answer::NotHeld { key: "k/1".into() }).unwrap(),
            json!({"outcome": "not_held", "key": "k/1"})
        );
    }

    #[test]
    fn a_reply_no_delivery_gets_has_no_answer() {
        assert_eq!(Answer::from_gate("k/1", &GateReply::NotFound), None);
        assert_eq!(Answer::from_gate("k/1", &GateReply::Unregistered), None);
    }

    #[test]
    fn a_repeated_known_terminal_is_answered_without_the_gate() {
        let mut memory = TerminalMemory::default();
        assert!(!memory.knows("batches/a", &Status::Succeeded));
        learn(&mut memory, "batches/a", &applied(Status::Succeeded));
        assert!(memory.knows("batches/a", &Status::Succeeded));
        let answer = TerminalMemory::duplicate_answer("batches/a", &Status::Succeeded);
        assert_eq!(
            serde_json::to_value(answer).unwrap(),
            json!({"outcome": "dropped", "reason": "duplicate", "key": "batches/a",
                   "status": "succeeded", "effect": "not_asked"})
        );
    }

    #[test]
    fn a_different_status_or_key_still_goes_to_the_gate() {
        let mut memory = TerminalMemory::default();
        learn(&mut memory, "batches/a", &applied(Status::Succeeded));
        // A conflicting terminal is recorded by the gate, never answered here.
        assert!(!memory.knows("batches/a", &Status::Failed));
        assert!(!memory.knows("batches/b", &Status::Succeeded));
    }

    #[test]
    fn only_a_terminal_reply_to_a_delivery_is_learned() {
        let mut memory = TerminalMemory::default();
        learn(&mut memory, "batches/a", &applied(Status::Running));
        assert!(!memory.knows("batches/a", &Status::Running));
        // A nudge's reply is never asked about: the intake's test holds that.
        let confirming = GateReply::Confirming {
            status: Status::Succeeded,
        };
        learn(&mut memory, "batches/c", &confirming);
        assert!(!memory.knows("batches/c", &Status::Succeeded));
        let dropped = GateReply::Dropped {
            reason: DropReason::ConflictingTerminal,
            status: Status::Failed,
            effect: EffectReport::Delivered,
        };
        learn(&mut memory, "batches/d", &dropped);
        assert!(memory.knows("batches/d", &Status::Failed));
    }

    #[test]
    fn memory_starts_over_past_its_capacity() {
        let mut memory = TerminalMemory::with_capacity(2);
        for key in ["batches/a", "batches/b", "batches/c"] {
            learn(&mut memory, key, &applied(Status::Succeeded));
        }
        assert!(!memory.knows("batches/a", &Status::Succeeded));
        assert!(memory.knows("batches/c", &Status::Succeeded));
    }
}
