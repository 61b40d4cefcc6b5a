//! The Worker: routes requests, reads the clock and the environment, and hands everything
//! that decides to the pure core and the OperationGate.
//!
//! Guarantees: every failure becomes an [`EdgeError`], mapped to an HTTP status in exactly one
//! place ([`EdgeError::into_response`]); the sender never sees internal detail; missing or
//! malformed configuration answers 503 naming the variable, on every route, so Gemini keeps
//! retrying while an operator fixes it; every log line is one JSON object and holds no secret.

mod admin_api;
mod dynamic_webhook;
mod gate_object;
mod lease_object;
mod ledger_kv;
mod outbound;
mod reconcile_pass;
mod stats;
mod webhook;

pub use gate_object::OperationGate;
pub use lease_object::ReconcileLease;
pub use stats::StatsShard;

use serde_json::{json, Value};
use worker::{event, Context, Env, Method, Request, Response, Result};

use crate::config::{Config, ConfigError};
use crate::gate_protocol::{GateCommand, GateReply};

/// The operator's dashboard: plain HTML, no build step, no data of its own.
const DASHBOARD: &str = include_str!("dashboard.html");

/// The Durable Object binding.
pub const GATE_BINDING: &str = "OPERATION_GATE";

/// Everything that can end a request early, with what the client may see.
#[derive(Debug)]
pub enum EdgeError {
    Config(ConfigError),
    Unauthorized,
    TooLarge,
    BadRequest(String),
    NotFound,
    MethodNotAllowed,
    /// The delivery could not be made durable; the sender should retry.
    Unavailable(String),
}

impl EdgeError {
    /// The one mapping from failure to HTTP answer.
    pub fn into_response(self) -> Result<Response> {
        let (status, body) = match self {
            EdgeError::Config(e) => (
                503,
                json!({"error": "not configured", "variable": e.var, "problem": e.to_string()}),
            ),
            EdgeError::Unauthorized => (401, json!({"error": "unauthorized"})),
            EdgeError::TooLarge => (413, json!({"error": "body too large"})),
            EdgeError::BadRequest(why) => (400, json!({"error": why})),
            EdgeError::NotFound => (404, json!({"error": "not found"})),
            EdgeError::MethodNotAllowed => (405, json!({"error": "method not allowed"})),
            EdgeError::Unavailable(why) => {
                log(json!({"event": "unavailable", "error": why}));
                (503, json!({"error": "temporarily unavailable, retry"}))
            }
        };
        Ok(Response::from_json(&body)?.with_status(status))
    }
}

/// Writes one structured log line.
pub fn log(line: Value) {
    worker::console_log!("{}", line);
}

/// The clock, read once per request at the edge and passed in.
pub fn now_ms() -> i64 {
    worker::Date::now().as_millis() as i64
}

/// A random number in [0, 1), for backoff jitter.
pub fn random_unit() -> f64 {
    let mut bytes = [0u8; 4];
    match getrandom::fill(&mut bytes) {
        Ok(()) => f64::from(u32::from_le_bytes(bytes)) / (f64::from(u32::MAX) + 1.0),
        Err(_) => 0.5,
    }
}

/// Reads the configuration from vars and secrets.
pub fn load_config(env: &Env) -> std::result::Result<Config, ConfigError> {
    Config::from_lookup(|name| env.var(name).ok().map(|v| v.to_string()))
}

/// The stub of the Durable Object named `name` in namespace `binding`.
pub fn stub_for(env: &Env, binding: &str, name: &str) -> std::result::Result<worker::Stub, String> {
    env.durable_object(binding)
        .and_then(|ns| ns.id_from_name(name)?.get_stub())
        .map_err(|e| format!("{binding} binding: {e}"))
}

/// Sends a command to the gate of `key` and returns its reply.
pub async fn call_gate(
    env: &Env,
    key: &str,
    command: &GateCommand,
) -> std::result::Result<GateReply, String> {
    post_json(&stub_for(env, GATE_BINDING, key)?, command).await
}

