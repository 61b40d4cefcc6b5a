//! The gate's tables of a batch's results (beside `tables.rs`'s record): the progress, the
//! results kept to be sent again, the parked rows, and an inline batch's items.
//!
//! Tables, created by the first write of a `"results": "each"` batch:
//! `results_progress(id = 1, body)` the [`Progress`] as JSON (its waiting rows included, at
//! most `MAX_WAITING`); `results_kept(idx, item)` the result of each row waiting or parked;
//! `results_parked(idx, row)` the parked rows; an inline batch's results, stored as its status
//! answer streams in: `results_inline_items(seq, key, hash, payload)` each item at its place
//! in the answer (its `metadata.key`, content hash, and `response`, `error` or `unreadable`),
//! then `results_inline_order(idx, seq, suffix)` their stable order (a row an item: the
//! answer cannot be held to order it first), so a chunk is a range of rows;
//! `results_inline(idx, item)` is the form an earlier build stored, still read.
//!
//! Guarantees: a progress and the writes its transition made are stored with no await in
//! between, so the runtime commits them as one (a Durable Object's writes between two awaits
//! are atomic); a row is written per result kept (a failure), never per delivered result.
//! They go with the rest of the object's storage when retention ends (`deleteAll`).

use serde::Deserialize;
use worker::{Result, SqlStorage};

use crate::results::inline::Entry;
use crate::results::item::{Payload, ResultItem};
use crate::results::keys::{inline_base, inline_order, Place};
use crate::results::progress::{Progress, Row, Write};

