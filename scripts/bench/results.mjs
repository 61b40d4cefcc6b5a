// The results section: a batch registered with `"results":"each"` whose results file has N
// lines of about 1 KB each, delivered end to end through the built worker in workerd. A stand-in
// Gemini answers the batch SUCCEEDED with `response.responsesFile` and serves the file at the
// download path, generated as it streams (honouring `Range`), never held; a stand-in destination
// answers each effect at once or after a delay. A cron pass finds the batch; the section then
// waits for the job's effect, which comes after every result.
//
// What it reports, per cell (lines x destination delay), each in a fresh worker: lines a
// second (results delivered over the time from the first result to the last), the time from
// the pass to the last result, workerd's CPU per line (all its threads, over the run), workerd's
// resident memory (sampled every 250 ms: before, peak, and the peak's growth), the worker's own
// isolate through workerd's inspector (heap.mjs: V8's heap, its live part after a full
// collection, and the Wasm memory: what Workers' 128 MB counts), and what the
// objects counted themselves (USAGE_LOG lines: DO requests, rows written, alarm writes, wall
// time) per result, priced per million results (cost.mjs, `resultsBill`). Every result must
// reach the destination under one `webhook-id` (repeats counted), and the job's effect must
// carry the counts. A cell that does not finish in its time reports how far it got.
import fs from "node:fs";
import http from "node:http";

import { ADMIN_TOKEN, CRON, now, round, sleep } from "./common.mjs";
import { startWorker } from "./worker.mjs";
import { send } from "./load.mjs";
import { generatedFile, serveFile } from "../results_file.mjs";
import { resultsBill } from "./cost.mjs";
import { freePort, sampleIsolate } from "./heap.mjs";

const COUNTS = ["rows_read", "rows_written", "alarm_writes", "outbound_fetches", "wall_ms", "held_ms", "sql_statements"];

/** Gemini's status API and download for one batch, and the destination, counting what they see. */
export async function startStandIns(name, lines, lineBytes, inline = null) {
  const file = generatedFile({ lines, lineBytes, prefix: "req-", errorEvery: 100 });
  const fileName = `files/${name.split("/")[1]}-results`;
  const s = { polls: 0, downloads: 0, ranged: 0, results: new Set(), repeats: 0, firstAt: null, lastAt: null, job: null, jobAt: null, jobEffects: 0, delayMs: 0, other: 0 };
  const server = http.createServer((req, res) => {
    const url = new URL(req.url, "http://x");
    if (req.method === "GET" && url.pathname === `/v1beta/${name}`) {
      req.resume();
      s.polls++;
      const t = new Date().toISOString();
      const output = { responsesFile: fileName };
      res.writeHead(200, { "content-type": "application/json" });
      if (inline) return res.end(inline);
      return res.end(JSON.stringify({ name, done: true, metadata: { state: "BATCH_STATE_SUCCEEDED", createTime: t, updateTime: t, endTime: t, output }, response: output }));
    }
    if (req.method === "GET" && decodeURIComponent(url.pathname) === `/download/v1beta/${fileName}:download`) {
      req.resume();
      s.downloads++;
      (s.downloadAt ??= []).push(now());
      // How long after the last result's answer this chunk's read began: what ran between chunks.
      if (s.answeredAt !== undefined) (s.idleBeforeDownload ??= []).push(now() - s.answeredAt);
      if (req.headers.range) s.ranged++;
      return serveFile(req, res, file);
    }
    if (req.method === "POST" && url.pathname === "/effects") {
      const id = String(req.headers["webhook-id"] ?? "");
      const chunks = [];
      req.on("data", (c) => chunks.push(c));
      req.on("end", () => {
        const answer = () => {
          res.writeHead(200, { "content-type": "application/json" });
          res.end('{"ok":true}');
          s.answeredAt = now();
        };
        if (id.startsWith("res_")) {
          if (s.results.has(id)) s.repeats++;
          else s.results.add(id);
          s.firstAt ??= now();
          s.lastAt = now();
        } else {
          s.jobEffects++;
          s.jobAt ??= now();
          try { s.job = JSON.parse(Buffer.concat(chunks).toString()); } catch { s.job = {}; }
        }
        if (s.delayMs > 0) setTimeout(answer, s.delayMs);
        else answer();
      });
      return;
    }
    req.resume();
    s.other++;
    res.writeHead(404);
    res.end("{}");
  });
  server.keepAliveTimeout = 30_000;
  server.maxConnections = 1024;
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  s.url = `http://127.0.0.1:${server.address().port}`;
  s.fileBytes = file.size;
  s.close = () => new Promise((r) => { server.closeAllConnections?.(); server.close(r); });
  return s;
}

