//! Nudges that name operations this worker does not hold open: what they leave behind, and
//! the one aggregated alert about many of them.
//!
//! Anyone can obtain valid dynamic-webhook tokens (by running a job of their own pointed at this
//! worker) and put any name in the body, so a nudge proves nothing and creates nothing: only an
//! operation the worker already holds (registered, or opened by an HMAC-signed delivery) is
//! hastened by one ([`crate::operation::gate::step`], `Nudge`). Guarantees: a nudge for any other
//! name (never seen, purged at retention, forgotten by storage) makes no call outside the worker
//! and stores nothing for the name (no record, no Durable Object storage, no KV entry); it is
//! answered 2xx, counted and logged, and counted by a worker-wide [`StrangerTally`] whose crossing
//! of `threshold` within an alert window raises one aggregated alert for that window (a user who
//! forgot to register their dynamic-webhook jobs finds out). The tally lives in an object of its
//! own (the `StrangerWatch`, spoken to with [`CountNudge`] and answering [`NudgeCounted`]), which
//! keeps at most [`MAX_OWED_ALERTS`] alerts the sink has not accepted ([`owe`]). Time is a
//! parameter.
//!
//! A `v1a`-signed body is Google's, but Google's keys serve every project: a body naming an
//! operation no gate holds is asked about once, with our key, in a slot of the status budget
//! (answered for it, the job is ours and its record is created from the answer). A stranger
//! can only name jobs Google signed deliveries for (their own), and only within the
//! signature's time window; [`NotOurs`] keeps an isolate from asking again about a name the
//! status API said is not ours within [`NOT_OURS_MS`], so replays of one such delivery cost no
//! further status call from that isolate. Nothing is stored for the name either way.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::operation::observation::{Observation, SlotAnswer, StatusError};

/// How long an isolate remembers that the status API said a name is not ours (404, or any
/// other refusal): the default `CONFIRM_INTERVAL_SECONDS`, so a name is asked about at most
/// once a minute per isolate however often a signed delivery naming it is replayed.
pub const NOT_OURS_MS: i64 = 60_000;

/// Names kept at most: past this the memory starts over (a miss costs one status call, in a
/// slot of the budget).
pub const NOT_OURS_MAX: usize = 10_000;

/// The names an isolate was told are not ours, and when.
#[derive(Debug, Default)]
pub struct NotOurs {
    told: std::collections::HashMap<String, i64>,
}

impl NotOurs {
    /// True when the status API said `key` is not ours less than [`NOT_OURS_MS`] ago.
    pub fn knows(&self, key: &str, now_ms: i64) -> bool {
        self.told
            .get(key)
            .is_some_and(|at| (0..NOT_OURS_MS).contains(&(now_ms - at)))
    }

    /// What the status API said about `key` at `now_ms`: a 404 or a 403 (another project's)
    /// is remembered; any other answer (ours, our key refused, or no usable answer) is not.
    pub fn answered(&mut self, key: &str, answer: &Result<Observation, StatusError>, now_ms: i64) {
        if !matches!(
            answer,
            Err(StatusError::NotFound | StatusError::Refused(403))
        ) {
            return;
        }
        if self.told.len() >= NOT_OURS_MAX {
            self.told.clear();
        }
        self.told.insert(key.to_string(), now_ms);
    }
}

/// The longest an edge waits, in all, within the request for a slot of the status budget:
/// slots are `1 / RECONCILE_POLL_RATE` apart (50 ms at the default), so two signed deliveries
/// arriving together both get theirs; a longer wait (Gemini's back-off, a pass holding the
/// lease) is Gemini's to wait, through a 503.
pub const SLOT_WAIT_MAX_MS: i64 = 1_000;

/// The most answers an edge asks of the status budget for one delivery. More than two, because
/// the slot a first answer names can be a millisecond away again when asked (the keeper's clock
/// and the edge's timer are not one), and a refusal then would be a 503 for a wait of nothing.
pub const SLOT_ASKS_MAX: u32 = 3;

