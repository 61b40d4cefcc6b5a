//! `/v1/stats`: the StatsShard Durable Objects, the per-isolate rejection counters, and the
//! read that sums them.
//!
//! Storage of a shard (SQLite): `counts(hour, name, n)` with hour -1 holding totals since the
//! shard's storage was created and other hours the last day's buckets (older ones pruned);
//! `seen(gate, seq, at_ms)` the highest event sequence counted per operation, so a gate's
//! retried flush is never counted twice; `recent(at_ms, gate, name)` the newest
//! [`RECENT_DROPS`] dropped events, for the dashboard. A read returns the totals, the last
//! day's sums and its hourly buckets (the dashboard's trend). Guarantees: see [`crate::stats`].

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{json, Value};
use worker::SqlStorageValue;
use worker::{durable_object, Context, Date, DurableObject, Env, Request, Response, Result, State};

use crate::gate_protocol::{LeaseCommand, LeaseReply};
use crate::stats::{
    hour_of, hourly_series, merge, merge_hourly, prune_due, to_count, Hourly, RecentDrop,
    ShardCommand, ShardCounts, StatEvent, Tally, SHARDS, TREND_HOURS,
};

use crate::log_event::LogEvent;

use super::usage_meter::Meter;
use super::EdgeError;
use super::{load_config, log, post_json};
use crate::usage::Invocation;

/// The shard binding.
pub const STATS_BINDING: &str = "STATS";
/// Counts kept at the edge (rejections, duplicates answered from memory) are flushed at most
/// this often per isolate, and at least as often as `STATS_FLUSH_SECONDS` asks (1 s at least).
const EDGE_FLUSH_MAX_MS: i64 = 10_000;
/// Dropped events kept per shard for "recently dropped".
const RECENT_DROPS: i64 = 50;
/// Operations whose dedupe mark is older than this are pruned (past any gate's life).
const SEEN_KEEP_MS: i64 = 400 * 86_400_000;

thread_local! {
    /// This isolate's counts not yet flushed, and when it last flushed.
    static EDGE_COUNTS: RefCell<(Tally, i64)> = const { RefCell::new((Tally::new(), 0)) };
}

/// Counts an event answered at the edge without a gate (a duplicate of a terminal outcome)
/// in this isolate's memory, flushed with the rejections. An isolate evicted before its
/// flush loses these counts, never state (as a gate's settled-duplicate counts).
pub fn count_at_edge(name: &str) {
    EDGE_COUNTS.with(|r| *r.borrow_mut().0.entry(name.to_string()).or_default() += 1);
}

/// Counts a rejected request in this isolate's memory (no storage round trip). True for the
/// first of its reason since the last flush: only that one is logged in full, and the flush
/// logs the counts as one `rejected_summary` line, so a flood of forged requests costs a
/// counter each, not a log line each (the log line was most of a rejection's CPU).
pub fn count_rejected(reason: &str) -> bool {
    EDGE_COUNTS.with(|r| {
        let mut r = r.borrow_mut();
        let n = r.0.entry(format!("rejected_{reason}")).or_default();
        *n += 1;
        *n == 1
    })
}

/// Flushes this isolate's edge counts in the background, at most every `flush_ms` (capped at
/// [`EDGE_FLUSH_MAX_MS`], at least a second); rejections are logged as one summary line.
pub fn flush_edge_counts_later(env: &Env, ctx: &Context, now_ms: i64, flush_ms: i64) {
    let every = flush_ms.clamp(1_000, EDGE_FLUSH_MAX_MS);
    let batch = EDGE_COUNTS.with(|r| {
        let mut r = r.borrow_mut();
        if r.0.is_empty() || now_ms - r.1 < every {
            return None;
        }
        r.1 = now_ms;
        Some(std::mem::take(&mut r.0))
    });
    let Some(batch) = batch else { return };
    let rejected: Tally = batch
        .iter()
        .filter(|(name, _)| name.starts_with("rejected_"))
        .map(|(name, n)| (name.clone(), *n))
        .collect();
    if !rejected.is_empty() {
        log(LogEvent::RejectedSummary.line(json!({"counts": rejected})));
    }
    let events: Vec<StatEvent> = batch
        .into_iter()
        .map(|(name, count)| StatEvent {
            seq: 0,
            name,
            at_ms: now_ms,
            count,
        })
        .collect();
    let shard = (now_ms.rem_euclid(i64::from(SHARDS))) as u32;
    let env = env.clone();
    ctx.wait_until(async move {
        if let Err(e) = add(&env, shard, None, events).await {
            log(json!({"event": "stats_flush_failed", "error": e}));
        }
    });
}

