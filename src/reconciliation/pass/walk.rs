//! The pass's two walks, each holding its own state: the routine walk over the `open:` index,
//! and the audit over the whole `op:` ledger, handed what the routine walk saw and its end.
//!
//! Guarantees: the routine walk lists its window of the index (all of it up to
//! [`MAX_INDEX_PAGES`] pages) before it acts, then starts no entry past its deadline, without
//! the budget for the entry's actions, or once the heartbeat says stop, and saves its
//! position after each entry; a saved cursor KV refuses lists the index from its start.
//! Entries skipped for a short status back-off hold the next pass's start at the first of
//! them. A walk from the index's start (a new coverage) lists the index, then schedules and
//! polls nothing while polls on the fan-out queue are still due (before the lease's
//! `fed_until_ms`), so no entry is scheduled beside an earlier copy of itself (`fanout.rs`).
//! The audit acts only on what the index missed when the index was listed whole in this
//! pass (otherwise on every entry that may need work, and re-indexes nothing), never judges an
//! entry the routine walk acted on, and saves its own cursor after each entry.

use std::collections::{HashMap, HashSet};
use std::mem;

use crate::operation::ledger::{LedgerMeta, OpenCounts, OPEN_PREFIX, OP_PREFIX};
use crate::operation::ledger_walk::LedgerCursor;
use crate::reconciliation::entry_decision::{audit_verdict, Action, AuditVerdict};
use crate::reconciliation::lease_state::{resume_index, AuditProgress, MAX_INDEX_PAGES};

use super::stop::Stop;

use super::entry::{EntryRun, Step};
use super::{Awaiting, Intent, ListedKey, ListedPage, Pass, PassLog, Phase};

/// The routine walk over one window of the index, and what it hands the audit.
#[derive(Debug, Default)]
pub(super) struct IndexWalk {
    /// The page cursor this window starts at (`None`: the index's start).
    window: Option<String>,
    cursor: Option<String>,
    pages: u32,
    pub(super) entries: Vec<(String, Option<LedgerMeta>)>,
    /// Whether the window is listed, and where the next one starts if this is not the end.
    listed: bool,
    next_window: Option<String>,
    /// Where the walk was asked to start until the window is listed, then the last entry
    /// done: where the next pass starts.
    pub(super) position: LedgerCursor,
    /// The next entry to visit.
    pub(super) at: usize,
    /// Whether the window's entries go to the fan-out queue rather than being polled here.
    feeding: bool,
    /// The walk starts a new coverage of the index and polls have been scheduled on the
    /// queue: it goes on only once their slots have passed (checked once, when listed).
    after_queued: bool,
    /// Where the audit starts after this walk, when it is due: the walk then keeps a third of
    /// the budget and of the deadline for it.
    pub(super) audit_from: Option<LedgerCursor>,
    /// Where the walk was before the first entry it owed a poll and skipped because Gemini
    /// asked us to wait (ending within [`super::HOLD_BACKOFF_UP_TO_MS`]): the next pass starts
    /// there, so a rate limit does not leave the rest of the ledger unpolled for a whole coverage.
    first_unpolled: Option<LedgerCursor>,
    /// What the walk saw of the index, handed to the audit.
    pub(super) seen: Seen,
}

impl IndexWalk {
    /// A walk starting at `resume`, followed by the audit from `audit_from` when it is due.
    pub(super) fn new(resume: LedgerCursor, audit_from: Option<LedgerCursor>) -> IndexWalk {
        IndexWalk {
            window: resume.cursor.clone(),
            cursor: resume.cursor.clone(),
            position: resume,
            audit_from,
            ..IndexWalk::default()
        }
    }
}

/// What the walks hand the release.
#[derive(Debug)]
pub(super) struct Walked {
    /// Where the next pass starts, and why the routine walk stopped.
    pub(super) end: (LedgerCursor, Stop),
    /// How far the audit has got, when this pass audits (sent with each renewal too).
    pub(super) audit: Option<AuditProgress>,
}

/// The audit over `op:`, one page at a time.
#[derive(Debug)]
pub(super) struct AuditWalk {
    resume: LedgerCursor,
    page: Option<(ListedPage, usize)>,
    seen: Seen,
    pub(super) walked: Walked,
}

fn stopped(resume: LedgerCursor) -> AuditProgress {
    AuditProgress {
        resume,
        complete: false,
    }
}

fn meta_of(key: &ListedKey) -> Option<LedgerMeta> {
    key.metadata
        .clone()
        .and_then(|m| serde_json::from_value(m).ok())
}

