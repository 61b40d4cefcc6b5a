//! The OperationGate's storage: its record and history in SQLite, both cached in memory, and
//! its one alarm.
//!
//! Table: `record(id = 1, body, history)`: the record as JSON (see
//! [`crate::operation::Operation`]) and its newest history rows as one JSON array
//! ([`HistoryLog`]), so the write a step makes anyway carries its history rows and a row of
//! history costs no billed write of its own. An object written by an earlier version has
//! `operation(id = 1, body)` and `history(seq, at_ms, entry)` instead: it is read as it is and
//! moved to `record` by its next write (its old tables dropped in the same write).
//! Guarantees: every write of the record goes through [`GateStorage::save`], so the cache
//! equals storage (except counts of settled duplicates, kept in memory by
//! [`GateStorage::keep_in_memory`] until the next write); history rows are stored with the
//! record in the same statement; the alarm is set only when its time changes (an unchanged
//! wake time costs no storage call). The table is created by the first write, never by a
//! read, and which tables exist is read from `sqlite_master` (no failing query on a new
//! object): an object that only answered (a nudge or delivery for an unregistered name with
//! `REQUIRE_REGISTRATION=true`, a command for an operation it does not know) stores nothing
//! at all. A record that does not load is kept and recovered
//! ([`crate::edge::objects::gate_repair`]), so it never bricks its operation; the alarm's
//! failure streak is kept under `alarm_failures` in the object's key-value storage. When
//! retention ends, [`GateStorage::purge`] deletes all of it.

use std::cell::{Cell, RefCell};

use serde::Deserialize;
use serde_json::Value;
use worker::wasm_bindgen::JsValue;
use worker::{Result, ScheduledTime, State};

use crate::operation::alarm_failure::AlarmFailures;
use crate::operation::gate::Limits;
use crate::operation::gate_log::GateLog;
use crate::operation::history::{HistoryEntry, HistoryLog};
use crate::operation::Operation;

use crate::edge::log;
use crate::edge::objects::usage_meter::Meter;

/// The table, created by the first write.
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS record (id INTEGER PRIMARY KEY CHECK (id = 1), body TEXT NOT NULL, history TEXT NOT NULL)";

/// Which tables hold this object's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Not read yet.
    Unknown,
    /// Nothing stored.
    Empty,
    /// `operation` and `history`, as an earlier version wrote them.
    Legacy,
    /// `record`.
    Current,
}

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

/// A stored record's text and its history.
pub(super) struct BodyRow {
    pub(super) body: String,
    pub(super) history: HistoryLog,
}

/// One gate's tables, cache and alarm.
pub struct GateStorage {
    state: State,
    /// The alarm time this instance last set; `None` when unknown (a new instance, or inside
    /// the alarm, which consumes it).
    alarm_at: Cell<Option<i64>>,
    meter: Meter,
    pub(super) cached: RefCell<Cached>,
    /// The history as stored (with the rows appended since), once the record was read.
    pub(super) history: RefCell<HistoryLog>,
    layout: Cell<Layout>,
    /// A record was recovered by this instance and its alarm not yet set for it.
    pub(super) recovered: Cell<bool>,
}

impl GateStorage {
    /// Opens the storage without touching it: the table is created by the first write
    /// ([`GateStorage::save`]).
    pub fn open(state: State) -> GateStorage {
        GateStorage {
            state,
            meter: Meter::default(),
            alarm_at: Cell::new(None),
            cached: RefCell::new(Cached::Unread),
            history: RefCell::new(HistoryLog::default()),
            layout: Cell::new(Layout::Unknown),
            recovered: Cell::new(false),
        }
    }

    /// Which tables hold the record, read once per instance from `sqlite_master` (a read
    /// that cannot fail on a new object, unlike a query on a table not created yet).
    fn layout(&self) -> Result<Layout> {
        if self.layout.get() != Layout::Unknown {
            return Ok(self.layout.get());
        }
        #[derive(Deserialize)]
        struct Name {
            name: String,
        }
        let names: Vec<Name> = self.meter.rows(
            &self.sql(),
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ('record', 'operation')",
            None,
        )?;
        let layout = if names.iter().any(|n| n.name == "record") {
            Layout::Current
        } else if names.iter().any(|n| n.name == "operation") {
            Layout::Legacy
        } else {
            Layout::Empty
        };
        self.layout.set(layout);
        Ok(layout)
    }

