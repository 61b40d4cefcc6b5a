//! What a results step writes, decided: each function takes the record and the progress as
//! stored and returns the gate's [`Step`] (what to store, its history row, its log line) with
//! the step's [`ProgressWrite`] when it has one (a chunk [`claimed`] before its sends, its
//! answers [`committed`] after them, a [`read_failed`], an alert marked on the [`Progress`], a
//! pause, a retry, or the progress alone: [`progress`]); the gate's commit stores both in one
//! write, the progress also when the record is unchanged. A write the results' plan names (a
//! [`Marking`]) is made one of these by [`decide`]. Time and jitter are arguments: the edge
//! and the host tests that kill it at every storage point commit the same decisions.
//!
//! Guarantees: the events an operator reads later (the file parked, results parked for
//! failing, the results settled with their counts) each leave a history row; a step's
//! bookkeeping (its due time, the desk's mark, a wait on the desk, `/metrics`' counts) leaves
//! none, so the history's newest rows stay worth reading. A step that changes nothing is
//! [`crate::operation::gate::Save::Unchanged`] (no write). A step's answers and what they owe
//! the record (`/metrics`' count, a destination's `Retry-After` hold) are one step, one
//! write; a step that waits (for the file, after a failed read; for a `Retry-After`) moves the
//! results' due time in it, so the alarm is set for the wait and no run only stores it.

use serde_json::Value;

use crate::operation::alert::AlertKind;
use crate::operation::gate::alarm::{self, AlarmDone, Attempt};
use crate::operation::gate::log::GateLog;
use crate::operation::gate::protocol::GateReply;
use crate::operation::gate::{results_retried, GateLimits, ResultsTaken, Step};
use crate::operation::history::HistoryEntry;
use crate::operation::{Actor, Claim, Operation, Queued};
use crate::results::item::ResultItem;
use crate::results::lines::Checkpoint;
use crate::results::progress::{ChunkClaim, FileTrouble, Limits, Metered, Progress};
use crate::results::progress::{ProgressWrite, Row, Sending, Step as Next};
use crate::telemetry::counters::{labelled, RESULT_TO_PREFIX};

/// A results step's decision: the record, and the progress stored with it.
pub type Marked = Step<(), ProgressWrite>;

/// The record after a step that stores it when `changed`, with the progress `write`.
fn stored(op: Operation, changed: bool, write: Option<ProgressWrite>) -> Marked {
    Step::new(Some(op), ()).carrying(write).durable_if(changed)
}

/// A step that stores the progress alone (where the results are, or a commit that owes the
/// record nothing): the record is unchanged.
pub fn progress(op: Operation, write: ProgressWrite) -> Marked {
    stored(op, false, Some(write))
}

/// The chunk just read (to `to`; `last`: the end of the file) is claimed, its progress stored
/// before any of its results is sent (the record unchanged); the step answers the claim, for
/// its commit ([`committed`]) after the sends.
pub fn claimed(
    op: Operation,
    mut progress: Progress,
    to: Checkpoint,
    last: bool,
) -> (Marked, ChunkClaim) {
    let claim = progress.claim(to, last);
    (stored(op, false, Some(ProgressWrite::of(progress))), claim)
}

/// A write a results step makes ([`crate::results::plan`] names it), on the record as stored
/// when it is committed: [`decide`] makes it the gate's step.
#[derive(Debug, Clone, PartialEq)]
pub enum Marking {
    /// The progress alone ([`progress`]): where the results are.
    Progress(Progress),
    /// The chunk just read claimed before its sends ([`claimed`]).
    Claimed {
        progress: Progress,
        to: Checkpoint,
        last: bool,
    },
    /// The sends' answers ([`committed`]), and the longest `Retry-After` they asked.
    Committed {
        progress: Progress,
        answers: Answers,
        asked_wait_ms: Option<i64>,
    },
    /// A read that did not give the file ([`read_failed`]).
    ReadFailed(Progress, FileTrouble),
    /// The parked file's alert ([`file_parked`]).
    FileParked(Progress, String),
    /// The alert for `n` results parked in this spell ([`gave_up`]).
    GaveUp(Progress, u64),
    /// The senders' alert raised (how many wait) or resolved ([`senders`]).
    Senders(Progress, Option<u64>),
    /// Every result settled, with the counts and how many were parked failing ([`settled`]).
    Settled { counts: Value, failing_parked: u64 },
    /// The desk queued the batch (`paused`: a pause holds it), with the progress a pause
    /// held ([`wait_on_destination`]).
    Wait {
        paused: bool,
        held: Option<ProgressWrite>,
    },
    /// The results' next step is due then ([`due_at`]).
    DueAt(i64),
    /// The desk's release or grant is spent ([`desk_spent`]).
    DeskSpent,
    /// The job's effect claimed before its send, if it is still owed, due and free
    /// ([`alarm::begin_attempt`]), with the alarm at the claim's expiry.
    EffectClaim,
    /// The job's attempt, committed under its claim's fencing token
    /// ([`alarm::attempt_finished`]).
    EffectAnswered(Box<Attempt>),
    /// The desk queued the job's effect (`paused`: a pause holds it)
    /// ([`alarm::wait_on_destination`]).
    EffectWaits(bool),
}

