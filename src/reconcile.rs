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

use serde::{Deserialize, Serialize};

use crate::alert::{EFFECT_FAILING, STUCK};
use crate::ledger::LedgerMeta;
use crate::lifecycle::Status;

/// The thresholds a pass decides with (seconds).
#[derive(Debug, Clone, Copy)]
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
    Alert { kind: &'static str, age_secs: i64 },
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
    let status = Status::parse(&meta.status);
    let alerted = |kind: &str| meta.alerts.iter().any(|a| a == kind);
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
        if (meta.parked || settled_age >= t.effect_alert_after_secs) && !alerted(EFFECT_FAILING) {
            actions.push(Action::Alert {
                kind: EFFECT_FAILING,
                age_secs: settled_age,
            });
        }
    } else if status.rank() >= 0 {
        let age = now_secs - meta.submitted_at;
        if age >= t.grace_secs {
            actions.push(Action::Poll);
        }
        if age >= t.stuck_after_secs && !alerted(STUCK) {
            actions.push(Action::Alert {
                kind: STUCK,
                age_secs: age,
            });
        }
    }
    actions
}

/// Where the next pass starts: the page cursor, and the last entry done on that page.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resume {
    pub cursor: Option<String>,
    pub after_key: Option<String>,
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

#[cfg(test)]
mod tests {
    use super::*;

    const T: Thresholds = Thresholds {
        grace_secs: 90,
        stuck_after_secs: 21_600,
        effect_alert_after_secs: 3_600,
    };

    fn meta(status: &str) -> LedgerMeta {
        LedgerMeta {
            status: status.into(),
            name: "batches/a".into(),
            submitted_at: 1_000,
            settled_at: None,
            effect_done: false,
            parked: false,
            claim_expires: None,
            alerts: vec![],
            forgotten: false,
            version: 1,
        }
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
                    kind: STUCK,
                    age_secs: 21_600
                }
            ]
        );
        let mut m = meta("running");
        m.alerts = vec![STUCK.into()];
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
                    kind: EFFECT_FAILING,
                    age_secs: 3_600
                }
            ]
        );
        m.alerts = vec![EFFECT_FAILING.into()];
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
                kind: EFFECT_FAILING,
                age_secs: 1
            }]
        );
        m.alerts = vec![EFFECT_FAILING.into()];
        assert_eq!(decide(&m, 1_001, &T), vec![]);
    }

    #[test]
    fn unknown_ledger_status_is_left_alone() {
        assert_eq!(decide(&meta("weird"), 99_999, &T), vec![]);
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
}
