//! The Gemini webhook's own state (`GET v1beta/webhooks`), checked at the start of a pass:
//! an alert once per state change when it is not `enabled`.
//!
//! Guarantees: at most [`MAX_WEBHOOK_PAGES`] pages, each only with room for it and one more
//! subrequest, and each read whole up to a cap (a page past it fails the check, saying so); a
//! check that could not be made leaves the mark the lease keeps as it was; an
//! alert that could not be sent leaves it too, so the next pass tries again.

use crate::operation::observation::{transient, StatusError};
use crate::reconciliation::status::{find_webhook, webhook_alert, WebhookPage};
use crate::retry::{Answer, Class};

use super::{Awaiting, Flow, Intent, Pass, PassLog, Phase, MAX_WEBHOOK_PAGES};
use crate::reconciliation::lease_state::Resume;

/// A webhook check in progress.
#[derive(Debug)]
pub(super) struct Check {
    name: String,
    token: Option<String>,
    state: Option<String>,
    pages: usize,
    /// The listing said all it will: the state is known, or no page is left.
    read: bool,
    /// The mark an alert being sent will leave.
    alerting: Option<Option<String>>,
    /// Where the routine walk starts after the check.
    then: Resume,
}

impl Check {
    pub(super) fn new(name: String, then: Resume) -> Check {
        Check {
            name,
            token: None,
            state: None,
            pages: 0,
            read: false,
            alerting: None,
            then,
        }
    }
}

/// What a page of the listing says: the class of the answer decides.
fn page_of(answer: &Answer, name: &str) -> Result<WebhookPage, StatusError> {
    match (answer, answer.class()) {
        (Answer::Http { body, .. }, Class::Success) => find_webhook(body, name),
        (Answer::Http { status, .. }, Class::Refused) => Err(StatusError::Refused(*status)),
        // Said in the log line, so an operator sees how long Gemini asked to wait.
        (Answer::Http { retry_after, .. }, _) => Err(transient(retry_after.as_deref())),
        (Answer::TooLarge { cap, .. }, _) => Err(StatusError::Malformed(format!(
            "a listing page over {cap} bytes"
        ))),
        (Answer::Timeout | Answer::Network(_), _) => Err(StatusError::Transient {
            retry_after_secs: 0,
        }),
    }
}

impl Pass {
    pub(super) fn webhook_step(&mut self, mut check: Check) -> Flow {
        if check.read || check.pages == MAX_WEBHOOK_PAGES {
            return self.webhook_conclude(check);
        }
        if !self.affords(2) {
            self.webhook = None;
            self.start_walk(check.then);
            return Flow::Continue;
        }
        let mut url = format!("{}/v1beta/webhooks?page_size=1000", self.limits.api_base);
        if let Some(t) = &check.token {
            url.push_str(&format!(
                "&page_token={}",
                percent_encoding::utf8_percent_encode(t, percent_encoding::NON_ALPHANUMERIC)
            ));
        }
        self.spend(1);
        check.pages += 1;
        self.phase = Phase::Webhook(check);
        self.awaiting = Some(Awaiting::WebhookPage);
        Flow::Io(Intent::ListWebhooks { url })
    }

    /// A page of the webhook listing, as asked by [`Intent::ListWebhooks`].
    pub fn on_webhook_page(&mut self, answer: Answer) {
        if self.answered(|a| *a == Awaiting::WebhookPage).is_none() {
            return;
        }
        let Phase::Webhook(mut check) = std::mem::replace(&mut self.phase, Phase::Done) else {
            return;
        };
        match page_of(&answer, &check.name) {
            Ok(page) => {
                check.state = page.state.or(check.state);
                check.token = page.next_page_token;
                check.read = check.state.is_some() || check.token.is_none();
                self.phase = Phase::Webhook(check);
            }
            Err(e) => {
                self.report.errors += 1;
                self.log(PassLog::WebhookCheckFailed {
                    webhook: check.name,
                    error: format!("{e:?}"),
                });
                self.webhook = None;
                self.start_walk(check.then);
            }
        }
    }

    fn webhook_conclude(&mut self, mut check: Check) -> Flow {
        let state = check
            .state
            .take()
            .unwrap_or_else(|| "not_found".to_string());
        let (alert, mark) = webhook_alert(self.webhook_alerted_state.as_deref(), &state);
        self.log(PassLog::WebhookState {
            webhook: check.name.clone(),
            state: state.clone(),
        });
        if !alert {
            self.webhook = Some(mark);
            self.start_walk(check.then);
            return Flow::Continue;
        }
        let body = crate::operation::alert::webhook_disabled(&check.name, &state);
        check.alerting = Some(mark);
        self.phase = Phase::Webhook(check);
        self.awaiting = Some(Awaiting::WebhookAlert);
        Flow::Io(Intent::PostAlert(body))
    }

    /// Whether the alert of [`Intent::PostAlert`] was sent.
    pub fn on_alert_posted(&mut self, sent: bool) {
        if self.answered(|a| *a == Awaiting::WebhookAlert).is_none() {
            return;
        }
        let Phase::Webhook(check) = std::mem::replace(&mut self.phase, Phase::Done) else {
            return;
        };
        self.webhook = if sent {
            self.report.alerts += 1;
            check.alerting
        } else {
            // Not sent: keep the old mark so the next pass tries again.
            Some(self.webhook_alerted_state.clone())
        };
        self.start_walk(check.then);
    }
}
