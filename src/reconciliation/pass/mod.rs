//! One reconciliation pass (the cron's slow path) and the fan-out queue's [`Consumer`], as
//! named machines: each [`Machine`] says what to do next ([`Intent`]), the edge does it and
//! hands back what it got ([`Performed`]), and a heartbeat beside the pass's walk asks
//! [`Pass::on_heartbeat`] for renewals. Both drive the same entry run (`entry.rs`) for each
//! entry. Every decision lives here, host-tested; the edge only performs I/O.
//!
//! What a pass does: take the lease; check the Gemini webhook's state when one is named (and
//! enable it again when Gemini disabled it for failed deliveries, sweeping every open
//! operation onto the fan-out queue: `restore.rs`); list
//! the `open:` index of operations that may need work (the whole of it, up to
//! [`MAX_INDEX_PAGES`] pages, then in windows), and visit the listed entries in key order from
//! where the last pass stopped, deciding from metadata ([`decide`]) and turning what Gemini's
//! status API says into events for the gates (or, for a backlog of at least
//! `RECONCILE_FANOUT_ABOVE` with the queue bound, scheduling their polls on the queue for its
//! consumer, which walks each message with the same decisions: `fanout.rs`); when the audit is due
//! (`RECONCILE_AUDIT_SECONDS`), walk the whole `op:` ledger with the audit's own cursor, on a
//! reserved third of the budget and deadline, acting on what the index missed and asking those
//! gates to re-index; release the lease with where the next pass starts.
//!
//! Guarantees: the pass writes no state itself, every change goes through a gate; it reads no
//! ledger value; it holds the lease or does nothing; it never spends more than
//! `RECONCILE_BUDGET` subrequests (KV list calls, gate calls, lease calls and status calls
//! together, keeping one for the release) and resumes where it stopped on the next run; it
//! starts no entry after `RECONCILE_DEADLINE_SECONDS`; a heartbeat renews its short lease
//! every quarter of the TTL, saving its position each time, and a refused renewal stops the
//! pass without a release, so it never saves a cursor over the new holder's. What each status
//! answer leads to is the entry run's (`entry.rs`; unanswered calls: `stop.rs`); a 429 or 5xx
//! stops polling until its Retry-After has passed and settles nothing, and the next pass
//! resumes at the first entry skipped for it (if the wait ends within a cron interval).

mod consumer;
mod entry;
mod fanout;
mod lease;
mod lines;
mod restore;
pub mod stop;
mod walk;
mod webhook;

#[cfg(test)]
mod tests;

use serde_json::Value;

use crate::operation::gate::protocol::{GateCommand, GateReply};
use crate::operation::ledger_walk::LedgerCursor;
use crate::reconciliation::entry_decision::Thresholds;
use crate::reconciliation::lease_protocol::{LeaseCommand, LeaseReply};
use crate::reconciliation::lease_state::audit_reserve;
use crate::reconciliation::status::StatusAnswer;
use crate::retry::PeerAnswer;

use stop::{past_deadline, Stop};

pub use consumer::Consumer;
pub use fanout::{Fanout, PollJob, QueuedJob, CONSUMER_BATCH_MESSAGES, JOB_ENTRIES};
pub use lines::{JobDrop, PassLog, PassReport};

#[cfg(doc)]
use crate::reconciliation::entry_decision::decide;
#[cfg(doc)]
use crate::reconciliation::lease_state::MAX_INDEX_PAGES;

/// Largest KV list page.
pub const PAGE_SIZE: u64 = 1_000;
/// The cron's interval (`*/5 * * * *` in wrangler.toml): how far ahead a pass schedules polls
/// on the fan-out queue.
pub const CRON_INTERVAL_MS: i64 = 300_000;
/// A backoff ending within this long (one cron interval) holds the next pass's start at the
/// first entry it skipped; a longer one does not, or every pass until it ends would spend its
/// budget on the same stretch of the ledger and never reach retries and alerts beyond it.
pub const HOLD_BACKOFF_UP_TO_MS: i64 = CRON_INTERVAL_MS;
/// Most pages of the webhook listing read when looking for our webhook.
pub const MAX_WEBHOOK_PAGES: usize = 5;

