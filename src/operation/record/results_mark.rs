//! Whether each result of an operation's batch gets its own side effect (`"results": "each"`),
//! and the results' counts once every result is settled.
//!
//! Guarantees: while a `"results": "each"` batch's results are owed ([`Operation::results_owed`]),
//! the job's own side effect is not claimed, so it is sent after every result, with the counts
//! ([`Operation::results_counts`]). The results' next step has its own due time
//! ([`Operation::results_due_ms`]): their waits never move the job effect's `next_attempt_ms`, nor
//! its backoff theirs, and a forgotten or retired operation runs none of them. When the results
//! make the job's effect due is kept, and the gate dates the job's `effect_failing` from it
//! ([`Operation::effect_due_after_results_ms`]). These fields are not stored while default, so a
//! record stored before them stores back byte for byte. The results' own progress lives in the
//! gate's tables (`src/edge/objects/gate/results.rs`), so this record is not rewritten per chunk.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::operation::alert::AlertKind;
use crate::operation::Operation;

/// What a registration asked for the batch's results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResultsMode {
    /// One side effect, the job's (the default).
    #[default]
    None,
    /// One side effect per result, then the job's with the counts.
    Each,
}

impl ResultsMode {
    /// The default, not stored.
    pub fn is_none(&self) -> bool {
        *self == ResultsMode::None
    }

    /// The spelling in registrations and the record's view.
    pub fn as_str(self) -> &'static str {
        match self {
            ResultsMode::None => "none",
            ResultsMode::Each => "each",
        }
    }

    /// Reads a registration's `results` (spelled as stored).
    pub fn parse(text: &str) -> Option<ResultsMode> {
        serde_json::from_value(text.into()).ok()
    }
}

impl Operation {
    /// What the registration asked for the results.
    pub fn results_mode(&self) -> ResultsMode {
        self.results
    }

    /// A registration's `results` for a record that has none recorded: taken only while no side
    /// effect of the job went out (one `webhook-id` means one body, and results begin before the
    /// job's effect); results owed by then are due at `now_ms`. Returns whether the record changed.
    pub fn fill_results_mode(&mut self, mode: ResultsMode, now_ms: i64) -> bool {
        if mode == self.results || self.effect.attempts > 0 || self.effect.done {
            return false;
        }
        self.results = mode;
        self.results_due_ms = self.results_owed().then_some(now_ms);
        self.changed();
        true
    }

    /// Every result is delivered or parked: the counts are kept, and the job's effect, built
    /// with them, is due now while owed. After it went out (an operator's retry settled again),
    /// changed counts are a new body, so a new generation under a new `webhook-id` (invariant
    /// 3), whatever the previous one's state; unchanged counts send nothing. `failing_parked`
    /// (results parked, refused or failing, since the last operator's retry): none resolves an
    /// open `results_failing`. Whenever this makes the job's effect due, the time is kept
    /// ([`Operation::effect_due_after_results_ms`]). Returns the new generation, when one began.
    pub fn results_settled(
        &mut self,
        counts: Value,
        failing_parked: u64,
        now_ms: i64,
    ) -> Option<u32> {
        let mut generation = None;
        if self.results_owed() {
            self.effect.next_attempt_ms = now_ms;
            self.effect_due_after_results_ms = Some(now_ms);
        } else if self.effect.attempts > 0 && self.results_counts.as_ref() != Some(&counts) {
            self.next_generation(now_ms);
            self.effect_due_after_results_ms = Some(now_ms);
            generation = Some(self.effect.generation);
        }
        // Every result was read (none left parked with the file): a `results_file_parked`
        // raised before (an operator's retry read the file after all) has ended.
        if counts["file_parked"].is_null() {
            self.resolve_alert(AlertKind::ResultsFileParked, now_ms);
        }
        if failing_parked == 0 {
            self.resolve_alert(AlertKind::ResultsFailing, now_ms);
        }
        self.results_counts = Some(counts);
        self.results_due_ms = None;
        self.changed();
        generation
    }

