//! A stats shard's tables and every statement on them, over any SQLite ([`Sql`]): the Durable
//! Object's at the edge (`src/edge/objects/stats_shard.rs`), an in-memory one in the tests here.
//!
//! Tables: `counts(hour, name, n)`: an hour ≥ 0 is that hour's bucket ([`hour_of`]), kept
//! [`KEEP_HOURS`] hours; hour -1 holds the sum of every bucket pruned so far, so a name's total
//! is the sum of its rows and a flush writes one row per name (not two, as it would if hour -1
//! held the all-time total). `seen(gate, seq, at_ms)`: the highest event sequence counted per
//! operation, kept [`SEEN_KEEP_MS`]. `recent(seq, at_ms, gate, name)`: the newest
//! [`RECENT_DROPS`] dropped events. `meta(k, v)`: the layout's version.
//!
//! Guarantees: a gate's events are counted once (see [`crate::telemetry::counters`]); pruning moves old
//! buckets into hour -1 in the statements that delete them, so no total changes by pruning; a
//! shard of layout 1 (hour -1 the all-time total; no `layout` row in `meta`) is migrated once,
//! when opened: its all-time row minus the buckets it still holds is exactly what it had pruned.
//! Every statement binds at most [`MAX_BINDINGS`] values (Durable Object SQLite's limit).

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::telemetry::counters::{
    hour_of, to_count, Hourly, RecentDrop, ShardCounts, StatEvent, Tally,
};

/// Dropped events kept per shard for "recently dropped".
pub const RECENT_DROPS: i64 = 50;
/// Operations whose dedupe mark is older than this are pruned (past any gate's life).
pub const SEEN_KEEP_MS: i64 = 400 * 86_400_000;
/// Hour buckets kept (the trend shows 24; a day more for late flushes).
pub const KEEP_HOURS: i64 = 48;
/// Bound parameters a Durable Object's SQLite accepts in one statement.
pub const MAX_BINDINGS: usize = 100;
/// The layout this module writes: 2 is hour -1 holding pruned buckets only.
const LAYOUT: i64 = 2;

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

