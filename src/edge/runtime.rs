//! What the edge reads from the runtime: the clock (and a deadline on it), randomness, the
//! configuration from vars and secrets, the log, and a JS exception as text.
//!
//! Guarantees: the clock and randomness are read here and passed into the pure core as
//! values, never read by it; the configuration is parsed once per isolate and an error is
//! never kept, so every request reports it until an operator fixes it; every log line is one
//! JSON object.

use std::rc::Rc;
use std::time::Duration;

use futures_util::future::{select, Either};
use serde_json::Value;
use worker::wasm_bindgen::{JsCast, JsValue};
use worker::{js_sys, Delay, Env};

use crate::config::{Config, ConfigError};
use crate::telemetry::worker_log::WorkerLog;

/// Writes one structured log line.
pub fn log(line: Value) {
    worker::console_log!("{}", line);
}

/// The clock, read once per request at the edge and passed in.
pub fn now_ms() -> i64 {
    worker::Date::now().as_millis() as i64
}

/// What `call` ends with, or `None` when `timeout_ms` passed first.
pub async fn within<T>(timeout_ms: i64, call: impl std::future::Future<Output = T>) -> Option<T> {
    let deadline = Delay::from(Duration::from_millis(timeout_ms.max(1) as u64));
    match select(Box::pin(call), Box::pin(deadline)).await {
        Either::Left((answer, _)) => Some(answer),
        Either::Right(_) => None,
    }
}

/// A random number in [0, 1), for backoff jitter.
pub fn random_unit() -> f64 {
    let mut bytes = [0u8; 4];
    getrandom::fill(&mut bytes).map_or(0.5, |()| {
        f64::from(u32::from_le_bytes(bytes)) / (f64::from(u32::MAX) + 1.0)
    })
}

/// Sets a Durable Object's alarm at `at_ms` (ms since the epoch, not an offset).
pub async fn set_alarm(storage: &worker::Storage, at_ms: i64) -> worker::Result<()> {
    let date = js_sys::Date::new(&JsValue::from_f64(at_ms as f64));
    storage.set_alarm(worker::ScheduledTime::new(date)).await
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
            let warning = warning.to_string();
            log(WorkerLog::ConfigWarning { warning }.to_value());
        }
        Ok(cell.get_or_init(|| Rc::new(config)).clone())
    })
}

/// A JS exception as text.
pub fn js_error(e: &JsValue) -> String {
    let message = e
        .dyn_ref::<js_sys::Error>()
        .map(|e| String::from(e.message()));
    e.as_string()
        .or(message)
        .unwrap_or_else(|| format!("{e:?}"))
}
