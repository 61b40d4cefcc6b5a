// Status answers of any size: a local stand-in for Gemini's status API answers a batch that
// carries its results inline (tens of MB), and the built worker in workerd reads it with
// bounded memory, by the cron and by a dynamic-webhook nudge; an answer it cannot use alerts
// once, and an operator settles that operation by hand.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { generateKeyPairSync, sign as rsaSign } from "node:crypto";
import { startWorker, startServer, startStatusApi, startDestination, assertEffectValid, eventually, sleep } from "./helpers.mjs";

const AUDIENCE = "gemini-once-status-size";
const { privateKey, publicKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
const jwk = { ...publicKey.export({ format: "jwk" }), kid: "k1", alg: "RS256", use: "sig" };
const b64u = (v) => Buffer.from(typeof v === "string" ? v : JSON.stringify(v)).toString("base64url");
const nowSecs = () => Math.floor(Date.now() / 1000);
function jwt() {
  const header = { alg: "RS256", kid: "k1", typ: "JWT" };
  const claims = { iss: "https://generativelanguage.googleapis.com", aud: AUDIENCE, exp: nowSecs() + 300 };
  const input = `${b64u(header)}.${b64u(claims)}`;
  return `${input}.${rsaSign("sha256", Buffer.from(input), privateKey).toString("base64url")}`;
}

// What the worker keeps of one answer at most (src/skim.rs, MAX_KEPT_BYTES).
const MAX_KEPT_BYTES = 256 * 1024;

/**
 * A succeeded batch with `n` inline results of about 10 KB each, in metadata and response,
 * and the `n` inline requests it was submitted with echoed in its input configuration.
 */
function inlineBatch(name, n) {
  const item = JSON.stringify({
    response: { candidates: [{ content: { role: "model", parts: [{ text: "lorem ipsum ".repeat(850) }] }, finishReason: "STOP" }] },
    metadata: { key: "request-\"quoted\"-]}" },
  });
  const items = Array(n).fill(item).join(",");
  const inlined = `{"inlinedResponses":[${items}]}`;
  const request = JSON.stringify({ request: { contents: [{ role: "user", parts: [{ text: "dolor sit amet ".repeat(680) }] }] }, metadata: { key: "request" } });
  const requests = Array(n).fill(request).join(",");
  return `{"name":"${name}","done":true,"metadata":{"@type":"type.googleapis.com/google.ai.generativelanguage.v1beta.GenerateContentBatch",` +
    `"model":"models/gemini-2.5-flash","state":"BATCH_STATE_SUCCEEDED","updateTime":"2026-11-22T10:00:00Z",` +
    `"inputConfig":{"requests":{"requests":[${requests}]}},` +
    `"batchStats":{"requestCount":"${n}","successfulRequestCount":"${n}"},"output":{"inlinedResponses":${inlined}}},` +
    `"response":{"@type":"type.googleapis.com/google.ai.generativelanguage.v1beta.GenerateContentBatchOutput","inlinedResponses":${inlined}}}`;
}

const INLINE = 750;
const gemini = new Map();
let api, dest, sink, jwks, w;
const effectsFor = (key) => dest.requests.filter((r) => r.headers["idempotency-key"] === key);
const alertsFor = (key) => sink.requests.map((r) => JSON.parse(r.body)).filter((a) => a.key === key);
const readsFor = (key) => w.events("status_read").filter((e) => e.key === key);

before(async () => {
  api = await startStatusApi(gemini);
  dest = await startDestination(() => ({ status: 200 }));
  sink = await startServer(() => ({ status: 200 }));
  jwks = await startServer(() => ({ status: 200, body: { keys: [jwk] } }));
  w = await startWorker({
    EFFECT_URL: `${dest.url}/effects`,
    GEMINI_API_BASE: api.url,
    GEMINI_API_KEY: "test-gemini-key",
    GEMINI_JWKS_URL: `${jwks.url}/.well-known/jwks.json`,
    GEMINI_JWT_AUDIENCE: AUDIENCE,
    ALERT_URL: `${sink.url}/alerts`,
    RECONCILE_GRACE_SECONDS: "0",
    EFFECT_RETRY_BASE_SECONDS: "1",
    // Nudges here are confirmed again within seconds (production asks at most once a minute).
    CONFIRM_INTERVAL_SECONDS: "1",
    EFFECT_RETRY_MAX_SECONDS: "1",
  });
});
after(async () => {
  await w?.dispose();
  for (const s of [api, dest, sink, jwks]) await s?.close();
  dest?.assertAllValid();
});

/** Checks the one effect of `key` and the log line of its read; returns the effect's body. */
function checkSettled(key, settledBy, bodyBytes) {
  const effects = effectsFor(key);
  assert.equal(effects.length, 1, `one effect for ${key}`);
  assert.ok(effects[0].body.length < 2_000, `the effect carries no inline result (${effects[0].body.length} bytes)`);
  const effect = assertEffectValid(effects[0].body);
  assert.equal(effect.status, "succeeded");
  assert.equal(effect.settled_by, settledBy);
  assert.equal(effect.provider.inlined_responses, INLINE);
  assert.equal(effect.provider.batch_stats.requestCount, String(INLINE));
  const reads = readsFor(key);
  assert.ok(reads.length >= 1, "the large read is logged");
  for (const read of reads) {
    assert.equal(read.bytes_read, bodyBytes, "the whole answer was read");
    assert.ok(read.bytes_kept < 4_096, `kept ${read.bytes_kept} bytes`);
    assert.ok(read.bytes_kept + read.max_chunk < MAX_KEPT_BYTES + 4 * 1024 * 1024, "one chunk and the kept part");
    assert.equal(read.arrays_counted, 2);
    assert.ok(read.values_dropped >= 1, "the echoed requests are dropped");
  }
  return effect;
}

describe("status answers of any size", () => {
  let cronEffect;

  it("settles a succeeded inline batch of more than 20 MB through the cron, with one effect", async () => {
    const key = "batches/inline-cron";
    const body = inlineBatch(key, INLINE);
    assert.ok(body.length > 20_000_000, `${body.length} bytes`);
    gemini.set(key, { status: 200, body });
    await w.register(key, "inline");
    await w.ledger(key);
    await w.scheduled();
    await eventually(async () => (await w.inspect(key)).body.effect_done, { what: "the effect", timeoutMs: 60_000 });
    cronEffect = checkSettled(key, "reconcile", Buffer.byteLength(body));
    // Settled: the next pass does not read it again.
    await sleep(1100);
    await w.scheduled();
    assert.equal(api.callsFor(key).length, 1);
  });

  it("settles one through a dynamic-webhook nudge, with one effect like the cron's", async () => {
    const key = "batches/inline-nudge";
    const body = inlineBatch(key, INLINE);
    gemini.set(key, { status: 200, body });
    await w.register(key, "inline");
    const r = await w.json("/webhooks/gemini", {
      method: "POST",
      headers: { "content-type": "application/json", "webhook-id": "msg_jwt_inline", "webhook-timestamp": String(nowSecs()), "webhook-signature": jwt() },
      body: JSON.stringify({ type: "batch.succeeded", version: "v1", timestamp: new Date().toISOString(), data: { id: key } }),
    });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal(r.body.outcome, "confirming");
    await eventually(async () => (await w.inspect(key)).body.effect_done, { what: "the effect", timeoutMs: 60_000 });
    const effect = checkSettled(key, "webhook", Buffer.byteLength(body));
    // The same body whichever path settled it (but for who, which and when).
    const strip = ({ key: _k, name: _n, settled_by: _s, settled_at: _t, ...rest }) => rest;
    assert.deepEqual(strip(effect), strip(cronEffect));
  });

  it("alerts once, with the reason, on an answer that is not JSON or keeps too much, and leaves it open", async () => {
    const cases = [
      ["batches/garbled", '{"name":"batches/garbled","metadata":{"state":"BATCH_STATE_SUCC', /not JSON/],
      ["batches/too-much", JSON.stringify({ name: "batches/too-much", done: true, metadata: { state: "BATCH_STATE_FAILED" }, error: { code: 13, message: "m", details: Array(40_000).fill("abcdefgh") } }), /larger than 262144/],
    ];
    for (const [key, body] of cases) {
      gemini.set(key, { status: 200, body });
      await w.register(key, "unusable");
      await w.ledger(key);
    }
    await w.scheduled();
    for (const [key, , reason] of cases) {
      const [alert] = await eventually(() => alertsFor(key).length && alertsFor(key), { what: `the alert for ${key}` });
      assert.equal(alert.alert, "status_unusable");
      assert.match(alert.text, reason);
      assert.match(alert.text, /settle/);
    }
    await sleep(1100);
    await w.scheduled();
    await sleep(500);
    for (const [key, , reason] of cases) {
      assert.equal(alertsFor(key).length, 1, "alerted once");
      assert.ok(api.callsFor(key).length >= 2, "the cron keeps asking");
      const op = (await w.inspect(key)).body;
      assert.equal(op.status, "pending", "never settled by the worker's own judgment");
      assert.match(op.unusable_status, reason);
      assert.equal(effectsFor(key).length, 0);
    }
  });

  it("a nudge whose answer cannot be used asks a bounded number of times, then leaves it to the cron and the alert", async () => {
    const key = "batches/garbled-nudge";
    gemini.set(key, { status: 200, body: "<html>oops</html>" });
    await w.register(key, "unusable");
    const r = await w.json("/webhooks/gemini", {
      method: "POST",
      headers: { "content-type": "application/json", "webhook-id": "msg_jwt_garbled", "webhook-timestamp": String(nowSecs()), "webhook-signature": jwt() },
      body: JSON.stringify({ type: "batch.succeeded", version: "v1", timestamp: new Date().toISOString(), data: { id: key } }),
    });
    assert.equal(r.body.outcome, "confirming");
    await eventually(async () => (await w.inspect(key)).body.confirming === false, { what: "the confirmation to give up", timeoutMs: 60_000 });
    const tries = api.callsFor(key).length;
    assert.equal(tries, 5, "MAX_CONFIRM_ATTEMPTS questions");
    assert.equal(alertsFor(key).length, 1);
    assert.equal(alertsFor(key)[0].alert, "status_unusable");
    await sleep(2500);
    assert.equal(api.callsFor(key).length, tries, "no more questions from the gate");
  });

  it("an operator settles it by hand: one effect, recorded as settled by operator", async () => {
    const key = "batches/garbled";
    const path = `/v1/operations/${encodeURIComponent(key)}/settle`;
    const bad = await w.admin(path, { method: "POST", body: JSON.stringify({ status: "running", reason: "x" }) });
    assert.equal(bad.status, 400);
    const noReason = await w.admin(path, { method: "POST", body: JSON.stringify({ status: "succeeded" }) });
    assert.equal(noReason.status, 400);
    const r = await w.admin(path, { method: "POST", body: JSON.stringify({ status: "succeeded", reason: "results checked in AI Studio" }) });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal(r.body.settled_by, "operator");
    assert.equal(r.body.status, "succeeded");
    await eventually(() => effectsFor(key).length === 1, { what: "the effect" });
    const effect = assertEffectValid(effectsFor(key)[0].body);
    assert.equal(effect.settled_by, "operator");
    assert.equal(effect.status, "succeeded");
    assert.equal(effect.provider.operator_reason, "results checked in AI Studio");
    const op = (await w.inspect(key)).body;
    assert.equal(op.settled_by, "operator");
    const row = op.history.find((h) => h.settled_by === "operator");
    assert.equal(row.reason, "results checked in AI Studio");
    assert.equal(row.status, "succeeded");
    const again = await w.admin(path, { method: "POST", body: JSON.stringify({ status: "failed", reason: "oops" }) });
    assert.equal(again.status, 409, "terminal absorbs");
    const missing = await w.admin(`/v1/operations/${encodeURIComponent("batches/never-heard")}/settle`, { method: "POST", body: JSON.stringify({ status: "failed", reason: "r" }) });
    assert.equal(missing.status, 404);
    await sleep(1500);
    assert.equal(effectsFor(key).length, 1, "still one effect");
    // The cron leaves a settled operation alone.
    const calls = api.callsFor(key).length;
    await w.scheduled();
    assert.equal(api.callsFor(key).length, calls);
  });
});
