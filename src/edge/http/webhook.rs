//! `POST /webhooks/gemini`: check the headers, read the body under its cap, verify, parse,
//! hand to the gate, answer.
//!
//! Guarantees (docs/DESIGN.md, invariants 4, 5 and 7): the order is a declared oversized
//! `content-length` (413), then the signature headers' presence and shape (401, before a byte
//! of the body is read: for HMAC the id, the timestamp and its window; for a JWT the token
//! itself, checked against the key set), then the body, read as a stream and refused with 413
//! as soon as it passes `MAX_BODY_BYTES` (at most the cap plus one chunk is held), then the
//! HMAC over the raw bytes (401, nothing written, nothing run), then parsing.
//!
//! What is trusted from where: an HMAC-signed body is proven byte for byte and becomes an
//! event; a JWT-signed (dynamic-webhook) body is not (the token proves only that Google sent
//! something, to anyone who runs a job), so it is a **nudge**: it names an operation, and the
//! gate asks Gemini's status API and applies what that says. A nudge naming an operation its
//! gate has no record of is not stored on the token's word (anyone can obtain tokens): the
//! edge asks the status API first, within the strangers' guard's limit, and stores only what
//! Gemini vouches for ([`crate::inbound::stranger`]). Only claims inside the verified
//! token (`user_metadata`) are forwarded as verified; metadata found only in the body is
//! forwarded as `unverified_user_metadata`.
//!
//! A verified HMAC body that is not an envelope (400) or has an unknown type (2xx) is kept in
//! KV as a dead letter, and if it cannot be kept the answer is 503 so Gemini retries; an
//! unusable JWT body is only counted and logged (it is unproven). A usable delivery costs one
//! gate round trip and no KV read, and is answered 2xx only after the gate stored what it
//! means; an HMAC-signed duplicate of a terminal outcome this isolate has seen a gate answer
//! with costs no round trip (terminal absorbs, so it cannot be a change: it is answered from
//! this isolate's copy of that fact, logged, and counted in memory).

use std::cell::RefCell;
use std::collections::HashMap;

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use worker::wasm_bindgen::{JsCast, JsValue};
use worker::wasm_bindgen_futures::JsFuture;
use worker::{js_sys, web_sys, Env, Response};

use crate::config::Config;
use crate::inbound::envelope::{meaning, parse, Envelope, Meaning};
use crate::inbound::jwt::JwtError;
use crate::inbound::stranger::{self, GuardLimits, Next};
use crate::operation::gate_protocol::{GateCommand, GateReply};
use crate::operation::key::{normalize, Collection, KeyError, OperationKey};
use crate::operation::ledger::dead_key;
use crate::operation::lifecycle::{DropReason, Source, Status};
use crate::operation::observation::StatusError;
use crate::operation::OpEvent;
use crate::reconciliation::lease_protocol::{LeaseCommand, LeaseReply};
use crate::signature::{check_headers, looks_like_jwt, CheckedHeaders, SignedHeaders};
use crate::telemetry::counters;
use crate::telemetry::log_event::LogEvent;
use crate::timestamp::format_rfc3339;

use crate::edge::http::dynamic_webhook;
use crate::edge::objects::lease_object::GUARD_NAME;
use crate::edge::objects::stats_shard::{count_at_edge, count_rejected};
use crate::edge::outbound::ledger_kv::{write_dead_letter, KV_BINDING};
use crate::edge::outbound::status_api;
use crate::edge::reconcile_pass::LEASE_BINDING;
use crate::edge::{call_gate, log, now_ms, ok_json, EdgeError};

/// Who vouched for a delivery.
enum Proof<'a> {
    /// Headers fit for an HMAC over the body's bytes with one of our secrets (checked next).
    Hmac(CheckedHeaders<'a>),
    /// A Google-signed token: it proves the sender, not the body.
    Jwt {
        claims: Map<String, Value>,
        token_hash: String,
    },
}

/// Logs (once per reason per flush window) and counts a refusal.
fn rejected(reason: &'static str, extra: Value) {
    if count_rejected(reason) {
        let mut line = json!({"event": "rejected", "reason": reason});
        if let (Value::Object(line), Value::Object(extra)) = (&mut line, extra) {
            line.extend(extra);
        }
        log(line);
    }
}

