// One side effect per result of a batch, exactly once, against the built worker in workerd:
// a local stand-in for Gemini serves the status answer and the results file (with `Range`),
// a local destination counts every result by its `webhook-id`. A 500-line file (a malformed
// line among them) gives 500 results and then the job's effect with counts; an inline batch
// read in another order gives each once; results that fail are retried and those refused are
// parked while the rest go on, and an operator's retry sends each parked one once under its
// first id; a worker killed (SIGKILL) mid-file and restarted on its storage misses none and
// sends none under a new id; a file that answers 404 for a while is read once it appears; a
// file gone for good alerts once and the job's effect says so; a batch an earlier build stored
// (its waiting rows in the progress, `results_kept`, `results_parked`) lists the same results
// after the deploy, is moved to one failure row per result, and finishes.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { execFileSync } from "node:child_process";
import { startWorker, startServer, eventually, sleep, assertEffectValid, workerdChildren } from "./helpers.mjs";
import { startGemini, succeeded, fileOf, split, distinct, workerVars } from "./results_stub.mjs";

describe("each result of a batch, its own side effect", () => {
  let gemini, dest, sink, refuse = new Set(), failOnce = new Set(), seen = new Map();
  const vars = () => ({
    ...workerVars({ dest, gemini, sink }),
    RESULTS_FILE_WAIT_SECONDS: "3",
    RESULTS_EACH_KINDS: "pages",
    DESTINATION_OPEN_AFTER: "1000",
  });
  before(async () => {
    gemini = await startGemini();
    sink = await startServer(() => ({ status: 200 }));
    dest = await startServer((req) => {
      const body = JSON.parse(req.body);
      const rk = body.result_key;
      if (rk && refuse.has(rk)) return { status: 422 };
      if (rk && failOnce.has(rk) && !seen.has(req.headers["webhook-id"])) {
        seen.set(req.headers["webhook-id"], 1);
        return { status: 503 };
      }
      return { status: 200 };
    });
  });
  after(async () => { await gemini.close(); await dest.close(); await sink.close(); });

  it("a file of whole chunks (80 lines): its last chunk ends on the last line, and the next ask (416) is the end, not a parked file", { timeout: 120_000 }, async () => {
    const w = await startWorker(vars());
    try {
      const key = "batches/r80";
      gemini.files.set("files/r80", fileOf(80, {}));
      gemini.status.set(key, succeeded(key, { responsesFile: "files/r80" }));
      assert.equal((await w.register(key, "other", { results: "each" })).status, 201);
      const alertsBefore = sink.requests.length;
      assert.equal((await w.deliver("batch.succeeded", key)).status, 200);
      const { jobs } = await eventually(() => { const s = split(dest, key); return s.jobs.length > 0 && s; }, { timeoutMs: 60_000, what: "the job effect" });
      assert.equal(distinct(split(dest, key).results.map((r) => r.id)), 80);
      const job = assertEffectValid(jobs[0].body);
      assert.deepEqual(job.results, { total: 80, delivered: 80, errors: 0, parked: 0 }, "no file_parked");
      assert.equal(sink.requests.slice(alertsBefore).filter((r) => r.body.includes("batches/r80")).length, 0, "no alert");
    } finally {
      await w.dispose();
    }
  });

  it("a completion that comes before its registration (kind and \"results\": \"each\"): the registration fills both, and each result goes before the job", { timeout: 120_000 }, async () => {
    // EFFECT_ROUTES makes an unregistered completion's effect wait UNREGISTERED_HOLD_SECONDS for
    // a late registration's kind; the hour's hold means only the registration can end it.
    const w = await startWorker({ ...vars(), EFFECT_ROUTES: JSON.stringify({ billing: `${dest.url}/billing` }), UNREGISTERED_HOLD_SECONDS: "3600" });
    try {
      const key = "batches/late-reg";
      gemini.files.set("files/late-reg", fileOf(30, {}));
      gemini.status.set(key, succeeded(key, { responsesFile: "files/late-reg" }));
      assert.equal((await w.deliver("batch.succeeded", key)).status, 200);
      await eventually(async () => (await w.inspect(key)).body.status === "succeeded", { what: "the completion stored" });
      const reg = await w.register(key, "billing", { results: "each" });
      assert.equal(reg.status, 200, JSON.stringify(reg.body));
      assert.equal(reg.body.results, "each", "the registration's results fill the record its completion created");
      const { jobs } = await eventually(() => { const s = split(dest, key); return s.jobs.length > 0 && s; }, { timeoutMs: 60_000, what: "the job effect" });
      assert.equal(distinct(split(dest, key).results.map((r) => r.id)), 30, "each result once");
      const job = assertEffectValid(jobs[0].body);
      assert.deepEqual(job.results, { total: 30, delivered: 30, errors: 0, parked: 0 });
    } finally {
      await w.dispose();
    }
  });

  it("a 500-line file: 500 result effects, a malformed line one error result, then one job effect with counts", { timeout: 120_000 }, async () => {
    const w = await startWorker(vars());
    try {
      const key = "batches/r500";
      gemini.files.set("files/r500", fileOf(500, { bad: 7 }));
      gemini.status.set(key, succeeded(key, { responsesFile: "files/r500" }));
      const reg = await w.register(key, "other", { results: "each" });
      assert.equal(reg.status, 201);
      assert.equal(reg.body.results, "each");
      const started = Date.now();
      assert.equal((await w.deliver("batch.succeeded", key)).status, 200);
      const { jobs } = await eventually(() => { const s = split(dest, key); return s.jobs.length > 0 && s; }, { timeoutMs: 90_000, what: "the job effect" });
      console.log(`# 500 results: job effect ${Date.now() - started} ms after the completion, ${gemini.downloads.filter((d) => d.name === "files/r500").length} downloads`);
      const { results } = split(dest, key);
      assert.equal(results.length, 500, "each result once");
      assert.equal(distinct(results.map((r) => r.id)), 500);
      assert.equal(distinct(results.map((r) => r.body.index)), 500);
      assert.ok(results.every((r) => r.id.startsWith("res_")));
      assert.equal(results.find((r) => r.body.index === 3).body.result_key, "k3");
      const bad = results.find((r) => r.body.index === 7);
      assert.equal(bad.body.result_key, "line-7");
      assert.equal(bad.body.unreadable.reason, "not a JSON object");
      assert.equal(jobs.length, 1);
      const job = assertEffectValid(jobs[0].body);
      assert.deepEqual(job.results, { total: 500, delivered: 500, errors: 1, parked: 0 });
      // The job's effect came after every result.
      const last = dest.requests.findLastIndex((r) => JSON.parse(r.body).result_key);
      assert.ok(dest.requests.findIndex((r) => r.headers["webhook-id"] === jobs[0].id) > last);
      // Downloaded with our key, in chunks from checkpoints.
      const downloads = gemini.downloads.filter((d) => d.name === "files/r500");
      assert.ok(downloads.every((d) => d.key === "test-gemini-key"));
      assert.ok(downloads.some((d) => d.range), "later chunks ask from their checkpoint");
      const op = await w.inspect(key);
      assert.equal(op.body.results_counts.total, 500);
      assert.equal(op.body.results_progress.reading.phase, "read");
    } finally {
      await w.dispose();
    }
  });

  it("an inline batch in another order on every read, without keys: each result once", { timeout: 60_000 }, async () => {
    const w = await startWorker(vars());
    try {
      const key = "batches/inline1";
      const items = Array.from({ length: 60 }, (_, i) => (i % 3 === 0 ? { response: { text: `same ${i % 2}` } } : i % 5 === 0 ? { error: { code: 8 } } : { response: { text: `t${i}` } }));
      let reads = 0;
      gemini.status.set(key, () => {
        reads++;
        const order = [...items];
        for (let i = 0; i < reads * 7; i++) order.push(order.shift());
        return succeeded(key, { inlinedResponses: { inlinedResponses: order } });
      });
      assert.equal((await w.register(key, "pages")).body.results, "each", "RESULTS_EACH_KINDS");
      await w.deliver("batch.succeeded", key);
      const { jobs } = await eventually(() => { const s = split(dest, key); return s.jobs.length > 0 && s; }, { timeoutMs: 45_000, what: "the job effect" });
      const { results } = split(dest, key);
      assert.equal(results.length, 60);
      assert.equal(distinct(results.map((r) => r.id)), 60);
      assert.equal(distinct(results.map((r) => r.body.result_key)), 60);
      assert.deepEqual(jobs[0].body.results, { total: 60, delivered: 60, errors: items.filter((i) => i.error).length, parked: 0 });
    } finally {
      await w.dispose();
    }
  });

  it("results that fail are retried, refused ones parked while the rest go on; a retry of the parked sends each once under its first id", { timeout: 90_000 }, async () => {
    const w = await startWorker(vars());
    try {
      const key = "batches/fail1";
      gemini.files.set("files/fail1", fileOf(100));
      gemini.status.set(key, succeeded(key, { responsesFile: "files/fail1" }));
      for (const i of [5, 45, 85]) refuse.add(`k${i}`);
      for (const i of [10, 50, 90]) failOnce.add(`k${i}`);
      await w.register(key, "other", { results: "each" });
      await w.deliver("batch.succeeded", key);
      const { jobs } = await eventually(() => { const s = split(dest, key); return s.jobs.length > 0 && s; }, { timeoutMs: 60_000, what: "the job effect" });
      assert.deepEqual(jobs[0].body.results, { total: 100, delivered: 97, errors: 0, parked: 3 });
      const first = split(dest, key).results;
      const idOf = (rk) => first.find((r) => r.body.result_key === rk).id;
      for (const i of [10, 50, 90]) assert.equal(first.filter((r) => r.body.result_key === `k${i}`).length, 2, "one failure, one retry, same id");
      const parked = await w.admin(`/v1/operations/${encodeURIComponent(key)}/results?state=parked`);
      assert.equal(parked.status, 200);
      assert.deepEqual(parked.body.results.map((r) => r.result_key), ["k5", "k45", "k85"]);
      assert.ok(parked.body.results.every((r) => r.attempts === 1 && /422/.test(r.last_error)));
      const delivered = await w.admin(`/v1/operations/${encodeURIComponent(key)}/results?state=delivered`);
      assert.equal(delivered.body.count, 97);
      // A dry run counts and changes nothing; then the retry.
      for (const i of [5, 45, 85]) refuse.delete(`k${i}`);
      const dry = await w.admin(`/v1/operations/${encodeURIComponent(key)}/results/retry`, { method: "POST", body: JSON.stringify({ reason: "fixed", dry_run: true }) });
      assert.equal(dry.status, 200);
      assert.equal(dry.body.would_retry, 3);
      const before = dest.requests.length;
      const retry = await w.admin(`/v1/operations/${encodeURIComponent(key)}/results/retry`, { method: "POST", body: JSON.stringify({ reason: "fixed" }) });
      assert.equal(retry.body.retried, 3);
      await eventually(() => dest.requests.slice(before).filter((r) => JSON.parse(r.body).key === key).length >= 4, { timeoutMs: 30_000, what: "the parked results again, then the job's effect" });
      await sleep(1_500);
      const again = dest.requests.slice(before).map((r) => ({ id: r.headers["webhook-id"], body: JSON.parse(r.body) })).filter((r) => r.body.key === key);
      const resent = again.filter((r) => "result_key" in r.body);
      assert.deepEqual(resent.map((r) => r.body.result_key).sort(), ["k45", "k5", "k85"], "each parked result once");
      for (const r of resent) assert.equal(r.id, idOf(r.body.result_key), "under its first webhook-id");
      // The counts changed: the job's effect goes again, once, as a new generation (one body per id).
      const job = again.filter((r) => !("result_key" in r.body));
      assert.equal(job.length, 1);
      assert.notEqual(job[0].id, jobs[0].id, "a new body, a new webhook-id");
      assert.deepEqual(job[0].body.results, { total: 100, delivered: 100, errors: 0, parked: 0 });
      const op = await w.inspect(key);
      assert.deepEqual(op.body.results_counts, { total: 100, delivered: 100, errors: 0, parked: 0 });
    } finally {
      refuse.clear();
      failOnce.clear();
      await w.dispose();
    }
  });

  it("a file answering 404 for a while after SUCCEEDED is read once it appears", { timeout: 60_000 }, async () => {
    const w = await startWorker({ ...vars(), RESULTS_FILE_WAIT_SECONDS: "60" });
    try {
      const key = "batches/late1";
      gemini.files.set("files/late1", fileOf(30));
      gemini.fileStatus.set("files/late1", (n) => (n <= 2 ? 404 : null));
      gemini.status.set(key, succeeded(key, { responsesFile: "files/late1" }));
      await w.register(key, "other", { results: "each" });
      await w.deliver("batch.succeeded", key);
      const { jobs } = await eventually(() => { const s = split(dest, key); return s.jobs.length > 0 && s; }, { timeoutMs: 45_000, what: "the job effect" });
      assert.deepEqual(jobs[0].body.results, { total: 30, delivered: 30, errors: 0, parked: 0 });
      assert.equal(split(dest, key).results.length, 30);
      assert.ok(gemini.downloads.filter((d) => d.name === "files/late1").length >= 3);
    } finally {
      await w.dispose();
    }
  });

  it("a line of 100 MB is one result that says where it is, never loaded", { timeout: 120_000 }, async () => {
    const w = await startWorker(vars());
    try {
      const key = "batches/huge1";
      const huge = Buffer.alloc(100 * 1024 * 1024, "x");
      const head = Buffer.from(JSON.stringify({ key: "a", response: { n: 1 } }) + "\n");
      const tail = Buffer.from("\n" + JSON.stringify({ key: "c", response: { n: 3 } }) + "\n");
      gemini.files.set("files/huge1", Buffer.concat([head, huge, tail]));
      gemini.status.set(key, succeeded(key, { responsesFile: "files/huge1" }));
      await w.register(key, "other", { results: "each" });
      const started = Date.now();
      await w.deliver("batch.succeeded", key);
      const { jobs } = await eventually(() => { const s = split(dest, key); return s.jobs.length > 0 && s; }, { timeoutMs: 100_000, what: "the job effect" });
      console.log(`# a 100 MB line: job effect ${Date.now() - started} ms after the completion`);
      const { results } = split(dest, key);
      assert.deepEqual(results.map((r) => r.body.index).sort(), [0, 1, 2]);
      const big = results.find((r) => r.body.index === 1).body;
      assert.deepEqual(big.unreadable, { reason: "line over the size cap", file: "files/huge1", index: 1, byte_offset: head.length, size: huge.length });
      assert.deepEqual(jobs[0].body.results, { total: 3, delivered: 3, errors: 1, parked: 0 });
    } finally {
      gemini.files.delete("files/huge1");
      await w.dispose();
    }
  });

  it("a file gone for good alerts once and the job's effect says so", { timeout: 60_000 }, async () => {
    const w = await startWorker(vars());
    try {
      const key = "batches/gone1";
      gemini.status.set(key, succeeded(key, { responsesFile: "files/gone1" }));
      await w.register(key, "other", { results: "each" });
      await w.deliver("batch.succeeded", key);
      const { jobs } = await eventually(() => { const s = split(dest, key); return s.jobs.length > 0 && s; }, { timeoutMs: 45_000, what: "the job effect" });
      assert.equal(jobs[0].body.results.total, 0);
      assert.match(jobs[0].body.results.file_parked, /404/);
      assertEffectValid(jobs[0].body);
      // The alert goes from the gate's alarm, not necessarily before the job's effect: wait
      // for it, then for any second one.
      const parkedAlerts = () => sink.requests.map((r) => JSON.parse(r.body)).filter((a) => a.key === key && a.alert === "results_file_parked");
      await eventually(() => parkedAlerts().length > 0, { what: "the results_file_parked alert", timeoutMs: 60_000 });
      await sleep(1_000);
      assert.equal(parkedAlerts().length, 1);
    } finally {
      await w.dispose();
    }
  });
});

