//! `/v1/stats`: the StatsShard Durable Objects, the per-isolate rejection counters, and the
//! read that sums them.
//!
//! Storage of a shard (SQLite): its tables and statements are [`crate::telemetry::shard_store`]'s (hour
//! buckets and the sum of the pruned ones, dedupe marks per operation, recent drops); this
//! object runs them on its database, counted by its meter, and prunes at most hourly, keeping
//! dedupe marks as long as the configured retention asks ([`shard_store::marks_keep_ms`]). A read
//! returns the totals, the last day's sums and its hourly buckets (the dashboard's trend).
//! Guarantees: see [`crate::telemetry::counters`] and [`crate::telemetry::shard_store`].

use std::cell::{Cell, RefCell};
use std::thread::LocalKey;
use std::time::Duration;

use serde_json::{json, Value};
use worker::{
    durable_object, Context, Delay, DurableObject, Env, Request, Response, Result, SqlStorage,
    SqlStorageValue, State,
};

use crate::reconciliation::lease_protocol::{LeaseCommand, LeaseReply};
use crate::telemetry::counters::{
    hourly_series, merge, merge_hourly, prune_due, Hourly, ShardCommand, ShardCounts, StatEvent,
    Tally, SHARDS, TREND_HOURS,
};
use crate::telemetry::isolate_tally::IsolateTally;
use crate::telemetry::shard_store::{self, MarkDays, Param, Prune, Row, Sql, RECENT_DROPS};
use crate::telemetry::worker_log::WorkerLog;

use crate::edge::error::bad_command;
use crate::edge::objects::call::{call_lease, post_json, stub_for, ObjectStub};
use crate::edge::objects::usage_meter::Meter;
use crate::edge::runtime::{load_config, log, now_ms};
use crate::refusal::Refusal;
use crate::telemetry::usage::Invocation;

/// The shard binding.
pub const STATS_BINDING: &str = "STATS";
/// Counts kept at the edge (rejections, duplicates answered from memory) are flushed at most
/// this often per isolate, and at least as often as `STATS_FLUSH_SECONDS` asks (1 s at least).
const EDGE_FLUSH_MAX_MS: i64 = 10_000;

thread_local! {
    /// This isolate's edge counts (rejections, duplicates answered from memory, status calls of
    /// passes and queue consumers) not yet sent.
    static EDGE_COUNTS: RefCell<IsolateTally> = const { RefCell::new(IsolateTally::new()) };
    /// The counts gates in this isolate handed over and not yet sent (see [`hand_over`]).
    static GATE_COUNTS: RefCell<IsolateTally> = const { RefCell::new(IsolateTally::new()) };
}

/// Counts an event answered at the edge without a gate (a duplicate of a terminal outcome, a
/// status call of a pass or a queue consumer) in this isolate's memory, flushed with the
/// rejections. An isolate evicted before its flush loses these counts, never state.
pub fn count_at_edge(name: &str) {
    EDGE_COUNTS.with(|t| t.borrow_mut().add(name, now_ms(), 1));
}

/// Counts a rejected request in this isolate's memory (no storage round trip). True for the
/// first of its reason since the last flush (in the hour): only that one is logged in full,
/// and the flush logs the counts as one `rejected_summary` line, so a flood of forged
/// requests costs a counter each, not a log line each (a log line costs more than the rest
/// of a rejection).
pub fn count_rejected(reason: &str) -> bool {
    let name = format!("rejected_{reason}");
    EDGE_COUNTS.with(|t| t.borrow_mut().add(&name, now_ms(), 1) == 1)
}

/// Flushes this isolate's edge counts in the background, once per `flush_ms` window (capped at
/// [`EDGE_FLUSH_MAX_MS`], at least 1 s): now when the window has passed, else by one timer in
/// this request's `waitUntil` for its end (if none is set), so counts reach the shards whether
/// or not another request comes; the answer never waits for it.
pub fn flush_edge_counts_later(env: &Env, ctx: &Context, now_ms: i64, flush_ms: i64) {
    let every = flush_ms.clamp(1_000, EDGE_FLUSH_MAX_MS);
    let (env, due) = (env.clone(), take_edge_counts(now_ms, every));
    if let Some(batch) = due {
        ctx.wait_until(async move { send_tally(&env, &EDGE_COUNTS, batch, now_ms).await });
    } else if let Some(delay) = EDGE_COUNTS.with(|t| t.borrow_mut().schedule(now_ms, every)) {
        ctx.wait_until(send_later(env, &EDGE_COUNTS, delay));
    }
}

