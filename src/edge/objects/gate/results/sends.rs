//! A results step's sends and their turn at the destination's desk: the one machine the job's
//! effect uses too (`desk_turn.rs`), with what the results store around it.
//!
//! Guarantees: a release or a grant is spent by the step that uses it; the results go through
//! the job's effect's one send (`KeyAtDesk::send`: more than one round trip's worth through
//! the gate's result senders, else from the gate itself); a desk's `Wait` makes the record
//! wait for its release, committed after the sends' commit (which holds the results for a
//! destination's `Retry-After`), so the desk's wait wins.

use worker::Result;

use crate::destination::protocol::Sent;
use crate::operation::Operation;
use crate::results::body::{build_result_request, ResultHead};
use crate::results::item::ResultItem;
use crate::results::marks as on_record;
use crate::results::progress::{ProgressWrite, Sending};

use crate::edge::objects::gate::desk_turn::{KeyAtDesk, Turn};
use crate::edge::runtime::now_ms;

use super::Driver;

impl Driver<'_> {
    /// The step's turn at its destination's desk for `ready` results (a `retry` asks first):
    /// how many may go now, or `Err(paused)` when the desk queued the batch. A release or a
    /// grant is spent by the step that uses it.
    pub(super) async fn turn(
        &self,
        op: &Operation,
        ready: u32,
        retry: bool,
    ) -> Result<std::result::Result<Turn, bool>> {
        let mark = op.effect().desk();
        let desk = KeyAtDesk::of(self.env, self.storage, self.config, op);
        let turn = desk.turn(mark, ready, retry).await;
        if mark.is_some() && turn.as_ref().is_ok_and(|turn| turn.n > 0) {
            self.mark(op.clone(), on_record::desk_spent).await?;
        }
        Ok(turn)
    }

    /// The desk queued the batch: the record waits for its release (or the fallback,
    /// [`crate::operation::gate::GateLimits::desk_fallback_ms`], should the desk be lost), and says whether a pause holds it
    /// (`held`: the progress whose failing clocks the pause stopped, stored with it).
    pub(super) async fn wait_on_destination(
        &self,
        op: Operation,
        paused: (bool, Option<ProgressWrite>),
    ) -> Result<Operation> {
        let fallback = self.gate.desk_fallback_ms;
        let decide = |op| on_record::wait_on_destination(op, paused, fallback, now_ms());
        self.mark(op, decide).await
    }

    /// A release of the desk found nothing to send (the file is not there yet): it is spent,
    /// and the desk hears at once (`sent: 0`: its slot freed, a probe missed) and, while the
    /// destination is open, queues the batch again, due when the step is (`at`).
    pub(super) async fn release_unused(&self, op: Operation, at: i64) -> Result<Operation> {
        let op = self.mark(op, on_record::desk_spent).await?;
        let desk = KeyAtDesk::of(self.env, self.storage, self.config, &op);
        if let Some(paused) = desk.tell(at, Sent::default()).await {
            return self.wait_on_destination(op, (paused, None)).await;
        }
        self.due_at(op, at).await
    }

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

    /// After the sends and their commit (which held the results for a destination's
    /// `Retry-After`): the desk hears what it needs to (as the job's effect reports), and a
    /// desk that queues the batch makes the record wait for its release, committed after.
    pub(super) async fn after_sends(
        &self,
        op: Operation,
        turn: Turn,
        sent: Sent,
    ) -> Result<Operation> {
        let desk = KeyAtDesk::of(self.env, self.storage, self.config, &op);
        if let Some(paused) = desk.report(&turn, &sent).await {
            return self.wait_on_destination(op, (paused, None)).await;
        }
        Ok(self.storage.load()?.unwrap_or(op))
    }
}
