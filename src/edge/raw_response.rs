//! JSON answers built as the runtime's own `Response`, for the paths every request takes.
//!
//! Guarantees: the same status, body and headers as worker-rs's `Response::from_json` (a JSON
//! body with `content-type: application/json`, and `retry-after` when given), for a fraction
//! of the calls across the wasm boundary: one init object, its status, a headers object this
//! isolate builds once, and the constructor. Building the answer through worker-rs's
//! `Response` is a measurable share of the cheapest request (docs/PERFORMANCE.md).

use worker::js_sys::{Object, Reflect};
use worker::web_sys;

use crate::edge::runtime::js_error;

thread_local! {
    /// `{"content-type": "application/json"}`: the runtime copies it into each answer.
    static JSON_HEADERS: Object = headers(None);
}

fn headers(retry_after: Option<u32>) -> Object {
    let headers = Object::new();
    let set = |name: &str, value: &str| {
        let _ = Reflect::set(&headers, &name.into(), &value.into());
    };
    set("content-type", "application/json");
    if let Some(secs) = retry_after {
        set("retry-after", &secs.to_string());
    }
    headers
}

/// An answer with `status` and the JSON text `body`; `retry_after` adds that header.
pub fn json_text(
    status: u16,
    body: &str,
    retry_after: Option<u32>,
) -> worker::Result<web_sys::Response> {
    let init = web_sys::ResponseInit::new();
    init.set_status(status);
    match retry_after {
        None => JSON_HEADERS.with(|h| init.set_headers(h)),
        Some(_) => init.set_headers(&headers(retry_after)),
    }
    web_sys::Response::new_with_opt_str_and_init(Some(body), &init)
        .map_err(|e| worker::Error::RustError(format!("answer: {}", js_error(&e))))
}

/// An answer with `status` and `body` serialized as JSON.
pub fn json<T: serde::Serialize>(status: u16, body: &T) -> worker::Result<web_sys::Response> {
    let text = serde_json::to_string(body).map_err(|e| worker::Error::RustError(e.to_string()))?;
    json_text(status, &text, None)
}
