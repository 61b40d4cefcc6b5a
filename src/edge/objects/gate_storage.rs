//! The OperationGate's storage: its record and history in SQLite, the record cached in
//! memory, and its one alarm.
//!
//! Tables: `operation(id = 1, body)` holds the record as JSON (see
//! [`crate::operation::Operation`]); `history(seq, at_ms,
//! entry)` keeps the newest [`HISTORY_LIMIT`] entries (trimmed in steps of [`TRIM_EVERY`]).
//! Guarantees: every write of the record goes through [`GateStorage::save`], so the cache
//! equals storage (except counts of settled duplicates, kept in memory by
//! [`GateStorage::keep_in_memory`] until the next write); the alarm is set only when its time
//! changes (an unchanged wake time costs no storage call). The tables are created by the first
//! write, never by a read: an object that only answered (a nudge or delivery for an
//! unregistered name with `REQUIRE_REGISTRATION=true`, a command for an operation it does not
//! know) stores nothing at all. A record that does not load is kept and recovered
//! ([`crate::edge::objects::gate_repair`]), so it never bricks its operation; the alarm's failure streak is kept under `alarm_failures`
//! in the object's key-value storage. When retention ends, [`GateStorage::purge`] deletes all
//! of it.

use std::cell::{Cell, RefCell};

use serde::Deserialize;
use serde_json::{json, Value};
use worker::wasm_bindgen::JsValue;
use worker::{Result, ScheduledTime, State};

use crate::operation::alarm_failure::AlarmFailures;
use crate::operation::gate::Limits;
use crate::operation::gate_log::GateLog;
use crate::operation::history::HistoryEntry;
use crate::operation::Operation;

use crate::edge::log;
use crate::edge::objects::usage_meter::Meter;

/// History rows kept per operation; older rows are deleted.
const HISTORY_LIMIT: i64 = 200;
/// History is trimmed when a row's sequence number is a multiple of this, not on every
/// insert (a DELETE per duplicate delivery measurably cost), so at most
/// `HISTORY_LIMIT + TRIM_EVERY` rows exist.
const TRIM_EVERY: i64 = 50;

/// Both tables, created in one statement. `history.seq` is a plain rowid, not AUTOINCREMENT:
/// that would write a `sqlite_sequence` row with every insert (a billed row written), and
/// only the oldest rows are ever deleted, so the newest seq is never reused (an object whose
/// table was created with AUTOINCREMENT behaves the same).
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS operation (id INTEGER PRIMARY KEY CHECK (id = 1), body TEXT NOT NULL); \
CREATE TABLE IF NOT EXISTS history (seq INTEGER PRIMARY KEY, at_ms INTEGER NOT NULL, entry TEXT NOT NULL)";

/// The key, in the object's key-value storage, of the alarm's failure streak (see
/// [`crate::operation::alarm_failure`]).
const ALARM_FAILURES: &str = "alarm_failures";

/// The record as this instance knows it: every write goes through [`GateStorage::save`],
/// so it equals storage, except for counts of settled duplicates not stored yet.
pub(super) enum Cached {
    Unread,
    Absent,
    Present(Box<Operation>),
}

impl Cached {
    fn of(op: Option<Operation>) -> Cached {
        op.map_or(Cached::Absent, |op| Cached::Present(Box::new(op)))
    }
}

#[derive(Deserialize)]
pub(super) struct BodyRow {
    pub(super) body: String,
}

/// One gate's tables, cache and alarm.
pub struct GateStorage {
    state: State,
    /// The alarm time this instance last set; `None` when unknown (a new instance, or inside
    /// the alarm, which consumes it).
    alarm_at: Cell<Option<i64>>,
    meter: Meter,
    pub(super) cached: RefCell<Cached>,
    /// The tables are known to exist (created or found by this instance).
    schema_ready: Cell<bool>,
    /// A record was recovered by this instance and its alarm not yet set for it.
    pub(super) recovered: Cell<bool>,
}

/// True for SQLite's answer to a query on a table not created yet.
fn no_table(e: &worker::Error) -> bool {
    e.to_string().contains("no such table")
}

