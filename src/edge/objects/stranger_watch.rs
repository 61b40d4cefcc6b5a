//! The StrangerWatch Durable Object: one for the worker, the strangers' tally
//! ([`crate::inbound::stranger::StrangerTally`]). It counts nudges for operations the worker
//! does not hold, in memory (an evicted or restarted watch starts its alert window again,
//! from the state stored with the last alert), and raises one aggregated alert per window.
//!
//! Storage (SQLite): `watch(id = 1, body)` holds `{"tally", "alerts"}`: the window's state as
//! of its last alert and the alerts the sink has not accepted (at most
//! [`crate::inbound::stranger::MAX_OWED_ALERTS`]). Guarantees: a flood of strangers' nudges
//! writes at most one row per alert window; an alert stays stored until the sink accepts it,
//! and the alarm that sends it sets itself again before anything leaves (rather than relying
//! on the runtime's few retries), so a send cut short is made again.

use std::cell::RefCell;

use serde_json::{json, Value};
use worker::{durable_object, DurableObject, Env, Request, Response, Result, State};

use crate::inbound::stranger::{alert_body, owe, CountNudge, NudgeCounted, StrangerTally};
use crate::telemetry::worker_log::WorkerLog;

use crate::edge::error::bad_command;
use crate::edge::objects::row;
use crate::edge::outbound::fetch::post_alerts;
use crate::edge::runtime::{load_config, log, now_ms};

/// How soon the alarm tries an alert sink again after a failure.
const ALERT_RETRY_MS: i64 = 30_000;

/// The watch's binding.
pub const WATCH_BINDING: &str = "STRANGER_WATCH";
/// The one watch's name.
pub const WATCH_NAME: &str = "strangers";

/// Counts nudges naming operations the worker does not hold, and sends their one alert a
/// window.
#[durable_object]
pub struct StrangerWatch {
    state: State,
    env: Env,
    /// The tally's counts (read from storage by the first call).
    tally: RefCell<Option<StrangerTally>>,
}

impl DurableObject for StrangerWatch {
    fn new(state: State, env: Env) -> Self {
        let ddl = ["CREATE TABLE IF NOT EXISTS watch (id INTEGER PRIMARY KEY CHECK (id = 1), body TEXT NOT NULL)"];
        row::create(&state, &ddl, |error| WorkerLog::WatchSchemaError { error });
        let tally = RefCell::new(None);
        Self { state, env, tally }
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        let CountNudge { limits } = match req.json().await {
            Ok(c) => c,
            Err(e) => return bad_command("tally command", e),
        };
        let now = now_ms();
        let (alert, tally) = self.with_tally(|t| (t.count(now, &limits), t.clone()));
        // The window's one alert is stored with its state (so a restart neither loses it nor
        // raises it twice) and sent by the alarm, set for now (an offset of 0 ms).
        if alert {
            let mut owed = self.owed_alerts();
            owe(&mut owed, alert_body(&tally));
            self.store(&json!(tally), owed)?;
            self.state.storage().set_alarm(0).await?;
        }
        Response::from_json(&NudgeCounted { alert })
    }

    async fn alarm(&self) -> Result<Response> {
        self.send_alerts().await?;
        Response::ok("ok")
    }
}

impl StrangerWatch {
    /// Runs `f` on the tally's counts, read from storage by this instance's first call.
    fn with_tally<T>(&self, f: impl FnOnce(&mut StrangerTally) -> T) -> T {
        let mut slot = self.tally.borrow_mut();
        let tally = slot.get_or_insert_with(|| {
            self.stored()
                .and_then(|v| serde_json::from_value(v["tally"].clone()).ok())
                .unwrap_or_default()
        });
        f(tally)
    }

    /// The stored row, if any.
    fn stored(&self) -> Option<Value> {
        row::read(&self.state.storage().sql(), "watch").ok()?
    }

    /// Aggregated alerts stored and not yet accepted by the sink, oldest first.
    fn owed_alerts(&self) -> Vec<Value> {
        let stored = self.stored().unwrap_or_default();
        stored["alerts"].as_array().cloned().unwrap_or_default()
    }

    fn store(&self, tally: &Value, alerts: Vec<Value>) -> Result<()> {
        let body = json!({"tally": tally, "alerts": alerts});
        row::write(&self.state.storage().sql(), "watch", &body)
    }

    /// Sends the stored aggregated alerts, oldest first, until the sink accepts them. A
    /// failure (the sink, or a configuration that does not parse) sets the alarm again in
    /// [`ALERT_RETRY_MS`], however long it lasts.
    async fn send_alerts(&self) -> Result<()> {
        let owed = self.owed_alerts();
        if owed.is_empty() {
            return Ok(());
        }
        // The alarm that woke us is spent: set the retry before anything leaves, so a run cut
        // short mid-send (an eviction, a deploy) still wakes the watch to send again.
        self.state.storage().set_alarm(ALERT_RETRY_MS).await?;
        let sent = match load_config(&self.env) {
            Ok(config) => post_alerts(&config, &owed).await,
            Err(e) => {
                log(WorkerLog::AlertFailed {
                    alert: json!("stranger_nudges"),
                    key: None,
                    answer: format!("configuration: {e}"),
                }
                .to_value());
                0
            }
        };
        if sent == 0 {
            return Ok(());
        }
        // Alerts raised while this run was sending were stored behind the ones sent.
        let stored = self.stored().unwrap_or(Value::Null);
        let mut left = self.owed_alerts();
        left.drain(..sent.min(left.len()));
        let done = left.is_empty();
        self.store(&stored["tally"], left)?;
        if done {
            self.state.storage().delete_alarm().await?;
        }
        Ok(())
    }
}
