//! The lease's state and the pass's position: the record that keeps overlapping cron passes
//! from doing the same work, and where the next pass (and the audit) resumes.
//!
//! Guarantees: the lease admits one pass at a time, lapses by itself if its holder dies, and
//! only its holder may move the durable cursor or the audit's; a refused call changes nothing;
//! the status back-off and the fan-out schedule only move later (a queue consumer, holding no
//! lease, may push them); a gate's confirmation gets a status slot ([`Lease::take_slot`]) only
//! outside Gemini's back-off, a running pass and every slot already given, at the poll rate.
//! A routine pass lists the `open:` index whole (up to [`MAX_INDEX_PAGES`] pages, then in
//! windows) and starts after the last entry the previous pass finished ([`resume_index`]), so
//! every open operation is visited once per ceil(work / budget) passes; the audit ([`Audit`],
//! every `RECONCILE_AUDIT_SECONDS`, with its own cursor) walks the whole `op:` ledger on a
//! third of the pass kept for it ([`audit_reserve`]). A pass renews its short lease on a
//! heartbeat ([`heartbeat_interval_ms`]), saving its position each time, so a dead pass blocks
//! the next one for one lease TTL, not for the length of a pass.

use serde::{Deserialize, Serialize};

use crate::operation::ledger_walk::LedgerCursor;
use crate::operation::observation::SlotAnswer;

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

/// The audit's state, kept in the lease: where the audit in progress resumes over `op:`, and
/// when the last one finished.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Audit {
    /// Set while an audit is in progress (a pass ran out of budget or time inside it).
    pub resume: Option<LedgerCursor>,
    /// When the last audit reached the end of `op:`.
    pub last_completed_ms: i64,
    /// Audits that reached the end (0: never, so the first pass audits, which also indexes
    /// operations opened before the index existed).
    pub completed: u64,
}

impl Audit {
    /// Where the audit starts in a pass at `now_ms`, if one is in progress or due.
    pub fn due(&self, now_ms: i64, interval_ms: i64) -> Option<LedgerCursor> {
        let due =
            self.completed == 0 || now_ms >= self.last_completed_ms.saturating_add(interval_ms);
        self.resume
            .clone()
            .or_else(|| due.then(LedgerCursor::default))
    }

    /// Records how far the audit got: `complete` when it reached the end of `op:`.
    pub fn progress(&mut self, resume: LedgerCursor, complete: bool, now_ms: i64) {
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
    pub resume: LedgerCursor,
    pub complete: bool,
}

/// The reconciliation lease and what it keeps between passes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub holder: Option<String>,
    pub expires_ms: i64,
    pub resume: LedgerCursor,
    /// No status calls before this time (a 429 or 5xx asked us to back off).
    pub status_backoff_until_ms: i64,
    /// Passes that reached the end of the ledger.
    pub completed_passes: u64,
    /// When the newest of them released the lease (Unix ms; 0 before the first): what
    /// `/metrics` serves, so a rule can page when no pass has completed for a while.
    #[serde(default)]
    pub last_complete_ms: i64,
    /// The Gemini webhook state last alerted on (not `enabled`), so it alerts once.
    pub webhook_alerted_state: Option<String>,
    /// The audit over `op:`, with its own cursor.
    #[serde(default)]
    pub audit: Audit,
    /// The end of the polls scheduled on the fan-out queue, by passes and by consumers sending
    /// polls back after a wait: the next pass schedules after it, so the rate toward Gemini
    /// holds across passes, and starts no new coverage of the index before it has passed.
    #[serde(default)]
    pub fed_until_ms: i64,
    /// The end of the last slot given to a gate's confirmation ([`Lease::take_slot`]): a pass
    /// schedules after it too.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gate_slots_until_ms: i64,
}

/// For serde: a field at zero is left out.
pub(crate) fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// How late a poll on the fan-out queue may start after its slot: a message's delay is whole
/// seconds and a batch waits up to `max_batch_timeout` (1 s), so a consumer runs up to about
/// that much behind its schedule. A gate's slot comes at least this long after the queue's.
pub const QUEUE_LAG_MS: i64 = 2_000;

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
        checkpoint: Option<(LedgerCursor, i64)>,
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

    /// A gate's confirmation asks for one status call at `now_ms`, from the same budget as the
    /// pass and its consumers: refused until Gemini's back-off ends, while a pass holds the
    /// lease, and until every poll already scheduled has had its slot (the fan-out's,
    /// [`QUEUE_LAG_MS`] later, since consumers run behind their slots; and those given to
    /// other gates); granted, it takes the next slot (`gate_slots_until_ms` moves one spacing
    /// at `rate_per_s`), after which passes schedule. A refusal changes nothing and says when to
    /// ask again; the slot is not reserved, so a confirmation that waits behind a backlog may
    /// wait again, while the pass polls the same operation from its index anyway.
    pub fn take_slot(&mut self, now_ms: i64, rate_per_s: u32) -> SlotAnswer {
        let queued_until = match self.fed_until_ms {
            0 => 0,
            fed => fed.saturating_add(QUEUE_LAG_MS),
        };
        let mut free_at = self
            .status_backoff_until_ms
            .max(queued_until)
            .max(self.gate_slots_until_ms);
        if self.holder.is_some() && self.expires_ms > now_ms {
            // A pass is running: it schedules from where the slots ended when it took the
            // lease, so a slot given now could fall among its polls. Ask again in a second.
            free_at = free_at.max((now_ms + 1_000).min(self.expires_ms));
        }
        if free_at > now_ms {
            return SlotAnswer::WaitUntil { until_ms: free_at };
        }
        self.gate_slots_until_ms = now_ms + slot_spacing_ms(rate_per_s);
        SlotAnswer::Granted
    }

    /// Gives the lease back, saving where to resume. Refused (false) unless `holder` still
    /// holds it: a pass whose lease lapsed must not move the cursor of the pass after it.
    pub fn release(
        &mut self,
        holder: &str,
        resume: LedgerCursor,
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
        self.completed_passes += u64::from(complete);
        true
    }
}