use crate::edge::objects::gate::storage::GateStorage;
use crate::edge::objects::usage_meter::Meter;

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS results_progress (id INTEGER PRIMARY KEY CHECK (id = 1), body TEXT NOT NULL); CREATE TABLE IF NOT EXISTS results_kept (idx INTEGER PRIMARY KEY, item TEXT NOT NULL); CREATE TABLE IF NOT EXISTS results_parked (idx INTEGER PRIMARY KEY, row TEXT NOT NULL); CREATE TABLE IF NOT EXISTS results_inline (idx INTEGER PRIMARY KEY, item TEXT NOT NULL); CREATE TABLE IF NOT EXISTS results_inline_items (seq INTEGER PRIMARY KEY, key TEXT, hash TEXT NOT NULL, payload TEXT NOT NULL); CREATE TABLE IF NOT EXISTS results_inline_order (idx INTEGER PRIMARY KEY, seq INTEGER NOT NULL, suffix TEXT NOT NULL)";

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
        Ok(ResultItem {
            result_key: format!(
                "{}{}",
                inline_base(self.key.as_deref(), &self.hash),
                self.suffix
            ),
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

impl<'a> ResultsStore<'a> {
    pub(super) fn new(storage: &'a GateStorage) -> ResultsStore<'a> {
        ResultsStore {
            meter: storage.meter(),
            sql: storage.sql(),
        }
    }

    /// Whether the tables exist (a read that cannot fail on an object that has none).
    fn exists(&self) -> Result<bool> {
        let rows: Vec<serde_json::Value> = self.meter.rows(
            &self.sql,
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'results_progress'",
            None,
        )?;
        Ok(!rows.is_empty())
    }

    /// The stored progress, if the results have begun.
    pub(super) fn load(&self) -> Result<Option<Progress>> {
        if !self.exists()? {
            return Ok(None);
        }
        let rows: Vec<Text> = self.meter.rows(
            &self.sql,
            "SELECT body FROM results_progress WHERE id = 1",
            None,
        )?;
        match rows.first() {
            Some(row) => Ok(Some(serde_json::from_str(&row.body).map_err(json_error)?)),
            None => Ok(None),
        }
    }

    /// The progress as stored now (else `stale`): a step reads it afresh after every await,
    /// so what an operator's retry of parked results stored meanwhile is kept, never written
    /// over.
    pub(super) fn fresh(&self, stale: Progress) -> Result<Progress> {
        Ok(self.load()?.unwrap_or(stale))
    }

    /// Stores the progress and its transition's writes, as one.
    pub(super) fn save(&self, progress: &Progress, writes: Vec<Write>) -> Result<()> {
        self.meter.exec(&self.sql, SCHEMA, None)?;
        self.meter.exec(
            &self.sql,
            "INSERT INTO results_progress (id, body) VALUES (1, ?) ON CONFLICT(id) DO UPDATE SET body = excluded.body",
            vec![text(progress)?.into()],
        )?;
        for write in writes {
            match write {
                Write::KeepResult(item) => self.meter.exec(
                    &self.sql,
                    "INSERT OR REPLACE INTO results_kept (idx, item) VALUES (?, ?)",
                    vec![(item.index as i64).into(), text(&item)?.into()],
                )?,
                Write::Forget(index) => self.meter.exec(
                    &self.sql,
                    "DELETE FROM results_kept WHERE idx = ?",
                    vec![(index as i64).into()],
                )?,
                Write::Park(row) => self.meter.exec(
                    &self.sql,
                    "INSERT OR REPLACE INTO results_parked (idx, row) VALUES (?, ?)",
                    vec![(row.index as i64).into(), text(&row)?.into()],
                )?,
            };
        }
        Ok(())
    }

    /// The kept result at `index` (a waiting or parked row's).
    pub(super) fn kept(&self, index: u64) -> Result<Option<ResultItem>> {
        self.one("SELECT item AS body FROM results_kept WHERE idx = ?", index)
    }

    fn one<T: serde::de::DeserializeOwned>(&self, query: &str, index: u64) -> Result<Option<T>> {
        let rows: Vec<Text> = self
            .meter
            .rows(&self.sql, query, vec![(index as i64).into()])?;
        rows.first()
            .map(|r| serde_json::from_str(&r.body).map_err(json_error))
            .transpose()
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
            let rows: Vec<Base> = self.meter.rows(
                &self.sql,
                "SELECT key, hash FROM results_inline_items WHERE seq = ?",
                vec![(seq as i64).into()],
            )?;
            let row = rows.into_iter().next();
            Ok::<_, worker::Error>(
                row.map_or_else(String::new, |r| inline_base(r.key.as_deref(), &r.hash)),
            )
        })?;
        for (idx, (seq, suffix)) in order.into_iter().enumerate() {
            self.meter.exec(
                &self.sql,
                "INSERT OR REPLACE INTO results_inline_order (idx, seq, suffix) VALUES (?, ?, ?)",
                vec![(idx as i64).into(), (seq as i64).into(), suffix.into()],
            )?;
        }
        Ok(())
    }

    /// Up to `n` inline results from `from` on, and whether they reach the last one.
    pub(super) fn inline_chunk(&self, from: u64, n: u64) -> Result<(Vec<ResultItem>, bool)> {
        let legacy: Vec<Text> = self.meter.rows(
            &self.sql,
            "SELECT item AS body FROM results_inline WHERE idx >= ? ORDER BY idx LIMIT ?",
            vec![(from as i64).into(), (n as i64 + 1).into()],
        )?;
        let rows: Vec<Inline> = match legacy.is_empty() {
            true => self.meter.rows(
                &self.sql,
                "SELECT o.idx AS idx, o.suffix AS suffix, i.key AS key, i.hash AS hash, i.payload AS payload FROM results_inline_order o JOIN results_inline_items i ON i.seq = o.seq WHERE o.idx >= ? ORDER BY o.idx LIMIT ?",
                vec![(from as i64).into(), (n as i64 + 1).into()],
            )?,
            false => {
                let last = legacy.len() as u64 <= n;
                let items = legacy
                    .iter()
                    .take(n as usize)
                    .map(|r| serde_json::from_str(&r.body).map_err(json_error))
                    .collect::<Result<Vec<ResultItem>>>()?;
                return Ok((items, last));
            }
        };
        let last = rows.len() as u64 <= n;
        let items = rows
            .into_iter()
            .take(n as usize)
            .map(Inline::item)
            .collect::<Result<Vec<ResultItem>>>()?;
        Ok((items, last))
    }

    /// Up to `n` parked rows after the index `after`, by index.
    pub(super) fn parked(&self, after: Option<u64>, n: usize) -> Result<Vec<Row>> {
        if !self.exists()? {
            return Ok(Vec::new());
        }
        let rows: Vec<Text> = self.meter.rows(
            &self.sql,
            "SELECT row AS body FROM results_parked WHERE idx > ? ORDER BY idx LIMIT ?",
            vec![after.map_or(-1, |a| a as i64).into(), (n as i64).into()],
        )?;
        rows.iter()
            .map(|r| serde_json::from_str(&r.body).map_err(json_error))
            .collect()
    }

    /// Takes these parked rows out of the parked ones (an operator's retry, stored with the
    /// progress that now holds them).
    pub(super) fn unpark(&self, rows: &[Row]) -> Result<()> {
        for row in rows {
            self.meter.exec(
                &self.sql,
                "DELETE FROM results_parked WHERE idx = ?",
                vec![(row.index as i64).into()],
            )?;
        }
        Ok(())
    }
}
