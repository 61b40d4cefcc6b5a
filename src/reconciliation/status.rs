//! Gemini's status API: where to ask about an operation, and what its answer means.
//!
//! Guarantees: each answer becomes an observation with the server's own update time (never
//! the receive time) and the same normalized details a webhook gives
//! ([`crate::operation::details::Outcome`]: output location, error, the rest under `provider`), so a
//! stale answer is dropped by the reducer like any other event and an outcome recovered here
//! gives the same side-effect body as one delivered by webhook; states follow google-genai's
//! enums (`JobState`, `InteractionStatus`), and `UNSPECIFIED` and unknown states map to
//! [`Status::Unknown`] and are never applied (the cron logs them); a 404, a
//! transient error (a timeout, 408, 409, 429, 5xx: [`crate::retry`]; `Retry-After` honoured) and a malformed answer are values,
//! never panics, and none of them settles anything. An answer read through the skimmer
//! ([`crate::skim`], [`interpret_skimmed`]) reads like the whole document: a counted array
//! gives the same count as the array, and a body the skimmer refused is malformed, with its
//! reason.

use serde_json::{json, Value};

use crate::operation::details::{bound, Outcome, USER_METADATA};
use crate::operation::key::Collection;
use crate::operation::lifecycle::Status;
use crate::operation::observation::{transient, Observation, StatusError};
use crate::retry::{class_of_status, Class, PeerAnswer};
use crate::skim::{Rule, SkimError, Skimmed};
use crate::telemetry::counters::StatusCallAnswer;
use crate::timestamp::parse_rfc3339_ms;

/// The `GET` URL for an operation: batches and interactions by key, video operations by
/// their full name (`models/{model}/operations/{id}`).
pub fn status_url(base: &str, collection: Collection, key: &str, name: &str) -> String {
    let path = match collection {
        Collection::Operations => name,
        Collection::Batches | Collection::Interactions => key,
    };
    format!("{}/v1beta/{}", base.trim_end_matches('/'), path)
}

/// Interprets a status-API answer for an operation of `collection`.
pub fn interpret(
    collection: Collection,
    http_status: u16,
    retry_after: Option<&str>,
    body: &str,
) -> Result<Observation, StatusError> {
    match (http_status, class_of_status(http_status)) {
        (_, Class::Success) => {}
        (404, _) => return Err(StatusError::NotFound),
        (_, Class::Retry) => return Err(transient(retry_after)),
        (other, Class::Refused) => return Err(StatusError::Refused(other)),
    }
    let value = json_of(body)?;
    if !value.is_object() {
        return Err(StatusError::Malformed("not a JSON object".into()));
    }
    match collection {
        Collection::Batches => batch(&value),
        Collection::Operations => video(&value),
        Collection::Interactions => interaction(&value),
    }
}

/// Every path of an answer this module reads, for the skimmer ([`crate::skim`]), whatever
/// the collection: a body skimmed with these reads exactly like the whole body (a test
/// holds every reader to it). Inline results are counted, never kept; everything else
/// (an echo of the inline requests, an interaction's input and outputs) is dropped.
pub const READ: &[Rule] = &[
    Rule::Keep("done"),
    Rule::Keep("error"),
    Rule::Keep("metadata.state"),
    Rule::Keep("metadata.updateTime"),
    Rule::Keep("metadata.batchStats"),
    Rule::Keep("metadata.output.responsesFile"),
    Rule::Count("metadata.output.inlinedResponses.inlinedResponses"),
    Rule::Count("metadata.output.inlinedEmbedContentResponses.inlinedResponses"),
    Rule::Keep("response.responsesFile"),
    Rule::Count("response.inlinedResponses.inlinedResponses"),
    Rule::Count("response.inlinedEmbedContentResponses.inlinedResponses"),
    Rule::Keep("response.generateVideoResponse.generatedSamples.*.video.uri"),
    Rule::Keep("response.generateVideoResponse.raiMediaFilteredCount"),
    Rule::Keep("response.generateVideoResponse.raiMediaFilteredReasons"),
    Rule::Keep("status"),
    Rule::Keep("errors"),
    Rule::Keep("updated"),
    Rule::Keep("webhook_config.user_metadata"),
];

/// A status call's answer: its body is streamed through the skimmer
/// ([`crate::skim`]) with [`READ`], and is `None` when it was not read (not a
/// 2xx).
pub type StatusAnswer = PeerAnswer<Option<Result<Skimmed, SkimError>>>;

/// How a status call ended, for its counter: a 2xx (usable or not), a 404, any other status
/// (a 429 or 5xx among them), or no answer (a timeout, a network error).
pub fn call_answer<B>(answer: &PeerAnswer<B>) -> StatusCallAnswer {
    match answer {
        PeerAnswer::Http { status: 404, .. } => StatusCallAnswer::NotFound,
        PeerAnswer::Http { status, .. } if class_of_status(*status) == Class::Success => {
            StatusCallAnswer::Answered
        }
        PeerAnswer::Http { .. } => StatusCallAnswer::Refused,
        // Only a 2xx body is read far enough to run past a cap.
        PeerAnswer::TooLarge { .. } => StatusCallAnswer::Answered,
        PeerAnswer::Timeout | PeerAnswer::Network(_) => StatusCallAnswer::Unanswered,
    }
}

