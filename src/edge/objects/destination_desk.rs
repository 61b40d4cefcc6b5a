//! The DestinationDesk Durable Object: one per destination (named by its label), performing
//! what [`crate::destination::desk::Desk`] decides.
//!
//! Storage (SQLite): `desk(id = 1, body)` holds the [`Desk`] as JSON (its health, pace,
//! owed alerts, and an operator's pause with who and why, so a pause outlives the object's
//! restart); `waiting(key PRIMARY
//! KEY, due_ms)`, indexed by `(due_ms, key)`, the effects waiting for their release (so ten
//! thousand of them cost one row each, and the soonest are read first by the index);
//! `slots(key PRIMARY KEY, expires_ms)` a paced route's attempts in flight (those an ask
//! was granted, `{key}#{i}`, a drained key's under its key, all freed by its report);
//! `misses(key PRIMARY KEY, n)` how many probes in a row could not reach a key's gate.
//!
//! Guarantees: every command is read-decide-write with no await in between; a key keeps its
//! place in `waiting` when its gate asks again, and only a failure while open moves it behind
//! ([`Desk::queue_place`]); the alarm takes
//! the keys it releases out of `waiting` before it calls their gates and puts back those
//! whose gate could not be reached (a probe's by that key's own backoff), so a key is
//! released once; a gate that answers that nothing is owed drops its key. The alarm sends the
//! owed alerts and sets itself again while anything waits (and is not paused) or an alert is
//! owed, so it never relies on the runtime's retries. A check ([`DeskCommand::Check`]) reads
//! the desk's row and writes nothing.

use serde::Deserialize;
use worker::{durable_object, DurableObject, Env, Request, Response, Result, State};

use crate::destination::desk::{Desk, Facts, Wake, ALERT_RETRY_MS};
use crate::destination::protocol::{DeskCommand, DeskReply};
use crate::telemetry::worker_log::WorkerLog;

use crate::edge::error::bad_command;
use crate::edge::objects::row;
use crate::edge::outbound::fetch::post_alerts;
use crate::edge::runtime::{load_config, log, now_ms, set_alarm};

/// One destination's health and pace.
#[durable_object]
pub struct DestinationDesk {
    state: State,
    env: Env,
}

#[derive(Deserialize)]
struct CountRow {
    n: i64,
}

mod release;

impl DurableObject for DestinationDesk {
    fn new(state: State, env: Env) -> Self {
        let ddl = [
            "CREATE TABLE IF NOT EXISTS desk (id INTEGER PRIMARY KEY CHECK (id = 1), body TEXT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS waiting (key TEXT PRIMARY KEY, due_ms INTEGER NOT NULL)",
            "CREATE INDEX IF NOT EXISTS waiting_by_due ON waiting (due_ms, key)",
            "CREATE TABLE IF NOT EXISTS slots (key TEXT PRIMARY KEY, expires_ms INTEGER NOT NULL)",
            "CREATE TABLE IF NOT EXISTS misses (key TEXT PRIMARY KEY, n INTEGER NOT NULL)",
        ];
        row::create(&state, &ddl, |error| WorkerLog::DeskSchemaError { error });
        Self { state, env }
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        let command: DeskCommand = match req.json().await {
            Ok(c) => c,
            Err(e) => return bad_command("desk command", e),
        };
        let now = now_ms();
        let (reply, alarm_at) = self.command(command, now)?;
        if let Some(at) = alarm_at {
            self.alarm_no_later_than(at).await?;
        }
        Response::from_json(&reply)
    }

    /// A run that fails sets the alarm again itself, rather than relying on the runtime's
    /// few retries: what waits is never stranded.
    async fn alarm(&self) -> Result<Response> {
        let run = self.run_alarm().await;
        if run.is_err() {
            set_alarm(&self.state.storage(), now_ms() + ALERT_RETRY_MS).await?;
        }
        run
    }
}

