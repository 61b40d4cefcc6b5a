// The operator's API against the built worker in workerd: listing, redelivery, forgetting,
// counters and per-kind routing.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { startWorker, startServer, startDestination, assertEffectValid, eventually, sleep, signedHeaders } from "./helpers.mjs";

let dest, billing, api, w;
const plans = new Map();
const effectsFor = (server, key) => server.requests.filter((r) => r.headers["idempotency-key"] === key);

before(async () => {
  dest = await startDestination((req) => {
    const plan = plans.get(req.headers["idempotency-key"]);
    return plan ? plan() : { status: 200 };
  });
  billing = await startDestination(() => ({ status: 200 }));
  api = await startServer((req) => ({ status: 200, body: { name: "x", metadata: { state: "BATCH_STATE_RUNNING" } } }));
  w = await startWorker({
    EFFECT_URL: `${dest.url}/effects`,
    EFFECT_ROUTES: JSON.stringify({ billing: `${billing.url}/bill` }),
    // Unregistered operations here need no wait for a late registration's kind.
    UNREGISTERED_HOLD_SECONDS: "0",
    GEMINI_API_BASE: api.url,
    RECONCILE_GRACE_SECONDS: "0",
    STUCK_AFTER_SECONDS: "1",
  });
});
after(async () => {
  await w?.dispose();
  await Promise.all([dest?.close(), billing?.close(), api?.close()]);
  dest?.assertAllValid();
  billing?.assertAllValid();
});