/// What a commit claimed: a chunk of results, or the job's effect.
#[derive(Debug, Clone, PartialEq)]
pub enum Claimed {
    Chunk(ChunkClaim),
    Effect(Claim),
}

/// A [`Marking`] decided: the gate's step, what it claimed, and whether the alarm is set with
/// its write (the job's claim, at its expiry; its answer, as [`alarm::sets_alarm_at_once`]
/// says; its wait on the desk) or left to the run's end (a results step's writes).
#[derive(Debug)]
pub struct Decided {
    pub step: Marked,
    pub claimed: Option<Claimed>,
    pub alarm_at_once: bool,
}

/// What a step's writes are decided with: the results' tunables, the gate's (the claim's
/// lifetime, the job's backoff, the desk's fallback:
/// [`crate::operation::gate::GateLimits::desk_fallback_ms`]) and the destination's label
/// (`/metrics`' count).
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    pub limits: &'a Limits,
    pub gate: &'a GateLimits,
    pub to: &'a str,
}

/// The gate's step for `marking` on the record `op` as stored now, at `now` (each failure's
/// backoff drawn with `jitter`), what it claimed, and whether it sets the alarm at once.
pub fn decide(
    marking: Marking,
    op: Operation,
    cx: &Context,
    (now, mut jitter): (i64, impl FnMut() -> f64),
) -> Decided {
    let age = cx.limits.alert_after_ms / 1_000;
    let decided = |step, claimed, alarm_at_once| Decided {
        step,
        claimed,
        alarm_at_once,
    };
    let marked = match marking {
        Marking::Progress(p) => progress(op, ProgressWrite::of(p)),
        Marking::Claimed { progress, to, last } => {
            let (step, claim) = claimed(op, progress, to, last);
            return decided(step, Some(Claimed::Chunk(claim)), false);
        }
        Marking::EffectClaim => {
            return match alarm::begin_attempt(op.clone(), now, cx.gate) {
                Some((claim, step)) => decided(of_alarm(step), Some(Claimed::Effect(claim)), true),
                None => decided(Step::new(Some(op), ()), None, true),
            };
        }
        Marking::EffectAnswered(attempt) => {
            let step = alarm::attempt_finished(op, &attempt, cx.gate, jitter());
            let at_once = alarm::sets_alarm_at_once(&step);
            return decided(of_alarm(step), None, at_once);
        }
        Marking::EffectWaits(paused) => {
            let step = alarm::wait_on_destination(op, now, cx.gate, paused);
            return decided(of_alarm(step), None, true);
        }
        Marking::Committed {
            progress,
            answers,
            asked_wait_ms,
        } => {
            let clock = (now, jitter);
            committed(
                op,
                progress,
                answers,
                asked_wait_ms,
                cx.to,
                cx.limits,
                clock,
            )
        }
        Marking::ReadFailed(p, t) => read_failed(op, p, t, cx.limits, (now, jitter())),
        Marking::FileParked(mut p, reason) => file_parked(op, &mut p, &reason, now),
        Marking::GaveUp(mut p, n) => gave_up(op, &mut p, n, age, now),
        Marking::Senders(mut p, waiting) => senders(op, &mut p, waiting, now),
        Marking::Settled {
            counts,
            failing_parked,
        } => settled(op, counts, failing_parked, now),
        Marking::Wait { paused, held } => {
            wait_on_destination(op, (paused, held), cx.gate.desk_fallback_ms, now)
        }
        Marking::DueAt(at) => due_at(op, at),
        Marking::DeskSpent => desk_spent(op),
    };
    decided(marked, None, false)
}

/// A job's alarm step as a step's decision: the same record, rows, lines and counts handed
/// over; no progress.
fn of_alarm(step: Step<AlarmDone>) -> Marked {
    Step {
        record: step.record,
        save: step.save,
        history: step.history,
        logs: step.logs,
        reply: (),
        attach_history: step.attach_history,
        reset_alarm: step.reset_alarm,
        purge: step.purge,
        tally: step.tally,
        results: None,
    }
}

/// A step's answers, as its commit settles them.
#[derive(Debug, Clone, PartialEq)]
pub enum Answers {
    /// The results of claim number `chunk` before `reached` (where its read stopped): counted,
    /// those not delivered kept; the rest of the claim, if any, stays claimed from there.
    Chunk {
        chunk: u64,
        reached: Checkpoint,
        answers: Vec<(ResultItem, Sending)>,
    },
    /// Waiting rows' results, sent again: each row's new state, or its forgetting.
    Rows(Vec<(ResultItem, Sending)>),
}

