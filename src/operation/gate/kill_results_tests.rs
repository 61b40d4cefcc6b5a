//! A `"results": "each"` batch driven on `kill_tests.rs`' world the way the gate's alarm drives
//! it: one step of the results per alarm run, before the alarm's plan, each the edge's own
//! [`ResultsPlan`] (`edge/objects/gate/results.rs` performs its work; this world performs the
//! same work on its own storage, desk and destination), then its job's effect, with a kill at
//! every storage point, results steps included: each result goes under its one id with one
//! body, is accepted or parked; the job's effect goes once every result is settled, once, with
//! their counts; nothing goes under a new id after a kill.
//!
//! Storage points of a results step: the record's (`World::commit` through the gate's steps,
//! [`on_record`]), which alone stores the progress and its transition's writes to the failure
//! rows ([`ProgressWrite`], the step's, in the record's write, also when the record is
//! unchanged: the claim before a chunk's sends, its commit with `/metrics`' count and a
//! `Retry-After` hold after them, the rows' answers after they are sent again, a failed read
//! with the results' next due time, a raised alert, where the results are); each send is a point
//! too (the request reached the destination). The order of the work and every write are the
//! plan's ([`ResultsWork`], each commit's [`Marking`] decided by [`on_record::decide`], as the
//! edge commits it), so these kills drive the edge's own order and decisions. The file is read
//! as the edge reads it without `Range` (from byte 0, the done part discarded), at most
//! [`CHUNK`] results a read (a download ends a chunk early at its byte cap, so a chunk may
//! hold fewer than the desk granted).

use std::collections::BTreeSet;

use serde_json::{json, Value};

use crate::destination::protocol::Sent;
use crate::destination::sending::outcome;
use crate::operation::effect::build_request;
use crate::operation::gate::alarm::Attempt;
use crate::operation::gate::desk_turn::{reports, DeskTurn};
use crate::operation::gate::kill_tests::{
    completion, deliver, job_kept_its_promises, job_requests, killed_everywhere, one_body_per_id,
    register, resent_after_2xx, secret, Alarm, Answer, Beside, Run, World, KEY, LIMITS, TIMEOUT_MS,
};
use crate::operation::gate::protocol::{GateCommand, GateReply};
use crate::operation::gate::step as gate_step;
use crate::operation::lifecycle::{Source as EventSource, Status};
use crate::operation::{Claim, Operation, ResultsMode};
use crate::results::body::{build_result_request, result_message_id, ResultHead};
use crate::results::item::{from_piece, ResultItem, Source, LINE_CAP};
use crate::results::lines::{Checkpoint, ChunkFill, LineSplitter};
use crate::results::marks::{self as on_record, Claimed, Context, Marking};
use crate::results::plan::{Granted, Read, ResultsPlan, ResultsWork, Seen};
use crate::results::progress::{
    FileTrouble, Limits, Phase, Progress, ProgressWrite, Sending, Write, CHUNK_BYTES,
};

const FILE: &str = "files/out";
/// Results a read gives at most.
const CHUNK: usize = 7;
const RESULTS: Limits = Limits {
    file_wait_ms: 30 * 60 * 1_000,
    retry: LIMITS.retry,
    alert_after_ms: 86_400_000,
};

/// A file of `n` results: keyed responses, a repeated key, an error, a line that is not JSON.
fn file(n: usize) -> Vec<u8> {
    let mut out = String::new();
    for i in 0..n {
        let line = match i % 6 {
            1 => format!("{{\"key\":\"dup\",\"response\":{{\"n\":{i}}}}}"),
            3 => format!("{{\"key\":\"e{i}\",\"error\":{{\"code\":3}}}}"),
            4 => "{not json".to_string(),
            _ => format!("{{\"key\":\"k{i}\",\"response\":{{\"n\":{i}}}}}"),
        };
        out.push_str(&line);
        out.push('\n');
    }
    out.into_bytes()
}

/// Every result of `file`, as a read of the whole file gives them.
fn all_results(file: &[u8]) -> Vec<ResultItem> {
    let mut splitter = LineSplitter::resume(LINE_CAP, Checkpoint::default(), 0);
    let mut pieces = splitter.push(file);
    let (tail, _) = splitter.finish();
    pieces.extend(tail);
    pieces.iter().map(|p| from_piece(p, FILE)).collect()
}

impl World {
    fn progress(&self) -> Option<Progress> {
        self.tables.load()
    }

