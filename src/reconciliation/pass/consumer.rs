//! The fan-out queue's consumer as its own machine ([`Consumer`]): it works through one
//! [`PollJob`], starting each entry at its slot and driving an [`EntryRun`] for it as the pass
//! does, with no lease to hold, no listing and no budget of its own (the message's
//! [`JOB_ENTRIES`] bound it).
//!
//! Guarantees: the consumer's side of the fan-out's (`fanout.rs`): the pace of its slots, the
//! wait reported to the lease before the entries not polled are sent back, and the drops of
//! entries past [`JOB_MAX_AGE_MS`] or with no lease to record them; a send back that fails
//! leaves the message to the queue's retries.

use std::mem;

use crate::operation::ledger::{LedgerMeta, OPEN_PREFIX};
use crate::reconciliation::lease_protocol::{LeaseCommand, LeaseReply};

use super::entry::{Books, EntryRun, Step};
use super::fanout::{JobEntry, PollJob, QueuedJob};
use super::lines::JobDrop;
use super::{Intent, Limits, Machine, PassLog, Performed};

#[cfg(doc)]
use super::fanout::{JOB_ENTRIES, JOB_MAX_AGE_MS};

/// A consumer's run over one queue message; see the module documentation.
#[derive(Debug)]
pub struct Consumer {
    started_ms: i64,
    books: Books,
    phase: Phase,
    awaiting: Option<Owed>,
    /// The entry in hand, its run.
    entry: Option<EntryRun>,
    /// The entries to send back could not be sent: the message is left to the queue's retries
    /// instead of being acknowledged.
    retry: bool,
}

#[derive(Debug)]
enum Phase {
    Walk(JobWalk),
    /// The message is walked: its wait and the entries it sends back.
    SendBack(SendBack),
    Done,
}

/// The answer a consumer owes, beside its entry run's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owed {
    /// The wait for the next entry's slot.
    Slot,
    /// The lease's record of the wait and of the slots sent back.
    Backoff,
    /// The send of the entries not polled back to the queue.
    SendBack,
}

/// A consumer's message being worked through.
#[derive(Debug)]
struct JobWalk {
    job: PollJob,
    at: usize,
    /// When the last entry started: a consumer that starts late (its slots passed while the
    /// message waited) still keeps its entries the rate's spacing apart.
    last_start_ms: Option<i64>,
    /// Entries whose poll was skipped for a back-off: sent back to the queue.
    skipped: Vec<JobEntry>,
}

/// The end of a consumer's message: the wait to report to the lease, and the entries to send
/// back to the queue once the lease has recorded them.
#[derive(Debug)]
struct SendBack {
    /// The entries not polled because Gemini asked to wait, for after the wait.
    job: Option<PollJob>,
    /// Whether the lease has been told (or could not be).
    reported: bool,
}

impl Machine for Consumer {
    fn next(&mut self, now_ms: i64) -> Intent {
        loop {
            if self.awaiting.is_some() || self.entry.as_ref().is_some_and(EntryRun::owes) {
                debug_assert!(false, "next() while {:?} is owed", self.awaiting);
                return Intent::Done;
            }
            let flow = match mem::replace(&mut self.phase, Phase::Done) {
                Phase::Walk(walk) => self.walk_step(walk, now_ms),
                Phase::SendBack(back) => self.send_back_step(back, now_ms),
                Phase::Done => return Intent::Done,
            };
            if let Some(intent) = flow {
                return intent;
            }
        }
    }

    fn answer(&mut self, performed: Performed, now_ms: i64) {
        match performed {
            Performed::Lease(reply) if self.owes(Owed::Backoff) => {
                self.on_backed_off(reply, now_ms)
            }
            // A failed send back leaves the message to the queue's retries.
            Performed::Enqueued(Err(e)) if self.owes(Owed::SendBack) => {
                self.books.error(PassLog::error(format!("queue send: {e}")));
                self.retry = true;
            }
            Performed::Enqueued(Ok(())) if self.owes(Owed::SendBack) => {}
            Performed::Slept if self.owes(Owed::Slot) => {}
            other => match self.entry.as_mut() {
                Some(run) => run.answer(&mut self.books, other, now_ms),
                None => debug_assert!(false, "an answer nobody asked for: {other:?}"),
            },
        }
    }

    fn drain_logs(&mut self) -> Vec<PassLog> {
        mem::take(&mut self.books.logs)
    }
}

impl Consumer {
    /// A consumer's run over `job`, starting at `now_ms`: each entry is decided again with its
    /// metadata and the clock at its slot.
    pub fn new(limits: Limits, job: PollJob, now_ms: i64) -> Consumer {
        Consumer {
            started_ms: now_ms,
            books: Books::new(u32::MAX, limits),
            phase: Phase::Walk(JobWalk {
                job,
                at: 0,
                last_start_ms: None,
                skipped: Vec::new(),
            }),
            awaiting: None,
            entry: None,
            retry: false,
        }
    }

    #[cfg(test)]
    pub fn report(&self) -> &super::PassReport {
        &self.books.report
    }

    /// Whether the message is left to the queue's retries rather than acknowledged (once
    /// [`Intent::Done`]).
    pub fn retry(&self) -> bool {
        self.retry
    }

    /// Takes the owed answer if it is `owed`.
    fn owes(&mut self, owed: Owed) -> bool {
        self.awaiting.take_if(|a| *a == owed).is_some()
    }

