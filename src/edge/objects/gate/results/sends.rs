//! A results step's sends and their turn at the destination's desk (invariant 8, as for the
//! job's effect; what goes when is [`crate::results::turn`]'s).
//!
//! Guarantees: a step asks the desk once for its results ([`DeskCommand::Ask`]) when it
//! must, and sends no more than the desk granted, each no sooner than its token on a paced
//! route; a release or a grant is spent by the step that uses it; the sends go at most
//! [`SENDS_IN_FLIGHT`] at a time (production's 6 connections per invocation; on a paced route
//! each at its token's time), and the desk hears of them in one report
//! ([`DeskCommand::Report`]) when it needs to (a health failure, an asked turn, a probe,
//! a paced route's slots). A desk's `Wait` makes the record wait for its release.

use std::time::Duration;

use futures_util::stream::{self, StreamExt};
use worker::{Delay, Result};

use crate::destination::protocol::{DeskCommand, DeskReply, Sent};
use crate::operation::effect::outcome;
use crate::operation::gate::alarm::{desk_turn, reports, DeskTurn};
use crate::operation::{DeskMark, Operation};
use crate::results::body::{build_result_request, ResultHead};
use crate::results::item::ResultItem;
use crate::results::marks as on_record;
use crate::results::progress::{Sending, SENDS_IN_FLIGHT};
use crate::results::turn::{goes_now, granted};

use crate::edge::objects::gate::{ask_desk, desk_due_ms, first_attempt_check, remembered_open};
use crate::edge::objects::result_sender::send_through_senders;
use crate::edge::outbound::fetch;
use crate::edge::runtime::now_ms;

use super::Driver;

/// What the destination's desk let a step send, and whether the step reports back.
#[derive(Debug, Clone)]
pub(super) struct Turn {
    pub(super) turn: DeskTurn,
    /// The desk was called before the sends (an ask, or a check): commands may have run.
    pub(super) awaited: bool,
    pub(super) paced: bool,
    /// Results that may go now.
    pub(super) n: u32,
    /// When each may leave, in ms from the grant, on a paced route (empty: all at once).
    pub(super) after_ms: Vec<i64>,
}

impl Turn {
    /// A step that sends nothing.
    pub(super) fn nothing() -> Turn {
        Turn {
            turn: DeskTurn::None,
            awaited: false,
            paced: false,
            n: 0,
            after_ms: Vec::new(),
        }
    }
}

