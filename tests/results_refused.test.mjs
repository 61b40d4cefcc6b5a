// Results the destination refuses, against the built worker in workerd (a local stand-in for
// Gemini serves the results file; a local destination refuses two results with a 400): each
// result arrives once, the refused ones are parked and never sent again, the batch raises ONE
// `results_failing` naming both at once (EFFECT_ALERT_AFTER_SECONDS is an hour: the test would
// time out long before it), and the job's effect goes counting them parked.
import { describe, it, after } from "node:test";
import assert from "node:assert/strict";
import { startWorker, startServer, eventually } from "./helpers.mjs";
import { startGemini, succeeded, fileOf, split, distinct, untilJob, workerVars } from "./results_stub.mjs";

const enc = encodeURIComponent;

describe("a batch's results the destination refuses", () => {
  let gemini, dest, sink, w;
  after(async () => {
    await w?.dispose();
    await dest?.close();
    await sink?.close();
    await gemini?.close();
  });

  it("are parked and sent once, with one results_failing naming them at once; the job's effect counts them parked", { timeout: 120_000 }, async () => {
    const key = "batches/refused1";
    const n = 30;
    const refused = new Set(["k5", "k17"]);
    dest = await startServer((req) => {
      const body = JSON.parse(req.body);
      return { status: refused.has(body.result_key) ? 400 : 200 };
    });
    sink = await startServer(() => ({ status: 200 }));
    gemini = await startGemini();
    w = await startWorker({ ...workerVars({ dest, gemini, sink }), EFFECT_ALERT_AFTER_SECONDS: "3600" });
    const alerts = () => sink.requests.map((r) => JSON.parse(r.body)).filter((a) => a.key === key);

    gemini.files.set("files/refused1", fileOf(n));
    gemini.status.set(key, succeeded(key, { responsesFile: "files/refused1" }));
    assert.equal((await w.register(key, "other", { results: "each" })).status, 201);
    assert.equal((await w.deliver("batch.succeeded", key)).status, 200);

    // The job's effect goes once every result is delivered or parked.
    const { jobs } = await untilJob(dest, key);
    assert.deepEqual(jobs[0].body.results, { total: n, delivered: n - 2, errors: 0, parked: 2 });
    const alert = await eventually(() => alerts().find((a) => a.alert === "results_failing"), { what: "the results_failing alert" });
    assert.match(alert.text, /2 of its results are parked, refused by their destination or still failing after/);
    assert.equal(alert.name, key);

    // Settled, its effect done and every alert it queued accepted by the sink: nothing more
    // is sent for this batch, so what arrived is all there is.
    const op = await eventually(async () => {
      const view = (await w.inspect(key)).body;
      const settledRow = view.history?.some((h) => h.what === "results_settled");
      return settledRow && view.effect_done && view.alerts_pending?.length === 0 && view;
    }, { what: "the batch settled, its effect done and its alerts sent" });
    assert.deepEqual(alerts().map((a) => a.alert), ["results_failing"], "one alert for the batch");
    const gaveUp = op.history.filter((h) => h.what === "results_gave_up");
    assert.deepEqual(gaveUp.map((h) => h.parked), [2], "one history row naming both");

    // Each result arrived once, under its own id; the refused ones were not sent again.
    const { results, jobs: jobsNow } = split(dest, key);
    assert.equal(results.length, n, "each result once");
    assert.equal(distinct(results.map((r) => r.id)), n);
    assert.equal(distinct(results.map((r) => r.body.result_key)), n);
    assert.equal(jobsNow.length, 1, "the job's effect once");

    // Listed as parked, each with the refusal that parked it.
    const parked = await w.admin(`/v1/operations/${enc(key)}/results?state=parked`);
    assert.equal(parked.status, 200, JSON.stringify(parked.body));
    assert.deepEqual(parked.body.results.map((r) => r.result_key).sort(), ["k17", "k5"]);
    for (const r of parked.body.results) assert.match(r.last_error, /^400/);
  });
});