/// A step's answers committed, after every send, in one step on the progress as stored now:
/// the progress settles them (each failure's backoff drawn with `jitter`), `/metrics`' count
/// goes on the record when it is due ([`Progress::meter`], by destination `to`: [`metered`]),
/// and a destination that asked to wait (`asked_wait_ms`, its longest `Retry-After`) holds the
/// results' next step that long, within the backoff's longest
/// ([`crate::retry::Backoff::max_ms`]): only a batch's step sends a row again, so the hold is
/// the whole batch's; a release the desk marked meanwhile is not held.
pub fn committed(
    mut op: Operation,
    mut progress: Progress,
    answers: Answers,
    asked_wait_ms: Option<i64>,
    to: &str,
    limits: &Limits,
    (now, mut jitter): (i64, impl FnMut() -> f64),
) -> Marked {
    let before = progress.counts;
    let writes = match answers {
        Answers::Chunk {
            chunk,
            reached,
            answers,
        } => progress
            .commit_through(chunk, reached, answers, now, limits, jitter())
            .unwrap_or_default(),
        Answers::Rows(answers) => answers
            .into_iter()
            .filter_map(|(item, sending)| {
                progress.finish_row(item.index, sending, now, limits, jitter())
            })
            .collect(),
    };
    // A release the desk marked during the sends is the next run's to spend: no hold delays it.
    let released = op.effect().released();
    let hold = |wait: i64| op.results_due_at(now + wait.min(limits.retry.max_ms));
    let held = !released && asked_wait_ms.is_some_and(hold);
    let (m, write) = (progress.meter(before), ProgressWrite { progress, writes });
    metered(op, m, to, now, write).durable_if(held)
}

/// A read did not give the file (a chunk's, or its first line's before the step's turn at the
/// desk): the progress marks it ([`Progress::file_failed`]: asked for again on its backoff,
/// drawn with `jitter`, or parked), and when its next step waits (for the file, or rows backing
/// off) the results are due then, in the same commit, so the alarm is set for it. Else, or
/// while the desk's release is marked (the next run spends it), the due time stays.
pub fn read_failed(
    mut op: Operation,
    mut progress: Progress,
    trouble: FileTrouble,
    limits: &Limits,
    (now, jitter): (i64, f64),
) -> Marked {
    progress.file_failed(trouble, now, limits, jitter);
    let released = op.effect().released();
    let changed = match progress.next(now) {
        Next::WaitUntil(at) if !released => op.results_due_at(at),
        _ => false,
    };
    stored(op, changed, Some(ProgressWrite::of(progress)))
}

/// `/metrics`' results by destination (`to`), as the progress metered them (`w`: the commit
/// that metered them, stored with them): counted in the record, flushed by the alarm's upkeep.
pub fn metered(op: Operation, m: Option<Metered>, to: &str, now: i64, w: ProgressWrite) -> Marked {
    let Some(m) = m else {
        return progress(op, w);
    };
    let mut op = op;
    let ended = [
        ("delivered", m.delivered),
        ("failed", m.failed),
        ("parked", m.parked),
        ("unanswered", m.unanswered),
    ];
    let label = |result| labelled(RESULT_TO_PREFIX, &format!("{result}:{to}"));
    for (result, n) in ended.into_iter().filter(|(_, n)| *n > 0) {
        op.count_by(label(result), n, now);
    }
    stored(op, true, Some(w))
}

/// The results file is parked: its one `results_file_parked` alert, through the record's
/// alerts (sent by this run's alert stage), with a history row and a log line naming why; the
/// progress marked alerted goes with it (as do the other alerts').
pub fn file_parked(mut op: Operation, progress: &mut Progress, reason: &str, now: i64) -> Marked {
    let age = (now - op.settled_at_ms().unwrap_or(now)) / 1_000;
    op.raise_alert(AlertKind::ResultsFileParked, age, now);
    progress.alerted = true;
    let key = op.key().to_string();
    let reason = reason.to_string();
    stored(op, true, Some(ProgressWrite::of(progress.clone())))
        .row(HistoryEntry::ResultsFileParked {
            reason: reason.clone(),
        })
        .log(GateLog::ResultsFileUnread { key, reason })
}

/// `n` results were parked, refused or failing past the alert threshold (`age_seconds`): the
/// batch's one `results_failing` alert of this spell, naming how many, with a history row.
pub fn gave_up(
    mut op: Operation,
    progress: &mut Progress,
    n: u64,
    age_seconds: i64,
    now: i64,
) -> Marked {
    op.results_gave_up(n, age_seconds, now);
    progress.failing_alerted = true;
    let write = Some(ProgressWrite::of(progress.clone()));
    stored(op, true, write).row(HistoryEntry::ResultsGaveUp { parked: n })
}

