//! The messages between the edge and the ReconcileLease object: the lease that keeps one cron
//! pass at a time, with where the next one resumes.
//!
//! Guarantees: both directions are plain tagged JSON, tested on the host and logged as is; a
//! renewal or release from a holder that lost the lease is refused, so a pass that lost it
//! saves nothing ([`decide`] says what each command does to the lease, host-tested).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::operation::ledger_walk::LedgerCursor;
use crate::operation::observation::SlotAnswer;
use crate::reconciliation::lease_state::{is_zero, Audit, AuditProgress, Lease};

/// A request to the ReconcileLease object (one for the whole worker).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum LeaseCommand {
    /// Take the lease if free or lapsed; answers with where to resume.
    Acquire { holder: String, ttl_ms: i64 },
    /// The holder's heartbeat: extend the lease by `ttl_ms` from now and save where the pass
    /// has got to, so a pass killed before it releases loses at most one heartbeat of work.
    /// Refused unless `holder` still holds the lease; the pass then stops and saves nothing.
    Renew {
        holder: String,
        ttl_ms: i64,
        resume: LedgerCursor,
        status_backoff_until_ms: i64,
        /// Where the audit in progress has got to, if this pass is auditing.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        audit: Option<AuditProgress>,
        /// How far the pass has scheduled polls on the fan-out queue (0: none).
        #[serde(default, skip_serializing_if = "is_zero")]
        fed_until_ms: i64,
    },
    /// Give it back with where the next pass starts and the pass's summary.
    Release {
        holder: String,
        resume: LedgerCursor,
        complete: bool,
        status_backoff_until_ms: i64,
        /// When the pass checked the Gemini webhook: the state now alerted on, if any.
        #[serde(default)]
        webhook_checked: bool,
        webhook_alerted_state: Option<String>,
        /// How far this pass's audit got, if it audited.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        audit: Option<AuditProgress>,
        /// How far the pass has scheduled polls on the fan-out queue (0: none).
        #[serde(default, skip_serializing_if = "is_zero")]
        fed_until_ms: i64,
        summary: Value,
    },
    /// From a fan-out consumer that Gemini asked to wait: no status call before `until_ms`;
    /// and, when it sends polls back to the queue, where their slots end (`fed_until_ms`,
    /// recorded before they are sent). Needs no lease: it only ever pushes both later.
    Backoff {
        until_ms: i64,
        #[serde(default, skip_serializing_if = "is_zero")]
        fed_until_ms: i64,
    },
    /// From a gate's alarm about to ask the status API for a nudge's confirmation: one slot
    /// of the budget the pass and its consumers share (`RECONCILE_POLL_RATE`, and Gemini's
    /// back-off). Needs no lease.
    Slot { rate_per_s: u32 },
    /// The lease, the cursor and the last pass's summary.
    Status,
}

/// The ReconcileLease object's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum LeaseReply {
    Granted {
        resume: LedgerCursor,
        status_backoff_until_ms: i64,
        webhook_alerted_state: Option<String>,
        /// The audit's state: the pass decides with its configured interval whether it is due.
        #[serde(default)]
        audit: Audit,
        /// Where the polls already scheduled on the fan-out queue end.
        #[serde(default)]
        fed_until_ms: i64,
    },
    /// The answer to [`LeaseCommand::Backoff`].
    BackedOff,
    /// The answer to [`LeaseCommand::Slot`].
    Slot {
        answer: SlotAnswer,
    },
    Busy,
    /// The answer to [`LeaseCommand::Renew`]; `accepted: false` means the lease is lost.
    Renewed {
        accepted: bool,
    },
    Released {
        accepted: bool,
    },
    State {
        lease: Lease,
        last_pass: Option<Value>,
    },
}

/// What a command did to the lease, for the object to store and answer.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseTurn {
    pub reply: LeaseReply,
    /// The lease changed: store it (in the same synchronous turn as the read).
    pub save: bool,
    /// A released pass's summary, stored as the last pass's.
    pub last_pass: Option<Value>,
}

