//! Asking Gemini's status API about one operation, with the API key and a deadline; and the
//! WebhookService's small calls a pass makes (a page of the listing, enabling the webhook).
//!
//! Guarantees: one bounded GET (headers within [`STATUS_TIMEOUT_MS`], a 2xx body within
//! [`STATUS_BODY_TIMEOUT_MS`] more); the body is streamed through the skimmer
//! ([`crate::skim`]), so an answer of any size Gemini sends is read with bounded memory (one
//! chunk plus at most [`crate::skim::MAX_KEPT_BYTES`] kept) and a large one is logged with
//! what it cost; every way it can end (an answer, a timeout, a network error) is the pure
//! core's [`StatusAnswer`], which the gate and the cron read the same way
//! ([`interpret_skimmed`]: an [`Observation`] or a [`StatusError`]); a timeout or network error
//! is transient, like a 429.
//! A WebhookService call (a listing page, the PATCH enabling the webhook) gets the same
//! deadline and its 2xx body is read whole up to 256 KiB, refused past it.

use worker::{AbortController, Method, Response};

use crate::body_cap::Read;
use crate::config::Config;
use crate::operation::key::Collection;
use crate::operation::observation::{Observation, StatusError};
use crate::reconciliation::status::{call_answer, interpret_skimmed, status_url, StatusAnswer};
use crate::redirect::KEY_HEADER;
use crate::retry::{class_of_status, Class, PeerAnswer};
use crate::skim::Skim;
use crate::telemetry::counters::StatusCallAnswer;
use crate::telemetry::worker_log::{StatusRead, WorkerLog};

use crate::edge::capped_read::each_chunk;
use crate::edge::outbound::fetch::{fetch, send, Keep};
use crate::edge::runtime::{js_error, log, now_ms, within};

/// Status API calls get this long. A status GET answers in well under a second; 5 s leaves
/// room for a slow moment, while a hanging call costs a cron pass a twelfth of its default
/// deadline (the pass moves on to the next entry) and a gate's alarm no more than that.
pub const STATUS_TIMEOUT_MS: i64 = 5_000;
/// A 2xx status answer's body gets this long once its headers came. A batch with inline
/// results answers with all of them (tens of MB): at the tens of MB a second a Worker reads
/// and skims, 20 s covers a few hundred MB; the skimmer's byte cap comes first.
pub const STATUS_BODY_TIMEOUT_MS: i64 = 20_000;
/// Longest 2xx answer read by [`webhook_call`] (webhook listings: a few KB); a longer one is
/// refused as it streams ([`PeerAnswer::TooLarge`]).
const GET_MAX_BYTES: usize = 256 * 1024;
/// An answer at least this large is logged (`status_read`) with the bytes read and kept.
const LOG_READ_FROM_BYTES: u64 = 256 * 1024;

/// A call to Gemini's API: JSON asked for, with our key when one is configured.
pub(super) fn headers(config: &Config) -> Vec<(&'static str, String)> {
    let mut headers = vec![("accept", "application/json".to_string())];
    if let Some(api_key) = &config.gemini_api_key {
        headers.push((KEY_HEADER, api_key.0.clone()));
    }
    headers
}

/// One WebhookService call a pass makes to Gemini's API (`url`), with the API key when one is
/// configured: a GET of a page of the webhook listing, or the PATCH with the JSON `body` that
/// enables the webhook again. A 2xx body is read whole up to 256 KiB, and refused past it.
pub async fn webhook_call(
    config: &Config,
    method: Method,
    url: &str,
    body: Option<&str>,
) -> PeerAnswer {
    let mut headers = headers(config);
    if body.is_some() {
        headers.push(("content-type", "application/json".to_string()));
    }
    let keep = Keep::Whole(GET_MAX_BYTES);
    send(method, url, &headers, body, STATUS_TIMEOUT_MS, keep).await
}

