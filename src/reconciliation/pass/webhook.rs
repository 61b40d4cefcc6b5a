//! The Gemini webhook's own state (`GET v1beta/webhooks`), checked at the start of a pass:
//! an alert once per state change when it is not `enabled` and is left so (`restore.rs`
//! decides what is restored instead, and says why the rest is left).
//!
//! Guarantees: at most [`MAX_WEBHOOK_PAGES`] pages, each only with room for it and one more
//! subrequest, and each read whole up to a cap (a page past it fails the check, saying so); a
//! check that could not be made leaves the mark the lease keeps as it was; an
//! alert that could not be sent leaves it too, so the next pass tries again.

use crate::reconciliation::status::{enable_webhook_call, read_answer, webhook_enabled};
use crate::reconciliation::status::{find_webhook, webhook_alert};
use crate::retry::PeerAnswer;

use super::restore::{verdict, Sweep, Verdict};
use super::{walk::IndexWalk, Awaiting, Intent, Pass, PassLog, Phase, MAX_WEBHOOK_PAGES};
use crate::operation::ledger_walk::LedgerCursor;

/// A webhook check in progress.
#[derive(Debug, Default)]
pub(super) struct Check {
    pub(super) name: String,
    token: Option<String>,
    pub(super) state: Option<String>,
    /// The webhook's id, for enabling it again.
    id: Option<String>,
    pages: usize,
    /// The listing said all it will: the state is known, or no page is left.
    read: bool,
    /// The mark an alert being sent will leave.
    alerting: Option<Option<String>>,
    /// Why the webhook is left as it is (said in the alert), once that is decided.
    pub(super) left: Option<String>,
    /// The routine walk that starts after the check.
    pub(super) then: IndexWalk,
}

impl Check {
    pub(super) fn new(name: String, then: IndexWalk) -> Check {
        Check {
            name,
            then,
            ..Check::default()
        }
    }
}

impl Pass {
    pub(super) fn webhook_step(&mut self, mut check: Check) -> Option<Intent> {
        if check.read || check.pages == MAX_WEBHOOK_PAGES {
            return self.webhook_conclude(check);
        }
        if !self.books.affords(2) {
            self.webhook = None;
            self.phase = Phase::Index(check.then);
            return None;
        }
        let base = &self.books.limits.api_base;
        let mut url = format!("{base}/v1beta/webhooks?page_size=1000");
        if let Some(t) = &check.token {
            let t = percent_encoding::utf8_percent_encode(t, percent_encoding::NON_ALPHANUMERIC);
            url.push_str(&format!("&page_token={t}"));
        }
        check.pages += 1;
        let list = Intent::ListWebhooks { url };
        self.call(Phase::Webhook(check), Awaiting::WebhookPage, list)
    }

    /// A page of the webhook listing, as asked by [`Intent::ListWebhooks`].
    pub(super) fn on_webhook_page(&mut self, answer: PeerAnswer) {
        let Phase::Webhook(mut check) = std::mem::replace(&mut self.phase, Phase::Done) else {
            return;
        };
        let page = read_answer(&answer, "a listing page", |body| {
            find_webhook(body, &check.name)
        });
        match page {
            Ok(page) => {
                if page.state.is_some() {
                    check.id = page.id;
                }
                check.state = page.state.or(check.state);
                check.token = page.next_page_token;
                check.read = check.state.is_some() || check.token.is_none();
                self.phase = Phase::Webhook(check);
            }
            Err(e) => {
                let (webhook, error) = (check.name, format!("{e:?}"));
                self.books
                    .error(PassLog::WebhookCheckFailed { webhook, error });
                self.webhook = None;
                self.phase = Phase::Index(check.then);
            }
        }
    }

    /// The state is known: enable the webhook again, or alert (once per state) that it is
    /// left as it is. Reached again with `left` set when enabling it failed.
    fn webhook_conclude(&mut self, mut check: Check) -> Option<Intent> {
        let state = check.state.get_or_insert("not_found".into()).clone();
        if check.left.is_none() {
            self.books.log(PassLog::WebhookState {
                webhook: check.name.clone(),
                state: state.clone(),
            });
            if state != "enabled" {
                let answering = self.answering();
                let auto_enable = self.books.limits.webhook_auto_enable;
                let why = match verdict(&state, check.id.as_deref(), auto_enable, answering) {
                    // The call (what is restored, and what follows: `restore.rs`), and the alert
                    // saying what it did.
                    Verdict::Restore { id } if self.books.affords(2) => {
                        let (url, body) = enable_webhook_call(&self.books.limits.api_base, &id);
                        let enable = Intent::EnableWebhook { url, body };
                        return self.call(Phase::Webhook(check), Awaiting::WebhookEnable, enable);
                    }
                    Verdict::Restore { .. } => {
                        "Left disabled: this pass has no budget left to enable it; the next tries."
                            .to_string()
                    }
                    Verdict::Leave { why } => why,
                };
                check.left = Some(why);
            }
        }
        let (alert, mark) = webhook_alert(self.webhook_alerted_state.as_deref(), &state);
        if !alert {
            self.webhook = Some(mark);
            self.phase = Phase::Index(check.then);
            return None;
        }
        let left = check.left.as_deref().unwrap_or_default();
        let body = crate::operation::alert::webhook_disabled(&check.name, &state, left);
        check.alerting = Some(mark);
        // The alert's post is a subrequest like any other call: counted against the budget.
        let alert = Intent::PostAlert(body);
        self.call(Phase::Webhook(check), Awaiting::WebhookAlert, alert)
    }

    /// Whether the alert of [`Intent::PostAlert`] was sent.
    pub(super) fn on_alert_posted(&mut self, sent: bool) {
        let Phase::Webhook(check) = std::mem::replace(&mut self.phase, Phase::Done) else {
            return;
        };
        self.webhook = if sent {
            self.books.report.alerts += 1;
            check.alerting
        } else {
            // Not sent: keep the old mark so the next pass tries again.
            Some(self.webhook_alerted_state.clone())
        };
        self.phase = Phase::Index(check.then);
    }

    /// The WebhookService's answer to [`Intent::EnableWebhook`].
    pub(super) fn on_webhook_enabled(&mut self, answer: PeerAnswer) {
        let Phase::Webhook(mut check) = std::mem::replace(&mut self.phase, Phase::Done) else {
            return;
        };
        let was = check.state.clone().unwrap_or_default();
        // Enabled: a 2xx whose body does not name another state.
        if let Err(e) = read_answer(&answer, "an answer", |body| webhook_enabled(body)) {
            let (webhook, error) = (check.name.clone(), format!("{e:?}"));
            self.books
                .error(PassLog::WebhookEnableFailed { webhook, error });
            // Alerted once per state, as any webhook left disabled; the next pass tries again.
            let left = format!("Enabling it failed ({e:?}); the next pass tries again.");
            check.left = Some(left);
            self.phase = Phase::Webhook(check);
            return;
        }
        let swept = self.books.limits.fanout.is_some();
        self.books.log(PassLog::WebhookEnabled {
            webhook: check.name.clone(),
            was: was.clone(),
            swept,
        });
        // Enabled: nothing is outstanding, so a later disabling alerts again.
        self.webhook = Some(None);
        self.sweep = Some(Sweep {
            webhook: check.name,
            was,
            announced: false,
        });
        // The walk keeps one subrequest for the alert (the release's is kept already).
        self.books.budget_limit = self.books.budget_limit.saturating_sub(1);
        self.phase = Phase::Index(if swept {
            IndexWalk::new(LedgerCursor::default(), check.then.audit_from)
        } else {
            check.then
        });
    }
}
