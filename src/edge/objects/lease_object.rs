//! The ReconcileLease Durable Object: one for the worker, admitting one reconciliation pass at
//! a time and keeping the durable cursor between passes.
//!
//! Storage (SQLite): `lease(id = 1, body)` holds [`crate::reconciliation::lease_state::Lease`] as JSON;
//! `last_pass(id = 1, body)` the summary of the newest pass. Guarantees: acquire, renew and
//! release are read-decide-write with no await in between, so two overlapping cron runs can
//! never both hold the lease; a holder that lost the lease can neither renew it nor move the
//! cursor. The lease is short and renewed by its pass's heartbeat (each renewal also saves the
//! pass's position), so a pass that dies blocks the next for one TTL. The audit over `op:`
//! keeps its own cursor in the same record ([`crate::reconciliation::lease_state::Audit`]), moved only by the
//! holder, like the routine cursor. The same record is the one status budget: a gate's
//! confirmation takes its slot here ([`crate::reconciliation::lease_state::Lease::take_slot`],
//! read-decide-write like the rest), after the pass's schedule and Gemini's back-off.
//!
//! Another instance of this class, named [`GUARD_NAME`], is the strangers' tally
//! ([`crate::inbound::stranger::StrangerTally`]): it counts nudges for operations the worker
//! does not hold in memory (an evicted or restarted tally starts its alert window again, from
//! the state stored with the last alert), and stores only the aggregated alerts of the windows
//! (`guard(id = 1, body)`, at most [`MAX_OWED_ALERTS`] owed at once), which its alarm sends
//! until the sink accepts them, re-arming itself rather than relying on the runtime's few
//! retries. So a flood of strangers' nudges writes at most one row per alert window.

use std::cell::RefCell;

use serde::Deserialize;
use serde_json::{json, Value};
use worker::{durable_object, Date, DurableObject, Env, Request, Response, Result, State};

use crate::inbound::stranger::{alert_body, AlertLimits, StrangerTally};
use crate::reconciliation::lease_protocol::{LeaseCommand, LeaseReply};
use crate::reconciliation::lease_state::{Lease, SlotAnswer};
use crate::refusal::Refusal;
use crate::telemetry::worker_log::WorkerLog;

use crate::edge::outbound::fetch::post_alert;
use crate::edge::runtime::{load_config, log};

/// Aggregated alerts kept while the sink refuses them (one per alert window, so a day's worth
/// at the default hour); older ones are dropped first, counted in the newest.
const MAX_OWED_ALERTS: usize = 24;
/// How soon the tally's alarm tries an alert sink again after a failure.
const ALERT_RETRY_MS: i64 = 30_000;

/// The lease object's binding.
pub const LEASE_BINDING: &str = "RECONCILE_LEASE";
/// The one lease object's name.
pub const LEASE_NAME: &str = "reconcile";
/// The strangers' tally's name (an instance of the same class, so no new class to migrate).
pub const GUARD_NAME: &str = "strangers";

/// Serializes reconciliation passes (and, as `GUARD_NAME` ("strangers"), tallies strangers' nudges).
#[durable_object]
pub struct ReconcileLease {
    state: State,
    env: Env,
    /// The tally's counts, when this instance is the strangers' tally (read from storage once).
    tally: RefCell<Option<StrangerTally>>,
}

#[derive(Deserialize)]
struct BodyRow {
    body: String,
}

impl DurableObject for ReconcileLease {
    fn new(state: State, env: Env) -> Self {
        let sql = state.storage().sql();
        for ddl in [
            "CREATE TABLE IF NOT EXISTS lease (id INTEGER PRIMARY KEY CHECK (id = 1), body TEXT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS last_pass (id INTEGER PRIMARY KEY CHECK (id = 1), body TEXT NOT NULL)",
        ] {
            if let Err(e) = sql.exec(ddl, None) {
                log(WorkerLog::LeaseSchemaError { error: e.to_string() }.to_value());
            }
        }
        Self {
            state,
            env,
            tally: RefCell::new(None),
        }
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        let command: LeaseCommand = match req.json().await {
            Ok(c) => c,
            Err(e) => {
                return Refusal::BadRequest(format!("bad lease command: {e}")).into_response()
            }
        };
        let now = Date::now().as_millis() as i64;
        if let LeaseCommand::StrangerNudge { limits } = command {
            let alert = self.count_stranger(&limits, now).await?;
            return Response::from_json(&LeaseReply::StrangerCounted { alert });
        }
        match self.lease_command(command, now)? {
            Some(reply) => Response::from_json(&reply),
            // Answered above, before the lease is read.
            None => Refusal::BadRequest("a tally command".into()).into_response(),
        }
    }

