// Side by side with the simple design: gemini-once and the peer (peer.mjs) in
// the same run, against the same destination stub, with the same secrets. Per round and
// concurrency, each design gets its own freshly registered operations (untimed), then the
// scenarios, each followed by an idle period so deferred work (alarms, flushes) is not charged
// to the next cell: registration (POST /v1/operations, creates the gate), first (a new
// completion for a registered operation), duplicate (the same delivery again, after the idle
// period, to an operation that has gone idle), rejected (wrong secret), floor (GET /healthz),
// then, for each destination delay in `plan.side.destMs`, first again with the destination
// answering after that delay (a real destination takes time; the simple design's answer waits
// for it, gemini-once's does not). The order of the designs rotates by round. Per cell it
// also counts what can be seen from outside: effects at the destination, the worker's log
// lines by event (gate calls, alarm runs), and KV keys created, by prefix; Miniflare exposes
// no count of KV reads/writes.
// Unless `plan.side.minimum` is off, the minimum designs (minimum.mjs: the least a design with
// a durable owner per operation does, in plain JS) run registration, first and duplicate in
// the same rounds: the measured limit of the shape, beside what gemini-once and the peer do.
import http from "node:http";

import { ADMIN_TOKEN, OTHER_SECRET, round, sleep } from "./common.mjs";
import { kvByPrefix, startWorker } from "./worker.mjs";
import { cpuMeter, median, quiesce, summarize } from "./measure.mjs";
import { OUTPUT, envelope, load, send, signed } from "./load.mjs";
import { bundlePeer, startPeer } from "./peer.mjs";
import { MINIMUM_DESIGNS, startMinimum } from "./minimum.mjs";

export const SIDE_SCENARIOS = ["registration", "first", "duplicate", "rejected", "floor"];

/**
 * The cells of one round and concurrency, in order: each scenario with the destination answering
 * at once, then a first delivery per positive delay in `destMs` (ms the destination takes).
 */
export function sideSteps(destMs = []) {
  return [
    ...SIDE_SCENARIOS.map((name) => ({ name, destMs: 0 })),
    ...[...new Set(destMs)].filter((ms) => ms > 0).map((ms) => ({ name: "first", destMs: ms })),
  ];
}
/** The scenarios the minimum designs run: what the shape costs (rejected and floor are not its). */
const MINIMUM_SCENARIOS = new Set(["registration", "first", "duplicate"]);
const isMinimum = (d) => d in MINIMUM_DESIGNS;
/** Each design's prefix for the operation names and webhook-ids it is sent. */
const TAGS = { "gemini-once": "so", peer: "sp", "object-per-op": "sm", sharded: "ss" };

/** Every key of a design's ledger namespace, counted by prefix (up to the first ':'). */
async function kvKeysByPrefix(w) {
  return Object.fromEntries(Object.entries(await kvByPrefix(w)).map(([p, t]) => [p, t.keys]));
}

/** Request makers and answer checks of one design; `tag` keeps the designs' names apart. */
function makers(design, tag, run) {
  const admin = { authorization: `Bearer ${ADMIN_TOKEN}`, "content-type": "application/json" };
  // gemini-once and the minimum designs answer with the gate's JSON; the peer with plain text.
  const ours = design !== "peer";
  let seq = 0;
  // A delivery of `id`; `again` (an earlier delivery) resends its body and webhook-id, signed now.
  const delivery = (id, n, secret, again) => {
    const body = again?.body ?? envelope("batch.succeeded", id, OUTPUT);
    const webhookId = again?.webhookId ?? `msg_${tag}_${run}_${n}`;
    return { method: "POST", path: "/webhooks/gemini", headers: signed(body, webhookId, secret), body, webhookId };
  };
  return {
    register: (name) => ({ method: "POST", path: "/v1/operations", headers: admin, body: JSON.stringify({ name, kind: "bench" }) }),
    registered: (r) => r.status === 201,
    fresh: () => `batches/${tag}-${run}-${seq++}`,
    delivery,
    first: (r) => r.status === 200 && (ours ? r.body.includes('"outcome":"applied"') : r.body === "ok"),
    duplicate: (r) => r.status === 200 && (ours ? r.body.includes('"reason":"duplicate"') : r.body === "ok"),
    rejected: (r) => r.status === 401,
    floor: (r) => r.status === 200,
  };
}