    fn walk_step(&mut self, mut walk: JobWalk, now_ms: i64) -> Option<Intent> {
        if let Some(run) = self.entry.as_mut() {
            if let Some(intent) = run.step(&mut self.books, now_ms) {
                self.phase = Phase::Walk(walk);
                return Some(intent);
            }
            if self.entry.take().expect("an entry in hand").skipped_poll {
                walk.skipped.push(walk.job.entries[walk.at - 1].clone());
            }
        }
        while walk.at < walk.job.entries.len() {
            if now_ms >= walk.job.expires_ms() {
                // Too old: the next coverage schedules these afresh.
                let late: Vec<JobEntry> = walk.job.entries.drain(walk.at..).collect();
                self.drop_entries(&walk.job, late, JobDrop::Expired, now_ms);
                break;
            }
            if now_ms < self.books.status_backoff_until_ms {
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
                self.awaiting = Some(Owed::Slot);
                self.phase = Phase::Walk(walk);
                return Some(Intent::Sleep { until_ms: slot });
            }
            let listed = walk.job.entries[walk.at].clone();
            walk.at += 1;
            walk.last_start_ms = Some(now_ms);
            let Some(key) = listed.name.strip_prefix(OPEN_PREFIX) else {
                continue;
            };
            let Ok(meta) = serde_json::from_value::<LedgerMeta>(listed.metadata.clone()) else {
                self.books.unreadable_metadata(key);
                continue;
            };
            self.books.report.visited += 1;
            let actions = self.books.decide(&meta, now_ms);
            let steps = actions.into_iter().map(Step::Act).collect::<Vec<_>>();
            if steps.is_empty() {
                continue;
            }
            self.entry = Some(EntryRun::new(&listed.name, key, meta, steps));
            self.phase = Phase::Walk(walk);
            return None;
        }
        let mut back = (!walk.skipped.is_empty()).then(|| PollJob {
            entries: std::mem::take(&mut walk.skipped),
            not_before_ms: self.books.status_backoff_until_ms.max(now_ms),
            rate_per_s: walk.job.rate_per_s,
            first_slot_ms: Some(walk.job.first_slot()),
            hops: walk.job.hops.saturating_add(1),
        });
        if let Some(job) = back.take_if(|j| j.not_before_ms >= j.expires_ms()) {
            // Its wait ends past its life: not sent back.
            self.drop_entries(&walk.job, job.entries, JobDrop::Expired, now_ms);
        }
        self.phase = Phase::SendBack(SendBack {
            job: back,
            reported: false,
        });
        None
    }

    /// A consumer's message is walked: report the wait (and where the slots of the entries
    /// sent back end) to the lease, then send them back; or finish.
    fn send_back_step(&mut self, mut back: SendBack, now_ms: i64) -> Option<Intent> {
        let backoff = self.books.status_backoff_until_ms;
        if !back.reported && (backoff > 0 || back.job.is_some()) {
            // The next pass schedules after the wait and the slots sent back, and starts no
            // new coverage before they have passed.
            let fed_until_ms = back.job.as_ref().map_or(0, PollJob::slots_end_ms);
            self.books.spend(1);
            self.awaiting = Some(Owed::Backoff);
            self.phase = Phase::SendBack(back);
            return Some(Intent::Lease(LeaseCommand::Backoff {
                until_ms: backoff,
                fed_until_ms,
            }));
        }
        let Some(job) = back.job.take() else {
            return self.finish(now_ms);
        };
        self.books.spend(1);
        self.books.report.queue_sends += 1;
        self.awaiting = Some(Owed::SendBack);
        self.phase = Phase::SendBack(back);
        let jobs = vec![QueuedJob::of(&job, now_ms)];
        Some(Intent::Enqueue { jobs })
    }

    /// The lease's answer to a consumer's [`LeaseCommand::Backoff`], at `now_ms`: entries to
    /// send back go only once the lease has recorded them.
    fn on_backed_off(&mut self, reply: Result<LeaseReply, String>, now_ms: i64) {
        let Phase::SendBack(mut back) = mem::replace(&mut self.phase, Phase::Done) else {
            return;
        };
        back.reported = true;
        let failure = match reply {
            Ok(LeaseReply::BackedOff) => None,
            Ok(other) => Some(format!("lease backoff refused: {other:?}")),
            Err(e) => Some(format!("lease backoff: {e}")),
        };
        if let Some(error) = failure {
            self.books.error(PassLog::error(error));
            if let Some(mut job) = back.job.take() {
                // Unrecorded, a copy could wait beside the next coverage's: dropped instead.
                let entries = std::mem::take(&mut job.entries);
                job.hops = job.hops.saturating_sub(1); // the hop it was to make is not made
                self.drop_entries(&job, entries, JobDrop::LeaseUnreachable, now_ms);
            }
        }
        self.phase = Phase::SendBack(back);
    }

    /// Drops `entries` of `job` (the message as it came) unpolled: counted, and logged with the
    /// message's age and the times it was sent back; they stay open in the index.
    fn drop_entries(
        &mut self,
        job: &PollJob,
        entries: Vec<JobEntry>,
        reason: JobDrop,
        now_ms: i64,
    ) {
        if entries.is_empty() {
            return;
        }
        self.books.report.dropped += entries.len() as u64;
        let keys = entries
            .iter()
            .map(|e| String::from(e.name.strip_prefix(OPEN_PREFIX).unwrap_or(&e.name)))
            .collect();
        self.books.log(PassLog::ReconcileJobDropped {
            reason,
            entries: entries.len() as u64,
            hops: job.hops,
            age_ms: now_ms - job.first_slot(),
            keys,
        });
    }

    /// The consumer's line, and the end.
    fn finish(&mut self, now_ms: i64) -> Option<Intent> {
        self.books.report.elapsed_ms = now_ms - self.started_ms;
        let line = PassLog::ReconcileJob(self.books.report.clone());
        self.books.log(line);
        self.phase = Phase::Done;
        None
    }
}
