//! A key's turn at its destination's desk and the sends it lets go, one machine for the job's
//! effect and a batch's results (the job's effect is a batch of one; what goes when is
//! [`crate::operation::gate::desk_turn`]'s), and their one send ([`KeyAtDesk::send`]: a
//! job's one request, a step's results), whose answers
//! [`crate::destination::sending::answered`] reads for both. What a wait, a claim or a commit
//! stores stays each caller's own.
//!
//! Guarantees (docs/DESIGN.md, invariant 8): a turn asks the desk at most once
//! ([`DeskCommand::Ask`], for all its ready sends) and only when it must; when this isolate
//! has not heard within [`crate::destination::protocol::CLEAR_MEMORY_MS`] that the
//! destination is neither open nor paused, a turn that would go without asking checks its
//! desk once, read only ([`DeskCommand::Check`]), so a pause holds first attempts too. The
//! sends go at most [`crate::results::progress::SENDS_IN_FLIGHT`] at a time (production's 6 connections per
//! invocation), more than that through the gate's result senders (a job's one request never),
//! each no sooner than its token on a paced route, and the desk hears of them
//! in one report ([`DeskCommand::Report`]) when it needs to. A desk that cannot be reached
//! lets the sends go. This isolate remembers the destinations a desk said are open (memory
//! only; what and for how long is [`DeskReply::remembered`]'s), so a first attempt to one asks
//! instead of going: a stale entry costs one desk call; an isolate without one lets a first
//! attempt go, and its report's answer makes it wait.

use std::{cell::RefCell, collections::HashMap};

use worker::Env;

use crate::config::Config;
use crate::destination::protocol::{DeskCommand, DeskReply, DeskSettings, Remember, Sent};
use crate::destination::sending::{answered, Answered};
use crate::operation::effect::EffectRequest;
use crate::operation::gate::desk_turn::{desk_turn, goes_now, granted, reports, DeskTurn};
use crate::operation::{DeskMark, Operation};
use crate::results::progress::SENDS_IN_FLIGHT;

use crate::edge::objects::call::call_desk;
use crate::edge::objects::gate::storage::GateStorage;
use crate::edge::objects::result_sender::send_through_senders;
use crate::edge::outbound::fetch;
use crate::edge::runtime::now_ms;

thread_local! {
    /// What a desk last said of each destination (by label): open (or paused), or neither,
    /// and until when.
    static HEARD: RefCell<HashMap<String, Remember>> = RefCell::new(HashMap::new());
}

/// What the desk let a key's sends do, and whether they report back (the default: a turn
/// that sends nothing).
#[derive(Debug, Clone, Default)]
pub(super) struct Turn {
    pub(super) turn: DeskTurn,
    /// The desk was called before the sends (an ask, or a check): commands may have run.
    pub(super) awaited: bool,
    /// Sends that may go now.
    pub(super) n: u32,
    /// When each may leave, in ms from the grant, on a paced route (empty: all at once).
    pub(super) after_ms: Vec<i64>,
}

/// One key at its destination's desk: what its turn performs with.
pub(super) struct KeyAtDesk<'a> {
    env: &'a Env,
    storage: &'a GateStorage,
    config: &'a Config,
    settings: DeskSettings,
    key: String,
    kind: Option<String>,
    /// When the operation's effect (or its results) became owed: its place in the desk's
    /// queue, soonest first.
    due_ms: i64,
}

impl<'a> KeyAtDesk<'a> {
    /// The desk of `op`'s destination, for `op`'s key.
    pub(super) fn of(
        env: &'a Env,
        storage: &'a GateStorage,
        config: &'a Config,
        op: &Operation,
    ) -> Self {
        KeyAtDesk {
            env,
            storage,
            config,
            settings: config.desk_settings(op.kind()),
            key: op.key().to_string(),
            kind: op.kind().map(str::to_string),
            due_ms: op.settled_at_ms().unwrap_or(op.submitted_at_ms()),
        }
    }

    /// The turn of `ready` sends of a key the record marks `mark` (a `retry` asks first): how
    /// many may go now, or `Err(paused)` when the desk queued the key (`paused`: a pause holds
    /// it).
    pub(super) async fn turn(
        &self,
        mark: Option<DeskMark>,
        ready: u32,
        retry: bool,
    ) -> Result<Turn, bool> {
        let paced = self.settings.pace.limits();
        let open = matches!(self.heard(), Remember::OpenUntil(u) if u > now_ms());
        let turn = desk_turn(mark, paced, open, retry);
        let checked = self.check(turn, ready).await;
        let turn = match checked {
            Some(true) => DeskTurn::Ask,
            _ => turn,
        };
        let (n, after_ms) = match goes_now(turn, paced, ready) {
            Some(n) => (n, Vec::new()),
            None => {
                let ask = DeskCommand::Ask {
                    key: self.key.clone(),
                    due_ms: self.due_ms,
                    n: ready,
                    settings: self.settings.clone(),
                };
                match self.call(&ask).await {
                    Some(DeskReply::Wait) => return Err(false),
                    Some(DeskReply::Paused) => return Err(true),
                    Some(DeskReply::Granted { n, after_ms }) => (granted(ready, Some(n)), after_ms),
                    _ => (granted(ready, None), Vec::new()),
                }
            }
        };
        Ok(Turn {
            turn,
            awaited: turn == DeskTurn::Ask || checked.is_some(),
            n,
            after_ms,
        })
    }

