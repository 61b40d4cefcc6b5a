#!/usr/bin/env node
// The chaos run of issue 4: `npm run chaos -- [--seed N] [--ops N] [--kills N] [--no-build]
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
// It exits 0 only when lost, regressions and unsettled are 0, every duplicate is explained
// (X = Y), and the extra checks (below) found nothing.
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
// Definitions (issue 4):
// - effects: side-effect requests the destination accepted (it decided 2xx on arrival; a
//   destination commits before it answers, so an accepted request counts even when the worker
//   gave up waiting for the answer).
// - duplicate_effects: accepted requests beyond the first for a key.
// - explained: duplicates in the window no receiver can close: the previous accepted request
//   for the key was not recorded by the worker because the worker was killed (the attempt
//   that sent it never recorded its end, and a kill came between the two requests) or the
//   attempt timed out (the worker closed the connection before the answer, or its attempt
//   ended in a timeout or network failure); never after the gate recorded the commit; and each
//   carries the same idempotency-key and webhook-id as the first. The evidence is the
//   worker's own history: the claims taken before the accepted request arrived, and how their
//   attempts ended (a timeout or network failure; or no end recorded at all, with a kill after).
// - lost: operations (all are terminal at Gemini) with no accepted side effect.
// - regressions: operations whose observed status (admin API, every observation kept) ever
//   moved backward on pending < running, requires_action < terminal, changed from one terminal
//   to another, or vanished (404 after being seen); only pairs where the later request was sent
//   after the earlier answer arrived are compared.
// - unsettled: operations not terminal in the admin API or in the KV ledger at the end.
// Extra checks (also fail the run, printed on the chaos-detail lines): an accepted side effect
// whose status differs from the truth, a final status different from the truth, effect_done
// false at the end, side effects for unknown keys, side effects failing signature checks, a
// harness delivery refused with 400/401/413.

import { spawn, spawnSync } from "node:child_process";
import { createServer } from "node:http";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { fileURLToPath, pathToFileURL } from "node:url";

import { sign } from "./send.mjs";
import { eachLine, freePort, logObject, workerLayout } from "./local_worker.mjs";

const SELF = fileURLToPath(import.meta.url);
const ROOT = path.resolve(path.dirname(SELF), "..");

// Secrets of this local run only (the same test values as tests/helpers.mjs, plus a second
// Gemini secret so that rotation is exercised).
const GEMINI_SECRETS = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_Y2hhb3Mtcm90YXRlZC1nZW1pbmktc2VjcmV0"];
const EFFECT_SECRET = "whsec_c2lkZS1lZmZlY3Qtc2VjcmV0LWZvci10ZXN0cw==";
const ADMIN_TOKEN = "chaos-admin-token-0123456789";
const GEMINI_API_KEY = "chaos-gemini-key";

// Worker configuration for the run: short timings so that it finishes in minutes.
const EFFECT_TIMEOUT_MS = 1000;
const WORKER_VARS = {
  CLAIM_TTL_SECONDS: "3",
  EFFECT_RETRY_BASE_SECONDS: "1",
  EFFECT_RETRY_MAX_SECONDS: "2",
  EFFECT_TIMEOUT_MS: String(EFFECT_TIMEOUT_MS),
  RECONCILE_GRACE_SECONDS: "0",
  RECONCILE_LEASE_SECONDS: "5",
  RECONCILE_BUDGET: "300",
  STUCK_AFTER_SECONDS: "86400",
};
const CRON = "*/5 * * * *";

// Fault rates.
const STATUS_429 = 0.05;
const STATUS_500 = 0.03;
const STATUS_STALE = 0.15;
const DEST_5XX = 0.1;
const DEST_SLOW = 0.15; // 100..700 ms: inside the side-effect timeout
const DEST_OVER_TIMEOUT = 0.02; // 1100..1800 ms: past it

const TERMINAL = new Set(["succeeded", "failed", "cancelled", "expired"]);
const rank = (s) => (s === "absent" ? -1 : s === "pending" ? 0 : s === "running" || s === "requires_action" ? 1 : TERMINAL.has(s) ? 2 : -2);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---------------------------------------------------------------------------------------------
// Seeded randomness (splitmix32 seeding an sfc32 generator).

export function makeRng(seed) {
  let s = seed >>> 0;
  const mix = () => {
    s = (s + 0x9e3779b9) >>> 0;
    let z = s;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
    return (z ^ (z >>> 16)) >>> 0;
  };
  let a = mix(), b = mix(), c = mix(), d = mix();
  const u32 = () => {
    const t = (((a + b) | 0) + d) | 0;
    d = (d + 1) | 0;
    a = b ^ (b >>> 9);
    b = (c + (c << 3)) | 0;
    c = (c << 21) | (c >>> 11);
    c = (c + t) | 0;
    return t >>> 0;
  };
  for (let i = 0; i < 12; i++) u32();
  const float = () => u32() / 4294967296;
  const rng = {
    float,
    u32,
    int: (lo, hi) => lo + Math.floor(float() * (hi - lo + 1)),
    uniform: (lo, hi) => lo + float() * (hi - lo),
    chance: (p) => float() < p,
    pick: (arr) => arr[Math.floor(float() * arr.length)],
    weighted(pairs) {
      const total = pairs.reduce((n, [, w]) => n + w, 0);
      let x = float() * total;
      for (const [v, w] of pairs) if ((x -= w) < 0) return v;
      return pairs[pairs.length - 1][0];
    },
    shuffle(arr) {
      for (let i = arr.length - 1; i > 0; i--) {
        const j = Math.floor(float() * (i + 1));
        [arr[i], arr[j]] = [arr[j], arr[i]];
      }
      return arr;
    },
    fork: (salt) => makeRng((u32() ^ Math.imul(salt, 0x27d4eb2d)) >>> 0),
  };
  return rng;
}

