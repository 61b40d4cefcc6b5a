// `npm run connect -- --url WORKER_URL [--local] [--rotate [--now] | --rotate --finish [--now]]`
//
// Connects a worker to Gemini with Gemini's WebhookService (`v1beta/webhooks`, the shapes of the
// official SDKs' webhook types): finds the project's webhook for the worker's URL or creates
// it, subscribed to exactly the events the SDKs list (never a second one), stores its signing
// secret as the worker's GEMINI_WEBHOOK_SECRETS and its id as GEMINI_WEBHOOK_NAME (`--local`:
// in .dev.vars; otherwise `wrangler secret put`, with a copy in .deploy.vars so a rotation
// knows the old secret), waits until the worker runs with them, pings the webhook and reports
// whether the worker received the ping (its `pings` counter in /v1/stats).
//
// `--rotate` rotates the signing secret without downtime: Gemini keeps signing with the old
// secret for 24 hours beside the new one, and the worker accepts both meanwhile; a later
// `--rotate --finish` drops the old one once Gemini no longer lists it as live (`--now` drops
// it at once, and `--rotate --now` asks Gemini to revoke the old secret immediately).
// A run that finds everything in place changes nothing. GEMINI_API_KEY and GEMINI_API_BASE
// come from the environment, else from .dev.vars.
import { parseArgs } from "node:util";
import path from "node:path";
import { accessHeaders, devVars, ROOT, isLoopback } from "./dev_vars.mjs";
import { DEPLOY_VARS, SDK_EVENTS, secretList, wrangler, writeVars } from "./deploy_vars.mjs";

const HELP = `usage: npm run connect -- --url WORKER_URL [options]

  --url URL           the worker's address (https://gemini-once.<you>.workers.dev); Gemini
                      delivers to URL/webhooks/gemini
  --local             keep the secret in .dev.vars (a worker run with npm start) instead of
                      wrangler secret put
  --rotate            rotate the signing secret: old and new accepted together for Gemini's
                      24 hours; then --rotate --finish drops the old one
  --now               with --rotate: Gemini revokes the old secret at once and the worker keeps
                      only the new one; with --finish: drop the old one without waiting
  --name NAME         the webhook's display name when creating it (gemini-once)
  --read-token TOKEN  a read token of the worker (READ_TOKENS), to check it runs with the new
                      settings and received the ping: connect only reads, so it never sends
                      the admin token (default: the first of READ_TOKENS from the
                      environment, else .dev.vars with --local, else .deploy.vars)
  --wait SECONDS      how long to wait for the worker and the ping (60)
  --no-ping           do not ping
  --dev-vars FILE     the local vars file (.dev.vars)`;

const { values: args } = parseArgs({
  options: {
    url: { type: "string" },
    local: { type: "boolean", default: false },
    rotate: { type: "boolean", default: false },
    now: { type: "boolean", default: false },
    finish: { type: "boolean", default: false },
    name: { type: "string", default: "gemini-once" },
    "read-token": { type: "string" },
    wait: { type: "string", default: "60" },
    "no-ping": { type: "boolean", default: false },
    "dev-vars": { type: "string" },
    help: { type: "boolean", short: "h", default: false },
  },
});

function fail(message) {
  console.error(`connect: ${message}`);
  process.exit(1);
}
const say = (message) => console.log(`connect: ${message}`);

if (args.help) {
  console.log(HELP);
  process.exit(0);
}
if ((args.now || args.finish) && !args.rotate) fail("--now and --finish go with --rotate");

const devFile = path.resolve(args["dev-vars"] ?? path.join(ROOT, ".dev.vars"));
const localVars = devVars(devFile);
const deployVars = devVars(DEPLOY_VARS);
const apiKey = process.env.GEMINI_API_KEY || localVars.GEMINI_API_KEY;
const apiBase = (process.env.GEMINI_API_BASE || localVars.GEMINI_API_BASE || "https://generativelanguage.googleapis.com").replace(/\/+$/, "");
const waitMs = Number(args.wait) * 1000;
if (!apiKey) fail("GEMINI_API_KEY is not set (export it, or put it in .dev.vars)");
if (!Number.isFinite(waitMs) || waitMs < 0) fail("--wait takes a number of seconds");

