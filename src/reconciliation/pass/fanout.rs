//! The fan-out of a large backlog onto a Cloudflare Queue: the pass schedules polls as queue
//! messages ([`PollJob`]) instead of making them itself, and each message is worked through
//! by a consumer ([`Pass::for_job`]) with the same per-entry decisions as the pass.
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
//! polls nothing more, sends the entries it did not poll back to the queue for after the
//! wait, and reports the wait to the lease, where the next pass schedules after it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::operation::ledger::{LedgerMeta, OPEN_PREFIX};
use crate::reconciliation::reconcile::{decide, Stop};

use super::entry::{Entry, Step};
use super::walk::IndexWalk;
use super::{Awaiting, Flow, Intent, Pass, PassLog, Phase, CRON_INTERVAL_MS};

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
/// the rate that spaces the rest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PollJob {
    pub entries: Vec<JobEntry>,
    pub not_before_ms: i64,
    pub rate_per_s: u32,
}

/// An index entry in a [`PollJob`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobEntry {
    pub name: String,
    pub metadata: Value,
}

impl PollJob {
    /// When entry `i` may start.
    pub fn slot_ms(&self, i: usize) -> i64 {
        self.not_before_ms + (i as i64 * 1_000) / i64::from(self.rate_per_s.max(1))
    }

    /// The message body.
    pub fn to_body(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// A message body read back; `Err` says why it is not one.
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
        QueuedJob {
            body: job.to_body(),
            delay_secs: delay.clamp(0, MAX_DELAY_SECS) as u32,
        }
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

/// A consumer's message being worked through.
#[derive(Debug)]
pub(super) struct JobWalk {
    job: PollJob,
    at: usize,
    /// When the last entry started: a consumer that starts late (its slots passed while the
    /// message waited) still keeps its entries the rate's spacing apart.
    last_start_ms: Option<i64>,
    /// Entries whose poll was skipped for a back-off: sent back to the queue.
    skipped: Vec<JobEntry>,
}

/// How a consumer's message ended.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JobOutcome {
    /// The entries not polled because Gemini asked to wait, for after the wait.
    pub requeue: Option<PollJob>,
    /// The wait to report to the lease, when this message met one.
    pub backoff_until_ms: Option<i64>,
}

impl Pass {
    /// Whether the walk fans this window out: a queue is bound and at least `above` entries
    /// are left to visit.
    pub(super) fn fans_out(&self, left: usize) -> bool {
        self.limits.fanout.as_ref().is_some_and(|f| left >= f.above)
    }

    /// Schedules the next messages of the window on the queue, or ends the walk.
    pub(super) fn feed_step(&mut self, mut walk: IndexWalk, now_ms: i64) -> Flow {
        let Some(fanout) = self.limits.fanout.clone() else {
            return self.end_walk(walk.position.clone(), Stop::Error);
        };
        if let Some(stop) = self.must_stop(now_ms) {
            return self.end_walk(walk.position.clone(), stop);
        }
        if !self.affords(1) {
            return self.end_walk(walk.position.clone(), Stop::Budget);
        }
        // One cron interval ahead: the queue holds about one interval of work, and the next
        // pass continues where this one stopped.
        let horizon = self.started_ms + CRON_INTERVAL_MS;
        let mut schedule = now_ms
            .max(self.fed_until_ms)
            .max(self.status_backoff_until_ms);
        let spacing = 1_000.0 / f64::from(fanout.rate_per_s.max(1));
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
            let mut job = PollJob {
                entries: Vec::new(),
                not_before_ms: schedule,
                rate_per_s: fanout.rate_per_s,
            };
            while job.entries.len() < JOB_ENTRIES && walk.at < walk.entries.len() {
                let (name, meta) = &mut walk.entries[walk.at];
                let (name, meta) = (name.clone(), meta.take());
                walk.at += 1;
                last_name = Some(name.clone());
                let Some(key) = name.strip_prefix(OPEN_PREFIX) else {
                    continue;
                };
                let Some(meta) = meta else {
                    self.unreadable_metadata(key);
                    continue;
                };
                self.report.visited += 1;
                if decide(&meta, now_ms.div_euclid(1_000), &self.limits.thresholds).is_empty() {
                    continue;
                }
                self.touched.insert(key.to_string());
                let metadata = serde_json::to_value(&meta).unwrap_or(Value::Null);
                bytes += name.len() + metadata.to_string().len() + 32;
                job.entries.push(JobEntry { name, metadata });
            }
            if job.entries.is_empty() {
                continue;
            }
            fed += job.entries.len() as u64;
            schedule = job.not_before_ms + (job.entries.len() as f64 * spacing).ceil() as i64;
            jobs.push(job);
        }
        if jobs.is_empty() {
            if let Some(name) = last_name {
                walk.position.after_key = Some(name);
                self.save_checkpoint(&walk.position);
            }
            if full || walk.at < walk.entries.len() {
                // The queue holds a cron interval of polls (or Gemini's wait runs past it):
                // the next pass schedules the rest.
                return self.end_walk(walk.position.clone(), Stop::Scheduled);
            }
            return self.window_done(walk);
        }
        let queued = jobs.iter().map(|j| QueuedJob::of(j, now_ms)).collect();
        self.spend(1);
        self.report.queue_sends += 1;
        self.awaiting = Some(Awaiting::Enqueue(Fed {
            last_name: last_name.unwrap_or_default(),
            until_ms: schedule,
            entries: fed,
        }));
        self.phase = Phase::Index(walk);
        Flow::Io(Intent::Enqueue { jobs: queued })
    }

