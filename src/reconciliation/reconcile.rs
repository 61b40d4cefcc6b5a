//! Reconciliation decisions: what one ledger entry needs, from its metadata alone, and the
//! lease that keeps overlapping cron passes from doing the same work.
//!
//! Guarantees: an entry that is terminal with its side effect done needs nothing (no value
//! read, no status call, no gate call), whatever the ledger's size; a non-terminal entry is
//! polled only past the grace period; a terminal entry whose side effect is neither done nor
//! parked is handed back to the gate (unless a live claim holds it); each alert is asked for
//! only while the ledger shows it unsent (the gate sends it at most once). The lease admits one
//! pass at a time, lapses by itself if its holder dies, and only its holder may move the
//! durable cursor.
//!
//! What a pass walks: the routine pass lists the `open:` index (operations that
//! [`may_need_work`]), all of it up to [`MAX_INDEX_PAGES`] pages, before it acts, so its
//! cost is O(open) KV lists whatever the ledger's size; then it visits the listed entries from
//! where the last pass stopped ([`resume_index`]), so every open operation is visited once per
//! ceil(work / budget) passes. The index is a hint: a rare audit ([`Audit`], every
//! `RECONCILE_AUDIT_SECONDS`, with its own cursor, on what budget the routine work left) walks
//! the whole `op:` ledger and acts on, and has the gate re-index, what the index missed
//! ([`audit_verdict`]).
//!
//! A pass is bounded in time as well as in subrequests: it starts no entry past its deadline
//! ([`past_deadline`]), renews its short lease on a heartbeat ([`heartbeat_interval_ms`],
//! saving its position with each renewal) and stops at once when a renewal is refused (another
//! pass holds the lease now, and only that pass may move the cursor). A dead pass therefore
//! blocks the next one for one lease TTL, not for the length of a pass. A status call that got
//! no answer (timeout, network error) costs only its own entry, which the cursor moves past
//! and the next coverage of the ledger revisits; [`StatusHealth`] turns a run of them into a
//! back-off of every status call, as a 429 does.
//!
//! The pass that puts these decisions in order is [`crate::reconciliation::pass`].

use serde::{Deserialize, Serialize};

use crate::operation::alert::AlertKind;
use crate::operation::ledger::{may_need_work, LedgerMeta};

/// The thresholds a pass decides with (seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    pub grace_secs: i64,
    pub stuck_after_secs: i64,
    pub effect_alert_after_secs: i64,
}

/// One thing a pass does for an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Ask Gemini's status API, then offer the answer to the gate.
    Poll,
    /// Ask the gate to run the owed side effect (it respects its own backoff).
    RetryEffect,
    /// Ask the gate to send this alert (once per operation and kind).
    Alert { kind: AlertKind, age_secs: i64 },
}

impl Action {
    /// Subrequests the action costs the pass: a poll may need the gate after the status call.
    pub fn cost(&self) -> u32 {
        match self {
            Action::Poll => 2,
            Action::RetryEffect | Action::Alert { .. } => 1,
        }
    }
}

/// Decides what an entry needs at `now_secs`.
pub fn decide(meta: &LedgerMeta, now_secs: i64, t: &Thresholds) -> Vec<Action> {
    let status = meta.status.clone();
    let alerted = |kind: AlertKind| meta.alerts.contains(&kind);
    let mut actions = Vec::new();
    if meta.forgotten {
        return actions;
    }
    if status.is_terminal() {
        if meta.effect_done {
            return actions;
        }
        let settled_age = now_secs - meta.settled_at.unwrap_or(meta.submitted_at);
        if !meta.parked && meta.claim_expires.is_none_or(|t| t <= now_secs) {
            actions.push(Action::RetryEffect);
        }
        if (meta.parked || settled_age >= t.effect_alert_after_secs)
            && !alerted(AlertKind::EffectFailing)
        {
            actions.push(Action::Alert {
                kind: AlertKind::EffectFailing,
                age_secs: settled_age,
            });
        }
    } else if status.rank() >= 0 {
        let age = now_secs - meta.submitted_at;
        if age >= t.grace_secs {
            actions.push(Action::Poll);
        }
        // Gemini not knowing it is why it is stuck: its `unknown_to_gemini` alert says so.
        if age >= t.stuck_after_secs
            && !alerted(AlertKind::Stuck)
            && !alerted(AlertKind::UnknownToGemini)
        {
            actions.push(Action::Alert {
                kind: AlertKind::Stuck,
                age_secs: age,
            });
        }
    }
    actions
}

/// Most index pages (of 1,000) a routine pass lists before it acts, which bounds the memory
/// it holds (~250 B per entry: about 12 MB) far inside an isolate's 128 MB. A larger index
/// is walked in windows of this size, each resumed by the page cursor.
pub const MAX_INDEX_PAGES: u32 = 50;

