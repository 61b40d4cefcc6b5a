// Measuring: quantiles and summaries of latencies, medians over rounds, CPU time of workerd, the
// client and the stubs from /proc, and waiting until workerd is idle (deferred work done).
import fs from "node:fs";

import { now, round, sleep } from "./common.mjs";

function quantile(sorted, q) {
  if (!sorted.length) return null;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
  return sorted[i];
}
export function summarize(values) {
  const s = Float64Array.from(values).sort();
  const sum = s.reduce((a, b) => a + b, 0);
  return { n: s.length, p50: quantile(s, 0.5), p90: quantile(s, 0.9), p99: quantile(s, 0.99), max: s.length ? s[s.length - 1] : null, mean: s.length ? sum / s.length : null };
}

export function median(xs) {
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
export function childPids(comm) {
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
export function cpuMeter(workerdPid, stubPid) {
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
export async function quiesce(pid, maxMs, minMs = 0) {
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
