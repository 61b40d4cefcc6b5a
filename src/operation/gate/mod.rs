//! The gate's decisions as pure steps: a command, or the outcome of one piece of the alarm's
//! I/O, applied to the operation's record at a given time, giving what to store, what to
//! record in the history, what to log and what to answer ([`Step`]).
//!
//! Guarantees (docs/DESIGN.md, invariants 1, 3 and 7): every change to an operation is decided
//! here, through [`Operation`]'s transitions, and nowhere else; a command never runs anything
//! outbound: it decides and schedules, and the Durable Object stores the record and sets the alarm
//! (at [`Operation::wake_at_ms`]) before it answers, so no answer waits on a destination, the
//! status API or an alert sink; a duplicate of a settled operation changes nothing durable
//! ([`Save::MemoryOnly`]). The Durable Object (`src/edge/objects/gate/`) only loads, calls a step,
//! performs the I/O the alarm needs and saves. Time and jitter are parameters.
//!
//! Deliveries (invariants 2 and 4): an event from a signed webhook or a status-API poll
//! changes state only through the reducer, its decision and count stored in one write; a
//! duplicate of a settled operation is answered from memory; a poll, a nudge, or a signed
//! event older than retention never creates a record; a nudge never shapes an operation, it
//! only schedules a confirmation on the alarm.
//!
//! [`step`] decides a delivery and a nudge here, the commands every operation gets; it sends the
//! others to their family: a registration (`registration.rs`), what the reconciliation pass asks
//! (`reconciling.rs`), an operator's actions (`operator.rs`). What a step is ([`Step`]: a value,
//! nothing more, stored as [`Save`] says before the answer; the commands' steps and the alarm's
//! pieces both decide in this shape) and the settings steps read ([`GateLimits`]) are here too. The
//! rest of the gate: the messages to it (`protocol.rs`), its log lines (`log.rs`), the alarm's plan
//! (`alarm.rs`), a key's turn at its destination's desk, for the job's effect and a batch's results
//! alike (`desk_turn.rs`), and what a failed alarm run does (`alarm_failure.rs`).

pub mod alarm;
pub mod alarm_failure;
#[cfg(test)]
mod deliveries_tests;
pub mod desk_turn;
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

pub use operator::{results_retried, ResultsTaken};

use serde_json::{Map, Value};

use crate::operation::gate::log::GateLog;
use crate::operation::gate::protocol::{GateCommand, GateReply};
use crate::operation::history::HistoryEntry;
use crate::operation::lifecycle::{reduce, DropReason, Position, Source, Status, Verdict};
use crate::operation::{OpEvent, Operation};
use crate::retry::Backoff;
use crate::telemetry::counters::{Counter, StatEvent};

/// The settings a step needs, from the configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GateLimits {
    pub retention_ms: i64,
    pub stats_delay_ms: i64,
    pub claim_ttl_ms: i64,
    /// A side effect's, an alert's and a confirmation's retries:
    /// `EFFECT_RETRY_BASE_SECONDS` doubling to `EFFECT_RETRY_MAX_SECONDS`.
    pub retry: Backoff,
    /// See [`Operation::hold_for_registration`].
    pub unregistered_hold_ms: i64,
    /// `CONFIRM_INTERVAL_SECONDS` in ms: least time between a confirmation's questions.
    pub confirm_interval_ms: i64,
    /// How long an effect (or a batch's results) its desk queued waits before asking again,
    /// should the desk be lost ([`crate::config::Config::desk_fallback_ms`]).
    pub desk_fallback_ms: i64,
    /// `EFFECT_ALERT_AFTER_SECONDS` in ms (see [`GateCommand::limit_alerts`]).
    pub effect_alert_after_ms: i64,
}

/// How the record is kept after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Save {
    /// Nothing changed.
    Unchanged,
    /// Kept in memory and stored with the next write or flush: only counts changed, of an
    /// operation nothing can change (a restart loses counts, never state), or only the mark of
    /// a ledger write that succeeded (a restart finds it not written, and writes it again).
    MemoryOnly,
    /// Stored before the answer (and before anything outbound is awaited).
    Durable,
}

/// What one step decided. `R` is its answer: a [`GateReply`] for a command, an
/// [`crate::operation::gate::alarm::AlarmDone`] for a piece of the alarm's work; `P` what it
/// stores beside the record (a batch's results' progress).
#[derive(Debug, Clone, PartialEq)]
pub struct Step<R = GateReply, P = ()> {
    /// The record after the step (`None`: there is none).
    pub record: Option<Operation>,
    pub save: Save,
    /// History rows to insert.
    pub history: Vec<HistoryEntry>,
    /// Log lines to print.
    pub logs: Vec<GateLog>,
    pub reply: R,
    /// The answer carries the stored history (`Inspect`): the object reads and attaches it.
    pub attach_history: bool,
    /// Set the alarm again even if this instance believes it is set (repairs a lost one).
    pub reset_alarm: bool,
    /// Delete all of the object's storage, its alarm included, then store `record` alone (the
    /// tombstone, with no history) if there is one (retention ended).
    pub purge: bool,
    /// Counted events the step took out of the record
    /// ([`Operation::take_stats_for_tally`]): the object hands them to its isolate's tally
    /// once the record is stored without them.
    pub tally: Vec<StatEvent>,
    /// Stored beside the record in the record's own write, also when the record is unchanged;
    /// a purge drops it.
    pub results: Option<P>,
}