    /// The queue's answer to [`Intent::Enqueue`] (`Err`: the send failed, and the walk stops
    /// where it was: those entries are scheduled by the next pass).
    pub fn on_enqueued(&mut self, sent: Result<(), String>) {
        let Some(Awaiting::Enqueue(fed)) = self.answered(|a| matches!(a, Awaiting::Enqueue(_)))
        else {
            return;
        };
        let Phase::Index(mut walk) = std::mem::replace(&mut self.phase, Phase::Done) else {
            return;
        };
        match sent {
            Ok(()) => {
                self.report.fed += fed.entries;
                self.fed_until_ms = self.fed_until_ms.max(fed.until_ms);
                walk.position.after_key = Some(fed.last_name);
                self.save_checkpoint(&walk.position);
                self.phase = Phase::Index(walk);
            }
            Err(e) => {
                self.report.errors += 1;
                self.log(PassLog::error(format!("queue send: {e}")));
                let position = walk.position.clone();
                self.walk_ended(position, Stop::Error);
            }
        }
    }

    /// A consumer's pass over one queue message, starting at `now_ms`: no lease, no listing;
    /// each entry is decided again with its metadata and the clock at its slot.
    pub fn for_job(limits: super::Limits, job: PollJob, now_ms: i64) -> Pass {
        let mut pass = Pass::new(limits, "queue".into(), now_ms);
        pass.budget_limit = u32::MAX;
        pass.deadline_ms = i64::MAX;
        pass.walk_deadline_ms = i64::MAX;
        pass.job = true;
        pass.phase = Phase::Job(JobWalk {
            job,
            at: 0,
            last_start_ms: None,
            skipped: Vec::new(),
        });
        pass
    }

    pub(super) fn job_step(&mut self, mut walk: JobWalk, now_ms: i64) -> Flow {
        if self.entry.is_some() {
            if let Some(intent) = self.entry_step(now_ms) {
                self.phase = Phase::Job(walk);
                return Flow::Io(intent);
            }
            let entry = self.entry.take().expect("an entry in hand");
            if entry.skipped_poll {
                walk.skipped.push(walk.job.entries[walk.at - 1].clone());
            }
        }
        while walk.at < walk.job.entries.len() {
            if now_ms < self.status_backoff_until_ms {
                // Gemini asked to wait: poll nothing more in this message.
                walk.skipped.extend(walk.job.entries.drain(walk.at..));
                break;
            }
            let spacing = walk.job.slot_ms(walk.at + 1) - walk.job.slot_ms(walk.at);
            let slot = walk
                .last_start_ms
                .map_or(i64::MIN, |last| last + spacing)
                .max(walk.job.slot_ms(walk.at));
            if now_ms < slot {
                self.awaiting = Some(Awaiting::Sleep);
                self.phase = Phase::Job(walk);
                return Flow::Io(Intent::Sleep { until_ms: slot });
            }
            let listed = walk.job.entries[walk.at].clone();
            walk.at += 1;
            walk.last_start_ms = Some(now_ms);
            let Some(key) = listed.name.strip_prefix(OPEN_PREFIX) else {
                continue;
            };
            let Ok(meta) = serde_json::from_value::<LedgerMeta>(listed.metadata.clone()) else {
                self.unreadable_metadata(key);
                continue;
            };
            self.report.visited += 1;
            let actions = decide(&meta, now_ms.div_euclid(1_000), &self.limits.thresholds);
            let steps = actions.into_iter().map(Step::Act).collect::<Vec<_>>();
            if steps.is_empty() {
                continue;
            }
            self.entry = Some(Entry::new(&listed.name, key, meta, steps));
            self.phase = Phase::Job(walk);
            return Flow::Continue;
        }
        let backoff = self.status_backoff_until_ms;
        self.job_outcome = JobOutcome {
            backoff_until_ms: (backoff > 0).then_some(backoff),
            requeue: (!walk.skipped.is_empty()).then(|| PollJob {
                entries: walk.skipped,
                not_before_ms: backoff.max(now_ms),
                rate_per_s: walk.job.rate_per_s,
            }),
        };
        self.phase = Phase::Finish;
        Flow::Continue
    }

    /// The edge slept until the slot asked by [`Intent::Sleep`].
    pub fn on_slept(&mut self) {
        self.answered(|a| *a == Awaiting::Sleep);
    }

    /// How a consumer's message ended (once [`Intent::Done`]).
    pub fn job_outcome(&self) -> &JobOutcome {
        &self.job_outcome
    }
}
