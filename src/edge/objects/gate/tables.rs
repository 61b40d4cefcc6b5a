//! The gate's SQLite tables and the statements on them.
//!
//! Table: `record(id = 1, body, history)`: the record as JSON (see
//! [`crate::operation::Operation`]) and its newest history rows as one JSON array
//! ([`HistoryLog`]), so the write a step makes anyway carries its history rows and a row of
//! history costs no billed write of its own. An object written by an earlier version has
//! `operation(id = 1, body)` and `history(seq, at_ms, entry)` instead ([`Layout::Legacy`]):
//! it is read as it is and moved to `record` by its next write, its old tables dropped in the
//! same write. `quarantine(seq, at_ms, error, body)` keeps the raw text of records that did
//! not load, until retention ends.
//!
//! Guarantees: which tables exist is read from `sqlite_master` (no failing query on a new
//! object); a table is created by the write that needs it, never by a read.

use serde::Deserialize;
use worker::{Result, SqlStorage};

#[cfg(doc)]
use crate::operation::history::HistoryLog;

use crate::edge::objects::usage_meter::Meter;

/// The table, created by the first write.
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS record (id INTEGER PRIMARY KEY CHECK (id = 1), body TEXT NOT NULL, history TEXT NOT NULL)";

/// Raw records that did not load, kept for inspection until retention ends (created only
/// when one is needed).
const QUARANTINE_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS quarantine (seq INTEGER PRIMARY KEY, at_ms INTEGER NOT NULL, error TEXT NOT NULL, body TEXT NOT NULL)";

/// What a step stores beside the record, in the record's write (`GateStorage::commit`):
/// nothing, or a batch's results' progress (`results_store.rs`).
pub(super) trait Beside {
    fn store(self, meter: &Meter, sql: SqlStorage) -> Result<()>;
}

impl Beside for () {
    fn store(self, _: &Meter, _: SqlStorage) -> Result<()> {
        Ok(())
    }
}

/// Which tables hold this object's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layout {
    /// Not read yet.
    Unknown,
    /// Nothing stored.
    Empty,
    /// `operation` and `history`, as an earlier version wrote them.
    Legacy,
    /// `record`.
    Current,
}

/// A record's history as stored: the `record` row's one JSON array ([`HistoryLog`]'s
/// encoding), or an earlier version's rows, oldest first.
pub(super) enum StoredHistory {
    Encoded(String),
    Rows(Vec<(i64, String)>),
}

/// Which tables hold the record, from `sqlite_master` (a read that cannot fail on a new
/// object, unlike a query on a table not created yet).
pub(super) fn layout(meter: &Meter, sql: &SqlStorage) -> Result<Layout> {
    #[derive(Deserialize)]
    struct Name {
        name: String,
    }
    let query =
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ('record', 'operation')";
    let names: Vec<Name> = meter.rows(sql, query, None)?;
    Ok(if names.iter().any(|n| n.name == "record") {
        Layout::Current
    } else if names.iter().any(|n| n.name == "operation") {
        Layout::Legacy
    } else {
        Layout::Empty
    })
}

/// The stored record's text, with its history as stored; none when the gate never wrote one.
pub(super) fn stored_row(
    layout: Layout,
    meter: &Meter,
    sql: &SqlStorage,
) -> Result<Option<(String, StoredHistory)>> {
    #[derive(Deserialize)]
    struct Row {
        body: String,
        /// `record`'s (NOT NULL); an earlier version's `operation` has none.
        history: Option<String>,
    }
    let query = match layout {
        Layout::Empty | Layout::Unknown => return Ok(None),
        Layout::Current => "SELECT body, history FROM record WHERE id = 1",
        Layout::Legacy => "SELECT body FROM operation WHERE id = 1",
    };
    let rows: Vec<Row> = meter.rows(sql, query, None)?;
    let Some(row) = rows.into_iter().next() else {
        return Ok(None);
    };
    let history = match row.history {
        Some(text) => StoredHistory::Encoded(text),
        None => StoredHistory::Rows(legacy_history(meter, sql)?),
    };
    Ok(Some((row.body, history)))
}

/// The rows of an earlier version's `history` table, oldest first.
fn legacy_history(meter: &Meter, sql: &SqlStorage) -> Result<Vec<(i64, String)>> {
    #[derive(Deserialize)]
    struct Row {
        at_ms: f64,
        entry: String,
    }
    let rows: Vec<Row> =
        match meter.rows(sql, "SELECT at_ms, entry FROM history ORDER BY seq", None) {
            Ok(rows) => rows,
            Err(e) if e.to_string().contains("no such table") => Vec::new(),
            Err(e) => return Err(e),
        };
    Ok(rows
        .into_iter()
        .map(|r| (r.at_ms as i64, r.entry))
        .collect())
}

/// Creates the `record` table (before the first write in it).
pub(super) fn create(meter: &Meter, sql: &SqlStorage) -> Result<()> {
    meter.exec(sql, SCHEMA, None).map(|_| ())
}

/// Writes the record and its history in one statement; an earlier version's tables are
/// dropped once it is written (`layout` is what was there before).
pub(super) fn write(
    meter: &Meter,
    sql: &SqlStorage,
    layout: Layout,
    body: String,
    history: String,
) -> Result<()> {
    let query = "INSERT INTO record (id, body, history) VALUES (1, ?, ?) ON CONFLICT(id) DO UPDATE SET body = excluded.body, history = excluded.history";
    meter.exec(sql, query, vec![body.into(), history.into()])?;
    if layout == Layout::Legacy {
        let query = "DROP TABLE IF EXISTS operation; DROP TABLE IF EXISTS history";
        meter.exec(sql, query, None)?;
    }
    Ok(())
}

/// Keeps a raw record that did not load, for inspection until retention ends.
pub(super) fn quarantine(
    meter: &Meter,
    sql: &SqlStorage,
    raw: &str,
    error: &str,
    now: i64,
) -> Result<()> {
    meter.exec(sql, QUARANTINE_SCHEMA, None)?;
    let query = "INSERT INTO quarantine (at_ms, error, body) VALUES (?, ?, ?)";
    meter.exec(sql, query, vec![now.into(), error.into(), raw.into()])?;
    Ok(())
}
