//! The gate's decisions as pure steps: a command, or the outcome of one piece of the alarm's
//! I/O, applied to the operation's record at a given time, giving what to store, what to
//! record in the history, what to log and what to answer ([`Step`]).
//!
//! Guarantees (docs/DESIGN.md, invariants 1, 3 and 7): every change to an operation is decided
//! here, through [`Operation`]'s transitions, and nowhere else; a command never runs anything
//! outbound: it decides and schedules, and the Durable Object stores the record and sets the
//! alarm (at [`Operation::wake_at_ms`]) before it answers, so no answer waits on a
//! destination, the status API or an alert sink; a duplicate of a settled operation changes
//! nothing durable ([`Save::MemoryOnly`]). The Durable Object
//! (`src/edge/objects/gate/`) only loads, calls a step, performs the I/O the alarm
//! needs and saves. Time and jitter are parameters.
//!
//! [`step`] sends each command to its family: a registration (`registration.rs`),
//! deliveries and nudges (`deliveries.rs`), what the reconciliation pass asks
//! (`reconciling.rs`), an operator's actions (`operator.rs`); what a step is, in
//! `decision.rs`. The rest of the gate lives here too: the messages to it (`protocol.rs`),
//! its log lines (`log.rs`), the alarm's plan with an attempt's turn at its destination's
//! desk (`alarm.rs`) and what a failed alarm run does (`alarm_failure.rs`).

pub mod alarm;
pub mod alarm_failure;
mod decision;
mod deliveries;
#[cfg(test)]
mod kill_results_tests;
#[cfg(test)]
mod kill_tests;
pub mod log;
mod operator;
pub mod protocol;
mod reconciling;
mod registration;
#[cfg(test)]
mod retired_tests;
#[cfg(test)]
mod spell_tests;

pub use decision::{GateLimits, Save, Step};
pub(crate) use deliveries::count_delivery;
pub use operator::{results_retried, ResultsTaken};

use crate::operation::gate::protocol::{GateCommand, GateReply};
use crate::operation::Operation;

/// Applies a command to the record (`None`: none yet) at `now`.
pub fn step(record: Option<Operation>, command: GateCommand, now: i64) -> Step {
    match command {
        GateCommand::Register {
            key,
            name,
            kind,
            user_metadata,
            results,
            by,
        } => match record {
            Some(op) => {
                registration::register_again(op, kind.as_deref(), user_metadata, results, now)
            }
            None => registration::register_new(&key, &name, kind, user_metadata, results, by, now),
        },
        GateCommand::Deliver {
            key,
            name,
            event,
            require_registration,
            hold_ms,
            new_not_before_ms,
        } => {
            let receiver = deliveries::receiver(
                record,
                &key,
                &name,
                &event,
                require_registration,
                new_not_before_ms,
                now,
            );
            match receiver {
                Ok(op) => deliveries::deliver(op, &event, hold_ms, now),
                Err(reply) => Step::new(None, reply),
            }
        }
        GateCommand::Nudge {
            claimed,
            metadata,
            delivery_id,
            confirm_interval_ms,
            ..
        } => deliveries::nudge(
            record,
            claimed,
            metadata,
            delivery_id,
            confirm_interval_ms,
            now,
        ),
        GateCommand::RetryEffect => held(record, |op| reconciling::retry_effect(op, now)),
        GateCommand::DestinationReady { probe } => {
            held(record, |op| reconciling::destination_ready(op, probe, now))
        }
        GateCommand::Alert { alert, age_seconds } => {
            held(record, |op| reconciling::alert(op, alert, age_seconds, now))
        }
        GateCommand::StatusUnusable {
            reason,
            age_seconds,
        } => held(record, |op| {
            reconciling::status_unusable(op, reason, age_seconds, now)
        }),
        GateCommand::Reindex => held(record, reconciling::reindex),
        action @ (GateCommand::Redeliver { .. }
        | GateCommand::RetryNow { .. }
        | GateCommand::Forget { .. }
        | GateCommand::Settle { .. }
        | GateCommand::Inspect
        | GateCommand::Results { .. }
        | GateCommand::RetryResults { .. }
        | GateCommand::Repair { .. }) => held(record, |op| operator_action(op, action, now)),
    }
}

