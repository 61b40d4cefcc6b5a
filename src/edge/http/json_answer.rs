//! The admin API's JSON answers, as worker-rs `Response`s (the routes that need worker-rs's
//! request helpers answer with its `Response`; the others build the runtime's own, in
//! `edge/raw_response.rs`).
//!
//! Guarantees: a body that cannot be made an answer is [`Refusal::Unavailable`], never a
//! panic.

use serde_json::Value;
use worker::Response;

use crate::refusal::Refusal;

/// A 200 JSON answer.
pub fn ok_json(body: &Value) -> std::result::Result<Response, Refusal> {
    json_response(body, 200)
}

/// A JSON answer with `status`.
pub fn json_response(body: &Value, status: u16) -> std::result::Result<Response, Refusal> {
    Ok(Response::from_json(body)?.with_status(status))
}