    /// The progress and its writes as stored; what it has done never moves back.
    fn write_progress(&mut self, progress: &Progress, writes: Vec<Write>) {
        if let Some(before) = self.progress() {
            assert!(progress.done_through.index >= before.done_through.index);
            assert!(progress.chunks_done >= before.chunks_done);
            assert!(progress.counts.delivered >= before.counts.delivered);
        }
        self.tables.save(progress, writes);
        let stored = self.tables.load().unwrap();
        assert_eq!(
            stored.rows, progress.rows,
            "its writes store its waiting rows"
        );
    }

    /// `results_admin::retry`: a page of parked results waiting again with the progress, in
    /// the record's step, committed (one write).
    pub(super) fn retry_results(&mut self, reason: String) -> Run<GateReply> {
        let Some(op) = self.load() else {
            return Ok(GateReply::NotFound);
        };
        let Some(mut progress) = self.progress() else {
            return Ok(GateReply::NotFound);
        };
        let parked = self.tables.parked(progress.room());
        let step = on_record::retried(op, &mut progress, parked, (reason, None), self.clock);
        let (_, reply) = self.commit(step, Alarm::Sync)?;
        Ok(reply)
    }

    /// `results::step`: one step of the results, when they are due.
    pub(super) fn results_step(&mut self, op: Operation) -> Run<Operation> {
        match ResultsPlan::new(&op, self.clock, RESULTS) {
            Some(plan) => self.perform(plan, op),
            None => Ok(op),
        }
    }

    /// `results::effect`: the job's effect, a batch of one, through the same plan.
    pub(super) fn effect_step(&mut self, op: Operation) -> Run<Operation> {
        let plan = ResultsPlan::job(&op, RESULTS);
        self.perform(plan, op)
    }

    /// `Driver::perform`: the plan's work performed on this world, one piece at a time.
    fn perform(&mut self, mut plan: ResultsPlan, op: Operation) -> Run<Operation> {
        // The sends are the record's as the step found it.
        let found = op.clone();
        let (mut turn, mut seen) = (DeskTurn::None, Seen::Nothing);
        let mut op = op;
        // A plan told what it does not expect is this world's bug: the test fails.
        while let Some(work) = plan.next(seen, self.clock).expect("told what it expects") {
            seen = match work {
                ResultsWork::LoadProgress => Seen::Progress(self.progress()),
                ResultsWork::Locate | ResultsWork::BackOff(_) => {
                    unreachable!("the outcome names its file")
                }
                ResultsWork::Read { source, from, max } => {
                    assert!(matches!(source, Source::File { .. }), "{source:?}");
                    Seen::Read(self.read(from, max)?)
                }
                ResultsWork::Turn { mark, ready, retry } => {
                    let granted = self.desk_turn(mark, ready, retry)?;
                    Seen::Turn(granted.map(|(t, awaited, n)| {
                        turn = t;
                        Granted { awaited, n }
                    }))
                }
                ResultsWork::LoadRows(indexes) => {
                    let items = indexes.into_iter().filter_map(|i| self.tables.item(i));
                    Seen::Items(items.collect())
                }
                ResultsWork::Send(items) => {
                    let (answers, sent) = self.send(&found, items)?;
                    Seen::Sent(answers, sent)
                }
                ResultsWork::SendEffect(claim) => {
                    let (attempt, sent) = self.send_effect(&op, claim)?;
                    Seen::Attempted(Box::new(attempt), sent)
                }
                ResultsWork::Commit(marking) => {
                    let claim;
                    (op, claim) = self.results_commit(op, *marking)?;
                    Seen::Committed(claim)
                }
                ResultsWork::Report(sent) => match reports(turn, false, sent.failures > 0) {
                    true => Seen::Told(self.desk_says_wait()?),
                    false => Seen::Told(None),
                },
                ResultsWork::Tell(_) => Seen::Told(self.desk_says_wait()?),
                ResultsWork::LoadRecord => {
                    op = self.load().unwrap_or(op);
                    Seen::Nothing
                }
            };
        }
        Ok(op)
    }

