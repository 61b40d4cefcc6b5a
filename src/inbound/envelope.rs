//! Gemini webhook envelopes: `{"type", "version", "timestamp", "data": {"id", ...}}`.
//!
//! Guarantees: parsing happens only after the signature was verified on the raw bytes; a body that
//! is not an envelope (not JSON, no `type`, no `data.id`) is an [`EnvelopeError`], never a panic;
//! an unknown `type` is a value ([`Meaning::Unknown`]) so that it can be acknowledged and kept; a
//! test delivery ([`Meaning::Ping`]) is recognized by its type alone, so it needs no `data.id` and
//! is never mistaken for an unusable body; `batch.completed` (early docs) means `batch.succeeded`;
//! everything in `data` except the id is carried to the side effect as details, normalized by
//! [`crate::operation::details::normalize_details`] into the shape a status-API answer also gives.

use serde_json::{Map, Value};
use thiserror::Error;

use crate::operation::details::normalize_details;
use crate::operation::key::Collection;
use crate::operation::lifecycle::Status;
use crate::timestamp::parse_rfc3339_ms;

/// A parsed delivery.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    /// The `type` field as sent.
    pub event_type: String,
    /// `data.id` as sent: a bare id or a resource name.
    pub id: String,
    /// The envelope's `timestamp` in Unix ms, or 0 when absent or unreadable.
    pub timestamp_ms: i64,
    /// `data` without `id`, normalized: `output_file_uri(s)`, `error_code`, `error_message`,
    /// `provider` (everything else, e.g. a video's `file_name`), `user_metadata` as sent.
    pub details: Map<String, Value>,
}

/// What an event type says about its operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Meaning {
    /// The operation reached `status`; a bare id belongs to `collection`.
    Status {
        status: Status,
        collection: Collection,
    },
    /// A test delivery (`POST v1beta/webhooks/{id}:ping`): acknowledge it, apply nothing,
    /// keep nothing. Its type is not documented (the SDKs say only "sends a ping event" and
    /// type neither the request nor the answer), so [`is_ping_type`] takes `ping` and any
    /// `<resource>.ping` (e.g. `webhook.ping`); any other type stays [`Meaning::Unknown`].
    Ping,
    /// A type this receiver does not know: acknowledge it, keep it, apply nothing.
    Unknown,
}

/// Whether `event_type` names a ping: `ping` itself or a `.ping` suffix, any case.
pub fn is_ping_type(event_type: &str) -> bool {
    let t = event_type.trim().to_ascii_lowercase();
    t == "ping" || t.ends_with(".ping")
}

/// Why a verified body is not a usable envelope.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EnvelopeError {
    #[error("body is not JSON")]
    NotJson,
    #[error("body is not a JSON object")]
    NotObject,
    #[error("missing string field type")]
    MissingType,
    #[error("missing object field data")]
    MissingData,
    #[error("missing string field data.id")]
    MissingId,
}

impl EnvelopeError {
    /// Short label for logs and counters.
    pub fn label(&self) -> &'static str {
        match self {
            EnvelopeError::NotJson => "not_json",
            EnvelopeError::NotObject => "not_object",
            EnvelopeError::MissingType => "missing_type",
            EnvelopeError::MissingData => "missing_data",
            EnvelopeError::MissingId => "missing_data_id",
        }
    }
}

