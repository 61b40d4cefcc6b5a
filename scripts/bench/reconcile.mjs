// The reconciliation bench: a ledger of N entries (1% open, registered; the rest seeded as done
// entries), the audit over the whole ledger, then routine coverages, every count from the
// worker's own reconcile_pass log lines.
import http from "node:http";

import { ADMIN_TOKEN, CRON, DEFAULT_BUDGET, RETENTION_SECS, chunked, iso, now, round, sleep } from "./common.mjs";
import { startWorker } from "./worker.mjs";
import { OUTPUT, envelope, send, signed } from "./load.mjs";

export async function benchReconcile(dir, stubs, size) {
  console.error(`  ledger of ${size}: starting worker`);
  const w = await startWorker(dir, {
    EFFECT_URL: `${stubs.url}/effects`,
    GEMINI_API_BASE: stubs.url,
    GEMINI_API_KEY: "bench-gemini-key",
    // The 1% are registered moments before the passes: no grace, so they are "past the grace".
    RECONCILE_GRACE_SECONDS: "0",
    // What this section measures is a pass polling by itself; the fan-out on the queue has
    // its own section (backlog.mjs).
    RECONCILE_FANOUT_ABOVE: "10000000",
  });
  const agent = new http.Agent({ keepAlive: true, maxSockets: 8 });
  const base = w.url;
  try {
    const kv = await w.mf.getKVNamespace("OPS_KV");
    // A real projection of a done operation, as the gate writes it: the template for the bulk.
    const tmplKey = `batches/template-${size}`;
    const tbody = envelope("batch.succeeded", tmplKey, OUTPUT);
    const tr = await send(agent, base, { method: "POST", path: "/webhooks/gemini", headers: signed(tbody, `msg_tmpl_${size}`), body: tbody });
    if (!tr.body.includes('"outcome":"applied"')) throw new Error(`template delivery: ${tr.status} ${tr.body}`);
    let tmpl = null;
    for (let i = 0; i < 300 && !tmpl?.metadata?.effect_done; i++) {
      tmpl = await kv.getWithMetadata(`op:${tmplKey}`);
      if (!tmpl?.metadata?.effect_done) await sleep(20);
    }
    if (!tmpl?.metadata?.effect_done) throw new Error("template projection never showed effect_done");
    await kv.delete(`op:${tmplKey}`);
    const tview = JSON.parse(tmpl.value);

    const pad = String(size).length;
    const keyOf = (i) => `batches/r${size}-${String(i).padStart(pad, "0")}`;
    const needsWork = (i) => i % 100 === 50 || (size < 100 && i === 0);
    const nowSecs = Math.floor(Date.now() / 1000);
    const seedStart = now();
    let next = 0;
    let seeded = 0;
    await Promise.all(Array.from({ length: 64 }, async () => {
      while (next < size) {
        const i = next++;
        if (needsWork(i)) continue;
        const key = keyOf(i);
        // Settled some time in the last 14 days, like a real ledger's closed entries.
        const settled = nowSecs - 60 - ((i * 7919) % (RETENTION_SECS - 3600));
        const submitted = settled - 600 - (i % 3600);
        const view = { ...tview, key, name: key, submitted_at: iso(submitted), settled_at: iso(settled), effect_done_at: iso(settled + 1), update_time: iso(settled) };
        const metadata = { ...tmpl.metadata, name: key, submitted_at: submitted, settled_at: settled };
        await kv.put(`op:${key}`, JSON.stringify(view), { metadata, expirationTtl: RETENTION_SECS });
        seeded++;
      }
    }));
    const seedMs = now() - seedStart;
    // The audit over the whole ledger (due at once on a fresh lease: the first pass audits),
    // measured on the seeded ledger before anything is open.
    const auditPasses = [];
    for (let n = 0; n < 60; n++) {
      const before = w.count("reconcile_pass");
      const worker = await w.mf.getWorker();
      await worker.scheduled({ cron: CRON, scheduledTime: new Date() });
      if (!(await w.waitFor("reconcile_pass", before + 1, 10_000))) throw new Error("no reconcile_pass line");
      const line = w.events("reconcile_pass").at(-1);
      auditPasses.push(line);
      if (line.audit_complete) break;
    }
    const asum = (f) => auditPasses.reduce((a, p) => a + (p[f] ?? 0), 0);
    const audit = {
      passes: auditPasses.length,
      complete: auditPasses.at(-1)?.audit_complete === true,
      audit_listed: asum("audit_listed"),
      audit_kv_lists: asum("audit_kv_lists"),
      kv_lists: asum("kv_lists"),
      found: asum("audit_found"),
      reindexed: asum("reindexed"),
      bodies_read: asum("bodies_read"),
      subrequests: asum("subrequests"),
      max_subrequests: Math.max(...auditPasses.map((p) => p.subrequests)),
      per_pass_ms: auditPasses.map((p) => p.elapsed_ms),
    };
    console.error(`  ledger of ${size}: audit over op: in ${audit.passes} pass(es), ${audit.audit_kv_lists} lists, ${audit.audit_listed} listed, found ${audit.found}`);
    const work = [];
    for (let i = 0; i < size; i++) if (needsWork(i)) work.push(keyOf(i));
    const regStart = now();
    await Promise.all(chunked(work, 8).map(async (part) => {
      for (const key of part) {
        const body = JSON.stringify({ name: key, kind: "bench" });
        const r = await send(agent, base, { method: "POST", path: "/v1/operations", headers: { authorization: `Bearer ${ADMIN_TOKEN}`, "content-type": "application/json" }, body });
        if (r.status !== 201) throw new Error(`register ${key}: ${r.status} ${r.body}`);
      }
    }));
    const regMs = now() - regStart;
    // The gate projects each record to KV (inline or from its alarm): wait until every one shows.
    await waitLedger(kv, work, (m) => m?.status === "pending", "registrations projected");
    let listed = 0;
    let cursor;
    let pendingInKv = 0;
    do {
      const page = await kv.list({ prefix: "op:", cursor });
      listed += page.keys.length;
      pendingInKv += page.keys.filter((k) => k.metadata?.status === "pending").length;
      cursor = page.list_complete ? undefined : page.cursor;
    } while (cursor);
    if (listed !== size || pendingInKv !== work.length) console.error(`  warning: ledger of ${size}: KV lists ${listed} entries, ${pendingInKv} pending (expected ${size}, ${work.length})`);
    let indexed = 0;
    cursor = undefined;
    do {
      const page = await kv.list({ prefix: "open:", cursor });
      indexed += page.keys.length;
      cursor = page.list_complete ? undefined : page.cursor;
    } while (cursor);
    if (indexed !== work.length) console.error(`  warning: ledger of ${size}: ${indexed} index entries (expected ${work.length})`);
    console.error(`  ledger of ${size}: seeded ${seeded} done entries in ${(seedMs / 1000).toFixed(1)} s, registered ${work.length} in ${(regMs / 1000).toFixed(1)} s`);

    const coverages = [];
    const workSet = new Set(work);
    // 1: the 1% are pending (the status API says RUNNING: a gate call each);
    // 2: steady state, the 1% are running (status call, no gate call);
    // 3: every entry settled and done (the cost of a quiet ledger).
    for (const phase of ["first", "steady", "all_done"]) {
      if (phase === "all_done") {
        await Promise.all(chunked(work, 8).map(async (part) => {
          for (const key of part) {
            const body = envelope("batch.succeeded", key, OUTPUT);
            const r = await send(agent, base, { method: "POST", path: "/webhooks/gemini", headers: signed(body, `msg_done_${key}`), body });
            if (!r.body.includes('"applied"')) throw new Error(`settling ${key}: ${r.status} ${r.body}`);
          }
        }));
        await waitLedger(kv, work, (m) => m?.status === "succeeded" && m?.effect_done === true, "work entries settled and done");
      } else if (phase === "steady") {
        await waitLedger(kv, work, (m) => m?.status === "running", "work entries projected as running");
      }
      await kv.delete(`op:${tmplKey}`); // in case its gate projected it again
      await stubs.reset();
      const passes = [];
      let wallTotal = 0;
      for (let n = 0; n < 60; n++) {
        const before = w.count("reconcile_pass");
        const t = now();
        const worker = await w.mf.getWorker();
        await worker.scheduled({ cron: CRON, scheduledTime: new Date() });
        const wall = now() - t;
        wallTotal += wall;
        if (!(await w.waitFor("reconcile_pass", before + 1, 10_000))) throw new Error("no reconcile_pass line");
        const line = w.events("reconcile_pass").at(-1);
        passes.push({ ...line, wall_ms: round(wall, 1) });
        if (line.complete) break;
      }
      const needing = phase === "all_done" ? 0 : work.length;
      const stats = await stubs.stats(true);
      const polled = Object.keys(stats.poll_paths ?? {});
      const sum = (f) => passes.reduce((a, p) => a + (p[f] ?? 0), 0);
      const cov = {
        phase,
        passes: passes.length,
        complete: passes.at(-1)?.complete === true,
        listed: sum("listed"),
        kv_lists: sum("kv_lists"),
        bodies_read: sum("bodies_read"),
        status_calls: sum("status_calls"),
        gate_calls: sum("gate_calls"),
        do_calls: sum("gate_calls") + 2 * passes.filter((p) => !p.lease_busy).length,
        subrequests: sum("subrequests"),
        max_subrequests: Math.max(...passes.map((p) => p.subrequests)),
        settled: sum("settled"),
        errors: sum("errors"),
        elapsed_ms: sum("elapsed_ms"),
        wall_ms: round(wallTotal, 0),
        stub_status_calls: stats.polls,
        status_calls_for_done_entries: polled.filter((p) => !workSet.has(p)).length,
        needing_status: needing,
        audits: passes.filter((p) => p.audit).length,
        // Each routine pass lists the whole index first: every open entry, in this many lists.
        index_listed_first_pass: passes[0]?.index_listed ?? 0,
        index_kv_lists_first_pass: passes[0]?.index_kv_lists ?? 0,
        every_pass_lists_every_open_entry: passes.every((p) => p.index_listed === needing),
        visited: sum("visited"),
        per_pass: passes.map((p) => ({ listed: p.listed, kv_lists: p.kv_lists, index_listed: p.index_listed, visited: p.visited, bodies_read: p.bodies_read, status_calls: p.status_calls, gate_calls: p.gate_calls, subrequests: p.subrequests, complete: p.complete, elapsed_ms: p.elapsed_ms, wall_ms: p.wall_ms, errors: p.errors })),
      };
      coverages.push(cov);
      console.error(`  ledger of ${size}, ${phase}: ${cov.passes} pass(es), ${cov.kv_lists} lists, ${cov.status_calls} status calls, ${cov.gate_calls} gate calls, ${cov.subrequests} subrequests (max ${cov.max_subrequests}/pass), ${cov.elapsed_ms} ms`);
    }
    return { size, needing_work: work.length, seeded_done: seeded, seed_seconds: round(seedMs / 1000, 1), seed_per_second: round(seeded / (seedMs / 1000), 0), register_seconds: round(regMs / 1000, 1), index_entries: indexed, budget: DEFAULT_BUDGET, template_metadata: tmpl.metadata, template_value_bytes: tmpl.value.length, audit, coverages };
  } finally {
    agent.destroy();
    await w.dispose();
  }
}

/** Polls the ledger entries of `keys` until `ok(metadata)` holds for all (at most 60 s). */
async function waitLedger(kv, keys, ok, what) {
  const deadline = now() + 60_000;
  let left = keys;
  while (left.length && now() < deadline) {
    const metas = await Promise.all(left.map(async (k) => (await kv.getWithMetadata(`op:${k}`)).metadata));
    left = left.filter((_, i) => !ok(metas[i]));
    if (left.length) await sleep(200);
  }
  if (left.length) throw new Error(`ledger: ${left.length} entries never showed ${what} (e.g. ${left[0]})`);
}
