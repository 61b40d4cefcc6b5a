//! The gate's pure steps driven the way its Durable Object drives them, against storage, a
//! destination and an alert sink held in memory, with a kill at every point where state is
//! stored or a request reaches the destination: the job's effect goes under one `webhook-id`
//! with one body, is accepted (or parked, its alert sent), and the stored status never moves
//! back. A batch's results before the job's effect: `kill_results_tests.rs`, on this world.
//!
//! What the world mirrors, storage point by storage point (a point is a place a kill may land:
//! everything stored before it survives, everything in memory is lost):
//! - [`World::commit`]: `GateStorage::commit`, one point: `GateStorage::save` (the record row,
//!   as JSON, with its history) for a step that is [`Save::Durable`] or carries history rows,
//!   and `GateStorage::sync_alarm` after it with `Alarm::Sync` (no await between the SQL write
//!   and `setAlarm`, so the runtime stores both or neither); a [`Save::MemoryOnly`] step stays
//!   in the instance's memory (`keep_in_memory`) and a kill loses it. A load reads the row back
//!   through its JSON and `Operation::as_loaded`.
//! - [`World::sync_alarm`]: the run's last `SetAlarm`, alone; skipped when this instance set
//!   that time.
//! - [`Destination::call`] (a point after each): the request reached the destination
//!   (`fetch::deliver` in `KeyAtDesk::send`, for `results.rs`' `send_effect` and
//!   `send_results`): a kill there loses its answer, whatever the destination did with it.
//! - the results' tables (`kill_results_tests.rs`): written by [`World::commit`] alone, as by
//!   `GateStorage::commit`: a step's progress with its transition's writes
//!   ([`crate::operation::gate::Step::results`]), in the record's write, a point also when the
//!   record is unchanged.
//!
//! The order of stores and awaits is the edge's: a command (`OperationGate::fetch`) is `step`
//! then `commit(Alarm::Sync)`; an alarm run (`alarm.rs`' `Run::perform`) spends the alarm,
//! asks the retired names (`ask_retired`), takes one results step, then works through
//! [`alarm::plan`]: an effect (`results::effect`, a batch of one through the results' own
//! plan, [`crate::results::plan::ResultsPlan::job`], performed as `kill_results_tests.rs`
//! performs a batch's: its turn at the desk, [`World::desk_turn`], a check or an ask; the claim
//! committed with its alarm on the record as stored; the call; the answer committed under the
//! token; the desk's report), alerts (`send_alert`), the upkeep (`settle_storage`), the alarm last. At every
//! outbound await (desk, destination, sink, ledger, counters, the file) a command may run
//! ([`World::interleave`]): a duplicate, a stale or out-of-order delivery, a poll, an
//! operator's redelivery. A kill in a command makes its sender send it again (Gemini retries
//! what was not answered 2xx, an operator's bulk run resumes); a kill in an alarm run makes the
//! runtime run the alarm again. The desk lets every attempt go, or (with
//! [`World::desk_waits`]) says `Wait` to an ask or a report and releases the key later
//! through `DestinationReady`, as a desk that found the destination open does.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde_json::{json, Map, Value};

use crate::operation::effect::{effect_message_id, EffectRequest};
use crate::operation::gate::alarm::{self, AlarmDone, AlarmWork, Upkeep};
use crate::operation::gate::desk_turn::{desk_turn, goes_now, granted, DeskTurn};
use crate::operation::gate::protocol::{GateCommand, GateReply};
use crate::operation::gate::{step as gate_step, GateLimits, Save, Step};
use crate::operation::lifecycle::{Source, Status};
use crate::operation::{DeskMark, OpEvent, Operation, PendingAlert, ResultsMode};
use crate::results::progress::Stored;
use crate::retry::{Backoff, PeerAnswer};
use crate::signature::Secret;

pub(super) const KEY: &str = "batches/k";
const DAY: i64 = 86_400_000;
pub(super) const LIMITS: GateLimits = GateLimits {
    retention_ms: 30 * DAY,
    stats_delay_ms: 1_000,
    claim_ttl_ms: 600_000,
    retry: Backoff::new(1_000, 60_000),
    unregistered_hold_ms: 0,
    confirm_interval_ms: 0,
    desk_fallback_ms: 60_000,
    effect_alert_after_ms: 3_600_000,
};
pub(super) const TIMEOUT_MS: i64 = 5_000;
/// The runtime runs an alarm whose run died again about this much later.
const RUNTIME_RETRY_MS: i64 = 2_000;
/// A sender whose delivery was not answered sends it again this much later.
const SENDER_RETRY_MS: i64 = 1_000;
/// How long an outbound await may last (a command due within it may run during it).
const AWAIT_MS: i64 = TIMEOUT_MS;
/// The world is quiet when nothing is due before this (retention is far later).
const QUIET_AFTER: i64 = 10 * DAY;