/// Waits `delay_ms`, then sends what `tally` still holds (a due send may have taken it all).
async fn send_later(env: Env, tally: &'static LocalKey<RefCell<IsolateTally>>, delay_ms: i64) {
    Delay::from(Duration::from_millis(delay_ms.max(0) as u64)).await;
    let now = now_ms();
    let batch = tally.with(|t| t.borrow_mut().take_scheduled(now));
    if !batch.is_empty() {
        log_rejected(&batch);
        send_tally(&env, tally, batch, now).await;
    }
}

/// Sends this isolate's edge counts now, whatever the window: the end of a cron pass or of a
/// queue batch (seldom: one shard call each is a small share of their own status calls).
pub async fn flush_edge_counts_now(env: &Env, now_ms: i64) {
    if let Some(batch) = take_edge_counts(now_ms, 0) {
        send_tally(env, &EDGE_COUNTS, batch, now_ms).await;
    }
}

/// The edge counts to send, when the window `every_ms` since the last send has passed.
fn take_edge_counts(now_ms: i64, every_ms: i64) -> Option<Vec<StatEvent>> {
    let batch = EDGE_COUNTS.with(|t| t.borrow_mut().take_due(now_ms, every_ms))?;
    log_rejected(&batch);
    Some(batch)
}

/// Logs the rejections among a batch of edge counts as one `rejected_summary` line.
fn log_rejected(batch: &[StatEvent]) {
    let mut rejected = Tally::new();
    for e in batch.iter().filter(|e| e.name.starts_with("rejected_")) {
        *rejected.entry(e.name.clone()).or_default() += e.count;
    }
    if !rejected.is_empty() {
        log(WorkerLog::RejectedSummary { counts: rejected }.to_value());
    }
}

/// Hands a gate's counted events (stored in its record until now) to this isolate's tally,
/// which sends the counts of every gate here in one shard call per `every_ms`: at once
/// (awaited) when the window since the last send has passed, else by one send scheduled in
/// `state`'s background for the window's end (if none is). The gate's record forgets them
/// either way: from here they are as exact as the isolate's life (see
/// [`crate::telemetry::isolate_tally`]). The gate's `meter` counts the shard call, or how long
/// a scheduled send holds the object in memory.
pub async fn hand_over(
    state: &State,
    meter: &Meter,
    env: &Env,
    events: &[StatEvent],
    now_ms: i64,
    every_ms: i64,
) {
    let due = GATE_COUNTS.with(|t| {
        let mut t = t.borrow_mut();
        t.add_events(events);
        t.take_due(now_ms, every_ms)
    });
    if let Some(batch) = due {
        send_tally(env, &GATE_COUNTS, batch, now_ms).await;
        return meter.add(|u| u.object_calls += 1);
    }
    if let Some(delay) = GATE_COUNTS.with(|t| t.borrow_mut().schedule(now_ms, every_ms)) {
        meter.add(|u| u.held_ms += delay.max(0) as u64);
        state.wait_until(send_later(env.clone(), &GATE_COUNTS, delay));
    }
}

/// Sends a tally's batch to a shard (any: an isolate's counts are not one operation's); a
/// batch that fails goes back into `tally`, to go with its next send.
async fn send_tally(
    env: &Env,
    tally: &'static LocalKey<RefCell<IsolateTally>>,
    batch: Vec<StatEvent>,
    now_ms: i64,
) {
    let shard = (now_ms.rem_euclid(i64::from(SHARDS))) as u32;
    if let Err(e) = add(env, shard, None, batch.clone()).await {
        tally.with(|t| t.borrow_mut().add_events(&batch));
        let error = e.to_string();
        log(WorkerLog::StatsFlushFailed { error }.to_value());
    }
}

/// Sends counted events to shard `shard`.
pub async fn add(
    env: &Env,
    shard: u32,
    gate: Option<String>,
    events: Vec<StatEvent>,
) -> std::result::Result<(), Refusal> {
    let stub = shard_stub(env, shard)?;
    let _: Value = post_json(&stub, &ShardCommand::Add { gate, events }).await?;
    Ok(())
}

fn shard_stub(env: &Env, shard: u32) -> std::result::Result<ObjectStub, Refusal> {
    stub_for(env, STATS_BINDING, &format!("stats-{shard}"))
}