    /// `Driver::commit`: what `marking` makes of the record as stored now, committed with the
    /// alarm when it says so (else the run's upkeep sets it last), and what it claimed, if
    /// anything.
    fn results_commit(
        &mut self,
        op: Operation,
        marking: Marking,
    ) -> Run<(Operation, Option<Claimed>)> {
        let current = self.load().unwrap_or(op);
        let cx = Context {
            limits: &RESULTS,
            gate: &LIMITS,
            to: "to",
        };
        let clock = (self.clock, || 0.5);
        let decided = on_record::decide(marking, current.clone(), &cx, clock);
        let alarm = match decided.alarm_at_once {
            true => Alarm::Sync,
            false => Alarm::Deferred,
        };
        let (stored, ()) = self.commit(decided.step, alarm)?;
        Ok((stored.unwrap_or(current), decided.claimed))
    }

    /// `Driver::send_effect`: the job's one request, built from the record as claimed, reaches
    /// the destination (a point), then its answer, as its commit and its desk hear it.
    fn send_effect(&mut self, op: &Operation, claim: Claim) -> Run<(Attempt, Sent)> {
        let request = build_request(op, &secret(), self.clock / 1_000);
        let started_ms = self.clock;
        let answer = self.dest.call(&request);
        self.clock += 10;
        self.point()?;
        self.interleave()?;
        let attempt = Attempt {
            claim,
            outcome: outcome(&answer, TIMEOUT_MS),
            started_ms,
            asked_wait_ms: answer.asked_wait_ms(self.clock),
            finished_ms: self.clock,
            target: Default::default(),
        };
        Ok((attempt, Sent::of([&answer], self.clock)))
    }

    /// `Driver::read`: at most `max` results (and [`CHUNK`]) from `from`, or a 404 while the
    /// file is missing.
    fn read(&mut self, from: Checkpoint, max: u32) -> Run<Read> {
        self.interleave()?;
        if self.file_missing > 0 {
            self.file_missing -= 1;
            return Ok(Err(FileTrouble::Missing));
        }
        let mut splitter = LineSplitter::resume(LINE_CAP, from, 0);
        let mut fill = ChunkFill::new((max as usize).min(CHUNK), CHUNK_BYTES);
        for bytes in self.file.chunks(13) {
            if fill.offer(splitter.push(bytes)) {
                let (pieces, to, last) = fill.close(splitter.checkpoint(), false);
                return Ok(Ok((
                    pieces.iter().map(|p| from_piece(p, FILE)).collect(),
                    to,
                    last,
                )));
            }
        }
        let (tail, end) = splitter.finish();
        fill.offer(tail);
        let (pieces, to, last) = fill.close(end, true);
        Ok(Ok((
            pieces.iter().map(|p| from_piece(p, FILE)).collect(),
            to,
            last,
        )))
    }

    /// `Driver::send`: every result to the destination (each a point: it reached it), then
    /// their answers.
    fn send(
        &mut self,
        op: &Operation,
        items: Vec<ResultItem>,
    ) -> Run<(Vec<(ResultItem, Sending)>, Sent)> {
        let head = ResultHead::of(op);
        let mut answers = Vec::new();
        for item in &items {
            let request = build_result_request(&head, item, &secret(), self.clock / 1_000);
            answers.push(self.dest.call(&request));
            self.point()?;
        }
        self.clock += 10;
        self.interleave()?;
        let sent = Sent::of(answers.iter(), self.clock);
        let outcomes = answers
            .iter()
            .map(|a| Sending::Answered(outcome(a, TIMEOUT_MS)));
        Ok((items.into_iter().zip(outcomes).collect(), sent))
    }
}

/// `results_store::Beside`: the step's progress and its writes, stored by the commit.
impl Beside for ProgressWrite {
    fn store(self, world: &mut World) -> bool {
        world.write_progress(&self.progress, self.writes);
        true
    }
}

/// A batch of `n` results registered `"results": "each"`, its file missing for the first
/// `missing` reads.
fn batch(world: &mut World, n: usize, missing: u32) {
    world.file = file(n);
    world.file_missing = missing;
    completion(world, true, ResultsMode::Each);
}

/// What became of each result, as the destination last answered it: the job's counts, and
/// how many were parked.
fn final_counts(world: &World, label: &str) -> Value {
    let items = all_results(&world.file);
    let parked = world.tables.parked(usize::MAX).into_iter();
    let parked: BTreeSet<u64> = parked.map(|r| r.index).collect();
    let mut delivered = 0;
    for item in &items {
        let id = result_message_id(KEY, &item.result_key, item.index);
        match world.dest.last[&id] {
            Answer::Refuse => assert!(
                parked.contains(&item.index),
                "{label}: {id} refused, not parked"
            ),
            Answer::Accept => delivered += 1,
            other => panic!("{label}: {id} left at {other:?}"),
        }
    }
    let errors = items.iter().filter(|i| i.payload.is_error()).count();
    json!({"total": items.len(), "delivered": delivered, "errors": errors,
        "parked": parked.len()})
}