export async function benchSide(buildDir, stubs, plan, peerDir) {
  const bundle = await bundlePeer(peerDir);
  const designs = {
    "gemini-once": await startWorker(buildDir, { EFFECT_URL: `${stubs.url}/effects`, GEMINI_API_BASE: stubs.url }),
    peer: await startPeer(bundle, `${stubs.url}/effects`),
  };
  if (plan.side.minimum !== false) {
    for (const d of Object.keys(MINIMUM_DESIGNS)) designs[d] = await startMinimum(d, `${stubs.url}/effects`);
  }
  const run = Date.now().toString(36);
  const s = plan.side;
  const steps = sideSteps(s.destMs);
  // Each first-delivery cell (one per destination delay) gets its own registered operations.
  const firstDelays = steps.filter((x) => x.name === "first").map((x) => x.destMs);
  const cells = [];
  try {
    for (let r = 0; r < s.rounds; r++) {
      // Rotate which design goes first, so none always runs right after another's idle.
      const names = Object.keys(designs);
      const order = names.map((_, i) => names[(i + r) % names.length]);
      for (const c of s.concurrency) {
        const agents = Object.fromEntries(order.map((d) => [d, new http.Agent({ keepAlive: true, maxSockets: c, maxFreeSockets: c })]));
        const mk = Object.fromEntries(order.map((d) => [d, makers(d, `${TAGS[d]}${r}c${c}`, run)]));
        // Untimed: each design's operations for this round's first deliveries, then idle.
        const pools = {};
        for (const d of order) {
          const names = Array.from({ length: s.ops * firstDelays.length }, () => mk[d].fresh());
          const setup = new http.Agent({ keepAlive: true, maxSockets: 8 });
          let next = 0;
          await Promise.all(Array.from({ length: 8 }, async () => {
            while (next < names.length) {
              const name = names[next++];
              const res = await send(setup, designs[d].url, mk[d].register(name));
              if (res.status !== 201) throw new Error(`${d}: registering ${name}: ${res.status} ${res.body.slice(0, 200)}`);
            }
          }));
          setup.destroy();
          const first = Object.fromEntries(firstDelays.map((ms, i) => [ms, names.slice(i * s.ops, (i + 1) * s.ops)]));
          pools[d] = { first, delivered: [] };
        }
        await idle(designs, s.idleMs);
        for (const { name, destMs } of steps) {
          // The destination keeps its delay through the idle periods: gemini-once's effects run after the answers.
          if (destMs) await stubs.setDestinationDelay(destMs);
          for (const d of order.filter((x) => !isMinimum(x) || MINIMUM_SCENARIOS.has(name))) {
            const w = designs[d];
            const m = mk[d];
            const pool = pools[d];
            let make;
            let max = 100_000;
            if (name === "registration") make = () => m.register(m.fresh());
            else if (name === "first") {
              const names = pool.first[destMs];
              max = names.length;
              make = (i) => {
                const req = m.delivery(names[i], destMs ? `d${destMs}_${i}` : i);
                // Duplicates replay the deliveries of the first cell (destination at once).
                if (!destMs) pool.delivered.push(req);
                return req;
              };
            } else if (name === "duplicate") {
              // The same deliveries again (same webhook-id and body, signed now), each once.
              max = pool.delivered.length;
              make = (i) => m.delivery(null, i, undefined, pool.delivered[i]);
            } else if (name === "rejected") make = (i) => m.delivery(m.fresh(), `r${i}`, OTHER_SECRET);
            else make = () => ({ method: "GET", path: "/healthz" });
            const check = name === "registration" ? m.registered : m[name];
            const events0 = w.eventCounts ? w.eventCounts() : {};
            const kv0 = await kvKeysByPrefix(w);
            const effects0 = (await stubs.stats()).effects;
            const meter = cpuMeter(w.pid, stubs.pid);
            const res = await load({ base: w.url, agent: agents[d], concurrency: c, durationMs: s.seconds * 1000, maxRequests: max, make, check });
            const cpu = meter(res.lat.length);
            // The deferred work these requests caused, then the idle period before the next cell.
            await idle(designs, s.idleMs);
            const n = res.lat.length;
            const effects = (await stubs.stats()).effects - effects0;
            const kv1 = await kvKeysByPrefix(w);
            const events1 = w.eventCounts ? w.eventCounts() : {};
            const per = (x) => (n ? round(x / n, 3) : null);
            const kvCreated = Object.fromEntries(Object.keys({ ...kv0, ...kv1 }).map((p) => [p, per((kv1[p] ?? 0) - (kv0[p] ?? 0))]).filter(([, v]) => v));
            const lines = Object.fromEntries(Object.keys(events1).map((e) => [e, per(events1[e] - (events0[e] ?? 0))]).filter(([, v]) => v));
            const after = name === "first" ? w.events("effect_delivered").slice(events0.effect_delivered ?? 0).map((x) => x.after_settled_ms).filter((x) => typeof x === "number") : [];
            const sm = summarize(res.lat);
            cells.push({
              design: d, round: r + 1, concurrency: c, scenario: name, dest_ms: destMs, n, p50: sm.p50, p99: sm.p99,
              rps: n / (res.elapsed_ms / 1000), failed: res.failed, wrong_answers: res.wrong_answers, transport_errors: res.transport_errors, failures: res.failures,
              per_request: { effects: per(effects), kv_keys_created: kvCreated, log_lines: lines, ...objectCalls(d, events0, events1, per) },
              effect_after_answer_ms: after.length ? summarize(after) : null,
              cpu,
            });
            process.stderr.write(`  side round ${r + 1} c=${String(c).padStart(2)} ${d.padEnd(13)} ${(destMs ? `${name}@${destMs}ms` : name).padEnd(12)} n=${String(n).padStart(5)} p50=${sm.p50?.toFixed(2)}ms ${(n / (res.elapsed_ms / 1000)).toFixed(0)} req/s effects/req ${per(effects)}${res.failed ? ` FAILED ${res.failed}: ${JSON.stringify(res.failures).slice(0, 200)}` : ""}\n`);
          }
          if (destMs) await stubs.setDestinationDelay(0);
        }
        for (const a of Object.values(agents)) a.destroy();
      }
    }
  } finally {
    for (const w of Object.values(designs)) await w.dispose();
  }
  return { plan: s, peer: { dir: peerDir, name: bundle.name, bundle_bytes: bundle.bytes, compatibility_date: bundle.compatibilityDate, compatibility_flags: bundle.compatibilityFlags }, table: sideTable(cells, s.concurrency, steps), cells };
}

