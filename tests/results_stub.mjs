// What the results tests share: a local stand-in for Gemini that serves status answers and
// results files (honouring `Range`), files of keyed lines, and a destination's requests
// split into results and job effects. Used by tests/results.test.mjs and
// tests/results_desk.test.mjs.
import { createServer } from "node:http";
import { eventually } from "./helpers.mjs";

/** A stand-in for Gemini: status answers by batch key, results files by name (honouring
 * `Range` with a 206 and its `Content-Range`, unless `ignoreRange`; from byte 0 whatever was
 * asked when `rangeFromZero`), each file answering `fileStatus(name, n)` first when set. A
 * file or a status named in `redirects` answers 302 to that URL instead; a status whose
 * `statusFails(n)` gives `{status, headers}` on its n-th call answers that. Every request's
 * path, `x-goog-api-key` and time are kept in `requests`. */
export async function startGemini() {
  const state = { status: new Map(), files: new Map(), fileStatus: new Map(), redirects: new Map(), statusFails: new Map(), ignoreRange: false, rangeFromZero: false, downloads: [], requests: [] };
  const server = createServer((req, res) => {
    const url = new URL(req.url, "http://x");
    state.requests.push({ path: url.pathname, key: req.headers["x-goog-api-key"], at: Date.now() });
    const download = url.pathname.match(/^\/download\/v1beta\/(files\/[^:]+):download$/);
    const redirect = state.redirects.get(download ? download[1] : url.pathname.replace(/^\/v1beta\//, ""));
    if (redirect) {
      res.writeHead(302, { location: redirect });
      return res.end();
    }
    if (download) {
      const name = download[1];
      state.downloads.push({ name, range: req.headers.range, key: req.headers["x-goog-api-key"] });
      const n = state.downloads.filter((d) => d.name === name).length;
      const forced = state.fileStatus.get(name)?.(n);
      const file = state.files.get(name);
      if (forced || !file) {
        res.writeHead(forced ?? 404, { "content-type": "application/json" });
        return res.end(JSON.stringify({ error: { code: forced ?? 404 } }));
      }
      const range = !state.ignoreRange && req.headers.range?.match(/^bytes=(\d+)-$/);
      const from = range && !state.rangeFromZero ? Number(range[1]) : 0;
      if (range && from >= file.length) {
        // As HTTP says (and Google's storage answers): a range past the end is not satisfiable.
        res.writeHead(416, { "content-range": `bytes */${file.length}` });
        return res.end();
      }
      const headers = { "content-type": "application/jsonl" };
      if (range) headers["content-range"] = `bytes ${from}-${file.length - 1}/${file.length}`;
      res.writeHead(range ? 206 : 200, headers);
      // In pieces, as a network would: the worker stops reading once its chunk is full.
      const body = file.subarray(from);
      let at = 0;
      const pump = () => {
        while (at < body.length) {
          const ok = res.write(body.subarray(at, at + 4096));
          at += 4096;
          if (!ok) return res.once("drain", pump);
        }
        res.end();
      };
      res.on("error", () => {});
      return pump();
    }
    const name = url.pathname.replace(/^\/v1beta\//, "");
    const n = state.requests.filter((r) => r.path === url.pathname).length;
    const failed = state.statusFails.get(name)?.(n);
    if (failed) {
      res.writeHead(failed.status, failed.headers ?? {});
      return res.end(JSON.stringify({ error: { code: failed.status } }));
    }
    const status = state.status.get(name);
    const answer = typeof status === "function" ? status() : status;
    res.writeHead(answer ? 200 : 404, { "content-type": "application/json" });
    res.end(JSON.stringify(answer ?? { error: { code: 404 } }));
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return { ...state, state, url: `http://127.0.0.1:${server.address().port}`, close: () => new Promise((r) => { server.closeAllConnections(); server.close(r); }) };
}

export const succeeded = (key, output) => ({ name: key, done: true, metadata: { state: "BATCH_STATE_SUCCEEDED", updateTime: new Date().toISOString(), ...(output ? { output } : {}) } });

/** A file of `n` keyed lines (line `bad` is not JSON). */
export function fileOf(n, { bad = -1, errorEvery = 0 } = {}) {
  const lines = [];
  for (let i = 0; i < n; i++) {
    if (i === bad) lines.push("{not json");
    else if (errorEvery && i % errorEvery === 0) lines.push(JSON.stringify({ key: `k${i}`, error: { code: 3, message: "bad request" } }));
    else lines.push(JSON.stringify({ key: `k${i}`, response: { candidates: [{ content: { parts: [{ text: `answer ${i} ${"x".repeat(200)}` }] } }] } }));
  }
  return Buffer.from(lines.join("\n") + "\n");
}

/** The destination's requests split into results (by webhook-id) and job effects; each with
 * when it arrived and, when the destination recorded it (`req.answered`), its answer. */
export function split(dest, key) {
  const mine = dest.requests.map((r) => ({ id: r.headers["webhook-id"], body: JSON.parse(r.body), at: r.at, answered: r.answered })).filter((r) => r.body.key === key);
  return { results: mine.filter((r) => "result_key" in r.body), jobs: mine.filter((r) => !("result_key" in r.body)) };
}

export const distinct = (list) => new Set(list).size;

/** Waits for the job effect of `key` at `dest`; returns `split(dest, key)` then. */
export const untilJob = (dest, key, timeoutMs = 60_000) =>
  eventually(() => { const s = split(dest, key); return s.jobs.length > 0 && s; }, { timeoutMs, what: `the job effect of ${key}` });

/** The worker's settings for a results test: effects to `dest`, Gemini at `gemini` with a key,
 * alerts to `sink`, retries after 1 s and at most 2 s apart. */
export const workerVars = ({ dest, gemini, sink }) => ({
  EFFECT_URL: `${dest.url}/effects`,
  GEMINI_API_BASE: gemini.url,
  GEMINI_API_KEY: "test-gemini-key",
  ALERT_URL: `${sink.url}/alerts`,
  EFFECT_RETRY_BASE_SECONDS: "1",
  EFFECT_RETRY_MAX_SECONDS: "2",
  // The stand-in destinations answer at once (or within a second): hundreds of sends in one
  // isolate on a starved machine can pass the default 5 s, and a timed-out send goes again,
  // a second request where the tests count each result once.
  EFFECT_TIMEOUT_MS: "60000",
});