impl GateStorage {
    /// Opens the storage without touching it: the tables are created by the first write
    /// ([`GateStorage::ensure_schema`]).
    pub fn open(state: State) -> GateStorage {
        GateStorage {
            state,
            meter: Meter::default(),
            alarm_at: Cell::new(None),
            cached: RefCell::new(Cached::Unread),
            schema_ready: Cell::new(false),
            recovered: Cell::new(false),
        }
    }

    /// Creates the tables if needed, once per instance, before its first write (one
    /// statement, so one call, not one per table).
    fn ensure_schema(&self) -> Result<()> {
        if self.schema_ready.get() {
            return Ok(());
        }
        if let Err(e) = self.meter.exec(&self.sql(), SCHEMA, None) {
            log(GateLog::GateSchemaError {
                error: e.to_string(),
            }
            .to_value());
            return Err(e);
        }
        self.schema_ready.set(true);
        Ok(())
    }

    /// What this object used (see [`Meter`]).
    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// The object's database, for the meter's size figure.
    pub fn sql(&self) -> worker::SqlStorage {
        self.state.storage().sql()
    }

    /// The alarm that woke this instance is spent; the next wake time must be set again.
    pub fn forget_alarm(&self) {
        self.alarm_at.set(None);
    }

    /// Keeps `op` in memory only (counts of a settled operation; stored with the next write).
    pub fn keep_in_memory(&self, op: &Operation) {
        self.cached.replace(Cached::Present(Box::new(op.clone())));
    }

    /// Deletes all of the object's storage (retention ended): the SQL tables, the key-value
    /// keys and the alarm (`deleteAll` deletes the alarm from compatibility date 2026-02-24
    /// on; wrangler.toml's is later, and the purge runs inside the alarm, whose own wake is
    /// spent), so the runtime keeps nothing for this object and no further row is billed.
    pub async fn purge(&self) -> Result<()> {
        self.state.storage().delete_all().await?;
        self.alarm_at.set(None);
        self.schema_ready.set(false);
        self.recovered.set(false);
        self.cached.replace(Cached::Absent);
        Ok(())
    }

    /// Sets the alarm for what `op` has pending next (or deletes it when nothing is).
    pub async fn sync_alarm(&self, op: &Operation, limits: &Limits) -> Result<()> {
        let storage = self.state.storage();
        let wake = op.wake_at_ms(limits.retention_ms, limits.stats_delay_ms);
        if wake.is_some() && wake == self.alarm_at.get() {
            return Ok(());
        }
        // Forgotten first: if the call fails, the next one sets the alarm again.
        self.alarm_at.set(None);
        match wake {
            Some(at) => {
                let date = worker::js_sys::Date::new(&JsValue::from_f64(at as f64));
                storage.set_alarm(ScheduledTime::new(date)).await?;
            }
            None => storage.delete_alarm().await?,
        }
        self.meter.add(|u| u.alarm_writes += 1);
        self.alarm_at.set(wake);
        Ok(())
    }