// ---------------------------------------------------------------------------------------------
// The schedule: a pure function of (seed, ops, kills). Times are ms after the run's t0.

const BATCH_OUTCOMES = [["succeeded", 0.55], ["failed", 0.2], ["cancelled", 0.12], ["expired", 0.13]];
const INTERACTION_OUTCOMES = [["succeeded", 0.6], ["failed", 0.25], ["cancelled", 0.15]];
const VIDEO_OUTCOMES = [["succeeded", 0.6], ["failed", 0.25], ["cancelled", 0.15]];

function eventTypeFor(family, outcome, rng) {
  if (family === "batch") return outcome === "succeeded" ? (rng.chance(0.15) ? "batch.completed" : "batch.succeeded") : `batch.${outcome}`;
  if (family === "interaction") return outcome === "succeeded" ? "interaction.completed" : `interaction.${outcome}`;
  return "video.generated";
}

function detailsFor(op, type) {
  if (type === "batch.succeeded" || type === "batch.completed") return { output_file_uri: `gs://chaos-out/${op.id}.jsonl` };
  if (type === "video.generated") return { output_file_uri: `gs://chaos-out/${op.id}.mp4`, file_name: `files/${op.id}` };
  if (type.endsWith(".failed")) return { error_code: op.i % 2 ? 13 : "INTERNAL", error_message: "chaos: planned failure" };
  return {};
}

export function loadMsFor(ops) {
  return Math.min(90_000, Math.max(15_000, ops * 110));
}

export function buildSchedule(seed, n, kills) {
  const rng = makeRng(seed);
  const loadMs = loadMsFor(n);
  const classes = [];
  const silent = Math.round(n * 0.2);
  const early = Math.round(n * 0.1);
  for (let i = 0; i < n; i++) classes.push(i < silent ? "silent" : i < silent + early ? "early" : "normal");
  rng.shuffle(classes);
  const ops = [];
  for (let i = 0; i < n; i++) {
    const cls = classes[i];
    const family = rng.weighted([["batch", 0.7], ["interaction", 0.15], ["video", 0.15]]);
    const id = `c${seed}x${String(i).padStart(4, "0")}`;
    let key, name, statusPath, forms;
    if (family === "batch") {
      key = `batches/${id}`;
      name = rng.chance(0.2) ? `projects/chaos/locations/us-central1/batches/${id}` : key;
      statusPath = `/v1beta/${key}`;
      forms = [[key, 0.5], [id, 0.3], [`projects/chaos/locations/us-central1/batches/${id}`, 0.2]];
    } else if (family === "interaction") {
      key = `interactions/${id}`;
      name = key;
      statusPath = `/v1beta/${key}`;
      forms = [[key, 0.6], [id, 0.4]];
    } else {
      key = `operations/${id}`;
      name = `models/veo-3/operations/${id}`;
      statusPath = `/v1beta/${name}`;
      forms = [[name, 1]];
    }
    // A video's webhook only says "generated": a failed or cancelled video is only seen
    // through the status API, so only silent videos end that way.
    const outcomes = family === "batch" ? BATCH_OUTCOMES : family === "interaction" ? INTERACTION_OUTCOMES : VIDEO_OUTCOMES;
    const outcome = family === "video" && cls !== "silent" ? "succeeded" : rng.weighted(outcomes);
    const op = { i, id, family, cls, key, name, statusPath, outcome, deliveries: [], conflict: null };
    if (cls === "early") {
      op.registerAt = null;
      op.completeAt = rng.uniform(0.05, 0.85) * loadMs;
      op.runningAt = op.completeAt - rng.uniform(1000, 4000);
      op.createdAt = op.runningAt - rng.uniform(500, 3000);
      op.lateRegister = rng.chance(0.5);
      op.lateRegisterDelay = rng.uniform(0, 3000);
    } else {
      op.registerAt = rng.uniform(0, 0.75) * loadMs;
      op.createdAt = op.registerAt - rng.uniform(0, 500);
      op.completeAt = op.registerAt + rng.uniform(500, 8000);
      op.runningAt = op.registerAt + (op.completeAt - op.registerAt) * rng.uniform(0.2, 0.6);
    }
    if (cls !== "silent") {
      const count = rng.int(1, 6);
      const ids = [];
      for (let j = 0; j < count; j++) {
        const reuse = j > 0 && rng.chance(0.45);
        let webhookId;
        if (reuse) webhookId = rng.pick(ids);
        else {
          webhookId = `msg_${id}_${j}_${rng.u32().toString(16)}`;
          ids.push(webhookId);
        }
        const concurrent = j > 0 && rng.chance(0.3);
        const at = concurrent ? op.deliveries[j - 1].at : op.completeAt + rng.uniform(0, 6000);
        op.deliveries.push({ webhookId, at, concurrent, reuse, terminal: true });
      }
      // One body per webhook-id: a retry of a delivery is byte for byte the same message.
      op.messages = {};
      for (const webhookId of ids) {
        const type = eventTypeFor(family, outcome, rng);
        const form = rng.weighted(forms);
        op.messages[webhookId] = {
          type,
          secret: rng.chance(0.1) ? 1 : 0,
          body: JSON.stringify({ type, version: "v1", timestamp: null, data: { id: form, ...detailsFor(op, type) } }),
        };
      }
      if (family === "interaction" && rng.chance(0.35)) {
        const webhookId = `msg_${id}_ra_${rng.u32().toString(16)}`;
        const type = "interaction.requires_action";
        op.messages[webhookId] = { type, secret: 0, body: JSON.stringify({ type, version: "v1", timestamp: null, data: { id: rng.weighted(forms) } }), eventAt: (op.runningAt + op.completeAt) / 2 };
        op.deliveries.push({ webhookId, at: rng.uniform(op.runningAt, op.completeAt + 6000), concurrent: false, reuse: false, terminal: false });
      }
      if (family === "batch" && rng.chance(0.06)) {
        const other = rng.pick(["succeeded", "failed", "cancelled", "expired"].filter((o) => o !== outcome));
        const webhookId = `msg_${id}_conflict_${rng.u32().toString(16)}`;
        const type = eventTypeFor(family, other, rng);
        op.messages[webhookId] = { type, secret: 0, body: JSON.stringify({ type, version: "v1", timestamp: null, data: { id: key, ...detailsFor(op, type) } }) };
        op.conflict = { webhookId, delay: rng.uniform(200, 3000), status: other };
      }
      // Envelope timestamps: when Gemini produced the event.
      for (const m of Object.values(op.messages)) m.eventAt ??= op.completeAt + rng.uniform(0, 50);
    }
    ops.push(op);
  }
  const killAt = [];
  for (let k = 1; k <= kills; k++) killAt.push((loadMs * k) / (kills + 1) * rng.uniform(0.92, 1.08));
  return { seed, loadMs, ops, killAt };
}

