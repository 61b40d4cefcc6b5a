//! The admin API under `/v1/`, and `/metrics` (the same counters for a Prometheus scraper),
//! behind `Authorization: Bearer <token>` of a scope that may make the request
//! (`ADMIN_TOKEN`, `REGISTER_TOKENS`, `READ_TOKENS`; [`crate::operator::access`]).
//!
//! Guarantees: the token and its scope are checked (constant time) before anything else is
//! read: an unknown token is 401, a known one of the wrong scope 403 naming the scope it
//! needs; a request body (the bulk routes' too) is held to a cap (`admin_body.rs`); every change
//! goes through the operation's gate (register, retry, redeliver, forget, repair, settle; one
//! at a time, `one_operation.rs`, or in bulk, `bulk.rs`) or a destination's desk (a pause by
//! hand and its resume, `destinations.rs`), carrying who asked (scope and fingerprint) into its
//! history row and log line, and every action request is logged with it (`admin_action`);
//! listing and search read the ledger's metadata only (`listing.rs`); `/v1/config` shows no
//! secret.

use serde_json::json;
use worker::{Env, Method, Request, Response};

use crate::config::Config;
use crate::operation::gate::protocol::{GateCommand, GateReply};
use crate::operation::KindFill;
use crate::operator::access::{Admission, Caller, Route};
use crate::operator::listing::parse_registration;
use crate::refusal::Refusal;
use crate::telemetry::worker_log::{ScopeRefused, WorkerLog};

use crate::edge::http::json_answer::{json_response, ok_json};
use crate::edge::http::{admin_body, listing, metrics, one_operation};
use crate::edge::objects::call::call_gate;
use crate::edge::objects::{call, stats_shard};
use crate::edge::runtime::log;

const OPERATIONS: &str = "/v1/operations";
/// The Prometheus route: the same counters as `/v1/stats`, as exposition text.
pub const METRICS: &str = "/metrics";

pub async fn handle(
    req: Request,
    method: Method,
    env: &Env,
    config: &Config,
) -> Result<Response, Refusal> {
    let auth = req.headers().get("authorization").ok().flatten();
    let path = req.path();
    let caller = match config.tokens.admit(auth.as_deref(), method.as_ref(), &path) {
        Admission::Admitted(caller) => caller,
        Admission::Unknown => {
            return Err(rejected("admin_unauthorized", None, Refusal::Unauthorized))
        }
        Admission::Forbidden { caller, needs } => {
            let scope = ScopeRefused {
                method: method.to_string(),
                path,
                needs: needs.as_str(),
                by: json!(caller.actor()),
            };
            let refusal = Refusal::Forbidden {
                scope: caller.scope,
                needs,
            };
            return Err(rejected("admin_forbidden", Some(scope), refusal));
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
                .map_or_else(Refusal::status, Response::status_code),
            by: json!(caller.actor()),
        }
        .to_value());
    }
    answer
}

/// Counts a refused request, logging it for the first of its reason in a flush window.
fn rejected(reason: &'static str, scope: Option<ScopeRefused>, refusal: Refusal) -> Refusal {
    if stats_shard::count_rejected(reason) {
        log(WorkerLog::Rejected { reason, scope }.to_value());
    }
    refusal
}

/// A request the caller's scope may make.
async fn serve(
    mut req: Request,
    method: Method,
    path: &str,
    env: &Env,
    config: &Config,
    caller: &Caller,
) -> Result<Response, Refusal> {
    let by = caller.actor();
    if let Some(action) = path.strip_prefix("/v1/bulk/") {
        return super::bulk::handle(&mut req, method, action, env, config, by).await;
    }
    if let Some(rest) = path.strip_prefix("/v1/destinations/") {
        return super::destinations::serve(&mut req, method, rest, env, config, by).await;
    }
    let read_only = matches!(path, "/v1/whoami" | "/v1/stats" | METRICS | "/v1/config");
    if read_only && method != Method::Get {
        return Err(Refusal::MethodNotAllowed);
    }
    if path == "/v1/whoami" {
        // The caller's own scope and fingerprint: the dashboard shows actions to admin only.
        return ok_json(&json!({"scope": caller.scope, "fingerprint": caller.fingerprint}));
    }
    if path == "/v1/stats" || path == METRICS {
        let mut stats = stats_shard::read(env, config.gemini_webhook_name.as_deref()).await?;
        stats["destinations"] = call::destinations_health(env, config).await;
        if path == METRICS {
            return metrics::answer(&req, &stats);
        }
        return ok_json(&stats);
    }
    if path == "/v1/config" {
        // Names and non-secret values only (secrets are "set" / "not set"), and the warnings.
        return ok_json(&config.public_view());
    }
    let Some(rest) = path.strip_prefix(OPERATIONS) else {
        return Err(Refusal::NotFound);
    };
    if !rest.is_empty() && !rest.starts_with('/') {
        return Err(Refusal::NotFound);
    }
    let rest = rest.trim_start_matches('/');
    if rest.is_empty() {
        return match method {
            Method::Post => register(&mut req, env, config, caller).await,
            Method::Get => listing::list(&req, env, config).await,
            _ => Err(Refusal::MethodNotAllowed),
        };
    }
    one_operation::serve(&mut req, method, rest, env, by).await
}

async fn register(
    req: &mut Request,
    env: &Env,
    config: &Config,
    caller: &Caller,
) -> Result<Response, Refusal> {
    let body = admin_body::read_body(req).await?;
    let reg = parse_registration(&body).map_err(|e| Refusal::BadRequest(e.to_string()))?;
    let command = GateCommand::Register {
        key: reg.key.key.clone(),
        name: reg.key.name.clone(),
        results: reg.results_or_default(&config.results.each_kinds),
        kind: reg.kind,
        user_metadata: reg.user_metadata,
        by: Some(caller.actor()),
    };
    match call_gate(env, &reg.key.key, &command).await? {
        GateReply::Created { operation } => {
            let (key, by) = (reg.key.key.clone(), json!(caller.actor()));
            log(WorkerLog::Registered { key, by }.to_value());
            json_response(&operation, 201)
        }
        GateReply::Exists {
            mut operation,
            kind,
        } => {
            // A registration after the completion fills in the kind; it never replaces one.
            operation["kind_change"] = json!(kind);
            if kind == KindFill::TooLate {
                operation["note"] = json!("a side-effect attempt already went out without a kind; its webhook-id keeps that body, so the kind stays unset");
            }
            ok_json(&operation)
        }
        // Nothing changed: the answer shows what is recorded, so the caller can tell.
        GateReply::Conflict { operation, fields } => json_response(
            &json!({"error": "conflict", "conflicts": fields, "operation": operation}),
            409,
        ),
        GateReply::Retired { operation } => {
            json_response(&json!({"error": "retired", "operation": operation}), 409)
        }
        other => Err(Refusal::unexpected("gate", &other)),
    }
}
