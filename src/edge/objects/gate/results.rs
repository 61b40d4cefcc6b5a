//! A `"results": "each"` batch's results, driven by its gate's alarm: one step of
//! [`crate::results::progress::Progress`] per run, performed here.
//!
//! Guarantees: nothing here decides (the progress does, and [`crate::results::marks`] each write:
//! a chunk's claim, its or the rows' commit, a failed read, what goes on the record); this reads,
//! sends, and commits what those return. Every write of the progress is a gate step's (but the
//! move of one an earlier version stored, `results_store.rs`), committed with the record in one
//! storage write (the record unchanged when only the progress moved): a chunk's claim is stored
//! before any of its results is sent, and its commit (the counts and the rows of the results not
//! delivered, with `/metrics`' count and a destination's `Retry-After` hold) after every answer; a
//! waiting row is sent again as it is stored (a kill before its answer is stored sends it again).
//! Each result is signed under its one `webhook-id` ([`crate::results::body::result_message_id`]).
//! While work remains the results' due time stays past, so the alarm fires again at once; a wait
//! (a file not there yet, rows backing off, a destination that asked to wait, the desk's queue)
//! moves it, in the step's own commit. How many a step sends is its turn at
//! the destination's desk, the job's effect's own (`desk_turn.rs`; the sends in
//! `results/sends.rs`); where the results are is asked in `results/locate.rs`; what a step commits
//! on the record is `results/marks.rs`. Only the alarm starts a step (never a duplicate delivery, a
//! poll or an operator's redeliver), one run at a time, from the stored progress; a desk's release
//! only makes it due.

use worker::{Env, Result};

use crate::config::Config;
use crate::destination::protocol::Sent;
use crate::operation::gate::GateLimits;
use crate::operation::Operation;
use crate::results::item::{from_piece, ResultItem, Source};
use crate::results::lines::Checkpoint;
use crate::results::marks::{self as on_record, Answers};
use crate::results::progress::{ChunkClaim, FileTrouble, Limits, Progress};
use crate::results::progress::{ProgressWrite, Sending, Step};
use crate::results::turn::reads_first;

use crate::edge::objects::gate::desk_turn::Turn;
use crate::edge::objects::gate::results_store::ResultsStore;
use crate::edge::objects::gate::storage::GateStorage;
use crate::edge::outbound::results_file::read_chunk;
use crate::edge::runtime::{now_ms, random_unit};

mod locate;
mod marks;
mod sends;

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
    // The alarm also runs for other work (a projection, counters, an alert): a wait the
    // results chose holds until it is over.
    if op.results_due_ms().is_none_or(|at| at > now_ms()) {
        return Ok(op);
    }
    let gate = super::limits(config);
    let limits = Limits {
        file_wait_ms: config.results.file_wait_secs * 1_000,
        retry: gate.retry,
        alert_after_ms: config.effect_alert_after_secs * 1_000,
    };
    let driver = Driver {
        env,
        storage,
        config,
        store: ResultsStore::new(storage),
        limits,
        gate,
    };
    driver.step(op).await
}

