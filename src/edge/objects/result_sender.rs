//! The ResultSender Durable Object: sends a group of a batch's results for the batch's gate,
//! from an invocation of its own, so a step is not bound to the gate's 6 connections
//! ([`crate::results::fanout`] decides the groups and what travels).
//!
//! Guarantees: a sender stores nothing and decides nothing: it sends each request it is given
//! as the gate signed it (same headers, same body, same `webhook-id`), as the gate sends its
//! own ([`fetch::deliver`]): at most [`crate::results::progress::SENDS_IN_FLIGHT`] at a time (production's 6 connections per invocation, which workerd does
//! not enforce locally), each no sooner than its `after_ms` from the sender's start, and
//! answers each send's answer in order. The gate calls at most [`SENDERS`] senders at once
//! (each call one of its own 6), one object per slot of a gate (`<key>#<slot>`), and waits for
//! each no longer than [`call_bound_ms`] (its sends' own deadlines and a margin). A call that
//! fails or passes its bound answers nothing for its group ([`group_answers`]): the gate
//! keeps those results to send again under their same ids, and neither the desk nor the
//! destination's counts hear of them; the other groups' answers are committed.

use futures_util::stream::{self, StreamExt};
use worker::{durable_object, DurableObject, Env, Request, Response, Result, State};

use crate::config::Destination;
use crate::operation::effect::EffectRequest;
use crate::results::fanout::{call_bound_ms, group_answers, groups, SendOrder, WireSend, SENDERS};
use crate::retry::PeerAnswer;
use crate::telemetry::usage::Invocation;

use crate::edge::error::bad_command;
use crate::edge::objects::call::{post_json, stub_for};
use crate::edge::objects::usage_meter::Meter;
use crate::edge::outbound::fetch;
use crate::edge::runtime::{load_config, now_ms, within};

/// The senders' binding.
pub const SENDER_BINDING: &str = "RESULT_SENDER";

/// Sends a group of results for a gate.
#[durable_object]
pub struct ResultSender {
    state: State,
    env: Env,
    meter: Meter,
}

impl DurableObject for ResultSender {
    fn new(state: State, env: Env) -> Self {
        let meter = Meter::default();
        meter.begin(load_config(&env).is_ok_and(|c| c.usage_log));
        Self { state, env, meter }
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        let started = now_ms();
        let order: SendOrder = match req.json().await {
            Ok(order) => order,
            Err(e) => return bad_command("send order", e),
        };
        // A send whose request cannot be rebuilt answers alone; the others still go.
        let (mut requests, mut after_ms, mut unsent) = (Vec::new(), Vec::new(), Vec::new());
        for send in order.sends {
            let after = send.after_ms as i64;
            match send.request() {
                Ok(request) => {
                    requests.push(request);
                    after_ms.push(after);
                    unsent.push(None);
                }
                Err(why) => unsent.push(Some(PeerAnswer::Network(why))),
            }
        }
        let group = (&requests[..], &after_ms[..]);
        let mut sent = fetch::deliver(&self.env, &order.to, group, order.timeout_ms)
            .await
            .into_iter();
        let answers: Vec<PeerAnswer> = unsent
            .into_iter()
            .map(|a| a.or_else(|| sent.next()).unwrap_or(PeerAnswer::Timeout))
            .collect();
        let sql = self.state.storage().sql();
        self.meter
            .end("result_sender", Invocation::Fetch, started, &sql);
        Response::from_json(&answers)
    }
}

/// Sends `requests` (in order, each at its `after_ms`) through the senders of the gate of
/// `key`, at most [`SENDERS`] calls at once, each waited for at most [`call_bound_ms`] (`cap`:
/// `RESULTS_SENDER_TIMEOUT_MS`), when there are more than one round trip's worth; `None` when
/// the gate sends them itself. Each is the destination's answer, or `Err` when its sender
/// answered nothing usable (the destination was not judged).
pub async fn send_through_senders(
    env: &Env,
    key: &str,
    destination: &Destination,
    (timeout_ms, cap): (i64, Option<i64>),
    requests: &[EffectRequest],
    after_ms: &[i64],
) -> Option<Vec<std::result::Result<PeerAnswer, String>>> {
    let split = groups(requests.len());
    if split.is_empty() {
        return None;
    }
    let calls = split.into_iter().enumerate().map(|(slot, range)| {
        let wait = |i: usize| after_ms.get(i).map_or(0, |ms| (*ms).max(0) as u64);
        let order = SendOrder {
            to: destination.clone(),
            timeout_ms,
            sends: range
                .clone()
                .map(|i| WireSend::of(&requests[i], wait(i)))
                .collect(),
        };
        let n = range.len();
        let last_after = order.sends.iter().map(|s| s.after_ms).max().unwrap_or(0);
        let bound = call_bound_ms(n, timeout_ms, last_after, cap);
        async move {
            let call = async {
                let stub = stub_for(env, SENDER_BINDING, &format!("{key}#{slot}"))?;
                post_json::<_, Vec<PeerAnswer>>(&stub, &order).await
            };
            let reply = match within(bound, call).await {
                Some(reply) => reply.map_err(|refusal| refusal.to_string()),
                // The call is left behind, not cancelled: its sends may still leave, which
                // the ids make harmless.
                None => Err(format!("no answer within {bound} ms")),
            };
            group_answers(reply, n)
        }
    });
    let answers: Vec<Vec<_>> = stream::iter(calls).buffered(SENDERS).collect().await;
    Some(answers.into_iter().flatten().collect())
}
