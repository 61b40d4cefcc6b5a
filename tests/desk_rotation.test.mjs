// A key its destination keeps refusing does not hold the keys behind it: a probe that fails
// puts its key behind every key that waited before it, and an ask again keeps that place
// (`Desk::queue_place`, host-tested with a fallback shorter than the probes' backoff, which a
// worker no longer has: the fallback is a minute at least). The chaos run with results
// batches left job effects waiting minutes behind the one key every probe went to. Against the
// built worker in workerd.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startWorker, startDestination, eventually } from "./helpers.mjs";

const STUCK = "batches/rotation-stuck";
const GOOD = Array.from({ length: 6 }, (_, i) => `batches/rotation-good-${i}`);
let dest, w;
let downUntil = Infinity;

before(async () => {
  // Down for everyone until `downUntil`; the stuck key is refused for ever.
  dest = await startDestination((req) => {
    const key = req.headers["idempotency-key"];
    return key === STUCK || Date.now() < downUntil ? { status: 503, body: { error: "down" } } : { status: 200 };
  });
  w = await startWorker({
    EFFECT_URL: `${dest.url}/effects`,
    EFFECT_RETRY_BASE_SECONDS: "1",
    EFFECT_RETRY_MAX_SECONDS: "2",
    UNREGISTERED_HOLD_SECONDS: "0",
  });
});
after(async () => {
  await w?.dispose();
  await dest?.close();
  dest?.assertAllValid();
});

test("a key refused at every probe goes behind and stays there when its effect asks again: the keys behind it are probed, and it closes", { timeout: 150_000 }, async () => {
  downUntil = Date.now() + 3_600_000;
  // The stuck key is owed first: the head of the desk's queue.
  await w.deliver("batch.succeeded", STUCK);
  await eventually(async () => dest.requests.length >= 1, { what: "the stuck key's first attempt" });
  await Promise.all(GOOD.map((k) => w.deliver("batch.succeeded", k)));
  await eventually(async () => {
    const view = (await w.admin("/v1/stats")).body.destinations.find((d) => d.label.startsWith("EFFECT_URL:"));
    return view?.state === "open" && view.waiting >= GOOD.length;
  }, { what: "the destination open, every key waiting", timeoutMs: 60_000, everyMs: 250 });
  // The destination is back for every key but the stuck one.
  const backAt = Date.now();
  downUntil = backAt;
  await eventually(async () => {
    const views = await Promise.all(GOOD.map((k) => w.inspect(k)));
    return views.every((v) => v.body.effect_done);
  }, { what: "every other key delivered", timeoutMs: 120_000, everyMs: 500 });
  const after = dest.requests.filter((r) => r.at >= backAt);
  const firstGood = after.findIndex((r) => r.headers["idempotency-key"] !== STUCK);
  const stuckFirst = firstGood;
  console.log(`# after the recovery: ${stuckFirst} attempt(s) of the stuck key before the first other key`);
  assert.ok(stuckFirst <= 1, `the stuck key was probed ${stuckFirst} times in a row while others waited`);
  for (const k of GOOD) {
    assert.equal(after.filter((r) => r.headers["idempotency-key"] === k).length, 1, `${k} sent once after the recovery`);
  }
});