/// Sends counted events to shard `shard`.
pub async fn add(
    env: &Env,
    shard: u32,
    gate: Option<String>,
    events: Vec<StatEvent>,
) -> std::result::Result<(), EdgeError> {
    let stub = shard_stub(env, shard)?;
    let _: Value = post_json(&stub, &ShardCommand::Add { gate, events }).await?;
    Ok(())
}

fn shard_stub(env: &Env, shard: u32) -> std::result::Result<super::ObjectStub, EdgeError> {
    super::stub_for(env, STATS_BINDING, &format!("stats-{shard}"))
}

/// Sums every shard and adds the hourly trend, the last reconciliation pass and, when
/// `webhook_name` is configured, what the passes know of the Gemini webhook's state.
pub async fn read(env: &Env, webhook_name: Option<&str>) -> std::result::Result<Value, EdgeError> {
    let mut total = Tally::new();
    let mut day = Tally::new();
    let mut hourly = Hourly::new();
    let mut drops = Vec::new();
    for shard in 0..SHARDS {
        let counts: ShardCounts = post_json(&shard_stub(env, shard)?, &ShardCommand::Read).await?;
        merge(&mut total, &counts.total);
        merge(&mut day, &counts.last_24h);
        merge_hourly(&mut hourly, &counts.hourly);
        drops.extend(counts.recent_drops);
    }
    drops.sort_by_key(|d| std::cmp::Reverse(d.at_ms));
    drops.truncate(RECENT_DROPS as usize);
    let drops: Vec<Value> = drops
        .iter()
        .map(|d| json!({"at": crate::timestamp::format_rfc3339(d.at_ms), "key": d.key, "reason": d.reason}))
        .collect();
    let lease = super::stub_for(
        env,
        super::reconcile_pass::LEASE_BINDING,
        super::lease_object::LEASE_NAME,
    )?;
    let (last_pass, webhook) = match post_json::<_, LeaseReply>(&lease, &LeaseCommand::Status)
        .await?
    {
        LeaseReply::State { last_pass, lease } => (
            json!({"last": last_pass, "completed_passes": lease.completed_passes}),
            // The lease keeps only the state last alerted on (none while it is enabled or
            // not yet checked): the passes do not record when they last saw it enabled.
            webhook_name
                .map(|name| json!({"name": name, "alerted_state": lease.webhook_alerted_state})),
        ),
        _ => (Value::Null, None),
    };
    let hourly = hourly_series(&hourly, super::now_ms());
    Ok(
        json!({"total": total, "last_24h": day, "hourly": hourly, "recent_drops": drops,
        "reconcile": last_pass, "gemini_webhook": webhook}),
    )
}

/// One of [`SHARDS`] counter objects.
#[durable_object]
pub struct StatsShard {
    state: State,
    /// When this instance last pruned old buckets and dedupe marks: at most hourly, because
    /// `seen` holds a row per operation ever counted and pruning it on every flush made each
    /// flush's cost grow with the shard's history.
    pruned_at_ms: Cell<i64>,
    meter: Meter,
}

#[derive(Deserialize)]
struct CountRow {
    name: String,
    n: f64,
}

#[derive(Deserialize)]
struct SeqRow {
    seq: f64,
}