/// What the routine walk saw of the index, for the audit to judge the ledger against.
#[derive(Debug, Default)]
pub(super) struct Seen {
    /// The index as listed by this pass: key → the version its entry shows.
    pub(super) indexed: HashMap<String, u64>,
    /// Whether that listing was the whole index (from the start to the end).
    pub(super) whole: bool,
    /// Keys the routine walk acted on: their ledger entries may have changed since the index
    /// was listed, so the audit does not judge them.
    pub(super) touched: HashSet<String>,
}

/// What the audit does with one `op:` entry.
enum AuditTurn {
    /// Nothing: move past it.
    Pass,
    /// Take it in hand (boxed: an entry is large beside the other answers).
    Act(Box<EntryRun>),
    /// The budget does not afford its steps: the audit stops before it.
    OutOfBudget,
}

impl Pass {
    pub(super) fn index_step(&mut self, mut walk: IndexWalk, now_ms: i64) -> Option<Intent> {
        if !walk.listed {
            if let Some(e) = self.kv_unbound.clone() {
                self.books.error(PassLog::error(format!("kv binding: {e}")));
                return self.walk_ended(walk, Stop::Error);
            }
            if let Some(stop) = self.must_stop(now_ms, walk.audit_from.is_some()) {
                return self.walk_ended(walk, stop);
            }
            if !self.books.affords(1) {
                return self.walk_ended(walk, Stop::Budget);
            }
            let cursor = walk.cursor.clone();
            self.phase = Phase::Index(walk);
            return self.list(OPEN_PREFIX, cursor);
        }
        if std::mem::take(&mut walk.after_queued) && now_ms < self.fed_until_ms {
            // Copies of these entries may still wait on the queue (a lasting 429 sent them
            // back): scheduling or polling them now would poll them twice. The index is
            // listed all the same, so a due audit judges only what it missed.
            return self.walk_ended(walk, Stop::StillQueued);
        }
        if self.entry.is_some() {
            if let Some(intent) = self.entry_step(now_ms) {
                self.phase = Phase::Index(walk);
                return Some(intent);
            }
            let entry = self.entry.take().expect("an entry in hand");
            if !entry.polled && walk.first_unpolled.is_none() {
                walk.first_unpolled = Some(walk.position.clone());
            }
            walk.position.after_key = Some(entry.name);
            self.save_checkpoint(&walk);
        }
        if walk.feeding {
            return self.feed_step(walk, now_ms);
        }
        while let Some((name, meta)) = walk.entries.get_mut(walk.at) {
            walk.at += 1;
            let Some(key) = name.strip_prefix(OPEN_PREFIX) else {
                continue;
            };
            if let Some(stop) = self.must_stop(now_ms, walk.audit_from.is_some()) {
                return self.walk_ended(walk, stop);
            }
            let Some(meta) = meta.take() else {
                self.books.unreadable_metadata(key);
                walk.position.after_key = Some(name.clone());
                continue;
            };
            let actions = self.books.decide(&meta, now_ms);
            let cost: u32 = actions.iter().map(Action::cost).sum();
            if !self.books.affords(cost) {
                return self.walk_ended(walk, Stop::Budget);
            }
            self.books.report.visited += 1;
            if !actions.is_empty() {
                walk.seen.touched.insert(key.to_string());
            }
            let steps = actions.into_iter().map(Step::Act).collect();
            self.entry = Some(EntryRun::new(name, key, meta, steps));
            self.phase = Phase::Index(walk);
            return None;
        }
        self.window_done(walk)
    }

    /// Every entry of the window is visited: the next pass lists the next window, or the
    /// index from its start.
    pub(super) fn window_done(&mut self, mut walk: IndexWalk) -> Option<Intent> {
        let next = walk.next_window.take();
        let stop = next.as_ref().map_or(Stop::Complete, |_| Stop::Window);
        walk.position = LedgerCursor::default();
        walk.position.cursor = next;
        self.walk_ended(walk, stop)
    }

    /// Records where the next pass would start if this one ended now, for the heartbeat.
    pub(super) fn save_checkpoint(&mut self, walk: &IndexWalk) {
        let at = walk.first_unpolled.as_ref().unwrap_or(&walk.position);
        self.checkpoint = (at.clone(), self.books.status_backoff_until_ms);
    }

    /// One KV list page under `prefix`, counted against the budget and in the report.
    fn list(&mut self, prefix: &'static str, cursor: Option<String>) -> Option<Intent> {
        self.books.spend(1);
        self.books.report.kv_lists += 1;
        self.awaiting = Some(Awaiting::Listed);
        Some(Intent::List { prefix, cursor })
    }

