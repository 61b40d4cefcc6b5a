//! The side effect: what is sent downstream for a terminal outcome (what its answer means is
//! [`crate::destination::sending::outcome`]'s, as for a batch's results).
//!
//! Guarantees (docs/DESIGN.md, invariant 3): the body and the `webhook-id` are the same on
//! every retry of one generation, and `idempotency-key` is the operation key on every
//! generation, so a destination can drop a repeat that outlived its claim; the request is
//! signed the Standard Webhooks way with the effect secret, so any Standard Webhooks library
//! verifies it; a 2xx marks done, a timeout, network error, 5xx, 408, 409 or 429 is retried,
//! and any other answer parks the effect.
//!
//! One body whatever settled the outcome (invariant 6; `docs/effect.schema.json`): the fixed
//! fields, then the record's details in the one shape every path's details are normalized to
//! ([`normalize_details`]); details never override a fixed field.

use std::collections::BTreeMap;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::operation::details::normalize_details;
use crate::operation::Operation;
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
    // A batch registered with `"results": "each"`: what became of its results.
    if let Some(counts) = op.results_counts() {
        body.insert("results".into(), counts.clone());
    }
    Value::Object(body)
}

/// Builds the signed request for the current generation. `now_secs` becomes
/// `webhook-timestamp`, so each attempt is fresh for the receiver's tolerance check.
pub fn build_request(op: &Operation, secret: &Secret, now_secs: i64) -> EffectRequest {
    let generation = op.effect().generation();
    let id = effect_message_id(op.key(), generation);
    let extra = ("effect-generation", generation.to_string());
    signed_request(
        secret,
        id,
        op.key().to_string(),
        Some(extra),
        now_secs,
        effect_body(op).to_string(),
    )
}

/// A side effect's request, signed under `id` (Standard Webhooks): the job's and each
/// result's take the same headers, in the same order.
pub fn signed_request(
    secret: &Secret,
    id: String,
    idempotency_key: String,
    extra: Option<(&'static str, String)>,
    now_secs: i64,
    body: String,
) -> EffectRequest {
    let signature = sign(secret, &id, now_secs, body.as_bytes());
    let mut headers = vec![
        ("content-type", "application/json".to_string()),
        ("user-agent", "gemini-once/0.1".to_string()),
        ("idempotency-key", idempotency_key),
    ];
    headers.extend(extra);
    headers.extend([
        ("webhook-id", id),
        ("webhook-timestamp", now_secs.to_string()),
        ("webhook-signature", signature),
    ]);
    EffectRequest { headers, body }
}

/// The largest queue message Cloudflare Queues accept: 128 KB (counted as 128,000 bytes, the
/// smaller reading). The local runtime does not refuse a larger one; production does, every time.
pub const QUEUE_MESSAGE_MAX_BYTES: usize = 128_000;

/// The message a queue destination receives for `request`, as JSON text:
/// `{"headers": {...the same headers...}, "raw_body": "..."}`. The body goes once, as the
/// exact bytes signed (a consumer verifies them, then parses them). `Err` says why it is not
/// sent: a message over [`QUEUE_MESSAGE_MAX_BYTES`] would be refused every time.
pub fn queue_message(request: &EffectRequest) -> Result<String, String> {
    let headers: BTreeMap<_, _> = request.headers.iter().cloned().collect();
    let message = json!({"headers": headers, "raw_body": request.body}).to_string();
    match message.len() {
        n if n > QUEUE_MESSAGE_MAX_BYTES => Err(format!(
            "a queue message of {n} bytes is over the queue's limit of {QUEUE_MESSAGE_MAX_BYTES} bytes: not sent"
        )),
        _ => Ok(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;

    use crate::operation::details::{UNVERIFIED_USER_METADATA, USER_METADATA};
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
    fn a_queue_message_carries_the_body_once_and_one_over_the_limit_is_not_sent() {
        let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let request = build_request(&failed_batch(), &secret, 1_700_000_000);
        let message: Value = serde_json::from_str(&queue_message(&request).unwrap()).unwrap();
        assert_eq!(
            message["raw_body"],
            request.body.as_str(),
            "the bytes signed"
        );
        assert!(message.get("body").is_none(), "the body once");
        assert_eq!(message["headers"]["idempotency-key"], "batches/b");
        // A body of 100 KB fits once (it did not twice); one past the limit is refused.
        let big = |n: usize| EffectRequest {
            body: json!({"x": "y".repeat(n)}).to_string(),
            ..request.clone()
        };
        assert!(queue_message(&big(100_000)).is_ok());
        let refused = queue_message(&big(QUEUE_MESSAGE_MAX_BYTES)).unwrap_err();
        assert!(refused.contains("over the queue's limit"), "{refused}");
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
        assert_eq!(
            optional,
            ["results", UNVERIFIED_USER_METADATA, USER_METADATA]
        );
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
}
