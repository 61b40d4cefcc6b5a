//! One reconciliation pass (the cron's slow path): list the `open:` index of operations that
//! may need work, decide from metadata, and turn what Gemini's status API says into events for
//! the gates; when the audit is due (`RECONCILE_AUDIT_SECONDS`), also walk the whole `op:`
//! ledger with the audit's own cursor, on a reserved third of the budget and deadline, acting
//! on what the index missed and asking those gates to re-index.
//!
//! Cost: a routine pass lists the whole index first (one KV list per 1,000 open operations,
//! up to [`MAX_INDEX_PAGES`] pages, then in windows), so a quiet ledger costs O(open) KV lists
//! however much it retains; it then visits the listed entries in key order from where the last
//! pass stopped, as far as budget and deadline allow.
//!
//! Guarantees: the pass writes no state itself, every change goes through a gate; it reads no
//! ledger value; it holds the lease or does nothing; it never spends more than
//! `RECONCILE_BUDGET` subrequests (KV list calls, gate calls, lease calls and status calls
//! together) and resumes where it stopped on the next run; it starts no entry after
//! `RECONCILE_DEADLINE_SECONDS` and saves its cursor; a heartbeat renews its short lease
//! (`RECONCILE_LEASE_SECONDS`) every quarter of the TTL while it works, saving its position
//! each time, and a refused renewal (another pass holds the lease) stops the pass without a
//! release, so it never saves a cursor over the new holder's. A 429 or 5xx from the status API
//! stops polling until its Retry-After has passed and settles nothing, and the next pass
//! resumes at the first entry that was skipped for it (if the wait is shorter than a cron
//! interval); a status call that gets no answer within [`status_api::STATUS_TIMEOUT_MS`] (or
//! a network error) skips only its entry, which the next coverage of the ledger revisits, and three in a
//! row back off every status call like a 429; a 404 asks the gate for an `unknown_to_gemini`
//! alert; a malformed answer is logged and skipped.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures_util::future::{select, Either};
use serde_json::{json, Value};
use worker::{Delay, Env, KvStore};

use crate::config::Config;
use crate::operation::alert::AlertKind;
use crate::operation::gate_protocol::{EffectReport, GateCommand, GateReply};
use crate::operation::key::Collection;
use crate::operation::ledger::{LedgerMeta, OPEN_PREFIX, OP_PREFIX};
use crate::operation::lifecycle::{Source, Status};
use crate::operation::observation::StatusError;
use crate::operation::OpEvent;
use crate::reconciliation::lease_protocol::{LeaseCommand, LeaseReply};
use crate::reconciliation::reconcile::{
    audit_reserve, audit_verdict, decide, heartbeat_interval_ms, lease_presumed_lapsed,
    past_deadline, resume_index, Action, AuditProgress, AuditVerdict, Resume, StatusHealth, Stop,
    Thresholds, MAX_INDEX_PAGES,
};
use crate::reconciliation::status::{find_webhook, status_url, webhook_alert};
use crate::retry::Class;

use super::outbound::status_api;
use super::EdgeError;
use super::{call_gate, log, now_ms, random_unit};
use crate::edge::objects::lease_object::LEASE_NAME;
use crate::edge::outbound::fetch::{post_alert, Answer, SkimAnswer};
use crate::edge::outbound::ledger_kv::KV_BINDING;

/// The lease object's binding.
pub const LEASE_BINDING: &str = "RECONCILE_LEASE";
/// Largest KV list page.
const PAGE_SIZE: u64 = 1_000;
/// A backoff ending within this long (one cron interval) holds the next pass's start at the
/// first entry it skipped; a longer one does not, or every pass until it ends would spend its
/// budget on the same stretch of the ledger and never reach retries and alerts beyond it.
const HOLD_BACKOFF_UP_TO_MS: i64 = 300_000;

