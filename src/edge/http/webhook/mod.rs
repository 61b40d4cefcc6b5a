//! `POST /webhooks/gemini`: carries out what [`crate::inbound::classify`] decides about a
//! delivery, hands it to the gate, answers.
//!
//! Guarantees (docs/DESIGN.md, invariants 4, 5 and 7): the classification's order holds
//! because this route asks it at each step before spending anything: the headers are
//! screened before a byte of the body is read; a token's RS256 signature is checked (with the
//! key set) before its claims; the body is read as a stream and refused with 413 as soon as it
//! passes `MAX_BODY_BYTES` (at most the cap plus one chunk is held); only then is the body
//! classified. Every refusal is counted, logged (once per reason per flush window) as
//! `rejected`, and answered as its [`Refusal`] says; nothing is written for it.
//!
//! A verified HMAC body that cannot be used is kept in KV as a dead letter, and if it cannot
//! be kept the answer is 503 so Gemini retries. A usable delivery costs one gate round trip
//! and no KV read, and is answered 2xx only after the gate stored what it means; a duplicate
//! the isolate's [`TerminalMemory`] can answer costs no round trip. A nudge (a token-signed
//! body) goes through [`nudge`].

mod body;
mod nudge;

use std::cell::RefCell;

use worker::{web_sys, Env, Response};

use crate::config::Config;
use crate::inbound::answer::{Answer, TerminalMemory};
use crate::inbound::classify::{
    classify, screen, vouch, Headers, Outcome, Oversize, Policy, Proof, Refusal, Reply, Screened,
};
use crate::inbound::route_log::{Handled, RouteLog};
use crate::operation::gate_protocol::{GateCommand, GateReply};
use crate::operation::key::OperationKey;
use crate::operation::OpEvent;
use crate::telemetry::counters;

use crate::edge::http::dynamic_webhook;
use crate::edge::objects::stats_shard::{count_at_edge, count_rejected};
use crate::edge::{call_gate, log, now_ms, ok_json, EdgeError};

thread_local! {
    /// The terminal states this isolate has seen gates answer with (see [`TerminalMemory`]).
    static TERMINAL: RefCell<TerminalMemory> = RefCell::new(TerminalMemory::default());
}

/// The classification's view of the configuration.
fn policy(config: &Config) -> Policy<'_> {
    Policy {
        max_body_bytes: config.max_body_bytes,
        tolerance_secs: config.tolerance_secs,
        dynamic_webhooks: config.dynamic_webhooks,
        secrets: &config.webhook_secrets,
        audience: config.gemini_jwt_audience.as_deref(),
    }
}

/// Writes a line of the route.
fn log_line(line: RouteLog) {
    log(line.to_value());
}

/// Counts a refusal, logs it (once per reason per flush window), and answers it.
fn refuse(refusal: Refusal) -> Result<Response, EdgeError> {
    if count_rejected(refusal.reason()) {
        log_line(refusal.log_line());
    }
    reply(refusal.reply())
}

/// The HTTP face of a [`Reply`].
fn reply(reply: Reply) -> Result<Response, EdgeError> {
    match reply {
        Reply::Unauthorized => Err(EdgeError::Unauthorized),
        Reply::TooLarge => Err(EdgeError::TooLarge),
        Reply::BadRequest(text) => Err(EdgeError::BadRequest(text)),
        Reply::RetryAfter(secs) => Err(EdgeError::RetryLater(secs)),
        Reply::Answered(answer) => answered(&answer),
    }
}

/// A 200 with `answer` as its body.
fn answered(answer: &Answer) -> Result<Response, EdgeError> {
    let body = serde_json::to_value(answer).map_err(|e| EdgeError::Unavailable(e.to_string()))?;
    ok_json(&body)
}

