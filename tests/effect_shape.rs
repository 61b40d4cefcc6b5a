//! One side-effect body whichever path settled an operation: the same outcome delivered by
//! webhook (through the envelope parser) and recovered by the cron (through the status API's
//! reader) gives the same fields with the same types, and outside values arrive bounded.

use serde_json::{json, Map, Value};

use gemini_once::operation::details;
use gemini_once::operation::details::normalize_details;
use gemini_once::operation::effect::effect_body;
use gemini_once::operation::key::Collection;
use gemini_once::operation::lifecycle::{Source, Status};
use gemini_once::operation::{OpEvent, Operation};

/// The top-level fields of a body and the JSON type of each: what a destination relies on.
fn shape(body: &Value) -> Vec<(String, &'static str)> {
    let kind = |v: &Value| match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    body.as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), kind(v)))
        .collect()
}

fn settled(status: Status, source: Source, details: Map<String, Value>) -> Value {
    let mut op = Operation::register("k/1", "k/1", Some("any".into()), 0);
    let event = OpEvent {
        status,
        update_time_ms: 0,
        source,
        details,
        delivery_id: None,
    };
    op.apply(&event, 1_000);
    effect_body(&op)
}

fn by_webhook(event_type: &str, data: &str, status: Status) -> Value {
    let body = format!(r#"{{"type":"{event_type}","data":{{"id":"k/1",{data}}}}}"#);
    let envelope = gemini_once::inbound::envelope::parse(body.as_bytes()).unwrap();
    settled(status, Source::Webhook, envelope.details)
}

fn by_status_api(collection: Collection, answer: &str) -> Value {
    let o = gemini_once::reconciliation::status::interpret(collection, 200, None, answer).unwrap();
    assert!(o.status.is_terminal(), "{answer}");
    settled(o.status, Source::Reconcile, o.details)
}

/// The same outcome settled both ways: same fields, same types; the values asserted too.
fn same_shape(webhook: &Value, cron: &Value) {
    assert_eq!(
        shape(webhook),
        shape(cron),
        "\nwebhook {webhook}\ncron {cron}"
    );
    for body in [webhook, cron] {
        for loose in [
            "output_file",
            "gemini_state",
            "gemini_status",
            "file_name",
            "errors",
        ] {
            assert!(body.get(loose).is_none(), "{loose} loose in {body}");
        }
    }
}

#[test]
fn batch_succeeded_has_one_shape_by_webhook_and_by_status_api() {
    let w = by_webhook(
        "batch.succeeded",
        r#""output_file_uri":"gs://b/out.jsonl""#,
        Status::Succeeded,
    );
    let c = by_status_api(
        Collection::Batches,
        r#"{"done":true,"metadata":{"state":"BATCH_STATE_SUCCEEDED","output":{"responsesFile":"files/out"}}}"#,
    );
    same_shape(&w, &c);
    assert_eq!(w["output_file_uri"], "gs://b/out.jsonl");
    assert_eq!(c["output_file_uri"], "files/out");
    assert_eq!(c["output_file_uris"], json!(["files/out"]));
    assert_eq!(c["provider"]["state"], "BATCH_STATE_SUCCEEDED");
    assert_eq!(c["error_code"], Value::Null);
}

#[test]
fn batch_failed_has_one_shape_by_webhook_and_by_status_api() {
    let w = by_webhook(
        "batch.failed",
        r#""error_code":13,"error_message":"boom""#,
        Status::Failed,
    );
    let c = by_status_api(
        Collection::Batches,
        r#"{"done":true,"metadata":{"state":"BATCH_STATE_FAILED"},"error":{"code":13,"message":"boom"}}"#,
    );
    same_shape(&w, &c);
    for body in [&w, &c] {
        assert_eq!(body["error_code"], 13);
        assert_eq!(body["error_message"], "boom");
        assert_eq!(body["output_file_uri"], Value::Null);
    }
}

#[test]
fn video_succeeded_has_one_shape_by_webhook_and_by_status_api() {
    let w = by_webhook(
        "video.generated",
        r#""output_file_uri":"gs://v/1.mp4","file_name":"files/1""#,
        Status::Succeeded,
    );
    let c = by_status_api(
        Collection::Operations,
        r#"{"done":true,"response":{"generateVideoResponse":{"generatedSamples":[{"video":{"uri":"files/v1"}}]}}}"#,
    );
    same_shape(&w, &c);
    assert_eq!(w["output_file_uri"], "gs://v/1.mp4");
    assert_eq!(w["provider"]["file_name"], "files/1");
    assert_eq!(c["output_file_uri"], "files/v1");
}

#[test]
fn a_video_s_video_uri_is_its_output_location() {
    let w = by_webhook(
        "video.generated",
        r#""video_uri":"gs://v/2.mp4","file_name":"files/2""#,
        Status::Succeeded,
    );
    assert_eq!(w["output_file_uri"], "gs://v/2.mp4");
    assert_eq!(w["output_file_uris"], json!(["gs://v/2.mp4"]));
    assert!(w["provider"].get("video_uri").is_none());
    let both = by_webhook(
        "video.generated",
        r#""video_uri":"gs://v/b.mp4","output_file_uri":"gs://v/a.mp4""#,
        Status::Succeeded,
    );
    assert_eq!(
        both["output_file_uri"], "gs://v/a.mp4",
        "output_file_uri first"
    );
    assert_eq!(
        both["output_file_uris"],
        json!(["gs://v/a.mp4", "gs://v/b.mp4"])
    );
    let odd = by_webhook("video.generated", r#""video_uri":7"#, Status::Succeeded);
    assert_eq!(odd["output_file_uri"], Value::Null);
    assert_eq!(
        odd["provider"]["video_uri"], 7,
        "not a location: kept as detail"
    );
}

#[test]
fn outside_values_are_bounded_on_the_way_in() {
    let deep = format!("{}1{}", "{\"a\":".repeat(100), "}".repeat(100));
    let w = by_webhook(
        "batch.succeeded",
        &format!(
            r#""user_metadata":{deep},"extra":{deep},"error_message":"{}""#,
            "m".repeat(40_000)
        ),
        Status::Succeeded,
    );
    assert_eq!(w["user_metadata"]["truncated"], true);
    assert_eq!(w["user_metadata"]["reason"], "too_deep");
    assert_eq!(w["provider"]["extra"]["reason"], "too_deep");
    assert!(w["error_message"].as_str().unwrap().len() <= details::MAX_BYTES);
    // The body reads back, and normalizing again changes nothing.
    let text = w.to_string();
    let back: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(back, w);
    let details = normalize_details(w.as_object().unwrap());
    assert_eq!(normalize_details(&details), details);
}

#[test]
fn video_failed_has_one_shape_by_webhook_data_and_by_status_api() {
    // No webhook type reports a failed video (google-genai 3.3 subscribes only to
    // `video.generated`); the webhook side is what such `data` would normalize to.
    let data = json!({"error_code": 3, "error_message": "bad prompt"});
    let w = settled(
        Status::Failed,
        Source::Webhook,
        normalize_details(data.as_object().unwrap()),
    );
    let c = by_status_api(
        Collection::Operations,
        r#"{"done":true,"error":{"code":3,"message":"bad prompt"}}"#,
    );
    same_shape(&w, &c);
    assert_eq!(c["error_code"], 3);
    assert_eq!(c["error_message"], "bad prompt");
}

#[test]
fn interaction_succeeded_has_one_shape_by_webhook_and_by_status_api() {
    let w = by_webhook("interaction.completed", r#""x":1"#, Status::Succeeded);
    let c = by_status_api(
        Collection::Interactions,
        r#"{"id":"i","status":"completed","outputs":[{"type":"text","text":"hi"}]}"#,
    );
    same_shape(&w, &c);
    assert_eq!(w["provider"]["x"], 1);
    assert_eq!(c["provider"]["state"], "completed");
}

#[test]
fn interaction_failed_has_one_shape_by_webhook_and_by_status_api() {
    let w = by_webhook(
        "interaction.failed",
        r#""error_code":"RESOURCE_EXHAUSTED","error_message":"quota""#,
        Status::Failed,
    );
    let c = by_status_api(
        Collection::Interactions,
        r#"{"id":"i","status":"failed","errors":[{"code":"RESOURCE_EXHAUSTED","message":"quota"}]}"#,
    );
    same_shape(&w, &c);
    for body in [&w, &c] {
        assert_eq!(body["error_code"], "RESOURCE_EXHAUSTED");
        assert_eq!(body["error_message"], "quota");
    }
}

#[test]
fn interaction_errors_in_webhook_data_are_read_too() {
    let w = by_webhook(
        "interaction.failed",
        r#""errors":[{"code":"INTERNAL","message":"m"}]"#,
        Status::Failed,
    );
    assert_eq!(w["error_code"], "INTERNAL");
    assert_eq!(w["error_message"], "m");
}