describe("a worker killed mid-file", () => {
  it("restarted on its storage, delivers every result exactly once by webhook-id", { timeout: 180_000 }, async () => {
    const gemini = await startGemini();
    const dest = await startServer(() => ({ status: 200, delayMs: 20 }));
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gemini-once-results-kill-"));
    const config = { EFFECT_URL: `${dest.url}/effects`, GEMINI_API_BASE: gemini.url, GEMINI_API_KEY: "k", EFFECT_RETRY_BASE_SECONDS: "1", EFFECT_RETRY_MAX_SECONDS: "2" };
    const key = "batches/kill1";
    gemini.files.set("files/kill1", fileOf(1_000));
    gemini.status.set(key, succeeded(key, { responsesFile: "files/kill1" }));
    let w;
    try {
      const before = new Set(workerdChildren());
      w = await startWorker(config, { persist: dir });
      const ours = workerdChildren().filter((pid) => !before.has(pid));
      assert.equal(ours.length, 1);
      await w.register(key, "other", { results: "each" });
      await w.deliver("batch.succeeded", key);
      await eventually(() => split(dest, key).results.length >= 200, { timeoutMs: 60_000, what: "a part of the file" });
      process.kill(ours[0], "SIGKILL");
      await Promise.race([w.dispose().catch(() => {}), sleep(10_000)]);
      const atKill = split(dest, key).results.length;
      assert.ok(atKill < 1_000, "killed mid-file");
      w = await startWorker(config, { persist: dir });
      const { jobs } = await eventually(() => { const s = split(dest, key); return s.jobs.length > 0 && s; }, { timeoutMs: 120_000, what: "the job effect after the restart" });
      const { results } = split(dest, key);
      const ids = new Set(results.map((r) => r.id));
      assert.equal(ids.size, 1_000, "none missing, none under a new id");
      const indexes = new Set(results.map((r) => r.body.index));
      assert.equal(indexes.size, 1_000);
      console.log(`# killed after ${atKill} of 1000 results; ${results.length - ids.size} sent again under their first id`);
      // The claim in doubt at the kill is one wave: 240 results, a chunk for each of 6 senders.
      assert.ok(results.length - ids.size <= 240, `repeats at most one wave: ${results.length - ids.size}`);
      assert.deepEqual(jobs[0].body.results, { total: 1_000, delivered: 1_000, errors: 0, parked: 0 });
      assert.equal(jobs.length, 1);
    } finally {
      await w?.dispose();
      await gemini.close();
      await dest.close();
    }
  });
});

