//! Host tests of a condition alerted in two spells while the alert sink is down: the alarm's
//! runs send every trigger and every resolution once, in the order they were raised, each
//! spell under its own ids, and one `dedup_key` per condition (PagerDuty opens an incident
//! on each trigger and closes it on the resolution that follows).

use crate::alert_format::{dedup_key, Action};
use crate::operation::alert::AlertKind;
use crate::operation::gate::alarm::{alert_sent, plan, AlarmWork};
use crate::operation::gate::fixtures::*;
use crate::operation::gate::step;
use crate::operation::lifecycle::Status;
use crate::operation::{AttemptOutcome, Operation};

/// What the sink accepted: each alert's kind, id, whether it resolves, and its `dedup_key`.
#[derive(Default)]
struct Sink {
    heard: Vec<(AlertKind, String, Action, String)>,
    refused: usize,
}

impl Sink {
    /// One alarm run at `now`, the sink up or down: the record as the run leaves it.
    fn run(&mut self, mut op: Operation, now: i64, up: bool) -> Operation {
        let mut run = plan(&op, now, &LIMITS);
        while let Some(work) = run.next(&op, now, &LIMITS, false) {
            op = match work {
                AlarmWork::SendAlert { alert, body } => {
                    match up {
                        true => self.heard.push((
                            alert.kind,
                            alert.id.clone(),
                            Action::of(&body),
                            dedup_key(&body),
                        )),
                        false => self.refused += 1,
                    }
                    alert_sent(op, &alert, up, now, &LIMITS, 0.5)
                        .record
                        .unwrap()
                }
                AlarmWork::Upkeep { record, .. } => *record,
                AlarmWork::SetAlarm => op,
                _ => panic!("no confirmation nor effect is due in these runs"),
            };
        }
        op
    }

    /// Runs every 250 ms from `from` to `to`, the sink down before `up_at`.
    fn runs(&mut self, mut op: Operation, (from, to): (i64, i64), up_at: i64) -> Operation {
        for now in (from..to).step_by(250) {
            op = self.run(op, now, now >= up_at);
        }
        op
    }

    fn kinds(&self) -> Vec<AlertKind> {
        self.heard.iter().map(|h| h.0).collect()
    }

    /// Every alert accepted has an id of its own (none accepted twice, no spell reusing one).
    fn ids_distinct(&self) -> bool {
        let mut ids: Vec<&String> = self.heard.iter().map(|h| &h.1).collect();
        ids.sort();
        ids.dedup();
        ids.len() == self.heard.len()
    }
}

/// The job's effect answered at `at` with `outcome` (claimed then).
fn attempt(op: Operation, at: i64, outcome: AttemptOutcome) -> Operation {
    answered(op, at, at, outcome).record.unwrap()
}

#[test]
fn two_spells_of_silent_senders_while_the_sink_is_down_alert_four_times_in_order() {
    let mut sink = Sink::default();
    let mut op = settled();
    assert!(op.results_senders_failing(40, 60, 1_000));
    op = sink.runs(op, (1_000, 1_500), 20_000);
    // The first spell ends while its trigger waits its backoff, and a second begins.
    op.results_senders_back(1_500);
    op = sink.runs(op, (1_500, 2_000), 20_000);
    assert!(op.results_senders_failing(30, 60, 2_000), "a second spell");
    op = sink.runs(op, (2_000, 2_500), 20_000);
    op.results_senders_back(2_500);
    op = sink.runs(op, (2_500, 40_000), 20_000);
    assert!(sink.refused >= 2, "the sink was down: {}", sink.refused);
    let (failing, back) = (
        AlertKind::ResultsSenderFailing,
        AlertKind::ResultsSenderRecovered,
    );
    assert_eq!(sink.kinds(), [failing, back, failing, back]);
    assert!(
        sink.ids_distinct(),
        "each spell's alerts have their own ids"
    );
    let actions: Vec<Action> = sink.heard.iter().map(|h| h.2).collect();
    use Action::{Resolve, Trigger};
    assert_eq!(actions, [Trigger, Resolve, Trigger, Resolve]);
    assert!(
        sink.heard.iter().all(|h| h.3 == sink.heard[0].3),
        "one dedup_key: each resolution closes the trigger before it"
    );
    assert!(op.pending_alerts().is_empty());
}