/// Parses a verified body.
pub fn parse(body: &[u8]) -> Result<Envelope, EnvelopeError> {
    let value: Value = serde_json::from_slice(body).map_err(|_| EnvelopeError::NotJson)?;
    let Value::Object(mut top) = value else {
        return Err(EnvelopeError::NotObject);
    };
    let event_type = match top.get("type") {
        Some(Value::String(t)) if !t.trim().is_empty() => t.trim().to_string(),
        _ => return Err(EnvelopeError::MissingType),
    };
    let timestamp_ms = match top.get("timestamp") {
        Some(Value::String(t)) => parse_rfc3339_ms(t).unwrap_or(0),
        _ => 0,
    };
    // A ping names no operation: whatever its `data` holds (if anything), it is only acknowledged.
    if is_ping_type(&event_type) {
        return Ok(Envelope {
            event_type,
            id: String::new(),
            timestamp_ms,
            details: Map::new(),
        });
    }
    let Some(Value::Object(mut data)) = top.remove("data") else {
        return Err(EnvelopeError::MissingData);
    };
    // Dynamic webhooks echo `user_metadata`; where is undocumented, so take it from `data` or
    // the top level, and carry it to the side effect either way.
    if let Some(meta) = top.remove("user_metadata") {
        data.entry("user_metadata").or_insert(meta);
    }
    let id = match data.remove("id") {
        Some(Value::String(id)) if !id.trim().is_empty() => id,
        _ => return Err(EnvelopeError::MissingId),
    };
    Ok(Envelope {
        event_type,
        id,
        timestamp_ms,
        details: normalize_details(&data),
    })
}