pub async fn receive(
    req: web_sys::Request,
    env: &Env,
    config: &Config,
) -> Result<Response, EdgeError> {
    let headers = req.headers();
    let header = |name: &str| headers.get(name).ok().flatten();
    let declared: Option<usize> = header("content-length").and_then(|v| v.trim().parse().ok());
    if declared.is_some_and(|n| n > config.max_body_bytes) {
        rejected("body_too_large", json!({"bytes": declared}));
        return Err(EdgeError::TooLarge);
    }
    let (id, timestamp, signature) = (
        header("webhook-id"),
        header("webhook-timestamp"),
        header("webhook-signature"),
    );
    let now = now_ms();
    let now_secs = now.div_euclid(1_000);
    let signed = SignedHeaders {
        id: id.as_deref(),
        timestamp: timestamp.as_deref(),
        signature: signature.as_deref(),
    };
    // Everything the headers alone can refuse is refused before the body is read.
    let proof = match signature.as_deref().filter(|s| looks_like_jwt(s)) {
        Some(token) => {
            let claims = verify_token(env, config, token, timestamp.as_deref(), now).await?;
            Proof::Jwt {
                claims,
                token_hash: token_hash(token),
            }
        }
        None => match check_headers(signed, now_secs, config.tolerance_secs) {
            Ok(checked) => Proof::Hmac(checked),
            Err(e) => {
                rejected(e.label(), json!({}));
                return Err(EdgeError::Unauthorized);
            }
        },
    };
    let body = match read_capped(&req, config.max_body_bytes).await {
        Ok(Some(body)) => body,
        Ok(None) => {
            rejected(
                "body_too_large",
                json!({"bytes": format!("> {}", config.max_body_bytes)}),
            );
            return Err(EdgeError::TooLarge);
        }
        Err(e) => {
            return Err(EdgeError::BadRequest(format!(
                "unreadable body: {}",
                crate::edge::js_error(&e)
            )))
        }
    };
    match proof {
        Proof::Hmac(checked) => {
            if let Err(e) = checked.verify(&body, &config.webhook_secrets) {
                rejected(e.label(), json!({}));
                return Err(EdgeError::Unauthorized);
            }
            let delivery_id = id.unwrap_or_default();
            deliver_signed(env, config, &body, &delivery_id, timestamp.as_deref(), now).await
        }
        Proof::Jwt { claims, token_hash } => {
            deliver_nudge(env, config, &body, claims, &token_hash, now).await
        }
    }
}

/// Checks a dynamic webhook's token: allowed at all, its `webhook-timestamp` (when sent)
/// within the tolerance, its signature and claims. A key set that cannot be refreshed now is
/// a 503 with `Retry-After`, so Gemini retries; everything else is a 401.
async fn verify_token(
    env: &Env,
    config: &Config,
    token: &str,
    timestamp: Option<&str>,
    now: i64,
) -> Result<Map<String, Value>, EdgeError> {
    if !config.dynamic_webhooks {
        rejected("dynamic_webhooks_disabled", json!({}));
        return Err(EdgeError::Unauthorized);
    }
    let now_secs = now.div_euclid(1_000);
    if let Some(t) = timestamp {
        let skew = t
            .trim()
            .parse::<i64>()
            .map(|t| t.saturating_sub(now_secs).saturating_abs());
        match skew {
            Err(_) => {
                rejected("bad_timestamp", json!({}));
                return Err(EdgeError::Unauthorized);
            }
            Ok(skew) if skew > config.tolerance_secs => {
                rejected("timestamp_out_of_tolerance", json!({}));
                return Err(EdgeError::Unauthorized);
            }
            Ok(_) => {}
        }
    }
    match dynamic_webhook::verify(env, config, token, now).await {
        Ok(claims) => Ok(claims),
        Err(dynamic_webhook::Refusal::RetryAfter(secs)) => {
            rejected(
                JwtError::KeysUnavailable.label(),
                json!({"retry_after": secs}),
            );
            Err(EdgeError::RetryLater(secs))
        }
        Err(dynamic_webhook::Refusal::Invalid(e)) => {
            rejected(e.label(), json!({}));
            Err(EdgeError::Unauthorized)
        }
    }
}