/// Where a routine pass starts among the `keys` it listed (sorted, as KV lists them): at the
/// first after `after`, the last entry the previous pass finished (which may be gone since).
pub fn resume_index(keys: &[&str], after: Option<&str>) -> usize {
    after.map_or(0, |a| keys.partition_point(|k| *k <= a))
}

/// When an audit is due, the routine walk keeps this share of the budget and of the deadline
/// (a third) for it, so a backlog of open operations cannot starve the audit.
pub fn audit_reserve(total: i64) -> i64 {
    total / 3
}

/// What the audit does with an `op:` entry, given its metadata and, when the index was
/// listed whole in this pass, the version of its `open:` entry (`None`: not in the index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditVerdict {
    /// Nothing: closed and not indexed, or indexed (the routine walk saw it).
    Fine,
    /// It may need work but the index lacks it (a lost put): act on it, and ask the gate to
    /// project it again (which puts the index entry back).
    Missed,
    /// The index holds it though the ledger shows it closed with a newer version (a lost
    /// delete): ask the gate to project it again (which deletes the entry).
    Stale,
}

/// Decides what the audit does with one `op:` entry; see [`AuditVerdict`]. With an index not
/// listed whole (`index_whole` false) it cannot tell missed from indexed: it acts on every
/// entry that may need work (a harmless second visit) and re-indexes nothing.
pub fn audit_verdict(
    meta: &LedgerMeta,
    index_whole: bool,
    indexed_version: Option<u64>,
) -> AuditVerdict {
    let open = may_need_work(meta);
    match (open, index_whole, indexed_version) {
        (true, false, _) => AuditVerdict::Missed,
        (true, true, None) => AuditVerdict::Missed,
        (false, true, Some(v)) if v < meta.version => AuditVerdict::Stale,
        _ => AuditVerdict::Fine,
    }
}

/// The audit's state, kept in the lease: where the audit in progress resumes over `op:`, and
/// when the last one finished.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Audit {
    /// Set while an audit is in progress (a pass ran out of budget or time inside it).
    #[serde(default)]
    pub resume: Option<Resume>,
    /// When the last audit reached the end of `op:`.
    #[serde(default)]
    pub last_completed_ms: i64,
    /// Audits that reached the end (0: never, so the first pass audits, which also indexes
    /// operations opened before the index existed).
    #[serde(default)]
    pub completed: u64,
}

impl Audit {
    /// Where the audit starts in a pass at `now_ms`, if one is in progress or due.
    pub fn due(&self, now_ms: i64, interval_ms: i64) -> Option<Resume> {
        match &self.resume {
            Some(r) => Some(r.clone()),
            None if self.completed == 0
                || now_ms >= self.last_completed_ms.saturating_add(interval_ms) =>
            {
                Some(Resume::default())
            }
            None => None,
        }
    }

    /// Records how far the audit got: `complete` when it reached the end of `op:`.
    pub fn progress(&mut self, resume: Resume, complete: bool, now_ms: i64) {
        if complete {
            self.resume = None;
            self.last_completed_ms = now_ms;
            self.completed += 1;
        } else {
            self.resume = Some(resume);
        }
    }
}

/// How far a pass's audit got: sent with renewals (not complete) and the release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditProgress {
    pub resume: Resume,
    pub complete: bool,
}

/// Where the next pass starts: the page cursor, and the last entry done on that page.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resume {
    pub cursor: Option<String>,
    pub after_key: Option<String>,
}

impl Resume {
    /// True for an entry of the resumed page that was already done (at or before `after_key`).
    pub fn already_done(&self, entry: &str) -> bool {
        self.after_key
            .as_deref()
            .is_some_and(|after| entry <= after)
    }
}

/// The reconciliation lease and what it keeps between passes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub holder: Option<String>,
    pub expires_ms: i64,
    pub resume: Resume,
    /// No status calls before this time (a 429 or 5xx asked us to back off).
    pub status_backoff_until_ms: i64,
    /// Passes that reached the end of the ledger.
    pub completed_passes: u64,
    /// The Gemini webhook state last alerted on (not `enabled`), so it alerts once.
    #[serde(default)]
    pub webhook_alerted_state: Option<String>,
    /// The audit over `op:`, with its own cursor.
    #[serde(default)]
    pub audit: Audit,
    /// The end of the polls scheduled on the fan-out queue, by passes and by consumers sending
    /// polls back after a wait: the next pass schedules after it, so the rate toward Gemini
    /// holds across passes, and starts no new coverage of the index before it has passed.
    #[serde(default)]
    pub fed_until_ms: i64,
}

