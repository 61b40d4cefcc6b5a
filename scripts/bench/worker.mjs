// The worker under test: the built worker in workerd through Miniflare with wrangler.toml's
// bindings, optionally beside a plain-JS probe worker (what the platform itself costs), its JSON
// log lines collected by event; and the child mode that serves it for the start-up measurement.
import fs from "node:fs";
import path from "node:path";
import { eachLine, logObject } from "../local_worker.mjs";

import { ADMIN_TOKEN, EFFECT_SECRET, GEMINI_SECRET, WRANGLER, now, sleep, workers } from "./common.mjs";
import { childPids } from "./measure.mjs";

/** Serves the built worker in `dir` on `port` until killed (start-up measurement). */
export async function serveOnce(dir, port) {
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

export function baseVars(vars) {
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
    queueProducers: WRANGLER.queueProducers,
    queueConsumers: WRANGLER.queueConsumers,
    bindings: { ...WRANGLER.vars, ...bindings },
  };
}

/** Starts the built worker in `dir` on a free 127.0.0.1 port; collects its JSON log lines. */
export async function startWorker(dir, vars, extraOptions = {}, { probe = false, probeDest } = {}) {
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
    // The KV namespace that holds its ledger.
    ledger: "OPS_KV",
    other,
    events: (name) => byEvent.get(name) ?? [],
    count: (name) => (byEvent.get(name) ?? []).length,
    /** How many lines of each event so far. */
    eventCounts: () => Object.fromEntries([...byEvent].map(([e, lines]) => [e, lines.length])),
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

/**
 * What a worker's ledger namespace holds, by key prefix (up to the first ':'): keys, and with `bytes`
 * their size (key + value + metadata JSON; reads every value).
 */
export async function kvByPrefix(w, { bytes = false } = {}) {
  const kv = await w.mf.getKVNamespace(w.ledger);
  const out = {};
  let cursor;
  do {
    const page = await kv.list({ cursor });
    for (const k of page.keys) {
      const p = k.name.includes(":") ? k.name.slice(0, k.name.indexOf(":") + 1) : "(none)";
      const t = (out[p] ??= bytes ? { keys: 0, bytes: 0 } : { keys: 0 });
      t.keys++;
      if (bytes) t.bytes += Buffer.byteLength(k.name) + Buffer.byteLength((await kv.get(k.name)) ?? "") + (k.metadata ? Buffer.byteLength(JSON.stringify(k.metadata)) : 0);
    }
    cursor = page.list_complete ? undefined : page.cursor;
  } while (cursor);
  if (bytes) for (const t of Object.values(out)) t.bytes_per_key = Math.round(t.bytes / t.keys);
  return out;
}