/// What a pass may spend and how it decides, from the configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// `RECONCILE_BUDGET`: subrequests, lease calls included.
    pub budget: u32,
    /// `RECONCILE_DEADLINE_SECONDS`, in ms.
    pub deadline_ms: i64,
    /// `RECONCILE_LEASE_SECONDS`, in ms.
    pub lease_ttl_ms: i64,
    /// `RECONCILE_AUDIT_SECONDS`, in ms.
    pub audit_interval_ms: i64,
    pub thresholds: Thresholds,
    /// `GEMINI_WEBHOOK_NAME`: the webhook whose state each pass checks.
    pub webhook_name: Option<String>,
    /// `GEMINI_WEBHOOK_AUTO_ENABLE`: enable it again when Gemini disabled it for failed
    /// deliveries.
    pub webhook_auto_enable: bool,
    /// `GEMINI_API_BASE`.
    pub api_base: String,
    /// How long the first side effect of an unregistered operation the pass settles waits.
    pub unregistered_hold_ms: i64,
    /// The fan-out queue, when `RECONCILE_QUEUE` is bound.
    pub fanout: Option<Fanout>,
    /// `RECONCILE_POLL_RATE`: the pass's own status calls are spaced `1 / rate` apart, as
    /// every other status call is, so the one budget holds whoever polls.
    pub poll_rate: u32,
}

/// What the edge does next for a pass or a consumer; each but `Done` is answered with the
/// [`Performed`] of the same name.
#[derive(Debug, Clone, PartialEq)]
pub enum Intent {
    /// Send this to the lease object.
    Lease(LeaseCommand),
    /// GET this page of Gemini's webhook listing.
    ListWebhooks { url: String },
    /// `PATCH` this WebhookService URL with this JSON body (enabling the webhook again).
    EnableWebhook { url: String, body: String },
    /// Post this alert to the alert sink.
    PostAlert(Value),
    /// List one KV page of keys under `prefix` from `cursor`.
    List {
        prefix: &'static str,
        cursor: Option<String>,
    },
    /// Ask Gemini's status API about `key` at `url`.
    Poll { key: String, url: String },
    /// Send `command` to the gate of `key`.
    CallGate { key: String, command: GateCommand },
    /// Delete the `open:` entry of `key`, whose gate holds no record (a delete lost before
    /// the gate's storage ended).
    DeleteIndex { key: String },
    /// Send these messages to the fan-out queue in one batch.
    Enqueue { jobs: Vec<QueuedJob> },
    /// Wait until then (the pace of status calls, or a consumer's next slot).
    Sleep { until_ms: i64 },
    /// The run is over; its line is among the logs.
    Done,
}

/// What the edge got by performing an [`Intent`] (`Err`: the call failed), handed back with
/// [`Machine::answer`].
#[derive(Debug)]
pub enum Performed {
    Lease(Result<LeaseReply, String>),
    WebhookPage(PeerAnswer),
    WebhookEnabled(PeerAnswer),
    /// Whether the alert was sent.
    AlertPosted(bool),
    Listed(Result<ListedPage, String>),
    Status(StatusAnswer),
    Gate(Result<GateReply, String>),
    IndexDeleted(Result<(), String>),
    Enqueued(Result<(), String>),
    Slept,
}

/// What the edge drives: a [`Pass`] or a queue [`Consumer`].
pub trait Machine {
    /// What to do next at `now_ms`; [`Intent::Done`] once the run is over. Each intent but
    /// `Done` owes its answer through [`Machine::answer`] before the next call; a call while
    /// one is owed is the executor's bug, and ends the driving (a pass's lease then lapses by
    /// itself) rather than doing anything twice.
    fn next(&mut self, now_ms: i64) -> Intent;
    /// What performing the last intent got, at `now_ms` (when it ended); an answer nobody
    /// asked for is ignored.
    fn answer(&mut self, performed: Performed, now_ms: i64);
    /// The lines logged since the last call, in order.
    fn drain_logs(&mut self) -> Vec<PassLog>;
}