/// How long an edge has waited for a slot so far, and how many answers it had.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotWaited {
    pub asks: u32,
    pub ms: i64,
}

/// What an edge about to ask about a `v1a`-signed body's unheld operation does with the
/// status budget's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotStep {
    /// The slot is taken: ask the status API.
    Ask,
    /// Wait this long, then ask the budget again.
    Wait(i64),
    /// Give up for now, as if the status API had answered this: the delivery is answered 503
    /// and Gemini retries. No status call leaves outside the budget.
    Refuse(StatusError),
}

/// The step after the status budget's answer at `now_ms` (`None`: its keeper did not answer),
/// given what was waited before it; a `Wait` is counted into `waited`.
pub fn slot_step(answer: Option<SlotAnswer>, now_ms: i64, waited: &mut SlotWaited) -> SlotStep {
    waited.asks += 1;
    let until_ms = match answer {
        Some(SlotAnswer::Granted) => return SlotStep::Ask,
        Some(SlotAnswer::WaitUntil { until_ms }) => until_ms,
        None => {
            let retry_after_secs = NOT_OURS_MS / 1_000;
            return SlotStep::Refuse(StatusError::Transient { retry_after_secs });
        }
    };
    let wait = (until_ms - now_ms).max(1);
    if waited.asks < SLOT_ASKS_MAX && waited.ms + wait <= SLOT_WAIT_MAX_MS {
        waited.ms += wait;
        return SlotStep::Wait(wait);
    }
    let retry_after_secs = (wait + 999) / 1_000;
    SlotStep::Refuse(StatusError::Transient { retry_after_secs })
}

/// The worker-wide count of nudges for names the worker does not hold, kept by one object
/// (in memory; stored only with the window's one alert).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StrangerTally {
    /// The current alert window's start, nudges counted in it, and whether its one alert
    /// was raised.
    pub window_start_ms: i64,
    pub window_unknown: u32,
    pub window_alerted: bool,
}

/// The alert's settings (from the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlertLimits {
    pub threshold: u32,
    pub window_ms: i64,
}

impl StrangerTally {
    /// One more nudge for a name the worker does not hold. True when this crosses the
    /// threshold of a window that has not alerted yet: its one aggregated alert is due.
    pub fn count(&mut self, now_ms: i64, limits: &AlertLimits) -> bool {
        if now_ms - self.window_start_ms >= limits.window_ms || now_ms < self.window_start_ms {
            self.window_start_ms = now_ms;
            self.window_unknown = 0;
            self.window_alerted = false;
        }
        self.window_unknown = self.window_unknown.saturating_add(1);
        if !self.window_alerted && self.window_unknown >= limits.threshold {
            self.window_alerted = true;
            return true;
        }
        false
    }
}

/// The message to the strangers' tally: one more nudge named an operation the worker does not
/// hold, to be counted under these limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountNudge {
    pub limits: AlertLimits,
}

/// The tally's answer: whether this nudge crossed the window's threshold (its one alert is
/// then stored and sent by the tally).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NudgeCounted {
    pub alert: bool,
}

/// Aggregated alerts kept while the sink refuses them (one per alert window, so a day's worth
/// at the default hour); older ones are dropped first, counted in the newest.
pub const MAX_OWED_ALERTS: usize = 24;

/// Adds `alert` to the alerts owed to the sink, oldest first, dropping the oldest beyond
/// [`MAX_OWED_ALERTS`] and saying in the newest how many were dropped.
pub fn owe(owed: &mut Vec<Value>, mut alert: Value) {
    let dropped = (owed.len() + 1).saturating_sub(MAX_OWED_ALERTS);
    owed.drain(..dropped.min(owed.len()));
    if dropped > 0 {
        alert["older_alerts_dropped"] = json!(dropped);
    }
    owed.push(alert);
}

