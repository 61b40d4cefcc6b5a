//! The edge's face of a [`Refusal`]: its one mapping to an HTTP response, and the runtime's
//! failures as refusals.
//!
//! Guarantees: every failure at the edge is a [`Refusal`] (the pure core's: its status, body
//! and log face are decided there), answered by [`Refusal::into_response`] or
//! [`Refusal::into_raw`] and nowhere else; the detail of an upstream failure
//! ([`Refusal::Unavailable`]) is logged here, once, and never sent.

use worker::Response;

use crate::refusal::Refusal;
use crate::telemetry::worker_log::WorkerLog;

use crate::edge::raw_response;
use crate::edge::runtime::log;

impl Refusal {
    /// The answer as the runtime's own `Response`: the worker's routes, where every request
    /// pays for building it (`edge/raw_response.rs`). The log face of an unavailable peer or
    /// store is logged here.
    pub fn into_raw(self) -> worker::Result<worker::web_sys::Response> {
        if let Refusal::Unavailable(detail) = &self {
            log(WorkerLog::Unavailable {
                error: detail.clone(),
                key: None,
                bulk: None,
            }
            .to_value());
        }
        raw_response::json_text(self.status(), &self.body().to_string(), self.retry_after())
    }

    /// The same answer as worker-rs's `Response` (the Durable Objects' handlers return those).
    pub fn into_response(self) -> worker::Result<Response> {
        self.into_raw().map(Response::from)
    }
}

/// A Durable Object's answer to a request whose body is not the command it takes: 400
/// naming `what` it is.
pub fn bad_command(what: &str, e: impl std::fmt::Display) -> worker::Result<Response> {
    Refusal::BadRequest(format!("bad {what}: {e}")).into_response()
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