/// Interprets a status call's answer. A body the skimmer refused (too large, not JSON) is
/// unusable, with the skimmer's reason; no answer (a timeout, a network error) is transient.
pub fn interpret_skimmed(
    collection: Collection,
    answer: &StatusAnswer,
) -> Result<Observation, StatusError> {
    if let PeerAnswer::Http { status: 404, .. } = answer {
        return Err(StatusError::NotFound);
    }
    // A 2xx: `interpret` reads any 2xx alike. A body past its cap is refused by the skimmer
    // itself, so `TooLarge` is never a skimmed body's.
    read_answer(answer, "body", |body| match body {
        Some(Ok(skimmed)) => interpret(collection, 200, None, &skimmed.json),
        Some(Err(e)) => Err(StatusError::Malformed(e.to_string())),
        None => Err(StatusError::Malformed("body not read".into())),
    })
}

/// An answer (`what`, said when it is too large): a 2xx's body read by `read`; anything else
/// by its class ([`crate::retry`]), no answer at all (a timeout, a network error) transient.
pub fn read_answer<B, T>(
    answer: &PeerAnswer<B>,
    what: &str,
    read: impl FnOnce(&B) -> Result<T, StatusError>,
) -> Result<T, StatusError> {
    match answer {
        PeerAnswer::Http {
            status,
            body,
            retry_after,
        } => match class_of_status(*status) {
            Class::Success => read(body),
            Class::Refused => Err(StatusError::Refused(*status)),
            Class::Retry => Err(transient(retry_after.as_deref())),
        },
        PeerAnswer::TooLarge { cap, .. } => {
            Err(StatusError::Malformed(format!("{what} over {cap} bytes")))
        }
        PeerAnswer::Timeout | PeerAnswer::Network(_) => Err(StatusError::Transient {
            retry_after_secs: 0,
        }),
    }
}

/// A body as JSON; malformed when it is not.
fn json_of(body: &str) -> Result<Value, StatusError> {
    serde_json::from_str(body).map_err(|e| StatusError::Malformed(format!("not JSON: {e}")))
}

fn time_at(value: &Value, pointer: &str) -> i64 {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .and_then(parse_rfc3339_ms)
        .unwrap_or(0)
}

/// google.rpc.Status `{code, message, details}` into the outcome; returns its code (2,
/// UNKNOWN, when the code is missing or not a number).
fn rpc_error(value: &Value, outcome: &mut Outcome) -> Option<i64> {
    let error = value.get("error").filter(|e| !e.is_null())?;
    outcome.take_error(error);
    Some(error.get("code").and_then(Value::as_i64).unwrap_or(2))
}

fn done(value: &Value) -> bool {
    value.get("done").and_then(Value::as_bool).unwrap_or(false)
}

/// The length of the array at `pointer`, or the count the skimmer left in its place.
fn count(value: &Value, pointer: &str) -> Option<usize> {
    let found = value.pointer(pointer)?;
    found
        .as_array()
        .map(Vec::len)
        .or_else(|| found.as_u64().map(|n| n as usize))
}

/// A batch's state, as the wire (`BATCH_STATE_*`) or the SDKs (`JOB_STATE_*`, google-genai's
/// `JobState`) spell it. Terminal are exactly the SDK's ended states (`JOB_STATES_ENDED`:
/// SUCCEEDED, FAILED, CANCELLED, EXPIRED); its other known states are not terminal;
/// `UNSPECIFIED` and anything else is unknown and never applied.
fn batch_state(raw: &str) -> Status {
    let state = raw
        .strip_prefix("BATCH_STATE_")
        .or_else(|| raw.strip_prefix("JOB_STATE_"))
        .unwrap_or(raw);
    match state {
        "PENDING" | "QUEUED" => Status::Pending,
        // CANCELLING may still end SUCCEEDED, FAILED or CANCELLED; PAUSED can be resumed;
        // UPDATING goes back to RUNNING (JobState's own descriptions).
        "RUNNING" | "CANCELLING" | "PAUSED" | "UPDATING" => Status::Running,
        "SUCCEEDED" => Status::Succeeded,
        "FAILED" => Status::Failed,
        "CANCELLED" => Status::Cancelled,
        "EXPIRED" => Status::Expired,
        // PARTIALLY_SUCCEEDED (Vertex) is not among the SDK's ended states and the Gemini
        // wire never sends it: unknown, so it is logged and an operator decides.
        other => Status::Unknown(other.to_string()),
    }
}

fn batch(value: &Value) -> Result<Observation, StatusError> {
    let mut outcome = Outcome::default();
    let raw = value.pointer("/metadata/state").and_then(Value::as_str);
    let error_code = rpc_error(value, &mut outcome);
    let mut status = match raw {
        Some(raw) => batch_state(raw),
        None if done(value) && error_code.is_some() => Status::Failed,
        None if done(value) => Status::Succeeded,
        None => return Err(StatusError::Malformed("no metadata.state".into())),
    };
    // google.rpc.Code 1 is CANCELLED, whatever the state field says.
    if error_code == Some(1) {
        status = Status::Cancelled;
    }
    if let Some(raw) = raw {
        outcome.provider.insert("state".into(), json!(raw));
    }
    for output in ["/metadata/output", "/response"] {
        let file = value.pointer(&format!("{output}/responsesFile"));
        if let Some(file) = file.and_then(Value::as_str) {
            outcome.add_output(file);
        }
        // Small batches carry results inline, with no file: say how many, never carry them
        // (they can be large; the destination fetches the batch).
        for inline in ["inlinedResponses", "inlinedEmbedContentResponses"] {
            if let Some(n) = count(value, &format!("{output}/{inline}/inlinedResponses")) {
                outcome
                    .provider
                    .entry("inlined_responses")
                    .or_insert(json!(n));
            }
        }
    }
    if let Some(stats) = value.pointer("/metadata/batchStats") {
        outcome.provider.insert("batch_stats".into(), stats.clone());
    }
    Ok(Observation {
        status,
        update_time_ms: time_at(value, "/metadata/updateTime"),
        details: outcome.into_details(),
    })
}

