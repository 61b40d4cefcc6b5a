//! The OperationGate's storage: its record and history (in the tables of [`super::tables`]),
//! both cached in memory, and its one alarm.
//!
//! Guarantees: every write of the record goes through [`GateStorage::save`], so the cache
//! equals storage (except counts of settled duplicates, kept in memory by
//! [`GateStorage::keep_in_memory`] until the next write); history rows are stored with the
//! record in the same statement; the alarm is set only when its time changes (an unchanged
//! wake time costs no storage call). The table is created by the first write, never by a
//! read: an object that only answered (a nudge or delivery for an unregistered name with
//! `REQUIRE_REGISTRATION=true`, a command for an operation it does not know) stores nothing
//! at all. A record that does not load is kept and recovered on load
//! ([`crate::operation::recovery`]; an operator's repair is [`super::repair`]), so it never
//! bricks its operation; the alarm's failure streak is kept under `alarm_failures` in the
//! object's key-value storage. When retention ends, [`GateStorage::commit`] deletes all of
//! it and stores the tombstone alone again.
//!
//! [`GateStorage::commit`] stores what a step decided ([`crate::operation::gate::Step`]): its
//! record and history rows, with a batch's results' progress when it carries one (also when the
//! record is unchanged), in one write; its log lines; and the alarm for the record it leaves;
//! a step that changed nothing (no record, row nor progress) costs no storage call (not even
//! for the alarm, unless it asks to repair one). Nothing here decides: the step did.

use std::cell::{Cell, RefCell};

use serde_json::Value;
use worker::{Result, State};

use crate::operation::gate::alarm_failure::AlarmFailures;
use crate::operation::gate::log::GateLog;
use crate::operation::gate::{GateLimits, Save, Step};
use crate::operation::history::{HistoryEntry, HistoryLog};
use crate::operation::{recovery, Operation};

use crate::edge::objects::gate::tables::{self, Beside, Layout, StoredHistory};
use crate::edge::objects::usage_meter::Meter;
use crate::edge::runtime::{log, now_ms, set_alarm};

/// The key, in the object's key-value storage, of the alarm's failure streak (see
/// [`crate::operation::gate::alarm_failure`]).
const ALARM_FAILURES: &str = "alarm_failures";

/// Whether a committed step sets the alarm for the record it leaves.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Alarm {
    Sync,
    /// Inside the alarm, between its I/O steps: its last step (the upkeep) sets the alarm
    /// last, for the record as it then stands, so the steps before it need not. If the
    /// run dies in between, the alarm already set (a claim's expiry, or this one, retried by
    /// the runtime when the handler throws) wakes the object again.
    Deferred,
}

/// The record as this instance knows it: every write goes through [`GateStorage::save`],
/// so it equals storage, except for counts of settled duplicates not stored yet.
pub(super) enum Cached {
    Unread,
    Absent,
    Present(Box<Operation>),
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
    history: RefCell<HistoryLog>,
    layout: Cell<Layout>,
    /// A record was recovered by this instance and its alarm not yet set for it.
    recovered: Cell<bool>,
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

    /// Which tables hold the record, read once per instance.
    fn layout(&self) -> Result<Layout> {
        if self.layout.get() == Layout::Unknown {
            self.layout.set(tables::layout(&self.meter, &self.sql())?);
        }
        Ok(self.layout.get())
    }

