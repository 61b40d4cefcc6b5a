// A batch's results through `npm start` (wrangler dev), beside the same batch in Miniflare as
// the results section runs it (results.mjs), so the two are compared on the same machine at
// the same moment. `npm start` runs as a user runs it (the build, scripts/start.mjs, wrangler
// dev with its inspector proxy and its log handling), its state persisted under a fresh
// directory, the stand-in Gemini and destination of results.mjs on free ports. A batch
// `"results":"each"` of N lines is registered, a cron pass runs (wrangler dev's
// `--test-scheduled` route; `scheduled()` in Miniflare), and the run waits for the job's effect.
//
// It reports lines a second, the time to the last result, the time between one chunk's
// download and the next, and what ran between chunks: from the destination's answer to a
// chunk's last result to the next chunk's download (the commit, the alarm, the next run's
// start and its decisions), with the load average.
//
//   node scripts/bench/start_results.mjs [--lines 2000] [--dest-ms 0] [--via start,miniflare]
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

import { ADMIN_TOKEN, CRON, EFFECT_SECRET, GEMINI_SECRET, now, round, setWrangler, sleep } from "./common.mjs";
import { startStandIns } from "./results.mjs";
import { freePort } from "./heap.mjs";
import { startWorker } from "./worker.mjs";
import { ROOT } from "../dev_vars.mjs";
import { workerLayout } from "../local_worker.mjs";

function option(argv, name, fallback) {
  const at = argv.indexOf(name);
  return at >= 0 ? argv[at + 1] : fallback;
}

/** `npm start` on a free port with `vars` as its env file; resolves to {url, scheduled, stop, output}. */
async function viaStart(vars) {
  const port = await freePort();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "start-results-"));
  const envFile = path.join(dir, "env");
  fs.writeFileSync(envFile, Object.entries(vars).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join("\n") + "\n", { mode: 0o600 });
  const child = spawn("bash", ["scripts/start.sh", "--port", String(port), "--ip", "127.0.0.1", "--persist-to", path.join(dir, "state"), "--env-file", envFile], {
    cwd: ROOT,
    detached: true,
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, GEMINI_ONCE_LOCAL_WORKER_FILE: path.join(dir, "local-worker.json"), FORCE_COLOR: "0" },
  });
  const output = [];
  for (const stream of [child.stdout, child.stderr]) stream.on("data", (b) => output.push([now(), b.toString()]));
  const url = `http://127.0.0.1:${port}`;
  const stop = async () => {
    try { process.kill(-child.pid, "SIGTERM"); } catch {}
    await new Promise((r) => { if (child.exitCode !== null) r(); else { child.once("exit", r); setTimeout(r, 10_000); } });
    try { process.kill(-child.pid, "SIGKILL"); } catch {}
    fs.rmSync(dir, { recursive: true, force: true });
  };
  const up = now() + 180_000;
  while (now() < up) {
    if (child.exitCode !== null) {
      await stop();
      throw new Error(`npm start exited ${child.exitCode}: ${output.map(([, t]) => t).join("").slice(-2000)}`);
    }
    if (await fetch(`${url}/healthz`).then((r) => r.text().then(() => true), () => false)) break;
    await sleep(500);
  }
  const scheduled = () => fetch(`${url}/__scheduled?cron=${encodeURIComponent(CRON)}`).then((r) => r.text());
  return { url, scheduled, stop, output, cpu: () => groupCpu(child.pid) };
}

/**
 * The built worker in Miniflare, as the results section runs it; `inspected`: with workerd's
 * inspector open to a client that enables what wrangler dev's inspector proxy enables
 * (`Runtime.enable`, `Network.enable`), reading every event; `persisted`: its state on disk.
 */
async function viaMiniflare(vars, { inspected = false, persisted = false } = {}) {
  setWrangler(await workerLayout());
  const inspectorPort = inspected ? await freePort() : undefined;
  const dir = persisted ? fs.mkdtempSync(path.join(os.tmpdir(), "mf-results-")) : null;
  const w = await startWorker(path.join(ROOT, "build"), vars, { ...(inspected ? { inspectorPort } : {}), ...(dir ? { defaultPersistRoot: dir } : {}) });
  const worker = await w.mf.getWorker();
  const events = {};
  let ws;
  if (inspected) {
    const { default: WebSocket } = await import("ws");
    const list = await (await fetch(`http://127.0.0.1:${inspectorPort}/json`)).json();
    ws = new WebSocket(list.find((t) => t.id === "core:user:").webSocketDebuggerUrl);
    await new Promise((resolve, reject) => { ws.once("open", resolve); ws.once("error", reject); });
    ws.on("message", (m) => { const d = JSON.parse(String(m)); if (d.method) events[d.method] = (events[d.method] ?? 0) + 1; });
    ws.send(JSON.stringify({ id: 1, method: "Runtime.enable" }));
    ws.send(JSON.stringify({ id: 2, method: "Network.enable" }));
  }
  const stop = async () => {
    ws?.close();
    await w.dispose();
    if (dir) fs.rmSync(dir, { recursive: true, force: true });
  };
  return { url: w.url.toString().replace(/\/$/, ""), scheduled: () => worker.scheduled({ cron: CRON, scheduledTime: new Date() }), stop, output: [], events };
}