impl DurableObject for StatsShard {
    fn new(state: State, env: Env) -> Self {
        let sql = state.storage().sql();
        let meter = Meter::default();
        meter.begin(load_config(&env).is_ok_and(|c| c.usage_log));
        for ddl in [
            "CREATE TABLE IF NOT EXISTS counts (hour INTEGER NOT NULL, name TEXT NOT NULL, n INTEGER NOT NULL, PRIMARY KEY (hour, name))",
            "CREATE TABLE IF NOT EXISTS seen (gate TEXT PRIMARY KEY, seq INTEGER NOT NULL, at_ms INTEGER NOT NULL)",
            "CREATE TABLE IF NOT EXISTS recent (seq INTEGER PRIMARY KEY AUTOINCREMENT, at_ms INTEGER NOT NULL, gate TEXT NOT NULL, name TEXT NOT NULL)",
            "CREATE INDEX IF NOT EXISTS seen_by_age ON seen (at_ms)",
        ] {
            if let Err(e) = meter.exec(&sql, ddl, None) {
                log(json!({"event": "stats_schema_error", "error": e.to_string()}));
            }
        }
        Self {
            state,
            pruned_at_ms: Cell::new(0),
            meter,
        }
    }

    async fn fetch(&self, req: Request) -> Result<Response> {
        let started = self.meter.start();
        let answer = self.handle(req).await;
        self.meter.end(
            "stats_shard",
            Invocation::Fetch,
            started,
            &self.state.storage().sql(),
        );
        answer
    }
}

/// Bound parameters a Durable Object's SQLite accepts in one statement.
const MAX_BINDINGS: usize = 100;

impl StatsShard {
    /// Inserts `rows` of three values each with `head` (`INSERT ... VALUES `) and `tail` (an
    /// upsert clause), as many rows per statement as [`MAX_BINDINGS`] allows.
    fn insert_rows(
        &self,
        sql: &worker::SqlStorage,
        head: &str,
        tail: &str,
        rows: Vec<[SqlStorageValue; 3]>,
    ) -> Result<()> {
        for chunk in rows.chunks(MAX_BINDINGS / 3) {
            let mut query = String::from(head);
            for i in 0..chunk.len() {
                query.push_str(if i == 0 { "(?, ?, ?)" } else { ", (?, ?, ?)" });
            }
            query.push_str(tail);
            let bindings: Vec<SqlStorageValue> = chunk.iter().flatten().cloned().collect();
            self.meter.exec(sql, &query, bindings)?;
        }
        Ok(())
    }