/** A process's resident memory (bytes), from /proc. */
function rssOf(pid) {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, "utf8"));
    return m ? Number(m[1]) * 1024 : null;
  } catch {
    return null;
  }
}

/** A process's CPU time (ms, all threads), from /proc. */
function cpuMsOf(pid) {
  try {
    const f = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
    const [utime, stime] = f.slice(f.lastIndexOf(")") + 2).split(" ").slice(11, 13).map(Number);
    return ((utime + stime) * 1000) / 100;
  } catch {
    return null;
  }
}

/** The objects' usage lines from `from` on, summed over the run. */
function usageTotals(w, from) {
  const t = { do_requests: 0, ...Object.fromEntries(COUNTS.map((c) => [c, 0])), by_object: {} };
  for (const l of w.events("usage").slice(from)) {
    t.do_requests++;
    for (const c of COUNTS) t[c] += l[c] ?? 0;
    const k = `${l.object}.${l.invocation}`;
    t.by_object[k] = (t.by_object[k] ?? 0) + 1;
  }
  return t;
}

/**
 * A status answer of about `mb` MB holding a batch's results inline, as Gemini writes it: the
 * list twice (`metadata.output` and `response`), items of about `itemBytes` (keys `req-<i>`,
 * one in 100 an error). Returns the answer's bytes and its item count.
 */
export function inlineAnswer(name, mb, itemBytes) {
  const item = (i) => {
    const head = i % 100 === 0 ? { error: { code: 3, message: "bad request" } } : { response: { candidates: [{ content: { parts: [{ text: "" }] } }] } };
    const bare = JSON.stringify({ ...head, metadata: { key: `req-${i}` } });
    if (head.error) return bare;
    head.response.candidates[0].content.parts[0].text = `answer ${i} `.padEnd(Math.max(0, itemBytes - bare.length), "x");
    return JSON.stringify({ ...head, metadata: { key: `req-${i}` } });
  };
  const n = Math.floor((mb * 1_000_000) / 2 / itemBytes);
  const list = `{"inlinedResponses":[${Array.from({ length: n }, (_, i) => item(i)).join(",")}]}`;
  const t = new Date().toISOString();
  const body = `{"name":${JSON.stringify(name)},"done":true,"metadata":{"@type":"type.googleapis.com/google.ai.generativelanguage.v1beta.GenerateContentBatch","state":"BATCH_STATE_SUCCEEDED","createTime":"${t}","updateTime":"${t}","endTime":"${t}","output":{"inlinedResponses":${list}}},"response":{"@type":"type.googleapis.com/google.ai.generativelanguage.v1beta.GenerateContentBatchOutput","inlinedResponses":${list}}}`;
  return { body: Buffer.from(body), items: n };
}

