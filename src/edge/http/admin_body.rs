//! Reading an admin request's body and the operation its path names, for the single routes
//! and the bulk ones alike.
//!
//! Guarantees: a body is held to [`MAX_ADMIN_BODY`]: 413 at once for a `content-length` over
//! it, else as soon as the streamed bytes pass it (the rest is never read); an action's
//! optional reason is cut to [`MAX_REASON_CHARS`].

use percent_encoding::percent_decode_str;
use serde::Deserialize;
use worker::Request;

use crate::edge::capped_read::request_body;
use crate::operation::key::{normalize, OperationKey};
use crate::operator::listing::MAX_REASON_CHARS;
use crate::refusal::Refusal;

/// Largest admin request body (bulk requests too): a longer one is refused while it streams.
pub const MAX_ADMIN_BODY: usize = 16 * 1024;

/// The operation a path names (percent-encoded or not, in any accepted form of the name).
pub fn operation_key(name: &str) -> Result<OperationKey, Refusal> {
    let name = percent_decode_str(name)
        .decode_utf8()
        .map_err(|_| Refusal::BadRequest("name is not UTF-8".into()))?;
    normalize(&name, None).map_err(|e| Refusal::BadRequest(format!("name: {e}")))
}

/// The request's body, refused with 413 past [`MAX_ADMIN_BODY`].
pub async fn read_body(req: &mut Request) -> Result<Vec<u8>, Refusal> {
    request_body(req, MAX_ADMIN_BODY).await
}

/// An optional `{"reason": "..."}` body; the reason is recorded with the operator's action.
pub async fn read_reason(req: &mut Request) -> Result<String, Refusal> {
    #[derive(Deserialize)]
    struct Body {
        reason: Option<String>,
    }
    let body = read_body(req).await?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok("operator".to_string());
    }
    let parsed: Body = serde_json::from_slice(&body)
        .map_err(|_| Refusal::BadRequest("body must be {\"reason\": \"...\"}".into()))?;
    Ok(parsed
        .reason
        .map(|r| r.chars().take(MAX_REASON_CHARS).collect())
        .unwrap_or_else(|| "operator".to_string()))
}