/// What a pass did: the `reconcile_pass` log line.
#[derive(Debug, Default)]
pub struct PassReport {
    /// Entries returned by KV lists, index and audit together.
    pub listed: u64,
    /// KV list calls, index and audit together.
    pub kv_lists: u64,
    /// Of those, the routine walk's over `open:`.
    pub index_listed: u64,
    pub index_kv_lists: u64,
    /// Index entries decided on (the rest of the listed index waits for the next pass).
    pub visited: u64,
    /// Whether the audit over `op:` ran in this pass, and what it did.
    pub audit: bool,
    pub audit_listed: u64,
    pub audit_kv_lists: u64,
    /// `op:` entries that may need work and were not in the index: acted on.
    pub audit_found: u64,
    /// Gates asked to project again: by the audit (an index entry missing, or left behind),
    /// or by the routine walk when a gate answered that the operation it was listed for is
    /// closed, its side effect done (a lost delete, or a lagging list).
    pub reindexed: u64,
    pub audit_complete: bool,
    pub bodies_read: u64,
    pub status_calls: u64,
    /// Status calls that timed out or failed to connect; their entries were skipped.
    pub status_unanswered: u64,
    pub settled: u64,
    pub effects_retried: u64,
    pub alerts: u64,
    pub gate_calls: u64,
    pub errors: u64,
    pub subrequests: u32,
    pub lease_renewals: u64,
    pub complete: bool,
    pub skipped_busy: bool,
    pub stopped: Option<Stop>,
    pub elapsed_ms: i64,
}

impl PassReport {
    fn to_json(&self) -> Value {
        json!({
            "event": "reconcile_pass",
            "listed": self.listed,
            "kv_lists": self.kv_lists,
            "index_listed": self.index_listed,
            "index_kv_lists": self.index_kv_lists,
            "visited": self.visited,
            "audit": self.audit,
            "audit_listed": self.audit_listed,
            "audit_kv_lists": self.audit_kv_lists,
            "audit_found": self.audit_found,
            "reindexed": self.reindexed,
            "audit_complete": self.audit_complete,
            "bodies_read": self.bodies_read,
            "status_calls": self.status_calls,
            "status_unanswered": self.status_unanswered,
            "settled": self.settled,
            "effects_retried": self.effects_retried,
            "alerts": self.alerts,
            "gate_calls": self.gate_calls,
            "errors": self.errors,
            "subrequests": self.subrequests,
            "lease_renewals": self.lease_renewals,
            "complete": self.complete,
            "lease_busy": self.skipped_busy,
            "stopped": self.stopped.map(Stop::label),
            "elapsed_ms": self.elapsed_ms,
        })
    }
}

/// What the walk and the heartbeat share. Both run on the one task of this invocation,
/// interleaved at their awaits, so plain cells suffice.
#[derive(Default)]
struct Shared {
    /// Subrequests spent by the walk and the heartbeat together.
    spent: Cell<u32>,
    renewals: Cell<u64>,
    heartbeat_errors: Cell<u64>,
    /// Set by the heartbeat when the walk must stop: the lease was lost or may have lapsed,
    /// or no budget is left for another renewal.
    stop: Cell<Option<Stop>>,
    /// Where the next pass would start if this one died now, and the status back-off: sent
    /// with each renewal.
    checkpoint: RefCell<(Resume, i64)>,
    /// How far the audit has got, when this pass audits: sent with each renewal.
    audit: RefCell<Option<AuditProgress>>,
}

struct Pass<'a> {
    env: &'a Env,
    config: &'a Config,
    shared: &'a Shared,
    deadline_ms: i64,
    /// The budget and deadline the current walk may use: the whole, or two thirds for the
    /// routine walk when an audit is due.
    budget_limit: u32,
    walk_deadline_ms: i64,
    report: PassReport,
    status_backoff_until_ms: i64,
    health: StatusHealth,
    /// Where the walk was before the first entry it owed a poll and skipped because Gemini
    /// asked us to wait (429/5xx, Retry-After, ending within [`HOLD_BACKOFF_UP_TO_MS`]): the
    /// next pass starts there, so a rate limit does not leave the rest of the ledger unpolled
    /// for a whole coverage. The entry whose call failed is not held (it was tried; holding
    /// it could stall every pass on it).
    first_unpolled: Option<Resume>,
    /// The index as listed by this pass: key → the version its entry shows.
    indexed: HashMap<String, u64>,
    /// Whether that listing was the whole index (from the start to the end).
    index_whole: bool,
    /// Keys the routine walk acted on: their ledger entries may have changed since the index
    /// was listed, so the audit does not judge them.
    touched: HashSet<String>,
}