pub(super) fn secret() -> Secret {
    Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap()
}

/// The instance died: what it held in memory is gone.
#[derive(Debug)]
pub(super) struct Killed;
pub(super) type Run<T> = Result<T, Killed>;

/// A small deterministic generator (splitmix64) for answers and interleavings.
#[derive(Clone)]
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What the destination did with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answer {
    /// 2xx.
    Accept,
    /// 503, nothing done.
    Fail,
    /// Done, but the answer was lost (the gate sees a timeout).
    Lost,
    /// 429 with `Retry-After: 3`, nothing done.
    Throttle,
    /// 422: refused for good.
    Refuse,
}

/// The destination: every request's (`webhook-id`, body), and what it accepted.
pub(super) struct Destination {
    seed: u64,
    /// Whether it may refuse (else it only fails, throttles, loses answers and accepts).
    refuses: bool,
    pub(super) requests: Vec<(String, String)>,
    tries: BTreeMap<String, u32>,
    /// Requests it acted on, by id (a repeat under one id is one effect to a receiver).
    pub(super) accepted: BTreeMap<String, u32>,
    /// The last answer each id got.
    pub(super) last: BTreeMap<String, Answer>,
    /// Each request's answer, in the order of `requests`.
    pub(super) answers: Vec<Answer>,
}

impl Destination {
    fn new(seed: u64, refuses: bool) -> Destination {
        Destination {
            seed,
            refuses,
            requests: Vec::new(),
            tries: BTreeMap::new(),
            accepted: BTreeMap::new(),
            last: BTreeMap::new(),
            answers: Vec::new(),
        }
    }

    /// The `k`th request under `id` gets a seeded answer; from the fifth on it accepts (so
    /// every run ends), unless it refuses everything (seed 0 with refusals).
    fn answer(&self, id: &str, k: u32) -> Answer {
        if self.refuses && self.seed == 0 {
            return Answer::Refuse;
        }
        if k >= 5 {
            return Answer::Accept;
        }
        let mut rng = Rng::new(self.seed ^ u64::from(k).wrapping_mul(31));
        for b in id.bytes() {
            rng.0 = rng.0.wrapping_mul(131).wrapping_add(u64::from(b));
        }
        let table: &[Answer] = match self.refuses {
            true => &[Answer::Accept, Answer::Fail, Answer::Lost, Answer::Refuse],
            false => &[Answer::Accept, Answer::Fail, Answer::Lost, Answer::Throttle],
        };
        table[rng.below(table.len() as u64) as usize]
    }

    /// One request: recorded, acted on or not, and the answer the gate gets.
    pub(super) fn call(&mut self, request: &EffectRequest) -> PeerAnswer {
        let id = webhook_id(request);
        let k = self.tries.entry(id.clone()).or_default();
        *k += 1;
        let k = *k;
        let answer = self.answer(&id, k);
        self.requests.push((id.clone(), request.body.clone()));
        self.last.insert(id.clone(), answer);
        self.answers.push(answer);
        if matches!(answer, Answer::Accept | Answer::Lost) {
            *self.accepted.entry(id).or_default() += 1;
        }
        let http = |status: u16, retry_after: Option<&str>| PeerAnswer::Http {
            status,
            body: String::new(),
            retry_after: retry_after.map(str::to_string),
        };
        match answer {
            Answer::Accept => http(200, None),
            Answer::Fail => http(503, None),
            Answer::Lost => PeerAnswer::Timeout,
            Answer::Throttle => http(429, Some("3")),
            Answer::Refuse => http(422, None),
        }
    }
}

pub(super) fn webhook_id(request: &EffectRequest) -> String {
    let id = request.headers.iter().find(|(h, _)| *h == "webhook-id");
    id.map(|(_, v)| v.clone()).expect("a webhook-id")
}

/// What a step stores beside the record (`results_store::Beside`): nothing, or a batch's
/// results' progress (`kill_results_tests.rs`); true when it stored something.
pub(super) trait Beside {
    fn store(self, world: &mut World) -> bool;
}

impl Beside for () {
    fn store(self, _: &mut World) -> bool {
        false
    }
}

