//! An operator's commands from the admin API: redeliver, retry now, forget, settle by hand,
//! and inspect (after a repair, if one was asked for).
//!
//! Guarantees (docs/DESIGN.md, invariant 3): an effect that is not done is retried under its own
//! `webhook-id`, never given a new one; only a done effect is sent again, as a new generation, and
//! a bulk run's cut-off keeps a run from sending anything twice; every action that changes the
//! record is stored with its reason, in the history and the log; a refusal changes nothing.

use crate::operation::gate::log::GateLog;
use crate::operation::gate::protocol::{GateReply, OperatorAction};
use crate::operation::history::HistoryEntry;
use crate::operation::lifecycle::Status;
use crate::operation::{Actor, Operation, OperatorRefusal};
use crate::telemetry::counters::Counter;

use super::Step;

/// Redeliver: retry an effect not done, or send a done one again as a new generation, unless
/// `sent_before_ms` (a bulk run's cut-off) says this run sent it already.
pub(super) fn redeliver(
    mut op: Operation,
    reason: &str,
    sent_before_ms: Option<i64>,
    by: Option<Actor>,
    now: i64,
) -> Step {
    // A bulk run's cut-off: an effect sent at or after it was sent by this run (or after it
    // began), so the run, resumed or run again, leaves it alone.
    if sent_before_ms.is_some_and(|cutoff| op.sent_since(cutoff)) {
        return refused(op, OperatorRefusal::SentSinceCutoff.as_str());
    }
    // An effect not done may have reached the destination already: it is retried under its
    // own webhook-id, never given a new one.
    if !op.effect().done() {
        return retry_now(op, reason, by, now);
    }
    match op.redeliver(now, reason) {
        Ok(_) => {
            op.count(Counter::Redeliveries, now);
            operator_acted(op, OperatorAction::Redeliver, reason, by, now)
        }
        Err(refusal) => refused(op, refusal.as_str()),
    }
}

/// Retry now: an effect that is not done is due at once, under the same generation.
pub(super) fn retry_now(mut op: Operation, reason: &str, by: Option<Actor>, now: i64) -> Step {
    match op.retry_now(now) {
        Ok(()) => operator_acted(op, OperatorAction::RetryNow, reason, by, now),
        Err(refusal) => refused(op, refusal.as_str()),
    }
}

/// Forget: stop tracking the operation (recorded once, never erased).
pub(super) fn forget(mut op: Operation, reason: String, by: Option<Actor>, now: i64) -> Step {
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

/// Settle: the operator gives the terminal outcome of an operation whose status answer
/// cannot be used; its side effect is then owed like any other.
pub(super) fn settle(
    mut op: Operation,
    status: &str,
    reason: String,
    by: Option<Actor>,
    now: i64,
) -> Step {
    match op.settle_by_operator(Status::parse(status), &reason, now) {
        Ok(event) => {
            let key = op.key().to_string();
            let (status, effect) = (op.status().clone(), op.effect_report(now));
            let row = HistoryEntry::settled_by_operator(&event, &reason, by.clone());
            let line = GateLog::SettledByOperator {
                key,
                status: status.as_str().to_string(),
                reason,
                by,
            };
            let reply = GateReply::Applied { status, effect };
            Step::stored(op, reply).row(row).log(line)
        }
        Err(refusal) => refused(op, refusal.as_str()),
    }
}

/// What an operator's retry of a batch's parked results took, once the object moved them out
/// of its results tables (`results_admin.rs`, deciding with
/// [`crate::results::progress::Progress::retry_parked`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResultsTaken {
    /// Parked results put back, each to be sent again under its first `webhook-id`.
    pub taken: u64,
    /// Whether the parked results file is read again.
    pub file_reread: bool,
    /// Parked results left (beyond the page taken).
    pub parked_left: u64,
    /// Results waiting for a retry, sent now rather than at the end of their backoff.
    pub hurried: u64,
}