// ---------------------------------------------------------------------------------------------
// Standard Webhooks signing, as Gemini signs.

function verifyEffect(headers, body) {
  const id = headers["webhook-id"], ts = headers["webhook-timestamp"], sig = headers["webhook-signature"];
  if (!id || !ts || !sig) return false;
  const expected = sign(EFFECT_SECRET, id, ts, body)["webhook-signature"];
  return sig.split(" ").some((s) => s === expected);
}

// ---------------------------------------------------------------------------------------------
// Local HTTP stand-ins.

function listen(handler) {
  return new Promise((resolve) => {
    const server = createServer(handler);
    server.keepAliveTimeout = 5000;
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      resolve({
        url: `http://127.0.0.1:${port}`,
        close: () => new Promise((r) => { server.closeAllConnections?.(); server.close(() => r()); }),
      });
    });
  });
}

function readBody(req) {
  return new Promise((resolve) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => resolve(Buffer.concat(chunks).toString()));
    req.on("error", () => resolve(Buffer.concat(chunks).toString()));
  });
}

function iso(ms) {
  return new Date(ms).toISOString();
}

/** Gemini's status API: answers from the schedule at the current time, with faults. */
async function startStatusApi(run) {
  const rng = makeRng(run.seed ^ 0x5a7a5);
  const byPath = new Map(run.schedule.ops.map((op) => [op.statusPath, op]));
  const stats = { calls: 0, status_429: 0, status_500: 0, status_stale: 0, terminal: 0, nonterminal: 0, not_found: 0, bad_key: 0 };
  const server = await listen(async (req, res) => {
    await readBody(req);
    stats.calls++;
    if (req.headers["x-goog-api-key"] !== GEMINI_API_KEY) stats.bad_key++;
    const url = req.url.split("?")[0];
    const op = byPath.get(url);
    const send = (status, body, headers = {}) => {
      if (res.destroyed) return;
      res.writeHead(status, { "content-type": "application/json", ...headers });
      res.end(JSON.stringify(body));
    };
    if (!op) {
      stats.not_found++;
      return send(404, { error: { code: 404, message: "not found", status: "NOT_FOUND" } });
    }
    const x = rng.float();
    if (x < STATUS_429) {
      stats.status_429++;
      return send(429, { error: { code: 429, message: "chaos: rate limited", status: "RESOURCE_EXHAUSTED" } }, { "retry-after": String(rng.int(1, 2)) });
    }
    if (x < STATUS_429 + STATUS_500) {
      stats.status_500++;
      return send(rng.chance(0.5) ? 500 : 503, { error: { code: 500, message: "chaos: internal", status: "INTERNAL" } }, { "retry-after": "1" });
    }
    const now = Date.now() - run.t0;
    let phase;
    if (now < op.completeAt) phase = now < op.runningAt ? "pending" : "running";
    else if (rng.chance(STATUS_STALE)) {
      stats.status_stale++;
      phase = rng.chance(0.8) ? "running" : "pending";
    } else phase = "terminal";
    if (phase === "terminal") stats.terminal++;
    else stats.nonterminal++;
    send(200, statusBody(op, phase, run.t0, rng));
  });
  return { ...server, stats };
}

function statusBody(op, phase, t0, rng) {
  const updateTime = iso(t0 + (phase === "terminal" ? op.completeAt : phase === "running" ? op.runningAt : op.createdAt));
  if (op.family === "batch") {
    const prefix = rng.chance(0.2) ? "JOB_STATE_" : "BATCH_STATE_";
    const state = phase === "terminal" ? op.outcome.toUpperCase() : phase.toUpperCase();
    const body = { name: op.key, metadata: { "@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch", state: prefix + state, createTime: iso(t0 + op.createdAt), updateTime } };
    if (phase === "terminal") {
      body.done = true;
      body.metadata.endTime = updateTime;
      if (op.outcome === "succeeded") body.response = { responsesFile: `files/${op.id}-out` };
      if (op.outcome === "failed") body.error = { code: 13, message: "chaos: planned failure" };
      if (op.outcome === "cancelled" && rng.chance(0.5)) body.error = { code: 1, message: "cancelled" };
      if (op.outcome === "expired" && rng.chance(0.5)) body.error = { code: 4, message: "deadline exceeded" };
    }
    return body;
  }
  if (op.family === "interaction") {
    const status = phase === "pending" ? "queued" : phase === "running" ? "in_progress"
      : op.outcome === "succeeded" ? "completed" : op.outcome === "cancelled" ? "cancelled" : rng.pick(["failed", "incomplete", "budget_exceeded"]);
    return { id: op.id, status, created: iso(t0 + op.createdAt), updated: updateTime };
  }
  const body = { name: op.name, metadata: { updateTime } };
  if (phase !== "terminal") return { ...body, done: false };
  if (op.outcome === "succeeded") return { ...body, done: true, response: { generateVideoResponse: { generatedSamples: [{ video: { uri: `files/${op.id}` } }] } } };
  if (op.outcome === "cancelled") return { ...body, done: true, error: { code: 1, message: "cancelled" } };
  return { ...body, done: true, error: { code: 13, message: "chaos: planned failure" } };
}