/// Whether a committed step sets the alarm (`storage::Alarm`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Alarm {
    Sync,
    Deferred,
}

/// The world outside the gate's steps.
pub(super) struct World {
    // Storage: survives a kill.
    stored: Option<String>,
    /// What `stored` holds, to compare the next write with.
    stored_op: Option<Operation>,
    history_rows: usize,
    alarm: Option<i64>,
    /// The results' tables: the progress and its failure rows.
    pub(super) tables: Stored,
    // The instance: lost on a kill.
    cache: Option<Option<Operation>>,
    alarm_known: Option<i64>,
    pub(super) desk_clear: bool,
    // Outside.
    /// Whether the desk may say `Wait` (and release later).
    pub(super) desk_waits: bool,
    pub(super) clock: i64,
    pub(super) dest: Destination,
    pub(super) alerts_sent: Vec<String>,
    commands: VecDeque<(i64, GateCommand)>,
    in_flight: Option<GateCommand>,
    pub(super) rng: Rng,
    pub(super) file: Vec<u8>,
    /// Reads of the results file that answer 404 before it is there.
    pub(super) file_missing: u32,
    // Kills.
    pub(super) points: usize,
    kill_at: Option<usize>,
    pub(super) kills: usize,
    /// Every status the stored record held, in order.
    pub(super) statuses: Vec<Status>,
    /// Each new instance reads the record as the build before the results' own due time
    /// stored it (a deploy at every kill): [`as_stored_before`].
    pub(super) stored_before: bool,
}

/// A record as the build before the results' own due time stored it: results owed kept their
/// due time in the job effect's `next_attempt_ms`, and `results_retry_at_ms` only for an
/// operator's retry after the job's effect.
fn as_stored_before(text: &str) -> String {
    let mut v: Value = serde_json::from_str(text).unwrap();
    let owed = serde_json::from_str::<Operation>(text)
        .unwrap()
        .results_owed();
    if let (true, Some(due)) = (
        owed,
        v.as_object_mut().unwrap().remove("results_retry_at_ms"),
    ) {
        v["effect"]["next_attempt_ms"] = due;
    }
    v.to_string()
}

impl World {
    pub(super) fn new(seed: u64, refuses: bool, kill_at: Option<usize>) -> World {
        World {
            stored: None,
            stored_op: None,
            history_rows: 0,
            alarm: None,
            tables: Stored::default(),
            cache: None,
            alarm_known: None,
            desk_clear: false,
            desk_waits: false,
            clock: 0,
            dest: Destination::new(seed, refuses),
            alerts_sent: Vec::new(),
            commands: VecDeque::new(),
            in_flight: None,
            rng: Rng::new(seed.wrapping_add(7)),
            file: Vec::new(),
            file_missing: 0,
            points: 0,
            kill_at,
            kills: 0,
            statuses: Vec::new(),
            stored_before: false,
        }
    }

    /// Queues a command its sender sends at `at` (kept in time order).
    pub(super) fn send_at(&mut self, at: i64, command: GateCommand) {
        let place = self.commands.iter().position(|(t, _)| *t > at);
        let place = place.unwrap_or(self.commands.len());
        self.commands.insert(place, (at, command));
    }

    /// A point where a kill may land.
    pub(super) fn point(&mut self) -> Run<()> {
        self.points += 1;
        match self.kill_at == Some(self.points) {
            true => Err(Killed),
            false => Ok(()),
        }
    }

    /// The record as stored, as a new instance reads it.
    pub(super) fn stored_record(&self) -> Option<Operation> {
        let text = self.stored.clone()?;
        let text = match self.stored_before {
            true => as_stored_before(&text),
            false => text,
        };
        Some(
            serde_json::from_str::<Operation>(&text)
                .unwrap()
                .as_loaded(),
        )
    }

    /// `GateStorage::load`: read once, then from memory.
    pub(super) fn load(&mut self) -> Option<Operation> {
        if self.cache.is_none() {
            self.cache = Some(self.stored_record());
        }
        self.cache.clone().flatten()
    }

    /// `GateStorage::save`: the record as JSON; the stored status never moves back. Not a
    /// point of its own: the commit that calls it is one.
    fn save(&mut self, op: &Operation) {
        if let Some(before) = &self.stored_op {
            never_rolled_back(before, op);
        }
        self.stored_op = Some(op.clone());
        if self.statuses.last() != Some(op.status()) {
            self.statuses.push(op.status().clone());
        }
        self.stored = Some(serde_json::to_string(op).unwrap());
        self.cache = Some(Some(op.clone()));
    }

