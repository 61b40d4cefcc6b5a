// The cost section: what one completion uses, counted by the worker itself. The
// built worker runs with USAGE_LOG=true, so every Durable Object invocation logs a `usage` line
// (SQLite statements, rows read and written, alarm writes, KV writes, calls to other objects,
// outbound fetches, wall time, database size; src/telemetry/usage.rs); each flow's lines are summed and
// divided by its operations. Flows, one after the other, each followed by quiet and the
// counter flush: `webhook` (a completion of an unregistered operation, by webhook),
// `registration` (POST /v1/operations), `registered_webhook` (the webhook for an operation
// registered in the flow before), `cron` (registered operations whose webhook never came:
// recovered by cron passes from the status API stand-in), `duplicate` (the `webhook` flow's
// deliveries again, later), and, in a second worker with a short retention, `retirement` (the
// name kept in its retired names' shard, then the gate's storage deleted at the end of
// retention; `purged` counts those the admin API no longer finds). KV's footprint is read from the namespace itself. Then the same flows for the
// `object-per-op` minimum (minimum.mjs, metered the same way, with storage that ends at
// retention), priced the same way: the shape's floor beside gemini-once's bill.
import http from "node:http";

import { ADMIN_TOKEN, CRON, round, sleep } from "./common.mjs";
import { kvByPrefix, startWorker } from "./worker.mjs";
import { cpuMeter, quiesce } from "./measure.mjs";
import { OUTPUT, envelope, send, signed } from "./load.mjs";
import { CRON_PASSES_PER_MONTH, HOSTED, RATES, monthlyBill, perMillion } from "./pricing.mjs";
import { startMinimum } from "./minimum.mjs";

const COUNTS = ["sql_statements", "rows_read", "rows_written", "alarm_writes", "kv_writes", "object_calls", "outbound_fetches", "wall_ms", "held_ms"];

const ADMIN = { authorization: `Bearer ${ADMIN_TOKEN}`, "content-type": "application/json" };

/** A signed `batch.succeeded` delivery for `name`, its `webhook-id` being `id`. */
function delivery(name, id) {
  const body = envelope("batch.succeeded", name, OUTPUT);
  return { method: "POST", path: "/webhooks/gemini", headers: signed(body, id), body };
}

/** `POST /v1/operations` for `name` (and `kind`, when given). */
const register = (name, kind) => ({ method: "POST", path: "/v1/operations", headers: ADMIN, body: JSON.stringify({ name, kind }) });

const applied = (r) => r.status === 200 && r.body.includes('"outcome":"applied"');

/** Sends `reqs` with `conc` keep-alive clients; throws on an unexpected answer. */
async function sendAll(base, reqs, ok, conc = 4) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: conc });
  let next = 0;
  await Promise.all(Array.from({ length: conc }, async () => {
    while (next < reqs.length) {
      // A request may be built as it is sent (a signed delivery's timestamps are then fresh).
      const req = typeof reqs[next] === "function" ? reqs[next++]() : reqs[next++];
      const r = await send(agent, base, req);
      if (!ok(r)) throw new Error(`cost: ${req.method} ${req.path}: ${r.status} ${r.body.slice(0, 200)}`);
    }
  }));
  agent.destroy();
}

/**
 * Waits for the alarms and the counter sends a flow caused: STATS_FLUSH_SECONDS is 1 here, and
 * a count may wait a window in its gate, then a window in its isolate's tally.
 */
async function settle(w) {
  await sleep(2_500);
  await quiesce(w.pid, 20_000, 500);
}

/** Sums the `usage` lines from index `from` on (those `keep` keeps), per object class and entry point. */
function usageSince(w, from, keep = () => true) {
  const lines = w.events("usage").slice(from).filter(keep);
  const out = {};
  for (const l of lines) {
    const k = `${l.object}.${l.invocation}`;
    const t = (out[k] ??= { invocations: 0, ...Object.fromEntries(COUNTS.map((c) => [c, 0])), db_bytes: [] });
    t.invocations++;
    for (const c of COUNTS) t[c] += l[c] ?? 0;
    t.db_bytes.push(l.db_bytes);
  }
  return out;
}

