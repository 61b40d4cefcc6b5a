//! The results' progress: a pure state machine the batch's gate and its alarm drive, one
//! claim of results at a time (a wave: a chunk for each result sender, `results::fanout`),
//! from durable state alone.
//!
//! Guarantees: a result's side effect is sent under one `webhook-id` only
//! ([`crate::results::body::result_message_id`]). A chunk is claimed (its byte and index ranges
//! stored) before any of its results is sent, and committed after its answers: a kill in between
//! resends its results under their same ids; a kill after the commit sends none of them again but
//! those kept as rows. A claim whose file fails waits on the file's backoff as a read does; a file
//! parked drops it, so an operator's retry reads its results again from its start, under their same
//! ids. An answer means for a result what it means for the job's effect, applied as to it
//! ([`crate::retry::item::apply`]), but a result failing past [`Limits::alert_after_ms`] is parked,
//! so the job's effect goes. A result parked (refused, at once; or failing past the threshold)
//! counts toward the batch's one alert of the spell (until an operator's retry), raised at the next
//! step and naming how many ([`Step::AlertFailing`]), never one per result. A result whose sender
//! answered nothing ([`Sending::Unanswered`]) runs the senders' clock instead: past the same
//! threshold, one alert for the batch naming how many wait ([`Step::AlertSenders`]), resolved once
//! a sender answers or none waits on one ([`Step::SendersBack`]); the results keep being sent. A
//! file missing after `SUCCEEDED` is asked for again with backoff for [`Limits::file_wait_ms`]
//! (once some of it was read, from its first trouble in a row), unless the batch ended more than
//! [`FILE_KEPT_MS`] ago; a file gone for good or unreadable parks the results with the reason and
//! one alert. The job's own effect is owed once the file is read (or parked) and no result is
//! waiting.
//!
//! Storage, in the batch's Durable Object: this value as one row, bounded whatever the keys' sizes
//! (never a result's key), and a failure row per result not delivered (waiting or parked): its
//! [`Row`] beside its result; a delivered result is counted, never stored. The waiting rows are
//! loaded into [`Progress::rows`] (at most [`MAX_WAITING`] before reading stops until they drain,
//! plus a wave), never stored in the value (one an earlier build stored with them reads them
//! there); a row keeps at most [`KEY_SHOWN_CHARS`] of its key and [`ERROR_KEPT_CHARS`] of its
//! error. Each transition returns its rows' [`Write`]s, stored in one transaction with the value.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::operation::AttemptOutcome;
use crate::results::item::{ResultItem, Source};
use crate::results::lines::Checkpoint;
use crate::retry::item::{apply, Item, Policy};
use crate::retry::{Backoff, Heard, Next, Run};

/// How a result's send ended ([`crate::destination::sending`]: the job's effect's too).
pub use crate::destination::sending::Sending;

/// How long a results file that answers 404 after `SUCCEEDED` is asked for again: Gemini can
/// report `SUCCEEDED` shortly before the file can be downloaded; far past the delays reported.
pub const FILE_WAIT_MS: i64 = 30 * 60 * 1_000;
/// How long Gemini keeps a batch's results file after the batch ended: a file that answers 404
/// past this is gone for good, parked at once rather than asked for during [`FILE_WAIT_MS`].
pub const FILE_KEPT_MS: i64 = 48 * 60 * 60 * 1_000;
/// Results waiting for a retry before no new chunk is read: a destination that fails
/// everything stops the reading instead of filling the object with rows.
pub const MAX_WAITING: usize = 400;
/// Results per chunk, the most one result sender is given: each one is a subrequest of the
/// sender's invocation; 40 stays within the Free plan's 50 subrequests per invocation. A step
/// claims up to [`WAVE_RESULTS`], a chunk for each sender.
pub const CHUNK_RESULTS: u64 = 40;
/// Result senders a step calls at once (`results::fanout`): each call counted as one of the
/// gate's own 6 connections, so the bound holds whether or not the platform counts it.
pub const SENDERS: usize = 6;
/// Results a step reads, claims and sends at most: a chunk for each sender, claimed and
/// committed together (one claim write and one commit write for all of them).
pub const WAVE_RESULTS: u64 = CHUNK_RESULTS * SENDERS as u64;
/// Results sent at once, per invocation (the gate, each result sender): production allows 6
/// simultaneous outgoing connections (workerd does not enforce it locally), and a request past
/// them waits inside the runtime, its own `EFFECT_TIMEOUT_MS` running.
pub const SENDS_IN_FLIGHT: usize = 6;
/// Delivered results counted for `/metrics` at a time on the happy path: the count is a write
/// of the record, so it goes once per 1,000 results, with a failure or a park, and when all
/// are settled; never once per chunk.
pub const METER_EVERY: u64 = 1_000;
/// Bytes of lines a step reads (its wave): held while it is sent, so this bounds memory.
pub const CHUNK_BYTES: u64 = 8 << 20;
/// Characters of a result's key a row keeps, to show it: a key may be as long as its line
/// (1 MiB), and [`MAX_WAITING`] rows of whole keys would pass SQLite's 2 MB row, failing the
/// commit after the sends. The whole key is in the kept result.
pub const KEY_SHOWN_CHARS: usize = 256;
/// Characters of an attempt's answer a row keeps (an answer's summary is about 200).
pub const ERROR_KEPT_CHARS: usize = 300;

