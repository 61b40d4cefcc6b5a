// A batch's results take their turn at the destination's desk, against the built worker in
// workerd: on a paced route the results are held to the route's pace (at most `per_second`
// plus its burst in any second), each once, then one job effect with the counts; a
// destination that fails only on results opens (one `destination_open` alert, `/v1/stats`
// says open), is probed rather than hammered while open, and once it answers again recovers
// (one `destination_recovered` alert) with every result answered 200 once under its one
// `webhook-id`; a result's 429 with `Retry-After: 2` holds the next results at least 2 s; a
// batch whose file is missing never waits in an open destination's queue: it asks for its
// file on its own schedule and takes a turn at the desk only once it can send.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { startWorker, startServer, eventually, sleep, assertEffectValid } from "./helpers.mjs";
import { startGemini, succeeded, fileOf, split, distinct, untilJob, workerVars } from "./results_stub.mjs";

let gemini;
before(async () => { gemini = await startGemini(); });
after(async () => { await gemini?.close(); });

/**
 * A destination answering `answer(req, body)` (default 200), recording each answer on its
 * request (`answered`), an alert sink, and a worker sending to them with `vars` on top.
 */
async function setup(vars = {}, answer = () => ({ status: 200 })) {
  const dest = await startServer((req) => {
    const a = answer(req, JSON.parse(req.body));
    req.answered = a.status;
    return a;
  });
  const sink = await startServer(() => ({ status: 200 }));
  const w = await startWorker({
    ...workerVars({ dest, gemini, sink }),
    ...(typeof vars === "function" ? vars(dest) : vars),
  });
  const alerts = (name) => sink.requests.map((r) => ({ ...JSON.parse(r.body), at: r.at })).filter((a) => a.alert === name);
  const desk = async (prefix) => (await w.admin("/v1/stats")).body.destinations?.find((d) => d.label.startsWith(prefix));
  const close = async () => { await w.dispose(); await dest.close(); await sink.close(); };
  return { dest, sink, w, alerts, desk, close };
}

/** A batch `name` of `n` result lines in a file, registered `"results": "each"` as `kind`
 * and completed by a signed webhook. */
async function complete(w, name, n, kind = "other") {
  const key = `batches/${name}`;
  gemini.files.set(`files/${name}`, fileOf(n));
  gemini.status.set(key, succeeded(key, { responsesFile: `files/${name}` }));
  const reg = await w.register(key, kind, { results: "each" });
  assert.equal(reg.status, 201);
  assert.equal(reg.body.results, "each");
  assert.equal((await w.deliver("batch.succeeded", key)).status, 200);
  return key;
}

/** Each result's requests all carry one `webhook-id`: a retry repeats its result's id. */
function assertOneIdPerResult(results) {
  const ids = new Map();
  for (const r of results) ids.set(r.body.result_key, (ids.get(r.body.result_key) ?? new Set()).add(r.id));
  for (const [rk, set] of ids) assert.equal(set.size, 1, `${rk} sent under ${[...set]}`);
  return ids.size;
}