/// An operator's retry of a batch's parked results, once the object took `taken` of them out
/// of its results tables: the record's part, decided here like every operator action. When it
/// took any (or the file), the results run again now (the alarm is set for it before the
/// answer), with a history row and a log line; when it took none, or the operation is
/// forgotten or retired, nothing changes.
pub fn results_retried<P>(
    mut op: Operation,
    taken: ResultsTaken,
    reason: String,
    by: Option<Actor>,
    now: i64,
) -> Step<GateReply, P> {
    let key = op.key().to_string();
    let answer = serde_json::json!({"key": key, "retried": taken.taken,
        "file_reread": taken.file_reread, "parked": taken.parked_left, "hurried": taken.hurried});
    let reply = GateReply::ResultsAnswer { answer };
    let nothing = taken.taken == 0 && !taken.file_reread && taken.hurried == 0;
    if nothing || !op.results_retried(now) {
        return Step::new(Some(op), reply);
    }
    Step::stored(op, reply)
        .row(HistoryEntry::ResultsRetried {
            taken: taken.taken,
            file_reread: taken.file_reread,
            reason: reason.clone(),
            by: by.clone(),
        })
        .log(GateLog::ResultsRetried {
            key,
            taken: taken.taken,
            reason,
            by,
        })
}

/// Inspect (and the answer to a repair, done by the object before this step): the record,
/// with the stored history the object attaches.
pub(super) fn inspect(op: Operation) -> Step {
    let (operation, history) = (op.view(), Vec::new());
    let reply = GateReply::Found { operation, history };
    let mut step = Step::new(Some(op), reply);
    step.attach_history = true;
    step
}

/// An operator's action that went ahead, under the effect's generation (a redelivery's new one).
fn operator_acted(
    op: Operation,
    action: OperatorAction,
    reason: &str,
    by: Option<Actor>,
    now: i64,
) -> Step {
    let generation = op.effect().generation();
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
    let effect = op.effect_report(now);
    let reply = GateReply::Redelivered {
        generation,
        action,
        effect,
    };
    let mut step = Step::stored(op, reply)
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
    let reason = reason.to_string();
    Step::new(Some(op), GateReply::Refused { reason })
}

#[cfg(test)]
mod tests {
    use crate::operation::alert::AlertKind;
    use crate::operation::gate::alarm::{attempt_finished, begin_attempt, Attempt};
    use crate::operation::gate::fixtures::*;
    use crate::operation::gate::protocol::{EffectReport, GateCommand, GateReply, OperatorAction};
    use crate::operation::gate::{step, Save, Step};
    use crate::operation::lifecycle::{Source, Status};
    use crate::operation::{Actor, AttemptOutcome};

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
                effect_alert_after_ms: 0,
            },
            13,
        );
        assert_eq!(alert.reply, GateReply::AlertSent { sent: false });
        let op = alert.record.unwrap();
        assert!(op.pending_alerts().is_empty() && op.confirmation().is_none());
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
                asked_wait_ms: None,
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
    fn an_operators_retry_of_results_runs_them_now_with_a_history_row() {
        let taken = |taken, file_reread| super::ResultsTaken {
            taken,
            file_reread,
            parked_left: 0,
            hurried: 0,
        };
        let by = Some(actor());
        let s = super::results_retried(settled(), taken(0, true), "back".into(), by.clone(), 40);
        assert_eq!(s.save, Save::Durable);
        assert_eq!(whats(&s), ["results_retried"]);
        assert_eq!(events(&s), ["results_retried"]);
        let op = s.record.as_ref().unwrap();
        assert_eq!(op.results_due_ms(), Some(40), "the results run now");
        let GateReply::ResultsAnswer { answer } = &s.reply else {
            panic!("{:?}", s.reply)
        };
        assert_eq!(answer["file_reread"], true);
        let none = super::results_retried::<()>(settled(), taken(0, false), "x".into(), None, 40);
        assert_eq!(none.save, Save::Unchanged);
        assert!(none.history.is_empty() && none.logs.is_empty());
        // Only waiting results sent now: the results run now too.
        let hurried = super::ResultsTaken {
            hurried: 2,
            ..taken(0, false)
        };
        let s = super::results_retried::<()>(settled(), hurried, "back".into(), None, 50);
        assert_eq!(s.save, Save::Durable);
        assert_eq!(s.record.as_ref().unwrap().results_due_ms(), Some(50));
        let GateReply::ResultsAnswer { answer } = &s.reply else {
            panic!("{:?}", s.reply)
        };
        assert_eq!(answer["hurried"], 2);
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
            asked_wait_ms: None,
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
}
