// The fan-out of a large backlog onto the worker's own Cloudflare Queue (Miniflare's, in
// workerd): a pass schedules the polls instead of making them, the consumer polls each at its
// slot and settles through the gates, a 429 pauses the polls until its Retry-After, a lasting
// 429 piles up no copies (passes schedule nothing beside the copies sent back), and every side
// effect still runs once.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { startWorker, startStatusApi, startDestination, eventually, sleep } from "./helpers.mjs";

const gemini = new Map();
let api, dest;
const effectsFor = (key) => dest.requests.filter((r) => r.headers["idempotency-key"] === key);

function batch(state) {
  return { status: 200, body: { name: "batches/x", metadata: { state, updateTime: "2026-11-25T10:00:00Z" }, done: state !== "BATCH_STATE_RUNNING" } };
}

before(async () => {
  api = await startStatusApi(gemini);
  dest = await startDestination(() => ({ status: 200 }));
});
after(async () => {
  await api?.close();
  await dest?.close();
  dest?.assertAllValid();
});

describe("reconciliation fanned out on a queue", () => {
  let w;
  const RATE = 20;
  before(async () => {
    w = await startWorker({
      EFFECT_URL: `${dest.url}/effects`,
      GEMINI_API_BASE: api.url,
      GEMINI_API_KEY: "test-gemini-key",
      RECONCILE_GRACE_SECONDS: "0",
      RECONCILE_FANOUT_ABOVE: "10",
      RECONCILE_POLL_RATE: String(RATE),
    });
  });
  after(() => w?.dispose());

  it("schedules a backlog on the queue at the rate, and the consumer settles each once", async () => {
    const keys = Array.from({ length: 30 }, (_, i) => `batches/fan${String(i).padStart(2, "0")}`);
    for (const k of keys) await w.register(k, "nightly");
    for (const k of keys) gemini.set(k, batch("BATCH_STATE_SUCCEEDED"));
    await w.ledger(keys);
    await w.scheduled();
    const pass = await eventually(() => w.events("reconcile_pass").at(-1), { what: "the pass's line" });
    assert.equal(pass.fed, 30, JSON.stringify(pass));
    assert.equal(pass.status_calls, 0, "the pass polls nothing itself");
    assert.equal(pass.queue_sends, 1);
    assert.equal(pass.stopped, "complete");
    // What the dashboard's health panel reads about the last pass.
    const stats = await w.admin("/v1/stats");
    assert.equal(stats.body.reconcile.last.report.fed, 30, JSON.stringify(stats.body.reconcile));
    // What /metrics serves as gauges: the index as the pass listed it, whole.
    assert.deepEqual(stats.body.reconcile.last.report.open, { operations: 30, stuck: 0, effects_not_done: 0 });
    for (const k of keys) {
      await eventually(async () => (await w.inspect(k)).body.effect_done, { what: `the effect of ${k}`, timeoutMs: 30_000 });
    }
    for (const k of keys) {
      assert.equal(effectsFor(k).length, 1, `one effect for ${k}`);
      assert.equal((await w.inspect(k)).body.settled_by, "reconcile", k);
    }
    // A consumer's line is logged when its batch ends, which may come after the effects.
    await eventually(() => w.events("reconcile_job").reduce((n, j) => n + j.status_calls, 0) >= 30, { what: "the consumers' lines" });
    const jobs = w.events("reconcile_job");
    assert.equal(jobs.reduce((n, j) => n + j.status_calls, 0), 30, "each polled once, by a consumer");
    assert.equal(jobs.reduce((n, j) => n + j.settled, 0), 30);
    // Counted by who asked (the consumers, in their isolate, sent as each batch ends).
    const counted = await eventually(async () => {
      const total = (await w.admin("/v1/stats")).body.total;
      return total["status_calls:queue:answered"] === 30 && total;
    }, { what: "the consumers' status calls counted" });
    assert.equal(counted["status_calls:pass:answered"], undefined, "the pass asked nothing");
    // The slots: 30 polls at 20 a second span at least 29 / 20 s (the clock's granularity and
    // the queue's batching can only make them later, never earlier).
    const at = keys.map((k) => api.callsFor(k)[0].at).sort((a, b) => a - b);
    assert.ok(at.at(-1) - at[0] >= (29 * 1000) / RATE - 50, `polls spread over ${at.at(-1) - at[0]} ms`);
    // The next pass finds the index empty: nothing is scheduled twice.
    await w.scheduled();
    const next = await eventually(() => w.events("reconcile_pass").length >= 2 && w.events("reconcile_pass").at(-1));
    assert.equal(next.fed, 0);
    assert.equal(next.index_listed, 0);
    assert.deepEqual(next.open, { operations: 0, stuck: 0, effects_not_done: 0 });
  });

  it("pauses every poll for a 429's Retry-After, sends the rest back, and still settles each once", async () => {
    const keys = Array.from({ length: 12 }, (_, i) => `batches/slow${String(i).padStart(2, "0")}`);
    for (const k of keys) await w.register(k, "nightly");
    let throttled = 0;
    for (const [i, k] of keys.entries()) {
      gemini.set(k, (n) => {
        // The fourth operation's first call is throttled, as Gemini would under load.
        if (i === 3 && n === 1) { throttled = Date.now(); return { status: 429, headers: { "retry-after": "2" }, body: { error: { code: 429 } } }; }
        return batch("BATCH_STATE_SUCCEEDED");
      });
    }
    await w.ledger(keys);
    const before = w.events("reconcile_pass").length;
    await w.scheduled();
    const pass = await eventually(() => w.events("reconcile_pass").length > before && w.events("reconcile_pass").at(-1));
    assert.equal(pass.fed, 12, JSON.stringify(pass));
    for (const k of keys) {
      await eventually(async () => (await w.inspect(k)).body.effect_done, { what: `the effect of ${k}`, timeoutMs: 30_000 });
      assert.equal(effectsFor(k).length, 1, k);
    }
    assert.ok(throttled > 0, "the 429 was answered");
    // Nothing was asked of Gemini during the wait, and the throttled one was asked again after.
    const during = api.requests.filter((r) => r.at > throttled + 5 && r.at < throttled + 1_900);
    assert.deepEqual(during.map((r) => r.url), [], "no status call during Retry-After");
    assert.equal(api.callsFor(keys[3]).length, 2);
    // The consumer told the lease, so the next pass schedules nothing before the wait ends.
    const ns = await w.mf.getDurableObjectNamespace("RECONCILE_LEASE");
    const res = await ns.get(ns.idFromName("reconcile")).fetch("http://lease/", { method: "POST", body: JSON.stringify({ command: "status" }) });
    const { lease } = await res.json();
    assert.ok(lease.status_backoff_until_ms >= throttled + 1_900, JSON.stringify(lease));
    assert.ok(lease.fed_until_ms > 0, JSON.stringify(lease));
  });

  it("under a 429 lasting several passes, schedules no second copy: after recovery each entry is polled once, and all settle", async () => {
    const keys = Array.from({ length: 20 }, (_, i) => `batches/lasting${String(i).padStart(2, "0")}`);
    for (const k of keys) await w.register(k, "nightly");
    let throttling = true;
    for (const k of keys) {
      gemini.set(k, () => (throttling
        ? { status: 429, headers: { "retry-after": "2" }, body: { error: { code: 429, status: "RESOURCE_EXHAUSTED" } } }
        : batch("BATCH_STATE_SUCCEEDED")));
    }
    await w.ledger(keys);
    const calls = () => api.requests.filter((r) => keys.some((k) => r.url === `/v1beta/${k}`));
    const passes = () => w.events("reconcile_pass");
    let seen = passes().length;
    const pass = async () => {
      await w.scheduled();
      const line = await eventually(() => passes().length > seen && passes().at(-1), { what: "the pass's line" });
      seen = passes().length;
      return line;
    };
    const first = await pass();
    assert.equal(first.fed, keys.length, JSON.stringify(first));
    assert.equal(first.stopped, "complete", "the coverage is scheduled whole");
    await eventually(() => calls().length >= 1, { what: "the first 429" });
    // Passes while Gemini keeps answering 429: the copy sent back is still waiting each time,
    // so a new coverage waits and schedules nothing beside it.
    for (let i = 0; i < 3; i++) {
      await sleep(1_500);
      const during = await pass();
      assert.equal(during.fed, 0, JSON.stringify(during));
      assert.equal(during.status_calls, 0);
      assert.equal(during.stopped, "still_queued", JSON.stringify(during));
    }
    // The copy meets the 429 again (sent back with its Retry-After each time).
    await eventually(() => calls().length >= 2, { what: "the copy to meet the 429 again", timeoutMs: 60_000 });
    throttling = false;
    const recovered = Date.now();
    for (const k of keys) {
      await eventually(async () => (await w.inspect(k)).body.effect_done, { what: `the effect of ${k}`, timeoutMs: 30_000 });
    }
    // A pass after recovery finds nothing left to schedule.
    const after = await pass();
    assert.equal(after.fed, 0, JSON.stringify(after));
    await sleep(2_000);
    for (const k of keys) {
      const polled = api.callsFor(k).filter((r) => r.at >= recovered).length;
      assert.equal(polled, 1, `${k} polled ${polled} times after recovery`);
      assert.equal(effectsFor(k).length, 1, `one effect for ${k}`);
      assert.equal((await w.inspect(k)).body.settled_by, "reconcile", k);
    }
    // Sent back, hop after hop, within its life: nothing dropped.
    assert.deepEqual(w.events("reconcile_job_dropped"), []);
    const ns = await w.mf.getDurableObjectNamespace("RECONCILE_LEASE");
    const res = await ns.get(ns.idFromName("reconcile")).fetch("http://lease/", { method: "POST", body: JSON.stringify({ command: "status" }) });
    const { lease } = await res.json();
    assert.ok(lease.fed_until_ms >= recovered - 2_000, `the copies sent back extended the schedule: ${JSON.stringify(lease)}`);
  });

  it("acknowledges a message that is not a poll job, once, with an error line, and polls nothing for it", async () => {
    const queue = await w.mf.getQueueProducer("RECONCILE_QUEUE");
    const polls = api.requests.length;
    const errors = () => w.events("reconcile_error").filter((e) => /queue message/.test(e.error ?? ""));
    const before = errors().length;
    await queue.send("not json at all", { contentType: "text" });
    await queue.send(JSON.stringify({ entries: "nope" }), { contentType: "text" });
    await queue.send({ an: "object" }, { contentType: "json" });
    await eventually(() => errors().length >= before + 3, { what: "three error lines" });
    // Not retried: a bad message does not become good, and its operations (if any) are still in
    // the index for the next coverage.
    await new Promise((r) => setTimeout(r, 2_500));
    assert.equal(errors().length, before + 3);
    assert.equal(api.requests.length, polls, "nothing polled for them");
  });
});