describe("a batch's results at the destination's desk", () => {
  it("a route paced at 10 a second: 30 results at no more than 11 in any second, each once, then one job effect", { timeout: 120_000 }, async () => {
    const perSecond = 10;
    const burst = Math.max(1, Math.floor(perSecond / 10));
    const n = 30;
    const t = await setup((dest) => ({ EFFECT_ROUTES: JSON.stringify({ paced: { url: `${dest.url}/effects`, per_second: perSecond } }) }));
    try {
      const key = await complete(t.w, "paced30", n, "paced");
      const { jobs } = await untilJob(t.dest, key);
      const { results } = split(t.dest, key);
      // What holds today already: each result once, then the job's effect with the counts.
      assert.equal(distinct(results.map((r) => r.id)), n, "every result arrived");
      assert.equal(results.length, n, "none failed, none sent twice");
      assert.equal(jobs.length, 1);
      assert.deepEqual(assertEffectValid(jobs[0].body).results, { total: n, delivered: n, errors: 0, parked: 0 });
      assert.ok(jobs[0].at >= Math.max(...results.map((r) => r.at)), "the job's effect after every result");
      // The pace.
      const times = results.map((r) => r.at).sort((a, b) => a - b);
      const span = times.at(-1) - times[0];
      console.log(`# 30 results on a route paced at ${perSecond}/s arrived over ${span} ms`);
      for (const start of times) {
        const inSecond = times.filter((at) => at >= start && at < start + 1_000).length;
        assert.ok(inSecond <= perSecond + burst, `${inSecond} results within a second of +${start - times[0]} ms (span ${span} ms)`);
      }
      const least = ((n - burst) / perSecond) * 1_000 - 700;
      assert.ok(span >= least, `30 results over ${span} ms, at a pace of ${perSecond}/s at least ${least} ms`);
      const view = await t.desk("route paced:");
      assert.deepEqual(view.pace, { per_second: perSecond });
      // A chunk takes the tokens due within 4 s and sends each at its time: a few desk calls
      // for the batch (an ask and a report a chunk, the job's effect), not two a result.
      assert.ok(view.calls <= 8, `${view.calls} desk calls for ${n} results`);
    } finally {
      await t.close();
    }
  });

  it("a destination failing only on results opens, is probed while open, and recovers with every result delivered once", { timeout: 240_000 }, async () => {
    let failing = true;
    const t = await setup(
      { DESTINATION_OPEN_AFTER: "3", DESTINATION_PROBE_MAX_SECONDS: "2" },
      (req, body) => ("result_key" in body && failing ? { status: 503, body: { error: "results are down" } } : { status: 200 }),
    );
    try {
      const n = 100;
      const key = await complete(t.w, "open100", n);
      const [opened] = await eventually(() => { const a = t.alerts("destination_open"); return a.length > 0 && a; }, { timeoutMs: 60_000, what: "the destination_open alert" });
      assert.match(opened.destination, /^EFFECT_URL:/);
      const view = await t.desk("EFFECT_URL:");
      assert.equal(view.state, "open", JSON.stringify(view));
      assert.match(view.last_error ?? "", /503/);
      // While open, one probe at a time (2 s apart at DESTINATION_PROBE_MAX_SECONDS=2), not a
      // wave of retries each time.
      const windowMs = 5_000;
      await sleep(windowMs + 500);
      const inWindow = split(t.dest, key).results.filter((r) => r.at >= opened.at && r.at < opened.at + windowMs);
      console.log(`# open: ${inWindow.length} result requests within ${windowMs} ms of the alert; ${split(t.dest, key).results.length} results sent by then`);
      assert.ok(inWindow.length <= 4, `${inWindow.length} result requests within ${windowMs} ms of opening`);
      assert.equal(split(t.dest, key).jobs.length, 0, "no job effect while results wait");
      // The destination answers again.
      failing = false;
      await eventually(() => t.alerts("destination_recovered").length > 0, { timeoutMs: 60_000, what: "the destination_recovered alert" });
      const { jobs } = await untilJob(t.dest, key, 90_000);
      const { results } = split(t.dest, key);
      const ok = results.filter((r) => r.answered === 200).map((r) => r.id);
      assert.equal(distinct(ok), n, "every result answered 200");
      assert.equal(ok.length, n, "no result answered 200 twice");
      assert.equal(assertOneIdPerResult(results), n);
      assert.equal(jobs.length, 1);
      assert.deepEqual(assertEffectValid(jobs[0].body).results, { total: n, delivered: n, errors: 0, parked: 0 });
      assert.equal(t.alerts("destination_open").length, 1, "one alert when it opened");
      assert.equal(t.alerts("destination_recovered").length, 1, "one when it recovered");
      assert.equal((await t.desk("EFFECT_URL:")).state, "healthy");
    } finally {
      await t.close();
    }
  });

  it("a result's 429 with Retry-After: 2 holds the next results at least 2 s, and it is sent again under its id", { timeout: 120_000 }, async () => {
    let refused;
    const t = await setup({ EFFECT_RETRY_MAX_SECONDS: "10" }, (req, body) => {
      if (!("result_key" in body) || refused) return { status: 200 };
      refused = { id: req.headers["webhook-id"], at: req.at };
      return { status: 429, headers: { "retry-after": "2" }, body: { error: "slow down" } };
    });
    try {
      const n = 300;
      const key = await complete(t.w, "slow300", n);
      const { jobs } = await untilJob(t.dest, key);
      const { results } = split(t.dest, key);
      // The first wave (240 results, fanned out to 6 senders) went at once with the refused
      // one; every later request (the next wave, or the refused result again) waited for the
      // Retry-After.
      const later = results.filter((r) => r.body.index >= 240 || (r.id === refused.id && r.answered === 200));
      const next = later.reduce((a, b) => (b.at < a.at ? b : a));
      const gap = next.at - refused.at;
      const which = next.id === refused.id ? "the refused result again" : `result ${next.body.index}`;
      console.log(`# the next result (${which}) ${gap} ms after a 429 with Retry-After: 2`);
      assert.ok(gap >= 1_900, `the next result (${which}) ${gap} ms after the 429`);
      assert.equal(results.filter((r) => r.id === refused.id).length, 2, "the refused result once more, under its id");
      assert.equal(assertOneIdPerResult(results), n);
      assert.equal(distinct(results.filter((r) => r.answered === 200).map((r) => r.id)), n);
      assert.deepEqual(jobs[0].body.results, { total: n, delivered: n, errors: 0, parked: 0 });
    } finally {
      await t.close();
    }
  });

  it("a batch whose file is missing takes no turn at an open destination's desk: it asks for its file on its own schedule, never queued", { timeout: 150_000 }, async () => {
    let failing = false;
    const t = await setup(
      { DESTINATION_OPEN_AFTER: "1", EFFECT_RETRY_BASE_SECONDS: "1", EFFECT_RETRY_MAX_SECONDS: "120" },
      (req, body) => (failing && !("result_key" in body) ? { status: 503, headers: { "retry-after": "120" }, body: { error: "down" } } : { status: 200 }),
    );
    try {
      // The batch's file is not there: its first read (the destination healthy) answers 404.
      const key = "batches/missing-file";
      gemini.status.set(key, succeeded(key, { responsesFile: "files/missing-file" }));
      assert.equal((await t.w.register(key, "other", { results: "each" })).status, 201);
      assert.equal((await t.w.deliver("batch.succeeded", key)).status, 200);
      const downloads = () => gemini.downloads.filter((d) => d.name === "files/missing-file").length;
      await eventually(() => downloads() >= 1, { what: "the file's first download, answered 404" });
      // A job effect opens the destination, with Retry-After: 120: its next probe is two
      // minutes away, and this isolate remembers it open.
      failing = true;
      assert.equal((await t.w.deliver("batch.succeeded", "batches/opens-it")).status, 200);
      await eventually(async () => (await t.desk("EFFECT_URL:"))?.state === "open", { what: "the destination open", timeoutMs: 60_000, everyMs: 250 });
      const from = downloads();
      // Queued behind the probe, the batch would not ask for its file again for two minutes.
      await eventually(() => downloads() >= from + 2, { what: "two more downloads while the destination is open", timeoutMs: 60_000, everyMs: 250 });
      const view = await t.desk("EFFECT_URL:");
      console.log(`# ${downloads() - from} downloads of the missing file while open; the desk: ${view.waiting} waiting, ${view.calls} calls`);
      assert.equal(view.state, "open");
      assert.equal(view.waiting, 1, "only the job effect waits at the desk");
      // The batch's results keep their own due time; the job effect's is the job's alone.
      const batch = (await t.w.inspect(key)).body;
      assert.equal(batch.waiting_on_destination, false);
      assert.equal(batch.next_attempt_at, null, "the job's effect waits for its results");
      assert.ok(Date.parse(batch.results_due_at) > 0, `the results' next step: ${batch.results_due_at}`);
      const job = (await t.w.inspect("batches/opens-it")).body;
      assert.ok(Date.parse(job.next_attempt_at) > 0 && job.results_due_at === null, JSON.stringify(job));
    } finally {
      await t.close();
    }
  });
});
