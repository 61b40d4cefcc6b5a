// A batch whose results took longer than `EFFECT_ALERT_AFTER_SECONDS`, against the built worker
// in workerd: its job effect, due only once the results settle, failing once then is not
// `effect_failing` at the next cron pass (the threshold counts from when the results made the
// effect due, not from the outcome); still failing the threshold after that, it is, its age
// counted from then.
import { describe, it, after } from "node:test";
import assert from "node:assert/strict";
import { startWorker, startServer, eventually, sleep, assertEffectValid } from "./helpers.mjs";
import { startGemini, succeeded, fileOf, split, workerVars } from "./results_stub.mjs";

const THRESHOLD_S = 20;

describe("effect_failing for a batch whose results took long", () => {
  let gemini, dest, sink, w;
  after(async () => {
    await w?.dispose();
    await dest?.close();
    await sink?.close();
    await gemini?.close();
  });

  it("waits the threshold from when the results settled, not from the outcome", { timeout: 180_000 }, async () => {
    const key = "batches/slow-results";
    // The destination takes every result and the first effect; the batch's job effect answers
    // 503 until `jobFails` is cleared.
    let jobFails = true;
    dest = await startServer((req) => {
      const body = JSON.parse(req.body);
      const failing = jobFails && body.key === key && !("result_key" in body);
      req.answered = failing ? 503 : 200;
      return { status: req.answered };
    });
    sink = await startServer(() => ({ status: 200 }));
    gemini = await startGemini();
    w = await startWorker({
      ...workerVars({ dest, gemini, sink }),
      UNREGISTERED_HOLD_SECONDS: "0",
      EFFECT_ALERT_AFTER_SECONDS: String(THRESHOLD_S),
    });
    const alerts = () => sink.requests.map((r) => JSON.parse(r.body)).filter((a) => a.alert === "effect_failing");
    // One effect first: this isolate then remembers the destination clear, as a busy one would.
    await w.deliver("batch.succeeded", "batches/first");
    await eventually(async () => (await w.inspect("batches/first")).body.effect_done, { what: "the first effect" });

    // The results take longer than the threshold: the destination is paused by hand.
    const paused = await w.admin("/v1/destinations/default/pause", { method: "POST", body: JSON.stringify({ reason: "slow results" }) });
    assert.equal(paused.status, 200, JSON.stringify(paused.body));
    const holdsFrom = Date.parse(paused.body.paused.holds_every_attempt_from);
    await eventually(() => Date.now() >= holdsFrom, { what: "the pause to hold every attempt", timeoutMs: 20_000 });
    gemini.files.set("files/slow-results", fileOf(5));
    gemini.status.set(key, succeeded(key, { responsesFile: "files/slow-results" }));
    assert.equal((await w.register(key, "other", { results: "each" })).status, 201);
    assert.equal((await w.deliver("batch.succeeded", key)).status, 200);
    const outcomeAt = Date.now();
    await eventually(async () => (await w.inspect(key)).body.paused_at_destination === true, { what: "the results held", timeoutMs: 30_000, everyMs: 500 });
    while (Date.now() - outcomeAt < (THRESHOLD_S + 5) * 1_000) {
      await w.scheduled();
      await sleep(5_000);
    }
    const resumed = await w.admin("/v1/destinations/default/resume", { method: "POST", body: JSON.stringify({ reason: "done" }) });
    assert.equal(resumed.status, 200, JSON.stringify(resumed.body));

    // The results settle; the job effect's first attempt fails; the next cron pass asks for
    // `effect_failing` (the outcome is past the threshold) and the gate refuses it.
    const failed = await eventually(() => { const s = split(dest, key); return s.jobs.find((j) => j.answered === 503) && s; }, { what: "the job effect's first attempt", timeoutMs: 60_000, everyMs: 250 });
    assert.equal(failed.results.length, 5);
    const dueAt = failed.jobs[0].at;
    assert.ok(dueAt - outcomeAt >= THRESHOLD_S * 1_000, `due ${dueAt - outcomeAt} ms after the outcome`);
    await w.scheduled();
    const view = (await w.inspect(key)).body;
    assert.equal(view.effect_done, false);
    const checkedAfter = Date.now() - dueAt;
    if (checkedAfter < (THRESHOLD_S - 1) * 1_000) {
      assert.ok(!view.alerts.includes("effect_failing"), `alerted ${checkedAfter} ms after its effect was due`);
      assert.deepEqual(alerts(), []);
    } else {
      console.log(`# the pass ran ${checkedAfter} ms after the effect was due: past the threshold, nothing to check`);
    }

    // Still failing the threshold after the results settled: raised, its age from then.
    await eventually(async () => { await w.scheduled(); return (await w.inspect(key)).body.alerts.includes("effect_failing"); }, { what: "effect_failing", timeoutMs: 60_000, everyMs: 2_000 });
    const raisedAt = Date.now();
    // `dueAt` is when the destination saw the attempt, a moment after the results settled (the
    // gate's own due time): a second's slack keeps that moment out of the check, which a
    // raise dated from the outcome still fails by the threshold.
    assert.ok(raisedAt - dueAt >= (THRESHOLD_S - 1) * 1_000, `raised ${raisedAt - dueAt} ms after its effect was due`);
    const [alert] = await eventually(() => alerts().length > 0 && alerts(), { what: "the alert sent" });
    assert.ok(alert.age_seconds < (raisedAt - outcomeAt) / 1_000 - 2, `age ${alert.age_seconds} s: from the outcome, not from when the effect was due`);
    assert.ok(alert.age_seconds >= THRESHOLD_S, `age ${alert.age_seconds} s`);

    jobFails = false;
    await eventually(async () => (await w.inspect(key)).body.effect_done, { what: "the job effect delivered", timeoutMs: 30_000 });
    for (const r of dest.requests) {
      const body = JSON.parse(r.body);
      if (!("result_key" in body)) assertEffectValid(body);
    }
  });
});
