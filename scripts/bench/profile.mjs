// Profile: V8 CPU profiles of our isolate in workerd through the inspector (a small DevTools
// protocol client), one scenario at a time, with self and inclusive time per function.
import http from "node:http";

import { round } from "./common.mjs";
import { startWorker } from "./worker.mjs";
import { cpuMeter, quiesce, summarize } from "./measure.mjs";
import { load, send } from "./load.mjs";
import { crateOf } from "./wasm.mjs";
import { DEFERRED_MS, prepareScenarios } from "./fast.mjs";

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

export async function benchProfile(dir, stubs, plan) {
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