describe("operator API", () => {
  it("routes side effects by kind with EFFECT_ROUTES", async () => {
    await w.register("batches/bill1", "billing");
    await w.register("batches/plain1", "nightly");
    await w.deliver("batch.succeeded", "batches/bill1");
    await w.deliver("batch.succeeded", "batches/plain1");
    await w.ledger(["batches/bill1", "batches/plain1"], (m) => m.effect_done);
    assert.equal(effectsFor(billing, "batches/bill1").length, 1);
    assert.equal(effectsFor(dest, "batches/bill1").length, 0);
    assert.equal(effectsFor(dest, "batches/plain1").length, 1);
  });

  it("un-parks with retry-now under the same generation, then redelivers a done effect on purpose as a new one", async () => {
    const key = "batches/redo1";
    let refuse = true;
    plans.set(key, () => (refuse ? { status: 422 } : { status: 200 }));
    await w.deliver("batch.succeeded", key);
    await eventually(async () => (await w.inspect(key)).body.effect_parked, { what: "the park" });
    refuse = false;
    const retried = await w.admin(`/v1/operations/${key}/redeliver`, { method: "POST", body: JSON.stringify({ reason: "destination fixed" }) });
    assert.equal(retried.status, 200, JSON.stringify(retried.body));
    assert.equal(retried.body.action, "retry_now", "an effect not done keeps its generation");
    assert.equal(retried.body.generation, 1);
    await eventually(async () => (await w.inspect(key)).body.effect_done, { what: "the retry" });
    const r = await w.admin(`/v1/operations/${key}/redeliver`, { method: "POST", body: JSON.stringify({ reason: "downstream lost it" }) });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal(r.body.action, "redeliver");
    assert.equal(r.body.generation, 2);
    assert.equal(r.body.effect, "scheduled");
    await eventually(() => effectsFor(dest, key).length === 3, { what: "the redelivery" });
    const [first, retry, second] = effectsFor(dest, key);
    assert.equal(first.headers["effect-generation"], "1");
    assert.equal(retry.headers["webhook-id"], first.headers["webhook-id"]);
    assert.equal(second.headers["effect-generation"], "2");
    assert.notEqual(first.headers["webhook-id"], second.headers["webhook-id"]);
    assert.equal(second.headers["idempotency-key"], key);
    assert.deepEqual(assertEffectValid(second.body), assertEffectValid(first.body), "a redelivery carries the same body");
    const op = await eventually(async () => {
      const o = await w.inspect(key);
      return o.body.effect_done && o;
    }, { what: "the redelivery to be done" });
    assert.equal(op.body.effect_parked, false);
    assert.equal(op.body.generation, 2);
    assert.equal(op.body.redeliveries[0].reason, "downstream lost it");
    assert.ok(op.body.history.some((h) => h.what === "redeliver" && h.generation === 2));
  });

  it("refuses to redeliver an operation with no outcome yet, or an unknown one", async () => {
    await w.register("batches/open1", "k");
    assert.equal((await w.admin("/v1/operations/batches/open1/redeliver", { method: "POST" })).status, 409);
    assert.equal((await w.admin("/v1/operations/batches/nobody/redeliver", { method: "POST" })).status, 404);
    // A GET is never an action: it reads the record and changes nothing.
    const read = await w.admin("/v1/operations/batches/open1/redeliver", { method: "GET" });
    assert.equal(read.body.generation, 1);
    assert.equal(read.body.status, "pending");
  });

  it("forgets an operation: recorded, not erased, and no longer polled", async () => {
    const key = "batches/forget1";
    await w.register(key, "k");
    const r = await w.admin(`/v1/operations/${key}/forget`, { method: "POST", body: JSON.stringify({ reason: "job deleted" }) });
    assert.equal(r.status, 200);
    assert.equal(r.body.changed, true);
    const again = await w.admin(`/v1/operations/${key}/forget`, { method: "POST" });
    assert.equal(again.body.changed, false);
    const op = await w.inspect(key);
    assert.equal(op.body.forgotten.reason, "job deleted");
    await w.ledger(key, (m) => m.forgotten);
    await w.scheduled();
    assert.equal(api.requests.filter((q) => q.url === `/v1beta/${key}`).length, 0);
  });

  it("lists operations from the ledger with filters and a cursor", async () => {
    for (let i = 0; i < 5; i++) await w.register(`batches/list${i}`, "list");
    await w.deliver("batch.failed", "batches/list0");
    await w.ledger("batches/list0", (m) => m.status === "failed");
    await w.ledger(["batches/list1", "batches/list2", "batches/list3", "batches/list4"]);
    const all = [];
    let cursor;
    let pages = 0;
    do {
      const r = await w.admin(`/v1/operations?limit=2${cursor ? `&cursor=${cursor}` : ""}`);
      assert.equal(r.status, 200);
      assert.ok(r.body.operations.length <= 2);
      all.push(...r.body.operations);
      cursor = r.body.cursor;
      pages++;
    } while (cursor && pages < 100);
    const keys = all.map((o) => o.key);
    assert.equal(new Set(keys).size, keys.length, "no entry twice across pages");
    for (let i = 0; i < 5; i++) assert.ok(keys.includes(`batches/list${i}`));
    const failed = await w.admin("/v1/operations?status=failed");
    assert.deepEqual(failed.body.operations.map((o) => o.key), ["batches/list0"]);
    const stuck = await w.admin("/v1/operations?stuck=true&limit=500");
    assert.ok(stuck.body.operations.some((o) => o.key === "batches/list1"));
    assert.ok(!stuck.body.operations.some((o) => o.key === "batches/list0"));
    assert.ok(!stuck.body.operations.some((o) => o.key === "batches/forget1"), "forgotten is not stuck");
    for (const bad of ["status=done", "limit=0", "cursor=%21", "effect_done=maybe", "order=asc"]) {
      assert.equal((await w.admin(`/v1/operations?${bad}`)).status, 400, bad);
    }
  });

  it("counts delivery outcomes and rejections", async () => {
    const fresh = await startWorker({ EFFECT_URL: `${dest.url}/effects` });
    try {
      await fresh.deliver("batch.succeeded", "batches/count1");
      await fresh.deliver("batch.succeeded", "batches/count1");
      await fresh.deliver("batch.succeeded", "batches/count1");
      await fresh.deliver("interaction.completed", "interactions/count2");
      await fresh.deliver("interaction.requires_action", "interactions/count2");
      const body = "{}";
      await fresh.json("/webhooks/gemini", { method: "POST", headers: signedHeaders(body, { signature: "v1,AAAA" }), body });
      const stats = await eventually(async () => {
        const s = await fresh.admin("/v1/stats");
        // Counted by the gates and at the edge, flushed by each on its own: wait for all.
        const t = s.body.total ?? {};
        return t.deliveries === 5 && t.effect_successes === 2 && t.duplicates_skipped === 2 && t.dropped_regress_from_terminal === 1 && t.settled_by_webhook === 2 && s;
      }, { what: "counters flushed" });
      assert.equal(stats.body.total.duplicates_skipped, 2);
      assert.equal(stats.body.total.dropped_regress_from_terminal, 1);
      assert.equal(stats.body.total.settled_by_webhook, 2);
      assert.equal(stats.body.last_24h.deliveries, 5);
      // Rejections are counted per isolate and flushed now and then: approximate by design.
      assert.ok((stats.body.total.rejected_signature_invalid ?? 0) <= 1);
      await sleep(200);
      const again = await fresh.admin("/v1/stats");
      assert.equal(again.body.total.deliveries, 5, "a second read counts nothing twice");
    } finally {
      await fresh.dispose();
    }
  });

  it("sends many operations' counts in a few shard calls, the last ones when the window ends", async () => {
    // Gates hand their counts to the isolate's tally: one shard call per STATS_FLUSH_SECONDS,
    // not one per completion. Nothing is sent after the burst, so the trailing counts arrive
    // only by the send the tally scheduled for the window's end. The window is 10 s (the
    // edge's longest): the burst's work fits in one however busy the machine, so the bound on
    // shard calls below does not depend on how fast the gates went.
    const fresh = await startWorker({ EFFECT_URL: `${dest.url}/effects`, STATS_FLUSH_SECONDS: "10", USAGE_LOG: "true" });
    try {
      const n = 12;
      const answers = await Promise.all(Array.from({ length: n }, (_, i) => fresh.deliver("batch.succeeded", `batches/tally${i}`)));
      assert.ok(answers.every((a) => a.status === 200));
      let reads = 0;
      await eventually(async () => {
        reads++;
        const s = (await fresh.admin("/v1/stats")).body.total ?? {};
        return s.deliveries === n && s.effect_successes === n && s.settled_by_webhook === n;
      }, { what: "every count sent", timeoutMs: 60_000, everyMs: 250 });
      // A read of /v1/stats is one call to each of the 8 shards; the rest are sends (the
      // reads' usage lines may still be on their way from workerd's stdout).
      const shardCalls = () => fresh.events("usage").filter((l) => l.object === "stats_shard").length;
      await eventually(() => shardCalls() > 8 * reads, { what: "the usage lines of every shard call" });
      const sends = shardCalls() - 8 * reads;
      assert.ok(sends >= 1 && sends <= 4, `${n} completions' counts in ${sends} shard calls`);
      await sleep(10_500);
      const again = (await fresh.admin("/v1/stats")).body.total;
      assert.equal(again.deliveries, n, "nothing sent twice");
    } finally {
      await fresh.dispose();
    }
  });
});