impl Lease {
    /// Takes the lease for `holder` if it is free or lapsed.
    pub fn acquire(&mut self, holder: &str, now_ms: i64, ttl_ms: i64) -> bool {
        if self.holder.is_some() && self.expires_ms > now_ms {
            return false;
        }
        self.holder = Some(holder.to_string());
        self.expires_ms = now_ms + ttl_ms;
        true
    }

    /// Extends the lease of `holder` to `now_ms + ttl_ms` and saves its position so far (where
    /// to resume and the status back-off), so a pass killed before it releases loses at most
    /// one heartbeat of progress. Refused (false, nothing changed) unless `holder` still holds
    /// it. A lapsed lease that no other pass has taken is still the holder's: nobody can have
    /// started from its cursor, so renewing it is safe.
    pub fn renew(
        &mut self,
        holder: &str,
        now_ms: i64,
        ttl_ms: i64,
        checkpoint: Option<(Resume, i64)>,
    ) -> bool {
        if self.holder.as_deref() != Some(holder) {
            return false;
        }
        self.expires_ms = self.expires_ms.max(now_ms + ttl_ms);
        if let Some((resume, status_backoff_until_ms)) = checkpoint {
            self.resume = resume;
            self.status_backoff_until_ms =
                self.status_backoff_until_ms.max(status_backoff_until_ms);
        }
        true
    }

    /// Saves how far `holder`'s audit got. Refused (false, nothing changed) unless `holder`
    /// holds the lease, like the routine cursor.
    pub fn record_audit(&mut self, holder: &str, progress: AuditProgress, now_ms: i64) -> bool {
        if self.holder.as_deref() != Some(holder) {
            return false;
        }
        self.audit
            .progress(progress.resume, progress.complete, now_ms);
        true
    }

    /// Saves how far `holder` has scheduled polls on the fan-out queue (never earlier than
    /// what is saved). Refused (false) unless `holder` holds the lease.
    pub fn record_fed(&mut self, holder: &str, fed_until_ms: i64) -> bool {
        if self.holder.as_deref() != Some(holder) {
            return false;
        }
        self.fed_until_ms = self.fed_until_ms.max(fed_until_ms);
        true
    }

    /// A fan-out consumer sent polls back to the queue, their slots ending at `until_ms`: the
    /// next pass schedules after them, and starts no new coverage of the index before. Anyone
    /// may push it later; nothing moves it earlier. True when it moved.
    pub fn sent_back(&mut self, until_ms: i64) -> bool {
        let moved = until_ms > self.fed_until_ms;
        self.fed_until_ms = self.fed_until_ms.max(until_ms);
        moved
    }

    /// Gemini asked a fan-out poll to wait until `until_ms`: no status call before then, from
    /// any pass or consumer. Anyone may push it later; nothing moves it earlier. True when it
    /// moved (the lease then has something new to store).
    pub fn back_off(&mut self, until_ms: i64) -> bool {
        let moved = until_ms > self.status_backoff_until_ms;
        self.status_backoff_until_ms = self.status_backoff_until_ms.max(until_ms);
        moved
    }

    /// Gives the lease back, saving where to resume. Refused (false) unless `holder` still
    /// holds it: a pass whose lease lapsed must not move the cursor of the pass after it.
    pub fn release(
        &mut self,
        holder: &str,
        resume: Resume,
        complete: bool,
        status_backoff_until_ms: i64,
    ) -> bool {
        if self.holder.as_deref() != Some(holder) {
            return false;
        }
        self.holder = None;
        self.expires_ms = 0;
        self.resume = resume;
        self.status_backoff_until_ms = self.status_backoff_until_ms.max(status_backoff_until_ms);
        if complete {
            self.completed_passes += 1;
        }
        true
    }
}

/// A pass renews its lease after a quarter of the TTL, so three renewals in a row can be slow
/// or fail before it lapses under a live pass.
pub fn heartbeat_interval_ms(lease_ttl_ms: i64) -> i64 {
    (lease_ttl_ms / 4).max(1)
}

/// True when renewals have failed (without a refusal) for a whole TTL since the last one that
/// succeeded: the lease may have lapsed and been taken, so the pass stops starting work.
pub fn lease_presumed_lapsed(now_ms: i64, last_renewed_ms: i64, lease_ttl_ms: i64) -> bool {
    now_ms >= last_renewed_ms + lease_ttl_ms
}

/// True when a pass must start no further entry: its wall-clock deadline has come. The entry
/// in hand finishes (at most one status call and one gate call past the deadline).
pub fn past_deadline(now_ms: i64, deadline_ms: i64) -> bool {
    now_ms >= deadline_ms
}

