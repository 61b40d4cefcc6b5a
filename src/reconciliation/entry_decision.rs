//! The per-entry decision: what one ledger entry needs, from its metadata alone, and what
//! the audit does with an `op:` entry the `open:` index may have missed or kept too long.
//!
//! Guarantees: an entry that is terminal with its side effect done needs nothing (no value
//! read, no status call, no gate call), whatever the ledger's size; a non-terminal entry is
//! polled only past the grace period; a terminal entry whose side effect is neither done nor
//! parked is handed back to the gate (unless a live claim holds it); each alert is asked for
//! only while the ledger shows it unsent (the gate sends it at most once). Whatever [`decide`]
//! may act on is in the index ([`may_need_work`]); the audit ([`audit_verdict`]) acts on, and
//! has the gate re-index, what the index missed. The pass that puts these decisions in order
//! is [`crate::reconciliation::pass`].

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
    let alerted = |kind: AlertKind| meta.alerts.contains(&kind);
    let mut actions = Vec::new();
    if meta.forgotten || (meta.status.is_terminal() && meta.effect_done) {
        return actions;
    }
    if meta.status.is_terminal() {
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
    } else if meta.status.rank() >= 0 {
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
    match (may_need_work(meta), index_whole, indexed_version) {
        (true, false, _) | (true, true, None) => AuditVerdict::Missed,
        (false, true, Some(v)) if v < meta.version => AuditVerdict::Stale,
        _ => AuditVerdict::Fine,
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
}