describe("a batch an earlier build stored", () => {
  const noSqlite = (t) => {
    try {
      execFileSync("sqlite3", ["-version"]);
      return false;
    } catch {
      t.skip("needs the sqlite3 command to write the tables an earlier build stored");
      return true;
    }
  };
  // The sqlite3 command on the storage of `key`'s gate under `dir` (run while the worker is stopped).
  const gateSql = async (w, dir, key) => {
    const id = (await w.mf.getDurableObjectNamespace("OPERATION_GATE")).idFromName(key).toString();
    const file = fs.readdirSync(dir, { recursive: true }).find((f) => String(f).endsWith(`${id}.sqlite`));
    return (q) => execFileSync("sqlite3", [path.join(dir, String(file)), q], { encoding: "utf8" }).trim();
  };
  // The failure rows written back as the earlier build's two tables (before `results_failures` is dropped).
  const EARLIER_TABLES = `CREATE TABLE results_kept (idx INTEGER PRIMARY KEY, item TEXT NOT NULL);
           CREATE TABLE results_parked (idx INTEGER PRIMARY KEY, row TEXT NOT NULL);
           INSERT INTO results_kept SELECT idx, item FROM results_failures;
           INSERT INTO results_parked SELECT idx, row FROM results_failures WHERE parked = 1;`;
  // An earlier build kept a result's state in two places: its waiting rows in the progress's
  // JSON (`rows`), each result in `results_kept(idx, item)` and the parked rows in
  // `results_parked(idx, row)`. Its storage is written back into that layout with the sqlite3
  // command while the worker is stopped; the worker started again on it lists the same
  // results, moves them to one failure row each, and finishes the batch.
  it("lists the same waiting and parked results after the deploy, moves them to one failure row each, and an operator's retry finishes the batch", { timeout: 180_000 }, async (t) => {
    if (noSqlite(t)) return;
    const gemini = await startGemini();
    const sink = await startServer(() => ({ status: 200 }));
    const refuse = new Set(["k3", "k8"]), failing = new Set(["k5"]);
    const dest = await startServer((req) => {
      const rk = JSON.parse(req.body).result_key;
      return { status: refuse.has(rk) ? 422 : failing.has(rk) ? 503 : 200 };
    });
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gemini-once-results-layout-"));
    const key = "batches/layout1";
    const list = async (w, state) => (await w.admin(`/v1/operations/${encodeURIComponent(key)}/results?state=${state}`)).body.results;
    let w;
    try {
      gemini.files.set("files/layout1", fileOf(12));
      gemini.status.set(key, succeeded(key, { responsesFile: "files/layout1" }));
      w = await startWorker(workerVars({ dest, gemini, sink }), { persist: dir });
      await w.register(key, "other", { results: "each" });
      await w.deliver("batch.succeeded", key);
      const parked = await eventually(async () => { const p = await list(w, "parked"); return p.length === 2 && p; }, { what: "k3 and k8 parked" });
      await eventually(async () => (await list(w, "waiting")).some((r) => r.result_key === "k5" && r.attempts >= 2), { what: "k5 waiting, retried" });
      const sql = await gateSql(w, dir, key);
      await w.dispose();
      w = null;
      const waiting = JSON.parse(sql("SELECT json_group_array(json(row)) FROM results_failures WHERE parked = 0"));
      assert.deepEqual(waiting.map((r) => r.result_key), ["k5"]);
      sql(`${EARLIER_TABLES}
           UPDATE results_progress SET body = json_set(body, '$.rows', (SELECT json_group_object(idx, json(row)) FROM results_failures WHERE parked = 0));
           DROP TABLE results_failures;`);
      assert.match(sql("SELECT body FROM results_progress"), /"rows":\{"5":\{"result_key":"k5"/);

      w = await startWorker(workerVars({ dest, gemini, sink }), { persist: dir });
      assert.deepEqual(await list(w, "parked"), parked, "the parked rows, as listed before");
      const still = await list(w, "waiting");
      assert.deepEqual(still.map((r) => [r.result_key, r.index]), [["k5", 5]]);
      assert.ok(still[0].attempts >= waiting[0].attempts, "its attempts kept");
      const progress = (await w.inspect(key)).body.results_progress;
      assert.deepEqual([progress.waiting, progress.counts.parked], [1, 2]);
      const firstIds = new Map(split(dest, key).results.map((r) => [r.body.result_key, r.id]));
      refuse.clear();
      failing.clear();
      const retry = await w.admin(`/v1/operations/${encodeURIComponent(key)}/results/retry`, { method: "POST", body: JSON.stringify({ reason: "fixed" }) });
      assert.equal(retry.body.retried, 2, JSON.stringify(retry.body));
      const { jobs, results } = await eventually(() => { const s = split(dest, key); return s.jobs.length > 0 && s; }, { timeoutMs: 60_000, what: "the job effect" });
      assert.deepEqual(jobs[0].body.results, { total: 12, delivered: 12, errors: 0, parked: 0 });
      assert.equal(distinct(results.map((r) => r.id)), 12, "each result under one id");
      for (const r of results) assert.equal(r.id, firstIds.get(r.body.result_key), `${r.body.result_key} under its first id`);
      await w.dispose();
      w = null;
      assert.equal(sql("SELECT group_concat(name) FROM sqlite_master WHERE type = 'table' AND name IN ('results_kept', 'results_parked', 'results_failures')"), "results_failures", "moved to one table");
      assert.doesNotMatch(sql("SELECT body FROM results_progress"), /"rows"/, "the progress stored without rows");
    } finally {
      await w?.dispose();
      await Promise.all([gemini.close(), dest.close(), sink.close()]);
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it("moves 450 parked results a page a load, lists every one in order meanwhile, and an operator's retries deliver them all under their first ids", { timeout: 240_000 }, async (t) => {
    if (noSqlite(t)) return;
    const gemini = await startGemini();
    const sink = await startServer(() => ({ status: 200 }));
    let refuse = true;
    const dest = await startServer((req) => ({ status: refuse && "result_key" in JSON.parse(req.body) ? 422 : 200 }));
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gemini-once-results-layout-"));
    const key = "batches/layout450";
    const page = async (w, cursor) => (await w.admin(`/v1/operations/${encodeURIComponent(key)}/results?state=parked${cursor ? `&cursor=${cursor}` : ""}`)).body;
    let w;
    try {
      gemini.files.set("files/layout450", fileOf(450));
      gemini.status.set(key, succeeded(key, { responsesFile: "files/layout450" }));
      w = await startWorker(workerVars({ dest, gemini, sink }), { persist: dir });
      await w.register(key, "other", { results: "each" });
      await w.deliver("batch.succeeded", key);
      await eventually(() => split(dest, key).jobs.length > 0, { timeoutMs: 90_000, what: "the job effect, every result parked" });
      const sql = await gateSql(w, dir, key);
      await w.dispose();
      w = null;
      assert.equal(sql("SELECT count(*) FROM results_failures WHERE parked = 1"), "450");
      sql(`${EARLIER_TABLES}
           DROP TABLE results_failures;`);

      w = await startWorker(workerVars({ dest, gemini, sink }), { persist: dir });
      // Each listing's load moves a page of parked rows first, so pages read in order of index
      // are whole while the move is under way.
      const first = await page(w, null);
      await w.dispose();
      w = null;
      assert.equal(sql("SELECT count(*) FROM results_parked"), "50", "a load moves 400 parked rows, not all");
      w = await startWorker(workerVars({ dest, gemini, sink }), { persist: dir });
      const listed = first.results.map((r) => r.index);
      let cursor = first.cursor;
      do {
        const body = await page(w, cursor);
        listed.push(...body.results.map((r) => r.index));
        cursor = body.cursor;
      } while (cursor);
      assert.deepEqual(listed, Array.from({ length: 450 }, (_, i) => i), "every parked result, once, in order");
      refuse = false;
      const firstIds = new Map(split(dest, key).results.map((r) => [r.body.result_key, r.id]));
      const retry = async () => (await w.admin(`/v1/operations/${encodeURIComponent(key)}/results/retry`, { method: "POST", body: JSON.stringify({ reason: "fixed" }) })).body;
      let retried = 0;
      await eventually(async () => {
        retried += (await retry()).retried;
        return retried === 450;
      }, { timeoutMs: 120_000, what: "every parked result retried" });
      const { results } = await eventually(() => {
        const s = split(dest, key);
        return s.jobs.some((j) => j.body.results.delivered === 450) && s;
      }, { timeoutMs: 120_000, what: "the job effect with 450 delivered" });
      const accepted = new Map();
      for (const r of results) {
        assert.equal(r.id, firstIds.get(r.body.result_key), `${r.body.result_key} under its first id`);
        accepted.set(r.body.result_key, r.id);
      }
      assert.equal(accepted.size, 450);
      await w.dispose();
      w = null;
      assert.equal(sql("SELECT group_concat(name) FROM sqlite_master WHERE type = 'table' AND name IN ('results_kept', 'results_parked', 'results_failures')"), "results_failures", "the old tables dropped once moved");
    } finally {
      await w?.dispose();
      await Promise.all([gemini.close(), dest.close(), sink.close()]);
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
