//! Every field a record stores from outside, at its limits: the deepest and largest values a
//! delivery, a dynamic-webhook nudge or a status-API answer can bring (anything deeper does not
//! parse at all) reach the record bounded, and the record, the gate's commands and its answers
//! all read back after a write (an object that reloads, a reply the edge decodes).

use serde_json::{json, Map, Value};

use gemini_once::inbound::envelope;
use gemini_once::operation::details::{self, MAX_BYTES, MAX_DEPTH};
use gemini_once::operation::gate::alarm;
use gemini_once::operation::gate::protocol::{GateCommand, GateReply};
use gemini_once::operation::gate::{self, GateLimits};
use gemini_once::operation::key::Collection;
use gemini_once::operation::lifecycle::Status;
use gemini_once::operation::Operation;
use gemini_once::reconciliation::status;
use gemini_once::retry::Backoff;

const LIMITS: GateLimits = GateLimits {
    retention_ms: 1_000_000,
    stats_delay_ms: 0,
    claim_ttl_ms: 10_000,
    retry: Backoff::new(1_000, 8_000),
    unregistered_hold_ms: 0,
    confirm_interval_ms: 0,
    desk_fallback_ms: 60_000,
    effect_alert_after_ms: 3_600_000,
};

/// `levels` nested objects as JSON text, built as text.
fn nested(levels: usize) -> String {
    format!("{}1{}", "{\"a\":".repeat(levels), "}".repeat(levels))
}

/// The deepest value that still parses at `at` levels below a body's top.
fn deepest_below(at: usize) -> String {
    nested(127 - at)
}

fn reads_back<T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug>(
    what: &str,
    value: &T,
) {
    let text = serde_json::to_string(value).unwrap();
    let back: T = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(&back, value, "{what}");
}

fn assert_bounded(v: &Value, what: &str) {
    assert!(
        details::depth(v) <= MAX_DEPTH,
        "{what} depth {}",
        details::depth(v)
    );
    let size = v.as_str().map_or_else(|| v.to_string().len(), str::len);
    assert!(size <= MAX_BYTES, "{what} size");
}

#[test]
fn a_signed_delivery_at_the_limits_gives_a_record_that_reads_back() {
    // Top-level `user_metadata` sits 1 level down, `data.*` 2 levels down.
    let body = format!(
        r#"{{"type":"batch.succeeded","user_metadata":{},"data":{{"id":"batches/lim","x":{},"output_file_uri":"gs://o","error_message":"{}"}}}}"#,
        deepest_below(1),
        deepest_below(2),
        "e".repeat(3 * MAX_BYTES),
    );
    assert!(
        serde_json::from_str::<Value>(&body).is_ok(),
        "at the limit it parses"
    );
    let e = envelope::parse(body.as_bytes()).unwrap();
    assert_eq!(e.details["user_metadata"]["reason"], "too_deep");
    assert_eq!(e.details["provider"]["x"]["reason"], "too_deep");
    let command = GateCommand::Deliver {
        key: "batches/lim".into(),
        name: "batches/lim".into(),
        event: gemini_once::operation::OpEvent {
            status: Status::Succeeded,
            update_time_ms: 0,
            source: gemini_once::operation::lifecycle::Source::Webhook,
            details: e.details,
            delivery_id: Some("msg_1".into()),
        },
        require_registration: false,
        hold_ms: 0,
        new_not_before_ms: 0,
    };
    reads_back("the command to the gate", &command);
    let step = gate::step(None, command, 1_000);
    let op = step.record.clone().unwrap();
    reads_back("the record", &op);
    for (k, v) in op.details() {
        assert_bounded(v, k);
    }
    reads_back("the answer", &step.reply);
    let found = gate::step(Some(op.clone()), GateCommand::Inspect, 2_000).reply;
    reads_back("the inspection", &found);
    let body = gemini_once::operation::effect::effect_body(&op);
    assert_eq!(body["output_file_uri"], "gs://o");
    reads_back("the side effect's body", &body);
}

