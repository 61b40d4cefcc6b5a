#!/usr/bin/env node
// The benchmark of issue 5: the built worker in workerd (Miniflare, listening on 127.0.0.1)
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
//  - the build: wasm size raw and gzip, what takes the space, and the time from process start
//    to the first answered request (Miniflare in a fresh node process, and `wrangler dev`).
//
// Every server listens on 127.0.0.1; every loop is bounded; every child process is killed.
// build/ is copied to a temp directory first, so a rebuild during the run changes nothing.
import { spawn, spawnSync, execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import zlib from "node:zlib";

import { sign } from "./send.mjs";
import { eachLine, freePort, logObject, workerLayout } from "./local_worker.mjs";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const SELF = fileURLToPath(import.meta.url);

const GEMINI_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const OTHER_SECRET = "whsec_b3RoZXItc2VjcmV0LW5vdC1nZW1pbmlzLWtleQ==";
const EFFECT_SECRET = "whsec_c2lkZS1lZmZlY3Qtc2VjcmV0LWZvci10ZXN0cw==";
const ADMIN_TOKEN = "bench-admin-token-0123456789";
const CRON = "*/5 * * * *";
const DEFAULT_BUDGET = 900;
const RETENTION_SECS = 14 * 86_400;

// ---------------------------------------------------------------------------------------
// Internal child modes: the stub servers, and a worker served for the start-up measurement.

// (dispatched at the end of this file, once every declaration is initialized)

/** The destination (200 at once) and Gemini's status API (RUNNING), counting what they see. */
function runStubs() {
  let stats = freshStats();
  function freshStats() {
    return { effects: 0, effectKeys: new Set(), effectRepeats: 0, effectOwnMs: 0, effectOwnMax: 0, polls: 0, pollPaths: new Map(), other: 0 };
  }
  const server = http.createServer((req, res) => {
    const t0 = process.hrtime.bigint();
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const url = req.url;
      if (req.method === "POST" && url.startsWith("/effects")) {
        const key = req.headers["idempotency-key"] ?? "";
        stats.effects++;
        if (stats.effectKeys.has(key)) stats.effectRepeats++;
        else stats.effectKeys.add(key);
        res.writeHead(200, { "content-type": "application/json" });
        res.end('{"ok":true}');
        const own = Number(process.hrtime.bigint() - t0) / 1e6;
        stats.effectOwnMs += own;
        stats.effectOwnMax = Math.max(stats.effectOwnMax, own);
        return;
      }
      if (req.method === "POST" && url.startsWith("/probe-effects")) {
        res.writeHead(200, { "content-type": "application/json" });
        return res.end('{"ok":true}');
      }
      if (req.method === "GET" && url.startsWith("/v1beta/")) {
        const p = url.slice("/v1beta/".length);
        stats.polls++;
        stats.pollPaths.set(p, (stats.pollPaths.get(p) ?? 0) + 1);
        res.writeHead(200, { "content-type": "application/json" });
        return res.end(JSON.stringify({
          name: p,
          metadata: { "@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch", state: "BATCH_STATE_RUNNING", updateTime: "2026-11-22T10:00:00Z" },
        }));
      }
      if (url === "/__reset") {
        stats = freshStats();
        res.writeHead(200);
        return res.end("{}");
      }
      if (url.startsWith("/__stats")) {
        const withPaths = url.includes("paths=1");
        res.writeHead(200, { "content-type": "application/json" });
        return res.end(JSON.stringify({
          effects: stats.effects,
          effect_keys: stats.effectKeys.size,
          effect_repeats: stats.effectRepeats,
          effect_own_ms_mean: stats.effects ? stats.effectOwnMs / stats.effects : null,
          effect_own_ms_max: stats.effectOwnMax,
          polls: stats.polls,
          poll_paths: withPaths ? Object.fromEntries(stats.pollPaths) : undefined,
          other: stats.other,
        }));
      }
      stats.other++;
      res.writeHead(404);
      res.end("{}");
    });
  });
  server.keepAliveTimeout = 30_000;
  server.listen(0, "127.0.0.1", () => {
    process.stdout.write(JSON.stringify({ port: server.address().port }) + "\n");
  });
  const stop = () => server.close(() => process.exit(0));
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
  // Never outlive the bench: exit when the parent's pipe closes.
  process.stdin.on("close", () => process.exit(0));
  process.stdin.resume();
}

/** Serves the built worker in `dir` on `port` until killed (start-up measurement). */
async function serveOnce(dir, port) {
  const { Miniflare } = await import("miniflare");
  const mf = new Miniflare(workerOptions(dir, baseVars({}), { port }));
  await mf.ready;
  const stop = async () => {
    await mf.dispose().catch(() => {});
    process.exit(0);
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
  process.stdin.on("close", stop);
  process.stdin.resume();
}

// ---------------------------------------------------------------------------------------
// Arguments, clean-up, small helpers.

function parseArgs(argv) {
  const a = { quick: false, build: true, json: null, only: null, sizes: null, rounds: null, seconds: null, wrangler: true, variants: true };
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
    else if (v === "--help" || v === "-h") {
      const lines = fs.readFileSync(SELF, "utf8").split("\n").slice(1);
      console.log(lines.slice(0, lines.findIndex((l) => !l.startsWith("//"))).map((l) => l.replace(/^\/\/ ?/, "")).join("\n"));
      process.exit(0);
    } else throw new Error(`unknown argument ${v} (see --help)`);
  }
  return a;
}

const children = new Set();
const workers = new Set();
const tempDirs = new Set();
let cleaning = null;

/** Kills every child process group and disposes every Miniflare; idempotent. */
function cleanup() {
  cleaning ??= (async () => {
    // Bounded: a Miniflare that hangs while disposing must not keep the bench alive.
    for (const w of workers) await Promise.race([w.mf.dispose().catch(() => {}), sleep(10_000)]);
    workers.clear();
    for (const c of children) killGroup(c);
    children.clear();
    for (const d of tempDirs) fs.rmSync(d, { recursive: true, force: true });
    tempDirs.clear();
  })();
  return cleaning;
}

function killGroup(child, signal = "SIGKILL") {
  if (child.exitCode !== null || child.signalCode !== null) return;
  try {
    process.kill(-child.pid, signal); // the child's own process group (spawned detached)
  } catch {
    try { child.kill(signal); } catch {}
  }
}

