// The signing keys of the local Gemini stand-in: an Ed25519 key (for `v1a,` signatures, as
// live dynamic-webhook deliveries are signed) and an RSA key (for RS256 tokens, the docs'
// form). `npm run gemini-stub` publishes their public halves as a key set at
// /.well-known/jwks.json; `npm run send -- --scheme v1a|jwt` signs with the private halves.
//
// They are made on first use and kept in `.gemini-stub-keys.json` (readable by you only, not
// tracked; GEMINI_STUB_KEYS names another file), so the stub and `send` agree across runs. They are for this machine only: a worker
// whose GEMINI_JWKS_URL is the stub's trusts whoever holds that file, so a deployed worker keeps
// the default (Google's key set).
import { createPrivateKey, createPublicKey, generateKeyPairSync, sign as cryptoSign } from "node:crypto";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { ROOT } from "./dev_vars.mjs";

export const KEYS_FILE = process.env.GEMINI_STUB_KEYS || path.join(ROOT, ".gemini-stub-keys.json");
/** The key ids the stand-in's key set names. */
export const ED25519_KID = "local-ed25519";
export const RSA_KID = "local-rs256";

/** The stand-in's private keys as JWKs ({ed25519, rsa}), made and kept on first use. */
export function localKeys(file = KEYS_FILE) {
  if (existsSync(file)) return JSON.parse(readFileSync(file, "utf8"));
  const make = (type, options) => generateKeyPairSync(type, options).privateKey.export({ format: "jwk" });
  const keys = { ed25519: make("ed25519"), rsa: make("rsa", { modulusLength: 2048 }) };
  writeFileSync(file, JSON.stringify(keys, null, 2) + "\n", { mode: 0o600 });
  return keys;
}

/** The public key set of `keys`, as Gemini publishes one (Ed25519 keys first, as reported live). */
export function keySet(keys = localKeys()) {
  const pub = (jwk) => createPublicKey(createPrivateKey({ key: jwk, format: "jwk" })).export({ format: "jwk" });
  return {
    keys: [
      { ...pub(keys.ed25519), kid: ED25519_KID, alg: "EdDSA", use: "sig" },
      { ...pub(keys.rsa), kid: RSA_KID, alg: "RS256", use: "sig" },
    ],
  };
}

/** A `v1a,` entry: Ed25519 over `{id}.{timestamp}.{body}` (Standard Webhooks' asymmetric scheme). */
export function signV1a(ed25519Jwk, id, timestamp, body) {
  const key = createPrivateKey({ key: ed25519Jwk, format: "jwk" });
  return `v1a,${cryptoSign(null, Buffer.from(`${id}.${timestamp}.${body}`), key).toString("base64")}`;
}

/** A compact RS256 token with `claims`, signed by `rsaJwk` under `kid`. */
export function signJwt(rsaJwk, claims, kid = RSA_KID) {
  const b64u = (v) => Buffer.from(JSON.stringify(v)).toString("base64url");
  const input = `${b64u({ alg: "RS256", kid, typ: "JWT" })}.${b64u(claims)}`;
  const key = createPrivateKey({ key: rsaJwk, format: "jwk" });
  return `${input}.${cryptoSign("sha256", Buffer.from(input), key).toString("base64url")}`;
}
