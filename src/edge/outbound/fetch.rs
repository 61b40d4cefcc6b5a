//! Outbound calls with a deadline: the side effect (to its destination: an HTTPS URL,
//! another Worker through a service binding, or a Cloudflare Queue through a producer
//! binding), alerts, the status API, the key set.
//!
//! Guarantees: every call is bounded by its timeout and aborted when it passes, so a slow
//! peer can neither hold a Gemini delivery past its deadline nor pin a claim; every way a call
//! ends, a timeout or a network error included, is the pure core's [`PeerAnswer`] (classified by
//! [`crate::retry`]; a queue send that succeeded is a 2xx: the queue is durable), never a
//! panic. An answer's body is read while it streams and only as far as the call needs
//! ([`Keep`]): an excerpt stops once it has its characters and cancels the rest, a body wanted
//! whole stops at the first chunk past its cap and is [`PeerAnswer::TooLarge`], and a status
//! answer goes through the skimmer (`status_api.rs`); so a peer that answers with an endless
//! or huge body costs at most the cap plus one chunk of memory, and an excerpt does not wait
//! for the end of the body. Every kind of destination receives the same signed request (a
//! queue message carries the headers as fields beside the body), so a consumer verifies and
//! dedupes it the same way (`webhook-id`, `idempotency-key`); the record keeps at most
//! [`EXCERPT_CHARS`] of its answer. The bindings are the user's to declare.

use std::time::Duration;

use futures_util::stream::{self, StreamExt};
use serde_json::Value;
use worker::wasm_bindgen::{JsCast, JsValue};
use worker::wasm_bindgen_futures::JsFuture;
use worker::{
    js_sys, AbortController, AbortSignal, Delay, Env, Fetch, Headers, Method, Request, RequestInit,
    RequestRedirect, Response,
};

use crate::alert_format::{header_id, render, Sink};
use crate::body_cap::{excerpt_bytes, excerpt_text, CappedBody, TooLarge};
use crate::config::{Config, Destination};
use crate::operation::effect::{queue_message, EffectRequest};
use crate::redirect::{next_hop, KEY_HEADER, MAX_REDIRECTS};
use crate::results::progress::SENDS_IN_FLIGHT;
use crate::retry::{class_of_status, Class, PeerAnswer};
use crate::telemetry::worker_log::WorkerLog;

use crate::edge::capped_read::read_answer;
use crate::edge::runtime::{js_error, log, now_ms, within};

/// Longest part of an answer kept in the record and logs: a destination's, an alert sink's, or
/// a non-2xx answer to a call that wants its 2xx body whole.
const EXCERPT_CHARS: usize = 300;

/// Alert sinks get this long to answer.
const ALERT_TIMEOUT_MS: i64 = 5_000;

/// How much of an answer's body a call keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// Its first this many characters, to quote in a record or a log (a destination's or an
    /// alert sink's answer); the rest is never read.
    Excerpt(usize),
    /// A 2xx body whole, up to this many bytes (the key set, a page of the webhook listing);
    /// a longer one is [`PeerAnswer::TooLarge`]. Any other status keeps an excerpt.
    Whole(usize),
}

impl Keep {
    /// The answer with `status`, once its body was read into `body`.
    fn answer(self, status: u16, retry_after: Option<String>, body: CappedBody) -> PeerAnswer {
        let success = class_of_status(status) == Class::Success;
        let body = match (self, body.finish()) {
            (_, Err(TooLarge { cap })) => return PeerAnswer::TooLarge { status, cap },
            (Keep::Whole(_), Ok(bytes)) if success => String::from_utf8_lossy(&bytes).into_owned(),
            (Keep::Whole(_), Ok(bytes)) => excerpt_text(&bytes, EXCERPT_CHARS),
            (Keep::Excerpt(chars), Ok(bytes)) => excerpt_text(&bytes, chars),
        };
        PeerAnswer::Http {
            status,
            body,
            retry_after,
        }
    }
}

/// Reads `response`'s body as `keep` says: chunk by chunk, the rest cancelled once it has
/// enough. Shared by URL calls and service bindings.
async fn kept_answer(response: &Response, keep: Keep) -> PeerAnswer {
    let status = response.status_code();
    let retry_after = response.headers().get("retry-after").ok().flatten();
    let body = match keep {
        Keep::Whole(cap) if class_of_status(status) == Class::Success => CappedBody::whole(cap),
        Keep::Whole(_) => CappedBody::excerpt(excerpt_bytes(EXCERPT_CHARS)),
        Keep::Excerpt(chars) => CappedBody::excerpt(excerpt_bytes(chars)),
    };
    match read_answer(response, body).await {
        Ok(body) => keep.answer(status, retry_after, body),
        Err(e) => PeerAnswer::Network(js_error(&e)),
    }
}

