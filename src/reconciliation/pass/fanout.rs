//! The fan-out of a large backlog onto a Cloudflare Queue: the pass schedules polls as queue
//! messages ([`PollJob`]) instead of making them itself, and each message is worked through
//! by a consumer ([`Consumer`](super::Consumer)) with the same per-entry decisions as the pass.
//!
//! Guarantees: every scheduled poll has a start time (its slot), the slots of all passes
//! spaced `1 / RECONCILE_POLL_RATE` seconds apart and never overlapping (a pass schedules
//! after the lease's `fed_until_ms`, and at most one cron interval ahead), and a consumer
//! starts no entry before its slot nor sooner than the spacing after its previous one, so
//! the status API sees at most the configured rate while consumers keep up, and a consumer
//! behind schedule catches up no faster than the rate. The walk's cursor moves past an entry only once its message is accepted
//! by the queue; a message lost after that (retries exhausted) leaves its entries in the
//! index, so the next coverage schedules them again: the index, not the queue, is the record
//! of what is open. A consumer that Gemini asks to wait (429, 5xx, a run of unanswered calls)
//! polls nothing more, reports the wait to the lease, where the next pass schedules after it,
//! and sends the entries it did not poll back to the queue for after the wait.
//!
//! The copies are bounded, so a lasting 429 cannot pile them up: one copy of an entry waits on
//! the queue at a time, and it lives at most [`JOB_MAX_AGE_MS`] (one cron interval).
//! A message carries the slot its pass first gave it and how many times it was sent back; no
//! entry is polled once [`JOB_MAX_AGE_MS`] past that slot, and a message whose wait would end
//! there is not sent back: its entries are dropped (acknowledged, counted as `dropped`, logged
//! `reconcile_job_dropped`) and stay open in the index, where the next coverage schedules
//! them afresh. Entries sent back are recorded in the lease before they are sent (their slots
//! extend `fed_until_ms`; with no lease to record them they are dropped), so `fed_until_ms`
//! is where every waiting copy's slots end. Within a coverage of the index the cursor passes
//! each entry once, and a pass starts a new coverage (from the index's start) only once
//! `fed_until_ms` has passed (`still_queued` until then): no entry is scheduled while an
//! earlier copy of it is still due. The one gap is a message the queue delivers well after
//! its slots (a consumer far behind): it may meet the next coverage's copy, and is still
//! dropped once [`JOB_MAX_AGE_MS`] old.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::operation::ledger::OPEN_PREFIX;

use super::stop::Stop;
use super::walk::IndexWalk;
use super::{Awaiting, Intent, Pass, PassLog, Phase, CRON_INTERVAL_MS};

/// Entries in one queue message: a consumer polls them in order, at most 2 subrequests each
/// (status call and gate call, 3 with a re-index), so a batch of
/// [`CONSUMER_BATCH_MESSAGES`] stays under a Worker's 1,000 subrequests.
pub const JOB_ENTRIES: usize = 50;
/// Messages a consumer receives at once (`max_batch_size` in wrangler.toml).
pub const CONSUMER_BATCH_MESSAGES: usize = 5;
/// Most messages in one `sendBatch` (the platform's limit is 100).
pub const SEND_MESSAGES: usize = 100;
/// Most bytes of message bodies in one `sendBatch` before another message is added: one more
/// message (50 entries of at most ~1.1 KB: KV metadata is at most 1,024 bytes) stays under
/// the platform's 256 KB a batch and 128 KB a message.
pub const SEND_BYTES: usize = 150_000;
/// The longest delay a queue message may carry (12 hours).
pub const MAX_DELAY_SECS: i64 = 43_200;
/// How long past the slot its pass first gave it a scheduled poll may still be made: one cron
/// interval. Past it, its entries are dropped rather than polled or sent back; the next
/// coverage schedules them afresh (a new coverage waits until every waiting copy's slots have
/// passed, so it never schedules a second copy beside one).
pub const JOB_MAX_AGE_MS: i64 = CRON_INTERVAL_MS;

/// How the pass fans polls out, when a queue is bound.
#[derive(Debug, Clone, PartialEq)]
pub struct Fanout {
    /// `RECONCILE_POLL_RATE`: status calls a second toward Gemini, all consumers together.
    pub rate_per_s: u32,
    /// `RECONCILE_FANOUT_ABOVE`: fan out when at least this many listed index entries are
    /// left to visit; a smaller backlog the pass polls itself.
    pub above: usize,
}

/// One queue message: index entries as listed (name and metadata), the first one's slot, and
/// the rate that spaces the rest; with the slot its pass first gave it and the times it was
/// sent back, which bound its life (`JOB_MAX_AGE_MS`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PollJob {
    pub entries: Vec<JobEntry>,
    pub not_before_ms: i64,
    pub rate_per_s: u32,
    /// The slot the pass first gave the message, kept when a consumer sends it back (`None`
    /// in a message sent before the field existed: its `not_before_ms` stands for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_slot_ms: Option<i64>,
    /// How many times a consumer sent it back after a wait.
    #[serde(default)]
    pub hops: u32,
}

/// An index entry in a [`PollJob`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobEntry {
    pub name: String,
    pub metadata: Value,
}

impl PollJob {
    /// A message as a pass first schedules it.
    pub fn new(entries: Vec<JobEntry>, not_before_ms: i64, rate_per_s: u32) -> PollJob {
        PollJob {
            entries,
            not_before_ms,
            rate_per_s,
            first_slot_ms: Some(not_before_ms),
            hops: 0,
        }
    }

    /// When entry `i` may start.
    pub fn slot_ms(&self, i: usize) -> i64 {
        self.not_before_ms + (i as i64 * 1_000) / i64::from(self.rate_per_s.max(1))
    }