/// Sums every shard and adds the hourly trend, the last reconciliation pass and, when
/// `webhook_name` is configured, what the passes know of the Gemini webhook's state.
pub async fn read(env: &Env, webhook_name: Option<&str>) -> std::result::Result<Value, Refusal> {
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
    let (last_pass, webhook) = match call_lease(env, &LeaseCommand::Status).await? {
        LeaseReply::State { last_pass, lease } => (
            json!({"last": last_pass, "completed_passes": lease.completed_passes,
                "last_complete": (lease.last_complete_ms > 0)
                    .then(|| crate::timestamp::format_rfc3339(lease.last_complete_ms))}),
            // The lease keeps only the state last alerted on (none while it is enabled or
            // not yet checked): the passes do not record when they last saw it enabled.
            webhook_name
                .map(|name| json!({"name": name, "alerted_state": lease.webhook_alerted_state})),
        ),
        _ => (Value::Null, None),
    };
    let hourly = hourly_series(&hourly, now_ms());
    let stats = json!({"total": total, "last_24h": day, "hourly": hourly, "recent_drops": drops,
        "reconcile": last_pass, "gemini_webhook": webhook});
    Ok(stats)
}

/// One of [`SHARDS`] counter objects.
#[durable_object]
pub struct StatsShard {
    state: State,
    /// When this instance last pruned old buckets and dedupe marks: at most hourly, because
    /// pruning reads the old buckets and the list of marks tables, work a flush need not
    /// repeat.
    pruned_at_ms: Cell<i64>,
    /// How long dedupe marks are kept, from the gates' retention (`None` when the
    /// configuration does not load: no mark is forgotten then).
    marks_keep_ms: Option<i64>,
    /// Its marks tables, read once per instance (see [`MarkDays`]).
    mark_days: RefCell<MarkDays>,
    meter: Meter,
}

/// The shard's database as [`crate::telemetry::shard_store`] sees it, each statement counted by the meter.
struct ShardSql<'a> {
    meter: &'a Meter,
    sql: SqlStorage,
}

impl Sql for ShardSql<'_> {
    fn run(&self, query: &str, params: Vec<Param>) -> std::result::Result<Vec<Row>, String> {
        let bindings: Vec<SqlStorageValue> = params
            .into_iter()
            .map(|p| match p {
                Param::Int(n) => n.into(),
                Param::Text(s) => s.into(),
            })
            .collect();
        self.meter
            .rows(&self.sql, query, bindings)
            .map_err(|e| e.to_string())
    }
}

impl DurableObject for StatsShard {
    fn new(state: State, env: Env) -> Self {
        let meter = Meter::default();
        let config = load_config(&env).ok();
        meter.begin(config.as_ref().is_some_and(|c| c.usage_log));
        let shard = Self {
            state,
            pruned_at_ms: Cell::new(0),
            marks_keep_ms: config.map(|c| shard_store::marks_keep_ms(c.retention_ms())),
            mark_days: RefCell::default(),
            meter,
        };
        if let Err(e) = shard_store::open(&shard.db(), now_ms()) {
            let error = e.to_string();
            log(WorkerLog::StatsSchemaError { error }.to_value());
        }
        shard
    }

    async fn fetch(&self, req: Request) -> Result<Response> {
        let started = now_ms();
        let answer = self.handle(req).await;
        let sql = self.state.storage().sql();
        self.meter
            .end("stats_shard", Invocation::Fetch, started, &sql);
        answer
    }
}

impl StatsShard {
    fn db(&self) -> ShardSql<'_> {
        ShardSql {
            meter: &self.meter,
            sql: self.state.storage().sql(),
        }
    }

    async fn handle(&self, mut req: Request) -> Result<Response> {
        let command: ShardCommand = match req.json().await {
            Ok(c) => c,
            Err(e) => return bad_command("stats command", e),
        };
        let now = now_ms();
        let db = self.db();
        let answer = match command {
            ShardCommand::Add { gate, events } => {
                let prune = prune_due(now, self.pruned_at_ms.get()).then_some(Prune {
                    marks_keep_ms: self.marks_keep_ms,
                });
                if prune.is_some() {
                    self.pruned_at_ms.set(now);
                }
                let mut days = self.mark_days.borrow_mut();
                shard_store::add(&db, &mut days, gate.as_deref(), &events, now, prune)
                    .map(|()| json!({"ok": true}))
            }
            ShardCommand::Read => shard_store::read(&db, now, TREND_HOURS)
                .and_then(|counts| serde_json::to_value(counts).map_err(|e| e.to_string())),
        };
        let body = answer.map_err(|e| worker::Error::RustError(format!("stats shard: {e}")))?;
        Response::from_json(&body)
    }
}
