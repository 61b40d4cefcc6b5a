#!/usr/bin/env node
// A `"results": "each"` batch's results, from a shell, through the worker's results routes
// (docs/openapi.yaml): list them in a state, or send the parked ones again.
//
//   npm run results -- list NAME [--state parked|waiting|delivered] [--url URL] [--token TOKEN]
//   npm run results -- retry NAME [--dry-run] [--reason TEXT] [--url URL] [--token ADMIN_TOKEN]
//
// `list` (GET /v1/operations/{name}/results) prints one line per result in the state (`parked`
// by default; `waiting`: failed and due again; `delivered`: only their count, as the worker
// keeps no row for them), following every page. `retry` (POST .../results/retry) puts parked
// results back, due at once under their first webhook-id, a page at a time as the worker
// takes them (it says how many stay parked: run it again for more), and sends those waiting
// for a retry now rather than at the end of their backoff; `--dry-run` counts what
// it would take and changes nothing. A parked results file is asked for again.
//
// The URL defaults to the local worker (the address a running `npm start` wrote, else
// http://127.0.0.1:8787). The token: --token, else, for a worker on this machine, the one of
// .dev.vars that `register` and `send` use: for `list` the read token (READ_TOKENS, else
// ADMIN_TOKEN), for `retry` ADMIN_TOKEN (an operator's action). A deployed worker's tokens are
// in .deploy.vars: pass one with --token. With CF_ACCESS_CLIENT_ID and CF_ACCESS_CLIENT_SECRET
// set, it sends them (a worker behind Cloudflare Access). Exits 0 when the worker answered
// 2xx, 1 when it refused or did not answer, 2 on bad arguments.
import { fileURLToPath } from "node:url";
import path from "node:path";
import { accessHeaders, devVars, isLoopback, localWorker } from "./dev_vars.mjs";

const USAGE = `usage: npm run results -- list NAME [--state parked|waiting|delivered] [--url URL] [--token TOKEN]
       npm run results -- retry NAME [--dry-run] [--reason TEXT] [--url URL] [--token ADMIN_TOKEN]`;
const STATES = ["parked", "waiting", "delivered"];
/** At most this many pages are followed (100 results each): a listing that never ends stops. */
const MAX_PAGES = 1000;

function fail(message) {
  console.error(`results: ${message}\n${USAGE}`);
  process.exit(2);
}

export function parseArgs(argv, vars = devVars()) {
  const local = localWorker();
  const opts = { url: local.url, urlFrom: local.from, state: "parked", dryRun: false };
  const positional = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const value = () => (i + 1 < argv.length ? argv[++i] : fail(`${arg} needs a value`));
    if (arg === "--state") {
      opts.state = value();
      if (!STATES.includes(opts.state)) fail(`--state is ${STATES.join(", ")}`);
      opts.stateGiven = true;
    } else if (arg === "--dry-run") opts.dryRun = true;
    else if (arg === "--reason") opts.reason = value();
    else if (arg === "--url") { opts.url = value().replace(/\/+$/, ""); opts.urlFrom = "--url"; }
    else if (arg === "--token") opts.token = value();
    else if (arg === "-h" || arg === "--help") { console.log(USAGE); process.exit(0); }
    else if (arg.startsWith("--")) fail(`unknown option ${arg}`);
    else positional.push(arg);
  }
  if (positional.length !== 2 || !["list", "retry"].includes(positional[0])) fail("give list or retry, then one operation name (e.g. batches/abc)");
  [opts.command, opts.name] = positional;
  if (opts.command === "list" && opts.dryRun) fail("--dry-run is for retry");
  if (opts.command === "retry" && opts.stateGiven && opts.state !== "parked") fail("retry takes parked results only (--state parked)");
  const first = (list) => list?.split(/\s+/).find(Boolean);
  // The local tokens go only to a worker on this machine.
  if (!opts.token && isLoopback(opts.url)) opts.token = opts.command === "list" ? first(vars.READ_TOKENS) ?? first(vars.ADMIN_TOKEN) : first(vars.ADMIN_TOKEN);
  if (!opts.token) fail(opts.command === "list" ? "give --token (a read token), or set READ_TOKENS in .dev.vars for a local worker" : "give --token (the admin token), or set ADMIN_TOKEN in .dev.vars for a local worker");
  return opts;
}

