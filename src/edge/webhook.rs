//! `POST /webhooks/gemini`: verify (HMAC, or an RS256 JWT for dynamic webhooks), parse, hand
//! to the gate, answer.
//!
//! Guarantees: the order is size limit (413), then the signature on the raw bytes (401,
//! nothing written, nothing run), then parsing; a verified body that is not an envelope (400)
//! or has an unknown type (2xx) is kept in KV as a dead letter, and if it cannot be kept the
//! answer is 503 so Gemini retries; a usable delivery costs one gate round trip and no KV
//! read, and is answered 2xx only after the gate stored what it means.

use serde_json::json;
use worker::wasm_bindgen_futures::JsFuture;
use worker::{js_sys, web_sys, Env, Response};

use crate::config::Config;
use crate::envelope::{meaning, parse, Meaning};
use crate::gate_protocol::{GateCommand, GateReply};
use crate::key::normalize;
use crate::ledger::dead_key;
use crate::lifecycle::Source;
use crate::operation::OpEvent;
use crate::signature::{looks_like_jwt, verify, SignedHeaders};
use crate::timestamp::format_rfc3339;

use super::dynamic_webhook;
use super::ledger_kv::{write_dead_letter, KV_BINDING};
use super::stats::count_rejected;
use super::{call_gate, log, now_ms, ok_json, EdgeError};

pub async fn receive(
    req: web_sys::Request,
    env: &Env,
    config: &Config,
) -> Result<Response, EdgeError> {
    let headers = req.headers();
    let header = |name: &str| headers.get(name).ok().flatten();
    let declared: Option<usize> = header("content-length").and_then(|v| v.trim().parse().ok());
    if declared.is_some_and(|n| n > config.max_body_bytes) {
        if count_rejected("body_too_large") {
            log(json!({"event": "rejected", "reason": "body_too_large", "bytes": declared}));
        }
        return Err(EdgeError::TooLarge);
    }
    let (id, timestamp, signature) = (
        header("webhook-id"),
        header("webhook-timestamp"),
        header("webhook-signature"),
    );
    let body = read_body(&req)
        .await
        .map_err(|e| EdgeError::BadRequest(format!("unreadable body: {}", super::js_error(&e))))?;
    if body.len() > config.max_body_bytes {
        if count_rejected("body_too_large") {
            log(json!({"event": "rejected", "reason": "body_too_large", "bytes": body.len()}));
        }
        return Err(EdgeError::TooLarge);
    }
    let now = now_ms();
    let now_secs = now.div_euclid(1_000);
    // Dynamic (per-job) webhooks carry an RS256 JWT instead of HMAC entries.
    let claims = match signature.as_deref().filter(|s| looks_like_jwt(s)) {
        Some(token) => {
            let skewed = timestamp.as_deref().map(|t| {
                t.trim()
                    .parse::<i64>()
                    .map(|t| (t - now_secs).abs() > config.tolerance_secs)
            });
            let verified = match skewed {
                Some(Err(_)) => Err("bad_timestamp"),
                Some(Ok(true)) => Err("timestamp_out_of_tolerance"),
                _ => dynamic_webhook::verify(env, config, token, now)
                    .await
                    .map_err(|e| e.label()),
            };
            match verified {
                Ok(claims) => Some(claims),
                Err(label) => {
                    if count_rejected(label) {
                        log(json!({"event": "rejected", "reason": label}));
                    }
                    return Err(EdgeError::Unauthorized);
                }
            }
        }
        None => {
            let headers = SignedHeaders {
                id: id.as_deref(),
                timestamp: timestamp.as_deref(),
                signature: signature.as_deref(),
            };
            if let Err(e) = verify(
                headers,
                &body,
                &config.webhook_secrets,
                now_secs,
                config.tolerance_secs,
            ) {
                if count_rejected(e.label()) {
                    log(json!({"event": "rejected", "reason": e.label()}));
                }
                return Err(EdgeError::Unauthorized);
            }
            None
        }
    };
    let delivery_id = id.unwrap_or_default();
    // A verified delivery that cannot be used is kept, never dropped unseen.
    let dead_letter = |reason: &'static str| {
        keep_dead_letter(
            env,
            config,
            &delivery_id,
            timestamp.as_deref(),
            reason,
            &body,
            now,
        )
    };

    let mut envelope = match parse(&body) {
        Ok(e) => e,
        Err(e) => {
            dead_letter(e.label()).await?;
            return Err(EdgeError::BadRequest(format!("not a Gemini envelope: {e}")));
        }
    };
    if let Some(meta) = claims.and_then(|mut c| c.remove("user_metadata")) {
        envelope.details.entry("user_metadata").or_insert(meta);
    }
    let (status, collection) = match meaning(&envelope.event_type) {
        Meaning::Status { status, collection } => (status, collection),
        Meaning::Unknown => {
            dead_letter("unknown_event_type").await?;
            return ok_json(
                &json!({"outcome": "ignored_unknown_type", "type": envelope.event_type}),
            );
        }
    };
    let key = match normalize(&envelope.id, Some(collection)) {
        Ok(k) => k,
        Err(e) => {
            dead_letter("bad_operation_id").await?;
            return Err(EdgeError::BadRequest(format!("data.id: {e}")));
        }
    };
    let command = GateCommand::Deliver {
        key: key.key.clone(),
        name: key.name.clone(),
        event: OpEvent {
            status,
            update_time_ms: envelope.timestamp_ms,
            source: Source::Webhook,
            details: envelope.details,
            delivery_id: Some(delivery_id.clone()),
        },
        require_registration: config.require_registration,
    };
    let reply = call_gate(env, &key.key, &command)
        .await
        .map_err(EdgeError::Unavailable)?;
    let ms = now_ms() - now;
    let (event, body) = match &reply {
        GateReply::Applied { status, effect } => (
            "delivered",
            json!({"outcome": "applied", "key": key.key, "status": status, "effect": effect}),
        ),
        GateReply::Dropped {
            reason,
            status,
            effect,
        } => (
            if reason == "duplicate" {
                "duplicate"
            } else {
                "dropped"
            },
            json!({"outcome": "dropped", "reason": reason, "key": key.key, "status": status, "effect": effect}),
        ),
        GateReply::IgnoredUnregistered => (
            "ignored_unregistered",
            json!({"outcome": "ignored_unregistered", "key": key.key}),
        ),
        other => {
            return Err(EdgeError::Unavailable(format!(
                "unexpected gate reply {other:?}"
            )))
        }
    };
    let mut line = body.clone();
    line["event"] = json!(event);
    line["type"] = json!(envelope.event_type);
    line["webhook_id"] = json!(delivery_id);
    line["ms"] = json!(ms);
    log(line);
    ok_json(&body)
}

/// The whole body, read by the runtime in one call.
async fn read_body(req: &web_sys::Request) -> Result<Vec<u8>, worker::wasm_bindgen::JsValue> {
    let buffer = JsFuture::from(req.array_buffer()?).await?;
    Ok(js_sys::Uint8Array::new(&buffer).to_vec())
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
    let ttl = (config.retention_ms() / 1_000) as u64;
    write_dead_letter(&kv, &key, &value, ttl)
        .await
        .map_err(EdgeError::Unavailable)?;
    log(
        json!({"event": "dead_letter", "reason": reason, "webhook_id": delivery_id, "kv_key": key}),
    );
    Ok(())
}