/** One cell: `lines` results (or an inline answer of `inlineMb` MB), the destination answering after `destMs`, in a fresh worker. */
async function cell(dir, { lines, destMs, lineBytes, timeoutMs, inlineMb = null }) {
  const name = `batches/bench-results-${inlineMb ? `inline${inlineMb}` : lines}-${destMs}-${Date.now().toString(36)}`;
  const inline = inlineMb ? inlineAnswer(name, inlineMb, lineBytes) : null;
  if (inline) lines = inline.items;
  const s = await startStandIns(name, lines, lineBytes, inline?.body);
  s.delayMs = destMs;
  const inspectorPort = await freePort();
  const w = await startWorker(dir, {
    EFFECT_URL: `${s.url}/effects`,
    GEMINI_API_BASE: s.url,
    GEMINI_API_KEY: "bench-gemini-key",
    RECONCILE_GRACE_SECONDS: "0",
    USAGE_LOG: "true",
  }, { inspectorPort });
  const base = new URL(w.url);
  const agent = new http.Agent({ keepAlive: true, maxSockets: 2 });
  const rss = [];
  const sampler = setInterval(() => { const b = rssOf(w.pid); if (b) rss.push([now(), b, s.results.size]); }, 250);
  try {
    const reg = await send(agent, base, { method: "POST", path: "/v1/operations", headers: { authorization: `Bearer ${ADMIN_TOKEN}`, "content-type": "application/json" }, body: JSON.stringify({ name, kind: "bench-results", results: "each" }) });
    if (reg.status !== 201) throw new Error(`results: register ${name}: ${reg.status} ${reg.body}`);
    await sleep(1_500); // the registration's projection puts its `open:` entry
    const rssBefore = rssOf(w.pid);
    // The isolate's own memory (what Workers' 128 MB counts), beside workerd's RSS.
    // An inline answer is read within a second or two: sample it often.
    const isolate = await sampleIsolate(inspectorPort, inline ? { now, everyMs: 100, liveEvery: 5 } : { now });
    const cpu0 = cpuMsOf(w.pid);
    const usage0 = w.count("usage");
    const worker = await w.mf.getWorker();
    const t0 = now();
    for (let pass = 0; pass < 20 && s.polls === 0; pass++) {
      await worker.scheduled({ cron: CRON, scheduledTime: new Date() });
      if (s.polls === 0) await sleep(500);
    }
    if (s.polls === 0) throw new Error("results: no pass asked about the batch");
    const deadline = t0 + timeoutMs;
    let shown = 0;
    while (s.jobEffects === 0 && now() < deadline) {
      await sleep(250);
      if (now() - t0 > shown + 30_000) {
        shown = now() - t0;
        process.stderr.write(`    ${s.results.size}/${lines} results after ${round(shown / 1000, 0)} s\n`);
      }
    }
    const finished = s.jobEffects > 0;
    await sleep(1_000); // repeats that come late
    const cpu = cpuMsOf(w.pid) - cpu0;
    const heap = (await isolate?.stop()) ?? { samples: [], peak_mb: null };
    const heapAt = (t) => heap.samples.filter(([ts]) => ts <= t).at(-1)?.[1] ?? null;
    const usage = usageTotals(w, usage0);
    const delivered = s.results.size;
    const spanMs = s.lastAt && s.firstAt ? s.lastAt - s.firstAt : null;
    const peak = Math.max(...rss.map(([, b]) => b), rssBefore ?? 0);
    // How memory went with the results delivered: a dozen samples across the run.
    const step = Math.max(1, Math.floor(rss.length / 12));
    const timeline = rss.filter((_, i) => i % step === 0 || i === rss.length - 1).map(([t, b, n]) => ({ s: round((t - t0) / 1000, 1), results: n, rss_mb: round(b / 2 ** 20, 1), isolate_mb: heapAt(t) === null ? null : round(heapAt(t) / 2 ** 20, 1) }));
    const per = (x) => (delivered ? round(x / delivered, 4) : null);
    return {
      lines,
      inline_answer_bytes: inline?.body.length ?? null,
      line_bytes: lineBytes,
      file_bytes: s.fileBytes,
      destination_ms: destMs,
      finished,
      delivered,
      repeats: s.repeats,
      job_effects: s.jobEffects,
      job_results: s.job?.results ?? null,
      job_after_last_result: finished && s.lastAt !== null ? s.jobAt >= s.lastAt : null,
      downloads: s.downloads,
      ranged_downloads: s.ranged,
      lines_per_second: spanMs ? round((delivered / spanMs) * 1000, 1) : null,
      seconds_to_last_line: s.lastAt ? round((s.lastAt - t0) / 1000, 1) : null,
      seconds_to_job_effect: finished ? round((s.jobAt - t0) / 1000, 1) : null,
      workerd_cpu_ms_per_line: per(cpu),
      rss_before_mb: rssBefore ? round(rssBefore / 2 ** 20, 1) : null,
      rss_peak_mb: round(peak / 2 ** 20, 1),
      rss_growth_mb: rssBefore ? round((peak - rssBefore) / 2 ** 20, 1) : null,
      isolate_before_mb: heap.samples.length ? round(heap.samples[0][1] / 2 ** 20, 1) : null,
      isolate_peak_mb: heap.peak_mb,
      isolate_live_first_mb: heap.live_first_mb ?? null,
      isolate_live_peak_mb: heap.live_peak_mb ?? null,
      wasm_memory_mb: { before: heap.wasm_before_mb ?? null, after: heap.wasm_after_mb ?? null },
      rss_timeline: timeline,
      per_result: {
        do_requests: per(usage.do_requests),
        rows_written: per(usage.rows_written),
        alarm_writes: per(usage.alarm_writes),
        rows_read: per(usage.rows_read),
        wall_ms: per(usage.wall_ms + usage.held_ms),
        outbound_fetches: per(usage.outbound_fetches),
      },
      invocations: usage.by_object,
    };
  } finally {
    clearInterval(sampler);
    agent.destroy();
    await w.dispose();
    await s.close();
  }
}

