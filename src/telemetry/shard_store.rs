//! A stats shard's tables and every statement on them, over any SQLite ([`Sql`]): the Durable
//! Object's at the edge (`src/edge/objects/stats_shard.rs`), an in-memory one in the tests here.
//!
//! Tables: `tally(hour, body)`: one row per hour bucket ([`hour_of`]), its counts by name as a
//! JSON object, kept [`KEEP_HOURS`] hours; hour -1 holds the sum of every bucket pruned so far,
//! so a name's total is the sum over the rows. `marks(gate, seq, at_ms)`, `WITHOUT ROWID`: the
//! highest event sequence counted per operation, kept [`MARKS_KEEP_MS`] after its last flush.
//! `recent(seq, at_ms, gate, name)`: the newest [`RECENT_DROPS`] dropped events. `meta(k, v)`:
//! the layout's version.
//!
//! What a gate's flush costs: one row written per hour its events fall in (almost always one)
//! and one dedupe mark, each a single row: neither table has a secondary index, since an index
//! entry is billed as a row written too. Pruning the marks by age scans them (reads cost a
//! thousandth of a write) at most hourly, and there are only [`MARKS_KEEP_MS`]' worth.
//!
//! Guarantees: a gate's events are counted once (see [`crate::telemetry::counters`]): a gate
//! sends an unacknowledged flush again within seconds, far inside [`MARKS_KEEP_MS`]; pruning
//! moves old buckets into hour -1 in the statements that delete them, so no total changes by
//! pruning; nothing per operation is kept past [`MARKS_KEEP_MS`] (its mark) or the newest
//! [`RECENT_DROPS`] drops; a shard of an earlier layout (1: hour -1 the all-time total and no
//! `layout` row; 2: a `counts(hour, name, n)` row per name and a `seen` table with an age
//! index) is migrated once, when opened, keeping its totals. Every statement binds at most
//! [`MAX_BINDINGS`] values (Durable Object SQLite's limit).

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::telemetry::counters::{
    hour_of, to_count, Hourly, RecentDrop, ShardCounts, StatEvent, Tally,
};

/// Dropped events kept per shard for "recently dropped".
pub const RECENT_DROPS: i64 = 50;
/// A dedupe mark is forgotten this long after its gate's last flush. A gate sends a flush it
/// saw no answer to again within seconds (`alarm::STATS_RETRY_MS`, or its alarm's capped
/// backoff); a later flush carries only events never acknowledged, which count rightly with
/// or without the mark.
pub const MARKS_KEEP_MS: i64 = 2 * 86_400_000;
/// Hour buckets kept (the trend shows 24; a day more for late flushes).
pub const KEEP_HOURS: i64 = 48;
/// Bound parameters a Durable Object's SQLite accepts in one statement.
pub const MAX_BINDINGS: usize = 100;
/// The layout this module writes: 3 is one JSON row per hour and dedupe marks without index.
const LAYOUT: i64 = 3;

/// A value bound to a statement.
#[derive(Debug, Clone, PartialEq)]
pub enum Param {
    Int(i64),
    Text(String),
}

/// One row a statement returned, by column name.
pub type Row = Map<String, Value>;

/// A SQLite database the shard's statements run on.
pub trait Sql {
    /// Runs one statement with `params` bound in order; returns its rows.
    fn run(&self, query: &str, params: Vec<Param>) -> Result<Vec<Row>, String>;
}

fn int(row: &Row, column: &str) -> i64 {
    row.get(column).and_then(Value::as_f64).unwrap_or(0.0) as i64
}

