//! The gate's decisions as pure steps: a command, or the outcome of one piece of the alarm's
//! I/O, applied to the operation's record at a given time, giving what to store, what to
//! record in the history, what to log and what to answer.
//!
//! Guarantees (docs/DESIGN.md, invariants 1, 3 and 7): every change to an operation is decided
//! here, through [`Operation`]'s transitions, and nowhere else; a command never runs anything
//! outbound: it decides and schedules, and the Durable Object stores the record and sets the
//! alarm (at [`Operation::wake_at_ms`]) before it answers, so no answer waits on a
//! destination, the status API or an alert sink; a duplicate of a settled operation changes
//! nothing durable ([`Save::MemoryOnly`]). The Durable Object
//! (`src/edge/objects/gate_object.rs`) only loads, calls a step, performs the I/O the alarm
//! needs and saves. Time and jitter are parameters.

use crate::operation::gate_log::GateLog;
use crate::operation::gate_protocol::{EffectReport, GateCommand, GateReply, OperatorAction};
use crate::operation::history::HistoryEntry;
use crate::operation::lifecycle::{reduce, DropReason, Position, Source, Status, Verdict};
use crate::operation::{Actor, KindFill, OpEvent, Operation};
use crate::telemetry::counters::Counter;

/// The settings a step needs, from the configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub retention_ms: i64,
    pub stats_delay_ms: i64,
    pub claim_ttl_ms: i64,
    pub retry_base_secs: i64,
    pub retry_max_secs: i64,
    /// See [`Operation::hold_for_registration`].
    pub unregistered_hold_ms: i64,
}

/// How the record is kept after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Save {
    /// Nothing changed.
    Unchanged,
    /// Only counts changed, of an operation nothing can change: kept in memory and stored
    /// with the next write or flush (a restart loses counts, never state).
    MemoryOnly,
    /// Stored before the answer (and before anything outbound is awaited).
    Durable,
}

/// What one step decided. `R` is its answer: a [`GateReply`] for a command, an
/// [`crate::operation::alarm::AlarmDone`] for a piece of the alarm's work.
#[derive(Debug, Clone, PartialEq)]
pub struct Step<R = GateReply> {
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
    /// Delete all of the object's storage, its alarm included, instead of saving (retention
    /// ended: nothing of the operation stays in its gate).
    pub purge: bool,
}

impl<R> Step<R> {
    pub(crate) fn new(record: Option<Operation>, reply: R) -> Step<R> {
        Step {
            record,
            save: Save::Unchanged,
            history: Vec::new(),
            logs: Vec::new(),
            reply,
            attach_history: false,
            reset_alarm: false,
            purge: false,
        }
    }

    pub(crate) fn durable(mut self) -> Step<R> {
        self.save = Save::Durable;
        self
    }

    pub(crate) fn row(mut self, entry: HistoryEntry) -> Step<R> {
        self.history.push(entry);
        self
    }

    pub(crate) fn log(mut self, line: GateLog) -> Step<R> {
        self.logs.push(line);
        self
    }