impl Driver<'_> {
    /// The step's turn at its destination's desk for `ready` results (invariant 8, as for the
    /// job's effect, [`crate::results::turn`]): how many may go now, or `Err(paused)` when the
    /// desk queued the batch (`paused`: a pause holds it). A release or a grant is spent by
    /// the step that uses it.
    pub(super) async fn turn(
        &self,
        op: &Operation,
        ready: u32,
        retry: bool,
    ) -> Result<std::result::Result<Turn, bool>> {
        let settings = self.config.desk_settings(op.kind());
        let paced = settings.pace.limits();
        let mark = op.effect().desk();
        let retry = retry || matches!(mark, Some(DeskMark::Waiting { .. }));
        let turn = desk_turn(mark, paced, remembered_open(&settings.label), retry);
        // A pause holds a step that would go without asking too (one read-only check when
        // this isolate has not heard from the desk lately).
        let checked = match ready {
            0 => None,
            _ => first_attempt_check(self.env, self.storage, &settings, turn).await,
        };
        let turn = match checked {
            Some(true) => DeskTurn::Ask,
            _ => turn,
        };
        let (n, after_ms) = match (ready, goes_now(turn, paced, ready)) {
            (0, _) => (0, Vec::new()),
            (_, Some(n)) => (n, Vec::new()),
            (_, None) => {
                let ask = DeskCommand::Ask {
                    key: op.key().to_string(),
                    due_ms: desk_due_ms(op),
                    n: ready,
                    settings: settings.clone(),
                };
                match ask_desk(self.env, self.storage, &settings, &ask).await {
                    Some(DeskReply::Wait) => return Ok(Err(false)),
                    Some(DeskReply::Paused) => return Ok(Err(true)),
                    Some(DeskReply::Granted { n, after_ms }) => (granted(ready, Some(n)), after_ms),
                    // A desk that cannot be reached never strands results.
                    _ => (granted(ready, None), Vec::new()),
                }
            }
        };
        if mark.is_some() && n > 0 {
            self.mark(op.clone(), on_record::desk_spent).await?;
        }
        Ok(Ok(Turn {
            turn,
            awaited: turn == DeskTurn::Ask || checked.is_some(),
            paced,
            n,
            after_ms,
        }))
    }

    /// The desk queued the batch: the record waits for its release (or the fallback,
    /// [`crate::operation::gate::GateLimits::desk_fallback_ms`], should the desk be lost), and says whether a pause holds it.
    pub(super) async fn wait_on_destination(
        &self,
        op: Operation,
        paused: bool,
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
        let settings = self.config.desk_settings(op.kind());
        let report = DeskCommand::Report {
            key: op.key().to_string(),
            due_ms: at,
            sent: Sent::default(),
            settings: settings.clone(),
        };
        let reply = ask_desk(self.env, self.storage, &settings, &report).await;
        if let Some(paused) = reply.as_ref().and_then(DeskReply::waits) {
            return self.wait_on_destination(op, paused).await;
        }
        self.due_at(op, at).await
    }

    /// Sends the results (they are independent), each no sooner than its time in `after_ms`
    /// on a paced route, and returns each one's outcome, in order, and how the sends went.
    /// More than one round trip's worth go through the gate's result senders, each its own
    /// invocation with its own 6 connections ([`send_through_senders`]); else from here, at
    /// most [`SENDS_IN_FLIGHT`] at once. A result whose sender answered nothing is
    /// [`Sending::Unanswered`]: retried under its same id, and no failure of the destination
    /// (neither its desk nor its counts hear of it).
    pub(super) async fn send(
        &self,
        op: &Operation,
        items: Vec<ResultItem>,
        after_ms: &[i64],
    ) -> (Vec<(ResultItem, Sending)>, Sent) {
        let destination = self.config.destination_for(op.kind());
        let timeout = self.config.effect_timeout_ms;
        let secret = &self.config.effect_signing_secret;
        let now_secs = now_ms() / 1_000;
        let head = ResultHead::of(op);
        let requests: Vec<_> = items
            .iter()
            .map(|item| build_result_request(&head, item, secret, now_secs))
            .collect();
        self.storage
            .meter()
            .add(|u| u.outbound_fetches += items.len() as u64);
        let fanned = send_through_senders(
            self.env,
            op.key(),
            &destination,
            (timeout, self.config.results.sender_timeout_ms),
            &requests,
            after_ms,
        );
        let (answers, carried) = match fanned.await {
            Some(answers) => (answers, true),
            None => {
                let calls = requests.iter().enumerate().map(|(i, request)| {
                    let destination = &destination;
                    let wait = after_ms.get(i).map_or(0, |ms| (*ms).max(0) as u64);
                    async move {
                        if wait > 0 {
                            Delay::from(Duration::from_millis(wait)).await;
                        }
                        Ok(fetch::deliver(self.env, destination, request, timeout).await)
                    }
                });
                let answers = stream::iter(calls).buffered(SENDS_IN_FLIGHT);
                (answers.collect().await, false)
            }
        };
        // A sender call that failed is not the destination's answer: the desk hears only of
        // the answers the destination gave.
        let sent = Sent::of(answers.iter().flatten(), now_ms());
        let outcomes = answers.into_iter().map(|answer| match answer {
            Ok(answer) if carried => Sending::Carried(outcome(&answer, timeout)),
            Ok(answer) => Sending::Answered(outcome(&answer, timeout)),
            Err(why) => Sending::Unanswered(why),
        });
        (items.into_iter().zip(outcomes).collect(), sent)
    }

    /// After the sends: the desk hears what it needs to (as an effect's attempt reports: a
    /// health failure, an asked or released turn, a paced route's slots), and a destination
    /// that asked for a wait (`Retry-After`) is not sent more before it.
    pub(super) async fn after_sends(
        &self,
        op: Operation,
        turn: Turn,
        sent: Sent,
    ) -> Result<Operation> {
        if reports(turn.turn, turn.paced, sent.failures > 0) {
            let settings = self.config.desk_settings(op.kind());
            let report = DeskCommand::Report {
                key: op.key().to_string(),
                due_ms: desk_due_ms(&op),
                sent: sent.clone(),
                settings: settings.clone(),
            };
            let reply = ask_desk(self.env, self.storage, &settings, &report).await;
            if let Some(paused) = reply.as_ref().and_then(DeskReply::waits) {
                return self.wait_on_destination(op, paused).await;
            }
        }
        match sent.asked_wait_ms {
            Some(wait) => {
                let at = now_ms() + wait.min(self.config.retry_max_secs * 1_000);
                self.due_at(op, at).await
            }
            None => Ok(self.storage.load()?.unwrap_or(op)),
        }
    }
}
