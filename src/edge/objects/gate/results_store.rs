//! The gate's tables of a batch's results (beside `tables.rs`'s record), created by the first
//! write of a `"results": "each"` batch:
//! - `results_progress(id = 1, body)`: the [`Progress`] as JSON, without its rows;
//! - `results_failures(idx, parked, row, item)`: each result not delivered, its [`Row`] and its
//!   result (`item` last, so reading the rows never reads a result); the waiting ones are
//!   loaded with the progress through the partial index `results_waiting`, never the parked;
//! - an inline batch's results, stored as its status answer streams in:
//!   `results_inline_items(seq, key, hash, payload)` each item at its place in the answer, then
//!   `results_inline_order(idx, seq, suffix)` their stable order (the answer cannot be held to
//!   order it first), so a chunk is a range of rows; `results_inline(idx, item)` is the form an
//!   earlier build stored, still read.
//!
//! An earlier build's layout (the waiting rows in the progress, `results_kept(idx, item)`,
//! `results_parked(idx, row)`) is moved to `results_failures` by the loads after the deploy:
//! the waiting rows at the first, the parked ones [`MOVED_PER_LOAD`] a load by index, the old
//! tables dropped once empty.
//!
//! Guarantees: a progress and its transition's writes are stored only by the gate's commit
//! (`GateStorage::commit`, through [`Beside`]), with the record and no await between, so as
//! one write (the layout's move in a load is the one other writer); a row is written per change
//! of a result not delivered, never per delivered result. The tables go with the object's
//! storage when retention ends (`deleteAll`). The inline items and their order are a staging
//! written as the status answer streams in, outside the commit (`results/locate.rs`).

use serde::de::DeserializeOwned;
use serde::Deserialize;
use worker::{Result, SqlStorage};

use crate::results::inline::Entry;
use crate::results::item::{Payload, ResultItem};
use crate::results::keys::{inline_base, inline_order, Place};
use crate::results::progress::{Progress, ProgressWrite, Row, Write, MAX_WAITING};

use crate::edge::objects::gate::storage::GateStorage;
use crate::edge::objects::gate::tables::Beside;
use crate::edge::objects::usage_meter::Meter;

/// Parked rows of an earlier build's layout moved by a load: bounded, so no load's write grows
/// with the number parked, and no fewer than a listing's page or a retry's room, so the rows
/// those read next (in order of index) were moved before them.
const MOVED_PER_LOAD: usize = MAX_WAITING;

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS results_progress (id INTEGER PRIMARY KEY CHECK (id = 1), body TEXT NOT NULL); CREATE TABLE IF NOT EXISTS results_failures (idx INTEGER PRIMARY KEY, parked INTEGER NOT NULL, row TEXT NOT NULL, item TEXT NOT NULL); CREATE INDEX IF NOT EXISTS results_waiting ON results_failures (idx) WHERE parked = 0; CREATE TABLE IF NOT EXISTS results_inline (idx INTEGER PRIMARY KEY, item TEXT NOT NULL); CREATE TABLE IF NOT EXISTS results_inline_items (seq INTEGER PRIMARY KEY, key TEXT, hash TEXT NOT NULL, payload TEXT NOT NULL); CREATE TABLE IF NOT EXISTS results_inline_order (idx INTEGER PRIMARY KEY, seq INTEGER NOT NULL, suffix TEXT NOT NULL)";

/// One gate's results tables.
pub(super) struct ResultsStore<'a> {
    meter: &'a Meter,
    sql: SqlStorage,
}

#[derive(Deserialize)]
struct Text {
    body: String,
}

/// An inline item's base key, as stored.
#[derive(Deserialize)]
struct Base {
    key: Option<String>,
    hash: String,
}

/// An inline result as stored: its index, its key's parts, its payload.
#[derive(Deserialize)]
struct Inline {
    idx: i64,
    suffix: String,
    key: Option<String>,
    hash: String,
    payload: String,
}

impl Inline {
    fn item(self) -> Result<ResultItem> {
        let mut payload: Payload = serde_json::from_str(&self.payload).map_err(json_error)?;
        // Where an unreadable item is, by its index (known once the order is).
        if let Payload::Unreadable(serde_json::Value::Object(place)) = &mut payload {
            place.insert("index".into(), self.idx.into());
        }
        let base = inline_base(self.key.as_deref(), &self.hash);
        Ok(ResultItem {
            result_key: format!("{base}{}", self.suffix),
            index: self.idx as u64,
            payload,
        })
    }
}

fn json_error(e: serde_json::Error) -> worker::Error {
    worker::Error::RustError(e.to_string())
}

fn text<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(json_error)
}

type Bindings = Option<Vec<worker::SqlStorageValue>>;

