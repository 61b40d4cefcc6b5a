#!/usr/bin/env node
// Registers an operation with the worker (POST /v1/operations), as your code would when it
// submits a job to Gemini, so reconciliation finds it if its completion never arrives.
//
//   npm run register -- NAME [--kind KIND] [--user-metadata JSON] [--results each|none] [--url URL] [--token REGISTER_TOKEN]
//
// --kind picks the destination (EFFECT_ROUTES) and is carried in the side effect; without it the
// effect goes to EFFECT_URL. --user-metadata (a JSON object) becomes the side effect's verified
// `user_metadata`. --results each (a batch) gives each of the batch's results its own side
// effect, then the job's effect with the counts; without it the worker's default for the kind
// holds (`none`: the job's effect alone). The URL defaults to the local worker: the address a
// running `npm start` wrote (.wrangler/local-worker.json), else http://127.0.0.1:8787. The token is a register token
// (it may register and read one operation back, nothing else): --token, else
// GEMINI_ONCE_REGISTER_TOKEN from the environment, else the first of REGISTER_TOKENS in
// .dev.vars (ADMIN_TOKEN there, with a note, when it has none). Prints the answer; exits 0
// when the worker created (201) or already knew (200) it, 1 when it refused, e.g. 409: an
// earlier registration recorded another kind or other metadata (a registration never changes
// it), or the operation's retention ended (it never runs again). With CF_ACCESS_CLIENT_ID and
// CF_ACCESS_CLIENT_SECRET set, it sends them (a worker behind Cloudflare Access).
import { fileURLToPath } from "node:url";
import path from "node:path";
import { accessHeaders, devVars, localWorker } from "./dev_vars.mjs";

const USAGE = "usage: npm run register -- NAME [--kind KIND] [--user-metadata JSON] [--results each|none] [--url URL] [--token REGISTER_TOKEN]";

/** What a refusal means, from its body's `error` (409: `conflict` or `retired`). */
function refusal(status, text) {
  let error;
  try {
    error = JSON.parse(text).error;
  } catch {
    return "refused";
  }
  if (status === 409 && error === "conflict") return "refused: registered before with another kind or other user_metadata; nothing changed";
  if (status === 409 && error === "retired") return "refused: settled and its retention ended; it never runs again";
  return "refused";
}

function fail(message) {
  console.error(`register: ${message}\n${USAGE}`);
  process.exit(2);
}

function parseArgs(argv) {
  const local = localWorker();
  const opts = { url: local.url, urlFrom: local.from };
  const positional = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const value = () => (i + 1 < argv.length ? argv[++i] : fail(`${arg} needs a value`));
    if (arg === "--kind") opts.kind = value();
    else if (arg === "--user-metadata") {
      try { opts.userMetadata = JSON.parse(value()); } catch { fail("--user-metadata must be a JSON object"); }
      if (!opts.userMetadata || typeof opts.userMetadata !== "object" || Array.isArray(opts.userMetadata)) fail("--user-metadata must be a JSON object");
    }
    else if (arg === "--results") {
      opts.results = value();
      if (!["each", "none"].includes(opts.results)) fail("--results is each or none");
    }
    else if (arg === "--url") { opts.url = value(); opts.urlFrom = "--url"; }
    else if (arg === "--token") opts.token = value();
    else if (arg === "-h" || arg === "--help") { console.log(USAGE); process.exit(0); }
    else if (arg.startsWith("--")) fail(`unknown option ${arg}`);
    else positional.push(arg);
  }
  if (positional.length !== 1) fail("give one operation name (e.g. batches/abc)");
  opts.name = positional[0];
  opts.token ??= process.env.GEMINI_ONCE_REGISTER_TOKEN || undefined;
  if (!opts.token) {
    const vars = devVars();
    opts.token = vars.REGISTER_TOKENS?.split(/\s+/).find(Boolean);
    if (!opts.token && vars.ADMIN_TOKEN) {
      // An older .dev.vars, from before tokens had scopes: it still works, with more power
      // than registering needs.
      opts.token = vars.ADMIN_TOKEN.split(/\s+/).find(Boolean);
      console.error("register: using ADMIN_TOKEN from .dev.vars: add a register token there (REGISTER_TOKENS, see .dev.vars.example)");
    }
  }
  if (!opts.token) fail("give --token (a register token), set GEMINI_ONCE_REGISTER_TOKEN, or set REGISTER_TOKENS in .dev.vars");
  return opts;
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const url = `${opts.url.replace(/\/+$/, "")}/v1/operations`;
  let res;
  try {
    res = await fetch(url, {
      method: "POST",
      headers: { authorization: `Bearer ${opts.token}`, "content-type": "application/json", ...accessHeaders() },
      body: JSON.stringify({ name: opts.name, kind: opts.kind, user_metadata: opts.userMetadata, results: opts.results }),
    });
  } catch (e) {
    console.error(`register: no answer from ${url} (${e.cause?.code ?? e.message}); is the worker running (npm start)? (the address is ${opts.urlFrom}; --url URL gives another)`);
    process.exit(1);
  }
  const text = await res.text();
  const what = { 201: "registered", 200: "already registered", 403: "refused: not a register token" }[res.status] ?? refusal(res.status, text);
  console.log(`register: ${res.status} ${what} ${opts.name}: ${text}`);
  process.exit(res.status === 200 || res.status === 201 ? 0 : 1);
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) main();
