//! The results' progress: a pure state machine the batch's gate and its alarm drive, one
//! chunk of results at a time, from durable state alone.
//!
//! Guarantees: a result's side effect is sent under one `webhook-id` only
//! ([`crate::results::body::result_message_id`]), so a repeat after a kill reaches the
//! destination as a repeat it can drop. A chunk is claimed (its byte range and index range
//! stored) before any of its results is sent, and committed after its answers: a kill in
//! between resends the chunk's results under their same ids (they may have reached the
//! destination); a kill after the commit sends none of them again, but those kept as rows.
//! Only failed and parked results take a row; delivered ones are counted, never stored, so
//! state does not grow with the file. A failed result is retried with the job's backoff
//! ([`crate::operation::backoff_ms`]); a refusal parks it. A results file missing right after
//! `SUCCEEDED` is asked for again with backoff for [`Limits::file_wait_ms`]; a file gone for
//! good or unreadable parks the results with the reason and raises one alert. The job's own
//! effect is owed once the file is read (or parked) and no result is waiting.
//!
//! Storage: the whole value is one record in the batch's Durable Object (rows included, each
//! at most a line's cap), plus the [`crate::results::keys::KeysSeen`] filter written with each
//! commit.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::operation::{backoff_ms, AttemptOutcome};
use crate::results::item::{ResultItem, Source};
use crate::results::lines::Checkpoint;

/// How long a results file that answers 404 after `SUCCEEDED` is asked for again: Gemini can
/// report `SUCCEEDED` shortly before the file can be downloaded; half an hour is far past the
/// delays reported, and far inside the file's 48 hours.
pub const FILE_WAIT_MS: i64 = 30 * 60 * 1_000;
/// Results per chunk: each one is a subrequest, and the download is one more; 40 stays within
/// the Free plan's 50 subrequests per invocation.
pub const CHUNK_RESULTS: u64 = 40;
/// Bytes of lines per chunk: the chunk is held while it is sent, so this bounds memory.
pub const CHUNK_BYTES: u64 = 8 << 20;
/// A line's cap: larger lines are not loaded, their result says where they are. Below a
/// Durable Object SQLite row's 2 MB, so a failed result's row always fits.
pub const LINE_CAP: usize = 1 << 20;

/// The tunables, with the job's backoff.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub file_wait_ms: i64,
    pub retry_base_secs: i64,
    pub retry_max_secs: i64,
}

/// Where the results stand.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "phase")]
pub enum Phase {
    /// The file answered 404 (or could not be reached) `failures` times; ask again then.
    WaitingForFile { failures: u32, next_at_ms: i64 },
    /// Chunks are being read and sent.
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

/// A failed or parked result, kept to be retried or shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub item: ResultItem,
    pub attempts: u32,
    pub last_error: String,
    /// When it may be sent again; `None` once parked.
    pub next_at_ms: Option<i64>,
    /// An attempt was begun and not finished: it may have reached the destination.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_doubt: bool,
}

/// What the edge does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Nothing until then.
    WaitUntil(i64),
    /// Open the file at `from` and read the next chunk (number `chunk`), then claim it.
    ReadChunk { chunk: u64, from: Checkpoint },
    /// Read the claimed chunk again and send its results, then commit it.
    ResendChunk(ChunkClaim),
    /// Send these rows' results again (begin each, then finish it).
    RetryRows(Vec<String>),
    /// Raise the one alert for a parked file.
    Alert(String),
    /// Every result is settled: the job's effect is owed with these counts.
    Settled(Value),
}

/// The results' progress for one operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    pub source: Source,
    pub phase: Phase,
    /// Everything before this has been sent and committed.
    pub done_through: Checkpoint,
    pub chunks_done: u64,
    pub claim: Option<ChunkClaim>,
    pub counts: Counts,
    pub rows: BTreeMap<String, Row>,
    /// When the results became owed (the operation's `SUCCEEDED`).
    pub since_ms: i64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub alerted: bool,
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
pub fn may_have_reached(outcome: &AttemptOutcome) -> bool {
    matches!(outcome, AttemptOutcome::Retry(_))
}

impl Progress {
    /// The progress of a batch that just succeeded with `results: "each"`.
    pub fn begin(source: Source, now_ms: i64) -> Progress {
        Progress {
            source,
            phase: Phase::Reading,
            done_through: Checkpoint::default(),
            chunks_done: 0,
            claim: None,
            counts: Counts::default(),
            rows: BTreeMap::new(),
            since_ms: now_ms,
            alerted: false,
        }
    }

    /// What to do next at `now_ms`.
    pub fn next(&self, now_ms: i64) -> Step {
        if let Some(claim) = self.claim {
            return Step::ResendChunk(claim);
        }
        match &self.phase {
            Phase::WaitingForFile { next_at_ms, .. } if *next_at_ms > now_ms => {
                Step::WaitUntil(*next_at_ms)
            }
            Phase::WaitingForFile { .. } | Phase::Reading => Step::ReadChunk {
                chunk: self.chunks_done,
                from: self.done_through,
            },
            Phase::FileParked { reason } if !self.alerted => Step::Alert(reason.clone()),
            Phase::Read | Phase::FileParked { .. } => self.next_row(now_ms),
        }
    }