impl<R, P> Step<R, P> {
    pub(crate) fn new(record: Option<Operation>, reply: R) -> Step<R, P> {
        Step {
            record,
            save: Save::Unchanged,
            history: Vec::new(),
            logs: Vec::new(),
            reply,
            attach_history: false,
            reset_alarm: false,
            purge: false,
            tally: Vec::new(),
            results: None,
        }
    }

    /// A step that stores `op` before its answer `reply`.
    pub(crate) fn stored(op: Operation, reply: R) -> Step<R, P> {
        Step::new(Some(op), reply).durable()
    }

    pub(crate) fn durable(self) -> Step<R, P> {
        self.saved(Save::Durable)
    }

    /// Durable when `changed`; else as it was.
    pub(crate) fn durable_if(mut self, changed: bool) -> Step<R, P> {
        self.save = if changed { Save::Durable } else { self.save };
        self
    }

    pub(crate) fn saved(mut self, save: Save) -> Step<R, P> {
        self.save = save;
        self
    }

    pub(crate) fn row(mut self, entry: HistoryEntry) -> Step<R, P> {
        self.history.push(entry);
        self
    }

    pub(crate) fn log(mut self, line: GateLog) -> Step<R, P> {
        self.logs.push(line);
        self
    }

    pub(crate) fn carrying(mut self, results: Option<P>) -> Step<R, P> {
        self.results = results;
        self
    }

