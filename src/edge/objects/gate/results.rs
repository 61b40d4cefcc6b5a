//! A `"results": "each"` batch's results, driven by its gate's alarm: one step of
//! [`crate::results::progress::Progress`] per run, its order [`ResultsPlan`]'s, performed here;
//! and the job's effect, a batch of one, through the same plan and this same loop
//! ([`ResultsPlan::job`]: its turn, its claim stored with the alarm at its expiry before its
//! one request leaves, `send_effect`, its answer committed under the claim's fencing token,
//! then the desk's report).
//!
//! Guarantees: nothing here decides (the plan orders the work, [`crate::results::marks`]
//! decides each write: a chunk's claim, its or the rows' commit, a failed read, what goes on
//! the record, the job's claim, answer or wait); this performs the plan's work in its order
//! (reads, the desk's turn, sends, commits) and tells it what each gave. Every write of the
//! progress is a gate step's (but the move of one an earlier version stored,
//! `results_store.rs`), committed with the record in one storage write (the record unchanged
//! when only the progress moved): a chunk's claim is stored before any of its results is
//! sent, and its commit (the counts and the rows of the results not delivered, with
//! `/metrics`' count and a destination's `Retry-After` hold) after every answer; a waiting
//! row is sent again as it is stored (a kill before its answer is stored sends it again). A
//! commit's decision is made on the record as stored then (commands may have run during the
//! step's awaits), at the clock's time then, with the edge's jitter; a results step's commit
//! leaves the alarm to the run's end, while the job's claim (the alarm at its expiry), its
//! wait, and an answer that leaves work owed set it with their write; the counts a commit
//! took out of the record go to the isolate's tally once it is stored. Results and the job's
//! effect go through one send ([`KeyAtDesk::send`]: more than one round trip's worth through
//! the gate's result senders, else from the gate itself), each result signed under its one
//! `webhook-id` ([`crate::results::body::result_message_id`]). While work remains the
//! results' due time stays past, so the alarm fires again at once; a wait (a file not there
//! yet, rows backing off, a destination that asked to wait, the desk's queue) moves it, in
//! the step's own commit. How many a step sends is its turn at the destination's desk, the
//! job's effect's own (`desk_turn.rs`); where the results are is asked in
//! `results/locate.rs`. Only the alarm starts a step (never a duplicate delivery, a poll or
//! an operator's redeliver), one run at a time, from the stored progress; a desk's release
//! only makes it due.

use worker::{Env, Result};

use crate::config::Config;
use crate::destination::protocol::Sent;
use crate::destination::sending::outcome;
use crate::operation::effect::{build_request, effect_message_id};
use crate::operation::gate::alarm::{Attempt, AttemptTarget};
use crate::operation::gate::GateLimits;
use crate::operation::{Claim, Operation};
use crate::results::body::{build_result_request, ResultHead};
use crate::results::item::{from_piece, ResultItem, Source};
use crate::results::lines::Checkpoint;
use crate::results::marks::{self as on_record, Claimed, Context, Marking};
use crate::results::plan::{Granted, Read, ResultsPlan, ResultsWork, Seen};
use crate::results::progress::{Limits, Sending};
use crate::retry::PeerAnswer;

use crate::edge::objects::call::status_backoff;
use crate::edge::objects::gate::desk_turn::{KeyAtDesk, Turn};
use crate::edge::objects::gate::results_store::ResultsStore;
use crate::edge::objects::gate::storage::{Alarm, GateStorage};
use crate::edge::objects::stats_shard;
use crate::edge::outbound::analytics;
use crate::edge::outbound::results_file::read_chunk;
use crate::edge::runtime::{now_ms, random_unit};

mod locate;

/// What a step performs with.
struct Driver<'a> {
    env: &'a Env,
    storage: &'a GateStorage,
    config: &'a Config,
    store: ResultsStore<'a>,
    limits: Limits,
    gate: GateLimits,
}

/// One step of the results of `op`, when they are running; `op` as it then stands.
pub(super) async fn step(
    env: &Env,
    storage: &GateStorage,
    config: &Config,
    op: Operation,
) -> Result<Operation> {
    let driver = driver(env, storage, config);
    match ResultsPlan::new(&op, now_ms(), driver.limits) {
        Some(plan) => driver.perform(plan, op).await,
        None => Ok(op),
    }
}