    /// Where the message's slots end: its first plus one spacing per entry (rounded up).
    pub fn slots_end_ms(&self) -> i64 {
        let rate = i64::from(self.rate_per_s.max(1));
        self.not_before_ms + (self.entries.len() as i64 * 1_000 + rate - 1) / rate
    }

    /// The slot its pass first gave it.
    pub fn first_slot(&self) -> i64 {
        self.first_slot_ms.unwrap_or(self.not_before_ms)
    }

    /// From this time on none of its entries is polled: they are dropped.
    pub fn expires_ms(&self) -> i64 {
        self.first_slot().saturating_add(JOB_MAX_AGE_MS)
    }

    /// A message body ([`QueuedJob::of`]) read back; `Err` says why it is not one.
    pub fn from_body(body: &str) -> Result<PollJob, String> {
        serde_json::from_str(body).map_err(|e| format!("not a poll job: {e}"))
    }
}

/// A message for the queue: its body, and how long the queue holds it before delivery.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuedJob {
    pub body: String,
    pub delay_secs: u32,
}

impl QueuedJob {
    /// `job` for sending at `now_ms`: held until its first slot.
    pub fn of(job: &PollJob, now_ms: i64) -> QueuedJob {
        let delay = (job.not_before_ms - now_ms).div_euclid(1_000);
        let body = serde_json::to_string(job).unwrap_or_default();
        let delay_secs = delay.clamp(0, MAX_DELAY_SECS) as u32;
        QueuedJob { body, delay_secs }
    }
}

/// What the pass owes the walk once its messages are accepted.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Fed {
    /// The last index entry the messages cover (or skip as needing nothing).
    pub(super) last_name: String,
    /// The end of the slots scheduled.
    pub(super) until_ms: i64,
    pub(super) entries: u64,
}

impl Pass {
    /// Schedules the next messages of the window on the queue, or ends the walk.
    pub(super) fn feed_step(&mut self, mut walk: IndexWalk, now_ms: i64) -> Option<Intent> {
        let Some(fanout) = self.books.limits.fanout.clone() else {
            return self.walk_ended(walk, Stop::Error);
        };
        if let Some(stop) = self.must_stop(now_ms, walk.audit_from.is_some()) {
            return self.walk_ended(walk, stop);
        }
        if !self.books.affords(1) {
            return self.walk_ended(walk, Stop::Budget);
        }
        // One cron interval ahead: the queue holds about one interval of work, and the next
        // pass continues where this one stopped.
        let horizon = self.started_ms + CRON_INTERVAL_MS;
        let mut schedule = now_ms
            .max(self.fed_until_ms)
            .max(self.books.status_backoff_until_ms);
        let mut jobs: Vec<PollJob> = Vec::new();
        let mut bytes = 0usize;
        let mut last_name = None;
        let mut fed = 0u64;
        let mut full = false;
        while walk.at < walk.entries.len() && jobs.len() < SEND_MESSAGES && bytes < SEND_BYTES {
            if schedule >= horizon {
                full = true;
                break;
            }
            let mut job = PollJob::new(Vec::new(), schedule, fanout.rate_per_s);
            while job.entries.len() < JOB_ENTRIES && walk.at < walk.entries.len() {
                let (name, meta) = &mut walk.entries[walk.at];
                let (name, meta) = (name.clone(), meta.take());
                walk.at += 1;
                last_name = Some(name.clone());
                let Some(key) = name.strip_prefix(OPEN_PREFIX) else {
                    continue;
                };
                let Some(meta) = meta else {
                    self.books.unreadable_metadata(key);
                    continue;
                };
                self.books.report.visited += 1;
                if self.books.decide(&meta, now_ms).is_empty() {
                    continue;
                }
                walk.seen.touched.insert(key.to_string());
                let metadata = serde_json::to_value(&meta).unwrap_or(Value::Null);
                bytes += name.len() + metadata.to_string().len() + 32;
                job.entries.push(JobEntry { name, metadata });
            }
            if job.entries.is_empty() {
                continue;
            }
            fed += job.entries.len() as u64;
            schedule = job.slots_end_ms();
            jobs.push(job);
        }
        if jobs.is_empty() {
            if let Some(name) = last_name {
                walk.position.after_key = Some(name);
                self.save_checkpoint(&walk);
            }
            if full || walk.at < walk.entries.len() {
                // The queue holds a cron interval of polls (or Gemini's wait runs past it):
                // the next pass schedules the rest.
                return self.walk_ended(walk, Stop::Scheduled);
            }
            return self.window_done(walk);
        }
        let queued = jobs.iter().map(|j| QueuedJob::of(j, now_ms)).collect();
        self.books.report.queue_sends += 1;
        let owed = Awaiting::Enqueue(Fed {
            last_name: last_name.unwrap_or_default(),
            until_ms: schedule,
            entries: fed,
        });
        self.call(Phase::Index(walk), owed, Intent::Enqueue { jobs: queued })
    }

    /// The queue's answer to [`Intent::Enqueue`] (`Err`: the send failed; the walk then stops
    /// where it was: those entries are scheduled by the next pass).
    pub(super) fn on_fed(&mut self, fed: Fed, sent: Result<(), String>) {
        let Phase::Index(mut walk) = std::mem::replace(&mut self.phase, Phase::Done) else {
            return;
        };
        match sent {
            Ok(()) => {
                self.books.report.fed += fed.entries;
                self.fed_until_ms = self.fed_until_ms.max(fed.until_ms);
                walk.position.after_key = Some(fed.last_name);
                self.save_checkpoint(&walk);
                self.phase = Phase::Index(walk);
            }
            Err(e) => {
                self.books.error(PassLog::error(format!("queue send: {e}")));
                self.walk_ended(walk, Stop::Error);
            }
        }
    }
}
