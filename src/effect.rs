//! The side effect: what is sent downstream for a terminal outcome, and what its answer means.
//!
//! Guarantees (ARCHITECTURE.md, invariant 3): the body and the `webhook-id` are the same on
//! every retry of one generation, and `idempotency-key` is the operation key on every
//! generation, so a destination can drop a repeat that outlived its claim; the request is
//! signed the Standard Webhooks way with the effect secret, so any Standard Webhooks library
//! verifies it; a 2xx marks done, a timeout, network error, 5xx, 408, 409 or 429 is retried,
//! and any other answer parks the effect.

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::operation::{AttemptOutcome, Operation};
use crate::signature::{sign, Secret};
use crate::timestamp::format_rfc3339;

/// One side-effect request, ready for the edge to send.
#[derive(Debug, Clone, PartialEq)]
pub struct EffectRequest {
    pub url: String,
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
/// "settled_at", ...details}`. Details never override the fixed fields.
pub fn effect_body(op: &Operation) -> Value {
    let mut body = serde_json::Map::new();
    for (k, v) in &op.details {
        body.insert(k.clone(), v.clone());
    }
    let fixed = json!({
        "version": 1,
        "key": op.key,
        "name": op.name,
        "kind": op.kind,
        "status": op.status.as_str(),
        "settled_by": op.settled_by.map(|s| s.as_str()),
        "settled_at": op.settled_at_ms.map(format_rfc3339),
    });
    if let Value::Object(fixed) = fixed {
        body.extend(fixed);
    }
    Value::Object(body)
}

/// Builds the signed request for the current generation. `now_secs` becomes
/// `webhook-timestamp`, so each attempt is fresh for the receiver's tolerance check.
pub fn build_request(op: &Operation, url: &str, secret: &Secret, now_secs: i64) -> EffectRequest {
    let body = effect_body(op).to_string();
    let id = effect_message_id(&op.key, op.effect.generation);
    let signature = sign(secret, &id, now_secs, body.as_bytes());
    EffectRequest {
        url: url.to_string(),
        headers: vec![
            ("content-type", "application/json".to_string()),
            ("user-agent", "gemini-once/0.1".to_string()),
            ("idempotency-key", op.key.clone()),
            ("effect-generation", op.effect.generation.to_string()),
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
    match status {
        200..=299 => AttemptOutcome::Delivered,
        408 | 409 | 429 | 500..=599 => AttemptOutcome::Retry(answer),
        _ => AttemptOutcome::Park(answer),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::{Source, Status};
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
        let a = build_request(&op, "http://dest/x", &secret, 100);
        let b = build_request(&op, "http://dest/x", &secret, 200);
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
