//! The Worker: routes requests, reads the clock and the environment, and hands everything
//! that decides to the pure core and the OperationGate.
//!
//! Guarantees: every failure becomes a [`crate::refusal::Refusal`], whose status the pure
//! core decides and `error.rs` answers in one place; the sender never sees internal detail;
//! missing or malformed configuration answers 503 naming the variable, on every route, so
//! Gemini keeps retrying while an operator fixes it; every log line is one JSON object and
//! holds no secret.
//!
//! This file is the router and nothing else: the runtime's events and the table of routes.
//! Nothing in the edge imports from it; what the rooms share lives in modules named for it
//! (`runtime.rs`: clock, randomness, configuration, log; `objects/call.rs`: calls to a
//! Durable Object; `error.rs`: a refusal's response; `raw_response.rs`: the runtime's own
//! answers).

mod capped_read;
mod error;
mod http;
mod objects;
mod outbound;
mod pass_runner;
mod raw_response;
mod runtime;

pub use objects::destination_desk::DestinationDesk;
pub use objects::gate::OperationGate;
pub use objects::lease_object::ReconcileLease;
pub use objects::result_sender::ResultSender;
pub use objects::retired_shard::RetiredNames;
pub use objects::stats_shard::StatsShard;
pub use objects::stranger_watch::StrangerWatch;

use worker::wasm_bindgen::JsValue;
use worker::{event, web_sys, Context, Env, Method, Request, Result};

use crate::refusal::Refusal;
use crate::telemetry::worker_log::WorkerLog;

use runtime::{load_config, log, now_ms};

#[event(start)]
fn start() {
    console_error_panic_hook::set_once();
}

/// Takes the runtime's request as it is: worker-rs's own `Request` reads `request.cf` on
/// creation, a measurable share of the cheapest request (docs/PERFORMANCE.md); only the admin
/// API, which needs its helpers, pays it.
#[event(fetch)]
async fn fetch(req: web_sys::Request, env: Env, ctx: Context) -> Result<web_sys::Response> {
    let answer = route(req, &env).await.or_else(Refusal::into_raw);
    let flush_ms = load_config(&env).map_or(10_000, |c| c.stats_flush_secs * 1_000);
    objects::stats_shard::flush_edge_counts_later(&env, &ctx, now_ms(), flush_ms);
    answer
}

#[event(scheduled)]
async fn scheduled(_event: worker::ScheduledEvent, env: Env, _ctx: worker::ScheduleContext) {
    // The runtime discards this handler's result: every error is logged here or below.
    match load_config(&env) {
        Ok(config) => {
            pass_runner::run(&env, &config).await;
            objects::stats_shard::flush_edge_counts_now(&env, now_ms()).await;
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
        Ok(config) => {
            pass_runner::consume(batch, &env, &config).await;
            objects::stats_shard::flush_edge_counts_now(&env, now_ms()).await;
        }
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
/// `raw_response.rs`).
async fn route(
    req: web_sys::Request,
    env: &Env,
) -> std::result::Result<web_sys::Response, Refusal> {
    let path = path_of(&req.url());
    let method = Method::from(req.method());
    // Answered before the configuration is read: `/healthz` reads it itself, and the
    // dashboard (a static page holding no data) needs none.
    match (path.as_str(), &method) {
        ("/healthz", Method::Get | Method::Head) => return http::health::answer(env),
        ("/dashboard", Method::Get) => return http::dashboard::page(),
        ("/healthz" | "/dashboard", _) => return Err(Refusal::MethodNotAllowed),
        _ => {}
    }
    let config = load_config(env).map_err(Refusal::Config)?;
    match (path.as_str(), method) {
        ("/webhooks/gemini", Method::Post) => http::webhook::receive(req, env, &config).await,
        ("/webhooks/gemini", _) => Err(Refusal::MethodNotAllowed),
        (p, m) if p.starts_with("/v1/") || p == http::admin_api::METRICS => {
            http::admin_api::handle(Request::from(req), m, env, &config)
                .await
                .map(web_sys::Response::from)
        }
        _ => Err(Refusal::NotFound),
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