fn video(value: &Value) -> Result<Observation, StatusError> {
    let mut outcome = Outcome::default();
    let error_code = rpc_error(value, &mut outcome);
    let status = match (done(value), error_code, value.get("response")) {
        (false, _, _) => Status::Running,
        (true, Some(1), _) => Status::Cancelled,
        (true, Some(_), _) => Status::Failed,
        (true, None, Some(_)) => Status::Succeeded,
        (true, None, None) => {
            return Err(StatusError::Malformed(
                "done without error or response".into(),
            ))
        }
    };
    let response = value.pointer("/response/generateVideoResponse");
    let samples = response.and_then(|r| r.get("generatedSamples"));
    if let Some(samples) = samples.and_then(Value::as_array) {
        for uri in samples.iter().filter_map(|s| s["video"]["uri"].as_str()) {
            outcome.add_output(uri);
        }
        outcome
            .provider
            .insert("generated_samples".into(), json!(samples.len()));
    }
    for (wire, name) in [
        ("raiMediaFilteredCount", "rai_media_filtered_count"),
        ("raiMediaFilteredReasons", "rai_media_filtered_reasons"),
    ] {
        if let Some(v) = response.and_then(|r| r.get(wire)) {
            outcome.provider.insert(name.into(), v.clone());
        }
    }
    Ok(Observation {
        status,
        update_time_ms: time_at(value, "/metadata/updateTime"),
        details: outcome.into_details(),
    })
}

/// An interaction's `status` (google-genai's `InteractionStatus`). `requires_continuation`
/// waits on the client like `requires_action`; anything unlisted is unknown, never applied.
fn interaction_state(raw: &str) -> Status {
    match raw {
        "queued" => Status::Pending,
        "in_progress" => Status::Running,
        "requires_action" | "requires_continuation" => Status::RequiresAction,
        "completed" => Status::Succeeded,
        "failed" | "incomplete" | "budget_exceeded" => Status::Failed,
        "cancelled" => Status::Cancelled,
        other => Status::Unknown(other.to_string()),
    }
}

fn interaction(value: &Value) -> Result<Observation, StatusError> {
    let mut outcome = Outcome::default();
    let raw = value["status"].as_str();
    let raw = raw.ok_or_else(|| StatusError::Malformed("no status".into()))?;
    // Interactions report `errors: [{code, message}]` (code a string); take the first and
    // keep the whole list when there are more.
    if let Some(errors) = value.get("errors").and_then(Value::as_array) {
        if let Some(first) = errors.first() {
            outcome.take_error(first);
        }
        if errors.len() > 1 {
            outcome
                .provider
                .insert("errors".into(), Value::Array(errors.clone()));
        }
    }
    // A google.rpc.Status `error` is not documented here, but costs nothing to read.
    rpc_error(value, &mut outcome);
    outcome.provider.insert("state".into(), json!(raw));
    let mut details = outcome.into_details();
    // The job's own metadata, echoed by Gemini to a call made with our key: verified, unlike
    // a dynamic webhook token's claims (a registration's still wins, in the record).
    let meta = value.pointer("/webhook_config/user_metadata");
    if let Some(meta) = meta.filter(|m| m.is_object()) {
        details.insert(USER_METADATA.into(), bound(meta.clone()));
    }
    Ok(Observation {
        status: interaction_state(raw),
        update_time_ms: time_at(value, "/updated"),
        details,
    })
}

/// One page of `GET v1beta/webhooks`: the state of the webhook named `wanted` (matched on
/// its `name` or `id`, with or without a `webhooks/` prefix), its id (its `id`, else its
/// `name` without the prefix, as early answers carried it), and the next page token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookPage {
    pub state: Option<String>,
    pub id: Option<String>,
    pub next_page_token: Option<String>,
}

/// Reads a webhook listing. The envelope is undocumented: items are taken from `webhooks`,
/// the token from `next_page_token` or `nextPageToken`.
pub fn find_webhook(body: &str, wanted: &str) -> Result<WebhookPage, StatusError> {
    let value = json_of(body)?;
    let bare = |s: &str| s.trim().trim_start_matches("webhooks/").to_string();
    let wanted = bare(wanted);
    let named = |w: &Value, field: &str| w[field].as_str().is_some_and(|v| bare(v) == wanted);
    let found = value
        .get("webhooks")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|w| named(w, "name") || named(w, "id"));
    let field = |name: &str| found.and_then(|w| w.get(name)).and_then(Value::as_str);
    let state = field("state").map(str::to_string);
    // A `name` is an id only in the `webhooks/{id}` form; otherwise it is a display name.
    let id = field("id")
        .or_else(|| field("name").filter(|n| n.trim().starts_with("webhooks/")))
        .map(bare)
        .filter(|id| !id.is_empty());
    let next_page_token = ["next_page_token", "nextPageToken"]
        .iter()
        .find_map(|k| value.get(*k).and_then(Value::as_str))
        .filter(|t| !t.is_empty())
        .map(str::to_string);
    Ok(WebhookPage {
        state,
        id,
        next_page_token,
    })
}

/// The state Gemini disables a webhook with after long failure; the only one a pass restores.
pub const DISABLED_FOR_FAILURES: &str = "disabled_due_to_failed_deliveries";