    /// `GateStorage::sync_alarm` (the run's last `SetAlarm`): a point when it sets the alarm.
    pub(super) fn sync_alarm(&mut self, op: &Operation) -> Run<()> {
        match self.set_alarm(op) {
            true => self.point(),
            false => Ok(()),
        }
    }

    /// Sets the alarm for `op` unless this instance set that time; whether it wrote.
    fn set_alarm(&mut self, op: &Operation) -> bool {
        let wake = op.wake_at_ms(LIMITS.retention_ms, LIMITS.stats_delay_ms);
        if wake.is_some() && wake == self.alarm_known {
            return false;
        }
        self.alarm = wake;
        self.alarm_known = wake;
        true
    }

    /// `GateStorage::commit`: one point for what it stores. The record's row and the alarm
    /// are written with no await between them (the SQL write is synchronous and `setAlarm`
    /// is issued right after it), so the runtime commits them as one: a kill keeps both or
    /// neither.
    pub(super) fn commit<R, P: Beside>(
        &mut self,
        step: Step<R, P>,
        alarm: Alarm,
    ) -> Run<(Option<Operation>, R)> {
        assert!(!step.purge, "retention never ends in these runs");
        let rows = !step.history.is_empty();
        self.history_rows += step.history.len();
        // The results' progress, in the same write, whatever the record's save.
        let progress = step.results.is_some_and(|results| results.store(self));
        let mut wrote = true;
        match (&step.record, step.save) {
            (Some(op), Save::Durable) => self.save(op),
            (Some(op), Save::MemoryOnly | Save::Unchanged) if rows => self.save(op),
            (Some(op), Save::MemoryOnly) => {
                self.cache = Some(Some(op.clone()));
                wrote = false;
            }
            _ => wrote = false,
        }
        if step.reset_alarm {
            self.alarm_known = None;
        }
        let changed = step.save != Save::Unchanged || step.reset_alarm;
        if let (Some(op), true, Alarm::Sync) = (&step.record, changed, alarm) {
            wrote |= self.set_alarm(op);
        }
        if wrote || progress {
            self.point()?;
        }
        Ok((step.record, step.reply))
    }

    /// `Run::apply`: commits an alarm step (its tally goes to the isolate, not modelled).
    fn apply(
        &mut self,
        step: Step<AlarmDone>,
        fallback: Operation,
        alarm: Alarm,
    ) -> Run<Operation> {
        let (op, _) = self.commit(step, alarm)?;
        Ok(op.unwrap_or(fallback))
    }

    /// `OperationGate::fetch` for a command.
    fn command(&mut self, command: GateCommand) -> Run<GateReply> {
        self.in_flight = Some(command.clone());
        if let GateCommand::RetryResults { reason, .. } = &command {
            let reply = self.retry_results(reason.clone())?;
            self.in_flight = None;
            return Ok(reply);
        }
        let mut command = command;
        command.limit_new_records(self.clock - LIMITS.retention_ms);
        command.limit_alerts(LIMITS.effect_alert_after_ms);
        let record = self.load();
        let step = gate_step(record, command, self.clock);
        let (_, reply) = self.commit(step, Alarm::Sync)?;
        self.in_flight = None;
        Ok(reply)
    }

    /// An outbound await: the next command, when it is due within [`AWAIT_MS`], may arrive
    /// meanwhile (seeded).
    pub(super) fn interleave(&mut self) -> Run<()> {
        if self.in_flight.is_some() || self.rng.below(3) != 0 {
            return Ok(());
        }
        match self.commands.front() {
            Some((at, _)) if *at <= self.clock + AWAIT_MS => {
                let (_, command) = self.commands.pop_front().unwrap();
                self.command(command).map(|_| ())
            }
            _ => Ok(()),
        }
    }

    /// The instance died: memory is lost; the command it was answering is sent again, and an
    /// alarm run is run again by the runtime.
    fn killed(&mut self, in_alarm: bool) {
        self.kills += 1;
        self.cache = None;
        self.alarm_known = None;
        self.desk_clear = false;
        // An operator's retry of results whose answer was lost is not sent again: sent twice,
        // it is two retries (each may take what the other's sends parked again).
        let command = self.in_flight.take();
        if let Some(command) = command.filter(|c| !matches!(c, GateCommand::RetryResults { .. })) {
            self.send_at(self.clock + SENDER_RETRY_MS, command);
        }
        if in_alarm {
            let retry = self.clock + RUNTIME_RETRY_MS;
            self.alarm = Some(self.alarm.map_or(retry, |a| a.min(retry)));
        }
    }