fn text(row: &Row, column: &str) -> String {
    row.get(column)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// Counts by name in one hour's row (signed: a layout-1 repair may have left a bucket
/// below zero for a moment; readers clamp at zero).
type Counts = BTreeMap<String, i64>;

fn parse_body(body: &str) -> Counts {
    serde_json::from_str(body).unwrap_or_default()
}

/// The rows of `hours` (all of them when `None`), by hour.
fn load_hours(sql: &impl Sql, hours: Option<&[i64]>) -> Result<BTreeMap<i64, Counts>, String> {
    let rows = match hours {
        None => sql.run("SELECT hour, body FROM tally", vec![])?,
        Some(hours) => {
            let mut rows = Vec::new();
            for chunk in hours.chunks(MAX_BINDINGS) {
                let marks = vec!["?"; chunk.len()].join(", ");
                rows.extend(sql.run(
                    &format!("SELECT hour, body FROM tally WHERE hour IN ({marks})"),
                    chunk.iter().map(|h| Param::Int(*h)).collect(),
                )?);
            }
            rows
        }
    };
    Ok(rows
        .iter()
        .map(|r| (int(r, "hour"), parse_body(&text(r, "body"))))
        .collect())
}

/// Stores one hour's row (one row written).
fn store_hour(sql: &impl Sql, hour: i64, counts: &Counts) -> Result<(), String> {
    let body = serde_json::to_string(counts).map_err(|e| e.to_string())?;
    sql.run(
        "INSERT INTO tally (hour, body) VALUES (?, ?) ON CONFLICT(hour) DO UPDATE SET body = excluded.body",
        vec![Param::Int(hour), Param::Text(body)],
    )?;
    Ok(())
}

/// Adds `add` into the stored rows of its hours: one row written per hour.
fn add_hours(sql: &impl Sql, add: BTreeMap<i64, Counts>) -> Result<(), String> {
    if add.is_empty() {
        return Ok(());
    }
    let hours: Vec<i64> = add.keys().copied().collect();
    let mut stored = load_hours(sql, Some(&hours))?;
    for (hour, counts) in add {
        let row = stored.entry(hour).or_default();
        for (name, n) in counts {
            *row.entry(name).or_default() += n;
        }
        store_hour(sql, hour, row)?;
    }
    Ok(())
}

/// Which of `names` exist as tables.
fn tables(sql: &impl Sql, names: &[&str]) -> Result<Vec<String>, String> {
    let marks = vec!["?"; names.len()].join(", ");
    Ok(sql
        .run(
            &format!("SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ({marks})"),
            names.iter().map(|n| Param::Text(n.to_string())).collect(),
        )?
        .iter()
        .map(|r| text(r, "name"))
        .collect())
}

/// Creates the tables if needed and migrates a shard of an earlier layout (once).
pub fn open(sql: &impl Sql) -> Result<(), String> {
    for ddl in [
        "CREATE TABLE IF NOT EXISTS tally (hour INTEGER PRIMARY KEY, body TEXT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS marks (gate TEXT PRIMARY KEY, seq INTEGER NOT NULL, at_ms INTEGER NOT NULL) WITHOUT ROWID",
        "CREATE TABLE IF NOT EXISTS recent (seq INTEGER PRIMARY KEY AUTOINCREMENT, at_ms INTEGER NOT NULL, gate TEXT NOT NULL, name TEXT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL)",
    ] {
        sql.run(ddl, vec![])?;
    }
    let layout = sql
        .run("SELECT v FROM meta WHERE k = 'layout'", vec![])?
        .first()
        .map(|r| int(r, "v"));
    if layout.unwrap_or(0) >= LAYOUT {
        return Ok(());
    }
    // Nothing awaits between these statements at the edge, so they are stored together.
    let old = tables(sql, &["counts", "seen"])?;
    if old.iter().any(|t| t == "counts") {
        if layout.is_none() {
            // Layout 1 added every count to hour -1 and to its bucket: what hour -1 holds
            // beyond the buckets still here is what the prunes took.
            sql.run(
                "UPDATE counts SET n = n - (SELECT COALESCE(SUM(b.n), 0) FROM counts AS b WHERE b.hour >= 0 AND b.name = counts.name) WHERE hour = -1",
                vec![],
            )?;
        }
        let mut by_hour: BTreeMap<i64, Counts> = BTreeMap::new();
        for r in sql.run("SELECT hour, name, n FROM counts", vec![])? {
            *by_hour
                .entry(int(&r, "hour"))
                .or_default()
                .entry(text(&r, "name"))
                .or_default() += int(&r, "n");
        }
        add_hours(sql, by_hour)?;
        sql.run("DROP TABLE counts", vec![])?;
    }
    if old.iter().any(|t| t == "seen") {
        sql.run(
            "INSERT INTO marks (gate, seq, at_ms) SELECT gate, seq, at_ms FROM seen WHERE true ON CONFLICT(gate) DO UPDATE SET seq = MAX(seq, excluded.seq)",
            vec![],
        )?;
        // Its age index goes with it.
        sql.run("DROP TABLE seen", vec![])?;
    }
    sql.run(
        "INSERT INTO meta (k, v) VALUES ('layout', ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v",
        vec![Param::Int(LAYOUT)],
    )?;
    Ok(())
}

/// Inserts rows of three values each: `head` is `INSERT ... VALUES `, `tail` an upsert
/// clause; as many rows per statement as [`MAX_BINDINGS`] allows.
fn insert_rows(
    sql: &impl Sql,
    head: &str,
    tail: &str,
    rows: Vec<[Param; 3]>,
) -> Result<(), String> {
    for chunk in rows.chunks(MAX_BINDINGS / 3) {
        let mut query = String::from(head);
        for i in 0..chunk.len() {
            query.push_str(if i == 0 { "(?, ?, ?)" } else { ", (?, ?, ?)" });
        }
        query.push_str(tail);
        sql.run(&query, chunk.iter().flatten().cloned().collect())?;
    }
    Ok(())
}

/// Counts `events` (a gate's only past the highest sequence seen from it, see
/// [`to_count`]); with `prune`, then moves buckets older than [`KEEP_HOURS`] into hour -1 and
/// forgets dedupe marks older than [`MARKS_KEEP_MS`].
pub fn add(
    sql: &impl Sql,
    gate: Option<&str>,
    events: &[StatEvent],
    now_ms: i64,
    prune: bool,
) -> Result<(), String> {
    let seen = match gate {
        Some(g) => Some(
            sql.run(
                "SELECT seq FROM marks WHERE gate = ?",
                vec![Param::Text(g.to_string())],
            )?
            .first()
            .map_or(0, |r| int(r, "seq").max(0) as u64),
        ),
        None => None,
    };
    let mut counts: BTreeMap<i64, Counts> = BTreeMap::new();
    let mut drops = Vec::new();
    let mut highest = seen.unwrap_or(0);
    for e in to_count(events, seen) {
        if let (Some(g), Some(reason)) = (gate, e.name.strip_prefix("dropped_")) {
            drops.push([
                Param::Int(e.at_ms),
                Param::Text(g.to_string()),
                Param::Text(reason.to_string()),
            ]);
        }
        *counts
            .entry(hour_of(e.at_ms))
            .or_default()
            .entry(e.name.clone())
            .or_default() += e.count as i64;
        highest = highest.max(e.seq);
    }
    let any_drops = !drops.is_empty();
    insert_rows(
        sql,
        "INSERT INTO recent (at_ms, gate, name) VALUES ",
        "",
        drops,
    )?;
    add_hours(sql, counts)?;
    // A flush of nothing new (a retry the shard had counted) writes no mark either.
    if let (Some(g), true) = (gate, highest > seen.unwrap_or(0)) {
        sql.run(
            "INSERT INTO marks (gate, seq, at_ms) VALUES (?, ?, ?) ON CONFLICT(gate) DO UPDATE SET seq = MAX(seq, excluded.seq), at_ms = excluded.at_ms",
            vec![Param::Text(g.to_string()), Param::Int(highest as i64), Param::Int(now_ms)],
        )?;
    }
    if prune {
        let before = hour_of(now_ms) - KEEP_HOURS;
        let old = sql.run(
            "SELECT hour, body FROM tally WHERE hour >= 0 AND hour < ?",
            vec![Param::Int(before)],
        )?;
        if !old.is_empty() {
            let mut folded = Counts::new();
            for r in &old {
                for (name, n) in parse_body(&text(r, "body")) {
                    *folded.entry(name).or_default() += n;
                }
            }
            // The fold and the delete go together (no await between them at the edge).
            add_hours(sql, BTreeMap::from([(-1, folded)]))?;
            sql.run(
                "DELETE FROM tally WHERE hour >= 0 AND hour < ?",
                vec![Param::Int(before)],
            )?;
        }
        sql.run(
            "DELETE FROM marks WHERE at_ms < ?",
            vec![Param::Int(now_ms - MARKS_KEEP_MS)],
        )?;
    }
    if any_drops {
        // Cheap (the newest rows by primary key), and it keeps "recent" recent.
        sql.run(
            "DELETE FROM recent WHERE seq <= (SELECT MAX(seq) FROM recent) - ?",
            vec![Param::Int(RECENT_DROPS)],
        )?;
    }
    Ok(())
}

/// The shard's totals, the last day's sums and buckets, and its recent drops (newest first).
pub fn read(sql: &impl Sql, now_ms: i64, trend_hours: i64) -> Result<ShardCounts, String> {
    let now_hour = hour_of(now_ms);
    let mut total = Tally::new();
    let mut last_24h = Tally::new();
    let mut hourly = Hourly::new();
    for (hour, counts) in load_hours(sql, None)? {
        for (name, n) in counts {
            let n = n.max(0) as u64;
            *total.entry(name.clone()).or_default() += n;
            if hour > now_hour - 24 {
                *last_24h.entry(name.clone()).or_default() += n;
            }
            if hour > now_hour - trend_hours {
                *hourly.entry(hour).or_default().entry(name).or_default() += n;
            }
        }
    }
    let recent_drops = sql
        .run(
            "SELECT at_ms, gate, name FROM recent ORDER BY seq DESC",
            vec![],
        )?
        .iter()
        .map(|r| RecentDrop {
            at_ms: int(r, "at_ms"),
            key: text(r, "gate"),
            reason: text(r, "name"),
        })
        .collect();
    Ok(ShardCounts {
        total,
        last_24h,
        recent_drops,
        hourly,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::types::Value as SqlValue;
    use serde_json::json;

    /// An in-memory SQLite, refusing what a Durable Object's would (too many bindings), and
    /// counting the rows its statements change (what a Durable Object bills as written,
    /// besides index entries: the tables here have none, checked below).
    struct Memory(rusqlite::Connection, std::cell::Cell<u64>);

    impl Memory {
        fn new() -> Memory {
            Memory(
                rusqlite::Connection::open_in_memory().unwrap(),
                std::cell::Cell::new(0),
            )
        }

        /// Rows changed since the last call.
        fn written(&self) -> u64 {
            self.1.replace(0)
        }
    }

    impl Sql for Memory {
        fn run(&self, query: &str, params: Vec<Param>) -> Result<Vec<Row>, String> {
            if params.len() > MAX_BINDINGS {
                return Err(format!("{} bindings", params.len()));
            }
            let mut stmt = self.0.prepare(query).map_err(|e| e.to_string())?;
            let names: Vec<String> = stmt.column_names().iter().map(|n| n.to_string()).collect();
            let values = params.into_iter().map(|p| match p {
                Param::Int(i) => SqlValue::Integer(i),
                Param::Text(s) => SqlValue::Text(s),
            });
            let mut rows = stmt
                .query(rusqlite::params_from_iter(values))
                .map_err(|e| e.to_string())?;
            let mut out = Vec::new();
            while let Some(row) = rows.next().map_err(|e| e.to_string())? {
                let mut map = Row::new();
                for (i, name) in names.iter().enumerate() {
                    let value = match row.get::<_, SqlValue>(i).map_err(|e| e.to_string())? {
                        SqlValue::Integer(n) => json!(n),
                        SqlValue::Real(f) => json!(f),
                        SqlValue::Text(s) => json!(s),
                        SqlValue::Null | SqlValue::Blob(_) => Value::Null,
                    };
                    map.insert(name.clone(), value);
                }
                out.push(map);
            }
            drop(rows);
            drop(stmt);
            if !query.trim_start().starts_with("SELECT") {
                self.1.set(self.1.get() + self.0.changes());
            }
            Ok(out)
        }
    }

    const HOUR: i64 = 3_600_000;
    /// Noon of some day, as an hour-aligned time far from 0.
    const T0: i64 = 500_000 * HOUR;

    fn event(seq: u64, name: &str, at_ms: i64) -> StatEvent {
        StatEvent {
            seq,
            name: name.into(),
            at_ms,
            count: 1,
        }
    }

    fn opened() -> Memory {
        let db = Memory::new();
        open(&db).unwrap();
        db
    }

    fn total(db: &Memory, now: i64, name: &str) -> u64 {
        read(db, now, 24)
            .unwrap()
            .total
            .get(name)
            .copied()
            .unwrap_or(0)
    }

    #[test]
    fn a_flush_writes_one_row_per_hour_and_one_mark_and_totals_sum_the_buckets() {
        let db = opened();
        db.written();
        let events = [
            event(1, "deliveries", T0),
            event(2, "settled_by_webhook", T0),
            event(3, "effect_successes", T0),
        ];
        add(&db, Some("batches/a"), &events, T0, false).unwrap();
        assert_eq!(db.written(), 2, "one hour's row and the gate's mark");
        add(
            &db,
            Some("batches/b"),
            &[event(1, "deliveries", T0 + HOUR)],
            T0 + HOUR,
            false,
        )
        .unwrap();
        assert_eq!(db.written(), 2);
        let indexes = db
            .run(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name IN ('tally', 'marks')",
                vec![],
            )
            .unwrap();
        assert!(indexes.is_empty(), "no index entry to pay for: {indexes:?}");
        let rows = db.run("SELECT hour FROM tally", vec![]).unwrap();
        assert_eq!(rows.len(), 2, "one row per hour: {rows:?}");
        let counts = read(&db, T0 + HOUR, 24).unwrap();
        assert_eq!(counts.total["deliveries"], 2);
        assert_eq!(counts.total["effect_successes"], 1);
        assert_eq!(counts.last_24h["deliveries"], 2);
        assert_eq!(counts.hourly[&hour_of(T0)]["deliveries"], 1);
        assert_eq!(counts.hourly[&hour_of(T0 + HOUR)]["deliveries"], 1);
        // A retried flush the shard had counted writes nothing.
        add(&db, Some("batches/a"), &events, T0 + HOUR, false).unwrap();
        assert_eq!(db.written(), 0);
    }

    #[test]
    fn a_retried_flush_is_not_counted_twice() {
        let db = opened();
        let events = [
            event(1, "deliveries", T0),
            event(2, "duplicates_skipped", T0),
        ];
        add(&db, Some("batches/a"), &events, T0, false).unwrap();
        add(&db, Some("batches/a"), &events, T0, false).unwrap();
        let more = [
            event(2, "duplicates_skipped", T0),
            event(3, "duplicates_skipped", T0),
        ];
        add(&db, Some("batches/a"), &more, T0, false).unwrap();
        assert_eq!(total(&db, T0, "deliveries"), 1);
        assert_eq!(total(&db, T0, "duplicates_skipped"), 2);
    }

    #[test]
    fn pruning_moves_old_buckets_into_the_total_without_changing_it() {
        let db = opened();
        add(
            &db,
            Some("batches/a"),
            &[event(1, "deliveries", T0)],
            T0,
            false,
        )
        .unwrap();
        add(
            &db,
            None,
            &[event(0, "deliveries", T0 + HOUR)],
            T0 + HOUR,
            false,
        )
        .unwrap();
        let later = T0 + (KEEP_HOURS + 1) * HOUR + 1;
        add(
            &db,
            Some("batches/b"),
            &[event(1, "deliveries", later)],
            later,
            true,
        )
        .unwrap();
        let counts = read(&db, later, 24).unwrap();
        assert_eq!(counts.total["deliveries"], 3, "nothing lost by pruning");
        assert_eq!(counts.last_24h["deliveries"], 1);
        let buckets = db
            .run(
                "SELECT hour FROM tally WHERE hour >= 0 ORDER BY hour",
                vec![],
            )
            .unwrap();
        assert_eq!(buckets.len(), 2, "the first bucket was pruned: {buckets:?}");
        let pruned = |db: &Memory| {
            let rows = db
                .run("SELECT body FROM tally WHERE hour = -1", vec![])
                .unwrap();
            parse_body(&text(&rows[0], "body"))["deliveries"]
        };
        assert_eq!(pruned(&db), 1);
        // A second prune folds the next bucket into the same row, and nothing twice.
        let even_later = later + HOUR;
        add(&db, None, &[], even_later, true).unwrap();
        assert_eq!(total(&db, even_later, "deliveries"), 3);
        assert_eq!(pruned(&db), 2);
    }

    #[test]
    fn a_shard_of_the_earlier_layout_is_migrated_once_and_keeps_its_totals() {
        let db = Memory::new();
        // Layout 1: every count in hour -1 (all time) and in its bucket; one bucket pruned.
        db.0.execute_batch(
            "CREATE TABLE counts (hour INTEGER NOT NULL, name TEXT NOT NULL, n INTEGER NOT NULL, PRIMARY KEY (hour, name));
             INSERT INTO counts VALUES (-1, 'deliveries', 10), (-1, 'alerts', 1), (500000, 'deliveries', 3), (500001, 'deliveries', 4), (500001, 'alerts', 1);",
        )
        .unwrap();
        open(&db).unwrap();
        let now = 500_001 * HOUR;
        assert_eq!(total(&db, now, "deliveries"), 10);
        assert_eq!(total(&db, now, "alerts"), 1);
        open(&db).unwrap();
        assert_eq!(
            total(&db, now, "deliveries"),
            10,
            "a second open changes nothing"
        );
        add(&db, None, &[event(0, "deliveries", now)], now, false).unwrap();
        assert_eq!(total(&db, now, "deliveries"), 11);
        assert_eq!(read(&db, now, 24).unwrap().last_24h["deliveries"], 8);
    }

    #[test]
    fn a_shard_of_layout_2_is_migrated_once_with_its_totals_and_marks() {
        let db = Memory::new();
        db.0.execute_batch(
            "CREATE TABLE counts (hour INTEGER NOT NULL, name TEXT NOT NULL, n INTEGER NOT NULL, PRIMARY KEY (hour, name));
             CREATE TABLE seen (gate TEXT PRIMARY KEY, seq INTEGER NOT NULL, at_ms INTEGER NOT NULL);
             CREATE INDEX seen_by_age ON seen (at_ms);
             CREATE TABLE meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL);
             INSERT INTO meta VALUES ('layout', 2);
             INSERT INTO counts VALUES (-1, 'deliveries', 6), (500000, 'deliveries', 3), (500001, 'deliveries', 4), (500001, 'alerts', 1);
             INSERT INTO seen VALUES ('batches/a', 2, 1800000000000);",
        )
        .unwrap();
        open(&db).unwrap();
        let now = 500_001 * HOUR;
        assert_eq!(total(&db, now, "deliveries"), 13);
        assert_eq!(total(&db, now, "alerts"), 1);
        assert_eq!(read(&db, now, 24).unwrap().last_24h["deliveries"], 7);
        let old = db
            .run(
                "SELECT name FROM sqlite_master WHERE name IN ('counts', 'seen', 'seen_by_age')",
                vec![],
            )
            .unwrap();
        assert!(old.is_empty(), "{old:?}");
        // The mark came along: a flush of what batches/a had sent counts only what is new.
        let events = [event(2, "deliveries", now), event(3, "deliveries", now)];
        add(&db, Some("batches/a"), &events, now, false).unwrap();
        assert_eq!(total(&db, now, "deliveries"), 14);
        open(&db).unwrap();
        assert_eq!(
            total(&db, now, "deliveries"),
            14,
            "a second open changes nothing"
        );
    }

    #[test]
    fn marks_are_forgotten_after_their_keep() {
        let db = opened();
        add(
            &db,
            Some("batches/a"),
            &[event(1, "deliveries", T0)],
            T0,
            false,
        )
        .unwrap();
        let later = T0 + MARKS_KEEP_MS - 1;
        add(&db, None, &[], later, true).unwrap();
        assert_eq!(db.run("SELECT gate FROM marks", vec![]).unwrap().len(), 1);
        add(&db, None, &[], T0 + MARKS_KEEP_MS + 1, true).unwrap();
        assert!(db.run("SELECT gate FROM marks", vec![]).unwrap().is_empty());
        assert_eq!(total(&db, T0, "deliveries"), 1, "counts stay");
    }

    #[test]
    fn a_flush_of_many_names_stays_within_the_binding_limit() {
        let db = opened();
        let events: Vec<StatEvent> = (0..40)
            .map(|i| event(0, &format!("rejected_reason_{i}"), T0))
            .collect();
        add(&db, None, &events, T0, false).unwrap();
        add(&db, None, &events, T0, false).unwrap();
        let counts = read(&db, T0, 24).unwrap();
        assert_eq!(counts.total.len(), 40);
        assert!(counts.total.values().all(|n| *n == 2));
    }

    #[test]
    fn recent_drops_keep_the_newest_first() {
        let db = opened();
        for i in 0..(RECENT_DROPS + 5) {
            let g = format!("batches/{i}");
            add(
                &db,
                Some(&g),
                &[event(1, "dropped_stale", T0 + i)],
                T0 + i,
                false,
            )
            .unwrap();
        }
        let recent = read(&db, T0, 24).unwrap().recent_drops;
        assert_eq!(recent.len() as i64, RECENT_DROPS);
        assert_eq!(recent[0].key, format!("batches/{}", RECENT_DROPS + 4));
        assert_eq!(recent[0].reason, "stale");
        assert_eq!(total(&db, T0, "dropped_stale"), (RECENT_DROPS + 5) as u64);
    }
}