    /// When the batch's results last made the job's effect due (settled first, or settled
    /// again with other counts after it went out): `None` for a job without results. The job's
    /// effect could not fail before then, so its `effect_failing` waits the threshold from it.
    pub fn effect_due_after_results_ms(&self) -> Option<i64> {
        self.effect_due_after_results_ms
    }

    /// `n` results were parked, refused or failing past the alert threshold (`age_seconds`):
    /// the batch's one `results_failing` alert of the spell names how many.
    /// Returns whether it was raised now.
    pub fn results_gave_up(&mut self, n: u64, age_seconds: i64, now_ms: i64) -> bool {
        if self.results_gave_up != n {
            self.results_gave_up = n;
            self.changed();
        }
        self.raise_alert(AlertKind::ResultsFailing, age_seconds, now_ms)
    }

    /// The batch's result senders answered nothing for `age_seconds` while `waiting` results
    /// wait: its `results_sender_failing` alert names how many. Returns whether it was raised.
    pub fn results_senders_failing(&mut self, waiting: u64, age_seconds: i64, now_ms: i64) -> bool {
        self.results_unanswered = waiting;
        self.changed();
        self.raise_alert(AlertKind::ResultsSenderFailing, age_seconds, now_ms)
    }

    /// A result sender answered again, or nothing waits for one: `results_sender_failing`
    /// resolves, and a later spell alerts again.
    pub fn results_senders_back(&mut self, now_ms: i64) {
        self.rearm_alert(AlertKind::ResultsSenderFailing);
        self.resolve_alert(AlertKind::ResultsSenderFailing, now_ms);
        self.changed();
    }

    /// An operator put parked results back: the results run again now, and a new spell of
    /// failures alerts `results_failing` again (the one open stays open until the results
    /// settle with none parked, refused or failing, in a spell). False, and nothing changes,
    /// once the operation is forgotten or retired.
    pub fn results_retried(&mut self, now_ms: i64) -> bool {
        if self.results_stopped() {
            return false;
        }
        self.rearm_alert(AlertKind::ResultsFailing);
        self.results_due_ms = Some(now_ms);
        self.changed();
        true
    }

    /// A results step used the desk's release (or its grant ended a wait): the mark is spent.
    /// Returns whether the record changed; the version does not move (the ledger shows no mark).
    pub fn results_desk_spent(&mut self) -> bool {
        self.effect.desk.take().is_some()
    }

