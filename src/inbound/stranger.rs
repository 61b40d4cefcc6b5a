//! Nudges that name operations nobody registered: what the worker lets a stranger holding a
//! valid token make it spend, and what it does with Gemini's answer about such a name.
//!
//! Anyone can obtain valid dynamic-webhook tokens (by running a job of their own pointed at
//! this worker) and put any name in the body, so a nudge for a name the gate has no record of
//! is not stored on the token's word: the edge asks Gemini's status API first ([`next_step`]).
//! Guarantees: a name Gemini answers 404 for leaves nothing behind (no record, no Durable
//! Object storage, no KV entry, no per-name alert); it is counted, logged, and counted against
//! a worker-wide [`Guard`]: past `per_minute` such names in a minute, further unregistered
//! nudges are refused (503, `Retry-After`) without a status call until the minute ends, and
//! crossing `threshold` within an alert window raises one aggregated alert for that window.
//! A name Gemini knows with an outcome is delivered as an event carrying what the status API
//! said; one not finished yet is recorded as a nudge its gate confirms later; an answer
//! that proves nothing yet is a 503, so Gemini retries a genuine completion. Time is a
//! parameter.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::operation::lifecycle::Source;
use crate::operation::observation::{Observation, StatusError, DEFAULT_RETRY_AFTER_SECS};
use crate::operation::OpEvent;

/// The guard's window for the status-call limit.
pub const MINUTE_MS: i64 = 60_000;

/// What to do with a nudge for an unregistered name, given the status API's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Gemini knows it: hand the gate this event (the state the status API gave, with the
    /// nudge's metadata), as a delivery from the webhook path.
    Deliver(OpEvent),
    /// Gemini knows it, not finished yet (or in a state this worker cannot read): the gate
    /// records the nudge, with its metadata, and its alarm asks again. Only an outcome is
    /// delivered at once: a record keeps details only from a terminal state, so delivering a
    /// `running` answer would drop the nudge's metadata and leave nothing to ask again.
    Confirm,
    /// Gemini does not know it (404): answer 2xx, store nothing, count it for the guard.
    Unknown,
    /// Nothing proven yet (no API key, 429, 5xx, timeout, an unreadable answer): answer 503
    /// with this `Retry-After`, so a genuine completion comes again.
    RetryLater(i64),
}

/// Decides what a nudge for an unregistered name leads to. `answer` is `None` when there is
/// no `GEMINI_API_KEY` (nothing can be asked).
pub fn next_step(
    answer: Option<Result<Observation, StatusError>>,
    metadata: &Map<String, Value>,
    delivery_id: &str,
) -> Next {
    match answer {
        None => Next::RetryLater(DEFAULT_RETRY_AFTER_SECS),
        Some(Ok(observation)) if !observation.status.is_terminal() => Next::Confirm,
        Some(Ok(observation)) => {
            let mut details = observation.details;
            for (k, v) in metadata {
                details.entry(k.clone()).or_insert(v.clone());
            }
            Next::Deliver(OpEvent {
                status: observation.status,
                update_time_ms: observation.update_time_ms,
                source: Source::Webhook,
                details,
                delivery_id: Some(delivery_id.to_string()),
            })
        }
        Some(Err(StatusError::NotFound)) => Next::Unknown,
        Some(Err(StatusError::Transient { retry_after_secs })) => {
            Next::RetryLater(retry_after_secs.max(1))
        }
        Some(Err(_)) => Next::RetryLater(DEFAULT_RETRY_AFTER_SECS),
    }
}

/// The worker-wide account of strangers' nudges, kept by one object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Guard {
    /// The current minute's start, and names Gemini did not know in it.
    pub minute_start_ms: i64,
    pub minute_unknown: u32,
    /// The current alert window's start, names Gemini did not know in it, and whether its
    /// one alert was raised.
    pub window_start_ms: i64,
    pub window_unknown: u32,
    pub window_alerted: bool,
    /// Unregistered nudges refused unasked since the last alert (reported in it).
    #[serde(default)]
    pub refused: u64,
}

/// The guard's limits (from the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuardLimits {
    pub per_minute: u32,
    pub threshold: u32,
    pub window_ms: i64,
}

impl Guard {
    fn roll(&mut self, now_ms: i64, limits: &GuardLimits) {
        if now_ms - self.minute_start_ms >= MINUTE_MS || now_ms < self.minute_start_ms {
            self.minute_start_ms = now_ms;
            self.minute_unknown = 0;
        }
        if now_ms - self.window_start_ms >= limits.window_ms || now_ms < self.window_start_ms {
            self.window_start_ms = now_ms;
            self.window_unknown = 0;
            self.window_alerted = false;
        }
    }

    /// May the status API be asked about one more unregistered name now? `Err` carries the
    /// seconds until the minute ends (the `Retry-After`).
    pub fn permit(&mut self, now_ms: i64, limits: &GuardLimits) -> Result<(), i64> {
        self.roll(now_ms, limits);
        if self.minute_unknown < limits.per_minute {
            return Ok(());
        }
        self.refused += 1;
        let left_ms = self.minute_start_ms + MINUTE_MS - now_ms;
        Err((left_ms + 999).div_euclid(1_000).max(1))
    }

