#!/usr/bin/env node
// The demo destination, and a starting point for your own: receives the worker's side
// effects (EFFECT_URL), verifies each one's Standard Webhooks signature with
// EFFECT_SIGNING_SECRET, drops a repeated `webhook-id`, and prints one line per request.
// A batch registered with `"results":"each"` sends one effect per result (it carries
// `result_key`), printed as `result key=... result_key=... index=... response=...|error=...`,
// then the job's effect with `results={total,delivered,errors,parked}`.
//
//   npm run receive -- [--port 8788] [--secret whsec_...]
//
// The secret defaults to EFFECT_SIGNING_SECRET in .dev.vars. `npm start` runs it by itself at
// EFFECT_URL when that is on this machine (http://127.0.0.1:8788/effects by default).
//
// What a real receiver must do the same way:
// - verify the raw body before parsing it (any Standard Webhooks library; here `standardwebhooks`);
// - answer 2xx only once the effect is done: the worker retries anything else (5xx, 408, 409,
//   429, timeouts) and parks the effect on any other 4xx;
// - drop a `webhook-id` it has already handled (answer 2xx again): a retry of an effect you
//   already applied. Keep the ids durably (a unique key in your database), not in memory as
//   this demo does. A deliberate redelivery (`POST /v1/operations/{name}/redeliver`) comes
//   with a new `webhook-id` and is meant to run again; `idempotency-key` is the operation's key.
import { createServer } from "node:http";
import { fileURLToPath } from "node:url";
import path from "node:path";
import { Webhook } from "standardwebhooks";

/** `value` as at most `max` characters of one line. */
function short(value, max = 60) {
  const text = (typeof value === "string" ? value : JSON.stringify(value)).replace(/\s+/g, " ");
  return text.length > max ? `${text.slice(0, max - 1).trimEnd()}…` : text;
}

/** A result effect's fields: whose, which, and what it says (a response's text, an error). */
function resultFields(effect) {
  const text = effect.response?.candidates?.[0]?.content?.parts?.find((p) => typeof p.text === "string")?.text;
  const what = "response" in effect ? `response=${short(text ?? effect.response)}`
    : "error" in effect ? `error=${short(effect.error?.message ? `${effect.error.code ?? ""} ${effect.error.message}`.trim() : effect.error)}`
    : `unreadable=${short(effect.unreadable)}`;
  return `result key=${effect.key} result_key=${effect.result_key} index=${effect.index} ${what}`;
}

/** A results batch's counts, in the order they read: total, delivered, errors, parked, then why a file was parked. */
function counts(results) {
  const order = ["total", "delivered", "errors", "parked"];
  return Object.fromEntries([...order.filter((k) => k in results).map((k) => [k, results[k]]), ...Object.entries(results).filter(([k]) => !order.includes(k))]);
}

/** A job effect's fields worth a line. */
function jobFields(effect) {
  return ["key", "status", "settled_by", "output_file_uri", "error_code", "error_message", "results"]
    .filter((k) => effect[k] != null)
    .map((k) => [k, k === "results" && typeof effect[k] === "object" ? counts(effect[k]) : effect[k]])
    .map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`)
    .join(" ");
}

/**
 * An HTTP request handler for signed side effects. `log` gets one line per request, starting
 * with `verified new`, `verified repeat` or `NOT verified`.
 */
export function effectReceiver(secret, { log = console.log } = {}) {
  const webhook = new Webhook(secret);
  const handled = new Set();
  return (req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const answer = (status, body) => {
        res.writeHead(status, { "content-type": "application/json" });
        res.end(JSON.stringify(body));
      };
      if (req.method !== "POST") return answer(200, { demo_destination: "POST signed side effects here" });
      const id = req.headers["webhook-id"];
      let effect;
      try {
        effect = webhook.verify(Buffer.concat(chunks).toString("utf8"), req.headers);
      } catch (e) {
        log(`NOT verified (${e.message}) webhook-id=${id} ${req.url}: answered 401`);
        return answer(401, { error: "signature not verified" });
      }
      // `result_key` is how a result's effect is told from its job's.
      const fields = "result_key" in effect ? resultFields(effect) : jobFields(effect);
      if (handled.has(id)) {
        log(`verified repeat ${fields} webhook-id=${id}: already handled, dropped`);
        return answer(200, { ok: true, duplicate: true });
      }
      handled.add(id);
      // Your side effect goes here (publish, bill, notify), before the 2xx.
      log(`verified new ${fields} webhook-id=${id}`);
      answer(200, { ok: true });
    });
  };
}

/** Listens on 127.0.0.1:`port` (0: any free port); resolves to the server. */
export function listen(handler, port) {
  return new Promise((resolve, reject) => {
    const server = createServer(handler);
    server.once("error", reject);
    server.listen(port, "127.0.0.1", () => resolve(server));
  });
}

async function main() {
  const { devVars } = await import("./dev_vars.mjs");
  const args = process.argv.slice(2);
  const usage = "usage: npm run receive -- [--port 8788] [--secret whsec_...]  (the secret defaults to EFFECT_SIGNING_SECRET in .dev.vars)";
  if (args.includes("--help") || args.includes("-h")) {
    console.log(usage);
    return;
  }
  const option = (name) => {
    const i = args.indexOf(name);
    return i >= 0 ? args[i + 1] : undefined;
  };
  const port = Number(option("--port") ?? 8788);
  const secret = option("--secret") ?? devVars().EFFECT_SIGNING_SECRET;
  if (!secret?.startsWith("whsec_") || !Number.isInteger(port)) {
    console.error(usage);
    process.exit(2);
  }
  const server = await listen(effectReceiver(secret, { log: (line) => console.log(`receive: ${line}`) }), port).catch((e) => {
    console.error(`receive: cannot listen on 127.0.0.1:${port}: ${e.code ?? e.message}`);
    process.exit(1);
  });
  console.log(`receive: demo destination at http://127.0.0.1:${server.address().port}/effects (verifying each signature)`);
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) main();