/// The batch's result senders answered nothing past the alert threshold while `waiting`
/// results wait (`Some`): its one `results_sender_failing` alert, with a history row and a log
/// line; or a sender answers again, or no result waits on one (`None`): resolved, with a
/// history row.
pub fn senders(mut op: Operation, p: &mut Progress, waiting: Option<u64>, now: i64) -> Marked {
    p.senders_alert_marked(waiting.is_some());
    let write = Some(ProgressWrite::of(p.clone()));
    let Some(waiting) = waiting else {
        op.results_senders_back(now);
        return stored(op, true, write).row(HistoryEntry::ResultSendersBack);
    };
    let silent_ms = now - p.unanswered_since_ms.unwrap_or(now);
    op.results_senders_failing(waiting, silent_ms / 1_000, now);
    let key = op.key().to_string();
    stored(op, true, write)
        .row(HistoryEntry::ResultSendersSilent { waiting, silent_ms })
        .log(GateLog::ResultSendersSilent {
            key,
            waiting,
            silent_ms,
        })
}

/// Every result is settled: the counts go on the record and the job's effect is due (after it
/// went out, as a new generation when the counts changed); none parked (refused or failing)
/// in this spell (`failing_parked`) resolves an open `results_failing`. A history row names the
/// counts, and the generation when one began.
pub fn settled(mut op: Operation, counts: Value, failing_parked: u64, now: i64) -> Marked {
    let generation = op.results_settled(counts.clone(), failing_parked, now);
    let key = op.key().to_string();
    let step = stored(op, true, None).row(HistoryEntry::ResultsSettled { counts, generation });
    match generation {
        Some(generation) => step.log(GateLog::ResultsRecounted { key, generation }),
        None => step,
    }
}

/// An operator's retry of parked results: the progress takes `parked` (a page the edge read,
/// at most its room), makes the waiting ones due now, and reads a parked file again, the rows
/// it moved stored with it (the step's [`ProgressWrite`]); the record's part is the gate's step
/// ([`results_retried`]: a history row, the results due now, and the answer). A forgotten or
/// retired operation runs nothing again: its progress takes nothing and nothing is stored.
pub fn retried(
    op: Operation,
    progress: &mut Progress,
    parked: Vec<Row>,
    (reason, by): (String, Option<Actor>),
    now: i64,
) -> Step<GateReply, ProgressWrite> {
    let mut taken = ResultsTaken {
        parked_left: progress.counts.parked,
        ..ResultsTaken::default()
    };
    if op.results_stopped() {
        return results_retried(op, taken, reason, by, now).carrying(None);
    }
    let mut writes = progress.hurry_waiting(now);
    let (rows, file_reread) = progress.retry_parked(parked, now);
    (taken.hurried, taken.taken) = (writes.len() as u64, rows.len() as u64);
    (taken.file_reread, taken.parked_left) = (file_reread, progress.counts.parked);
    writes.extend(rows);
    let mut write = ProgressWrite::of(progress.clone());
    write.writes = writes;
    results_retried(op, taken, reason, by, now).carrying(Some(write))
}

/// The destination's desk queued the batch: the record waits for its release, or for
/// `fallback_ms` should the desk be lost, and says whether a pause holds it; `held`: the
/// progress whose failing clocks a pause stopped, stored with it.
pub fn wait_on_destination(
    mut op: Operation,
    (paused, held): (bool, Option<ProgressWrite>),
    fallback_ms: i64,
    now: i64,
) -> Marked {
    let waits = op.wait_on_desk(Queued::Results, now, fallback_ms, paused);
    stored(op, waits, held)
}

/// The results' next step is due at `at`.
pub fn due_at(mut op: Operation, at: i64) -> Marked {
    let changed = op.results_due_at(at);
    stored(op, changed, None)
}

/// A step used the desk's release (or its grant ended a wait): the mark is spent.
pub fn desk_spent(mut op: Operation) -> Marked {
    let changed = op.results_desk_spent();
    stored(op, changed, None)
}

#[cfg(test)]
pub(crate) mod tests {
    use serde_json::json;

    use super::*;
    use crate::operation::gate::Save;
    use crate::operation::lifecycle::{Source as EventSource, Status};
    use crate::operation::{OpEvent, ResultsMode};
    use crate::results::item::{Payload, Source};
    use crate::results::progress::{Phase, Write};
    use crate::retry::{AttemptOutcome, Backoff};

    const LIMITS: Limits = Limits {
        file_wait_ms: 30 * 60 * 1_000,
        retry: Backoff::new(1_000, 60_000),
        alert_after_ms: 86_400_000,
    };

    /// A `"results": "each"` batch that succeeded at 10.
    pub(crate) fn succeeded() -> Operation {
        let mut op = Operation::register("batches/r", "batches/r", None, 0);
        op.fill_results_mode(ResultsMode::Each, 0);
        let event = OpEvent {
            status: Status::Succeeded,
            update_time_ms: 1,
            source: EventSource::Webhook,
            details: Default::default(),
            delivery_id: None,
        };
        op.apply(&event, 10);
        op
    }

    fn what<R>(step: &Step<R, ProgressWrite>) -> Vec<String> {
        let whats = step.history.iter().map(|h| h.to_value()["what"].clone());
        whats
            .map(|w| w.as_str().unwrap_or("").to_string())
            .collect()
    }

