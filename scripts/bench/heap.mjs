// The worker's own isolate's memory, read from workerd's inspector (the Chrome DevTools
// protocol Miniflare serves with `inspectorPort`): V8's heap in use, workerd's objects on it
// (`embedderHeapUsedSize`) and array buffers' backing stores (the Wasm module's linear memory
// among them). This is what Workers' 128 MB limit counts, per isolate; workerd's resident memory
// (RSS) also holds the local runtime's own bookkeeping, which grows with every subrequest even
// for a plain-JS worker (docs/PERFORMANCE.md, "Results of a batch").
// `ws` is Miniflare's own dependency (node 20 has no WebSocket of its own).
import WebSocket from "ws";

/** A free TCP port for the inspector. */
export async function freePort() {
  const net = await import("node:net");
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

/**
 * Samples the isolate of the worker named `name` ("" for the main worker) every `everyMs`:
 * `{ async stop() -> { samples, live, peak_mb, live_first_mb, live_peak_mb, wasm_before_mb, wasm_after_mb } }`;
 * each sample `[time, bytes]`: heap used + embedder + backing stores (garbage included), and in
 * `live` after a full collection, with the Wasm memory added. Resolves null when the inspector cannot be reached.
 */
export async function sampleIsolate(port, { name = "", everyMs = 500, liveEvery = 6, now = Date.now } = {}) {
  let target;
  try {
    const list = await (await fetch(`http://127.0.0.1:${port}/json`, { signal: AbortSignal.timeout(3_000) })).json();
    target = list.find((t) => t.id === `core:user:${name}`);
  } catch {
    return null;
  }
  if (!target) return null;
  const ws = new WebSocket(target.webSocketDebuggerUrl);
  try {
    await new Promise((resolve, reject) => { ws.once("open", resolve); ws.once("error", reject); });
  } catch {
    return null;
  }
  let id = 0;
  const pending = new Map();
  const contexts = [];
  ws.on("message", (m) => {
    const d = JSON.parse(String(m));
    if (d.method === "Runtime.executionContextCreated") contexts.push(d.params.context.id);
    pending.get(d.id)?.(d.result);
    pending.delete(d.id);
  });
  ws.on("error", () => {});
  const call = (method, params = {}, ms = 2_000) => new Promise((resolve) => {
    const i = ++id;
    pending.set(i, resolve);
    ws.send(JSON.stringify({ id: i, method, params }));
    setTimeout(() => { pending.delete(i); resolve(null); }, ms);
  });
  const usage = () => call("Runtime.getHeapUsage");
  // The Wasm linear memory's size: it only grows, so its size at the end is its peak.
  const wasmBytes = async () => {
    if (!contexts.length) await call("Runtime.enable");
    const proto = await call("Runtime.evaluate", { expression: "WebAssembly.Memory.prototype", contextId: contexts[0] });
    const id = proto?.result?.objectId;
    if (!id) return null;
    const found = await call("Runtime.queryObjects", { prototypeObjectId: id }, 10_000);
    const list = found?.objects?.objectId;
    if (!list) return null;
    const sizes = await call("Runtime.callFunctionOn", { objectId: list, functionDeclaration: "function () { return this.map((m) => m.buffer.byteLength); }", returnByValue: true });
    return sizes?.result?.value ?? null;
  };
  const samples = [];
  const live = [];
  let busy = false;
  let n = 0;
  const timer = setInterval(async () => {
    if (busy) return;
    busy = true;
    // Every `liveEvery`th sample, the live heap: V8 collects all garbage before it answers
    // queryObjects, so the usage read right after is what the isolate holds, not what waits
    // for a collection (which V8 lets grow with the room it has).
    const full = ++n % liveEvery === 0;
    const wasm = full ? await wasmBytes() : null;
    const u = await usage();
    busy = false;
    if (!u) return;
    const bytes = u.usedSize + (u.embedderHeapUsedSize ?? 0) + (u.backingStorageSize ?? 0);
    samples.push([now(), bytes]);
    if (full && wasm) live.push([now(), bytes + wasm.reduce((a, b) => a + b, 0)]);
  }, everyMs);
  const wasmBefore = await wasmBytes();
  return {
    samples,
    async stop() {
      clearInterval(timer);
      const wasmAfter = await wasmBytes();
      const peak = Math.max(0, ...samples.map(([, b]) => b));
      const mb = (b) => Math.round((b / 2 ** 20) * 10) / 10;
      const sum = (l) => (l ? mb(l.reduce((a, b) => a + b, 0)) : null);
      const u = await usage();
      if (u && wasmAfter) live.push([now(), u.usedSize + (u.embedderHeapUsedSize ?? 0) + (u.backingStorageSize ?? 0) + wasmAfter.reduce((a, b) => a + b, 0)]);
      ws.close();
      const livePeak = Math.max(0, ...live.map(([, b]) => b));
      return { samples, live, peak_mb: samples.length ? mb(peak) : null, live_first_mb: live.length ? mb(live[0][1]) : null, live_peak_mb: live.length ? mb(livePeak) : null, wasm_before_mb: sum(wasmBefore), wasm_after_mb: sum(wasmAfter) };
    },
  };
}
