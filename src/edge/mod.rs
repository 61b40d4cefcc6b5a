//! The Worker: routes requests, reads the clock and the environment, and hands everything
//! that decides to the pure core and the OperationGate.
//!
//! Guarantees: every failure becomes an [`EdgeError`], mapped to an HTTP status in exactly one
//! place ([`EdgeError::into_response`]); the sender never sees internal detail; missing or
//! malformed configuration answers 503 naming the variable, on every route, so Gemini keeps
//! retrying while an operator fixes it; every log line is one JSON object and holds no secret.

// Grouped on disk by role: HTTP routes (`http/`), the Durable Objects (`objects/`), calls
// that leave the worker (`outbound/`), the cron pass, and the capped reading of streams from
// outside that routes and outbound calls share.
mod capped_read;
mod http;
mod objects;
mod outbound;
mod reconcile_pass;

pub use http::error::EdgeError;
pub use objects::gate_object::OperationGate;
pub use objects::lease_object::ReconcileLease;
pub use objects::stats_shard::StatsShard;

use std::rc::Rc;

use serde_json::{json, Value};
use worker::wasm_bindgen::{JsCast, JsValue};
use worker::wasm_bindgen_futures::JsFuture;
use worker::{event, js_sys, web_sys, Context, Env, Method, Request, Response, Result};

use crate::config::{Config, ConfigError};
use crate::operation::gate_protocol::{GateCommand, GateReply};
use crate::telemetry::worker_log::WorkerLog;

/// The operator's dashboard: plain HTML, no build step, no data of its own.
const DASHBOARD: &str = include_str!("http/dashboard.html");

/// The Durable Object binding.
pub const GATE_BINDING: &str = "OPERATION_GATE";

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

thread_local! {
    /// The parsed configuration of this isolate. Vars and secrets cannot change while an
    /// isolate lives (changing them deploys a new one), so it is parsed once; an error is not
    /// kept, so every request reports it until the operator fixes it.
    static CONFIG: std::cell::OnceCell<Rc<Config>> = const { std::cell::OnceCell::new() };
}

/// The configuration from vars and secrets, parsed once per isolate (see `CONFIG`): parsing
/// it on every request would be a large share of the cheapest request's CPU
/// (docs/PERFORMANCE.md, "Why the hot path is built as it is").
pub fn load_config(env: &Env) -> std::result::Result<Rc<Config>, ConfigError> {
    CONFIG.with(|cell| {
        if let Some(config) = cell.get() {
            return Ok(config.clone());
        }
        let config = Config::from_lookup(|name| env.var(name).ok().map(|v| v.to_string()))?;
        for warning in config.warnings() {
            log(WorkerLog::ConfigWarning {
                warning: warning.to_string(),
            }
            .to_value());
        }
        Ok(cell.get_or_init(|| Rc::new(config)).clone())
    })
}

/// A Durable Object stub, as the runtime hands it out.
pub type ObjectStub = worker::worker_sys::DurableObject;

/// The stub of the Durable Object named `name` in namespace `binding`. Uses the runtime's
/// `getByName` directly: one call where worker-rs makes two.
pub fn stub_for(
    env: &Env,
    binding: &str,
    name: &str,
) -> std::result::Result<ObjectStub, EdgeError> {
    let namespace = js_sys::Reflect::get(env, &JsValue::from_str(binding))
        .ok()
        .filter(|ns| !ns.is_undefined())
        .ok_or_else(|| EdgeError::Unavailable(format!("{binding} binding: not bound")))?
        .unchecked_into::<worker::worker_sys::DurableObjectNamespace>();
    namespace
        .get_by_name(name)
        .map_err(|e| EdgeError::Unavailable(format!("{binding} binding: {}", js_error(&e))))
}

/// A JS exception as text.
pub fn js_error(e: &JsValue) -> String {
    e.as_string()
        .or_else(|| {
            e.dyn_ref::<js_sys::Error>()
                .map(|e| String::from(e.message()))
        })
        .unwrap_or_else(|| format!("{e:?}"))
}

/// Sends a command to the gate of `key` and returns its reply.
pub async fn call_gate(
    env: &Env,
    key: &str,
    command: &GateCommand,
) -> std::result::Result<GateReply, EdgeError> {
    post_json(&stub_for(env, GATE_BINDING, key)?, command).await
}