    /// When the alarm must next fire for the record as it stands after the step.
    #[cfg(test)]
    pub fn wake_at(&self, limits: &Limits) -> Option<i64> {
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
        } => match record {
            Some(mut op) => {
                // The completion may have come first (short interactions often do): the
                // registration fills in the kind and the metadata, so later attempts route
                // by it and carry them.
                let fill = op.fill_kind(kind.as_deref(), now);
                let filled_metadata = op.fill_user_metadata(user_metadata);
                let reply = GateReply::Exists {
                    operation: op.view(),
                    kind: fill,
                };
                let kind = op.kind().map(str::to_string);
                let step = Step::new(Some(op), reply);
                match (fill, filled_metadata) {
                    (KindFill::Filled, _) => step.durable().row(HistoryEntry::KindFilled { kind }),
                    (_, true) => step.durable(),
                    _ => step,
                }
            }
            None => {
                let mut op = Operation::register(&key, &name, kind, now);
                op.fill_user_metadata(user_metadata);
                let reply = GateReply::Created {
                    operation: op.view(),
                };
                let kind = op.kind().map(str::to_string);
                Step::new(Some(op), reply)
                    .durable()
                    .row(HistoryEntry::Registered { kind })
            }
        },
        GateCommand::Deliver {
            key,
            name,
            event,
            require_registration,
            hold_ms,
            new_not_before_ms,
        } => {
            let mut op = match record {
                Some(op) => op,
                None if require_registration => {
                    return Step::new(None, GateReply::IgnoredUnregistered)
                }
                // A poll only visits what the ledger lists open, whose gate holds a record: a
                // gate without one was purged at retention since (or never held it), and a
                // status answer may carry no time to judge its age by. It creates nothing.
                None if event.source == Source::Reconcile => {
                    return Step::new(None, GateReply::Unregistered)
                }
                // A replay after the operation's storage ended with retention (an event with
                // no time is judged by the signature's window alone).
                None if event.update_time_ms > 0 && event.update_time_ms < new_not_before_ms => {
                    return Step::new(None, GateReply::IgnoredTooOld)
                }
                None => Operation::unregistered(&key, &name, now),
            };
            let verdict = op.apply(&event, now);
            if verdict == Verdict::Apply {
                op.hold_for_registration(hold_ms, now);
            }
            count_delivery(&mut op, &event, verdict, now, true);
            let status = op.status().clone();
            let effect = effect_report(&op, now);
            if verdict == Verdict::Drop(DropReason::Duplicate) && op.is_settled() {
                // Nothing can change a settled operation: the answer is the stored state,
                // and the count waits in memory. No history row: the worker logs the
                // duplicate with its webhook-id. This is what lets a duplicate cost a round
                // trip and no durable write (docs/PERFORMANCE.md).
                let mut step = Step::new(
                    Some(op),
                    GateReply::Dropped {
                        reason: DropReason::Duplicate,
                        status,
                        effect,
                    },
                );
                step.save = Save::MemoryOnly;
                return step;
            }
            // The decision and its count in one write; a side effect now owed is scheduled
            // on the alarm, set before the answer.
            let reply = match verdict {
                Verdict::Apply => GateReply::Applied { status, effect },
                Verdict::Drop(reason) => GateReply::Dropped {
                    reason,
                    status,
                    effect,
                },
            };
            Step::new(Some(op), reply)
                .durable()
                .row(HistoryEntry::of_event(&event, verdict))
        }
        GateCommand::Nudge {
            claimed,
            metadata,
            delivery_id,
            ..
        } => {
            // A token proves only that Google sent something (anyone can obtain one by
            // pointing a job of their own here), so a nudge only hastens what this gate
            // already holds: it never creates, resurrects or shapes an operation.
            let Some(mut op) = record else {
                return Step::new(None, GateReply::Unregistered);
            };
            op.count(Counter::Deliveries, now);
            let version = op.version();
            if op.forgotten().is_some() {
                // An operator stopped tracking it: nothing is asked or alerted for it again.
                let mut step = Step::new(Some(op), GateReply::Forgotten { changed: false });
                step.save = Save::MemoryOnly;
                return step;
            }
            if !op.request_confirmation(now, metadata, Some(delivery_id.clone())) {
                // Terminal already: it absorbs, so no answer from Gemini could change it.
                let claimed = Position {
                    status: Status::parse(&claimed),
                    update_time_ms: 0,
                };
                let reason = match reduce(&position(&op), &claimed) {
                    Verdict::Drop(reason) => reason,
                    Verdict::Apply => DropReason::Duplicate,
                };
                return dropped(op, reason, now);
            }
            let status = op.status().clone();
            if op.version() == version {
                // The same nudge again while its confirmation waits: nothing changed, so
                // nothing is written (no version, no history row, no ledger projection); the
                // count waits in memory.
                let mut step = Step::new(Some(op), GateReply::Confirming { status });
                step.save = Save::MemoryOnly;
                return step;
            }
            Step::new(Some(op), GateReply::Confirming { status })
                .durable()
                .row(HistoryEntry::Nudged {
                    claimed,
                    delivery_id,
                })
        }
        GateCommand::RetryEffect => match record {
            // The alarm runs the effect if due: the backoff stands; setting the alarm again
            // repairs a lost one.
            Some(op) => {
                let effect = effect_report(&op, now);
                let mut step = Step::new(Some(op), GateReply::Effect { effect });
                step.reset_alarm = true;
                step
            }
            None => Step::new(None, GateReply::NotFound),
        },
        GateCommand::Alert { alert, age_seconds } => match record {
            Some(mut op) => {
                if !op.raise_alert(alert, age_seconds, now) {
                    return Step::new(Some(op), GateReply::AlertSent { sent: false });
                }
                // Queued in the record and sent by the alarm, the one runner of alerts: if the
                // object dies during the send, the next alarm sends it again, under one id.
                Step::new(Some(op), GateReply::AlertSent { sent: true }).durable()
            }
            None => Step::new(None, GateReply::NotFound),
        },
        GateCommand::Redeliver {
            reason,
            sent_before_ms,
            by,
        } => match record {
            // A bulk run's cut-off: an effect sent at or after it was sent by this run (or
            // after it began), so the run, resumed or run again, leaves it alone.
            Some(op) if sent_before_ms.is_some_and(|cutoff| op.sent_since(cutoff)) => refused(
                op,
                crate::operation::OperatorRefusal::SentSinceCutoff.as_str(),
            ),
            // An effect not done may have reached the destination already: it is retried
            // under its own webhook-id, never given a new one.
            Some(op) if !op.effect().done() => operator_retry(op, &reason, by, now),
            Some(mut op) => match op.redeliver(now, &reason) {
                Ok(generation) => {
                    op.count(Counter::Redeliveries, now);
                    operator_acted(op, OperatorAction::Redeliver, generation, &reason, by, now)
                }
                Err(refusal) => refused(op, refusal.as_str()),
            },
            None => Step::new(None, GateReply::NotFound),
        },
        GateCommand::RetryNow { reason, by } => match record {
            Some(op) => operator_retry(op, &reason, by, now),
            None => Step::new(None, GateReply::NotFound),
        },
        GateCommand::Forget { reason, by } => match record {
            Some(mut op) => {
                let changed = op.forget(now, &reason);
                let key = op.key().to_string();
                let step = Step::new(Some(op), GateReply::Forgotten { changed });
                if !changed {
                    return step;
                }
                step.durable()
                    .row(HistoryEntry::Forgotten {
                        reason: reason.clone(),
                        by: by.clone(),
                    })
                    .log(GateLog::ForgottenByOperator { key, reason, by })
            }
            None => Step::new(None, GateReply::NotFound),
        },
        GateCommand::Reindex => match record {
            // The reconciliation audit (or a pass told the effect is done) found the `open:`
            // index out of step: project again, treating the index entry as possibly there.
            Some(mut op) => {
                let changed = op.reindex();
                let (key, status) = (op.key().to_string(), op.status().as_str().to_string());
                let step = Step::new(Some(op), GateReply::Reindexed { changed });
                if !changed {
                    return step;
                }
                step.durable().log(GateLog::Reindexed { key, status })
            }
            None => Step::new(None, GateReply::NotFound),
        },
        GateCommand::Settle { status, reason, by } => match record {
            Some(mut op) => match op.settle_by_operator(Status::parse(&status), &reason, now) {
                Ok(event) => {
                    let key = op.key().to_string();
                    let (status, effect) = (op.status().clone(), effect_report(&op, now));
                    let row = HistoryEntry::settled_by_operator(&event, &reason, by.clone());
                    Step::new(
                        Some(op),
                        GateReply::Applied {
                            status: status.clone(),
                            effect,
                        },
                    )
                    .durable()
                    .row(row)
                    .log(GateLog::SettledByOperator {
                        key,
                        status: status.as_str().to_string(),
                        reason,
                        by,
                    })
                }
                Err(refusal) => refused(op, refusal.as_str()),
            },
            None => Step::new(None, GateReply::NotFound),
        },
        GateCommand::StatusUnusable {
            reason,
            age_seconds,
        } => match record {
            Some(mut op) => {
                let raised_before = op.alerts_raised().len();
                if !op.status_unusable(&reason, age_seconds, now) {
                    return Step::new(Some(op), GateReply::AlertSent { sent: false });
                }
                let raised = op.alerts_raised().len() > raised_before;
                Step::new(Some(op), GateReply::AlertSent { sent: raised })
                    .durable()
                    .row(HistoryEntry::StatusUnusable {
                        reason: reason.clone(),
                    })
            }
            None => Step::new(None, GateReply::NotFound),
        },
        // A repair has been done (or was not needed) by the object before this step.
        GateCommand::Inspect | GateCommand::Repair { .. } => match record {
            Some(op) => {
                let reply = GateReply::Found {
                    operation: op.view(),
                    history: Vec::new(),
                };
                let mut step = Step::new(Some(op), reply);
                step.attach_history = true;
                step
            }
            None => Step::new(None, GateReply::NotFound),
        },
    }
}

