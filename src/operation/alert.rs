//! Alerts: the JSON an operator's alert sink receives, with a `text` fit for Slack or Discord.
//!
//! Guarantees: the body names the alert kind ([`AlertKind`]), the operation (key, name, kind)
//! and its age; it never contains a secret. Each kind is raised once per operation, or once per
//! spell of a condition that begins again (the gate keeps that mark), and sent at least once:
//! it stays queued in the record until the sink accepts it, under an `alert_id` that is the
//! same on every retry and its own (each spell's differs).

use crate::alert_line::{hashed_id, text};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// What an alert is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertKind {
    /// Not terminal past the stuck threshold. The receiver never closes it by itself.
    Stuck,
    /// The status API answered 404 for the operation.
    UnknownToGemini,
    /// Terminal, but the side effect is still not done past the threshold, or parked.
    EffectFailing,
    /// Gemini disabled (or lost) the webhook: completions arrive only by reconciliation.
    WebhookDisabled,
    /// A pass enabled the webhook Gemini had disabled for failed deliveries, and swept.
    WebhookReenabled,
    /// The operation's stored record could not be read as it was: it was recovered, and the
    /// original kept for inspection.
    RecordUnreadable,
    /// Gemini's status answer for the operation cannot be used (too large, not JSON): it
    /// cannot settle by itself; an operator settles it by hand.
    StatusUnusable,
    /// The gate's alarm has failed for minutes on end (a record it cannot read, a configuration
    /// that does not parse): sent from the failing alarm itself, since its record may be what
    /// cannot be read.
    AlarmFailing,
    /// A `stuck` operation has an outcome now: the resolution of its `stuck` alert.
    StuckSettled,
    /// A side effect alerted `effect_failing` was delivered: the resolution of that alert.
    EffectRecovered,
    /// A `"results": "each"` batch's results file is gone for good or unreadable: its unread
    /// results are parked, and the job's effect says `results.file_parked`.
    ResultsFileParked,
    /// A parked results file was read after all (an operator's retry): the resolution of
    /// `results_file_parked`.
    ResultsFileRead,
    /// Results of a `"results": "each"` batch were refused by their destination, or kept
    /// failing past `EFFECT_ALERT_AFTER_SECONDS`: they are parked (an operator retries them),
    /// and the job's effect counts them parked. One alert per spell, naming how many.
    ResultsFailing,
    /// Results alerted `results_failing` were retried by an operator and settled with none
    /// parked (refused or failing) in that spell: the resolution of `results_failing`.
    ResultsRecovered,
    /// A `"results": "each"` batch's result senders answered nothing past
    /// `EFFECT_ALERT_AFTER_SECONDS`: its results wait, sent again with backoff, not parked.
    ResultsSenderFailing,
    /// A result sender answered again, or nothing waits for one: the resolution of
    /// `results_sender_failing`.
    ResultsSenderRecovered,
}