/// Why a pass ended; logged as `stopped` in its `reconcile_pass` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// It reached the end of the ledger.
    Complete,
    /// It reached the end of a window of an index larger than [`MAX_INDEX_PAGES`] pages; the
    /// next pass lists the next window.
    Window,
    /// It reached the end, but skipped polls for a short status back-off; the next pass
    /// starts at the first entry it skipped.
    HeldForBackoff,
    /// The subrequest budget ran out; the next pass resumes at the saved cursor.
    Budget,
    /// The wall-clock deadline came; the next pass resumes at the saved cursor.
    Deadline,
    /// A renewal was refused: another pass holds the lease. Nothing is saved.
    LeaseLost,
    /// Renewals failed for a whole TTL; the release is still tried (it is fenced).
    LeaseLapsed,
    /// It scheduled a cron interval of polls on the fan-out queue (or Gemini's wait runs
    /// past it); the next pass schedules from the saved cursor.
    Scheduled,
    /// It was to start a new coverage of the index while polls scheduled on the fan-out queue
    /// (by passes, or sent back by consumers after a wait) may still be waiting: it schedules
    /// nothing, so no entry gets a second copy; a pass after their slots starts it.
    StillQueued,
    /// KV could not be listed.
    Error,
}

impl Stop {
    /// The log label.
    pub fn label(self) -> &'static str {
        match self {
            Stop::Complete => "complete",
            Stop::Window => "window",
            Stop::HeldForBackoff => "held_for_backoff",
            Stop::Budget => "budget",
            Stop::Deadline => "deadline",
            Stop::LeaseLost => "lease_lost",
            Stop::LeaseLapsed => "lease_lapsed",
            Stop::Scheduled => "scheduled",
            Stop::StillQueued => "still_queued",
            Stop::Error => "error",
        }
    }

    /// Whether the audit, when due, runs after the routine walk stopped this way: not after a
    /// lost or lapsed lease, or a KV error. After the routine walk's budget or deadline (its
    /// two thirds) it runs on the third kept for it.
    pub fn audits_after(self) -> bool {
        !matches!(self, Stop::LeaseLost | Stop::LeaseLapsed | Stop::Error)
    }

    /// Whether the pass may release the lease and save its cursor: not once another pass
    /// holds it (the release would be refused anyway; not sending it saves a subrequest).
    pub fn releases(self) -> bool {
        self != Stop::LeaseLost
    }
}

/// Status calls in a row that got no answer before every status call backs off: one or two
/// are one operation's trouble (that entry is skipped and revisited on the next coverage),
/// three in a row look like the API's.
pub const UNANSWERED_BEFORE_BACKOFF: u32 = 3;
/// The back-off after [`UNANSWERED_BEFORE_BACKOFF`] unanswered calls: as long as after a 429
/// without Retry-After, and shorter than a cron interval, so the next pass starts at the first
/// entry it skipped.
pub const UNANSWERED_BACKOFF_MS: i64 =
    crate::operation::observation::DEFAULT_RETRY_AFTER_SECS * 1_000;
// Bounded, and shorter than the */5 cron interval (checked when compiling).
const _: () = assert!(UNANSWERED_BACKOFF_MS > 0 && UNANSWERED_BACKOFF_MS < 300_000);

/// A pass's account of status calls that got no answer (timeout or network error).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatusHealth {
    /// Unanswered calls since the last answer of any kind.
    pub consecutive_unanswered: u32,
}

impl StatusHealth {
    /// Any HTTP answer, even an error: the API is there.
    pub fn answered(&mut self) {
        self.consecutive_unanswered = 0;
    }

