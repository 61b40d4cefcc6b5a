//! A stats shard's tables and every statement on them, over any SQLite ([`Sql`]): the Durable
//! Object's at the edge (`src/edge/objects/stats_shard.rs`), an in-memory one in the tests here.
//!
//! Tables: `tally(hour, body)`: one row per hour bucket ([`hour_of`]), its counts by name as a
//! JSON object, kept [`KEEP_HOURS`] hours; hour -1 holds the sum of every bucket pruned so far,
//! so a name's total is the sum over the rows. `marks_<day>(gate, seq, at_ms)`, `WITHOUT
//! ROWID`, one table per UTC day ([`day_of`]): the highest event sequence counted per
//! operation, written into the table of the day of the flush; the highest over the tables is
//! the operation's. `recent(seq, at_ms, gate, name)`: the newest [`RECENT_DROPS`] dropped
//! events. `meta(k, v)`: the layout's version.
//!
//! What a gate's flush costs: one row written per hour its events fall in (almost always one)
//! and one dedupe mark, each a single row: no table has a secondary index, since an index
//! entry is billed as a row written too. Marks are forgotten a whole day's table at a time
//! (`DROP TABLE`), so forgetting them writes no row per mark (a `DELETE` would bill one row
//! per mark deleted, as much again as writing it) and scans nothing.
//!
//! How long a mark is kept ([`marks_keep_ms`], [`marks_expired`]): at least the retention
//! (`LEDGER_RETENTION_DAYS`, read from the same configuration as the gates) plus a retirement
//! moment's period (a day, or the retention when shorter) and never less than
//! [`MARKS_KEEP_FLOOR_MS`], after the flush that wrote it, and at most a day more (the day's
//! table goes when its last mark is due). A gate deletes its storage at its close plus the
//! retention, moved to its name's bucket's next moment (less than that period later:
//! `crate::operation::retired_names`), and every flush of a closed gate happens before that, so a mark outlives
//! every flush its gate can still send: a closed gate's retry is never counted twice. An open
//! gate sends a flush it saw no answer to again within seconds while its alarm runs; the
//! floor covers an alarm stalled for two days. A gate created again for the same key after
//! its storage was deleted numbers its events from its creation time (`outbox`), past any
//! mark its earlier life left, so a kept mark never hides a new life's counts.
//!
//! Guarantees: a gate's events are counted once (see [`crate::telemetry::counters`]); pruning
//! moves old buckets into hour -1 in the statements that delete them, so no total changes by
//! pruning; nothing per operation is kept past its mark's day table or the newest
//! [`RECENT_DROPS`] drops; a shard of an earlier layout (1: hour -1 the all-time total and no
//! `layout` row; 2: a `counts(hour, name, n)` row per name and a `seen` table with an age
//! index; 3: JSON hour rows and one `marks` table) is migrated once, when opened, keeping its
//! totals and its marks (an earlier marks table becomes the day table of the migration, kept
//! as long as a mark written that day). Every statement binds at most [`MAX_BINDINGS`] values
//! (Durable Object SQLite's limit).

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::telemetry::counters::{
    hour_of, to_count, Hourly, RecentDrop, ShardCounts, StatEvent, Tally,
};

/// Dropped events kept per shard for "recently dropped".
pub const RECENT_DROPS: i64 = 50;
/// The least a dedupe mark is kept after the flush that wrote it, whatever the retention: an
/// open gate sends a flush it saw no answer to again within seconds (`alarm::STATS_RETRY_MS`,
/// or its alarm's capped backoff), far inside it.
pub const MARKS_KEEP_FLOOR_MS: i64 = 2 * DAY_MS;
/// A day, the span of one marks table.
pub const DAY_MS: i64 = 86_400_000;
/// Hour buckets kept (the trend shows 24; a day more for late flushes).
pub const KEEP_HOURS: i64 = 48;
/// Bound parameters a Durable Object's SQLite accepts in one statement.
pub const MAX_BINDINGS: usize = 100;
/// The layout this module writes: 4 is one JSON row per hour and a marks table per day.
const LAYOUT: i64 = 4;
/// The prefix of a day's marks table.
const MARKS_PREFIX: &str = "marks_";