/// `text`, cut to `max` characters (marked `…` when cut).
fn clipped(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// The tunables.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub file_wait_ms: i64,
    /// The job's backoff (the gate's [`crate::operation::gate::GateLimits::retry`]).
    pub retry: Backoff,
    /// A result failing this long (`EFFECT_ALERT_AFTER_SECONDS`) is parked at its next
    /// failure (after one retry at least), and the batch alerts once.
    pub alert_after_ms: i64,
}

/// Where the results stand.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "phase")]
pub enum Phase {
    /// The file answered 404 (or could not be reached) `failures` times; ask again then.
    WaitingForFile { failures: u32, next_at_ms: i64 },
    /// Chunks are being read and sent.
    #[default]
    Reading,
    /// Every line has been read; rows may still be retried.
    Read,
    /// The file is gone or unreadable: the unread results are parked with this reason.
    FileParked { reason: String },
}

/// The counts the job's effect carries as `results`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Counts {
    /// Results read (each line or item, blank lines aside).
    pub total: u64,
    /// Results whose effect a destination accepted.
    pub delivered: u64,
    /// Results that carry an error (Gemini's, or a line that could not be read).
    pub errors: u64,
    /// Results whose effect was refused and parked.
    pub parked: u64,
}

/// A chunk claimed and not yet committed: its results may have reached the destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkClaim {
    pub chunk: u64,
    pub from: Checkpoint,
    pub to: Checkpoint,
    /// Whether `to` is the end of the file.
    pub last: bool,
}

/// A result not delivered, its failure row: waiting to be retried, or parked (listed, retried
/// by an operator); its result is stored beside it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Row {
    pub result_key: String,
    pub index: u64,
    pub attempts: u32,
    pub last_error: String,
    /// When it may be sent again; `None` once parked (`last_error` says why).
    pub next_at_ms: Option<i64>,
    /// When its first failure was answered (since its last operator's retry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing_since_ms: Option<i64>,
    /// When its last attempt was answered (`last_error` is what answered): stored in the
    /// write that stores the failure, so it costs no write of its own. `None` in a row stored
    /// before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt_ms: Option<i64>,
    /// Its last send went through a result sender that answered nothing: it waits on the
    /// senders, whose clock ([`Progress::unanswered_since_ms`]) runs while any such row waits.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unanswered: bool,
}

impl Row {
    /// Whether it is parked (else it waits for a retry).
    pub fn parked(&self) -> bool {
        self.next_at_ms.is_none()
    }
}

/// A result as an answer changes it ([`apply`]): it counts its attempts at its answers
/// (a chunk cut short is sent again at once under its ids) and keeps its failing clock; a
/// delivered one is forgotten, so nothing on it changes.
impl Item for Row {
    fn run(&self) -> Run {
        let (attempts, failing_since_ms) = (self.attempts, self.failing_since_ms);
        Run {
            attempts,
            failing_since_ms,
        }
    }

    fn delivered(&mut self, _now_ms: i64) {}

    fn retry_at(&mut self, at_ms: i64, failing_since_ms: Option<i64>, why: &str) {
        self.failing_since_ms = failing_since_ms;
        self.last_error = clipped(why, ERROR_KEPT_CHARS);
        self.next_at_ms = Some(at_ms);
    }