#[test]
fn a_nudge_at_the_limits_gives_a_record_that_reads_back_before_and_after_confirmation() {
    // The body's (or the token's) `user_metadata` becomes `unverified_user_metadata`, nested
    // deeper in the command and deeper still in the record's confirmation; a confirmation an
    // earlier version stored as `user_metadata` travels as unverified too.
    let body = format!(
        r#"{{"type":"batch.succeeded","user_metadata":{},"data":{{"id":"batches/nudge"}}}}"#,
        deepest_below(1)
    );
    let e = envelope::parse(body.as_bytes()).unwrap();
    // A token's claims parse under the same limit: its `user_metadata` one level down.
    let claims: Value =
        serde_json::from_str(&format!(r#"{{"user_metadata":{}}}"#, deepest_below(1))).unwrap();
    for (label, meta) in [
        (
            "unverified_user_metadata",
            e.details["user_metadata"].clone(),
        ),
        (
            "user_metadata",
            details::bound(claims["user_metadata"].clone()),
        ),
    ] {
        let mut metadata = Map::new();
        metadata.insert(label.into(), meta);
        let command = GateCommand::Nudge {
            key: "batches/nudge".into(),
            name: "batches/nudge".into(),
            claimed: "succeeded".into(),
            metadata,
            delivery_id: "jwt_1".into(),
            confirm_interval_ms: 60_000,
        };
        reads_back("the nudge", &command);
        let held = Operation::register("batches/nudge", "batches/nudge", None, 500);
        let op = gate::step(Some(held), command, 1_000).record.unwrap();
        reads_back("the record awaiting confirmation", &op);
        let answer = status::interpret(
            Collection::Batches,
            200,
            None,
            r#"{"name":"batches/nudge","metadata":{"state":"BATCH_STATE_SUCCEEDED"},"done":true}"#,
        );
        let op = alarm::confirmed(op, answer, 2_000, &LIMITS, 0.5)
            .record
            .unwrap();
        assert_eq!(op.status(), &Status::Succeeded);
        let unverified = &op.details()["unverified_user_metadata"];
        assert_eq!(unverified["reason"], "too_deep", "{label}");
        assert!(op.details().get("user_metadata").is_none(), "{label}");
        reads_back("the confirmed record", &op);
    }
}

#[test]
fn a_status_answer_at_the_limits_gives_details_that_read_back() {
    // Members of an interaction's answer land in `provider`, two levels below the record's top.
    let answer = format!(
        r#"{{"id":"i","status":"completed","usage":{},"outputs":[{{"type":"text","text":"{}"}}]}}"#,
        deepest_below(1),
        "t".repeat(2 * MAX_BYTES)
    );
    let o = status::interpret(Collection::Interactions, 200, None, &answer).unwrap();
    let mut op = Operation::register("interactions/i", "interactions/i", None, 0);
    op.apply(
        &gemini_once::operation::OpEvent {
            status: o.status,
            update_time_ms: o.update_time_ms,
            source: gemini_once::operation::lifecycle::Source::Reconcile,
            details: o.details,
            delivery_id: None,
        },
        1_000,
    );
    reads_back("the record", &op);
    let provider = op.details()["provider"].as_object().unwrap();
    assert!(Value::Object(provider.clone()).to_string().len() <= details::PROVIDER_MAX_BYTES);
    for (k, v) in provider {
        assert_bounded(v, k);
    }
}

#[test]
fn a_value_at_the_bound_is_carried_whole() {
    let at = nested(MAX_DEPTH);
    let body =
        format!(r#"{{"type":"batch.succeeded","data":{{"id":"batches/w","user_metadata":{at}}}}}"#);
    let e = envelope::parse(body.as_bytes()).unwrap();
    let want: Value = serde_json::from_str(&at).unwrap();
    assert_eq!(e.details["user_metadata"], want);
    let reply = GateReply::Found {
        operation: json!({"details": e.details}),
        history: vec![],
    };
    reads_back("an inspection carrying it", &reply);
}