/// Each result went under its one id, and none under another.
fn each_result_under_its_id(world: &World, label: &str) {
    let items = all_results(&world.file);
    let ids: BTreeSet<String> = items
        .iter()
        .map(|i| result_message_id(KEY, &i.result_key, i.index))
        .collect();
    let results: BTreeSet<String> = world
        .dest
        .requests
        .iter()
        .filter(|(id, _)| id.starts_with("res_"))
        .map(|(id, _)| id.clone())
        .collect();
    assert_eq!(
        results, ids,
        "{label}: each result under its one id, none under a new one"
    );
}

/// The body of the job's effect of `generation`.
fn job_body(world: &World, generation: u32) -> Option<Value> {
    let id = crate::operation::effect::effect_message_id(KEY, generation);
    let bodies = job_requests(world).remove(&id)?;
    Some(serde_json::from_str(bodies.first().unwrap()).unwrap())
}

/// An operator's retry of the parked results a day after the batch: the retried results go
/// under their first ids; counts it changed go as the job's generation 2 (after the last
/// result), counts it did not change send nothing more.
fn retried_batch_kept_its_promises(world: &World, label: &str) {
    one_body_per_id(world, label);
    each_result_under_its_id(world, label);
    let counts = final_counts(world, label);
    let op = world.stored_record().unwrap();
    assert_eq!(op.results_counts(), Some(&counts), "{label}");
    let generation = op.effect().generation();
    let first = job_body(world, 1).expect("the job's first effect");
    assert_eq!(generation == 2, first["results"] != counts, "{label}");
    assert!(generation <= 2, "{label}: generation {generation}");
    if generation == 2 {
        let second = job_body(world, 2).expect("the new counts sent");
        assert_eq!(second["results"], counts, "{label}");
        let id = crate::operation::effect::effect_message_id(KEY, 2);
        let requests = &world.dest.requests;
        let last_result = requests.iter().rposition(|(id, _)| id.starts_with("res_"));
        let first_job = requests.iter().position(|(i, _)| *i == id);
        assert!(
            first_job > last_result,
            "{label}: generation 2 before the results"
        );
    }
    let generations: Vec<u32> = (1..=generation).collect();
    job_kept_its_promises(world, &generations, label);
}

/// Each result went under its one id, every request of it with one body, and ended accepted
/// or parked; the job's effect went after the last result's request, once accepted (or
/// parked), with the counts of what became of them.
fn batch_kept_its_promises(world: &World, label: &str) {
    one_body_per_id(world, label);
    each_result_under_its_id(world, label);
    let counts = final_counts(world, label);
    let requests = &world.dest.requests;
    let last_result = requests.iter().rposition(|(id, _)| id.starts_with("res_"));
    let first_job = requests.iter().position(|(id, _)| id.starts_with("msg_"));
    assert!(
        first_job > last_result,
        "{label}: the job went before its results"
    );
    job_kept_its_promises(world, &[1], label);
    let body = job_body(world, 1).expect("the job's effect");
    assert_eq!(body["results"], counts, "{label}: the job's counts");
    let op = world.stored_record().unwrap();
    assert_eq!(op.results_counts(), Some(&counts));
}

#[test]
fn a_results_batch_killed_at_every_storage_point_sends_each_result_once_then_the_job() {
    let mut points = 0;
    // Seeds 2 and 4 may refuse (results parked), 1 and 3 throttle; the file is missing for
    // the first read or two but with seed 3; the desk may say wait with seeds 3 and 4.
    for seed in 1..=4 {
        let missing = (seed % 3) as u32;
        let refuses = seed % 2 == 0;
        let scenario = |w: &mut World| {
            w.desk_waits = seed >= 3;
            batch(w, 14, missing)
        };
        points += killed_everywhere(seed, refuses, scenario, batch_kept_its_promises);
    }
    assert!(points > 4 * 60, "{points} points");
}

