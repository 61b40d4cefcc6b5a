// Reading a batch's results (the status answer, then the results file), against the built
// worker in workerd, with a local stand-in for Gemini: a 206 that does not start where it was
// asked is never used (no line under another id) and parks the results with its reason, which
// an operator's retry then reads again from where reading stopped; our API key never reaches
// another origin when a download or a status answer redirects there; a results file name that
// fails the filter, or a status answer that names no results, parks the results with an alert
// instead of meaning zero of them (resolved by a results_file_read alert once an operator's
// retry reads the file after all); a file missing 48 hours after the batch ended is parked at
// once; and the results' status call draws from the one status budget and honours its
// `Retry-After`; and a large inline answer is read as a stream, each of its results once.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { startWorker, startServer, eventually, sleep, assertEffectValid } from "./helpers.mjs";
import { startGemini, succeeded, fileOf, split, distinct, untilJob, workerVars } from "./results_stub.mjs";

describe("reading a batch's results", () => {
  let gemini, other, dest, sink;
  const vars = (extra = {}) => ({ ...workerVars({ dest, gemini, sink }), RESULTS_FILE_WAIT_SECONDS: "3", ...extra });
  const alertsFor = (key) => sink.requests.map((r) => JSON.parse(r.body)).filter((a) => a.key === key && a.alert === "results_file_parked");
  before(async () => {
    gemini = await startGemini();
    other = await startGemini();
    sink = await startServer(() => ({ status: 200 }));
    dest = await startServer(() => ({ status: 200 }));
  });
  after(async () => { await gemini.close(); await other.close(); await dest.close(); await sink.close(); });

  it("a 206 from byte 0 to a Range from the checkpoint is not used: no line under another id, the results parked with the reason; an operator's retry reads the rest once the server is fixed", { timeout: 120_000 }, async () => {
    const w = await startWorker(vars());
    try {
      const key = "batches/range0";
      gemini.files.set("files/range0", fileOf(300));
      gemini.status.set(key, succeeded(key, { responsesFile: "files/range0" }));
      gemini.state.rangeFromZero = true;
      await w.register(key, "other", { results: "each" });
      await w.deliver("batch.succeeded", key);
      const { jobs } = await untilJob(dest, key);
      const first = split(dest, key).results;
      // A step claims a wave of 240 results: the first wave is read from byte 0, the next asks
      // a Range from its checkpoint, and the server answers 206 from byte 0.
      assert.equal(first.length, 240, "the first wave only");
      assert.equal(distinct(first.map((r) => r.body.result_key)), 240, "no line came back under another index");
      assert.equal(distinct(first.map((r) => r.id)), 240);
      const job = assertEffectValid(jobs[0].body);
      assert.equal(job.results.total, 240);
      assert.match(job.results.file_parked, /^206 from byte 0, asked from byte \d+$/);
      await eventually(() => alertsFor(key).length === 1, { what: "the results_file_parked alert" });
      assert.ok(gemini.downloads.filter((d) => d.name === "files/range0" && d.range).length >= 2, "asked again before it was parked");

      // The server is fixed: an operator's retry reads the file again from where it stopped.
      gemini.state.rangeFromZero = false;
      const dry = await w.admin(`/v1/operations/${encodeURIComponent(key)}/results/retry`, { method: "POST", body: JSON.stringify({ reason: "check", dry_run: true }) });
      assert.equal(dry.body.would_reread_file, true);
      const retry = await w.admin(`/v1/operations/${encodeURIComponent(key)}/results/retry`, { method: "POST", body: JSON.stringify({ reason: "storage fixed" }) });
      assert.equal(retry.status, 200);
      assert.equal(retry.body.retried, 0);
      assert.equal(retry.body.file_reread, true);
      await eventually(() => split(dest, key).results.length >= 300, { timeoutMs: 60_000, what: "the rest of the file" });
      const op = await eventually(async () => { const op = (await w.inspect(key)).body; return op.results_counts?.total === 300 && op; }, { what: "the counts of the whole file" });
      const all = split(dest, key).results;
      assert.equal(all.length, 300, "each result once");
      assert.equal(distinct(all.map((r) => r.body.result_key)), 300);
      assert.deepEqual(op.results_counts, { total: 300, delivered: 300, errors: 0, parked: 0 });
      const row = op.history.find((h) => h.what === "results_retried");
      assert.ok(row, "the operator's retry has its history row");
      assert.equal(row.file_reread, true);
      assert.equal(row.reason, "storage fixed");
      assert.equal(row.by.scope, "admin");
      // The file is read after all: its results_file_parked alert is resolved (PagerDuty
      // closes the incident under the same dedup_key).
      const read = await eventually(() => sink.requests.map((r) => JSON.parse(r.body)).find((a) => a.key === key && a.alert === "results_file_read"), { what: "the results_file_read resolution" });
      assert.equal(read.resolves, "results_file_parked");
      assert.equal(alertsFor(key).length, 1, "the trigger once");
    } finally {
      gemini.state.rangeFromZero = false;
      await w.dispose();
    }
  });

  it("our key never reaches another origin: a status answer and a download that redirect to another port are fetched there without it", { timeout: 90_000 }, async () => {
    const w = await startWorker(vars());
    try {
      const key = "batches/redir1";
      other.status.set(key, succeeded(key, { responsesFile: "files/redir1" }));
      other.files.set("files/redir1", fileOf(50));
      gemini.redirects.set(key, `${other.url}/v1beta/${key}`);
      gemini.redirects.set("files/redir1", `${other.url}/download/v1beta/files/redir1:download?alt=media`);
      // A redirect on the same origin keeps the key (the file is served under another name).
      const same = "batches/redir2";
      gemini.status.set(same, succeeded(same, { responsesFile: "files/redir2" }));
      gemini.files.set("files/redir2b", fileOf(10));
      gemini.redirects.set("files/redir2", `/download/v1beta/files/redir2b:download?alt=media`);
      for (const k of [key, same]) {
        await w.register(k, "other", { results: "each" });
        await w.deliver("batch.succeeded", k);
      }
      const { jobs } = await untilJob(dest, key);
      assert.deepEqual(jobs[0].body.results, { total: 50, delivered: 50, errors: 0, parked: 0 });
      assert.equal(distinct(split(dest, key).results.map((r) => r.id)), 50);
      const elsewhere = other.requests.filter((r) => r.path.includes("redir1"));
      assert.ok(elsewhere.some((r) => r.path.startsWith("/v1beta/")), "the status answer was followed there");
      assert.ok(elsewhere.some((r) => r.path.startsWith("/download/")), "the download was followed there");
      assert.deepEqual(elsewhere.map((r) => r.key ?? null), elsewhere.map(() => null), "never with our key");
      const { jobs: sameJobs } = await untilJob(dest, same);
      assert.equal(sameJobs[0].body.results.total, 10);
      const followed = gemini.requests.filter((r) => r.path.includes("redir2b"));
      assert.ok(followed.length >= 1 && followed.every((r) => r.key === "test-gemini-key"), "the same origin gets the key");
    } finally {
      await w.dispose();
    }
  });

  it("a results file name that fails the filter, or a status answer that names no results, parks the results with an alert: never zero results", { timeout: 90_000 }, async () => {
    const w = await startWorker(vars());
    try {
      const cases = {
        "batches/silent-gs": { output: { responsesFile: "gs://bucket/out.jsonl" }, reason: /responsesFile "gs:\/\/bucket\/out\.jsonl" is not a files\/\.\.\. name/ },
        "batches/silent-none": { output: undefined, reason: /names neither a results file nor inline responses/ },
        "batches/silent-shape": { output: { inlinedResponses: { inlinedResponses: { a: 1 } } }, reason: /not a list/ },
      };
      for (const [key, { output }] of Object.entries(cases)) {
        gemini.status.set(key, succeeded(key, output));
        await w.register(key, "other", { results: "each" });
        await w.deliver("batch.succeeded", key);
      }
      for (const [key, { reason }] of Object.entries(cases)) {
        const { jobs } = await untilJob(dest, key);
        const job = assertEffectValid(jobs[0].body);
        assert.equal(job.results.total, 0, key);
        assert.match(job.results.file_parked, reason, key);
        await eventually(() => alertsFor(key).length === 1, { what: `the alert of ${key}` });
        assert.equal((await w.inspect(key)).body.results_progress.reading.phase, "file_parked", key);
      }
      await sleep(1_000);
      for (const key of Object.keys(cases)) assert.equal(alertsFor(key).length, 1, `one alert for ${key}`);
    } finally {
      await w.dispose();
    }
  });

  it("a large inline answer (its list in response and in metadata.output, as Gemini writes it) is read as a stream: each result once, under ids that hold on a read in another order, an item over the cap unreadable with its key and size", { timeout: 120_000 }, async () => {
    const w = await startWorker(vars());
    try {
      const key = "batches/inline-large";
      const text = (i) => `${"é😀\\\"".repeat(i % 7)}answer ${i} ${"x".repeat(1_800)}`;
      const items = Array.from({ length: 2_000 }, (_, i) =>
        i % 50 === 7 ? { response: { text: "the same" } }
          : i % 10 === 3 ? { error: { code: 3, message: `bad ${i}` }, metadata: { key: `req-${i}` } }
            : { response: { candidates: [{ content: { parts: [{ text: text(i) }] } }] }, metadata: { key: `req-${i}` } });
      items.push({ response: { inlineData: "A".repeat(1_200_000) }, metadata: { key: "big" } });
      let reads = 0;
      gemini.status.set(key, () => {
        reads++;
        const order = [...items];
        for (let i = 0; i < reads * 13; i++) order.push(order.shift());
        const output = { inlinedResponses: { inlinedResponses: order } };
        return { ...succeeded(key, output), response: { "@type": "type.googleapis.com/google.ai.generativelanguage.v1beta.GenerateContentBatchOutput", ...output } };
      });
      assert.ok(JSON.stringify(gemini.status.get(key)()).length > 9_000_000, "a few MB, twice");
      reads = 0;
      await w.register(key, "other", { results: "each" });
      await w.deliver("batch.succeeded", key);
      const { jobs } = await untilJob(dest, key, 100_000);
      const { results } = split(dest, key);
      assert.equal(results.length, items.length, "each result once");
      assert.equal(distinct(results.map((r) => r.id)), items.length);
      assert.equal(distinct(results.map((r) => r.body.result_key)), items.length);
      assert.deepEqual(results.map((r) => r.body.index).sort((a, b) => a - b), items.map((_, i) => i));
      const byKey = new Map(results.map((r) => [r.body.result_key, r.body]));
      assert.deepEqual(byKey.get("req-1").response, items[1].response, "a response as Gemini wrote it");
      assert.deepEqual(byKey.get("req-3").error, items[3].error);
      const big = byKey.get("big");
      assert.equal(big.unreadable.reason, "item over the size cap");
      assert.equal(big.unreadable.size, JSON.stringify(items.at(-1)).length);
      assert.equal(big.unreadable.index, big.index);
      assert.equal(results.filter((r) => r.body.result_key.startsWith("inline-")).length, 40, "keyless items ranked by content");
      assert.deepEqual(jobs[0].body.results, { total: items.length, delivered: items.length, errors: items.filter((i) => i.error).length + 1, parked: 0 });
      assert.equal(reads, 1, "read once");
    } finally {
      await w.dispose();
    }
  });

  it("a results file missing 48 hours after its batch ended is parked at once, with its alert, not asked for during the file's wait", { timeout: 60_000 }, async () => {
    const w = await startWorker(vars({ RESULTS_FILE_WAIT_SECONDS: "1800" }));
    try {
      const key = "batches/old1";
      const answer = succeeded(key, { responsesFile: "files/old1" });
      answer.metadata.endTime = new Date(Date.now() - 49 * 3_600_000).toISOString();
      gemini.status.set(key, answer);
      await w.register(key, "other", { results: "each" });
      await w.deliver("batch.succeeded", key);
      const { jobs } = await untilJob(dest, key, 30_000);
      assert.match(jobs[0].body.results.file_parked, /more than 48 hours ago/);
      assert.equal(gemini.downloads.filter((d) => d.name === "files/old1").length, 1, "asked once");
      await eventually(() => alertsFor(key).length === 1, { what: "the results_file_parked alert" });
    } finally {
      await w.dispose();
    }
  });

  it("the results' status call takes a slot of the one status budget and honours a 429's Retry-After, which holds the cron's pass too", { timeout: 90_000 }, async () => {
    const w = await startWorker(vars({ RECONCILE_GRACE_SECONDS: "0" }));
    try {
      const key = "batches/busy1";
      gemini.files.set("files/busy1", fileOf(5));
      gemini.status.set(key, succeeded(key, { responsesFile: "files/busy1" }));
      // A Retry-After of 15 s: the held pass must come inside it, which a busy machine's passes
      // (each waited for in turn) do with room to spare.
      gemini.statusFails.set(key, (n) => (n === 1 ? { status: 429, headers: { "retry-after": "15" } } : null));
      // An open operation the pass would poll.
      const open = "batches/busy-open";
      gemini.status.set(open, { name: open, metadata: { state: "BATCH_STATE_RUNNING", updateTime: new Date().toISOString() } });
      await w.register(open, "other");
      await w.register(key, "other", { results: "each" });
      await w.deliver("batch.succeeded", key);
      const calls = () => gemini.requests.filter((r) => r.path === `/v1beta/${key}`);
      await eventually(() => calls().length >= 1, { what: "the results' status call" });
      // The 429 backs off every status call of the project: a cron pass is held by it.
      const held = await eventually(async () => {
        const n = w.events("reconcile_pass").length;
        await w.scheduled();
        const line = await eventually(() => w.events("reconcile_pass")[n], { what: "the pass's log line" });
        return line.stopped === "held_for_backoff" && line;
      }, { timeoutMs: 14_000, what: "a pass held by the results' 429" });
      assert.equal(held.stopped, "held_for_backoff");
      const { jobs } = await untilJob(dest, key);
      assert.equal(jobs[0].body.results.total, 5);
      const [first, second] = calls();
      assert.ok(second.at - first.at >= 15_000, `asked again ${second.at - first.at} ms after a Retry-After of 15 s`);
    } finally {
      await w.dispose();
    }
  });
});
