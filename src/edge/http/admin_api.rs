//! The admin API under `/v1/`, behind `Authorization: Bearer <token>` of a scope that may
//! make the request (`ADMIN_TOKEN`, `REGISTER_TOKENS`, `READ_TOKENS`; [`crate::access`]).
//!
//! Guarantees: the token and its scope are checked (constant time) before anything else is
//! read: an unknown token is 401, a known one of the wrong scope 403 naming the scope it
//! needs; a request body (the bulk routes' too) is held to [`MAX_ADMIN_BODY`]: 413 at once
//! for a `content-length` over it, else as soon as the streamed bytes pass it; every change
//! goes through the operation's gate (register, retry, redeliver, forget, repair, settle; one
//! at a time or in bulk, `bulk.rs`), carrying who asked (scope and fingerprint) into its
//! history row and log line, and every action request is logged with it (`admin_action`);
//! listing and search read the ledger's metadata only; `/v1/config` shows no secret; a name
//! in the path may be percent-encoded, may contain slashes and may be any accepted form of
//! the name.

use percent_encoding::percent_decode_str;
use serde::Deserialize;
use serde_json::{json, Value};
use worker::{Env, Method, Request, Response};

use crate::access::{Admission, Caller, Route};
use crate::admin::{encode_cursor, parse_registration, parse_settle, ListQuery, MAX_REASON_CHARS};
use crate::config::Config;
use crate::operation::gate_protocol::{GateCommand, GateReply};
use crate::operation::key::normalize;
use crate::operation::ledger::{LedgerMeta, OP_PREFIX};
use crate::operation::KindFill;
use crate::reconciliation::reconcile::Resume;
use crate::telemetry::worker_log::WorkerLog;
use crate::timestamp::format_rfc3339;

use crate::edge::capped_read::request_body;
use crate::edge::error::EdgeError;
use crate::edge::http::json_answer::{json_response, ok_json};
use crate::edge::objects::call::call_gate;
use crate::edge::objects::stats_shard;
use crate::edge::outbound::ledger_kv::{list_page, KV_BINDING};
use crate::edge::runtime::{log, now_ms};

const OPERATIONS: &str = "/v1/operations";
/// Largest admin request body (bulk requests too): a longer one is refused while it streams.
pub const MAX_ADMIN_BODY: usize = 16 * 1024;
/// KV pages one listing request may scan looking for matches.
const MAX_LIST_PAGES: usize = 5;

pub async fn handle(
    req: Request,
    method: Method,
    env: &Env,
    config: &Config,
) -> Result<Response, EdgeError> {
    let auth = req.headers().get("authorization").ok().flatten();
    let path = req.path();
    let caller = match config.tokens.admit(auth.as_deref(), method.as_ref(), &path) {
        Admission::Admitted(caller) => caller,
        Admission::Unknown => {
            if stats_shard::count_rejected("admin_unauthorized") {
                log(WorkerLog::Rejected {
                    reason: "admin_unauthorized",
                }
                .to_value());
            }
            return Err(EdgeError::Unauthorized);
        }
        Admission::Forbidden { caller, needs } => {
            if stats_shard::count_rejected("admin_forbidden") {
                log(WorkerLog::RejectedScope {
                    reason: "admin_forbidden",
                    method: method.to_string(),
                    path,
                    needs: needs.as_str(),
                    by: json!(caller.actor()),
                }
                .to_value());
            }
            return Err(EdgeError::Forbidden {
                scope: caller.scope,
                needs,
            });
        }
    };
    let acts = Route::of(method.as_ref(), &path) == Route::Act;
    let method_name = method.to_string();
    let answer = serve(req, method, &path, env, config, &caller).await;
    if acts {
        // Who did what: one line per action request, whatever its answer.
        log(WorkerLog::AdminAction {
            method: method_name,
            path,
            status: answer
                .as_ref()
                .map_or_else(EdgeError::status, Response::status_code),
            by: json!(caller.actor()),
        }
        .to_value());
    }
    answer
}

