//! Workers Analytics Engine data points, for teams that keep 90 days of history there: one per
//! side-effect attempt and one per delivery the webhook route answered.
//!
//! Guarantees: each point's layout is fixed here and nowhere else (docs/OPERATIONS.md's SQL
//! names the same columns); labels are of bounded cardinality (a destination's route label, a
//! kind, an outcome, a reason: never an operation's name, never a secret); building a point
//! reads no clock (times are passed in). Whether a point is written at all is the edge's
//! business: without the binding, nothing is.

use serde_json::Value;

/// `blob1` of an attempt's point.
pub const EFFECT_ATTEMPT: &str = "effect_attempt";
/// `blob1` of a delivery's point.
pub const DELIVERY: &str = "delivery";

/// One data point: Analytics Engine's single index, then blobs and doubles in column order.
#[derive(Debug, Clone, PartialEq)]
pub struct DataPoint {
    pub index: String,
    pub blobs: Vec<String>,
    pub doubles: Vec<f64>,
}

/// What one side-effect attempt was, as its point records it.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptSeen<'a> {
    /// The route's label (`route billing: https://host/…`), as the history row shows it.
    pub destination: &'a str,
    pub kind: Option<&'a str>,
    /// `delivered`, `retry` or `refused`: the class of the destination's answer.
    pub result: &'static str,
    pub http_status: Option<u16>,
    pub started_ms: i64,
    pub finished_ms: i64,
    /// When the operation settled, for the time from settlement to acceptance.
    pub settled_at_ms: Option<i64>,
}

/// An attempt's point. `index1` = destination; `blob1..5` = `effect_attempt`, destination,
/// kind, result, HTTP status (empty when none came); `double1` = the attempt's milliseconds,
/// `double2` = milliseconds from settlement to this attempt's end (0 when unknown), `double3`
/// = the HTTP status (0 when none came).
pub fn effect_attempt(seen: &AttemptSeen<'_>) -> DataPoint {
    let since_settled = seen
        .settled_at_ms
        .map_or(0, |settled| (seen.finished_ms - settled).max(0));
    DataPoint {
        index: seen.destination.to_string(),
        blobs: vec![
            EFFECT_ATTEMPT.to_string(),
            seen.destination.to_string(),
            seen.kind.unwrap_or_default().to_string(),
            seen.result.to_string(),
            seen.http_status.map(|s| s.to_string()).unwrap_or_default(),
        ],
        doubles: vec![
            (seen.finished_ms - seen.started_ms).max(0) as f64,
            since_settled as f64,
            f64::from(seen.http_status.unwrap_or(0)),
        ],
    }
}

/// A delivery's point, from the route's log line as JSON (its `event`, `reason` and `type`).
/// `index1` = the event's type (`batch.succeeded`, or `unknown`); `blob1..4` = `delivery`,
/// the route's event (`delivered`, `duplicate`, `rejected`, ...), the reason (a drop's or a
/// refusal's; empty otherwise), the event's type; `double1` = milliseconds from receipt to
/// answer.
pub fn delivery(line: &Value, ms: i64) -> DataPoint {
    let field = |name: &str| line.get(name).and_then(Value::as_str).unwrap_or_default();
    let event_type = match field("type") {
        "" => "unknown",
        t => t,
    };
    DataPoint {
        index: event_type.to_string(),
        blobs: vec![
            DELIVERY.to_string(),
            field("event").to_string(),
            field("reason").to_string(),
            event_type.to_string(),
        ],
        doubles: vec![ms.max(0) as f64],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn seen() -> AttemptSeen<'static> {
        AttemptSeen {
            destination: "EFFECT_URL https://dest.example",
            kind: Some("publish"),
            result: "delivered",
            http_status: Some(204),
            started_ms: 10_000,
            finished_ms: 10_250,
            settled_at_ms: Some(9_000),
        }
    }

    #[test]
    fn an_attempt_point_has_its_columns_in_order() {
        let p = effect_attempt(&seen());
        assert_eq!(p.index, "EFFECT_URL https://dest.example");
        assert_eq!(
            p.blobs,
            [
                "effect_attempt",
                "EFFECT_URL https://dest.example",
                "publish",
                "delivered",
                "204"
            ]
        );
        assert_eq!(p.doubles, [250.0, 1_250.0, 204.0]);
    }

    #[test]
    fn an_attempt_without_status_kind_or_settlement_leaves_those_empty() {
        let p = effect_attempt(&AttemptSeen {
            kind: None,
            result: "retry",
            http_status: None,
            settled_at_ms: None,
            ..seen()
        });
        assert_eq!(p.blobs[2], "");
        assert_eq!(p.blobs[4], "");
        assert_eq!(p.doubles, [250.0, 0.0, 0.0]);
    }

    #[test]
    fn a_clock_that_stepped_back_never_records_a_negative_time() {
        let p = effect_attempt(&AttemptSeen {
            finished_ms: 9_000,
            settled_at_ms: Some(9_500),
            ..seen()
        });
        assert_eq!(p.doubles[..2], [0.0, 0.0]);
    }

    #[test]
    fn a_delivery_point_reads_the_route_line() {
        let line = json!({"event": "dropped", "outcome": "dropped", "reason": "duplicate",
            "type": "batch.succeeded", "webhook_id": "w1", "key": "batches/b1"});
        let p = delivery(&line, 42);
        assert_eq!(p.index, "batch.succeeded");
        assert_eq!(
            p.blobs,
            ["delivery", "dropped", "duplicate", "batch.succeeded"]
        );
        assert_eq!(p.doubles, [42.0]);
    }

    #[test]
    fn a_refusal_without_a_type_is_indexed_as_unknown() {
        let p = delivery(
            &json!({"event": "rejected", "reason": "signature_invalid"}),
            3,
        );
        assert_eq!(p.index, "unknown");
        assert_eq!(
            p.blobs,
            ["delivery", "rejected", "signature_invalid", "unknown"]
        );
    }
}
