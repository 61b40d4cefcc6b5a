// What the tests and the scripts that run the built worker locally (bench, chaos) share: the
// worker's bindings as wrangler.toml declares them, read with wrangler's own reader so every
// local run follows the file; a free loopback port; and a child's output as lines, with the
// worker's JSON log lines parsed.
import net from "node:net";
import path from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

/**
 * Compatibility date, KV namespaces, Durable Objects (SQLite where a migration says so), queues
 * and `[vars]` from wrangler.toml.
 */
export async function workerLayout() {
  const { unstable_readConfig } = await import("wrangler");
  const config = unstable_readConfig({ config: path.join(ROOT, "wrangler.toml") });
  const sqlite = new Set((config.migrations ?? []).flatMap((m) => m.new_sqlite_classes ?? []));
  const durableObjects = {};
  for (const b of config.durable_objects?.bindings ?? []) durableObjects[b.name] = { className: b.class_name, useSQLite: sqlite.has(b.class_name) };
  const layout = {
    compatibilityDate: config.compatibility_date ?? "2026-04-01",
    kvNamespaces: (config.kv_namespaces ?? []).map((k) => k.binding),
    durableObjects,
    vars: Object.fromEntries(Object.entries(config.vars ?? {}).map(([k, v]) => [k, String(v)])),
    // Miniflare's spelling of [[queues.producers]] and [[queues.consumers]].
    queueProducers: Object.fromEntries((config.queues?.producers ?? []).map((q) => [q.binding, { queueName: q.queue }])),
    queueConsumers: Object.fromEntries((config.queues?.consumers ?? []).map((q) => [q.queue, {
      maxBatchSize: q.max_batch_size,
      maxBatchTimeout: q.max_batch_timeout,
      maxRetries: q.max_retries,
    }])),
  };
  if (!layout.kvNamespaces.includes("OPS_KV") || !durableObjects.OPERATION_GATE) throw new Error(`unexpected wrangler.toml layout: ${JSON.stringify(layout)}`);
  return layout;
}

/** A TCP port free on 127.0.0.1 a moment ago. */
export function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

/** Calls `onLine` with each complete line `stream` emits. */
export function eachLine(stream, onLine) {
  let buffered = "";
  stream.on("data", (chunk) => {
    buffered += chunk.toString();
    let nl;
    while ((nl = buffered.indexOf("\n")) >= 0) {
      const line = buffered.slice(0, nl);
      buffered = buffered.slice(nl + 1);
      onLine(line);
    }
  });
}

/** The JSON object a worker log line carries (after any prefix workerd adds), or null. */
export function logObject(line) {
  const start = line.indexOf("{");
  if (start < 0) return null;
  try {
    return JSON.parse(line.slice(start));
  } catch {
    return null;
  }
}
