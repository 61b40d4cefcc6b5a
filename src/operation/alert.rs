//! Alerts: the JSON an operator's alert sink receives, with a `text` fit for Slack or Discord.
//!
//! Guarantees: the body names the alert kind, the operation (key, name, kind) and its age;
//! it never contains a secret. Each kind is raised once per operation (the gate keeps that
//! mark) and sent at least once: it stays queued in the record until the sink accepts it,
//! under an `alert_id` that is the same on every retry.

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::operation::Operation;

/// Not terminal past the stuck threshold. The receiver never closes it by itself.
pub const STUCK: &str = "stuck";
/// The status API answered 404 for a registered operation.
pub const UNKNOWN_TO_GEMINI: &str = "unknown_to_gemini";
/// Terminal, but the side effect is still not done past the threshold, or parked.
pub const EFFECT_FAILING: &str = "effect_failing";

/// The `alert-id` of an alert: the same on every retry of one alert, so a sink can drop
/// repeats (alerts are sent at least once).
pub fn alert_id(key: &str, kind: &str, generation: u32) -> String {
    let digest = Sha256::digest(format!("{key}#{kind}#{generation}").as_bytes());
    let hex: String = digest.iter().take(12).map(|b| format!("{b:02x}")).collect();
    format!("alert_{hex}")
}

/// Renders a duration as `2h 5m`, `3m 20s` or `45s`.
pub fn human_age(seconds: i64) -> String {
    let s = seconds.max(0);
    match (s / 3_600, (s % 3_600) / 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, m, sec) => format!("{m}m {sec}s"),
        (h, m, _) => format!("{h}h {m}m"),
    }
}

/// The alert body: `{"alert", "alert_id", "key", "name", "kind", "age_seconds", "text"}`.
pub fn alert_body(alert: &str, alert_id: &str, op: &Operation, age_seconds: i64) -> Value {
    let kind = op.kind.as_deref().unwrap_or("unregistered kind");
    let age = human_age(age_seconds);
    let what = match alert {
        STUCK => format!(
            "still {} after {age}; left open for a person to judge",
            op.status.as_str()
        ),
        UNKNOWN_TO_GEMINI => format!("Gemini's status API does not know it (404) after {age}"),
        EFFECT_FAILING => match (&op.effect.parked, &op.effect.last_error) {
            (Some(p), _) => format!(
                "{} but its side effect was refused and parked: {}",
                op.status.as_str(),
                p.answer
            ),
            (None, Some(e)) => format!(
                "{} {age} ago but its side effect is still not done after {} attempts (last: {e})",
                op.status.as_str(),
                op.effect.attempts
            ),
            (None, None) => format!(
                "{} {age} ago but its side effect is still not done",
                op.status.as_str()
            ),
        },
        other => other.to_string(),
    };
    json!({
        "alert": alert,
        "alert_id": alert_id,
        "key": op.key,
        "name": op.name,
        "kind": op.kind,
        "age_seconds": age_seconds,
        "text": format!("gemini-once {alert}: {} ({kind}) {what}", op.name),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_well() {
        assert_eq!(human_age(45), "45s");
        assert_eq!(human_age(200), "3m 20s");
        assert_eq!(human_age(7_500), "2h 5m");
        assert_eq!(human_age(-3), "0s");
    }

    #[test]
    fn alert_ids_are_stable_per_operation_kind_and_generation() {
        assert_eq!(
            alert_id("batches/a", STUCK, 1),
            alert_id("batches/a", STUCK, 1)
        );
        assert_ne!(
            alert_id("batches/a", STUCK, 1),
            alert_id("batches/b", STUCK, 1)
        );
        assert_ne!(
            alert_id("batches/a", STUCK, 1),
            alert_id("batches/a", EFFECT_FAILING, 1)
        );
        assert_ne!(
            alert_id("batches/a", STUCK, 1),
            alert_id("batches/a", STUCK, 2)
        );
    }

    #[test]
    fn stuck_alert_names_the_operation() {
        let op = Operation::register(
            "batches/a",
            "projects/p/batches/a",
            Some("nightly".into()),
            0,
        );
        let body = alert_body(STUCK, "alert_x", &op, 21_600);
        assert_eq!(body["alert_id"], "alert_x");
        assert_eq!(body["alert"], "stuck");
        assert_eq!(body["key"], "batches/a");
        assert_eq!(body["name"], "projects/p/batches/a");
        assert_eq!(body["kind"], "nightly");
        assert_eq!(body["age_seconds"], 21_600);
        let text = body["text"].as_str().unwrap();
        assert!(
            text.contains("projects/p/batches/a")
                && text.contains("6h 0m")
                && text.contains("pending"),
            "{text}"
        );
    }
}
