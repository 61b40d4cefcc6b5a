#!/usr/bin/env node
// Signs and sends a Gemini-shaped webhook delivery, the way Gemini does (Standard Webhooks
// HMAC-SHA256 over "{webhook-id}.{webhook-timestamp}.{body}"), to a local or deployed worker.
//
//   npm run send -- <event-type> <operation-name> [--url URL] [--secret whsec_...]
//                   [--data JSON] [--repeat N] [--concurrency N] [--fresh-ids]
//
// --repeat sends the same delivery (same webhook-id, as Gemini's retries do) N times;
// --fresh-ids gives each send its own webhook-id (the same completion delivered anew);
// --concurrency sends up to N at once. The secret defaults to the first one in .dev.vars.
import { createHmac, randomBytes } from "node:crypto";
import { readFileSync, existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import path from "node:path";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const USAGE = "usage: npm run send -- <event-type> <operation-name> [--url URL] [--secret whsec_...] [--data JSON] [--repeat N] [--concurrency N] [--fresh-ids]";

function fail(message) {
  console.error(`send: ${message}\n${USAGE}`);
  process.exit(2);
}

function parseArgs(argv) {
  const opts = { url: "http://127.0.0.1:8787/webhooks/gemini", repeat: 1, concurrency: 1, freshIds: false, data: {} };
  const positional = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const value = () => (i + 1 < argv.length ? argv[++i] : fail(`${arg} needs a value`));
    if (arg === "--url") opts.url = value();
    else if (arg === "--secret") opts.secret = value();
    else if (arg === "--repeat") opts.repeat = Number(value());
    else if (arg === "--concurrency") opts.concurrency = Number(value());
    else if (arg === "--fresh-ids") opts.freshIds = true;
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
  opts.secret ??= secretFromDevVars();
  if (!opts.secret?.startsWith("whsec_")) fail("give --secret whsec_... (or set GEMINI_WEBHOOK_SECRETS in .dev.vars)");
  return opts;
}

function secretFromDevVars() {
  const file = path.join(root, ".dev.vars");
  if (!existsSync(file)) return undefined;
  const line = readFileSync(file, "utf8").split("\n").find((l) => l.trim().startsWith("GEMINI_WEBHOOK_SECRETS"));
  return line?.split("=").slice(1).join("=").replace(/["']/g, "").split(/[\s,]+/).find((s) => s.startsWith("whsec_"));
}

/** The Standard Webhooks headers for one delivery. */
export function sign(secret, id, timestamp, body) {
  const key = Buffer.from(secret.slice("whsec_".length), "base64");
  const mac = createHmac("sha256", key).update(`${id}.${timestamp}.${body}`).digest("base64");
  return { "content-type": "application/json", "webhook-id": id, "webhook-timestamp": String(timestamp), "webhook-signature": `v1,${mac}` };
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const body = JSON.stringify({ type: opts.type, version: "v1", timestamp: new Date().toISOString(), data: { id: opts.name, ...opts.data } });
  const sharedId = `msg_${randomBytes(12).toString("hex")}`;
  let next = 0;
  const tally = new Map();
  async function sendOne(n) {
    const id = opts.freshIds ? `msg_${randomBytes(12).toString("hex")}` : sharedId;
    const started = Date.now();
    try {
      const res = await fetch(opts.url, { method: "POST", headers: sign(opts.secret, id, Math.floor(Date.now() / 1000), body), body });
      const text = await res.text();
      tally.set(res.status, (tally.get(res.status) ?? 0) + 1);
      console.log(`#${n} ${res.status} ${Date.now() - started}ms ${id} ${text}`);
    } catch (e) {
      tally.set("error", (tally.get("error") ?? 0) + 1);
      console.log(`#${n} error ${e.cause?.code ?? e.message}`);
    }
  }
  await Promise.all(Array.from({ length: Math.min(opts.concurrency, opts.repeat) }, async () => {
    while (next < opts.repeat) await sendOne(++next);
  }));
  const summary = [...tally].map(([k, v]) => `${k}=${v}`).join(" ");
  console.log(`sent ${opts.repeat} ${opts.type} for ${opts.name} to ${opts.url}: ${summary}`);
  process.exit(tally.has("error") || [...tally.keys()].some((k) => k >= 400) ? 1 : 0);
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) main();