    fn park(&mut self, why: &str, _now_ms: i64) {
        self.last_error = clipped(why, ERROR_KEPT_CHARS);
        self.next_at_ms = None;
    }

    fn give_up(&mut self, failing_ms: i64, why: &str, now_ms: i64) {
        let age = crate::operation::alert::human_age(failing_ms / 1_000);
        let why = format!("failing for {age}, {} attempts; last: {why}", self.attempts);
        self.park(&why, now_ms);
    }
}

/// A change to the failure rows, stored with the value in the same transaction.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// A result not delivered at its first attempt: its row, and its result to send again.
    Keep(Row, ResultItem),
    /// A row's new state (failed again, parked, waiting again); its result stays.
    Update(Row),
    /// A result delivered after a retry: its row and its result go (by index).
    Forget(u64),
}

/// What the edge does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Nothing until then.
    WaitUntil(i64),
    /// Open the file at `from` and read the next wave (claim number `chunk`, at most
    /// [`WAVE_RESULTS`] results), then claim it.
    ReadChunk { chunk: u64, from: Checkpoint },
    /// Read the claimed chunk again and send its results, then commit it.
    ResendChunk(ChunkClaim),
    /// Send these rows' stored results again (then finish each), by index.
    RetryRows(Vec<u64>),
    /// Raise the one alert for a parked file.
    Alert(String),
    /// Raise the spell's one alert for results parked (refused, or failing past the alert
    /// threshold): how many so far.
    AlertFailing(u64),
    /// Raise the alert that the result senders answered nothing past the alert threshold:
    /// how many results wait.
    AlertSenders(u64),
    /// Resolve that alert: a sender answered again, or no result waits on one.
    SendersBack,
    /// Every result is settled: the job's effect is owed with these counts.
    Settled(Value),
}

impl Step {
    /// How many results the step sends at most, and whether they are retries (which ask the
    /// destination's desk first); `None` when it sends none.
    pub fn sends(&self) -> Option<(u64, bool)> {
        match self {
            Step::ReadChunk { .. } => Some((WAVE_RESULTS, false)),
            Step::ResendChunk(claim) => Some((claim.to.index - claim.from.index, false)),
            Step::RetryRows(rows) => Some(((rows.len() as u64).min(WAVE_RESULTS), true)),
            _ => None,
        }
    }
}

/// A step's progress and its transition's writes to the failure rows: stored by the gate's
/// commit beside the record, in the same write (`Step::results`).
#[derive(Debug, Clone, PartialEq)]
pub struct ProgressWrite {
    pub progress: Progress,
    pub writes: Vec<Write>,
}

impl ProgressWrite {
    /// The progress alone, with no write to the failure rows.
    pub fn of(progress: Progress) -> ProgressWrite {
        let writes = Vec::new();
        ProgressWrite { progress, writes }
    }

    /// The progress with the failing clocks a pause stops, if any ran.
    pub fn held_by_pause(mut progress: Progress) -> Option<ProgressWrite> {
        let writes = progress.held_by_pause()?;
        Some(ProgressWrite { progress, writes })
    }
}