impl AlertKind {
    /// The spelling in alert bodies, records and ledger metadata.
    pub fn as_str(self) -> &'static str {
        match self {
            AlertKind::Stuck => "stuck",
            AlertKind::UnknownToGemini => "unknown_to_gemini",
            AlertKind::EffectFailing => "effect_failing",
            AlertKind::WebhookDisabled => "webhook_disabled",
            AlertKind::WebhookReenabled => "webhook_reenabled",
            AlertKind::RecordUnreadable => "record_unreadable",
            AlertKind::StatusUnusable => "status_unusable",
            AlertKind::AlarmFailing => "alarm_failing",
            AlertKind::StuckSettled => "stuck_settled",
            AlertKind::EffectRecovered => "effect_recovered",
            AlertKind::ResultsFileParked => "results_file_parked",
            AlertKind::ResultsFileRead => "results_file_read",
            AlertKind::ResultsFailing => "results_failing",
            AlertKind::ResultsRecovered => "results_recovered",
            AlertKind::ResultsSenderFailing => "results_sender_failing",
            AlertKind::ResultsSenderRecovered => "results_sender_recovered",
        }
    }

    /// What an alert's line says in place of a kind its subject has none of: a webhook's
    /// alerts are about the webhook, a failing alarm may not have read its record.
    fn unnamed_kind(self) -> &'static str {
        match self {
            AlertKind::WebhookDisabled | AlertKind::WebhookReenabled => "webhook",
            AlertKind::AlarmFailing => "kind not read",
            _ => "unregistered kind",
        }
    }

    /// The condition this alert says has ended, for a resolution (`None` for a trigger).
    pub fn resolves(self) -> Option<AlertKind> {
        match self {
            AlertKind::StuckSettled => Some(AlertKind::Stuck),
            AlertKind::EffectRecovered => Some(AlertKind::EffectFailing),
            AlertKind::WebhookReenabled => Some(AlertKind::WebhookDisabled),
            AlertKind::ResultsFileRead => Some(AlertKind::ResultsFileParked),
            AlertKind::ResultsRecovered => Some(AlertKind::ResultsFailing),
            AlertKind::ResultsSenderRecovered => Some(AlertKind::ResultsSenderFailing),
            _ => None,
        }
    }

    /// The resolution that says this condition ended, for the conditions an operation's gate
    /// resolves itself.
    pub fn resolution(self) -> Option<AlertKind> {
        match self {
            AlertKind::Stuck => Some(AlertKind::StuckSettled),
            AlertKind::EffectFailing => Some(AlertKind::EffectRecovered),
            AlertKind::ResultsFileParked => Some(AlertKind::ResultsFileRead),
            AlertKind::ResultsFailing => Some(AlertKind::ResultsRecovered),
            AlertKind::ResultsSenderFailing => Some(AlertKind::ResultsSenderRecovered),
            _ => None,
        }
    }
}

