//! The messages between the edge and the ReconcileLease object's two instances: the lease
//! that keeps one cron pass at a time (with where the next one resumes), and the strangers'
//! tally that raises one alert about many nudges for operations the worker does not hold.
//!
//! Guarantees: both directions are plain tagged JSON, tested on the host and logged as is; a
//! renewal or release from a holder that lost the lease is refused, so a pass that lost it
//! saves nothing.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::inbound::stranger::AlertLimits;
use crate::reconciliation::lease_state::{Audit, AuditProgress, Lease, Resume, SlotAnswer};

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
        resume: Resume,
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
        resume: Resume,
        complete: bool,
        status_backoff_until_ms: i64,
        /// When the pass checked the Gemini webhook: the state now alerted on, if any.
        #[serde(default)]
        webhook_checked: bool,
        #[serde(default)]
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
    /// To the strangers' tally (another instance of the lease's class): one more nudge
    /// named an operation the worker does not hold.
    StrangerNudge { limits: AlertLimits },
    /// The lease, the cursor and the last pass's summary.
    Status,
}

/// The ReconcileLease object's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum LeaseReply {
    Granted {
        resume: Resume,
        status_backoff_until_ms: i64,
        #[serde(default)]
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
    /// `alert`: this crossed the window's threshold; the tally sends the one alert.
    StrangerCounted {
        alert: bool,
    },
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_renewal_round_trips_as_tagged_json() {
        let cmd = LeaseCommand::Renew {
            holder: "pass-1".into(),
            ttl_ms: 60_000,
            resume: Resume {
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