/** In the bench's own process only (child modes have their own handlers). */
function installSignalHandlers() {
  for (const sig of ["SIGINT", "SIGTERM"]) {
    process.on(sig, async () => {
      console.error(`\n${sig}: stopping children`);
      await cleanup();
      process.exit(130);
    });
  }
  process.on("exit", () => {
    for (const c of children) killGroup(c);
    for (const d of tempDirs) fs.rmSync(d, { recursive: true, force: true });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const now = () => performance.now();

function quantile(sorted, q) {
  if (!sorted.length) return null;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
  return sorted[i];
}
function summarize(values) {
  const s = Float64Array.from(values).sort();
  const sum = s.reduce((a, b) => a + b, 0);
  return { n: s.length, p50: quantile(s, 0.5), p90: quantile(s, 0.9), p99: quantile(s, 0.99), max: s.length ? s[s.length - 1] : null, mean: s.length ? sum / s.length : null };
}
const round = (x, d = 2) => (x === null || x === undefined || Number.isNaN(x) ? null : Math.round(x * 10 ** d) / 10 ** d);
function median(xs) {
  const s = Float64Array.from(xs).filter((x) => !Number.isNaN(x)).sort();
  if (!s.length) return null;
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

/** CPU time (ns) of a process: its main thread and all its threads, from /proc schedstat. */
function cpuOf(pid) {
  try {
    let total = 0;
    let main = 0;
    for (const t of fs.readdirSync(`/proc/${pid}/task`)) {
      const ns = Number(fs.readFileSync(`/proc/${pid}/task/${t}/schedstat`, "utf8").split(" ")[0]);
      total += ns;
      if (t === String(pid)) main = ns;
    }
    return { main, total };
  } catch {
    return null;
  }
}

/** Child processes of this process named `comm` (Miniflare's workerd). */
function childPids(comm) {
  const out = [];
  if (!fs.existsSync("/proc")) return out;
  for (const p of fs.readdirSync("/proc")) {
    if (!/^\d+$/.test(p)) continue;
    try {
      const st = fs.readFileSync(`/proc/${p}/stat`, "utf8");
      const name = st.slice(st.indexOf("(") + 1, st.lastIndexOf(")"));
      const ppid = Number(st.slice(st.lastIndexOf(")") + 2).split(" ")[1]);
      if (ppid === process.pid && name === comm) out.push(Number(p));
    } catch {}
  }
  return out;
}

/** Samples CPU of workerd (main thread and all), this client, and the stubs, for one cell. */
function cpuMeter(workerdPid, stubPid) {
  const w0 = workerdPid ? cpuOf(workerdPid) : null;
  const s0 = stubPid ? cpuOf(stubPid) : null;
  const c0 = process.cpuUsage();
  return (requests) => {
    const w1 = workerdPid ? cpuOf(workerdPid) : null;
    const s1 = stubPid ? cpuOf(stubPid) : null;
    const c1 = process.cpuUsage(c0);
    const per = (ns) => (requests ? round(ns / 1e6 / requests, 3) : null);
    return {
      workerd_main_ms_per_req: w0 && w1 ? per(w1.main - w0.main) : null,
      workerd_all_ms_per_req: w0 && w1 ? per(w1.total - w0.total) : null,
      client_ms_per_req: per((c1.user + c1.system) * 1000),
      stubs_ms_per_req: s0 && s1 ? per(s1.total - s0.total) : null,
    };
  };
}

/**
 * Waits until workerd's threads are nearly idle (background work a scenario caused, such as
 * alarms and waitUntil flushes, has finished), at most `maxMs`. Returns the time waited.
 */
async function quiesce(pid, maxMs, minMs = 0) {
  const t0 = now();
  if (!pid) {
    await sleep(Math.max(minMs, Math.min(maxMs, 300)));
    return now() - t0;
  }
  let quiet = 0;
  let last = cpuOf(pid)?.total ?? 0;
  while (now() - t0 < Math.max(maxMs, minMs) && (quiet < 2 || now() - t0 < minMs)) {
    await sleep(100);
    const cur = cpuOf(pid)?.total ?? last;
    quiet = cur - last < 5e6 ? quiet + 1 : 0; // under 5 ms of CPU in 100 ms
    last = cur;
  }
  return now() - t0;
}

// ---------------------------------------------------------------------------------------
// The worker under test.

function baseVars(vars) {
  const b = {
    GEMINI_WEBHOOK_SECRETS: GEMINI_SECRET,
    EFFECT_URL: "http://127.0.0.1:9/unset",
    EFFECT_SIGNING_SECRET: EFFECT_SECRET,
    ADMIN_TOKEN,
    ...vars,
  };
  for (const [k, v] of Object.entries(b)) if (v === undefined) delete b[k];
  return b;
}

/** wrangler.toml's bindings and [vars] (scripts/local_worker.mjs), read once by main(). */
let WRANGLER;

/**
 * A plain-JS worker beside ours in the same workerd, reached with `Host: probe.local`: what the
 * platform itself costs here (a JS answer, one Durable Object round trip, a SQLite write, an
 * alarm, a KV put), so our figures can be read against what any design would pay.
 */
const PROBE_SCRIPT = `
export class Probe {
  constructor(state) {
    this.state = state;
    state.storage.sql.exec("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY AUTOINCREMENT, v TEXT)");
  }
  async fetch(request) {
    const path = new URL(request.url).pathname;
    const body = await request.text();
    if (path !== "/noop") this.state.storage.sql.exec("INSERT INTO t (v) VALUES (?)", body.slice(0, 64));
    if (path === "/write-alarm") await this.state.storage.setAlarm(Date.now() + 3_600_000);
    return new Response('{"ok":true}', { headers: { "content-type": "application/json" } });
  }
  async alarm() {}
}
export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    if (url.pathname === "/healthz") return new Response('{"ok":true}', { headers: { "content-type": "application/json" } });
    const body = await request.text();
    if (url.pathname === "/fetch") {
      const answer = await fetch(env.DEST, { method: "POST", body, headers: { "content-type": "application/json", "idempotency-key": "probe" } });
      await answer.text();
      return new Response('{"ok":true}', { headers: { "content-type": "application/json" } });
    }
    if (url.pathname === "/kv-put") {
      await env.PROBE_KV.put("k:" + crypto.randomUUID(), body, { metadata: { status: "succeeded", effect_done: true } });
      return new Response('{"ok":true}', { headers: { "content-type": "application/json" } });
    }
    const name = url.searchParams.get("k") ?? crypto.randomUUID();
    const stub = env.PROBE.get(env.PROBE.idFromName(name));
    const answer = await stub.fetch("https://probe" + url.pathname.slice(3), { method: "POST", body });
    return new Response(await answer.text(), { headers: { "content-type": "application/json" } });
  },
};
`;

function workerOptions(dir, bindings, extra = {}, { probe = false, probeDest = "http://127.0.0.1:9/" } = {}) {
  const main = mainWorkerOptions(dir, bindings);
  const shared = { host: "127.0.0.1", port: 0, logRequests: false, ...extra };
  if (!probe) return { ...shared, ...main };
  return {
    ...shared,
    workers: [
      main,
      {
        name: "probe",
        routes: ["probe.local/*"],
        modules: [{ type: "ESModule", path: "probe.mjs", contents: PROBE_SCRIPT }],
        compatibilityDate: main.compatibilityDate,
        kvNamespaces: ["PROBE_KV"],
        durableObjects: { PROBE: { className: "Probe", useSQLite: true } },
        bindings: { DEST: probeDest },
      },
    ],
  };
}

function mainWorkerOptions(dir, bindings) {
  // Only the classes this build exports (wrangler.toml may be ahead of build/ while someone works).
  const js = fs.readFileSync(path.join(dir, "index.js"), "utf8");
  const exported = new Set([...js.matchAll(/export\s*\{([^}]*)\}/g)].flatMap((m) => m[1].split(",").map((x) => x.trim().split(/\s+as\s+/).at(-1))));
  const durableObjects = Object.fromEntries(Object.entries(WRANGLER.durableObjects).filter(([, v]) => !exported.size || exported.has(v.className)));
  return {
    modules: true,
    modulesRoot: dir,
    scriptPath: path.join(dir, "index.js"),
    modulesRules: [{ type: "CompiledWasm", include: ["**/*.wasm"] }],
    compatibilityDate: WRANGLER.compatibilityDate,
    kvNamespaces: WRANGLER.kvNamespaces,
    durableObjects,
    bindings: { ...WRANGLER.vars, ...bindings },
  };
}

/** Starts the built worker in `dir` on a free 127.0.0.1 port; collects its JSON log lines. */
async function startWorker(dir, vars, extraOptions = {}, { probe = false, probeDest } = {}) {
  const { Miniflare } = await import("miniflare");
  const byEvent = new Map();
  const other = [];
  const collect = (stream) => eachLine(stream, (line) => {
    const parsed = logObject(line);
    if (parsed && typeof parsed.event === "string") {
      if (!byEvent.has(parsed.event)) byEvent.set(parsed.event, []);
      byEvent.get(parsed.event).push(parsed);
    } else if (line.trim() && other.length < 200) other.push(line);
    if (process.env.SHOW_WORKER_LOGS) console.error(line);
  });
  const t0 = now();
  const mf = new Miniflare(workerOptions(dir, baseVars(vars), {
    ...extraOptions,
    handleRuntimeStdio(stdout, stderr) {
      collect(stdout);
      collect(stderr);
    },
  }, { probe, probeDest }));
  const known = new Set([...workers].map((x) => x.pid));
  const url = await mf.ready;
  const ready_ms = now() - t0;
  const w = {
    mf,
    url,
    ready_ms,
    pid: childPids("workerd").find((p) => !known.has(p)) ?? null,
    other,
    events: (name) => byEvent.get(name) ?? [],
    count: (name) => (byEvent.get(name) ?? []).length,
    /** Waits until `name` has at least `n` lines (or `timeoutMs` passes). */
    async waitFor(name, n, timeoutMs = 10_000) {
      const deadline = now() + timeoutMs;
      while (w.count(name) < n && now() < deadline) await sleep(10);
      return w.count(name) >= n;
    },
    async dispose() {
      workers.delete(w);
      await mf.dispose();
    },
  };
  workers.add(w);
  return w;
}

// ---------------------------------------------------------------------------------------
// The HTTP client: node's http with a keep-alive agent.

function send(agent, base, req) {
  return new Promise((resolve) => {
    const headers = { ...(req.headers ?? {}) };
    if (req.body !== undefined) headers["content-length"] = Buffer.byteLength(req.body);
    const r = http.request({ host: base.hostname, port: base.port, method: req.method ?? "GET", path: req.path, headers, agent }, (res) => {
      const chunks = [];
      res.on("data", (c) => chunks.push(c));
      res.on("end", () => resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString() }));
      res.on("error", (e) => resolve({ status: 0, body: String(e) }));
    });
    r.setTimeout(30_000, () => r.destroy(new Error("client timeout")));
    r.on("error", (e) => resolve({ status: 0, body: String(e) }));
    r.end(req.body);
  });
}

/**
 * Closed-loop load: `concurrency` clients, each sending its next request when the last one
 * is answered, until `durationMs` passed or `maxRequests` were started.
 */
async function load({ base, agent, concurrency, durationMs, maxRequests, make, check }) {
  const lat = [];
  const failures = new Map();
  let started = 0;
  let transport = 0; // no HTTP answer at all (connection reset or hang-up)
  const t0 = now();
  const deadline = t0 + durationMs;
  async function client() {
    while (now() < deadline && started < maxRequests) {
      const req = make(started++);
      const s = now();
      const res = await send(agent, base, req);
      lat.push(now() - s);
      if (res.status === 0) transport++;
      if (!check(res)) {
        const k = `${res.status} ${res.body.slice(0, 120)}`;
        failures.set(k, (failures.get(k) ?? 0) + 1);
      }
    }
  }
  await Promise.all(Array.from({ length: concurrency }, client));
  const elapsed = now() - t0;
  const failed = [...failures.values()].reduce((a, b) => a + b, 0);
  return { lat, elapsed_ms: elapsed, failures: Object.fromEntries(failures), failed, wrong_answers: failed - transport, transport_errors: transport };
}

// ---------------------------------------------------------------------------------------
// Gemini deliveries, signed the Standard Webhooks way.


/** A delivery's headers, signed as Gemini signs (with `secret`, by default Gemini's). */
function signed(body, id, secret = GEMINI_SECRET) {
  return sign(secret, id, Math.floor(Date.now() / 1000), body);
}

function envelope(type, id, data = {}, timestamp = new Date().toISOString()) {
  return JSON.stringify({ type, version: "v1", timestamp, data: { id, ...data } });
}

const OUTPUT = { output_file_uri: "gs://bench-bucket/results/out.jsonl" };

// ---------------------------------------------------------------------------------------
// Stubs (a child process, so answering them does not compete with the load generator's
// event loop).

async function startStubs() {
  const child = spawn(process.execPath, [SELF, "--_stubs"], { stdio: ["pipe", "pipe", "inherit"], detached: true });
  children.add(child);
  const port = await new Promise((resolve, reject) => {
    let buf = "";
    const timer = setTimeout(() => reject(new Error("stub server did not start")), 10_000);
    child.stdout.on("data", (c) => {
      buf += c;
      const nl = buf.indexOf("\n");
      if (nl >= 0) {
        clearTimeout(timer);
        resolve(JSON.parse(buf.slice(0, nl)).port);
      }
    });
    child.on("exit", (code) => reject(new Error(`stub server exited ${code}`)));
  });
  const base = new URL(`http://127.0.0.1:${port}`);
  const agent = new http.Agent({ keepAlive: true, maxSockets: 2 });
  return {
    pid: child.pid,
    url: base.href.replace(/\/$/, ""),
    async stats(paths = false) {
      return JSON.parse((await send(agent, base, { path: `/__stats${paths ? "?paths=1" : ""}` })).body);
    },
    async reset() {
      await send(agent, base, { method: "POST", path: "/__reset", body: "" });
    },
    stop() {
      agent.destroy();
      killGroup(child, "SIGTERM");
      children.delete(child);
    },
  };
}

// ---------------------------------------------------------------------------------------
// Main.

async function main() {
  installSignalHandlers();
  const args = parseArgs(process.argv.slice(2));
  WRANGLER = await workerLayout();
  const quick = args.quick;
  const sections = args.only ?? new Set(["build", "fast", "profile", "reconcile"]);
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
  };
  const watchdog = setTimeout(async () => {
    console.error("bench: watchdog (60 min) fired; stopping");
    await cleanup();
    process.exit(2);
  }, 60 * 60_000);
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
// Build: sizes and start-up.

async function benchBuild(dir, work, plan) {
  const wasm = fs.readFileSync(path.join(dir, "index_bg.wasm"));
  const js = fs.readFileSync(path.join(dir, "index.js"));
  const out = {
    wasm_raw_bytes: wasm.length,
    wasm_gzip_bytes: zlib.gzipSync(wasm).length,
    wasm_gzip9_bytes: zlib.gzipSync(wasm, { level: 9 }).length,
    wasm_brotli_bytes: zlib.brotliCompressSync(wasm).length,
    js_glue_bytes: js.length,
    js_glue_gzip_bytes: zlib.gzipSync(js).length,
    wasm_breakdown: wasmBreakdown(wasm),
  };
  // Without a name section (a stripped build), attribute code by crate from the named wasm
  // that cargo left in target/ (before wasm-bindgen and wasm-opt: sizes larger, shares indicative).
  const named = path.join(root, "target/wasm32-unknown-unknown/release/gemini_once.wasm");
  if (!out.wasm_breakdown.sections.some((x) => x.section === "custom:name") && fs.existsSync(named)) {
    const b = fs.readFileSync(named);
    out.named_wasm_breakdown = { path: path.relative(root, named), bytes: b.length, mtime: fs.statSync(named).mtime.toISOString(), ...wasmBreakdown(b) };
  }
  const stripped = stripCustomSections(wasm, (name) => name === "name");
  out.wasm_without_name_section_bytes = stripped.length;
  out.wasm_without_name_section_gzip_bytes = zlib.gzipSync(stripped).length;

  out.startup = { miniflare_process_ms: [], wrangler_dev_ms: [] };
  for (let i = 0; i < plan.startup_samples; i++) {
    out.startup.miniflare_process_ms.push(round(await timeToFirstAnswer([process.execPath, SELF, "--_serve", dir, JSON.stringify(WRANGLER)], root), 0));
  }
  if (plan.wrangler) {
    const wdir = path.join(work, "wrangler");
    fs.mkdirSync(wdir, { recursive: true });
    fs.cpSync(dir, path.join(wdir, "build"), { recursive: true });
    // The project's wrangler.toml without its [build] step (the build is already there).
    const toml = fs.readFileSync(path.join(root, "wrangler.toml"), "utf8")
      .replace(/^\[build\]\s*\ncommand\s*=.*\n/m, "");
    fs.writeFileSync(path.join(wdir, "wrangler.toml"), toml);
    fs.writeFileSync(path.join(wdir, ".dev.vars"), Object.entries(baseVars({})).map(([k, v]) => `${k}="${v}"`).join("\n") + "\n");
    const wrangler = path.join(root, "node_modules/wrangler/bin/wrangler.js");
    for (let i = 0; i < plan.startup_samples; i++) {
      const state = path.join(wdir, `state${i}`);
      const ms = await timeToFirstAnswer(
        [process.execPath, wrangler, "dev", "--ip", "127.0.0.1", "--persist-to", state, "--log-level", "error", "--port"],
        wdir,
        { WRANGLER_SEND_METRICS: "false" },
      );
      out.startup.wrangler_dev_ms.push(round(ms, 0));
    }
  }
  return out;
}

/** Spawns `argv` (with a free port appended) and polls GET /healthz until it answers 200. */
async function timeToFirstAnswer(argv, cwd, env = {}) {
  const port = await freePort();
  const t0 = now();
  const child = spawn(argv[0], [...argv.slice(1), String(port)], { cwd, env: { ...process.env, ...env }, stdio: ["pipe", "ignore", "pipe"], detached: true });
  children.add(child);
  let stderr = "";
  child.stderr.on("data", (c) => { if (stderr.length < 4000) stderr += c; });
  const base = new URL(`http://127.0.0.1:${port}`);
  let ms = null;
  try {
    while (now() - t0 < 60_000 && child.exitCode === null) {
      const r = await send(false, base, { path: "/healthz" });
      if (r.status === 200) {
        ms = now() - t0;
        break;
      }
      await sleep(10);
    }
  } finally {
    killGroup(child, "SIGTERM");
    await Promise.race([new Promise((r) => child.once("exit", r)), sleep(3000)]);
    killGroup(child, "SIGKILL");
    children.delete(child);
  }
  if (ms === null) throw new Error(`no answer from ${argv.slice(1, 3).join(" ")}: ${stderr}`);
  return ms;
}

/** Section sizes, the name section, and the largest functions by crate (from the name section). */
function wasmBreakdown(b) {
  let p = 8;
  const leb = () => { let r = 0, s = 0, x; do { x = b[p++]; r += (x & 0x7f) * 2 ** s; s += 7; } while (x & 0x80); return r; };
  const ids = { 1: "type", 2: "import", 3: "function", 4: "table", 5: "memory", 6: "global", 7: "export", 8: "start", 9: "element", 10: "code", 11: "data", 12: "datacount" };
  const sections = [];
  const bodies = [];
  const names = new Map();
  let imported = 0;
  while (p < b.length) {
    const id = b[p++];
    const size = leb();
    const start = p;
    let name = ids[id] ?? `id${id}`;
    if (id === 0) {
      const l = leb();
      name = `custom:${b.subarray(p, p + l).toString()}`;
      p += l;
      if (name === "custom:name") {
        while (p < start + size) {
          const sub = b[p++];
          const sl = leb();
          const end = p + sl;
          if (sub === 1) {
            const cnt = leb();
            for (let i = 0; i < cnt; i++) {
              const idx = leb();
              const nl = leb();
              names.set(idx, b.subarray(p, p + nl).toString());
              p += nl;
            }
          }
          p = end;
        }
      }
    } else if (id === 2) {
      const cnt = leb();
      for (let i = 0; i < cnt; i++) {
        p += leb(); // module
        p += leb(); // field
        const kind = b[p++];
        if (kind === 0) { leb(); imported++; }
        else if (kind === 1) { p++; const f = b[p++]; leb(); if (f & 1) leb(); }
        else if (kind === 2) { const f = b[p++]; leb(); if (f & 1) leb(); }
        else if (kind === 3) p += 2;
        else if (kind === 4) { p++; leb(); }
      }
    } else if (id === 10) {
      const cnt = leb();
      for (let i = 0; i < cnt; i++) {
        const sz = leb();
        bodies.push(sz);
        p += sz;
      }
    }
    sections.push({ section: name, bytes: size });
    p = start + size;
  }
  // wasm-bindgen's __wbindgen_describe_* exist only before wasm-bindgen runs; leave them out.
  const fns = bodies.map((bytes, i) => ({ bytes, name: names.get(i + imported) ?? `func[${i + imported}]` })).filter((f) => !f.name.startsWith("__wbindgen_describe"));
  const byCrate = new Map();
  for (const f of fns) {
    const c = crateOf(f.name);
    byCrate.set(c, (byCrate.get(c) ?? 0) + f.bytes);
  }
  const codeBytes = fns.reduce((a, x) => a + x.bytes, 0);
  return {
    sections,
    functions: fns.length,
    imported_functions: imported,
    code_bytes: codeBytes,
    by_crate: [...byCrate].map(([crate, bytes]) => ({ crate, bytes, share: round(bytes / codeBytes, 3) })).sort((a, b) => b.bytes - a.bytes),
    largest_functions: fns.sort((a, b) => b.bytes - a.bytes).slice(0, 15),
  };
}

/** The crate of a mangled Rust symbol (legacy `_ZN...` or v0 `_R...`), or null. */
function crateOfMangled(name) {
  const prim = (c) => (/^(f32|f64|u8|u16|u32|u64|u128|usize|i8|i16|i32|i64|i128|isize|bool|char|str)$/.test(c) ? "core (primitives)" : /^[A-Z]$/.test(c) ? "(generic impls)" : c);
  let m = /^_ZN(\d+)/.exec(name);
  if (m) {
    let seg = name.substr(m[0].length, Number(m[1]));
    seg = seg.replace(/^_?\$LT\$/, "").replace(/^(\$RF\$|mut\$u20\$|dyn\$u20\$)+/, "").replace(/^\$u5b\$/, "");
    const c = /^([A-Za-z_][A-Za-z0-9_]*)/.exec(seg)?.[1];
    return c ? prim(c) : "(other)";
  }
  if (name.startsWith("_R")) {
    for (const x of name.matchAll(/C(?:s[0-9A-Za-z]*_)?(\d+)/g)) {
      const ident = name.substr(x.index + x[0].length, Number(x[1]));
      if (/^[A-Za-z_][A-Za-z0-9_]*$/.test(ident)) return prim(ident);
    }
    return "(other)";
  }
  return null;
}

function crateOf(name) {
  if (/^(func|wasm-function)\[\d+\]$/.test(name)) return "(unnamed)";
  const mangled = crateOfMangled(name);
  if (mangled) return mangled;
  if (/^__wbindgen|^__wbg_|^__externref/.test(name)) return "wasm_bindgen";
  // `a::b::c`, `<a::B as c::D>::e`, `<&mut a::B<R> as ...>`, `core[hash]::...`, `<f64 as ...>`
  const m = /^[<&\s]*(?:mut\s+|dyn\s+)?([A-Za-z_][A-Za-z0-9_]*)(?:\[[0-9a-f]+\])?(::|\s|>|$)/.exec(name);
  if (!m) return "(other)";
  const first = m[1];
  if (m[2] !== "::" || /^(f32|f64|u8|u16|u32|u64|u128|usize|i8|i16|i32|i64|i128|isize|bool|char|str)$/.test(first)) return "core (primitives)";
  if (/^func$/.test(first)) return "(unnamed)";
  return first;
}

function stripCustomSections(b, drop) {
  let p = 8;
  const leb = () => { let r = 0, s = 0, x; do { x = b[p++]; r += (x & 0x7f) * 2 ** s; s += 7; } while (x & 0x80); return r; };
  const parts = [b.subarray(0, 8)];
  while (p < b.length) {
    const at = p;
    const id = b[p++];
    const size = leb();
    const start = p;
    let keep = true;
    if (id === 0) {
      const l = leb();
      keep = !drop(b.subarray(p, p + l).toString());
    }
    if (keep) parts.push(b.subarray(at, start + size));
    p = start + size;
  }
  return Buffer.concat(parts);
}

// ---------------------------------------------------------------------------------------
// Fast path.

const CONCURRENCY = [1, 10, 50];
const PROFILE_CONCURRENCY = [1, 10];

/**
 * The request makers of every scenario, against worker `w`: a pool of done operations for the
 * duplicates is delivered first. `counters.first` counts first deliveries sent.
 */
async function prepareScenarios(w) {
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
// and at least this long. Gates flush counters STATS_FLUSH_SECONDS (default 10) after the
// oldest one, so duplicate cells wait for that; a first delivery's alarm follows its commit
// and the ledger write may wait for the 1 s spacing.
const STATS_FLUSH_SECONDS = 10;
const DEFERRED_MS = {
  duplicate: STATS_FLUSH_SECONDS * 1000 + 500,
  duplicate_one_key: STATS_FLUSH_SECONDS * 1000 + 500,
  first: 1_500,
  first_no_effect: 1_500,
};

async function benchFast(dir, stubs, plan) {
  const w = await startWorker(dir, {
    EFFECT_URL: `${stubs.url}/effects`,
    GEMINI_API_BASE: stubs.url,
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

// ---------------------------------------------------------------------------------------
// Profile: V8 CPU profiles of every isolate in workerd (our worker and its objects, Miniflare's
// entry worker, the local KV simulator) through the inspector, one scenario at a time.

async function webSocketClass() {
  try { return (await import("ws")).default; } catch {}
  try { return (await import("undici")).WebSocket; } catch {}
  return globalThis.WebSocket ?? null;
}

function cdp(WebSocket, url) {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url);
    let n = 0;
    const pending = new Map();
    const onMessage = (data) => {
      const msg = JSON.parse(typeof data === "string" ? data : data.data ?? data.toString());
      if (msg.id && pending.has(msg.id)) {
        pending.get(msg.id)(msg);
        pending.delete(msg.id);
      }
    };
    if (ws.on) ws.on("message", onMessage);
    else ws.addEventListener("message", onMessage);
    const opened = () => resolve({
      call: (method, params = {}) => new Promise((r) => {
        const id = ++n;
        pending.set(id, r);
        ws.send(JSON.stringify({ id, method, params }));
      }),
      close: () => ws.close(),
    });
    if (ws.on) { ws.on("open", opened); ws.on("error", reject); }
    else { ws.addEventListener("open", opened); ws.addEventListener("error", reject); }
  });
}

/** Self and inclusive time per function of one V8 CPU profile. */
function analyzeProfile(p) {
  const byId = new Map(p.nodes.map((x) => [x.id, x]));
  const parent = new Map();
  for (const x of p.nodes) for (const c of x.children ?? []) parent.set(c, x.id);
  const kindOf = (cf) => {
    if (cf.url?.startsWith("wasm://")) return "wasm";
    if (/^\((idle|program|garbage collector|root)\)$/.test(cf.functionName)) return cf.functionName;
    if (cf.url?.endsWith("index.js")) return "js (wasm-bindgen glue)";
    return cf.url ? "js (runtime/other)" : "native";
  };
  const keyOf = (cf) => `${cf.functionName || "(anonymous)"}${cf.url?.startsWith("wasm://") ? "" : cf.url ? ` @${cf.url.split("/").pop()}` : ""}`;
  const self = new Map();
  const incl = new Map();
  const kinds = new Map();
  const crates = new Map();
  let busy = 0;
  let program = 0;
  p.samples.forEach((sid, i) => {
    const d = (p.timeDeltas[i] ?? 0) / 1000;
    const node = byId.get(sid);
    if (!node) return;
    const cf = node.callFrame;
    if (cf.functionName === "(idle)") return;
    // "(program)" is time the shared workerd thread spent outside this isolate's JS (often in
    // another isolate): not this isolate's work.
    if (cf.functionName === "(program)") { program += d; return; }
    busy += d;
    const kind = kindOf(cf);
    kinds.set(kind, (kinds.get(kind) ?? 0) + d);
    const k = keyOf(cf);
    self.set(k, (self.get(k) ?? 0) + d);
    if (kind === "wasm") {
      const c = crateOf(cf.functionName.replace(/^\$/, ""));
      crates.set(c, (crates.get(c) ?? 0) + d);
    }
    const seen = new Set();
    for (let id = sid; id !== undefined; id = parent.get(id)) {
      const ck = keyOf(byId.get(id).callFrame);
      if (seen.has(ck)) continue;
      seen.add(ck);
      incl.set(ck, (incl.get(ck) ?? 0) + d);
    }
  });
  const top = (m, n) => [...m].sort((a, b) => b[1] - a[1]).slice(0, n).map(([name, ms]) => ({ name, ms: round(ms, 1), share: round(ms / busy, 3) }));
  return {
    busy_ms: busy,
    program_ms: round(program, 1),
    kinds: top(kinds, 20),
    wasm_by_crate: top(crates, 15),
    top_self: top(self, 25),
    top_inclusive_ours: top(new Map([...incl].filter(([k]) => /gemini_once|worker::|OperationGate|StatsShard/.test(k))), 30),
  };
}

async function benchProfile(dir, stubs, plan) {
  const WebSocket = await webSocketClass();
  if (!WebSocket) return { skipped: "no WebSocket client (ws or undici) in node_modules" };
  const w = await startWorker(dir, { EFFECT_URL: `${stubs.url}/effects`, GEMINI_API_BASE: stubs.url }, { inspectorPort: 0 });
  const conns = {};
  try {
    const inspector = await w.mf.getInspectorURL();
    const list = JSON.parse((await send(false, new URL(inspector.href.replace(/^ws/, "http")), { path: "/json" })).body);
    // Our isolate only: every isolate shares workerd's one thread, and a profiler attached to
    // several of them misattributes samples taken while another isolate runs.
    for (const t of list.filter((x) => x.id === "core:user:")) {
      conns[t.id] = await cdp(WebSocket, t.webSocketDebuggerUrl);
      await conns[t.id].call("Profiler.enable");
      await conns[t.id].call("Profiler.setSamplingInterval", { interval: 500 });
    }
    const { scenarios } = await prepareScenarios(w);
    const c = 10;
    const out = { concurrency: c, seconds: plan.profileSeconds, sampling_us: 500, scenarios: {} };
    for (const name of ["floor", "rejected", "duplicate", "unknown_type", "first_no_effect", "first"]) {
      const sc = scenarios[name];
      const agent = new http.Agent({ keepAlive: true, maxSockets: c });
      await load({ base: w.url, agent, concurrency: c, durationMs: 10_000, maxRequests: 50, make: sc.make, check: () => true });
      const settleMs = plan.quick ? 0 : DEFERRED_MS[name] ?? 0;
      await quiesce(w.pid, plan.quick ? 1_000 : 3_000, settleMs); // the warm-up's alarms and flushes
      for (const cn of Object.values(conns)) await cn.call("Profiler.start");
      const meter = cpuMeter(w.pid, stubs.pid);
      const m = await load({ base: w.url, agent, concurrency: c, durationMs: plan.profileSeconds * 1000, maxRequests: 100_000, make: sc.make, check: sc.check });
      await quiesce(w.pid, plan.quick ? 1_000 : 3_000, settleMs); // the alarms and waitUntil work these requests caused belong to them
      const cpu = meter(m.lat.length);
      const per = {};
      for (const [id, cn] of Object.entries(conns)) {
        const stopped = await cn.call("Profiler.stop");
        const prof = stopped.result?.profile;
        if (!prof) continue;
        const a = analyzeProfile(prof);
        if (a.busy_ms < 1) continue;
        per[id] = { ms_per_req: round(a.busy_ms / m.lat.length, 3), ...a, busy_ms: round(a.busy_ms, 1) };
      }
      agent.destroy();
      const ours = per["core:user:"];
      // Our isolate's sampled time against workerd's main-thread CPU over the same window.
      const oursShare = ours && cpu.workerd_main_ms_per_req ? round(ours.ms_per_req / cpu.workerd_main_ms_per_req, 2) : null;
      out.scenarios[name] = { requests: m.lat.length, failed: m.failed, p50_ms: round(summarize(m.lat).p50, 3), cpu, ours_share_of_workerd_main: oursShare, isolates: per };
      process.stderr.write(`  profile ${name.padEnd(16)} n=${m.lat.length} ` + Object.entries(per).map(([id, x]) => `${id} ${x.ms_per_req} ms/req`).join(", ") + "\n");
    }
    return out;
  } finally {
    for (const cn of Object.values(conns)) { try { cn.close(); } catch {} }
    await w.dispose();
  }
}

function chunked(xs, parts) {
  const out = Array.from({ length: parts }, () => []);
  xs.forEach((x, i) => out[i % parts].push(x));
  return out;
}

// ---------------------------------------------------------------------------------------
// Reconciliation.

async function benchReconcile(dir, stubs, size) {
  console.error(`  ledger of ${size}: starting worker`);
  const w = await startWorker(dir, {
    EFFECT_URL: `${stubs.url}/effects`,
    GEMINI_API_BASE: stubs.url,
    GEMINI_API_KEY: "bench-gemini-key",
    // The 1% are registered moments before the passes: no grace, so they are "past the grace".
    RECONCILE_GRACE_SECONDS: "0",
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

function iso(secs) {
  return new Date(secs * 1000).toISOString().replace(/\.000Z$/, "Z");
}

// ---------------------------------------------------------------------------------------
// Targets of issue 5 and the printed report.

function evaluateTargets(r) {
  const t = [];
  const row = (s, c) => r.fast?.table.find((x) => x.scenario === s && x.concurrency === c);
  if (r.fast) {
    const dup = row("duplicate", 10), rej = row("rejected", 10), first = row("first", 10);
    // Median over rounds of the ratio measured within each round.
    t.push({ target: "duplicate p50 <= 1.5x floor at c=10", value: dup.p50_ratio_median, holds: dup.p50_ratio_median <= 1.5 });
    t.push({ target: "rejected p50 <= 1.2x floor at c=10", value: rej.p50_ratio_median, holds: rej.p50_ratio_median <= 1.2 });
    t.push({ target: "first p50 (minus destination) <= 2.5x floor at c=10", value: first.p50_ratio_minus_destination_median, raw: first.p50_ratio_median, holds: first.p50_ratio_minus_destination_median <= 2.5 });
    const f50 = row("first", 50), d50 = row("duplicate", 50);
    t.push({ target: "first rps >= 40% of floor at c=50", value: f50.rps_ratio_median, holds: f50.rps_ratio_median >= 0.4 });
    t.push({ target: "duplicate rps >= 60% of floor at c=50", value: d50.rps_ratio_median, holds: d50.rps_ratio_median >= 0.6 });
    const e = r.fast.effects;
    t.push({ target: "one side effect per first delivery (no repeats)", value: `${e.effects_at_destination}/${e.first_deliveries_measured_and_warmup}, repeats ${e.repeated_idempotency_keys}`, holds: e.effects_at_destination === e.first_deliveries_measured_and_warmup && e.repeated_idempotency_keys === 0 });
  }
  for (const l of r.reconcile ?? []) {
    for (const c of l.coverages) {
      t.push({
        target: `ledger ${l.size} (${c.phase}): status calls = entries needing them, none for done entries, no body reads`,
        value: `${c.status_calls}/${c.needing_status}, done polled ${c.status_calls_for_done_entries}, bodies ${c.bodies_read}`,
        holds: c.status_calls === c.needing_status && c.stub_status_calls === c.status_calls && c.status_calls_for_done_entries === 0 && c.bodies_read === 0,
      });
      t.push({ target: `ledger ${l.size} (${c.phase}): no pass over budget ${l.budget}`, value: c.max_subrequests, holds: c.max_subrequests <= l.budget });
    }
    const quiet = l.coverages.find((c) => c.phase === "all_done");
    t.push({ target: `ledger ${l.size}: a routine pass lists every open entry (${l.needing_work}) in one pass`, value: l.coverages.filter((c) => c.phase !== "all_done").map((c) => `${c.phase} ${c.index_listed_first_pass} in ${c.index_kv_lists_first_pass} lists`).join(", "), holds: l.coverages.every((c) => c.every_pass_lists_every_open_entry) });
    t.push({ target: `ledger ${l.size}: a quiet ledger's routine pass costs O(open) KV lists (1 empty index page)`, value: `${quiet?.kv_lists} lists, ${quiet?.listed} listed`, holds: quiet?.kv_lists === 1 && quiet?.listed === 0 });
    t.push({ target: `ledger ${l.size}: the audit covers the ledger within budget and finds nothing missing`, value: `${l.audit.passes} passes, ${l.audit.audit_kv_lists} lists, found ${l.audit.found}`, holds: l.audit.complete && l.audit.found === 0 && l.audit.max_subrequests <= l.budget });
  }
  if (r.build) t.push({ target: "wasm <= 1 MB raw", value: r.build.wasm_raw_bytes, holds: r.build.wasm_raw_bytes <= 1_000_000 });
  return t;
}

function fmtTable(headers, rows) {
  const w = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => String(r[i] ?? "").length)));
  const line = (cells) => cells.map((c, i) => (i === 0 ? String(c ?? "").padEnd(w[i]) : String(c ?? "").padStart(w[i]))).join("  ");
  return [line(headers), w.map((n) => "-".repeat(n)).join("  "), ...rows.map(line)].join("\n");
}

function report(r) {
  const out = [];
  const m = r.machine;
  out.push(`gemini-once bench (${r.plan.mode}), ${r.started_at}, ${r.total_seconds} s`);
  out.push(`machine: ${m.cores} cores, ${m.cpu_model}, ${m.memory_gib} GiB, ${m.os}; node ${m.node}, workerd ${m.workerd}, miniflare ${m.miniflare}`);
  out.push(`build: commit ${m.git_commit}, wasm sha256 ${m.wasm_sha256}; load average ${m.loadavg_start.join(" ")} -> ${m.loadavg_end.join(" ")}`);
  if (r.fast) {
    out.push("", `Fast path (${r.plan.rounds} round(s) x ${r.plan.seconds} s per cell; n, p50, p99, req/s pool the rounds; ratios to the floor of the same round, pooled and their median over rounds)`);
    out.push(fmtTable(
      ["scenario", "conc", "n", "p50 ms", "p99 ms", "req/s", "p50/floor", "p99/floor", "rps/floor", "p50/floor by round", "median", "rps/floor median", "failed"],
      r.fast.table.map((x) => [x.scenario, x.concurrency, x.n, x.p50_ms.toFixed(2), x.p99_ms.toFixed(2), x.rps, x.p50_ratio, x.p99_ratio, x.rps_ratio, x.p50_ratio_rounds.join(" "), x.p50_ratio_median, x.rps_ratio_median, x.failed]),
    ));
    const firsts = r.fast.table.filter((x) => x.scenario === "first");
    out.push("", "first delivery: the answer does not wait for the side effect, which runs from the gate's alarm; when its attempt starts after the outcome settled (`after_settled_ms` of effect_delivered: p50 of the rounds' p50, max p99), and the effect call as the worker logs it (`ms`, p50), against the destination's own time (measured by the stub):");
    out.push(fmtTable(["conc", "effect starts after answer p50 ms", "p99 ms", "effect call seen by worker ms", "destination own ms"], firsts.map((x) => [x.concurrency, x.effect_start_after_answer_ms?.p50, x.effect_start_after_answer_ms?.p99, x.effect_seen_by_worker_ms_p50, x.destination_own_ms_mean])));
    out.push("", "CPU per request (ms; median over rounds; workerd runs every isolate of the worker, its objects and Miniflare's KV on one thread; the tail of background work after each cell included):");
    out.push(fmtTable(["scenario", "conc", "workerd main thread", "workerd all threads", "client", "stubs"], r.fast.table.map((x) => [x.scenario, x.concurrency, x.cpu_ms_per_req.workerd_main, x.cpu_ms_per_req.workerd_all, x.cpu_ms_per_req.client, x.cpu_ms_per_req.stubs])));
    out.push("", "the worker's own `ms` log fields (p50 per round; integer ms, the clock advances only on I/O):");
    out.push(fmtTable(["scenario", "conc", "log line", "p50 ms by round", "p99 ms by round"], r.fast.table.flatMap((x) => Object.entries(x.worker_log ?? {}).filter(([, v]) => v.p50_ms_rounds.length).map(([e, v]) => [x.scenario, x.concurrency, e, v.p50_ms_rounds.join(" "), v.p99_ms_rounds.join(" ")]))));
    const e = r.fast.effects;
    out.push("", `side effects: ${e.effects_at_destination} at the destination for ${e.first_deliveries_measured_and_warmup} first deliveries (incl. warm-up); repeated idempotency keys: ${e.repeated_idempotency_keys}`);
  }
  if (r.profile?.scenarios) {
    const pr = r.profile;
    out.push("", `Profile (V8 sampling profiler on our isolate, concurrency ${pr.concurrency}, ${pr.seconds} s per scenario; the profiler slows everything, so read shares; the rest of workerd's thread is Miniflare's entry worker, its KV simulator and outbound shim, and workerd itself)`);
    out.push(fmtTable(["scenario", "n", "workerd main-thread CPU ms/req (profiling on)", "our isolate sampled ms/req", "ours / workerd"], Object.entries(pr.scenarios).map(([name, x]) => [name, x.requests, x.cpu.workerd_main_ms_per_req, x.isolates["core:user:"]?.ms_per_req ?? "", x.ours_share_of_workerd_main ?? ""])));
    for (const [name, x] of Object.entries(pr.scenarios)) {
      const u = x.isolates["core:user:"];
      if (!u) continue;
      out.push(`  ${name}: ours by kind: ${u.kinds.map((k) => `${k.name} ${Math.round(k.share * 100)}%`).join(", ")}`);
      out.push(`  ${name}: ours, top self: ${u.top_self.slice(0, 8).map((f) => `${f.name.replace(/::h[0-9a-f]{16}/, "").slice(0, 70)} ${Math.round(f.share * 100)}%`).join("; ")}`);
    }
  }
  if (r.reconcile?.length) {
    out.push("", `Reconciliation (default budget ${DEFAULT_BUDGET}; 1% of entries registered and non-terminal, status stub answers RUNNING; counts from reconcile_pass lines)`);
    out.push(fmtTable(
      ["entries", "seeded/s", "audit passes", "audit lists", "audit listed", "found", "audit ms (each)"],
      r.reconcile.map((l) => [l.size, l.seed_per_second, l.audit.passes, l.audit.audit_kv_lists, l.audit.audit_listed, l.audit.found, l.audit.per_pass_ms.join(" ")]),
    ));
    out.push(fmtTable(
      ["entries", "coverage", "passes", "index listed/pass", "listed", "kv lists", "body reads", "status calls", "DO calls", "subrequests", "max/pass", "done polled", "pass ms (each)", "errors"],
      r.reconcile.flatMap((l) => l.coverages.map((c) => [l.size, c.phase, c.passes, c.index_listed_first_pass, c.listed, c.kv_lists, c.bodies_read, c.status_calls, c.do_calls, c.subrequests, c.max_subrequests, c.status_calls_for_done_entries, c.per_pass.length > 8 ? `${c.per_pass.slice(0, 3).map((p) => p.elapsed_ms).join(" ")} … ${c.per_pass.at(-1).elapsed_ms}` : c.per_pass.map((p) => p.elapsed_ms).join(" "), c.errors])),
    ));
  }
  if (r.build) {
    const b = r.build;
    out.push("", "Build");
    out.push(`wasm: ${b.wasm_raw_bytes} bytes raw, ${b.wasm_gzip_bytes} gzip (${b.wasm_gzip9_bytes} gzip -9, ${b.wasm_brotli_bytes} brotli); without its name section ${b.wasm_without_name_section_bytes} raw, ${b.wasm_without_name_section_gzip_bytes} gzip; JS glue ${b.js_glue_bytes} (${b.js_glue_gzip_bytes} gzip)`);
    out.push("sections: " + b.wasm_breakdown.sections.map((s) => `${s.section} ${s.bytes}`).join(", "));
    const bd = b.named_wasm_breakdown ?? b.wasm_breakdown;
    if (b.named_wasm_breakdown) out.push(`(build/ has no name section: code attributed from ${bd.path}, ${bd.bytes} bytes before wasm-bindgen and wasm-opt, ${bd.code_bytes} bytes of code)`);
    out.push("code by crate (by function name; LTO inlines handlers into wasm-bindgen's future closures): " + bd.by_crate.slice(0, 10).map((c) => `${c.crate} ${c.bytes} (${Math.round(c.share * 100)}%)`).join(", "));
    out.push("largest functions: " + bd.largest_functions.slice(0, 6).map((f) => `${f.name.replace(/::h[0-9a-f]{16}$/, "").slice(0, 90)} ${f.bytes}`).join("; "));
    out.push(`start to first answered request: Miniflare in a new node process ${b.startup.miniflare_process_ms.join(", ")} ms` + (b.startup.wrangler_dev_ms.length ? `; wrangler dev ${b.startup.wrangler_dev_ms.join(", ")} ms` : ""));
  }
  out.push("", "Targets (issue 5)");
  out.push(fmtTable(["target", "value", "holds"], r.targets.map((t) => [t.target, typeof t.value === "number" ? t.value : String(t.value), t.holds ? "yes" : "NO"])));
  return out.join("\n");
}

// ---------------------------------------------------------------------------------------
// Entry.

if (process.argv[2] === "--_stubs") {
  runStubs();
} else if (process.argv[2] === "--_serve") {
  WRANGLER = JSON.parse(process.argv[4]); // read by the parent: not part of the start-up timed
  serveOnce(process.argv[3], Number(process.argv[5]));
} else {
  main().catch(async (e) => {
    console.error(e?.stack ?? String(e));
    await cleanup();
    process.exit(1);
  });
}