impl Intent {
    /// Whether this is work done under the lease, while the heartbeat renews it (not the
    /// lease calls themselves, nor the end).
    pub fn under_lease(&self) -> bool {
        !matches!(self, Intent::Lease(_) | Intent::Done)
    }
}

/// The ledger's pages, as the pass lists them.
pub use crate::operation::ledger_walk::{ListedKey, ListedPage};

/// One pass; see the module documentation.
#[derive(Debug)]
pub struct Pass {
    holder: String,
    started_ms: i64,
    books: entry::Books,
    phase: Phase,
    /// The answer the edge owes, and what it is for.
    awaiting: Option<Awaiting>,
    /// The entry in hand, its run.
    entry: Option<entry::EntryRun>,
    /// Set by the heartbeat when the walk must stop: the lease was lost or may have lapsed,
    /// or no budget is left for another renewal.
    heartbeat_stop: Option<Stop>,
    last_renewed_ms: i64,
    /// Where the next pass would start if this one died now, and the status back-off: sent
    /// with each renewal.
    checkpoint: (LedgerCursor, i64),
    /// KV is not bound: nothing can be listed.
    kv_unbound: Option<String>,
    /// The webhook state last alerted on, as the lease kept it.
    webhook_alerted_state: Option<String>,
    /// The webhook check's result: `None` when it was not made, else the state now alerted on.
    webhook: Option<Option<String>>,
    /// The webhook this pass enabled again, and the sweep that follows.
    sweep: Option<restore::Sweep>,
    /// Where the polls scheduled on the fan-out queue end (from the lease, then this pass's).
    fed_until_ms: i64,
}

#[derive(Debug)]
enum Phase {
    Acquire,
    Webhook(webhook::Check),
    /// The walk is over and the webhook this pass enabled again is to be alerted; then this.
    Announce(Box<Phase>),
    Index(walk::IndexWalk),
    Audit(walk::AuditWalk),
    /// The walks are over: release the lease with what they handed on.
    Release(walk::Walked),
    Finish,
    Done,
}

/// The answer owed by the edge.
#[derive(Debug, Clone, PartialEq)]
enum Awaiting {
    Acquire,
    WebhookPage,
    WebhookEnable,
    WebhookAlert,
    Announce,
    Listed,
    Enqueue(fanout::Fed),
    Release,
}

impl Pass {
    /// A pass for `holder` (unique per run), starting at `now_ms`.
    pub fn new(limits: Limits, holder: String, now_ms: i64) -> Pass {
        Pass {
            books: entry::Books::new(limits.budget, limits),
            holder,
            started_ms: now_ms,
            phase: Phase::Acquire,
            awaiting: None,
            entry: None,
            heartbeat_stop: None,
            last_renewed_ms: now_ms,
            checkpoint: (LedgerCursor::default(), 0),
            kv_unbound: None,
            webhook_alerted_state: None,
            webhook: None,
            sweep: None,
            fed_until_ms: 0,
        }
    }

    /// KV is not bound (`error`): the pass lists nothing and stops its walk with an error.
    pub fn on_kv_unbound(&mut self, error: String) {
        self.kv_unbound = Some(error);
    }

    /// What the pass has done so far (all of it once [`Intent::Done`]).
    pub fn report(&self) -> &PassReport {
        &self.books.report
    }

    /// How often the heartbeat renews the lease.
    pub fn heartbeat_interval_ms(&self) -> i64 {
        crate::reconciliation::lease_state::heartbeat_interval_ms(self.books.limits.lease_ttl_ms)
    }

