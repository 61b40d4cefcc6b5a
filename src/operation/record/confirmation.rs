//! A dynamic-webhook delivery waiting for Gemini's status API to confirm it.
//!
//! Guarantees: an unproven body decides nothing: only what the status API says is applied;
//! replays of a waiting nudge keep its schedule (no extra status calls); at most
//! [`MAX_CONFIRM_ATTEMPTS`] questions are asked, then the cron's polling takes over; two
//! questions about one operation are at least `CONFIRM_INTERVAL_SECONDS` apart, whoever
//! nudges, and a nudge inside that interval with no confirmation waiting changes nothing.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::operation::details::{
    normalize_details, SIGNED_USER_METADATA, UNVERIFIED_USER_METADATA, USER_METADATA,
};
use crate::operation::lifecycle::Verdict;
use crate::operation::record::{OpEvent, Operation};

/// A dynamic-webhook delivery waiting for Gemini's status API to confirm it. Its body is
/// unproven as ours (a token vouches only that Google sent something, a `v1a` signature that
/// Google sent this body, for whichever project), so it decides nothing: the gate asks the
/// status API and applies what that says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Confirmation {
    pub requested_at_ms: i64,
    /// Not before this time (Unix ms) is the status API asked (again).
    pub due_ms: i64,
    /// Status-API questions asked so far for this confirmation.
    pub attempts: u32,
    /// `unverified_user_metadata` (the token's claim, else the body's), or a `v1a`-signed body's
    /// [`SIGNED_USER_METADATA`], carried to the side effect with what the status API says.
    #[serde(default)]
    pub metadata: Map<String, Value>,
    /// The delivery's id (a hash of its token), for the history.
    #[serde(default)]
    pub delivery_id: Option<String>,
}

/// Status-API questions a confirmation asks at most, whether the answers say "not finished"
/// or cannot be used; then it is left to the cron (which polls every operation that is not
/// terminal) and its alerts.
pub const MAX_CONFIRM_ATTEMPTS: u32 = 5;

impl Operation {
    /// Records a dynamic-webhook delivery that names this operation: the status API is to be
    /// asked now. Returns false when there is nothing to confirm (already terminal: terminal
    /// absorbs, so no answer could change it; or forgotten). A confirmation already waiting
    /// keeps its schedule (a flood of replays costs no extra status calls) and gains missing
    /// metadata; when it gains none, nothing changed and the version stays. With none
    /// waiting, a nudge within `interval_ms` of the last question changes nothing either
    /// (true, version kept): a held operation that Gemini answers 404 or "still running" is
    /// asked at most once an interval, however many nudges name it.
    pub fn request_confirmation(
        &mut self,
        now_ms: i64,
        metadata: Map<String, Value>,
        delivery_id: Option<String>,
        interval_ms: i64,
    ) -> bool {
        if self.status.is_terminal() || self.refuse_untracked().is_err() {
            return false;
        }
        // Metadata enters the record here: bounded, so the record always loads again.
        let metadata = crate::operation::details::bound_members(metadata);
        let recent = self
            .confirm_asked_ms
            .is_some_and(|asked| now_ms < asked.saturating_add(interval_ms));
        match &mut self.confirmation {
            Some(waiting) => {
                let before = waiting.metadata.len();
                for (k, v) in metadata {
                    waiting.metadata.entry(k).or_insert(v);
                }
                if waiting.metadata.len() == before {
                    return true;
                }
            }
            None if recent => return true,
            None => {
                self.confirmation = Some(Confirmation {
                    requested_at_ms: now_ms,
                    due_ms: now_ms,
                    attempts: 0,
                    metadata,
                    delivery_id,
                });
            }
        }
        self.changed();
        true
    }

    /// A confirmation asked the status API at `now_ms`: the next question waits the interval.
    pub fn confirmation_asked(&mut self, now_ms: i64) {
        self.confirm_asked_ms = Some(now_ms);
    }

    /// True when a confirmation is waiting and due.
    pub fn confirmation_due(&self, now_ms: i64) -> bool {
        matches!(&self.confirmation, Some(c) if c.due_ms <= now_ms)
    }

    /// Applies what the status API said in answer to a confirmation, as an event from the
    /// webhook path carrying the nudge's metadata. The confirmation ends once the operation
    /// is terminal or after `MAX_CONFIRM_ATTEMPTS`; otherwise it is asked again in
    /// `retry_in_ms` (Gemini may answer a moment behind its own webhook).
    pub fn confirm_with(&mut self, mut event: OpEvent, now_ms: i64, retry_in_ms: i64) -> Verdict {
        let Some(mut confirmation) = self.confirmation.take() else {
            return self.apply(&event, now_ms);
        };
        for (k, v) in &confirmation.metadata {
            // A token's metadata is never verified: one stored by an earlier version as
            // `user_metadata` still travels as unverified. A `v1a`-signed body's is the job's
            // own now that the status API answered for the operation with our key.
            let k = match k.as_str() {
                USER_METADATA => UNVERIFIED_USER_METADATA,
                SIGNED_USER_METADATA => USER_METADATA,
                other => other,
            };
            event.details.entry(k.to_string()).or_insert(v.clone());
        }
        // The merged metadata takes the details' one shape (an earlier version's key included).
        event.details = normalize_details(&event.details);
        event.delivery_id = event.delivery_id.or(confirmation.delivery_id.clone());
        let verdict = self.apply(&event, now_ms);
        confirmation.attempts += 1;
        if !self.status.is_terminal() && confirmation.attempts < MAX_CONFIRM_ATTEMPTS {
            confirmation.due_ms = now_ms + retry_in_ms;
            self.confirmation = Some(confirmation);
        }
        self.changed();
        verdict
    }

    /// The status API could not answer, or not usably (no key, 429, 5xx, timeout, an
    /// unusable body): ask again later, at most `MAX_CONFIRM_ATTEMPTS` questions in all,
    /// then leave the operation to the cron (which polls it) and its alerts.
    pub fn confirmation_failed(&mut self, now_ms: i64, retry_in_ms: i64) {
        if let Some(c) = &mut self.confirmation {
            c.attempts += 1;
            c.due_ms = now_ms + retry_in_ms;
            if c.attempts >= MAX_CONFIRM_ATTEMPTS {
                self.confirmation = None;
            }
            self.changed();
        }
    }

    /// No status API to ask (`GEMINI_API_KEY` is not set): the confirmation waits, backing
    /// off, until it is; no question was asked, so this is not one of its tries.
    pub fn confirmation_waits(&mut self, now_ms: i64, retry_in_ms: i64) {
        if let Some(c) = &mut self.confirmation {
            c.due_ms = now_ms + retry_in_ms;
            self.changed();
        }
    }

    /// The status budget said wait: the confirmation is due again at `due_ms`. Nothing the
    /// ledger shows changed, so the version stays (no ledger projection for a wait).
    pub fn confirmation_deferred(&mut self, due_ms: i64) {
        if let Some(c) = &mut self.confirmation {
            c.due_ms = due_ms;
        }
    }

    /// The status API does not know the operation (404): nothing to apply, nothing to ask.
    pub fn confirmation_gone(&mut self) {
        if self.confirmation.take().is_some() {
            self.changed();
        }
    }
}