    /// Runs commands and alarms in time order until nothing is due before [`QUIET_AFTER`].
    pub(super) fn run(&mut self) {
        let mut same_time = (0, 0);
        for _ in 0..20_000 {
            let command_at = self.commands.front().map(|(at, _)| *at);
            let alarm_at = self.alarm.filter(|at| *at < QUIET_AFTER);
            match (command_at, alarm_at) {
                (None, None) => return,
                (Some(c), a) if a.is_none_or(|a| c <= a) => {
                    self.clock = self.clock.max(c);
                    let (_, command) = self.commands.pop_front().unwrap();
                    if self.command(command).is_err() {
                        self.killed(false);
                    }
                }
                (_, a) => {
                    self.clock = self.clock.max(a.expect("an alarm comes first"));
                    // A run that sets the alarm at once again must be making progress.
                    same_time = match same_time.0 == self.clock {
                        true => (self.clock, same_time.1 + 1),
                        false => (self.clock, 1),
                    };
                    let at = self.clock;
                    assert!(same_time.1 < 100, "the alarm fires again and again at {at}");
                    if self.alarm_run().is_err() {
                        self.killed(true);
                    }
                }
            }
        }
        panic!("the world never went quiet");
    }

    /// `Run::perform`.
    fn alarm_run(&mut self) -> Run<()> {
        // The alarm that woke the object is spent.
        self.alarm = None;
        self.alarm_known = None;
        let Some(op) = self.load() else {
            return Ok(());
        };
        assert!(alarm::retire_if_over(&op, self.clock, &LIMITS).is_none());
        let op = self.ask_retired(op)?;
        let mut op = self.results_step(op)?;
        let mut plan = alarm::plan(&op, self.clock, &LIMITS);
        while let Some(work) = plan.next(&op, self.clock, &LIMITS, false) {
            op = match work {
                AlarmWork::Retire(_) | AlarmWork::Confirm(_) => unreachable!("not in these runs"),
                AlarmWork::SendAlert { alert, .. } => self.send_alert(op, &alert)?,
                AlarmWork::Effect => self.effect_step(op)?,
                AlarmWork::Upkeep { record, upkeep } => self.upkeep(*record, *upkeep)?,
                AlarmWork::SetAlarm => {
                    self.sync_alarm(&op)?;
                    op
                }
            };
        }
        Ok(())
    }

    /// `Run::ask_retired`: a record a delivery created asks the retired names (never retired
    /// here); the answer is kept in memory.
    fn ask_retired(&mut self, op: Operation) -> Run<Operation> {
        if !op.retired_unasked() {
            return Ok(op);
        }
        self.interleave()?;
        let mut current = self.load().unwrap_or(op);
        current.retired_asked();
        self.cache = Some(Some(current.clone()));
        Ok(current)
    }

    /// `Run::send_alert`: the sink accepts three times in four.
    fn send_alert(&mut self, op: Operation, alert: &PendingAlert) -> Run<Operation> {
        let sent = self.rng.below(4) != 0;
        if sent {
            self.alerts_sent.push(alert.kind.as_str().to_string());
        }
        self.interleave()?;
        let current = self.load().unwrap_or(op);
        let step = alarm::alert_sent(current.clone(), alert, sent, self.clock, &LIMITS, 0.5);
        self.apply(step, current, Alarm::Deferred)
    }

    /// `KeyAtDesk::turn` (`desk_turn.rs`), the one turn of the job's effect (`ready`: 1) and a
    /// batch's results: a fresh isolate's first send checks the desk, a retry asks it (an
    /// await either way), and the desk grants all or says wait (`Err(paused)`). Returns the
    /// turn, whether the desk was called, and how many go.
    pub(super) fn desk_turn(
        &mut self,
        mark: Option<DeskMark>,
        ready: u32,
        retry: bool,
    ) -> Run<Result<(DeskTurn, bool, u32), bool>> {
        let turn = desk_turn(mark, false, false, retry);
        let checked = ready > 0 && turn == DeskTurn::None && !self.desk_clear;
        if checked {
            self.desk_clear = true;
            self.interleave()?;
        }
        let n = match (ready, goes_now(turn, false, ready)) {
            (0, _) => 0,
            (_, Some(n)) => n,
            (_, None) => match self.desk_says_wait()? {
                Some(paused) => return Ok(Err(paused)),
                None => granted(ready, Some(ready)),
            },
        };
        Ok(Ok((turn, turn == DeskTurn::Ask || checked, n)))
    }