/// How long a dedupe mark must be kept after the flush that wrote it, given the retention of
/// the gates' storage (see the module's doc): the retention and the period of the retirement
/// moments (a day, or the retention when shorter), never less than [`MARKS_KEEP_FLOOR_MS`].
pub fn marks_keep_ms(retention_ms: i64) -> i64 {
    retention_ms
        .saturating_add(retention_ms.min(DAY_MS))
        .max(MARKS_KEEP_FLOOR_MS)
}

/// The marks table of a time's UTC day.
pub fn day_of(ms: i64) -> i64 {
    ms.div_euclid(DAY_MS)
}

/// True when the marks table of `day` may be dropped at `now_ms`: its newest mark, written
/// before the day's end, has been kept `keep_ms`.
pub fn marks_expired(day: i64, now_ms: i64, keep_ms: i64) -> bool {
    (day + 1).saturating_mul(DAY_MS).saturating_add(keep_ms) <= now_ms
}

fn marks_table(day: i64) -> String {
    format!("{MARKS_PREFIX}{day}")
}

/// The days that have a marks table, oldest first.
fn mark_days(sql: &impl Sql) -> Result<Vec<i64>, String> {
    let query =
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'marks\\_%' ESCAPE '\\'";
    let mut days: Vec<i64> = sql
        .run(query, vec![])?
        .iter()
        .filter_map(|r| text(r, "name").strip_prefix(MARKS_PREFIX)?.parse().ok())
        .collect();
    days.sort_unstable();
    Ok(days)
}

/// The highest sequence marked for `gate` over the tables of `days` (0 when none).
fn marked_seq(sql: &impl Sql, days: &[i64], gate: &str) -> Result<u64, String> {
    let mut highest = 0;
    for chunk in days.chunks(MAX_BINDINGS) {
        let query = chunk
            .iter()
            .map(|d| format!("SELECT seq FROM {} WHERE gate = ?", marks_table(*d)))
            .collect::<Vec<_>>()
            .join(" UNION ALL ");
        let params = vec![Param::Text(gate.to_string()); chunk.len()];
        let rows = sql.run(&format!("SELECT MAX(seq) AS seq FROM ({query})"), params)?;
        highest = highest.max(rows.first().map_or(0, |r| int(r, "seq").max(0) as u64));
    }
    Ok(highest)
}

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

/// Adds `add` into the stored rows of its hours: one row written per hour.
fn add_hours(sql: &impl Sql, add: BTreeMap<i64, Counts>) -> Result<(), String> {
    let hours: Vec<i64> = add.keys().copied().collect();
    let mut stored = load_hours(sql, Some(&hours))?;
    for (hour, counts) in add {
        let row = stored.entry(hour).or_default();
        for (name, n) in counts {
            *row.entry(name).or_default() += n;
        }
        let body = serde_json::to_string(row).map_err(|e| e.to_string())?;
        let query = "INSERT INTO tally (hour, body) VALUES (?, ?) ON CONFLICT(hour) DO UPDATE SET body = excluded.body";
        sql.run(query, vec![Param::Int(hour), Param::Text(body)])?;
    }
    Ok(())
}

