// The fast-path bench: the scenarios (floor, first delivery, duplicate, rejected, the
// profile variants and the platform probe's), each measured per round and concurrency, pooled
// and compared with the floor of the same round.
import http from "node:http";

import { OTHER_SECRET, chunked, round, sleep } from "./common.mjs";
import { startWorker } from "./worker.mjs";
import { cpuMeter, median, quiesce, summarize } from "./measure.mjs";
import { OUTPUT, envelope, load, send, signed } from "./load.mjs";

const CONCURRENCY = [1, 10, 50];
const PROFILE_CONCURRENCY = [1, 10];

/**
 * The request makers of every scenario, against worker `w`: a pool of done operations for the
 * duplicates is delivered first. `counters.first` counts first deliveries sent.
 */
export async function prepareScenarios(w) {
  const base = w.url;
  const run = `${Date.now().toString(36)}`;
  const setupAgent = new http.Agent({ keepAlive: true, maxSockets: 8 });
  // The duplicates' pool: done operations, each with the delivery that settled it.
  const poolSize = 200;
  const pool = [];
  for (let i = 0; i < poolSize; i++) {
    const id = `batches/bd-${run}-${i}`;
    pool.push({ id, webhookId: `msg_bd_${run}_${i}`, body: envelope("batch.succeeded", id, OUTPUT) });
  }
  try {
    await Promise.all(chunked(pool, 8).map(async (part) => {
      for (const d of part) {
        const r = await send(setupAgent, base, { method: "POST", path: "/webhooks/gemini", headers: signed(d.body, d.webhookId), body: d.body });
        if (r.status !== 200 || !r.body.includes('"applied"')) throw new Error(`seeding duplicates' pool: ${r.status} ${r.body}`);
      }
    }));
  } finally {
    setupAgent.destroy();
  }
  const hot = pool[0];
  let seq = 0; // unique ids across scenarios
  const counters = { first: 0, poolSize };
  const post = (body, id, key) => ({ method: "POST", path: "/webhooks/gemini", headers: signed(body, id, key), body });
  const scenarios = {
    floor: { make: () => ({ method: "GET", path: "/healthz" }), check: (r) => r.status === 200 },
    first: {
      make: () => {
        const n = seq++;
        counters.first++;
        return post(envelope("batch.succeeded", `batches/bf-${run}-${n}`, OUTPUT), `msg_bf_${run}_${n}`);
      },
      check: (r) => r.status === 200 && r.body.includes('"outcome":"applied"') && r.body.includes('"effect":"scheduled"'),
    },
    duplicate: {
      make: (i) => {
        const d = pool[i % pool.length];
        return post(d.body, d.webhookId);
      },
      check: (r) => r.status === 200 && r.body.includes('"reason":"duplicate"'),
    },
    rejected: {
      make: () => {
        const n = seq++;
        return post(envelope("batch.succeeded", `batches/br-${run}-${n}`, OUTPUT), `msg_br_${run}_${n}`, OTHER_SECRET);
      },
      check: (r) => r.status === 401,
    },
    // Profile variants.
    unknown_type: {
      make: () => {
        const n = seq++;
        return post(envelope("batch.progress", `batches/bu-${run}-${n}`, { percent: 50 }), `msg_bu_${run}_${n}`);
      },
      check: (r) => r.status === 200 && r.body.includes("ignored_unknown_type"),
    },
    first_no_effect: {
      make: () => {
        const n = seq++;
        return post(envelope("interaction.requires_action", `interactions/bn-${run}-${n}`, {}), `msg_bn_${run}_${n}`);
      },
      check: (r) => r.status === 200 && r.body.includes('"outcome":"applied"') && r.body.includes('"not_owed"'),
    },
    duplicate_one_key: {
      make: () => post(hot.body, hot.webhookId),
      check: (r) => r.status === 200 && r.body.includes('"reason":"duplicate"'),
    },
  };
  // The platform probe (a plain-JS worker in the same workerd, see PROBE_SCRIPT).
  const probe = (p, body) => ({ method: body === undefined ? "GET" : "POST", path: p, headers: { host: "probe.local", "content-type": "application/json" }, body });
  const okJson = (r) => r.status === 200 && r.body.includes('"ok":true');
  Object.assign(scenarios, {
    js_floor: { make: () => probe("/healthz"), check: okJson },
    js_do_noop: { make: (i) => probe(`/do/noop?k=${i % pool.length}`, pool[i % pool.length].body), check: okJson },
    js_do_write: { make: (i) => probe(`/do/write?k=${i % pool.length}`, pool[i % pool.length].body), check: okJson },
    js_do_write_alarm: { make: (i) => probe(`/do/write-alarm?k=${i % pool.length}`, pool[i % pool.length].body), check: okJson },
    js_kv_put: { make: (i) => probe("/kv-put", JSON.stringify({ key: pool[i % pool.length].id, pad: "x".repeat(600) })), check: okJson },
    js_do_new_write: { make: (i) => probe("/do/write", pool[i % pool.length].body), check: okJson },
    js_fetch: { make: (i) => probe("/fetch", JSON.stringify({ key: pool[i % pool.length].id, pad: "x".repeat(300) })), check: okJson },
  });
  return { scenarios, counters };
}