/// The results' progress for one operation.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Progress {
    pub source: Source,
    pub phase: Phase,
    /// Everything before this has been sent and committed.
    pub done_through: Checkpoint,
    pub chunks_done: u64,
    pub claim: Option<ChunkClaim>,
    pub counts: Counts,
    /// The results waiting for a retry, by index (unique: a file's keys may repeat): loaded
    /// from their failure rows, never stored in the value (a value an earlier build stored
    /// with them reads them here).
    #[serde(default, skip_serializing)]
    pub rows: BTreeMap<u64, Row>,
    /// When the results became owed (the operation's `SUCCEEDED`) or an operator reopened the
    /// file; once some of it was read, when its current run of troubles began: what
    /// [`Limits::file_wait_ms`] is counted from.
    pub since_ms: i64,
    /// When the batch ended, by Gemini's clock (its `endTime`, else its `updateTime`), when
    /// known: a file missing [`FILE_KEPT_MS`] after it is gone for good.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<i64>,
    /// The one alert for a parked file was raised.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub alerted: bool,
    /// The status answer could not say where the results are (the source is not known): once
    /// not parked, the step asks it again before anything else.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unlocated: bool,
    /// Results parked in this spell (since the last operator's retry): refused, or failing
    /// past the alert threshold; what the batch's one `results_failing` names.
    #[serde(default, skip_serializing_if = "crate::is_default")]
    pub gave_up: u64,
    /// Their one alert was raised.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub failing_alerted: bool,
    /// Results delivered and not yet counted for `/metrics` ([`Progress::meter`]).
    #[serde(default, skip_serializing_if = "crate::is_default")]
    pub unmetered: u64,
    /// Results whose sender answered nothing, not yet counted for `/metrics`.
    #[serde(default, skip_serializing_if = "crate::is_default")]
    pub unanswered: u64,
    /// Attempts the destination failed (retried, or given up), not yet counted for `/metrics`.
    #[serde(default, skip_serializing_if = "crate::is_default")]
    pub failed: u64,
    /// When the result senders began answering nothing: the first result a sender left
    /// unanswered since a sender last answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unanswered_since_ms: Option<i64>,
    /// Where the senders' alert stands.
    #[serde(default, skip_serializing_if = "crate::is_default")]
    pub senders_alert: SendersAlert,
}

/// The alert that a batch's result senders answer nothing (`results_sender_failing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SendersAlert {
    #[default]
    Quiet,
    /// Past the threshold: to raise.
    Due,
    Raised,
    /// Raised, and a sender answered since: to resolve.
    Resolve,
}

/// What a commit adds to `/metrics`' results by destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Metered {
    pub delivered: u64,
    /// Failed attempts (retried later).
    pub failed: u64,
    pub parked: u64,
    /// Results whose sender answered nothing (sent again later).
    pub unanswered: u64,
}

/// Why a download did not give the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileTrouble {
    /// 404: not there yet, or gone.
    Missing,
    /// Worth retrying (timeout, network, 5xx, 429).
    Unavailable(String),
    /// It will not get better (another 4xx, not a results file).
    Unreadable(String),
}

/// Whether an attempt may have reached the destination: every answer but a 2xx or a refusal
/// leaves that open (a timeout or a reset may come after the destination acted), so the
/// result is retried under its same `webhook-id`, never a new one.
#[cfg(test)]
pub fn may_have_reached(outcome: &AttemptOutcome) -> bool {
    matches!(outcome, AttemptOutcome::Retry(_))
}

impl Progress {
    /// The progress of a batch that just succeeded with `results: "each"`.
    pub fn begin(source: Source, now_ms: i64) -> Progress {
        Progress {
            source,
            since_ms: now_ms,
            ..Progress::default()
        }
    }

    /// What to do next at `now_ms`: a claimed chunk first (it may have reached the
    /// destination) unless its file waits for a retry, then the rows that are due, then the
    /// next chunk while few rows wait.
    pub fn next(&self, now_ms: i64) -> Step {
        let file_later =
            matches!(self.phase, Phase::WaitingForFile { next_at_ms, .. } if next_at_ms > now_ms);
        if let Some(claim) = self.claim.filter(|_| !file_later) {
            return Step::ResendChunk(claim);
        }
        if let (Phase::FileParked { reason }, false) = (&self.phase, self.alerted) {
            return Step::Alert(reason.clone());
        }
        if self.gave_up > 0 && !self.failing_alerted {
            return Step::AlertFailing(self.gave_up);
        }
        match self.senders_alert {
            // Past the threshold with results waiting (none: the gate sent them itself).
            SendersAlert::Due if !self.rows.is_empty() => {
                return Step::AlertSenders(self.rows.len() as u64)
            }
            SendersAlert::Resolve => return Step::SendersBack,
            _ => {}
        }
        let due: Vec<u64> = self
            .rows
            .iter()
            .filter(|(_, r)| r.next_at_ms.is_some_and(|at| at <= now_ms))
            .map(|(index, _)| *index)
            .collect();
        if !due.is_empty() {
            return Step::RetryRows(due);
        }
        let next_row = self.rows.values().filter_map(|r| r.next_at_ms).min();
        match (&self.phase, next_row) {
            (Phase::Reading | Phase::WaitingForFile { .. }, Some(at))
                if self.rows.len() >= MAX_WAITING =>
            {
                Step::WaitUntil(at)
            }
            (Phase::WaitingForFile { next_at_ms, .. }, _) if *next_at_ms > now_ms => {
                Step::WaitUntil(next_row.map_or(*next_at_ms, |at| at.min(*next_at_ms)))
            }
            (Phase::WaitingForFile { .. } | Phase::Reading, _) => Step::ReadChunk {
                chunk: self.chunks_done,
                from: self.done_through,
            },
            (_, Some(at)) => Step::WaitUntil(at),
            // Nothing waits for a sender any more: the senders' alert ends first.
            (_, None) if self.senders_alert == SendersAlert::Raised => Step::SendersBack,
            (_, None) => Step::Settled(self.job_results()),
        }
    }