    /// Only the strangers' tally sets an alarm: to send its aggregated alert.
    async fn alarm(&self) -> Result<Response> {
        self.send_tally_alerts().await?;
        Response::ok("ok")
    }
}

impl ReconcileLease {
    /// Counts a stranger's nudge; true when it raised the window's one alert, which is stored
    /// with the window's state (so a restart neither loses it nor raises it twice) and sent by
    /// the alarm.
    async fn count_stranger(&self, limits: &AlertLimits, now: i64) -> Result<bool> {
        let (alert, guard) = self.with_tally(|g| (g.count(now, limits), g.clone()));
        if alert {
            self.ensure_tally_table()?;
            let mut owed = self.owed_alerts();
            owed.push(alert_body(&guard));
            let dropped = owed.len().saturating_sub(MAX_OWED_ALERTS);
            owed.drain(..dropped);
            if dropped > 0 {
                if let Some(newest) = owed.last_mut() {
                    newest["older_alerts_dropped"] = json!(dropped);
                }
            }
            self.write("guard", &json!({"guard": guard, "alerts": owed}))?;
            self.set_alarm_in(0).await?;
        }
        Ok(alert)
    }

    /// A command on the lease: read, decided and written with no await in between, so two
    /// overlapping passes can never both hold it. `None` for a tally command (not the
    /// lease's).
    fn lease_command(&self, command: LeaseCommand, now: i64) -> Result<Option<LeaseReply>> {
        let mut lease: Lease = self.read("lease")?.unwrap_or_default();
        let reply = match command {
            LeaseCommand::Acquire { holder, ttl_ms } => {
                if !lease.acquire(&holder, now, ttl_ms) {
                    return Ok(Some(LeaseReply::Busy));
                }
                self.save_lease(&lease)?;
                LeaseReply::Granted {
                    resume: lease.resume.clone(),
                    status_backoff_until_ms: lease.status_backoff_until_ms,
                    webhook_alerted_state: lease.webhook_alerted_state.clone(),
                    audit: lease.audit.clone(),
                    // Slots given to gates are scheduled polls too: the pass goes after them.
                    fed_until_ms: lease.fed_until_ms.max(lease.gate_slots_until_ms),
                }
            }
            LeaseCommand::Renew {
                holder,
                ttl_ms,
                resume,
                status_backoff_until_ms,
                audit,
                fed_until_ms,
            } => {
                let progress = Some((resume, status_backoff_until_ms));
                let accepted = lease.renew(&holder, now, ttl_ms, progress);
                if accepted {
                    if let Some(progress) = audit {
                        lease.record_audit(&holder, progress, now);
                    }
                    lease.record_fed(&holder, fed_until_ms);
                    self.save_lease(&lease)?;
                }
                LeaseReply::Renewed { accepted }
            }
            LeaseCommand::Release {
                holder,
                resume,
                complete,
                status_backoff_until_ms,
                webhook_checked,
                webhook_alerted_state,
                audit,
                fed_until_ms,
                summary,
            } => {
                if let Some(progress) = audit {
                    // Fenced like the release: only the holder moves the audit's cursor.
                    lease.record_audit(&holder, progress, now);
                }
                lease.record_fed(&holder, fed_until_ms);
                let accepted = lease.release(&holder, resume, complete, status_backoff_until_ms);
                if accepted {
                    if webhook_checked {
                        lease.webhook_alerted_state = webhook_alerted_state;
                    }
                    self.save_lease(&lease)?;
                }
                self.write("last_pass", &summary)?;
                LeaseReply::Released { accepted }
            }
            LeaseCommand::Backoff {
                until_ms,
                fed_until_ms,
            } => {
                // Both, unconditionally: `|` does not stop at the first that moved.
                if lease.back_off(until_ms) | lease.sent_back(fed_until_ms) {
                    self.save_lease(&lease)?;
                }
                LeaseReply::BackedOff
            }
            LeaseCommand::Slot { rate_per_s } => {
                let answer = lease.take_slot(now, rate_per_s);
                if answer == SlotAnswer::Granted {
                    self.save_lease(&lease)?;
                }
                LeaseReply::Slot { answer }
            }
            LeaseCommand::StrangerNudge { .. } => return Ok(None),
            LeaseCommand::Status => LeaseReply::State {
                lease,
                last_pass: self.read("last_pass")?,
            },
        };
        Ok(Some(reply))
    }

