//! The side effect: what is sent downstream for a terminal outcome, and what its answer means.
//!
//! Guarantees (docs/DESIGN.md, invariant 3): the body and the `webhook-id` are the same on
//! every retry of one generation, and `idempotency-key` is the operation key on every
//! generation, so a destination can drop a repeat that outlived its claim; the request is
//! signed the Standard Webhooks way with the effect secret, so any Standard Webhooks library
//! verifies it; a 2xx marks done, a timeout, network error, 5xx, 408, 409 or 429 is retried,
//! and any other answer parks the effect.
//!
//! One body whatever settled the outcome (invariant 6; `docs/effect.schema.json`): every path
//! (a webhook's `data`, a status-API answer, a record stored by an older version) goes through
//! [`normalize_details`], so the body always has `output_file_uri`, `output_file_uris`,
//! `error_code`, `error_message` and `provider` (null or empty when the path had nothing), and
//! `user_metadata` / `unverified_user_metadata` only when given, passed through untouched
//! within the bounds of [`crate::bounds`] (past them, a marker that says so).
//! Anything else the provider said goes under `provider`, never loose at the top level.

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use crate::bounds;
use crate::operation::{AttemptOutcome, Operation};
use crate::retry::{class_of_status, Class};
use crate::signature::{sign, Secret};
use crate::timestamp::format_rfc3339;

/// One side-effect request, ready for the edge to send.
#[derive(Debug, Clone, PartialEq)]
pub struct EffectRequest {
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
}

/// The `webhook-id` of a generation of an operation's side effect: stable across retries,
/// new for a deliberate redelivery.
pub fn effect_message_id(key: &str, generation: u32) -> String {
    let digest = Sha256::digest(format!("{key}#{generation}").as_bytes());
    let hex: String = digest.iter().take(12).map(|b| format!("{b:02x}")).collect();
    format!("msg_{hex}_{generation}")
}

/// First output location (a `gs://` URI or a `files/...` name), or null.
pub const OUTPUT_FILE_URI: &str = "output_file_uri";
/// Every output location, first one first (a video with several samples has several).
pub const OUTPUT_FILE_URIS: &str = "output_file_uris";
/// The provider's error code as given: a number (google.rpc.Code) or a string.
pub const ERROR_CODE: &str = "error_code";
/// The provider's error message, or null.
pub const ERROR_MESSAGE: &str = "error_message";
/// A `video.generated` webhook's location as Google's Cloud Run sample reads it: an output
/// location like `output_file_uri`.
pub const VIDEO_URI: &str = "video_uri";
/// Everything else the provider said, informational; what it holds depends on the path.
pub const PROVIDER: &str = "provider";
/// A dynamic webhook's user metadata, verified (passed through untouched).
pub const USER_METADATA: &str = "user_metadata";
/// Metadata that came only in an unverified body: a destination must not authorize on it.
pub const UNVERIFIED_USER_METADATA: &str = "unverified_user_metadata";

/// What one path learned about an outcome, before it becomes details.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// Output locations, first one first; duplicates are dropped.
    pub output_file_uris: Vec<String>,
    /// String or number, as the provider gave it.
    pub error_code: Option<Value>,
    pub error_message: Option<String>,
    pub provider: Map<String, Value>,
}

impl Outcome {
    /// Adds an output location unless it is empty or already known.
    pub fn add_output(&mut self, uri: &str) {
        let uri = uri.trim();
        if !uri.is_empty() && !self.output_file_uris.iter().any(|u| u == uri) {
            self.output_file_uris.push(uri.to_string());
        }
    }

    /// Takes `code` and `message` of an error object (google.rpc.Status, or an interaction's
    /// `errors[]` entry) unless an error is already known; other members go to `provider`.
    pub fn take_error(&mut self, error: &Value) {
        let Value::Object(error) = error else { return };
        for (k, v) in error {
            match k.as_str() {
                "code" => self.set_error_code(v),
                "message" => self.set_error_message(v),
                "details" => {
                    self.provider.entry("error_details").or_insert(v.clone());
                }
                other => {
                    self.provider
                        .entry(format!("error_{other}"))
                        .or_insert(v.clone());
                }
            }
        }
    }

    /// A string or number code is kept as given; anything else is provider detail.
    fn set_error_code(&mut self, code: &Value) {
        if self.error_code.is_some() {
            return;
        }
        match code {
            Value::String(_) | Value::Number(_) => self.error_code = Some(code.clone()),
            Value::Null => {}
            other => {
                self.provider.insert(ERROR_CODE.into(), other.clone());
            }
        }
    }