/// Runs one pass and logs its line. Never panics; errors are counted and logged.
pub async fn run(env: &Env, config: &Config) -> PassReport {
    let started = now_ms();
    let holder = format!(
        "pass-{started}-{:08x}",
        (random_unit() * f64::from(u32::MAX)) as u32
    );
    let ttl_ms = config.reconcile_lease_secs * 1_000;
    let shared = Shared::default();
    let mut pass = Pass {
        env,
        config,
        shared: &shared,
        deadline_ms: started + config.reconcile_deadline_secs * 1_000,
        budget_limit: config.reconcile_budget,
        walk_deadline_ms: started + config.reconcile_deadline_secs * 1_000,
        report: PassReport::default(),
        status_backoff_until_ms: 0,
        health: StatusHealth::default(),
        first_unpolled: None,
        indexed: HashMap::new(),
        index_whole: false,
        touched: HashSet::new(),
    };
    pass.spend(1);
    let acquired = lease_call(
        env,
        &LeaseCommand::Acquire {
            holder: holder.clone(),
            ttl_ms,
        },
    )
    .await;
    let (resume, stop, webhook, audit) = match acquired {
        Ok(LeaseReply::Granted {
            resume,
            status_backoff_until_ms,
            webhook_alerted_state,
            audit,
        }) => {
            pass.status_backoff_until_ms = status_backoff_until_ms;
            // A cursor saved before the index existed points into `op:`: start the index over.
            let resume = if resume
                .after_key
                .as_deref()
                .is_some_and(|k| !k.starts_with(OPEN_PREFIX))
            {
                Resume::default()
            } else {
                resume
            };
            *shared.checkpoint.borrow_mut() = (resume.clone(), status_backoff_until_ms);
            let audit_from = audit.due(started, config.reconcile_audit_secs * 1_000);
            if audit_from.is_some() {
                // Keep a third of the budget and of the deadline for the audit.
                let budget = i64::from(config.reconcile_budget);
                pass.budget_limit = (budget - audit_reserve(budget)) as u32;
                pass.walk_deadline_ms =
                    pass.deadline_ms - audit_reserve(config.reconcile_deadline_secs * 1_000);
            }
            let work = async {
                let webhook = match &config.gemini_webhook_name {
                    Some(name) => pass.check_webhook(name, webhook_alerted_state).await,
                    None => None,
                };
                let (resume, stop) = pass.walk(resume).await;
                pass.budget_limit = config.reconcile_budget;
                pass.walk_deadline_ms = pass.deadline_ms;
                let audit = match audit_from {
                    Some(from) if stop.audits_after() => Some(pass.audit(from).await),
                    _ => None,
                };
                (resume, stop, webhook, audit)
            };
            let beat = heartbeat(env, &holder, ttl_ms, config.reconcile_budget, &shared);
            // The heartbeat runs beside the walk; it ends only to stop the walk (which then
            // finishes its entry in hand), and is dropped when the walk ends first.
            match select(Box::pin(work), Box::pin(beat)).await {
                Either::Left((done, _)) => done,
                Either::Right(((), work)) => work.await,
            }
        }
        Ok(_) => {
            pass.report.skipped_busy = true;
            return pass.finish(started);
        }
        Err(e) => {
            pass.report.errors += 1;
            log(json!({"event": "reconcile_error", "error": format!("lease: {e}")}));
            return pass.finish(started);
        }
    };
    // A lost lease wins over whatever stopped the walk: it must not release.
    let stop = shared
        .stop
        .get()
        .filter(|s| *s == Stop::LeaseLost)
        .unwrap_or(stop);
    pass.report.stopped = Some(stop);
    pass.report.complete = stop == Stop::Complete;
    if !stop.releases() {
        log(json!({"event": "reconcile_lease_lost", "holder": holder}));
        return pass.finish(started);
    }
    pass.spend(1);
    pass.report.elapsed_ms = now_ms() - started;
    pass.sync_report();
    let release = LeaseCommand::Release {
        holder,
        resume,
        complete: pass.report.complete,
        status_backoff_until_ms: pass.status_backoff_until_ms,
        webhook_checked: webhook.is_some(),
        webhook_alerted_state: webhook.flatten(),
        audit,
        summary: json!({"at": crate::timestamp::format_rfc3339(started), "report": pass.report.to_json()}),
    };
    match lease_call(env, &release).await {
        Ok(LeaseReply::Released { accepted: true }) => {}
        Ok(other) => log(
            json!({"event": "reconcile_error", "error": format!("lease release refused: {other:?}")}),
        ),
        Err(e) => {
            pass.report.errors += 1;
            log(json!({"event": "reconcile_error", "error": format!("lease release: {e}")}));
        }
    }
    pass.finish(started)
}

