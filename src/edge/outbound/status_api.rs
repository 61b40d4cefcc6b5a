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

/// The status API gets this long to answer.
pub const STATUS_TIMEOUT_MS: i64 = 10_000;
/// Longest status answer read (a batch's metadata is a few KB; inlined results are not read).
pub const STATUS_MAX_CHARS: usize = 256 * 1024;

/// Asks about the operation `key` (full name `name`) of `collection`.
pub async fn ask(
    config: &Config,
    collection: Collection,
    key: &str,
    name: &str,
) -> Result<Observation, StatusError> {
    let url = status_url(&config.gemini_api_base, collection, key, name);
    let mut headers = vec![("accept", "application/json".to_string())];
    if let Some(api_key) = &config.gemini_api_key {
        headers.push(("x-goog-api-key", api_key.0.clone()));
    }
    match send(
        Method::Get,
        &url,
        &headers,
        None,
        STATUS_TIMEOUT_MS,
        STATUS_MAX_CHARS,
    )
    .await
    {
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