    /// A KV list page asked by [`Intent::List`] (`Err`: the list failed).
    pub(super) fn on_listed(&mut self, page: Result<ListedPage, String>) {
        self.books.report.listed += page.as_ref().map_or(0, |p| p.keys.len() as u64);
        match mem::replace(&mut self.phase, Phase::Done) {
            Phase::Index(walk) => self.on_index_page(walk, page),
            Phase::Audit(walk) => self.on_audit_page(walk, page),
            other => self.phase = other,
        }
    }

    fn on_index_page(&mut self, mut walk: IndexWalk, page: Result<ListedPage, String>) {
        let page = match page {
            Ok(page) => page,
            Err(error) if walk.cursor.is_some() && walk.pages == 0 => {
                // A saved cursor KV no longer accepts (expired, or from before the index):
                // list the index from its start.
                self.books.log(PassLog::ReconcileCursorReset { error });
                walk.window = None;
                walk.cursor = None;
                self.phase = Phase::Index(walk);
                return;
            }
            Err(e) => {
                self.books.error(PassLog::error(format!("kv list: {e}")));
                self.walk_ended(walk, Stop::Error);
                return;
            }
        };
        self.books.report.index_kv_lists += 1;
        self.books.report.index_listed += page.keys.len() as u64;
        walk.pages += 1;
        let listed = page.keys.iter().map(|key| (key.name.clone(), meta_of(key)));
        walk.entries.extend(listed);
        if page.list_complete || page.cursor.is_none() {
            walk.listed = true;
        } else {
            walk.cursor = page.cursor;
            if walk.pages >= MAX_INDEX_PAGES {
                walk.next_window = walk.cursor.clone();
                walk.listed = true;
            }
        }
        if walk.listed {
            self.index_listed(&mut walk);
        }
        self.phase = Phase::Index(walk);
    }

    /// The window is listed: note what the index holds, and start after the last entry done.
    fn index_listed(&mut self, walk: &mut IndexWalk) {
        walk.seen.whole = walk.window.is_none() && walk.next_window.is_none();
        let metas = walk.entries.iter().filter_map(|(_, meta)| meta.as_ref());
        self.books.report.open = walk.seen.whole.then(|| OpenCounts::of(metas));
        for (name, meta) in &walk.entries {
            if let (Some(key), Some(meta)) = (name.strip_prefix(OPEN_PREFIX), meta) {
                walk.seen.indexed.insert(key.to_string(), meta.version);
            }
        }
        let fresh = walk.position == LedgerCursor::default();
        walk.position.cursor = walk.window.clone();
        let names: Vec<&str> = walk.entries.iter().map(|(n, _)| n.as_str()).collect();
        walk.at = resume_index(&names, walk.position.after_key.as_deref());
        // A sweep after the webhook was enabled again goes to the queue whatever its size, and
        // does not wait for copies still queued (`restore.rs`).
        let sweeping = self.sweeping();
        // Otherwise the window fans out when a queue is bound and at least `above` entries
        // are left to visit.
        let left = walk.entries.len().saturating_sub(walk.at);
        let fanout = self.books.limits.fanout.as_ref();
        walk.feeding = sweeping || fanout.is_some_and(|f| left >= f.above);
        walk.after_queued = !sweeping && fresh && self.fed_until_ms > 0;
    }

    /// The routine walk stopped: entries skipped for a short back-off hold the resume point
    /// back; then the audit runs if it is due and the walk did not lose the lease or fail.
    pub(super) fn walk_ended(&mut self, walk: IndexWalk, stop: Stop) -> Option<Intent> {
        let end = match walk.first_unpolled {
            Some(held) if stop == Stop::Complete => (held, Stop::HeldForBackoff),
            Some(held) => (held, stop),
            None => (walk.position, stop),
        };
        let walked = Walked { end, audit: None };
        self.books.budget_limit = self.books.limits.budget;
        match walk.audit_from {
            Some(from) if stop.audits_after() => {
                self.books.report.audit = true;
                if self.kv_unbound.is_some() {
                    self.audit_ended(walked, stopped(from));
                } else {
                    self.phase = Phase::Audit(AuditWalk {
                        resume: from,
                        page: None,
                        seen: walk.seen,
                        walked,
                    });
                }
            }
            _ => self.phase = Phase::Release(walked),
        }
        self.announce_after_walk();
        None
    }

    fn audit_ended(&mut self, mut walked: Walked, progress: AuditProgress) -> Option<Intent> {
        walked.audit = Some(progress);
        self.phase = Phase::Release(walked);
        None
    }