/// One status GET for the operation `key` at `url`, its body skimmed. A large body is
/// logged with the bytes read and kept, the largest chunk and how long it took.
pub async fn read(config: &Config, key: &str, url: &str) -> StatusAnswer {
    let (answer, read_ms) = get_skimmed(url, &headers(config)).await;
    let read = match &answer {
        PeerAnswer::Http {
            body: Some(Ok(s)), ..
        } if s.bytes_read >= LOG_READ_FROM_BYTES => StatusRead::Kept {
            bytes_read: s.bytes_read,
            bytes_kept: s.bytes_kept,
            max_chunk: s.max_chunk,
            arrays_counted: s.counted,
            values_dropped: s.dropped,
            strings_cut: s.truncated,
        },
        PeerAnswer::Http {
            body: Some(Err(e)), ..
        } => StatusRead::Refused {
            refused: e.to_string(),
        },
        _ => return answer,
    };
    let key = key.to_string();
    log(WorkerLog::StatusRead { key, read, read_ms }.to_value());
    answer
}

/// Asks about the operation `key` (full name `name`) of `collection`: what the answer
/// means, and how the call ended, for its counter.
pub async fn ask(
    config: &Config,
    collection: Collection,
    key: &str,
    name: &str,
) -> (Result<Observation, StatusError>, StatusCallAnswer) {
    let url = status_url(&config.gemini_api_base, collection, key, name);
    let answer = read(config, key, &url).await;
    (interpret_skimmed(collection, &answer), call_answer(&answer))
}

/// A GET ([`fetch`]: a status call's, the results file's) whose headers came within
/// `timeout_ms`: its response, and the controller that aborts the rest of it; `None` when they
/// did not come, the call then aborted.
pub(super) async fn get_head(
    url: &str,
    headers: &[(&str, String)],
    timeout_ms: i64,
) -> Option<worker::Result<(Response, AbortController)>> {
    let controller = AbortController::default();
    let signal = controller.signal();
    match within(timeout_ms, fetch(Method::Get, url, headers, None, &signal)).await {
        Some(head) => Some(head.map(|response| (response, controller))),
        None => {
            controller.abort();
            None
        }
    }
}

/// One GET whose headers must come within [`STATUS_TIMEOUT_MS`] and whose 2xx body is then
/// streamed, chunk by chunk, through a [`Skim`] within [`STATUS_BODY_TIMEOUT_MS`] more. Memory: one
/// chunk as the runtime hands it over, plus what the skimmer keeps (bounded by
/// [`crate::skim::MAX_KEPT_BYTES`]); a body the skimmer refuses is not read further.
/// Also says how long reading the body took (0 when it was not read).
async fn get_skimmed(url: &str, headers: &[(&str, String)]) -> (StatusAnswer, i64) {
    let (response, controller) = match get_head(url, headers, STATUS_TIMEOUT_MS).await {
        Some(Ok(head)) => head,
        Some(Err(e)) => return (PeerAnswer::Network(e.to_string()), 0),
        None => return (PeerAnswer::Timeout, 0),
    };
    let status = response.status_code();
    let retry_after = response.headers().get("retry-after").ok().flatten();
    if class_of_status(status) != Class::Success {
        controller.abort();
        let answer = PeerAnswer::Http {
            status,
            body: None,
            retry_after,
        };
        return (answer, 0);
    }
    let started = now_ms();
    let read = async {
        let mut skim = Skim::new(crate::reconciliation::status::READ);
        // No body at all reads as an empty one (and is refused as such).
        if let worker::ResponseBody::Stream(stream) = response.body() {
            each_chunk(stream, |chunk| match skim.feed(chunk) {
                Ok(()) => Read::More,
                Err(_) => Read::Enough,
            })
            .await
            .map_err(|e| worker::Error::from(js_error(&e)))?;
        }
        Ok::<_, worker::Error>(skim.finish())
    };
    let outcome = within(STATUS_BODY_TIMEOUT_MS, read).await;
    // Stops a refused body's download, or one the deadline cut; harmless after the end.
    controller.abort();
    let answer = match outcome {
        Some(Ok(body)) => PeerAnswer::Http {
            status,
            body: Some(body),
            retry_after,
        },
        Some(Err(e)) => PeerAnswer::Network(e.to_string()),
        None => PeerAnswer::Timeout,
    };
    (answer, now_ms() - started)
}
