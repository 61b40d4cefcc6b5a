//! What the reconciliation pass asks of a gate: run an owed side effect if it is due
//! ([`GateCommand::RetryEffect`]), raise an alert ([`GateCommand::Alert`]), keep a status
//! answer that cannot be used ([`GateCommand::StatusUnusable`]), and project the record again
//! ([`GateCommand::Reindex`]); and what a destination's desk asks: run a released effect now
//! ([`GateCommand::DestinationReady`]).
//!
//! Guarantees (docs/DESIGN.md, invariants 5 and 7): nothing here runs anything outbound: an
//! alert is queued in the record for the alarm, the one runner of alerts, and raised once per
//! operation; a retry keeps the effect's backoff and only sets the alarm again (repairing a
//! lost one); a re-index changes no state.

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
    let mut step = Step::new(Some(op), GateReply::Effect { effect }).durable();
    step.reset_alarm = true;
    step
}

/// Queued in the record and sent by the alarm, the one runner of alerts: if the object dies
/// during the send, the next alarm sends it again, under one id.
pub(super) fn alert(mut op: Operation, alert: AlertKind, age_seconds: i64, now: i64) -> Step {
    if !op.raise_alert(alert, age_seconds, now) {
        return Step::new(Some(op), GateReply::AlertSent { sent: false });
    }
    Step::new(Some(op), GateReply::AlertSent { sent: true }).durable()
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
    Step::new(Some(op), GateReply::AlertSent { sent: raised })
        .durable()
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
    use crate::operation::alert::AlertKind;
    use crate::operation::gate::alarm::confirmed;
    use crate::operation::gate::fixtures::*;
    use crate::operation::gate::protocol::{EffectReport, GateCommand, GateReply};
    use crate::operation::gate::{step, Save};
    use crate::operation::lifecycle::Status;
    use crate::operation::observation::StatusError;

    #[test]
    fn an_operation_gemini_does_not_know_alerts_once_not_stuck_on_top() {
        let s = confirmed(nudged(), Err(StatusError::NotFound), 20, &LIMITS, 1.0);
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

    #[test]
    fn a_terminal_operation_is_never_alerted_stuck() {
        let settled = step(Some(registered()), deliver(Status::Succeeded), 10);
        let s = step(
            settled.record,
            GateCommand::Alert {
                alert: AlertKind::Stuck,
                age_seconds: 99_999,
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
