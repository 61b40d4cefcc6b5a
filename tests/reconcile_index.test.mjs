// Reconciliation proportional to what is open, against the built worker in
// workerd: the gate keeps an `open:<key>` index beside the `op:<key>` ledger, a routine pass
// lists only that index, and a rare audit over the whole ledger finds what the index lost.
// Local servers stand in for Gemini's status API and the destination; KV is Miniflare's.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { startWorker, startStatusApi, startDestination, eventually, sleep } from "./helpers.mjs";

const gemini = new Map();
let api, dest;

const statusCallsFor = (key) => api.callsFor(key);
const effectsFor = (key) => dest.requests.filter((r) => r.headers["idempotency-key"] === key);
const passes = (w) => w.events("reconcile_pass");
const running = () => ({ status: 200, body: { name: "x", metadata: { state: "BATCH_STATE_RUNNING", updateTime: "2026-11-22T12:00:00Z" } } });
const succeeded = () => ({ status: 200, body: { name: "x", done: true, metadata: { state: "BATCH_STATE_SUCCEEDED", updateTime: "2026-11-22T12:30:00Z" } } });

before(async () => {
  api = await startStatusApi(gemini);
  dest = await startDestination(() => ({ status: 200 }));
});
after(async () => {
  await api?.close();
  await dest?.close();
  dest?.assertAllValid();
});

const vars = (extra = {}) => ({ EFFECT_URL: `${dest.url}/effects`, GEMINI_API_BASE: api.url, RECONCILE_GRACE_SECONDS: "0", ...extra });

/** Runs one cron pass and returns its log line. */
async function pass(w) {
  const n = passes(w).length;
  await w.scheduled();
  return eventually(() => passes(w)[n], { what: "the pass's log line" });
}

async function indexKeys(w) {
  return (await w.kvList("open:")).map((k) => k.name);
}

describe("the open: index", () => {
  it("finds an operation whose completion webhook was lost through the index, in a pass that does not audit", async () => {
    const w = await startWorker(vars());
    try {
      const first = await pass(w); // the first audit, over an empty ledger
      assert.equal(first.audit, true);
      assert.equal(first.audit_complete, true);
      const key = "batches/idx-lost-hook";
      await w.register(key, "idx");
      gemini.set(key, succeeded());
      await w.ledger(key);
      await eventually(async () => (await indexKeys(w)).includes(`open:${key}`), { what: "index entry on registration" });
      const p = await pass(w);
      assert.equal(p.audit, false, "not an audit pass");
      assert.equal(p.index_listed, 1);
      assert.equal(p.listed, 1, "only the index was listed");
      assert.equal(p.settled, 1);
      assert.equal(statusCallsFor(key).length, 1);
      const op = await eventually(async () => {
        const r = await w.inspect(key);
        return r.body.effect_done && r.body;
      }, { what: "effect done" });
      assert.equal(op.settled_by, "reconcile");
      assert.equal(effectsFor(key).length, 1);
      // Closed: the projection that shows it done deletes its index entry.
      await eventually(async () => !(await indexKeys(w)).includes(`open:${key}`), { what: "index entry deleted on close" });
      await w.ledger(key, (m) => m.effect_done);
    } finally {
      await w.dispose();
    }
  });

  it("holds only operations that may need work: a completion done at once never enters it, a forgotten one leaves it", async () => {
    const w = await startWorker(vars());
    try {
      // A completion whose effect succeeded at once: closed in its first projection.
      await w.deliver("batch.succeeded", "batches/idx-fast");
      await w.ledger("batches/idx-fast", (m) => m.effect_done);
      // Registered: open, with the same metadata as its ledger entry.
      await w.register("batches/idx-open", "idx");
      await w.register("batches/idx-forget", "idx");
      const [meta] = await w.ledger(["batches/idx-open"]);
      const kv = await w.kv();
      const indexed = await eventually(async () => (await kv.getWithMetadata("open:batches/idx-open")).metadata, { what: "index entry" });
      assert.deepEqual(indexed, meta, "the index entry carries the ledger's metadata");
      assert.equal(await kv.get("open:batches/idx-open"), "", "and no value");
      await eventually(async () => (await indexKeys(w)).includes("open:batches/idx-forget"), { what: "forget's index entry" });
      const r = await w.admin("/v1/operations/batches%2Fidx-forget/forget", { method: "POST", body: JSON.stringify({ reason: "test" }) });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      await eventually(async () => !(await indexKeys(w)).includes("open:batches/idx-forget"), { what: "forgotten leaves the index" });
      assert.deepEqual(await indexKeys(w), ["open:batches/idx-open"]);
    } finally {
      await w.dispose();
    }
  });

  it("costs a routine pass on a mostly-done ledger one list of the open entries, not of the ledger", async () => {
    const w = await startWorker(vars());
    try {
      for (let i = 0; i < 40; i++) await w.deliver("batch.succeeded", `batches/idx-done${String(i).padStart(2, "0")}`);
      const open = ["batches/idx-run0", "batches/idx-run1", "batches/idx-run2"];
      for (const key of open) {
        await w.register(key, "idx");
        gemini.set(key, running());
      }
      await w.ledger(open);
      await eventually(async () => (await indexKeys(w)).length === 3, { what: "three index entries" });
      await eventually(async () => (await w.kvList("op:")).filter((k) => k.metadata?.effect_done).length === 40, { what: "done entries projected" });
      const audit = await pass(w);
      assert.equal(audit.audit, true);
      assert.equal(audit.audit_listed, 43, "the audit lists the whole ledger");
      assert.equal(audit.audit_found, 0, "and finds nothing the index lacks");
      assert.equal(audit.reindexed, 0);
      // The projections of `running` (one write a second per key): the ledger follows each record.
      for (const key of open) {
        const { version } = (await w.inspect(key)).body;
        await w.ledger(key, (m) => m.version === version);
      }
      const p = await pass(w);
      assert.equal(p.audit, false);
      assert.equal(p.kv_lists, 1, "one list call");
      assert.equal(p.listed, 3, "only the open entries");
      assert.equal(p.index_listed, 3);
      assert.equal(p.bodies_read, 0);
      assert.equal(p.status_calls, 3);
      assert.equal(p.visited, 3);
      assert.equal(p.complete, true);
      for (const key of open) assert.equal(statusCallsFor(key).length, 2, key);
    } finally {
      await w.dispose();
    }
  });
});

