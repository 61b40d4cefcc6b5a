// A cron pass never outlives its lease, against the built worker in workerd:
// status calls that hang cost only their own entries, the pass stops at its deadline and
// saves its cursor, a heartbeat keeps a long pass's short lease, and a pass killed with the
// worker blocks the next only until its short lease lapses. Local servers stand in for
// Gemini's status API and the destination.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { startWorker, startServer, startStatusApi, eventually, sleep, workerdChildren } from "./helpers.mjs";

// Gemini's status API: answers per path, set by each test; `HANG` never answers.
const HANG = () => new Promise(() => {});
const gemini = new Map();
let api, dest;

const statusCallsFor = (key) => api.callsFor(key);
const effectsFor = (key) => dest.requests.filter((r) => r.headers["idempotency-key"] === key);
const passes = (w) => w.events("reconcile_pass");
const running = () => ({ status: 200, body: { name: "x", metadata: { state: "BATCH_STATE_RUNNING", updateTime: "2026-11-22T12:00:00Z" } } });
const succeeded = () => ({ status: 200, body: { name: "x", done: true, metadata: { state: "BATCH_STATE_SUCCEEDED", updateTime: "2026-11-22T12:00:00Z" } } });

before(async () => {
  api = await startStatusApi(gemini);
  dest = await startServer(() => ({ status: 200 }));
});
after(async () => {
  await api?.close();
  await dest?.close();
});

const vars = (extra = {}) => ({ EFFECT_URL: `${dest.url}/effects`, GEMINI_API_BASE: api.url, RECONCILE_GRACE_SECONDS: "0", ...extra });

/** Runs `run` (one cron run by default) and returns the first pass line logged after it began. */
async function pass(w, run = () => w.scheduled()) {
  const n = passes(w).length;
  await run();
  return eventually(() => passes(w)[n], { what: "the pass's log line" });
}

async function registerAll(w, keys) {
  for (const key of keys) await w.register(key, "lease");
  await w.ledger(keys);
}

describe("status calls that hang", () => {
  it("cost only their own entries: the cursor moves past them, the others settle, the hung ones are asked again", { timeout: 90_000 }, async () => {
    const w = await startWorker(vars());
    try {
      const keys = ["batches/hang0", "batches/hang1", "batches/hang2", "batches/hang3", "batches/hang4", "batches/hang5"];
      const hung = ["batches/hang1", "batches/hang4"];
      for (const key of keys) gemini.set(key, hung.includes(key) ? HANG : succeeded());
      await registerAll(w, keys);
      const first = await pass(w);
      assert.equal(first.status_unanswered, 2, JSON.stringify(first));
      assert.equal(first.complete, true, "the pass went past the hung entries to the end of the ledger");
      assert.equal(first.stopped, "complete");
      for (const key of keys.filter((k) => !hung.includes(k))) {
        const op = (await w.inspect(key)).body;
        assert.equal(op.status, "succeeded", key);
        assert.equal(op.settled_by, "reconcile", key);
        assert.equal(statusCallsFor(key).length, 1, key);
      }
      for (const key of hung) {
        assert.equal(statusCallsFor(key).length, 1, key);
        assert.equal((await w.inspect(key)).body.status, "pending", `${key}: nothing settled from a call that got no answer`);
      }
      // Nothing is lost: the next coverage of the ledger asks the skipped entries again, and
      // they settle once Gemini answers.
      for (const key of hung) gemini.set(key, succeeded());
      await w.ledger(keys.filter((k) => !hung.includes(k)), (m) => m.effect_done);
      await w.scheduled();
      for (const key of hung) {
        assert.equal(statusCallsFor(key).length, 2, `${key} revisited`);
        assert.equal((await w.inspect(key)).body.status, "succeeded", key);
      }
      for (const key of keys) assert.equal(effectsFor(key).length, 1, key);
    } finally {
      await w.dispose();
    }
  });

  it("three in a row back off every status call and hold the next pass at the first entry skipped", { timeout: 90_000 }, async () => {
    const w = await startWorker(vars());
    try {
      const keys = ["batches/down0", "batches/down1", "batches/down2", "batches/down3", "batches/down4"];
      for (const key of keys) gemini.set(key, key < "batches/down3" ? HANG : running());
      await registerAll(w, keys);
      const first = await pass(w);
      assert.equal(first.status_unanswered, 3);
      assert.equal(first.stopped, "held_for_backoff");
      assert.equal(first.complete, false);
      for (const key of ["batches/down3", "batches/down4"]) assert.equal(statusCallsFor(key).length, 0, `${key} skipped during the back-off`);
      // During the back-off the next pass asks nothing, and does not spend 5 s per entry again.
      await w.scheduled();
      assert.equal(keys.reduce((n, k) => n + statusCallsFor(k).length, 0), 3);
    } finally {
      await w.dispose();
    }
  });
});