/// The time between two slots at `rate_per_s` status calls a second (rounded up, so the rate
/// holds).
pub fn slot_spacing_ms(rate_per_s: u32) -> i64 {
    let rate = i64::from(rate_per_s.max(1));
    (1_000 + rate - 1) / rate
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn audit_is_due_first_then_once_per_interval_and_resumes_its_cursor() {
        let mut audit = Audit::default();
        assert_eq!(
            audit.due(1_000, 86_400_000),
            Some(LedgerCursor::default()),
            "never ran"
        );
        audit.progress(at("op:k"), false, 2_000);
        assert_eq!(
            audit.due(2_001, 86_400_000),
            Some(at("op:k")),
            "in progress"
        );
        audit.progress(LedgerCursor::default(), true, 3_000);
        assert_eq!(audit.completed, 1);
        assert_eq!(audit.due(3_001, 86_400_000), None);
        assert_eq!(
            audit.due(86_403_000, 86_400_000),
            Some(LedgerCursor::default())
        );
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
        let resume = LedgerCursor {
            cursor: Some("c".into()),
            after_key: Some("op:x".into()),
        };
        assert!(
            !lease.release("a", resume.clone(), false, 0),
            "lapsed holder may not move the cursor"
        );
        assert_eq!(lease.resume, LedgerCursor::default());
        assert!(lease.release("b", resume.clone(), false, 500));
        assert_eq!(lease.resume, resume);
        assert_eq!(lease.status_backoff_until_ms, 500);
        assert!(lease.acquire("c", 101, 100));
        assert!(lease.release("c", LedgerCursor::default(), true, 0));
        assert_eq!(lease.completed_passes, 1);
        assert_eq!(lease.status_backoff_until_ms, 500, "backoff never shrinks");
    }

    #[test]
    fn a_gate_takes_one_slot_at_the_rate_and_waits_for_backoff_and_the_schedule() {
        let mut lease = Lease::default();
        assert_eq!(lease.take_slot(1_000, 4), SlotAnswer::Granted);
        assert_eq!(
            lease.gate_slots_until_ms, 1_250,
            "the next slot is one spacing on"
        );
        assert_eq!(
            lease.take_slot(1_100, 4),
            SlotAnswer::WaitUntil { until_ms: 1_250 },
            "another gate inside the spacing waits"
        );
        assert_eq!(
            lease.gate_slots_until_ms, 1_250,
            "a refusal changes nothing"
        );
        assert_eq!(lease.take_slot(1_250, 4), SlotAnswer::Granted);
        assert!(lease.back_off(9_000));
        assert_eq!(
            lease.take_slot(2_000, 4),
            SlotAnswer::WaitUntil { until_ms: 9_000 }
        );
        assert_eq!(lease.take_slot(9_000, 4), SlotAnswer::Granted);
        // Polls scheduled on the fan-out queue hold every slot until they end, and the
        // queue's lag beyond.
        assert!(lease.sent_back(60_000));
        assert_eq!(
            lease.take_slot(10_000, 4),
            SlotAnswer::WaitUntil { until_ms: 62_000 }
        );
        // While a pass holds the lease, gates ask again a second later (or when it lapses).
        let mut lease = held("a", 70_500);
        let wait = |until_ms| SlotAnswer::WaitUntil { until_ms };
        assert_eq!(lease.take_slot(70_000, 4), wait(70_500));
        assert_eq!(lease.take_slot(60_000, 4), wait(61_000));
        assert!(lease.release("a", LedgerCursor::default(), true, 0));
        assert_eq!(lease.take_slot(60_000, 4), SlotAnswer::Granted);
        // A pass that takes the lease next schedules after the gates' slots.
        assert_eq!(lease.gate_slots_until_ms, 60_250);
    }

    #[test]
    fn slots_never_come_faster_than_the_rate() {
        assert_eq!(slot_spacing_ms(20), 50);
        assert_eq!(slot_spacing_ms(3), 334);
        assert_eq!(slot_spacing_ms(0), 1_000);
        let mut lease = Lease::default();
        let mut granted = Vec::new();
        for now in (0..3_000).step_by(10) {
            if lease.take_slot(now, 3) == SlotAnswer::Granted {
                granted.push(now);
            }
        }
        assert!(
            granted.windows(2).all(|w| w[1] - w[0] >= 334),
            "{granted:?}"
        );
        assert_eq!(granted.len(), 9);
    }

    fn held(holder: &str, expires_ms: i64) -> Lease {
        Lease {
            holder: Some(holder.into()),
            expires_ms,
            ..Lease::default()
        }
    }

    fn at(after: &str) -> LedgerCursor {
        LedgerCursor {
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
    fn a_resumed_page_skips_what_was_done() {
        let r = LedgerCursor {
            cursor: Some("c".into()),
            after_key: Some("op:batches/m".into()),
        };
        assert!(r.already_done("op:batches/a"));
        assert!(r.already_done("op:batches/m"));
        assert!(!r.already_done("op:batches/n"));
        assert!(!LedgerCursor::default().already_done("op:batches/a"));
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
        assert!(lease.release("a", LedgerCursor::default(), true, 0));
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
        assert_eq!(
            old.last_complete_ms, 0,
            "a lease saved before /metrics reads as no complete pass yet"
        );
    }
}