describe("the audit", () => {
  it("finds an operation whose index entry was lost, and puts the entry back", { timeout: 60_000 }, async () => {
    const w = await startWorker(vars({ RECONCILE_AUDIT_SECONDS: "3" }));
    try {
      await pass(w); // the first audit
      const key = "batches/idx-lost-put";
      await w.register(key, "idx");
      gemini.set(key, running());
      await w.ledger(key);
      await eventually(async () => (await indexKeys(w)).includes(`open:${key}`), { what: "index entry" });
      // A lost write: the index entry is gone behind the worker's back.
      await (await w.kv()).delete(`open:${key}`);
      const routine = await pass(w);
      assert.equal(routine.audit, false);
      assert.equal(routine.index_listed, 0);
      assert.equal(statusCallsFor(key).length, 0, "the routine pass cannot see it");
      await sleep(3_100); // the audit is due again
      const audit = await pass(w);
      assert.equal(audit.audit, true, JSON.stringify(audit));
      assert.equal(audit.audit_found, 1);
      assert.equal(audit.reindexed, 1);
      assert.equal(statusCallsFor(key).length, 1, "the audit polled it");
      assert.ok(w.events("index_missed").some((e) => e.key === key));
      // Its gate projected it again: the index holds it, and routine passes poll it.
      await eventually(async () => (await indexKeys(w)).includes(`open:${key}`), { what: "index entry put back" });
      gemini.set(key, succeeded());
      const next = await pass(w);
      assert.equal(next.audit, false);
      assert.equal(next.index_listed, 1);
      assert.equal(next.settled, 1);
      await eventually(async () => (await w.inspect(key)).body.effect_done, { what: "effect done" });
      assert.equal(effectsFor(key).length, 1);
      await eventually(async () => !(await indexKeys(w)).includes(`open:${key}`), { what: "index entry deleted on close" });
    } finally {
      await w.dispose();
    }
  });

  it("removes an index entry left behind by a closed operation (a lost delete)", { timeout: 60_000 }, async () => {
    const w = await startWorker(vars({ RECONCILE_AUDIT_SECONDS: "3" }));
    try {
      await pass(w);
      const key = "batches/idx-lost-delete";
      await w.deliver("batch.succeeded", key);
      const meta = await w.ledger(key, (m) => m.effect_done);
      // An index entry as an older projection wrote it: terminal, a live claim (so the
      // routine walk has nothing to do for it and leaves it to the audit).
      const kv = await w.kv();
      const left = { ...meta, effect_done: false, claim_expires: Math.floor(Date.now() / 1000) + 3_600, version: meta.version - 1 };
      await kv.put(`open:${key}`, "", { metadata: left });
      const routine = await pass(w);
      assert.equal(routine.index_listed, 1);
      assert.equal(routine.gate_calls, 0, "a live claim: nothing to do");
      await sleep(3_100);
      const audit = await pass(w);
      assert.equal(audit.audit, true);
      assert.equal(audit.reindexed, 1, JSON.stringify(audit));
      assert.ok(w.events("index_stale").some((e) => e.key === key));
      await eventually(async () => !(await indexKeys(w)).includes(`open:${key}`), { what: "stale index entry deleted" });
      assert.equal(effectsFor(key).length, 1, "re-indexing runs nothing");
    } finally {
      await w.dispose();
    }
  });
});
