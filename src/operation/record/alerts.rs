//! The record's alerts: which kinds were raised (each once per spell of its condition) and
//! the queue of those the sink has not accepted yet.
//!
//! Guarantees: an alert stays queued in the record until the sink accepts it, so an object
//! that dies while sending it sends it later, under the same id (at least once); each spell's
//! alerts have their own ids, and one accepted takes only itself off the queue. The alerts of
//! one condition go in the order they were queued (a trigger, its resolution, the next
//! spell's trigger), each only after the one before it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::operation::alert::{human_age, AlertKind};
use crate::operation::record::Operation;

/// An alert raised and not yet accepted by the sink: kept in the record, so an object that
/// dies while sending it sends it later (at least once; `id`, its own in the queue, lets the
/// sink drop repeats).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingAlert {
    pub kind: AlertKind,
    pub id: String,
    pub age_seconds: i64,
    pub attempts: u32,
    pub due_ms: i64,
}

impl Operation {
    /// Marks an alert of `kind` as raised; false if one was raised before.
    pub(super) fn mark_alert(&mut self, kind: AlertKind) -> bool {
        if self.alerts.contains(&kind) {
            return false;
        }
        self.alerts.push(kind);
        self.changed();
        true
    }

    /// The body of an alert of `kind` about this operation, `age_seconds` old.
    pub fn alert_body(&self, kind: AlertKind, alert_id: &str, age_seconds: i64) -> Value {
        let age = human_age(age_seconds);
        let (status, key) = (self.status.as_str(), &self.key);
        let unusable = self.notes.unusable_status.as_deref();
        let unusable = unusable.unwrap_or("unknown reason");
        let what = match kind {
            // Raised while it had no outcome, sent after it got one (a retried send).
            AlertKind::Stuck if self.status.is_terminal() => {
                format!("had no outcome for {age}; it has one now: {status}")
            }
            AlertKind::Stuck => {
                format!("still {status} after {age}; left open for a person to judge")
            }
            AlertKind::UnknownToGemini => {
                format!("Gemini's status API does not know it (404) after {age}")
            }
            AlertKind::EffectFailing => match (&self.effect.parked, &self.effect.last_error) {
                (Some(p), _) => format!(
                    "{status} but its side effect was refused and parked: {}",
                    p.answer
                ),
                (None, Some(e)) => format!(
                    "{status} {age} ago but its side effect is still not done after {} attempts (last: {e})",
                    self.effect.attempts
                ),
                (None, None) => {
                    format!("{status} {age} ago but its side effect is still not done")
                }
            },
            AlertKind::WebhookDisabled | AlertKind::WebhookReenabled => {
                format!("{status} (the webhook, not this operation)")
            }
            AlertKind::RecordUnreadable => format!(
                "{status}: its stored record could not be read; it was recovered and the original kept for inspection"
            ),
            // Sent after an operator settled it (queued before): say so, not "still".
            AlertKind::StatusUnusable if self.status.is_terminal() => format!(
                "{status}: Gemini's status answer could not be used ({unusable}); it has an outcome now"
            ),
            AlertKind::StatusUnusable => format!(
                "still {status}: Gemini's status answer cannot be used ({unusable}); settle it by hand (POST /v1/operations/{key}/settle) once its outcome is known"
            ),
            AlertKind::AlarmFailing => format!("{status}: its gate's alarm keeps failing"),
            AlertKind::StuckSettled => format!("has an outcome now: {status}, after {age}"),
            AlertKind::EffectRecovered => format!(
                "{status}: its side effect was delivered after {} attempts",
                self.effect.attempts
            ),
            AlertKind::ResultsFileParked => {
                format!("{status}: its results file could not be read; its results are parked")
            }
            AlertKind::ResultsFileRead => {
                format!("{status}: its parked results file was read after all")
            }
            AlertKind::ResultsFailing => format!(
                "{status}: {} of its results are parked, refused by their destination or still failing after {age}; list them with GET /v1/operations/{key}/results?state=parked, send them again with POST /v1/operations/{key}/results/retry",
                self.results_gave_up
            ),
            AlertKind::ResultsRecovered => format!(
                "{status}: its parked results were sent again and none was refused or kept failing this time"
            ),
            AlertKind::ResultsSenderFailing => format!(
                "{status}: its result senders have answered nothing for {age}; {} of its results wait, sent again with backoff under their ids (none parked for it)",
                self.results_unanswered
            ),
            AlertKind::ResultsSenderRecovered => format!("{status}: no result waits on a silent sender"),
        };
        let subject = (Some(key.as_str()), self.name.as_str(), self.kind.as_deref());
        crate::operation::alert::body(kind, Some(alert_id), subject, age_seconds, &what)
    }

