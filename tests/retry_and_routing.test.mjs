// What the destination sees, against the built worker in workerd: an id that never changes
// under an effect that may have arrived (retry-now vs redeliver), a registration that comes
// after its completion's first attempt changes neither its route nor its body, configuration
// that cannot double an attempt, and an answer read only as far as the excerpt kept of it.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { startWorker, startDestination, eventually } from "./helpers.mjs";

let dest, billing, w;
const plans = new Map();
const effectsFor = (server, key) => server.requests.filter((r) => r.headers["idempotency-key"] === key);

before(async () => {
  dest = await startDestination((req, n) => {
    const plan = plans.get(req.headers["idempotency-key"]);
    return plan ? plan(effectsFor(dest, req.headers["idempotency-key"]).length) : { status: 200 };
  });
  billing = await startDestination(() => ({ status: 200 }));
  w = await startWorker({
    EFFECT_URL: `${dest.url}/effects`,
    EFFECT_ROUTES: JSON.stringify({ billing: `${billing.url}/bill` }),
    // The first test needs an attempt to time out (its destination holds the answer); every
    // other attempt is answered at once, and with retries an hour apart one that timed out on
    // a starved machine would never be done: 30 s is a wait only the held attempt reaches.
    EFFECT_TIMEOUT_MS: "30000",
    // Failed attempts wait an hour: every retry in these tests is an operator's.
    EFFECT_RETRY_BASE_SECONDS: "3600",
    EFFECT_RETRY_MAX_SECONDS: "3600",
    // No wait for a late registration: attempts go out at once (tests/strangers.test.mjs
    // covers the wait).
    UNREGISTERED_HOLD_SECONDS: "0",
  });
});
after(async () => {
  await w?.dispose();
  await Promise.all([dest?.close(), billing?.close()]);
  dest?.assertAllValid();
  billing?.assertAllValid();
});

const action = (key, what, body = {}) =>
  w.admin(`/v1/operations/${encodeURIComponent(key)}/${what}`, { method: "POST", body: JSON.stringify(body) });

describe("retry now and redeliver", () => {
  it("retry-now keeps the webhook-id of an attempt that timed out on our side, and is refused while one is in flight", async () => {
    const key = "batches/timed-out";
    let release;
    const held = new Promise((resolve) => { release = resolve; });
    // The first attempt reaches the destination, which answers only after our timeout.
    plans.set(key, (n) => (n === 1 ? held.then(() => ({ status: 200 })) : { status: 200 }));
    await w.deliver("batch.succeeded", key);
    await eventually(() => effectsFor(dest, key).length === 1, { what: "the first attempt" });
    for (const what of ["retry", "redeliver"]) {
      const busy = await action(key, what, { reason: "impatient" });
      assert.equal(busy.status, 409, `${what} while the attempt is in flight: ${JSON.stringify(busy.body)}`);
      assert.match(busy.body.error, /in flight/);
    }
    const failed = await eventually(async () => {
      const { body } = await w.inspect(key);
      return body.last_error && body;
    }, { what: "the attempt to time out on our side", timeoutMs: 120_000 });
    assert.match(failed.last_error, /timeout/);
    assert.equal(failed.effect_done, false);
    const r = await action(key, "retry", { reason: "destination looks fine" });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal(r.body.action, "retry_now");
    assert.equal(r.body.generation, 1);
    release();
    const done = await eventually(async () => {
      const { body } = await w.inspect(key);
      return body.effect_done && body;
    }, { what: "the retried attempt" });
    assert.equal(done.generation, 1);
    const sent = effectsFor(dest, key);
    assert.equal(sent.length, 2);
    assert.equal(sent[1].headers["webhook-id"], sent[0].headers["webhook-id"], "a Standard Webhooks receiver drops the repeat");
    assert.equal(sent[1].headers["effect-generation"], "1");
    assert.ok(done.history.some((h) => h.what === "retry_now" && h.reason === "destination looks fine"));
  });

  it("on an effect not done, redeliver is retry-now (and un-parks); on a done effect it is a new generation", async () => {
    const key = "batches/redo2";
    let refuse = true;
    plans.set(key, () => (refuse ? { status: 422 } : { status: 200 }));
    await w.deliver("batch.succeeded", key);
    await eventually(async () => (await w.inspect(key)).body.effect_parked, { what: "the park" });
    refuse = false;
    const retried = await action(key, "redeliver", { reason: "fixed the schema" });
    assert.equal(retried.status, 200);
    assert.equal(retried.body.action, "retry_now");
    assert.equal(retried.body.generation, 1);
    await eventually(async () => (await w.inspect(key)).body.effect_done, { what: "the retried effect" });
    assert.equal(new Set(effectsFor(dest, key).map((r) => r.headers["webhook-id"])).size, 1);
    const again = await action(key, "redeliver", { reason: "downstream lost it" });
    assert.equal(again.body.action, "redeliver");
    assert.equal(again.body.generation, 2);
    await eventually(() => effectsFor(dest, key).length === 3, { what: "the redelivery" });
    const [, second, third] = effectsFor(dest, key);
    assert.notEqual(third.headers["webhook-id"], second.headers["webhook-id"]);
    assert.equal(third.headers["effect-generation"], "2");
    assert.equal(third.headers["idempotency-key"], key);
    const retryDone = await action(key, "retry");
    assert.equal(retryDone.status, 409, "retry-now on a done effect");
  });
});

