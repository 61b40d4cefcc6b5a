// One budget for every status call: anyone with a Gemini job of their own can mint valid
// dynamic-webhook tokens and name, in a loop, an operation the worker holds. A held operation
// is asked about at most once per CONFIRM_INTERVAL_SECONDS (60 here, the default) whatever the
// nudges, a nudge that changes nothing writes nothing, and every status call (a nudge's
// confirmation, the cron pass's polls on the fan-out queue) takes its slot from the one budget
// the lease keeps, RECONCILE_POLL_RATE a second. Tokens are signed with a local RSA key whose
// key set a local server publishes; Gemini's status API is a local stand-in that records when
// each call arrived.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { generateKeyPairSync, sign as rsaSign } from "node:crypto";
import { startWorker, startServer, startDestination, eventually, sleep } from "./helpers.mjs";

const RATE = 2;
const { privateKey, publicKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
const jwk = { ...publicKey.export({ format: "jwk" }), kid: "k1", alg: "RS256", use: "sig" };
const b64u = (v) => Buffer.from(typeof v === "string" ? v : JSON.stringify(v)).toString("base64url");
const now = () => Math.floor(Date.now() / 1000);
function jwt(claims = {}) {
  const input = `${b64u({ alg: "RS256", kid: "k1", typ: "JWT" })}.${b64u({ exp: now() + 300, ...claims })}`;
  return `${input}.${rsaSign("sha256", Buffer.from(input), privateKey).toString("base64url")}`;
}
function nudge(id, token, type = "batch.succeeded") {
  const body = JSON.stringify({ type, version: "v1", timestamp: new Date().toISOString(), data: { id } });
  return w.json("/webhooks/gemini", {
    method: "POST",
    headers: { "content-type": "application/json", "webhook-id": `msg_${Math.random()}`, "webhook-timestamp": String(now()), "webhook-signature": token },
    body,
  });
}
/** Sends `count` nudges naming `id`, `width` at a time; returns their answers. */
async function nudges(id, count, width) {
  const token = jwt();
  const answers = [];
  for (let i = 0; i < count; i += width) {
    answers.push(...await Promise.all(Array.from({ length: Math.min(width, count - i) }, () => nudge(id, token))));
  }
  return answers;
}

let jwks, gemini, dest, w;
/** The stand-in's answers by path: a batch state, or an HTTP status. */
const states = new Map();
const statusCalls = (key) => gemini.requests.filter((r) => r.url === `/v1beta/${key}`);
const effectsFor = (key) => dest.requests.filter((r) => r.headers["idempotency-key"] === key);

/** The status calls that arrived from `from` on: when (ms after `from`), and which operation. */
function arrivals(from) {
  return gemini.requests
    .filter((r) => r.url.startsWith("/v1beta/batches/") && r.at >= from)
    .map((r) => ({ at: r.at - from, key: r.url.slice("/v1beta/".length) }))
    .sort((x, y) => x.at - y.at);
}
/**
 * The shortest time any WINDOW_SLOTS + 1 of `times` took. At RECONCILE_POLL_RATE the slots are
 * 1 / RATE apart, so it is at least WINDOW_SLOTS of them, less how much later than its slot
 * the first call's arrival was stamped (the caller's and the stand-in's event loops on a busy
 * machine; 82 ms seen), which TOLERANCE_MS covers. A budget taken twice (two sources sharing
 * the slots) halves the window, well under the bound.
 */
function shortestWindow(times) {
  let shortest = Infinity;
  for (let i = 0; i + WINDOW_SLOTS < times.length; i++) shortest = Math.min(shortest, times[i + WINDOW_SLOTS] - times[i]);
  return shortest;
}
const SPACING_MS = 1000 / RATE;
const WINDOW_SLOTS = 2 * RATE; // two seconds of slots
const TOLERANCE_MS = SPACING_MS; // one slot

before(async () => {
  dest = await startDestination(() => ({ status: 200 }));
  jwks = await startServer(() => ({ status: 200, body: { keys: [jwk] } }));
  gemini = await startServer((req) => {
    const state = states.get(req.url);
    if (state === undefined) return { status: 404, body: { error: { code: 404, message: "not found" } } };
    if (typeof state === "number") return { status: state, headers: { "retry-after": "2" }, body: { error: { code: state } } };
    return {
      status: 200,
      body: { name: req.url.replace("/v1beta/", ""), metadata: { state: `BATCH_STATE_${state}`, updateTime: new Date().toISOString() }, done: state === "SUCCEEDED" },
    };
  });
  w = await startWorker({
    GEMINI_JWKS_URL: `${jwks.url}/jwks`,
    GEMINI_API_BASE: gemini.url,
    GEMINI_API_KEY: "test-api-key",
    EFFECT_URL: `${dest.url}/effects`,
    RECONCILE_POLL_RATE: String(RATE),
    // Every open operation is polled by the pass, through the fan-out queue.
    RECONCILE_GRACE_SECONDS: "0",
    RECONCILE_FANOUT_ABOVE: "1",
  });
});
after(async () => {
  await w?.dispose();
  for (const s of [jwks, gemini, dest]) await s?.close();
  dest?.assertAllValid();
});

describe("one budget for every status call", () => {
  it("120 nudges naming one held operation, 4 at a time, make one status call (404, or still running)", async () => {
    states.set("/v1beta/batches/nb-run", "RUNNING");
    for (const key of ["batches/nb-404", "batches/nb-run"]) {
      assert.equal((await w.register(key)).status, 201);
      const answers = await nudges(key, 120, 4);
      assert.ok(answers.every((a) => a.status === 200 && a.body.outcome === "confirming"), JSON.stringify(answers.find((a) => a.body.outcome !== "confirming")));
      await eventually(() => statusCalls(key).length >= 1, { what: `the confirmation of ${key}` });
      const { body } = await eventually(async () => {
        const op = await w.inspect(key);
        return !op.body.alerts_pending.length && op.body.version && op;
      }, { what: `${key} at rest` });
      // More nudges inside the interval: answered, nothing asked, nothing written.
      const again = await nudges(key, 40, 4);
      assert.ok(again.every((a) => a.status === 200 && a.body.outcome === "confirming"));
      await sleep(2500);
      assert.equal(statusCalls(key).length, 1, `one status call for 160 nudges naming ${key}`);
      const after = (await w.inspect(key)).body;
      assert.equal(after.version, body.version, "no write for a nudge inside the interval");
      assert.equal(after.history.filter((h) => h.what === "nudged").length, 1, "one nudged row");
    }
  });

  it("nudges claiming another state of a settled operation write nothing and ask nothing", async () => {
    const key = "batches/nb-done";
    assert.equal((await w.register(key)).status, 201);
    assert.equal((await w.deliver("batch.succeeded", key, { output: { responsesFile: "files/x" } })).status, 200);
    await eventually(() => effectsFor(key).length === 1, { what: "the one effect" });
    const { body: before } = await eventually(async () => {
      const op = await w.inspect(key);
      return op.body.effect_done && op;
    }, { what: "settled" });
    const token = jwt();
    for (let i = 0; i < 20; i++) {
      const r = await nudge(key, token, "batch.failed");
      assert.equal(r.status, 200);
      assert.equal(r.body.outcome, "dropped", JSON.stringify(r.body));
      assert.equal(r.body.reason, "conflicting_terminal");
    }
    const { body: after } = await w.inspect(key);
    assert.equal(after.version, before.version);
    assert.equal(after.history.length, before.history.length);
    assert.equal(statusCalls(key).length, 0);
    assert.equal(effectsFor(key).length, 1);
  });

  it(`confirmations and a cron pass's polls together never exceed RECONCILE_POLL_RATE (${RATE} a second)`, async () => {
    const keys = Array.from({ length: 10 }, (_, i) => `batches/nb-many-${i}`);
    for (const key of keys) {
      states.set(`/v1beta/${key}`, "RUNNING");
      assert.equal((await w.register(key)).status, 201);
    }
    await w.ledger(keys); // in the index, so the pass below polls each of them
    const from = Date.now();
    const token = jwt();
    // Ten confirmations want the status API at once, beside a pass fanning out every open
    // operation (these ten and the first test's two) onto the queue.
    const [answers] = await Promise.all([
      Promise.all(keys.map((k) => nudge(k, token))),
      w.scheduled(),
    ]);
    assert.ok(answers.every((a) => a.body.outcome === "confirming"));
    await eventually(() => keys.every((k) => statusCalls(k).length >= 2), { what: "each asked by its confirmation and by the pass", timeoutMs: 40000, everyMs: 250 });
    await sleep(1500);
    const seen = arrivals(from);
    const shortest = shortestWindow(seen.map((x) => x.at));
    const calls = seen.length;
    console.log(`status calls: ${calls} in ${Date.now() - from} ms; the shortest time ${WINDOW_SLOTS + 1} of them took: ${shortest} ms`);
    assert.ok(calls >= 20, `${calls}`);
    const why = `${WINDOW_SLOTS + 1} status calls within ${shortest} ms (rate ${RATE} a second): ${JSON.stringify(seen)}`;
    assert.ok(shortest >= WINDOW_SLOTS * SPACING_MS - TOLERANCE_MS, why);
  });
});
