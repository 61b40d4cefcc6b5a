//! What Gemini's status API said about one operation, as the gate applies it: an observation
//! with the server's own update time, or why there is none.
//!
//! Guarantees: a 429 or 5xx waits for its `Retry-After` (capped at a day) or a default, never
//! less than zero; none of the errors settles anything. A gate asks only when the project's
//! status budget grants it a slot ([`SlotAnswer`]).

use serde_json::{Map, Value};

use crate::operation::lifecycle::Status;

/// What the status API said about one operation.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    pub status: Status,
    /// Server update time in Unix ms; 0 when the answer has none.
    pub update_time_ms: i64,
    /// The normalized outcome details ([`crate::operation::details::normalize_details`]'s shape): output
    /// location, error code and message, and the raw Gemini state under `provider.state`.
    pub details: Map<String, Value>,
}

/// Why there is no observation: an answer that could not be used, or no question asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatusError {
    /// 404: Gemini does not know the operation.
    NotFound,
    /// 429 or 5xx: back off for this many seconds (Retry-After, or the default).
    Transient { retry_after_secs: i64 },
    /// Any other HTTP status: logged, nothing settled.
    Refused(u16),
    /// A 2xx answer we cannot read.
    Malformed(String),
    /// Nothing was asked: `GEMINI_API_KEY` is not set, so Gemini would refuse.
    NoApiKey,
}

/// Back-off after a 429 or 5xx without a usable `Retry-After`.
pub const DEFAULT_RETRY_AFTER_SECS: i64 = 60;

/// A 429 or 5xx from Gemini's API: back off for its `Retry-After` seconds (capped at a day),
/// or [`DEFAULT_RETRY_AFTER_SECS`] without a usable one.
pub fn transient(retry_after: Option<&str>) -> StatusError {
    let secs = retry_after.and_then(|v| v.trim().parse::<i64>().ok());
    let secs = secs.filter(|s| *s >= 0).unwrap_or(DEFAULT_RETRY_AFTER_SECS);
    let retry_after_secs = secs.min(86_400);
    StatusError::Transient { retry_after_secs }
}

/// The project's status budget's answer to a gate about to ask the status API (the
/// reconciliation lease keeps the budget: `Lease::take_slot`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "slot", rename_all = "snake_case")]
pub enum SlotAnswer {
    /// Ask now: the slot is taken.
    Granted,
    /// No status call before this time (Unix ms): ask for a slot again then.
    WaitUntil { until_ms: i64 },
}