/// A JWT delivery's id: a hash of the token, which is signed (the `webhook-id` header is not,
/// and may be empty).
fn token_hash(token: &str) -> String {
    let digest = Sha256::digest(token.trim().as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("jwt_{hex}")
}

/// An HMAC-signed delivery: the body is proven, so it becomes an event for the gate.
async fn deliver_signed(
    env: &Env,
    config: &Config,
    body: &[u8],
    delivery_id: &str,
    timestamp: Option<&str>,
    now: i64,
) -> Result<Response, EdgeError> {
    // A verified delivery that cannot be used is kept, never dropped unseen.
    let dead_letter = |reason: &'static str| {
        keep_dead_letter(env, config, delivery_id, timestamp, reason, body, now)
    };
    let envelope = match parse(body) {
        Ok(e) => e,
        Err(e) => {
            dead_letter(e.label()).await?;
            return Err(EdgeError::BadRequest(format!("not a Gemini envelope: {e}")));
        }
    };
    if meaning(&envelope.event_type) == Meaning::Ping {
        count_at_edge(counters::PINGS);
        log(LogEvent::Ping.line(json!({"type": envelope.event_type, "webhook_id": delivery_id})));
        return ok_json(&json!({"outcome": "pong", "type": envelope.event_type}));
    }
    let Some((status, key)) = usable(&envelope) else {
        dead_letter("unknown_event_type").await?;
        return ok_json(&json!({"outcome": "ignored_unknown_type", "type": envelope.event_type}));
    };
    let key = match key {
        Ok(k) => k,
        Err(e) => {
            dead_letter("bad_operation_id").await?;
            return Err(EdgeError::BadRequest(format!("data.id: {e}")));
        }
    };
    if let Some(answer) = duplicate_of_known_terminal(&key.key, &status) {
        // Terminal absorbs: the same terminal outcome again cannot change anything, so this
        // isolate answers it from its copy of that fact, without a gate round trip. Changes
        // always go through the gate; this answers only what cannot be one.
        count_at_edge(counters::DELIVERIES);
        count_at_edge(counters::DUPLICATES);
        let mut line = answer.clone();
        line["type"] = json!(envelope.event_type);
        line["webhook_id"] = json!(delivery_id);
        line["answered_by"] = json!("edge");
        log(LogEvent::Duplicate.line(line));
        return ok_json(&answer);
    }
    let command = GateCommand::Deliver {
        key: key.key.clone(),
        name: key.name.clone(),
        event: OpEvent {
            status,
            update_time_ms: envelope.timestamp_ms,
            source: Source::Webhook,
            details: envelope.details,
            delivery_id: Some(delivery_id.to_string()),
        },
        require_registration: config.require_registration,
        hold_ms: config.unregistered_hold_ms(),
    };
    answer(
        env,
        &key.key,
        &command,
        &envelope.event_type,
        delivery_id,
        now,
    )
    .await
}

