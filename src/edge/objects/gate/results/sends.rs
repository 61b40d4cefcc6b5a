//! A results step's sends: the one machine the job's effect uses too (`desk_turn.rs`: the
//! step's turn at the destination's desk, its sends and its report, in the order the plan
//! gives them).
//!
//! Guarantees: the results go through the job's effect's one send (`KeyAtDesk::send`: more
//! than one round trip's worth through the gate's result senders, else from the gate itself),
//! each signed under its one `webhook-id`.

use crate::destination::protocol::Sent;
use crate::operation::Operation;
use crate::results::body::{build_result_request, ResultHead};
use crate::results::item::ResultItem;
use crate::results::progress::Sending;

use crate::edge::objects::gate::desk_turn::KeyAtDesk;
use crate::edge::runtime::now_ms;

use super::Driver;

impl Driver<'_> {
    /// Sends the results, each no sooner than its time in `after_ms` on a paced route, through
    /// the one send the job's effect takes too ([`KeyAtDesk::send`]: the gate's result senders
    /// past one round trip's worth), and returns each one's outcome, in order, and how the
    /// sends went. A result whose sender answered nothing is [`Sending::Unanswered`]: retried
    /// under its same id, and no failure of the destination (neither its desk nor its counts
    /// hear of it).
    pub(super) async fn send(
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
}
