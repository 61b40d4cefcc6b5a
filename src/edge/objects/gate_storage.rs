//! The OperationGate's storage: its record and history in SQLite, the record cached in
//! memory, and its one alarm.
//!
//! Tables: `operation(id = 1, body)` holds the record as JSON (see
//! [`crate::operation::Operation`]; after retention, a tombstone); `history(seq, at_ms,
//! entry)` keeps the newest [`HISTORY_LIMIT`] entries (trimmed in steps of [`TRIM_EVERY`]).
//! Guarantees: every write of the record goes through [`GateStorage::save`], so the cache
//! equals storage (except counts of settled duplicates, kept in memory by
//! [`GateStorage::keep_in_memory`] until the next write); the alarm is set only when its time
//! changes (an unchanged wake time costs no storage call).

use std::cell::{Cell, RefCell};

use serde::Deserialize;
use serde_json::{json, Value};
use worker::wasm_bindgen::JsValue;
use worker::{Result, ScheduledTime, State};

use crate::gate::Limits;
use crate::log_event::LogEvent;
use crate::operation::Operation;

use super::log;
use super::usage_meter::Meter;

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

/// The record as this instance knows it: every write goes through [`GateStorage::save`],
/// so it equals storage, except for counts of settled duplicates not stored yet.
enum Cached {
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
struct BodyRow {
    body: String,
}

/// One gate's tables, cache and alarm.
pub struct GateStorage {
    state: State,
    /// The alarm time this instance last set; `None` when unknown (a new instance, or inside
    /// the alarm, which consumes it).
    alarm_at: Cell<Option<i64>>,
    meter: Meter,
    cached: RefCell<Cached>,
}

impl GateStorage {
    /// Opens the tables, creating them if needed (one statement: a woken object runs it
    /// every time, so it is one call, not one per table). `meter` counts it when `USAGE_LOG`
    /// is on.
    pub fn open(state: State, counting: bool) -> GateStorage {
        let meter = Meter::default();
        meter.begin(counting);
        if let Err(e) = meter.exec(&state.storage().sql(), SCHEMA, None) {
            log(LogEvent::GateSchemaError.line(json!({"error": e.to_string()})));
        }
        GateStorage {
            state,
            meter,
            alarm_at: Cell::new(None),
            cached: RefCell::new(Cached::Unread),
        }
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

    /// Deletes the history (retention ended).
    pub fn clear_history(&self) -> Result<()> {
        self.meter.exec(&self.sql(), "DELETE FROM history", None)?;
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

    /// The record (read once, then from memory).
    pub fn load(&self) -> Result<Option<Operation>> {
        match &*self.cached.borrow() {
            Cached::Absent => return Ok(None),
            Cached::Present(op) => return Ok(Some((**op).clone())),
            Cached::Unread => {}
        }
        let rows: Vec<BodyRow> =
            self.meter
                .rows(&self.sql(), "SELECT body FROM operation WHERE id = 1", None)?;
        let op: Option<Operation> = match rows.first() {
            None => None,
            Some(row) => Some(
                serde_json::from_str::<Operation>(&row.body)
                    .map_err(|e| {
                        worker::Error::RustError(format!("stored record unreadable: {e}"))
                    })?
                    .as_loaded(),
            ),
        };
        self.cached.replace(Cached::of(op.clone()));
        Ok(op)
    }

    /// Stores the record.
    pub fn save(&self, op: &Operation) -> Result<()> {
        let body =
            serde_json::to_string(op).map_err(|e| worker::Error::RustError(e.to_string()))?;
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
    pub fn record(&self, at_ms: i64, entries: Vec<Value>) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
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
            bindings.push(entry.to_string().into());
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
        let rows: Vec<Row> = self.meter.rows(
            &self.sql(),
            "SELECT at_ms, entry FROM history ORDER BY seq",
            None,
        )?;
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
