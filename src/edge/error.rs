//! The edge's face of a [`Refusal`]: its one mapping to an HTTP response, and the runtime's
//! failures as refusals.
//!
//! Guarantees: every failure at the edge is a [`Refusal`] (the pure core's: its status, body
//! and log face are decided there), answered by [`Refusal::into_response`] or
//! [`Refusal::into_raw`] and nowhere else; the detail of an upstream failure
//! ([`Refusal::Unavailable`]) is logged here, once, and never sent.

use worker::{Headers, Response};

use crate::refusal::Refusal;
use crate::telemetry::worker_log::WorkerLog;

use crate::edge::raw_response;
use crate::edge::runtime::log;

impl Refusal {
    /// The client face (status, body and the `Retry-After` seconds, if any); the log face of
    /// an unavailable peer or store is logged here.
    fn client_face(&self) -> (u16, serde_json::Value, Option<u32>) {
        if let Refusal::Unavailable(detail) = self {
            log(WorkerLog::Unavailable {
                error: detail.clone(),
                key: None,
                bulk: None,
            }
            .to_value());
        }
        (self.status(), self.body(), self.retry_after())
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

/// A runtime failure (storage, a binding, serialization) is ours, and worth retrying.
impl From<worker::Error> for Refusal {
    fn from(e: worker::Error) -> Self {
        Refusal::Unavailable(e.to_string())
    }
}

/// A KV failure (an outage, a spent quota): the gate stays the truth; worth retrying.
impl From<worker::kv::KvError> for Refusal {
    fn from(e: worker::kv::KvError) -> Self {
        Refusal::Unavailable(format!("KV: {e:?}"))
    }
}