describe("a registration that comes after the completion", () => {
  it("after the first attempt went out, leaves the kind unset: the retry is the same body to the same place", async () => {
    const key = "interactions/late-reg";
    plans.set(key, (n) => (n === 1 ? { status: 503 } : { status: 200 }));
    await w.deliver("interaction.completed", key);
    await eventually(() => effectsFor(dest, key).length === 1, { what: "the first attempt, with no kind" });
    assert.equal(JSON.parse(effectsFor(dest, key)[0].body).kind, null);
    const reg = await w.register(key, "billing");
    assert.equal(reg.status, 200);
    assert.equal(reg.body.kind, null);
    assert.equal(reg.body.kind_change, "too_late");
    assert.match(reg.body.note, /webhook-id/);
    assert.equal((await action(key, "retry")).status, 200);
    await eventually(() => effectsFor(dest, key).length === 2, { what: "the retry" });
    const [first, second] = effectsFor(dest, key);
    assert.equal(second.headers["webhook-id"], first.headers["webhook-id"]);
    assert.equal(second.body, first.body, "one webhook-id, one body");
    assert.equal(effectsFor(billing, key).length, 0);
    const done = await eventually(async () => (await w.inspect(key)).body.effect_done && (await w.inspect(key)).body, { what: "done" });
    assert.equal(done.kind, null);
    const after = await w.register(key, "billing");
    assert.equal(after.body.kind_change, "filled", "once done, the kind may be filled: only a redelivery (a new webhook-id) sends again");
    const other = await w.register(key, "publish");
    assert.equal(other.status, 409, "a registration never changes what an earlier one recorded");
    assert.deepEqual([other.body.error, other.body.conflicts, other.body.operation.kind], ["conflict", ["kind"], "billing"]);
  });
});

describe("configuration that cannot double an attempt", () => {
  it("refuses a claim TTL that does not outlast the effect timeout, and warns below the runtime's grace", async () => {
    const refused = await startWorker({ EFFECT_TIMEOUT_MS: "5000", CLAIM_TTL_SECONDS: "5" });
    try {
      const r = await refused.json("/healthz");
      assert.equal(r.status, 503);
      assert.equal(r.body.variable, "CLAIM_TTL_SECONDS");
      assert.match(r.body.problem, /EFFECT_TIMEOUT_MS/);
      assert.equal((await refused.deliver("batch.succeeded", "batches/cfg1")).status, 503, "Gemini keeps retrying meanwhile");
    } finally {
      await refused.dispose();
    }
    const warned = await startWorker({ EFFECT_TIMEOUT_MS: "5000", CLAIM_TTL_SECONDS: "10" });
    try {
      const r = await warned.json("/healthz");
      assert.equal(r.status, 200);
      assert.match(r.body.warnings[0], /CLAIM_TTL_SECONDS/);
      assert.ok(warned.events("config_warning").length >= 1);
    } finally {
      await warned.dispose();
    }
  });
});

describe("a destination's answer is read only as far as its excerpt", () => {
  it("an endless answer neither holds the attempt to its timeout nor fills memory: a 200 is done, a 400 parked with a bounded excerpt", async () => {
    // Answers the status, then writes its body for as long as anyone reads it.
    const cut = new Map();
    const endless = createServer((req, res) => {
      req.resume();
      req.on("end", () => {
        const key = req.headers["idempotency-key"];
        res.writeHead(key.endsWith("-refused") ? 400 : 200, { "content-type": "text/plain" });
        const chunk = "e".repeat(16 * 1024);
        let sent = 0;
        res.on("close", () => cut.set(key, sent));
        const pump = () => {
          while (!res.destroyed) {
            sent += chunk.length;
            if (!res.write(chunk)) return res.once("drain", pump);
          }
        };
        pump();
      });
    });
    await new Promise((r) => endless.listen(0, "127.0.0.1", r));
    // Far beyond what a starved machine takes for two answers: only a worker that waited for
    // the end of an endless body would reach it (and the test then fails at half of it).
    const timeoutMs = 120_000;
    const worker = await startWorker({
      EFFECT_URL: `http://127.0.0.1:${endless.address().port}/effects`,
      EFFECT_TIMEOUT_MS: String(timeoutMs),
      EFFECT_RETRY_BASE_SECONDS: "3600",
      EFFECT_RETRY_MAX_SECONDS: "3600",
      UNREGISTERED_HOLD_SECONDS: "0",
    });
    try {
      const started = Date.now();
      await worker.deliver("batch.succeeded", "batches/endless-done");
      await worker.deliver("batch.succeeded", "batches/endless-refused");
      const done = await eventually(async () => {
        const { body } = await worker.inspect("batches/endless-done");
        return body.effect_done && body;
      }, { what: "the effect answered 200 with an endless body", timeoutMs: timeoutMs / 2 });
      assert.equal(done.last_error ?? null, null);
      const parked = await eventually(async () => {
        const { body } = await worker.inspect("batches/endless-refused");
        return body.effect_parked && body;
      }, { what: "the effect answered 400 with an endless body", timeoutMs: timeoutMs / 2 });
      assert.ok(Date.now() - started < timeoutMs / 2, "well before the timeout: nothing waited for the end");
      // The record keeps the status and the start of the body, bounded.
      assert.match(parked.last_error, /^400: e{200}$/, parked.last_error);
      // The worker stopped reading and let go: each answer was cut after a bounded amount
      // (the excerpt, plus what the sockets buffered meanwhile), not read to any end.
      const sent = await eventually(() => cut.size === 2 && [...cut.values()], { what: "both answers cut" });
      for (const bytes of sent) assert.ok(bytes < 64 * 1024 * 1024, `${bytes} bytes written before the cut`);
    } finally {
      await worker.dispose();
      endless.closeAllConnections?.();
      await new Promise((r) => endless.close(r));
    }
  });
});