    /// The stored record's text, none when the gate never wrote one; its history is read
    /// into memory with it.
    pub(super) fn stored_body(&self) -> Result<Option<String>> {
        let Some((body, history)) = tables::stored_row(self.layout()?, &self.meter, &self.sql())?
        else {
            return Ok(None);
        };
        self.history.replace(match history {
            StoredHistory::Encoded(text) => HistoryLog::decode(&text),
            StoredHistory::Rows(rows) => HistoryLog::from_rows(rows),
        });
        Ok(Some(body))
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
    async fn purge(&self) -> Result<()> {
        self.state.storage().delete_all().await?;
        self.alarm_at.set(None);
        self.layout.set(Layout::Empty);
        self.recovered.set(false);
        self.cached.replace(Cached::Absent);
        self.history.replace(HistoryLog::default());
        Ok(())
    }

    /// Sets the alarm for what `op` has pending next (or deletes it when nothing is).
    pub async fn sync_alarm(&self, op: &Operation, limits: &GateLimits) -> Result<()> {
        let storage = self.state.storage();
        let wake = op.wake_at_ms(limits.retention_ms, limits.stats_delay_ms);
        if wake.is_some() && wake == self.alarm_at.get() {
            return Ok(());
        }
        // Forgotten first: if the call fails, the next one sets the alarm again.
        self.alarm_at.set(None);
        match wake {
            Some(at) => set_alarm(&storage, at).await?,
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
        let Some(body) = self.stored_body()? else {
            self.cached.replace(Cached::Absent);
            return Ok(None);
        };
        let parsed = serde_json::from_str::<Operation>(&body);
        let op = parsed
            .or_else(|e| self.recover(&body, &e.to_string()))?
            .as_loaded();
        self.cached.replace(Cached::Present(Box::new(op.clone())));
        Ok(Some(op))
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
        set_alarm(&self.state.storage(), retry_at).await?;
        self.alarm_at.set(Some(retry_at));
        stored
    }

    /// A run succeeded after failures: the streak is over.
    pub async fn alarm_recovered(&self) -> Result<()> {
        self.state.storage().delete(ALARM_FAILURES).await?;
        Ok(())
    }

    /// Stores the record with its history (one statement; an object an earlier version
    /// wrote is moved to `record` by this write, its old tables dropped with it).
    pub fn save(&self, op: &Operation) -> Result<()> {
        let body =
            serde_json::to_string(op).map_err(|e| worker::Error::RustError(e.to_string()))?;
        let sql = self.sql();
        let layout = self.layout()?;
        if layout != Layout::Current {
            if let Err(e) = tables::create(&self.meter, &sql) {
                log(GateLog::GateSchemaError {
                    error: e.to_string(),
                }
                .to_value());
                return Err(e);
            }
        }
        let history = self.history.borrow().encode();
        tables::write(&self.meter, &sql, layout, body, history)?;
        self.layout.set(Layout::Current);
        self.cached.replace(Cached::Present(Box::new(op.clone())));
        Ok(())
    }

    /// The history, oldest first, each entry with its time as `at`.
    pub fn history(&self) -> Result<Vec<Value>> {
        self.load()?;
        Ok(self.history.borrow().view())
    }

    /// A stored record that did not load: kept as it was in the `quarantine` table, then
    /// read as [`recovery::recover`] can and stored again, with its `record_unreadable` alert
    /// queued and a history row. The alarm must be set again for the alert
    /// ([`GateStorage::take_recovered`]). A record that cannot be recovered stays where it is
    /// and every call on it fails until an operator repairs it ([`super::repair`]).
    fn recover(&self, raw: &str, error: &str) -> Result<Operation> {
        let Some((mut op, how)) = recovery::recover(raw) else {
            log(recovery::unrecoverable(error, raw).to_value());
            return Err(worker::Error::RustError(format!(
                "stored record unreadable: {error}"
            )));
        };
        let now = now_ms();
        tables::quarantine(&self.meter, &self.sql(), raw, error, now)?;
        let (row, line) = recovery::mark_recovered(&mut op, how, error, raw, now, None);
        self.store_recovered(&op, row, line, now)?;
        Ok(op)
    }

    /// Stores a record recovered or rebuilt at `now`, with its history row, and logs it; its
    /// alert waits for the alarm ([`GateStorage::take_recovered`]).
    pub(super) fn store_recovered(
        &self,
        op: &Operation,
        row: HistoryEntry,
        line: GateLog,
        now: i64,
    ) -> Result<()> {
        self.history.borrow_mut().append(now, vec![row]);
        self.save(op)?;
        log(line.to_value());
        self.recovered.set(true);
        Ok(())
    }

    /// True once after a record was recovered: its alert needs the alarm set.
    pub fn take_recovered(&self) -> bool {
        self.recovered.replace(false)
    }

    /// Stores what a step decided (its record, history rows, results' progress, logs), sets the
    /// alarm for the record as it now stands (unless `alarm` defers it), and returns the record
    /// and the answer.
    pub(super) async fn commit<R, P: Beside>(
        &self,
        step: Step<R, P>,
        limits: &GateLimits,
        alarm: Alarm,
    ) -> Result<(Option<Operation>, R)> {
        if step.purge {
            self.purge().await?;
            // The tombstone alone, with no history row nor results' progress; it never wakes
            // (`deleteAll` deleted the alarm), so no alarm call follows.
            if let Some(tombstone) = &step.record {
                self.save(tombstone)?;
            }
            step.logs.iter().for_each(|line| log(line.to_value()));
            return Ok((step.record, step.reply));
        }
        // The results' progress, whatever the record's save: no await until the record's.
        // First, so that a progress that cannot be stored leaves no history row in memory.
        if let Some(results) = step.results {
            results.store(&self.meter, self.sql())?;
        }
        // History rows ride in the record's own write; a step that has rows but no write of
        // its own stores the record as it stands with them.
        let rows = self.history.borrow_mut().append(now_ms(), step.history);
        match (&step.record, step.save) {
            (Some(op), Save::Durable) => self.save(op)?,
            (Some(op), Save::MemoryOnly | Save::Unchanged) if rows => self.save(op)?,
            (Some(op), Save::MemoryOnly) => self.keep_in_memory(op),
            _ => {}
        }
        step.logs.iter().for_each(|line| log(line.to_value()));
        if step.reset_alarm {
            self.forget_alarm();
        }
        // A step that changed nothing needs no alarm call, unless asked to repair one.
        let changed = step.save != Save::Unchanged || step.reset_alarm;
        if let (Some(op), true, Alarm::Sync) = (&step.record, changed, alarm) {
            self.sync_alarm(op, limits).await?;
        }
        Ok((step.record, step.reply))
    }
}