    /// What to do next when the destination's desk released the batch: as [`Progress::next`],
    /// but a step that would wait sends the waiting result due soonest instead (its backoff is
    /// the desk's to cut short); it still waits when none waits (the file is not there yet).
    pub fn next_released(&self, now_ms: i64) -> Step {
        let due = |(index, row): (&u64, &Row)| row.next_at_ms.map(|at| (at, *index));
        match (self.next(now_ms), self.rows.iter().filter_map(due).min()) {
            (Step::WaitUntil(_), Some((_, index))) => Step::RetryRows(vec![index]),
            (step, _) => step,
        }
    }

    /// The job effect's `results`: the counts, and why the file was parked when it was.
    pub fn job_results(&self) -> Value {
        let c = self.counts;
        let mut out = json!({"total": c.total, "delivered": c.delivered, "errors": c.errors,
            "parked": c.parked});
        if let Phase::FileParked { reason } = &self.phase {
            out["file_parked"] = reason.clone().into();
        }
        out
    }

    /// The download did not give the file: wait and ask again, or park the results.
    pub fn file_failed(&mut self, trouble: FileTrouble, now_ms: i64, limits: &Limits, jitter: f64) {
        // Once some of the file was read, the wait runs from the first trouble in a row: a
        // file that fails after a long read is asked for again, not parked at once.
        let failures = match self.phase {
            Phase::WaitingForFile { failures, .. } => failures + 1,
            _ if self.chunks_done > 0 => {
                self.since_ms = now_ms;
                1
            }
            _ => 1,
        };
        let over = now_ms - self.since_ms >= limits.file_wait_ms;
        let expired = self
            .ended_ms
            .is_some_and(|ended| now_ms - ended >= FILE_KEPT_MS);
        let reason = match trouble {
            FileTrouble::Unreadable(why) => Some(why),
            FileTrouble::Missing if expired => Some(
                "results file not found (404): the batch ended more than 48 hours ago, \
                 and Gemini keeps results files 48 hours"
                    .to_string(),
            ),
            FileTrouble::Missing if over => Some("results file not found (404)".to_string()),
            FileTrouble::Unavailable(why) if over => Some(why),
            _ => None,
        };
        // Parked: a claim's results, never committed, are read again from `done_through` (its
        // start) by an operator's retry, under their same ids.
        self.claim = self.claim.filter(|_| reason.is_none());
        self.phase = match reason {
            Some(reason) => Phase::FileParked { reason },
            None => Phase::WaitingForFile {
                failures,
                next_at_ms: now_ms + limits.retry.jittered(failures, jitter),
            },
        };
    }

    /// The senders' alert was raised (`raised`), or resolved.
    pub fn senders_alert_marked(&mut self, raised: bool) {
        self.senders_alert = match raised {
            true => SendersAlert::Raised,
            false => SendersAlert::Quiet,
        };
    }

    /// Claims the chunk just read (`to` is where reading stopped): store this before sending.
    pub fn claim(&mut self, to: Checkpoint, last: bool) -> ChunkClaim {
        let claim = ChunkClaim {
            chunk: self.chunks_done,
            from: self.done_through,
            to,
            last,
        };
        self.phase = Phase::Reading;
        self.claim = Some(claim);
        claim
    }