    fn set_error_message(&mut self, message: &Value) {
        if self.error_message.is_some() {
            return;
        }
        match message {
            Value::String(m) => self.error_message = Some(m.clone()),
            Value::Null => {}
            other => {
                self.provider.insert(ERROR_MESSAGE.into(), other.clone());
            }
        }
    }

    /// The normalized details: the five outcome fields, always present, each within the
    /// bounds of [`crate::bounds`] (this is where everything Gemini said enters a record).
    pub fn into_details(self) -> Map<String, Value> {
        let mut provider = self.provider;
        let (uris, omitted) = bounds::bound_uris(self.output_file_uris);
        if omitted > 0 {
            let earlier = provider.get(bounds::URIS_OMITTED).and_then(Value::as_u64);
            provider.insert(
                bounds::URIS_OMITTED.into(),
                json!(earlier.unwrap_or(0) + omitted),
            );
        }
        let mut details = Map::new();
        details.insert(
            OUTPUT_FILE_URI.into(),
            uris.first()
                .map_or(Value::Null, |u| Value::String(u.clone())),
        );
        details.insert(
            OUTPUT_FILE_URIS.into(),
            Value::Array(uris.into_iter().map(Value::String).collect()),
        );
        let code = match self.error_code {
            Some(Value::String(s)) => Value::String(bounds::bound_string(s)),
            other => other.unwrap_or(Value::Null),
        };
        details.insert(ERROR_CODE.into(), code);
        details.insert(
            ERROR_MESSAGE.into(),
            self.error_message
                .map_or(Value::Null, |m| Value::String(bounds::bound_string(m))),
        );
        details.insert(
            PROVIDER.into(),
            Value::Object(bounds::bound_provider(provider)),
        );
        details
    }
}

/// Turns any details into the one documented shape: a webhook's `data` (without its `id`),
/// a status-API observation's details (already normalized: unchanged), or a record stored by
/// an older version (`output_file`, `gemini_state`, `gemini_status` at the top level).
/// Idempotent. `user_metadata` and `unverified_user_metadata` pass through untouched, unless
/// over the bounds of [`crate::bounds`] (then a marker says so); so does everything else.
pub fn normalize_details(raw: &Map<String, Value>) -> Map<String, Value> {
    let mut outcome = Outcome::default();
    let mut passthrough = Map::new();
    // Locations first, in a fixed order, so the first location does not depend on key order.
    for field in [OUTPUT_FILE_URI, VIDEO_URI, "output_file"] {
        if let Some(Value::String(uri)) = raw.get(field) {
            outcome.add_output(uri);
        }
    }
    if let Some(Value::Array(uris)) = raw.get(OUTPUT_FILE_URIS) {
        for uri in uris.iter().filter_map(Value::as_str) {
            outcome.add_output(uri);
        }
    }
    if let Some(code) = raw.get(ERROR_CODE) {
        outcome.set_error_code(code);
    }
    if let Some(message) = raw.get(ERROR_MESSAGE) {
        outcome.set_error_message(message);
    }
    for (k, v) in raw {
        match k.as_str() {
            OUTPUT_FILE_URIS | ERROR_CODE | ERROR_MESSAGE => {}
            OUTPUT_FILE_URI | VIDEO_URI | "output_file" if v.is_string() || v.is_null() => {}
            USER_METADATA | UNVERIFIED_USER_METADATA => {
                passthrough.insert(k.clone(), bounds::bound(v.clone()));
            }
            PROVIDER if v.is_object() => {
                if let Value::Object(p) = v {
                    for (pk, pv) in p {
                        outcome.provider.insert(pk.clone(), pv.clone());
                    }
                }
            }
            "error" => outcome.take_error(v),
            "errors" => {
                if let Some(first) = v.as_array().and_then(|a| a.first()) {
                    outcome.take_error(first);
                }
                if v.as_array().is_none_or(|a| a.len() > 1) {
                    outcome.provider.insert("errors".into(), v.clone());
                }
            }
            "gemini_state" | "gemini_status" => {
                outcome.provider.entry("state").or_insert(v.clone());
            }
            other => {
                outcome.provider.insert(other.to_string(), v.clone());
            }
        }
    }
    let mut details = outcome.into_details();
    details.extend(passthrough);
    details
}