/// An operator's command on a held record.
fn operator_action(op: Operation, command: GateCommand, now: i64) -> Step {
    match command {
        GateCommand::Redeliver {
            reason,
            sent_before_ms,
            by,
        } => operator::redeliver(op, &reason, sent_before_ms, by, now),
        GateCommand::RetryNow { reason, by } => operator::retry_now(op, &reason, by, now),
        GateCommand::Forget { reason, by } => operator::forget(op, reason, by, now),
        GateCommand::Settle { status, reason, by } => {
            operator::settle(op, &status, reason, by, now)
        }
        // A repair has been done (or was not needed) by the object before this step, and the
        // object answers the results' commands from their tables; `step` sends nothing else
        // here.
        _ => operator::inspect(op),
    }
}

/// A command that needs a record: `NotFound` when the gate holds none.
fn held(record: Option<Operation>, command: impl FnOnce(Operation) -> Step) -> Step {
    match record {
        Some(op) => command(op),
        None => Step::new(None, GateReply::NotFound),
    }
}

/// Records and commands the gate's and the alarm's tests share.
#[cfg(test)]
pub(crate) mod fixtures {
    use serde_json::Map;

    use crate::operation::gate::alarm::{attempt_finished, begin_attempt, AlarmDone, Attempt};
    use crate::operation::gate::protocol::GateCommand;
    use crate::operation::lifecycle::{Source, Status};
    use crate::operation::observation::{Observation, StatusError};
    use crate::operation::{AttemptOutcome, OpEvent, Operation};
    use crate::retry::Backoff;

    use super::{step, GateLimits, Step};

    pub(crate) const LIMITS: GateLimits = GateLimits {
        retention_ms: 100_000,
        stats_delay_ms: 0,
        claim_ttl_ms: 10_000,
        retry: Backoff::new(1_000, 8_000),
        unregistered_hold_ms: 0,
        confirm_interval_ms: 0,
        desk_fallback_ms: 60_000,
    };

    pub(crate) fn event(status: Status, source: Source) -> OpEvent {
        OpEvent {
            status,
            update_time_ms: 0,
            source,
            details: Map::new(),
            delivery_id: Some("msg_1".into()),
        }
    }

    pub(crate) fn deliver(status: Status) -> GateCommand {
        GateCommand::Deliver {
            key: "batches/a".into(),
            name: "batches/a".into(),
            event: event(status, Source::Webhook),
            require_registration: false,
            hold_ms: 0,
            new_not_before_ms: 0,
        }
    }

    pub(crate) fn nudge(claimed: &str) -> GateCommand {
        GateCommand::Nudge {
            key: "batches/a".into(),
            name: "batches/a".into(),
            claimed: claimed.into(),
            metadata: Map::new(),
            delivery_id: "jwt_1".into(),
            confirm_interval_ms: 0,
        }
    }

    pub(crate) fn registered() -> Operation {
        Operation::register("batches/a", "batches/a", Some("billing".into()), 0)
    }

    /// A terminal operation whose effect is done.
    pub(crate) fn settled() -> Operation {
        let s = step(Some(registered()), deliver(Status::Succeeded), 10);
        delivered_at_20(s.record.unwrap()).record.unwrap()
    }

    /// `op`'s effect claimed at 10 and delivered at 20: the commit's step.
    pub(crate) fn delivered_at_20(op: Operation) -> Step<AlarmDone> {
        let (claim, s) = begin_attempt(op, 10, &LIMITS).unwrap();
        let attempt = Attempt {
            claim,
            outcome: AttemptOutcome::Delivered,
            started_ms: 10,
            finished_ms: 20,
            asked_wait_ms: None,
            target: Default::default(),
        };
        attempt_finished(s.record.unwrap(), &attempt, &LIMITS, 0.5)
    }

    pub(crate) fn whats<R>(step: &Step<R>) -> Vec<String> {
        step.history
            .iter()
            .map(|h| h.to_value()["what"].as_str().unwrap_or("").to_string())
            .collect()
    }

    pub(crate) fn events<R>(step: &Step<R>) -> Vec<String> {
        step.logs
            .iter()
            .map(crate::telemetry::log_event::event_of)
            .collect()
    }

    pub(crate) fn nudged() -> Operation {
        step(Some(registered()), nudge("succeeded"), 10)
            .record
            .unwrap()
    }

    pub(crate) fn observed(status: Status) -> Result<Observation, StatusError> {
        Ok(Observation {
            status,
            update_time_ms: 5,
            details: Map::new(),
        })
    }

    /// An unregistered operation's completion, its first attempt held `hold_ms`.
    pub(crate) fn deliver_unregistered(hold_ms: i64) -> GateCommand {
        GateCommand::Deliver {
            key: "batches/a".into(),
            name: "batches/a".into(),
            event: event(Status::Succeeded, Source::Webhook),
            require_registration: false,
            hold_ms,
            new_not_before_ms: 0,
        }
    }
}