    /// Spends a subrequest on `intent`, whose answer is owed as `awaiting`; `phase` goes on.
    fn call(&mut self, phase: Phase, awaiting: Awaiting, intent: Intent) -> Option<Intent> {
        self.books.spend(1);
        self.phase = phase;
        self.awaiting = Some(awaiting);
        Some(intent)
    }

    /// The next intent of the entry in hand; `None` when nothing is left to do for it.
    fn entry_step(&mut self, now_ms: i64) -> Option<Intent> {
        self.entry.as_mut()?.step(&mut self.books, now_ms)
    }

    /// Why the walk must start nothing more, if it must: the heartbeat said so, or the
    /// deadline has come (less a third of the pass's for a routine walk an audit follows).
    fn must_stop(&self, now_ms: i64, audit_after: bool) -> Option<Stop> {
        let pass_ms = self.books.limits.deadline_ms;
        let kept_ms = audit_reserve(pass_ms) * i64::from(audit_after);
        let deadline_ms = self.started_ms + pass_ms - kept_ms;
        self.heartbeat_stop
            .or_else(|| past_deadline(now_ms, deadline_ms).then_some(Stop::Deadline))
    }
}

/// What the walks have handed on in `phase`: nothing before the routine walk ends.
fn walked(phase: &Phase) -> Option<&walk::Walked> {
    match phase {
        Phase::Audit(walk) => Some(&walk.walked),
        Phase::Release(walked) => Some(walked),
        Phase::Announce(next) => walked(next),
        _ => None,
    }
}

impl Machine for Pass {
    fn next(&mut self, now_ms: i64) -> Intent {
        loop {
            if self.awaiting.is_some() || self.entry.as_ref().is_some_and(entry::EntryRun::owes) {
                debug_assert!(false, "next() while {:?} is owed", self.awaiting);
                return Intent::Done;
            }
            let flow = match std::mem::replace(&mut self.phase, Phase::Done) {
                Phase::Acquire => self.acquire(),
                Phase::Webhook(check) => self.webhook_step(check),
                Phase::Announce(then) => self.announce_step(*then),
                Phase::Index(walk) => self.index_step(walk, now_ms),
                Phase::Audit(walk) => self.audit_step(walk, now_ms),
                Phase::Release(walked) => self.release(walked, now_ms),
                Phase::Finish => self.finish(now_ms),
                Phase::Done => return Intent::Done,
            };
            if let Some(intent) = flow {
                return intent;
            }
        }
    }

    fn answer(&mut self, performed: Performed, now_ms: i64) {
        use Awaiting as A;
        use Performed as P;
        match (self.awaiting.take(), performed) {
            (Some(A::Acquire), P::Lease(reply)) => self.on_acquired(reply, now_ms),
            (Some(A::Release), P::Lease(reply)) => self.on_released(reply),
            (Some(A::WebhookPage), P::WebhookPage(page)) => self.on_webhook_page(page),
            (Some(A::WebhookEnable), P::WebhookEnabled(answer)) => self.on_webhook_enabled(answer),
            (Some(A::WebhookAlert), P::AlertPosted(sent)) => self.on_alert_posted(sent),
            (Some(A::Announce), P::AlertPosted(sent)) => self.on_announced(sent),
            (Some(A::Listed), P::Listed(page)) => self.on_listed(page),
            (Some(A::Enqueue(fed)), P::Enqueued(sent)) => self.on_fed(fed, sent),
            (None, performed) => match self.entry.as_mut() {
                Some(run) => run.answer(&mut self.books, performed, now_ms),
                None => debug_assert!(false, "an answer nobody asked for: {performed:?}"),
            },
            (owed, performed) => {
                debug_assert!(false, "{performed:?} while {owed:?} is owed");
                self.awaiting = owed;
            }
        }
    }

    fn drain_logs(&mut self) -> Vec<PassLog> {
        std::mem::take(&mut self.books.logs)
    }
}