/// The JSON body: `{"version": 1, "key", "name", "kind", "status", "settled_by",
/// "settled_at", "output_file_uri", "output_file_uris", "error_code", "error_message",
/// "provider"}`, plus `user_metadata` / `unverified_user_metadata` when the record has them
/// (`docs/effect.schema.json`). Details never override the fixed fields.
pub fn effect_body(op: &Operation) -> Value {
    let mut body = normalize_details(op.details());
    let fixed = json!({
        "version": 1,
        "key": op.key(),
        "name": op.name(),
        "kind": op.kind(),
        "status": op.status().as_str(),
        "settled_by": op.settled_by().map(|s| s.as_str()),
        "settled_at": op.settled_at_ms().map(format_rfc3339),
    });
    if let Value::Object(fixed) = fixed {
        body.extend(fixed);
    }
    Value::Object(body)
}

/// Builds the signed request for the current generation. `now_secs` becomes
/// `webhook-timestamp`, so each attempt is fresh for the receiver's tolerance check.
pub fn build_request(op: &Operation, secret: &Secret, now_secs: i64) -> EffectRequest {
    let body = effect_body(op).to_string();
    let id = effect_message_id(op.key(), op.effect().generation());
    let signature = sign(secret, &id, now_secs, body.as_bytes());
    EffectRequest {
        headers: vec![
            ("content-type", "application/json".to_string()),
            ("user-agent", "gemini-once/0.1".to_string()),
            ("idempotency-key", op.key().to_string()),
            ("effect-generation", op.effect().generation().to_string()),
            ("webhook-id", id),
            ("webhook-timestamp", now_secs.to_string()),
            ("webhook-signature", signature),
        ],
        body,
    }
}