/** The side-effect destination: accepts (commits) on arrival or fails, sometimes slowly. */
async function startDestination(run) {
  const rng = makeRng(run.seed ^ 0xde57);
  const requests = [];
  const stats = { requests: 0, dest_5xx: 0, dest_slow: 0, dest_over_timeout: 0, accepted: 0, bad_signature: 0 };
  const server = await listen(async (req, res) => {
    const arrivedAt = Date.now();
    const body = await readBody(req);
    stats.requests++;
    let parsed = null;
    try { parsed = JSON.parse(body); } catch {}
    const failing = rng.chance(DEST_5XX);
    const status = failing ? rng.pick([500, 502, 503]) : rng.pick([200, 200, 200, 201, 202, 204]);
    const y = rng.float();
    const delayMs = y < DEST_OVER_TIMEOUT ? rng.uniform(1100, 1800) : y < DEST_OVER_TIMEOUT + DEST_SLOW ? rng.uniform(100, 700) : rng.uniform(0, 10);
    if (failing) stats.dest_5xx++;
    if (y < DEST_OVER_TIMEOUT) stats.dest_over_timeout++;
    else if (y < DEST_OVER_TIMEOUT + DEST_SLOW) stats.dest_slow++;
    const sigOk = verifyEffect(req.headers, body);
    if (!sigOk) stats.bad_signature++;
    const rec = {
      seq: requests.length,
      key: req.headers["idempotency-key"],
      webhookId: req.headers["webhook-id"],
      generation: req.headers["effect-generation"],
      bodyStatus: parsed?.status,
      bodyKey: parsed?.key,
      settledBy: parsed?.settled_by,
      arrivedAt,
      status,
      accepted: status >= 200 && status < 300,
      delayMs: Math.round(delayMs),
      finishedAt: null,
      closedAt: null,
      closedEarly: false,
      sigOk,
    };
    if (rec.accepted) stats.accepted++;
    requests.push(rec);
    res.on("close", () => {
      rec.closedAt = Date.now();
      if (!res.writableFinished) rec.closedEarly = true;
    });
    res.on("finish", () => { rec.finishedAt = Date.now(); });
    if (delayMs > 0) await sleep(delayMs);
    if (res.destroyed || res.writableEnded) {
      rec.closedEarly = true;
      return;
    }
    res.writeHead(status, { "content-type": "application/json" });
    res.end(status === 204 ? undefined : JSON.stringify(rec.accepted ? { ok: true } : { error: "chaos: destination failing" }));
  });
  return { ...server, stats, requests };
}

const liveGroups = new Set();
function killGroupSync(pid) {
  try { process.kill(-pid, "SIGKILL"); } catch {}
}
process.on("exit", () => { for (const pid of liveGroups) killGroupSync(pid); });

function groupAlive(pid) {
  try {
    process.kill(-pid, 0);
    return true;
  } catch {
    return false;
  }
}

class WorkerSupervisor {
  constructor({ dir, bindings, layout, onEvent, logFile }) {
    this.dir = dir;
    this.layout = layout;
    this.bindings = bindings;
    this.onEvent = onEvent;
    this.logStream = fs.createWriteStream(logFile, { flags: "a" });
    this.child = null;
    this.base = null;
    this.generation = 0;
    this.up = false;
  }

  async start() {
    const port = await freePort();
    const controlPort = await freePort();
    this.generation++;
    const cfg = {
      ...this.layout,
      scriptPath: path.join(this.dir, "build", "index.js"),
      persistRoot: path.join(this.dir, "state"),
      port,
      controlPort,
      bindings: this.bindings,
    };
    const cfgPath = path.join(this.dir, `worker-${this.generation}.json`);
    fs.writeFileSync(cfgPath, JSON.stringify(cfg));
    this.logStream.write(`=== worker generation ${this.generation} starting at ${iso(Date.now())}\n`);
    // workerd resolves the module paths from its working directory: run it where build/ is.
    const child = spawn(process.execPath, [SELF, "--worker-child", cfgPath], {
      cwd: this.dir,
      detached: true,
      stdio: ["pipe", "pipe", "pipe"],
    });
    this.child = child;
    liveGroups.add(child.pid);
    const exited = new Promise((resolve) => child.on("exit", (code, signal) => resolve({ code, signal })));
    child.exitedPromise = exited;
    const ready = new Promise((resolve, reject) => {
      eachLine(child.stdout, (line) => {
        if (line.startsWith("CHAOS_WORKER_READY ")) {
          resolve(JSON.parse(line.slice("CHAOS_WORKER_READY ".length)));
          return;
        }
        this.logStream.write(line + "\n");
        const event = logObject(line);
        if (event) this.onEvent(event);
      });
      child.stderr.on("data", (chunk) => this.logStream.write(chunk));
      exited.then(({ code, signal }) => reject(new Error(`worker child exited before ready (code ${code}, signal ${signal})`)));
    });
    const timeout = sleep(30_000).then(() => { throw new Error("worker did not start within 30 s"); });
    const info = await Promise.race([ready, timeout]);
    this.base = info.url.replace(/\/$/, "");
    this.control = info.control;
    this.up = true;
    return this;
  }

