// Test harness: the built worker in workerd (through Miniflare) with real KV and SQLite
// Durable Object storage, plus real local HTTP servers standing in for the destination,
// Gemini's status API and an alert sink. Nothing of the worker's own code is mocked.
import { createServer } from "node:http";
import { readFileSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import path from "node:path";
import assert from "node:assert/strict";
import { Miniflare } from "miniflare";
import Ajv2020 from "ajv/dist/2020.js";

import { sign } from "../scripts/send.mjs";
import { eachLine, logObject } from "../scripts/local_worker.mjs";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

export const GEMINI_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
export const EFFECT_SECRET = "whsec_c2lkZS1lZmZlY3Qtc2VjcmV0LWZvci10ZXN0cw==";
export const ADMIN_TOKEN = "test-admin-token-0123456789";
/** A token of each narrower scope (src/access.rs): every test worker has all three, as a deployed one does. */
export const REGISTER_TOKEN = "test-register-token-0123456789";
export const READ_TOKEN = "test-read-token-0123456789";

/**
 * Starts the built worker with `vars` on top of a working test configuration (ADMIN_TOKEN,
 * REGISTER_TOKENS and READ_TOKENS set to the tokens above, EFFECT_TIMEOUT_MS 60 s; a var set
 * to `undefined` is unset). With
 * `{ http: true }` it also listens on a loopback port (`worker.url`), for real HTTP clients.
 * With `{ persist: dir }` its KV and Durable Object state live in `dir` (a worker started
 * again on the same `dir` finds them); otherwise in memory.
 */
export async function startWorker(vars = {}, { http = false, persist, main = {}, workers = [] } = {}) {
  const logs = [];
  const collect = (stream) => eachLine(stream, (line) => {
    logs.push(line);
    if (process.env.SHOW_WORKER_LOGS) console.error(line);
  });
  const options = (more = {}) => {
    const bindings = {
      GEMINI_WEBHOOK_SECRETS: GEMINI_SECRET,
      EFFECT_URL: "http://127.0.0.1:9/unset",
      EFFECT_SIGNING_SECRET: EFFECT_SECRET,
      ADMIN_TOKEN,
      REGISTER_TOKENS: REGISTER_TOKEN,
      READ_TOKENS: READ_TOKEN,
      // Counters are batched in each gate before going to a stats shard; 1 s instead of the
      // default 10 keeps the batching path under test without slowing the suite.
      STATS_FLUSH_SECONDS: "1",
      // The stand-in destinations answer at once: an attempt past the default 5 s is a starved
      // machine (every object of a test shares one isolate), and its retry a second request
      // where a test counts one. A test of the timeout itself sets its own.
      EFFECT_TIMEOUT_MS: "60000",
      ...vars,
      ...more,
    };
    for (const [k, v] of Object.entries(bindings)) if (v === undefined) delete bindings[k];
    const gemini = {
      name: "gemini-once",
      modules: true,
      scriptPath: path.join(root, "build/index.js"),
      modulesRules: [{ type: "CompiledWasm", include: ["**/*.wasm"] }],
      compatibilityDate: "2026-04-01",
      kvNamespaces: ["OPS_KV"],
      durableObjects: {
        OPERATION_GATE: { className: "OperationGate", useSQLite: true },
        RECONCILE_LEASE: { className: "ReconcileLease", useSQLite: true },
        STATS: { className: "StatsShard", useSQLite: true },
        DESTINATION_DESK: { className: "DestinationDesk", useSQLite: true },
        STRANGER_WATCH: { className: "StrangerWatch", useSQLite: true },
        RETIRED_NAMES: { className: "RetiredNames", useSQLite: true },
        RESULT_SENDER: { className: "ResultSender", useSQLite: true },
      },
      // The fan-out queue, produced and consumed by the worker itself, as wrangler.toml says.
      queueProducers: { RECONCILE_QUEUE: { queueName: "gemini-once-polls" } },
      queueConsumers: { "gemini-once-polls": { maxBatchSize: 5, maxBatchTimeout: 1, maxRetries: 3 } },
      bindings,
      // The user's own bindings (a queue producer, a service binding), when a test declares them.
      ...main,
    };
    // Other local workers beside it (a queue consumer, a service), when a test has them.
    return {
      ...(workers.length ? { workers: [gemini, ...workers] } : gemini),
      ...(http ? { host: "127.0.0.1", port: 0 } : {}),
      ...(persist ? { defaultPersistRoot: persist } : {}),
      handleRuntimeStdio(stdout, stderr) {
        collect(stdout);
        collect(stderr);
      },
    };
  };
  const mf = new Miniflare(options());
  const ready = await mf.ready;
  const worker = {
    mf,
    url: http ? String(ready).replace(/\/$/, "") : undefined,
    logs,
    /** Structured (JSON) log lines the worker printed so far. */
    events(name) {
      return logs.map(logObject).filter((e) => e && (!name || e.event === name));
    },
    fetch: (p, init) => mf.dispatchFetch(`http://gemini-once.test${p}`, init),
    async json(p, init) {
      const res = await worker.fetch(p, init);
      const text = await res.text();
      let body;
      try { body = JSON.parse(text); } catch { body = text; }
      return { status: res.status, body };
    },
    admin(p, init = {}) {
      return worker.as(ADMIN_TOKEN).json(p, init);
    },
    /**
     * The admin API as the holder of `token` calls it: `json(p, init)` with `token` as the
     * bearer, and `register` and `inspect` as below.
     */
    as(token) {
      const api = {
        json: (p, init = {}) => worker.json(p, {
          ...init,
          headers: { authorization: `Bearer ${token}`, "content-type": "application/json", ...(init.headers || {}) },
        }),
        register: (name, kind, extra = {}) => api.json("/v1/operations", { method: "POST", body: JSON.stringify({ name, kind, ...extra }) }),
        inspect: (name) => api.json(`/v1/operations/${encodeURIComponent(name)}`),
      };
      return api;
    },
    /** Registers `name`; `extra` adds fields to the body (e.g. `user_metadata`). */
    register(name, kind, extra = {}) {
      return worker.as(ADMIN_TOKEN).register(name, kind, extra);
    },
    inspect(name) {
      return worker.as(ADMIN_TOKEN).inspect(name);
    },
    /** Sends a Gemini-signed delivery; returns {status, body}. */
    deliver(type, id, data = {}, opts = {}) {
      const body = opts.rawBody ?? JSON.stringify({ type, version: "v1", timestamp: opts.timestamp ?? new Date().toISOString(), data: { id, ...data } });
      return worker.json("/webhooks/gemini", { method: "POST", headers: signedHeaders(body, opts), body });
    },
    /**
     * Runs the cron handler, then waits (10 s at most, silently) until its line is among the
     * logs (`reconcile_pass`, or `reconcile_error`): workerd writes it before it answers, but
     * its output and its answer reach this process apart, and a test reads the line next.
     */
    async scheduled(cron = "*/5 * * * *") {
      const from = logs.length;
      const ended = () => logs.slice(from).some((l) => /"event":"reconcile_(pass|error)"/.test(l));
      const w = await mf.getWorker();
      const result = await w.scheduled({ cron, scheduledTime: new Date() });
      for (const deadline = Date.now() + 10_000; !ended() && Date.now() < deadline;) {
        await new Promise((r) => setTimeout(r, 10));
      }
      return result;
    },
    async kvList(prefix) {
      const kv = await mf.getKVNamespace("OPS_KV");
      const all = [];
      let cursor;
      do {
        const page = await kv.list({ prefix, cursor });
        all.push(...page.keys);
        cursor = page.list_complete ? undefined : page.cursor;
      } while (cursor);
      return all;
    },
    async kv() {
      return mf.getKVNamespace("OPS_KV");
    },
    /**
     * Waits until the ledger entry of each key exists and satisfies `check(metadata)`: the gate
     * projects to KV from its alarm, just after it answers.
     */
    async ledger(keys, check = () => true) {
      const kv = await mf.getKVNamespace("OPS_KV");
      const metas = [];
      for (const key of [].concat(keys)) {
        metas.push(await eventually(async () => {
          const { metadata } = await kv.getWithMetadata(`op:${key}`);
          return metadata && check(metadata) && metadata;
        }, { what: `ledger entry of ${key}` }));
        await indexAgrees(kv, key);
      }
      return Array.isArray(keys) ? metas : metas[0];
    },
    /**
     * Restarts the worker with `more` vars on top of its configuration, on the same port and
     * (with `persist`) the same state: what restarting `npm start` after editing .dev.vars does.
     */
    restart: (more) => mf.setOptions(options(more)),
    dispose: () => mf.dispose(),
  };
  return worker;
}

const TERMINAL = new Set(["succeeded", "failed", "cancelled", "expired"]);
/** Whether a ledger entry's operation belongs in the `open:` index (src/operation/ledger.rs, `may_need_work`). */
function mayNeedWork(m) {
  if (m.forgotten) return false;
  if (TERMINAL.has(m.status)) return !m.effect_done && (!m.parked || !(m.alerts ?? []).includes("effect_failing"));
  return ["pending", "running", "requires_action"].includes(m.status);
}

/**
 * Waits (5 s at most, silently) until `open:<key>` agrees with `op:<key>`: the gate writes the
 * two side by side, so a test that saw the entry could run a pass before the index held it.
 */
async function indexAgrees(kv, key) {
  for (const deadline = Date.now() + 5_000; Date.now() < deadline;) {
    const [{ metadata: op }, { metadata: open }] = await Promise.all([kv.getWithMetadata(`op:${key}`), kv.getWithMetadata(`open:${key}`)]);
    if (!op || (mayNeedWork(op) ? open?.version === op.version : !open)) return;
    await new Promise((r) => setTimeout(r, 20));
  }
}

let counter = 0;
/** Standard Webhooks headers for `body`, as Gemini signs them. */
export function signedHeaders(body, opts = {}) {
  const id = opts.webhookId ?? `msg_test_${process.pid}_${++counter}`;
  const headers = sign(opts.secret ?? GEMINI_SECRET, id, opts.ts ?? Math.floor(Date.now() / 1000), body);
  if (opts.signature != null) headers["webhook-signature"] = opts.signature;
  return headers;
}

/** The side effect's documented body (docs/effect.schema.json), compiled once. */
export const EFFECT_SCHEMA = JSON.parse(readFileSync(path.join(root, "docs/effect.schema.json"), "utf8"));
// `format` is documentation here (the schema's `pattern` checks the timestamp); strict mode
// still refuses a schema with unknown keywords or types.
const validateEffect = new Ajv2020({ strict: true, allowUnionTypes: true, allErrors: true, validateFormats: false }).compile(EFFECT_SCHEMA);

/**
 * Asserts that a side effect's body (the raw string, or parsed) is valid against
 * docs/effect.schema.json; returns it parsed.
 */
export function assertEffectValid(body) {
  const value = typeof body === "string" ? JSON.parse(body) : body;
  if (!validateEffect(value)) {
    assert.fail(`effect body does not match docs/effect.schema.json: ${JSON.stringify(validateEffect.errors)}\nbody: ${JSON.stringify(value)}`);
  }
  return value;
}

/**
 * A destination: a local server (see `startServer`) that also checks every body it receives
 * against docs/effect.schema.json. `invalid` lists the bodies that did not match;
 * `assertAllValid()` fails the test if there are any and returns how many effects came.
 */
export async function startDestination(behave) {
  const invalid = [];
  const server = await startServer((req, n) => {
    try {
      assertEffectValid(req.body);
    } catch (e) {
      invalid.push({ url: req.url, key: req.headers["idempotency-key"], error: e.message });
    }
    return behave ? behave(req, n) : { status: 200 };
  });
  return {
    ...server,
    invalid,
    assertAllValid() {
      assert.deepEqual(invalid, [], "every side effect matches docs/effect.schema.json");
      return server.requests.length;
    },
  };
}

/**
 * A local HTTP server that records every request. `behave(req, body, n)` returns
 * {status, delayMs, body} for the n-th request (1-based) to a path; default 200.
 */
export async function startServer(behave = () => ({ status: 200 })) {
  const requests = [];
  const perPath = new Map();
  const server = createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", async () => {
      const body = Buffer.concat(chunks).toString();
      const n = (perPath.get(req.url) ?? 0) + 1;
      perPath.set(req.url, n);
      const record = { method: req.method, url: req.url, headers: req.headers, body, at: Date.now() };
      requests.push(record);
      let answer;
      try { answer = (await behave(record, n)) ?? { status: 200 }; } catch { answer = { status: 500 }; }
      if (answer.delayMs) await new Promise((r) => setTimeout(r, answer.delayMs));
      if (res.destroyed) return;
      const payload = typeof answer.body === "string" ? answer.body : JSON.stringify(answer.body ?? { ok: true });
      res.writeHead(answer.status ?? 200, { "content-type": "application/json", ...(answer.headers || {}) });
      res.end(payload);
    });
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address();
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    close: () => new Promise((r) => { server.closeAllConnections?.(); server.close(r); }),
  };
}