/** Per operation: each object's invocations and counts, and the totals across objects. */
function perOp(usage, n, extra = {}) {
  const objects = {};
  const total = { do_requests: 0, ...Object.fromEntries(COUNTS.map((c) => [c, 0])) };
  for (const [k, t] of Object.entries(usage)) {
    objects[k] = { invocations: round(t.invocations / n, 3), ...Object.fromEntries(COUNTS.map((c) => [c, round(t[c] / n, 3)])) };
    total.do_requests += t.invocations / n;
    for (const c of COUNTS) total[c] += t[c] / n;
  }
  for (const c of Object.keys(total)) total[c] = round(total[c], 3);
  return { ...extra, total, objects };
}

/** The median of the gates' database sizes in a flow's lines (bytes). */
function gateDbBytes(usage) {
  const sizes = Object.entries(usage).filter(([k]) => k.startsWith("gate.")).flatMap(([, t]) => t.db_bytes).sort((a, b) => a - b);
  return sizes.length ? sizes[Math.floor(sizes.length / 2)] : null;
}

export async function benchCost(dir, stubs, plan) {
  const n = plan.cost.ops;
  const run = Date.now().toString(36);
  const vars = {
    EFFECT_URL: `${stubs.url}/effects`,
    GEMINI_API_BASE: stubs.url,
    GEMINI_API_KEY: "bench-gemini-key",
    RECONCILE_GRACE_SECONDS: "0",
    // The cron flow is priced as a pass polling by itself (the fan-out adds 3 queue
    // operations per 50 operations and one consumer invocation per 5 messages: the backlog
    // section's figures).
    RECONCILE_FANOUT_ABOVE: "10000000",
    STATS_FLUSH_SECONDS: "1",
    USAGE_LOG: "true",
  };
  const hook = (name, i, tag) => delivery(name, `msg_cost_${run}_${tag}_${i}`);
  const flows = {};
  const w = await startWorker(dir, vars);
  try {
    const flow = async (name, fn, count = n) => {
      const from = w.count("usage");
      const effects0 = (await stubs.stats()).effects;
      const meter = cpuMeter(w.pid);
      const extra = (await fn()) ?? {};
      await settle(w);
      // workerd's CPU for the flow and its deferred work (the quiet wait adds a little).
      extra.workerd_cpu_ms_per_op = meter(count).workerd_main_ms_per_req;
      const usage = usageSince(w, from);
      const effects = (await stubs.stats()).effects - effects0;
      flows[name] = perOp(usage, count, { operations: count, effects_per_op: round(effects / count, 3), gate_db_bytes_median: gateDbBytes(usage), ...extra });
      process.stderr.write(`  cost ${name.padEnd(18)} per op: ${JSON.stringify(flows[name].total)}\n`);
    };
    const hooked = Array.from({ length: n }, (_, i) => `batches/cost-${run}-hook-${i}`);
    const firsts = hooked.map((name, i) => hook(name, i, "hook"));
    await flow("webhook", async () => {
      await sendAll(w.url, firsts, applied);
      return { worker_requests_per_op: 1 };
    });
    const registered = Array.from({ length: n }, (_, i) => `batches/cost-${run}-reg-${i}`);
    await flow("registration", async () => {
      await sendAll(w.url, registered.map((name) => register(name, "bench")), (r) => r.status === 201);
      return { worker_requests_per_op: 1 };
    });
    await flow("registered_webhook", async () => {
      await sendAll(w.url, registered.map((name, i) => hook(name, i, "reg")), applied);
      return { worker_requests_per_op: 1 };
    });
    // Registered, never delivered by webhook: the status API stand-in says SUCCEEDED.
    const silent = Array.from({ length: n }, (_, i) => `batches/done-${run}-${i}`);
    await sendAll(w.url, silent.map((name) => register(name, "bench")), (r) => r.status === 201);
    await settle(w);
    await flow("cron", async () => {
      const passes = [];
      const worker = await w.mf.getWorker();
      for (let p = 0; p < 50; p++) {
        const before = w.count("reconcile_pass");
        await worker.scheduled({ cron: CRON, scheduledTime: new Date() });
        if (!(await w.waitFor("reconcile_pass", before + 1, 30_000))) throw new Error("cost: no reconcile_pass line");
        const line = w.events("reconcile_pass").at(-1);
        passes.push(line);
        await settle(w);
        if (!line.settled && !line.status_calls) break;
      }
      const sum = (f) => passes.reduce((a, x) => a + (x[f] ?? 0), 0);
      return {
        passes: passes.length,
        per_op_from_passes: {
          status_calls: round(sum("status_calls") / n, 3),
          kv_lists: round(sum("kv_lists") / n, 3),
          kv_reads: round(sum("bodies_read") / n, 3),
          gate_calls: round(sum("gate_calls") / n, 3),
          lease_calls: round((2 * passes.length + sum("lease_renewals")) / n, 3),
          subrequests: round(sum("subrequests") / n, 3),
        },
        settled: sum("settled"),
        // Each pass is one cron invocation (a Worker request).
        worker_requests_per_op: round(passes.length / n, 3),
      };
    });
    await flow("duplicate", async () => {
      const before = w.count("duplicate");
      await sendAll(w.url, firsts, (r) => r.status === 200 && r.body.includes('"reason":"duplicate"'));
      const lines = w.events("duplicate").slice(before);
      return { worker_requests_per_op: 1, answered_by_edge: round(lines.filter((l) => l.answered_by === "edge").length / n, 3) };
    });
    flows.kv = await kvByPrefix(w, { bytes: true });
  } finally {
    await w.dispose();
  }
  // Retention's end, in a worker of its own: completions, then the alarm that keeps the name
  // in its retired names' shard and deletes the gate's storage.
  const retentionSecs = 20;
  const r = await startWorker(dir, { ...vars, LEDGER_RETENTION_SECONDS: String(retentionSecs) });
  try {
    const names = Array.from({ length: n }, (_, i) => `batches/cost-${run}-ret-${i}`);
    await sendAll(r.url, names.map((name, i) => () => hook(name, i, "ret")), applied);
    await settle(r);
    const before = r.count("retention_expired");
    const from = r.count("usage");
    const meter = cpuMeter(r.pid);
    if (!(await r.waitFor("retention_expired", before + n, (retentionSecs + 120) * 1000))) process.stderr.write("  cost retirement: not every gate retired in time; counted per retirement seen\n");
    await settle(r);
    const usage = usageSince(r, from);
    // Per retirement the window saw (a loaded machine may leave a few for later).
    const seen = r.events("retention_expired").length - before;
    const cpu = meter(Math.max(1, seen)).workerd_main_ms_per_req;
    // What the gates keep after: an operation the admin API no longer finds was purged; one
    // it finds with `retired_at` kept a tombstone (what versions before the shards did).
    let purged = 0;
    let tombstones = 0;
    await sendAll(r.url, names.map((name) => ({ method: "GET", path: `/v1/operations/${encodeURIComponent(name)}`, headers: ADMIN })), (res) => {
      if (res.status === 404) purged++;
      if (res.status === 200 && res.body.includes('"retired_at":"')) tombstones++;
      return res.status === 404 || res.status === 200;
    });
    // A retired name registered again: answered 409 `retired` from its shard (one call), and
    // nothing created.
    let refused = 0;
    await sendAll(r.url, names.map((name) => register(name, "bench")), (res) => {
      if (res.status === 409 && res.body.includes('"retired"')) refused++;
      return res.status === 409;
    });
    const retiredLines = r.events("retention_expired").slice(before);
    flows.retirement = perOp(usage, Math.max(1, seen), {
      operations: n,
      retired: retiredLines.length,
      purged,
      tombstones,
      registered_again_refused: refused,
      // Each name in its bucket's packed row in its shard, on disk (an 11-byte entry; measured
      // on SQLite by src/operation/retired_names.rs's a_shard_for_three_years).
      retired_name_bytes: RETIRED_NAME_BYTES,
      gate_db_bytes_median: gateDbBytes(usage),
      workerd_cpu_ms_per_op: cpu,
    });
    process.stderr.write(`  cost retirement        per op: ${JSON.stringify(flows.retirement.total)}\n`);
  } finally {
    await r.dispose();
  }
  const shape = await benchShapeCost(stubs, n, run, plan.quick ? 5_000 : 30_000);
  return { plan: plan.cost, flows, bill: bill(flows, { moments: true }), shape: { flows: shape, bill: bill(shape) } };
}