    /// Whether `ready` sends that would go without asking (`turn`) must ask first: one
    /// read-only check of the desk when this isolate has not heard lately that the destination
    /// is clear. `None` when no check was made (nothing awaited).
    async fn check(&self, turn: DeskTurn, ready: u32) -> Option<bool> {
        let clear = matches!(self.heard(), Remember::ClearUntil(u) if u > now_ms());
        if turn != DeskTurn::None || clear || ready == 0 {
            return None;
        }
        let check = DeskCommand::Check {
            settings: self.settings.clone(),
        };
        let reply = self.call(&check).await;
        Some(matches!(reply, Some(DeskReply::Checked { ask: true })))
    }

    /// Sends `requests` (a job's effect: its one; a step's results), each no sooner than its
    /// time in `after_ms` on a paced route, and reads their answers ([`answered`]). More than
    /// one round trip's worth go through the gate's result senders, each its own invocation
    /// with its own 6 connections ([`send_through_senders`]); else from here
    /// ([`fetch::deliver`]), as a job's one request always does.
    pub(super) async fn send(&self, requests: &[EffectRequest], after_ms: &[i64]) -> Answered {
        let destination = self.config.destination_for(self.kind.as_deref());
        let timeout = self.config.effect_timeout_ms;
        let sends = requests.len() as u64;
        self.storage.meter().add(|u| u.outbound_fetches += sends);
        let (key, timeouts) = (&self.key, (timeout, self.config.results.sender_timeout_ms));
        // No more than one round trip's worth (a job's one request) go from here, as
        // `send_through_senders` would say (`results::fanout::groups`).
        let fanned = match requests.len() > SENDS_IN_FLIGHT {
            true => {
                send_through_senders(self.env, key, &destination, timeouts, requests, after_ms)
                    .await
            }
            false => None,
        };
        let (answers, carried) = match fanned {
            Some(answers) => (answers, true),
            None => {
                let group = (requests, after_ms);
                let answers = fetch::deliver(self.env, &destination, group, timeout).await;
                (answers.into_iter().map(Ok).collect(), false)
            }
        };
        answered(answers, carried, timeout, now_ms())
    }

    /// After the sends: the desk hears how they went when it needs to ([`reports`]);
    /// `Some(paused)` when it queued the key.
    pub(super) async fn report(&self, turn: &Turn, sent: &Sent) -> Option<bool> {
        match reports(turn.turn, self.settings.pace.limits(), sent.failures > 0) {
            true => self.tell(self.due_ms, sent.clone()).await,
            false => None,
        }
    }

    /// Tells the desk how sends went (`due_ms`: the key's place, should it queue it again);
    /// `Some(paused)` when it queued the key.
    pub(super) async fn tell(&self, due_ms: i64, sent: Sent) -> Option<bool> {
        let report = DeskCommand::Report {
            key: self.key.clone(),
            due_ms,
            sent,
            settings: self.settings.clone(),
        };
        self.call(&report).await.as_ref().and_then(DeskReply::waits)
    }

    /// One call to the desk (`None` when it could not be reached); its reply teaches this
    /// isolate's memory of open destinations ([`DeskReply::remembered`]).
    async fn call(&self, command: &DeskCommand) -> Option<DeskReply> {
        self.storage.meter().add(|u| u.object_calls += 1);
        let reply = call_desk(self.env, &self.settings, command).await.ok()?;
        let heard = reply.remembered(now_ms());
        if heard != Remember::Keep {
            HEARD.with_borrow_mut(|m| m.insert(self.settings.label.clone(), heard));
        }
        Some(reply)
    }

    /// The destination's name, as its desk and the history know it.
    pub(super) fn label(&self) -> &str {
        &self.settings.label
    }

    /// What a desk last said of this destination (until when it holds is the caller's test).
    fn heard(&self) -> Remember {
        let heard = HEARD.with_borrow(|m| m.get(&self.settings.label).copied());
        heard.unwrap_or(Remember::Keep)
    }
}