/// Characters left as they are in a webhook id put in a path (RFC 3986's unreserved).
const PATH_SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The WebhookService call that enables webhook `id` again, as `npm run connect` makes it:
/// `PATCH v1beta/webhooks/{id}?update_mask=state` with this body.
pub fn enable_webhook_call(api_base: &str, id: &str) -> (String, String) {
    let id = percent_encoding::utf8_percent_encode(id, PATH_SEGMENT);
    (
        format!("{api_base}/v1beta/webhooks/{id}?update_mask=state"),
        r#"{"state":"enabled"}"#.to_string(),
    )
}

/// Reads the answer to [`enable_webhook_call`] (a 2xx's body: the webhook as it now is). It
/// is enabled when the body says `enabled`, or says no state at all (all but `id` and `uri`
/// are optional); a body naming another state, or not JSON, is not taken as enabled.
pub fn webhook_enabled(body: &str) -> Result<(), StatusError> {
    match json_of(body)?.get("state").and_then(Value::as_str) {
        None | Some("enabled") => Ok(()),
        Some(other) => Err(StatusError::Malformed(format!(
            "answered with the webhook {other}"
        ))),
    }
}

/// Whether a webhook state deserves an alert, given the state last alerted on: any state but
/// `enabled` alerts once per change; back to `enabled` clears the mark.
pub fn webhook_alert(last_alerted: Option<&str>, state: &str) -> (bool, Option<String>) {
    if state == "enabled" {
        return (false, None);
    }
    (last_alerted != Some(state), Some(state.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operation::observation::DEFAULT_RETRY_AFTER_SECS;
    use serde_json::Map;
    use Collection::*;

    fn answered(status: u16, body: Option<Result<Skimmed, SkimError>>) -> StatusAnswer {
        PeerAnswer::Http {
            status,
            body,
            retry_after: None,
        }
    }

    fn ok(c: Collection, body: &str) -> Observation {
        interpret(c, 200, None, body).unwrap()
    }

    #[test]
    fn urls_per_collection() {
        let base = "http://127.0.0.1:1/";
        assert_eq!(
            status_url(base, Batches, "batches/b", "projects/p/batches/b"),
            "http://127.0.0.1:1/v1beta/batches/b"
        );
        assert_eq!(
            status_url(
                base,
                Operations,
                "operations/o",
                "models/veo-3/operations/o"
            ),
            "http://127.0.0.1:1/v1beta/models/veo-3/operations/o"
        );
        assert_eq!(
            status_url(base, Interactions, "interactions/i", "interactions/i"),
            "http://127.0.0.1:1/v1beta/interactions/i"
        );
    }

    #[test]
    fn batch_states_with_either_prefix() {
        for (raw, want) in [
            ("BATCH_STATE_PENDING", Status::Pending),
            ("BATCH_STATE_RUNNING", Status::Running),
            ("BATCH_STATE_SUCCEEDED", Status::Succeeded),
            ("JOB_STATE_FAILED", Status::Failed),
            ("JOB_STATE_CANCELLED", Status::Cancelled),
            ("BATCH_STATE_EXPIRED", Status::Expired),
            // google-genai 3.3 `JobState` values beyond the Gemini wire's seven.
            ("JOB_STATE_QUEUED", Status::Pending),
            ("JOB_STATE_CANCELLING", Status::Running),
            ("JOB_STATE_PAUSED", Status::Running),
            ("JOB_STATE_UPDATING", Status::Running),
            (
                "JOB_STATE_PARTIALLY_SUCCEEDED",
                Status::Unknown("PARTIALLY_SUCCEEDED".into()),
            ),
        ] {
            let body = format!(
                r#"{{"name":"batches/b","metadata":{{"state":"{raw}","updateTime":"2026-01-22T12:00:00Z"}}}}"#
            );
            let o = ok(Batches, &body);
            assert_eq!(o.status, want, "{raw}");
            assert_eq!(o.update_time_ms, 1_769_083_200_000);
            assert_eq!(o.details["provider"]["state"], raw);
        }
    }

    #[test]
    fn batch_unspecified_is_unknown_and_never_applied() {
        let o = ok(
            Batches,
            r#"{"metadata":{"state":"BATCH_STATE_UNSPECIFIED"}}"#,
        );
        assert_eq!(o.status, Status::Unknown("UNSPECIFIED".into()));
        assert_eq!(o.status.rank(), -1);
    }

    #[test]
    fn cancelling_is_not_terminal_and_unspecified_job_state_is_unknown() {
        let o = ok(
            Batches,
            r#"{"metadata":{"state":"JOB_STATE_CANCELLING"},"done":false}"#,
        );
        assert!(!o.status.is_terminal());
        let o = ok(Batches, r#"{"metadata":{"state":"JOB_STATE_UNSPECIFIED"}}"#);
        assert_eq!(o.status.rank(), -1);
        let o = ok(Batches, r#"{"metadata":{"state":"BATCH_STATE_EXPLODED"}}"#);
        assert_eq!(o.status, Status::Unknown("EXPLODED".into()));
    }

    #[test]
    fn batch_output_file_from_metadata_or_response() {
        let o = ok(
            Batches,
            r#"{"done":true,"metadata":{"state":"BATCH_STATE_SUCCEEDED","output":{"responsesFile":"files/out-1"},
                "batchStats":{"requestCount":"2","successfulRequestCount":"2"}}}"#,
        );
        assert_eq!(o.details["output_file_uri"], "files/out-1");
        assert_eq!(o.details["output_file_uris"], json!(["files/out-1"]));
        assert_eq!(o.details["error_code"], Value::Null);
        assert_eq!(o.details["provider"]["batch_stats"]["requestCount"], "2");
        assert!(!o.details.contains_key("output_file"), "old name is gone");
        let o = ok(
            Batches,
            r#"{"done":true,"metadata":{"state":"BATCH_STATE_SUCCEEDED"},"response":{"responsesFile":"files/out-2"}}"#,
        );
        assert_eq!(o.details["output_file_uri"], "files/out-2");
    }

    #[test]
    fn inline_batch_results_are_counted_not_carried() {
        let o = ok(
            Batches,
            r#"{"done":true,"metadata":{"state":"BATCH_STATE_SUCCEEDED","output":{"inlinedResponses":
                {"inlinedResponses":[{"response":{"text":"big"}},{"response":{"text":"bigger"}}]}}}}"#,
        );
        assert_eq!(o.details["output_file_uri"], Value::Null);
        assert_eq!(o.details["output_file_uris"], json!([]));
        assert_eq!(o.details["provider"]["inlined_responses"], 2);
        assert!(!Value::Object(o.details).to_string().contains("bigger"));
    }

    #[test]
    fn a_skimmed_answer_of_twenty_megabytes_reads_like_a_small_one() {
        let item = json!({"response": {"candidates": [{"content": {"parts": [{"text": "y".repeat(10_000)}]}}]}})
            .to_string();
        let body = |n: usize| {
            let items = vec![item.as_str(); n].join(",");
            format!(
                r#"{{"name":"batches/b","done":true,"metadata":{{"state":"BATCH_STATE_SUCCEEDED","updateTime":"2026-01-22T12:00:00Z",
                "batchStats":{{"requestCount":"{n}","successfulRequestCount":"{n}"}},"output":{{"inlinedResponses":{{"inlinedResponses":[{items}]}}}}}},
                "response":{{"inlinedResponses":{{"inlinedResponses":[{items}]}}}}}}"#
            )
        };
        let big = body(1_100);
        assert!(big.len() > 20_000_000);
        let skimmed = crate::skim::skim(READ, big.as_bytes());
        let from_skim = interpret_skimmed(Batches, &answered(200, Some(skimmed.clone()))).unwrap();
        assert_eq!(from_skim.status, Status::Succeeded);
        assert_eq!(from_skim.details["provider"]["inlined_responses"], 1_100);
        // The same details as the whole document parsed in memory.
        assert_eq!(from_skim, ok(Batches, &big));
        assert!(skimmed.unwrap().bytes_kept < 1_000);
    }

    #[test]
    fn every_reader_reads_a_skimmed_answer_like_the_whole_one() {
        let cases = [
            (
                Batches,
                r#"{"name":"batches/b","done":true,"metadata":{"@type":"x","model":"m","state":"BATCH_STATE_SUCCEEDED",
                "updateTime":"2026-01-22T12:00:00Z","createTime":"2026-01-22T11:00:00Z","displayName":"d",
                "inputConfig":{"requests":{"requests":[{"request":{"contents":[{"parts":[{"text":"hi"}]}]},"metadata":{"key":"a"}}]}},
                "batchStats":{"requestCount":"2","successfulRequestCount":"1","failedRequestCount":"1"},
                "output":{"responsesFile":"files/out","inlinedResponses":{"inlinedResponses":[{"response":{}},{"error":{"code":3}}]}}},
                "response":{"@type":"y","responsesFile":"files/out","inlinedResponses":{"inlinedResponses":[{},{}]}}}"#,
            ),
            (
                Batches,
                r#"{"done":true,"metadata":{"state":"BATCH_STATE_SUCCEEDED","output":{"inlinedEmbedContentResponses":
                {"inlinedResponses":[{"response":{"embedding":{"values":[0.1,0.2]}}}]}}}}"#,
            ),
            (
                Batches,
                r#"{"done":true,"metadata":{"state":"BATCH_STATE_FAILED"},"error":{"code":13,"message":"internal",
                "details":[{"@type":"t","reason":"R","metadata":{"k":"v"}}],"status":"INTERNAL"}}"#,
            ),
            (Batches, r#"{"done":true,"error":{"code":1}}"#),
            (Batches, r#"{"done":true}"#),
            (
                Batches,
                r#"{"metadata":{"state":"JOB_STATE_RUNNING"},"done":false}"#,
            ),
            (
                Operations,
                r#"{"name":"models/veo/operations/o","done":true,"metadata":{"updateTime":"2026-01-22T12:00:00Z"},
                "response":{"@type":"x","generateVideoResponse":{"generatedSamples":[{"video":{"uri":"files/v1","videoBytes":"AAAA","mimeType":"video/mp4"}},
                {"video":{"uri":"files/v2"}},{"other":1}],"raiMediaFilteredCount":1,"raiMediaFilteredReasons":["r"]}}}"#,
            ),
            (Operations, r#"{"done":true,"response":{}}"#),
            (
                Operations,
                r#"{"done":true,"error":{"code":3,"message":"bad prompt"}}"#,
            ),
            (Operations, r#"{"done":false,"metadata":{}}"#),
            (
                Interactions,
                r#"{"id":"i","status":"completed","updated":"2026-01-22T12:00:01Z","created":"2026-01-22T12:00:00Z",
                "model":"m","input":[{"type":"image","data":"AAAA"}],"outputs":[{"type":"text","text":"hello"},{"type":"image","data":"BBBB"}],
                "usage":{"total_tokens":5},"webhook_config":{"uris":["https://x"],"user_metadata":{"job":"j1"}}}"#,
            ),
            (
                Interactions,
                r#"{"status":"failed","errors":[{"code":"X","message":"m"},{"code":"Y","message":"n"}]}"#,
            ),
            (Interactions, r#"{"status":"requires_action","outputs":[]}"#),
        ];
        for (collection, body) in cases {
            let whole = interpret(collection, 200, None, body);
            let skimmed = crate::skim::skim(READ, body.as_bytes());
            assert_eq!(
                interpret_skimmed(collection, &answered(200, Some(skimmed.clone()))),
                whole,
                "{body}"
            );
        }
    }

    #[test]
    fn a_refused_body_is_unusable_with_its_reason_and_errors_need_no_body() {
        let refused = Err(crate::skim::SkimError::KeptTooLarge);
        match interpret_skimmed(Batches, &answered(200, Some(refused.clone()))) {
            Err(StatusError::Malformed(reason)) => assert!(reason.contains("larger than")),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            interpret_skimmed(Batches, &answered(404, None)),
            Err(StatusError::NotFound)
        );
        assert!(matches!(
            interpret_skimmed(Batches, &answered(200, None)),
            Err(StatusError::Malformed(_))
        ));
        for unanswered in [PeerAnswer::Timeout, PeerAnswer::Network("reset".into())] {
            assert_eq!(
                interpret_skimmed(Batches, &unanswered),
                Err(StatusError::Transient {
                    retry_after_secs: 0
                })
            );
        }
    }

    #[test]
    fn video_output_is_the_first_sample_and_all_are_listed() {
        let o = ok(
            Operations,
            r#"{"done":true,"response":{"@type":"x","generateVideoResponse":{"generatedSamples":[
                {"video":{"uri":"files/v1"}},{"video":{"uri":"files/v2"}}],"raiMediaFilteredCount":0}}}"#,
        );
        assert_eq!(o.status, Status::Succeeded);
        assert_eq!(o.details["output_file_uri"], "files/v1");
        assert_eq!(
            o.details["output_file_uris"],
            json!(["files/v1", "files/v2"])
        );
        assert_eq!(o.details["provider"]["generated_samples"], 2);
        assert_eq!(o.details["provider"]["rai_media_filtered_count"], 0);
    }

    #[test]
    fn an_interactions_echoed_user_metadata_is_its_verified_metadata() {
        let o = interpret(
            Interactions,
            200,
            None,
            r#"{"status":"completed","webhook_config":{"uris":["https://x"],"user_metadata":{"tenant":"t1"}}}"#,
        )
        .unwrap();
        assert_eq!(o.details[USER_METADATA], json!({"tenant": "t1"}));
        assert!(o.details["provider"].get("webhook_config").is_none());
        let o = interpret(
            Interactions,
            200,
            None,
            r#"{"status":"completed","webhook_config":{"user_metadata":"x"}}"#,
        )
        .unwrap();
        assert!(o.details.get(USER_METADATA).is_none(), "only an object");
    }

    #[test]
    fn interaction_error_is_the_first_of_errors() {
        let o = ok(
            Interactions,
            r#"{"id":"i","status":"failed","errors":[{"code":"RESOURCE_EXHAUSTED","message":"quota"},
                {"code":"INTERNAL","message":"later"}]}"#,
        );
        assert_eq!(o.status, Status::Failed);
        assert_eq!(o.details["error_code"], "RESOURCE_EXHAUSTED");
        assert_eq!(o.details["error_message"], "quota");
        assert_eq!(o.details["provider"]["errors"][1]["code"], "INTERNAL");
        let single = ok(
            Interactions,
            r#"{"status":"failed","errors":[{"code":"X","message":"m"}]}"#,
        );
        assert!(single.details["provider"].get("errors").is_none());
    }

    #[test]
    fn batch_error_code_one_means_cancelled() {
        let o = ok(
            Batches,
            r#"{"done":true,"metadata":{"state":"BATCH_STATE_FAILED"},"error":{"code":1,"message":"cancelled by user"}}"#,
        );
        assert_eq!(o.status, Status::Cancelled);
        assert_eq!(o.details["error_message"], "cancelled by user");
    }

    #[test]
    fn batch_failure_keeps_its_error() {
        let o = ok(
            Batches,
            r#"{"done":true,"metadata":{"state":"BATCH_STATE_FAILED"},"error":{"code":13,"message":"internal"}}"#,
        );
        assert_eq!(o.status, Status::Failed);
        assert_eq!(o.details["error_code"], 13);
        assert_eq!(o.details["error_message"], "internal");
    }

    #[test]
    fn video_operation_states() {
        assert_eq!(ok(Operations, r#"{"name":"x"}"#).status, Status::Running);
        assert_eq!(ok(Operations, r#"{"done":false}"#).status, Status::Running);
        assert_eq!(
            ok(
                Operations,
                r#"{"done":true,"response":{"generateVideoResponse":{}}}"#
            )
            .status,
            Status::Succeeded
        );
        assert_eq!(
            ok(
                Operations,
                r#"{"done":true,"error":{"code":3,"message":"bad prompt"}}"#
            )
            .status,
            Status::Failed
        );
        assert_eq!(
            ok(Operations, r#"{"done":true,"error":{"code":1}}"#).status,
            Status::Cancelled
        );
        assert!(matches!(
            interpret(Operations, 200, None, r#"{"done":true}"#),
            Err(StatusError::Malformed(_))
        ));
    }

    #[test]
    fn interaction_states() {
        for (raw, want) in [
            ("queued", Status::Pending),
            ("in_progress", Status::Running),
            ("requires_action", Status::RequiresAction),
            ("requires_continuation", Status::RequiresAction),
            ("completed", Status::Succeeded),
            ("failed", Status::Failed),
            ("incomplete", Status::Failed),
            ("budget_exceeded", Status::Failed),
            ("cancelled", Status::Cancelled),
        ] {
            let body = format!(r#"{{"id":"i","status":"{raw}","updated":"2026-01-22T12:00:01Z"}}"#);
            let o = ok(Interactions, &body);
            assert_eq!(o.status, want, "{raw}");
            assert_eq!(o.details["provider"]["state"], raw);
            assert_eq!(o.update_time_ms, 1_769_083_201_000);
        }
        assert_eq!(
            ok(Interactions, r#"{"status":"teleported"}"#).status,
            Status::Unknown("teleported".into())
        );
    }

    #[test]
    fn http_errors_settle_nothing() {
        assert_eq!(
            interpret(Batches, 404, None, ""),
            Err(StatusError::NotFound)
        );
        assert_eq!(
            interpret(Batches, 429, Some("120"), ""),
            Err(StatusError::Transient {
                retry_after_secs: 120
            })
        );
        assert_eq!(
            interpret(Batches, 503, None, ""),
            Err(StatusError::Transient {
                retry_after_secs: DEFAULT_RETRY_AFTER_SECS
            })
        );
        assert_eq!(
            interpret(Batches, 500, Some("Wed, 21 Oct 2026 07:28:00 GMT"), ""),
            Err(StatusError::Transient {
                retry_after_secs: DEFAULT_RETRY_AFTER_SECS
            })
        );
        assert_eq!(
            interpret(Batches, 403, None, ""),
            Err(StatusError::Refused(403))
        );
    }

    #[test]
    fn webhook_listing_finds_the_state_by_name_or_id() {
        let body = r#"{"webhooks":[{"id":"a1","name":"webhooks/other","state":"enabled"},
            {"id":"w7","name":"webhooks/gemini-once","state":"disabled_due_to_failed_deliveries"}],
            "nextPageToken":"p2"}"#;
        let page = find_webhook(body, "gemini-once").unwrap();
        assert_eq!(
            page.state.as_deref(),
            Some("disabled_due_to_failed_deliveries")
        );
        assert_eq!(page.next_page_token.as_deref(), Some("p2"));
        assert_eq!(page.id.as_deref(), Some("w7"));
        assert_eq!(find_webhook(body, "webhooks/w7").unwrap().state, page.state);
        let missing = find_webhook(r#"{"webhooks":[],"next_page_token":""}"#, "x").unwrap();
        assert_eq!(
            missing,
            WebhookPage {
                state: None,
                id: None,
                next_page_token: None
            }
        );
        assert!(find_webhook("nope", "x").is_err());
    }

    #[test]
    fn a_webhook_without_an_id_field_is_known_by_its_resource_name_only() {
        let page = |w: Value| find_webhook(&json!({ "webhooks": [w] }).to_string(), "gemini-once");
        let early = page(json!({"name": "webhooks/gemini-once", "state": "disabled"})).unwrap();
        assert_eq!(early.id.as_deref(), Some("gemini-once"));
        // A display name is not an id: nothing to address a PATCH to.
        let display = page(json!({"name": "gemini-once", "state": "disabled"})).unwrap();
        assert_eq!(display.state.as_deref(), Some("disabled"));
        assert_eq!(display.id, None);
    }

    #[test]
    fn the_enabling_call_is_connects_update_mask_patch() {
        let (url, body) = enable_webhook_call("https://g", "ab-9_x");
        assert_eq!(url, "https://g/v1beta/webhooks/ab-9_x?update_mask=state");
        assert_eq!(body, r#"{"state":"enabled"}"#);
        let (url, _) = enable_webhook_call("https://g", "a/b?c");
        assert_eq!(url, "https://g/v1beta/webhooks/a%2Fb%3Fc?update_mask=state");
    }

    #[test]
    fn an_enabling_answer_counts_only_when_it_does_not_name_another_state() {
        assert_eq!(webhook_enabled(r#"{"id":"w","state":"enabled"}"#), Ok(()));
        assert_eq!(webhook_enabled(r#"{"id":"w"}"#), Ok(()));
        assert!(webhook_enabled(r#"{"state":"disabled"}"#).is_err());
        assert!(webhook_enabled("").is_err());
    }

    #[test]
    fn webhook_alerts_once_per_state_change() {
        assert_eq!(webhook_alert(None, "enabled"), (false, None));
        let (alert, mark) = webhook_alert(None, "disabled_due_to_failed_deliveries");
        assert!(alert);
        assert!(!webhook_alert(mark.as_deref(), "disabled_due_to_failed_deliveries").0);
        assert!(webhook_alert(mark.as_deref(), "disabled").0);
        assert_eq!(webhook_alert(mark.as_deref(), "enabled"), (false, None));
    }

    #[test]
    fn malformed_answers_are_values() {
        for body in ["", "not json", "[]", "{}", r#"{"metadata":{"state":7}}"#] {
            assert!(
                matches!(
                    interpret(Batches, 200, None, body),
                    Err(StatusError::Malformed(_))
                ),
                "{body}"
            );
        }
        assert!(matches!(
            interpret(Interactions, 200, None, r#"{"status":null}"#),
            Err(StatusError::Malformed(_))
        ));
    }

    mod skimmed_like_whole {
        use super::*;
        use proptest::prelude::*;

        /// Names the readers look for, and some they do not.
        const NAMES: &[&str] = &[
            "done",
            "error",
            "metadata",
            "state",
            "updateTime",
            "batchStats",
            "output",
            "responsesFile",
            "inlinedResponses",
            "inlinedEmbedContentResponses",
            "response",
            "generateVideoResponse",
            "generatedSamples",
            "video",
            "uri",
            "raiMediaFilteredCount",
            "raiMediaFilteredReasons",
            "status",
            "errors",
            "updated",
            "code",
            "message",
            "details",
            "inputConfig",
            "outputs",
            "x",
        ];
        const STRINGS: &[&str] = &[
            "BATCH_STATE_SUCCEEDED",
            "JOB_STATE_RUNNING",
            "completed",
            "failed",
            "files/a",
            "gs://b/o",
            "2026-01-22T12:00:00Z",
            "",
            "é😀\"",
        ];

        fn arb_tree() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                (-3i64..20).prop_map(|n| json!(n)),
                prop::sample::select(STRINGS).prop_map(|s| json!(s)),
            ];
            leaf.prop_recursive(6, 64, 5, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                    object(inner, 5),
                ]
            })
        }

        fn object(
            values: impl Strategy<Value = Value>,
            most: usize,
        ) -> impl Strategy<Value = Value> {
            prop::collection::vec((prop::sample::select(NAMES), values), 0..most).prop_map(|m| {
                Value::Object(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            })
        }

        /// An answer shaped like the API's, members optional, with random trees inside.
        fn arb_answer() -> impl Strategy<Value = Value> {
            let string = || prop::sample::select(STRINGS).prop_map(|s| json!(s));
            let output = (
                prop::option::of(string()),
                prop::option::of(arb_tree()),
                prop::option::of(arb_tree()),
            )
                .prop_map(|(file, inline, embed)| {
                    let mut o = Map::new();
                    o.extend(file.map(|f| ("responsesFile".to_string(), f)));
                    o.extend(inline.map(|i| {
                        (
                            "inlinedResponses".to_string(),
                            json!({"inlinedResponses": i}),
                        )
                    }));
                    o.extend(embed.map(|e| {
                        (
                            "inlinedEmbedContentResponses".to_string(),
                            json!({"inlinedResponses": e}),
                        )
                    }));
                    Value::Object(o)
                })
                .boxed();
            let metadata = (
                prop::option::of(string()),
                prop::option::of(string()),
                prop::option::of(arb_tree()),
                prop::option::of(output.clone()),
            )
                .prop_map(|(state, time, stats, output)| {
                    let mut m = Map::new();
                    m.extend(state.map(|v| ("state".to_string(), v)));
                    m.extend(time.map(|v| ("updateTime".to_string(), v)));
                    m.extend(stats.map(|v| ("batchStats".to_string(), v)));
                    m.extend(output.map(|v| ("output".to_string(), v)));
                    Value::Object(m)
                });
            let samples = prop::collection::vec(
                prop_oneof![
                    string().prop_map(|u| json!({"video": {"uri": u, "videoBytes": "AAAA"}})),
                    arb_tree()
                ],
                0..4,
            );
            let response = prop_oneof![
                output,
                (samples, prop::option::of(arb_tree())).prop_map(|(s, n)| json!({"generateVideoResponse": {"generatedSamples": s, "raiMediaFilteredCount": n}})),
                arb_tree(),
            ];
            let error = prop_oneof![
                (0i64..16, string(), arb_tree())
                    .prop_map(|(c, m, d)| json!({"code": c, "message": m, "details": d})),
                arb_tree(),
            ];
            (
                prop::option::of(any::<bool>()),
                prop::option::of(error),
                prop::option::of(metadata),
                prop::option::of(response),
                prop::option::of(string()),
                prop::option::of(prop::collection::vec(arb_tree(), 0..3)),
                prop::option::of(string()),
                object(arb_tree(), 3),
            )
                .prop_map(
                    |(done, error, metadata, response, status, errors, updated, extra)| {
                        let mut a = match extra {
                            Value::Object(m) => m,
                            _ => Map::new(),
                        };
                        a.extend(done.map(|v| ("done".to_string(), json!(v))));
                        a.extend(error.map(|v| ("error".to_string(), v)));
                        a.extend(metadata.map(|v| ("metadata".to_string(), v)));
                        a.extend(response.map(|v| ("response".to_string(), v)));
                        a.extend(status.map(|v| ("status".to_string(), v)));
                        a.extend(errors.map(|v| ("errors".to_string(), Value::Array(v))));
                        a.extend(updated.map(|v| ("updated".to_string(), v)));
                        Value::Object(a)
                    },
                )
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]
            #[test]
            fn every_reader_reads_any_skimmed_answer_like_the_whole_one(answer in arb_answer()) {
                let body = answer.to_string();
                let skimmed = crate::skim::skim(READ, body.as_bytes());
                for collection in [Batches, Operations, Interactions] {
                    prop_assert_eq!(
                        interpret_skimmed(collection, &answered(200, Some(skimmed.clone()))),
                        interpret(collection, 200, None, &body)
                    );
                }
            }
        }
    }

    #[test]
    fn a_status_call_is_counted_by_how_it_ended() {
        let http = |status: u16| PeerAnswer::Http {
            status,
            body: (),
            retry_after: None,
        };
        let classes: Vec<_> = [
            http(200),
            http(204),
            http(404),
            http(429),
            http(503),
            http(403),
            PeerAnswer::TooLarge {
                status: 200,
                cap: 1,
            },
            PeerAnswer::Timeout,
            PeerAnswer::Network("reset".into()),
        ]
        .iter()
        .map(|a| crate::telemetry::log_event::name_of(&call_answer(a)))
        .collect();
        assert_eq!(
            classes,
            [
                "answered",
                "answered",
                "not_found",
                "refused",
                "refused",
                "refused",
                "answered",
                "unanswered",
                "unanswered"
            ]
        );
    }
}