/// Sends one request and waits at most `timeout_ms` for the status and the body, reading as
/// much of the body as `keep` says.
pub async fn send(
    method: Method,
    url: &str,
    headers: &[(&str, String)],
    body: Option<&str>,
    timeout_ms: i64,
    keep: Keep,
) -> PeerAnswer {
    let controller = AbortController::default();
    let signal = controller.signal();
    let call = async move {
        let response = fetch(method, url, headers, body, &signal).await?;
        Ok::<_, worker::Error>(kept_answer(&response, keep).await)
    };
    let outcome = within(timeout_ms, call).await;
    // Stops the download of a body read only in part, or one the deadline cut; harmless
    // after the end.
    controller.abort();
    match outcome {
        Some(Ok(answer)) => answer,
        Some(Err(e)) => PeerAnswer::Network(e.to_string()),
        None => PeerAnswer::Timeout,
    }
}

/// Sends one request and answers its response (its body unread). A request that carries our
/// Gemini API key ([`KEY_HEADER`]) does not follow redirects blindly: it is sent with
/// `redirect: "manual"` and each 3xx followed as [`next_hop`] says, the key only ever going to
/// the origin the call was first made to. Any other request follows redirects as fetch does.
pub(super) async fn fetch(
    method: Method,
    url: &str,
    headers: &[(&str, String)],
    body: Option<&str>,
    signal: &AbortSignal,
) -> worker::Result<Response> {
    let keyed = headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case(KEY_HEADER));
    let request = build(method.clone(), url, headers, body, keyed)?;
    let mut response = Fetch::Request(request).send_with_signal(signal).await?;
    if !keyed || method != Method::Get {
        return Ok(response);
    }
    let (mut current, mut with_key) = (url.to_string(), true);
    for _ in 0..MAX_REDIRECTS {
        let location = response.headers().get("location")?;
        let Some(hop) = next_hop(url, &current, response.status_code(), location.as_deref()) else {
            break;
        };
        with_key &= hop.same_origin;
        let sent: Vec<(&str, String)> = headers
            .iter()
            .filter(|(n, _)| with_key || !n.eq_ignore_ascii_case(KEY_HEADER))
            .cloned()
            .collect();
        let request = build(Method::Get, &hop.url, &sent, None, true)?;
        response = Fetch::Request(request).send_with_signal(signal).await?;
        current = hop.url;
    }
    Ok(response)
}

/// A request; with `manual`, one that answers a redirect as it is instead of following it.
pub(super) fn build(
    method: Method,
    url: &str,
    headers: &[(&str, String)],
    body: Option<&str>,
    manual: bool,
) -> worker::Result<Request> {
    let h = Headers::new();
    for (name, value) in headers {
        h.set(name, value)?;
    }
    let mut init = RequestInit::new();
    init.with_method(method).with_headers(h);
    if manual {
        init.with_redirect(RequestRedirect::Manual);
    }
    if let Some(body) = body {
        init.with_body(Some(JsValue::from_str(body)));
    }
    Request::new_with_init(url, &init)
}

/// An operation's alert with where its side effect goes (`destination`: the desk's label for
/// its kind, never a credential a URL holds); any other alert as it is.
fn with_destination(config: &Config, body: &Value) -> Value {
    let mut body = body.clone();
    if body["key"].is_string() && body.get("destination").is_none() {
        body["destination"] = config.desk_settings(body["kind"].as_str()).label.into();
    }
    body
}

/// Logs an alert and POSTs it to `ALERT_URL` when one is configured, in `ALERT_FORMAT`'s shape
/// ([`crate::alert_format::render`]), with its `alert-id` header (the same on every retry).
/// True once it is out (logged only, or accepted with a 2xx by the sink).
pub async fn post_alert(config: &Config, body: &Value) -> bool {
    log(WorkerLog::Alert {
        alert: body["alert"].clone(),
        key: body["key"].clone(),
        age_seconds: body["age_seconds"].clone(),
        text: body["text"].clone(),
    }
    .to_value());
    let Some(url) = &config.alert_url else {
        return true;
    };
    let mut headers = vec![("content-type", "application/json".to_string())];
    if let Some(id) = header_id(body) {
        headers.push(("alert-id", id));
    }
    let sink = Sink {
        format: config.alert_format,
        routing_key: config.alert_routing_key.as_ref().map(|k| k.0.as_str()),
        dashboard: config.alert_dashboard_url.as_deref(),
    };
    let answer = send(
        Method::Post,
        url,
        &headers,
        Some(&render(sink, &with_destination(config, body)).to_string()),
        ALERT_TIMEOUT_MS,
        Keep::Excerpt(EXCERPT_CHARS),
    )
    .await;
    if answer.class() == Class::Success {
        return true;
    }
    let (alert, key) = (body["alert"].clone(), Some(body["key"].clone()));
    let answer = answer.summary();
    log(WorkerLog::AlertFailed { alert, key, answer }.to_value());
    false
}

