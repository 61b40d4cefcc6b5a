//! The pass and its lease: taking it (and what the grant says about where to start and
//! whether an audit is due), the heartbeat's renewals, and the release with the pass's
//! summary, or none once the lease is lost.

use crate::operation::ledger::OPEN_PREFIX;
use crate::reconciliation::lease_protocol::{LeaseCommand, LeaseReply};
use crate::reconciliation::lease_state::{audit_reserve, lease_presumed_lapsed};

use super::stop::Stop;

use super::walk::{IndexWalk, Walked};
use super::{walked, webhook, Awaiting, Intent, Pass, PassLog, Phase};

impl Pass {
    pub(super) fn acquire(&mut self) -> Option<Intent> {
        let (holder, ttl_ms) = (self.holder.clone(), self.books.limits.lease_ttl_ms);
        let acquire = LeaseCommand::Acquire { holder, ttl_ms };
        self.call(Phase::Acquire, Awaiting::Acquire, Intent::Lease(acquire))
    }

    /// The lease object's answer (`Err`: the call failed) to [`Intent::Lease`], at `now_ms`.
    pub(super) fn on_acquired(&mut self, reply: Result<LeaseReply, String>, now_ms: i64) {
        match reply {
            Ok(LeaseReply::Granted {
                resume,
                status_backoff_until_ms,
                webhook_alerted_state,
                audit,
                fed_until_ms,
            }) => {
                self.books.status_backoff_until_ms = status_backoff_until_ms;
                self.fed_until_ms = fed_until_ms;
                // A cursor saved before the index existed points into `op:`: the index starts
                // over.
                let in_index = |k: &str| k.starts_with(OPEN_PREFIX);
                let resume = Some(resume)
                    .filter(|r| r.after_key.as_deref().is_none_or(in_index))
                    .unwrap_or_default();
                self.checkpoint = (resume.clone(), status_backoff_until_ms);
                let audit_from = audit.due(self.started_ms, self.books.limits.audit_interval_ms);
                if audit_from.is_some() {
                    // Keep a third of the budget (and of the deadline: `must_stop`) for the audit.
                    let budget = i64::from(self.books.limits.budget);
                    self.books.budget_limit = (budget - audit_reserve(budget)) as u32;
                }
                self.webhook_alerted_state = webhook_alerted_state;
                self.last_renewed_ms = now_ms;
                let walk = IndexWalk::new(resume, audit_from);
                match self.books.limits.webhook_name.clone() {
                    Some(name) => self.phase = Phase::Webhook(webhook::Check::new(name, walk)),
                    None => self.phase = Phase::Index(walk),
                }
            }
            Ok(_) => {
                self.books.report.skipped_busy = true;
                self.phase = Phase::Finish;
            }
            Err(e) => {
                self.books.error(PassLog::error(format!("lease: {e}")));
                self.phase = Phase::Finish;
            }
        }
    }

    /// A heartbeat tick: the renewal to send (answer with [`Pass::on_renewed`]), or `None`
    /// once the pass is over, or when the budget has no room for it and the release, which
    /// stops the walk.
    pub fn on_heartbeat(&mut self) -> Option<LeaseCommand> {
        if matches!(self.phase, Phase::Done) {
            return None; // the line is logged: nothing is held, nothing more is counted
        }
        if self.books.report.subrequests + 2 > self.books.limits.budget {
            self.heartbeat_stop = Some(Stop::Budget);
            return None;
        }
        self.books.spend(1);
        self.books.report.lease_renewals += 1;
        let (resume, status_backoff_until_ms) = self.checkpoint.clone();
        Some(LeaseCommand::Renew {
            holder: self.holder.clone(),
            ttl_ms: self.books.limits.lease_ttl_ms,
            resume,
            status_backoff_until_ms,
            audit: walked(&self.phase).and_then(|w| w.audit.clone()),
            fed_until_ms: self.fed_sent(),
        })
    }

    /// The answer to a renewal, at `now_ms`. False when the heartbeat ends, which stops the
    /// walk: the renewal was refused (the lease is lost), or renewals have failed for a whole
    /// TTL (it may have lapsed).
    pub fn on_renewed(&mut self, reply: Result<LeaseReply, String>, now_ms: i64) -> bool {
        match reply {
            Ok(LeaseReply::Renewed { accepted: true }) => {
                self.last_renewed_ms = now_ms;
                true
            }
            Ok(other) => {
                self.books
                    .log(PassLog::error(format!("lease renewal refused: {other:?}")));
                self.heartbeat_stop = Some(Stop::LeaseLost);
                false
            }
            Err(e) => {
                self.books
                    .error(PassLog::error(format!("lease renewal: {e}")));
                let ttl_ms = self.books.limits.lease_ttl_ms;
                if lease_presumed_lapsed(now_ms, self.last_renewed_ms, ttl_ms) {
                    self.heartbeat_stop = Some(Stop::LeaseLapsed);
                    return false;
                }
                true
            }
        }
    }

    /// The work is over: release the lease with where the next pass starts, unless it was
    /// lost (the new holder's cursor is not ours to move).
    pub(super) fn release(&mut self, walked: Walked, now_ms: i64) -> Option<Intent> {
        let (resume, stop) = walked.end;
        // A lost lease wins over whatever stopped the walk.
        let lost = self.heartbeat_stop == Some(Stop::LeaseLost);
        let stop = if lost { Stop::LeaseLost } else { stop };
        self.books.report.stopped = Some(stop);
        self.books.report.complete = stop == Stop::Complete;
        if !stop.releases() {
            let holder = self.holder.clone();
            self.books.log(PassLog::ReconcileLeaseLost { holder });
            self.phase = Phase::Finish;
            return None;
        }
        self.books.spend(1);
        self.books.report.elapsed_ms = now_ms - self.started_ms;
        let webhook = self.webhook.take();
        let release = LeaseCommand::Release {
            holder: self.holder.clone(),
            resume,
            complete: self.books.report.complete,
            status_backoff_until_ms: self.books.status_backoff_until_ms,
            webhook_checked: webhook.is_some(),
            webhook_alerted_state: webhook.flatten(),
            audit: walked.audit,
            fed_until_ms: self.fed_sent(),
            summary: serde_json::json!({
                "at": crate::timestamp::format_rfc3339(self.started_ms),
                "report": self.books.report.to_value(),
            }),
        };
        self.phase = Phase::Finish; // once the release is answered
        self.awaiting = Some(Awaiting::Release);
        Some(Intent::Lease(release))
    }

    pub(super) fn on_released(&mut self, reply: Result<LeaseReply, String>) {
        match reply {
            Ok(LeaseReply::Released { accepted: true }) => {}
            Ok(other) => self
                .books
                .log(PassLog::error(format!("lease release refused: {other:?}"))),
            Err(e) => self
                .books
                .error(PassLog::error(format!("lease release: {e}"))),
        }
    }

    /// How far this pass scheduled polls on the fan-out queue, for the lease (0: nothing).
    fn fed_sent(&self) -> i64 {
        if self.books.report.fed == 0 {
            return 0;
        }
        self.fed_until_ms
    }

    /// The pass's line, and the end.
    pub(super) fn finish(&mut self, now_ms: i64) -> Option<Intent> {
        self.books.report.elapsed_ms = now_ms - self.started_ms;
        self.books
            .log(PassLog::ReconcilePass(self.books.report.clone()));
        self.phase = Phase::Done;
        None
    }
}