/// A request the caller's scope may make.
async fn serve(
    mut req: Request,
    method: Method,
    path: &str,
    env: &Env,
    config: &Config,
    caller: &Caller,
) -> Result<Response, EdgeError> {
    let by = caller.actor();
    if let Some(action) = path.strip_prefix("/v1/bulk/") {
        return super::bulk::handle(&mut req, method, action, env, config, by).await;
    }
    if path == "/v1/whoami" {
        // The caller's own scope and fingerprint: the dashboard shows actions to admin only.
        return match method {
            Method::Get => {
                ok_json(&json!({"scope": caller.scope, "fingerprint": caller.fingerprint}))
            }
            _ => Err(EdgeError::MethodNotAllowed),
        };
    }
    if path == "/v1/stats" {
        return match method {
            Method::Get => {
                ok_json(&stats_shard::read(env, config.gemini_webhook_name.as_deref()).await?)
            }
            _ => Err(EdgeError::MethodNotAllowed),
        };
    }
    if path == "/v1/config" {
        // Names and non-secret values only (secrets are "set" / "not set"), and the warnings.
        return match method {
            Method::Get => ok_json(&config.public_view()),
            _ => Err(EdgeError::MethodNotAllowed),
        };
    }
    let Some(rest) = path.strip_prefix(OPERATIONS) else {
        return Err(EdgeError::NotFound);
    };
    if !rest.is_empty() && !rest.starts_with('/') {
        return Err(EdgeError::NotFound);
    }
    let rest = rest.trim_start_matches('/');
    if rest.is_empty() {
        return match method {
            Method::Post => register(&mut req, env, caller).await,
            Method::Get => list(&req, env, config).await,
            _ => Err(EdgeError::MethodNotAllowed),
        };
    }
    let (name, action) = match (method, rest.rsplit_once('/')) {
        (Method::Post, Some((name, "redeliver"))) => (name, Some("redeliver")),
        (Method::Post, Some((name, "retry"))) => (name, Some("retry")),
        (Method::Post, Some((name, "forget"))) => (name, Some("forget")),
        (Method::Post, Some((name, "repair"))) => (name, Some("repair")),
        (Method::Post, Some((name, "settle"))) => (name, Some("settle")),
        (Method::Get, _) => (rest, None),
        _ => return Err(EdgeError::MethodNotAllowed),
    };
    let name = percent_decode_str(name)
        .decode_utf8()
        .map_err(|_| EdgeError::BadRequest("name is not UTF-8".into()))?;
    let key = normalize(&name, None).map_err(|e| EdgeError::BadRequest(format!("name: {e}")))?;
    let command = match action {
        None => GateCommand::Inspect,
        Some("settle") => {
            let body = read_body(&mut req).await?;
            let settle = parse_settle(&body).map_err(|e| EdgeError::BadRequest(e.to_string()))?;
            GateCommand::Settle {
                status: settle.status.as_str().to_string(),
                reason: settle.reason,
                by: Some(by),
            }
        }
        Some(action) => {
            let reason = read_reason(&mut req).await?;
            match action {
                "redeliver" => GateCommand::Redeliver {
                    reason,
                    sent_before_ms: None,
                    by: Some(by),
                },
                "retry" => GateCommand::RetryNow {
                    reason,
                    by: Some(by),
                },
                "repair" => GateCommand::Repair {
                    key: key.key.clone(),
                    name: key.name.clone(),
                    reason,
                    by: Some(by),
                },
                _ => GateCommand::Forget {
                    reason,
                    by: Some(by),
                },
            }
        }
    };
    match call_gate(env, &key.key, &command).await? {
        GateReply::Found {
            mut operation,
            history,
        } => {
            operation["history"] = json!(history);
            ok_json(&operation)
        }
        GateReply::Repaired {
            repaired,
            mut operation,
            history,
        } => {
            operation["history"] = json!(history);
            ok_json(&json!({"key": key.key, "repaired": repaired, "operation": operation}))
        }
        GateReply::Redelivered {
            generation,
            action,
            effect,
        } => ok_json(
            &json!({"key": key.key, "action": action, "generation": generation, "effect": effect}),
        ),
        GateReply::Forgotten { changed } => {
            ok_json(&json!({"key": key.key, "forgotten": true, "changed": changed}))
        }
        GateReply::Applied { status, effect } => ok_json(
            &json!({"key": key.key, "settled": true, "settled_by": "operator", "status": status, "effect": effect}),
        ),
        GateReply::Refused { reason } => Err(EdgeError::Conflict(reason)),
        GateReply::NotFound => Err(EdgeError::NotFound),
        other => Err(EdgeError::Unavailable(format!(
            "unexpected gate reply {other:?}"
        ))),
    }
}

async fn register(req: &mut Request, env: &Env, caller: &Caller) -> Result<Response, EdgeError> {
    let body = read_body(req).await?;
    let reg = parse_registration(&body).map_err(|e| EdgeError::BadRequest(e.to_string()))?;
    let command = GateCommand::Register {
        key: reg.key.key.clone(),
        name: reg.key.name.clone(),
        kind: reg.kind,
        user_metadata: reg.user_metadata,
    };
    match call_gate(env, &reg.key.key, &command).await? {
        GateReply::Created { operation } => {
            log(WorkerLog::Registered {
                key: reg.key.key.clone(),
                by: json!(caller.actor()),
            }
            .to_value());
            json_response(&operation, 201)
        }
        GateReply::Exists {
            mut operation,
            kind,
        } => {
            // A registration after the completion fills in the kind; it never replaces one.
            operation["kind_change"] = json!(kind);
            if kind == KindFill::Conflict {
                operation["note"] = json!("the operation already has another kind; unchanged");
            }
            if kind == KindFill::TooLate {
                operation["note"] = json!("a side-effect attempt already went out without a kind; its webhook-id keeps that body, so the kind stays unset");
            }
            ok_json(&operation)
        }
        other => Err(EdgeError::Unavailable(format!(
            "unexpected gate reply {other:?}"
        ))),
    }
}