/// Decides `command` on `lease` at `now` (the object reads the lease, calls this, and writes
/// what it says with no await in between, so two overlapping passes never both hold it).
/// [`LeaseCommand::Status`] is the object's to answer: it reads the last pass too.
pub fn decide(lease: &mut Lease, command: LeaseCommand, now: i64) -> LeaseTurn {
    let turn = |reply, save| LeaseTurn {
        reply,
        save,
        last_pass: None,
    };
    match command {
        LeaseCommand::Acquire { holder, ttl_ms } => {
            if !lease.acquire(&holder, now, ttl_ms) {
                return turn(LeaseReply::Busy, false);
            }
            let granted = LeaseReply::Granted {
                resume: lease.resume.clone(),
                status_backoff_until_ms: lease.status_backoff_until_ms,
                webhook_alerted_state: lease.webhook_alerted_state.clone(),
                audit: lease.audit.clone(),
                // Slots given to gates are scheduled polls too: the pass goes after them.
                fed_until_ms: lease.fed_until_ms.max(lease.gate_slots_until_ms),
            };
            turn(granted, true)
        }
        LeaseCommand::Renew {
            holder,
            ttl_ms,
            resume,
            status_backoff_until_ms,
            audit,
            fed_until_ms,
        } => {
            let progress = Some((resume, status_backoff_until_ms));
            let accepted = lease.renew(&holder, now, ttl_ms, progress);
            // Fenced like the renewal: refused with it.
            if let Some(progress) = audit {
                lease.record_audit(&holder, progress, now);
            }
            lease.record_fed(&holder, fed_until_ms);
            turn(LeaseReply::Renewed { accepted }, accepted)
        }
        release @ LeaseCommand::Release { .. } => released(lease, release, now),
        LeaseCommand::Backoff {
            until_ms,
            fed_until_ms,
        } => {
            // Both, unconditionally: `|` does not stop at the first that moved.
            let moved = lease.back_off(until_ms) | lease.sent_back(fed_until_ms);
            turn(LeaseReply::BackedOff, moved)
        }
        LeaseCommand::Slot { rate_per_s } => {
            let answer = lease.take_slot(now, rate_per_s);
            turn(LeaseReply::Slot { answer }, answer == SlotAnswer::Granted)
        }
        LeaseCommand::Status => turn(
            LeaseReply::State {
                lease: lease.clone(),
                last_pass: None,
            },
            false,
        ),
    }
}