/// The `alert-id` of an alert: the same on every retry of one alert, so a sink can drop
/// repeats (alerts are sent at least once), and another for each spell of its condition
/// (`spell` counts the earlier ones; the first spell's id names none, as it always did).
pub fn alert_id(key: &str, kind: AlertKind, generation: u32, spell: u32) -> String {
    match spell {
        0 => hashed_id(&format!("{key}#{}#{generation}", kind.as_str())),
        _ => hashed_id(&format!("{key}#{}#{generation}#{spell}", kind.as_str())),
    }
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

/// An alert body: `{"alert", "alert_id", "key", "name", "kind", "age_seconds", "text"}`, with
/// `text` ready for Slack or Discord (`gemini-once <alert>: <name> (<kind>) <what>`); a
/// resolution also names the condition that ended (`resolves`), so a sink can close what its
/// trigger opened (`docs/alert.schema.json`).
pub fn body(
    alert: AlertKind,
    alert_id: Option<&str>,
    subject: (Option<&str>, &str, Option<&str>),
    age_seconds: i64,
    what: &str,
) -> Value {
    let (key, name, kind) = subject;
    let mut body = json!({
        "alert": alert.as_str(),
        "alert_id": alert_id,
        "key": key,
        "name": name,
        "kind": kind,
        "age_seconds": age_seconds,
        "text": text(alert.as_str(), name, kind.unwrap_or(alert.unnamed_kind()), what),
    });
    if let Some(condition) = alert.resolves() {
        body["resolves"] = json!(condition.as_str());
    }
    body
}

/// The alert that Gemini's webhook `name` is in `state` (not `enabled`) and was left so:
/// `left` says why and what to do.
pub fn webhook_disabled(name: &str, state: &str, left: &str) -> Value {
    let what = format!("is {state}; completions now arrive only through reconciliation. {left}");
    let subject = (None, name, None);
    body(AlertKind::WebhookDisabled, None, subject, 0, &what)
}

/// The alert that a pass enabled Gemini's webhook `name` again (it was `was`): `done` says
/// what the pass did about the completions missed meanwhile.
pub fn webhook_reenabled(name: &str, was: &str, done: &str) -> Value {
    let what = format!("was {was}: re-enabled by a cron pass (PATCH v1beta/webhooks/{{id}}?update_mask=state, as npm run connect does). {done}");
    let subject = (None, name, None);
    body(AlertKind::WebhookReenabled, None, subject, 0, &what)
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
    fn alert_ids_are_stable_per_operation_kind_generation_and_spell() {
        let id = |key, kind, generation, spell| alert_id(key, kind, generation, spell);
        let first = id("batches/a", AlertKind::Stuck, 1, 0);
        assert_eq!(first, id("batches/a", AlertKind::Stuck, 1, 0));
        assert_ne!(first, id("batches/b", AlertKind::Stuck, 1, 0));
        assert_ne!(first, id("batches/a", AlertKind::EffectFailing, 1, 0));
        assert_ne!(first, id("batches/a", AlertKind::Stuck, 2, 0));
        assert_ne!(first, id("batches/a", AlertKind::Stuck, 1, 1));
        assert_ne!(
            id("batches/a", AlertKind::Stuck, 1, 2),
            id("batches/a", AlertKind::Stuck, 1, 1)
        );
        // The first spell keeps the id earlier versions gave (a queued alert stored then).
        assert_eq!(first, hashed_id("batches/a#stuck#1"));
    }

    #[test]
    fn kinds_are_spelled_as_stored() {
        for kind in [
            AlertKind::Stuck,
            AlertKind::UnknownToGemini,
            AlertKind::EffectFailing,
            AlertKind::WebhookDisabled,
            AlertKind::WebhookReenabled,
            AlertKind::StuckSettled,
            AlertKind::EffectRecovered,
            AlertKind::ResultsFileParked,
            AlertKind::ResultsFileRead,
            AlertKind::ResultsFailing,
            AlertKind::ResultsRecovered,
            AlertKind::ResultsSenderFailing,
            AlertKind::ResultsSenderRecovered,
        ] {
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
            if let Some(resolution) = kind.resolution() {
                assert_eq!(resolution.resolves(), Some(kind), "{kind:?}");
            }
        }
    }

    #[test]
    fn webhook_disabled_names_the_webhook_and_its_state() {
        let body = webhook_disabled(
            "webhooks/gemini-once",
            "disabled_due_to_failed_deliveries",
            "Left as it is.",
        );
        assert_eq!(body["alert"], "webhook_disabled");
        assert_eq!(body.get("resolves"), None, "a trigger keeps today's shape");
        assert_eq!(body["key"], Value::Null);
        assert_eq!(body["name"], "webhooks/gemini-once");
        let text = body["text"].as_str().unwrap();
        assert!(
            text.starts_with("gemini-once webhook_disabled: webhooks/gemini-once (webhook) is "),
            "{text}"
        );
        assert!(text.contains("disabled_due_to_failed_deliveries"), "{text}");
        assert!(text.ends_with("Left as it is."), "{text}");
    }

    #[test]
    fn webhook_reenabled_says_what_it_was_and_what_was_done() {
        let body = webhook_reenabled(
            "webhooks/gemini-once",
            "disabled_due_to_failed_deliveries",
            "3 swept.",
        );
        assert_eq!(body["alert"], "webhook_reenabled");
        assert_eq!(body["resolves"], "webhook_disabled");
        assert_eq!(body["key"], Value::Null);
        let text = body["text"].as_str().unwrap();
        assert!(
            text.starts_with("gemini-once webhook_reenabled: webhooks/gemini-once"),
            "{text}"
        );
        assert!(
            text.contains("was disabled_due_to_failed_deliveries: re-enabled"),
            "{text}"
        );
        assert!(text.contains("update_mask=state"), "{text}");
        assert!(text.ends_with("3 swept."), "{text}");
    }
}