/// Renews the lease every quarter of its TTL while the walk runs, sending the walk's
/// checkpoint with each renewal. Returns only when the walk must stop: a renewal was refused
/// (the lease is lost), renewals failed for a whole TTL (it may have lapsed), or the budget
/// has no room left for a renewal and the release.
async fn heartbeat(env: &Env, holder: &str, ttl_ms: i64, budget: u32, shared: &Shared) {
    let interval = heartbeat_interval_ms(ttl_ms);
    let mut last_renewed = now_ms();
    loop {
        Delay::from(Duration::from_millis(interval as u64)).await;
        if shared.spent.get() + 2 > budget {
            shared.stop.set(Some(Stop::Budget));
            return;
        }
        shared.spent.set(shared.spent.get() + 1);
        shared.renewals.set(shared.renewals.get() + 1);
        let (resume, status_backoff_until_ms) = shared.checkpoint.borrow().clone();
        let renew = LeaseCommand::Renew {
            holder: holder.to_string(),
            ttl_ms,
            resume,
            status_backoff_until_ms,
            audit: shared.audit.borrow().clone(),
        };
        match lease_call(env, &renew).await {
            Ok(LeaseReply::Renewed { accepted: true }) => last_renewed = now_ms(),
            Ok(other) => {
                log(
                    json!({"event": "reconcile_error", "error": format!("lease renewal refused: {other:?}")}),
                );
                shared.stop.set(Some(Stop::LeaseLost));
                return;
            }
            Err(e) => {
                shared
                    .heartbeat_errors
                    .set(shared.heartbeat_errors.get() + 1);
                log(json!({"event": "reconcile_error", "error": format!("lease renewal: {e}")}));
                if lease_presumed_lapsed(now_ms(), last_renewed, ttl_ms) {
                    shared.stop.set(Some(Stop::LeaseLapsed));
                    return;
                }
            }
        }
    }
}