/// POSTs `command` as JSON to a Durable Object and decodes its JSON reply.
pub async fn post_json<C: serde::Serialize, R: serde::de::DeserializeOwned>(
    stub: &worker::Stub,
    command: &C,
) -> std::result::Result<R, String> {
    let body = serde_json::to_string(command).map_err(|e| e.to_string())?;
    let mut init = worker::RequestInit::new();
    init.with_method(Method::Post)
        .with_body(Some(worker::wasm_bindgen::JsValue::from_str(&body)));
    let request =
        Request::new_with_init("https://object/command", &init).map_err(|e| e.to_string())?;
    let mut response = stub
        .fetch_with_request(request)
        .await
        .map_err(|e| format!("object call: {e}"))?;
    if response.status_code() != 200 {
        let text = response.text().await.unwrap_or_default();
        return Err(format!(
            "object answered {}: {text}",
            response.status_code()
        ));
    }
    response
        .json()
        .await
        .map_err(|e| format!("object reply: {e}"))
}

#[event(start)]
fn start() {
    console_error_panic_hook::set_once();
}

#[event(fetch)]
async fn fetch(req: Request, env: Env, ctx: Context) -> Result<Response> {
    let answer = match route(req, &env).await {
        Ok(response) => Ok(response),
        Err(e) => e.into_response(),
    };
    stats::flush_rejected_later(&env, &ctx, now_ms());
    answer
}

#[event(scheduled)]
async fn scheduled(_event: worker::ScheduledEvent, env: Env, _ctx: worker::ScheduleContext) {
    // The runtime discards this handler's result: every error is logged here or below.
    match load_config(&env) {
        Ok(config) => {
            reconcile_pass::run(&env, &config).await;
        }
        Err(e) => log(json!({"event": "reconcile_error", "error": format!("configuration: {e}")})),
    }
}

async fn route(req: Request, env: &Env) -> std::result::Result<Response, EdgeError> {
    let path = req.path();
    let method = req.method();
    if path == "/healthz" {
        return match method {
            Method::Get | Method::Head => {
                load_config(env).map_err(EdgeError::Config)?;
                ok_json(&json!({"ok": true}))
            }
            _ => Err(EdgeError::MethodNotAllowed),
        };
    }
    if path == "/dashboard" {
        // A static page holding no data; it calls the admin API with the operator's token.
        return match method {
            Method::Get => {
                let headers = worker::Headers::new();
                let set = |k: &str, v: &str| {
                    headers
                        .set(k, v)
                        .map_err(|e| EdgeError::Unavailable(e.to_string()))
                };
                set("content-type", "text/html; charset=utf-8")?;
                set(
                    "content-security-policy",
                    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; form-action 'none'; frame-ancestors 'none'",
                )?;
                set("cache-control", "no-store")?;
                Ok(Response::ok(DASHBOARD)
                    .map_err(|e| EdgeError::Unavailable(e.to_string()))?
                    .with_headers(headers))
            }
            _ => Err(EdgeError::MethodNotAllowed),
        };
    }
    let config = load_config(env).map_err(EdgeError::Config)?;
    match (path.as_str(), method) {
        ("/webhooks/gemini", Method::Post) => webhook::receive(req, env, &config).await,
        ("/webhooks/gemini", _) => Err(EdgeError::MethodNotAllowed),
        (p, m) if p.starts_with("/v1/") => admin_api::handle(req, m, env, &config).await,
        _ => Err(EdgeError::NotFound),
    }
}

/// A 200 JSON answer.
pub fn ok_json(body: &Value) -> std::result::Result<Response, EdgeError> {
    json_response(body, 200)
}

/// A JSON answer with `status`.
pub fn json_response(body: &Value, status: u16) -> std::result::Result<Response, EdgeError> {
    Response::from_json(body)
        .map(|r| r.with_status(status))
        .map_err(|e| EdgeError::Unavailable(e.to_string()))
}