    /// The results' next step is due at `at_ms` (the alarm wakes then). Returns whether the
    /// record changed; the version does not move (nothing the ledger shows changed).
    pub fn results_due_at(&mut self, at_ms: i64) -> bool {
        if self.results_due_ms().is_none_or(|due| due == at_ms) {
            return false;
        }
        self.results_due_ms = Some(at_ms);
        true
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::operation::lifecycle::{Source, Status};
    use crate::operation::OpEvent;
    use crate::operation::{OperatorRefusal, Queued};

    fn succeeded(mode: ResultsMode) -> Operation {
        let mut op = Operation::register("batches/r", "batches/r", None, 0);
        op.fill_results_mode(mode, 0);
        op.apply(
            &OpEvent {
                status: Status::Succeeded,
                update_time_ms: 1,
                source: Source::Webhook,
                details: Default::default(),
                delivery_id: None,
            },
            10,
        );
        op
    }

    #[test]
    fn results_hold_the_job_effect_until_settled() {
        let mut op = succeeded(ResultsMode::Each);
        assert!(op.results_owed());
        assert!(
            op.claim(10, 1_000).is_none(),
            "the job waits for its results"
        );
        op.results_settled(json!({"total": 2}), 0, 20);
        assert!(!op.results_owed() && op.results_due_ms().is_none());
        assert!(op.claim(20, 1_000).is_some());
        op.results_retried(30);
        assert!(op.results_due_ms().is_some());
        assert_eq!(
            op.wake_at_ms(1_000_000, 0),
            Some(30),
            "the retry wakes the gate"
        );
    }

    /// An operator's retry of parked results accepted just before retention ends holds it
    /// until the results settle again: retention never drops an accepted retry.
    #[test]
    fn retry_now_is_refused_while_the_job_effect_waits_for_its_results() {
        let mut op = succeeded(ResultsMode::Each);
        let before = op.clone();
        assert_eq!(op.retry_now(50), Err(OperatorRefusal::ResultsOwed));
        assert_eq!(op, before, "a refused retry changes nothing");
        op.results_settled(json!({"total": 2}), 0, 60);
        assert_eq!(
            op.retry_now(70),
            Ok(()),
            "once settled, the job's effect is retried"
        );
    }

    #[test]
    fn a_running_results_retry_holds_retention_until_the_results_settle() {
        use crate::retry::Next;
        let mut op = succeeded(ResultsMode::Each);
        op.results_settled(json!({"total": 2, "parked": 1}), 0, 20);
        let claim = op.claim(20, 1_000).unwrap();
        op.finish(&claim, &Next::Delivered, 30);
        op.projection_written(op.version(), 0);
        assert_eq!(op.expires_at_ms(1_000), Some(1_030));
        op.results_retried(1_029);
        assert_eq!(op.expires_at_ms(1_000), None, "held while the retry runs");
        op.results_settled(json!({"total": 2, "parked": 1}), 0, 5_000);
        assert_eq!(
            op.expires_at_ms(1_000),
            Some(1_030),
            "the same counts: over at once"
        );
    }

    #[test]
    fn results_wait_on_their_destination_and_a_release_makes_them_due() {
        use crate::operation::DeskMark;
        use crate::retry::Next;
        let hour = 3_600_000;
        // When the gate wakes for the results (the ledger's projection aside).
        let wakes = |op: &mut Operation| {
            op.projection_written(op.version(), 0);
            op.wake_at_ms(i64::MAX / 4, 0)
        };
        // Owed before the job's effect: the effect's mark and due time are the results'.
        let mut op = succeeded(ResultsMode::Each);
        assert!(op.wait_on_desk(Queued::Results, 100, hour, false));
        assert_eq!(
            op.effect().desk(),
            Some(DeskMark::Waiting {
                since_ms: 100,
                paused: false
            })
        );
        assert_eq!(wakes(&mut op), Some(100 + hour));
        assert!(op.destination_ready(true, 200));
        assert_eq!(wakes(&mut op), Some(200));
        // A `Wait` that crossed the release on its way back does not undo it.
        assert!(!op.wait_on_desk(Queued::Results, 210, hour, false));
        assert_eq!(op.effect().desk(), Some(DeskMark::Released { probe: true }));
        assert_eq!(wakes(&mut op), Some(200));
        assert!(op.results_desk_spent());
        assert_eq!(op.effect().desk(), None);
        assert!(!op.results_desk_spent(), "spent once");
        // After the job's effect, an operator's retry of parked results waits the same way.
        op.results_settled(json!({"total": 2}), 0, 300);
        let claim = op.claim(300, 1_000).unwrap();
        op.finish(&claim, &Next::Delivered, 310);
        assert!(!op.destination_ready(false, 320), "nothing is owed");
        op.results_retried(400);
        assert!(op.wait_on_desk(Queued::Results, 400, hour, false));
        assert_eq!(wakes(&mut op), Some(400 + hour));
        assert!(op.destination_ready(false, 500));
        assert_eq!(wakes(&mut op), Some(500));
    }

    #[test]
    fn retried_results_waiting_on_the_desk_leave_the_failing_jobs_retry_alone() {
        use crate::retry::Next;
        let hour = 3_600_000;
        let mut op = succeeded(ResultsMode::Each);
        op.results_settled(json!({"total": 2, "parked": 1}), 0, 20);
        let claim = op.claim(20, 1_000).unwrap();
        op.finish(&claim, &Next::retry("503".into(), 30 + 5_000), 30);
        let job_retry = op.effect().next_attempt_ms();
        op.results_retried(100);
        assert_eq!(op.results_due_ms(), Some(100));
        assert!(op.wait_on_desk(Queued::Results, 100, hour, false));
        assert_eq!(
            op.results_due_ms(),
            Some(100 + hour),
            "not due again at once"
        );
        assert_eq!(
            op.effect().next_attempt_ms(),
            job_retry,
            "the job's retry stands"
        );
        // A release makes both due: whichever runs first spends it.
        assert!(op.destination_ready(false, 200));
        assert_eq!(op.results_due_ms(), Some(200));
        assert_eq!(op.effect().next_attempt_ms(), 200);
    }

    /// The results' due time and the job effect's are two fields: a wait of the results
    /// never moves the job's, and the job's never wakes the gate nor shows as the next
    /// attempt while it waits for them.
    #[test]
    fn the_results_due_time_is_their_own() {
        let hour = 3_600_000;
        let mut op = succeeded(ResultsMode::Each);
        assert_eq!(op.results_due_ms(), Some(10), "owed from the outcome");
        assert!(op.wait_on_desk(Queued::Results, 100, hour, false));
        assert!(op.results_due_at(200 + hour));
        assert_eq!(op.results_due_ms(), Some(200 + hour));
        assert_eq!(op.effect().next_attempt_ms(), 10, "the job's own time");
        assert_eq!(op.job_due_ms(), None);
        op.projection_written(op.version(), 0);
        assert_eq!(op.wake_at_ms(i64::MAX / 4, 0), Some(200 + hour));
        let view = op.view();
        assert_eq!(view["next_attempt_at"], Value::Null);
        assert_eq!(
            view["results_due_at"],
            crate::timestamp::format_rfc3339(200 + hour)
        );
        // A registration that asks for the results after the outcome: due at once.
        let mut late = succeeded(ResultsMode::None);
        assert_eq!(late.results_due_ms(), None);
        assert!(late.fill_results_mode(ResultsMode::Each, 50));
        assert_eq!(late.results_due_ms(), Some(50));
        // Forgotten: nothing of the results runs or wakes the gate.
        assert!(op.forget(300, "by hand"));
        assert_eq!(op.results_due_ms(), None);
    }

    /// Invariant 3: one body per `webhook-id`. The job's effect is built once, when every
    /// result is delivered or parked; an operator's retry that changes the counts sends a new
    /// generation, and one that changes nothing sends nothing.
    #[test]
    fn counts_changed_after_the_jobs_effect_went_out_go_as_a_new_generation() {
        use crate::operation::effect::{build_request, effect_body};
        use crate::operation::Finished;
        use crate::retry::Next;
        use crate::signature::Secret;
        let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let id = |op: &Operation| {
            let request = build_request(op, &secret, 0);
            let id = request.headers.iter().find(|(k, _)| *k == "webhook-id");
            (id.unwrap().1.clone(), request.body)
        };
        let mut op = succeeded(ResultsMode::Each);
        assert_eq!(
            op.results_settled(json!({"total": 2, "parked": 1}), 0, 20),
            None
        );
        let first = id(&op);
        let claim = op.claim(20, 1_000).unwrap();
        op.finish(&claim, &Next::Delivered, 30);
        // A retry that parks the result again: the same counts, nothing new to send.
        op.results_retried(40);
        assert_eq!(
            op.results_settled(json!({"total": 2, "parked": 1}), 0, 50),
            None
        );
        assert!(op.effect().done() && op.effect().generation() == 1);
        // A retry that delivers it: a new generation, due now, under a new id.
        op.results_retried(60);
        assert_eq!(
            op.results_settled(json!({"total": 2, "parked": 0}), 0, 70),
            Some(2)
        );
        assert!(op.effect_owed() && op.effect().next_attempt_ms() == 70);
        let second = id(&op);
        assert_ne!(second.0, first.0, "a new body, a new webhook-id");
        assert_eq!(effect_body(&op)["results"]["parked"], 0);
        // While the job's effect is failing, the failing generation keeps its body and id;
        // changed counts go as the next generation, and its in-flight attempt is fenced off.
        let claim = op.claim(70, 1_000).unwrap();
        op.finish(&claim, &Next::retry("503".into(), 80 + 1_000), 80);
        assert_eq!(id(&op), second, "a retry keeps its body under its id");
        let in_flight = op.claim(1_080, 1_000).unwrap();
        op.results_retried(1_100);
        assert_eq!(op.results_settled(json!({"total": 3}), 0, 1_200), Some(3));
        let late = op.finish(&in_flight, &Next::Delivered, 1_300);
        assert_eq!(
            late,
            Finished::Fenced,
            "the old generation's 2xx is not the new one's"
        );
        assert!(op.effect_owed() && op.effect().generation() == 3);
        assert_ne!(id(&op).0, second.0);
    }

    /// The job's effect is due from when its results settle, and again from a new generation
    /// an operator's retry of its results began; results settled again with the same counts,
    /// or before the effect went out, leave it due from when it was.
    #[test]
    fn the_time_the_results_made_the_jobs_effect_due_is_kept() {
        use crate::retry::Next;
        let mut op = succeeded(ResultsMode::Each);
        assert_eq!(op.effect_due_after_results_ms(), None, "owed, not settled");
        op.results_settled(json!({"total": 2, "parked": 1}), 0, 20);
        assert_eq!(op.effect_due_after_results_ms(), Some(20));
        op.results_retried(25);
        op.results_settled(json!({"total": 2, "parked": 0}), 0, 26);
        assert_eq!(op.effect_due_after_results_ms(), Some(20), "not sent yet");
        let claim = op.claim(30, 1_000).unwrap();
        op.finish(&claim, &Next::Delivered, 40);
        op.results_retried(50);
        op.results_settled(json!({"total": 2, "parked": 0}), 0, 60);
        assert_eq!(op.effect_due_after_results_ms(), Some(20), "nothing new");
        op.results_retried(70);
        assert_eq!(op.results_settled(json!({"total": 3}), 0, 80), Some(2));
        assert_eq!(op.effect_due_after_results_ms(), Some(80));
    }

    #[test]
    fn counts_settled_again_before_the_jobs_effect_went_out_change_it_in_place() {
        let mut op = succeeded(ResultsMode::Each);
        op.results_settled(json!({"parked": 1}), 0, 20);
        op.results_retried(30);
        assert_eq!(op.results_settled(json!({"parked": 0}), 0, 40), None);
        assert_eq!(
            op.effect().generation(),
            1,
            "nothing was sent under the first id"
        );
        assert_eq!(op.results_counts(), Some(&json!({"parked": 0})));
    }

    #[test]
    fn a_parked_results_file_resolves_once_its_results_are_read() {
        let kinds = |op: &Operation| -> Vec<AlertKind> {
            op.due_alerts(i64::MAX).iter().map(|a| a.kind).collect()
        };
        let mut op = succeeded(ResultsMode::Each);
        assert!(op.raise_alert(AlertKind::ResultsFileParked, 0, 20));
        op.alert_delivered(&op.queued_id(AlertKind::ResultsFileParked));
        op.results_settled(json!({"total": 0, "file_parked": "404"}), 0, 30);
        assert_eq!(kinds(&op), vec![], "still parked: nothing resolved");
        op.results_retried(40);
        op.results_settled(json!({"total": 2, "delivered": 2}), 0, 50);
        assert_eq!(kinds(&op), vec![AlertKind::ResultsFileRead]);
        let body = op.alert_body(AlertKind::ResultsFileRead, "alert_x", 0);
        assert_eq!(body["resolves"], "results_file_parked");
        op.alert_delivered(&op.queued_id(AlertKind::ResultsFileRead));
        op.results_retried(60);
        op.results_settled(json!({"total": 2, "delivered": 2}), 0, 70);
        assert_eq!(kinds(&op), vec![], "resolved once");
    }

    #[test]
    fn without_results_nothing_changes() {
        let mut op = succeeded(ResultsMode::None);
        assert!(!op.results_owed());
        assert!(op.claim(10, 1_000).is_some());
        let text = serde_json::to_string(&op).unwrap();
        assert!(!text.contains("results"), "the default is not stored");
    }

    #[test]
    fn the_mode_is_stored_and_read_back() {
        let op = succeeded(ResultsMode::Each);
        let back: Operation = serde_json::from_str(&serde_json::to_string(&op).unwrap()).unwrap();
        assert_eq!(back.results_mode(), ResultsMode::Each);
        assert_eq!(op.view()["results"], "each");
    }

    /// The desk's wait, as the effect and the results take it.
    fn wait(op: &mut Operation, queued: Queued, now: i64, fallback: i64, paused: bool) -> bool {
        op.wait_on_desk(queued, now, fallback, paused)
    }

    /// The effect's wait on its desk and the results' are one ([`Operation::wait_on_desk`]):
    /// the same mark (first since, a pause's flag), each its own due time moved to the
    /// fallback, the version moved once and once more for a pause's wait, as each did before
    /// they were one; a live claim, results not running or a release marked leave the record
    /// as it was.
    #[test]
    fn the_effects_wait_on_its_desk_and_the_results_are_one() {
        use crate::operation::DeskMark;
        let hour = 3_600_000;
        let mark = |since_ms, paused| Some(DeskMark::Waiting { since_ms, paused });
        for queued in [Queued::Effect, Queued::Results] {
            let (mut op, due): (Operation, fn(&Operation) -> Option<i64>) = match queued {
                Queued::Effect => (succeeded(ResultsMode::None), |op| {
                    Some(op.effect().next_attempt_ms())
                }),
                Queued::Results => (succeeded(ResultsMode::Each), |op| op.results_due_ms()),
            };
            if queued == Queued::Effect {
                op.claim(20, 50).unwrap();
                let live = op.clone();
                assert!(!wait(&mut op, queued, 60, hour, true), "a live claim");
                assert_eq!(op, live);
            }
            let (v, others) = (
                op.version(),
                (op.results_due_ms(), op.effect().next_attempt_ms()),
            );
            assert!(wait(&mut op, queued, 100, hour, true));
            assert_eq!(
                (op.effect().desk(), due(&op)),
                (mark(100, true), Some(100 + hour))
            );
            assert_eq!((op.version(), op.effect().claim()), (v + 2, None));
            assert!(wait(&mut op, queued, 200, hour, false));
            assert_eq!(
                (op.effect().desk(), due(&op)),
                (mark(100, false), Some(200 + hour))
            );
            assert_eq!(op.version(), v + 3);
            let others_now = (op.results_due_ms(), op.effect().next_attempt_ms());
            match queued {
                Queued::Effect => assert_eq!(others_now.0, others.0, "the results' stands"),
                Queued::Results => assert_eq!(others_now.1, others.1, "the job's stands"),
            }
            assert!(op.destination_ready(false, 300));
            let released = op.clone();
            assert!(!wait(&mut op, queued, 310, hour, true), "a release stands");
            assert_eq!(op, released);
            if queued == Queued::Results {
                let mut stopped = succeeded(ResultsMode::None);
                assert!(!wait(&mut stopped, queued, 100, hour, false), "not running");
                assert_eq!(stopped, succeeded(ResultsMode::None));
            }
        }
    }
}