/// Posts `alerts` oldest first until the sink refuses one ([`post_alert`]): how many went.
pub async fn post_alerts(config: &Config, alerts: &[Value]) -> usize {
    for (sent, alert) in alerts.iter().enumerate() {
        if !post_alert(config, alert).await {
            return sent;
        }
    }
    alerts.len()
}

/// Sends `requests` (they are independent) to `destination`, at most [`SENDS_IN_FLIGHT`] at
/// once (production's 6 connections per invocation), each no sooner than its `after_ms` from
/// now (a paced route's tokens, counted from the grant, not from when its turn among the 6
/// comes) and waiting at most `timeout_ms`; answers each one's answer, in order.
pub async fn deliver(
    env: &Env,
    destination: &Destination,
    (requests, after_ms): (&[EffectRequest], &[i64]),
    timeout_ms: i64,
) -> Vec<PeerAnswer> {
    let begun = now_ms();
    let sends = requests.iter().enumerate().map(|(i, request)| async move {
        let wait = begun + after_ms.get(i).copied().unwrap_or(0) - now_ms();
        if wait > 0 {
            Delay::from(Duration::from_millis(wait as u64)).await;
        }
        match destination {
            Destination::Url(url) => {
                let (body, keep) = (Some(request.body.as_str()), Keep::Excerpt(EXCERPT_CHARS));
                send(Method::Post, url, &request.headers, body, timeout_ms, keep).await
            }
            Destination::Service(binding) => within(timeout_ms, to_service(env, binding, request))
                .await
                .unwrap_or(PeerAnswer::Timeout),
            Destination::Queue(binding) => within(timeout_ms, to_queue(env, binding, request))
                .await
                .unwrap_or(PeerAnswer::Timeout),
        }
    });
    stream::iter(sends)
        .buffered(SENDS_IN_FLIGHT)
        .collect()
        .await
}

/// POSTs the signed request to another Worker (the URL's host is the binding's, unused).
async fn to_service(env: &Env, binding: &str, request: &EffectRequest) -> PeerAnswer {
    let fetcher = match env.service(binding) {
        Ok(f) => f,
        Err(e) => return PeerAnswer::Network(format!("service binding {binding}: {e}")),
    };
    let call = async {
        let url = "https://effects.internal/effects";
        let body = Some(request.body.as_str());
        let req = build(Method::Post, url, &request.headers, body, false)?;
        let response = fetcher.fetch_request(req).await?;
        Ok::<_, worker::Error>(kept_answer(&response, Keep::Excerpt(EXCERPT_CHARS)).await)
    };
    call.await
        .unwrap_or_else(|e| PeerAnswer::Network(e.to_string()))
}

/// Sends `{"headers": {...}, "raw_body": "..."}` to a queue ([`queue_message`]): the same
/// headers and bytes a URL receives.
async fn to_queue(env: &Env, binding: &str, request: &EffectRequest) -> PeerAnswer {
    let message = match queue_message(request) {
        Ok(message) => message,
        // The queue would refuse it every time: a refusal (parked), never a retry. It was
        // not sent, so no destination's health is judged by it.
        Err(why) => {
            return PeerAnswer::Http {
                status: 413,
                body: why,
                retry_after: None,
            }
        }
    };
    let call = async {
        let queue = js_sys::Reflect::get(env, &JsValue::from_str(binding))?;
        if queue.is_undefined() {
            return Err(JsValue::from_str("not bound"));
        }
        let send: js_sys::Function = js_sys::Reflect::get(&queue, &JsValue::from_str("send"))?
            .dyn_into()
            .map_err(|_| JsValue::from_str("not a queue producer"))?;
        let body = js_sys::JSON::parse(&message)?;
        let promise: js_sys::Promise = send.call1(&queue, &body)?.dyn_into()?;
        JsFuture::from(promise).await
    };
    match call.await {
        Ok(_) => PeerAnswer::Http {
            status: 202,
            body: "queued".to_string(),
            retry_after: None,
        },
        Err(e) => PeerAnswer::Network(format!("queue {binding}: {}", js_error(&e))),
    }
}