/// The aggregated alert's body (`stranger_nudges`): how many, since when, and what to do.
/// Its id is the window's, so a resend of it is the same alert.
pub fn alert_body(tally: &StrangerTally) -> Value {
    let since = crate::timestamp::format_rfc3339(tally.window_start_ms);
    let id = format!("alert_strangers_{}", tally.window_start_ms);
    json!({
        "alert": "stranger_nudges",
        "alert_id": id,
        "key": null,
        "name": null,
        "kind": null,
        "age_seconds": 0,
        "count": tally.window_unknown,
        "since": since,
        "text": format!(
            "gemini-once stranger_nudges: dynamic webhooks (nudges) at least {} since {since} named operations this worker does not hold open; nothing was stored or asked for them. A dynamic-webhook job must be registered (POST /v1/operations) to be tracked: register yours as you submit them. If they are someone else's jobs pointed at this worker, nothing is needed; set DYNAMIC_WEBHOOKS=false if you use only the static webhook.",
            tally.window_unknown
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: AlertLimits = AlertLimits {
        threshold: 2,
        window_ms: 3_600_000,
    };

    #[test]
    fn the_alert_is_raised_once_per_window() {
        let mut g = StrangerTally::default();
        let t = 5_000_000;
        assert!(!g.count(t, &LIMITS));
        assert!(g.count(t + 1, &LIMITS), "the threshold crossed");
        for i in 2..50 {
            assert!(!g.count(t + i, &LIMITS), "once per window");
        }
        assert!(!g.count(t + LIMITS.window_ms, &LIMITS), "a new window");
        assert!(g.count(t + LIMITS.window_ms + 1, &LIMITS));
        let body = alert_body(&g);
        assert_eq!(body["alert"], "stranger_nudges");
        assert_eq!(body["count"], 2);
        assert!(body["text"]
            .as_str()
            .unwrap()
            .contains("POST /v1/operations"));
        // The documented line: `gemini-once <alert>: <name> (<kind>) <what>`.
        assert!(body["text"].as_str().unwrap().starts_with(
            "gemini-once stranger_nudges: dynamic webhooks (nudges) at least 2 since "
        ));
    }

    #[test]
    fn owed_alerts_keep_the_newest_and_say_how_many_were_dropped() {
        let mut owed = Vec::new();
        for i in 0..MAX_OWED_ALERTS {
            owe(&mut owed, json!({"n": i}));
        }
        assert_eq!(owed.len(), MAX_OWED_ALERTS);
        assert!(owed.iter().all(|a| a.get("older_alerts_dropped").is_none()));
        owe(&mut owed, json!({"n": "newest"}));
        assert_eq!(owed.len(), MAX_OWED_ALERTS);
        assert_eq!(owed[0]["n"], 1, "the oldest went first");
        assert_eq!(owed.last().unwrap()["older_alerts_dropped"], 1);
    }

    #[test]
    fn the_tallys_messages_round_trip() {
        let count = CountNudge { limits: LIMITS };
        let text = serde_json::to_string(&count).unwrap();
        assert_eq!(serde_json::from_str::<CountNudge>(&text).unwrap(), count);
        let counted: NudgeCounted = serde_json::from_str(r#"{"alert":true}"#).unwrap();
        assert!(counted.alert);
    }

    #[test]
    fn a_clock_that_steps_back_starts_a_new_window() {
        let mut g = StrangerTally::default();
        assert!(!g.count(
            10_000_000,
            &AlertLimits {
                threshold: 3,
                ..LIMITS
            }
        ));
        assert!(!g.count(
            5_000,
            &AlertLimits {
                threshold: 3,
                ..LIMITS
            }
        ));
        assert_eq!((g.window_start_ms, g.window_unknown), (5_000, 1));
    }

    #[test]
    fn a_tally_stored_by_an_earlier_version_still_loads() {
        let stored = json!({"minute_start_ms": 1, "minute_unknown": 4, "window_start_ms": 7,
            "window_unknown": 3, "window_alerted": true, "refused": 9});
        let g: StrangerTally = serde_json::from_value(stored).unwrap();
        assert_eq!(
            (g.window_start_ms, g.window_unknown, g.window_alerted),
            (7, 3, true)
        );
    }

    #[test]
    fn a_name_the_status_api_said_is_not_ours_is_not_asked_about_again_for_a_while() {
        use crate::operation::lifecycle::Status;
        use crate::operation::observation::Observation;
        let mut memory = NotOurs::default();
        memory.answered("batches/x", &Err(StatusError::NotFound), 1_000);
        memory.answered("batches/y", &Err(StatusError::Refused(403)), 1_000);
        assert!(memory.knows("batches/x", 1_000));
        assert!(memory.knows("batches/y", 1_000 + NOT_OURS_MS - 1));
        assert!(!memory.knows("batches/x", 1_000 + NOT_OURS_MS));
        assert!(
            !memory.knows("batches/x", 999),
            "a clock that went back asks again"
        );
        // Ours, or no usable answer: asked again next time.
        let ours = Observation {
            status: Status::Succeeded,
            update_time_ms: 0,
            details: serde_json::Map::new(),
        };
        for answer in [
            Ok(ours),
            Err(StatusError::Transient {
                retry_after_secs: 5,
            }),
            Err(StatusError::Malformed("x".into())),
            Err(StatusError::NoApiKey),
            // Our key refused: says nothing of whose the job is.
            Err(StatusError::Refused(401)),
        ] {
            memory.answered("batches/z", &answer, 1_000);
            assert!(!memory.knows("batches/z", 1_000), "{answer:?}");
        }
    }

    #[test]
    fn no_status_call_leaves_outside_the_budget() {
        let wait = |until_ms| Some(SlotAnswer::WaitUntil { until_ms });
        let step =
            |answer, now_ms, asks, ms| slot_step(answer, now_ms, &mut SlotWaited { asks, ms });
        assert_eq!(step(Some(SlotAnswer::Granted), 0, 0, 0), SlotStep::Ask);
        assert_eq!(step(Some(SlotAnswer::Granted), 0, 2, 900), SlotStep::Ask);
        // A slot a moment away: waited for.
        assert_eq!(step(wait(1_050), 1_000, 0, 0), SlotStep::Wait(50));
        assert_eq!(
            step(wait(1_000 + SLOT_WAIT_MAX_MS), 1_000, 0, 0),
            SlotStep::Wait(SLOT_WAIT_MAX_MS)
        );
        // Asked again at the named moment and told it is a millisecond away: waited again.
        let mut waited = SlotWaited::default();
        assert_eq!(
            slot_step(wait(1_050), 1_000, &mut waited),
            SlotStep::Wait(50)
        );
        assert_eq!(
            slot_step(wait(1_050), 1_050, &mut waited),
            SlotStep::Wait(1)
        );
        assert_eq!(waited, SlotWaited { asks: 2, ms: 51 });
        // The third answer is the last: it is a slot or a 503.
        assert_eq!(
            slot_step(wait(1_052), 1_051, &mut waited),
            SlotStep::Refuse(StatusError::Transient {
                retry_after_secs: 1
            })
        );
        // Waits add up to at most SLOT_WAIT_MAX_MS (a pass holding the lease for a second).
        assert_eq!(
            step(wait(2_000), 1_000, 1, 50),
            SlotStep::Refuse(StatusError::Transient {
                retry_after_secs: 1
            })
        );
        // Gemini's back-off, or no answer from the budget: Gemini retries.
        assert_eq!(
            step(wait(31_000), 1_000, 0, 0),
            SlotStep::Refuse(StatusError::Transient {
                retry_after_secs: 30
            })
        );
        assert_eq!(
            step(None, 0, 0, 0),
            SlotStep::Refuse(StatusError::Transient {
                retry_after_secs: 60
            })
        );
    }
}