describe("pass deadline", () => {
  it("stops starting entries at RECONCILE_DEADLINE_SECONDS and the next pass resumes after the last one done", { timeout: 90_000 }, async () => {
    const w = await startWorker(vars({ RECONCILE_DEADLINE_SECONDS: "1" }));
    try {
      const keys = ["batches/dl0", "batches/dl1", "batches/dl2", "batches/dl3"];
      for (const key of keys) gemini.set(key, key === "batches/dl1" ? HANG : running());
      await registerAll(w, keys);
      const first = await pass(w);
      assert.equal(first.stopped, "deadline", JSON.stringify(first));
      assert.equal(first.complete, false);
      assert.equal(statusCallsFor("batches/dl0").length, 1);
      assert.equal(statusCallsFor("batches/dl1").length, 1, "the entry in hand finished (its call timed out)");
      assert.equal(statusCallsFor("batches/dl2").length + statusCallsFor("batches/dl3").length, 0, "nothing started past the deadline");
      // The next passes resume after dl1: they ask neither dl0 nor dl1 before reaching the end.
      await eventually(async () => (await pass(w)).complete, { what: "a pass reaching the end of the ledger", timeoutMs: 30_000 });
      assert.equal(statusCallsFor("batches/dl0").length, 1);
      assert.equal(statusCallsFor("batches/dl1").length, 1);
      assert.equal(statusCallsFor("batches/dl2").length, 1);
      assert.equal(statusCallsFor("batches/dl3").length, 1);
    } finally {
      await w.dispose();
    }
  });
});

describe("lease heartbeat", () => {
  it("keeps a pass longer than its lease TTL the only pass, and frees the lease when it ends", { timeout: 90_000 }, async () => {
    // A 5 s lease; three hung calls (5 s each, answered entries between) make a ~15 s pass.
    const w = await startWorker(vars({ RECONCILE_LEASE_SECONDS: "5" }));
    try {
      const keys = ["batches/hb0", "batches/hb1", "batches/hb2", "batches/hb3", "batches/hb4"];
      for (const key of keys) gemini.set(key, ["batches/hb0", "batches/hb2", "batches/hb4"].includes(key) ? HANG : running());
      await registerAll(w, keys);
      const n = passes(w).length;
      const long = w.scheduled();
      // Once the pass is on its second hung call, well past one TTL, another cron run comes.
      await eventually(() => statusCallsFor("batches/hb2").length === 1, { what: "the second hung call", timeoutMs: 60_000 });
      const overlapping = await pass(w);
      assert.equal(overlapping.lease_busy, true, "the heartbeat kept the lease");
      await long;
      const walked = await eventually(() => passes(w).slice(n).find((p) => !p.lease_busy), { what: "the long pass's line" });
      assert.equal(walked.complete, true, JSON.stringify(walked));
      assert.ok(walked.lease_renewals >= 2, `renewed ${walked.lease_renewals} times`);
      assert.ok(walked.elapsed_ms > 5_000, "the pass outlived one TTL");
      for (const key of keys) assert.equal(statusCallsFor(key).length, 1, `${key} asked once: only one pass walked`);
      // Released on completion: the next run takes the lease at once.
      for (const key of keys) gemini.set(key, running());
      assert.equal((await pass(w)).lease_busy, false);
    } finally {
      await w.dispose();
    }
  });
});

describe("a pass killed with the worker", () => {
  it("blocks the next only until its short lease lapses; the next resumes from its last heartbeat", { timeout: 120_000 }, async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gemini-once-lease-"));
    const config = vars({ RECONCILE_LEASE_SECONDS: "5" });
    let w;
    try {
      const before = new Set(workerdChildren());
      w = await startWorker(config, { persist: dir });
      const ours = workerdChildren().filter((pid) => !before.has(pid));
      assert.equal(ours.length, 1, `one workerd started for this worker: ${ours}`);
      const keys = ["batches/kill0", "batches/kill1", "batches/kill2", "batches/kill3"];
      // kill0 stays running, so a pass that started again from the top would ask it again.
      gemini.set("batches/kill0", running());
      for (const key of keys.slice(1)) gemini.set(key, key === "batches/kill1" ? HANG : succeeded());
      await registerAll(w, keys);
      w.scheduled().catch(() => {}); // dies with the worker
      await eventually(() => statusCallsFor("batches/kill1").length === 1, { what: "the pass to reach the hanging call" });
      // Inside the 5 s hang, past two heartbeats (every 1.25 s): the lease holds the pass's
      // position after kill0, and its holder is about to die without releasing.
      await sleep(3_000);
      process.kill(ours[0], "SIGKILL");
      await Promise.race([w.dispose().catch(() => {}), sleep(10_000)]);
      w = null;
      gemini.set("batches/kill1", succeeded());

      w = await startWorker(config, { persist: dir });
      const started = Date.now();
      // Runs that find the dead pass's lease still live do nothing; once it lapses, one runs.
      const next = await eventually(async () => {
        const p = await pass(w);
        return !p.lease_busy && p;
      }, { what: "a pass that is not lease_busy", timeoutMs: 60_000, everyMs: 500 });
      const busy = passes(w).filter((p) => p.lease_busy).length;
      console.error(`# next pass ran ${Date.now() - started} ms after the restart (${busy} lease_busy runs before it)`);
      assert.equal(next.complete, true, JSON.stringify(next));
      for (const key of keys.slice(1)) assert.equal((await w.inspect(key)).body.status, "succeeded", key);
      assert.equal(statusCallsFor("batches/kill0").length, 1, "resumed after kill0, the position of the last heartbeat");
      assert.equal(statusCallsFor("batches/kill1").length, 2, "kill1 (in hand when killed) asked again");
      for (const key of keys.slice(1)) assert.equal(effectsFor(key).length, 1, key);
    } finally {
      await w?.dispose();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
