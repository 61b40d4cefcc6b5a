// After retention nothing runs twice, whoever asks, and the gate keeps nothing: a batch and a
// video, each registered with its metadata, settled and its effect delivered once, then
// purged at retention (LEDGER_RETENTION_SECONDS): their name is kept in its retired names'
// shard and their gate deletes everything. Registered again with other metadata (409
// `retired`, nothing created), polled by a cron pass (a stale index entry, which the pass
// deletes), nudged with a valid dynamic-webhook token, and delivered again with a valid,
// fresh HMAC signature (a current webhook-timestamp and envelope timestamp: its record asks
// the shard in its first alarm and is deleted with nothing run), the destination still holds
// exactly one effect and the gate holds nothing. Before retention, a second registration with
// other metadata is 409 `conflict` with what is recorded, and the effect carries the first
// registration's metadata.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { generateKeyPairSync, sign as rsaSign } from "node:crypto";
import { startWorker, startServer, startDestination, eventually, sleep, signedHeaders } from "./helpers.mjs";
import { startGemini, succeeded, fileOf, split, untilJob, workerVars } from "./results_stub.mjs";

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

      // Retention ends: the gate keeps nothing; the name is its shard's.
      await eventually(() => w.events("retention_expired").some((l) => l.key === c.key), { what: "retention to end" });
      assert.equal((await w.inspect(c.name)).status, 404, "nothing left in the gate");

      // Registered again, with other metadata or the same: 409 `retired`, nothing created.
      for (const tenant of ["attacker", "ours"]) {
        const again = await w.register(c.name, c.kind, { user_metadata: { tenant } });
        assert.equal(again.status, 409, JSON.stringify(again.body));
        assert.equal(again.body.error, "retired");
        assert.equal(again.body.operation.key, c.key);
      }
      assert.equal((await w.inspect(c.name)).status, 404, "the registration created nothing");
      assert.equal((await w.kvList(`open:${c.key}`)).length, 0, "nothing opened for the pass");

      // Polled: an index entry left behind makes a cron pass ask Gemini (terminal, with or
      // without a time); the empty gate creates nothing and the pass deletes the entry.
      const callsBefore = statusCalls(c.name).length;
      await (await w.kv()).put(`open:${c.key}`, "", { metadata: pending });
      await w.scheduled();
      await eventually(() => statusCalls(c.name).length > callsBefore, { what: "the pass's poll" });
      await eventually(async () => (await w.kvList(`open:${c.key}`)).length === 0, { what: "the stale index entry deleted" });
      assert.equal((await w.inspect(c.name)).status, 404, "the poll created nothing");
      const callsAfterPoll = statusCalls(c.name).length;

      // Nudged with a valid token: the gate holds nothing, so nothing is asked of Gemini.
      const nudged = await nudge(w, c.name, c.type);
      assert.equal(nudged.status, 200);
      assert.notEqual(nudged.body.outcome, "applied", JSON.stringify(nudged.body));
      assert.equal((await w.inspect(c.name)).status, 404, "the nudge created nothing");

      // Delivered again with a fresh, valid signature (current timestamps, a new webhook-id):
      // answered, then its record's first alarm finds the name retired and deletes it.
      const refusedBefore = w.events("retired_name_refused").filter((l) => l.key === c.key).length;
      const b2 = body();
      const resigned = await w.json("/webhooks/gemini", { method: "POST", headers: signedHeaders(b2), body: b2 });
      assert.equal(resigned.status, 200, JSON.stringify(resigned.body));
      if (resigned.body.outcome === "applied") {
        await eventually(() => w.events("retired_name_refused").filter((l) => l.key === c.key).length > refusedBefore, { what: "the first alarm to find the name retired", timeoutMs: 60_000 });
      }
      await eventually(async () => (await w.inspect(c.name)).status === 404, { what: "the gate empty again", timeoutMs: 60_000 });
      // And a second pass, with nothing left to poll.
      await w.scheduled();

      await sleep(2000);
      assert.equal(effectsFor(c.key).length, 1, "nothing ran again");
      assert.equal(statusCalls(c.name).length, callsAfterPoll, "neither the nudge nor the delivery asked anything");
      assert.equal((await w.inspect(c.name)).status, 404, "nothing kept but the name in its shard");
    });
  }
});

