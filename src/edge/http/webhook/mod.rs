//! `POST /webhooks/gemini`: performs the steps [`crate::inbound::intake`] asks for, in the
//! order it asks, and answers what it finishes with.
//!
//! Guarantees (docs/DESIGN.md, invariants 4, 5 and 7): this route decides nothing; each await
//! is one [`Need`] of the intake, whose answer goes straight back to it: the key set for a
//! token's signature or a body's `v1a,` entries, the status API (in a slot of the budget)
//! for a `v1a`-signed body no gate holds, the body read under its cap ([`read_capped`]: at most the cap
//! plus one chunk is held), this isolate's memory of settled operations
//! ([`TerminalMemory`]), one gate call, the strangers' tally, a dead letter in KV. Refusals
//! are counted and logged once per reason per flush window; nothing is written for them. A
//! usable delivery costs one gate round trip and no KV read, and is answered 2xx only after
//! the gate stored what it means.

use std::cell::RefCell;

use std::time::Duration;

use worker::{web_sys, Delay, Env};

use crate::config::Config;
use crate::inbound::classify::Policy;
use crate::inbound::intake::{DeliveryEnd, Headers, Intake, Need, Settings, TerminalMemory};
use crate::inbound::stranger::{
    slot_step, AlertLimits, CountNudge, NotOurs, NudgeCounted, SlotStep, SlotWaited,
};
use crate::operation::gate::alarm::status_backoff_until;
use crate::operation::key::Collection;
use crate::operation::observation::{Observation, StatusError};
use crate::refusal::Refusal;
use crate::telemetry::analytics::delivery as delivery_point;

use crate::edge::capped_read::{read_capped, unreadable};
use crate::edge::http::dynamic_webhook;
use crate::edge::objects::call::{call_gate, post_json, status_backoff, status_slot, stub_for};
use crate::edge::objects::stats_shard::{count_at_edge, count_rejected};
use crate::edge::objects::stranger_watch::{WATCH_BINDING, WATCH_NAME};
use crate::edge::objects::usage_meter::Meter;
use crate::edge::outbound::{analytics, ledger_kv::write_dead_letter, status_api};
use crate::edge::raw_response;
use crate::edge::runtime::{log, now_ms};

thread_local! {
    /// The terminal states this isolate has seen gates answer with (see [`TerminalMemory`]).
    static TERMINAL: RefCell<TerminalMemory> = RefCell::new(TerminalMemory::default());
    /// The names the status API told this isolate are not ours (see [`NotOurs`]).
    static NOT_OURS: RefCell<NotOurs> = RefCell::new(NotOurs::default());
}

pub async fn receive(
    req: web_sys::Request,
    env: &Env,
    config: &Config,
) -> Result<web_sys::Response, Refusal> {
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
    let policy = Policy {
        max_body_bytes: config.max_body_bytes,
        tolerance_secs: config.tolerance_secs,
        dynamic_webhooks: config.dynamic_webhooks,
        secrets: &config.webhook_secrets,
        audience: config.gemini_jwt_audience.as_deref(),
    };
    let settings = Settings {
        require_registration: config.require_registration,
        hold_ms: config.unregistered_hold_ms(),
        confirm_interval_ms: config.confirm_interval_secs * 1_000,
        status_api: config.gemini_api_key.is_some(),
    };
    let received_ms = now_ms();
    let (mut intake, mut need) = Intake::start(headers, policy, settings, received_ms);
    loop {
        need = match need {
            Need::Signature(token) => {
                let checked = dynamic_webhook::verify(env, config, &token, now_ms()).await;
                intake.signature_checked(checked, now_ms())
            }
            Need::V1a(message) => {
                let checked = dynamic_webhook::verify_v1a(env, config, &message, now_ms()).await;
                intake.v1a_checked(checked)
            }
            Need::Body { cap, declared } => {
                let body = read_capped(&req, cap, declared).await;
                let body = body.map_err(|e| unreadable(&e))?;
                TERMINAL.with(|t| intake.body_read(body, &t.borrow()))
            }
            Need::Gate { key, command } => {
                let reply = call_gate(env, &key, &command).await;
                intake.gate_answered(reply.map_err(|e| e.to_string()), now_ms())
            }
            Need::AskStatus {
                key,
                name,
                collection,
            } => intake.status_answered(ask_unheld(env, config, &key, &name, collection).await),
            Need::Tally => intake.tallied(tally(env, config).await),
            Need::DeadLetter { key, value } => {
                let kept = write_dead_letter(env, &key, &value, config.kv_ttl_secs()).await;
                intake.dead_letter_kept(kept.map_err(|e| e.to_string()))
            }
            Need::Done(finished) => return answer(finished, env, now_ms() - received_ms),
        };
    }
}