    /// A call to the destination's desk (an ask or a report): an await, after which it says
    /// `Wait` (`Some(false)`) or `Paused` (`Some(true)`) one time in three when
    /// [`World::desk_waits`], and releases the key (a probe or not) within half a minute (the
    /// destination recovered, or an operator resumed it), as `DestinationReady`.
    pub(super) fn desk_says_wait(&mut self) -> Run<Option<bool>> {
        self.desk_clear = true;
        self.interleave()?;
        if !self.desk_waits || self.rng.below(3) != 0 {
            return Ok(None);
        }
        let at = self.clock + 1_000 + self.rng.below(30_000) as i64;
        let probe = self.rng.below(2) == 0;
        self.send_at(at, GateCommand::DestinationReady { probe });
        Ok(Some(self.rng.below(4) == 0))
    }

    /// `Run::settle_storage`: the flush and the ledger write (each fails one time in four).
    fn upkeep(&mut self, op: Operation, upkeep: Upkeep) -> Run<Operation> {
        if upkeep.sealed.is_some() {
            self.cache = Some(Some(op.clone()));
        }
        let result = |world: &mut World| match world.rng.below(4) {
            0 => Err("unavailable".to_string()),
            _ => Ok(()),
        };
        let flushed = upkeep.sealed.map(|_| result(self));
        let written = upkeep.projection.as_ref().map(|_| result(self));
        self.interleave()?;
        let current = self.load().unwrap_or(op);
        let step = alarm::upkeep_done(current.clone(), &upkeep, flushed, written, self.clock);
        self.apply(step, current, Alarm::Sync)
    }
}

/// Invariant 2 on what is stored: the status never moves back and a terminal one absorbs;
/// the effect's generation and fence only grow; a generation done stays done.
fn never_rolled_back(before: &Operation, after: &Operation) {
    let (b, a) = (before.status(), after.status());
    assert!(a.rank() >= b.rank(), "status moved back: {b:?} to {a:?}");
    assert!(!b.is_terminal() || a == b, "terminal {b:?} became {a:?}");
    let (be, ae) = (before.effect(), after.effect());
    assert!(ae.generation() >= be.generation(), "generation moved back");
    assert!(ae.fence() >= be.fence(), "fence moved back");
    if be.done() && ae.generation() == be.generation() {
        assert!(ae.done(), "a generation done became not done");
    }
}

pub(super) fn event(status: Status, update_time_ms: i64, source: Source) -> OpEvent {
    let mut details = Map::new();
    if status == Status::Succeeded {
        details.insert("output_file_uri".into(), json!("files/out"));
    }
    OpEvent {
        status,
        update_time_ms,
        source,
        details,
        delivery_id: Some(format!("d{update_time_ms}")),
    }
}

pub(super) fn deliver(status: Status, update_time_ms: i64, source: Source) -> GateCommand {
    GateCommand::Deliver {
        key: KEY.into(),
        name: KEY.into(),
        event: event(status, update_time_ms, source),
        require_registration: false,
        hold_ms: 0,
        new_not_before_ms: 0,
    }
}

pub(super) fn register(results: ResultsMode) -> GateCommand {
    GateCommand::Register {
        key: KEY.into(),
        name: KEY.into(),
        kind: Some("billing".into()),
        user_metadata: None,
        results: Some(results),
        by: None,
    }
}

/// A completion delivered the ways it can be: registered (or not, when `registered` is
/// false: the webhook comes first), running, succeeded by webhook, then in a seeded order
/// and at seeded times a duplicate, the poller's copy, a stale `RUNNING` and a later `FAILED`
/// (dropped: the first terminal wins).
pub(super) fn completion(world: &mut World, registered: bool, results: ResultsMode) {
    if registered {
        world.send_at(0, register(results));
    }
    world.send_at(10, deliver(Status::Running, 100, Source::Webhook));
    world.send_at(20, deliver(Status::Succeeded, 200, Source::Webhook));
    let late = [
        deliver(Status::Succeeded, 200, Source::Webhook),
        deliver(Status::Succeeded, 200, Source::Reconcile),
        deliver(Status::Running, 100, Source::Webhook),
        deliver(Status::Failed, 300, Source::Webhook),
    ];
    for command in late {
        // FAILED never before SUCCEEDED's retries (a sender retries after a second).
        let at = 5_000 + world.rng.below(120_000) as i64;
        world.send_at(at, command);
    }
}