    /// The object's state (for work it runs in the background).
    pub fn state(&self) -> &State {
        &self.state
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
        self.layout.set(Layout::Empty);
        self.recovered.set(false);
        self.cached.replace(Cached::Absent);
        self.history.replace(HistoryLog::default());
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

    /// The stored record's row, as text, with its history; none when the gate never wrote
    /// one.
    pub(super) fn stored_body(&self) -> Result<Vec<BodyRow>> {
        match self.layout()? {
            Layout::Empty | Layout::Unknown => Ok(Vec::new()),
            Layout::Current => {
                #[derive(Deserialize)]
                struct Row {
                    body: String,
                    history: String,
                }
                let rows: Vec<Row> = self.meter.rows(
                    &self.sql(),
                    "SELECT body, history FROM record WHERE id = 1",
                    None,
                )?;
                Ok(rows
                    .into_iter()
                    .map(|r| BodyRow {
                        body: r.body,
                        history: HistoryLog::decode(&r.history),
                    })
                    .collect())
            }
            Layout::Legacy => {
                #[derive(Deserialize)]
                struct Row {
                    body: String,
                }
                let rows: Vec<Row> = self.meter.rows(
                    &self.sql(),
                    "SELECT body FROM operation WHERE id = 1",
                    None,
                )?;
                if rows.is_empty() {
                    return Ok(Vec::new());
                }
                let history = HistoryLog::from_rows(self.legacy_history()?);
                Ok(rows
                    .into_iter()
                    .map(|r| BodyRow {
                        body: r.body,
                        history: history.clone(),
                    })
                    .collect())
            }
        }
    }

    /// The rows of an earlier version's `history` table, oldest first.
    fn legacy_history(&self) -> Result<Vec<(i64, String)>> {
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
            Err(e) if e.to_string().contains("no such table") => Vec::new(),
            Err(e) => return Err(e),
        };
        Ok(rows
            .into_iter()
            .map(|r| (r.at_ms as i64, r.entry))
            .collect())
    }

    /// The record (read once, then from memory).
    pub fn load(&self) -> Result<Option<Operation>> {
        match &*self.cached.borrow() {
            Cached::Absent => return Ok(None),
            Cached::Present(op) => return Ok(Some((**op).clone())),
            Cached::Unread => {}
        }
        let rows = self.stored_body()?;
        if let Some(row) = rows.first() {
            self.history.replace(row.history.clone());
        }
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

    /// Stores the record with its history (one statement; an object an earlier version
    /// wrote is moved to `record` by this write, its old tables dropped with it).
    pub fn save(&self, op: &Operation) -> Result<()> {
        let body =
            serde_json::to_string(op).map_err(|e| worker::Error::RustError(e.to_string()))?;
        let sql = self.sql();
        let layout = self.layout()?;
        if layout != Layout::Current {
            if let Err(e) = self.meter.exec(&sql, SCHEMA, None) {
                log(GateLog::GateSchemaError {
                    error: e.to_string(),
                }
                .to_value());
                return Err(e);
            }
        }
        self.meter.exec(
            &sql,
            "INSERT INTO record (id, body, history) VALUES (1, ?, ?) ON CONFLICT(id) DO UPDATE SET body = excluded.body, history = excluded.history",
            vec![body.into(), self.history.borrow().encode().into()],
        )?;
        if layout == Layout::Legacy {
            self.meter.exec(
                &sql,
                "DROP TABLE IF EXISTS operation; DROP TABLE IF EXISTS history",
                None,
            )?;
        }
        self.layout.set(Layout::Current);
        self.cached.replace(Cached::Present(Box::new(op.clone())));
        Ok(())
    }

    /// Adds history rows to the record's history, to be stored by the next
    /// [`GateStorage::save`]; true when there were any.
    pub fn record(&self, at_ms: i64, entries: Vec<HistoryEntry>) -> bool {
        self.history.borrow_mut().append(at_ms, entries)
    }

    /// The history, oldest first, each entry with its time as `at`.
    pub fn history(&self) -> Result<Vec<Value>> {
        self.load()?;
        Ok(self.history.borrow().view())
    }
}
