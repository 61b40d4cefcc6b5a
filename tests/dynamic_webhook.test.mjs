// Dynamic (per-job) webhooks: RS256 JWTs in webhook-signature, verified against a key set
// served by a local stand-in for Gemini's JWKS endpoint, signed with a locally made RSA key.
// A token proves only that Google sent something (anyone who runs a Gemini job receives
// valid tokens), so the body is a nudge: for an operation the worker holds, the gate asks a
// local stand-in for Gemini's status API and applies what that says; nothing in a token is
// verified metadata.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { createHmac, generateKeyPairSync, sign as rsaSign } from "node:crypto";
import { createServer } from "node:http";
import { startWorker, startServer, startDestination, eventually } from "./helpers.mjs";

const AUDIENCE = "gemini-once-test";
const { privateKey, publicKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
const other = generateKeyPairSync("rsa", { modulusLength: 2048 });
const jwk = { ...publicKey.export({ format: "jwk" }), kid: "k1", alg: "RS256", use: "sig" };

let jwks, dest, gemini, alerts, w;
let jwksUp = true;
/** What the status API answers, per path: a batch state name, or an HTTP status to fail with. */
const states = new Map();
const b64u = (v) => Buffer.from(typeof v === "string" ? v : JSON.stringify(v)).toString("base64url");

function jwt(claims, { header = { alg: "RS256", kid: "k1", typ: "JWT" }, key = privateKey } = {}) {
  const input = `${b64u(header)}.${b64u(claims)}`;
  return `${input}.${rsaSign("sha256", Buffer.from(input), key).toString("base64url")}`;
}

const now = () => Math.floor(Date.now() / 1000);
const goodClaims = (extra = {}) => ({ iss: "https://generativelanguage.googleapis.com", aud: AUDIENCE, exp: now() + 300, ...extra });

function deliverTo(worker, type, id, token, data = {}) {
  const body = JSON.stringify({ type, version: "v1", timestamp: new Date().toISOString(), data: { id, ...data } });
  return worker.json("/webhooks/gemini", {
    method: "POST",
    headers: { "content-type": "application/json", "webhook-id": `msg_jwt_${Math.random()}`, "webhook-timestamp": String(now()), "webhook-signature": token },
    body,
  });
}
const deliver = (...args) => deliverTo(w, ...args);

/** A batch as Gemini's status API returns it. */
function batchAnswer(path, state) {
  const done = ["SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED"].includes(state);
  return {
    name: path.replace("/v1beta/", ""),
    metadata: { state: `BATCH_STATE_${state}`, updateTime: new Date().toISOString(), ...(state === "SUCCEEDED" ? { output: { responsesFile: "files/out-1" } } : {}) },
    done,
    ...(state === "FAILED" ? { error: { code: 13, message: "internal" } } : {}),
  };
}

const effectsFor = (key) => dest.requests.filter((r) => r.headers["idempotency-key"] === key).map((r) => JSON.parse(r.body));
const statusCallsFor = (key) => gemini.requests.filter((r) => r.url === `/v1beta/${key}`);

before(async () => {
  jwks = await startServer(() => (jwksUp ? { status: 200, body: { keys: [jwk] } } : { status: 503, body: "down" }));
  dest = await startDestination(() => ({ status: 200 }));
  alerts = await startServer(() => ({ status: 200 }));
  gemini = await startServer((req) => {
    const state = states.get(req.url);
    if (state === undefined) return { status: 404, body: { error: { code: 404, message: "not found" } } };
    if (typeof state === "number") return { status: state, headers: { "retry-after": "1" }, body: { error: { code: state } } };
    return { status: 200, body: batchAnswer(req.url, state) };
  });
  w = await startWorker({
    EFFECT_URL: `${dest.url}/effects`,
    GEMINI_JWKS_URL: `${jwks.url}/.well-known/jwks.json`,
    GEMINI_JWT_AUDIENCE: AUDIENCE,
    GEMINI_API_BASE: gemini.url,
    GEMINI_API_KEY: "test-api-key",
    ALERT_URL: `${alerts.url}/alerts`,
    EFFECT_RETRY_BASE_SECONDS: "1",
    // Nudges here are confirmed again within seconds (production asks at most once a minute).
    CONFIRM_INTERVAL_SECONDS: "1",
    EFFECT_RETRY_MAX_SECONDS: "1",
  });
});
after(async () => {
  await w?.dispose();
  for (const s of [jwks, dest, gemini, alerts]) await s?.close();
  dest?.assertAllValid();
});

describe("dynamic webhooks: a token is a nudge, the status API decides", () => {
  it("confirms a valid delivery with the status API; the token's user_metadata is only unverified", async () => {
    states.set("/v1beta/batches/dyn1", "SUCCEEDED");
    await w.register("batches/dyn1");
    const r = await deliver("batch.succeeded", "batches/dyn1", jwt(goodClaims({ user_metadata: { job: "nightly-42" } })));
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal(r.body.outcome, "confirming", "answered before the status API is asked");
    const [effect] = await eventually(() => effectsFor("batches/dyn1").length && effectsFor("batches/dyn1"), { what: "the effect" });
    assert.equal(effect.status, "succeeded");
    assert.equal(effect.settled_by, "webhook");
    assert.equal(effect.user_metadata, undefined, "nothing binds a token's claims to the operation");
    assert.deepEqual(effect.unverified_user_metadata, { job: "nightly-42" });
    assert.equal(statusCallsFor("batches/dyn1")[0].headers["x-goog-api-key"], "test-api-key");
    const { body } = await w.inspect("batches/dyn1");
    const nudged = body.history.find((h) => h.what === "nudged");
    assert.match(nudged.delivery_id, /^jwt_[0-9a-f]{32}$/, "keyed by a hash of the signed token, not the unsigned webhook-id");
  });

  it("a token replayed with a forged body applies nothing the status API contradicts; the genuine outcome still arrives once", async () => {
    states.set("/v1beta/batches/victim", "RUNNING");
    await w.register("batches/victim", "billing");
    // An attacker's own job gave them a valid token; they replay it with a body about our operation.
    const stolen = jwt(goodClaims());
    const forged = await deliver("batch.failed", "batches/victim", stolen, { error_code: 13, error_message: "forged" });
    assert.equal(forged.status, 200);
    assert.equal(forged.body.outcome, "confirming");
    await eventually(async () => (await w.inspect("batches/victim")).body.status === "running", { what: "the API's word applied" });
    assert.equal(effectsFor("batches/victim").length, 0, "no effect from a forged outcome");
    // Gemini finishes the job for real; its genuine (dynamic) webhook arrives.
    states.set("/v1beta/batches/victim", "SUCCEEDED");
    const genuine = await deliver("batch.succeeded", "batches/victim", jwt(goodClaims()));
    assert.equal(genuine.status, 200);
    await eventually(() => effectsFor("batches/victim").length === 1, { what: "the genuine effect" });
    await deliver("batch.failed", "batches/victim", stolen); // and the forgery again, now on a terminal operation
    const op = (await w.inspect("batches/victim")).body;
    assert.equal(op.status, "succeeded");
    assert.equal(op.effect_done, true);
    const effects = effectsFor("batches/victim");
    assert.equal(effects.length, 1);
    assert.equal(effects[0].status, "succeeded");
    assert.equal(effects[0].kind, "billing");
    assert.ok(!JSON.stringify(effects[0]).includes("forged"), "nothing of the forged body reaches the destination");
  });

  it("for a name nobody registered, stores nothing and asks nothing, whatever the status API would say", async () => {
    states.set("/v1beta/batches/dyn-unregistered", "SUCCEEDED");
    const r = await deliver("batch.succeeded", "batches/dyn-unregistered", jwt(goodClaims({ user_metadata: { job: "n-7" } })));
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal(r.body.outcome, "not_held");
    assert.equal(statusCallsFor("batches/dyn-unregistered").length, 0, "no status call");
    assert.equal((await w.inspect("batches/dyn-unregistered")).status, 404, "nothing stored");
    assert.equal(effectsFor("batches/dyn-unregistered").length, 0);
  });

  it("answers 2xx while the status API is down and applies the outcome once it answers", async () => {
    states.set("/v1beta/batches/api-down", 503);
    await w.register("batches/api-down");
    const r = await deliver("batch.succeeded", "batches/api-down", jwt(goodClaims()));
    assert.equal(r.status, 200);
    assert.equal(r.body.outcome, "confirming");
    await eventually(() => statusCallsFor("batches/api-down").length >= 1, { what: "a first status call" });
    assert.equal(effectsFor("batches/api-down").length, 0);
    assert.equal((await w.inspect("batches/api-down")).body.confirming, true, "the nudge is kept");
    states.set("/v1beta/batches/api-down", "SUCCEEDED");
    await eventually(() => effectsFor("batches/api-down").length === 1, { what: "the effect after the API recovered" });
    assert.ok(statusCallsFor("batches/api-down").length >= 2, "asked again from the gate's alarm");
  });

  it("forwards metadata found only in the body as unverified_user_metadata", async () => {
    states.set("/v1beta/batches/meta-body", "SUCCEEDED");
    await w.register("batches/meta-body");
    await deliver("batch.succeeded", "batches/meta-body", jwt(goodClaims()), { user_metadata: { tenant: "acme" } });
    const [effect] = await eventually(() => effectsFor("batches/meta-body").length && effectsFor("batches/meta-body"), { what: "the effect" });
    assert.equal(effect.user_metadata, undefined, "never presented as verified");
    assert.deepEqual(effect.unverified_user_metadata, { tenant: "acme" });
  });

  it("a 404 from the status API applies nothing and alerts unknown_to_gemini once", async () => {
    await w.register("batches/never-existed");
    const token = jwt(goodClaims());
    assert.equal((await deliver("batch.succeeded", "batches/never-existed", token)).status, 200);
    assert.equal((await deliver("batch.succeeded", "batches/never-existed", token)).status, 200);
    await eventually(() => alerts.requests.some((r) => JSON.parse(r.body).key === "batches/never-existed"), { what: "the alert" });
    const op = await eventually(async () => {
      const o = (await w.inspect("batches/never-existed")).body;
      return !o.confirming && o;
    }, { what: "the confirmation to end" });
    assert.equal(op.status, "pending");
    assert.equal(effectsFor("batches/never-existed").length, 0);
    const sent = alerts.requests.filter((r) => JSON.parse(r.body).key === "batches/never-existed");
    assert.equal(sent.length, 1);
    assert.equal(JSON.parse(sent[0].body).alert, "unknown_to_gemini");
    assert.match(sent[0].headers["alert-id"], /^alert_/);
  });

  it("counts and logs an unusable body without keeping it: it is unproven", async () => {
    const token = jwt(goodClaims());
    const headers = { "content-type": "application/json", "webhook-id": "msg_jwt_junk", "webhook-timestamp": String(now()), "webhook-signature": token };
    const notJson = await w.json("/webhooks/gemini", { method: "POST", headers, body: "not json" });
    assert.equal(notJson.status, 400);
    const unknown = await deliver("batch.exploded", "batches/junk", token);
    assert.equal(unknown.status, 200);
    assert.equal(unknown.body.outcome, "ignored_unknown_type");
    assert.deepEqual(await w.kvList("dead:"), [], "no dead letters from unproven bodies");
    const reasons = new Set(w.events("rejected").map((e) => e.reason));
    assert.ok(reasons.has("jwt_body_not_envelope") && reasons.has("jwt_unknown_event_type"), [...reasons].join());
  });

  it("refuses malformed, forged, expired and endless tokens with 401", async () => {
    const input = `${b64u({ alg: "HS256", kid: "k1" })}.${b64u(goodClaims())}`;
    const pem = publicKey.export({ format: "pem", type: "spki" });
    const hsWithPublicKey = `${input}.${createHmac("sha256", pem).update(input).digest("base64url")}`;
    const valid = jwt(goodClaims());
    const [h, c, s] = valid.split(".");
    const { exp, ...noExp } = goodClaims();
    const cases = {
      "alg none": `${b64u({ alg: "none", kid: "k1" })}.${b64u(goodClaims())}.`,
      "alg none with signature": `${b64u({ alg: "none", kid: "k1" })}.${b64u(goodClaims())}.${s}`,
      "HS256 with the public key as secret": hsWithPublicKey,
      "missing kid": jwt(goodClaims(), { header: { alg: "RS256" } }),
      "expired": jwt(goodClaims({ exp: now() - 120 })),
      "no exp": jwt(noExp),
      "not yet valid": jwt(goodClaims({ nbf: now() + 600 })),
      "issued in the future": jwt(goodClaims({ iat: now() + 600 })),
      "wrong audience": jwt(goodClaims({ aud: "someone-else" })),
      "no audience": jwt({ exp: now() + 300 }),
      "bad base64url": `${h}.${c}.${s.slice(0, -2)}+/`,
      "tampered claims": `${h}.${b64u(goodClaims({ aud: AUDIENCE, exp: now() + 999 }))}.${s}`,
      "signed by another key": jwt(goodClaims(), { key: other.privateKey }),
      "two parts": `${h}.${c}`,
    };
    for (const [name, token] of Object.entries(cases)) {
      const r = await deliver("batch.succeeded", `batches/forged-${name.replace(/\W+/g, "-")}`, token);
      assert.equal(r.status, 401, name);
    }
    for (const name of Object.keys(cases)) {
      assert.equal((await w.inspect(`batches/forged-${name.replace(/\W+/g, "-")}`)).status, 404, `${name}: no record`);
    }
    const reasons = new Set(w.events("rejected").map((e) => e.reason));
    for (const label of ["jwt_alg", "jwt_missing_kid", "jwt_expired", "jwt_not_yet_valid", "jwt_audience", "jwt_signature_invalid", "jwt_base64"]) {
      assert.ok(reasons.has(label), `${label} in ${[...reasons]}`);
    }
  });

  it("caches the key set: no fetch for a known kid, 401 for a kid absent from a fresh set, cached keys serve while the endpoint is down", async () => {
    states.set("/v1beta/batches/cached0", "SUCCEEDED");
    const fetchesBefore = jwks.requests.length;
    for (let i = 0; i < 3; i++) assert.equal((await deliver("batch.succeeded", `batches/cached${i}`, jwt(goodClaims()))).status, 200);
    assert.equal(jwks.requests.length, fetchesBefore, "known kid: no fetch");
    const unknown = await deliver("batch.succeeded", "batches/unknown-a", jwt(goodClaims(), { header: { alg: "RS256", kid: "kX" } }));
    assert.equal(unknown.status, 401, "the set was fetched a moment ago: the kid is not Google's");
    jwksUp = false;
    const r = await deliver("batch.succeeded", "batches/while-down", jwt(goodClaims()));
    assert.equal(r.status, 200, "cached keys keep serving");
    jwksUp = true;
  });

  it("still accepts HMAC deliveries on the same endpoint, as proven events", async () => {
    const r = await w.deliver("batch.succeeded", "batches/hmac-too");
    assert.equal(r.status, 200);
    assert.equal(r.body.outcome, "applied");
    await eventually(() => effectsFor("batches/hmac-too").length === 1, { what: "the effect" });
    assert.equal(statusCallsFor("batches/hmac-too").length, 0, "a signed body needs no confirmation");
  });
});

describe("dynamic webhooks: key set refresh and switch", () => {
  it("answers 503 with Retry-After while an unknown kid's key set cannot be fetched, then accepts once it can", async () => {
    let up = false;
    const keys = await startServer(() => (up ? { status: 200, body: { keys: [jwk] } } : { status: 500, body: "down" }));
    const worker = await startWorker({ EFFECT_URL: `${dest.url}/effects`, GEMINI_JWKS_URL: `${keys.url}/jwks`, GEMINI_API_BASE: gemini.url, GEMINI_API_KEY: "k" });
    try {
      states.set("/v1beta/batches/refresh1", "SUCCEEDED");
      const token = jwt(goodClaims({ aud: undefined }));
      const first = await worker.fetch("/webhooks/gemini", {
        method: "POST",
        headers: { "content-type": "application/json", "webhook-id": "m1", "webhook-timestamp": String(now()), "webhook-signature": token },
        body: JSON.stringify({ type: "batch.succeeded", data: { id: "batches/refresh1" } }),
      });
      assert.equal(first.status, 503);
      assert.ok(Number(first.headers.get("retry-after")) >= 1, `retry-after: ${first.headers.get("retry-after")}`);
      await first.text();
      up = true;
      const accepted = await eventually(async () => {
        const r = await deliverTo(worker, "batch.succeeded", "batches/refresh1", token);
        return r.status === 200 && r;
      }, { what: "acceptance once the key set refreshes", everyMs: 1000 });
      assert.equal(accepted.body.outcome, "not_held", "verified, and unregistered: nothing stored");
      const absent = await deliverTo(worker, "batch.succeeded", "batches/refresh2", jwt(goodClaims(), { header: { alg: "RS256", kid: "k-absent" } }));
      assert.equal(absent.status, 401, "a kid absent from a freshly fetched set");
      const kv = await worker.kv();
      assert.ok(await kv.get("jwks:cache"), "the fetched set is kept in KV");
    } finally {
      await worker.dispose();
      await keys.close();
    }
  });

  it("refuses a key set answered past its cap while it streams: 503 with Retry-After, the failure said, the answer cut", async () => {
    // A key set that starts well and never ends.
    let cutAfter;
    const keys = createServer((req, res) => {
      res.writeHead(200, { "content-type": "application/json" });
      res.write(`{"keys":[${JSON.stringify(jwk)}],"pad":"`);
      const chunk = "p".repeat(16 * 1024);
      let sent = 0;
      res.on("close", () => { cutAfter = sent; });
      const pump = () => {
        while (!res.destroyed) {
          sent += chunk.length;
          if (!res.write(chunk)) return res.once("drain", pump);
        }
      };
      pump();
    });
    await new Promise((r) => keys.listen(0, "127.0.0.1", r));
    const worker = await startWorker({ EFFECT_URL: `${dest.url}/effects`, GEMINI_JWKS_URL: `http://127.0.0.1:${keys.address().port}/jwks`, GEMINI_API_BASE: gemini.url, GEMINI_API_KEY: "k" });
    try {
      const r = await deliverTo(worker, "batch.succeeded", "batches/bigkeys1", jwt(goodClaims({ aud: undefined })));
      assert.equal(r.status, 503, JSON.stringify(r.body));
      // Refused at the cap (the reason below), not at the key set's 5 s timeout.
      const failed = worker.events("jwks_fetch_failed").at(-1);
      assert.match(failed?.error ?? "", /^200: body over 262144 bytes/, JSON.stringify(failed));
      await eventually(() => cutAfter !== undefined, { what: "the key set's answer cut" });
      assert.ok(cutAfter < 64 * 1024 * 1024, `${cutAfter} bytes written before the cut`);
      const kv = await worker.kv();
      assert.equal(await kv.get("jwks:cache"), null, "nothing of it kept");
    } finally {
      await worker.dispose();
      keys.closeAllConnections?.();
      await new Promise((r) => keys.close(r));
    }
  });

  it("DYNAMIC_WEBHOOKS=false refuses every JWT-shaped signature with 401 and fetches no key", async () => {
    const keys = await startServer(() => ({ status: 200, body: { keys: [jwk] } }));
    const worker = await startWorker({ DYNAMIC_WEBHOOKS: "false", GEMINI_JWKS_URL: `${keys.url}/jwks` });
    try {
      const r = await deliverTo(worker, "batch.succeeded", "batches/off1", jwt(goodClaims()));
      assert.equal(r.status, 401);
      assert.equal(keys.requests.length, 0);
      assert.equal((await worker.deliver("batch.succeeded", "batches/off2")).status, 200, "HMAC still works");
      assert.ok(worker.events("rejected").some((e) => e.reason === "dynamic_webhooks_disabled"));
    } finally {
      await worker.dispose();
      await keys.close();
    }
  });
});