/// Creates the tables if needed and migrates a shard of an earlier layout (once); `now_ms`
/// names the day table an earlier layout's marks become.
pub fn open(sql: &impl Sql, now_ms: i64) -> Result<(), String> {
    for ddl in [
        "CREATE TABLE IF NOT EXISTS tally (hour INTEGER PRIMARY KEY, body TEXT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS recent (seq INTEGER PRIMARY KEY AUTOINCREMENT, at_ms INTEGER NOT NULL, gate TEXT NOT NULL, name TEXT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL)",
    ] {
        sql.run(ddl, vec![])?;
    }
    let rows = sql.run("SELECT v FROM meta WHERE k = 'layout'", vec![])?;
    let layout = rows.first().map(|r| int(r, "v"));
    if layout.unwrap_or(0) >= LAYOUT {
        return Ok(());
    }
    // Nothing awaits between these statements at the edge, so they are stored together.
    let query = "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ('counts', 'seen', 'marks')";
    let rows = sql.run(query, vec![])?;
    let old: Vec<String> = rows.iter().map(|r| text(r, "name")).collect();
    if old.iter().any(|t| t == "counts") {
        if layout.is_none() {
            // Layout 1 added every count to hour -1 and to its bucket: what hour -1 holds
            // beyond the buckets still here is what the prunes took.
            let query = "UPDATE counts SET n = n - (SELECT COALESCE(SUM(b.n), 0) FROM counts AS b WHERE b.hour >= 0 AND b.name = counts.name) WHERE hour = -1";
            sql.run(query, vec![])?;
        }
        let mut by_hour: BTreeMap<i64, Counts> = BTreeMap::new();
        for r in sql.run("SELECT hour, name, n FROM counts", vec![])? {
            let hour = by_hour.entry(int(&r, "hour")).or_default();
            *hour.entry(text(&r, "name")).or_default() += int(&r, "n");
        }
        add_hours(sql, by_hour)?;
        sql.run("DROP TABLE counts", vec![])?;
    }
    // An earlier layout's marks become today's table as they are (a rename writes no row per
    // mark), so each is kept at least as long as a mark written now. Layout 3's `marks` has
    // the day tables' shape; layout 2's `seen` has a rowid and an age index: the index goes,
    // and until the day ends a mark written into it costs its key's index entry too.
    let today = marks_table(day_of(now_ms));
    let has = |t: &str| old.iter().any(|o| o == t);
    if has("marks") || has("seen") {
        sql.run("DROP INDEX IF EXISTS seen_by_age", vec![])?;
        let mut today_exists = mark_days(sql)?.contains(&day_of(now_ms));
        for from in ["marks", "seen"].into_iter().filter(|t| has(t)) {
            if std::mem::replace(&mut today_exists, true) {
                let query = format!("INSERT INTO {today} (gate, seq, at_ms) SELECT gate, seq, at_ms FROM {from} WHERE true ON CONFLICT(gate) DO UPDATE SET seq = MAX(seq, excluded.seq)");
                sql.run(&query, vec![])?;
                sql.run(&format!("DROP TABLE {from}"), vec![])?;
            } else {
                sql.run(&format!("ALTER TABLE {from} RENAME TO {today}"), vec![])?;
            }
        }
    }
    let query =
        "INSERT INTO meta (k, v) VALUES ('layout', ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v";
    sql.run(query, vec![Param::Int(LAYOUT)])?;
    Ok(())
}

/// When a flush also prunes: buckets older than [`KEEP_HOURS`] move into hour -1, and the
/// day tables of marks kept `marks_keep_ms` ([`marks_keep_ms`]; `None`, retention unknown:
/// none) are dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prune {
    pub marks_keep_ms: Option<i64>,
}

/// The days that have a marks table, as the caller last learned them: an object is its
/// database's only writer and [`add`] keeps this in step with what it creates and drops, so
/// it is read once per instance instead of once per flush. Start with `default()`.
#[derive(Debug, Default)]
pub struct MarkDays(Option<Vec<i64>>);

/// Counts `events` (a gate's only past the highest sequence seen from it, see
/// [`to_count`]), then prunes when asked ([`Prune`]).
pub fn add(
    sql: &impl Sql,
    known: &mut MarkDays,
    gate: Option<&str>,
    events: &[StatEvent],
    now_ms: i64,
    prune: Option<Prune>,
) -> Result<(), String> {
    // Taken while the statements run: a failure leaves it unknown, read again next time.
    let mut days = known.0.take().map_or_else(|| mark_days(sql), Ok)?;
    if count(sql, &days, gate, events, now_ms)? {
        days.push(day_of(now_ms));
    }
    if let Some(prune) = prune {
        prune_old(sql, &days, now_ms, prune)?;
        if let Some(keep) = prune.marks_keep_ms {
            days.retain(|d| !marks_expired(*d, now_ms, keep));
        }
    }
    known.0 = Some(days);
    Ok(())
}