    /// Commits the claimed chunk with each result's answer: counts move, and the results not
    /// delivered are kept. A commit for another chunk than the one claimed is ignored (a stale
    /// run's): `None`.
    #[cfg(test)]
    pub fn commit<O: Into<Sending>>(
        &mut self,
        chunk: u64,
        answers: Vec<(ResultItem, O)>,
        now_ms: i64,
        limits: &Limits,
        jitter: f64,
    ) -> Option<Vec<Write>> {
        let to = self.claim.filter(|c| c.chunk == chunk)?.to;
        self.commit_through(chunk, to, answers, now_ms, limits, jitter)
    }

    /// Commits the claimed chunk's results before `reached` (a claimed chunk sent again in
    /// parts, as its destination's desk lets them go): the rest stays claimed, from there.
    pub fn commit_through<O: Into<Sending>>(
        &mut self,
        chunk: u64,
        reached: Checkpoint,
        answers: Vec<(ResultItem, O)>,
        now_ms: i64,
        limits: &Limits,
        jitter: f64,
    ) -> Option<Vec<Write>> {
        let claim = self.claim.filter(|c| c.chunk == chunk)?;
        let mut writes = Vec::new();
        for (item, outcome) in answers {
            let outcome = outcome.into();
            self.counts.total += 1;
            self.counts.errors += u64::from(item.payload.is_error());
            let row = Row {
                result_key: clipped(&item.result_key, KEY_SHOWN_CHARS),
                index: item.index,
                ..Row::default()
            };
            if let Some(row) = self.settle(row, &outcome, now_ms, limits, jitter) {
                writes.push(Write::Keep(row, item));
            }
        }
        if reached.index < claim.to.index {
            self.claim = Some(ChunkClaim {
                from: reached,
                ..claim
            });
            self.done_through = reached;
            return Some(writes);
        }
        self.claim = None;
        self.done_through = claim.to;
        self.chunks_done += 1;
        if claim.last {
            self.phase = Phase::Read;
        }
        Some(writes)
    }

    /// Records an attempt's answer for a result (a new one, or a row's): the row as it then
    /// stands (waiting or parked), `None` once delivered.
    fn settle(
        &mut self,
        mut row: Row,
        outcome: &Sending,
        now_ms: i64,
        limits: &Limits,
        jitter: f64,
    ) -> Option<Row> {
        row.attempts += 1;
        row.last_attempt_ms = Some(now_ms);
        row.unanswered = false;
        self.rows.remove(&row.index);
        let heard = self.hear(&mut row, outcome, now_ms, limits);
        self.failed += u64::from(matches!(heard, Heard::Answer(AttemptOutcome::Retry(_), _)));
        // A result is given up past the threshold (parked, and the batch alerts once) rather
        // than the job's effect waiting behind it. Its `Retry-After` holds the whole batch
        // instead (`results::marks::committed`), since only a batch's step sends a row again.
        let policy = Policy {
            backoff: limits.retry,
            give_up_after_ms: Some(limits.alert_after_ms),
        };
        match apply(&mut row, heard, policy, now_ms, jitter) {
            Next::Delivered => {
                self.counts.delivered += 1;
                self.unmetered += 1;
                None
            }
            Next::RetryAt { .. } => {
                self.rows.insert(row.index, row.clone());
                Some(row)
            }
            // Parked (refused, at once; or given up): counted toward the batch's one
            // `results_failing` of this spell, raised at the next step, as the job's refused
            // effect alerts at once; one alert for the spell however many, never one per result.
            Next::Park(_) | Next::GaveUp { .. } => {
                self.counts.parked += 1;
                self.gave_up += 1;
                Some(row)
            }
        }
    }

