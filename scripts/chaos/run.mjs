// One chaos run: builds and copies the worker, plays the schedule against it and the stand-ins
// (registrations, deliveries, cron passes, kills and restarts), polls the admin API throughout,
// lets reconciliation settle everything, then checks (oracle.mjs) and prints the result.
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { sign } from "../send.mjs";
import { workerLayout } from "../local_worker.mjs";

import { ADMIN_TOKEN, CRON, EFFECT_SECRET, GEMINI_API_KEY, GEMINI_SECRETS, LATE_AFTER_MS, ROOT, TERMINAL, WORKER_VARS, httpJson, percentile, sleep } from "./config.mjs";
import { buildSchedule, makeRng } from "./schedule.mjs";
import { iso, startDestination, startStatusApi } from "./standins.mjs";
import { WorkerSupervisor } from "./supervisor.mjs";
import { check } from "./oracle.mjs";

export const activeCleanups = new Set();

export async function runChaos(options = {}) {
  const o = { seed: 1, ops: 500, kills: 2, resultsShare: 0, lateAfterMs: LATE_AFTER_MS, build: true, keep: false, quiet: false, json: null, ...options };
  const say = o.quiet ? () => {} : (...a) => console.error(...a);
  const out = o.print ?? ((line) => console.log(line));
  const wallStart = Date.now();
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), `gemini-once-chaos-s${o.seed}-`));
  say(`chaos: seed=${o.seed} ops=${o.ops} kills=${o.kills} results_share=${o.resultsShare}; state and logs in ${tmp}`);

  if (o.build) {
    say("chaos: building the worker (bash scripts/build.sh)");
    const b = spawnSync("bash", ["scripts/build.sh"], { cwd: ROOT, stdio: ["ignore", "inherit", "inherit"] });
    if (b.status !== 0) throw new Error(`build failed (exit ${b.status})`);
  }
  // The other engineer may rebuild build/ at any time: run on a copy taken now.
  fs.cpSync(path.join(ROOT, "build"), path.join(tmp, "build"), { recursive: true });
  const layout = await workerLayout();

  const schedule = buildSchedule(o.seed, o.ops, o.kills, o.kills + 1, o.resultsShare);
  const run = { seed: o.seed, schedule, t0: 0 };
  const ops = schedule.ops;
  const byKey = new Map(ops.map((op) => [op.key, op]));

  // Worker-side counters, from its log lines.
  const events = { reconcile_pass: 0, lease_busy: 0, pass_complete: 0, settled_by_reconcile: 0, effect_delivered: 0, effect_failed: 0, effect_fenced: 0, effect_parked: 0, status_transient: 0, unavailable: 0, other: {} };
  const onEvent = (e) => {
    switch (e.event) {
      case "reconcile_pass":
        events.reconcile_pass++;
        if (e.lease_busy) events.lease_busy++;
        if (e.complete) events.pass_complete++;
        break;
      case "settled_by_reconcile": events.settled_by_reconcile++; break;
      case "effect_delivered": events.effect_delivered++; break;
      case "effect_failed": events.effect_failed++; break;
      case "effect_fenced": events.effect_fenced++; break;
      case "effect_parked": events.effect_parked++; break;
      case "status_transient": events.status_transient++; break;
      case "unavailable": events.unavailable++; break;
      default:
        if (e.event) events.other[e.event] = (events.other[e.event] ?? 0) + 1;
    }
  };

  let api, dest, worker, progress;
  const timers = new Set();
  let stopAll = false;
  const cleanup = async () => {
    stopAll = true;
    clearInterval(progress);
    for (const t of timers) { clearTimeout(t); clearInterval(t); }
    try { await worker?.stop(); } catch (e) { say(`chaos: stopping the worker: ${e.message}`); }
    await api?.close().catch(() => {});
    await dest?.close().catch(() => {});
  };
  activeCleanups.add(cleanup);
  let result;
  try {
    api = await startStatusApi(run);
    dest = await startDestination(run);
    worker = new WorkerSupervisor({
      dir: tmp,
      logFile: path.join(tmp, "worker.log"),
      layout,
      onEvent,
      bindings: {
        GEMINI_WEBHOOK_SECRETS: GEMINI_SECRETS.join(" "),
        EFFECT_URL: `${dest.url}/effects`,
        EFFECT_SIGNING_SECRET: EFFECT_SECRET,
        ADMIN_TOKEN,
        GEMINI_API_BASE: api.url,
        GEMINI_API_KEY,
        ...WORKER_VARS,
      },
    });
    await worker.start();
    const health = await httpJson(`${worker.base}/healthz`);
    if (health.status !== 200) throw new Error(`worker unhealthy: ${JSON.stringify(health.body)}`);

    run.t0 = Date.now();
    const since = () => Date.now() - run.t0;
    const hardDeadline = run.t0 + schedule.loadMs + 60_000 + o.lateAfterMs + o.ops * 400;

    // ---- observations: every admin answer about an operation, with send and receive times.
    const observations = new Map(ops.map((op) => [op.key, []]));
    const started = new Set(); // keys with a registration or delivery sent
    const adminHeaders = { authorization: `Bearer ${ADMIN_TOKEN}`, "content-type": "application/json" };
    const inspect = async (op) => {
      const sent = performance.now();
      let r;
      try {
        r = await httpJson(`${worker.base}/v1/operations/${encodeURIComponent(op.key)}`, { headers: adminHeaders }, 10_000);
      } catch {
        return null;
      }
      const recv = performance.now();
      if (r.status === 200) {
        observations.get(op.key).push({ sent, recv, status: r.body.status, version: r.body.version, done: r.body.effect_done });
        return r.body;
      }
      if (r.status === 404) {
        observations.get(op.key).push({ sent, recv, status: "absent", version: 0, done: false });
        return { status: "absent" };
      }
      return null;
    };
    const counters = { observations: 0 };
    let pollerStop = false;
    const pollers = [];
    // Round robin over the operations started so far; three polls in four go to those not yet
    // seen terminal with their side effect done, the fourth to any (a settled record must
    // stay settled, across kills too).
    const seenClosed = new Set();
    const cursors = { open: 0, any: 0 };
    const pollRng = makeRng(o.seed ^ 0x9011);
    for (let p = 0; p < 4; p++) {
      pollers.push((async () => {
        for (let n = 0; n < 1_000_000 && !pollerStop && !stopAll && Date.now() < hardDeadline; n++) {
          const any = [...started];
          const open = any.filter((k) => !seenClosed.has(k));
          if (!any.length || !worker.up) { await sleep(200); continue; }
          const pool = open.length && pollRng.chance(0.75) ? open : any;
          const which = pool === open ? "open" : "any";
          const op = byKey.get(pool[cursors[which]++ % pool.length]);
          const got = await inspect(op);
          counters.observations++;
          if (got && TERMINAL.has(got.status) && got.effect_done) seenClosed.add(op.key);
          // Paced so that the observer does not become the load.
          await sleep(got ? 10 : 100);
        }
      })());
    }

    // ---- Gemini's deliveries: at least once, retried with the same webhook-id until a 2xx.
    const deliveryStats = { planned: 0, http_attempts: 0, retried_attempts: 0, acked: 0, gave_up: 0, refused: 0, answers: {}, network_errors: 0, http_5xx: 0 };
    const countAnswer = (label) => { deliveryStats.answers[label] = (deliveryStats.answers[label] ?? 0) + 1; };
    const deliver = async (op, webhookId) => {
      const m = op.messages[webhookId];
      const body = m.body.replace('"timestamp":null', `"timestamp":"${iso(run.t0 + m.eventAt)}"`);
      const secret = GEMINI_SECRETS[m.secret];
      const giveUpAt = Date.now() + 120_000;
      for (let attempt = 0; attempt < 200 && !stopAll; attempt++) {
        if (attempt > 0) deliveryStats.retried_attempts++;
        deliveryStats.http_attempts++;
        const headers = sign(secret, webhookId, Math.floor(Date.now() / 1000), body);
        try {
          const r = await httpJson(`${worker.base}/webhooks/gemini`, { method: "POST", headers, body }, 15_000);
          if (r.status >= 200 && r.status < 300) {
            deliveryStats.acked++;
            countAnswer(r.body.outcome === "dropped" ? `dropped:${r.body.reason}` : r.body.outcome);
            return r.body;
          }
          if ([400, 401, 413].includes(r.status)) {
            deliveryStats.refused++;
            say(`chaos: delivery ${webhookId} refused ${r.status}: ${JSON.stringify(r.body)}`);
            return null;
          }
          deliveryStats.http_5xx++;
        } catch {
          deliveryStats.network_errors++;
        }
        if (Date.now() > giveUpAt) break;
        await sleep(Math.min(3000, 200 * 2 ** Math.min(attempt, 4)) * (0.5 + Math.random() / 2));
      }
      deliveryStats.gave_up++;
      return null;
    };
    const registrationStats = { sent: 0, created: 0, existed: 0, retried: 0, failed: 0 };
    const tooLate = []; // [key, answered at]: the registrations answered "too_late"
    const register = async (op) => {
      started.add(op.key);
      registrationStats.sent++;
      for (let attempt = 0; attempt < 200 && !stopAll; attempt++) {
        if (attempt > 0) registrationStats.retried++;
        try {
          const r = await httpJson(`${worker.base}/v1/operations`, { method: "POST", headers: adminHeaders, body: JSON.stringify({ name: op.name, kind: `chaos-${op.family}`, ...(op.results ? { results: "each" } : {}) }) });
          // Only the worker's own answer counts: between a kill and the restart the old port
          // is free, and another process on this machine may be listening there by then.
          const ours = r.body?.key === op.key;
          if (r.status === 201 && ours) { registrationStats.created++; return; }
          if (r.status === 200 && ours) {
            registrationStats.existed++;
            // A registration that lands after the job's first attempt (a kill delayed it past
            // the completion) cannot change that attempt's body: the worker keeps it plain.
            if (r.body.kind_change === "too_late") tooLate.push([op.key, Date.now()]);
            return;
          }
          if ((r.status === 400 || r.status === 401) && typeof r.body?.error === "string") break;
          if (!ours && r.status < 500) say(`chaos: a registration of ${op.name} was answered ${r.status} by something other than the worker; sent again`);
        } catch {}
        await sleep(Math.min(3000, 200 * 2 ** Math.min(attempt, 4)));
      }
      registrationStats.failed++;
    };
    const at = (ms, fn) => new Promise((resolve) => {
      const t = setTimeout(() => { timers.delete(t); Promise.resolve().then(fn).then(resolve, (e) => { say(`chaos: task failed: ${e.stack}`); resolve(); }); }, Math.max(0, ms - since()));
      timers.add(t);
    });

    const tasks = [];
    for (const op of ops) {
      if (op.registerAt !== null) tasks.push(at(op.registerAt, () => register(op)));
      if (!op.deliveries.length) continue;
      // Resolves true at the first acknowledged terminal delivery, false if none ever is.
      let firstAck;
      const acked = new Promise((r) => { firstAck = r; });
      let terminalLeft = op.deliveries.filter((d) => d.terminal).length;
      for (const d of op.deliveries) {
        deliveryStats.planned++;
        tasks.push(at(d.at, async () => {
          started.add(op.key);
          const answer = await deliver(op, d.webhookId);
          if (!d.terminal) return;
          if (answer) firstAck(true);
          if (--terminalLeft === 0) firstAck(false);
        }));
      }
      if (op.conflict || op.lateRegister) {
        tasks.push((async () => {
          if (!(await acked)) return;
          const ackedAt = since();
          const work = [];
          if (op.conflict) {
            deliveryStats.planned++;
            work.push(at(ackedAt + op.conflict.delay, () => deliver(op, op.conflict.webhookId)));
          }
          if (op.lateRegister) work.push(at(ackedAt + op.lateRegisterDelay, () => register(op)));
          await Promise.all(work);
        })());
      }
    }

    // ---- cron passes throughout, some overlapping.
    const cronStats = { triggered: 0, bursts: 0, answered: 0, failed: 0 };
    let cronInFlight = 0;
    const trigger = async () => {
      cronStats.triggered++;
      cronInFlight++;
      try {
        const r = await fetch(`${worker.base}/cdn-cgi/handler/scheduled?cron=${encodeURIComponent(CRON).replace(/%20/g, "+")}`, { signal: AbortSignal.timeout(30_000) });
        await r.text();
        if (r.ok) cronStats.answered++;
        else cronStats.failed++;
      } catch {
        cronStats.failed++;
      } finally {
        cronInFlight--;
      }
    };
    const cronRng = makeRng(o.seed ^ 0xc40);
    let loadOver = false;
    const cronLoop = (async () => {
      for (let n = 0; n < 100_000 && !loadOver && !stopAll; n++) {
        await sleep(cronRng.uniform(300, 1500));
        if (!worker.up || cronInFlight > 6) continue;
        const burst = cronRng.chance(0.2) ? cronRng.int(2, 3) : 1;
        if (burst > 1) cronStats.bursts++;
        for (let b = 0; b < burst; b++) trigger();
      }
    })();

    // ---- hard kills and restarts on the same state.
    const kills = [];
    const killLoop = (async () => {
      for (const killAt of schedule.killAt) {
        await at(killAt, async () => {
          const k = { at: Date.now(), generation: worker.generation };
          await worker.kill();
          k.deadAt = Date.now();
          await worker.start();
          k.upAt = Date.now();
          kills.push(k);
          say(`chaos: +${Math.round(since() / 1000)}s killed worker generation ${k.generation} (SIGKILL, process group); back after ${k.upAt - k.at} ms`);
        });
      }
    })();

    const load = [];
    const loadTimer = setInterval(() => load.push(os.loadavg()[0]), 5000);
    timers.add(loadTimer);
    progress = setInterval(() => {
      const keys = new Set(dest.requests.filter((r) => r.accepted && !r.webhookId?.startsWith("res_")).map((r) => r.key));
      say(`chaos: +${Math.round(since() / 1000)}s deliveries acked ${deliveryStats.acked}/${deliveryStats.planned}, effects for ${keys.size}/${ops.length} ops, passes ${events.reconcile_pass}, kills ${kills.length}, observations ${counters.observations}`);
    }, 10_000);

    // ---- the load phase ends when every scheduled action has finished.
    await Promise.race([Promise.all([...tasks, killLoop]), sleep(schedule.loadMs + 300_000)]);
    const lastCompletion = Math.max(...ops.map((op) => op.completeAt));
    if (since() < lastCompletion + 500) await sleep(lastCompletion + 500 - since());
    loadOver = true;
    await cronLoop;
    const loadEnd = since();
    say(`chaos: +${Math.round(loadEnd / 1000)}s load phase over; settling`);

    // ---- settle: cron passes until everything is terminal and done, or the deadline passes:
    // o.lateAfterMs after the load phase's end (an effect accepted later is late), or longer
    // for a large run.
    const kvList = async () => {
      try {
        const r = await httpJson(`${worker.control}/kv?prefix=op:`, {}, 30_000);
        return r.status === 200 ? new Map(r.body.map((e) => [e.name.slice(3), e.metadata])) : null;
      } catch {
        return null;
      }
    };
    const snapshot = async () => {
      const views = new Map();
      let next = 0;
      await Promise.all(Array.from({ length: 6 }, async () => {
        while (next < ops.length) {
          const op = ops[next++];
          views.set(op.key, await inspect(op));
        }
      }));
      return views;
    };
    const settleDeadline = Date.now() + Math.max(60_000 + o.ops * 200, o.lateAfterMs + 5_000);
    let settled = false, settleRounds = 0;
    for (let round = 0; round < 10_000 && Date.now() < settleDeadline && !stopAll; round++) {
      await trigger();
      await sleep(500);
      if (round % 3 !== 2) continue;
      settleRounds++;
      const views = await snapshot();
      const kv = await kvList();
      const acceptedKeys = new Set(dest.requests.filter((r) => r.accepted).map((r) => r.key));
      let done = 0;
      for (const op of ops) {
        const v = views.get(op.key);
        const meta = kv?.get(op.key);
        if (v && TERMINAL.has(v.status) && v.effect_done && meta && TERMINAL.has(meta.status) && meta.effect_done && acceptedKeys.has(op.key)) done++;
      }
      if (done === ops.length) { settled = true; break; }
    }
    const settleEnd = since();
    // A quiet tail longer than the claim TTL: any stray retry would show up now.
    await sleep(4000);
    await trigger();
    await sleep(1000);
    pollerStop = true;
    await Promise.all(pollers);
    clearInterval(progress);
    clearInterval(loadTimer);
    say(`chaos: +${Math.round(since() / 1000)}s settle ${settled ? "complete" : "stopped at the deadline"}; checking`);

    // ---- final state: every record with its history, and the KV ledger.
    const finalViews = await snapshot();
    const finalKv = (await kvList()) ?? new Map();
    await worker.stop();

    const loadEndAt = run.t0 + loadEnd;
    const evidence = { o, t0: run.t0, ops, byKey, dest, api, kills, observations, finalViews, finalKv, loadEndAt, tooLate };
    // Everything the check sees, to re-run it offline (node scripts/chaos.mjs --recheck FILE);
    // written before the check, so a check that throws leaves it too. Kept on a failure or --keep.
    const evidenceFile = path.join(tmp, "evidence.json");
    fs.writeFileSync(evidenceFile, JSON.stringify({
      o: { seed: o.seed, ops: o.ops, kills: o.kills, resultsShare: o.resultsShare, lateAfterMs: o.lateAfterMs }, t0: run.t0, loadEndAt, kills,
      dest: { stats: dest.stats, requests: dest.requests }, api: { stats: api.stats },
      observations: [...observations], finalViews: [...finalViews], finalKv: [...finalKv], tooLate,
    }));
    result = check(evidence);
    Object.assign(result.stats, {
      elapsed_s: Math.round((Date.now() - wallStart) / 1000),
      load_phase_s: Math.round(loadEnd / 1000),
      settle_s: Math.round((settleEnd - loadEnd) / 1000),
      settled_before_deadline: settled,
      silent_latency_p50: percentile(result.silentLatency, 50),
      silent_latency_max: result.silentLatency.length ? Math.max(...result.silentLatency) : null,
      settle_rounds: settleRounds,
      deliveries: deliveryStats,
      registrations: registrationStats,
      cron: cronStats,
      worker_events: events,
      status_api: api.stats,
      destination: dest.stats,
      observations: counters.observations,
      loadavg_1m: { mean: load.length ? Math.round((load.reduce((a, b) => a + b, 0) / load.length) * 100) / 100 : null, max: load.length ? Math.max(...load) : null, cpus: os.cpus().length },
      kills: kills.map((k) => ({ at_s: Math.round((k.at - run.t0) / 100) / 10, down_ms: k.upAt - k.at })),
      outage: schedule.outage,
      tmp,
    });
  } finally {
    await cleanup();
    activeCleanups.delete(cleanup);
  }

  const s = result.stats;
  const f = result.faults;
  out(`chaos-detail: schedule ops=${s.schedule.ops} batches=${s.schedule.batches} interactions=${s.schedule.interactions} videos=${s.schedule.videos} silent=${s.schedule.silent} early=${s.schedule.early} late_registered=${s.schedule.late_registered} never_registered=${s.schedule.never_registered} outcomes=${JSON.stringify(s.schedule.outcomes)}`);
  out(`chaos-detail: deliveries planned=${s.deliveries.planned} same_id_repeats=${s.schedule.same_id_repeats} fresh_id_duplicates=${s.schedule.fresh_id_duplicates} concurrent=${s.schedule.concurrent} conflicting_terminals=${s.schedule.conflicting} requires_action=${s.schedule.requires_action} http_attempts=${s.deliveries.http_attempts} retried=${s.deliveries.retried_attempts} network_errors=${s.deliveries.network_errors} http_5xx=${s.deliveries.http_5xx} gave_up=${s.deliveries.gave_up} refused=${s.deliveries.refused} answers=${JSON.stringify(s.deliveries.answers)}`);
  out(`chaos-detail: faults status_429=${f.status_429} status_500=${f.status_500} status_stale=${f.status_stale} dest_5xx=${f.dest_5xx} dest_outage=${f.dest_outage} (${Math.round(s.outage?.ms ?? 0)} ms at ${Math.round((s.outage?.at ?? 0) / 100) / 10} s) dest_slow=${f.dest_slow} dest_over_timeout=${f.dest_over_timeout} kills=${f.kills} (downtime ms ${s.kills.map((k) => k.down_ms).join(",")})`);
  out(`chaos-detail: cron triggered=${s.cron.triggered} overlapping_bursts=${s.cron.bursts} passes_logged=${s.worker_events.reconcile_pass} lease_busy=${s.worker_events.lease_busy} complete=${s.worker_events.pass_complete} settled_by_reconcile=${s.worker_events.settled_by_reconcile} status_calls=${s.status_api.calls} queue_messages=${s.worker_events.other?.reconcile_job ?? 0}`);
  out(`chaos-detail: effects requests=${s.destination.requests} accepted=${s.destination.accepted} keys=${s.effect_keys} duplicates_by_cause=${JSON.stringify(result.causes)} bad_signatures=${s.destination.bad_signature} wrong_effect_status=${result.checks.wrong_effect_status} unknown_keys=${result.checks.unknown_keys} settled_by=${JSON.stringify(s.settled_by)}`);
  out(`chaos-detail: checks final_wrong_status=${result.checks.final_wrong_status} effect_not_done=${result.checks.effect_not_done} version_rollbacks=${result.checks.version_rollbacks} done_rollbacks=${result.checks.done_rollbacks} observations=${s.observations} silent_settle_latency_ms p50=${s.silent_latency_p50} max=${s.silent_latency_max} elapsed_s=${s.elapsed_s} (load phase ${s.load_phase_s}, settle ${s.settle_s}, settled=${s.settled_before_deadline}) loadavg_1m mean=${s.loadavg_1m.mean} max=${s.loadavg_1m.max} cpus=${s.loadavg_1m.cpus}`);
  const rs = result.results;
  out(`chaos-results: batches=${rs.batches} registered_too_late=${rs.registered_too_late} results=${rs.expected} delivered=${rs.delivered} missing=${rs.missing} unknown_ids=${rs.unknown} repeats=${rs.repeats} job_after_results=${rs.job_after_results}/${rs.batches} counts_right=${rs.counts_right}/${rs.batches} late_jobs=${result.late.count} last_job_after_load_s=${result.late.lastAfterLoadS} kills_mid_file=${rs.kills_mid_file} downloads=${s.status_api.downloads} ranged=${s.status_api.ranged} file_not_yet=${s.status_api.file_not_yet} file_503=${s.status_api.file_503} file_cut=${s.status_api.file_cut}`);
  for (const line of result.problems.slice(0, 40)) out(`chaos-problem: ${line}`);
  if (o.json) fs.writeFileSync(o.json, JSON.stringify({ line: result.line, ok: result.ok, causes: result.causes, faults: result.faults, checks: result.checks, problems: result.problems, stats: result.stats, duplicates: result.duplicateDetails, silent: result.silentDetails }, null, 2));
  if (result.ok && !o.keep) fs.rmSync(tmp, { recursive: true, force: true });
  else say(`chaos: state, worker.log and configs kept in ${tmp}`);
  out(result.line);
  return result;
}