    /// When the alarm must next fire for the record as it stands after the step.
    #[cfg(test)]
    pub fn wake_at(&self, limits: &GateLimits) -> Option<i64> {
        self.record
            .as_ref()
            .and_then(|op| op.wake_at_ms(limits.retention_ms, limits.stats_delay_ms))
    }
}

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
            let receiver = receiver(
                record,
                &key,
                &name,
                &event,
                require_registration,
                new_not_before_ms,
                now,
            );
            match receiver {
                Ok(op) => deliver(op, &event, hold_ms, now),
                Err(reply) => Step::new(None, reply),
            }
        }
        GateCommand::Nudge {
            claimed,
            metadata,
            delivery_id,
            confirm_interval_ms,
            ..
        } => nudge(
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
        GateCommand::Alert {
            alert,
            age_seconds,
            effect_alert_after_ms,
        } => held(record, |op| {
            reconciling::alert(op, alert, age_seconds, effect_alert_after_ms, now)
        }),
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

/// The record a delivery is offered to: the gate's own, or a new unregistered one; `Err` is
/// the answer, with no record, when none may be created for it.
fn receiver(
    record: Option<Operation>,
    key: &str,
    name: &str,
    event: &OpEvent,
    require_registration: bool,
    new_not_before_ms: i64,
    now: i64,
) -> Result<Operation, GateReply> {
    match record {
        // A poll only visits what the ledger lists open, and a tombstone is never listed: the
        // index entry outlived the operation, and this answer has the pass delete it. Any
        // other delivery meets the tombstone, which absorbs it (terminal, effect closed).
        Some(op) if op.retired_at_ms().is_some() && event.source == Source::Reconcile => {
            Err(GateReply::Unregistered)
        }
        Some(op) => Ok(op),
        None if require_registration => Err(GateReply::IgnoredUnregistered),
        // A poll only visits what the ledger lists open, whose gate holds a record: a gate
        // without one was purged at retention since (or never held it), and a status answer
        // may carry no time to judge its age by. It creates nothing.
        None if event.source == Source::Reconcile => Err(GateReply::Unregistered),
        // A replay after the operation's storage ended with retention (an event with no time
        // is judged by the signature's window alone).
        None if event.update_time_ms > 0 && event.update_time_ms < new_not_before_ms => {
            Err(GateReply::IgnoredTooOld)
        }
        None => Ok(Operation::unregistered(key, name, now)),
    }
}

/// Offers `event` to the reducer; an unregistered operation's first attempt waits `hold_ms`
/// for a late registration.
fn deliver(mut op: Operation, event: &OpEvent, hold_ms: i64, now: i64) -> Step {
    let verdict = op.apply(event, now);
    if verdict == Verdict::Apply {
        op.hold_for_registration(hold_ms, now);
    }
    count_delivery(&mut op, event, verdict, now, true);
    let status = op.status().clone();
    let effect = op.effect_report(now);
    let reply = match verdict {
        Verdict::Apply => GateReply::Applied { status, effect },
        Verdict::Drop(reason) => GateReply::Dropped {
            reason,
            status,
            effect,
        },
    };
    if verdict == Verdict::Drop(DropReason::Duplicate) && op.is_settled() {
        // Nothing can change a settled operation: the answer is the stored state, and the
        // count waits in memory. No history row: the worker logs the duplicate with its
        // webhook-id. This is what lets a duplicate cost a round trip and no durable write
        // (docs/PERFORMANCE.md).
        return Step::new(Some(op), reply).saved(Save::MemoryOnly);
    }
    // The decision and its count in one write; a side effect now owed is scheduled on the
    // alarm, set before the answer.
    Step::stored(op, reply).row(HistoryEntry::of_event(event, verdict))
}

/// A nudge: the gate asks the status API (from its alarm) about an operation it holds open.
/// A token proves only that Google sent something (anyone can obtain one by pointing a job of
/// their own here), so a nudge only hastens what this gate already holds: it never creates,
/// resurrects or shapes an operation.
fn nudge(
    record: Option<Operation>,
    claimed: String,
    metadata: Map<String, Value>,
    delivery_id: String,
    interval_ms: i64,
    now: i64,
) -> Step {
    let Some(mut op) = record else {
        return Step::new(None, GateReply::Unregistered);
    };
    op.count(Counter::Deliveries, now);
    let version = op.version();
    if op.forgotten().is_some() {
        // An operator stopped tracking it: nothing is asked or alerted for it again.
        return Step::new(Some(op), GateReply::Forgotten { changed: false })
            .saved(Save::MemoryOnly);
    }
    if !op.request_confirmation(now, metadata, Some(delivery_id.clone()), interval_ms) {
        // Terminal already: it absorbs, so no answer from Gemini could change it.
        return nudged_terminal(op, &claimed, now);
    }
    let status = op.status().clone();
    if op.version() == version {
        // The same nudge again while its confirmation waits, or any nudge within the
        // confirmation interval of the last question: nothing changed, so nothing is written
        // (no version, no history row, no ledger projection); the count waits in memory.
        return Step::new(Some(op), GateReply::Confirming { status }).saved(Save::MemoryOnly);
    }
    Step::stored(op, GateReply::Confirming { status }).row(HistoryEntry::Nudged {
        claimed,
        delivery_id,
    })
}

/// A nudge for a terminal operation: dropped for the reason the reducer gives the state it
/// claims, and counted. A nudge's claim is unproven and changes nothing, so nothing is written
/// for it, whatever it claims: the count waits in memory (a stream of nudges claiming another
/// state costs no durable write).
fn nudged_terminal(mut op: Operation, claimed: &str, now: i64) -> Step {
    let claimed = Position {
        status: Status::parse(claimed),
        update_time_ms: 0,
    };
    let reason = match reduce(&op.position(), &claimed) {
        Verdict::Drop(reason) => reason,
        Verdict::Apply => DropReason::Duplicate,
    };
    match reason {
        DropReason::Duplicate => op.count(Counter::Duplicates, now),
        other => op.count(Counter::Dropped(other.as_str()), now),
    }
    let reply = GateReply::Dropped {
        reason,
        status: op.status().clone(),
        effect: op.effect_report(now),
    };
    Step::new(Some(op), reply).saved(Save::MemoryOnly)
}

/// Counts a delivery's outcome in the record, exactly once (same write as the decision).
/// `arrived` is false for a confirmation, whose delivery was counted when it arrived.
pub(crate) fn count_delivery(
    op: &mut Operation,
    event: &OpEvent,
    verdict: Verdict,
    now: i64,
    arrived: bool,
) {
    if arrived && event.source == Source::Webhook {
        op.count(Counter::Deliveries, now);
    }
    match verdict {
        Verdict::Drop(DropReason::Duplicate) => op.count(Counter::Duplicates, now),
        Verdict::Drop(reason) => op.count(Counter::Dropped(reason.as_str()), now),
        Verdict::Apply if op.status().is_terminal() => op.count(
            match event.source {
                Source::Reconcile => Counter::SettledByReconcile,
                _ => Counter::SettledByWebhook,
            },
            now,
        ),
        Verdict::Apply => {}
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
    record.map_or_else(|| Step::new(None, GateReply::NotFound), command)
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
        effect_alert_after_ms: 3_600_000,
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
        answered(op, 10, 20, AttemptOutcome::Delivered)
    }

    /// `op`'s effect claimed at `started_ms` and answered `outcome` at `finished_ms`, committed
    /// as the alarm commits it: the commit's step.
    pub(crate) fn answered(
        op: Operation,
        started_ms: i64,
        finished_ms: i64,
        outcome: AttemptOutcome,
    ) -> Step<AlarmDone> {
        let (claim, s) = begin_attempt(op, started_ms, &LIMITS).unwrap();
        let attempt = Attempt {
            claim,
            outcome,
            started_ms,
            finished_ms,
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
