#!/usr/bin/env node
// Signs and sends a Gemini-shaped webhook delivery, the way Gemini does, to a local or
// deployed worker: by default a project webhook's (Standard Webhooks `v1,` HMAC-SHA256 over
// "{webhook-id}.{webhook-timestamp}.{body}" with your secret); `--scheme v1a` as live dynamic
// webhooks are signed (`v1a,` Ed25519 over the same bytes); `--scheme jwt` as Gemini's docs
// describe dynamic webhooks (an RS256 token). The last two sign with the local Gemini
// stand-in's keys (scripts/gemini_keys.mjs), which `npm run gemini-stub` publishes at
// /.well-known/jwks.json: the worker must have GEMINI_JWKS_URL set to it.
//
//   npm run send -- <event-type> <operation-name> [--url URL] [--secret whsec_...]
//                   [--scheme v1|v1a|jwt] [--data JSON] [--repeat N] [--concurrency N]
//                   [--fresh-ids] [--token TOKEN]
//
// --repeat sends the same delivery (same webhook-id, as Gemini's retries do) N times;
// --fresh-ids gives each send its own webhook-id (the same completion delivered anew);
// --concurrency sends up to N at once. The secret defaults to the first one in .dev.vars.
//
// Then it tells whether the side effect reached the destination: from the answers, and, with
// a token that may read an operation (--token; for a worker on this machine, the read token
// of .dev.vars, READ_TOKENS, else its ADMIN_TOKEN), from the operation's record a moment later
// (GET /v1/operations/{name}), with a hint when the attempt failed (e.g. nothing listens at
// EFFECT_URL). --admin-token is the same as --token.
import { createHmac, randomBytes } from "node:crypto";
import { fileURLToPath } from "node:url";
import path from "node:path";
import { accessHeaders, devVars, isLoopback, localWorker, DEMO_EFFECT_URL } from "./dev_vars.mjs";
import { localKeys, signJwt, signV1a } from "./gemini_keys.mjs";

const USAGE = "usage: npm run send -- <event-type> <operation-name> [--url URL] [--secret whsec_...] [--scheme v1|v1a|jwt] [--data JSON] [--repeat N] [--concurrency N] [--fresh-ids] [--token TOKEN]";
const SCHEMES = ["v1", "v1a", "jwt"];

function fail(message) {
  console.error(`send: ${message}\n${USAGE}`);
  process.exit(2);
}

function parseArgs(argv) {
  // The local worker: the address a running `npm start` wrote, else http://127.0.0.1:8787.
  const opts = { url: `${localWorker().url}/webhooks/gemini`, repeat: 1, concurrency: 1, freshIds: false, data: {}, scheme: "v1" };
  const positional = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const value = () => (i + 1 < argv.length ? argv[++i] : fail(`${arg} needs a value`));
    if (arg === "--url") opts.url = value();
    else if (arg === "--secret") opts.secret = value();
    else if (arg === "--scheme") opts.scheme = value();
    else if (arg === "--repeat") opts.repeat = Number(value());
    else if (arg === "--concurrency") opts.concurrency = Number(value());
    else if (arg === "--fresh-ids") opts.freshIds = true;
    else if (arg === "--token" || arg === "--admin-token") opts.token = value();
    else if (arg === "--data") {
      try { opts.data = JSON.parse(value()); } catch { fail("--data must be a JSON object"); }
    } else if (arg === "-h" || arg === "--help") { console.log(USAGE); process.exit(0); }
    else if (arg.startsWith("--")) fail(`unknown option ${arg}`);
    else positional.push(arg);
  }
  if (positional.length !== 2) fail("give an event type and an operation name");
  [opts.type, opts.name] = positional;
  for (const k of ["repeat", "concurrency"]) if (!Number.isInteger(opts[k]) || opts[k] < 1 || opts[k] > 10000) fail(`--${k} must be a whole number from 1 to 10000`);
  if (!opts.url.endsWith("/webhooks/gemini")) opts.url = opts.url.replace(/\/$/, "") + "/webhooks/gemini";
  const vars = devVars();
  opts.secret ??= vars.GEMINI_WEBHOOK_SECRETS?.split(/[\s,]+/).find((s) => s.startsWith("whsec_"));
  // The local tokens go only to a worker on this machine; reading a record needs a read token.
  const first = (list) => list?.split(/\s+/).find(Boolean);
  if (isLoopback(opts.url)) opts.token ??= first(vars.READ_TOKENS) ?? first(vars.ADMIN_TOKEN);
  if (!SCHEMES.includes(opts.scheme)) fail(`--scheme is one of ${SCHEMES.join(", ")}`);
  if (opts.scheme === "v1" && !opts.secret?.startsWith("whsec_")) fail("give --secret whsec_... (or set GEMINI_WEBHOOK_SECRETS in .dev.vars)");
  opts.audience = vars.GEMINI_JWT_AUDIENCE;
  return opts;
}

const NO_DESTINATION_HINT = `hint: is anything listening at EFFECT_URL? npm start runs a demo destination there when it is on this machine (${DEMO_EFFECT_URL} by default); npm run receive runs it alone`;

/**
 * What became of the side effect, as lines for the user: `effects` are the answers' `effect`
 * fields, `outcomes` their `outcome`s. With a token, the record is read until its first
 * attempt has an outcome (the worker may answer before the attempt, then `effect` is
 * "scheduled"). When no answer applied the completion (each `dropped`: a duplicate of one the
 * worker had already applied, as with `--fresh-ids` after a first send), the effect's state is
 * that earlier delivery's, and the lines say so.
 */