/// A dynamic-webhook delivery: the body only names the operation. Nothing in it decides
/// state; the gate confirms with the status API.
async fn deliver_nudge(
    env: &Env,
    config: &Config,
    body: &[u8],
    mut claims: Map<String, Value>,
    token_hash: &str,
    now: i64,
) -> Result<Response, EdgeError> {
    // Unproven bodies are never stored: a refusal is counted and logged only.
    let envelope = match parse(body) {
        Ok(e) => e,
        Err(e) => {
            rejected(
                "jwt_body_not_envelope",
                json!({"problem": e.label(), "delivery_id": token_hash}),
            );
            return Err(EdgeError::BadRequest(format!("not a Gemini envelope: {e}")));
        }
    };
    let Some((status, key)) = usable(&envelope) else {
        rejected(
            "jwt_unknown_event_type",
            json!({"type": envelope.event_type, "delivery_id": token_hash}),
        );
        return ok_json(&json!({"outcome": "ignored_unknown_type", "type": envelope.event_type}));
    };
    let key = key.map_err(|e| {
        rejected("jwt_bad_operation_id", json!({"delivery_id": token_hash}));
        EdgeError::BadRequest(format!("data.id: {e}"))
    })?;
    let mut metadata = Map::new();
    match claims.remove("user_metadata") {
        Some(verified) => {
            // Bounded before it travels to the gate (the command nests it deeper than the
            // token did); the body's was bounded when the envelope was parsed.
            metadata.insert("user_metadata".into(), crate::bounds::bound(verified));
        }
        None => {
            if let Some(unverified) = envelope.details.get("user_metadata") {
                metadata.insert("unverified_user_metadata".into(), unverified.clone());
            }
        }
    }
    let nudge = |metadata, vouched| GateCommand::Nudge {
        key: key.key.clone(),
        name: key.name.clone(),
        claimed: status.as_str().to_string(),
        metadata,
        delivery_id: token_hash.to_string(),
        require_registration: config.require_registration,
        vouched,
    };
    let command = nudge(metadata.clone(), false);
    let reply = call_gate(env, &key.key, &command).await?;
    if reply != GateReply::Unregistered {
        return respond(
            &key.key,
            &command,
            reply,
            &envelope.event_type,
            token_hash,
            now,
        );
    }
    // A name the gate has never seen: Gemini's status API decides, before anything is stored.
    let limits = guard_limits(config);
    let permit = guard_call(env, &LeaseCommand::StrangerPermit { limits }).await?;
    if let LeaseReply::StrangerPermit {
        retry_after: Some(secs),
    } = permit
    {
        rejected(
            "stranger_limit",
            json!({"key": key.key, "retry_after": secs}),
        );
        return Err(EdgeError::RetryLater(secs.clamp(1, 60) as u32));
    }
    let asked = match (&config.gemini_api_key, Collection::of_key(&key.key)) {
        (None, _) => None,
        (Some(_), None) => Some(Err(StatusError::Malformed("key has no collection".into()))),
        (Some(_), Some(collection)) => {
            Some(status_api::ask(config, collection, &key.key, &key.name).await)
        }
    };
    let event_type = &envelope.event_type;
    match stranger::next_step(asked, &metadata, token_hash) {
        Next::Deliver(event) => {
            let command = GateCommand::Deliver {
                key: key.key.clone(),
                name: key.name.clone(),
                event,
                require_registration: config.require_registration,
                hold_ms: config.unregistered_hold_ms(),
            };
            answer(env, &key.key, &command, event_type, token_hash, now).await
        }
        Next::Confirm => {
            let command = nudge(metadata, true);
            answer(env, &key.key, &command, event_type, token_hash, now).await
        }
        Next::Unknown => {
            count_at_edge(counters::STRANGER_NUDGES);
            let counted = guard_call(env, &LeaseCommand::StrangerUnknown { limits }).await;
            let body = json!({"outcome": "unknown_to_gemini", "key": key.key});
            let mut line = body.clone();
            line["event"] = json!(LogEvent::StrangerNudge.as_str());
            line["type"] = json!(event_type);
            line["webhook_id"] = json!(token_hash);
            line["alert"] = json!(matches!(
                counted,
                Ok(LeaseReply::StrangerCounted { alert: true })
            ));
            log(line);
            ok_json(&body)
        }
        Next::RetryLater(secs) => {
            log(LogEvent::StrangerUnconfirmed.line(json!({
                "key": key.key, "webhook_id": token_hash, "retry_after": secs,
                "reason": if config.gemini_api_key.is_none() { "GEMINI_API_KEY is not set" } else { "the status API did not answer" },
            })));
            Err(EdgeError::RetryLater(secs.clamp(1, 3_600) as u32))
        }
    }
}

/// The strangers' guard's limits, from the configuration.
fn guard_limits(config: &Config) -> GuardLimits {
    GuardLimits {
        per_minute: config.stranger_nudges_per_minute,
        threshold: config.stranger_alert_threshold,
        window_ms: config.stranger_alert_window_secs * 1_000,
    }
}

async fn guard_call(env: &Env, command: &LeaseCommand) -> Result<LeaseReply, EdgeError> {
    crate::edge::post_json(
        &crate::edge::stub_for(env, LEASE_BINDING, GUARD_NAME)?,
        command,
    )
    .await
}

/// What an envelope's type means, and its operation's key: `None` for an unknown type.
fn usable(envelope: &Envelope) -> Option<(Status, Result<OperationKey, KeyError>)> {
    match meaning(&envelope.event_type) {
        Meaning::Status { status, collection } => {
            Some((status, normalize(&envelope.id, Some(collection))))
        }
        Meaning::Ping | Meaning::Unknown => None,
    }
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
    if let (
        GateCommand::Deliver { .. },
        GateReply::Applied { status, .. } | GateReply::Dropped { status, .. },
    ) = (command, &reply)
    {
        remember_terminal(key, status);
    }
    let (event, body) = match &reply {
        GateReply::Applied { status, effect } => (
            "delivered",
            json!({"outcome": "applied", "key": key, "status": status, "effect": effect}),
        ),
        GateReply::Dropped {
            reason,
            status,
            effect,
        } => (
            if *reason == DropReason::Duplicate {
                "duplicate"
            } else {
                "dropped"
            },
            json!({"outcome": "dropped", "reason": reason, "key": key, "status": status, "effect": effect}),
        ),
        GateReply::Confirming { status } => (
            "nudged",
            json!({"outcome": "confirming", "key": key, "status": status}),
        ),
        GateReply::IgnoredUnregistered => (
            "ignored_unregistered",
            json!({"outcome": "ignored_unregistered", "key": key}),
        ),
        GateReply::Forgotten { .. } => (
            "ignored_forgotten",
            json!({"outcome": "ignored_forgotten", "key": key}),
        ),
        other => {
            return Err(EdgeError::Unavailable(format!(
                "unexpected gate reply {other:?}"
            )))
        }
    };
    let mut line = body.clone();
    line["event"] = json!(event);
    line["type"] = json!(event_type);
    line["webhook_id"] = json!(delivery_id);
    line["ms"] = json!(now_ms() - started);
    log(line);
    ok_json(&body)
}