    pub(super) fn audit_step(&mut self, mut walk: AuditWalk, now_ms: i64) -> Option<Intent> {
        if self.entry.is_some() {
            if let Some(intent) = self.entry_step(now_ms) {
                self.phase = Phase::Audit(walk);
                return Some(intent);
            }
            walk.resume.after_key = Some(self.entry.take().expect("an entry in hand").name);
            walk.walked.audit = Some(stopped(walk.resume.clone()));
        }
        let Some((page, mut at)) = walk.page.take() else {
            if self.must_stop(now_ms, false).is_some() || !self.books.affords(1) {
                return self.audit_ended(walk.walked, stopped(walk.resume));
            }
            let cursor = walk.resume.cursor.clone();
            self.phase = Phase::Audit(walk);
            return self.list(OP_PREFIX, cursor);
        };
        while let Some(listed) = page.keys.get(at) {
            at += 1;
            if walk.resume.already_done(&listed.name) {
                continue;
            }
            let Some(key) = listed.name.strip_prefix(OP_PREFIX) else {
                continue;
            };
            if self.must_stop(now_ms, false).is_some() {
                return self.audit_ended(walk.walked, stopped(walk.resume));
            }
            match self.audit_turn(&walk.seen, key, listed, now_ms) {
                AuditTurn::OutOfBudget => {
                    return self.audit_ended(walk.walked, stopped(walk.resume));
                }
                AuditTurn::Act(entry) => {
                    self.entry = Some(*entry);
                    walk.page = Some((page, at));
                    self.phase = Phase::Audit(walk);
                    return None;
                }
                AuditTurn::Pass => {
                    walk.resume.after_key = Some(listed.name.clone());
                    walk.walked.audit = Some(stopped(walk.resume.clone()));
                }
            }
        }
        if page.list_complete || page.cursor.is_none() {
            self.books.report.audit_complete = true;
            let mut done = stopped(LedgerCursor::default());
            done.complete = true;
            return self.audit_ended(walk.walked, done);
        }
        walk.resume = LedgerCursor {
            cursor: page.cursor,
            after_key: None,
        };
        walk.walked.audit = Some(stopped(walk.resume.clone()));
        self.phase = Phase::Audit(walk);
        None
    }

    /// What the audit does with one `op:` entry: its verdict against the index, the actions
    /// a missed entry needs (as the routine walk would decide them) and the re-index, if the
    /// budget affords them.
    fn audit_turn(&mut self, seen: &Seen, key: &str, listed: &ListedKey, now_ms: i64) -> AuditTurn {
        let meta = meta_of(listed);
        let verdict = match &meta {
            Some(_) if seen.touched.contains(key) => AuditVerdict::Fine,
            Some(m) => audit_verdict(m, seen.whole, seen.indexed.get(key).copied()),
            None => AuditVerdict::Fine,
        };
        let reindex = seen.whole && verdict != AuditVerdict::Fine;
        let actions = match (&meta, verdict) {
            (Some(m), AuditVerdict::Missed) => self.books.decide(m, now_ms),
            _ => Vec::new(),
        };
        let cost: u32 = actions.iter().map(Action::cost).sum::<u32>() + u32::from(reindex);
        if !self.books.affords(cost) {
            return AuditTurn::OutOfBudget;
        }
        if verdict == AuditVerdict::Missed {
            self.books.report.audit_found += 1;
            if seen.whole {
                let key = key.to_string();
                self.books.log(PassLog::IndexMissed { key });
            }
        }
        let mut steps: Vec<Step> = actions.into_iter().map(Step::Act).collect();
        if reindex {
            let stale = verdict == AuditVerdict::Stale;
            steps.push(Step::Reindex { stale });
        }
        match meta {
            Some(meta) if !steps.is_empty() => {
                AuditTurn::Act(Box::new(EntryRun::new(&listed.name, key, meta, steps)))
            }
            _ => AuditTurn::Pass,
        }
    }

    fn on_audit_page(&mut self, mut walk: AuditWalk, page: Result<ListedPage, String>) {
        match page {
            Ok(page) => {
                self.books.report.audit_kv_lists += 1;
                self.books.report.audit_listed += page.keys.len() as u64;
                walk.page = Some((page, 0));
                self.phase = Phase::Audit(walk);
            }
            Err(e) => {
                self.books
                    .error(PassLog::error(format!("audit kv list: {e}")));
                // A cursor KV no longer accepts would stall every audit: start over.
                self.audit_ended(walk.walked, stopped(LedgerCursor::default()));
            }
        }
    }
}