/// The job's effect of `op`, due: a batch of one, through the same plan; `op` as it then
/// stands.
pub(super) async fn effect(
    env: &Env,
    storage: &GateStorage,
    config: &Config,
    op: Operation,
) -> Result<Operation> {
    let driver = driver(env, storage, config);
    let plan = ResultsPlan::job(&op, driver.limits);
    driver.perform(plan, op).await
}

/// What a step performs with.
fn driver<'a>(env: &'a Env, storage: &'a GateStorage, config: &'a Config) -> Driver<'a> {
    let gate = super::limits(config);
    let limits = Limits {
        file_wait_ms: config.results.file_wait_secs * 1_000,
        retry: gate.retry,
        alert_after_ms: config.effect_alert_after_secs * 1_000,
    };
    Driver {
        env,
        storage,
        config,
        store: ResultsStore::new(storage),
        limits,
        gate,
    }
}

impl Driver<'_> {
    /// Performs the plan's work, one piece at a time, and tells it what each gave.
    async fn perform(&self, mut plan: ResultsPlan, op: Operation) -> Result<Operation> {
        // One desk for the step, the record's as the step found it: its turn, its report and
        // a release's tell go to the desk that gave the turn; so do a batch's sends (the job's
        // one request names the destination of the record as claimed: `send_effect`).
        let found = op.clone();
        let desk = KeyAtDesk::of(self.env, self.storage, self.config, &found);
        let (mut turn, mut seen) = (Turn::default(), Seen::Nothing);
        let mut op = op;
        while let Some(work) = plan.next(seen, now_ms()).map_err(|e| e.to_string())? {
            seen = match work {
                ResultsWork::LoadProgress => Seen::Progress(self.store.load()?),
                ResultsWork::Locate => Seen::Located(self.source_in_status(&op).await?),
                ResultsWork::BackOff(until) => {
                    status_backoff(self.env, self.storage.meter(), Some(until)).await;
                    Seen::Nothing
                }
                ResultsWork::Read { source, from, max } => {
                    Seen::Read(self.read(&source, from, max).await?)
                }
                ResultsWork::Turn { mark, ready, retry } => {
                    let granted = desk.turn(mark, ready, retry).await.map(|t| {
                        let (awaited, n) = (t.awaited, t.n);
                        turn = t;
                        Granted { awaited, n }
                    });
                    Seen::Turn(granted)
                }
                ResultsWork::LoadRows(indexes) => {
                    let kept = indexes.into_iter().map(|i| self.store.kept(i));
                    let kept: Vec<_> = kept.collect::<Result<_>>()?;
                    Seen::Items(kept.into_iter().flatten().collect())
                }
                ResultsWork::Send(items) => {
                    let after_ms = &turn.after_ms;
                    let (answers, sent) = self.send_results(&desk, &found, items, after_ms).await;
                    Seen::Sent(answers, sent)
                }
                ResultsWork::SendEffect(claim) => {
                    let (attempt, sent) = self.send_effect(&op, claim, &turn.after_ms).await;
                    Seen::Attempted(Box::new(attempt), sent)
                }
                ResultsWork::Commit(marking) => {
                    let claim;
                    (op, claim) = self.commit(op, marking).await?;
                    Seen::Committed(claim)
                }
                ResultsWork::Report(sent) => Seen::Told(desk.report(&turn, &sent).await),
                ResultsWork::Tell(at) => Seen::Told(desk.tell(at, Sent::default()).await),
                ResultsWork::LoadRecord => {
                    op = self.storage.load()?.unwrap_or(op);
                    Seen::Nothing
                }
            };
        }
        Ok(op)
    }

    /// Reads the chunk that starts at `from`: its results, where it ends, and whether it is
    /// the last; or why the file could not be read.
    async fn read(&self, source: &Source, from: Checkpoint, max: u32) -> Result<Read> {
        match source {
            Source::File { name } => {
                self.storage.meter().add(|u| u.outbound_fetches += 1);
                let read = read_chunk(self.config, name, from, max as usize).await;
                Ok(read.map(|(pieces, to, last)| {
                    let items = pieces.iter().map(|p| from_piece(p, name)).collect();
                    (items, to, last)
                }))
            }
            Source::Inline => {
                let (items, last) = self.store.inline_chunk(from.index, u64::from(max))?;
                let index = from.index + items.len() as u64;
                Ok(Ok((items, Checkpoint { offset: 0, index }, last)))
            }
        }
    }

    /// Sends the results of `op` (the record as the step found it) at its `desk` (the one that
    /// gave the turn), each no sooner than its time in `after_ms` on a paced route, through
    /// the one send the job's effect takes too ([`KeyAtDesk::send`]: the gate's result senders
    /// past one round trip's worth), and returns each one's outcome, in order, and how the
    /// sends went. A result whose sender answered nothing is [`Sending::Unanswered`]: retried
    /// under its same id, and no failure of the destination (neither its desk nor its counts
    /// hear of it).
    async fn send_results(
        &self,
        desk: &KeyAtDesk<'_>,
        op: &Operation,
        items: Vec<ResultItem>,
        after_ms: &[i64],
    ) -> (Vec<(ResultItem, Sending)>, Sent) {
        let secret = &self.config.effect_signing_secret;
        let now_secs = now_ms() / 1_000;
        let head = ResultHead::of(op);
        let requests: Vec<_> = items
            .iter()
            .map(|item| build_result_request(&head, item, secret, now_secs))
            .collect();
        let answered = desk.send(&requests, after_ms).await;
        let outcomes = items.into_iter().zip(answered.outcomes).collect();
        (outcomes, answered.sent)
    }

    /// The job's effect under `claim`: its one request, built from the record as claimed (`op`:
    /// it names the destination, a kind filled meanwhile included), through the same send, no
    /// sooner than its token on a paced route; returns how the attempt went (its analytics
    /// point written) and how the send went, as its desk hears it.
    async fn send_effect(&self, op: &Operation, claim: Claim, after_ms: &[i64]) -> (Attempt, Sent) {
        let config = self.config;
        let request = build_request(op, &config.effect_signing_secret, now_ms() / 1_000);
        let started_ms = now_ms();
        let desk = KeyAtDesk::of(self.env, self.storage, config, op);
        let mut answered = desk.send(&[request], after_ms).await;
        let outcome = match answered.outcomes.pop() {
            Some(Sending::Answered(outcome)) => outcome,
            // Never: one request sent from here has one answer.
            _ => outcome(&PeerAnswer::Timeout, config.effect_timeout_ms),
        };
        let target = AttemptTarget {
            destination: desk.label().to_string(),
            webhook_id: effect_message_id(op.key(), op.effect().generation()),
            http_status: answered.statuses.pop().flatten(),
        };
        let attempt = Attempt {
            claim,
            outcome,
            started_ms,
            asked_wait_ms: answered.sent.asked_wait_ms,
            finished_ms: answered.at_ms,
            target,
        };
        analytics::attempt(self.env, &attempt, op);
        (attempt, answered.sent)
    }

    /// Commits what `marking` makes of the record as stored now (else `op`), and returns it,
    /// with what it claimed, if anything; the counts the step took out of the record then go
    /// to the isolate's tally.
    async fn commit(
        &self,
        op: Operation,
        marking: Box<Marking>,
    ) -> Result<(Operation, Option<Claimed>)> {
        let current = self.storage.load()?.unwrap_or(op);
        let to = self.config.destination_label(current.kind());
        let cx = Context {
            limits: &self.limits,
            gate: &self.gate,
            to: &to,
        };
        let clock = (now_ms(), random_unit);
        let mut decided = on_record::decide(*marking, current.clone(), &cx, clock);
        let alarm = match decided.alarm_at_once {
            true => Alarm::Sync,
            false => Alarm::Deferred,
        };
        let tally = std::mem::take(&mut decided.step.tally);
        let (stored, ()) = self.storage.commit(decided.step, &self.gate, alarm).await?;
        if !tally.is_empty() {
            let every_ms = self.config.stats_flush_secs * 1_000;
            let (state, meter) = (self.storage.state(), self.storage.meter());
            stats_shard::hand_over(state, meter, self.env, &tally, now_ms(), every_ms).await;
        }
        Ok((stored.unwrap_or(current), decided.claimed))
    }
}