/// The request's body, refused with 413 past [`MAX_ADMIN_BODY`]: at once when `content-length`
/// declares more, else as soon as the streamed bytes pass it (the rest is never read).
async fn read_body(req: &mut Request) -> Result<Vec<u8>, EdgeError> {
    request_body(req, MAX_ADMIN_BODY).await
}

/// An optional `{"reason": "..."}` body; the reason is recorded with the operator's action.
async fn read_reason(req: &mut Request) -> Result<String, EdgeError> {
    #[derive(Deserialize)]
    struct Body {
        reason: Option<String>,
    }
    let body = read_body(req).await?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok("operator".to_string());
    }
    let parsed: Body = serde_json::from_slice(&body)
        .map_err(|_| EdgeError::BadRequest("body must be {\"reason\": \"...\"}".into()))?;
    Ok(parsed
        .reason
        .map(|r| r.chars().take(MAX_REASON_CHARS).collect())
        .unwrap_or_else(|| "operator".to_string()))
}

/// Lists ledger entries matching the query, from metadata only.
async fn list(req: &Request, env: &Env, config: &Config) -> Result<Response, EdgeError> {
    let url = req
        .url()
        .map_err(|e| EdgeError::BadRequest(e.to_string()))?;
    let pairs: Vec<(String, String)> = url
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let query = ListQuery::parse(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .map_err(|e| EdgeError::BadRequest(e.to_string()))?;
    let kv = env
        .kv(KV_BINDING)
        .map_err(|e| EdgeError::Unavailable(e.to_string()))?;
    let now_secs = now_ms().div_euclid(1_000);
    let mut resume = query.resume.clone();
    let mut found: Vec<Value> = Vec::new();
    for _ in 0..MAX_LIST_PAGES {
        // A key prefix narrows the listing itself; every other filter reads metadata.
        let prefix = format!("{OP_PREFIX}{}", query.prefix.as_deref().unwrap_or(""));
        let page = list_page(&kv, &prefix, resume.cursor.clone()).await?;
        for entry in &page.keys {
            if resume.already_done(&entry.name) {
                continue;
            }
            if found.len() == query.limit {
                return ok_json(
                    &json!({"operations": found, "cursor": encode_cursor(&resume), "complete": false}),
                );
            }
            resume.after_key = Some(entry.name.clone());
            let Some(meta) = entry
                .metadata
                .clone()
                .and_then(|m| serde_json::from_value::<LedgerMeta>(m).ok())
            else {
                continue;
            };
            let key = &entry.name[OP_PREFIX.len()..];
            if query.matches(&meta, now_secs, config.stuck_after_secs)
                && query.matches_key(key, &meta)
            {
                found.push(entry_view(key, &meta, now_secs, config));
            }
        }
        if page.list_complete || page.cursor.is_none() {
            return ok_json(&json!({"operations": found, "cursor": null, "complete": true}));
        }
        resume = Resume {
            cursor: page.cursor.clone(),
            after_key: None,
        };
    }
    ok_json(&json!({"operations": found, "cursor": encode_cursor(&resume), "complete": false}))
}

fn entry_view(key: &str, meta: &LedgerMeta, now_secs: i64, config: &Config) -> Value {
    let terminal = meta.status.is_terminal();
    json!({
        "key": key,
        "name": meta.name,
        "kind": meta.kind,
        "status": meta.status,
        "settled_by": meta.settled_by,
        "effect_done": meta.effect_done,
        "effect_parked": meta.parked,
        "forgotten": meta.forgotten,
        "submitted_at": format_rfc3339(meta.submitted_at * 1_000),
        "settled_at": meta.settled_at.map(|s| format_rfc3339(s * 1_000)),
        "age_seconds": now_secs - meta.submitted_at,
        "stuck": !terminal && !meta.forgotten && now_secs - meta.submitted_at >= config.stuck_after_secs,
        "alerts": meta.alerts,
        "destination": config.destination_label(meta.kind.as_deref()),
        "error": meta.error,
        "effect_latency_ms": meta.effect_ms,
    })
}
