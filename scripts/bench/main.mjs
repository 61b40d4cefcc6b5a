#!/usr/bin/env node
// The benchmark: the built worker in workerd (Miniflare, listening on 127.0.0.1)
// against local stand-ins for the destination and Gemini's status API, measured over real
// HTTP with a keep-alive node client. A command, not a test: it asserts nothing about time.
//
//   npm run bench                        full mode (several minutes)
//   npm run bench -- --quick             smoke mode (seconds)
//   npm run bench -- --no-build          skip `bash scripts/build.sh`, use build/ as it is
//   npm run bench -- --json out.json     where to write the raw figures (default: a temp file)
//   npm run bench -- --only build,fast,profile,reconcile   run some sections only
//   npm run bench -- --sizes 1000,10000 ledger sizes for the reconciliation section
//   npm run bench -- --rounds 3 --seconds 3        rounds and seconds per measured cell
//   npm run bench -- --no-wrangler       skip the `wrangler dev` start-up measurement
//   npm run bench -- --no-variants       fast path: the four scenarios only (no profile variants)
//   npm run bench -- --cost-ops 200      operations per flow in the cost section ("cost")
//   npm run bench -- --backlog 100000 --backlog-rate 1000
//                                        open operations in the backlog section ("backlog") and
//                                        the RECONCILE_POLL_RATE it runs at (default 100,000 at
//                                        1,000 a second: this machine's pace, not the default's)
//   npm run bench -- --outage 10000 --outage-seconds 120
//                                        effects waiting on a down destination in the outage
//                                        section ("outage") and how long it stays down
//   npm run bench -- --only results      the results section ("results", not run by default):
//   npm run bench -- --only results --results-lines 10000,100000 --results-dest-ms 0,100
//                                        a batch's results file of N lines (about 1 KB each)
//                                        delivered one effect per line, at each destination delay
//                                        (--results-timeout minutes per cell, default 20)
//   npm run bench -- --only results --results-inline-mb 20 --results-dest-ms 0
//                                        instead, the batch's results inline in a status answer
//                                        of about 20 MB (the list twice, as Gemini writes it):
//                                        the isolate's peak memory while it is read and sent
//   node scripts/bench/start_results.mjs --lines 10000 --via start,miniflare
//                                        a results batch through `npm start` (wrangler dev),
//                                        then in Miniflare: lines a second, what runs between
//                                        chunks, the CPU of each process (a script of its own)
//   npm run bench -- --peer DIR          also the side-by-side section ("side"): the simple
//                                        design in DIR (DIR/src/index.ts, DIR/wrangler.toml)
//                                        against gemini-once; `--only side` runs only it
//   npm run bench -- --peer DIR --side-ops 1000 --side-conc 1,10,50 --idle 15
//                                        its registered operations per round and concurrency,
//                                        concurrencies, and idle seconds after every cell
//                                        (rounds and seconds: --rounds, --seconds)
//   npm run bench -- --peer DIR --no-minimum   without the minimum designs (below)
//   npm run bench -- --peer DIR --dest-ms 100,250   side by side: first deliveries again with the
//                                        destination answering after each delay (default 100;
//                                        0 alone leaves them out)
//
// What it reports:
//  - fast path, each as p50/p99 latency and throughput at concurrency 1, 10 and 50, and its
//    ratio to the floor measured in the same round: the floor (GET /healthz), a first
//    delivery of a completion (new operation each time), a duplicate delivery of a done
//    completion, a rejected delivery (bad signature); plus profile variants at
//    concurrency 1 and 10 (an unknown event type kept as a dead letter, a first delivery that
//    owes no side effect, duplicates all for one key) and the `ms` fields the worker logs;
//  - reconciliation passes over ledgers of 1,000, 10,000, 100,000 (and, with --sizes,
//    1,000,000) entries, 1% needing work (real operations registered through the admin API,
//    non-terminal, the status stub answering RUNNING, so the gate writes their `open:` index
//    entries), the rest seeded straight into KV as done `op:` entries with the value and
//    metadata the gate writes (done entries have no index entry): first the audit over the
//    whole ledger, then routine coverages; every count from the worker's own `reconcile_pass`
//    log lines, and how many cron runs cover the ledger at the default budget;
//  - with --peer, side by side with the simple design, both in the same run:
//    registration, first (a new completion for a registered operation), duplicate (the same
//    delivery again, after an idle period), rejected, floor, and first again with a destination
//    that takes time (--dest-ms); req/s and p50 (median over rounds), the ratio
//    gemini-once/peer, the effect's delay after the answer, and per request what is seen
//    from outside (effects, log lines by event, KV keys created); and,
//    in the same cells, the minimum of the shape (scripts/bench/minimum.mjs: the least a design
//    with a durable owner per operation does, in plain JS, one object per operation or 16
//    shared objects): registration, first and duplicate, so a missed target shows its limit;
//  - the cost section: per completion, by flow (webhook, registration, registered
//    then webhook, recovered by cron, duplicate, retirement), what the Durable Objects used as
//    they count it themselves (USAGE_LOG lines: SQLite rows, alarm and KV writes, calls, wall
//    time, database size), KV's footprint, and the monthly bill at Cloudflare's rates;
//  - the backlog: N open operations (a day of lost webhooks) recovered by passes that fan their
//    polls out on the worker's own queue: passes, KV lists, queue messages and subrequests,
//    time until every one is polled and the 1% done are settled with their side effects;
//  - the destination outage: N completions to a destination that answers 503 for a while,
//    then recovers: requests it receives per failing effect per hour (one first attempt each,
//    then the desk's probes), and the time from its recovery to the last waiting effect's
//    delivery;
//  - with --only results, a batch's results: lines a second, time to the last line, CPU per
//    line, the isolate's peak live memory and workerd's peak RSS at each file size and
//    destination delay, and the bill per
//    million results (scripts/bench/results.mjs);
//  - the build: wasm size raw and gzip, what takes the space, and the time from process start
//    to the first answered request (Miniflare in a fresh node process, and `wrangler dev`).
//
// Every server listens on 127.0.0.1; every loop is bounded; every child process is killed.
// build/ is copied to a temp directory first, so a rebuild during the run changes nothing.
import { spawnSync, execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { workerLayout } from "../local_worker.mjs";

import { MAX_DEST_MS, SELF, cleanup, setWrangler, installSignalHandlers, now, root, round, tempDirs } from "./common.mjs";
import { runStubs, startStubs } from "./stubs.mjs";
import { serveOnce } from "./worker.mjs";
import { benchBuild } from "./wasm.mjs";
import { benchFast } from "./fast.mjs";
import { benchProfile } from "./profile.mjs";
import { benchReconcile } from "./reconcile.mjs";
import { benchBacklog } from "./backlog.mjs";
import { benchOutage } from "./outage.mjs";
import { benchCost } from "./cost.mjs";
import { evaluateTargets, report } from "./report.mjs";
import { benchSide } from "./side.mjs";
import { benchResults } from "./results.mjs";

function parseArgs(argv) {
  const a = { quick: false, build: true, json: null, only: null, sizes: null, rounds: null, seconds: null, wrangler: true, variants: true, peer: null, sideOps: null, sideConc: null, idle: null, costOps: null, backlog: null, backlogRate: null, minimum: true, destMs: null };
  for (let i = 0; i < argv.length; i++) {
    const v = argv[i];
    if (v === "--quick") a.quick = true;
    else if (v === "--no-build") a.build = false;
    else if (v === "--json") a.json = argv[++i];
    else if (v === "--only") a.only = new Set(argv[++i].split(","));
    else if (v === "--sizes") a.sizes = argv[++i].split(",").map(Number);
    else if (v === "--rounds") a.rounds = Number(argv[++i]);
    else if (v === "--seconds") a.seconds = Number(argv[++i]);
    else if (v === "--no-wrangler") a.wrangler = false;
    else if (v === "--no-variants") a.variants = false;
    else if (v === "--peer") a.peer = path.resolve(argv[++i]);
    else if (v === "--side-ops") a.sideOps = Number(argv[++i]);
    else if (v === "--no-minimum") a.minimum = false;
    else if (v === "--cost-ops") a.costOps = Number(argv[++i]);
    else if (v === "--backlog") a.backlog = Number(argv[++i]);
    else if (v === "--backlog-rate") a.backlogRate = Number(argv[++i]);
    else if (v === "--outage") a.outageWaiting = Number(argv[++i]);
    else if (v === "--outage-seconds") a.outageSeconds = Number(argv[++i]);
    else if (v === "--results-lines") a.resultsLines = argv[++i].split(",").map(Number);
    else if (v === "--results-dest-ms") a.resultsDestMs = argv[++i].split(",").map(Number);
    else if (v === "--results-timeout") a.resultsTimeout = Number(argv[++i]);
    else if (v === "--results-inline-mb") a.resultsInlineMb = Number(argv[++i]);
    else if (v === "--side-conc") a.sideConc = argv[++i].split(",").map(Number);
    else if (v === "--idle") a.idle = Number(argv[++i]);
    else if (v === "--dest-ms") {
      a.destMs = argv[++i].split(",").map(Number);
      if (a.destMs.some((ms) => !Number.isInteger(ms) || ms < 0 || ms > MAX_DEST_MS)) throw new Error(`--dest-ms takes whole milliseconds from 0 to ${MAX_DEST_MS}, comma-separated`);
    }
    else if (v === "--help" || v === "-h") {
      const lines = fs.readFileSync(SELF, "utf8").split("\n").slice(1);
      console.log(lines.slice(0, lines.findIndex((l) => !l.startsWith("//"))).map((l) => l.replace(/^\/\/ ?/, "")).join("\n"));
      process.exit(0);
    } else throw new Error(`unknown argument ${v} (see --help)`);
  }
  return a;
}

async function main() {
  installSignalHandlers();
  const args = parseArgs(process.argv.slice(2));
  setWrangler(await workerLayout());
  const quick = args.quick;
  const sections = args.only ?? new Set(["build", "fast", "profile", "reconcile", "backlog", "outage", "cost", ...(args.peer ? ["side"] : [])]);
  if (sections.has("side") && !args.peer) throw new Error("--only side needs --peer DIR");
  const plan = {
    mode: quick ? "quick" : "full",
    quick,
    rounds: args.rounds ?? (quick ? 1 : 4),
    seconds: args.seconds ?? (quick ? 0.4 : 2),
    sizes: args.sizes ?? (quick ? [1_000] : [1_000, 10_000, 100_000]),
    profileSeconds: quick ? 0.5 : 3,
    startup_samples: quick ? 1 : 3,
    wrangler: args.wrangler && !quick,
    variants: args.variants,
    cost: { ops: args.costOps ?? (quick ? 20 : 200) },
    backlog: { open: args.backlog ?? (quick ? 500 : 100_000), rate: args.backlogRate ?? 1_000 },
    outage: { waiting: args.outageWaiting ?? (quick ? 200 : 10_000), downSeconds: args.outageSeconds ?? (quick ? 20 : 120) },
    results: {
      sizes: args.resultsLines ?? (quick ? [200] : [10_000, 100_000]),
      destMs: args.resultsDestMs ?? (quick ? [0] : [0, 100]),
      lineBytes: 1024,
      timeoutMs: (args.resultsTimeout ?? (quick ? 3 : 20)) * 60_000,
      inlineMb: args.resultsInlineMb ?? null,
    },
  };
  if (plan.results.sizes.some((n) => !Number.isInteger(n) || n < 1) || plan.results.destMs.some((ms) => !Number.isInteger(ms) || ms < 0 || ms > MAX_DEST_MS)) throw new Error("--results-lines takes whole numbers of lines, --results-dest-ms whole milliseconds");
  if (sections.has("side")) {
    plan.side = {
      rounds: args.rounds ?? (quick ? 1 : 3),
      seconds: args.seconds ?? (quick ? 1 : 3),
      ops: args.sideOps ?? (quick ? 200 : 1_000),
      concurrency: args.sideConc ?? (quick ? [10] : [1, 10, 50]),
      idleMs: (args.idle ?? (quick ? 2 : 15)) * 1000,
      minimum: args.minimum,
      // A real destination takes time: 100 ms is a short round trip to a service on the internet.
      destMs: args.destMs ?? [100],
    };
  }
  // The side-by-side section idles between cells: a longer bound when it runs.
  const watchdogMin = plan.side ? 150 : sections.has("results") ? 120 : 60;
  const watchdog = setTimeout(async () => {
    console.error(`bench: watchdog (${watchdogMin} min) fired; stopping`);
    await cleanup();
    process.exit(2);
  }, watchdogMin * 60_000);
  watchdog.unref();

  if (args.build) {
    console.error("== build (bash scripts/build.sh)");
    const r = spawnSync("bash", [path.join(root, "scripts/build.sh")], { stdio: "inherit", cwd: root });
    if (r.status !== 0) throw new Error("build failed");
  }
  if (!fs.existsSync(path.join(root, "build/index.js"))) throw new Error("build/index.js missing: run without --no-build");
  const work = fs.mkdtempSync(path.join(os.tmpdir(), "gemini-once-bench-"));
  tempDirs.add(work);
  const dir = path.join(work, "build");
  fs.cpSync(path.join(root, "build"), dir, { recursive: true });

  const results = { plan, machine: machineInfo(dir), started_at: new Date().toISOString() };
  const t0 = now();
  console.error(`== gemini-once bench (${plan.mode}); build copied to ${dir}`);

  if (sections.has("build")) {
    console.error("== build: wasm size and start-up");
    results.build = await benchBuild(dir, work, plan);
  }
  const stubs = await startStubs();
  try {
    if (sections.has("fast")) {
      console.error("== fast path");
      results.fast = await benchFast(dir, stubs, plan);
    }
    if (sections.has("profile")) {
      console.error("== profile (V8 CPU profiles through the inspector)");
      results.profile = await benchProfile(dir, stubs, plan);
    }
    if (sections.has("reconcile")) {
      console.error("== reconciliation");
      results.reconcile = [];
      for (const size of plan.sizes) results.reconcile.push(await benchReconcile(dir, stubs, size));
    }
    if (sections.has("backlog")) {
      console.error(`== backlog: ${plan.backlog.open} open operations fanned out on the queue`);
      results.backlog = await benchBacklog(dir, stubs, plan.backlog);
    }
    if (sections.has("outage")) {
      console.error(`== destination outage: ${plan.outage.waiting} effects, ${plan.outage.downSeconds} s down`);
      results.outage = await benchOutage(dir, plan.outage);
    }
    if (sections.has("results")) {
      console.error(`== results: ${plan.results.sizes.join(", ")} lines at destination ${plan.results.destMs.join(", ")} ms`);
      results.results = await benchResults(dir, plan.results);
    }
    if (sections.has("cost")) {
      console.error("== cost: what one completion uses (USAGE_LOG lines)");
      results.cost = await benchCost(dir, stubs, plan);
    }
    if (sections.has("side")) {
      console.error(`== side by side with the simple design in ${args.peer}`);
      results.side = await benchSide(dir, stubs, plan, args.peer);
    }
  } finally {
    stubs.stop();
  }
  results.machine.loadavg_end = os.loadavg().map((x) => round(x));
  results.total_seconds = round((now() - t0) / 1000, 1);
  results.targets = evaluateTargets(results);

  const jsonPath = args.json ? path.resolve(args.json) : path.join(os.tmpdir(), `gemini-once-bench-${Date.now()}.json`);
  fs.writeFileSync(jsonPath, JSON.stringify(results, null, 2) + "\n");
  console.log(report(results));
  console.log(`\nraw figures: ${jsonPath}`);
  await cleanup();
  process.exit(0);
}

function machineInfo(dir) {
  const cpuinfo = fs.existsSync("/proc/cpuinfo") ? fs.readFileSync("/proc/cpuinfo", "utf8") : "";
  const model = /model name\s*:\s*(.*)/.exec(cpuinfo)?.[1] ?? os.cpus()[0]?.model ?? "unknown";
  const mhz = /cpu MHz\s*:\s*(.*)/.exec(cpuinfo)?.[1];
  let commit = null;
  try { commit = execFileSync("git", ["rev-parse", "--short", "HEAD"], { cwd: root, encoding: "utf8" }).trim(); } catch {}
  const ver = (p) => { try { return JSON.parse(fs.readFileSync(path.join(root, "node_modules", p, "package.json"), "utf8")).version; } catch { return null; } };
  const wasm = fs.readFileSync(path.join(dir, "index_bg.wasm"));
  return {
    cores: os.cpus().length,
    cpu_model: model,
    cpu_mhz: mhz ? Number(mhz) : null,
    memory_gib: round(os.totalmem() / 2 ** 30, 1),
    os: `${os.type()} ${os.release()}`,
    node: process.version,
    miniflare: ver("miniflare"),
    workerd: ver("workerd"),
    wrangler: ver("wrangler"),
    git_commit: commit,
    wasm_sha256: createHash("sha256").update(wasm).digest("hex").slice(0, 16),
    build_mtime: fs.statSync(path.join(root, "build/index_bg.wasm")).mtime.toISOString(),
    loadavg_start: os.loadavg().map((x) => round(x)),
  };
}

// ---------------------------------------------------------------------------------------
// Entry (also through scripts/bench.mjs, which only imports this file).

const ENTRY_POINTS = [SELF, path.join(root, "scripts/bench.mjs")];
if (process.argv[2] === "--_stubs") {
  runStubs();
} else if (process.argv[2] === "--_serve") {
  setWrangler(JSON.parse(process.argv[4])); // read by the parent: not part of the start-up timed
  serveOnce(process.argv[3], Number(process.argv[5]));
} else if (process.argv[1] && ENTRY_POINTS.includes(path.resolve(process.argv[1]))) {
  main().catch(async (e) => {
    console.error(e?.stack ?? String(e));
    await cleanup();
    process.exit(1);
  });
}
