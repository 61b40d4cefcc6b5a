// A destination that says when to come back is believed: against the built worker in workerd,
// a 429 or 503 with `Retry-After` (seconds or an HTTP date) is retried no sooner than it asks,
// capped by EFFECT_RETRY_MAX_SECONDS, under the same webhook-id, and never parked for it.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { startWorker, startDestination, eventually } from "./helpers.mjs";

let dest, w;
const plans = new Map();
const effectsFor = (key) => dest.requests.filter((r) => r.headers["idempotency-key"] === key);

before(async () => {
  dest = await startDestination((req) => {
    const plan = plans.get(req.headers["idempotency-key"]);
    return plan ? plan(effectsFor(req.headers["idempotency-key"]).length) : { status: 200 };
  });
  w = await startWorker({
    EFFECT_URL: `${dest.url}/effects`,
    // The backoff's own first wait is about a second: a retry sooner than Retry-After asks
    // would show.
    EFFECT_RETRY_BASE_SECONDS: "1",
    EFFECT_RETRY_MAX_SECONDS: "8",
    UNREGISTERED_HOLD_SECONDS: "0",
  });
});
after(async () => {
  await w?.dispose();
  await dest?.close();
  dest?.assertAllValid();
});

/**
 * Delivers `key`'s completion and waits for its effect to be done; returns what was sent, and
 * `waitsAtMost`: once the first refusal is stored, the record's next attempt less the moment it
 * was read (a state, not a timing: a slow machine only makes it smaller).
 */
async function deliveredAfterRefusals(key, plan) {
  plans.set(key, plan);
  await w.deliver("batch.succeeded", key);
  const waitsAtMost = await eventually(async () => {
    const { body } = await w.inspect(key);
    const readAt = Date.now();
    // Read only after the retry (a slow read): nothing left to bound, which only a wait
    // shorter than the read allows.
    if (body.effect_done || body.attempts > 1) return { ms: -Infinity };
    return body.attempts === 1 && body.last_error && body.next_attempt_at
      && { ms: Date.parse(body.next_attempt_at) - readAt };
  }, { what: `${key}'s first refusal stored`, timeoutMs: 30_000 });
  const done = await eventually(async () => {
    const { body } = await w.inspect(key);
    return body.effect_done && body;
  }, { what: `${key}'s effect`, timeoutMs: 30_000 });
  assert.equal(done.effect_parked, false, "a Retry-After never parks");
  const sent = effectsFor(key);
  assert.ok(sent.every((r) => r.headers["webhook-id"] === sent[0].headers["webhook-id"]), "one webhook-id throughout");
  sent.waitsAtMost = waitsAtMost.ms;
  return sent;
}

describe("Retry-After from the destination", () => {
  it("a 429 with Retry-After: 4 is retried after at least 4 s, under the same webhook-id", async () => {
    const sent = await deliveredAfterRefusals("batches/ra-429", (n) =>
      n === 1 ? { status: 429, headers: { "retry-after": "4" }, body: { error: "slow down" } } : { status: 200 });
    assert.equal(sent.length, 2);
    const gap = sent[1].at - sent[0].at;
    assert.ok(gap >= 4_000, `retried ${gap} ms after a Retry-After of 4 s`);
  });

  it("a 503 with an HTTP-date Retry-After waits until that date", async () => {
    const sent = await deliveredAfterRefusals("batches/ra-date", (n) =>
      n === 1
        ? { status: 503, headers: { "retry-after": new Date(Date.now() + 5_000).toUTCString() } }
        : { status: 200 });
    assert.equal(sent.length, 2);
    // The date has one-second resolution: at least 4 s of the 5 asked for.
    const gap = sent[1].at - sent[0].at;
    assert.ok(gap >= 4_000, `retried ${gap} ms after a date 5 s ahead`);
  });

  it("a Retry-After past EFFECT_RETRY_MAX_SECONDS waits the cap, not an hour", async () => {
    const sent = await deliveredAfterRefusals("batches/ra-cap", (n) =>
      n === 1 ? { status: 503, headers: { "retry-after": "3600" } } : { status: 200 });
    assert.equal(sent.length, 2);
    const gap = sent[1].at - sent[0].at;
    assert.ok(gap >= 6_000, `retried ${gap} ms after, capped at 8 s`);
    // The cap, as the record stores it (an hour's wait would read about 3,600,000).
    assert.ok(sent.waitsAtMost <= 8_000, `the next attempt was stored ${sent.waitsAtMost} ms ahead`);
  });

  it("a Retry-After that cannot be read leaves the backoff's own wait", async () => {
    const sent = await deliveredAfterRefusals("batches/ra-junk", (n) =>
      n === 1 ? { status: 429, headers: { "retry-after": "soon" } } : { status: 200 });
    assert.equal(sent.length, 2);
    // The backoff's own first wait (about a second), as the record stores it: a Retry-After
    // believed would read about an hour, or 8 s capped.
    assert.ok(sent.waitsAtMost < 4_000, `the next attempt was stored ${sent.waitsAtMost} ms ahead`);
  });
});