/** CPU time (ms) of every process in process group `pgid`, by its command line's head. */
function groupCpu(pgid) {
  const out = {};
  for (const pid of fs.readdirSync("/proc").filter((d) => /^\d+$/.test(d))) {
    try {
      const f = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
      const rest = f.slice(f.lastIndexOf(")") + 2).split(" ");
      if (Number(rest[2]) !== pgid) continue;
      const cmd = fs.readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").filter(Boolean).map((a) => path.basename(a)).slice(0, 3).join(" ");
      out[`${pid} ${cmd}`] = ((Number(rest[11]) + Number(rest[12])) * 1000) / 100;
    } catch {}
  }
  return out;
}

const quantiles = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const q = (f) => (s.length ? round(s[Math.min(s.length - 1, Math.floor(f * s.length))], 0) : null);
  return { p50: q(0.5), p90: q(0.9), max: q(1) };
};

/** One batch of `lines` results through `via` ("start" or "miniflare"); returns the figures. */
export async function runResults({ via = "start", lines = 2000, destMs = 0, timeoutMs = 600_000, extraVars = {}, log = () => {} }) {
  const name = `batches/${via}-results-${lines}-${Date.now().toString(36)}`;
  const s = await startStandIns(name, lines, 1024);
  s.delayMs = destMs;
  const vars = {
    GEMINI_WEBHOOK_SECRETS: GEMINI_SECRET,
    EFFECT_URL: `${s.url}/effects`,
    EFFECT_SIGNING_SECRET: EFFECT_SECRET,
    ADMIN_TOKEN,
    GEMINI_API_BASE: s.url,
    GEMINI_API_KEY: "bench-gemini-key",
    RECONCILE_GRACE_SECONDS: "0",
    ...extraVars,
  };
  let w;
  try {
    w = via === "start" ? await viaStart(vars) : await viaMiniflare(vars, { inspected: via.includes("inspected"), persisted: via.includes("persisted") });
    const reg = await fetch(`${w.url}/v1/operations`, { method: "POST", headers: { authorization: `Bearer ${ADMIN_TOKEN}`, "content-type": "application/json" }, body: JSON.stringify({ name, kind: "start-results", results: "each" }) });
    if (reg.status !== 201) throw new Error(`register ${name}: ${reg.status} ${await reg.text()}`);
    await sleep(1_500); // the registration's projection puts its `open:` entry
    const load = os.loadavg()[0];
    const cpu0 = w.cpu?.() ?? {};
    const t0 = now();
    for (let pass = 0; pass < 20 && s.polls === 0; pass++) {
      await w.scheduled();
      if (s.polls === 0) await sleep(500);
    }
    if (s.polls === 0) throw new Error("no pass asked about the batch");
    let shown = 0;
    while (s.jobEffects === 0 && now() - t0 < timeoutMs) {
      await sleep(250);
      if (now() - t0 > shown + 15_000) {
        shown = now() - t0;
        log(`  ${via}: ${s.results.size}/${lines} results after ${round(shown / 1000, 0)} s`);
      }
    }
    const cpu1 = w.cpu?.() ?? {};
    const cpu = Object.fromEntries(Object.entries(cpu1).map(([k, v]) => [k, round(v - (cpu0[k] ?? 0), 0)]).filter(([, v]) => v > 0));
    const at = s.downloadAt ?? [];
    const spanMs = s.lastAt && s.firstAt ? s.lastAt - s.firstAt : null;
    return {
      via,
      lines,
      destination_ms: destMs,
      finished: s.jobEffects > 0,
      delivered: s.results.size,
      repeats: s.repeats,
      downloads: s.downloads,
      lines_per_second: spanMs ? round((s.results.size / spanMs) * 1000, 1) : null,
      seconds_to_last_line: s.lastAt ? round((s.lastAt - t0) / 1000, 1) : null,
      ms_between_downloads: quantiles(at.slice(1).map((t, i) => t - at[i])),
      ms_last_answer_to_next_download: quantiles(s.idleBeforeDownload ?? []),
      load_average: [round(load, 2), round(os.loadavg()[0], 2)],
      ...(w.cpu ? { cpu_ms_by_process: cpu } : {}),
      ...(w.events ? { inspector_events: w.events } : {}),
      output: w.output.map(([t, text]) => [round(t - t0, 0), text]),
    };
  } finally {
    await w?.stop();
    await s.close();
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const argv = process.argv.slice(2);
  const logFile = option(argv, "--log");
  for (const via of option(argv, "--via", "start,miniflare").split(",")) {
    const r = await runResults({
      via,
      lines: Number(option(argv, "--lines", "2000")),
      destMs: Number(option(argv, "--dest-ms", "0")),
      extraVars: argv.includes("--usage-log") ? { USAGE_LOG: "true" } : {},
      log: (l) => process.stderr.write(l + "\n"),
    });
    if (logFile && r.output.length) fs.writeFileSync(logFile, r.output.map(([t, text]) => `${t} ${text}`).join(""));
    delete r.output;
    console.log(JSON.stringify(r));
  }
  process.exit(0);
}