// Work a cell's deliveries defer is charged to that cell: after it, the bench waits for idleness
// and at least this long. Gates hand counters over STATS_FLUSH_SECONDS (default 10) after the
// oldest one, so duplicate cells wait for that (the isolate's send of them, one shard call
// per window, may land in the next cell); a first delivery's alarm follows its commit and the
// ledger write may wait for the 1 s spacing.
const STATS_FLUSH_SECONDS = 10;
export const DEFERRED_MS = {
  duplicate: STATS_FLUSH_SECONDS * 1000 + 500,
  duplicate_one_key: STATS_FLUSH_SECONDS * 1000 + 500,
  first: 1_500,
  first_no_effect: 1_500,
};

export async function benchFast(dir, stubs, plan) {
  const w = await startWorker(dir, {
    EFFECT_URL: `${stubs.url}/effects`,
    GEMINI_API_BASE: stubs.url,
    // The smoke run checks that no effect goes out twice. Its destination answers at once, so
    // an attempt past the default 5 s is a starved machine, not the worker, and its retry
    // (same idempotency key, as designed) would read as a repeat: give it the time.
    ...(plan.quick ? { EFFECT_TIMEOUT_MS: "60000" } : {}),
  }, {}, { probe: true, probeDest: `${stubs.url}/probe-effects` });
  try {
    const base = w.url;
    const { scenarios, counters } = await prepareScenarios(w);
    const poolSize = counters.poolSize;
    const main = ["floor", "first", "duplicate", "rejected"];
    const variants = ["unknown_type", "first_no_effect", "duplicate_one_key", "js_floor", "js_do_noop", "js_do_write", "js_do_write_alarm", "js_do_new_write", "js_kv_put", "js_fetch"];
    // Which worker log events belong to a scenario, and which carry its `ms`.
    const logOf = { first: ["delivered", "effect_delivered"], duplicate: ["duplicate"], duplicate_one_key: ["duplicate"], first_no_effect: ["delivered"], rejected: ["rejected"], unknown_type: ["dead_letter"] };

    const cells = []; // one per (round, concurrency, scenario)
    // The pool's effects run from the gates' alarms after their answers: count from once they
    // have all arrived, so that only the measured first deliveries' effects are compared.
    const seededBy = Date.now() + 30_000;
    while ((await stubs.stats()).effects < poolSize && Date.now() < seededBy) await sleep(50);
    const effectsBefore = (await stubs.stats()).effects;
    let firstDeliveries = 0;
    for (let r = 0; r < plan.rounds; r++) {
      for (const c of CONCURRENCY) {
        const agent = new http.Agent({ keepAlive: true, maxSockets: c, maxFreeSockets: c });
        const names = plan.variants && PROFILE_CONCURRENCY.includes(c) ? [...main, ...variants] : main;
        for (const name of names) {
          const sc = scenarios[name];
          // Warm-up: open the connections, touch the code paths.
          await load({ base, agent, concurrency: c, durationMs: 10_000, maxRequests: Math.max(20, c * 4), make: sc.make, check: () => true });
          const marks = Object.fromEntries((logOf[name] ?? []).map((e) => [e, w.count(e)]));
          // The warm-up's deferred work lands in the cell with the cell's own, as it would.
          await quiesce(w.pid, plan.quick ? 500 : 3_000);
          const meter = cpuMeter(w.pid, stubs.pid);
          const m = await load({ base, agent, concurrency: c, durationMs: plan.seconds * 1000, maxRequests: 100_000, make: sc.make, check: sc.check });
          // The background work these requests caused (alarms, flushes) is part of their cost.
          const tail_ms = await quiesce(w.pid, plan.quick ? 500 : 3_000, plan.quick ? 0 : DEFERRED_MS[name] ?? 0);
          const cpu = { ...meter(m.lat.length), tail_ms: round(tail_ms, 0) };
          const logged = {};
          for (const [e, from] of Object.entries(marks)) {
            // Lines are printed before the answer leaves; give stdout a moment to drain.
            await w.waitFor(e, from + m.lat.length, 2000);
            const lines = w.events(e).slice(from);
            const ms = lines.map((x) => x.ms).filter((x) => typeof x === "number");
            // A side effect's start after its outcome settled (the answer does not wait for it).
            const after = lines.map((x) => x.after_settled_ms).filter((x) => typeof x === "number");
            logged[e] = { lines: w.count(e) - from, ms: ms.length ? summarize(ms) : null, after: after.length ? summarize(after) : null };
          }
          if (name === "first") firstDeliveries += m.lat.length;
          const s = summarize(m.lat);
          cells.push({ round: r + 1, concurrency: c, scenario: name, ...s, rps: m.lat.length / (m.elapsed_ms / 1000), elapsed_ms: m.elapsed_ms, failed: m.failed, wrong_answers: m.wrong_answers, transport_errors: m.transport_errors, failures: m.failures, logged, cpu, _lat: m.lat });
          process.stderr.write(`  round ${r + 1} c=${String(c).padStart(2)} ${name.padEnd(17)} n=${String(s.n).padStart(5)} p50=${s.p50.toFixed(2)}ms p99=${s.p99.toFixed(2)}ms ${(m.lat.length / (m.elapsed_ms / 1000)).toFixed(0)} req/s cpu/req workerd ${cpu.workerd_main_ms_per_req}/${cpu.workerd_all_ms_per_req} client ${cpu.client_ms_per_req} stubs ${cpu.stubs_ms_per_req}${m.failed ? ` FAILED ${m.failed}: ${JSON.stringify(m.failures).slice(0, 200)}` : ""}\n`);
        }
        agent.destroy();
      }
    }
    await quiesce(w.pid, 3_000);
    const effectsAfter = await stubs.stats();

    const destinationOwnMs = effectsAfter.effect_own_ms_mean;
    // Pool the rounds; ratios per round, and of the pooled figures.
    const table = [];
    for (const c of CONCURRENCY) {
      const floorCells = cells.filter((x) => x.concurrency === c && x.scenario === "floor");
      const floor = pooled(floorCells);
      for (const name of [...main, ...variants]) {
        const cs = cells.filter((x) => x.concurrency === c && x.scenario === name);
        if (!cs.length) continue;
        const p = pooled(cs);
        const perRound = cs.map((x) => {
          const f = floorCells.find((y) => y.round === x.round);
          return { p50_ratio: x.p50 / f.p50, rps_ratio: x.rps / f.rps };
        });
        const row = {
          scenario: name,
          concurrency: c,
          n: p.n,
          p50_ms: round(p.p50, 3),
          p90_ms: round(p.p90, 3),
          p99_ms: round(p.p99, 3),
          mean_ms: round(p.mean, 3),
          rps: round(p.rps, 0),
          p50_ratio: round(p.p50 / floor.p50, 2),
          p99_ratio: round(p.p99 / floor.p99, 2),
          rps_ratio: round(p.rps / floor.rps, 2),
          p50_ratio_rounds: perRound.map((x) => round(x.p50_ratio, 2)),
          rps_ratio_rounds: perRound.map((x) => round(x.rps_ratio, 2)),
          // Robust to one disturbed round (the machine is shared): the median of the rounds.
          p50_ratio_median: round(median(perRound.map((x) => x.p50_ratio)), 2),
          rps_ratio_median: round(median(perRound.map((x) => x.rps_ratio)), 2),
          p50_ms_rounds: cs.map((x) => round(x.p50, 3)),
          rps_rounds: cs.map((x) => round(x.rps, 0)),
          failed: cs.reduce((a, x) => a + x.failed, 0),
          wrong_answers: cs.reduce((a, x) => a + x.wrong_answers, 0),
          transport_errors: cs.reduce((a, x) => a + x.transport_errors, 0),
          cpu_ms_per_req: {
            workerd_main: median(cs.map((x) => x.cpu.workerd_main_ms_per_req ?? NaN)),
            workerd_all: median(cs.map((x) => x.cpu.workerd_all_ms_per_req ?? NaN)),
            client: median(cs.map((x) => x.cpu.client_ms_per_req ?? NaN)),
            stubs: median(cs.map((x) => x.cpu.stubs_ms_per_req ?? NaN)),
          },
        };
        const ev = logOf[name];
        if (ev) {
          row.worker_log = {};
          for (const e of ev) {
            const all = cs.flatMap((x) => (x.logged[e]?.ms ? [x.logged[e].ms] : []));
            // Re-summarize from the cells' medians is lossy; keep each round's p50 and the max p99.
            row.worker_log[e] = { p50_ms_rounds: all.map((s) => s.p50), p99_ms_rounds: all.map((s) => s.p99), lines: cs.reduce((a, x) => a + (x.logged[e]?.lines ?? 0), 0) };
          }
        }
        if (name === "first") {
          // The destination's own time: what the stub measured from request to answer.
          const own = destinationOwnMs ?? 0;
          row.destination_own_ms_mean = round(own, 3);
          row.p50_ratio_minus_destination = round((p.p50 - own) / floor.p50, 2);
          row.p50_ratio_minus_destination_median = round(median(cs.map((x) => (x.p50 - own) / floorCells.find((y) => y.round === x.round).p50)), 2);
          // The effect call as the worker saw it (log `ms`): includes workerd's outbound path,
          // the output gate (the claim must be durable before the request leaves) and queueing.
          const seen = median(row.worker_log.effect_delivered.p50_ms_rounds);
          row.effect_seen_by_worker_ms_p50 = seen;
          row.p50_ratio_minus_effect_seen = round((p.p50 - seen) / floor.p50, 2);
          // The answer does not wait for the side effect: how long after it the attempt starts.
          const after = cs.flatMap((x) => (x.logged.effect_delivered?.after ? [x.logged.effect_delivered.after] : []));
          row.effect_start_after_answer_ms = { p50: median(after.map((a) => a.p50)), p99: Math.max(...after.map((a) => a.p99), 0) };
        }
        table.push(row);
      }
    }
    for (const x of cells) delete x._lat;
    return {
      worker_ready_ms: round(w.ready_ms, 0),
      duplicate_pool: poolSize,
      table,
      cells,
      effects: {
        first_deliveries_measured_and_warmup: counters.first,
        first_deliveries_measured: firstDeliveries,
        effects_at_destination: effectsAfter.effects - effectsBefore,
        repeated_idempotency_keys: effectsAfter.effect_repeats,
      },
      worker_other_output: w.other.slice(0, 20),
    };
  } finally {
    await w.dispose();
  }

  function pooled(cs) {
    const lat = cs.flatMap((x) => x._lat);
    const s = summarize(lat);
    const elapsed = cs.reduce((a, x) => a + x.elapsed_ms, 0);
    return { ...s, rps: lat.length / (elapsed / 1000) };
  }
}
