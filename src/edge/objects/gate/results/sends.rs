//! A results step's sends: the one machine the job's effect uses too (`desk_turn.rs`: the
//! step's turn at the destination's desk, its sends and its report, in the order the plan
//! gives them).
//!
//! Guarantees: the results go through the job's effect's one send (`KeyAtDesk::send`: more
//! than one round trip's worth through the gate's result senders, else from the gate itself),
//! each signed under its one `webhook-id`.

use crate::destination::protocol::Sent;
use crate::destination::sending::outcome;
use crate::operation::effect::{build_request, effect_message_id};
use crate::operation::gate::alarm::{Attempt, AttemptTarget};
use crate::operation::{Claim, Operation};
use crate::results::body::{build_result_request, ResultHead};
use crate::results::item::ResultItem;
use crate::results::progress::Sending;
use crate::retry::PeerAnswer;

use crate::edge::objects::gate::desk_turn::KeyAtDesk;
use crate::edge::outbound::analytics;
use crate::edge::runtime::now_ms;

use super::Driver;

impl Driver<'_> {
    /// Sends the results, each no sooner than its time in `after_ms` on a paced route, through
    /// the one send the job's effect takes too ([`KeyAtDesk::send`]: the gate's result senders
    /// past one round trip's worth), and returns each one's outcome, in order, and how the
    /// sends went. A result whose sender answered nothing is [`Sending::Unanswered`]: retried
    /// under its same id, and no failure of the destination (neither its desk nor its counts
    /// hear of it).
    pub(super) async fn send_results(
        &self,
        op: &Operation,
        items: Vec<ResultItem>,
        after_ms: &[i64],
    ) -> (Vec<(ResultItem, Sending)>, Sent) {
        let secret = &self.config.effect_signing_secret;
        let now_secs = now_ms() / 1_000;
        let head = ResultHead::of(op);
        let requests: Vec<_> = items
            .iter()
            .map(|item| build_result_request(&head, item, secret, now_secs))
            .collect();
        let desk = KeyAtDesk::of(self.env, self.storage, self.config, op);
        let answered = desk.send(&requests, after_ms).await;
        let outcomes = items.into_iter().zip(answered.outcomes).collect();
        (outcomes, answered.sent)
    }

    /// The job's effect under `claim`: its one request, built from the record as claimed (`op`:
    /// it names the destination, a kind filled meanwhile included), through the same send, no
    /// sooner than its token on a paced route; returns how the attempt went (its analytics
    /// point written) and how the send went, as its desk hears it.
    pub(super) async fn send_effect(
        &self,
        op: &Operation,
        claim: Claim,
        after_ms: &[i64],
    ) -> (Attempt, Sent) {
        let config = self.config;
        let request = build_request(op, &config.effect_signing_secret, now_ms() / 1_000);
        let started_ms = now_ms();
        let desk = KeyAtDesk::of(self.env, self.storage, config, op);
        let mut answered = desk.send(&[request], after_ms).await;
        let outcome = match answered.outcomes.pop() {
            Some(Sending::Answered(outcome)) => outcome,
            // Never: one request sent from here has one answer.
            _ => outcome(&PeerAnswer::Timeout, config.effect_timeout_ms),
        };
        let target = AttemptTarget {
            destination: desk.label().to_string(),
            webhook_id: effect_message_id(op.key(), op.effect().generation()),
            http_status: answered.statuses.pop().flatten(),
        };
        let attempt = Attempt {
            claim,
            outcome,
            started_ms,
            asked_wait_ms: answered.sent.asked_wait_ms,
            finished_ms: answered.at_ms,
            target,
        };
        analytics::attempt(self.env, &attempt, op);
        (attempt, answered.sent)
    }
}