/// POSTs `command` as JSON to a Durable Object and decodes its JSON reply. The reply is read
/// with the runtime's own `text()`: worker-rs reads a fetched body chunk by chunk through a
/// stream reader, a measurable share of a duplicate delivery's time (docs/PERFORMANCE.md).
pub async fn post_json<C: serde::Serialize, R: serde::de::DeserializeOwned>(
    stub: &ObjectStub,
    command: &C,
) -> std::result::Result<R, EdgeError> {
    let body = serde_json::to_string(command).map_err(|e| EdgeError::Unavailable(e.to_string()))?;
    let init = web_sys::RequestInit::new();
    init.set_method("POST");
    init.set_body(&JsValue::from_str(&body));
    let request = web_sys::Request::new_with_str_and_init("https://object/command", &init)
        .map_err(|e| EdgeError::Unavailable(format!("object call: {}", js_error(&e))))?;
    let call = async {
        let promise = stub.fetch_with_request(&request)?;
        let response: web_sys::Response = JsFuture::from(promise).await?.unchecked_into();
        let text = JsFuture::from(response.text()?).await?;
        Ok::<_, JsValue>((response.status(), text.as_string().unwrap_or_default()))
    };
    let (status, text) = call
        .await
        .map_err(|e| EdgeError::Unavailable(format!("object call: {}", js_error(&e))))?;
    if status != 200 {
        return Err(EdgeError::Unavailable(format!(
            "object answered {status}: {text}"
        )));
    }
    serde_json::from_str(&text).map_err(|e| EdgeError::Unavailable(format!("object reply: {e}")))
}

#[event(start)]
fn start() {
    console_error_panic_hook::set_once();
}

/// Takes the runtime's request as it is: worker-rs's own `Request` reads `request.cf` on
/// creation, a measurable share of the cheapest request (docs/PERFORMANCE.md); only the admin
/// API, which needs its helpers, pays it.
#[event(fetch)]
async fn fetch(req: web_sys::Request, env: Env, ctx: Context) -> Result<web_sys::Response> {
    let answer = match route(req, &env).await {
        Ok(response) => Ok(response),
        Err(e) => e.into_raw(),
    };
    let flush_ms = load_config(&env).map_or(10_000, |c| c.stats_flush_secs * 1_000);
    objects::stats_shard::flush_edge_counts_later(&env, &ctx, now_ms(), flush_ms);
    answer
}

#[event(scheduled)]
async fn scheduled(_event: worker::ScheduledEvent, env: Env, _ctx: worker::ScheduleContext) {
    // The runtime discards this handler's result: every error is logged here or below.
    match load_config(&env) {
        Ok(config) => {
            reconcile_pass::run(&env, &config).await;
        }
        Err(e) => log(WorkerLog::ReconcileError {
            error: format!("configuration: {e}"),
        }
        .to_value()),
    }
}

/// The fan-out queue's consumer: polls the open operations a pass scheduled on it.
#[event(queue)]
async fn queue(batch: worker::MessageBatch<JsValue>, env: Env, _ctx: Context) -> Result<()> {
    match load_config(&env) {
        Ok(config) => reconcile_pass::consume(batch, &env, &config).await,
        Err(e) => {
            log(WorkerLog::ReconcileError {
                error: format!("configuration: {e}"),
            }
            .to_value());
            // Delivered again later (the queue's retries), when the configuration may be fixed.
            batch.retry_all();
        }
    }
    Ok(())
}

/// Routes a request; the answer is the runtime's own `Response` (see
/// [`http::raw_response`]).
async fn route(
    req: web_sys::Request,
    env: &Env,
) -> std::result::Result<web_sys::Response, EdgeError> {
    let path = path_of(&req.url());
    let method = Method::from(req.method());
    if path == "/healthz" {
        return match method {
            Method::Get | Method::Head => {
                let config = load_config(env).map_err(EdgeError::Config)?;
                let warnings = config.warnings();
                if warnings.is_empty() {
                    http::raw_response::json_text(200, r#"{"ok":true}"#, None)
                } else {
                    http::raw_response::json(200, &json!({"ok": true, "warnings": warnings}))
                }
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
                    .with_headers(headers)
                    .into())
            }
            _ => Err(EdgeError::MethodNotAllowed),
        };
    }
    let config = load_config(env).map_err(EdgeError::Config)?;
    match (path.as_str(), method) {
        ("/webhooks/gemini", Method::Post) => http::webhook::receive(req, env, &config).await,
        ("/webhooks/gemini", _) => Err(EdgeError::MethodNotAllowed),
        (p, m) if p.starts_with("/v1/") => {
            http::admin_api::handle(Request::from(req), m, env, &config)
                .await
                .map(web_sys::Response::from)
        }
        _ => Err(EdgeError::NotFound),
    }
}

/// The path of a URL as the runtime serializes it (WHATWG: already normalized, never an
/// empty path after the host, `?` and `#` only where they start the query and fragment).
fn path_of(url: &str) -> String {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[after_scheme..];
    let path = rest.find('/').map_or("/", |i| &rest[i..]);
    path[..path.find(['?', '#']).unwrap_or(path.len())].to_string()
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
