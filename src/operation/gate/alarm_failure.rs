//! When a gate's alarm fails: when it runs again.
//!
//! Guarantees: the gate's alarm never leaves its retries to the runtime (Cloudflare retries a
//! throwing alarm handler at most six times, from 2 s, then drops the alarm); a failed run is
//! recorded as a streak and re-armed on [`ALARM_RETRY`]'s backoff for as long as the fault
//! lasts, so an operation's work resumes at most its cap after the fault clears. These are constants, not configuration:
//! they must hold when the configuration itself is what fails. Time and jitter are parameters.

use serde::{Deserialize, Serialize};

use crate::operation::alert::{alert_id, body, human_age, AlertKind};
use crate::retry::Backoff;

/// A failing alarm's runs: 2 s after the first failure of a streak, doubling to 60 s, how long
/// after a fault clears its work may wait. One failing run costs an invocation and one small
/// storage write.
pub const ALARM_RETRY: Backoff = Backoff::new(2_000, 60_000);

/// A streak this long (about six minutes of failing) alerts `alarm_failing`, and again each time it
/// doubles (about 16 and 36 minutes, then every doubling), so a fault that nothing else can report
/// (a record that cannot be read, a broken deploy) reaches a person, without an alert a minute.
pub const ALERT_AFTER_FAILURES: u32 = 10;

/// The `alarm_failing` alert for a streak, sent by the gate itself: `key` when its record can
/// still be read (otherwise the object's id names it), with the error and how long it lasted.
pub fn alert(
    streak: &AlarmFailures,
    key: Option<&str>,
    object_id: &str,
    now: i64,
) -> serde_json::Value {
    let subject = key.unwrap_or(object_id);
    let age_seconds = (now.saturating_sub(streak.first_at_ms) / 1_000).max(0);
    let id = alert_id(subject, AlertKind::AlarmFailing, streak.failures, 0);
    body(
        AlertKind::AlarmFailing,
        Some(&id),
        (key, subject, None),
        age_seconds,
        &format!(
            "its gate's alarm has failed {} times in a row for {} (work resumes once this clears; a record that cannot be read needs POST /v1/operations/{{name}}/repair): {}",
            streak.failures,
            human_age(age_seconds),
            streak.error
        ),
    )
}

/// Whether the streak's `failures`-th failure alerts.
pub fn alerts_at(failures: u32) -> bool {
    failures >= ALERT_AFTER_FAILURES
        && failures.is_multiple_of(ALERT_AFTER_FAILURES)
        && (failures / ALERT_AFTER_FAILURES).is_power_of_two()
}

/// A run of failed alarms, kept in the gate's storage between runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlarmFailures {
    pub failures: u32,
    pub first_at_ms: i64,
    pub last_at_ms: i64,
    pub error: String,
}

/// Records a failed run at `now` after `previous` (the stored streak, if any) and returns the
/// streak and when to run again. A streak whose last failure is older than twice the longest
/// wait ended with a run that succeeded: this failure starts a new one. `jitter` in [0, 1)
/// shortens the wait by up to a quarter, so gates failing together do not retry in lockstep.
pub fn failed(
    previous: Option<AlarmFailures>,
    error: &str,
    now: i64,
    jitter: f64,
) -> (AlarmFailures, i64) {
    let streak = previous.filter(|p| now - p.last_at_ms <= 2 * ALARM_RETRY.max_ms);
    let (failures, first_at_ms) = match streak {
        Some(p) => (p.failures.saturating_add(1), p.first_at_ms),
        None => (1, now),
    };
    let wait = ALARM_RETRY.jittered(failures, jitter);
    let record = AlarmFailures {
        failures,
        first_at_ms,
        last_at_ms: now,
        error: error.chars().take(500).collect(),
    };
    (record, now + wait)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_streak_alerts_at_growing_intervals() {
        let at: Vec<u32> = (1..=200).filter(|f| alerts_at(*f)).collect();
        assert_eq!(at, [10, 20, 40, 80, 160]);
    }

    #[test]
    fn the_alert_names_the_gate_and_says_why() {
        let (streak, _) = failed(None, "configuration: EFFECT_URL is not a URL", 1_000, 0.0);
        let body = alert(&streak, None, "0f3a", 361_000);
        assert_eq!(body["alert"], "alarm_failing");
        assert_eq!(body["name"], "0f3a");
        assert_eq!(body["age_seconds"], 360);
        assert!(body["text"]
            .as_str()
            .unwrap()
            .contains("EFFECT_URL is not a URL"));
        let named = alert(&streak, Some("batches/x"), "0f3a", 361_000);
        assert_eq!(named["key"], "batches/x");
    }

    /// Cloudflare's runtime: a throwing alarm is retried 6 times, from 2 s, doubling.
    const RUNTIME_RETRIES: u32 = 6;

    #[test]
    fn waits_double_from_two_seconds_to_the_cap() {
        let mut streak = None;
        let mut now = 0;
        let mut waits = Vec::new();
        for _ in 0..10 {
            let (s, at) = failed(streak, "configuration: EFFECT_TIMEOUT_MS", now, 0.999_999);
            waits.push((at - now + 500) / 1_000);
            now = at;
            streak = Some(s);
        }
        assert_eq!(waits, [2, 4, 8, 16, 32, 60, 60, 60, 60, 60]);
        let s = streak.unwrap();
        assert_eq!(s.failures, 10);
        assert_eq!(s.first_at_ms, 0);
    }

    #[test]
    fn a_fault_longer_than_the_runtime_s_retries_keeps_an_alarm_set() {
        // Ten minutes of a broken configuration: every run fails, and every run sets the next.
        let mut streak = None;
        let mut now = 0;
        let mut runs = 0;
        while now < 600_000 {
            let (s, at) = failed(streak, "configuration", now, 0.5);
            assert!(at > now && at - now <= ALARM_RETRY.max_ms);
            streak = Some(s);
            now = at;
            runs += 1;
        }
        assert!(runs > RUNTIME_RETRIES + 1, "{runs} runs");
    }

    #[test]
    fn jitter_shortens_by_at_most_a_quarter() {
        let (_, at) = failed(None, "e", 0, 0.0);
        assert_eq!(at, 1_500);
        let (_, at) = failed(None, "e", 0, 0.999);
        assert!(at <= 2_000 && at > 1_990);
    }

    #[test]
    fn an_old_streak_ended_and_a_new_one_starts() {
        let old = AlarmFailures {
            failures: 9,
            first_at_ms: 0,
            last_at_ms: 1_000,
            error: "x".into(),
        };
        let (s, at) = failed(
            Some(old.clone()),
            "y",
            1_000 + 3 * ALARM_RETRY.max_ms,
            0.999,
        );
        assert_eq!(s.failures, 1);
        assert!(at - s.last_at_ms <= ALARM_RETRY.first_ms);
        let (s, _) = failed(Some(old), "y", 30_000, 0.5);
        assert_eq!((s.failures, s.first_at_ms, s.error.as_str()), (10, 0, "y"));
    }

    #[test]
    fn a_long_error_is_cut() {
        let (s, _) = failed(None, &"e".repeat(10_000), 0, 0.5);
        assert_eq!(s.error.len(), 500);
    }
}