    fn next_row(&self, now_ms: i64) -> Step {
        let due: Vec<String> = self
            .rows
            .iter()
            .filter(|(_, r)| r.next_at_ms.is_some_and(|at| at <= now_ms))
            .map(|(k, _)| k.clone())
            .collect();
        if !due.is_empty() {
            return Step::RetryRows(due);
        }
        match self.rows.values().filter_map(|r| r.next_at_ms).min() {
            Some(at) => Step::WaitUntil(at),
            None => Step::Settled(self.job_results()),
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
        let failures = match self.phase {
            Phase::WaitingForFile { failures, .. } => failures + 1,
            _ => 1,
        };
        let over = now_ms - self.since_ms >= limits.file_wait_ms;
        let reason = match trouble {
            FileTrouble::Unreadable(why) => Some(why),
            FileTrouble::Missing if over => Some("results file not found (404)".to_string()),
            FileTrouble::Unavailable(why) if over => Some(why),
            _ => None,
        };
        self.phase = match reason {
            Some(reason) => Phase::FileParked { reason },
            None => Phase::WaitingForFile {
                failures,
                next_at_ms: now_ms
                    + backoff_ms(
                        failures,
                        limits.retry_base_secs,
                        limits.retry_max_secs,
                        jitter,
                    ),
            },
        };
    }

    /// The one alert for a parked file was raised.
    pub fn alert_raised(&mut self) {
        self.alerted = true;
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
    /// delivered become rows. A commit for another chunk than the one claimed is ignored
    /// (a stale run's); returns whether it was taken.
    pub fn commit(
        &mut self,
        chunk: u64,
        answers: Vec<(ResultItem, AttemptOutcome)>,
        now_ms: i64,
        limits: &Limits,
        jitter: f64,
    ) -> bool {
        let Some(claim) = self.claim.filter(|c| c.chunk == chunk) else {
            return false;
        };
        for (item, outcome) in answers {
            self.counts.total += 1;
            self.counts.errors += u64::from(item.payload.is_error());
            let row = Row {
                item,
                attempts: 0,
                last_error: String::new(),
                next_at_ms: None,
                in_doubt: false,
            };
            self.settle(row, &outcome, now_ms, limits, jitter);
        }
        self.claim = None;
        self.done_through = claim.to;
        self.chunks_done += 1;
        if claim.last {
            self.phase = Phase::Read;
        }
        true
    }

    /// Records an attempt's answer for a result (a new one, or a row's).
    fn settle(
        &mut self,
        mut row: Row,
        outcome: &AttemptOutcome,
        now_ms: i64,
        limits: &Limits,
        jitter: f64,
    ) {
        row.attempts += 1;
        row.in_doubt = false;
        match outcome {
            AttemptOutcome::Delivered => {
                self.counts.delivered += 1;
                self.rows.remove(&row.item.result_key);
            }
            AttemptOutcome::Retry(why) => {
                row.last_error = why.clone();
                let wait = backoff_ms(
                    row.attempts,
                    limits.retry_base_secs,
                    limits.retry_max_secs,
                    jitter,
                );
                row.next_at_ms = Some(now_ms + wait);
                self.rows.insert(row.item.result_key.clone(), row);
            }
            AttemptOutcome::Park(why) => {
                row.last_error = why.clone();
                row.next_at_ms = None;
                self.counts.parked += 1;
                self.rows.insert(row.item.result_key.clone(), row);
            }
        }
    }

    /// Begins a row's attempt: store this before sending. Returns the result to send, or
    /// `None` when the row is not due (settled meanwhile, or parked).
    pub fn begin_row(&mut self, key: &str) -> Option<ResultItem> {
        let row = self.rows.get_mut(key).filter(|r| r.next_at_ms.is_some())?;
        row.in_doubt = true;
        Some(row.item.clone())
    }

    /// Finishes a row's attempt with its answer.
    pub fn finish_row(
        &mut self,
        key: &str,
        outcome: &AttemptOutcome,
        now_ms: i64,
        limits: &Limits,
        jitter: f64,
    ) {
        if let Some(row) = self.rows.get(key).filter(|r| r.in_doubt).cloned() {
            self.settle(row, outcome, now_ms, limits, jitter);
        }
    }

    /// An operator's retry of the parked results: each is due now, under its first
    /// `webhook-id`. Returns how many; `dry_run` only counts.
    pub fn retry_parked(&mut self, now_ms: i64, dry_run: bool) -> u64 {
        let parked: Vec<String> = self
            .rows
            .iter()
            .filter(|(_, r)| r.next_at_ms.is_none())
            .map(|(k, _)| k.clone())
            .collect();
        if !dry_run {
            for key in &parked {
                if let Some(row) = self.rows.get_mut(key) {
                    row.next_at_ms = Some(now_ms);
                }
            }
            self.counts.parked -= parked.len() as u64;
            if matches!(self.phase, Phase::FileParked { .. }) {
                // The unread part is asked for again, from where reading stopped.
                self.phase = Phase::Reading;
            }
        }
        parked.len() as u64
    }
}

#[cfg(test)]
#[path = "progress_tests.rs"]
mod tests;