/// Maps an event type to the state it reports.
pub fn meaning(event_type: &str) -> Meaning {
    use Collection::*;
    let (status, collection) = match event_type {
        "batch.succeeded" | "batch.completed" => (Status::Succeeded, Batches),
        "batch.failed" => (Status::Failed, Batches),
        "batch.cancelled" => (Status::Cancelled, Batches),
        "batch.expired" => (Status::Expired, Batches),
        "interaction.completed" => (Status::Succeeded, Interactions),
        "interaction.failed" => (Status::Failed, Interactions),
        "interaction.cancelled" => (Status::Cancelled, Interactions),
        "interaction.requires_action" => (Status::RequiresAction, Interactions),
        "video.generated" => (Status::Succeeded, Operations),
        t if is_ping_type(t) => return Meaning::Ping,
        _ => return Meaning::Unknown,
    };
    Meaning::Status { status, collection }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_of(t: &str) -> (Status, Collection) {
        match meaning(t) {
            Meaning::Status { status, collection } => (status, collection),
            other => panic!("{t} should be a status, is {other:?}"),
        }
    }

    #[test]
    fn documented_example_parses() {
        let body = br#"{"type":"batch.succeeded","version":"v1","timestamp":"2026-01-22T12:00:00Z",
            "data":{"id":"batch_123456","output_file_uri":"gs://my-bucket/results.jsonl"}}"#;
        let e = parse(body).unwrap();
        assert_eq!(e.event_type, "batch.succeeded");
        assert_eq!(e.id, "batch_123456");
        assert_eq!(e.timestamp_ms, 1_769_083_200_000);
        assert_eq!(e.details["output_file_uri"], "gs://my-bucket/results.jsonl");
        assert!(!e.details.contains_key("id"));
    }

    #[test]
    fn every_documented_type_has_a_meaning() {
        use Collection::*;
        assert_eq!(status_of("batch.succeeded"), (Status::Succeeded, Batches));
        assert_eq!(status_of("batch.completed"), (Status::Succeeded, Batches));
        assert_eq!(status_of("batch.failed"), (Status::Failed, Batches));
        assert_eq!(status_of("batch.cancelled"), (Status::Cancelled, Batches));
        assert_eq!(status_of("batch.expired"), (Status::Expired, Batches));
        assert_eq!(
            status_of("interaction.completed"),
            (Status::Succeeded, Interactions)
        );
        assert_eq!(
            status_of("interaction.failed"),
            (Status::Failed, Interactions)
        );
        assert_eq!(
            status_of("interaction.cancelled"),
            (Status::Cancelled, Interactions)
        );
        assert_eq!(
            status_of("interaction.requires_action"),
            (Status::RequiresAction, Interactions)
        );
        assert_eq!(
            status_of("video.generated"),
            (Status::Succeeded, Operations)
        );
    }

    #[test]
    fn unknown_type_is_a_value_not_an_error() {
        let e = parse(br#"{"type":"batch.exploded","data":{"id":"b"}}"#).unwrap();
        assert_eq!(meaning(&e.event_type), Meaning::Unknown);
    }

    #[test]
    fn a_ping_needs_no_operation_and_is_not_unknown() {
        for body in [
            &br#"{"type":"webhook.ping","version":"v1","timestamp":"2026-01-22T12:00:00Z"}"#[..],
            br#"{"type":"ping","data":{}}"#,
            br#"{"type":"webhook.ping","data":{"id":"wh_1","webhook_id":"wh_1"}}"#,
            br#"{"type":" Webhook.PING ","data":"not an object"}"#,
        ] {
            let e = parse(body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
            assert_eq!(meaning(&e.event_type), Meaning::Ping, "{body:?}");
            assert!(e.id.is_empty() && e.details.is_empty());
        }
        // Only the type decides: lookalikes stay unknown, and a ping still needs a type.
        for t in ["pinged", "batch.ping_test", "webhook.pong", "webhookping"] {
            assert_eq!(meaning(t), Meaning::Unknown, "{t}");
        }
        assert_eq!(
            parse(br#"{"data":{"ping":true}}"#).unwrap_err(),
            EnvelopeError::MissingType
        );
    }

    #[test]
    fn failed_batch_keeps_error_fields_of_either_type() {
        let e = parse(
            br#"{"type":"batch.failed","data":{"id":"batches/b","error_code":13,"error_message":"boom"}}"#,
        )
        .unwrap();
        assert_eq!(e.details["error_code"], 13);
        assert_eq!(e.details["error_message"], "boom");
        let e =
            parse(br#"{"type":"batch.failed","data":{"id":"b","error_code":"INTERNAL"}}"#).unwrap();
        assert_eq!(e.details["error_code"], "INTERNAL");
    }

    #[test]
    fn user_metadata_is_carried_from_data_or_top_level() {
        let e =
            parse(br#"{"type":"batch.succeeded","user_metadata":{"job":"n1"},"data":{"id":"b"}}"#)
                .unwrap();
        assert_eq!(e.details["user_metadata"]["job"], "n1");
        let e = parse(br#"{"type":"batch.succeeded","user_metadata":{"job":"top"},"data":{"id":"b","user_metadata":{"job":"data"}}}"#).unwrap();
        assert_eq!(e.details["user_metadata"]["job"], "data");
    }

    #[test]
    fn missing_or_bad_timestamp_counts_as_epoch() {
        let e = parse(br#"{"type":"batch.failed","data":{"id":"b"}}"#).unwrap();
        assert_eq!(e.timestamp_ms, 0);
        let e = parse(br#"{"type":"batch.failed","timestamp":"soon","data":{"id":"b"}}"#).unwrap();
        assert_eq!(e.timestamp_ms, 0);
    }

    #[test]
    fn junk_is_an_error_with_a_label() {
        let cases: [(&[u8], EnvelopeError); 8] = [
            (b"", EnvelopeError::NotJson),
            (b"\xff\xfe", EnvelopeError::NotJson),
            (b"[1,2]", EnvelopeError::NotObject),
            (br#"{"data":{"id":"b"}}"#, EnvelopeError::MissingType),
            (
                br#"{"type":"","data":{"id":"b"}}"#,
                EnvelopeError::MissingType,
            ),
            (br#"{"type":"batch.failed"}"#, EnvelopeError::MissingData),
            (
                br#"{"type":"batch.failed","data":{}}"#,
                EnvelopeError::MissingId,
            ),
            (
                br#"{"type":"batch.failed","data":{"id":7}}"#,
                EnvelopeError::MissingId,
            ),
        ];
        for (body, want) in cases {
            assert_eq!(parse(body).unwrap_err(), want, "{:?}", body);
            assert!(!want.label().is_empty());
        }
    }
}