/// Creates the tables if needed and migrates a shard of layout 1 (once).
pub fn open(sql: &impl Sql) -> Result<(), String> {
    for ddl in [
        "CREATE TABLE IF NOT EXISTS counts (hour INTEGER NOT NULL, name TEXT NOT NULL, n INTEGER NOT NULL, PRIMARY KEY (hour, name))",
        "CREATE TABLE IF NOT EXISTS seen (gate TEXT PRIMARY KEY, seq INTEGER NOT NULL, at_ms INTEGER NOT NULL)",
        "CREATE TABLE IF NOT EXISTS recent (seq INTEGER PRIMARY KEY AUTOINCREMENT, at_ms INTEGER NOT NULL, gate TEXT NOT NULL, name TEXT NOT NULL)",
        "CREATE INDEX IF NOT EXISTS seen_by_age ON seen (at_ms)",
        "CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL)",
    ] {
        sql.run(ddl, vec![])?;
    }
    let layout = sql
        .run("SELECT v FROM meta WHERE k = 'layout'", vec![])?
        .first()
        .map(|r| int(r, "v"));
    if layout.unwrap_or(1) < LAYOUT {
        // Layout 1 added every count to hour -1 and to its bucket: what hour -1 holds beyond
        // the buckets still here is what the prunes took. Nothing awaits between these
        // statements, so they are stored together.
        sql.run(
            "UPDATE counts SET n = n - (SELECT COALESCE(SUM(b.n), 0) FROM counts AS b WHERE b.hour >= 0 AND b.name = counts.name) WHERE hour = -1",
            vec![],
        )?;
        sql.run(
            "INSERT INTO meta (k, v) VALUES ('layout', ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v",
            vec![Param::Int(LAYOUT)],
        )?;
    }
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
/// forgets dedupe marks older than [`SEEN_KEEP_MS`].
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
                "SELECT seq FROM seen WHERE gate = ?",
                vec![Param::Text(g.to_string())],
            )?
            .first()
            .map_or(0, |r| int(r, "seq").max(0) as u64),
        ),
        None => None,
    };
    let mut counts: BTreeMap<(i64, String), i64> = BTreeMap::new();
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
            .entry((hour_of(e.at_ms), e.name.clone()))
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
    insert_rows(
        sql,
        "INSERT INTO counts (hour, name, n) VALUES ",
        " ON CONFLICT(hour, name) DO UPDATE SET n = n + excluded.n",
        counts
            .into_iter()
            .map(|((hour, name), n)| [Param::Int(hour), Param::Text(name), Param::Int(n)])
            .collect(),
    )?;
    if let Some(g) = gate {
        sql.run(
            "INSERT INTO seen (gate, seq, at_ms) VALUES (?, ?, ?) ON CONFLICT(gate) DO UPDATE SET seq = MAX(seq, excluded.seq), at_ms = excluded.at_ms",
            vec![Param::Text(g.to_string()), Param::Int(highest as i64), Param::Int(now_ms)],
        )?;
    }
    if prune {
        let before = Param::Int(hour_of(now_ms) - KEEP_HOURS);
        // The fold and the delete go together (no await between them at the edge).
        sql.run(
            "INSERT INTO counts (hour, name, n) SELECT -1, name, SUM(n) FROM counts WHERE hour >= 0 AND hour < ? GROUP BY name ON CONFLICT(hour, name) DO UPDATE SET n = n + excluded.n",
            vec![before.clone()],
        )?;
        sql.run(
            "DELETE FROM counts WHERE hour >= 0 AND hour < ?",
            vec![before],
        )?;
        sql.run(
            "DELETE FROM seen WHERE at_ms < ?",
            vec![Param::Int(now_ms - SEEN_KEEP_MS)],
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
    let tally = |rows: Vec<Row>| -> Tally {
        rows.iter()
            .map(|r| (text(r, "name"), int(r, "n").max(0) as u64))
            .collect()
    };
    let total = tally(sql.run("SELECT name, SUM(n) AS n FROM counts GROUP BY name", vec![])?);
    let last_24h = tally(sql.run(
        "SELECT name, SUM(n) AS n FROM counts WHERE hour > ? GROUP BY name",
        vec![Param::Int(hour_of(now_ms) - 24)],
    )?);
    let mut hourly = Hourly::new();
    for r in sql.run(
        "SELECT hour, name, n FROM counts WHERE hour > ?",
        vec![Param::Int(hour_of(now_ms) - trend_hours)],
    )? {
        *hourly
            .entry(int(&r, "hour"))
            .or_default()
            .entry(text(&r, "name"))
            .or_default() += int(&r, "n").max(0) as u64;
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

    /// An in-memory SQLite, refusing what a Durable Object's would (too many bindings).
    struct Memory(rusqlite::Connection);

    impl Memory {
        fn new() -> Memory {
            Memory(rusqlite::Connection::open_in_memory().unwrap())
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
    fn a_flush_writes_one_row_per_name_and_totals_sum_the_buckets() {
        let db = opened();
        let events = [event(1, "deliveries", T0), event(2, "effect_successes", T0)];
        add(&db, Some("batches/a"), &events, T0, false).unwrap();
        add(
            &db,
            Some("batches/b"),
            &[event(1, "deliveries", T0 + HOUR)],
            T0 + HOUR,
            false,
        )
        .unwrap();
        let rows = db.run("SELECT hour, name, n FROM counts", vec![]).unwrap();
        assert_eq!(
            rows.len(),
            3,
            "one row per hour and name, no all-time row: {rows:?}"
        );
        let counts = read(&db, T0 + HOUR, 24).unwrap();
        assert_eq!(counts.total["deliveries"], 2);
        assert_eq!(counts.last_24h["deliveries"], 2);
        assert_eq!(counts.hourly[&hour_of(T0)]["deliveries"], 1);
        assert_eq!(counts.hourly[&hour_of(T0 + HOUR)]["deliveries"], 1);
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
                "SELECT hour, n FROM counts WHERE hour >= 0 ORDER BY hour",
                vec![],
            )
            .unwrap();
        assert_eq!(buckets.len(), 2, "the first bucket was pruned: {buckets:?}");
        let pruned = db
            .run("SELECT n FROM counts WHERE hour = -1", vec![])
            .unwrap();
        assert_eq!(int(&pruned[0], "n"), 1);
        // A second prune folds the next bucket into the same row, and nothing twice.
        let even_later = later + HOUR;
        add(&db, None, &[], even_later, true).unwrap();
        assert_eq!(total(&db, even_later, "deliveries"), 3);
        let pruned = db
            .run("SELECT n FROM counts WHERE hour = -1", vec![])
            .unwrap();
        assert_eq!(int(&pruned[0], "n"), 2);
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