  /** SIGKILL of the whole process group (node child and workerd), then wait until it is gone. */
  async kill() {
    const child = this.child;
    if (!child) return;
    this.up = false;
    killGroupSync(child.pid);
    await Promise.race([child.exitedPromise, sleep(10_000)]);
    for (let i = 0; i < 100 && groupAlive(child.pid); i++) await sleep(50);
    if (groupAlive(child.pid)) throw new Error(`process group ${child.pid} survived SIGKILL`);
    liveGroups.delete(child.pid);
    this.child = null;
  }

  async stop() {
    await this.kill();
    await new Promise((r) => this.logStream.end(r));
  }
}

/** Child mode: runs the built worker in workerd with persisted state and an HTTP port. */
async function workerChild(cfgPath) {
  const cfg = JSON.parse(fs.readFileSync(cfgPath, "utf8"));
  // If the driver goes away (its end of stdin closes) or after an hour at most, this process
  // kills its own group, workerd included.
  const die = () => { try { process.kill(-process.pid, "SIGKILL"); } catch {} process.exit(1); };
  process.stdin.on("end", die);
  process.stdin.on("close", die);
  process.stdin.resume();
  setTimeout(die, 3_600_000).unref();
  const { Miniflare } = await import("miniflare");
  const mf = new Miniflare({
    modules: true,
    scriptPath: cfg.scriptPath,
    modulesRules: [{ type: "CompiledWasm", include: ["**/*.wasm"] }],
    compatibilityDate: cfg.compatibilityDate,
    kvNamespaces: cfg.kvNamespaces,
    durableObjects: cfg.durableObjects,
    bindings: cfg.bindings,
    defaultPersistRoot: cfg.persistRoot,
    host: "127.0.0.1",
    port: cfg.port,
    unsafeTriggerHandlers: true,
    handleRuntimeStdio(stdout, stderr) {
      stdout.pipe(process.stdout);
      stderr.pipe(process.stderr);
    },
  });
  const url = await mf.ready;
  // A small control server: lists the KV ledger with metadata for the final check.
  const control = createServer(async (req, res) => {
    try {
      const u = new URL(req.url, "http://x");
      const kv = await mf.getKVNamespace("OPS_KV");
      const all = [];
      let cursor;
      for (let page = 0; page < 1000; page++) {
        const r = await kv.list({ prefix: u.searchParams.get("prefix") ?? "", cursor });
        all.push(...r.keys);
        if (r.list_complete) break;
        cursor = r.cursor;
      }
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify(all));
    } catch (e) {
      res.writeHead(500);
      res.end(String(e));
    }
  });
  await new Promise((r) => control.listen(cfg.controlPort, "127.0.0.1", r));
  process.stdout.write(`CHAOS_WORKER_READY ${JSON.stringify({ url: String(url), control: `http://127.0.0.1:${cfg.controlPort}` })}\n`);
}

// ---------------------------------------------------------------------------------------------
// The run.

async function httpJson(url, init = {}, timeoutMs = 15_000) {
  const res = await fetch(url, { ...init, signal: AbortSignal.timeout(timeoutMs) });
  const text = await res.text();
  let body;
  try { body = JSON.parse(text); } catch { body = text; }
  return { status: res.status, body };
}