/// Counts what is new in `events`; true when it created today's marks table.
fn count(
    sql: &impl Sql,
    days: &[i64],
    gate: Option<&str>,
    events: &[StatEvent],
    now_ms: i64,
) -> Result<bool, String> {
    let seen = gate.map(|g| marked_seq(sql, days, g)).transpose()?;
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
        let hour = counts.entry(hour_of(e.at_ms)).or_default();
        *hour.entry(e.name.clone()).or_default() += e.count as i64;
        highest = highest.max(e.seq);
    }
    let any_drops = !drops.is_empty();
    for chunk in drops.chunks(MAX_BINDINGS / 3) {
        let rows = vec!["(?, ?, ?)"; chunk.len()].join(", ");
        let query = format!("INSERT INTO recent (at_ms, gate, name) VALUES {rows}");
        sql.run(&query, chunk.iter().flatten().cloned().collect())?;
    }
    add_hours(sql, counts)?;
    // A flush of nothing new (a retry the shard had counted) writes no mark either.
    let mut created = false;
    if let (Some(g), true) = (gate, highest > seen.unwrap_or(0)) {
        let today = day_of(now_ms);
        let table = marks_table(today);
        if !days.contains(&today) {
            let query = format!("CREATE TABLE IF NOT EXISTS {table} (gate TEXT PRIMARY KEY, seq INTEGER NOT NULL, at_ms INTEGER NOT NULL) WITHOUT ROWID");
            sql.run(&query, vec![])?;
            created = true;
        }
        sql.run(
            &format!("INSERT INTO {table} (gate, seq, at_ms) VALUES (?, ?, ?) ON CONFLICT(gate) DO UPDATE SET seq = MAX(seq, excluded.seq), at_ms = excluded.at_ms"),
            vec![Param::Text(g.to_string()), Param::Int(highest as i64), Param::Int(now_ms)],
        )?;
    }
    if any_drops {
        // Cheap (the newest rows by primary key), and it keeps "recent" recent.
        let query = "DELETE FROM recent WHERE seq <= (SELECT MAX(seq) FROM recent) - ?";
        sql.run(query, vec![Param::Int(RECENT_DROPS)])?;
    }
    Ok(created)
}