    /// The stored record's row, as text; none when the gate never wrote one.
    pub(super) fn stored_body(&self) -> Result<Vec<BodyRow>> {
        match self
            .meter
            .rows(&self.sql(), "SELECT body FROM operation WHERE id = 1", None)
        {
            Ok(rows) => {
                self.schema_ready.set(true);
                Ok(rows)
            }
            // Never written: nothing stored, and nothing is created by reading.
            Err(e) if no_table(&e) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// The record (read once, then from memory).
    pub fn load(&self) -> Result<Option<Operation>> {
        match &*self.cached.borrow() {
            Cached::Absent => return Ok(None),
            Cached::Present(op) => return Ok(Some((**op).clone())),
            Cached::Unread => {}
        }
        let rows = self.stored_body()?;
        let op: Option<Operation> = match rows.first() {
            None => None,
            Some(row) => Some(match serde_json::from_str::<Operation>(&row.body) {
                Ok(op) => op.as_loaded(),
                Err(e) => self.recover(&row.body, &e.to_string())?.as_loaded(),
            }),
        };
        self.cached.replace(Cached::of(op.clone()));
        Ok(op)
    }

    /// This object's id, to name it when its record cannot be read.
    pub fn object_id(&self) -> String {
        self.state.id().to_string()
    }

    /// The key of the record in memory, if one is.
    pub fn cached_key(&self) -> Option<String> {
        match &*self.cached.borrow() {
            Cached::Present(op) => Some(op.key().to_string()),
            _ => None,
        }
    }

    /// The alarm time this instance last set, if it knows it.
    pub fn alarm_set_at(&self) -> Option<i64> {
        self.alarm_at.get()
    }

    /// The alarm's failures so far, if a streak is stored.
    pub async fn alarm_failures(&self) -> Result<Option<AlarmFailures>> {
        self.state.storage().get(ALARM_FAILURES).await
    }

    /// Stores a streak of alarm failures and sets the alarm at `retry_at` (whatever this
    /// instance believed was set).
    pub async fn alarm_failed(&self, streak: &AlarmFailures, retry_at: i64) -> Result<()> {
        let stored = self.state.storage().put(ALARM_FAILURES, streak).await;
        self.alarm_at.set(None);
        let date = worker::js_sys::Date::new(&JsValue::from_f64(retry_at as f64));
        self.state
            .storage()
            .set_alarm(ScheduledTime::new(date))
            .await?;
        self.alarm_at.set(Some(retry_at));
        stored
    }

    /// A run succeeded after failures: the streak is over.
    pub async fn alarm_recovered(&self) -> Result<()> {
        self.state
            .storage()
            .delete(ALARM_FAILURES)
            .await
            .map(|_| ())
    }

    /// Stores the record.
    pub fn save(&self, op: &Operation) -> Result<()> {
        let body =
            serde_json::to_string(op).map_err(|e| worker::Error::RustError(e.to_string()))?;
        self.ensure_schema()?;
        self.meter.exec(
            &self.sql(),
            "INSERT INTO operation (id, body) VALUES (1, ?) ON CONFLICT(id) DO UPDATE SET body = excluded.body",
            vec![body.into()],
        )?;
        self.cached.replace(Cached::Present(Box::new(op.clone())));
        Ok(())
    }

    /// Appends history entries, all in one statement; trims when a row's sequence number
    /// reaches a multiple of [`TRIM_EVERY`] (counted in storage, so it holds across
    /// instances, so waking an object costs no trim).
    pub fn record(&self, at_ms: i64, entries: Vec<HistoryEntry>) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        self.ensure_schema()?;
        #[derive(Deserialize)]
        struct SeqRow {
            seq: f64,
        }
        let sql = self.sql();
        let mut query = String::from("INSERT INTO history (at_ms, entry) VALUES ");
        let mut bindings = Vec::with_capacity(entries.len() * 2);
        for (i, entry) in entries.into_iter().enumerate() {
            query.push_str(if i == 0 { "(?, ?)" } else { ", (?, ?)" });
            bindings.push(at_ms.into());
            bindings.push(entry.to_value().to_string().into());
        }
        query.push_str(" RETURNING seq");
        let seqs: Vec<SeqRow> = self.meter.rows(&sql, &query, bindings)?;
        if seqs.iter().any(|r| (r.seq as i64) % TRIM_EVERY == 0) {
            self.meter.exec(
                &sql,
                "DELETE FROM history WHERE seq <= (SELECT MAX(seq) FROM history) - ?",
                vec![HISTORY_LIMIT.into()],
            )?;
        }
        Ok(())
    }

    /// The history, oldest first, each entry with its time as `at`.
    pub fn history(&self) -> Result<Vec<Value>> {
        #[derive(Deserialize)]
        struct Row {
            at_ms: f64,
            entry: String,
        }
        let rows: Vec<Row> = match self.meter.rows(
            &self.sql(),
            "SELECT at_ms, entry FROM history ORDER BY seq",
            None,
        ) {
            Ok(rows) => rows,
            Err(e) if no_table(&e) => Vec::new(),
            Err(e) => return Err(e),
        };
        Ok(rows
            .into_iter()
            .map(|r| {
                let mut entry: Value = serde_json::from_str(&r.entry).unwrap_or(Value::Null);
                if let Value::Object(map) = &mut entry {
                    map.insert(
                        "at".into(),
                        json!(crate::timestamp::format_rfc3339(r.at_ms as i64)),
                    );
                }
                entry
            })
            .collect())
    }
}