/** One call; resolves to {status, body} or exits 1 when nothing answered. */
async function call(opts, pathAndQuery, init = {}) {
  const url = `${opts.url}/v1/operations/${encodeURIComponent(opts.name)}${pathAndQuery}`;
  let res;
  try {
    res = await fetch(url, { ...init, headers: { authorization: `Bearer ${opts.token}`, "content-type": "application/json", ...accessHeaders() } });
  } catch (e) {
    console.error(`results: no answer from ${opts.url} (${e.cause?.code ?? e.message}); is the worker running (npm start)? (the address is ${opts.urlFrom}; --url URL gives another)`);
    process.exit(1);
  }
  const text = await res.text();
  let body;
  try { body = JSON.parse(text); } catch { body = text; }
  return { status: res.status, body };
}

function refused({ status, body }) {
  const why = { 401: "the token is not one the worker knows", 403: "this token's scope may not do that (retry needs the admin token)", 404: "no such operation" }[status] ?? "refused";
  console.error(`results: ${status} ${why}: ${typeof body === "string" ? body : JSON.stringify(body)}`);
  process.exit(1);
}

const line = (r) => [`index=${r.index}`, `result_key=${r.result_key}`, `attempts=${r.attempts}`,
  r.last_attempt_ms != null ? `last_attempt=${new Date(r.last_attempt_ms).toISOString()}` : null,
  r.next_attempt_ms != null ? `due=${new Date(r.next_attempt_ms).toISOString()}` : null, `last_error=${JSON.stringify(r.last_error)}`].filter(Boolean).join(" ");

async function list(opts) {
  let cursor = null;
  let shown = 0;
  for (let page = 0; page < MAX_PAGES; page++) {
    const query = new URLSearchParams({ state: opts.state, ...(cursor ? { cursor } : {}) });
    const answer = await call(opts, `/results?${query}`);
    if (answer.status !== 200) refused(answer);
    if (opts.state === "delivered") {
      console.log(`results: ${opts.name}: ${answer.body.count ?? 0} delivered${answer.body.note ? ` (${answer.body.note})` : ""}`);
      return;
    }
    for (const r of answer.body.results ?? []) console.log(line(r));
    shown += answer.body.results?.length ?? 0;
    cursor = answer.body.cursor;
    if (!cursor) break;
  }
  const hint = opts.state === "parked" && shown > 0 ? `; send them again: npm run results -- retry ${opts.name} (--dry-run counts first)` : "";
  console.log(`results: ${opts.name}: ${shown} ${opts.state}${hint}`);
}

async function retry(opts) {
  const answer = await call(opts, "/results/retry", { method: "POST", body: JSON.stringify({ reason: opts.reason ?? "npm run results -- retry", dry_run: opts.dryRun }) });
  if (answer.status !== 200) refused(answer);
  const { retried = 0, would_retry: would = 0, parked = 0, hurried = 0, would_hurry: wouldHurry = 0 } = answer.body;
  const more = parked > 0 ? `; ${parked} stay parked: run it again for more` : "";
  // Results waiting for a retry go now too, rather than at the end of their backoff.
  const waiting = opts.dryRun ? (wouldHurry ? `; would send the ${wouldHurry} waiting for a retry now` : "") : hurried ? `; ${hurried} waiting for a retry sent now` : "";
  // A dry run's `parked` is how many are parked now; a retry's, how many stay after its page.
  if (opts.dryRun) console.log(`results: ${opts.name}: dry run: would retry ${would} of the ${parked} parked now${would < parked ? " (a page at a time: run retry again for the rest)" : ""}${waiting}; nothing changed`);
  else console.log(`results: ${opts.name}: retried ${retried}, each due at once under its first webhook-id${more}${waiting}`);
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  await (opts.command === "list" ? list(opts) : retry(opts));
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) main();