/**
 * A local stand-in for Gemini's status API. `answers` maps an operation's path under
 * `v1beta/` (`batches/x`, `models/m/operations/y`) to an answer for `startServer`, or to a
 * function of the call's number giving one; any other path answers 404. `callsFor(path)`
 * lists the calls for one operation.
 */
export async function startStatusApi(answers) {
  const server = await startServer((req, n) => {
    const answer = answers.get(req.url.replace(/^\/v1beta\//, ""));
    return typeof answer === "function" ? answer(n) : answer ?? { status: 404, body: { error: { code: 404, status: "NOT_FOUND" } } };
  });
  return { ...server, callsFor: (path) => server.requests.filter((r) => r.url === `/v1beta/${path}`) };
}

/**
 * Polls `check` until it returns a truthy value or `timeoutMs` passes. The default is long:
 * it bounds how long a failing test waits, never how fast a passing one must be (a busy
 * machine may take many times a quiet one's seconds).
 */
export async function eventually(check, { timeoutMs = 60_000, everyMs = 100, what = "condition" } = {}) {
  const deadline = Date.now() + timeoutMs;
  let last;
  while (Date.now() < deadline) {
    last = await check();
    if (last) return last;
    await new Promise((r) => setTimeout(r, everyMs));
  }
  throw new Error(`timed out waiting for ${what}; last value: ${JSON.stringify(last)}`);
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** The workerd processes this test process started (Miniflare runs workerd as a child). */
export function workerdChildren() {
  let out = "";
  try {
    out = execFileSync("ps", ["-o", "pid=,comm=", "--ppid", String(process.pid)], { encoding: "utf8" });
  } catch {
    return [];
  }
  return out.split("\n").map((l) => l.trim().split(/\s+/)).filter(([pid, comm]) => pid && /workerd/.test(comm ?? "")).map(([pid]) => Number(pid));
}