impl Pass<'_> {
    /// Counts `n` subrequests against the budget the heartbeat shares.
    fn spend(&self, n: u32) {
        self.shared.spent.set(self.shared.spent.get() + n);
    }

    /// Room for `cost` more subrequests in the current walk's share, keeping one for the
    /// lease release.
    fn affords(&self, cost: u32) -> bool {
        self.shared.spent.get() + cost < self.budget_limit
    }

    /// Why the walk must start nothing more, if it must: the heartbeat said so, or the
    /// deadline has come.
    fn must_stop(&self) -> Option<Stop> {
        self.shared
            .stop
            .get()
            .or_else(|| past_deadline(now_ms(), self.walk_deadline_ms).then_some(Stop::Deadline))
    }

    /// Records where the next pass would start if this one ended now, for the heartbeat.
    fn checkpoint(&self, resume: &Resume) {
        let at = self
            .first_unpolled
            .clone()
            .unwrap_or_else(|| resume.clone());
        *self.shared.checkpoint.borrow_mut() = (at, self.status_backoff_until_ms);
    }

    fn sync_report(&mut self) {
        self.report.subrequests = self.shared.spent.get();
        self.report.lease_renewals = self.shared.renewals.get();
    }

    /// Logs the pass's line and returns its report.
    fn finish(mut self, started: i64) -> PassReport {
        self.sync_report();
        self.report.errors += self.shared.heartbeat_errors.get();
        self.report.elapsed_ms = now_ms() - started;
        log(self.report.to_json());
        self.report
    }

    /// Walks the ledger from `resume`; returns where the next pass starts and why this one
    /// stopped. Entries skipped for a short backoff hold the resume point back (see
    /// `first_unpolled`): the walk goes on (retries and alerts further on still happen) but
    /// the next pass starts again at the first of them.
    async fn walk(&mut self, resume: Resume) -> (Resume, Stop) {
        let (resume, stop) = self.walk_from(resume).await;
        match self.first_unpolled.take() {
            Some(held) if stop == Stop::Complete => (held, Stop::HeldForBackoff),
            Some(held) => (held, stop),
            None => (resume, stop),
        }
    }

    /// The routine walk: lists the index window that starts at `resume.cursor` (the whole
    /// index unless it has more than [`MAX_INDEX_PAGES`] pages), then decides on and acts for
    /// its entries after `resume.after_key`, in key order, as budget and deadline allow.
    async fn walk_from(&mut self, resume: Resume) -> (Resume, Stop) {
        let kv = match self.env.kv(KV_BINDING) {
            Ok(kv) => kv,
            Err(e) => {
                self.report.errors += 1;
                log(json!({"event": "reconcile_error", "error": format!("kv binding: {e}")}));
                return (resume, Stop::Error);
            }
        };
        let mut window = resume.cursor.clone();
        let mut cursor = window.clone();
        let mut entries: Vec<(String, Option<LedgerMeta>)> = Vec::new();
        let mut pages = 0;
        // Where the next window starts, when this one is not the index's end.
        let next_window = loop {
            if let Some(stop) = self.must_stop() {
                return (resume, stop);
            }
            if !self.affords(1) {
                return (resume, Stop::Budget);
            }
            let page = match self.list(&kv, OPEN_PREFIX, cursor.clone(), false).await {
                Ok(p) => p,
                Err(e) if cursor.is_some() && pages == 0 => {
                    // A saved cursor KV no longer accepts (expired, or from before the
                    // index): list the index from its start.
                    log(json!({"event": "reconcile_cursor_reset", "error": e}));
                    window = None;
                    cursor = None;
                    continue;
                }
                Err(e) => {
                    self.report.errors += 1;
                    log(json!({"event": "reconcile_error", "error": format!("kv list: {e}")}));
                    return (resume, Stop::Error);
                }
            };
            pages += 1;
            for entry in page.keys {
                let meta: Option<LedgerMeta> =
                    entry.metadata.and_then(|m| serde_json::from_value(m).ok());
                entries.push((entry.name, meta));
            }
            if page.list_complete || page.cursor.is_none() {
                break None;
            }
            cursor = page.cursor;
            if pages >= MAX_INDEX_PAGES {
                break cursor;
            }
        };
        self.index_whole = window.is_none() && next_window.is_none();
        for (name, meta) in &entries {
            if let (Some(key), Some(meta)) = (name.strip_prefix(OPEN_PREFIX), meta) {
                self.indexed.insert(key.to_string(), meta.version);
            }
        }
        let mut position = Resume {
            cursor: window,
            after_key: resume.after_key.clone(),
        };
        let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
        let start = resume_index(&names, resume.after_key.as_deref());
        for (name, meta) in &entries[start..] {
            let Some(key) = name.strip_prefix(OPEN_PREFIX) else {
                continue;
            };
            if let Some(stop) = self.must_stop() {
                return (position, stop);
            }
            let Some(meta) = meta else {
                self.report.errors += 1;
                log(
                    json!({"event": "reconcile_error", "key": key, "error": "unreadable index metadata"}),
                );
                position.after_key = Some(name.clone());
                continue;
            };
            let now = now_ms();
            let actions = decide(meta, now.div_euclid(1_000), &self.thresholds());
            let cost: u32 = actions.iter().map(Action::cost).sum();
            if !self.affords(cost) {
                return (position, Stop::Budget);
            }
            self.report.visited += 1;
            if !actions.is_empty() {
                self.touched.insert(key.to_string());
            }
            let mut polled = true;
            for action in actions {
                polled &= self.act(key, meta, action).await;
            }
            if !polled && self.first_unpolled.is_none() {
                self.first_unpolled = Some(position.clone());
            }
            position.after_key = Some(name.clone());
            self.checkpoint(&position);
        }
        match next_window {
            None => (Resume::default(), Stop::Complete),
            Some(c) => (
                Resume {
                    cursor: Some(c),
                    after_key: None,
                },
                Stop::Window,
            ),
        }
    }

    /// One KV list page under `prefix`, counted against the budget and in the report.
    async fn list(
        &mut self,
        kv: &KvStore,
        prefix: &str,
        cursor: Option<String>,
        audit: bool,
    ) -> Result<worker::kv::ListResponse, EdgeError> {
        self.spend(1);
        self.report.kv_lists += 1;
        let page = list_page(kv, prefix, cursor).await?;
        let n = page.keys.len() as u64;
        self.report.listed += n;
        if audit {
            self.report.audit_kv_lists += 1;
            self.report.audit_listed += n;
        } else {
            self.report.index_kv_lists += 1;
            self.report.index_listed += n;
        }
        Ok(page)
    }

    /// The audit: walks `op:` from `resume` (its own cursor) on what budget and time are left,
    /// and acts on what the index missed. With the index listed whole in this pass, an entry
    /// that may need work and is not in it is acted on and its gate asked to re-index, and an
    /// index entry left behind by a closed operation is removed the same way; otherwise every
    /// entry that may need work is acted on (a harmless second visit) and nothing re-indexed.
    async fn audit(&mut self, mut resume: Resume) -> AuditProgress {
        self.report.audit = true;
        let stopped = |resume: Resume| AuditProgress {
            resume,
            complete: false,
        };
        let kv = match self.env.kv(KV_BINDING) {
            Ok(kv) => kv,
            Err(_) => return stopped(resume),
        };
        loop {
            if self.must_stop().is_some() || !self.affords(1) {
                return stopped(resume);
            }
            let page = match self.list(&kv, OP_PREFIX, resume.cursor.clone(), true).await {
                Ok(p) => p,
                Err(e) => {
                    self.report.errors += 1;
                    log(
                        json!({"event": "reconcile_error", "error": format!("audit kv list: {e}")}),
                    );
                    // A cursor KV no longer accepts would stall every audit: start over.
                    return stopped(Resume::default());
                }
            };
            for entry in &page.keys {
                if resume.already_done(&entry.name) {
                    continue;
                }
                let Some(key) = entry.name.strip_prefix(OP_PREFIX) else {
                    continue;
                };
                if self.must_stop().is_some() {
                    return stopped(resume);
                }
                let meta: Option<LedgerMeta> = entry
                    .metadata
                    .clone()
                    .and_then(|m| serde_json::from_value(m).ok());
                let verdict = match &meta {
                    Some(_) if self.touched.contains(key) => AuditVerdict::Fine,
                    Some(m) => audit_verdict(m, self.index_whole, self.indexed.get(key).copied()),
                    None => AuditVerdict::Fine,
                };
                let reindex = self.index_whole && verdict != AuditVerdict::Fine;
                let actions = match (&meta, verdict) {
                    (Some(m), AuditVerdict::Missed) => {
                        decide(m, now_ms().div_euclid(1_000), &self.thresholds())
                    }
                    _ => Vec::new(),
                };
                let cost: u32 = actions.iter().map(Action::cost).sum::<u32>() + u32::from(reindex);
                if !self.affords(cost) {
                    return stopped(resume);
                }
                if verdict == AuditVerdict::Missed {
                    self.report.audit_found += 1;
                    if self.index_whole {
                        log(json!({"event": "index_missed", "key": key}));
                    }
                }
                if let Some(m) = &meta {
                    for action in actions {
                        self.act(key, m, action).await;
                    }
                }
                if reindex {
                    if verdict == AuditVerdict::Stale {
                        log(json!({"event": "index_stale", "key": key}));
                    }
                    self.report.reindexed += 1;
                    self.gate(key, &GateCommand::Reindex).await;
                }
                resume.after_key = Some(entry.name.clone());
                *self.shared.audit.borrow_mut() = Some(stopped(resume.clone()));
            }
            if page.list_complete || page.cursor.is_none() {
                self.report.audit_complete = true;
                return AuditProgress {
                    resume: Resume::default(),
                    complete: true,
                };
            }
            resume = Resume {
                cursor: page.cursor.clone(),
                after_key: None,
            };
            *self.shared.audit.borrow_mut() = Some(stopped(resume.clone()));
        }
    }

    /// Checks the Gemini webhook's own state (`GET v1beta/webhooks`) and alerts once per
    /// state change when it is not `enabled`. Returns the state now alerted on, or `None` when
    /// the check could not be made (the mark then stays as it was).
    async fn check_webhook(
        &mut self,
        name: &str,
        alerted: Option<String>,
    ) -> Option<Option<String>> {
        const MAX_PAGES: usize = 5;
        let mut token: Option<String> = None;
        let mut state = None;
        for _ in 0..MAX_PAGES {
            if !self.affords(2) {
                return None;
            }
            let mut url = format!(
                "{}/v1beta/webhooks?page_size=1000",
                self.config.gemini_api_base
            );
            if let Some(t) = &token {
                url.push_str(&format!(
                    "&page_token={}",
                    percent_encoding::utf8_percent_encode(t, percent_encoding::NON_ALPHANUMERIC)
                ));
            }
            let answer = self.gemini_get(&url).await;
            let page = match (&answer, answer.class()) {
                (Answer::Http { excerpt, .. }, Class::Success) => find_webhook(excerpt, name),
                (Answer::Http { status, .. }, Class::Refused) => Err(StatusError::Refused(*status)),
                // Said in the log line, so an operator sees how long Gemini asked to wait.
                (Answer::Http { retry_after, .. }, _) => Err(
                    crate::operation::observation::transient(retry_after.as_deref()),
                ),
                _ => Err(StatusError::Transient {
                    retry_after_secs: 0,
                }),
            };
            match page {
                Ok(page) => {
                    state = page.state.or(state);
                    token = page.next_page_token;
                    if state.is_some() || token.is_none() {
                        break;
                    }
                }
                Err(e) => {
                    self.report.errors += 1;
                    log(
                        json!({"event": "webhook_check_failed", "webhook": name, "error": format!("{e:?}")}),
                    );
                    return None;
                }
            }
        }
        let state = state.unwrap_or_else(|| "not_found".to_string());
        let (alert, mark) = webhook_alert(alerted.as_deref(), &state);
        log(json!({"event": "webhook_state", "webhook": name, "state": state}));
        if alert {
            let body = crate::operation::alert::webhook_disabled(name, &state);
            if post_alert(self.config, &body).await {
                self.report.alerts += 1;
            } else {
                return Some(alerted); // not sent: keep the old mark so the next pass tries again
            }
        }
        Some(mark)
    }

    /// One GET to Gemini's API with the API key, counted against the budget.
    async fn gemini_get(&mut self, url: &str) -> Answer {
        self.spend(1);
        status_api::get(self.config, url).await
    }

    fn thresholds(&self) -> Thresholds {
        Thresholds {
            grace_secs: self.config.reconcile_grace_secs,
            stuck_after_secs: self.config.stuck_after_secs,
            effect_alert_after_secs: self.config.effect_alert_after_secs,
        }
    }

    /// Runs one action; false when it was a poll skipped because Gemini asked us to wait.
    async fn act(&mut self, key: &str, meta: &LedgerMeta, action: Action) -> bool {
        match action {
            Action::Poll => return self.poll(key, meta).await,
            Action::RetryEffect => {
                self.report.effects_retried += 1;
                let reply = self.gate(key, &GateCommand::RetryEffect).await;
                self.reindex_if_done(key, reply.as_ref()).await;
            }
            Action::Alert { kind, age_secs } => {
                let command = GateCommand::Alert {
                    alert: kind,
                    age_seconds: age_secs,
                };
                if let Some(GateReply::AlertSent { sent: true }) = self.gate(key, &command).await {
                    self.report.alerts += 1;
                }
            }
        }
        true
    }

    async fn gate(&mut self, key: &str, command: &GateCommand) -> Option<GateReply> {
        self.spend(1);
        self.report.gate_calls += 1;
        match call_gate(self.env, key, command).await {
            Ok(reply) => Some(reply),
            Err(e) => {
                self.report.errors += 1;
                log(json!({"event": "reconcile_error", "key": key, "error": e}));
                None
            }
        }
    }

    /// Polls Gemini for one operation and hands a change to its gate. False when it did not
    /// ask because Gemini asked us to wait, and the wait ends before the next cron run.
    async fn poll(&mut self, key: &str, meta: &LedgerMeta) -> bool {
        let now = now_ms();
        if now < self.status_backoff_until_ms {
            // Gemini asked us to wait; the next pass asks again, starting here if it is soon.
            return self.status_backoff_until_ms - now > HOLD_BACKOFF_UP_TO_MS;
        }
        let Some(collection) = Collection::of_key(key) else {
            return true;
        };
        let url = status_url(&self.config.gemini_api_base, collection, key, &meta.name);
        self.report.status_calls += 1;
        self.spend(1);
        let answer = status_api::read(self.config, key, &url).await;
        let interpreted = match &answer {
            SkimAnswer::Http { .. } => {
                self.health.answered();
                status_api::interpret_answer(collection, &answer)
            }
            SkimAnswer::Timeout | SkimAnswer::Network(_) => {
                // Only this entry's trouble, unless a run of them says the API's: the cursor
                // moves past it and the next coverage of the ledger asks again.
                self.report.errors += 1;
                self.report.status_unanswered += 1;
                let backoff = self.health.unanswered(now_ms());
                if let Some(until) = backoff {
                    self.status_backoff_until_ms = self.status_backoff_until_ms.max(until);
                }
                log(json!({
                    "event": "status_unanswered",
                    "key": key,
                    "answer": match &answer { SkimAnswer::Network(e) => json!(e), _ => json!("timeout") },
                    "backoff_secs": backoff.map(|until| (until - now_ms()).div_euclid(1_000)),
                }));
                return true;
            }
        };
        let observation = match interpreted {
            Ok(o) => o,
            Err(StatusError::NotFound) => {
                log(json!({"event": "status_not_found", "key": key}));
                if !meta.alerts.contains(&AlertKind::UnknownToGemini) {
                    let age = now.div_euclid(1_000) - meta.submitted_at;
                    let command = GateCommand::Alert {
                        alert: AlertKind::UnknownToGemini,
                        age_seconds: age,
                    };
                    if let Some(GateReply::AlertSent { sent: true }) =
                        self.gate(key, &command).await
                    {
                        self.report.alerts += 1;
                    }
                }
                return true;
            }
            Err(StatusError::Transient { retry_after_secs }) => {
                self.report.errors += 1;
                self.status_backoff_until_ms = self
                    .status_backoff_until_ms
                    .max(now + retry_after_secs * 1_000);
                log(
                    json!({"event": "status_transient", "key": key, "retry_after_secs": retry_after_secs,
                    "answer": match &answer { SkimAnswer::Http { status, .. } => json!(status), _ => Value::Null }}),
                );
                return true;
            }
            Err(StatusError::Malformed(reason)) => {
                // The answer will not get better by asking again: alert once, with the reason,
                // so a person can settle it (the gate keeps the mark; the ledger carries it).
                self.report.errors += 1;
                log(json!({"event": "status_unusable", "key": key, "error": reason}));
                if !meta.alerts.contains(&AlertKind::StatusUnusable) {
                    let command = GateCommand::StatusUnusable {
                        reason,
                        age_seconds: now.div_euclid(1_000) - meta.submitted_at,
                    };
                    if let Some(GateReply::AlertSent { sent: true }) =
                        self.gate(key, &command).await
                    {
                        self.report.alerts += 1;
                    }
                }
                return true;
            }
            Err(e) => {
                self.report.errors += 1;
                log(json!({"event": "status_unusable", "key": key, "error": format!("{e:?}")}));
                return true;
            }
        };
        if let Status::Unknown(raw) = &observation.status {
            log(json!({"event": "status_unknown_state", "key": key, "state": raw}));
            return true;
        }
        if observation.status == meta.status {
            return true; // nothing new for the gate: save the round trip
        }
        let command = GateCommand::Deliver {
            key: key.to_string(),
            name: meta.name.clone(),
            event: OpEvent {
                status: observation.status.clone(),
                update_time_ms: observation.update_time_ms,
                source: Source::Reconcile,
                details: observation.details,
                delivery_id: None,
            },
            require_registration: false,
            hold_ms: self.config.unregistered_hold_ms(),
        };
        let reply = self.gate(key, &command).await;
        if let Some(GateReply::Applied { status, .. }) = &reply {
            if status.is_terminal() {
                self.report.settled += 1;
                log(json!({"event": "settled_by_reconcile", "key": key, "status": status}));
            }
        }
        self.reindex_if_done(key, reply.as_ref()).await;
        true
    }

    /// The entry was listed as needing work, but its gate says the side effect is done: the
    /// listing is stale (an index entry whose delete was lost, or a list lagging behind a
    /// close). Ask the gate to project again, which deletes the index entry, so a lost delete
    /// costs one trip, not one per pass. A pass-level race (closed since it was listed) costs
    /// at most one redundant projection.
    async fn reindex_if_done(&mut self, key: &str, reply: Option<&GateReply>) {
        let done = matches!(
            reply,
            Some(
                GateReply::Effect {
                    effect: EffectReport::Delivered
                } | GateReply::Dropped {
                    effect: EffectReport::Delivered,
                    ..
                }
            )
        );
        if done && self.affords(1) {
            self.report.reindexed += 1;
            log(json!({"event": "index_stale", "key": key}));
            self.gate(key, &GateCommand::Reindex).await;
        }
    }
}

async fn list_page(
    kv: &KvStore,
    prefix: &str,
    cursor: Option<String>,
) -> Result<worker::kv::ListResponse, EdgeError> {
    let mut list = kv.list().prefix(prefix.to_string()).limit(PAGE_SIZE);
    if let Some(c) = cursor {
        list = list.cursor(c);
    }
    list.execute().await.map_err(EdgeError::from)
}

async fn lease_call(env: &Env, command: &LeaseCommand) -> Result<LeaseReply, EdgeError> {
    super::post_json(&super::stub_for(env, LEASE_BINDING, LEASE_NAME)?, command).await
}
