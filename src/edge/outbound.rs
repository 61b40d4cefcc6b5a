//! Outbound HTTP with a deadline: the side effect, alerts, and (later) the status API.
//!
//! Guarantees: every call is bounded by its timeout and aborted when it passes, so a slow
//! peer can neither hold a Gemini delivery past its deadline nor pin a claim; a timeout or a
//! network error is reported as a value, never as a panic.

use std::time::Duration;

use futures_util::future::{select, Either};
use worker::wasm_bindgen::JsValue;
use worker::{AbortController, Delay, Fetch, Headers, Method, Request, RequestInit};

/// How an outbound call ended.
pub enum Answer {
    /// The peer answered: status and the first bytes of its body.
    Http { status: u16, excerpt: String },
    /// The deadline passed first; the request was aborted.
    Timeout,
    /// The request could not be made or the connection failed.
    Network(String),
}

/// Longest part of a peer's body kept for logs and the record.
const EXCERPT_CHARS: usize = 300;

/// Sends one request and waits at most `timeout_ms` for the status and body.
pub async fn send(
    method: Method,
    url: &str,
    headers: &[(&str, String)],
    body: Option<&str>,
    timeout_ms: i64,
) -> Answer {
    let request = match build(method, url, headers, body) {
        Ok(r) => r,
        Err(e) => return Answer::Network(e.to_string()),
    };
    let controller = AbortController::default();
    let signal = controller.signal();
    let call = async move {
        let mut response = Fetch::Request(request).send_with_signal(&signal).await?;
        let status = response.status_code();
        let text = response.text().await.unwrap_or_default();
        Ok::<_, worker::Error>((status, text))
    };
    let deadline = Delay::from(Duration::from_millis(timeout_ms.max(1) as u64));
    match select(Box::pin(call), Box::pin(deadline)).await {
        Either::Left((Ok((status, text)), _)) => Answer::Http {
            status,
            excerpt: text.chars().take(EXCERPT_CHARS).collect(),
        },
        Either::Left((Err(e), _)) => Answer::Network(e.to_string()),
        Either::Right(_) => {
            controller.abort();
            Answer::Timeout
        }
    }
}

fn build(
    method: Method,
    url: &str,
    headers: &[(&str, String)],
    body: Option<&str>,
) -> worker::Result<Request> {
    let h = Headers::new();
    for (name, value) in headers {
        h.set(name, value)?;
    }
    let mut init = RequestInit::new();
    init.with_method(method).with_headers(h);
    if let Some(body) = body {
        init.with_body(Some(JsValue::from_str(body)));
    }
    Request::new_with_init(url, &init)
}
