// Dynamic (per-job) webhooks: RS256 JWTs in webhook-signature, verified against a key set
// served by a local stand-in for Gemini's JWKS endpoint, signed with a locally made RSA key.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { createHmac, generateKeyPairSync, sign as rsaSign } from "node:crypto";
import { startWorker, startServer, startDestination, assertEffectValid } from "./helpers.mjs";

const AUDIENCE = "gemini-once-test";
const { privateKey, publicKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
const other = generateKeyPairSync("rsa", { modulusLength: 2048 });
const jwk = { ...publicKey.export({ format: "jwk" }), kid: "k1", alg: "RS256", use: "sig" };

let jwks, dest, w;
let jwksUp = true;
const b64u = (v) => Buffer.from(typeof v === "string" ? v : JSON.stringify(v)).toString("base64url");

function jwt(claims, { header = { alg: "RS256", kid: "k1", typ: "JWT" }, key = privateKey } = {}) {
  const input = `${b64u(header)}.${b64u(claims)}`;
  return `${input}.${rsaSign("sha256", Buffer.from(input), key).toString("base64url")}`;
}

const now = () => Math.floor(Date.now() / 1000);
const goodClaims = (extra = {}) => ({ iss: "https://generativelanguage.googleapis.com", aud: AUDIENCE, exp: now() + 300, ...extra });

function deliver(type, id, token, data = {}) {
  const body = JSON.stringify({ type, version: "v1", timestamp: new Date().toISOString(), data: { id, ...data } });
  return w.json("/webhooks/gemini", {
    method: "POST",
    headers: { "content-type": "application/json", "webhook-id": `msg_jwt_${Math.random()}`, "webhook-timestamp": String(now()), "webhook-signature": token },
    body,
  });
}

const effectsFor = (key) => dest.requests.filter((r) => r.headers["idempotency-key"] === key);

before(async () => {
  jwks = await startServer(() => (jwksUp ? { status: 200, body: { keys: [jwk] } } : { status: 503, body: "down" }));
  dest = await startDestination(() => ({ status: 200 }));
  w = await startWorker({ EFFECT_URL: `${dest.url}/effects`, GEMINI_JWKS_URL: `${jwks.url}/.well-known/jwks.json`, GEMINI_JWT_AUDIENCE: AUDIENCE });
});
after(async () => {
  await w?.dispose();
  await jwks?.close();
  await dest?.close();
  dest?.assertAllValid();
});

describe("dynamic webhooks", () => {
  it("accepts a valid RS256 delivery and carries user_metadata to the side effect", async () => {
    const r = await deliver("batch.succeeded", "batches/dyn1", jwt(goodClaims({ user_metadata: { job: "nightly-42" } })));
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal(r.body.outcome, "applied");
    const [effect] = effectsFor("batches/dyn1");
    assert.deepEqual(assertEffectValid(effect.body).user_metadata, { job: "nightly-42" });
  });

  it("refuses malformed, forged and expired tokens with 401", async () => {
    const input = `${b64u({ alg: "HS256", kid: "k1" })}.${b64u(goodClaims())}`;
    const pem = publicKey.export({ format: "pem", type: "spki" });
    const hsWithPublicKey = `${input}.${createHmac("sha256", pem).update(input).digest("base64url")}`;
    const valid = jwt(goodClaims());
    const [h, c, s] = valid.split(".");
    const cases = {
      "alg none": `${b64u({ alg: "none", kid: "k1" })}.${b64u(goodClaims())}.`,
      "alg none with signature": `${b64u({ alg: "none", kid: "k1" })}.${b64u(goodClaims())}.${s}`,
      "HS256 with the public key as secret": hsWithPublicKey,
      "missing kid": jwt(goodClaims(), { header: { alg: "RS256" } }),
      "unknown kid": jwt(goodClaims(), { header: { alg: "RS256", kid: "k9" } }),
      "expired": jwt(goodClaims({ exp: now() - 120 })),
      "not yet valid": jwt(goodClaims({ nbf: now() + 600 })),
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
    for (const name of Object.keys(cases)) assert.equal(effectsFor(`batches/forged-${name.replace(/\W+/g, "-")}`).length, 0, name);
    const reasons = new Set(w.events("rejected").map((e) => e.reason));
    for (const label of ["jwt_alg", "jwt_missing_kid", "jwt_unknown_kid", "jwt_expired", "jwt_audience", "jwt_signature_invalid", "jwt_base64"]) {
      assert.ok(reasons.has(label), `${label} in ${[...reasons]}`);
    }
  });

  it("caches the key set, refetches on an unknown kid at most once a minute, and serves from cache when the endpoint is down", async () => {
    const fetchesBefore = jwks.requests.length;
    for (let i = 0; i < 5; i++) assert.equal((await deliver("batch.succeeded", `batches/cached${i}`, jwt(goodClaims()))).status, 200);
    assert.equal(jwks.requests.length, fetchesBefore, "known kid: no fetch");
    await deliver("batch.succeeded", "batches/unknown-a", jwt(goodClaims(), { header: { alg: "RS256", kid: "kX" } }));
    await deliver("batch.succeeded", "batches/unknown-b", jwt(goodClaims(), { header: { alg: "RS256", kid: "kY" } }));
    assert.ok(jwks.requests.length - fetchesBefore <= 1, "unknown kids refetch at most once a minute");
    jwksUp = false;
    const r = await deliver("batch.succeeded", "batches/while-down", jwt(goodClaims()));
    assert.equal(r.status, 200, "cached keys keep serving");
    jwksUp = true;
  });

  it("still accepts HMAC deliveries on the same endpoint", async () => {
    const r = await w.deliver("batch.succeeded", "batches/hmac-too");
    assert.equal(r.status, 200);
    assert.equal(effectsFor("batches/hmac-too").length, 1);
  });
});