// Retirement ends a batch's results as it ends the job: an operator retries a parked result
// whose destination keeps failing; retention waits for the accepted retry, and ends once the
// results settle again. Nothing of the batch stays
// due: no results' due time, no results tables, nothing wakes; a signed duplicate later asks
// Gemini nothing, downloads nothing and sends no result again.
describe("retention during an operator's retry of a batch's results", () => {
  let gemini, dest, sink, w;
  const refuse = new Map();
  before(async () => {
    gemini = await startGemini();
    sink = await startServer(() => ({ status: 200 }));
    dest = await startServer((req) => {
      const status = refuse.get(JSON.parse(req.body).result_key);
      return { status: status ?? 200 };
    });
    w = await startWorker({ ...workerVars({ dest, gemini, sink }), LEDGER_RETENTION_SECONDS: "6", RESULTS_FILE_WAIT_SECONDS: "3" });
  });
  after(async () => {
    await w?.dispose();
    for (const s of [gemini, dest, sink]) await s?.close();
  });

  it("retires the batch with its results: nothing wakes, and a signed duplicate runs nothing", { timeout: 180_000 }, async () => {
    const key = `batches/ret-results-${run}`;
    gemini.files.set(`files/${run}-r10`, fileOf(10));
    gemini.status.set(key, succeeded(key, { responsesFile: `files/${run}-r10` }));
    refuse.set("k3", 422);
    assert.equal((await w.register(key, "other", { results: "each" })).status, 201);
    assert.equal((await w.deliver("batch.succeeded", key)).status, 200);
    const { jobs } = await untilJob(dest, key, 90_000);
    assert.equal(jobs[0].body.results.parked, 1, "k3 parked");

    // The operator retries k3 while its destination now fails it: the results are due again.
    refuse.set("k3", 503);
    const sentBefore = split(dest, key).results.length;
    const retry = await w.admin(`/v1/operations/${encodeURIComponent(key)}/results/retry`, { method: "POST", body: JSON.stringify({ reason: "fixed" }) });
    assert.equal(retry.status, 200, JSON.stringify(retry.body));
    assert.equal(retry.body.retried, 1);
    await eventually(() => split(dest, key).results.length > sentBefore, { what: "the retried result tried again", timeoutMs: 60_000 });

    // Retention waits for the accepted retry while it runs (it is never dropped)...
    await sleep(7_000);
    assert.ok(!w.events("retention_expired").some((l) => l.key === key), "held by the retry");
    const held = await w.admin(`/v1/operations/${encodeURIComponent(key)}/results?state=waiting`);
    assert.deepEqual(held.body.results.map((r) => r.result_key), ["k3"], "the retry still runs");
    // ...and ends once the results settle again (k3 refused: parked): the gate keeps nothing,
    // its results included.
    refuse.set("k3", 422);
    await eventually(() => w.events("retention_expired").some((l) => l.key === key), { what: "retention to end", timeoutMs: 60_000 });
    assert.equal((await w.inspect(key)).status, 404, "nothing left in the gate");
    const quiet = async () => {
      const before = { sent: dest.requests.length, downloads: gemini.downloads.length };
      await sleep(4_000);
      return { sent: dest.requests.length - before.sent, downloads: gemini.downloads.length - before.downloads };
    };
    assert.deepEqual(await quiet(), { sent: 0, downloads: 0 }, "nothing wakes after retirement");

    // A signed duplicate, fresh: its record's first alarm finds the name retired.
    const sent = dest.requests.length;
    const downloads = gemini.downloads.length;
    assert.equal((await w.deliver("batch.succeeded", key)).status, 200);
    await eventually(async () => (await w.inspect(key)).status === 404, { what: "the gate empty again", timeoutMs: 60_000 });
    await sleep(3_000);
    assert.equal(dest.requests.length, sent, "no result and no job effect sent again");
    assert.equal(gemini.downloads.length, downloads, "no download");
    assert.equal((await w.inspect(key)).status, 404, "no results tables recreated");
    const results = await w.admin(`/v1/operations/${encodeURIComponent(key)}/results`);
    assert.equal(results.status, 404, JSON.stringify(results.body));
  });
});
