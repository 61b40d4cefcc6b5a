//! The edge's one error type and its one mapping to HTTP.
//!
//! Guarantees (axum's two faces, pingora's classification): every failure at the edge is an
//! [`EdgeError`], answered by [`EdgeError::into_response`] and nowhere else. It has a client
//! face (status and a short body: never internal detail, never a secret) and a log face (the
//! detail, logged once when the failure is ours or a peer's); it knows where it came from
//! ([`Origin`]) and whether a retry can help, which for a Gemini delivery decides between a 5xx
//! (Gemini retries) and a 4xx (it would fail again).

use std::fmt;

use serde_json::json;
use worker::{Headers, Response};

use crate::access::{refusal, Scope};
use crate::config::ConfigError;
use crate::telemetry::worker_log::WorkerLog;

use crate::edge::raw_response;
use crate::edge::runtime::log;

/// Where a failure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The caller's request: refused as it stands.
    Downstream,
    /// A peer this worker called (the key-set endpoint, a Durable Object, KV).
    Upstream,
    /// This worker's own configuration or runtime.
    Internal,
}

/// Everything that can end a request early.
#[derive(Debug)]
pub enum EdgeError {
    /// Missing or malformed configuration: 503 naming the variable, so the sender retries
    /// while an operator fixes it.
    Config(ConfigError),
    Unauthorized,
    /// A known token whose scope (`scope`) may not make the request: it `needs` another.
    Forbidden {
        scope: Scope,
        needs: Scope,
    },
    TooLarge,
    /// Malformed input; the text says what is wrong (no internal detail).
    BadRequest(String),
    NotFound,
    MethodNotAllowed,
    /// The command does not apply to the resource as it stands; the text says why.
    Conflict(String),
    /// What the request means could not be made durable (storage, an object, KV): the text
    /// is logged, the sender sees only "retry".
    Unavailable(String),
    /// A check cannot be made right now (a key set that cannot be refreshed): retry after
    /// this many seconds.
    RetryLater(u32),
}

impl EdgeError {
    /// Where the failure came from.
    pub fn origin(&self) -> Origin {
        match self {
            EdgeError::Config(_) => Origin::Internal,
            EdgeError::Unavailable(_) | EdgeError::RetryLater(_) => Origin::Upstream,
            _ => Origin::Downstream,
        }
    }

    /// Whether the same request could succeed later (answered 5xx, so a sender retries).
    pub fn retry_helps(&self) -> bool {
        self.origin() != Origin::Downstream
    }

    /// The HTTP status it is answered with.
    pub fn status(&self) -> u16 {
        match self {
            EdgeError::Config(_) | EdgeError::Unavailable(_) | EdgeError::RetryLater(_) => 503,
            EdgeError::Unauthorized => 401,
            EdgeError::Forbidden { .. } => 403,
            EdgeError::TooLarge => 413,
            EdgeError::BadRequest(_) => 400,
            EdgeError::NotFound => 404,
            EdgeError::MethodNotAllowed => 405,
            EdgeError::Conflict(_) => 409,
        }
    }

    /// The one mapping from failure to HTTP answer: the client face (status, body and the
    /// `Retry-After` seconds, if any); the log face of an upstream or internal failure is
    /// logged here.
    fn client_face(&self) -> (u16, serde_json::Value, Option<u32>) {
        if let EdgeError::Unavailable(detail) = self {
            log(WorkerLog::Unavailable {
                error: detail.clone(),
                key: None,
                bulk: None,
            }
            .to_value());
        }
        let status = self.status();
        let body = match self {
            EdgeError::Config(e) => {
                json!({"error": "not configured", "variable": e.var, "problem": e.to_string()})
            }
            EdgeError::Unauthorized => json!({"error": "unauthorized"}),
            EdgeError::Forbidden { scope, needs } => {
                json!({"error": refusal(*scope, *needs), "scope": scope, "needs": needs})
            }
            EdgeError::TooLarge => json!({"error": "body too large"}),
            EdgeError::BadRequest(why) => json!({"error": why}),
            EdgeError::NotFound => json!({"error": "not found"}),
            EdgeError::MethodNotAllowed => json!({"error": "method not allowed"}),
            EdgeError::Conflict(why) => json!({"error": why}),
            EdgeError::Unavailable(_) => json!({"error": "temporarily unavailable, retry"}),
            EdgeError::RetryLater(secs) => {
                json!({"error": "temporarily unavailable, retry", "retry_after": secs})
            }
        };
        debug_assert_eq!(status >= 500, self.retry_helps());
        let retry_after = match self {
            EdgeError::RetryLater(secs) => Some(*secs),
            _ => None,
        };
        (status, body, retry_after)
    }

    /// The answer as worker-rs's `Response` (the Durable Objects' handlers return those).
    pub fn into_response(self) -> worker::Result<Response> {
        let (status, body, retry_after) = self.client_face();
        let response = Response::from_json(&body)?.with_status(status);
        Ok(match retry_after {
            Some(secs) => {
                let headers = Headers::new();
                headers.set("content-type", "application/json")?;
                headers.set("retry-after", &secs.to_string())?;
                response.with_headers(headers)
            }
            None => response,
        })
    }

    /// The answer as the runtime's own `Response`: the worker's routes, where every request
    /// pays for building it (`edge/raw_response.rs`).
    pub fn into_raw(self) -> worker::Result<worker::web_sys::Response> {
        let (status, body, retry_after) = self.client_face();
        raw_response::json_text(status, &body.to_string(), retry_after)
    }
}

/// The log face.
impl fmt::Display for EdgeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EdgeError::Config(e) => write!(f, "configuration: {e}"),
            EdgeError::Unauthorized => f.write_str("unauthorized"),
            EdgeError::Forbidden { scope, needs } => f.write_str(&refusal(*scope, *needs)),
            EdgeError::TooLarge => f.write_str("body too large"),
            EdgeError::BadRequest(why) => write!(f, "bad request: {why}"),
            EdgeError::NotFound => f.write_str("not found"),
            EdgeError::MethodNotAllowed => f.write_str("method not allowed"),
            EdgeError::Conflict(why) => write!(f, "conflict: {why}"),
            EdgeError::Unavailable(detail) => f.write_str(detail),
            EdgeError::RetryLater(secs) => write!(f, "retry after {secs} s"),
        }
    }
}

/// In a log line, an error is its log face.
impl serde::Serialize for EdgeError {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

/// A runtime failure (storage, a binding, serialization) is ours, and worth retrying.
impl From<worker::Error> for EdgeError {
    fn from(e: worker::Error) -> Self {
        EdgeError::Unavailable(e.to_string())
    }
}

/// A KV failure (an outage, a spent quota): the gate stays the truth; worth retrying.
impl From<worker::kv::KvError> for EdgeError {
    fn from(e: worker::kv::KvError) -> Self {
        EdgeError::Unavailable(format!("KV: {e:?}"))
    }
}

impl From<ConfigError> for EdgeError {
    fn from(e: ConfigError) -> Self {
        EdgeError::Config(e)
    }
}
