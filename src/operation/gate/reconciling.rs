//! What the reconciliation pass asks of a gate: run an owed side effect if it is due
//! ([`GateCommand::RetryEffect`]), raise an alert ([`GateCommand::Alert`]), keep a status
//! answer that cannot be used ([`GateCommand::StatusUnusable`]), and project the record again
//! ([`GateCommand::Reindex`]); and what a destination's desk asks: run a released effect now
//! ([`GateCommand::DestinationReady`]).
//!
//! Guarantees (docs/DESIGN.md, invariants 5 and 7): nothing here runs anything outbound: an
//! alert is queued in the record for the alarm, the one runner of alerts, and raised once per
//! operation (a job's `effect_failing` no sooner than the threshold after its effect was due);
//! a retry keeps the effect's backoff and only sets the alarm again (repairing a lost one); a
//! re-index changes no state.

use crate::operation::alert::AlertKind;
use crate::operation::gate::log::GateLog;
use crate::operation::gate::protocol::{EffectReport, GateReply};
use crate::operation::history::HistoryEntry;
use crate::operation::Operation;

use super::Step;

#[cfg(doc)]
use crate::operation::gate::protocol::GateCommand;

/// The alarm runs the effect if due: the backoff stands; setting the alarm again repairs a
/// lost one.
pub(super) fn retry_effect(op: Operation, now: i64) -> Step {
    let effect = op.effect_report(now);
    let mut step = Step::new(Some(op), GateReply::Effect { effect });
    step.reset_alarm = true;
    step
}

/// The destination's desk released the effect: due now (the alarm runs it, reporting back);
/// an effect no longer owed changes nothing, and its answer says so.
pub(super) fn destination_ready(mut op: Operation, probe: bool, now: i64) -> Step {
    if !op.destination_ready(probe, now) {
        let effect = op.effect_report(now);
        return Step::new(Some(op), GateReply::Effect { effect });
    }
    // Results an operator retried after the job's effect are owed, though the effect is not.
    let effect = match op.effect_owed() {
        true => op.effect_report(now),
        false => EffectReport::Scheduled,
    };
    let mut step = Step::stored(op, GateReply::Effect { effect });
    step.reset_alarm = true;
    step
}

/// Queued in the record and sent by the alarm, the one runner of alerts: if the object dies
/// during the send, the next alarm sends it again, under one id.
///
/// The pass dates `effect_failing` from the outcome, but a job whose batch's results made its
/// effect due later could not fail before then: refused (nothing stored; the pass asks again
/// while the ledger shows it unsent) until `after` ms from then, and its age counted from
/// then. A parked effect needs a person at once.
pub(super) fn alert(mut op: Operation, alert: AlertKind, age: i64, after: i64, now: i64) -> Step {
    let failing = alert == AlertKind::EffectFailing && op.effect().parked().is_none();
    let due = op.effect_due_after_results_ms().filter(|_| failing);
    let age = due.map_or(age, |due| (now - due) / 1_000);
    if due.is_some_and(|due| now - due < after) || !op.raise_alert(alert, age, now) {
        return Step::new(Some(op), GateReply::AlertSent { sent: false });
    }
    Step::stored(op, GateReply::AlertSent { sent: true })
}

/// The status API's answer could not be used: kept in the record, alerted once.
pub(super) fn status_unusable(
    mut op: Operation,
    reason: String,
    age_seconds: i64,
    now: i64,
) -> Step {
    let raised_before = op.alerts_raised().len();
    if !op.status_unusable(&reason, age_seconds, now) {
        return Step::new(Some(op), GateReply::AlertSent { sent: false });
    }
    let raised = op.alerts_raised().len() > raised_before;
    Step::stored(op, GateReply::AlertSent { sent: raised })
        .row(HistoryEntry::StatusUnusable { reason })
}