    fn save_lease(&self, lease: &Lease) -> Result<()> {
        self.write("lease", &serde_json::to_value(lease).unwrap_or(Value::Null))
    }

    /// Runs `f` on the tally's counts, read from storage by this instance's first call.
    fn with_tally<T>(&self, f: impl FnOnce(&mut StrangerTally) -> T) -> T {
        let mut slot = self.tally.borrow_mut();
        let guard = slot.get_or_insert_with(|| {
            self.read::<Value>("guard")
                .ok()
                .flatten()
                .and_then(|v| serde_json::from_value(v["guard"].clone()).ok())
                .unwrap_or_default()
        });
        f(guard)
    }

    fn ensure_tally_table(&self) -> Result<()> {
        self.state.storage().sql().exec(
            "CREATE TABLE IF NOT EXISTS guard (id INTEGER PRIMARY KEY CHECK (id = 1), body TEXT NOT NULL)",
            None,
        )?;
        Ok(())
    }

    /// Aggregated alerts stored and not yet accepted by the sink, oldest first.
    fn owed_alerts(&self) -> Vec<Value> {
        let Some(stored) = self.read::<Value>("guard").ok().flatten() else {
            return Vec::new();
        };
        match (&stored["alerts"], &stored["alert"]) {
            (Value::Array(owed), _) => owed.clone(),
            // The single-alert form this object may have stored before.
            (_, Value::Null) => Vec::new(),
            (_, one) => vec![one.clone()],
        }
    }

    /// The tally's alarm: sends the stored aggregated alerts, oldest first, until the sink
    /// accepts them. A failure (the sink, or a configuration that does not parse) sets the
    /// alarm again in [`ALERT_RETRY_MS`], however long it lasts.
    async fn send_tally_alerts(&self) -> Result<()> {
        let mut owed = self.owed_alerts();
        if owed.is_empty() {
            return Ok(());
        }
        // The alarm that woke us is spent: set the retry before anything leaves, so a run cut
        // short mid-send (an eviction, a deploy) still wakes the tally to send again.
        self.set_alarm_in(ALERT_RETRY_MS).await?;
        let sent = match load_config(&self.env) {
            Ok(config) => {
                let mut sent = 0;
                for alert in &owed {
                    if !post_alert(&config, alert).await {
                        break;
                    }
                    sent += 1;
                }
                sent
            }
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
        if sent > 0 {
            // Alerts raised while this run was sending were stored behind the ones sent.
            let mut now_owed = self.owed_alerts();
            now_owed.drain(..sent.min(now_owed.len()));
            owed = now_owed;
            let guard = self
                .read::<Value>("guard")
                .ok()
                .flatten()
                .map(|v| v["guard"].clone());
            self.write("guard", &json!({"guard": guard, "alerts": owed}))?;
        }
        if owed.is_empty() {
            self.state.storage().delete_alarm().await?;
        }
        Ok(())
    }

    /// Sets this object's alarm `ms` from now.
    async fn set_alarm_in(&self, ms: i64) -> Result<()> {
        let at = Date::now().as_millis() as f64 + ms as f64;
        let date = worker::js_sys::Date::new(&worker::wasm_bindgen::JsValue::from_f64(at));
        self.state
            .storage()
            .set_alarm(worker::ScheduledTime::new(date))
            .await
    }

    /// The row of `table` (an error when the table does not exist).
    fn read<T: serde::de::DeserializeOwned>(&self, table: &str) -> Result<Option<T>> {
        let rows: Vec<BodyRow> = self
            .state
            .storage()
            .sql()
            .exec(&format!("SELECT body FROM {table} WHERE id = 1"), None)?
            .to_array()?;
        Ok(rows
            .first()
            .and_then(|r| serde_json::from_str(&r.body).ok()))
    }

    fn write(&self, table: &str, value: &Value) -> Result<()> {
        self.state.storage().sql().exec(
            &format!("INSERT INTO {table} (id, body) VALUES (1, ?) ON CONFLICT(id) DO UPDATE SET body = excluded.body"),
            vec![value.to_string().into()],
        )?;
        Ok(())
    }
}
