//! Sending one side-effect attempt to its destination: an HTTPS URL, another Worker through a
//! service binding, or a Cloudflare Queue through a producer binding.
//!
//! Guarantees: every kind of destination receives the same signed request (a queue message
//! carries the headers as fields beside the body), so a consumer verifies and dedupes it the
//! same way (`webhook-id`, `idempotency-key`); every attempt is bounded by the effect timeout;
//! how it ended is a [`PeerAnswer`] that the pure core classifies
//! ([`crate::operation::effect::outcome`]; a queue send that succeeded is
//! a 2xx: the queue is durable), never a panic. An answer's body is read only as far as the
//! excerpt the record keeps ([`EXCERPT_CHARS`]) and the rest cancelled, so a destination that
//! answers with an endless or huge body neither holds the attempt to its timeout nor costs
//! memory. The bindings are the user's to declare.

use std::time::Duration;

use futures_util::future::{select, Either};
use serde_json::{Map, Value};
use worker::wasm_bindgen::{JsCast, JsValue};
use worker::wasm_bindgen_futures::JsFuture;
use worker::{js_sys, Delay, Env, Headers, Method, Request, RequestInit};

use crate::config::Destination;
use crate::operation::effect::EffectRequest;
use crate::retry::PeerAnswer;

use crate::edge::outbound::fetch::{kept_answer, send, Keep};
use crate::edge::runtime::js_error;

/// Longest part of a destination's answer kept in the record and logs.
const EXCERPT_CHARS: usize = 300;

/// Sends `request` to `destination`, waiting at most `timeout_ms`.
pub async fn deliver(
    env: &Env,
    destination: &Destination,
    request: &EffectRequest,
    timeout_ms: i64,
) -> PeerAnswer {
    match destination {
        Destination::Url(url) => {
            send(
                Method::Post,
                url,
                &request.headers,
                Some(&request.body),
                timeout_ms,
                Keep::Excerpt(EXCERPT_CHARS),
            )
            .await
        }
        Destination::Service(binding) => {
            within(timeout_ms, to_service(env, binding, request)).await
        }
        Destination::Queue(binding) => within(timeout_ms, to_queue(env, binding, request)).await,
    }
}

async fn within(
    timeout_ms: i64,
    call: impl std::future::Future<Output = PeerAnswer>,
) -> PeerAnswer {
    let deadline = Delay::from(Duration::from_millis(timeout_ms.max(1) as u64));
    match select(Box::pin(call), Box::pin(deadline)).await {
        Either::Left((answer, _)) => answer,
        Either::Right(_) => PeerAnswer::Timeout,
    }
}

/// POSTs the signed request to another Worker (the URL's host is the binding's, unused).
async fn to_service(env: &Env, binding: &str, request: &EffectRequest) -> PeerAnswer {
    let fetcher = match env.service(binding) {
        Ok(f) => f,
        Err(e) => return PeerAnswer::Network(format!("service binding {binding}: {e}")),
    };
    let call = async {
        let headers = Headers::new();
        for (name, value) in &request.headers {
            headers.set(name, value)?;
        }
        let mut init = RequestInit::new();
        init.with_method(Method::Post)
            .with_headers(headers)
            .with_body(Some(JsValue::from_str(&request.body)));
        let req = Request::new_with_init("https://effects.internal/effects", &init)?;
        let response = fetcher.fetch_request(req).await?;
        Ok::<_, worker::Error>(kept_answer(&response, Keep::Excerpt(EXCERPT_CHARS)).await)
    };
    call.await
        .unwrap_or_else(|e| PeerAnswer::Network(e.to_string()))
}

/// Sends `{"headers": {...}, "body": {...}}` to a queue: the same fields a URL receives.
async fn to_queue(env: &Env, binding: &str, request: &EffectRequest) -> PeerAnswer {
    let message = queue_message(request);
    let call = async {
        let queue = js_sys::Reflect::get(env, &JsValue::from_str(binding))?;
        if queue.is_undefined() {
            return Err(JsValue::from_str("not bound"));
        }
        let send: js_sys::Function = js_sys::Reflect::get(&queue, &JsValue::from_str("send"))?
            .dyn_into()
            .map_err(|_| JsValue::from_str("not a queue producer"))?;
        let body = js_sys::JSON::parse(&message.to_string())?;
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

/// The queue message of an effect request: its headers as fields, its body as JSON.
fn queue_message(request: &EffectRequest) -> Value {
    let headers: Map<String, Value> = request
        .headers
        .iter()
        .map(|(k, v)| (k.to_string(), Value::String(v.clone())))
        .collect();
    let body: Value =
        serde_json::from_str(&request.body).unwrap_or(Value::String(request.body.clone()));
    let mut message = Map::new();
    message.insert("headers".into(), Value::Object(headers));
    message.insert("body".into(), body);
    message.insert("raw_body".into(), Value::String(request.body.clone()));
    Value::Object(message)
}
