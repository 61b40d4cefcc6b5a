//! The OperationGate's storage, when its record does not load: the raw text kept in
//! `quarantine(seq, at_ms, error, body)` until retention ends, the record recovered
//! ([`crate::operation::recovery`]) and stored again with its alert queued, or rebuilt by an
//! operator's repair.
//!
//! Guarantees: a record that does not load never bricks its operation and is never lost:
//! its raw text stays for inspection; a record that cannot be recovered stays where it is and
//! every call on it fails until an operator repairs it.

use worker::Result;

use crate::operation::{recovery, Actor, Operation};

use crate::edge::log;
use crate::edge::objects::gate_storage::{Cached, GateStorage};

/// Raw records that did not load, kept for inspection until retention ends (created only
/// when one is needed).
const QUARANTINE_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS quarantine (seq INTEGER PRIMARY KEY, at_ms INTEGER NOT NULL, error TEXT NOT NULL, body TEXT NOT NULL)";

impl GateStorage {
    /// A stored record that did not load: kept as it was in the `quarantine` table, then
    /// read as [`recovery::recover`] can and stored again, with its `record_unreadable` alert
    /// queued and a history row. The alarm must be set again for the alert
    /// ([`GateStorage::take_recovered`]). A record that cannot be recovered stays where it is
    /// and every call on it fails until an operator repairs it ([`GateStorage::repair`]).
    pub(super) fn recover(&self, raw: &str, error: &str) -> Result<Operation> {
        let Some((mut op, how)) = recovery::recover(raw) else {
            log(recovery::unrecoverable(error, raw).to_value());
            return Err(worker::Error::RustError(format!(
                "stored record unreadable: {error}"
            )));
        };
        let now = worker::Date::now().as_millis() as i64;
        self.quarantine(raw, error, now)?;
        let (row, line) = recovery::mark_recovered(&mut op, how, error, raw, now, None);
        self.record(now, vec![row]);
        self.save(&op)?;
        log(line.to_value());
        self.recovered.set(true);
        Ok(op)
    }

    /// An operator's repair: `None` when there is no record; `Some(false)` when it loads as
    /// it is (nothing done); `Some(true)` when it did not: recovered as [`GateStorage::load`]
    /// would, or, when not even its key and state can be read, kept in `quarantine` and
    /// replaced by [`recovery::rebuild`] of `key` and `name`, with its alert queued and `by`
    /// (the operator) in its history row.
    pub fn repair(
        &self,
        key: &str,
        name: &str,
        reason: &str,
        by: Option<&Actor>,
    ) -> Result<Option<bool>> {
        let rows = self.stored_body()?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        self.history.replace(row.history.clone());
        let Err(error) = serde_json::from_str::<Operation>(&row.body) else {
            return Ok(Some(false));
        };
        self.cached.replace(Cached::Unread);
        if recovery::recover(&row.body).is_some() {
            self.load()?;
            return Ok(Some(true));
        }
        let now = worker::Date::now().as_millis() as i64;
        let error = error.to_string();
        self.quarantine(&row.body, &error, now)?;
        let mut op = recovery::rebuild(key, name, reason, now);
        let (entry, line) = recovery::mark_recovered(
            &mut op,
            recovery::Recovery::Rebuilt,
            &error,
            &row.body,
            now,
            by.cloned(),
        );
        self.record(now, vec![entry]);
        self.save(&op)?;
        log(line.to_value());
        self.recovered.set(true);
        Ok(Some(true))
    }

    /// Keeps a raw record that did not load, for inspection until retention ends.
    fn quarantine(&self, raw: &str, error: &str, now: i64) -> Result<()> {
        let sql = self.sql();
        self.meter().exec(&sql, QUARANTINE_SCHEMA, None)?;
        self.meter().exec(
            &sql,
            "INSERT INTO quarantine (at_ms, error, body) VALUES (?, ?, ?)",
            vec![now.into(), error.into(), raw.into()],
        )?;
        Ok(())
    }

    /// True once after a record was recovered: its alert needs the alarm set.
    pub fn take_recovered(&self) -> bool {
        self.recovered.replace(false)
    }
}