// Where this worker's settings live, and what they are now.
const stored = args.local ? localVars : { ...deployVars, ...(process.env.GEMINI_WEBHOOK_SECRETS ? { GEMINI_WEBHOOK_SECRETS: process.env.GEMINI_WEBHOOK_SECRETS } : {}) };
// Least privilege: connect reads /v1/config and /v1/stats, which a read token may.
const readToken = args["read-token"] || firstToken(process.env.READ_TOKENS) || firstToken(stored.READ_TOKENS);

let workerUrl = args.url?.trim().replace(/\/+$/, "").replace(/\/webhooks\/gemini$/, "");
if (workerUrl !== undefined && !/^https?:\/\/[^/]+/.test(workerUrl)) fail(`--url must be the worker's http(s) address, not ${args.url}`);
if (!workerUrl && !(args.rotate && stored.GEMINI_WEBHOOK_NAME)) fail("give --url WORKER_URL (npm run connect -- --help)");
// A token goes to this address, and Gemini signs what it sends there: plain http only on this machine.
if (workerUrl?.startsWith("http://") && !isLoopback(workerUrl)) fail(`--url must be https:// (connect sends the worker a token, and Gemini delivers there): plain http:// is accepted only for this machine (127.0.0.1, localhost, [::1]), not ${workerUrl}`);
if (workerUrl && !args.local && isLoopback(workerUrl)) say(`${workerUrl} is on this machine: Gemini cannot reach it (use a tunnel's https address); --local keeps the secret in .dev.vars`);