/// The reconciliation audit (or a pass told the effect is done) found the `open:` index out
/// of step: project again, treating the index entry as possibly there.
pub(super) fn reindex(mut op: Operation) -> Step {
    let changed = op.reindex();
    let (key, status) = (op.key().to_string(), op.status().as_str().to_string());
    let step = Step::new(Some(op), GateReply::Reindexed { changed });
    if !changed {
        return step;
    }
    step.durable().log(GateLog::Reindexed { key, status })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::operation::alert::AlertKind;
    use crate::operation::gate::alarm::confirmed;
    use crate::operation::gate::fixtures::*;
    use crate::operation::gate::protocol::{EffectReport, GateCommand, GateReply};
    use crate::operation::gate::{step, Save, Step};
    use crate::operation::lifecycle::Status;
    use crate::operation::observation::StatusError;
    use crate::operation::{AttemptOutcome, Operation, ResultsMode};
    use crate::retry::Next;

    #[test]
    fn an_operation_gemini_does_not_know_alerts_once_not_stuck_on_top() {
        let s = confirmed(nudged(), Err(StatusError::NotFound), 20, &LIMITS, 1.0);
        let stuck = step(
            s.record,
            GateCommand::Alert {
                alert: AlertKind::Stuck,
                age_seconds: 99_999,
                effect_alert_after_ms: 0,
            },
            30,
        );
        assert_eq!(stuck.reply, GateReply::AlertSent { sent: false });
        assert_eq!(
            stuck.record.unwrap().alerts_raised(),
            vec![AlertKind::UnknownToGemini]
        );
    }

    #[test]
    fn a_terminal_operation_is_never_alerted_stuck() {
        let settled = step(Some(registered()), deliver(Status::Succeeded), 10);
        let s = step(
            settled.record,
            GateCommand::Alert {
                alert: AlertKind::Stuck,
                age_seconds: 99_999,
                effect_alert_after_ms: 0,
            },
            11,
        );
        assert_eq!(s.reply, GateReply::AlertSent { sent: false });
        assert_eq!(s.save, Save::Unchanged);
        assert!(s.record.unwrap().alerts_raised().is_empty());
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
            effect_alert_after_ms: 0,
        };
        let s = step(Some(registered()), raise(), 10);
        assert_eq!(s.reply, GateReply::AlertSent { sent: true });
        assert_eq!(s.wake_at(&LIMITS), Some(10));
        let again = step(s.record, raise(), 11);
        assert_eq!(again.reply, GateReply::AlertSent { sent: false });
        assert_eq!(again.save, Save::Unchanged);
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

    const HOUR: i64 = 3_600_000;

    /// The pass's `effect_failing` at `now`, dated from the outcome as the pass dates it, with
    /// the threshold the gate fills in.
    fn effect_failing(op: Operation, now: i64) -> Step {
        let age_seconds = (now - op.settled_at_ms().unwrap()) / 1_000;
        let mut command = GateCommand::Alert {
            alert: AlertKind::EffectFailing,
            age_seconds,
            effect_alert_after_ms: 0,
        };
        command.limit_alerts(LIMITS.effect_alert_after_ms);
        step(Some(op), command, now)
    }

    /// A job succeeded at 10 whose effect became due at `due` (a `"results": "each"` batch's
    /// 100,000 results settled then, when `results`), and whose first attempt answered
    /// `outcome` a second later, committed as the alarm commits it.
    fn tried_once(results: bool, due: i64, outcome: AttemptOutcome) -> Operation {
        let mut op = registered();
        if results {
            op.fill_results_mode(ResultsMode::Each, 0);
        }
        let mut op = step(Some(op), deliver(Status::Succeeded), 10)
            .record
            .unwrap();
        if results {
            op.results_settled(json!({"total": 100_000}), 0, due);
        }
        answered(op, due, due + 1_000, outcome).record.unwrap()
    }

    /// A batch whose results took two hours: its job's effect could not fail before they
    /// settled, so one failed attempt since is not `effect_failing` (the pass dates it from
    /// the outcome, two hours back): the gate refuses it, storing nothing, until the
    /// threshold has passed since the results settled, and dates it from then.
    #[test]
    fn a_batch_whose_results_settled_late_alerts_effect_failing_a_threshold_after_them() {
        let op = tried_once(true, 2 * HOUR, AttemptOutcome::Retry("503".into()));
        let next_pass = effect_failing(op, 2 * HOUR + 300_000);
        assert_eq!(next_pass.reply, GateReply::AlertSent { sent: false });
        assert_eq!(next_pass.save, Save::Unchanged);
        assert!(next_pass.history.is_empty() && next_pass.logs.is_empty());
        let op = next_pass.record.unwrap();
        assert!(op.alerts_raised().is_empty() && op.pending_alerts().is_empty());
        let early = effect_failing(op.clone(), 3 * HOUR - 1);
        assert_eq!(early.reply, GateReply::AlertSent { sent: false });
        let s = effect_failing(op, 3 * HOUR);
        assert_eq!(s.reply, GateReply::AlertSent { sent: true });
        assert_eq!(s.save, Save::Durable);
        let op = s.record.unwrap();
        assert_eq!(op.alerts_raised(), [AlertKind::EffectFailing]);
        assert_eq!(op.pending_alerts()[0].age_seconds, 3_600, "since due");
    }

    /// A refusal the destination will repeat needs a person at once, however recently the
    /// results made the effect due: the alarm raises it as it parks, and a pass that asks for
    /// a parked effect's alert is not held back either.
    #[test]
    fn a_parked_job_effect_after_its_results_alerts_at_once() {
        let op = tried_once(true, 2 * HOUR, AttemptOutcome::Park("400: bad".into()));
        assert_eq!(op.alerts_raised(), [AlertKind::EffectFailing]);
        let mut op = registered();
        op.fill_results_mode(ResultsMode::Each, 0);
        let mut op = step(Some(op), deliver(Status::Succeeded), 10)
            .record
            .unwrap();
        op.results_settled(json!({"total": 2}), 0, 2 * HOUR);
        let claim = op.claim(2 * HOUR, 1_000).unwrap();
        op.finish(&claim, &Next::Park("400: bad".into()), 2 * HOUR + 1_000);
        let s = effect_failing(op, 2 * HOUR + 300_000);
        assert_eq!(s.reply, GateReply::AlertSent { sent: true });
        assert_eq!(
            s.record.unwrap().pending_alerts()[0].age_seconds,
            7_499,
            "as asked"
        );
    }

    /// A job without results: the gate raises what the pass asks for, dated as the pass
    /// dates it (the pass asks once the threshold has passed since the outcome).
    #[test]
    fn a_job_without_results_alerts_effect_failing_as_the_pass_asks() {
        let op = tried_once(false, 10, AttemptOutcome::Retry("503".into()));
        assert_eq!(op.effect_due_after_results_ms(), None);
        let s = effect_failing(op, 10 + HOUR);
        assert_eq!(s.reply, GateReply::AlertSent { sent: true });
        assert_eq!(s.record.unwrap().pending_alerts()[0].age_seconds, 3_600);
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
