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

/// History rows kept per operation; older rows are deleted.
const HISTORY_LIMIT: i64 = 200;
/// History is trimmed on the first insert of each object instance and every this many
/// inserts after, not on every insert (a DELETE per duplicate delivery measurably cost), so
/// at most `HISTORY_LIMIT + TRIM_EVERY - 1` rows exist.
const TRIM_EVERY: u32 = 50;

/// The record as this instance knows it: every write goes through [`OperationGate::save`],
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
    /// History rows inserted by this instance, for trimming every [`TRIM_EVERY`].
    inserts: Cell<u32>,
    cached: RefCell<Cached>,
}

impl GateStorage {
    /// Opens the tables, creating them if needed.
    pub fn open(state: State) -> GateStorage {
        let sql = state.storage().sql();
        for ddl in [
            "CREATE TABLE IF NOT EXISTS operation (id INTEGER PRIMARY KEY CHECK (id = 1), body TEXT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS history (seq INTEGER PRIMARY KEY AUTOINCREMENT, at_ms INTEGER NOT NULL, entry TEXT NOT NULL)",
        ] {
            if let Err(e) = sql.exec(ddl, None) {
                log(LogEvent::GateSchemaError.line(json!({"error": e.to_string()})));
            }
        }
        GateStorage {
            state,
            alarm_at: Cell::new(None),
            inserts: Cell::new(0),
            cached: RefCell::new(Cached::Unread),
        }
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
        self.state
            .storage()
            .sql()
            .exec("DELETE FROM history", None)?;
        self.inserts.set(0);
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
        let rows: Vec<BodyRow> = self
            .state
            .storage()
            .sql()
            .exec("SELECT body FROM operation WHERE id = 1", None)?
            .to_array()?;
        let op: Option<Operation> =
            match rows.first() {
                None => None,
                Some(row) => Some(serde_json::from_str(&row.body).map_err(|e| {
                    worker::Error::RustError(format!("stored record unreadable: {e}"))
                })?),
            };
        self.cached.replace(Cached::of(op.clone()));
        Ok(op)
    }

    /// Stores the record.
    pub fn save(&self, op: &Operation) -> Result<()> {
        let body =
            serde_json::to_string(op).map_err(|e| worker::Error::RustError(e.to_string()))?;
        self.state.storage().sql().exec(
            "INSERT INTO operation (id, body) VALUES (1, ?) ON CONFLICT(id) DO UPDATE SET body = excluded.body",
            vec![body.into()],
        )?;
        self.cached.replace(Cached::Present(Box::new(op.clone())));
        Ok(())
    }

    /// Appends a history entry.
    pub fn record(&self, at_ms: i64, entry: Value) -> Result<()> {
        let sql = self.state.storage().sql();
        sql.exec(
            "INSERT INTO history (at_ms, entry) VALUES (?, ?)",
            vec![at_ms.into(), entry.to_string().into()],
        )?;
        let inserts = self.inserts.get();
        self.inserts.set(inserts.wrapping_add(1));
        if inserts.is_multiple_of(TRIM_EVERY) {
            sql.exec(
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
        let rows: Vec<Row> = self
            .state
            .storage()
            .sql()
            .exec("SELECT at_ms, entry FROM history ORDER BY seq", None)?
            .to_array()?;
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
