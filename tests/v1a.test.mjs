// Dynamic webhooks as live deliveries are signed: Standard Webhooks `v1a,` entries (Ed25519
// over "{webhook-id}.{webhook-timestamp}.{body}"), verified against the Ed25519 keys
// (`kty: OKP`, `crv: Ed25519`) of a key set served by a local stand-in for Gemini's JWKS
// endpoint, signed with locally made keys. Google signed the body, but its keys serve every
// project, so the job is ours only once Gemini's status API (a local stand-in), asked with our
// key, answers for it: a held operation is confirmed as for a token; one no gate holds is asked
// about once and created from the answer when it is ours, and nothing is stored when it is not.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { generateKeyPairSync, sign as cryptoSign } from "node:crypto";
import { startWorker, startServer, startDestination, eventually, signedHeaders } from "./helpers.mjs";
import { statusAnswer } from "../scripts/gemini_stub.mjs";

const edKey = () => generateKeyPairSync("ed25519");
const [first, added, forger] = [edKey(), edKey(), edKey()];
const jwk = (pair, kid) => ({ ...pair.publicKey.export({ format: "jwk" }), kid, alg: "EdDSA", use: "sig" });

let jwks, gemini, dest, alerts, w;
/** The key set the stand-in serves now. */
let published = [jwk(first, "ed-1"), jwk(added, "ed-2")];
/** The status stand-in's states by operation name (`batches/x`, `interactions/y`); others 404, or an HTTP status. */
const states = new Map();

const now = () => Math.floor(Date.now() / 1000);
let seq = 0;
/** A Gemini envelope for `id`. */
const envelope = (type, id, extra = {}) => JSON.stringify({ type, version: "v1", timestamp: new Date().toISOString(), data: { id }, ...extra });

/** Headers signed `v1a,` by `pair` (the same webhook-id on a retry when `webhookId` is given). */
function v1aHeaders(body, { pair = first, webhookId = `msg_v1a_${++seq}`, ts = now(), signature } = {}) {
  const sig = signature ?? `v1a,${cryptoSign(null, Buffer.from(`${webhookId}.${ts}.${body}`), pair.privateKey).toString("base64")}`;
  return { "content-type": "application/json", "webhook-id": webhookId, "webhook-timestamp": String(ts), "webhook-signature": sig };
}
const post = (body, headers) => w.json("/webhooks/gemini", { method: "POST", headers, body });
const sendV1a = (body, opts) => post(body, v1aHeaders(body, opts));
const sendV1 = (body) => post(body, signedHeaders(body));

const effectsFor = (key) => dest.requests.filter((r) => r.headers["idempotency-key"] === key).map((r) => JSON.parse(r.body));
const statusCallsFor = (key) => gemini.requests.filter((r) => r.url === `/v1beta/${key}`);
const rejected = () => w.events("rejected").map((e) => e.reason);

