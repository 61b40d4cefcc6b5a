//! Asking Gemini's status API about one operation, with the API key and a deadline.
//!
//! Guarantees: one bounded GET; every way it can end (an answer, a timeout, a network error)
//! becomes the pure core's [`Observation`] or [`StatusError`], so the gate and the cron read
//! an answer the same way; a timeout or network error is transient, like a 429.

use worker::Method;

use crate::config::Config;
use crate::key::Collection;
use crate::status::{interpret, status_url, Observation, StatusError};

use super::outbound::{send, Answer};

/// Status API calls get this long. A status GET answers in well under a second; 5 s leaves
/// room for a slow moment, while a hanging call costs a cron pass a twelfth of its default
/// deadline (the pass moves on to the next entry) and a gate's alarm no more than that.
pub const STATUS_TIMEOUT_MS: i64 = 5_000;
/// Longest status answer read (a batch's metadata is a few KB; inlined results are not read).
const STATUS_MAX_CHARS: usize = 256 * 1024;

/// One GET to Gemini's API (`url`), with the API key when one is configured.
pub async fn get(config: &Config, url: &str) -> Answer {
    let mut headers = vec![("accept", "application/json".to_string())];
    if let Some(api_key) = &config.gemini_api_key {
        headers.push(("x-goog-api-key", api_key.0.clone()));
    }
    send(
        Method::Get,
        url,
        &headers,
        None,
        STATUS_TIMEOUT_MS,
        STATUS_MAX_CHARS,
    )
    .await
}

/// Asks about the operation `key` (full name `name`) of `collection`.
pub async fn ask(
    config: &Config,
    collection: Collection,
    key: &str,
    name: &str,
) -> Result<Observation, StatusError> {
    let url = status_url(&config.gemini_api_base, collection, key, name);
    match get(config, &url).await {
        Answer::Http {
            status,
            excerpt,
            retry_after,
        } => interpret(collection, status, retry_after.as_deref(), &excerpt),
        Answer::Timeout | Answer::Network(_) => Err(StatusError::Transient {
            retry_after_secs: 0,
        }),
    }
}