impl DestinationDesk {
    /// One alarm run: what the desk releases, then the next alarm, then the owed alerts when
    /// due (last: a sink that is down holds no release back).
    async fn run_alarm(&self) -> Result<Response> {
        let now = now_ms();
        let mut desk = self.load()?;
        let facts = self.facts(now)?;
        let wake = desk.wake(facts, now);
        self.save(&desk)?;
        match wake {
            Wake::Probe => self.probe(now).await?,
            Wake::Drain(n) => self.drain(n, now).await?,
            Wake::Idle => {}
        }
        let desk = self.load()?;
        let now = now_ms();
        if let Some(at) = desk.next_alarm_ms(self.facts(now)?, now) {
            set_alarm(&self.state.storage(), at).await?;
        }
        if desk.alerts_due(now) {
            self.send_alerts(now).await?;
        }
        Response::ok("ok")
    }

    /// An ask, a report or a status request: read, decided and written with no await. Whoever
    /// spoke last runs the desk with its settings.
    fn command(&self, command: DeskCommand, now: i64) -> Result<(DeskReply, Option<i64>)> {
        let mut desk = self.load()?;
        // A check before a first attempt reads the one row and writes nothing.
        if let DeskCommand::Check { .. } = command {
            return Ok((desk.check(), None));
        }
        desk.settings = Some(command.settings().clone());
        // A report frees the slots its attempts held (`{key}#{i}`, and a drained key's own).
        if let DeskCommand::Report { key, .. } = &command {
            self.forget("slots", key)?;
            let range = vec![format!("{key}#").into(), format!("{key}$").into()];
            self.exec("DELETE FROM slots WHERE key >= ? AND key < ?", range)?;
        }
        let facts = self.facts(now)?;
        let (decision, key, due_ms) = match command {
            DeskCommand::Status { .. } | DeskCommand::Check { .. } => {
                return Ok((DeskReply::View(desk.view(facts)), None))
            }
            DeskCommand::Pause { .. } | DeskCommand::Resume { .. } => {
                return self.pause_or_resume(desk, command, facts, now)
            }
            DeskCommand::Ask { key, due_ms, n, .. } => (desk.ask(n, facts, now), key, due_ms),
            DeskCommand::Report {
                key, due_ms, sent, ..
            } => (desk.report(&key, sent, facts, now), key, due_ms),
        };
        desk.calls += 1;
        // Where `key` waits now, if it does.
        let waiting = self.n_of_key("SELECT due_ms AS n FROM waiting WHERE key = ?", &key)?;
        if let Some(at) = desk.queue_place(&key, waiting, due_ms, &decision, now) {
            self.enqueue(&key, at)?;
        }
        for i in 0..decision.slots {
            self.take_slot(&format!("{key}#{i}"), &desk, now)?;
        }
        self.save(&desk)?;
        Ok((decision.reply, decision.alarm_at_ms))
    }

    /// An operator's pause or resume (a dry run changes nothing); a resume sets the alarm, so
    /// what waited is released from its next run, soonest first.
    fn pause_or_resume(
        &self,
        mut desk: Desk,
        command: DeskCommand,
        facts: Facts,
        now: i64,
    ) -> Result<(DeskReply, Option<i64>)> {
        let changed = match command {
            DeskCommand::Pause {
                by,
                reason,
                dry_run: false,
                ..
            } => desk.pause(by, reason, now),
            DeskCommand::Resume { dry_run: false, .. } => desk.resume(),
            _ => false,
        };
        if changed {
            self.save(&desk)?;
        }
        let alarm = (changed && desk.paused.is_none() && facts.waiting > 0).then_some(now);
        let view = desk.view(facts);
        Ok((DeskReply::PauseSet { changed, view }, alarm))
    }

