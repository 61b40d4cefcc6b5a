// After retention nothing runs twice, whoever asks: a batch and a video, each registered with
// its metadata, settled and its effect delivered once, then purged at retention
// (LEDGER_RETENTION_SECONDS), keep a tombstone in their gate. Registered again with other
// metadata (409 `retired`, nothing created), polled by a cron pass (a stale index entry, which
// the pass deletes), nudged with a valid dynamic-webhook token, and delivered again with a
// valid, fresh HMAC signature (a current webhook-timestamp and envelope timestamp), the
// destination still holds exactly one effect. Before retention, a second registration with
// other metadata is 409 `conflict` with what is recorded, and the effect carries the first
// registration's metadata.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { generateKeyPairSync, sign as rsaSign } from "node:crypto";
import { startWorker, startServer, startDestination, eventually, sleep, signedHeaders } from "./helpers.mjs";

const { privateKey, publicKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
const jwk = { ...publicKey.export({ format: "jwk" }), kid: "k1", alg: "RS256", use: "sig" };
const b64u = (v) => Buffer.from(typeof v === "string" ? v : JSON.stringify(v)).toString("base64url");
const now = () => Math.floor(Date.now() / 1000);
function jwt() {
  const input = `${b64u({ alg: "RS256", kid: "k1", typ: "JWT" })}.${b64u({ exp: now() + 300 })}`;
  return `${input}.${rsaSign("sha256", Buffer.from(input), privateKey).toString("base64url")}`;
}
function nudge(worker, id, type) {
  const body = JSON.stringify({ type, version: "v1", timestamp: new Date().toISOString(), data: { id } });
  return worker.json("/webhooks/gemini", {
    method: "POST",
    headers: { "content-type": "application/json", "webhook-id": `msg_${Math.random()}`, "webhook-timestamp": String(now()), "webhook-signature": jwt() },
    body,
  });
}

let jwks, gemini, dest;
/** The status stand-in's answers by path, each a whole body answered 200. */
const answers = new Map();
const statusCalls = (name) => gemini.requests.filter((r) => r.url === `/v1beta/${name}`);
const effectsFor = (key) => dest.requests.filter((r) => r.headers["idempotency-key"] === key).map((r) => JSON.parse(r.body));

before(async () => {
  dest = await startDestination(() => ({ status: 200 }));
  jwks = await startServer(() => ({ status: 200, body: { keys: [jwk] } }));
  gemini = await startServer((req) => {
    const body = answers.get(req.url);
    return body ? { status: 200, body } : { status: 404, body: { error: { code: 404, message: "not found" } } };
  });
});
after(async () => {
  for (const s of [jwks, gemini, dest]) await s?.close();
  dest?.assertAllValid();
});

const run = Date.now().toString(36);
const cases = [
  {
    what: "a batch (its answers carry a time)",
    name: `batches/ret-${run}`,
    key: `batches/ret-${run}`,
    kind: "billing",
    type: "batch.succeeded",
    data: (name) => ({ id: name, output_file_uri: "files/out" }),
    answer: (name) => ({ name, metadata: { state: "BATCH_STATE_SUCCEEDED", updateTime: new Date().toISOString() }, done: true }),
  },
  {
    what: "a video (its answers carry no time)",
    name: `models/veo-3/operations/ret-${run}`,
    key: `operations/ret-${run}`,
    kind: "publish",
    type: "video.generated",
    data: (name) => ({ id: name, file_name: "files/v" }),
    answer: (name) => ({ name, done: true, response: { generateVideoResponse: { generatedSamples: [{ video: { uri: "files/v" } }] } } }),
  },
];

describe("after retention nothing runs twice, whoever asks", () => {
  let w;
  before(async () => {
    w = await startWorker({
      GEMINI_JWKS_URL: `${jwks.url}/jwks`,
      GEMINI_API_BASE: gemini.url,
      GEMINI_API_KEY: "test-api-key",
      EFFECT_URL: `${dest.url}/effects`,
      LEDGER_RETENTION_SECONDS: "2",
      RECONCILE_GRACE_SECONDS: "0",
    });
  });
  after(async () => {
    await w?.dispose();
  });

  for (const c of cases) {
    it(`${c.what}: registered again, polled, nudged and re-signed after retention, it still has one effect`, async () => {
      answers.set(`/v1beta/${c.name}`, c.answer(c.name));
      const first = await w.register(c.name, c.kind, { user_metadata: { tenant: "ours" } });
      assert.equal(first.status, 201);
      const pending = await w.ledger(c.key);

      // Before the outcome: the same registration again is an idempotent 200; another with
      // other metadata is 409 with what is recorded, and changes nothing.
      const same = await w.register(c.name, c.kind, { user_metadata: { tenant: "ours" } });
      assert.equal(same.status, 200, JSON.stringify(same.body));
      const other = await w.register(c.name, c.kind, { user_metadata: { tenant: "attacker" } });
      assert.equal(other.status, 409, JSON.stringify(other.body));
      assert.equal(other.body.error, "conflict");
      assert.deepEqual(other.body.conflicts, ["user_metadata"]);
      assert.deepEqual(other.body.operation.details.user_metadata, { tenant: "ours" });
      const otherKind = await w.register(c.name, "elsewhere", {});
      assert.equal(otherKind.status, 409);
      assert.deepEqual(otherKind.body.conflicts, ["kind"]);

      // The completion, signed: one effect, carrying the first registration's metadata.
      const body = () => JSON.stringify({ type: c.type, version: "v1", timestamp: new Date().toISOString(), data: c.data(c.name) });
      const b1 = body();
      const delivered = await w.json("/webhooks/gemini", { method: "POST", headers: signedHeaders(b1), body: b1 });
      assert.equal(delivered.status, 200);
      await eventually(() => effectsFor(c.key).length === 1, { what: "the effect" });
      assert.deepEqual(effectsFor(c.key)[0].user_metadata, { tenant: "ours" });
      assert.equal(effectsFor(c.key)[0].kind, c.kind);

      // Retention ends: the gate keeps its tombstone alone.
      await eventually(() => w.events("retention_expired").some((l) => l.key === c.key), { what: "retention to end" });
      const tomb = await w.inspect(c.name);
      assert.equal(tomb.status, 200);
      assert.ok(tomb.body.retired_at, JSON.stringify(tomb.body));
      assert.equal(tomb.body.status, "succeeded");
      assert.equal(tomb.body.effect_done, true);

      // Registered again, with other metadata or the same: 409 `retired`, nothing created.
      for (const tenant of ["attacker", "ours"]) {
        const again = await w.register(c.name, c.kind, { user_metadata: { tenant } });
        assert.equal(again.status, 409, JSON.stringify(again.body));
        assert.equal(again.body.error, "retired");
        assert.ok(again.body.operation.retired_at);
      }
      assert.equal((await w.kvList(`open:${c.key}`)).length, 0, "nothing opened for the pass");

      // Polled: an index entry left behind makes a cron pass ask Gemini (terminal, with or
      // without a time); the tombstone runs nothing and the pass deletes the entry.
      const callsBefore = statusCalls(c.name).length;
      await (await w.kv()).put(`open:${c.key}`, "", { metadata: pending });
      await w.scheduled();
      await eventually(() => statusCalls(c.name).length > callsBefore, { what: "the pass's poll" });
      await eventually(async () => (await w.kvList(`open:${c.key}`)).length === 0, { what: "the stale index entry deleted" });
      const callsAfterPoll = statusCalls(c.name).length;

      // Nudged with a valid token: answered from the tombstone, nothing asked of Gemini.
      const nudged = await nudge(w, c.name, c.type);
      assert.equal(nudged.status, 200);
      assert.equal(nudged.body.outcome, "dropped", JSON.stringify(nudged.body));

      // Delivered again with a fresh, valid signature (current timestamps, a new webhook-id).
      const b2 = body();
      const resigned = await w.json("/webhooks/gemini", { method: "POST", headers: signedHeaders(b2), body: b2 });
      assert.equal(resigned.status, 200);
      assert.equal(resigned.body.outcome, "dropped", JSON.stringify(resigned.body));
      // And a second pass, with nothing left to poll.
      await w.scheduled();

      await sleep(2000);
      assert.equal(effectsFor(c.key).length, 1, "nothing ran again");
      assert.equal(statusCalls(c.name).length, callsAfterPoll, "the nudge asked nothing");
      const after = await w.inspect(c.name);
      assert.equal(after.body.retired_at, tomb.body.retired_at, "the same tombstone");
      assert.equal(after.body.generation, tomb.body.generation);
    });
  }
});