/// A deploy at any storage point of a batch whose results are owed: each instance after a
/// kill reads the record as the build that kept the results' due time in the job effect's
/// `next_attempt_ms` stored it, and every result still goes once, then the job.
#[test]
fn results_stored_by_the_build_before_go_on_after_a_deploy_at_every_storage_point() {
    for seed in [1, 3] {
        let scenario = |w: &mut World| {
            w.stored_before = true;
            w.desk_waits = seed == 3;
            batch(w, 14, 1);
        };
        killed_everywhere(seed, false, scenario, batch_kept_its_promises);
    }
}

#[test]
fn an_operators_retry_of_parked_results_killed_anywhere_sends_new_counts_once_under_a_new_id() {
    let mut retried = 0;
    for seed in [2, 4, 6] {
        let scenario = |w: &mut World| {
            w.desk_waits = seed == 6;
            batch(w, 14, 0);
            let retry = GateCommand::RetryResults {
                reason: "fixed".into(),
                dry_run: false,
                by: None,
            };
            w.send_at(86_400_000, retry);
        };
        killed_everywhere(seed, true, scenario, retried_batch_kept_its_promises);
        let mut clean = World::new(seed, true, None);
        scenario(&mut clean);
        clean.run();
        retried += usize::from(clean.stored_record().unwrap().effect().generation() == 2);
    }
    assert!(retried >= 1, "a retry changed the counts at least once");
}

/// Clean, a batch's steps store only per chunk and per failure: the counts are exact, and a
/// repeat under one id happens only after a lost answer.
#[test]
fn a_clean_batch_sends_a_result_again_only_after_an_answer_that_was_not_a_2xx() {
    let mut world = World::new(3, false, None);
    batch(&mut world, 17, 0);
    world.run();
    batch_kept_its_promises(&world, "clean");
    assert_eq!(resent_after_2xx(&world), 0);
    let kinds: BTreeSet<String> = world
        .dest
        .answers
        .iter()
        .map(|a| format!("{a:?}"))
        .collect();
    assert_eq!(
        kinds.len(),
        4,
        "accepted, failed, lost and throttled: {kinds:?}"
    );
}

/// The commit is the progress's one writer: a step whose record is unchanged (a claim) stores
/// its progress all the same, as a point of its own, and the record stays as it was.
#[test]
fn a_step_whose_record_is_unchanged_stores_its_progress_as_its_own_point() {
    let mut world = World::new(1, false, None);
    let op = Operation::register(KEY, KEY, None, 0);
    let mut progress = Progress::begin(Source::Inline, 0);
    let claim = progress.claim(
        Checkpoint {
            offset: 9,
            index: 3,
        },
        false,
    );
    let step = on_record::progress(op.clone(), ProgressWrite::of(progress.clone()));
    assert_eq!(step.save, crate::operation::gate::Save::Unchanged);
    world.commit(step, Alarm::Deferred).unwrap();
    assert_eq!(world.points, 1, "the claim is a storage point");
    assert_eq!(world.progress(), Some(progress));
    assert_eq!(world.progress().unwrap().claim, Some(claim));
    assert_eq!(world.stored_record(), None, "the record is not written");
}

/// A read that did not give the file (a chunk's, then the first line's before the desk) sets
/// the results' next due time to the file's retry in the same commit, so the alarm is set for
/// it: no run after it only stores the due time.
#[test]
fn a_failed_read_makes_the_results_due_when_the_file_is_asked_for_again() {
    let mut world = World::new(1, false, None);
    (world.file, world.file_missing) = (file(14), 2);
    let registered = gate_step(None, register(ResultsMode::Each), 0);
    let succeeded = deliver(Status::Succeeded, 200, EventSource::Webhook);
    let succeeded = gate_step(registered.record, succeeded, 20);
    world.commit(succeeded, Alarm::Sync).unwrap();
    world.clock = 30;
    for failures in 1..=2 {
        let op = world.load().unwrap();
        assert!(op.results_due_ms().is_some_and(|at| at <= world.clock));
        world.results_step(op).unwrap();
        let progress = world.progress().unwrap();
        let Phase::WaitingForFile { next_at_ms, .. } = progress.phase else {
            panic!("{:?}", progress.phase);
        };
        assert_eq!(
            progress.phase,
            Phase::WaitingForFile {
                failures,
                next_at_ms
            }
        );
        assert!(next_at_ms > world.clock);
        let op = world.stored_record().unwrap();
        assert_eq!(op.results_due_ms(), Some(next_at_ms), "read {failures}");
        world.clock = next_at_ms;
    }
    let op = world.load().unwrap();
    world.results_step(op).unwrap();
    assert_eq!(
        world.progress().unwrap().phase,
        Phase::Reading,
        "read at last"
    );
}