    /// Sends the owed alerts, oldest first, until the sink refuses one (tried again
    /// [`ALERT_RETRY_MS`] later), and logs those dropped past the bound.
    async fn send_alerts(&self, now: i64) -> Result<()> {
        let mut desk = self.load()?;
        if desk.alerts_dropped > 0 {
            let (owner, dropped) = (desk.label(), std::mem::take(&mut desk.alerts_dropped));
            log(WorkerLog::AlertDropped { owner, dropped }.to_value());
            self.save(&desk)?;
        }
        let Ok(config) = load_config(&self.env) else {
            return Ok(());
        };
        let sent = post_alerts(&config, &desk.alerts).await;
        let refused = sent < desk.alerts.len();
        let mut desk = self.load()?;
        desk.alerts_tried(sent, refused, now);
        self.save(&desk)?;
        if refused {
            // The retry's alarm, when nothing else set one sooner.
            let now = now_ms();
            if let Some(at) = desk.next_alarm_ms(self.facts(now)?, now) {
                self.alarm_no_later_than(at).await?;
            }
        }
        Ok(())
    }

    fn facts(&self, now: i64) -> Result<Facts> {
        let query = "DELETE FROM slots WHERE expires_ms <= ?";
        self.exec(query, vec![(now as f64).into()])?;
        Ok(Facts {
            waiting: self.count("SELECT COUNT(*) AS n FROM waiting")?,
            in_flight: self.count("SELECT COUNT(*) AS n FROM slots")?,
            next_due_ms: self.count("SELECT COALESCE(MIN(due_ms), 0) AS n FROM waiting")? as i64,
        })
    }

    fn count(&self, query: &str) -> Result<u64> {
        let rows: Vec<CountRow> = self.state.storage().sql().exec(query, None)?.to_array()?;
        Ok(rows.first().map_or(0, |r| r.n.max(0) as u64))
    }

    /// The `n` of the row `query` reads for `key`, if there is one.
    fn n_of_key(&self, query: &str, key: &str) -> Result<Option<i64>> {
        let sql = self.state.storage().sql();
        let rows: Vec<CountRow> = sql.exec(query, Some(vec![key.into()]))?.to_array()?;
        Ok(rows.first().map(|r| r.n))
    }

    /// Queues `key` due at `due_ms` (where [`Desk::queue_place`] put it, or its own backoff).
    fn enqueue(&self, key: &str, due_ms: i64) -> Result<()> {
        let query = "INSERT INTO waiting (key, due_ms) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET due_ms = excluded.due_ms";
        self.exec(query, vec![key.into(), (due_ms as f64).into()])
    }

    fn take_slot(&self, key: &str, desk: &Desk, now: i64) -> Result<()> {
        let query = "INSERT INTO slots (key, expires_ms) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET expires_ms = excluded.expires_ms";
        let expires = ((now + desk.slot_ttl_ms()) as f64).into();
        self.exec(query, vec![key.into(), expires])
    }

    /// Deletes `key`'s row of `table` (`waiting`, `slots` or `misses`).
    fn forget(&self, table: &str, key: &str) -> Result<()> {
        let query = format!("DELETE FROM {table} WHERE key = ?");
        self.exec(&query, vec![key.into()])
    }

    fn exec(&self, query: &str, bindings: Vec<worker::SqlStorageValue>) -> Result<()> {
        self.state.storage().sql().exec(query, Some(bindings))?;
        Ok(())
    }

    fn load(&self) -> Result<Desk> {
        Ok(row::read(&self.state.storage().sql(), "desk")?.unwrap_or_default())
    }

    fn save(&self, desk: &Desk) -> Result<()> {
        row::write(&self.state.storage().sql(), "desk", desk)
    }

    /// Sets the alarm at `at` unless one is already set sooner.
    async fn alarm_no_later_than(&self, at: i64) -> Result<()> {
        let current = self.state.storage().get_alarm().await?;
        if current.is_some_and(|c| c <= at) {
            return Ok(());
        }
        set_alarm(&self.state.storage(), at).await
    }
}