/// The job's requests (not a result's), by `webhook-id`, with every body each carried.
pub(super) fn job_requests(world: &World) -> BTreeMap<String, BTreeSet<String>> {
    let mut by_id: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (id, body) in world
        .dest
        .requests
        .iter()
        .filter(|(id, _)| id.starts_with("msg_"))
    {
        by_id.entry(id.clone()).or_default().insert(body.clone());
    }
    by_id
}

/// Every request under one id carried one body.
pub(super) fn one_body_per_id(world: &World, label: &str) {
    let mut bodies: BTreeMap<&str, &str> = BTreeMap::new();
    for (id, body) in &world.dest.requests {
        let first = bodies.entry(id).or_insert(body);
        assert_eq!(first, body, "{label}: two bodies under {id}");
    }
}

/// Requests sent again under an id whose last request got a 2xx: only what a kill left in
/// doubt (its answer lost with the instance) is, so none in a clean run.
pub(super) fn resent_after_2xx(world: &World) -> usize {
    let mut last: BTreeMap<&str, Answer> = BTreeMap::new();
    let mut resent = 0;
    for ((id, _), answer) in world.dest.requests.iter().zip(&world.dest.answers) {
        resent += usize::from(last.get(id.as_str()) == Some(&Answer::Accept));
        last.insert(id, *answer);
    }
    resent
}

/// The job's effect ended accepted under generation 1 (or `generations`, with an operator's
/// redelivery), or parked with its alert sent; the stored record says the same.
pub(super) fn job_kept_its_promises(world: &World, generations: &[u32], label: &str) {
    one_body_per_id(world, label);
    // The job's one request in doubt at the kill, at most, or one chunk of a batch's results.
    let in_doubt = if world.file.is_empty() { 1 } else { 7 };
    let resent = resent_after_2xx(world);
    assert!(
        resent <= world.kills * in_doubt,
        "{label}: {resent} sent again after a 2xx"
    );
    let ids: BTreeSet<String> = generations
        .iter()
        .map(|g| effect_message_id(KEY, *g))
        .collect();
    let sent: BTreeSet<String> = job_requests(world).into_keys().collect();
    assert!(
        sent.is_subset(&ids),
        "{label}: a job id not asked for: {sent:?}"
    );
    let op = world.stored_record().expect("a record");
    assert!(op.status().is_terminal(), "{label}: {:?}", op.status());
    let last = effect_message_id(KEY, op.effect().generation());
    let asked = generations.last().map(|g| effect_message_id(KEY, *g));
    assert_eq!(asked, Some(last.clone()), "{label}: generation");
    match op.effect().parked() {
        None => {
            assert!(
                op.effect().done(),
                "{label}: effect neither done nor parked"
            );
            let accepted = world.dest.accepted.get(&last).copied().unwrap_or(0);
            assert!(accepted >= 1, "{label}: done but never accepted");
        }
        Some(_) => {
            assert_eq!(world.dest.last.get(&last), Some(&Answer::Refuse), "{label}");
            assert!(
                world.alerts_sent.iter().any(|a| a == "effect_failing"),
                "{label}: parked with no alert"
            );
        }
    }
    for generation in generations {
        let id = effect_message_id(KEY, *generation);
        let acted = world.dest.accepted.contains_key(&id)
            || world.dest.last.get(&id) == Some(&Answer::Refuse);
        assert!(
            acted,
            "{label}: generation {generation} never accepted nor refused"
        );
    }
    let terminal: Vec<&Status> = world.statuses.iter().filter(|s| s.is_terminal()).collect();
    assert!(
        terminal.windows(2).all(|w| w[0] == w[1]),
        "{label}: {terminal:?}"
    );
}

/// A clean run of `scenario` for `seed`, then one killed at each of its points: `check` holds
/// for every one. Returns how many points the clean run had.
pub(super) fn killed_everywhere(
    seed: u64,
    refuses: bool,
    scenario: impl Fn(&mut World),
    check: impl Fn(&World, &str),
) -> usize {
    let mut clean = World::new(seed, refuses, None);
    scenario(&mut clean);
    clean.run();
    check(&clean, &format!("seed {seed}, clean"));
    for kill_at in 1..=clean.points {
        let mut world = World::new(seed, refuses, Some(kill_at));
        scenario(&mut world);
        world.run();
        assert_eq!(world.kills, 1, "seed {seed}: the kill at {kill_at} landed");
        check(&world, &format!("seed {seed}, kill at {kill_at}"));
    }
    clean.points
}

