//! The ResultSender Durable Object: sends a group of a batch's results for the batch's gate,
//! from an invocation of its own, so a step is not bound to the gate's 6 connections
//! ([`crate::results::fanout`] decides the groups and what travels).
//!
//! Guarantees: a sender stores nothing and decides nothing: it sends each request it is given
//! as the gate signed it (same headers, same body, same `webhook-id`), at most
//! [`SENDS_IN_FLIGHT`] at a time (production's 6 connections per invocation, which workerd does
//! not enforce locally), each no sooner than its `after_ms`, and answers each send's answer in
//! order. The gate calls at most [`SENDERS`] senders at once (each call one of its own 6), one
//! object per slot of a gate (`<key>#<slot>`), so an object has one call in flight. A call that
//! fails answers each of its results as a network failure: the gate keeps them to send again
//! under their same ids, and its desk is not told the destination failed.

use std::time::Duration;

use futures_util::stream::{self, StreamExt};
use worker::{durable_object, Delay, DurableObject, Env, Request, Response, Result, State};

use crate::config::Destination;
use crate::operation::effect::EffectRequest;
use crate::refusal::Refusal;
use crate::results::fanout::{groups, sender_failed, SendOrder, WireSend, SENDERS};
use crate::results::progress::SENDS_IN_FLIGHT;
use crate::retry::PeerAnswer;
use crate::telemetry::usage::Invocation;

use crate::edge::objects::call::{post_json, stub_for};
use crate::edge::objects::usage_meter::Meter;
use crate::edge::outbound::fetch;
use crate::edge::runtime::load_config;

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
        let started = self.meter.start();
        let order: SendOrder = match req.json().await {
            Ok(order) => order,
            Err(e) => return Refusal::BadRequest(format!("bad send order: {e}")).into_response(),
        };
        let timeout = order.timeout_ms;
        let calls = order.sends.into_iter().map(|send| {
            let destination = &order.to;
            async move {
                let wait = send.after_ms;
                let request = match send.request() {
                    Ok(request) => request,
                    Err(why) => return PeerAnswer::Network(why),
                };
                if wait > 0 {
                    Delay::from(Duration::from_millis(wait)).await;
                }
                fetch::deliver(&self.env, destination, &request, timeout).await
            }
        });
        let answers: Vec<PeerAnswer> = stream::iter(calls)
            .buffered(SENDS_IN_FLIGHT)
            .collect()
            .await;
        self.meter.end(
            "result_sender",
            Invocation::Fetch,
            started,
            &self.state.storage().sql(),
        );
        Response::from_json(&answers)
    }
}

/// Sends `requests` (in order, each at its `after_ms`) through the senders of the gate of
/// `key`, at most [`SENDERS`] calls at once, when there are more than one round trip's worth;
/// `None` when the gate sends them itself. Each answer comes with whether a sender gave it
/// (`false`: its sender failed, the destination was not judged).
pub async fn send_through_senders(
    env: &Env,
    key: &str,
    destination: &Destination,
    timeout_ms: i64,
    requests: &[EffectRequest],
    after_ms: &[i64],
) -> Option<Vec<(PeerAnswer, bool)>> {
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
        async move {
            let stub = stub_for(env, SENDER_BINDING, &format!("{key}#{slot}"));
            let reply = match stub {
                Ok(stub) => post_json::<_, Vec<PeerAnswer>>(&stub, &order).await,
                Err(refusal) => Err(refusal),
            };
            match reply {
                Ok(answers) if answers.len() == n => {
                    answers.into_iter().map(|a| (a, true)).collect()
                }
                Ok(answers) => failed(n, &format!("{} answers for {n}", answers.len())),
                Err(refusal) => failed(n, &refusal.to_string()),
            }
        }
    });
    let answers: Vec<Vec<(PeerAnswer, bool)>> =
        stream::iter(calls).buffered(SENDERS).collect().await;
    Some(answers.into_iter().flatten().collect())
}

fn failed(n: usize, why: &str) -> Vec<(PeerAnswer, bool)> {
    sender_failed(n, why)
        .into_iter()
        .map(|a| (a, false))
        .collect()
}