/** The section: every size at every destination delay. */
export async function benchResults(dir, { sizes, destMs, lineBytes, timeoutMs, inlineMb = null }) {
  const cells = [];
  for (const ms of destMs) {
    if (inlineMb) {
      process.stderr.write(`  results: an inline answer of ${inlineMb} MB, items of ${lineBytes} bytes, destination ${ms} ms\n`);
      const c = await cell(dir, { lines: 0, destMs: ms, lineBytes, timeoutMs, inlineMb });
      process.stderr.write(`  results: ${c.delivered}/${c.lines} delivered (${c.repeats} repeats) from ${c.inline_answer_bytes} bytes, isolate ${c.isolate_before_mb} -> ${c.isolate_peak_mb} MB (live ${c.isolate_live_first_mb} -> ${c.isolate_live_peak_mb} MB), Wasm memory ${c.wasm_memory_mb.before} -> ${c.wasm_memory_mb.after} MB\n`);
      cells.push(c);
      continue;
    }
    for (const lines of sizes) {
      process.stderr.write(`  results: ${lines} lines of ${lineBytes} bytes, destination ${ms} ms\n`);
      const c = await cell(dir, { lines, destMs: ms, lineBytes, timeoutMs });
      process.stderr.write(`  results: ${c.delivered}/${lines} delivered (${c.repeats} repeats), ${c.lines_per_second} lines/s, last after ${c.seconds_to_last_line} s, ${c.workerd_cpu_ms_per_line} ms CPU a line, RSS ${c.rss_before_mb} -> ${c.rss_peak_mb} MB, isolate ${c.isolate_before_mb} -> ${c.isolate_peak_mb} MB (live ${c.isolate_live_first_mb} -> ${c.isolate_live_peak_mb} MB), Wasm memory ${c.wasm_memory_mb.before} -> ${c.wasm_memory_mb.after} MB\n`);
      cells.push(c);
    }
  }
  // The bill per million results from the largest finished run at once (most chunks, least start-up).
  const basis = cells.filter((c) => c.finished && c.destination_ms === Math.min(...destMs)).at(-1) ?? cells.at(-1);
  return { cells, bill: resultsBill(basis?.delivered ? basis.per_result : null) };
}