export async function effectReport(opts, effects, outcomes = []) {
  const earlier = outcomes.length > 0 && !outcomes.includes("applied") && outcomes.includes("dropped");
  if (earlier) {
    const lines = await effectState(opts, effects);
    const note = "this send applied nothing: the worker had already applied this completion (each answer: dropped), so it sends the destination nothing new";
    return [note, ...lines.map((l) => l.replace(/^effect: delivered to the destination/, "effect: delivered to the destination earlier, not by this send"))];
  }
  return effectState(opts, effects);
}

/** The side effect's state as lines: from the answers, else from the record. */
async function effectState(opts, effects) {
  if (effects.includes("delivered")) return ["effect: delivered to the destination"];
  const failed = effects.includes("retry_scheduled") || effects.includes("parked");
  let op;
  if (opts.token) {
    const url = opts.url.replace(/\/webhooks\/gemini$/, `/v1/operations/${encodeURIComponent(opts.name)}`);
    // Until the attempt has an outcome, which is at once on a healthy machine; a busy one
    // (or a worker under load) can take several seconds to make it.
    const deadline = Date.now() + 30_000;
    while (Date.now() < deadline) {
      try {
        const res = await fetch(url, { headers: { authorization: `Bearer ${opts.token}`, ...accessHeaders() } });
        if (!res.ok) break;
        op = await res.json();
      } catch {
        break;
      }
      if (op.effect_done || op.effect_parked || op.last_error) break;
      await new Promise((r) => setTimeout(r, 300));
    }
  }
  if (op?.effect_done) return [`effect: delivered to the destination (attempts: ${op.attempts})`];
  if (op?.effect_parked) return [`effect: parked: the destination refused it for good (${op.parked_answer}); fix the destination, then POST /v1/operations/{name}/redeliver`];
  if (op?.last_error) return [`effect: not delivered yet (last_error: ${op.last_error}); the worker retries it at ${op.next_attempt_at}`, NO_DESTINATION_HINT];
  if (failed) return [`effect: ${effects.includes("parked") ? "parked" : "not delivered yet; the worker retries it"} (GET /v1/operations/{name} shows last_error)`, NO_DESTINATION_HINT];
  return [];
}

/** The Standard Webhooks headers for one delivery, signed `v1,` with `secret`. */
export function sign(secret, id, timestamp, body) {
  const key = Buffer.from(secret.slice("whsec_".length), "base64");
  const mac = createHmac("sha256", key).update(`${id}.${timestamp}.${body}`).digest("base64");
  return headersWith(id, timestamp, `v1,${mac}`);
}

const headersWith = (id, timestamp, signature) => ({ "content-type": "application/json", "webhook-id": id, "webhook-timestamp": String(timestamp), "webhook-signature": signature });

/**
 * The headers for one delivery signed by `scheme`: `v1` with `opts.secret`; `v1a` and `jwt`
 * with the local Gemini stand-in's keys (`keys`, scripts/gemini_keys.mjs), the token carrying
 * `opts.audience` when set.
 */
export function signAs(scheme, opts, id, timestamp, body, keys = scheme === "v1" ? null : localKeys()) {
  if (scheme === "v1a") return headersWith(id, timestamp, signV1a(keys.ed25519, id, timestamp, body));
  if (scheme === "jwt") {
    const claims = { iss: "https://generativelanguage.googleapis.com", iat: timestamp, exp: timestamp + 300, ...(opts.audience ? { aud: opts.audience } : {}) };
    return headersWith(id, timestamp, signJwt(keys.rsa, claims));
  }
  return sign(opts.secret, id, timestamp, body);
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const body = JSON.stringify({ type: opts.type, version: "v1", timestamp: new Date().toISOString(), data: { id: opts.name, ...opts.data } });
  const sharedId = `msg_${randomBytes(12).toString("hex")}`;
  let next = 0;
  const tally = new Map();
  const effects = [];
  const outcomes = [];
  async function sendOne(n) {
    const id = opts.freshIds ? `msg_${randomBytes(12).toString("hex")}` : sharedId;
    const started = Date.now();
    try {
      const res = await fetch(opts.url, { method: "POST", headers: signAs(opts.scheme, opts, id, Math.floor(Date.now() / 1000), body), body });
      const text = await res.text();
      tally.set(res.status, (tally.get(res.status) ?? 0) + 1);
      console.log(`#${n} ${res.status} ${Date.now() - started}ms ${id} ${text}`);
      try { const answer = JSON.parse(text); effects.push(answer.effect); outcomes.push(answer.outcome); } catch { /* not JSON: no effect to report */ }
    } catch (e) {
      tally.set("error", (tally.get("error") ?? 0) + 1);
      console.log(`#${n} error ${e.cause?.code ?? e.message}`);
    }
  }
  await Promise.all(Array.from({ length: Math.min(opts.concurrency, opts.repeat) }, async () => {
    while (next < opts.repeat) await sendOne(++next);
  }));
  const summary = [...tally].map(([k, v]) => `${k}=${v}`).join(" ");
  if (tally.has(200)) for (const line of await effectReport(opts, effects, outcomes)) console.error(line);
  console.log(`sent ${opts.repeat} ${opts.type} for ${opts.name} to ${opts.url}: ${summary}`);
  process.exit(tally.has("error") || [...tally.keys()].some((k) => k >= 400) ? 1 : 0);
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) main();