/**
 * The same flows, metered and priced the same way, for the `object-per-op` minimum
 * (minimum.mjs): the least a design with a durable owner per operation uses, with storage that
 * ends at retention like gemini-once's (an alarm that deletes the object's storage). What
 * gemini-once costs beyond this bill is its own; this bill is the shape's floor.
 */
async function benchShapeCost(stubs, n, run, retentionMs) {
  const w = await startMinimum("object-per-op", `${stubs.url}/effects`, { USAGE_LOG: "true", RETENTION_MS: String(retentionMs) });
  const hook = (name, i, tag) => delivery(name, `msg_shape_${run}_${tag}_${i}`);
  // Lines of some entry points only: a flow's retirements come later, in their own flow.
  const usageOf = (from, invocations) => usageSince(w, from, (l) => invocations.includes(l.invocation));
  const flows = {};
  try {
    const flow = async (name, reqs, ok) => {
      const from = w.count("usage");
      const meter = cpuMeter(w.pid);
      await sendAll(w.url, reqs, ok);
      await settle(w);
      const usage = usageOf(from, ["fetch", "alarm"]);
      flows[name] = perOp(usage, reqs.length, { operations: reqs.length, worker_requests_per_op: 1, workerd_cpu_ms_per_op: meter(reqs.length).workerd_main_ms_per_req, gate_db_bytes_median: gateDbBytes(usage) });
      process.stderr.write(`  cost shape ${name.padEnd(12)} per op: ${JSON.stringify(flows[name].total)}\n`);
    };
    const hooked = Array.from({ length: n }, (_, i) => `batches/shape-${run}-hook-${i}`);
    await flow("webhook", hooked.map((name, i) => hook(name, i, "hook")), applied);
    const registered = Array.from({ length: n }, (_, i) => `batches/shape-${run}-reg-${i}`);
    await flow("registration", registered.map((name) => register(name)), (r) => r.status === 201);
    await flow("registered_webhook", registered.map((name, i) => hook(name, i, "reg")), applied);
    flows.kv = await kvByPrefix(w, { bytes: true });
    // Every settled operation retires `retentionMs` after its commit.
    if (!(await waitRetired(w, 2 * n, retentionMs + 60_000))) throw new Error("cost: the minimum's retirements did not all run");
    const usage = usageOf(0, ["retire"]);
    const retired = usage["gate.retire"].invocations;
    // Its CPU is not measured (retirements land during the other flows): the floor leaves it out.
    flows.retirement = perOp(usage, retired, { operations: retired, retired, purged: retired, workerd_cpu_ms_per_op: null });
    process.stderr.write(`  cost shape retirement   per op: ${JSON.stringify(flows.retirement.total)}\n`);
  } finally {
    await w.dispose();
  }
  return flows;
}