/** Gemini's WebhookService: `v1beta/<p>`, JSON both ways; throws with Gemini's own message. */
async function gemini(method, p, body, query = {}) {
  const qs = new URLSearchParams(Object.entries(query).filter(([, v]) => v !== undefined)).toString();
  const res = await fetch(`${apiBase}/v1beta/${p}${qs ? `?${qs}` : ""}`, {
    method,
    headers: { "x-goog-api-key": apiKey, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  }).catch((e) => fail(`${method} ${apiBase}/v1beta/${p}: ${e.cause?.message ?? e.message}`));
  const text = await res.text();
  let value;
  try { value = text ? JSON.parse(text) : {}; } catch { value = { raw: text }; }
  if (!res.ok) fail(`${method} v1beta/${p}: ${res.status} ${value?.error?.message ?? text.slice(0, 300)}`);
  return value;
}

/** Every webhook of the project (all pages). */
async function listWebhooks() {
  const all = [];
  let page_token;
  do {
    const page = await gemini("GET", "webhooks", undefined, { page_size: "1000", page_token });
    all.push(...(page.webhooks ?? []));
    page_token = page.next_page_token || page.nextPageToken || undefined;
  } while (page_token);
  return all;
}

/** A webhook's id (the SDKs' `id`; early answers carried it only as `name: webhooks/{id}`). */
const idOf = (w) => w.id ?? String(w.name ?? "").replace(/^webhooks\//, "");
const sameUri = (a, b) => String(a ?? "").replace(/\/+$/, "") === b.replace(/\/+$/, "");
const sameEvents = (events) => [...(events ?? [])].sort().join() === [...SDK_EVENTS].sort().join();

/** The first of a space-separated token list, or undefined. */
function firstToken(list) {
  return String(list ?? "").trim().split(/\s+/).find(Boolean);
}

/** A read of the worker's admin API, or null without a token or when it does not answer. */
async function workerRead(p) {
  if (!readToken || !workerUrl) return null;
  try {
    const res = await fetch(`${workerUrl}${p}`, { headers: { authorization: `Bearer ${readToken}`, ...accessHeaders() }, signal: AbortSignal.timeout(10_000) });
    // A refused token will not get better by waiting: say which one, and where it came from.
    if (res.status === 401 || res.status === 403) fail(`the worker refused the read token (${res.status} on ${p}): it is not one of the worker's READ_TOKENS. After rotating tokens, put the new ones in ${args.local ? "the .dev.vars file" : DEPLOY_VARS} (or give --read-token)`);
    return res.ok ? await res.json() : null;
  } catch {
    return null;
  }
}
const setting = (config, name) => config?.settings?.find((s) => s.name === name)?.value;
const pingsSeen = async () => {
  const stats = await workerRead("/v1/stats");
  return stats ? Number(stats.total?.pings ?? 0) : null;
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * Stores `vars` where the worker reads them; returns the names whose value changed. Deployed,
 * each changed one is a `wrangler secret put` (secrets survive `npm run deploy`, which rewrites
 * [vars]), recorded in .deploy.vars.
 */
async function store(vars) {
  const changed = Object.keys(vars).filter((k) => stored[k] !== vars[k]);
  if (!changed.length) return [];
  if (args.local) {
    writeVars(devFile, Object.fromEntries(changed.map((k) => [k, vars[k]])));
  } else {
    for (const name of changed) {
      const r = await wrangler(["secret", "put", name], { input: `${vars[name]}\n` });
      if (r.code !== 0) {
        // Gemini shows a new secret only once: keep it in the owner-only file, never on screen.
        if (name === "GEMINI_WEBHOOK_SECRETS") {
          writeVars(DEPLOY_VARS, { GEMINI_WEBHOOK_SECRETS: vars[name] });
          console.error(`connect: Gemini shows a new secret only once: it is kept in ${DEPLOY_VARS} (owner-only) as GEMINI_WEBHOOK_SECRETS; run connect again once wrangler works`);
        }
        fail(`wrangler secret put ${name} failed: ${(r.stderr || r.stdout).trim()}`);
      }
    }
    writeVars(DEPLOY_VARS, Object.fromEntries(changed.map((k) => [k, vars[k]])));
  }
  Object.assign(stored, vars);
  say(`stored ${changed.join(", ")} ${args.local ? `in ${path.relative(process.cwd(), devFile) || devFile}` : "as worker secrets (copy in .deploy.vars)"}`);
  return changed;
}

/** Waits until the worker runs with `id` and `count` secrets (its /v1/config says so). */
async function awaitWorker(id, count) {
  if (!readToken || !workerUrl) {
    say("no read token: not checking that the worker runs with the new settings (give --read-token, or READ_TOKENS)");
    return true;
  }
  const deadline = Date.now() + waitMs;
  let hinted = false;
  for (;;) {
    const config = await workerRead("/v1/config");
    if (setting(config, "GEMINI_WEBHOOK_NAME") === id && setting(config, "GEMINI_WEBHOOK_SECRETS") === `set (${count})`) return true;
    if (Date.now() > deadline) return false;
    if (!hinted && args.local) {
      say("waiting for the worker to run with the new .dev.vars: restart npm start (wrangler dev reads .dev.vars when it starts)");
      hinted = true;
    }
    await sleep(500);
  }
}

/** Pings the webhook; true when the worker counted it. */
async function ping(id) {
  const before = await pingsSeen();
  await gemini("POST", `webhooks/${id}:ping`, {});
  if (before === null) {
    say("ping sent; whether the worker received it needs a read token (--read-token), or look for an \"event\":\"ping\" line in npx wrangler tail");
    return true;
  }
  const deadline = Date.now() + waitMs;
  for (;;) {
    const now = await pingsSeen();
    if (now !== null && now > before) {
      say(`ping: the worker received it (pings ${before} -> ${now})`);
      return true;
    }
    if (Date.now() > deadline) break;
    await sleep(1000);
  }
  say(`ping: the worker did not count a ping within ${args.wait} s. Check that Gemini can reach ${workerUrl}/webhooks/gemini, that the worker has this webhook's secret (a "rejected" line with bad_signature in npx wrangler tail says it does not: npm run connect -- --url ${workerUrl} --rotate --now gets a new one), and /healthz. A ping whose type the worker does not recognise is kept as a dead letter (dead:<webhook-id> in KV): its body shows the type`);
  return false;
}

const webhooks = await listWebhooks();
const target = workerUrl ? `${workerUrl}/webhooks/gemini` : null;
const matches = target ? webhooks.filter((w) => sameUri(w.uri, target)) : webhooks.filter((w) => idOf(w) === stored.GEMINI_WEBHOOK_NAME);
if (matches.length > 1) say(`${matches.length} webhooks deliver to ${target}: using ${idOf(matches[0])}; delete the others (DELETE v1beta/webhooks/{id}) or each completion arrives ${matches.length} times`);
let hook = matches[0];
if (!workerUrl && hook) workerUrl = String(hook.uri).replace(/\/webhooks\/gemini\/?$/, "");

if (args.rotate) {
  if (!hook) fail(`no webhook of this project delivers to ${target ?? stored.GEMINI_WEBHOOK_NAME}: run npm run connect -- --url WORKER_URL first`);
  const id = idOf(hook);
  const held = secretList(stored.GEMINI_WEBHOOK_SECRETS);
  if (args.finish) {
    const live = (hook.signing_secrets ?? []).filter((s) => !s.expire_time || Date.parse(s.expire_time) > Date.now());
    if (held.length <= 1) {
      say("the worker holds one secret: nothing to drop");
    } else if (live.length > 1 && !args.now) {
      const until = live.map((s) => s.expire_time).filter(Boolean).sort().pop();
      fail(`Gemini still signs with ${live.length} secrets${until ? ` (the old one until ${until})` : ""}: run this again after that, or add --now to drop the old one anyway`);
    } else {
      await store({ GEMINI_WEBHOOK_SECRETS: held[held.length - 1] });
      say("dropped the old secret: the worker accepts only the newest");
    }
  } else {
    if (!held.length && !args.now) fail(`the worker's current secret is not known here (${args.local ? devFile : ".deploy.vars, or GEMINI_WEBHOOK_SECRETS in the environment"}), so it cannot be kept beside the new one: set it, or rotate with --now (deliveries fail until the new one is stored; Gemini retries them)`);
    const rotated = await gemini("POST", `webhooks/${id}:rotateSigningSecret`, {
      revocation_behavior: args.now ? "revoke_previous_secrets_immediately" : "revoke_previous_secrets_after_h24",
    });
    if (!rotated.secret?.startsWith("whsec_")) fail(`rotateSigningSecret answered no secret: ${JSON.stringify(rotated)}`);
    const list = args.now ? [rotated.secret] : [...held, rotated.secret];
    await store({ GEMINI_WEBHOOK_SECRETS: list.join(" "), GEMINI_WEBHOOK_NAME: id });
    say(args.now
      ? "rotated: Gemini revoked the old secret; the worker keeps only the new one"
      : `rotated: the worker accepts the old and the new secret while Gemini signs with both (24 hours); then drop the old one with npm run connect -- --url ${workerUrl} --rotate --finish${args.local ? " --local" : ""}`);
  }
} else if (!hook) {
  const created = await gemini("POST", "webhooks", { name: args.name, uri: target, subscribed_events: [...SDK_EVENTS] });
  if (!created.new_signing_secret?.startsWith("whsec_")) fail(`Gemini created webhook ${idOf(created)} but answered no signing secret: delete it and run again`);
  hook = created;
  say(`created webhook ${idOf(created)} delivering to ${target}, subscribed to ${SDK_EVENTS.join(", ")}`);
  await store({ GEMINI_WEBHOOK_SECRETS: created.new_signing_secret, GEMINI_WEBHOOK_NAME: idOf(created) });
} else {
  const id = idOf(hook);
  say(`webhook ${id} already delivers to ${target}`);
  if (!sameEvents(hook.subscribed_events)) {
    hook = { ...hook, ...(await gemini("PATCH", `webhooks/${id}`, { subscribed_events: [...SDK_EVENTS] }, { update_mask: "subscribed_events" })) };
    say(`subscribed it to exactly ${SDK_EVENTS.join(", ")}`);
  }
  if (hook.state && hook.state !== "enabled") {
    say(`it was ${hook.state}: enabling it`);
    hook = { ...hook, ...(await gemini("PATCH", `webhooks/${id}`, { state: "enabled" }, { update_mask: "state" })) };
  }
  await store({ GEMINI_WEBHOOK_NAME: id });
  if (!secretList(stored.GEMINI_WEBHOOK_SECRETS).length) say("its signing secret is not known here (Gemini shows it only at creation): if the ping is not received, npm run connect -- --url URL --rotate --now gets a new one");
}

const id = idOf(hook);
const count = secretList(stored.GEMINI_WEBHOOK_SECRETS).length;
if (count && !(await awaitWorker(id, count))) fail(`the worker at ${workerUrl} does not run with GEMINI_WEBHOOK_NAME=${id} and ${count} secret(s) after ${args.wait} s${args.local ? " (restart npm start)" : ""}`);
if (!args["no-ping"] && !(await ping(id))) process.exit(1);
say(`connected: Gemini webhook ${id} -> ${workerUrl}/webhooks/gemini`);