    /// The alerts queued on the record, by kind.
    fn queued(op: &Operation) -> Vec<&'static str> {
        op.due_alerts(i64::MAX)
            .iter()
            .map(|a| a.kind.as_str())
            .collect()
    }

    fn row(index: u64) -> Row {
        Row {
            result_key: format!("k{index}"),
            index,
            attempts: 3,
            last_error: "failing for 3s".into(),
            next_at_ms: None,
            failing_since_ms: Some(0),
            last_attempt_ms: None,
            unanswered: false,
        }
    }

    /// A forgotten operation runs nothing again: an operator's retry of its results takes no
    /// parked row, hurries no waiting one, stores nothing and wakes nothing.
    #[test]
    fn a_retry_of_a_forgotten_operations_results_takes_nothing() {
        let mut p = Progress::begin(Source::Inline, 10);
        p.counts.parked = 1;
        let mut op = succeeded();
        assert!(op.forget(15, "gone"));
        let before = p.clone();
        let s = retried(op, &mut p, vec![row(0)], ("x".into(), None), 20);
        assert_eq!((s.results.clone(), &p), (None, &before));
        assert_eq!((s.save, s.history.len()), (Save::Unchanged, 0));
    }

    /// A results spell that fails past the threshold alerts; an operator's retry that
    /// delivers them resolves it; a second spell that fails alerts again, and only its
    /// delivery resolves it again.
    #[test]
    fn results_failing_resolves_once_retried_results_settle_and_alerts_again_next_spell() {
        let mut p = Progress::begin(Source::Inline, 10);
        p.gave_up = 1;
        assert_eq!(p.next(20), Next::AlertFailing(1));
        let s = gave_up(succeeded(), &mut p, 1, 3, 20);
        assert_eq!(
            (s.save, what(&s)),
            (Save::Durable, vec!["results_gave_up".into()])
        );
        let op = s.record.unwrap();
        assert_eq!(queued(&op), ["results_failing"]);
        assert_ne!(p.next(20), Next::AlertFailing(1), "alerted once");
        // The job's effect goes with it parked; the alert is not resolved by that.
        let counts = json!({"total": 1, "parked": 1});
        let mut op = settled(op, counts, p.gave_up, 30).record.unwrap();
        assert_eq!(queued(&op), ["results_failing"]);
        op.alert_delivered(&op.queued_id(AlertKind::ResultsFailing));
        let claim = op.claim(30, 1_000).unwrap();
        op.finish(&claim, &crate::retry::Next::Delivered, 40);
        // An operator's retry: a new spell, then delivered: resolved.
        let s = retried(op, &mut p, vec![row(0)], ("fixed".into(), None), 50);
        assert_eq!(
            (s.save, what(&s)),
            (Save::Durable, vec!["results_retried".into()])
        );
        assert_eq!(
            s.results.clone().unwrap().writes,
            [Write::Update(p.rows[&0].clone())],
            "waiting, due now"
        );
        assert_eq!(p.rows[&0].next_at_ms, Some(50));
        assert_eq!((p.gave_up, p.failing_alerted), (0, false));
        let op = s.record.unwrap();
        let s = settled(op, json!({"total": 1, "delivered": 1}), p.gave_up, 60);
        assert_eq!(what(&s), ["results_settled"]);
        let mut op = s.record.unwrap();
        assert_eq!(queued(&op), ["results_recovered"]);
        op.alert_delivered(&op.queued_id(AlertKind::ResultsRecovered));
        // A second retry whose results fail past the threshold again: alerted again.
        let op = retried(op, &mut p, vec![row(0)], ("again".into(), None), 70);
        let none = retried(
            op.record.clone().unwrap(),
            &mut p,
            vec![],
            ("x".into(), None),
            75,
        );
        assert_eq!(
            (none.save, none.history.len()),
            (Save::Unchanged, 0),
            "nothing taken"
        );
        assert_eq!(none.results.map(|w| w.writes), Some(vec![]));
        let op = op.record.unwrap();
        p.gave_up = 1;
        let op = gave_up(op, &mut p, 1, 3, 80).record.unwrap();
        assert_eq!(queued(&op), ["results_failing"], "a second spell alerts");
        let op = settled(op, json!({"total": 1, "parked": 1}), 1, 90)
            .record
            .unwrap();
        assert_eq!(
            queued(&op),
            ["results_failing"],
            "not resolved while parked"
        );
    }

    /// Senders that answer nothing: one `results_sender_failing` naming how many wait, with a
    /// history row and a log line; its resolution when a sender answers; a later spell alerts
    /// again.
    #[test]
    fn silent_senders_alert_with_a_row_and_a_line_and_resolve_then_alert_again() {
        let mut p = Progress::begin(Source::Inline, 10);
        p.unanswered_since_ms = Some(10);
        let s = senders(succeeded(), &mut p, Some(40), 5_010);
        assert_eq!(what(&s), ["result_senders_silent"]);
        assert_eq!(s.logs.len(), 1);
        let op = s.record.unwrap();
        assert_eq!(queued(&op), ["results_sender_failing"]);
        let text = op.alert_body(AlertKind::ResultsSenderFailing, "a", 5)["text"].clone();
        assert!(
            text.as_str().unwrap().contains("40 of its results wait"),
            "{text}"
        );
        assert_eq!(
            p.next(5_010),
            Next::ReadChunk {
                chunk: 0,
                from: Default::default()
            }
        );
        let s = senders(op, &mut p, None, 6_000);
        assert_eq!(what(&s), ["result_senders_back"]);
        let mut op = s.record.unwrap();
        assert_eq!(
            queued(&op),
            ["results_sender_failing", "results_sender_recovered"]
        );
        op.alert_delivered(&op.queued_id(AlertKind::ResultsSenderFailing));
        op.alert_delivered(&op.queued_id(AlertKind::ResultsSenderRecovered));
        let op = senders(op, &mut p, Some(3), 9_000).record.unwrap();
        assert_eq!(queued(&op), ["results_sender_failing"], "a second spell");
    }

    #[test]
    fn a_parked_file_alerts_once_with_a_history_row_and_its_reading_resolves_it() {
        let mut p = Progress::begin(Source::Inline, 10);
        let s = file_parked(succeeded(), &mut p, "404", 20);
        assert_eq!(what(&s), ["results_file_parked"]);
        assert!(p.alerted);
        let op = s.record.unwrap();
        assert_eq!(queued(&op), ["results_file_parked"]);
        let op = settled(op, json!({"total": 2}), 0, 30).record.unwrap();
        assert_eq!(queued(&op), ["results_file_parked", "results_file_read"]);
    }

    #[test]
    fn bookkeeping_stores_only_what_changed_and_leaves_no_history_row() {
        let s = due_at(succeeded(), 500);
        assert_eq!(s.save, Save::Durable, "the results' due time moved");
        let s = due_at(s.record.unwrap(), 500);
        assert_eq!(s.save, Save::Unchanged);
        assert_eq!(desk_spent(succeeded()).save, Save::Unchanged, "no mark");
        let s = wait_on_destination(succeeded(), (true, None), 1_000, 20);
        assert_eq!(s.save, Save::Durable);
        assert_eq!(s.record.unwrap().results_due_ms(), Some(1_020));
        let w = ProgressWrite::of(Progress::begin(Source::Inline, 10));
        let none = metered(succeeded(), None, "default", 20, w.clone());
        assert_eq!(none.save, Save::Unchanged);
        let m = Metered {
            delivered: 2,
            failed: 0,
            parked: 1,
            unanswered: 0,
        };
        let s = metered(succeeded(), Some(m), "default", 20, w);
        assert_eq!(s.save, Save::Durable);
        assert!([&s]
            .iter()
            .all(|s| s.history.is_empty() && s.logs.is_empty()));
    }

    /// A step's progress goes with it when the record is unchanged too: the gate's commit
    /// stores it whatever the record's save.
    #[test]
    fn a_steps_progress_write_is_carried_when_the_record_is_unchanged() {
        let mut p = Progress::begin(Source::Inline, 10);
        p.claim(Default::default(), false);
        let w = ProgressWrite::of(p);
        let steps = [
            progress(succeeded(), w.clone()),
            metered(succeeded(), None, "default", 20, w.clone()),
        ];
        for s in steps {
            assert_eq!((s.save, s.history.len()), (Save::Unchanged, 0));
            assert_eq!(
                s.results.as_ref(),
                Some(&w),
                "the progress goes with the step"
            );
        }
        let mut op = succeeded();
        op.wait_on_desk(Queued::Results, 20, 1_000, false);
        let s = wait_on_destination(op, (true, Some(w.clone())), 1_000, 20);
        assert_eq!(s.results, Some(w));
    }

    fn item(index: u64) -> ResultItem {
        let payload = Payload::Response(json!({"n": index}));
        let result_key = format!("k{index}");
        ResultItem {
            result_key,
            index,
            payload,
        }
    }

    fn at(index: u64) -> Checkpoint {
        Checkpoint { offset: 0, index }
    }

    /// A claim is stored before the sends as the progress alone (the record unchanged), and
    /// answers the claim its commit settles.
    #[test]
    fn a_claim_stores_the_progress_alone_and_answers_the_claim() {
        let p = Progress::begin(Source::Inline, 10);
        let (s, claim) = claimed(succeeded(), p, at(3), true);
        assert_eq!((s.save, s.history.len()), (Save::Unchanged, 0));
        assert_eq!((claim.chunk, claim.from, claim.to), (0, at(0), at(3)));
        assert_eq!(s.results.unwrap().progress.claim, Some(claim));
    }

    /// A chunk's answers in one step: the claim settles, the one not delivered is kept, and
    /// `/metrics`' count goes on the record (a failure is counted at once); a `Retry-After`
    /// holds the results, within the backoff's longest.
    #[test]
    fn a_commit_settles_meters_and_holds_for_a_retry_after_in_one_step() {
        let mut p = Progress::begin(Source::Inline, 10);
        let claim = p.claim(at(2), true);
        let retry = Sending::Answered(AttemptOutcome::Retry("503".into()));
        let answers = vec![
            (item(0), Sending::Answered(AttemptOutcome::Delivered)),
            (item(1), retry),
        ];
        let chunk = Answers::Chunk {
            chunk: claim.chunk,
            reached: at(2),
            answers,
        };
        let (label, clock) = ("default", (20, || 0.5));
        let s = committed(
            succeeded(),
            p.clone(),
            chunk.clone(),
            None,
            label,
            &LIMITS,
            clock,
        );
        assert_eq!((s.save, s.history.len()), (Save::Durable, 0), "counted");
        let w = s.results.clone().unwrap();
        assert_eq!((w.progress.claim, w.progress.counts.delivered), (None, 1));
        assert!(matches!(&w.writes[..], [Write::Keep(row, _)] if row.index == 1));
        let op = s.record.unwrap();
        assert_eq!(op.results_due_ms(), Some(10), "no hold: due as it was");
        let held = committed(
            succeeded(),
            p.clone(),
            chunk.clone(),
            Some(5_000),
            label,
            &LIMITS,
            clock,
        );
        assert_eq!(held.record.unwrap().results_due_ms(), Some(5_020));
        assert_eq!(held.results, Some(w), "the same commit");
        let capped = committed(
            succeeded(),
            p.clone(),
            chunk.clone(),
            Some(600_000),
            label,
            &LIMITS,
            clock,
        );
        assert_eq!(capped.record.unwrap().results_due_ms(), Some(60_020));
        // The desk released the batch during the sends: the release is the next run's, no
        // hold delays it.
        let mut released = succeeded();
        assert!(released.destination_ready(false, 15));
        let due = released.results_due_ms();
        let s = committed(released, p, chunk, Some(5_000), label, &LIMITS, clock);
        assert_eq!(
            s.record.unwrap().results_due_ms(),
            due,
            "the release stands"
        );
    }

    /// A named write decides as its function does: a claim answers the chunk it claimed (no
    /// other write claims one); a failed read draws the jitter once; the clock is the commit's.
    #[test]
    fn a_marking_is_decided_by_its_function_on_the_record_as_stored() {
        let gate = GateLimits {
            desk_fallback_ms: 1_000,
            ..crate::operation::gate::fixtures::LIMITS
        };
        let cx = Context {
            limits: &LIMITS,
            gate: &gate,
            to: "d",
        };
        let p = Progress::begin(Source::Inline, 10);
        let claim = Marking::Claimed {
            progress: p.clone(),
            to: at(3),
            last: true,
        };
        let d = decide(claim, succeeded(), &cx, (20, || 0.5));
        let to = match d.claimed {
            Some(Claimed::Chunk(c)) => Some(c.to),
            _ => None,
        };
        assert_eq!(
            (d.step.save, to, d.alarm_at_once),
            (Save::Unchanged, Some(at(3)), false)
        );
        let d = decide(Marking::DueAt(500), succeeded(), &cx, (20, || 0.5));
        assert_eq!((d.step.save, d.claimed), (Save::Durable, None));
        let mut draws = 0;
        let failed = Marking::ReadFailed(p, FileTrouble::Missing);
        let jitter = || {
            draws += 1;
            0.5
        };
        let s = decide(failed, succeeded(), &cx, (20, jitter)).step;
        assert_eq!(draws, 1);
        let w = read_failed(
            succeeded(),
            Progress::begin(Source::Inline, 10),
            FileTrouble::Missing,
            &LIMITS,
            (20, 0.5),
        );
        assert_eq!(s.results, w.results);
        let wait = Marking::Wait {
            paused: true,
            held: None,
        };
        let s = decide(wait, succeeded(), &cx, (20, || 0.5)).step;
        assert_eq!(
            s.record.unwrap().results_due_ms(),
            Some(1_020),
            "the desk's fallback"
        );
    }

    /// The job's writes, decided on the record as stored: the claim (with its history row, the
    /// alarm at its expiry) only while the effect is owed and free; the answer under the
    /// claim's fencing token (a stale token changes nothing), the alarm at once when work is
    /// left owed; a wait on the desk, with the alarm.
    #[test]
    fn the_jobs_writes_are_decided_as_the_alarm_decides_them() {
        use crate::operation::gate::fixtures::{deliver, registered, LIMITS as GATE};
        use crate::operation::gate::step as gate_step;
        use crate::operation::Finished;
        let cx = Context {
            limits: &LIMITS,
            gate: &GATE,
            to: "d",
        };
        let owed = gate_step(Some(registered()), deliver(Status::Succeeded), 10);
        let owed = owed.record.unwrap();
        let d = decide(Marking::EffectClaim, registered(), &cx, (10, || 0.5));
        assert_eq!(
            (d.step.save, d.claimed),
            (Save::Unchanged, None),
            "not owed"
        );
        let d = decide(Marking::EffectClaim, owed.clone(), &cx, (10, || 0.5));
        let Some(Claimed::Effect(claim)) = d.claimed else {
            panic!("{:?}", d.claimed);
        };
        let (expected, _) = alarm::begin_attempt(owed.clone(), 10, &GATE).unwrap();
        assert_eq!(
            (claim, d.step.save, d.alarm_at_once),
            (expected, Save::Durable, true)
        );
        assert_eq!(what(&d.step), ["claimed"]);
        let claimed = d.step.record.unwrap();
        let attempt = |claim, outcome| {
            Box::new(Attempt {
                claim,
                outcome,
                started_ms: 10,
                finished_ms: 20,
                asked_wait_ms: None,
                target: Default::default(),
            })
        };
        let done = Marking::EffectAnswered(attempt(claim, AttemptOutcome::Delivered));
        let d = decide(done, claimed.clone(), &cx, (20, || 0.5));
        assert!(claimed_done(&d), "committed under its token");
        assert!(
            !d.alarm_at_once,
            "a success leaves the alarm to the run's end"
        );
        let retry = AttemptOutcome::Retry("503".into());
        let d = decide(
            Marking::EffectAnswered(attempt(claim, retry)),
            claimed.clone(),
            &cx,
            (20, || 0.5),
        );
        assert!(d.alarm_at_once, "a retry moves the alarm at once");
        // A claim no longer current (an older token): its failure changes nothing.
        let stale = Claim {
            token: claim.token - 1,
            ..claim
        };
        let late = || attempt(stale, AttemptOutcome::Retry("503".into()));
        let d = decide(
            Marking::EffectAnswered(late()),
            claimed.clone(),
            &cx,
            (20, || 0.5),
        );
        let expected = alarm::attempt_finished(claimed.clone(), &late(), &GATE, 0.5);
        let fenced = alarm::AlarmDone::AttemptFinished(Finished::Fenced);
        assert_eq!(expected.reply, fenced);
        assert_eq!(
            (d.step.save, d.step.record),
            (expected.save, expected.record)
        );
        let d = decide(Marking::EffectWaits(true), owed, &cx, (20, || 0.5));
        assert!(d.alarm_at_once && d.step.save == Save::Durable);
    }

    fn claimed_done(d: &Decided) -> bool {
        d.step.record.as_ref().is_some_and(|op| op.effect().done())
    }

    /// Rows sent again: each row's answer, each with its own draw of the jitter.
    #[test]
    fn a_rows_commit_finishes_each_row_with_its_own_jitter() {
        let mut p = Progress::begin(Source::Inline, 10);
        p.claim(at(2), true);
        let fail = || Sending::Answered(AttemptOutcome::Retry("503".into()));
        let answers = vec![(item(0), fail()), (item(1), fail())];
        let chunk = Answers::Chunk {
            chunk: 0,
            reached: at(2),
            answers,
        };
        let p = committed(succeeded(), p, chunk, None, "d", &LIMITS, (20, || 0.5));
        let p = p.results.unwrap().progress;
        let mut draws = [0.0, 1.0].into_iter();
        let answers = vec![(item(0), fail()), (item(1), fail())];
        let clock = (5_000, move || draws.next().unwrap());
        let s = committed(
            succeeded(),
            p,
            Answers::Rows(answers),
            None,
            "d",
            &LIMITS,
            clock,
        );
        let w = s.results.unwrap();
        assert_eq!(w.writes.len(), 2);
        let (a, b) = (&w.progress.rows[&0], &w.progress.rows[&1]);
        assert_eq!((a.attempts, b.attempts), (2, 2));
        assert!(a.next_at_ms < b.next_at_ms, "{a:?} {b:?}");
    }

    /// A read that did not give the file: the progress waits for it, and the results are due
    /// when it is asked for again, in the same step (the alarm is set for it); a parked file
    /// (its alert next) and a release the next run spends keep the due time.
    #[test]
    fn a_failed_read_makes_the_results_due_at_the_files_retry() {
        let p = Progress::begin(Source::Inline, 10);
        let clock = (20, 0.5);
        let s = read_failed(succeeded(), p.clone(), FileTrouble::Missing, &LIMITS, clock);
        let w = s.results.clone().unwrap();
        let Phase::WaitingForFile { next_at_ms, .. } = w.progress.phase else {
            panic!("{:?}", w.progress.phase);
        };
        assert!(next_at_ms > 20);
        assert_eq!((s.save, s.history.len()), (Save::Durable, 0));
        assert_eq!(s.record.unwrap().results_due_ms(), Some(next_at_ms));
        let gone = FileTrouble::Unreadable("400".into());
        let s = read_failed(succeeded(), p.clone(), gone, &LIMITS, clock);
        let parked = s.results.as_ref().unwrap().progress.phase.clone();
        assert!(matches!(parked, Phase::FileParked { .. }));
        assert_eq!(
            (s.save, s.record.unwrap().results_due_ms()),
            (Save::Unchanged, Some(10))
        );
        let mut released = succeeded();
        assert!(released.destination_ready(false, 15));
        let s = read_failed(released, p, FileTrouble::Missing, &LIMITS, clock);
        assert_eq!(
            s.record.unwrap().results_due_ms(),
            Some(10),
            "the release stands"
        );
    }
}