/** Waits until `n` of the minimum's objects have retired (or `timeoutMs` passes). */
async function waitRetired(w, n, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  const retired = () => w.events("usage").filter((l) => l.invocation === "retire").length;
  while (retired() < n && Date.now() < deadline) await sleep(100);
  return retired() >= n;
}

/** Volumes a month the bill is computed for. */
export const VOLUMES = [10_000, 1_000_000, 100_000_000];

/** Months after the first the bill is computed for: what is kept per retired operation adds up. */
export const STEADY_MONTHS = [12, 36];

/**
 * Bytes a retired name keeps for good: its 11-byte entry in its bucket's packed row in its
 * shard, pages included, as src/operation/retired_names.rs's `a_shard_for_three_years`
 * measures on SQLite (a shard at 1 M completions a month, names kept one by one; the largest of
 * its months 1, 12 and 36).
 */
export const RETIRED_NAME_BYTES = 14;

/** Buckets of retired names (256 shards × 64) and the names a bucket's row holds at most. */
const RETIRED_BUCKETS = 256 * 64;
const RETIRED_PART_NAMES = 4_096;

/**
 * Rows an ask of the retired names reads beyond the one a young shard shows (the bench's): its
 * bucket's rows, one per RETIRED_PART_NAMES names, in month `m` at `v` completions a month. A
 * completion asks once (its first alarm, or its registration).
 */
export function askExtraRows(v, m) {
  const names = (v * Math.max(0, m - RETENTION_DAYS / 30)) / RETIRED_BUCKETS;
  return Math.max(0, Math.ceil(names / RETIRED_PART_NAMES) - 1);
}

/** Days a closed operation's ledger entry and gate are kept (`LEDGER_RETENTION_DAYS`' default). */
export const RETENTION_DAYS = 14;

/**
 * Days a gate is kept past its retention on average: it retires at its name's bucket's next
 * moment, less than a day later, uniformly (its retention's end falls anywhere in the day).
 */
export const MOMENT_DELAY_DAYS = 0.5;

/**
 * The names that reach a shard at one bucket's moment: each of the RETIRED_BUCKETS buckets
 * has one moment a day, so a day's retirements (a month's completions / 30) are spread over
 * them; at least one. About 203 at 100 M a month, 2.03 at 1 M, one at 10,000.
 *
 * The assumption the bill rests on (the local runtime cannot show it, its bench retires a few
 * names of thousands of buckets): the keeps of one moment reach their shard within
 * `RETIRED_KEEP_WAIT_MS` of the first, so they share one write. Cloudflare fires alarms set
 * for the same millisecond within that of each other; a moment whose keeps straddle more
 * windows writes once per window (10 windows at 100 M would be $5 a month instead of $0.50).
 */
