//! A result's side effect: its body and its `webhook-id`.
//!
//! Guarantees: the body carries the job effect's identifying fields (`version`, `key`, `name`,
//! `kind`, and `user_metadata` / `unverified_user_metadata` when the job's body has them),
//! then `result_key`, `index` and exactly one of `response`, `error` (as Gemini wrote them)
//! or `unreadable` (docs/effect.schema.json, "a result"). Its `webhook-id` depends only on the
//! operation key and the result key, so it is the same on every retry, after every restart and
//! on every path, and never equals the job's (`msg_…`) or another result's.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::operation::effect::{effect_body, signed_request, EffectRequest};
use crate::operation::Operation;
use crate::results::item::{Payload, ResultItem};
use crate::signature::Secret;

/// The job body's fields a result's body repeats, so a destination knows whose result it is.
const IDENTIFYING: [&str; 6] = [
    "version",
    "key",
    "name",
    "kind",
    "user_metadata",
    "unverified_user_metadata",
];

/// The `webhook-id` of the result at `index`, keyed `result_key`, of the operation `key`: the
/// index tells apart two lines of a file that carry the same key.
pub fn result_message_id(key: &str, result_key: &str, index: u64) -> String {
    // The zero byte cannot occur in an operation key, so no (key, result key, index) hashes
    // the same text as another.
    let digest = Sha256::digest(format!("{key}\u{0}{result_key}\u{0}{index}").as_bytes());
    format!("res_{}", crate::hex(&digest, 16))
}

/// What every result of an operation repeats of the job's body, built once for a chunk
/// rather than once a result.
pub struct ResultHead {
    key: String,
    fields: Map<String, Value>,
}

impl ResultHead {
    pub fn of(op: &Operation) -> ResultHead {
        let job = effect_body(op);
        let fields = IDENTIFYING
            .iter()
            .filter_map(|f| job.get(*f).map(|v| (f.to_string(), v.clone())))
            .collect();
        let key = op.key().to_string();
        ResultHead { key, fields }
    }
}

/// The JSON body of one result's side effect.
pub fn result_body(head: &ResultHead, item: &ResultItem) -> Value {
    let mut body = head.fields.clone();
    body.insert("result_key".into(), item.result_key.clone().into());
    body.insert("index".into(), item.index.into());
    let (field, value) = match &item.payload {
        Payload::Response(v) => ("response", v),
        Payload::Error(v) => ("error", v),
        Payload::Unreadable(v) => ("unreadable", v),
    };
    body.insert(field.into(), value.clone());
    Value::Object(body)
}

/// The signed request for one result. `idempotency-key` is the `webhook-id`: one per result.
pub fn build_result_request(
    head: &ResultHead,
    item: &ResultItem,
    secret: &Secret,
    now_secs: i64,
) -> EffectRequest {
    let id = result_message_id(&head.key, &item.result_key, item.index);
    let body = result_body(head, item).to_string();
    signed_request(secret, id.clone(), id, None, now_secs, body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use crate::operation::effect::effect_message_id;
    use crate::signature::{verify, SignedHeaders};

    fn op() -> Operation {
        let mut op = Operation::register("batches/b", "batches/b", Some("pages".into()), 0);
        op.fill_user_metadata(Some(json!({"team": "a"})));
        op
    }

    fn item(payload: Payload) -> ResultItem {
        ResultItem {
            result_key: "req-1".into(),
            index: 4,
            payload,
        }
    }

    #[test]
    fn the_body_names_the_job_and_the_result() {
        let body = result_body(
            &ResultHead::of(&op()),
            &item(Payload::Response(json!({"c": 1}))),
        );
        assert_eq!(
            body,
            json!({"version": 1, "key": "batches/b", "name": "batches/b", "kind": "pages",
                "user_metadata": {"team": "a"}, "result_key": "req-1", "index": 4,
                "response": {"c": 1}})
        );
        let error = result_body(
            &ResultHead::of(&op()),
            &item(Payload::Error(json!({"code": 3}))),
        );
        assert_eq!(error["error"], json!({"code": 3}));
        assert!(error.get("response").is_none());
    }

    #[test]
    fn the_id_is_stable_per_result_and_distinct_from_the_job_and_other_results() {
        let a = result_message_id("batches/b", "req-1", 4);
        assert_eq!(a, result_message_id("batches/b", "req-1", 4));
        assert_ne!(a, result_message_id("batches/b", "req-2", 4));
        assert_ne!(
            a,
            result_message_id("batches/b", "req-1", 5),
            "a repeated key"
        );
        assert_ne!(a, result_message_id("batches/c", "req-1", 4));
        assert_ne!(a, effect_message_id("batches/b", 1));
        assert!(a.starts_with("res_"));
    }

    #[test]
    fn the_request_verifies_and_is_the_same_on_a_retry() {
        let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let it = item(Payload::Response(json!({"c": 1})));
        let a = build_result_request(&ResultHead::of(&op()), &it, &secret, 100);
        let b = build_result_request(&ResultHead::of(&op()), &it, &secret, 200);
        let h =
            |r: &EffectRequest, n: &str| r.headers.iter().find(|(k, _)| *k == n).unwrap().1.clone();
        assert_eq!(a.body, b.body);
        assert_eq!(h(&a, "webhook-id"), h(&b, "webhook-id"));
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
    fn the_schema_describes_the_result_body() {
        let schema: Value =
            serde_json::from_str(include_str!("../../docs/effect.schema.json")).unwrap();
        let result = &schema["$defs"]["result"];
        let mut required: Vec<&str> = result["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        required.sort();
        assert_eq!(
            required,
            ["index", "key", "kind", "name", "result_key", "version"]
        );
        let props = result["properties"].as_object().unwrap();
        let body = result_body(
            &ResultHead::of(&op()),
            &item(Payload::Unreadable(json!({"reason": "x"}))),
        );
        for field in body.as_object().unwrap().keys() {
            assert!(props.contains_key(field), "{field} in the schema");
        }
        for field in ["response", "error", "unreadable"] {
            assert!(props.contains_key(field), "{field} in the schema");
        }
        assert_eq!(result["additionalProperties"], false);
    }
}
