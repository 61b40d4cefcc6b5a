// The simple design as a benchmark peer: its TypeScript Worker (DIR/src/index.ts)
// bundled to one ES module with the esbuild wrangler already depends on (no download), run in
// workerd through a Miniflare instance of its own with its own KV, the compatibility date and
// flags of its wrangler.toml, and the same secrets as ours.
import fs from "node:fs";
import path from "node:path";

import { ADMIN_TOKEN, GEMINI_SECRET, now, workers } from "./common.mjs";
import { childPids } from "./measure.mjs";
import { eachLine, logObject } from "../local_worker.mjs";

/** DIR/src/index.ts as one ES module, and what DIR/wrangler.toml says about the runtime. */
export async function bundlePeer(dir) {
  const entry = path.join(dir, "src/index.ts");
  if (!fs.existsSync(entry)) throw new Error(`--peer ${dir}: no src/index.ts`);
  const esbuild = await import("esbuild");
  const out = await esbuild.build({ entryPoints: [entry], bundle: true, format: "esm", platform: "neutral", target: "es2022", write: false, logLevel: "silent" });
  const code = out.outputFiles[0].text;
  const { unstable_readConfig } = await import("wrangler");
  const config = unstable_readConfig({ config: path.join(dir, "wrangler.toml") });
  return {
    code,
    bytes: Buffer.byteLength(code),
    name: config.name ?? "peer",
    compatibilityDate: config.compatibility_date ?? "2025-11-01",
    compatibilityFlags: config.compatibility_flags ?? [],
    kvNamespaces: (config.kv_namespaces ?? []).map((k) => k.binding),
  };
}

/** Starts the bundled peer on a free 127.0.0.1 port, its effects going to `effectUrl`. */
export function startPeer(bundle, effectUrl) {
  return startPlain({
    code: bundle.code,
    compatibilityDate: bundle.compatibilityDate,
    compatibilityFlags: bundle.compatibilityFlags,
    kvNamespaces: bundle.kvNamespaces,
    bindings: { GEMINI_WEBHOOK_SECRETS: GEMINI_SECRET, EFFECT_URL: effectUrl, ADMIN_TOKEN },
  });
}

/**
 * A plain-JS worker (one ES module, `code`) in a workerd of its own, on a free 127.0.0.1 port,
 * with the KV namespaces, Durable Objects and bindings given; shaped like `startWorker`'s handle.
 */
export async function startPlain({ code, compatibilityDate, compatibilityFlags = [], kvNamespaces = [], durableObjects = {}, bindings }) {
  const { Miniflare } = await import("miniflare");
  const other = [];
  const byEvent = new Map();
  const collect = (stream) => eachLine(stream, (line) => {
    const parsed = logObject(line);
    if (parsed && typeof parsed.event === "string") {
      if (!byEvent.has(parsed.event)) byEvent.set(parsed.event, []);
      byEvent.get(parsed.event).push(parsed);
    } else if (line.trim() && other.length < 50) other.push(line.slice(0, 300));
  });
  const t0 = now();
  const mf = new Miniflare({
    host: "127.0.0.1",
    port: 0,
    logRequests: false,
    modules: [{ type: "ESModule", path: "plain.mjs", contents: code }],
    compatibilityDate,
    compatibilityFlags,
    kvNamespaces,
    durableObjects,
    bindings,
    handleRuntimeStdio(stdout, stderr) {
      collect(stdout);
      collect(stderr);
    },
  });
  const known = new Set([...workers].map((x) => x.pid));
  const url = await mf.ready;
  const w = {
    mf,
    url,
    ready_ms: now() - t0,
    pid: childPids("workerd").find((p) => !known.has(p)) ?? null,
    // The KV namespace that holds its ledger (the first it binds).
    ledger: kvNamespaces[0],
    other,
    // Their JSON log lines with an `event` (the minimum's `usage` lines), as startWorker's.
    events: (name) => byEvent.get(name) ?? [],
    eventCounts: () => Object.fromEntries([...byEvent].map(([e, lines]) => [e, lines.length])),
    count: (name) => (byEvent.get(name) ?? []).length,
    async waitFor(name, n, timeoutMs = 10_000) {
      const deadline = now() + timeoutMs;
      while (w.count(name) < n && now() < deadline) await new Promise((r) => setTimeout(r, 10));
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