    /// Raises an alert of `kind` once per operation: marked, and queued until the sink
    /// accepts it. False when one was raised before.
    /// Nothing is raised for a forgotten operation, and `stuck` is not raised on top of
    /// `unknown_to_gemini` (Gemini not knowing it is why it is stuck: one alert says it) nor
    /// for a terminal operation (stuck means without an outcome: a pass that recovers a lost
    /// completion past the threshold asked for it before its poll settled the operation).
    pub fn raise_alert(&mut self, kind: AlertKind, age_seconds: i64, now_ms: i64) -> bool {
        let not_stuck =
            self.status.is_terminal() || self.alerts.contains(&AlertKind::UnknownToGemini);
        if self.notes.forgotten.is_some() || (kind == AlertKind::Stuck && not_stuck) {
            return false;
        }
        // A batch's results are still being sent, or its destination is paused by hand: the
        // job's effect waits, it is not failing.
        if kind == AlertKind::EffectFailing && (self.results_owed() || self.held_by_pause()) {
            return false;
        }
        if !self.mark_alert(kind) {
            return false;
        }
        // A condition that ends by itself stays open until its resolution is raised.
        if kind.resolution().is_some() && !self.open_alerts.contains(&kind) {
            self.open_alerts.push(kind);
        }
        self.queue_alert(kind, age_seconds, now_ms);
        true
    }

    /// The condition `kind` raised has ended: its resolution is raised (once per time the
    /// condition was opened; an operator's retry that lets `effect_failing` alert again does
    /// not close it) and queued like any alert, so the sink hears the end at least once,
    /// after the trigger (the queue keeps their order). False when the condition is not open.
    pub fn resolve_alert(&mut self, kind: AlertKind, now_ms: i64) -> bool {
        let open = self.open_alerts.contains(&kind);
        let Some(resolution) = kind.resolution().filter(|_| open) else {
            return false;
        };
        self.open_alerts.retain(|a| *a != kind);
        self.changed();
        let age_seconds = (now_ms - self.submitted_at_ms()).max(0) / 1_000;
        self.queue_alert(resolution, age_seconds, now_ms);
        true
    }

    /// The spell of `kind` raised last ends: a later raise is a new spell, alerted again under
    /// its own id (a sink that drops repeats by id keeps it).
    pub(super) fn rearm_alert(&mut self, kind: AlertKind) {
        if self.alerts.contains(&kind) {
            self.alerts.retain(|a| *a != kind);
            *self.alert_spells.entry(kind).or_default() += 1;
            self.changed();
        }
    }

    /// The spell of condition `kind` raised last (0 for the first): its trigger's and its
    /// resolution's ids both name it, so each is distinct from every other spell's.
    fn spell(&self, kind: AlertKind) -> u32 {
        let ended = self.alert_spells.get(&kind).copied().unwrap_or(0);
        match self.alerts.contains(&kind) {
            true => ended,
            false => ended.saturating_sub(1),
        }
    }

    fn queue_alert(&mut self, kind: AlertKind, age_seconds: i64, now_ms: i64) {
        let spell = self.spell(kind.resolves().unwrap_or(kind));
        let generation = self.effect.generation;
        self.pending_alerts.push(PendingAlert {
            kind,
            id: crate::operation::alert::alert_id(&self.key, kind, generation, spell),
            age_seconds,
            attempts: 0,
            due_ms: now_ms,
        });
        self.keep_in_order();
    }

    /// Holds each queued alert until the alerts of its condition queued before it are due (a
    /// trigger whose send failed holds its resolution, and a resolution the next spell's
    /// trigger): the run sends them in queue order, and one that fails holds the rest of its
    /// condition. PagerDuty pairs a trigger and its resolution by one `dedup_key` per
    /// condition, in the order they come: a resolution first would leave the incident open,
    /// one after the next spell's trigger would close that spell's.
    fn keep_in_order(&mut self) {
        let mut ahead: Vec<(AlertKind, i64)> = Vec::new();
        for alert in &mut self.pending_alerts {
            let condition = alert.kind.resolves().unwrap_or(alert.kind);
            match ahead.iter_mut().find(|(c, _)| *c == condition) {
                Some((_, at)) => {
                    alert.due_ms = alert.due_ms.max(*at);
                    *at = alert.due_ms;
                }
                None => ahead.push((condition, alert.due_ms)),
            }
        }
    }

    /// The sink accepted the queued alert `id`: it alone leaves the queue (another spell's
    /// alert of its kind still goes).
    pub fn alert_delivered(&mut self, id: &str) {
        if let Some(at) = self.pending_alerts.iter().position(|a| a.id == id) {
            self.pending_alerts.remove(at);
            self.changed();
        }
    }

    /// Sending the queued alert `id` failed: try again in `retry_in_ms`; the alerts of its
    /// condition queued after it wait as long.
    pub fn alert_failed(&mut self, id: &str, now_ms: i64, retry_in_ms: i64) {
        if let Some(alert) = self.pending_alerts.iter_mut().find(|a| a.id == id) {
            alert.attempts += 1;
            alert.due_ms = now_ms + retry_in_ms;
            self.keep_in_order();
            self.changed();
        }
    }

    /// The id of the first queued alert of `kind` (tests tell the record what the sink did).
    #[cfg(test)]
    pub fn queued_id(&self, kind: AlertKind) -> String {
        let queued = self.pending_alerts.iter().find(|a| a.kind == kind);
        queued.map(|a| a.id.clone()).unwrap_or_default()
    }

    /// Alerts whose time to be sent has come, in queue order.
    pub fn due_alerts(&self, now_ms: i64) -> Vec<PendingAlert> {
        let due = self.pending_alerts.iter().filter(|a| a.due_ms <= now_ms);
        due.cloned().collect()
    }
}