impl Driver<'_> {
    async fn step(&self, op: Operation) -> Result<Operation> {
        let now = now_ms();
        let stored = self.store.load()?;
        let since = stored.as_ref().map(|p| p.since_ms);
        let progress = match stored.filter(|p| !p.wants_locating()) {
            Some(p) => p,
            None => match self.begin(&op, now, since).await? {
                Ok(p) => p,
                // No status call yet (the budget said wait), or no answer: ask again then.
                Err(at) => return self.due_at(op, at).await,
            },
        };
        let released = op.effect().released();
        let step = match released {
            true => progress.next_released(now),
            false => progress.next(now),
        };
        if let (true, &Step::WaitUntil(at)) = (released, &step) {
            return self.release_unused(op, at).await;
        }
        // A file the last read could not give is tried first: a batch that cannot send takes
        // no turn at the desk (no place in its queue, no probe) until it can.
        let progress = match reads_first(&step, &progress.phase, released) {
            Some(from) => match self.file_check(progress, from).await? {
                (progress, None) => progress,
                (failed, Some(trouble)) => return self.read_failed(op, failed, trouble).await,
            },
            None => progress,
        };
        let turn = match step.sends() {
            Some((ready, retry)) => match self.turn(&op, ready as u32, retry).await? {
                Ok(turn) => turn,
                Err(paused) => {
                    // A pause's wait is no failure: the results' failing clocks stop.
                    let held = match paused {
                        true => ProgressWrite::held_by_pause(self.store.fresh(progress)?),
                        false => None,
                    };
                    return self.wait_on_destination(op, (paused, held)).await;
                }
            },
            None => Turn::default(),
        };
        // An operator's retry of parked results may have run during the desk's call.
        let progress = match turn.awaited {
            true => self.store.fresh(progress)?,
            false => progress,
        };
        match step {
            Step::WaitUntil(at) => self.due_at(op, at).await,
            Step::ReadChunk { from, .. } => self.chunk(op, progress, from, None, turn).await,
            Step::ResendChunk(c) => self.chunk(op, progress, c.from, Some(c), turn).await,
            Step::RetryRows(indexes) => self.retry_rows(op, progress, indexes, turn).await,
            alert @ (Step::Alert(_)
            | Step::AlertFailing(_)
            | Step::AlertSenders(_)
            | Step::SendersBack) => self.alert(op, progress, alert).await,
            Step::Settled(counts) => {
                let failing = progress.gave_up;
                let decide = |op| on_record::settled(op, counts, failing, now_ms());
                self.mark(op, decide).await
            }
        }
    }

    /// The results' next step is due at `at` (their own due time, stored when it moved).
    async fn due_at(&self, op: Operation, at: i64) -> Result<Operation> {
        self.mark(op, |op| on_record::due_at(op, at)).await
    }

    /// Reads the chunk that starts at `from`: its results, where it ends, and whether it is
    /// the last; or why the file could not be read.
    async fn read(
        &self,
        source: &Source,
        from: Checkpoint,
        max: u32,
    ) -> Result<std::result::Result<(Vec<ResultItem>, Checkpoint, bool), FileTrouble>> {
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

    /// Reads the first line of a file the last read could not give, before any turn at the
    /// desk: the progress as it then stands, and why the line did not come, when it did not,
    /// for the caller to commit as a chunk's failed read is (the desk hears nothing).
    async fn file_check(
        &self,
        p: Progress,
        from: Checkpoint,
    ) -> Result<(Progress, Option<FileTrouble>)> {
        let read = self.read(&p.source.clone(), from, 1).await?;
        Ok((self.store.fresh(p)?, read.err()))
    }

    /// Commits what a read that did not give the file decides ([`on_record::read_failed`]:
    /// the file asked for again on its backoff, the results due then; or parked).
    async fn read_failed(&self, op: Operation, p: Progress, t: FileTrouble) -> Result<Operation> {
        let limits = &self.limits;
        let decide = |op| on_record::read_failed(op, p, t, limits, (now_ms(), random_unit()));
        self.mark(op, decide).await
    }

    /// Commits the progress alone (the record unchanged).
    async fn store_progress(&self, op: Operation, progress: Progress) -> Result<Operation> {
        let write = ProgressWrite::of(progress);
        self.mark(op, |op| on_record::progress(op, write)).await
    }

    /// Reads a chunk from `from` (as many results as the desk let go), sends its results and
    /// commits them: the next chunk, claimed (stored) first; or the chunk `claimed`, found
    /// stored (a kill came between claim and commit), whose results are sent again under
    /// their same ids (in parts, when the desk lets fewer go than it holds: the rest stays
    /// claimed).
    async fn chunk(
        &self,
        op: Operation,
        progress: Progress,
        from: Checkpoint,
        claimed: Option<ChunkClaim>,
        turn: Turn,
    ) -> Result<Operation> {
        let read = self.read(&progress.source.clone(), from, turn.n).await?;
        let progress = self.store.fresh(progress)?;
        let (items, to, last) = match read {
            Err(trouble) => {
                let op = self.read_failed(op, progress, trouble).await?;
                return self.after_sends(op, turn, Sent::default()).await;
            }
            Ok(read) => read,
        };
        let (claim, items, reached) = match claimed {
            None => {
                let decide = |op| on_record::claimed(op, progress.clone(), to, last);
                let (_, claim) = self.decide(op.clone(), decide).await?;
                (claim, items, to)
            }
            Some(claim) => {
                let before_end = |i: &ResultItem| i.index < claim.to.index;
                let reached = std::cmp::min_by_key(claim.to, to, |c| c.index);
                let items = items.into_iter().filter(before_end).collect();
                (claim, items, reached)
            }
        };
        let answers = |answers| Answers::Chunk {
            chunk: claim.chunk,
            reached,
            answers,
        };
        self.send_and_commit(op, progress, items, turn, answers)
            .await
    }

    /// Sends the due rows again (as many as the desk let go): each waits under its id, so a
    /// kill before their answers are stored sends them again.
    async fn retry_rows(
        &self,
        op: Operation,
        progress: Progress,
        indexes: Vec<u64>,
        turn: Turn,
    ) -> Result<Operation> {
        let indexes = indexes.into_iter().take(turn.n as usize);
        let kept: Vec<_> = indexes.map(|i| self.store.kept(i)).collect::<Result<_>>()?;
        let items = kept.into_iter().flatten().collect();
        self.send_and_commit(op, progress, items, turn, Answers::Rows)
            .await
    }

    /// Sends `items` and commits what their answers decide ([`on_record::committed`]: a
    /// claimed chunk's or the rows', as `answers` names them), on the progress as stored after
    /// the sends, with `/metrics`' count and a destination's `Retry-After` on the record.
    async fn send_and_commit(
        &self,
        op: Operation,
        progress: Progress,
        items: Vec<ResultItem>,
        turn: Turn,
        answers: impl FnOnce(Vec<(ResultItem, Sending)>) -> Answers,
    ) -> Result<Operation> {
        let (sent_answers, sent) = self.send(&op, items, &turn.after_ms).await;
        let progress = self.store.fresh(progress)?;
        let (answers, wait) = (answers(sent_answers), sent.asked_wait_ms);
        let (to, limits) = (self.config.destination_label(op.kind()), &self.limits);
        let decide = |op| {
            let clock = (now_ms(), random_unit);
            on_record::committed(op, progress, answers, wait, &to, limits, clock)
        };
        let op = self.mark(op, decide).await?;
        self.after_sends(op, turn, sent).await
    }

    /// An alert raised or resolved on the record, marked on the progress in the same write:
    /// the file is parked (its one `results_file_parked`); results kept failing past the alert
    /// threshold and were parked (the batch's one `results_failing` of this spell, naming how
    /// many); the result senders answer nothing past the threshold (naming how many results
    /// wait), or answer again (`SendersBack`, the one other step handed here).
    async fn alert(&self, op: Operation, mut p: Progress, alert: Step) -> Result<Operation> {
        let age = self.limits.alert_after_ms / 1_000;
        let decide = |op| match alert {
            Step::Alert(reason) => on_record::file_parked(op, &mut p, &reason, now_ms()),
            Step::AlertFailing(n) => on_record::gave_up(op, &mut p, n, age, now_ms()),
            Step::AlertSenders(n) => on_record::senders(op, &mut p, Some(n), now_ms()),
            _ => on_record::senders(op, &mut p, None, now_ms()),
        };
        self.mark(op, decide).await
    }
}