thread_local! {
    /// Terminal states this isolate has seen a gate answer with, by key: a copy of a fact that
    /// never changes (terminal absorbs), used only to answer a duplicate of it.
    static TERMINAL: RefCell<HashMap<String, Status>> = RefCell::new(HashMap::new());
}

/// Keys remembered per isolate; past this the memory starts over (a miss costs one round trip).
const TERMINAL_KEYS_MAX: usize = 100_000;

fn remember_terminal(key: &str, status: &Status) {
    if !status.is_terminal() {
        return;
    }
    TERMINAL.with(|t| {
        let mut t = t.borrow_mut();
        if t.len() >= TERMINAL_KEYS_MAX {
            t.clear();
        }
        t.insert(key.to_string(), status.clone());
    });
}

/// The answer to a delivery that repeats a terminal outcome this isolate knows, if it does.
fn duplicate_of_known_terminal(key: &str, status: &Status) -> Option<Value> {
    let known = TERMINAL.with(|t| t.borrow().get(key).cloned())?;
    (known == *status).then(|| {
        json!({"outcome": "dropped", "reason": "duplicate", "key": key, "status": status, "effect": "not_asked"})
    })
}

/// The body, read chunk by chunk as it streams in; `None` as soon as it passes `cap` (the
/// rest is cancelled, never buffered), so memory per request is bounded by the cap plus one
/// chunk whatever `content-length` says or omits.
async fn read_capped(req: &web_sys::Request, cap: usize) -> Result<Option<Vec<u8>>, JsValue> {
    let Some(stream) = req.body() else {
        return Ok(Some(Vec::new()));
    };
    let reader: web_sys::ReadableStreamDefaultReader = stream.get_reader().unchecked_into();
    let mut body = Vec::new();
    loop {
        let step = JsFuture::from(reader.read()).await?;
        if js_sys::Reflect::get(&step, &JsValue::from_str("done"))?
            .as_bool()
            .unwrap_or(true)
        {
            return Ok(Some(body));
        }
        let chunk =
            js_sys::Uint8Array::new(&js_sys::Reflect::get(&step, &JsValue::from_str("value"))?);
        let len = chunk.length() as usize;
        if body.len() + len > cap {
            // Not awaited: the answer goes out now; the runtime drops the rest of the upload.
            let _ = reader.cancel();
            return Ok(None);
        }
        let start = body.len();
        body.resize(start + len, 0);
        chunk.copy_to(&mut body[start..]);
    }
}

/// Keeps a verified but unusable delivery as `dead:<webhook-id>`. Failing to keep it is a 503:
/// a signed delivery is never dropped unseen.
async fn keep_dead_letter(
    env: &Env,
    config: &Config,
    delivery_id: &str,
    timestamp: Option<&str>,
    reason: &str,
    body: &[u8],
    now: i64,
) -> Result<(), EdgeError> {
    let key = dead_key(delivery_id);
    let value = json!({
        "webhook_id": delivery_id,
        "webhook_timestamp": timestamp,
        "received_at": format_rfc3339(now),
        "reason": reason,
        "body": String::from_utf8_lossy(body),
        "body_is_utf8": std::str::from_utf8(body).is_ok(),
    });
    let kv = env
        .kv(KV_BINDING)
        .map_err(|e| EdgeError::Unavailable(e.to_string()))?;
    write_dead_letter(&kv, &key, &value, config.kv_ttl_secs()).await?;
    log(
        json!({"event": "dead_letter", "reason": reason, "webhook_id": delivery_id, "kv_key": key}),
    );
    Ok(())
}