export function keepsPerWrite(v) {
  return Math.max(1, v / 30 / RETIRED_BUCKETS);
}

/**
 * The share of one measured keep's shard work (the row read and written, the shard's wall
 * time) a name pays at `v` a month: a batch of keepsPerWrite(v) names reads and writes its
 * bucket's last row once, plus a new row each time the row fills past RETIRED_PART_NAMES.
 * Each keep is still one object call, and each gate still waits for its batch (its own wall
 * time, measured with the wait, unchanged).
 */
export function keepShare(v) {
  const k = keepsPerWrite(v);
  return (1 + k / RETIRED_PART_NAMES) / k;
}

/** The simple design's units per completion: one request, one KV read, one KV write. */
const SIMPLE = { worker_requests: 1, kv_reads: 1, kv_writes: 1 };

/**
 * The monthly bill at each volume for two ways of using the worker: `webhook` (completions of
 * operations nobody registered) and `registered` (each registered through the admin API, then
 * completed by webhook), each with its retirement at the end of retention and the cron every
 * five minutes over a quiet index; in month 1 and in each of [`STEADY_MONTHS`] (whatever a
 * retired operation keeps accumulates). Billed rows written include one per `setAlarm`; the
 * Worker's CPU is workerd's whole CPU here (the objects' included: an upper bound); duration
 * is the objects' measured wall time. Beside them, the simple design's bill.
 */
export function bill(flows, { moments = false } = {}) {
  const units = (fs) => {
    const sum = (f) => fs.reduce((a, x) => a + (x ? f(x) ?? 0 : 0), 0);
    return {
      worker_requests: sum((x) => x.worker_requests_per_op),
      worker_cpu_ms: sum((x) => x.workerd_cpu_ms_per_op),
      do_requests: sum((x) => x.total.do_requests),
      // An object held in memory by a scheduled send is billed as if active.
      do_wall_ms: sum((x) => x.total.wall_ms + x.total.held_ms),
      rows_read: sum((x) => x.total.rows_read),
      rows_written: sum((x) => x.total.rows_written + x.total.alarm_writes),
      kv_writes: sum((x) => x.total.kv_writes),
    };
  };
  // A quiet routine pass: one cron invocation, one KV list of the index, a lease acquire and
  // release (docs/PERFORMANCE.md, "Reconciliation at scale").
  const fixed = { worker_requests: CRON_PASSES_PER_MONTH, do_requests: 2 * CRON_PASSES_PER_MONTH, kv_lists: CRON_PASSES_PER_MONTH };
  const held = RETENTION_DAYS / 30;
  // A gate is kept to its bucket's moment (gemini-once), the floor's to its retention.
  const heldGate = moments ? (RETENTION_DAYS + MOMENT_DELAY_DAYS) / 30 : held;
  // The shard's keep, as measured: one keep, one batch. At volume a batch holds
  // keepsPerWrite(v) names (gemini-once only: the floor keeps no names).
  const keep = moments ? flows.retirement?.objects?.["retired_names.fetch"] : undefined;
  const stored = {
    // A gate's database while the operation is kept, then whatever its retirement leaves.
    do_bytes_kept: flows.webhook.gate_db_bytes_median ?? 0,
    // A purged gate (`deleteAll`) keeps nothing Cloudflare bills, though workerd still reports
    // its empty database's one page; its name keeps its row in its shard, for good. A
    // tombstone (what versions before the shards kept) kept its whole database.
    do_bytes_retired: flows.retirement?.purged === flows.retirement?.operations
      ? flows.retirement?.retired_name_bytes ?? 0
      : flows.retirement?.gate_db_bytes_median ?? flows.webhook.gate_db_bytes_median ?? 0,
    kv_bytes: flows.kv?.["op:"]?.bytes_per_key ?? 0,
  };
  // Bytes held per completion of a month, in month `m` of steady volume: the last
  // RETENTION_DAYS of completions kept, and every earlier one as its retirement left it.
  const heldIn = (m) => ({
    do_bytes: heldGate * stored.do_bytes_kept + Math.max(0, m - heldGate) * stored.do_bytes_retired,
    kv_bytes: held * stored.kv_bytes,
  });
  const profiles = {
    webhook: units([flows.webhook, flows.retirement]),
    registered: units([flows.registration, flows.registered_webhook, flows.retirement]),
  };
  // "Steady": every later month within 2 % of month 1 (what is kept for good stays small).
  // In month m an ask also reads its bucket's rows beyond the first (none in the bench's run).
  // The keep's row read and written and the shard's wall time are shared by a batch's names.
  const coalesced = (u, v) => {
    if (!keep) return u;
    const saved = 1 - keepShare(v);
    return {
      ...u,
      rows_read: u.rows_read - saved * keep.rows_read,
      rows_written: u.rows_written - saved * keep.rows_written,
      do_wall_ms: u.do_wall_ms - saved * keep.wall_ms,
    };
  };
  const inMonth = (u, v, m) => {
    const c = coalesced(u, v);
    return { ...c, rows_read: c.rows_read + askExtraRows(v, m) };
  };
  const months = (u, f) => VOLUMES.map((v) => {
    const first = monthlyBill(v, inMonth(u, v, 1), f, heldIn(1));
    const later = Object.fromEntries(STEADY_MONTHS.map((m) => [`total_month_${m}`, monthlyBill(v, inMonth(u, v, m), f, heldIn(m)).total]));
    const steady = Object.values(later).every((t) => Math.abs(t - first.total) <= 0.02 * first.total);
    return { ...first, ...later, steady };
  });
  return {
    rates: RATES,
    retention_days: RETENTION_DAYS,
    moment_delay_days: moments ? MOMENT_DELAY_DAYS : 0,
    keeps_per_write: moments ? VOLUMES.map((v) => ({ completions: v, keeps_per_write: round(keepsPerWrite(v), 2), keep_share: round(keepShare(v), 4) })) : null,
    stored_per_completion: stored,
    fixed_per_month: fixed,
    profiles: Object.fromEntries(Object.entries(profiles).map(([k, u]) => [k, { per_completion: u, months: months(u, fixed) }])),
    simple_design: { per_completion: SIMPLE, months: VOLUMES.map((v) => monthlyBill(v, SIMPLE, { worker_requests: CRON_PASSES_PER_MONTH }, { do_bytes: 0, kv_bytes: held * stored.kv_bytes })) },
    hosted_list_prices_per_million: HOSTED,
  };
}