/// Asks the status API about an operation only a `v1a`-signed body names, in a slot of the
/// status budget (one lease call, up to [`crate::inbound::stranger::SLOT_ASKS_MAX`] when the
/// slot is a moment away), unless this isolate was told a moment ago that it is not ours
/// (`None`: not asked); a 429 or 5xx is reported to the lease, so every status call backs off.
async fn ask_unheld(
    env: &Env,
    config: &Config,
    key: &str,
    name: &str,
    collection: Collection,
) -> Option<Result<Observation, StatusError>> {
    if NOT_OURS.with(|m| m.borrow().knows(key, now_ms())) {
        return None;
    }
    // The worker's routes have no usage meter: these calls go on one that counts nothing.
    let unmetered = Meter::default();
    let mut waited = SlotWaited::default();
    loop {
        let answer = status_slot(env, &unmetered, config.reconcile_poll_rate).await;
        match slot_step(answer, now_ms(), &mut waited) {
            SlotStep::Ask => break,
            SlotStep::Wait(ms) => {
                Delay::from(Duration::from_millis(ms as u64)).await;
                // A delivery of the same name that held the slot before may have learnt
                // meanwhile that it is not ours.
                if NOT_OURS.with(|m| m.borrow().knows(key, now_ms())) {
                    return None;
                }
            }
            SlotStep::Refuse(refused) => return Some(Err(refused)),
        }
    }
    let (answer, _) = status_api::ask(config, collection, key, name).await;
    status_backoff(env, &unmetered, status_backoff_until(&answer, now_ms())).await;
    NOT_OURS.with(|m| m.borrow_mut().answered(key, &answer, now_ms()));
    Some(answer)
}

/// Counts a nudge for an operation not held on the strangers' tally: whether it raised the
/// window's alert, `None` when the call failed.
async fn tally(env: &Env, config: &Config) -> Option<bool> {
    let limits = AlertLimits {
        threshold: config.stranger_alert_threshold,
        window_ms: config.stranger_alert_window_secs * 1_000,
    };
    let stub = stub_for(env, WATCH_BINDING, WATCH_NAME).ok()?;
    let counted: NudgeCounted = post_json(&stub, &CountNudge { limits }).await.ok()?;
    Some(counted.alert)
}

/// Counts, logs and remembers what a finished delivery says (and writes its Analytics Engine
/// point when that is bound), and answers it.
fn answer(end: DeliveryEnd, env: &Env, ms: i64) -> Result<web_sys::Response, Refusal> {
    for name in end.counts {
        count_at_edge(name);
    }
    // A refusal's line is logged for the first of its reason in a flush window only.
    let log_it = end.rejected.is_none_or(count_rejected);
    if let (Some(dataset), Some(line)) = (analytics::dataset(env), &end.line) {
        analytics::write(&dataset, delivery_point(&line.to_value(), ms));
    }
    if let (true, Some(line)) = (log_it, end.line) {
        // Serialized straight to text: no JSON tree is built for the line every delivery
        // writes (a duplicate's included).
        match serde_json::to_string(&line) {
            Ok(text) => worker::console_log!("{text}"),
            Err(_) => log(line.to_value()),
        }
    }
    if let Some((key, status)) = end.remember {
        TERMINAL.with(|t| t.borrow_mut().remember(&key, status));
    }
    end.reply
        .and_then(|answer| raw_response::json(200, &answer).map_err(Refusal::from))
}