    /// A call that timed out or failed to connect. Returns the time every status call must
    /// wait for, when this makes a run long enough to mean the API itself is in trouble.
    pub fn unanswered(&mut self, now_ms: i64) -> Option<i64> {
        self.consecutive_unanswered += 1;
        if self.consecutive_unanswered >= UNANSWERED_BEFORE_BACKOFF {
            self.consecutive_unanswered = 0;
            Some(now_ms + UNANSWERED_BACKOFF_MS)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Thresholds = Thresholds {
        grace_secs: 90,
        stuck_after_secs: 21_600,
        effect_alert_after_secs: 3_600,
    };

    fn meta(status: &str) -> LedgerMeta {
        LedgerMeta::sample(status)
    }

    #[test]
    fn an_operation_gemini_does_not_know_is_not_also_alerted_stuck() {
        let mut m = meta("running");
        m.alerts = vec![AlertKind::UnknownToGemini];
        assert_eq!(decide(&m, 1_000_000, &T), vec![Action::Poll]);
    }

    #[test]
    fn forgotten_entry_needs_nothing() {
        let mut m = meta("running");
        m.forgotten = true;
        assert_eq!(decide(&m, 99_999_999, &T), vec![]);
    }

    #[test]
    fn terminal_and_done_needs_nothing() {
        for s in ["succeeded", "failed", "cancelled", "expired"] {
            let mut m = meta(s);
            m.effect_done = true;
            m.settled_at = Some(1_000);
            assert_eq!(decide(&m, 10_000_000, &T), vec![], "{s}");
        }
    }

    #[test]
    fn pending_inside_grace_is_left_alone() {
        assert_eq!(decide(&meta("pending"), 1_089, &T), vec![]);
    }

    #[test]
    fn pending_past_grace_is_polled() {
        assert_eq!(decide(&meta("pending"), 1_090, &T), vec![Action::Poll]);
        assert_eq!(decide(&meta("running"), 2_000, &T), vec![Action::Poll]);
        assert_eq!(
            decide(&meta("requires_action"), 2_000, &T),
            vec![Action::Poll]
        );
    }

    #[test]
    fn zero_grace_polls_at_once() {
        let t = Thresholds { grace_secs: 0, ..T };
        assert_eq!(decide(&meta("pending"), 1_000, &t), vec![Action::Poll]);
    }

    #[test]
    fn stuck_operation_alerts_once_and_stays_polled() {
        let now = 1_000 + 21_600;
        assert_eq!(
            decide(&meta("running"), now, &T),
            vec![
                Action::Poll,
                Action::Alert {
                    kind: AlertKind::Stuck,
                    age_secs: 21_600
                }
            ]
        );
        let mut m = meta("running");
        m.alerts = vec![AlertKind::Stuck];
        assert_eq!(decide(&m, now, &T), vec![Action::Poll]);
    }

    #[test]
    fn owed_effect_is_retried_unless_a_live_claim_holds_it() {
        let mut m = meta("succeeded");
        m.settled_at = Some(1_000);
        assert_eq!(decide(&m, 1_010, &T), vec![Action::RetryEffect]);
        m.claim_expires = Some(1_100);
        assert_eq!(decide(&m, 1_010, &T), vec![]);
        assert_eq!(
            decide(&m, 1_100, &T),
            vec![Action::RetryEffect],
            "lapsed claim"
        );
    }

    #[test]
    fn effect_still_failing_after_threshold_alerts_once() {
        let mut m = meta("failed");
        m.settled_at = Some(1_000);
        assert_eq!(
            decide(&m, 4_600, &T),
            vec![
                Action::RetryEffect,
                Action::Alert {
                    kind: AlertKind::EffectFailing,
                    age_secs: 3_600
                }
            ]
        );
        m.alerts = vec![AlertKind::EffectFailing];
        assert_eq!(decide(&m, 4_600, &T), vec![Action::RetryEffect]);
    }

    #[test]
    fn parked_effect_alerts_once_and_is_not_retried() {
        let mut m = meta("succeeded");
        m.settled_at = Some(1_000);
        m.parked = true;
        assert_eq!(
            decide(&m, 1_001, &T),
            vec![Action::Alert {
                kind: AlertKind::EffectFailing,
                age_secs: 1
            }]
        );
        m.alerts = vec![AlertKind::EffectFailing];
        assert_eq!(decide(&m, 1_001, &T), vec![]);
    }

    #[test]
    fn unknown_ledger_status_is_left_alone() {
        assert_eq!(decide(&meta("weird"), 99_999, &T), vec![]);
    }

    /// Every metadata shape the decision table knows, at several ages.
    fn shapes() -> Vec<LedgerMeta> {
        let mut out = Vec::new();
        for status in [
            "pending",
            "running",
            "requires_action",
            "succeeded",
            "failed",
            "weird",
        ] {
            for done in [false, true] {
                for parked in [false, true] {
                    for claim in [None, Some(1_050), Some(99_999_999)] {
                        for alerts in [
                            vec![],
                            vec![AlertKind::Stuck],
                            vec![AlertKind::EffectFailing],
                        ] {
                            for forgotten in [false, true] {
                                let mut m = meta(status);
                                m.effect_done = done;
                                m.parked = parked;
                                m.claim_expires = claim;
                                m.alerts = alerts.clone();
                                m.forgotten = forgotten;
                                m.settled_at = Some(1_000);
                                out.push(m);
                            }
                        }
                    }
                }
            }
        }
        out
    }

    #[test]
    fn whatever_decide_acts_on_is_in_the_index() {
        for m in shapes() {
            for now in [1_000, 1_089, 1_090, 5_000, 30_000, 99_999_999] {
                if !decide(&m, now, &T).is_empty() {
                    assert!(may_need_work(&m), "{m:?} at {now}");
                }
            }
        }
    }

    #[test]
    fn what_leaves_the_index_never_needs_work_again() {
        for m in shapes().into_iter().filter(|m| !may_need_work(m)) {
            for now in [0, 1_000, 1_090, 30_000, i64::MAX / 4] {
                assert_eq!(decide(&m, now, &T), vec![], "{m:?} at {now}");
            }
        }
    }

    #[test]
    fn open_and_closed_entries_by_the_table() {
        assert!(may_need_work(&meta("pending")));
        assert!(may_need_work(&meta("running")));
        let mut m = meta("succeeded");
        assert!(may_need_work(&m), "effect owed");
        m.effect_done = true;
        assert!(!may_need_work(&m), "done");
        let mut m = meta("failed");
        m.parked = true;
        assert!(may_need_work(&m), "parked, alert owed");
        m.alerts = vec![AlertKind::EffectFailing];
        assert!(!may_need_work(&m), "parked and alerted");
        let mut m = meta("running");
        m.forgotten = true;
        assert!(!may_need_work(&m), "forgotten");
        assert!(
            !may_need_work(&meta("weird")),
            "unknown status is never acted on"
        );
    }

    #[test]
    fn routine_pass_resumes_after_the_last_entry_done() {
        let keys = ["open:a", "open:b", "open:c", "open:d"];
        assert_eq!(resume_index(&keys, None), 0);
        assert_eq!(resume_index(&keys, Some("open:b")), 2);
        assert_eq!(resume_index(&keys, Some("open:bb")), 2, "gone since");
        assert_eq!(resume_index(&keys, Some("open:d")), 4, "at the end");
        assert_eq!(resume_index(&keys, Some("open:0")), 0);
        assert_eq!(resume_index(&[], Some("open:a")), 0);
    }

    #[test]
    fn audit_keeps_a_third() {
        assert_eq!(audit_reserve(900), 300);
        assert_eq!(audit_reserve(60_000), 20_000);
        assert_eq!(audit_reserve(2), 0);
    }

    #[test]
    fn audit_acts_on_what_the_index_missed_and_repairs_stale_entries() {
        let open = meta("running");
        let mut closed = meta("succeeded");
        closed.effect_done = true;
        closed.version = 5;
        assert_eq!(audit_verdict(&open, true, Some(1)), AuditVerdict::Fine);
        assert_eq!(audit_verdict(&open, true, None), AuditVerdict::Missed);
        assert_eq!(audit_verdict(&open, false, None), AuditVerdict::Missed);
        assert_eq!(audit_verdict(&closed, true, None), AuditVerdict::Fine);
        assert_eq!(audit_verdict(&closed, true, Some(4)), AuditVerdict::Stale);
        assert_eq!(
            audit_verdict(&closed, true, Some(5)),
            AuditVerdict::Fine,
            "an index entry newer than the ledger's: KV lag, not a lost delete"
        );
        assert_eq!(audit_verdict(&closed, false, Some(4)), AuditVerdict::Fine);
    }

    #[test]
    fn audit_is_due_first_then_once_per_interval_and_resumes_its_cursor() {
        let mut audit = Audit::default();
        assert_eq!(
            audit.due(1_000, 86_400_000),
            Some(Resume::default()),
            "never ran"
        );
        audit.progress(at("op:k"), false, 2_000);
        assert_eq!(
            audit.due(2_001, 86_400_000),
            Some(at("op:k")),
            "in progress"
        );
        audit.progress(Resume::default(), true, 3_000);
        assert_eq!(audit.completed, 1);
        assert_eq!(audit.due(3_001, 86_400_000), None);
        assert_eq!(audit.due(86_403_000, 86_400_000), Some(Resume::default()));
    }

    #[test]
    fn only_the_holder_records_audit_progress() {
        let mut lease = held("a", 61_000);
        let p = AuditProgress {
            resume: at("op:k"),
            complete: false,
        };
        assert!(!lease.record_audit("b", p.clone(), 1_000));
        assert_eq!(lease.audit, Audit::default());
        assert!(lease.record_audit("a", p, 1_000));
        assert_eq!(lease.audit.resume, Some(at("op:k")));
    }

    #[test]
    fn lease_admits_one_holder_until_it_lapses() {
        let mut lease = Lease::default();
        assert!(lease.acquire("a", 0, 100));
        assert!(!lease.acquire("b", 50, 100));
        assert!(lease.acquire("b", 100, 100), "lapsed");
        let resume = Resume {
            cursor: Some("c".into()),
            after_key: Some("op:x".into()),
        };
        assert!(
            !lease.release("a", resume.clone(), false, 0),
            "lapsed holder may not move the cursor"
        );
        assert_eq!(lease.resume, Resume::default());
        assert!(lease.release("b", resume.clone(), false, 500));
        assert_eq!(lease.resume, resume);
        assert_eq!(lease.status_backoff_until_ms, 500);
        assert!(lease.acquire("c", 101, 100));
        assert!(lease.release("c", Resume::default(), true, 0));
        assert_eq!(lease.completed_passes, 1);
        assert_eq!(lease.status_backoff_until_ms, 500, "backoff never shrinks");
    }

    fn held(holder: &str, expires_ms: i64) -> Lease {
        Lease {
            holder: Some(holder.into()),
            expires_ms,
            ..Lease::default()
        }
    }

    fn at(after: &str) -> Resume {
        Resume {
            cursor: Some("c".into()),
            after_key: Some(after.into()),
        }
    }

    #[test]
    fn free_lease_is_granted() {
        let mut lease = Lease::default();
        assert!(lease.acquire("a", 1_000, 60_000));
        assert_eq!(lease.holder.as_deref(), Some("a"));
        assert_eq!(lease.expires_ms, 61_000);
    }

    #[test]
    fn live_lease_is_not_granted_to_another() {
        let mut lease = held("a", 61_000);
        assert!(!lease.acquire("b", 60_999, 60_000));
        assert_eq!(lease.holder.as_deref(), Some("a"));
    }

    #[test]
    fn lapsed_lease_is_granted_to_another() {
        let mut lease = held("a", 61_000);
        assert!(lease.acquire("b", 61_000, 60_000));
        assert_eq!(lease.holder.as_deref(), Some("b"));
        assert_eq!(lease.expires_ms, 121_000);
    }

    #[test]
    fn renewal_by_the_holder_extends_and_saves_the_position() {
        let mut lease = held("a", 61_000);
        assert!(lease.renew("a", 20_000, 60_000, Some((at("op:k"), 5_000))));
        assert_eq!(lease.expires_ms, 80_000);
        assert_eq!(lease.resume, at("op:k"));
        assert_eq!(lease.status_backoff_until_ms, 5_000);
        assert!(!lease.acquire("b", 79_999, 60_000), "renewed lease holds");
    }

    #[test]
    fn renewal_without_a_checkpoint_keeps_the_position() {
        let mut lease = held("a", 61_000);
        lease.resume = at("op:old");
        assert!(lease.renew("a", 20_000, 60_000, None));
        assert_eq!(lease.resume, at("op:old"));
    }

    #[test]
    fn renewal_never_shortens_the_lease() {
        let mut lease = held("a", 61_000);
        assert!(lease.renew("a", 0, 1_000, None));
        assert_eq!(lease.expires_ms, 61_000);
    }

    #[test]
    fn renewal_never_shrinks_the_status_backoff() {
        let mut lease = held("a", 61_000);
        lease.status_backoff_until_ms = 9_000;
        assert!(lease.renew("a", 1_000, 60_000, Some((at("op:k"), 2_000))));
        assert_eq!(lease.status_backoff_until_ms, 9_000);
    }

    #[test]
    fn renewal_of_a_lapsed_lease_nobody_took_succeeds() {
        let mut lease = held("a", 61_000);
        assert!(lease.renew("a", 70_000, 60_000, Some((at("op:k"), 0))));
        assert_eq!(lease.expires_ms, 130_000);
        assert_eq!(lease.resume, at("op:k"));
    }

    #[test]
    fn renewal_by_a_holder_that_lost_the_lease_fails_and_changes_nothing() {
        let mut lease = held("a", 61_000);
        lease.resume = at("op:a-saved");
        assert!(lease.acquire("b", 61_000, 60_000), "a lapsed, b took it");
        let before = lease.clone();
        assert!(!lease.renew("a", 62_000, 60_000, Some((at("op:zzz"), 99_000))));
        assert_eq!(lease, before, "b's cursor, expiry and backoff untouched");
    }

    #[test]
    fn renewal_of_a_released_lease_fails() {
        let mut lease = held("a", 61_000);
        assert!(lease.release("a", at("op:k"), false, 0));
        assert!(!lease.renew("a", 1_000, 60_000, None));
        assert_eq!(lease.holder, None);
    }

    #[test]
    fn release_by_the_holder_saves_the_cursor_and_frees_the_lease() {
        let mut lease = held("a", 61_000);
        assert!(lease.release("a", at("op:k"), false, 0));
        assert_eq!(lease.resume, at("op:k"));
        assert!(
            lease.acquire("b", 1_000, 60_000),
            "free at once, not after the TTL"
        );
    }

    #[test]
    fn release_by_a_holder_that_lost_the_lease_fails() {
        let mut lease = held("b", 121_000);
        lease.resume = at("op:b");
        assert!(!lease.release("a", at("op:a"), true, 0));
        assert_eq!(lease.resume, at("op:b"));
        assert_eq!(lease.completed_passes, 0);
        assert_eq!(lease.holder.as_deref(), Some("b"));
    }

    #[test]
    fn heartbeat_renews_four_times_per_ttl() {
        assert_eq!(heartbeat_interval_ms(60_000), 15_000);
        assert_eq!(heartbeat_interval_ms(5_000), 1_250);
        assert_eq!(heartbeat_interval_ms(0), 1, "never a busy loop");
    }

    #[test]
    fn lease_is_presumed_lapsed_after_a_ttl_without_a_renewal() {
        assert!(!lease_presumed_lapsed(59_999, 0, 60_000));
        assert!(lease_presumed_lapsed(60_000, 0, 60_000));
    }

    #[test]
    fn deadline_stops_new_work_when_it_comes() {
        assert!(!past_deadline(59_999, 60_000));
        assert!(past_deadline(60_000, 60_000));
        assert!(past_deadline(75_000, 60_000));
    }

    #[test]
    fn only_a_lost_lease_keeps_a_pass_from_releasing() {
        for stop in [
            Stop::Complete,
            Stop::Window,
            Stop::HeldForBackoff,
            Stop::Budget,
            Stop::Deadline,
            Stop::LeaseLapsed,
            Stop::Error,
        ] {
            assert!(stop.releases(), "{}", stop.label());
        }
        assert!(!Stop::LeaseLost.releases());
    }

    #[test]
    fn one_or_two_unanswered_status_calls_cost_only_their_entries() {
        let mut h = StatusHealth::default();
        assert_eq!(h.unanswered(1_000), None);
        assert_eq!(h.unanswered(2_000), None);
    }

    #[test]
    fn three_unanswered_status_calls_in_a_row_back_off_every_call() {
        let mut h = StatusHealth::default();
        h.unanswered(1_000);
        h.unanswered(2_000);
        assert_eq!(h.unanswered(3_000), Some(3_000 + UNANSWERED_BACKOFF_MS));
        assert_eq!(h.unanswered(4_000), None, "the count starts again");
    }

    #[test]
    fn an_answer_between_unanswered_calls_resets_the_run() {
        let mut h = StatusHealth::default();
        h.unanswered(1_000);
        h.unanswered(2_000);
        h.answered();
        assert_eq!(h.unanswered(3_000), None);
        assert_eq!(h.unanswered(4_000), None);
    }

    #[test]
    fn a_resumed_page_skips_what_was_done() {
        let r = Resume {
            cursor: Some("c".into()),
            after_key: Some("op:batches/m".into()),
        };
        assert!(r.already_done("op:batches/a"));
        assert!(r.already_done("op:batches/m"));
        assert!(!r.already_done("op:batches/n"));
        assert!(!Resume::default().already_done("op:batches/a"));
    }

    #[test]
    fn the_fan_out_schedule_and_backoff_only_move_later_and_only_the_holder_schedules() {
        let mut lease = Lease::default();
        assert!(!lease.record_fed("a", 500), "no holder, no schedule");
        assert!(lease.acquire("a", 0, 100));
        assert!(lease.record_fed("a", 500));
        assert!(lease.record_fed("a", 300));
        assert_eq!(lease.fed_until_ms, 500, "never earlier");
        assert!(!lease.record_fed("b", 900));
        assert_eq!(lease.fed_until_ms, 500);
        assert!(lease.back_off(1_000));
        assert!(!lease.back_off(400), "an earlier wait moves nothing");
        assert_eq!(
            lease.status_backoff_until_ms, 1_000,
            "a consumer only pushes it later"
        );
        assert!(lease.release("a", Resume::default(), true, 0));
        assert_eq!(
            lease.status_backoff_until_ms, 1_000,
            "nor does the release undo it"
        );
        // A consumer sending polls back needs no lease, and only pushes the schedule later.
        assert!(lease.sent_back(800));
        assert!(!lease.sent_back(600), "an earlier end moves nothing");
        assert!(!lease.sent_back(0), "nothing sent back");
        assert_eq!(lease.fed_until_ms, 800);
        assert!(lease.acquire("c", 0, 100));
        assert!(lease.record_fed("c", 700));
        assert_eq!(lease.fed_until_ms, 800, "a pass never undoes it");
        let old: Lease = serde_json::from_str(r#"{"holder":null,"expires_ms":0,"resume":{"cursor":null,"after_key":null},"status_backoff_until_ms":0,"completed_passes":3}"#).unwrap();
        assert_eq!(
            old.fed_until_ms, 0,
            "a lease saved before the fan-out reads as none"
        );
    }
}
