// The backlog bench: N open operations (a day of lost webhooks), recovered by the cron passes
// fanning their polls out on the worker's own queue (Miniflare's, in workerd). 99% are still
// running at Gemini (the stub answers RUNNING: a status call each, and no gate call) and are
// seeded straight into the index with the metadata a registration's gate writes (N
// registrations through the admin API would take longer than the recovery measured); 1% are
// done (`batches/done-*`, SUCCEEDED) and registered for real, since a poll settles only what a
// gate holds: settled through their gates, side effect included. Every count is the worker's
// own: its `reconcile_pass` and `reconcile_job` lines, and what the stubs saw.
import { ADMIN_TOKEN, CRON, iso, now, round, sleep } from "./common.mjs";
import { startWorker } from "./worker.mjs";
import { send } from "./load.mjs";
import http from "node:http";

/** Cloudflare Queues: $0.40 per million operations (a write, a read and a delete per 64 KB message), 1 M a month included (read 2026-11-25). */
export const QUEUE_OPS_PER_MILLION = 0.4;

export async function benchBacklog(dir, stubs, { open, rate }) {
  console.error(`  backlog of ${open}: starting worker (RECONCILE_POLL_RATE=${rate})`);
  const w = await startWorker(dir, {
    GEMINI_API_BASE: stubs.url,
    GEMINI_API_KEY: "bench-gemini-key",
    EFFECT_URL: `${stubs.url}/effects`,
    RECONCILE_GRACE_SECONDS: "0",
    RECONCILE_POLL_RATE: String(rate),
    // The audit is not what is measured: done before the backlog exists.
    RECONCILE_AUDIT_SECONDS: "604800",
  });
  const agent = new http.Agent({ keepAlive: true, maxSockets: 4 });
  try {
    const kv = await w.mf.getKVNamespace("OPS_KV");
    // A real registration's projection: the template for the rest.
    const tmplKey = "batches/backlog-template";
    const r = await send(agent, w.url, { method: "POST", path: "/v1/operations", headers: { authorization: `Bearer ${ADMIN_TOKEN}`, "content-type": "application/json" }, body: JSON.stringify({ name: tmplKey, kind: "bench" }) });
    if (r.status !== 201) throw new Error(`register template: ${r.status} ${r.body}`);
    let tmpl = null;
    for (let i = 0; i < 300 && !tmpl?.metadata; i++) {
      tmpl = await kv.getWithMetadata(`open:${tmplKey}`);
      if (!tmpl?.metadata) await sleep(20);
    }
    if (!tmpl?.metadata) throw new Error("the template registration never showed in the index");
    // The first pass audits (a fresh lease): let it, before the backlog exists.
    const worker = await w.mf.getWorker();
    await worker.scheduled({ cron: CRON, scheduledTime: new Date() });
    if (!(await w.waitFor("reconcile_pass", 1, 30_000))) throw new Error("no first pass");
    // Done with the template: forgotten (closed), so its gate deletes its index entry and no
    // audit puts it back; a delete behind the gate's back would be repaired by a later audit
    // and polled beside the backlog.
    const forgot = await send(agent, w.url, { method: "POST", path: `/v1/operations/${encodeURIComponent(tmplKey)}/forget`, headers: { authorization: `Bearer ${ADMIN_TOKEN}`, "content-type": "application/json" }, body: JSON.stringify({ reason: "bench template" }) });
    if (forgot.status !== 200) throw new Error(`forget template: ${forgot.status} ${forgot.body}`);
    for (let i = 0; i < 300 && (await kv.getWithMetadata(`open:${tmplKey}`))?.metadata; i++) await sleep(20);

    const pad = String(open).length;
    const keys = Array.from({ length: open }, (_, i) => (i % 100 === 7 ? `batches/done-b${String(i).padStart(pad, "0")}` : `batches/b${String(i).padStart(pad, "0")}`));
    // Registered an hour ago, their webhooks lost since: younger than STUCK_AFTER_SECONDS, so
    // a poll is all each needs (an older one would also get its one `stuck` alert).
    const submitted = Math.floor(Date.now() / 1000) - 3_600;
    const seedStart = now();
    // The 1% Gemini says are done are registered for real: a poll settles only an operation
    // whose gate holds it (a poll never creates a record). The rest (Gemini says running,
    // which costs the pass no gate call) are seeded straight into the index.
    const toRegister = keys.filter((k) => k.includes("/done-"));
    await Promise.all(Array.from({ length: 4 }, async () => {
      while (toRegister.length) {
        const key = toRegister.pop();
        const reg = await send(agent, w.url, { method: "POST", path: "/v1/operations", headers: { authorization: `Bearer ${ADMIN_TOKEN}`, "content-type": "application/json" }, body: JSON.stringify({ name: key, kind: "bench" }) });
        if (reg.status !== 201) throw new Error(`register ${key}: ${reg.status} ${reg.body}`);
      }
    }));
    let next = 0;
    const seeded = keys.filter((k) => !k.includes("/done-"));
    await Promise.all(Array.from({ length: 64 }, async () => {
      while (next < seeded.length) {
        const key = seeded[next++];
        const metadata = { ...tmpl.metadata, name: key, status: "running", submitted_at: submitted, version: 2 };
        await kv.put(`open:${key}`, "", { metadata });
      }
    }));
    // The registered ones' gates write their index entries from their alarms.
    for (const key of keys.filter((k) => k.includes("/done-"))) {
      for (let i = 0; i < 300 && !(await kv.getWithMetadata(`open:${key}`))?.metadata; i++) await sleep(20);
    }
    const seedMs = now() - seedStart;
    // Everything the index holds is owed a poll (the template too, if its gate indexed it again).
    let indexed = 0;
    let cursor;
    do {
      const page = await kv.list({ prefix: "open:", cursor });
      indexed += page.keys.length;
      cursor = page.list_complete ? undefined : page.cursor;
    } while (cursor);
    console.error(`  backlog of ${open}: seeded the index in ${(seedMs / 1000).toFixed(1)} s (${indexed} entries)`);
    await stubs.reset();

    // Cron runs every 5 minutes in production; here a pass is triggered as soon as the last
    // one ends, and the clock below is what the queue's consumers take. A pass schedules at
    // most one cron interval of polls (300 s × the rate), so at a rate that covers the backlog
    // in one interval one or two passes (the index is listed in windows of 50,000) feed it all.
    const passes = [];
    const t0 = now();
    let polledAll = null;
    const deadline = t0 + 60 * 60_000;
    while (now() < deadline) {
      const stats = await stubs.stats();
      if (stats.polls >= indexed) {
        polledAll = now() - t0;
        break;
      }
      // Passes until one coverage of the index is done (a pass that reaches its end says
      // `complete`); then only the consumers work.
      const covered = passes.some((p) => p.stopped === "complete");
      if (!covered && passes.length < 50) {
        const before = w.count("reconcile_pass");
        await worker.scheduled({ cron: CRON, scheduledTime: new Date() });
        if (!(await w.waitFor("reconcile_pass", before + 1, 120_000))) throw new Error("no reconcile_pass line");
        passes.push({ ...w.events("reconcile_pass").at(-1), at_ms: round(now() - t0, 0) });
      } else await sleep(500);
    }
    // The settled 1%: their effects follow from their gates' alarms.
    const done = keys.filter((k) => k.includes("/done-"));
    let effects = 0;
    for (let i = 0; i < 600; i++) {
      effects = (await stubs.stats()).effect_keys;
      if (effects >= done.length) break;
      await sleep(100);
    }
    const settledMs = now() - t0;
    const stats = await stubs.stats(true);
    const jobs = w.events("reconcile_job");
    const sum = (xs, f) => xs.reduce((a, x) => a + (x[f] ?? 0), 0);
    const messages = jobs.length;
    const queueOps = 3 * messages; // written, read, deleted (each message is far under 64 KB)
    const result = {
      open,
      indexed,
      rate_per_s: rate,
      seed_seconds: round(seedMs / 1000, 1),
      passes: passes.length,
      per_pass: passes.map((p) => ({ index_listed: p.index_listed, kv_lists: p.kv_lists, fed: p.fed, queue_sends: p.queue_sends, subrequests: p.subrequests, stopped: p.stopped, elapsed_ms: p.elapsed_ms, at_ms: p.at_ms })),
      fed: sum(passes, "fed"),
      pass_status_calls: sum(passes, "status_calls"),
      kv_lists: sum(passes, "kv_lists"),
      queue_sends: sum(passes, "queue_sends"),
      pass_subrequests: sum(passes, "subrequests"),
      max_pass_subrequests: Math.max(...passes.map((p) => p.subrequests)),
      messages,
      consumer_status_calls: sum(jobs, "status_calls"),
      consumer_gate_calls: sum(jobs, "gate_calls"),
      consumer_subrequests: sum(jobs, "subrequests"),
      consumer_errors: sum(jobs, "errors"),
      settled: sum(jobs, "settled"),
      stub_polls: stats.polls,
      distinct_polled: Object.keys(stats.poll_paths ?? {}).length,
      polled_twice: Object.values(stats.poll_paths ?? {}).filter((n) => n > 1).length,
      effects: stats.effects,
      effect_keys: stats.effect_keys,
      effect_repeats: stats.effect_repeats,
      done_expected: done.length,
      seconds_until_all_polled: polledAll === null ? null : round(polledAll / 1000, 1),
      seconds_until_all_settled: round(settledMs / 1000, 1),
      achieved_polls_per_s: polledAll ? round(indexed / (polledAll / 1000), 1) : null,
      queue_operations: queueOps,
      queue_cost_usd: round((queueOps / 1e6) * QUEUE_OPS_PER_MILLION, 4),
      started_at: iso(Math.floor(Date.now() / 1000)),
    };
    console.error(`  backlog of ${open}: ${result.passes} pass(es) fed ${result.fed} in ${result.messages} messages; all polled in ${result.seconds_until_all_polled} s (${result.achieved_polls_per_s}/s), ${result.effect_keys}/${done.length} settled with effects, ${result.polled_twice} polled twice`);
    return result;
  } finally {
    agent.destroy();
    await w.dispose();
  }
}