/// A kill between a chunk's claim and its commit (some of its results sent), then the file
/// fails: the step waits on the file's backoff (the results due then, not read again at once,
/// over and over); past the wait the file is parked (the claim dropped): one alert, the batch
/// settles and the job's effect counts the file parked. An operator's retry reads again from
/// the claim's start: each result of the claimed range goes again under its same id, and is
/// counted once.
#[test]
fn a_claimed_chunk_whose_file_then_fails_waits_is_parked_once_and_a_retry_sends_it_again() {
    let mut world = World::new(1, false, None);
    world.file = file(14);
    let registered = gate_step(None, register(ResultsMode::Each), 0);
    let succeeded = deliver(Status::Succeeded, 200, EventSource::Webhook);
    let succeeded = gate_step(registered.record, succeeded, 20);
    world.commit(succeeded, Alarm::Sync).unwrap();
    world.clock = 30;
    // The first chunk is read, sent and committed; the second is claimed and three of its
    // results reach the destination before the kill.
    let op = world.load().unwrap();
    let op = world.results_step(op).unwrap();
    assert_eq!(world.progress().unwrap().chunks_done, 1);
    let progress = world.progress().unwrap();
    let read = world.read(progress.done_through, CHUNK as u32).unwrap();
    let (items, to, last) = read.unwrap();
    let (step, claim) = on_record::claimed(op.clone(), progress, to, last);
    world.commit(step, Alarm::Deferred).unwrap();
    world.send(&op, items[..3].to_vec()).unwrap();
    world.kills += 1;
    world.file_missing = u32::MAX;
    let reads = |w: &World| u32::MAX - w.file_missing;
    // The runs after the kill, each when the results are due (a throttle or the rows may hold
    // them; the rows go meanwhile), until the file's backoff is over: it is read once.
    let mut file_at = None;
    for _ in 0..100 {
        let op = world.load().unwrap();
        world.clock = world.clock.max(op.results_due_ms().unwrap());
        if file_at.is_some_and(|at| world.clock >= at) {
            break;
        }
        world.results_step(op).unwrap();
        let progress = world.progress().unwrap();
        let waits = (progress.claim, reads(&world));
        assert_eq!(
            waits,
            (Some(claim), 1),
            "the claim waits on the file's backoff"
        );
        let Phase::WaitingForFile { next_at_ms, .. } = progress.phase else {
            panic!("{:?}", progress.phase);
        };
        file_at = Some(next_at_ms);
    }
    assert!(file_at.is_some_and(|at| world.clock >= at));
    // The alarm runs on until the file is parked and the batch settles.
    world.sync_alarm(&world.stored_record().unwrap()).unwrap();
    world.run();
    let parked = |w: &World| {
        let alerts = w.alerts_sent.iter();
        alerts.filter(|a| *a == "results_file_parked").count()
    };
    assert_eq!(parked(&world), 1, "one alert: {:?}", world.alerts_sent);
    let progress = world.progress().unwrap();
    assert_eq!((progress.claim, progress.chunks_done), (None, 1));
    let first = job_body(&world, 1).expect("the job's effect");
    assert_eq!(
        first["results"]["file_parked"],
        "results file not found (404)"
    );
    assert_eq!(first["results"]["total"], CHUNK);
    // The file is back; an operator's retry reads it from the claim's start.
    world.file_missing = 0;
    let before = world.dest.requests.len();
    let retry = GateCommand::RetryResults {
        reason: "file back".into(),
        dry_run: false,
        by: None,
    };
    world.send_at(world.clock + 86_400_000, retry);
    world.run();
    let after: BTreeSet<&String> = world.dest.requests[before..]
        .iter()
        .map(|(id, _)| id)
        .collect();
    for item in all_results(&world.file) {
        let id = result_message_id(KEY, &item.result_key, item.index);
        let claimed = (claim.from.index..claim.to.index).contains(&item.index);
        assert_eq!(after.contains(&id), claimed, "{id} at {}", item.index);
    }
    retried_batch_kept_its_promises(&world, "retried after the claim's file was parked");
    assert_eq!(world.stored_record().unwrap().effect().generation(), 2);
    assert_eq!(parked(&world), 1, "no new alert");
}