function percentile(values, p) {
  if (!values.length) return null;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

export async function runChaos(options = {}) {
  const o = { seed: 1, ops: 500, kills: 2, build: true, keep: false, quiet: false, json: null, ...options };
  const say = o.quiet ? () => {} : (...a) => console.error(...a);
  const out = o.print ?? ((line) => console.log(line));
  const wallStart = Date.now();
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), `gemini-once-chaos-s${o.seed}-`));
  say(`chaos: seed=${o.seed} ops=${o.ops} kills=${o.kills}; state and logs in ${tmp}`);

  if (o.build) {
    say("chaos: building the worker (bash scripts/build.sh)");
    const b = spawnSync("bash", ["scripts/build.sh"], { cwd: ROOT, stdio: ["ignore", "inherit", "inherit"] });
    if (b.status !== 0) throw new Error(`build failed (exit ${b.status})`);
  }
  // The other engineer may rebuild build/ at any time: run on a copy taken now.
  fs.cpSync(path.join(ROOT, "build"), path.join(tmp, "build"), { recursive: true });
  const layout = await workerLayout();

  const schedule = buildSchedule(o.seed, o.ops, o.kills);
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
    const hardDeadline = run.t0 + schedule.loadMs + 60_000 + 120_000 + o.ops * 400;

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
    const register = async (op) => {
      started.add(op.key);
      registrationStats.sent++;
      for (let attempt = 0; attempt < 200 && !stopAll; attempt++) {
        if (attempt > 0) registrationStats.retried++;
        try {
          const r = await httpJson(`${worker.base}/v1/operations`, { method: "POST", headers: adminHeaders, body: JSON.stringify({ name: op.name, kind: `chaos-${op.family}` }) });
          if (r.status === 201) { registrationStats.created++; return; }
          if (r.status === 200) { registrationStats.existed++; return; }
          if (r.status === 400 || r.status === 401) break;
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
      const keys = new Set(dest.requests.filter((r) => r.accepted).map((r) => r.key));
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

    // ---- settle: cron passes until everything is terminal and done, nothing changes, or the
    // deadline passes.
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
    const settleDeadline = Date.now() + 60_000 + o.ops * 200;
    const quietMs = 30_000;
    let lastFingerprint = "", lastChange = Date.now(), settled = false, settleRounds = 0;
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
      const fingerprint = `${done}/${dest.requests.length}/${[...views.values()].map((v) => `${v?.status}:${v?.version}`).join(",")}`;
      if (fingerprint !== lastFingerprint) { lastFingerprint = fingerprint; lastChange = Date.now(); }
      if (done === ops.length) { settled = true; break; }
      if (Date.now() - lastChange > quietMs) break;
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
    say(`chaos: +${Math.round(since() / 1000)}s settle ${settled ? "complete" : "stopped (deadline or no change)"}; checking`);

    // ---- final state: every record with its history, and the KV ledger.
    const finalViews = await snapshot();
    const finalKv = (await kvList()) ?? new Map();
    await worker.stop();

    const evidence = { o, t0: run.t0, ops, byKey, dest, api, kills, observations, finalViews, finalKv };
    result = check(evidence);
    if (!result.ok || o.keep) {
      // Everything the check saw, to re-run it offline: node scripts/chaos.mjs --recheck FILE
      fs.writeFileSync(path.join(tmp, "evidence.json"), JSON.stringify({
        o: { seed: o.seed, ops: o.ops, kills: o.kills }, t0: run.t0, kills,
        dest: { stats: dest.stats, requests: dest.requests }, api: { stats: api.stats },
        observations: [...observations], finalViews: [...finalViews], finalKv: [...finalKv],
      }));
    }
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
  out(`chaos-detail: faults status_429=${f.status_429} status_500=${f.status_500} status_stale=${f.status_stale} dest_5xx=${f.dest_5xx} dest_slow=${f.dest_slow} dest_over_timeout=${f.dest_over_timeout} kills=${f.kills} (downtime ms ${s.kills.map((k) => k.down_ms).join(",")})`);
  out(`chaos-detail: cron triggered=${s.cron.triggered} overlapping_bursts=${s.cron.bursts} passes_logged=${s.worker_events.reconcile_pass} lease_busy=${s.worker_events.lease_busy} complete=${s.worker_events.pass_complete} settled_by_reconcile=${s.worker_events.settled_by_reconcile} status_calls=${s.status_api.calls}`);
  out(`chaos-detail: effects requests=${s.destination.requests} accepted=${s.destination.accepted} keys=${s.effect_keys} duplicates_by_cause=${JSON.stringify(result.causes)} bad_signatures=${s.destination.bad_signature} wrong_effect_status=${result.checks.wrong_effect_status} unknown_keys=${result.checks.unknown_keys} settled_by=${JSON.stringify(s.settled_by)}`);
  out(`chaos-detail: checks final_wrong_status=${result.checks.final_wrong_status} effect_not_done=${result.checks.effect_not_done} version_rollbacks=${result.checks.version_rollbacks} done_rollbacks=${result.checks.done_rollbacks} observations=${s.observations} silent_settle_latency_ms p50=${s.silent_latency_p50} max=${s.silent_latency_max} elapsed_s=${s.elapsed_s} (load phase ${s.load_phase_s}, settle ${s.settle_s}, settled=${s.settled_before_deadline}) loadavg_1m mean=${s.loadavg_1m.mean} max=${s.loadavg_1m.max} cpus=${s.loadavg_1m.cpus}`);
  for (const line of result.problems.slice(0, 40)) out(`chaos-problem: ${line}`);
  if (o.json) fs.writeFileSync(o.json, JSON.stringify({ line: result.line, ok: result.ok, causes: result.causes, faults: result.faults, checks: result.checks, problems: result.problems, stats: result.stats, duplicates: result.duplicateDetails, silent: result.silentDetails }, null, 2));
  if (result.ok && !o.keep) fs.rmSync(tmp, { recursive: true, force: true });
  else say(`chaos: state, worker.log and configs kept in ${tmp}`);
  out(result.line);
  return result;
}

// ---------------------------------------------------------------------------------------------
// The checks against the schedule's ground truth.

export function check({ o, t0, ops, byKey, dest, api, kills, observations, finalViews, finalKv }) {
  const problems = [];
  const checks = { wrong_effect_status: 0, unknown_keys: 0, final_wrong_status: 0, effect_not_done: 0, version_rollbacks: 0, done_rollbacks: 0 };
  const accepted = new Map();
  for (const r of dest.requests) {
    if (!r.accepted) continue;
    if (!byKey.has(r.key)) {
      checks.unknown_keys++;
      problems.push(`side effect accepted for a key not in the schedule: ${r.key}`);
      continue;
    }
    if (!accepted.has(r.key)) accepted.set(r.key, []);
    accepted.get(r.key).push(r);
  }
  let effects = 0, duplicates = 0, explained = 0, lost = 0, regressions = 0, unsettled = 0;
  const causes = { killed: 0, timeout: 0, unexplained: 0 };
  const duplicateDetails = [];
  const silentDetails = [];
  const settledBy = {};
  const silentLatency = [];
  for (const op of ops) {
    const acc = (accepted.get(op.key) ?? []).sort((a, b) => a.arrivedAt - b.arrivedAt || a.seq - b.seq);
    effects += acc.length;
    const view = finalViews.get(op.key);
    const history = (view?.history ?? []).map((h) => ({ ...h, atMs: Date.parse(h.at) }));
    if (acc.length === 0) {
      lost++;
      problems.push(`lost ${op.key} (${op.cls}, truth ${op.outcome}): no accepted side effect; final ${JSON.stringify(brief(view))}`);
    }
    for (const r of acc) {
      if (r.bodyStatus !== op.outcome || r.bodyKey !== op.key) {
        checks.wrong_effect_status++;
        problems.push(`wrong side effect for ${op.key}: status ${r.bodyStatus} key ${r.bodyKey}, truth ${op.outcome}`);
      }
    }
    if (acc[0]?.settledBy) settledBy[acc[0].settledBy] = (settledBy[acc[0].settledBy] ?? 0) + 1;
    if (op.cls === "silent" && view?.settled_at) {
      const latency = Date.parse(view.settled_at) - (t0 + op.completeAt);
      silentLatency.push(latency);
      silentDetails.push({ key: op.key, latency_ms: Math.round(latency), settled_by: view.settled_by });
    }
    // Duplicates and their explanation.
    const commitAt = Math.min(Infinity, ...history.filter((h) => h.what === "attempt" && h.result === "effect_delivered").map((h) => h.atMs));
    const attempts = new Map(history.filter((h) => h.what === "attempt").map((h) => [h.token, h]));
    for (let j = 1; j < acc.length; j++) {
      duplicates++;
      const d = acc[j], p = acc[j - 1], first = acc[0];
      const sameIds = d.key === first.key && d.webhookId === first.webhookId && d.generation === first.generation;
      const afterCommit = commitAt < d.arrivedAt;
      // The worker's own account: the attempts of the claims taken before p arrived (one of
      // them sent p) that were still running when p arrived. Their rows may be written after
      // d arrived: a CPU-starved worker notices its deadline late, and its claim may have
      // lapsed and been taken over meanwhile.
      const candidates = history.filter((h) => h.what === "claimed" && h.atMs <= p.arrivedAt + 50).map((c) => attempts.get(c.token) ?? { token: c.token, missing: true, claimedAt: c.atMs });
      const live = candidates.filter((a) => a.missing || a.atMs >= p.arrivedAt - 50);
      const timedOut = p.closedEarly || live.some((a) => !a.missing && /^(timeout|network)/.test(a.answer ?? ""));
      const workerAttempt = live.at(-1);
      // Killed: a claim that may have sent p (taken before p arrived, and not already ended by
      // an earlier kill) never recorded how its attempt ended, and the worker was killed after
      // p arrived and before d: the destination accepted, the worker died before the commit.
      const killedInFlight = live.some((a) => a.missing && !kills.some((k) => k.at > a.claimedAt && k.at < p.arrivedAt - 5));
      const killed = killedInFlight && kills.some((k) => k.at >= p.arrivedAt - 5 && k.at <= d.arrivedAt);
      duplicateDetails.push({ key: op.key, cause: sameIds && !afterCommit && (killed || timedOut) ? (killed ? "killed" : "timeout") : "unexplained", prev_dest_delay_ms: p.delayMs, prev_closed_early: p.closedEarly, worker_attempt: workerAttempt ? { token: workerAttempt.token, missing: !!workerAttempt.missing, answer: workerAttempt.answer, ms: workerAttempt.ms, result: workerAttempt.result } : null, gap_ms: d.arrivedAt - p.arrivedAt });
      if (sameIds && !afterCommit && (killed || timedOut)) {
        explained++;
        causes[killed ? "killed" : "timeout"]++;
        // Which side was slow: the destination (answer later than the timeout) or the worker
        // (the answer left in time, the worker's deadline fired first under CPU load).
        if (!killed) causes[p.delayMs >= EFFECT_TIMEOUT_MS ? "timeout_destination_slow" : "timeout_worker_late"] = (causes[p.delayMs >= EFFECT_TIMEOUT_MS ? "timeout_destination_slow" : "timeout_worker_late"] ?? 0) + 1;
      } else {
        causes.unexplained++;
        problems.push(`unexplained duplicate side effect for ${op.key}: previous accepted at ${iso(p.arrivedAt)} (answered ${p.finishedAt ? iso(p.finishedAt) : "never"}, closed early ${p.closedEarly}, delay ${p.delayMs} ms), duplicate at ${iso(d.arrivedAt)}; same ids ${sameIds}; commit recorded ${Number.isFinite(commitAt) ? iso(commitAt) : "never"}; kills ${kills.map((k) => iso(k.at)).join(",")}; history ${JSON.stringify(view?.history ?? []).slice(0, 1500)}`);
      }
    }
    // Final state: admin API and KV ledger.
    const meta = finalKv.get(op.key);
    if (!view || !TERMINAL.has(view.status) || !meta || !TERMINAL.has(meta.status)) {
      unsettled++;
      problems.push(`unsettled ${op.key} (${op.cls}, truth ${op.outcome}): admin ${JSON.stringify(brief(view))}, ledger ${JSON.stringify(meta ?? null)}`);
    }
    if (view && TERMINAL.has(view.status) && view.status !== op.outcome) {
      checks.final_wrong_status++;
      problems.push(`final status of ${op.key} is ${view.status}, truth ${op.outcome}`);
    }
    if (view && TERMINAL.has(view.status) && !view.effect_done) {
      checks.effect_not_done++;
      problems.push(`effect not done at the end for ${op.key}: ${JSON.stringify(brief(view))}`);
    }
    // Regressions over every observation.
    const obs = observations.get(op.key).slice().sort((a, b) => a.sent - b.sent);
    let regressed = false, rolledBack = false, undone = false;
    for (let b = 0; b < obs.length; b++) {
      for (let a = 0; a < b; a++) {
        const A = obs[a], B = obs[b];
        if (A.recv >= B.sent) continue; // overlapping requests: order unknown
        const backward = rank(B.status) < rank(A.status) || (TERMINAL.has(A.status) && TERMINAL.has(B.status) && A.status !== B.status);
        if (backward && !regressed) {
          regressed = true;
          problems.push(`regression ${op.key}: observed ${A.status} (v${A.version}) then ${B.status} (v${B.version}); observations ${obs.map((x) => x.status + "@v" + x.version).join(" ").slice(0, 600)}`);
        }
        if (B.version < A.version && B.status !== "absent" && !rolledBack) {
          rolledBack = true;
          problems.push(`version rollback ${op.key}: v${A.version} then v${B.version}`);
        }
        if (A.done && !B.done && B.status !== "absent" && !undone) {
          undone = true;
          problems.push(`effect_done went back to false for ${op.key}`);
        }
      }
    }
    if (regressed) regressions++;
    if (rolledBack) checks.version_rollbacks++;
    if (undone) checks.done_rollbacks++;
  }
  const faults = {
    status_429: api.stats.status_429,
    status_500: api.stats.status_500,
    status_stale: api.stats.status_stale,
    dest_5xx: dest.stats.dest_5xx,
    dest_slow: dest.stats.dest_slow,
    dest_over_timeout: dest.stats.dest_over_timeout,
    kills: kills.length,
  };
  const faultTotal = Object.values(faults).reduce((a, b) => a + b, 0);
  const deliveries = ops.reduce((n, op) => n + op.deliveries.length + (op.conflict ? 1 : 0), 0);
  const line = `chaos: seed=${o.seed} ops=${ops.length} deliveries=${deliveries} faults=${faultTotal} effects=${effects} duplicate_effects=${duplicates} explained=${explained} lost=${lost} regressions=${regressions} unsettled=${unsettled}`;
  const extraBad = checks.wrong_effect_status + checks.unknown_keys + checks.final_wrong_status + checks.effect_not_done + checks.version_rollbacks + checks.done_rollbacks + dest.stats.bad_signature;
  if (kills.length < o.kills) problems.push(`only ${kills.length} of ${o.kills} kills happened`);
  const ok = lost === 0 && regressions === 0 && unsettled === 0 && duplicates === explained && extraBad === 0 && kills.length >= o.kills;
  const stats = {
    schedule: {
      ops: ops.length,
      batches: ops.filter((op) => op.family === "batch").length,
      interactions: ops.filter((op) => op.family === "interaction").length,
      videos: ops.filter((op) => op.family === "video").length,
      silent: ops.filter((op) => op.cls === "silent").length,
      early: ops.filter((op) => op.cls === "early").length,
      late_registered: ops.filter((op) => op.cls === "early" && op.lateRegister).length,
      never_registered: ops.filter((op) => op.cls === "early" && !op.lateRegister).length,
      outcomes: ops.reduce((m, op) => ((m[op.outcome] = (m[op.outcome] ?? 0) + 1), m), {}),
      same_id_repeats: ops.reduce((n, op) => n + op.deliveries.filter((d) => d.reuse).length, 0),
      fresh_id_duplicates: ops.reduce((n, op) => n + Math.max(0, op.deliveries.filter((d) => d.terminal && !d.reuse).length - 1), 0),
      concurrent: ops.reduce((n, op) => n + op.deliveries.filter((d) => d.concurrent).length, 0),
      conflicting: ops.filter((op) => op.conflict).length,
      requires_action: ops.reduce((n, op) => n + op.deliveries.filter((d) => !d.terminal).length, 0),
    },
    effect_keys: accepted.size,
    settled_by: settledBy,
  };
  return { line, ok, causes, faults, checks, problems, stats, silentLatency, duplicateDetails, silentDetails };
}

function brief(view) {
  if (!view) return null;
  const { status, version, effect_done, effect_parked, attempts, settled_by, last_error } = view;
  return { status, version, effect_done, effect_parked, attempts, settled_by, last_error };
}

// ---------------------------------------------------------------------------------------------
// Command line.

const activeCleanups = new Set();

export function parseArgs(argv) {
  const o = { seed: null, ops: 500, kills: 2, build: true, keep: false, json: null };
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
    console.error(`chaos: ${e.message}\nusage: npm run chaos -- [--seed N] [--ops N] [--kills N] [--no-build] [--keep] [--json FILE] | --recheck EVIDENCE.json`);
    process.exit(2);
  }
  if (o.help) {
    console.log("usage: npm run chaos -- [--seed N] [--ops N] [--kills N] [--no-build] [--keep] [--json FILE] | --recheck EVIDENCE.json");
    return;
  }
  if (o.recheck) {
    // Re-runs the check on a kept evidence.json (the schedule is rebuilt from its seed).
    const e = JSON.parse(fs.readFileSync(o.recheck, "utf8"));
    const schedule = buildSchedule(e.o.seed, e.o.ops, e.o.kills);
    const r = check({ o: e.o, t0: e.t0, ops: schedule.ops, byKey: new Map(schedule.ops.map((op) => [op.key, op])), dest: e.dest, api: e.api, kills: e.kills, observations: new Map(e.observations), finalViews: new Map(e.finalViews), finalKv: new Map(e.finalKv) });
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

if (process.argv[2] === "--worker-child") {
  workerChild(process.argv[3]).catch((e) => {
    console.error(`worker child: ${e.stack ?? e}`);
    try { process.kill(-process.pid, "SIGKILL"); } catch {}
    process.exit(1);
  });
} else if (process.argv[1] && path.resolve(process.argv[1]) === SELF) {
  main();
}
