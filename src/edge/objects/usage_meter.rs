//! Counts what one Durable Object uses (see [`crate::telemetry::usage`]): its SQL statements and the rows
//! their cursors report, its alarm writes, KV writes, object calls and outbound fetches.
//!
//! Guarantees: with `USAGE_LOG` off nothing is counted (the one cost is a flag check per
//! statement); on, each invocation logs one `usage` line with the counts since the previous
//! line of this object, so a run's lines sum to exactly what it used.

use std::cell::{Cell, RefCell};

use serde::de::DeserializeOwned;
use worker::{Result, SqlCursor, SqlStorage, SqlStorageValue};

use crate::telemetry::usage::{Invocation, Usage};

use crate::edge::runtime::{log, now_ms};

/// One object's counter.
#[derive(Default)]
pub struct Meter {
    on: Cell<bool>,
    usage: RefCell<Usage>,
}

impl Meter {
    /// Starts an invocation: counting is on when configured; returns its start time.
    pub fn begin(&self, on: bool) -> i64 {
        self.on.set(on);
        now_ms()
    }

    /// Runs a statement that returns no rows the caller reads, counting it.
    pub fn exec(
        &self,
        sql: &SqlStorage,
        query: &str,
        bindings: impl Into<Option<Vec<SqlStorageValue>>>,
    ) -> Result<SqlCursor> {
        let cursor = sql.exec(query, bindings)?;
        self.count(&cursor);
        Ok(cursor)
    }

    /// Runs a query and reads every row, counting it once read.
    pub fn rows<T: DeserializeOwned>(
        &self,
        sql: &SqlStorage,
        query: &str,
        bindings: impl Into<Option<Vec<SqlStorageValue>>>,
    ) -> Result<Vec<T>> {
        let cursor = sql.exec(query, bindings)?;
        let rows = cursor.to_array()?;
        self.count(&cursor);
        Ok(rows)
    }

    /// Runs a query and reads every row as its columns' values (blobs as bytes), counting it.
    pub fn values(
        &self,
        sql: &SqlStorage,
        query: &str,
        bindings: impl Into<Option<Vec<SqlStorageValue>>>,
    ) -> Result<Vec<Vec<SqlStorageValue>>> {
        let cursor = sql.exec(query, bindings)?;
        let rows = cursor.raw().collect::<Result<Vec<_>>>()?;
        self.count(&cursor);
        Ok(rows)
    }

    fn count(&self, cursor: &SqlCursor) {
        self.add(|u| u.statement(cursor.rows_read() as u64, cursor.rows_written() as u64));
    }

    /// Counts something other than a statement.
    pub fn add(&self, f: impl FnOnce(&mut Usage)) {
        if self.on.get() {
            f(&mut self.usage.borrow_mut());
        }
    }

    /// Ends an invocation that began at `started_ms`: logs its line if counting is on.
    pub fn end(&self, object: &str, invocation: Invocation, started_ms: i64, sql: &SqlStorage) {
        if !self.on.get() {
            return;
        }
        let usage = self.usage.take();
        let wall_ms = now_ms() - started_ms;
        log(usage.line(object, invocation, wall_ms, sql.database_size() as u64));
    }
}