#[test]
fn an_operators_retry_that_fails_again_alerts_again_under_a_new_id_and_resolves_once() {
    let mut sink = Sink::default();
    let s = step(Some(registered()), deliver(Status::Succeeded), 10);
    let mut op = attempt(s.record.unwrap(), 100, AttemptOutcome::Park("400".into()));
    op = sink.runs(op, (100, 1_000), 20_000);
    // Retried by hand, refused again (a second spell, same generation), retried, delivered.
    op.retry_now(1_000).unwrap();
    op = attempt(op, 1_000, AttemptOutcome::Park("400 again".into()));
    op = sink.runs(op, (1_000, 2_000), 20_000);
    op.retry_now(2_000).unwrap();
    op = attempt(op, 2_000, AttemptOutcome::Delivered);
    op = sink.runs(op, (2_000, 40_000), 20_000);
    assert!(sink.refused >= 2, "the sink was down: {}", sink.refused);
    let (failing, recovered) = (AlertKind::EffectFailing, AlertKind::EffectRecovered);
    assert_eq!(sink.kinds(), [failing, failing, recovered]);
    assert!(
        sink.ids_distinct(),
        "the second spell is not dropped as a repeat"
    );
    assert!(op.pending_alerts().is_empty());
}

/// A trigger whose send fails in a run holds the alerts of its condition queued after it,
/// in that run too: its resolution never reaches the sink first.
#[test]
fn a_failed_trigger_holds_its_resolution_in_the_same_run() {
    let mut op = settled();
    assert!(op.results_senders_failing(40, 60, 1_000));
    op.results_senders_back(1_000);
    assert_eq!(op.due_alerts(1_000).len(), 2, "both due");
    let mut sink = Sink::default();
    op = sink.run(op, 1_000, false);
    assert_eq!(
        sink.refused, 1,
        "the trigger failed; its resolution was not sent"
    );
    assert!(op.due_alerts(1_000).is_empty());
    let due_at = op.pending_alerts()[0].due_ms;
    assert!(op.pending_alerts().iter().all(|a| a.due_ms == due_at));
}

/// Each alert is sent under one id however often it is retried, and a spell's resolution
/// under an id of its own.
#[test]
fn a_spells_alerts_keep_their_ids_across_retries() {
    let mut op = settled();
    assert!(op.results_senders_failing(40, 60, 1_000));
    let trigger = op.pending_alerts()[0].id.clone();
    op.alert_failed(&trigger, 1_000, 500);
    op.results_senders_back(1_200);
    let queued: Vec<String> = op.pending_alerts().iter().map(|a| a.id.clone()).collect();
    assert_eq!(queued[0], trigger);
    assert_ne!(queued[1], trigger);
    assert!(op.results_senders_failing(40, 60, 1_300));
    let third = op.pending_alerts()[2].id.clone();
    assert!(!queued.contains(&third), "the next spell's trigger");
    op.alert_delivered(&trigger);
    let left: Vec<String> = op.pending_alerts().iter().map(|a| a.id.clone()).collect();
    assert_eq!(
        left,
        [queued[1].clone(), third],
        "only the one accepted leaves"
    );
}

/// The spells ended are stored (nothing while there were none) and read back, so a spell
/// raised after the record was loaded again does not take an earlier spell's id.
#[test]
fn the_spells_ended_are_stored_and_read_back() {
    let mut op = settled();
    let none = serde_json::to_string(&op).unwrap();
    assert!(
        !none.contains("alert_spells"),
        "nothing stored while none ended"
    );
    assert!(op.results_senders_failing(40, 60, 1_000));
    let first = op.pending_alerts()[0].id.clone();
    op.results_senders_back(1_200);
    let stored = serde_json::to_string(&op).unwrap();
    assert!(stored.contains(r#""alert_spells":{"results_sender_failing":1}"#));
    let mut back: Operation = serde_json::from_str(&stored).unwrap();
    assert_eq!(back, op);
    assert!(back.results_senders_failing(40, 60, 1_300));
    assert_ne!(back.pending_alerts()[2].id, first);
}