pub async fn receive(
    req: web_sys::Request,
    env: &Env,
    config: &Config,
) -> Result<Response, EdgeError> {
    let raw = req.headers();
    let header = |name: &str| raw.get(name).ok().flatten();
    let (length, id, timestamp, signature) = (
        header("content-length"),
        header("webhook-id"),
        header("webhook-timestamp"),
        header("webhook-signature"),
    );
    let headers = Headers {
        content_length: length.as_deref(),
        id: id.as_deref(),
        timestamp: timestamp.as_deref(),
        signature: signature.as_deref(),
    };
    let policy = policy(config);
    let now = now_ms();
    // Everything the headers alone can refuse is refused before the body is read.
    let proof = match screen(&headers, now, &policy) {
        Err(refusal) => return refuse(refusal),
        Ok(Screened::Hmac(checked)) => Proof::Hmac(checked),
        Ok(Screened::Jwt { token, token_hash }) => {
            let vouched = match dynamic_webhook::verify(env, config, &token, now).await {
                Ok(()) => vouch(token, token_hash, now, &policy),
                Err(refusal) => Err(refusal),
            };
            match vouched {
                Ok(proof) => proof,
                Err(refusal) => return refuse(refusal),
            }
        }
    };
    let declared = headers.declared_length();
    let body = match body::read_capped(&req, config.max_body_bytes, declared).await {
        Ok(Some(body)) => body,
        Ok(None) => {
            let cap = config.max_body_bytes;
            return refuse(Refusal::BodyTooLarge(Oversize::Streamed { cap }));
        }
        Err(e) => {
            return Err(EdgeError::BadRequest(format!(
                "unreadable body: {}",
                crate::edge::js_error(&e)
            )))
        }
    };
    let delivery_id = id.as_deref().unwrap_or_default().to_string();
    match classify(proof, &body, &delivery_id, &policy) {
        Outcome::Refused(refusal) => refuse(refusal),
        Outcome::Ping { event_type } => {
            count_at_edge(counters::PINGS);
            log_line(RouteLog::Ping {
                event_type: event_type.clone(),
                webhook_id: delivery_id,
            });
            answered(&Answer::Pong { event_type })
        }
        Outcome::DeadLetter { reason, reply: r } => {
            // A verified delivery that cannot be used is kept, never dropped unseen.
            let received = body::Received {
                delivery_id: &delivery_id,
                timestamp: timestamp.as_deref(),
                body: &body,
                now,
            };
            body::keep_dead_letter(env, config, &received, reason).await?;
            reply(r)
        }
        Outcome::Event {
            key,
            event_type,
            event,
        } => deliver(env, config, key, &event_type, event, &delivery_id, now).await,
        Outcome::Nudge {
            key,
            event_type,
            claimed,
            metadata,
            delivery_id,
        } => {
            let nudge = nudge::Nudge {
                key,
                event_type,
                claimed,
                metadata,
                delivery_id,
            };
            nudge::deliver(env, config, nudge, now).await
        }
    }
}

/// An HMAC-proven event: answered here when it repeats a terminal outcome this isolate knows,
/// else handed to the gate.
async fn deliver(
    env: &Env,
    config: &Config,
    key: OperationKey,
    event_type: &str,
    event: OpEvent,
    delivery_id: &str,
    now: i64,
) -> Result<Response, EdgeError> {
    let known = TERMINAL.with(|t| t.borrow().duplicate(&key.key, &event.status));
    if let Some(answer) = known {
        count_at_edge(counters::DELIVERIES);
        count_at_edge(counters::DUPLICATES);
        if let Some(line) = RouteLog::handled(Handled {
            answer: answer.clone(),
            event_type: event_type.to_string(),
            webhook_id: delivery_id.to_string(),
            ms: None,
            answered_by: Some("edge"),
            alert: None,
        }) {
            log_line(line);
        }
        return answered(&answer);
    }
    let command = GateCommand::Deliver {
        key: key.key.clone(),
        name: key.name,
        event,
        require_registration: config.require_registration,
        hold_ms: config.unregistered_hold_ms(),
        new_not_before_ms: 0,
    };
    answer(env, &key.key, &command, event_type, delivery_id, now).await
}

/// Hands `command` to the gate of `key`, logs what it did, and answers the sender.
async fn answer(
    env: &Env,
    key: &str,
    command: &GateCommand,
    event_type: &str,
    delivery_id: &str,
    started: i64,
) -> Result<Response, EdgeError> {
    let reply = call_gate(env, key, command).await?;
    respond(key, command, reply, event_type, delivery_id, started)
}

/// Logs what the gate did with `command` and answers the sender.
fn respond(
    key: &str,
    command: &GateCommand,
    reply: GateReply,
    event_type: &str,
    delivery_id: &str,
    started: i64,
) -> Result<Response, EdgeError> {
    TERMINAL.with(|t| t.borrow_mut().learn(key, command, &reply));
    let Some(answer) = Answer::from_gate(key, &reply) else {
        return Err(EdgeError::Unavailable(format!(
            "unexpected gate reply {reply:?}"
        )));
    };
    if let Some(line) = RouteLog::handled(Handled {
        answer: answer.clone(),
        event_type: event_type.to_string(),
        webhook_id: delivery_id.to_string(),
        ms: Some(now_ms() - started),
        answered_by: None,
        alert: None,
    }) {
        log_line(line);
    }
    answered(&answer)
}