    /// What the senders' clock makes of how a result's send ended, and what was heard.
    fn hear<'a>(
        &mut self,
        row: &mut Row,
        outcome: &'a Sending,
        now_ms: i64,
        limits: &Limits,
    ) -> Heard<'a> {
        let answer = match outcome {
            Sending::Answered(answer) | Sending::Carried(answer) => answer,
            Sending::Unanswered(why) => {
                // Not the destination's failure ([`Heard::Nothing`]). The senders' clock runs; past
                // the threshold (after one retry at least, as a failing result), the batch alerts.
                self.unanswered += 1;
                row.unanswered = true;
                let since = *self.unanswered_since_ms.get_or_insert(now_ms);
                let over = now_ms - since >= limits.alert_after_ms && row.attempts > 1;
                if over && self.senders_alert == SendersAlert::Quiet {
                    self.senders_alert = SendersAlert::Due;
                }
                return Heard::Nothing(why);
            }
        };
        // A sender carried it back: the senders answer. The gate sent it itself: their silence
        // ends only when no result waits on them any more (else an old spell's clock, left
        // running, would date a later silence from it).
        let carried = matches!(outcome, Sending::Carried(_));
        if carried || !self.rows.values().any(|r| r.unanswered) {
            self.senders_heard();
        }
        Heard::Answer(answer, None)
    }

    /// The senders are heard from (one carried an answer back), or no result waits on them:
    /// their clock stops, an alert not yet raised is dropped, and a raised one resolves.
    fn senders_heard(&mut self) {
        self.unanswered_since_ms = None;
        self.senders_alert = match self.senders_alert {
            SendersAlert::Raised | SendersAlert::Resolve => SendersAlert::Resolve,
            SendersAlert::Quiet | SendersAlert::Due => SendersAlert::Quiet,
        };
    }

    /// What a commit (from counts `before`) adds to `/metrics`, when it is time to write it
    /// (with the commit): at once with a failure, a park or a result a sender left unanswered,
    /// else once [`METER_EVERY`] delivered wait, or when nothing is left to send. `None`:
    /// nothing to write yet.
    pub fn meter(&mut self, before: Counts) -> Option<Metered> {
        let failed = std::mem::take(&mut self.failed);
        let parked = self.counts.parked.saturating_sub(before.parked);
        let all_sent = self.claim.is_none()
            && self.rows.is_empty()
            && matches!(self.phase, Phase::Read | Phase::FileParked { .. });
        let due = failed + parked + self.unanswered > 0 || self.unmetered >= METER_EVERY;
        if !(due || all_sent) || failed + parked + self.unmetered + self.unanswered == 0 {
            return None;
        }
        Some(Metered {
            delivered: std::mem::take(&mut self.unmetered),
            failed,
            parked,
            unanswered: std::mem::take(&mut self.unanswered),
        })
    }

    /// Finishes a waiting row's attempt with its answer: its row's new state, or its
    /// forgetting once delivered; `None` when the row does not wait (settled meanwhile).
    pub fn finish_row(
        &mut self,
        index: u64,
        outcome: impl Into<Sending>,
        now_ms: i64,
        limits: &Limits,
        jitter: f64,
    ) -> Option<Write> {
        let row = self.rows.get(&index).cloned()?;
        let settled = self.settle(row, &outcome.into(), now_ms, limits, jitter);
        Some(settled.map_or(Write::Forget(index), Write::Update))
    }

    /// Its destination's pause holds the batch. A pause is not the destination failing, so
    /// each waiting result's failing clock starts again at its first failure after the resume
    /// (else a pause longer than `EFFECT_ALERT_AFTER_SECONDS` parks every waiting result at its
    /// first failure after it; the senders' clock stops too). `Some` (the rows whose clock
    /// stopped) when a clock was running, so there is something to store.
    pub fn held_by_pause(&mut self) -> Option<Vec<Write>> {
        let stopped = self.unanswered_since_ms.take().is_some();
        let rows = self.rows.values_mut();
        let writes: Vec<Write> = rows
            .filter_map(|row| {
                row.failing_since_ms
                    .take()
                    .map(|_| Write::Update(row.clone()))
            })
            .collect();
        (stopped || !writes.is_empty()).then_some(writes)
    }

    /// An operator's retry of parked results, a page at a time (the edge reads at most the room
    /// left below [`MAX_WAITING`] and takes them out of the parked ones in the same
    /// transaction): each is due now, under its first `webhook-id`. A parked file is read
    /// again ([`Progress::reopen_file`]). Taking any begins a new spell of failures: none is
    /// counted as parked in it, so results refused or failing past the threshold again alert
    /// again. Returns the rows taken, waiting again, and whether the file was taken.
    pub fn retry_parked(&mut self, parked: Vec<Row>, now_ms: i64) -> (Vec<Write>, bool) {
        let n = parked.len() as u64;
        if n > 0 {
            self.gave_up = 0;
            self.failing_alerted = false;
            // A clock left from before the results settled: the senders are tried anew.
            self.unanswered_since_ms = None;
            if self.senders_alert == SendersAlert::Due {
                self.senders_alert = SendersAlert::Quiet;
            }
        }
        let writes = parked.into_iter().map(|mut row| {
            row.next_at_ms = Some(now_ms);
            row.failing_since_ms = None;
            self.rows.insert(row.index, row.clone());
            Write::Update(row)
        });
        let writes = writes.collect();
        self.counts.parked = self.counts.parked.saturating_sub(n);
        (writes, self.reopen_file(now_ms))
    }

    /// An operator's retry also sends the results waiting for a retry now, rather than at the
    /// end of their backoff (the destination is back, say): each keeps its `webhook-id` and
    /// its attempts (one in flight is due already). Returns the rows it moved.
    pub fn hurry_waiting(&mut self, now_ms: i64) -> Vec<Write> {
        let later = self
            .rows
            .values_mut()
            .filter(|r| r.next_at_ms > Some(now_ms));
        let hurry = |row: &mut Row| {
            row.next_at_ms = Some(now_ms);
            Write::Update(row.clone())
        };
        later.map(hurry).collect()
    }

    /// Waiting results an operator's retry would send now ([`Progress::hurry_waiting`]).
    pub fn waiting_later(&self, now_ms: i64) -> u64 {
        let later = |r: &&Row| r.next_at_ms > Some(now_ms);
        self.rows.values().filter(later).count() as u64
    }

    /// A parked file is asked for again now, from where reading stopped (its status answer
    /// first, when it never said where the results are), with its wait started anew, so a file
    /// that is back is read and one still gone is parked again, with its reason. `false` when
    /// the file was not parked.
    pub fn reopen_file(&mut self, now_ms: i64) -> bool {
        if !matches!(self.phase, Phase::FileParked { .. }) {
            return false;
        }
        self.phase = Phase::WaitingForFile {
            failures: 0,
            next_at_ms: now_ms,
        };
        self.since_ms = now_ms;
        self.alerted = false;
        true
    }

    /// Whether the step must ask the status answer where the results are before anything
    /// else: it could not say, and the results are not parked for it.
    pub fn wants_locating(&self) -> bool {
        self.unlocated && !matches!(self.phase, Phase::FileParked { .. })
    }

    /// Room for parked rows an operator's retry may take now.
    pub fn room(&self) -> usize {
        MAX_WAITING.saturating_sub(self.rows.len())
    }
}