fn operator_retry(mut op: Operation, reason: &str, by: Option<Actor>, now: i64) -> Step {
    match op.retry_now(now) {
        Ok(()) => {
            let generation = op.effect().generation();
            operator_acted(op, OperatorAction::RetryNow, generation, reason, by, now)
        }
        Err(refusal) => refused(op, refusal.as_str()),
    }
}

fn operator_acted(
    op: Operation,
    action: OperatorAction,
    generation: u32,
    reason: &str,
    by: Option<Actor>,
    now: i64,
) -> Step {
    let key = op.key().to_string();
    let reason = reason.to_string();
    let line = match action {
        OperatorAction::RetryNow => GateLog::RetryNow {
            key,
            generation,
            reason: reason.clone(),
            by: by.clone(),
        },
        OperatorAction::Redeliver => GateLog::Redeliver {
            key,
            generation,
            reason: reason.clone(),
            by: by.clone(),
        },
    };
    let effect = effect_report(&op, now);
    let mut step = Step::new(
        Some(op),
        GateReply::Redelivered {
            generation,
            action,
            effect,
        },
    )
    .durable()
    .row(match action {
        OperatorAction::RetryNow => HistoryEntry::RetryNow {
            generation,
            reason,
            by,
        },
        OperatorAction::Redeliver => HistoryEntry::Redeliver {
            generation,
            reason,
            by,
        },
    })
    .log(line);
    step.reset_alarm = true;
    step
}

fn refused(op: Operation, reason: &str) -> Step {
    Step::new(
        Some(op),
        GateReply::Refused {
            reason: reason.to_string(),
        },
    )
}

/// A delivery that changes nothing on a terminal operation, counted. A settled operation
/// stores nothing for it: its count waits in memory.
fn dropped(mut op: Operation, reason: DropReason, now: i64) -> Step {
    match reason {
        DropReason::Duplicate => op.count(Counter::Duplicates, now),
        other => op.count(Counter::Dropped(other.as_str()), now),
    }
    let settled_duplicate = reason == DropReason::Duplicate && op.is_settled();
    let reply = GateReply::Dropped {
        reason,
        status: op.status().clone(),
        effect: effect_report(&op, now),
    };
    let mut step = Step::new(Some(op), reply);
    step.save = if settled_duplicate {
        Save::MemoryOnly
    } else {
        Save::Durable
    };
    step
}

/// Where the side effect stands, without running it (the alarm runs it).
pub fn effect_report(op: &Operation, now: i64) -> EffectReport {
    if !op.effect_owed() {
        if op.effect().done() {
            EffectReport::Delivered
        } else if op.effect().parked().is_some() {
            EffectReport::Parked
        } else {
            EffectReport::NotOwed
        }
    } else if op.effect().claim().is_some_and(|c| c.expires_ms > now) {
        EffectReport::InFlight
    } else if op.effect().next_attempt_ms() <= now {
        EffectReport::Scheduled
    } else {
        EffectReport::RetryScheduled
    }
}