/// Moves buckets older than [`KEEP_HOURS`] into hour -1, and drops the marks tables of `days`
/// whose marks have been kept long enough.
fn prune_old(sql: &impl Sql, days: &[i64], now_ms: i64, prune: Prune) -> Result<(), String> {
    let before = hour_of(now_ms) - KEEP_HOURS;
    let query = "SELECT hour, body FROM tally WHERE hour >= 0 AND hour < ?";
    let old = sql.run(query, vec![Param::Int(before)])?;
    if !old.is_empty() {
        let mut folded = Counts::new();
        for r in &old {
            for (name, n) in parse_body(&text(r, "body")) {
                *folded.entry(name).or_default() += n;
            }
        }
        // The fold and the delete go together (no await between them at the edge).
        add_hours(sql, BTreeMap::from([(-1, folded)]))?;
        let query = "DELETE FROM tally WHERE hour >= 0 AND hour < ?";
        sql.run(query, vec![Param::Int(before)])?;
    }
    if let Some(keep) = prune.marks_keep_ms {
        for day in days.iter().filter(|d| marks_expired(**d, now_ms, keep)) {
            let table = marks_table(*day);
            sql.run(&format!("DROP TABLE IF EXISTS {table}"), vec![])?;
        }
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
    let query = "SELECT at_ms, gate, name FROM recent ORDER BY seq DESC";
    let recent_drops = sql
        .run(query, vec![])?
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
    /// Its third field is what the object using it knows of its marks tables.
    struct Memory(
        rusqlite::Connection,
        std::cell::Cell<u64>,
        std::cell::RefCell<MarkDays>,
    );

    impl Memory {
        fn new() -> Memory {
            Memory(
                rusqlite::Connection::open_in_memory().unwrap(),
                std::cell::Cell::new(0),
                std::cell::RefCell::default(),
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
            let before = self.0.total_changes();
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
            self.1.set(self.1.get() + (self.0.total_changes() - before));
            Ok(out)
        }
    }

    /// [`super::add`] as a shard object calls it: one [`MarkDays`] over its life.
    fn add(
        db: &Memory,
        gate: Option<&str>,
        events: &[StatEvent],
        now_ms: i64,
        prune: Option<Prune>,
    ) -> Result<(), String> {
        super::add(db, &mut db.2.borrow_mut(), gate, events, now_ms, prune)
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
        open(&db, T0).unwrap();
        db
    }

    /// Prunes with marks kept the floor's two days.
    const PRUNE: Option<Prune> = Some(Prune {
        marks_keep_ms: Some(MARKS_KEEP_FLOOR_MS),
    });

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
        add(&db, Some("batches/a"), &events, T0, None).unwrap();
        assert_eq!(db.written(), 2, "one hour's row and the gate's mark");
        add(
            &db,
            Some("batches/b"),
            &[event(1, "deliveries", T0 + HOUR)],
            T0 + HOUR,
            None,
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
        add(&db, Some("batches/a"), &events, T0 + HOUR, None).unwrap();
        assert_eq!(db.written(), 0);
    }

    #[test]
    fn a_retried_flush_is_not_counted_twice() {
        let db = opened();
        let events = [
            event(1, "deliveries", T0),
            event(2, "duplicates_skipped", T0),
        ];
        add(&db, Some("batches/a"), &events, T0, None).unwrap();
        add(&db, Some("batches/a"), &events, T0, None).unwrap();
        let more = [
            event(2, "duplicates_skipped", T0),
            event(3, "duplicates_skipped", T0),
        ];
        add(&db, Some("batches/a"), &more, T0, None).unwrap();
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
            None,
        )
        .unwrap();
        add(
            &db,
            None,
            &[event(0, "deliveries", T0 + HOUR)],
            T0 + HOUR,
            None,
        )
        .unwrap();
        let later = T0 + (KEEP_HOURS + 1) * HOUR + 1;
        add(
            &db,
            Some("batches/b"),
            &[event(1, "deliveries", later)],
            later,
            PRUNE,
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
        add(&db, None, &[], even_later, PRUNE).unwrap();
        assert_eq!(total(&db, even_later, "deliveries"), 3);
        assert_eq!(pruned(&db), 2);
    }

    /// `/metrics` serves totals: a scrape after the shard pruned the buckets it counted
    /// from, days later, serves every counter at least as high as before.
    #[test]
    fn served_counters_never_go_back_when_the_shard_prunes() {
        use crate::telemetry::metrics::{render, Format};
        let db = opened();
        let events = [
            event(1, "deliveries", T0),
            event(2, "effect_parks", T0),
            event(3, "dropped_stale_update_time", T0),
        ];
        add(&db, Some("batches/a"), &events, T0, None).unwrap();
        add(&db, None, &[event(0, "duplicates_skipped", T0)], T0, None).unwrap();
        let served = |now: i64| -> Vec<(String, f64)> {
            let counts = read(&db, now, 24).unwrap();
            let page = render(&json!({ "total": counts.total }), Format::Text);
            page.lines()
                .filter(|l| !l.starts_with('#'))
                .filter_map(|l| {
                    let (name, value) = l.rsplit_once(' ')?;
                    Some((name.to_string(), value.parse().ok()?))
                })
                .collect()
        };
        let before = served(T0);
        let later = T0 + (KEEP_HOURS + 2) * HOUR;
        add(&db, None, &[], later, PRUNE).unwrap();
        let kept = db
            .run("SELECT hour FROM tally WHERE hour >= 0", vec![])
            .unwrap();
        assert!(kept.is_empty(), "every bucket was pruned: {kept:?}");
        let after = served(later);
        assert_eq!(before, after, "nothing moved back (or forward)");
        for want in [
            "gemini_once_deliveries_total",
            "gemini_once_effects_total{result=\"parked\"}",
            "gemini_once_dropped_total{reason=\"stale_update_time\"}",
            "gemini_once_duplicates_total",
        ] {
            assert!(
                after.iter().any(|(n, v)| n == want && *v == 1.0),
                "{want}: {after:?}"
            );
        }
    }

    #[test]
    fn a_shard_of_the_earlier_layout_is_migrated_once_and_keeps_its_totals() {
        let db = Memory::new();
        // Layout 1: every count in hour -1 (all time) and in its bucket; one bucket pruned.
        db.0.execute_batch(
            "CREATE TABLE counts (hour INTEGER NOT NULL, name TEXT NOT NULL, n INTEGER NOT NULL, PRIMARY KEY (hour, name));
             CREATE TABLE seen (gate TEXT PRIMARY KEY, seq INTEGER NOT NULL, at_ms INTEGER NOT NULL);
             INSERT INTO counts VALUES (-1, 'deliveries', 10), (-1, 'alerts', 1), (500000, 'deliveries', 3), (500001, 'deliveries', 4), (500001, 'alerts', 1);
             INSERT INTO seen VALUES ('batches/a', 1, 1800000000000);",
        )
        .unwrap();
        let now = 500_001 * HOUR;
        open(&db, now).unwrap();
        assert_eq!(total(&db, now, "deliveries"), 10);
        assert_eq!(total(&db, now, "alerts"), 1);
        open(&db, now).unwrap();
        assert_eq!(
            total(&db, now, "deliveries"),
            10,
            "a second open changes nothing"
        );
        add(&db, None, &[event(0, "deliveries", now)], now, None).unwrap();
        assert_eq!(total(&db, now, "deliveries"), 11);
        assert_eq!(read(&db, now, 24).unwrap().last_24h["deliveries"], 8);
        add(
            &db,
            Some("batches/a"),
            &[event(1, "alerts", now)],
            now,
            None,
        )
        .unwrap();
        assert_eq!(total(&db, now, "alerts"), 1, "its mark came along");
    }

    /// A shard of layout 2: a row per name and hour, marks in `seen` with an age index.
    fn layout_2() -> Memory {
        let db = Memory::new();
        db.0.execute_batch(
            "CREATE TABLE counts (hour INTEGER NOT NULL, name TEXT NOT NULL, n INTEGER NOT NULL, PRIMARY KEY (hour, name));
             CREATE TABLE seen (gate TEXT PRIMARY KEY, seq INTEGER NOT NULL, at_ms INTEGER NOT NULL);
             CREATE INDEX seen_by_age ON seen (at_ms);
             CREATE TABLE recent (seq INTEGER PRIMARY KEY AUTOINCREMENT, at_ms INTEGER NOT NULL, gate TEXT NOT NULL, name TEXT NOT NULL);
             CREATE TABLE meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL);
             INSERT INTO meta VALUES ('layout', 2);
             INSERT INTO counts VALUES (-1, 'deliveries', 6), (500000, 'deliveries', 3), (500001, 'deliveries', 4), (500001, 'alerts', 1);
             INSERT INTO seen VALUES ('batches/a', 2, 1800000000000);",
        )
        .unwrap();
        db
    }

    fn schema(db: &Memory) -> Vec<String> {
        db.run(
            "SELECT name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY name",
            vec![],
        )
        .unwrap()
        .iter()
        .map(|r| text(r, "name"))
        .collect()
    }

    #[test]
    fn a_shard_of_layout_2_is_migrated_once_with_its_totals_and_marks() {
        let db = layout_2();
        let now = 500_001 * HOUR;
        open(&db, now).unwrap();
        assert_eq!(total(&db, now, "deliveries"), 13);
        assert_eq!(total(&db, now, "alerts"), 1);
        assert_eq!(read(&db, now, 24).unwrap().last_24h["deliveries"], 7);
        let today = marks_table(day_of(now));
        assert_eq!(schema(&db), [today.as_str(), "meta", "recent", "tally"]);
        // The mark came along: a flush of what batches/a had sent counts only what is new.
        let events = [event(2, "deliveries", now), event(3, "deliveries", now)];
        add(&db, Some("batches/a"), &events, now, None).unwrap();
        assert_eq!(total(&db, now, "deliveries"), 14);
        open(&db, now).unwrap();
        assert_eq!(
            total(&db, now, "deliveries"),
            14,
            "a second open changes nothing"
        );
        // The old marks go with the day they were moved into, and the totals stay.
        let later = (day_of(now) + 1) * DAY_MS + MARKS_KEEP_FLOOR_MS;
        add(&db, None, &[], later, PRUNE).unwrap();
        assert_eq!(schema(&db), ["meta", "recent", "tally"]);
        assert_eq!(total(&db, later, "deliveries"), 14);
        assert_eq!(total(&db, later, "alerts"), 1);
    }

    #[test]
    fn a_shard_of_layout_3_is_migrated_once_and_its_marks_table_kept_as_today_s() {
        let db = layout_2();
        let then = 500_001 * HOUR;
        // Layout 3 as its own code left it (its statements, from the layout-2 shard above).
        db.0.execute_batch(
            "CREATE TABLE tally (hour INTEGER PRIMARY KEY, body TEXT NOT NULL);
             CREATE TABLE marks (gate TEXT PRIMARY KEY, seq INTEGER NOT NULL, at_ms INTEGER NOT NULL) WITHOUT ROWID;
             INSERT INTO tally VALUES (-1, '{\"deliveries\":6}'), (500000, '{\"deliveries\":3}'), (500001, '{\"alerts\":1,\"deliveries\":4}');
             INSERT INTO marks SELECT gate, seq, at_ms FROM seen;
             DROP TABLE counts; DROP TABLE seen;
             UPDATE meta SET v = 3 WHERE k = 'layout';",
        )
        .unwrap();
        let now = then + 30 * HOUR;
        open(&db, now).unwrap();
        assert_eq!(total(&db, now, "deliveries"), 13);
        assert_eq!(total(&db, now, "alerts"), 1);
        let today = marks_table(day_of(now));
        assert_eq!(schema(&db), [today.as_str(), "meta", "recent", "tally"]);
        db.written();
        let events = [event(2, "deliveries", now), event(3, "deliveries", now)];
        add(&db, Some("batches/a"), &events, now, None).unwrap();
        assert_eq!(total(&db, now, "deliveries"), 14, "only seq 3 is new");
        assert_eq!(db.written(), 2, "the hour's row and the mark");
    }

    #[test]
    fn marks_are_kept_the_retention_and_at_least_two_days_after_their_flush() {
        let retention = 14 * DAY_MS;
        assert_eq!(
            marks_keep_ms(retention),
            retention + DAY_MS,
            "and a moment's period"
        );
        assert_eq!(
            marks_keep_ms(5_000),
            MARKS_KEEP_FLOOR_MS,
            "a test's retention"
        );
        // A day's table goes when its newest possible mark has been kept that long.
        let day = day_of(T0);
        let end = (day + 1) * DAY_MS;
        assert!(!marks_expired(day, end + retention - 1, retention));
        assert!(marks_expired(day, end + retention, retention));
        assert!(
            !marks_expired(day, T0 + retention, retention),
            "never early"
        );
        assert!(
            !marks_expired(i64::MAX / DAY_MS, 0, i64::MAX),
            "no overflow"
        );
    }

    #[test]
    fn marks_are_forgotten_a_day_at_a_time_and_counts_stay() {
        let db = opened();
        let keep = MARKS_KEEP_FLOOR_MS;
        let prune = Some(Prune {
            marks_keep_ms: Some(keep),
        });
        add(
            &db,
            Some("batches/a"),
            &[event(1, "deliveries", T0)],
            T0,
            None,
        )
        .unwrap();
        let next_day = T0 + DAY_MS;
        add(
            &db,
            Some("batches/b"),
            &[event(1, "deliveries", next_day)],
            next_day,
            None,
        )
        .unwrap();
        let end = (day_of(T0) + 1) * DAY_MS;
        add(&db, None, &[], end + keep - 1, prune).unwrap();
        assert_eq!(mark_days(&db).unwrap(), [day_of(T0), day_of(next_day)]);
        db.written();
        add(&db, None, &[], end + keep, prune).unwrap();
        assert_eq!(mark_days(&db).unwrap(), [day_of(next_day)]);
        assert_eq!(
            db.written(),
            0,
            "a day's marks go with their table, no row deleted one by one"
        );
        // Unknown retention: nothing is forgotten.
        add(
            &db,
            None,
            &[],
            next_day + 100 * DAY_MS,
            Some(Prune {
                marks_keep_ms: None,
            }),
        )
        .unwrap();
        assert_eq!(mark_days(&db).unwrap(), [day_of(next_day)]);
        assert_eq!(total(&db, T0, "deliveries"), 2, "counts stay");
    }

    #[test]
    fn a_gate_s_mark_in_an_earlier_day_still_dedupes_and_the_new_one_goes_in_today_s() {
        let db = opened();
        let events = [
            event(1, "deliveries", T0),
            event(2, "settled_by_webhook", T0),
        ];
        add(&db, Some("batches/a"), &events, T0, None).unwrap();
        let later = T0 + 3 * DAY_MS;
        let mut more = events.to_vec();
        more.push(event(3, "duplicates_skipped", later));
        db.written();
        add(&db, Some("batches/a"), &more, later, None).unwrap();
        assert_eq!(
            db.written(),
            2,
            "a new hour's row, and the mark in today's table"
        );
        add(&db, Some("batches/a"), &more, later, None).unwrap();
        assert_eq!(db.written(), 0, "a retry spanning both days counts nothing");
        assert_eq!(total(&db, later, "deliveries"), 1);
        assert_eq!(total(&db, later, "duplicates_skipped"), 1);
        assert_eq!(mark_days(&db).unwrap(), [day_of(T0), day_of(later)]);
    }

    #[test]
    fn a_flush_of_many_names_stays_within_the_binding_limit() {
        let db = opened();
        let events: Vec<StatEvent> = (0..40)
            .map(|i| event(0, &format!("rejected_reason_{i}"), T0))
            .collect();
        add(&db, None, &events, T0, None).unwrap();
        add(&db, None, &events, T0, None).unwrap();
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
                None,
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