/// The stored value and its failure rows held in memory, as the edge stores them
/// (`results_store.rs`), for the host tests that drive the machine through kills.
#[cfg(test)]
#[derive(Debug, Default)]
pub struct Stored {
    pub value: Option<String>,
    pub failures: BTreeMap<u64, (Row, ResultItem)>,
}

#[cfg(test)]
impl Stored {
    /// Stores the value and its writes, as one.
    pub fn save(&mut self, progress: &Progress, writes: Vec<Write>) {
        self.value = Some(serde_json::to_string(progress).unwrap());
        for write in writes {
            match write {
                Write::Keep(row, item) => {
                    self.failures.insert(row.index, (row, item));
                }
                Write::Update(row) => {
                    let index = row.index;
                    self.failures.get_mut(&index).unwrap().0 = row;
                }
                Write::Forget(index) => {
                    self.failures.remove(&index).unwrap();
                }
            }
        }
    }

    /// The stored value with its waiting rows, as the edge loads it.
    pub fn load(&self) -> Option<Progress> {
        let mut progress: Progress = serde_json::from_str(self.value.as_ref()?).unwrap();
        assert!(progress.rows.is_empty(), "the rows are never in the value");
        let rows = self.failures.values().map(|(row, _)| row);
        progress.rows = rows
            .filter(|r| !r.parked())
            .map(|r| (r.index, r.clone()))
            .collect();
        Some(progress)
    }

    /// Up to `n` parked rows, by index.
    pub fn parked(&self, n: usize) -> Vec<Row> {
        let rows = self.failures.values().map(|(row, _)| row);
        rows.filter(|r| r.parked()).take(n).cloned().collect()
    }

    /// The kept result at `index`.
    pub fn item(&self, index: u64) -> Option<ResultItem> {
        self.failures.get(&index).map(|(_, item)| item.clone())
    }
}

#[cfg(test)]
#[path = "progress_tests.rs"]
mod tests;