fn position(op: &Operation) -> Position {
    Position {
        status: op.status().clone(),
        update_time_ms: op.update_time_ms(),
    }
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

/// Records and commands the gate's and the alarm's tests share.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;
    use crate::operation::alarm::{attempt_finished, begin_attempt, Attempt, ConfirmAnswer};
    use crate::operation::observation::Observation;
    use crate::operation::AttemptOutcome;
    use serde_json::Map;

    pub(crate) const LIMITS: Limits = Limits {
        retention_ms: 100_000,
        stats_delay_ms: 0,
        claim_ttl_ms: 10_000,
        retry_base_secs: 1,
        retry_max_secs: 8,
        unregistered_hold_ms: 0,
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
        }
    }

    pub(crate) fn registered() -> Operation {
        Operation::register("batches/a", "batches/a", Some("billing".into()), 0)
    }

    /// A terminal operation whose effect is done.
    pub(crate) fn settled() -> Operation {
        let s = step(Some(registered()), deliver(Status::Succeeded), 10);
        let (claim, s) = begin_attempt(s.record.unwrap(), 10, &LIMITS).unwrap();
        let attempt = Attempt {
            claim,
            outcome: AttemptOutcome::Delivered,
            started_ms: 10,
            finished_ms: 20,
            target: Default::default(),
        };
        attempt_finished(s.record.unwrap(), &attempt, &LIMITS, 0.5)
            .record
            .unwrap()
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
            .map(|l| l.event().as_str().to_string())
            .collect()
    }

    pub(crate) fn nudged() -> Operation {
        step(Some(registered()), nudge("succeeded"), 10)
            .record
            .unwrap()
    }

    pub(crate) fn observed(status: Status) -> ConfirmAnswer {
        ConfirmAnswer::Answer(Ok(Observation {
            status,
            update_time_ms: 5,
            details: Map::new(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;
    use crate::operation::alarm::*;
    use crate::operation::alert::AlertKind;
    use crate::operation::observation::StatusError;
    use crate::operation::AttemptOutcome;
    use serde_json::json;
    use serde_json::Map;

    #[test]
    fn register_creates_a_pending_record() {
        let s = step(
            None,
            GateCommand::Register {
                key: "batches/a".into(),
                name: "batches/a".into(),
                kind: Some("k".into()),
                user_metadata: None,
            },
            5,
        );
        assert!(matches!(s.reply, GateReply::Created { .. }));
        assert_eq!(s.save, Save::Durable);
        assert_eq!(whats(&s), ["registered"]);
        assert_eq!(s.record.unwrap().status(), &Status::Pending);
    }

    #[test]
    fn register_of_a_known_operation_fills_a_missing_kind_only() {
        let unregistered = Operation::unregistered("batches/a", "batches/a", 0);
        let reg = |kind: &str| GateCommand::Register {
            key: "batches/a".into(),
            name: "batches/a".into(),
            kind: Some(kind.into()),
            user_metadata: None,
        };
        let s = step(Some(unregistered), reg("billing"), 5);
        assert!(matches!(
            s.reply,
            GateReply::Exists {
                kind: KindFill::Filled,
                ..
            }
        ));
        assert_eq!(
            (s.save, whats(&s)),
            (Save::Durable, vec!["kind_filled".to_string()])
        );
        let s = step(s.record, reg("other"), 6);
        assert!(matches!(
            s.reply,
            GateReply::Exists {
                kind: KindFill::Conflict,
                ..
            }
        ));
        assert_eq!(s.save, Save::Unchanged);
        assert_eq!(s.record.unwrap().kind(), Some("billing"));
    }

    #[test]
    fn first_terminal_delivery_is_applied_and_its_effect_scheduled_not_run() {
        let s = step(Some(registered()), deliver(Status::Succeeded), 10);
        assert_eq!(
            s.reply,
            GateReply::Applied {
                status: Status::Succeeded,
                effect: EffectReport::Scheduled
            }
        );
        assert_eq!(s.save, Save::Durable);
        assert_eq!(whats(&s), ["applied"]);
        assert_eq!(
            s.wake_at(&LIMITS),
            Some(10),
            "the alarm runs the effect at once"
        );
    }

    #[test]
    fn delivery_for_an_unknown_operation_creates_it_unless_registration_is_required() {
        let s = step(None, deliver(Status::Succeeded), 10);
        assert!(matches!(s.reply, GateReply::Applied { .. }));
        assert!(!s.record.unwrap().registered());
        let required = GateCommand::Deliver {
            key: "batches/a".into(),
            name: "batches/a".into(),
            event: event(Status::Succeeded, Source::Webhook),
            require_registration: true,
            hold_ms: 0,
            new_not_before_ms: 0,
        };
        let s = step(None, required, 10);
        assert_eq!(s.reply, GateReply::IgnoredUnregistered);
        assert!(s.record.is_none());
        assert_eq!(s.save, Save::Unchanged);
    }

    #[test]
    fn duplicate_of_a_settled_operation_is_answered_from_memory() {
        let s = step(Some(settled()), deliver(Status::Succeeded), 30);
        assert_eq!(
            s.reply,
            GateReply::Dropped {
                reason: DropReason::Duplicate,
                status: Status::Succeeded,
                effect: EffectReport::Delivered
            }
        );
        assert_eq!(s.save, Save::MemoryOnly);
        assert!(s.history.is_empty());
    }

    #[test]
    fn duplicate_while_the_effect_is_owed_is_stored_with_its_reason() {
        let first = step(Some(registered()), deliver(Status::Succeeded), 10);
        let s = step(first.record, deliver(Status::Succeeded), 11);
        assert_eq!(
            s.reply,
            GateReply::Dropped {
                reason: DropReason::Duplicate,
                status: Status::Succeeded,
                effect: EffectReport::Scheduled
            }
        );
        assert_eq!(s.save, Save::Durable);
        assert_eq!(whats(&s), ["dropped"]);
    }

    #[test]
    fn conflicting_terminal_is_dropped_and_recorded() {
        let s = step(Some(settled()), deliver(Status::Failed), 30);
        assert!(matches!(
            s.reply,
            GateReply::Dropped {
                reason: DropReason::ConflictingTerminal,
                ..
            }
        ));
        assert_eq!(s.save, Save::Durable);
        assert_eq!(whats(&s), ["dropped"]);
    }

    #[test]
    fn nudge_on_an_open_operation_waits_for_the_status_api() {
        let s = step(Some(registered()), nudge("failed"), 10);
        assert_eq!(
            s.reply,
            GateReply::Confirming {
                status: Status::Pending
            }
        );
        assert_eq!(whats(&s), ["nudged"]);
        assert_eq!(s.wake_at(&LIMITS), Some(10));
        assert_eq!(
            s.record.unwrap().status(),
            &Status::Pending,
            "the body decided nothing"
        );
    }

    #[test]
    fn nudge_on_a_terminal_operation_is_a_drop_by_the_reducer() {
        let s = step(Some(settled()), nudge("succeeded"), 30);
        assert!(matches!(
            s.reply,
            GateReply::Dropped {
                reason: DropReason::Duplicate,
                ..
            }
        ));
        assert_eq!(s.save, Save::MemoryOnly);
        let s = step(Some(settled()), nudge("failed"), 30);
        assert!(matches!(
            s.reply,
            GateReply::Dropped {
                reason: DropReason::ConflictingTerminal,
                ..
            }
        ));
        assert_eq!(s.save, Save::Durable);
    }

    #[test]
    fn a_nudge_creates_nothing_for_a_name_the_gate_does_not_hold() {
        // Never seen, purged at retention, or under REQUIRE_REGISTRATION: the same answer,
        // and nothing stored, whatever the token claimed.
        let s = step(None, nudge("succeeded"), 10);
        assert_eq!(s.reply, GateReply::Unregistered);
        assert!(s.record.is_none());
        assert_eq!(s.save, Save::Unchanged);
        assert!(s.history.is_empty() && s.logs.is_empty());
        // Held open (registered, or opened by a signed delivery): the nudge hastens it.
        let s = step(Some(registered()), nudge("succeeded"), 10);
        assert!(matches!(s.reply, GateReply::Confirming { .. }));
        assert_eq!(s.save, Save::Durable);
        let opened = step(None, deliver(Status::Running), 5).record;
        let s = step(opened, nudge("succeeded"), 10);
        assert!(matches!(s.reply, GateReply::Confirming { .. }));
    }

    #[test]
    fn a_poll_creates_nothing_for_a_name_the_gate_does_not_hold() {
        // A status answer may carry no time (a video's): a gate purged at retention is not
        // rebuilt from it, however old it is.
        let poll = GateCommand::Deliver {
            key: "operations/v".into(),
            name: "models/veo/operations/v".into(),
            event: event(Status::Succeeded, Source::Reconcile),
            require_registration: false,
            hold_ms: 0,
            new_not_before_ms: 0,
        };
        let s = step(None, poll.clone(), 10);
        assert_eq!(s.reply, GateReply::Unregistered);
        assert!(s.record.is_none());
        assert_eq!(s.save, Save::Unchanged);
        // A record it can apply to is settled by it as before.
        let held = Operation::register("operations/v", "models/veo/operations/v", None, 0);
        assert!(matches!(
            step(Some(held), poll, 10).reply,
            GateReply::Applied { .. }
        ));
    }

    #[test]
    fn a_registrations_metadata_reaches_the_effect_over_every_other_source() {
        let register = |meta: serde_json::Value| GateCommand::Register {
            key: "batches/a".into(),
            name: "batches/a".into(),
            kind: None,
            user_metadata: Some(meta),
        };
        let op = step(None, register(json!({"tenant": "ours"})), 1).record;
        // A second registration does not replace the first's.
        let s = step(op, register(json!({"tenant": "other"})), 2);
        assert_eq!(s.save, Save::Unchanged);
        let mut done = event(Status::Succeeded, Source::Reconcile);
        done.details
            .insert("user_metadata".into(), json!({"tenant": "echo"}));
        let op = step(
            s.record,
            GateCommand::Deliver {
                key: "batches/a".into(),
                name: "batches/a".into(),
                event: done,
                require_registration: false,
                hold_ms: 0,
                new_not_before_ms: 0,
            },
            3,
        )
        .record
        .unwrap();
        assert_eq!(op.details()["user_metadata"], json!({"tenant": "ours"}));
        // A registration after the outcome, before any attempt, still gives it; after an
        // attempt went out it changes nothing (one webhook-id, one body).
        let unregistered = step(None, deliver(Status::Succeeded), 5).record;
        let s = step(unregistered, register(json!({"late": true})), 6);
        assert_eq!(s.save, Save::Durable);
        let op = s.record.unwrap();
        assert_eq!(op.details()["user_metadata"], json!({"late": true}));
        let (_, started) = begin_attempt(op, 7, &LIMITS).unwrap();
        let s = step(started.record, register(json!({"later": true})), 8);
        assert_eq!(s.save, Save::Unchanged);
        assert_eq!(
            s.record.unwrap().details()["user_metadata"],
            json!({"late": true})
        );
    }

    #[test]
    fn the_same_nudge_again_while_its_confirmation_waits_writes_nothing() {
        let first = step(Some(registered()), nudge("succeeded"), 10);
        let op = first.record.unwrap();
        let version = op.version();
        let again = step(Some(op), nudge("succeeded"), 11);
        assert!(matches!(again.reply, GateReply::Confirming { .. }));
        assert_eq!(again.save, Save::MemoryOnly, "only the count, in memory");
        assert!(again.history.is_empty());
        let op = again.record.unwrap();
        assert_eq!(op.version(), version, "no version: no ledger projection");
        let mut meta = Map::new();
        meta.insert("user_metadata".into(), json!({"a": 1}));
        let mut with_meta = nudge("succeeded");
        if let GateCommand::Nudge { metadata, .. } = &mut with_meta {
            *metadata = meta;
        }
        let gained = step(Some(op), with_meta, 12);
        assert_eq!(gained.save, Save::Durable, "new metadata is a change");
        assert!(gained.record.unwrap().version() > version);
    }

    #[test]
    fn a_forgotten_operation_is_never_asked_about_or_alerted_again() {
        let nudged = step(Some(registered()), nudge("succeeded"), 10);
        let forgot = step(
            nudged.record,
            GateCommand::Forget {
                reason: "gone".into(),
                by: None,
            },
            11,
        );
        let op = forgot.record.unwrap();
        assert!(
            op.confirmation().is_none(),
            "the waiting confirmation is dropped"
        );
        let version = op.version();
        let s = step(Some(op), nudge("succeeded"), 12);
        assert_eq!(s.reply, GateReply::Forgotten { changed: false });
        assert_ne!(s.save, Save::Durable);
        let op = s.record.unwrap();
        assert!(op.confirmation().is_none());
        assert_eq!(op.version(), version);
        let alert = step(
            Some(op),
            GateCommand::Alert {
                alert: AlertKind::Stuck,
                age_seconds: 1,
            },
            13,
        );
        assert_eq!(alert.reply, GateReply::AlertSent { sent: false });
        let op = alert.record.unwrap();
        assert!(op.pending_alerts().is_empty() && op.confirmation().is_none());
    }

    #[test]
    fn an_operation_gemini_does_not_know_alerts_once_not_stuck_on_top() {
        let s = confirmed(
            nudged(),
            ConfirmAnswer::Answer(Err(StatusError::NotFound)),
            20,
            &LIMITS,
            1.0,
        );
        let stuck = step(
            s.record,
            GateCommand::Alert {
                alert: AlertKind::Stuck,
                age_seconds: 99_999,
            },
            30,
        );
        assert_eq!(stuck.reply, GateReply::AlertSent { sent: false });
        assert_eq!(
            stuck.record.unwrap().alerts_raised(),
            vec![AlertKind::UnknownToGemini]
        );
    }

    fn deliver_unregistered(hold_ms: i64) -> GateCommand {
        GateCommand::Deliver {
            key: "batches/a".into(),
            name: "batches/a".into(),
            event: event(Status::Succeeded, Source::Webhook),
            require_registration: false,
            hold_ms,
            new_not_before_ms: 0,
        }
    }

    /// An unregistered completion whose event happened at `event_ms`, to a gate that
    /// refuses new records for events before `not_before`.
    fn deliver_at(event_ms: i64, not_before: i64) -> GateCommand {
        let mut command = deliver_unregistered(0);
        if let GateCommand::Deliver { event, .. } = &mut command {
            event.update_time_ms = event_ms;
        }
        command.limit_new_records(not_before);
        command
    }

    #[test]
    fn an_event_older_than_retention_creates_no_record() {
        // Retention ended for an operation closed before `not_before`: its gate is empty and
        // an event of it, however signed, is a replay.
        let s = step(None, deliver_at(999, 1_000), 5_000);
        assert_eq!(s.reply, GateReply::IgnoredTooOld);
        assert!(s.record.is_none());
        assert_eq!(s.save, Save::Unchanged);
        assert!(s.history.is_empty());
        // Newer than the limit, or with no time of its own (the signature's window decides):
        // a record is created and the effect runs.
        for event_ms in [1_000, 4_000, 0] {
            let s = step(None, deliver_at(event_ms, 1_000), 5_000);
            assert!(matches!(s.reply, GateReply::Applied { .. }), "{event_ms}");
            assert_eq!(s.save, Save::Durable);
        }
        // A gate that has the record applies it as always (terminal absorbs).
        let kept = step(None, deliver_at(4_000, 1_000), 5_000).record;
        let s = step(kept, deliver_at(999, 1_000), 6_000);
        assert!(matches!(s.reply, GateReply::Dropped { .. }));
    }

    #[test]
    fn the_limit_on_new_records_is_never_on_the_wire() {
        let command = deliver_at(999, 1_000);
        let wire = serde_json::to_string(&command).unwrap();
        assert!(!wire.contains("not_before"), "{wire}");
        let back: GateCommand = serde_json::from_str(&wire).unwrap();
        let s = step(None, back, 5_000);
        assert!(
            matches!(s.reply, GateReply::Applied { .. }),
            "only the gate sets it"
        );
    }

    #[test]
    fn an_unregistered_completion_waits_for_a_late_registration_then_runs_at_once() {
        let s = step(None, deliver_unregistered(15_000), 10);
        let held = s.record.as_ref().unwrap().effect().next_attempt_ms();
        assert_eq!(held, 10 + 15_000, "held");
        assert!(begin_attempt(s.record.clone().unwrap(), 11, &LIMITS).is_none());
        let late = step(
            s.record,
            GateCommand::Register {
                key: "batches/a".into(),
                name: "batches/a".into(),
                kind: Some("billing".into()),
                user_metadata: None,
            },
            2_000,
        );
        assert!(matches!(
            late.reply,
            GateReply::Exists {
                kind: KindFill::Filled,
                ..
            }
        ));
        let due = late.record.as_ref().unwrap().effect().next_attempt_ms();
        assert_eq!(due, 2_000, "due now");
        let op = late.record.unwrap();
        assert_eq!(op.kind(), Some("billing"));
        assert!(begin_attempt(op, 2_000, &LIMITS).is_some());
        let registered_first = step(Some(registered()), deliver(Status::Succeeded), 10);
        let due = registered_first.record.unwrap().effect().next_attempt_ms();
        assert_eq!(due, 10, "no hold");
    }

    #[test]
    fn a_registration_after_the_first_attempt_leaves_the_kind_and_the_body_alone() {
        let s = step(None, deliver_unregistered(0), 10);
        let (claim, s) = begin_attempt(s.record.unwrap(), 10, &LIMITS).unwrap();
        let failed = attempt_finished(
            s.record.unwrap(),
            &Attempt {
                claim,
                outcome: AttemptOutcome::Retry("503".into()),
                started_ms: 10,
                finished_ms: 20,
                target: Default::default(),
            },
            &LIMITS,
            1.0,
        );
        let op = failed.record.unwrap();
        let late = step(
            Some(op.clone()),
            GateCommand::Register {
                key: "batches/a".into(),
                name: "batches/a".into(),
                kind: Some("billing".into()),
                user_metadata: None,
            },
            30,
        );
        assert!(matches!(
            late.reply,
            GateReply::Exists {
                kind: KindFill::TooLate,
                ..
            }
        ));
        assert_eq!(late.save, Save::Unchanged);
        assert_eq!(
            late.record.unwrap(),
            op,
            "kind, version and schedule unchanged"
        );
    }

    #[test]
    fn retry_effect_repairs_the_alarm_and_runs_nothing() {
        let first = step(Some(registered()), deliver(Status::Succeeded), 10);
        let s = step(first.record, GateCommand::RetryEffect, 11);
        assert_eq!(
            s.reply,
            GateReply::Effect {
                effect: EffectReport::Scheduled
            }
        );
        assert!(s.reset_alarm);
        assert_eq!(s.save, Save::Unchanged);
        assert_eq!(
            step(None, GateCommand::RetryEffect, 1).reply,
            GateReply::NotFound
        );
    }

    #[test]
    fn alert_is_raised_once_and_queued_for_the_alarm() {
        let raise = || GateCommand::Alert {
            alert: AlertKind::Stuck,
            age_seconds: 60,
        };
        let s = step(Some(registered()), raise(), 10);
        assert_eq!(s.reply, GateReply::AlertSent { sent: true });
        assert_eq!(s.wake_at(&LIMITS), Some(10));
        let again = step(s.record, raise(), 11);
        assert_eq!(again.reply, GateReply::AlertSent { sent: false });
        assert_eq!(again.save, Save::Unchanged);
    }

    #[test]
    fn redeliver_on_an_effect_not_done_is_retry_now_under_the_same_generation() {
        let first = step(Some(registered()), deliver(Status::Succeeded), 10);
        let (claim, s) = begin_attempt(first.record.unwrap(), 10, &LIMITS).unwrap();
        let failed = attempt_finished(
            s.record.unwrap(),
            &Attempt {
                claim,
                outcome: AttemptOutcome::Park("400".into()),
                started_ms: 10,
                finished_ms: 20,
                target: Default::default(),
            },
            &LIMITS,
            0.5,
        );
        let s = step(
            failed.record,
            GateCommand::Redeliver {
                reason: "fixed".into(),
                sent_before_ms: None,
                by: None,
            },
            30,
        );
        assert_eq!(
            s.reply,
            GateReply::Redelivered {
                generation: 1,
                action: OperatorAction::RetryNow,
                effect: EffectReport::Scheduled
            }
        );
        assert_eq!(events(&s), ["retry_now"]);
        assert!(s.reset_alarm);
    }

    #[test]
    fn redeliver_on_a_done_effect_is_a_new_generation() {
        let s = step(
            Some(settled()),
            GateCommand::Redeliver {
                reason: "lost downstream".into(),
                sent_before_ms: None,
                by: None,
            },
            30,
        );
        assert_eq!(
            s.reply,
            GateReply::Redelivered {
                generation: 2,
                action: OperatorAction::Redeliver,
                effect: EffectReport::Scheduled
            }
        );
        assert_eq!(whats(&s), ["redeliver"]);
    }

    #[test]
    fn a_bulk_runs_cutoff_refuses_an_effect_sent_since_it() {
        let run = |cutoff| GateCommand::Redeliver {
            reason: "bulk redeliver: lost downstream".into(),
            sent_before_ms: Some(cutoff),
            by: None,
        };
        let refused_as_sent = |s: &Step| {
            matches!(&s.reply, GateReply::Refused { reason }
                if reason == crate::operation::OperatorRefusal::SentSinceCutoff.as_str())
        };
        // Accepted at 20: a run cut off at 20 began before it went out, and leaves it alone.
        let s = step(Some(settled()), run(20), 30);
        assert!(refused_as_sent(&s), "{:?}", s.reply);
        assert_eq!(s.save, Save::Unchanged);
        // A run cut off at 25 redelivers it once; that run again does not, neither while the
        // new generation waits nor once it is accepted.
        let s = step(s.record, run(25), 30);
        assert!(matches!(
            s.reply,
            GateReply::Redelivered {
                generation: 2,
                action: OperatorAction::Redeliver,
                ..
            }
        ));
        let again = step(s.record, run(25), 31);
        assert!(refused_as_sent(&again), "{:?}", again.reply);
        assert!(again.history.is_empty());
        let (claim, s) = begin_attempt(again.record.unwrap(), 32, &LIMITS).unwrap();
        let attempt = Attempt {
            claim,
            outcome: AttemptOutcome::Delivered,
            started_ms: 32,
            finished_ms: 40,
            target: Default::default(),
        };
        let done = attempt_finished(s.record.unwrap(), &attempt, &LIMITS, 0.5).record;
        assert!(done.as_ref().unwrap().effect().done());
        let s = step(done, run(25), 50);
        assert!(refused_as_sent(&s), "{:?}", s.reply);
        // A run with a later cut-off sends it again.
        let s = step(s.record, run(50), 50);
        assert!(matches!(
            s.reply,
            GateReply::Redelivered {
                generation: 3,
                action: OperatorAction::Redeliver,
                ..
            }
        ));
    }

    #[test]
    fn retry_now_is_refused_while_an_attempt_is_in_flight() {
        let first = step(Some(registered()), deliver(Status::Succeeded), 10);
        let (_, s) = begin_attempt(first.record.unwrap(), 10, &LIMITS).unwrap();
        let s = step(
            s.record,
            GateCommand::RetryNow {
                reason: String::new(),
                by: None,
            },
            11,
        );
        assert!(matches!(&s.reply, GateReply::Refused { reason } if reason.contains("in flight")));
        assert_eq!(s.save, Save::Unchanged);
        let none = step(
            None,
            GateCommand::RetryNow {
                reason: String::new(),
                by: None,
            },
            11,
        );
        assert_eq!(none.reply, GateReply::NotFound);
    }

    #[test]
    fn operator_actions_on_an_operation_without_an_outcome_are_refused() {
        let s = step(
            Some(registered()),
            GateCommand::Redeliver {
                reason: String::new(),
                sent_before_ms: None,
                by: None,
            },
            5,
        );
        assert!(matches!(s.reply, GateReply::Refused { .. }));
    }

    #[test]
    fn reindex_forces_a_projection_and_marks_the_index_entry_possibly_present() {
        let mut op = registered();
        op.projection_written(op.version(), 0);
        let s = step(Some(op), GateCommand::Reindex, 5);
        assert_eq!(s.reply, GateReply::Reindexed { changed: true });
        let record = s.record.unwrap();
        assert!(record.indexed());
        assert!(
            record.projected_version() < record.version(),
            "a projection is pending"
        );
        assert_eq!(
            step(None, GateCommand::Reindex, 5).reply,
            GateReply::NotFound
        );
    }

    #[test]
    fn forget_is_recorded_once() {
        let s = step(
            Some(registered()),
            GateCommand::Forget {
                reason: "job deleted".into(),
                by: None,
            }
            .by(actor()),
            5,
        );
        assert_eq!(s.reply, GateReply::Forgotten { changed: true });
        assert_eq!(events(&s), ["forgotten_by_operator"]);
        let who = serde_json::json!({"scope": "admin", "fingerprint": "0a1b2c3d"});
        assert_eq!(
            s.history[0].to_value()["by"],
            who,
            "the row names who forgot it"
        );
        assert_eq!(s.logs[0].to_value()["by"], who, "and so does the line");
        let again = step(
            s.record,
            GateCommand::Forget {
                reason: "again".into(),
                by: None,
            },
            6,
        );
        assert_eq!(again.reply, GateReply::Forgotten { changed: false });
        assert_eq!(again.save, Save::Unchanged);
    }

    #[test]
    fn inspect_asks_for_the_history_and_changes_nothing() {
        let s = step(Some(registered()), GateCommand::Inspect, 5);
        assert!(matches!(s.reply, GateReply::Found { .. }));
        assert!(s.attach_history);
        assert_eq!(s.save, Save::Unchanged);
        assert_eq!(
            step(None, GateCommand::Inspect, 5).reply,
            GateReply::NotFound
        );
    }

    fn actor() -> Actor {
        Actor {
            scope: "admin".into(),
            fingerprint: "0a1b2c3d".into(),
        }
    }

    fn settle(status: &str) -> GateCommand {
        GateCommand::Settle {
            status: status.into(),
            reason: "checked in AI Studio".into(),
            by: None,
        }
    }

    #[test]
    fn an_operator_settles_an_open_operation_once_and_its_effect_is_owed() {
        let s = step(Some(registered()), settle("succeeded"), 30);
        assert_eq!(
            s.reply,
            GateReply::Applied {
                status: Status::Succeeded,
                effect: EffectReport::Scheduled
            }
        );
        assert_eq!(s.save, Save::Durable);
        assert_eq!(events(&s), ["settled_by_operator"]);
        assert_eq!(s.history[0].to_value()["settled_by"], "operator");
        assert_eq!(s.history[0].to_value()["reason"], "checked in AI Studio");
        let by_admin = step(Some(registered()), settle("failed").by(actor()), 30);
        assert_eq!(
            by_admin.history[0].to_value()["by"]["fingerprint"],
            "0a1b2c3d"
        );
        let op = s.record.unwrap();
        assert_eq!(op.settled_by(), Some(Source::Operator));
        assert!(op.effect_owed());
        assert_eq!(
            crate::operation::effect::effect_body(&op)["provider"]["operator_reason"],
            "checked in AI Studio"
        );
        // Terminal absorbs: a second settle, or one on a settled operation, is refused.
        let again = step(Some(op), settle("failed"), 31);
        assert!(
            matches!(&again.reply, GateReply::Refused { reason } if reason.contains("already has an outcome"))
        );
        assert_eq!(again.save, Save::Unchanged);
        assert!(matches!(
            step(None, settle("failed"), 1).reply,
            GateReply::NotFound
        ));
    }

    #[test]
    fn settle_ends_a_waiting_confirmation() {
        let s = step(Some(nudged()), settle("failed"), 30);
        let op = s.record.unwrap();
        assert_eq!(op.status(), &Status::Failed);
        assert!(op.confirmation().is_none());
    }

    #[test]
    fn an_unusable_status_answer_alerts_once_with_its_reason() {
        let unusable = GateCommand::StatusUnusable {
            reason: "answer is larger than 268435456 bytes".into(),
            age_seconds: 600,
        };
        let s = step(Some(registered()), unusable.clone(), 30);
        assert_eq!(s.reply, GateReply::AlertSent { sent: true });
        assert_eq!(whats(&s), ["status_unusable"]);
        let op = s.record.unwrap();
        assert_eq!(op.pending_alerts()[0].kind, AlertKind::StatusUnusable);
        let body = op.alert_body(AlertKind::StatusUnusable, "alert_x", 600);
        assert!(body["text"].as_str().unwrap().contains("larger than"));
        assert!(body["text"].as_str().unwrap().contains("/settle"));
        let again = step(Some(op), unusable, 40);
        assert_eq!(again.reply, GateReply::AlertSent { sent: false });
        assert_eq!(again.save, Save::Unchanged);
    }
}