before(async () => {
  jwks = await startServer(() => ({ status: 200, body: { keys: published } }));
  dest = await startDestination(() => ({ status: 200 }));
  alerts = await startServer(() => ({ status: 200 }));
  gemini = await startServer((req) => {
    const name = req.url.replace(/^\/v1beta\//, "");
    const state = states.get(name);
    if (state === undefined) return { status: 404, body: { error: { code: 404, message: "not found", status: "NOT_FOUND" } } };
    if (typeof state === "number") return { status: state, headers: { "retry-after": "1" }, body: { error: { code: state } } };
    const t = new Date().toISOString();
    return { status: 200, body: statusAnswer(name, { state, createTime: t, updateTime: t }) };
  });
  w = await startWorker({
    EFFECT_URL: `${dest.url}/effects`,
    GEMINI_JWKS_URL: `${jwks.url}/.well-known/jwks.json`,
    GEMINI_API_BASE: gemini.url,
    GEMINI_API_KEY: "test-api-key",
    ALERT_URL: `${alerts.url}/alerts`,
    EFFECT_RETRY_BASE_SECONDS: "1",
    EFFECT_RETRY_MAX_SECONDS: "1",
    // Nudges here are confirmed again within seconds (production asks at most once a minute).
    CONFIRM_INTERVAL_SECONDS: "1",
  });
});
after(async () => {
  await w?.dispose();
  for (const s of [jwks, dest, gemini, alerts]) await s?.close();
  dest?.assertAllValid();
});

describe("v1a: Ed25519 signatures against the key set", () => {
  it("a key added to the set is picked up on a miss; within the minute after, a miss fetches nothing", async () => {
    // The durable copy (what an earlier isolate fetched) holds only the first key.
    const kv = await w.mf.getKVNamespace("OPS_KV");
    await kv.put("jwks:cache", JSON.stringify({ keys: [jwk(first, "ed-1")] }));
    states.set("batches/by-added-key", "succeeded");
    await w.register("batches/by-added-key");
    const r = await sendV1a(envelope("batch.succeeded", "batches/by-added-key"), { pair: added });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal(r.body.outcome, "confirming");
    assert.equal(jwks.requests.length, 1, "the miss fetched the set once");
    assert.deepEqual(w.events("jwks_fetched").map((e) => e.changed), [true]);
    await eventually(() => effectsFor("batches/by-added-key").length === 1, { what: "the effect" });
    // Both keys now verify, from the cache.
    for (const pair of [first, added]) {
      assert.equal((await sendV1a(envelope("batch.succeeded", "batches/by-added-key"), { pair })).status, 200);
    }
    assert.equal(jwks.requests.length, 1, "known keys: no fetch");
  });

  it("refuses a forged v1a (a key not in the set) with 401 and stores nothing; bad entries never reach the key set", async () => {
    const fetches = jwks.requests.length;
    states.set("batches/forged", "succeeded");
    const forged = await sendV1a(envelope("batch.succeeded", "batches/forged"), { pair: forger });
    assert.equal(forged.status, 401);
    assert.equal(jwks.requests.length, fetches, "the set was fetched within the minute: a miss fetches nothing");
    const body = envelope("batch.succeeded", "batches/forged");
    const good = v1aHeaders(body)["webhook-signature"];
    const sig = Buffer.from(good.slice(4), "base64");
    const cases = {
      "empty": "v1a,",
      "63 bytes": `v1a,${sig.subarray(0, 63).toString("base64")}`,
      "not base64": "v1a,!!!!",
      "signature of another body": v1aHeaders(envelope("batch.failed", "batches/forged"))["webhook-signature"],
    };
    for (const [name, signature] of Object.entries(cases)) {
      const webhookId = `msg_bad_${++seq}`;
      const r = await post(body, { ...v1aHeaders(body, { webhookId }), "webhook-signature": signature });
      assert.equal(r.status, 401, name);
    }
    // The good signature, with the body changed by one byte.
    const headers = v1aHeaders(body);
    assert.equal((await post(body.replace("succeeded", "succeedeD"), headers)).status, 401, "changed body");
    assert.equal((await w.inspect("batches/forged")).status, 404, "no record");
    assert.equal(statusCallsFor("batches/forged").length, 0, "no status call");
    assert.ok(rejected().includes("v1a_signature_invalid"), rejected().join());
    assert.equal(jwks.requests.length, fetches, "no fetch for any of them");
  });

  it("accepts a header with several entries of either kind when one is valid", async () => {
    states.set("batches/mixed", "succeeded");
    await w.register("batches/mixed");
    const body = envelope("batch.succeeded", "batches/mixed");
    const webhookId = `msg_mixed_${++seq}`;
    const ts = now();
    const forgedEd = v1aHeaders(body, { webhookId, ts, pair: forger })["webhook-signature"];
    const v1 = signedHeaders(body, { webhookId, ts })["webhook-signature"];
    // A valid v1 among bad v1a entries: an HMAC-proven event, no status call.
    const hmac = await post(body, { ...v1aHeaders(body, { webhookId, ts }), "webhook-signature": `${forgedEd} v1a, ${v1}` });
    assert.equal(hmac.status, 200, JSON.stringify(hmac.body));
    assert.equal(hmac.body.outcome, "applied");
    assert.equal(statusCallsFor("batches/mixed").length, 0);
    // A valid v1a among a bad v1 and a forged v1a: a nudge.
    await w.register("batches/mixed-2");
    states.set("batches/mixed-2", "succeeded");
    const body2 = envelope("batch.succeeded", "batches/mixed-2");
    const ed2 = v1aHeaders(body2, { webhookId, ts })["webhook-signature"];
    const r = await post(body2, { ...v1aHeaders(body2, { webhookId, ts }), "webhook-signature": `v1,AAAA ${forgedEd} ${ed2}` });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal(r.body.outcome, "confirming");
    await eventually(() => effectsFor("batches/mixed-2").length === 1, { what: "the effect" });
    assert.equal(effectsFor("batches/mixed").length, 1);
  });
});

describe("v1a: the job is ours only once the status API says so", () => {
  it("settles a registered job once, confirmed with our key; the signed body's user_metadata is the job's own", async () => {
    states.set("batches/v1a-registered", "succeeded");
    await w.register("batches/v1a-registered", "billing");
    const body = envelope("batch.succeeded", "batches/v1a-registered", { user_metadata: { job: "nightly-42" } });
    const webhookId = `msg_retry_${++seq}`;
    // Gemini's retries: the same delivery, three times, one at a time and then at once.
    const answer = await sendV1a(body, { webhookId });
    assert.equal(answer.status, 200, JSON.stringify(answer.body));
    assert.equal(answer.body.outcome, "confirming");
    const more = await Promise.all([sendV1a(body, { webhookId }), sendV1a(body, { webhookId })]);
    assert.deepEqual(more.map((r) => r.status), [200, 200]);
    const [effect] = await eventually(() => effectsFor("batches/v1a-registered").length && effectsFor("batches/v1a-registered"), { what: "the effect" });
    assert.equal(effect.status, "succeeded");
    assert.equal(effect.settled_by, "webhook");
    assert.equal(effect.kind, "billing");
    assert.deepEqual(effect.user_metadata, { job: "nightly-42" }, "signed by Google, confirmed ours by the status API");
    assert.equal(effect.unverified_user_metadata, undefined);
    assert.equal(statusCallsFor("batches/v1a-registered")[0].headers["x-goog-api-key"], "test-api-key");
    const { body: op } = await w.inspect("batches/v1a-registered");
    assert.equal(op.history.find((h) => h.what === "nudged").delivery_id, webhookId, "the webhook-id is signed: it names the delivery");
    await sendV1a(body);
    assert.equal(effectsFor("batches/v1a-registered").length, 1, "settled once");
  });

  it("settles a job known only through v1a deliveries once, after the status API confirms it is ours", async () => {
    states.set("batches/v1a-only", "succeeded");
    const body = envelope("batch.succeeded", "batches/v1a-only", { user_metadata: { tenant: "acme" } });
    const webhookId = `msg_only_${++seq}`;
    const r = await sendV1a(body, { webhookId });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal(r.body.outcome, "applied", "created from the status API's answer");
    assert.equal(statusCallsFor("batches/v1a-only").length, 1);
    const again = await sendV1a(body, { webhookId });
    assert.equal(again.status, 200);
    assert.equal(again.body.outcome, "dropped");
    const [effect] = await eventually(() => effectsFor("batches/v1a-only").length && effectsFor("batches/v1a-only"), { what: "the effect" });
    assert.equal(effect.status, "succeeded");
    assert.equal(effect.settled_by, "webhook");
    assert.deepEqual(effect.user_metadata, { tenant: "acme" });
    assert.equal(statusCallsFor("batches/v1a-only").length, 1, "the record answers the retry: no second status call");
    assert.equal(effectsFor("batches/v1a-only").length, 1);
  });

  it("a signed body for a name that is not ours creates nothing and spends no more than the strangers' bound", async () => {
    // Google signed it (for a job of another project): our key gets 404, or 403.
    states.set("batches/theirs-403", 403);
    const strangers = ["batches/theirs-404", "batches/theirs-403"];
    for (const name of strangers) {
      const body = envelope("batch.succeeded", name, { user_metadata: { tenant: "attacker" } });
      const webhookId = `msg_theirs_${++seq}`;
      // Replayed five times within the signature's window, two at once.
      for (let i = 0; i < 5; i += 1) {
        const answers = await Promise.all([sendV1a(body, { webhookId }), sendV1a(body, { webhookId })]);
        for (const a of answers) {
          assert.equal(a.status, 200, JSON.stringify(a.body));
          assert.equal(a.body.outcome, "not_held");
        }
      }
      assert.equal((await w.inspect(name)).status, 404, `${name}: no record`);
      const calls = statusCallsFor(name).length;
      assert.ok(calls >= 1 && calls <= 2, `${name}: ${calls} status calls for 10 deliveries (asked once, twice at most for the first concurrent pair)`);
    }
    // Once answered "not ours", a name is not asked about again for a minute.
    const asked = statusCallsFor("batches/theirs-404").length;
    await sendV1a(envelope("batch.succeeded", "batches/theirs-404"));
    assert.equal(statusCallsFor("batches/theirs-404").length, asked);
    assert.deepEqual((await w.kvList("")).map((k) => k.name).filter((n) => n.includes("theirs")), [], "no KV entry");
    assert.equal(effectsFor("batches/theirs-404").length + effectsFor("batches/theirs-403").length, 0);
  });

  it("answers 503 while the status API cannot say, and settles once it can", async () => {
    states.set("batches/v1a-api-down", 503);
    const body = envelope("batch.succeeded", "batches/v1a-api-down");
    const webhookId = `msg_down_${++seq}`;
    const down = await sendV1a(body, { webhookId });
    assert.equal(down.status, 503, "Gemini retries");
    assert.ok(rejected().includes("v1a_status_unavailable"), rejected().join());
    assert.equal((await w.inspect("batches/v1a-api-down")).status, 404, "nothing stored meanwhile");
    states.set("batches/v1a-api-down", "succeeded");
    // Gemini's retry, once the status budget's backoff has passed.
    const retried = await eventually(async () => {
      const r = await sendV1a(body, { webhookId });
      return r.status === 200 && r;
    }, { what: "the retry accepted", everyMs: 1000, timeoutMs: 90_000 });
    assert.equal(retried.body.outcome, "applied");
    await eventually(() => effectsFor("batches/v1a-api-down").length === 1, { what: "the effect" });
  });
});

describe("every event a public source names, signed v1 and v1a", () => {
  // type, collection, the status the stand-in answers, the status the effect carries.
  const cases = [
    ["batch.cancelled", "batches", "cancelled", "cancelled"],
    ["interaction.cancelled", "interactions", "cancelled", "cancelled"],
    ["batch.completed", "batches", "succeeded", "succeeded"],
  ];
  for (const scheme of ["v1", "v1a"]) {
    for (const [type, collection, state, settled] of cases) {
      it(`${type} signed ${scheme} settles as ${settled}`, async () => {
        const name = `${collection}/ev-${scheme}-${type.replace(".", "-")}`;
        states.set(name, state);
        const body = envelope(type, name);
        const r = scheme === "v1" ? await sendV1(body) : await sendV1a(body);
        assert.equal(r.status, 200, JSON.stringify(r.body));
        assert.equal(r.body.outcome, "applied");
        const [effect] = await eventually(() => effectsFor(name).length && effectsFor(name), { what: "the effect" });
        assert.equal(effect.status, settled);
        assert.equal(effectsFor(name).length, 1);
      });
    }
    it(`batch.completed signed ${scheme} settles as the status says`, async () => {
      // An HMAC-signed body is our own proof (batch.completed reads as succeeded); a
      // v1a-signed one is Google's word for a job of any project: the status API's answer wins.
      const name = `batches/completed-but-failed-${scheme}`;
      states.set(name, "failed");
      await w.register(name);
      const body = envelope("batch.completed", name);
      const r = scheme === "v1" ? await sendV1(body) : await sendV1a(body);
      assert.equal(r.status, 200, JSON.stringify(r.body));
      const [effect] = await eventually(() => effectsFor(name).length && effectsFor(name), { what: "the effect" });
      assert.equal(effect.status, scheme === "v1" ? "succeeded" : "failed");
    });
    it(`an unknown type signed ${scheme} is acknowledged and runs nothing`, async () => {
      const name = `batches/unknown-type-${scheme}`;
      states.set(name, "succeeded");
      const body = envelope("batch.exploded", name);
      const r = scheme === "v1" ? await sendV1(body) : await sendV1a(body);
      assert.equal(r.status, 200, JSON.stringify(r.body));
      assert.equal(r.body.outcome, "ignored_unknown_type");
      assert.equal((await w.inspect(name)).status, 404);
      assert.equal(statusCallsFor(name).length, 0);
      assert.equal(effectsFor(name).length, 0);
    });
  }
  it("interaction.requires_action sends the destination nothing until the interaction ends", async () => {
    const name = "interactions/needs-a-tool";
    await w.register(name);
    const r = await sendV1(envelope("interaction.requires_action", name));
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal((await w.inspect(name)).body.status, "requires_action");
    states.set(name, "succeeded");
    await sendV1(envelope("interaction.completed", name));
    const effects = await eventually(() => effectsFor(name).length && effectsFor(name), { what: "the effect" });
    assert.deepEqual(effects.map((e) => e.status), ["succeeded"], "one effect, when it ended");
  });
});