/**
 * gemini-once's Durable Object work, read from its log lines: the webhook and admin handlers log
 * one line per gate call after the gate answers (src/edge/webhook.rs `answer`), and the gate
 * logs each side-effect attempt from its alarm. Stats flushes and ledger writes log nothing.
 */
function objectCalls(design, e0, e1, per) {
  if (design !== "gemini-once") return {};
  const d = (names) => names.reduce((a, e) => a + (e1[e] ?? 0) - (e0[e] ?? 0), 0);
  return {
    gate_calls: per(d(["delivered", "duplicate", "dropped", "nudged", "ignored_unregistered", "registered"])),
    effect_alarm_runs: per(d(["effect_delivered", "effect_failed", "effect_fenced", "effect_parked"])),
  };
}

/** Waits for both workerd processes to go quiet, and at least `ms`. */
async function idle(designs, ms) {
  const t0 = Date.now();
  for (const w of Object.values(designs)) await quiesce(w.pid, Math.max(ms, 3_000), 0);
  const left = ms - (Date.now() - t0);
  if (left > 0) await sleep(left);
}

/** Medians over rounds per (concurrency, scenario, destination delay), the designs side by side. */
function sideTable(cells, concurrency, steps) {
  const rows = [];
  for (const c of concurrency) {
    for (const { name, destMs } of steps) {
      const of = (d) => cells.filter((x) => x.design === d && x.concurrency === c && x.scenario === name && (x.dest_ms ?? 0) === destMs);
      const ours = of("gemini-once");
      const peer = of("peer");
      if (!ours.length || !peer.length) continue;
      const fig = (cs) => ({
        rps: round(median(cs.map((x) => x.rps)), 0),
        p50_ms: round(median(cs.map((x) => x.p50 ?? NaN)), 3),
        p99_ms: round(median(cs.map((x) => x.p99 ?? NaN)), 3),
        n: cs.reduce((a, x) => a + x.n, 0),
        failed: cs.reduce((a, x) => a + x.failed, 0),
        rps_rounds: cs.map((x) => round(x.rps, 0)),
        p50_ms_rounds: cs.map((x) => round(x.p50, 3)),
        per_request: cs.at(-1).per_request,
        workerd_all_cpu_ms_per_req: median(cs.map((x) => x.cpu.workerd_all_ms_per_req ?? NaN)),
      });
      const o = fig(ours);
      const p = fig(peer);
      const vsPeer = (x) => ({ rps_ratio: round(x.rps / p.rps, 2), p50_ratio: round(x.p50_ms / p.p50_ms, 2) });
      const row = { concurrency: c, scenario: name, dest_ms: destMs, "gemini-once": o, peer: p, ...vsPeer(o) };
      // The minimum designs, each with its own ratios to the peer.
      const minimum = {};
      for (const d of Object.keys(MINIMUM_DESIGNS)) {
        const cs = of(d);
        if (!cs.length) continue;
        const m = fig(cs);
        minimum[d] = { ...m, ...vsPeer(m) };
      }
      if (Object.keys(minimum).length) row.minimum = minimum;
      if (name === "first") {
        const after = ours.flatMap((x) => (x.effect_after_answer_ms ? [x.effect_after_answer_ms] : []));
        row.effect_after_answer_ms = { p50: median(after.map((a) => a.p50)), p99: Math.max(...after.map((a) => a.p99), 0) };
      }
      rows.push(row);
    }
  }
  return rows;
}
