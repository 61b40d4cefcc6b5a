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
//! `decision.rs`.

mod decision;
mod deliveries;
#[cfg(test)]
pub(crate) mod fixtures;
mod operator;
mod reconciling;
mod registration;

pub use decision::{effect_report, Limits, Save, Step};
pub(crate) use deliveries::count_delivery;

use crate::operation::gate_protocol::{GateCommand, GateReply};
use crate::operation::Operation;

/// Applies a command to the record (`None`: none yet) at `now`.
pub fn step(record: Option<Operation>, command: GateCommand, now: i64) -> Step {
    match command {
        GateCommand::Register {
            key,
            name,
            kind,
            user_metadata,
        } => match record {
            Some(op) => registration::register_again(op, kind.as_deref(), user_metadata, now),
            None => registration::register_new(&key, &name, kind, user_metadata, now),
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
            ..
        } => deliveries::nudge(record, claimed, metadata, delivery_id, now),
        GateCommand::RetryEffect => held(record, |op| reconciling::retry_effect(op, now)),
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
        GateCommand::Redeliver {
            reason,
            sent_before_ms,
        } => held(record, |op| {
            operator::redeliver(op, &reason, sent_before_ms, now)
        }),
        GateCommand::RetryNow { reason } => {
            held(record, |op| operator::retry_now(op, &reason, now))
        }
        GateCommand::Forget { reason } => held(record, |op| operator::forget(op, reason, now)),
        GateCommand::Settle { status, reason } => {
            held(record, |op| operator::settle(op, &status, reason, now))
        }
        // A repair has been done (or was not needed) by the object before this step.
        GateCommand::Inspect | GateCommand::Repair { .. } => held(record, operator::inspect),
    }
}

/// A command that needs a record: `NotFound` when the gate holds none.
fn held(record: Option<Operation>, command: impl FnOnce(Operation) -> Step) -> Step {
    match record {
        Some(op) => command(op),
        None => Step::new(None, GateReply::NotFound),
    }
}
