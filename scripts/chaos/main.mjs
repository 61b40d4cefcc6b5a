#!/usr/bin/env node
// The chaos run: `npm run chaos -- [--seed N] [--ops N] [--kills N] [--results-share F] [--late-after S] [--no-build]
// [--keep] [--json FILE]`; `node scripts/chaos.mjs --recheck DIR/evidence.json` re-checks a kept run.
//
// Builds the worker (unless --no-build), copies build/ into a fresh temporary directory and runs
// it in workerd through Miniflare in a child process of its own (its own process group, with
// KV and Durable Object state persisted in that directory), next to local stand-ins for
// Gemini's status API and the side-effect destination (node http servers on 127.0.0.1). It then
// plays a randomized schedule derived from the seed: registrations, signed deliveries
// (retries with the same webhook-id, fresh duplicates, reordered, concurrent, conflicting late
// terminals, completions before registration, operations never delivered), faults in both
// stand-ins, cron passes (some overlapping) and hard kills (SIGKILL of the whole process group,
// workerd included) with restarts on the same state. It polls the admin API throughout and
// keeps every observation, lets reconciliation settle everything, checks the outcome against
// the schedule's ground truth, and prints as its last line:
//
//   chaos: seed=S ops=N deliveries=D faults=F effects=E duplicate_effects=X explained=Y lost=L regressions=R unsettled=U
//
// ops counts the --ops operations and the batches registered with `"results":"each"` (one per
// kill, plus one; each succeeds with a file of a few hundred lines served by the stand-in, the
// first ones a few seconds before a kill so that it comes while the file is read); the line
// before it (`chaos-results: ...`) says whether every result arrived once under its id, and
// `late_jobs`: the operations whose first side effect was not accepted within 5 minutes (or
// --late-after S) of the load phase's end. --results-share F also registers that share of the succeeded batches among
// the --ops operations with `"results":"each"` (a file of 50 to 150 lines each).
//
// It exits 0 only when lost, regressions and unsettled are 0, every duplicate is explained
// (X = Y), and the extra checks (oracle.mjs) found nothing.
//
// The schedule (operations, deliveries, timings, kill times) is a pure function of the seed;
// the interleaving with the worker is not, so two runs of one seed differ in detail.
//
// Ground truth: every operation of the schedule ends at Gemini in one terminal outcome. The
// status stand-in answers that outcome from the operation's completion time on (or a stale,
// older non-terminal state with an older update time, or a 429/500); every terminal delivery
// carries that outcome, and a conflicting late terminal is only sent after a true one was
// acknowledged, so the first terminal to reach the worker is always the planned outcome.
//
// The definitions of effects, duplicates, lost, regressions and unsettled, and the extra
// checks: scripts/chaos/oracle.mjs. The parts: schedule.mjs (the seeded schedule), standins.mjs
// (Gemini's status API and the destination), supervisor.mjs (the worker process, kills,
// restarts), run.mjs (the run), oracle.mjs (the checks), config.mjs (what they share).
import fs from "node:fs";
import path from "node:path";

import { buildSchedule } from "./schedule.mjs";
import { activeCleanups, runChaos } from "./run.mjs";
import { check } from "./oracle.mjs";
import { workerChild } from "./supervisor.mjs";
import { SELF, ROOT } from "./config.mjs";

export function parseArgs(argv) {
  const o = { seed: null, ops: 500, kills: 2, resultsShare: 0, lateAfterMs: 300_000, build: true, keep: false, json: null };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const value = () => {
      const v = argv[++i];
      if (v === undefined) throw new Error(`${a} needs a value`);
      return v;
    };
    const int = (v, min) => {
      const n = Number(v);
      if (!Number.isInteger(n) || n < min) throw new Error(`${a} must be an integer >= ${min}`);
      return n;
    };
    if (a === "--seed") o.seed = int(value(), 0);
    else if (a === "--ops") o.ops = int(value(), 1);
    else if (a === "--kills") o.kills = int(value(), 0);
    else if (a === "--late-after") o.lateAfterMs = int(value(), 1) * 1000;
    else if (a === "--results-share") {
      const v = Number(value());
      if (!(v >= 0 && v <= 1)) throw new Error(`${a} must be a number from 0 to 1`);
      o.resultsShare = v;
    }
    else if (a === "--no-build") o.build = false;
    else if (a === "--keep") o.keep = true;
    else if (a === "--json") o.json = value();
    else if (a === "--recheck") o.recheck = value();
    else if (a === "--help" || a === "-h") o.help = true;
    else throw new Error(`unknown argument ${a}`);
  }
  if (o.seed === null) o.seed = Math.floor(Math.random() * 1_000_000);
  return o;
}

async function main() {
  let o;
  try {
    o = parseArgs(process.argv.slice(2));
  } catch (e) {
    console.error(`chaos: ${e.message}\nusage: npm run chaos -- [--seed N] [--ops N] [--kills N] [--results-share F] [--late-after S] [--no-build] [--keep] [--json FILE] | --recheck EVIDENCE.json`);
    process.exit(2);
  }
  if (o.help) {
    console.log("usage: npm run chaos -- [--seed N] [--ops N] [--kills N] [--results-share F] [--late-after S] [--no-build] [--keep] [--json FILE] | --recheck EVIDENCE.json");
    return;
  }
  if (o.recheck) {
    // Re-runs the check on a kept evidence.json (the schedule is rebuilt from its seed).
    const e = JSON.parse(fs.readFileSync(o.recheck, "utf8"));
    const schedule = buildSchedule(e.o.seed, e.o.ops, e.o.kills, e.o.kills + 1, e.o.resultsShare ?? 0);
    const r = check({ o: e.o, t0: e.t0, ops: schedule.ops, byKey: new Map(schedule.ops.map((op) => [op.key, op])), dest: e.dest, api: e.api, kills: e.kills, observations: new Map(e.observations), finalViews: new Map(e.finalViews), finalKv: new Map(e.finalKv), loadEndAt: e.loadEndAt, tooLate: e.tooLate ?? [] });
    for (const line of r.problems.slice(0, 40)) console.log(`chaos-problem: ${line}`);
    console.log(`chaos-detail: duplicates_by_cause=${JSON.stringify(r.causes)}`);
    console.log(r.line);
    process.exit(r.ok ? 0 : 1);
  }
  const onSignal = async (sig) => {
    console.error(`chaos: ${sig}: stopping`);
    await Promise.all([...activeCleanups].map((c) => c().catch(() => {})));
    process.exit(130);
  };
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  try {
    const result = await runChaos(o);
    process.exit(result.ok ? 0 : 1);
  } catch (e) {
    console.error(`chaos: run failed: ${e.stack ?? e}`);
    await Promise.all([...activeCleanups].map((c) => c().catch(() => {})));
    // No figures to report: say so on the last line instead of inventing a summary.
    console.log(`chaos: seed=${o.seed} ops=${o.ops} error=${JSON.stringify(String(e.message ?? e))}`);
    process.exit(1);
  }
}

// Entry (also through scripts/chaos.mjs, which only imports this file).
const ENTRY_POINTS = [SELF, path.join(ROOT, "scripts/chaos.mjs")];
if (process.argv[2] === "--worker-child") {
  workerChild(process.argv[3]).catch((e) => {
    console.error(`worker child: ${e.stack ?? e}`);
    try { process.kill(-process.pid, "SIGKILL"); } catch {}
    process.exit(1);
  });
} else if (process.argv[1] && ENTRY_POINTS.includes(path.resolve(process.argv[1]))) {
  main();
}