/// Classifies the destination's HTTP answer. `excerpt` is the start of its body, kept for
/// the operator.
pub fn classify(status: u16, excerpt: &str) -> AttemptOutcome {
    let answer = format!(
        "{status}: {}",
        excerpt.chars().take(200).collect::<String>()
    );
    match class_of_status(status) {
        Class::Success => AttemptOutcome::Delivered,
        Class::Retry => AttemptOutcome::Retry(answer),
        Class::Refused => AttemptOutcome::Park(answer),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operation::lifecycle::{Source, Status};
    use crate::operation::OpEvent;
    use crate::signature::{verify, SignedHeaders};

    fn failed_batch() -> Operation {
        let mut op = Operation::register(
            "batches/b",
            "projects/p/batches/b",
            Some("nightly".into()),
            0,
        );
        let mut details = serde_json::Map::new();
        details.insert("error_code".into(), json!(13));
        details.insert("error_message".into(), json!("boom"));
        details.insert("key".into(), json!("attempt to override"));
        op.apply(
            &OpEvent {
                status: Status::Failed,
                update_time_ms: 0,
                source: Source::Webhook,
                details,
                delivery_id: None,
            },
            1_000,
        );
        op
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

    #[test]
    fn normalizing_is_idempotent() {
        for data in [
            json!({"output_file_uri": "gs://a", "file_name": "f", "user_metadata": {"j": 1}}),
            json!({"error_code": "X", "error_message": "m", "errors": [{"code": "X"}, {"code": "Y"}]}),
            json!({"output_file_uris": ["files/a", "files/b"], "provider": {"state": "S"}}),
            json!({"error": {"code": 5, "message": "gone", "details": [{"@type": "t"}]}}),
            json!({"error_code": {"weird": true}, "output_file_uri": 7}),
        ] {
            let once = normalize_details(data.as_object().unwrap());
            assert_eq!(normalize_details(&once), once, "{data}");
        }
    }

    #[test]
    fn records_stored_by_older_versions_give_the_new_body() {
        let legacy = json!({"output_file": "files/old", "gemini_state": "BATCH_STATE_SUCCEEDED"});
        let mut stored =
            serde_json::to_value(Operation::register("batches/o", "batches/o", None, 0)).unwrap();
        stored["status"] = json!(Status::Succeeded.as_str());
        stored["details"] = legacy;
        let op: Operation = serde_json::from_value(stored).unwrap();
        let body = effect_body(&op);
        assert_eq!(body["output_file_uri"], "files/old");
        assert_eq!(body["provider"]["state"], "BATCH_STATE_SUCCEEDED");
        assert!(body.get("output_file").is_none() && body.get("gemini_state").is_none());
    }

    #[test]
    fn user_metadata_of_either_trust_passes_through_untouched() {
        let data = json!({"user_metadata": {"job": "n1", "n": [1, 2]},
            "unverified_user_metadata": "claimed", "output_file_uri": "gs://x"});
        let body = settled(
            Status::Succeeded,
            Source::Webhook,
            data.as_object().unwrap().clone(),
        );
        assert_eq!(body["user_metadata"], json!({"job": "n1", "n": [1, 2]}));
        assert_eq!(body["unverified_user_metadata"], "claimed");
        let none = settled(Status::Succeeded, Source::Webhook, Map::new());
        assert!(none.get("user_metadata").is_none());
        assert!(none.get("unverified_user_metadata").is_none());
    }

    #[test]
    fn unknown_fields_never_reach_the_top_level() {
        let data = json!({"surprise": 1, "kind": "forged", "status": "x", "output_file_uri": 5});
        let body = settled(
            Status::Succeeded,
            Source::Webhook,
            data.as_object().unwrap().clone(),
        );
        assert_eq!(body["kind"], "any");
        assert_eq!(body["status"], "succeeded");
        assert_eq!(body["provider"]["surprise"], 1);
        assert_eq!(body["provider"]["kind"], "forged");
        assert_eq!(body["provider"]["output_file_uri"], 5);
        assert_eq!(body["output_file_uri"], Value::Null);
        let mut fields: Vec<_> = body.as_object().unwrap().keys().cloned().collect();
        fields.sort();
        assert_eq!(
            fields,
            [
                "error_code",
                "error_message",
                "key",
                "kind",
                "name",
                "output_file_uri",
                "output_file_uris",
                "provider",
                "settled_at",
                "settled_by",
                "status",
                "version"
            ]
        );
    }

    #[test]
    fn schema_lists_exactly_the_fields_the_body_has() {
        let schema: Value =
            serde_json::from_str(include_str!("../../docs/effect.schema.json")).unwrap();
        let mut required: Vec<String> = schema["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        required.sort();
        let body = settled(Status::Succeeded, Source::Webhook, Map::new());
        let fields: Vec<String> = body.as_object().unwrap().keys().cloned().collect();
        assert_eq!(
            required, fields,
            "every body field is required, and only those"
        );
        let mut optional: Vec<&String> = schema["properties"]
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| !required.contains(k))
            .collect();
        optional.sort();
        assert_eq!(optional, [UNVERIFIED_USER_METADATA, USER_METADATA]);
        assert_eq!(schema["additionalProperties"], false);
    }

    #[test]
    fn body_carries_fixed_fields_and_details() {
        let body = effect_body(&failed_batch());
        assert_eq!(body["version"], 1);
        assert_eq!(body["key"], "batches/b");
        assert_eq!(body["name"], "projects/p/batches/b");
        assert_eq!(body["kind"], "nightly");
        assert_eq!(body["status"], "failed");
        assert_eq!(body["settled_by"], "webhook");
        assert_eq!(body["error_code"], 13);
        assert_eq!(body["error_message"], "boom");
    }

    #[test]
    fn request_verifies_as_standard_webhook_and_is_stable_across_retries() {
        let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let op = failed_batch();
        let a = build_request(&op, &secret, 100);
        let b = build_request(&op, &secret, 200);
        let h =
            |r: &EffectRequest, n: &str| r.headers.iter().find(|(k, _)| *k == n).unwrap().1.clone();
        assert_eq!(a.body, b.body);
        assert_eq!(h(&a, "webhook-id"), h(&b, "webhook-id"));
        assert_eq!(h(&a, "idempotency-key"), "batches/b");
        assert_eq!(h(&a, "effect-generation"), "1");
        let (id, ts, sig) = (
            h(&b, "webhook-id"),
            h(&b, "webhook-timestamp"),
            h(&b, "webhook-signature"),
        );
        let headers = SignedHeaders {
            id: Some(&id),
            timestamp: Some(&ts),
            signature: Some(&sig),
        };
        assert_eq!(
            verify(headers, b.body.as_bytes(), &[secret], 200, 300),
            Ok(())
        );
    }

    #[test]
    fn message_id_changes_with_generation_only() {
        assert_eq!(
            effect_message_id("batches/b", 1),
            effect_message_id("batches/b", 1)
        );
        assert_ne!(
            effect_message_id("batches/b", 1),
            effect_message_id("batches/b", 2)
        );
        assert_ne!(
            effect_message_id("batches/b", 1),
            effect_message_id("batches/c", 1)
        );
    }

    #[test]
    fn answers_are_classified() {
        assert_eq!(classify(200, ""), AttemptOutcome::Delivered);
        assert_eq!(classify(204, ""), AttemptOutcome::Delivered);
        for s in [408, 409, 429, 500, 502, 503, 599] {
            assert!(matches!(classify(s, ""), AttemptOutcome::Retry(_)), "{s}");
        }
        for s in [300, 400, 401, 403, 404, 410, 422] {
            assert!(matches!(classify(s, ""), AttemptOutcome::Park(_)), "{s}");
        }
        assert_eq!(
            classify(400, "bad request"),
            AttemptOutcome::Park("400: bad request".into())
        );
    }
}