#[test]
fn a_job_killed_at_every_storage_point_is_accepted_under_one_id_with_one_body() {
    let mut points = 0;
    for seed in 1..=8 {
        // Unregistered (the webhook first) one time in four; the desk may say wait with odd
        // seeds.
        let registered = seed % 4 != 0;
        let scenario = |w: &mut World| {
            w.desk_waits = seed % 2 == 1;
            completion(w, registered, ResultsMode::None)
        };
        let check = |w: &World, label: &str| job_kept_its_promises(w, &[1], label);
        points += killed_everywhere(seed, false, scenario, check);
    }
    assert!(points > 8 * 10, "{points} points");
}

#[test]
fn a_job_its_destination_may_refuse_killed_anywhere_ends_accepted_or_parked_and_alerted() {
    for seed in 0..=6 {
        let scenario = |w: &mut World| {
            w.desk_waits = seed % 3 == 0;
            completion(w, true, ResultsMode::None)
        };
        let check = |w: &World, label: &str| job_kept_its_promises(w, &[1], label);
        killed_everywhere(seed, true, scenario, check);
    }
    // Seed 0 refuses everything: parked at its first answer, its one id asked once per
    // claim at most.
    let mut world = World::new(0, true, None);
    completion(&mut world, true, ResultsMode::None);
    world.run();
    assert!(world.stored_record().unwrap().effect().parked().is_some());
    assert_eq!(world.dest.requests.len(), 1);
}

/// An operator's redelivery (a bulk run's, with its cut-off, so its sender may send it again
/// after a kill) sends generation 2 once it is asked; nothing else is ever sent under a new id.
#[test]
fn an_operator_redelivery_killed_anywhere_adds_exactly_one_generation() {
    for seed in 1..=4 {
        let scenario = |w: &mut World| {
            completion(w, true, ResultsMode::None);
            let redeliver = GateCommand::Redeliver {
                reason: "asked".into(),
                sent_before_ms: Some(DAY),
                by: None,
            };
            w.send_at(DAY, redeliver);
        };
        let check = |w: &World, label: &str| job_kept_its_promises(w, &[1, 2], label);
        killed_everywhere(seed, false, scenario, check);
    }
}

/// A claim whose attempt died lapses; the desk then says wait (a retry asks it): the gate must
/// sleep until the desk's release or its fallback, not wake again and again at the lapsed
/// claim's expiry, now past (an alarm run and an alarm write each time, for as long as the
/// wait lasts: a minute, or an operator's pause).
#[test]
fn a_lapsed_claim_told_to_wait_by_the_desk_does_not_wake_the_gate_at_once() {
    let s = gate_step(None, register(ResultsMode::None), 0);
    let s = gate_step(
        s.record,
        deliver(Status::Succeeded, 200, Source::Webhook),
        10,
    );
    let (claim, s) = alarm::begin_attempt(s.record.unwrap(), 10, &LIMITS).unwrap();
    // The instance died during the call: the claim is stored, its answer lost.
    let lapsed = claim.expires_ms;
    let op = s.record.unwrap();
    let retry = op.effect().failures_in_row() > 0;
    assert_eq!(
        desk_turn(op.effect().desk(), false, false, retry),
        DeskTurn::Ask,
        "a retry asks the desk"
    );
    let s = alarm::wait_on_destination(op, lapsed, &LIMITS, false);
    assert_eq!(s.reply, AlarmDone::WaitsOnDestination(true));
    // The run's upkeep (counts, the ledger) done, the alarm is what the effect waits for.
    let mut op = s.record.unwrap();
    let upkeep = alarm::plan_upkeep(&mut op, lapsed, &LIMITS);
    let s = alarm::upkeep_done(op, &upkeep, Some(Ok(())), Some(Ok(())), lapsed);
    let wake = s.wake_at(&LIMITS).unwrap();
    assert_eq!(
        wake,
        lapsed + LIMITS.desk_fallback_ms,
        "woken at {wake} (now {lapsed})"
    );
}

#[test]
fn the_world_reads_back_what_it_stored_and_loses_only_memory() {
    let mut world = World::new(1, false, None);
    world.send_at(0, register(ResultsMode::None));
    world.run();
    let op = world.stored_record().unwrap();
    assert_eq!(op.status(), &Status::Pending);
    assert_eq!(
        json!(op.view()["key"]),
        Value::String(KEY.into()),
        "stored through its JSON"
    );
    assert!(world.history_rows >= 1);
}