/// A pass's release: its position, its audit's and its feed's (each fenced: only the holder
/// moves them), when it completed, the webhook state it alerted on, and its summary.
fn released(lease: &mut Lease, command: LeaseCommand, now: i64) -> LeaseTurn {
    let LeaseCommand::Release {
        holder,
        resume,
        complete,
        status_backoff_until_ms,
        webhook_checked,
        webhook_alerted_state,
        audit,
        fed_until_ms,
        summary,
    } = command
    else {
        unreachable!("only a release is released")
    };
    if let Some(progress) = audit {
        lease.record_audit(&holder, progress, now);
    }
    lease.record_fed(&holder, fed_until_ms);
    let accepted = lease.release(&holder, resume, complete, status_backoff_until_ms);
    if accepted && complete {
        lease.last_complete_ms = now;
    }
    if accepted && webhook_checked {
        lease.webhook_alerted_state = webhook_alerted_state;
    }
    LeaseTurn {
        reply: LeaseReply::Released { accepted },
        save: accepted,
        last_pass: Some(summary),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(holder: &str, complete: bool) -> LeaseCommand {
        LeaseCommand::Release {
            holder: holder.into(),
            resume: LedgerCursor::default(),
            complete,
            status_backoff_until_ms: 0,
            webhook_checked: false,
            webhook_alerted_state: None,
            audit: None,
            fed_until_ms: 0,
            summary: serde_json::json!({"pass": holder}),
        }
    }

    #[test]
    fn one_holder_at_a_time_and_a_lost_lease_saves_nothing() {
        let mut lease = Lease::default();
        let acquire = |holder: &str| LeaseCommand::Acquire {
            holder: holder.into(),
            ttl_ms: 1_000,
        };
        assert!(decide(&mut lease, acquire("a"), 0).save);
        let busy = decide(&mut lease, acquire("b"), 10);
        assert_eq!((busy.reply, busy.save), (LeaseReply::Busy, false));
        // After the TTL, another takes it; the first one's release is refused and saves
        // nothing but its summary.
        assert!(decide(&mut lease, acquire("b"), 1_001).save);
        let late = decide(&mut lease, release("a", true), 1_002);
        assert_eq!(late.reply, LeaseReply::Released { accepted: false });
        assert!(!late.save);
        assert_eq!(late.last_pass, Some(serde_json::json!({"pass": "a"})));
        assert_eq!(lease.last_complete_ms, 0);
    }

    #[test]
    fn a_complete_release_records_when() {
        let mut lease = Lease::default();
        let acquire = LeaseCommand::Acquire {
            holder: "a".into(),
            ttl_ms: 1_000,
        };
        decide(&mut lease, acquire, 0);
        let done = decide(&mut lease, release("a", true), 500);
        assert_eq!(done.reply, LeaseReply::Released { accepted: true });
        assert!(done.save);
        assert_eq!(lease.last_complete_ms, 500);
    }

    #[test]
    fn a_backoff_saves_only_when_it_moved_something() {
        let mut lease = Lease::default();
        let backoff = |until_ms| LeaseCommand::Backoff {
            until_ms,
            fed_until_ms: 0,
        };
        assert!(decide(&mut lease, backoff(100), 0).save);
        assert!(!decide(&mut lease, backoff(50), 0).save, "never earlier");
    }

    #[test]
    fn lease_renewal_round_trips_as_tagged_json() {
        let cmd = LeaseCommand::Renew {
            holder: "pass-1".into(),
            ttl_ms: 60_000,
            resume: LedgerCursor {
                cursor: Some("c".into()),
                after_key: Some("op:batches/a".into()),
            },
            status_backoff_until_ms: 5,
            audit: None,
            fed_until_ms: 0,
        };
        assert!(!serde_json::to_string(&cmd)
            .unwrap()
            .contains("fed_until_ms"));
        let text = serde_json::to_string(&cmd).unwrap();
        assert!(text.contains(r#""command":"renew""#));
        assert_eq!(serde_json::from_str::<LeaseCommand>(&text).unwrap(), cmd);
        // A consumer's report: the slots it sends back only when it sends some.
        let wait = LeaseCommand::Backoff {
            until_ms: 9,
            fed_until_ms: 0,
        };
        assert_eq!(
            serde_json::to_string(&wait).unwrap(),
            r#"{"command":"backoff","until_ms":9}"#
        );
        let sent_back = LeaseCommand::Backoff {
            until_ms: 9,
            fed_until_ms: 12,
        };
        let text = serde_json::to_string(&sent_back).unwrap();
        assert_eq!(
            serde_json::from_str::<LeaseCommand>(&text).unwrap(),
            sent_back
        );
        // A gate's request for a status slot, and the answers.
        let slot = LeaseCommand::Slot { rate_per_s: 20 };
        assert_eq!(
            serde_json::to_string(&slot).unwrap(),
            r#"{"command":"slot","rate_per_s":20}"#
        );
        let wait = LeaseReply::Slot {
            answer: SlotAnswer::WaitUntil { until_ms: 7 },
        };
        let text = serde_json::to_string(&wait).unwrap();
        assert_eq!(
            text,
            r#"{"outcome":"slot","answer":{"slot":"wait_until","until_ms":7}}"#
        );
        assert_eq!(serde_json::from_str::<LeaseReply>(&text).unwrap(), wait);
        let reply = LeaseReply::Renewed { accepted: false };
        let text = serde_json::to_string(&reply).unwrap();
        assert_eq!(text, r#"{"outcome":"renewed","accepted":false}"#);
        assert_eq!(serde_json::from_str::<LeaseReply>(&text).unwrap(), reply);
    }
}
