//! The messages between the edge and the OperationGate Durable Object.
//!
//! Guarantees (docs/DESIGN.md, invariant 1): every path that can change an operation
//! (webhook, reconciliation, registration, operator) speaks to the gate in these commands
//! only; none writes state itself. Both directions are plain JSON, so the protocol is tested
//! on the host and logged as is.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::operation::alert::AlertKind;
use crate::operation::lifecycle::{DropReason, Status};
pub use crate::operation::record::EffectReport;
use crate::operation::{Actor, KindFill, OpEvent, ResultsMode};

/// A request to the gate of one operation. An operator's `by` is who asked (the admin API's
/// caller), recorded in the history row and log line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum GateCommand {
    /// Register a submitted operation as pending; changes nothing if it exists but a kind or
    /// `user_metadata` it lacks (see [`crate::operation::Operation::fill_kind`]).
    Register {
        key: String,
        name: String,
        kind: Option<String>,
        /// The job's `user_metadata`, from the authenticated registration: the side effect's
        /// verified `user_metadata` (it wins over every other source).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user_metadata: Option<Value>,
        /// `"results"` as asked (or the kind's default); `None` states nothing.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        results: Option<ResultsMode>,
        /// Whose token registered it (its scope and fingerprint), kept in the history row.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
    /// Offer an event (from a webhook or the status API) to the reducer, then run any side
    /// effect it makes due.
    Deliver {
        key: String,
        name: String,
        event: OpEvent,
        /// Drop events for operations never registered (REQUIRE_REGISTRATION).
        require_registration: bool,
        /// How long the first side-effect attempt of an unregistered operation that this
        /// event settles waits for a late registration (`UNREGISTERED_HOLD_SECONDS` when
        /// routes are configured, else 0).
        #[serde(default)]
        hold_ms: i64,
        /// An event older than this (Unix ms; 0: no limit) does not create a record: the
        /// gate sets it from its own retention ([`GateCommand::limit_new_records`]), never
        /// the sender, so it is not on the wire.
        #[serde(skip)]
        new_not_before_ms: i64,
    },
    /// A dynamic-webhook delivery named this operation: its body is unproven, so a gate that
    /// holds the operation open asks Gemini's status API (from its alarm) and applies what
    /// that says. A nudge never creates a record: a gate without one stores nothing and
    /// answers [`GateReply::Unregistered`].
    Nudge {
        key: String,
        name: String,
        /// The state the body claims: kept in the history, never applied.
        claimed: String,
        /// `unverified_user_metadata` for the side effect (nothing binds a token's claims to
        /// the operation it names, so nothing from a nudge is verified).
        metadata: serde_json::Map<String, Value>,
        /// A hash of the token: something signed, unlike the `webhook-id` header.
        delivery_id: String,
        /// `CONFIRM_INTERVAL_SECONDS` in ms: with no confirmation waiting, a nudge within it
        /// of the last status question changes nothing.
        #[serde(default)]
        confirm_interval_ms: i64,
    },
    /// Run an owed side effect if it is due and no live claim holds it.
    RetryEffect,
    /// The destination's desk released this effect (a probe, or its turn in the drain or the
    /// pace): due now, under the same generation and `webhook-id`. Answered
    /// [`GateReply::Effect`]; anything but an owed effect tells the desk to drop the key.
    DestinationReady { probe: bool },
    /// Raise an alert of this kind once per operation: queued, and sent (at least once) by
    /// the gate's alarm.
    Alert {
        alert: AlertKind,
        age_seconds: i64,
        /// `EFFECT_ALERT_AFTER_SECONDS` in ms: a job's `effect_failing` waits it from when its
        /// batch's results made its effect due. The gate sets it from its own configuration
        /// ([`GateCommand::limit_alerts`]), never the sender, so it is not on the wire.
        #[serde(skip)]
        effect_alert_after_ms: i64,
    },
    /// The operator's action on the side effect: retry now under the same generation when it
    /// is not done (refused while an attempt is in flight); a new generation when it is done.
    Redeliver {
        reason: String,
        /// A bulk redelivery run's cut-off (Unix ms): refused
        /// ([`crate::operation::OperatorRefusal::SentSinceCutoff`]) when the effect was sent
        /// at or after it, so running the run again sends nothing twice. Absent from a single
        /// redelivery and from commands sent before runs had one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sent_before_ms: Option<i64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
    /// Retry an effect that is not done now, under the same generation (never a new one).
    RetryNow {
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
    /// Stop tracking the operation (recorded, not erased).
    Forget {
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
    /// The operator gives the outcome of an operation whose status answer cannot be used:
    /// a terminal `status` (`succeeded`, `failed`, `cancelled`, `expired`), applied as an
    /// event settled by `operator`; its side effect runs like any other. Refused once the
    /// operation has an outcome.
    Settle {
        status: String,
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
    /// The status API's answer could not be used (`reason`): kept in the record and alerted
    /// once per operation.
    StatusUnusable { reason: String, age_seconds: i64 },
    /// The reconciliation audit found the `open:` index out of step with the ledger: project
    /// the record again, putting or deleting the index entry. Changes no state.
    Reindex,
    /// Return the record and its history.
    Inspect,
    /// A `"results": "each"` batch's results in `state` (`parked`, `waiting` or
    /// `delivered`), a page after `cursor`; answered by the object from its results tables.
    Results {
        state: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cursor: Option<String>,
    },
    /// Put parked results back to be sent again under their first ids, a page at a time
    /// (`dry_run`: count them, change nothing); answered by the object.
    RetryResults {
        reason: String,
        #[serde(default)]
        dry_run: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
    /// An operator's repair of a stored record that does not load (the object handles it
    /// before loading): recovered as a load would, or rebuilt from this key and name
    /// ([`crate::operation::Operation::rebuild`]); then answered as [`GateCommand::Inspect`].
    Repair {
        key: String,
        name: String,
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
}

impl GateCommand {
    /// A delivery whose event is older than `not_before_ms` may not create a record. An operation's
    /// storage is deleted when its retention ends, so an event for it arriving later finds no
    /// record; the event is at least as old as the operation's close, which was at least retention
    /// ago, while a genuine first delivery is never older than an operation's longest run plus
    /// Gemini's 24 hours of retries plus the signature tolerance (retention is never shorter than
    /// that, see [`crate::signature::replay_floor_ms`]).
    pub fn limit_new_records(&mut self, not_before_ms: i64) {
        if let GateCommand::Deliver {
            new_not_before_ms, ..
        } = self
        {
            *new_not_before_ms = not_before_ms;
        }
    }

    /// An alert's command waits `after_ms` to raise a job's `effect_failing` once its batch's
    /// results made its effect due ([`GateCommand::Alert`]).
    pub fn limit_alerts(&mut self, after_ms: i64) {
        if let GateCommand::Alert {
            effect_alert_after_ms: at,
            ..
        } = self
        {
            *at = after_ms;
        }
    }

    /// The same command, recording `actor` as who asked when it is an operator's action
    /// (retry, redeliver, forget, settle, repair); any other command is returned as it is.
    pub fn by(mut self, actor: Actor) -> GateCommand {
        match &mut self {
            GateCommand::Redeliver { by, .. }
            | GateCommand::RetryNow { by, .. }
            | GateCommand::Forget { by, .. }
            | GateCommand::Settle { by, .. }
            | GateCommand::Repair { by, .. }
            | GateCommand::RetryResults { by, .. } => *by = Some(actor),
            _ => {}
        }
        self
    }
}

/// The gate's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum GateReply {
    Created {
        operation: Value,
    },
    Exists {
        operation: Value,
        /// What the registration did to the kind.
        kind: KindFill,
    },
    /// A registration that would change what an earlier registration recorded (`fields`:
    /// `kind`, `user_metadata`): nothing changed; `operation` is what is recorded.
    Conflict {
        operation: Value,
        fields: Vec<String>,
    },
    /// A registration for a name whose retention ended, and nothing was created: `operation`
    /// is its key and name (found in its retired names' shard), or the tombstone a gate an
    /// earlier version retired keeps.
    Retired {
        operation: Value,
    },
    Applied {
        status: Status,
        effect: EffectReport,
    },
    Dropped {
        reason: DropReason,
        status: Status,
        effect: EffectReport,
    },
    IgnoredUnregistered,
    /// An event older than retention for an operation this gate has no record of: a
    /// replay after the gate's storage ended with retention. Nothing was stored.
    IgnoredTooOld,
    /// A nudge (or a poll) named an operation this gate has no record of: nothing was stored.
    Unregistered,
    /// A nudge was recorded; the status API is asked from the gate's alarm.
    Confirming {
        status: Status,
    },
    Effect {
        effect: EffectReport,
    },
    /// `sent`: the alert was raised now (queued durably); false if raised before.
    AlertSent {
        sent: bool,
    },
    Redelivered {
        generation: u32,
        action: OperatorAction,
        effect: EffectReport,
    },
    Forgotten {
        changed: bool,
    },
    /// The answer to [`GateCommand::Reindex`]: false for a tombstone (never projected again).
    Reindexed {
        changed: bool,
    },
    /// The command does not apply to the operation as it stands (answered 409).
    Refused {
        reason: String,
    },
    Found {
        operation: Value,
        history: Vec<Value>,
    },
    /// The answer to [`GateCommand::Repair`]: `repaired` is false when the record loaded as
    /// it was (nothing done).
    Repaired {
        repaired: bool,
        operation: Value,
        history: Vec<Value>,
    },
    NotFound,
    /// The answer to [`GateCommand::Results`] or [`GateCommand::RetryResults`], as the admin
    /// API gives it.
    ResultsAnswer {
        answer: Value,
    },
}

/// What an operator's action on a side effect did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OperatorAction {
    /// An effect not done, run again now under the same generation and `webhook-id`.
    RetryNow,
    /// A done effect, sent again on purpose as a new generation.
    Redeliver,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operation::lifecycle::{Source, Status};

    #[test]
    fn commands_round_trip_as_tagged_json() {
        let cmd = GateCommand::Deliver {
            key: "batches/a".into(),
            name: "batches/a".into(),
            event: OpEvent {
                status: Status::Succeeded,
                update_time_ms: 0,
                source: Source::Webhook,
                details: Default::default(),
                delivery_id: Some("msg_1".into()),
            },
            require_registration: false,
            hold_ms: 0,
            new_not_before_ms: 0,
        };
        let text = serde_json::to_string(&cmd).unwrap();
        assert!(text.contains(r#""command":"deliver""#));
        assert_eq!(serde_json::from_str::<GateCommand>(&text).unwrap(), cmd);
    }

    #[test]
    fn a_redeliver_without_a_cutoff_still_parses() {
        let old: GateCommand =
            serde_json::from_str(r#"{"command":"redeliver","reason":"lost"}"#).unwrap();
        assert_eq!(
            old,
            GateCommand::Redeliver {
                reason: "lost".into(),
                sent_before_ms: None,
                by: None,
            }
        );
        let text = serde_json::to_string(&old).unwrap();
        assert!(!text.contains("sent_before_ms"), "{text}");
        assert!(!text.contains("by"), "{text}");
        let run = GateCommand::Redeliver {
            reason: "lost".into(),
            sent_before_ms: Some(1_700_000_000_000),
            by: None,
        };
        let text = serde_json::to_string(&run).unwrap();
        assert_eq!(serde_json::from_str::<GateCommand>(&text).unwrap(), run);
    }

    #[test]
    fn an_operator_command_carries_who_asked() {
        let actor = Actor {
            scope: "admin".into(),
            fingerprint: "0a1b2c3d".into(),
        };
        let forget = GateCommand::Forget {
            reason: "r".into(),
            by: None,
        }
        .by(actor.clone());
        let text = serde_json::to_string(&forget).unwrap();
        assert!(
            text.contains(r#""by":{"scope":"admin","fingerprint":"0a1b2c3d"}"#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<GateCommand>(&text).unwrap(), forget);
        assert_eq!(GateCommand::Inspect.by(actor), GateCommand::Inspect);
    }

    #[test]
    fn replies_round_trip_as_tagged_json() {
        let reply = GateReply::Dropped {
            reason: DropReason::ConflictingTerminal,
            status: Status::Succeeded,
            effect: EffectReport::InFlight,
        };
        let text = serde_json::to_string(&reply).unwrap();
        assert!(text.contains(r#""outcome":"dropped""#));
        assert!(text.contains(r#""reason":"conflicting_terminal""#));
        assert!(text.contains(r#""status":"succeeded""#));
        assert!(text.contains(r#""effect":"in_flight""#));
        assert_eq!(serde_json::from_str::<GateReply>(&text).unwrap(), reply);
    }
}