/// A step's progress, stored by the gate's commit beside the record.
impl Beside for ProgressWrite {
    fn store(self, meter: &Meter, sql: SqlStorage) -> Result<()> {
        ResultsStore { meter, sql }.save(&self.progress, self.writes)
    }
}

impl<'a> ResultsStore<'a> {
    pub(super) fn new(storage: &'a GateStorage) -> ResultsStore<'a> {
        ResultsStore {
            meter: storage.meter(),
            sql: storage.sql(),
        }
    }

    /// The stored progress with its waiting rows, if the results have begun (read from
    /// `sqlite_master` first: a read that cannot fail on an object that has no tables). An
    /// earlier build's layout is moved to the failure rows first.
    pub(super) fn load(&self) -> Result<Option<Progress>> {
        let query = "SELECT name AS body FROM sqlite_master WHERE type = 'table' AND name IN ('results_progress', 'results_kept')";
        let tables: Vec<Text> = self.meter.rows(&self.sql, query, None)?;
        if !tables.iter().any(|t| t.body == "results_progress") {
            return Ok(None);
        }
        let query = "SELECT body FROM results_progress WHERE id = 1";
        let Some(mut progress) = self.parsed::<Progress>(query, None)?.pop() else {
            return Ok(None);
        };
        if tables.iter().any(|t| t.body == "results_kept") {
            self.move_earlier_layout(&progress)?;
        }
        let query = "SELECT row AS body FROM results_failures WHERE parked = 0";
        let rows = self.parsed::<Row>(query, None)?.into_iter();
        progress.rows = rows.map(|row| (row.index, row)).collect();
        Ok(Some(progress))
    }

    /// The `body` of each row `query` returns, read as JSON.
    fn parsed<T: DeserializeOwned>(&self, query: &str, bindings: Bindings) -> Result<Vec<T>> {
        let rows: Vec<Text> = self.meter.rows(&self.sql, query, bindings)?;
        let parse = |r: &Text| serde_json::from_str(&r.body).map_err(json_error);
        rows.iter().map(parse).collect()
    }

    /// An earlier build's layout, moved to the failure rows with no await: the waiting rows
    /// the value held (at most `MAX_WAITING`, each with its kept result) and the value without
    /// them, then [`MOVED_PER_LOAD`] parked rows with theirs, the old tables dropped once no
    /// parked row is left in them.
    fn move_earlier_layout(&self, progress: &Progress) -> Result<()> {
        self.meter.exec(&self.sql, SCHEMA, None)?;
        for row in progress.rows.values() {
            let index = (row.index as i64).into();
            let query = "INSERT OR REPLACE INTO results_failures (idx, parked, row, item) SELECT idx, 0, ?, item FROM results_kept WHERE idx = ?";
            self.meter
                .exec(&self.sql, query, vec![text(row)?.into(), index])?;
            let index = (row.index as i64).into();
            let forget = "DELETE FROM results_kept WHERE idx = ?";
            self.meter.exec(&self.sql, forget, Some(vec![index]))?;
        }
        if !progress.rows.is_empty() {
            self.save(progress, Vec::new())?;
        }
        let page = || Some(vec![(MOVED_PER_LOAD as i64).into()]);
        let query = "INSERT OR REPLACE INTO results_failures (idx, parked, row, item) SELECT p.idx, 1, p.row, k.item FROM results_parked p JOIN results_kept k ON k.idx = p.idx ORDER BY p.idx LIMIT ?";
        self.meter.exec(&self.sql, query, page())?;
        for table in ["results_kept", "results_parked"] {
            let query = format!("DELETE FROM {table} WHERE idx IN (SELECT idx FROM results_parked ORDER BY idx LIMIT ?)");
            self.meter.exec(&self.sql, &query, page())?;
        }
        let query = "SELECT 'parked' AS body FROM results_parked LIMIT 1";
        let left: Vec<Text> = self.meter.rows(&self.sql, query, None)?;
        if left.is_empty() {
            let drop = "DROP TABLE results_parked; DROP TABLE results_kept";
            self.meter.exec(&self.sql, drop, None)?;
        }
        Ok(())
    }

    /// Stores the progress and its transition's writes, as one.
    fn save(&self, progress: &Progress, writes: Vec<Write>) -> Result<()> {
        self.meter.exec(&self.sql, SCHEMA, None)?;
        let query = "INSERT INTO results_progress (id, body) VALUES (1, ?) ON CONFLICT(id) DO UPDATE SET body = excluded.body";
        self.meter
            .exec(&self.sql, query, vec![text(progress)?.into()])?;
        for write in writes {
            let (query, bindings) = match write {
                Write::Keep(row, item) => (
                    "INSERT OR REPLACE INTO results_failures (idx, parked, row, item) VALUES (?, ?, ?, ?)",
                    vec![(row.index as i64).into(), i64::from(row.parked()).into(), text(&row)?.into(), text(&item)?.into()],
                ),
                Write::Update(row) => (
                    "UPDATE results_failures SET parked = ?, row = ? WHERE idx = ?",
                    vec![i64::from(row.parked()).into(), text(&row)?.into(), (row.index as i64).into()],
                ),
                Write::Forget(index) => (
                    "DELETE FROM results_failures WHERE idx = ?",
                    vec![(index as i64).into()],
                ),
            };
            self.meter.exec(&self.sql, query, bindings)?;
        }
        Ok(())
    }

    /// The kept result at `index` (a waiting or parked row's).
    pub(super) fn kept(&self, index: u64) -> Result<Option<ResultItem>> {
        let query = "SELECT item AS body FROM results_failures WHERE idx = ?";
        Ok(self.parsed(query, Some(vec![(index as i64).into()]))?.pop())
    }

    /// Before an inline answer is read: what an interrupted read stored is dropped (a
    /// delete of empty tables writes nothing).
    pub(super) fn clear_inline(&self) -> Result<()> {
        self.meter.exec(&self.sql, SCHEMA, None)?;
        self.meter
            .exec(&self.sql, "DELETE FROM results_inline_items", None)?;
        self.meter
            .exec(&self.sql, "DELETE FROM results_inline_order", None)?;
        Ok(())
    }

    /// Stores inline items as they are read: a row each.
    pub(super) fn put_entries(&self, entries: Vec<Entry>) -> Result<()> {
        for e in entries {
            let key = e.key.map_or(worker::SqlStorageValue::Null, Into::into);
            self.meter.exec(
                &self.sql,
                "INSERT OR REPLACE INTO results_inline_items (seq, key, hash, payload) VALUES (?, ?, ?, ?)",
                vec![(e.seq as i64).into(), key, e.hash.into(), text(&e.payload)?.into()],
            )?;
        }
        Ok(())
    }

    /// Stores the inline items' order, once they are all stored: a row an index.
    pub(super) fn put_order(&self, places: Vec<Place>) -> Result<()> {
        let order = inline_order(places, |seq| {
            let query = "SELECT key, hash FROM results_inline_items WHERE seq = ?";
            let rows: Vec<Base> = self
                .meter
                .rows(&self.sql, query, vec![(seq as i64).into()])?;
            let row = rows.into_iter().next();
            Ok::<_, worker::Error>(
                row.map_or_else(String::new, |r| inline_base(r.key.as_deref(), &r.hash)),
            )
        })?;
        for (idx, (seq, suffix)) in order.into_iter().enumerate() {
            let query =
                "INSERT OR REPLACE INTO results_inline_order (idx, seq, suffix) VALUES (?, ?, ?)";
            let row = vec![(idx as i64).into(), (seq as i64).into(), suffix.into()];
            self.meter.exec(&self.sql, query, row)?;
        }
        Ok(())
    }

    /// Up to `n` inline results from `from` on, and whether they reach the last one.
    pub(super) fn inline_chunk(&self, from: u64, n: u64) -> Result<(Vec<ResultItem>, bool)> {
        let range = || Some(vec![(from as i64).into(), (n as i64 + 1).into()]);
        let query = "SELECT item AS body FROM results_inline WHERE idx >= ? ORDER BY idx LIMIT ?";
        let mut items: Vec<ResultItem> = self.parsed(query, range())?;
        let mut last = items.len() as u64 <= n;
        if items.is_empty() {
            let query = "SELECT o.idx AS idx, o.suffix AS suffix, i.key AS key, i.hash AS hash, i.payload AS payload FROM results_inline_order o JOIN results_inline_items i ON i.seq = o.seq WHERE o.idx >= ? ORDER BY o.idx LIMIT ?";
            let rows: Vec<Inline> = self.meter.rows(&self.sql, query, range())?;
            last = rows.len() as u64 <= n;
            let rows = rows.into_iter().take(n as usize);
            items = rows.map(Inline::item).collect::<Result<_>>()?;
        }
        items.truncate(n as usize);
        Ok((items, last))
    }

    /// Up to `n` parked rows after the index `after`, by index (once the progress loaded).
    pub(super) fn parked(&self, after: Option<u64>, n: usize) -> Result<Vec<Row>> {
        let query = "SELECT row AS body FROM results_failures WHERE parked = 1 AND idx > ? ORDER BY idx LIMIT ?";
        let page = vec![after.map_or(-1, |a| a as i64).into(), (n as i64).into()];
        self.parsed(query, Some(page))
    }
}