    async fn handle(&self, mut req: Request) -> Result<Response> {
        let command: ShardCommand = match req.json().await {
            Ok(c) => c,
            Err(e) => {
                return EdgeError::BadRequest(format!("bad stats command: {e}")).into_response()
            }
        };
        let now = Date::now().as_millis() as i64;
        let sql = self.state.storage().sql();
        match command {
            ShardCommand::Add { gate, events } => {
                let seen = match &gate {
                    Some(g) => Some(
                        self.meter
                            .rows::<SeqRow>(
                                &sql,
                                "SELECT seq FROM seen WHERE gate = ?",
                                vec![g.clone().into()],
                            )?
                            .first()
                            .map_or(0, |r| r.seq as u64),
                    ),
                    None => None,
                };
                let mut counts: BTreeMap<(i64, String), i64> = BTreeMap::new();
                let mut drops: Vec<[SqlStorageValue; 3]> = Vec::new();
                let mut highest = seen.unwrap_or(0);
                for e in to_count(&events, seen) {
                    if let (Some(g), Some(reason)) = (&gate, e.name.strip_prefix("dropped_")) {
                        drops.push([e.at_ms.into(), g.clone().into(), reason.to_string().into()]);
                    }
                    let n = e.count as i64;
                    *counts.entry((-1, e.name.clone())).or_default() += n;
                    *counts
                        .entry((hour_of(e.at_ms), e.name.clone()))
                        .or_default() += n;
                    highest = highest.max(e.seq);
                }
                // Every row in as few statements as the binding limit allows (a flush of a
                // completion's ~3 counters is one statement, not six).
                self.insert_rows(
                    &sql,
                    "INSERT INTO recent (at_ms, gate, name) VALUES ",
                    "",
                    drops,
                )?;
                self.insert_rows(
                    &sql,
                    "INSERT INTO counts (hour, name, n) VALUES ",
                    " ON CONFLICT(hour, name) DO UPDATE SET n = n + excluded.n",
                    counts
                        .into_iter()
                        .map(|((hour, name), n)| [hour.into(), name.into(), n.into()])
                        .collect(),
                )?;
                if let Some(g) = gate {
                    self.meter.exec(
                        &sql,
                        "INSERT INTO seen (gate, seq, at_ms) VALUES (?, ?, ?) ON CONFLICT(gate) DO UPDATE SET seq = MAX(seq, excluded.seq), at_ms = excluded.at_ms",
                        vec![g.into(), (highest as i64).into(), now.into()],
                    )?;
                }
                if prune_due(now, self.pruned_at_ms.get()) {
                    self.pruned_at_ms.set(now);
                    self.meter.exec(
                        &sql,
                        "DELETE FROM counts WHERE hour >= 0 AND hour < ?",
                        vec![(hour_of(now) - 48).into()],
                    )?;
                    self.meter.exec(
                        &sql,
                        "DELETE FROM seen WHERE at_ms < ?",
                        vec![(now - SEEN_KEEP_MS).into()],
                    )?;
                }
                // Cheap (the newest rows by primary key), and it keeps "recent" recent.
                if events.iter().any(|e| e.name.starts_with("dropped_")) {
                    self.meter.exec(
                        &sql,
                        "DELETE FROM recent WHERE seq <= (SELECT MAX(seq) FROM recent) - ?",
                        vec![RECENT_DROPS.into()],
                    )?;
                }
                Response::from_json(&json!({"ok": true}))
            }
            ShardCommand::Read => {
                let total: Vec<CountRow> =
                    self.meter
                        .rows(&sql, "SELECT name, n FROM counts WHERE hour = -1", None)?;
                let day: Vec<CountRow> = self.meter.rows(
                    &sql,
                    "SELECT name, SUM(n) AS n FROM counts WHERE hour > ? GROUP BY name",
                    vec![(hour_of(now) - 24).into()],
                )?;
                let tally = |rows: Vec<CountRow>| {
                    rows.into_iter()
                        .map(|r| (r.name, r.n as u64))
                        .collect::<Tally>()
                };
                #[derive(Deserialize)]
                struct HourRow {
                    hour: f64,
                    name: String,
                    n: f64,
                }
                let rows: Vec<HourRow> = self.meter.rows(
                    &sql,
                    "SELECT hour, name, n FROM counts WHERE hour > ?",
                    vec![(hour_of(now) - TREND_HOURS).into()],
                )?;
                let mut hourly = Hourly::new();
                for r in rows {
                    *hourly
                        .entry(r.hour as i64)
                        .or_default()
                        .entry(r.name)
                        .or_default() += r.n as u64;
                }
                #[derive(Deserialize)]
                struct DropRow {
                    at_ms: f64,
                    gate: String,
                    name: String,
                }
                let recent: Vec<DropRow> = self.meter.rows(
                    &sql,
                    "SELECT at_ms, gate, name FROM recent ORDER BY seq DESC",
                    None,
                )?;
                Response::from_json(&ShardCounts {
                    total: tally(total),
                    last_24h: tally(day),
                    recent_drops: recent
                        .into_iter()
                        .map(|r| RecentDrop {
                            at_ms: r.at_ms as i64,
                            key: r.gate,
                            reason: r.name,
                        })
                        .collect(),
                    hourly,
                })
            }
        }
    }
}
