//! `GET /metrics`: the counters `/v1/stats` reads, rendered for a Prometheus scraper by
//! [`crate::telemetry::metrics`] in the format its `Accept` asks for.
//!
//! Guarantees: the admin API's token check has admitted the caller (a read scope at least);
//! a scrape writes nothing (it costs what a `/v1/stats` read does: one call to each stats
//! shard, one to the lease, one to each destination's desk, no KV read), and the answer is
//! never cached.

use serde_json::Value;
use worker::{Request, Response};

use crate::refusal::Refusal;
use crate::telemetry::metrics::{render, Format};

/// The exposition page for `stats`, in the format the request's `Accept` asks for.
pub fn answer(req: &Request, stats: &Value) -> Result<Response, Refusal> {
    let format = Format::from_accept(req.headers().get("accept").ok().flatten().as_deref());
    let mut response = Response::ok(render(stats, format))?;
    let headers = response.headers_mut();
    headers.set("content-type", format.content_type())?;
    headers.set("cache-control", "no-store")?;
    Ok(response)
}