/**
 * A batch's results, counted from the design (docs/DESIGN.md, "Results of a batch"): a step
 * claims a wave of `WAVE_RESULTS` (240: `CHUNK_RESULTS`, 40, for each of 6 result senders),
 * and a step is one alarm run of the batch's gate (one DO request) that stores its claim (the
 * progress row) before sending and its commit (the progress row and the counts: 2 rows) after,
 * then sets the alarm for the next wave (billed as a row written); the wave's results go
 * through 6 ResultSender objects (6 DO requests, no storage). A delivered result leaves no row;
 * the subrequests (the download, the sends) are free. The wall time the objects are held is
 * the sends' round trips, a parameter here (`chunkWallMs`, the gate's and the senders' per
 * wave) and measured by the results section.
 */
export const RESULTS_DESIGN = { chunk_results: 240, do_requests: 7, rows_written: 3, alarm_writes: 1, rows_read: 2 };

/** Units per result from the design, with a chunk holding its object `chunkWallMs`. */
export function resultsDesignUnits(chunkWallMs = 7 * 1_000) {
  const d = RESULTS_DESIGN;
  return {
    do_requests: d.do_requests / d.chunk_results,
    rows_written: (d.rows_written + d.alarm_writes) / d.chunk_results,
    rows_read: d.rows_read / d.chunk_results,
    do_wall_ms: chunkWallMs / d.chunk_results,
  };
}

/**
 * The bill per million results at the published rates beyond a month's allowances: from the
 * design, and from what a run measured per result (`measured`: the objects' own counts, as the
 * results section sums them; null when not run). The target is $2 per million.
 */
export function resultsBill(measured) {
  const design = resultsDesignUnits();
  const units = measured && {
    do_requests: measured.do_requests,
    rows_written: measured.rows_written + measured.alarm_writes,
    rows_read: measured.rows_read,
    do_wall_ms: measured.wall_ms,
  };
  return {
    target_per_million: 2,
    design: { per_result: design, per_million: perMillion(design) },
    measured: units ? { per_result: units, per_million: perMillion(units) } : null,
  };
}