    /// Gemini did not know one more name. True when this crosses the threshold of the alert
    /// window that has not alerted yet: the one aggregated alert is due.
    pub fn unknown(&mut self, now_ms: i64, limits: &GuardLimits) -> bool {
        self.roll(now_ms, limits);
        self.minute_unknown = self.minute_unknown.saturating_add(1);
        self.window_unknown = self.window_unknown.saturating_add(1);
        if !self.window_alerted && self.window_unknown >= limits.threshold {
            self.window_alerted = true;
            return true;
        }
        false
    }
}

/// The aggregated alert's body (`stranger_nudges`): how many, since when, and what to do.
/// Its id is the window's, so a resend of it is the same alert.
pub fn alert_body(guard: &Guard, limits: &GuardLimits) -> Value {
    let since = crate::timestamp::format_rfc3339(guard.window_start_ms);
    let id = format!("alert_strangers_{}", guard.window_start_ms);
    json!({
        "alert": "stranger_nudges",
        "alert_id": id,
        "key": null,
        "name": null,
        "kind": null,
        "age_seconds": 0,
        "count": guard.window_unknown,
        "since": since,
        "text": format!(
            "gemini-once stranger_nudges: at least {} dynamic-webhook nudges since {since} named operations this project's Gemini API does not know (someone else's jobs pointed at this worker, or invented names); nothing was stored for them. At most {} a minute are asked about; more are answered 503. Set DYNAMIC_WEBHOOKS=false if you use only the static webhook.",
            guard.window_unknown, limits.per_minute
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operation::lifecycle::Status;

    const LIMITS: GuardLimits = GuardLimits {
        per_minute: 3,
        threshold: 2,
        window_ms: 3_600_000,
    };

    #[test]
    fn a_minute_allows_per_minute_unknown_names_then_refuses_until_it_ends() {
        let mut g = Guard::default();
        let t = 1_000_000;
        for i in 0..3 {
            assert_eq!(g.permit(t + i, &LIMITS), Ok(()));
            g.unknown(t + i, &LIMITS);
        }
        assert_eq!(g.permit(t + 10_000, &LIMITS), Err(50));
        assert_eq!(g.refused, 1);
        assert_eq!(g.permit(t + MINUTE_MS, &LIMITS), Ok(()), "a new minute");
    }

    #[test]
    fn known_names_spend_nothing() {
        let mut g = Guard::default();
        for i in 0..100 {
            assert_eq!(g.permit(i, &LIMITS), Ok(()));
        }
    }

    #[test]
    fn the_alert_is_raised_once_per_window() {
        let mut g = Guard::default();
        let t = 5_000_000;
        assert!(!g.unknown(t, &LIMITS));
        assert!(g.unknown(t + 1, &LIMITS), "the threshold crossed");
        for i in 2..50 {
            assert!(!g.unknown(t + i, &LIMITS), "once per window");
        }
        assert!(!g.unknown(t + LIMITS.window_ms, &LIMITS), "a new window");
        assert!(g.unknown(t + LIMITS.window_ms + 1, &LIMITS));
        let body = alert_body(&g, &LIMITS);
        assert_eq!(body["alert"], "stranger_nudges");
        assert_eq!(body["count"], 2);
    }

    fn observed(status: Status) -> Option<Result<Observation, StatusError>> {
        let mut details = Map::new();
        details.insert("output_file_uri".into(), json!("gs://b/o"));
        Some(Ok(Observation {
            status,
            update_time_ms: 7,
            details,
        }))
    }

    #[test]
    fn gemini_decides_what_an_unregistered_nudge_leads_to() {
        let mut meta = Map::new();
        meta.insert("user_metadata".into(), json!({"a": 1}));
        match next_step(observed(Status::Succeeded), &meta, "jwt_1") {
            Next::Deliver(e) => {
                assert_eq!(e.status, Status::Succeeded);
                assert_eq!(e.source, Source::Webhook);
                assert_eq!(e.details["user_metadata"], json!({"a": 1}));
                assert_eq!(e.details["output_file_uri"], "gs://b/o");
                assert_eq!(e.delivery_id.as_deref(), Some("jwt_1"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            next_step(observed(Status::Unknown("X".into())), &meta, "j"),
            Next::Confirm
        );
        // Not finished: the nudge (and its metadata) waits in the record for the outcome.
        for status in [Status::Pending, Status::Running, Status::RequiresAction] {
            assert_eq!(next_step(observed(status), &meta, "j"), Next::Confirm);
        }
        assert_eq!(
            next_step(Some(Err(StatusError::NotFound)), &meta, "j"),
            Next::Unknown
        );
        assert_eq!(
            next_step(
                Some(Err(StatusError::Transient {
                    retry_after_secs: 0
                })),
                &meta,
                "j"
            ),
            Next::RetryLater(1)
        );
        assert_eq!(
            next_step(None, &meta, "j"),
            Next::RetryLater(DEFAULT_RETRY_AFTER_SECS)
        );
        assert_eq!(
            next_step(Some(Err(StatusError::Refused(403))), &meta, "j"),
            Next::RetryLater(DEFAULT_RETRY_AFTER_SECS)
        );
    }
}
