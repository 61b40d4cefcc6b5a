// `npm run deploy [-- --set NAME=value ...] [--dry-run] [--url URL]`: from a Cloudflare account
// to a deployed worker, safe to run again.
//
// 1. Checks before deploying what the worker needs: the KV namespace (no id in wrangler.toml:
//    wrangler's automatic resource provisioning creates it on the first deploy and keeps it
//    linked; a placeholder id is refused), EFFECT_URL (refused when missing), and says what is
//    advised (GEMINI_API_KEY, ALERT_URL) and what comes next (GEMINI_WEBHOOK_SECRETS:
//    `npm run connect`).
// 2. Generates EFFECT_SIGNING_SECRET and the three tokens (ADMIN_TOKEN, REGISTER_TOKENS,
//    READ_TOKENS: one scope each) when the worker has none yet, keeping them in .deploy.vars
//    (mode 0600, never committed), where the user reads them back, and says which token goes
//    where.
// 3. Creates the fan-out queue wrangler.toml names, unless it exists (wrangler deploy does not).
// 4. Deploys with the secrets it was given (--set, or GEMINI_API_KEY from the environment) and
//    generated, in one `wrangler deploy --secrets-file` (secrets already set stay).
// 5. Checks GET /healthz on the deployed worker.
// `--dry-run` makes the same checks, with the same words, and bundles without uploading
// anything: it fails wherever the deploy would fail. Like the deploy, it asks Cloudflare which
// secrets the worker has (`wrangler secret list`), so it needs wrangler logged in
// (`npx wrangler login` once, or CLOUDFLARE_API_TOKEN), and stops at once when it is not.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { devVars, ROOT } from "./dev_vars.mjs";
import { DEPLOY_VARS, fingerprint, newSigningSecret, newToken, remoteSecretNames, wrangler, writeVars } from "./deploy_vars.mjs";

const HELP = `usage: npm run deploy -- [--set NAME=value ...] [--dry-run] [--url URL] [--config FILE]

  --set NAME=value   a setting to upload as a worker secret (repeat it), e.g.
                     --set EFFECT_URL=https://your.app/hooks/gemini --set ALERT_URL=https://hooks.slack.com/...
                     GEMINI_API_KEY is also taken from the environment
  --dry-run          every check the deploy makes, then bundle; nothing is uploaded or created.
                     It fails wherever the deploy would, with the same words: like the
                     deploy, it asks Cloudflare which secrets the worker has, so it needs
                     wrangler logged in (npx wrangler login once, or CLOUDFLARE_API_TOKEN)
  --url URL          where to check /healthz (default: the workers.dev address wrangler prints)
  --config FILE      another wrangler configuration (wrangler.toml)
Other arguments go to wrangler deploy (e.g. --outdir DIR).`;

/**
 * Secrets deploy makes when the worker has none: the ones it cannot run without
 * (GEMINI_WEBHOOK_SECRETS comes from npm run connect), and a token of each narrower scope, so
 * that nobody needs the admin token to register jobs or to look at the dashboard.
 */
const GENERATED = { EFFECT_SIGNING_SECRET: newSigningSecret, ADMIN_TOKEN: newToken, REGISTER_TOKENS: newToken, READ_TOKENS: newToken };

/** Where each token goes, as deploy tells the user. */
const TOKEN_USE = {
  REGISTER_TOKENS: "register token: for the code that submits jobs (your cron, notebook, CI job or app server registers each job with it; GEMINI_ONCE_REGISTER_TOKEN in the README's snippets). It can register and read a job back, nothing else",
  READ_TOKENS: "read token: for whoever only looks (sign in to /dashboard with it: everything shows, no action buttons; npm run connect's checks)",
  ADMIN_TOKEN: "admin token: for operators only (the dashboard's actions: retry, redeliver, settle, forget, bulk). Keep it out of job-submitting code",
};

const args = { set: {}, dryRun: false, url: undefined, config: path.join(ROOT, "wrangler.toml"), rest: [] };
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  const a = argv[i];
  const value = () => {
    if (i + 1 >= argv.length) fail(`${a} needs a value`);
    return argv[++i];
  };
  if (a === "--help" || a === "-h") {
    console.log(HELP);
    process.exit(0);
  } else if (a === "--dry-run") args.dryRun = true;
  else if (a === "--set") {
    const pair = value();
    const m = pair.match(/^([A-Z][A-Z0-9_]*)=(.*)$/s);
    // Never echo the pair: its value is a secret, typed or pasted wrong.
    const given = pair.includes("=") ? `"${pair.slice(0, pair.indexOf("=")).slice(0, 40)}=…"` : "a value with no =";
    if (!m) fail(`--set takes NAME=value with NAME in capitals (A-Z, 0-9, _), not ${given} (the value is not shown)`);
    args.set[m[1]] = m[2];
  } else if (a === "--url") args.url = value().replace(/\/+$/, "");
  else if (a === "--config" || a === "-c") args.config = path.resolve(value());
  else args.rest.push(a);
}

function fail(message) {
  console.error(`deploy: ${message}`);
  process.exit(1);
}
const say = (message) => console.log(`deploy: ${message}`);

/**
 * What the deploy needs from wrangler.toml: the OPS_KV binding's id, the [vars] names and the
 * queues the worker produces to (wrangler deploy does not create queues).
 */
function readConfig(file) {
  let text;
  try {
    text = readFileSync(file, "utf8");
  } catch (e) {
    fail(`cannot read ${file}: ${e.message}`);
  }
  const blocks = text.split(/^\s*\[/m);
  const kv = blocks.filter((b) => b.startsWith("[kv_namespaces]]")).find((b) => /^\s*binding\s*=\s*"OPS_KV"/m.test(b));
  const vars = blocks.find((b) => b.startsWith("vars]")) ?? "";
  return {
    hasKv: Boolean(kv) || /OPS_KV/.test(text.match(/kv_namespaces\s*=\s*\[[^\]]*\]/)?.[0] ?? ""),
    kvId: kv?.match(/^\s*id\s*=\s*"([^"]*)"/m)?.[1],
    vars: new Set([...vars.matchAll(/^\s*([A-Z][A-Z0-9_]*)\s*=/gm)].map((m) => m[1])),
    queues: blocks.filter((b) => b.startsWith("[queues.producers]]")).map((b) => b.match(/^\s*queue\s*=\s*"([^"]+)"/m)?.[1]).filter(Boolean),
  };
}

const config = readConfig(args.config);
const problems = [];
const notes = [];
if (!config.hasKv) problems.push(`${path.basename(args.config)} has no [[kv_namespaces]] binding OPS_KV`);
else if (config.kvId === undefined) notes.push("OPS_KV: no id in wrangler.toml, so wrangler creates the namespace on the first deploy and keeps it linked");
else if (!/^[0-9a-f]{32}$/.test(config.kvId) || /^0+$/.test(config.kvId)) {
  problems.push(`OPS_KV's id "${config.kvId}" is a placeholder, not a namespace: delete the id line (wrangler then creates the namespace) or put your namespace's id (npx wrangler kv namespace list)`);
}

for (const name of Object.keys(args.set)) {
  if (config.vars.has(name)) problems.push(`${name} is in wrangler.toml's [vars]: change it there rather than with --set (a name cannot be both)`);
}
// What is wrong in this checkout is said before anything asks Cloudflare.
if (problems.length) {
  for (const p of problems) console.error(`deploy: ${p}`);
  fail(`not deploying: ${problems.length} problem(s) above`);
}
if (process.env.GEMINI_API_KEY && args.set.GEMINI_API_KEY === undefined) args.set.GEMINI_API_KEY = process.env.GEMINI_API_KEY;
const kept = devVars(DEPLOY_VARS);
const LOGIN = "npx wrangler login once, or CLOUDFLARE_API_TOKEN in the environment";
let remote = null;
try {
  remote = (await remoteSecretNames()) ?? new Set();
} catch (e) {
  // The dry run stops here too, with the deploy's words: it passes only where the deploy would.
  fail(`${e.message}\n(${LOGIN})`);
}
/** Where the worker gets `name` from, or null: given now, wrangler.toml, or set on the worker. */
const source = (name) => (args.set[name] !== undefined ? "given" : config.vars.has(name) ? "wrangler.toml" : remote?.has(name) ? "the worker" : null);

if (!source("EFFECT_URL")) {
  problems.push("EFFECT_URL is not set: where should each completion's side effect go? npm run deploy -- --set EFFECT_URL=https://your.app/hooks/gemini");
}
const generate = {};
for (const [name, make] of Object.entries(GENERATED)) {
  if (source(name)) continue;
  if (args.dryRun) {
    const use = TOKEN_USE[name] ? `; the ${TOKEN_USE[name]}` : "";
    notes.push(`${name}: generated on deploy unless the worker has one (kept in ${DEPLOY_VARS.startsWith(`${ROOT}${path.sep}`) ? path.relative(ROOT, DEPLOY_VARS) : DEPLOY_VARS})${use}`);
  } else {
    generate[name] = kept[name] || make();
  }
}
if (!source("GEMINI_WEBHOOK_SECRETS")) notes.push("GEMINI_WEBHOOK_SECRETS: not set yet; after the deploy, npm run connect -- --url WORKER_URL registers the webhook with Gemini and sets it");
if (!source("GEMINI_API_KEY")) notes.push("advised: GEMINI_API_KEY (export it, or --set GEMINI_API_KEY=...): without it the cron cannot ask Gemini about a completion whose webhook never came, and dynamic webhooks wait");
if (!source("ALERT_URL")) notes.push("advised: ALERT_URL (--set ALERT_URL=https://hooks.slack.com/...): without it alerts go only to the logs");
if (!source("RECONCILE_BUDGET")) notes.push("on the Workers Free plan (50 subrequests per invocation): --set RECONCILE_BUDGET=45");

for (const n of notes) say(n);
if (problems.length) {
  for (const p of problems) console.error(`deploy: ${p}`);
  fail(`not deploying: ${problems.length} problem(s) above`);
}

const upload = { ...args.set, ...generate };
if (Object.keys(generate).length) {
  writeVars(DEPLOY_VARS, generate);
  say(`generated ${Object.keys(generate).join(", ")}: read them back in ${DEPLOY_VARS} (owner-only, never committed)`);
  const tokens = Object.keys(TOKEN_USE).filter((name) => generate[name]);
  if (tokens.length) {
    say(`which token goes where (each in ${DEPLOY_VARS}; [fingerprint] is how the worker's logs and history name it):`);
    for (const name of tokens) say(`  ${name} [${fingerprint(generate[name])}]: ${TOKEN_USE[name]}`);
  }
}

// wrangler deploy provisions KV itself but refuses a queue that does not exist: create the
// fan-out queue first; one that exists is kept as it is.
for (const name of config.queues) {
  if (args.dryRun) {
    notes.push(`queue ${name}: created on deploy unless it exists`);
    say(`queue ${name}: created on deploy unless it exists`);
    continue;
  }
  const made = await wrangler(["queues", "create", name]);
  if (made.code === 0) say(`queue ${name}: created`);
  else if (/already (exists|taken)|\b11009\b/i.test(`${made.stdout}${made.stderr}`)) say(`queue ${name}: exists`);
  else fail(`wrangler queues create ${name} failed (exit ${made.code}): ${(made.stderr || made.stdout).trim()}`);
}

const deployArgs = ["deploy", "--config", args.config, ...args.rest];
let secretsDir;
if (args.dryRun) {
  deployArgs.push("--dry-run");
  if (Object.keys(upload).length) say(`would upload as secrets: ${Object.keys(upload).join(", ")}`);
} else if (Object.keys(upload).length) {
  secretsDir = mkdtempSync(path.join(os.tmpdir(), "gemini-once-deploy-"));
  const file = path.join(secretsDir, "secrets.json");
  writeFileSync(file, JSON.stringify(upload), { mode: 0o600 });
  deployArgs.push("--secrets-file", file);
  say(`uploading as secrets: ${Object.keys(upload).join(", ")} (the worker's other secrets stay)`);
}
const deployed = await wrangler(deployArgs, { echo: true });
if (secretsDir) rmSync(secretsDir, { recursive: true, force: true });
if (deployed.code !== 0) fail(`wrangler deploy failed (exit ${deployed.code})`);
if (args.dryRun) {
  say("dry run passed: nothing was uploaded");
  process.exit(0);
}

const url = args.url ?? (deployed.stdout + deployed.stderr).match(/https:\/\/[^\s]+\.workers\.dev\b/)?.[0];
if (!url) {
  say("wrangler printed no workers.dev address (custom routes?): check /healthz yourself, or give --url");
  process.exit(0);
}
let health;
for (let i = 0; i < 20; i++) {
  try {
    const res = await fetch(`${url}/healthz`, { signal: AbortSignal.timeout(10_000) });
    health = { status: res.status, text: await res.text() };
    if (res.status === 200 || res.status === 503) break;
  } catch (e) {
    health = { status: 0, text: e.cause?.message ?? e.message };
  }
  await new Promise((r) => setTimeout(r, 1500));
}
if (health.status === 200) {
  const warnings = JSON.parse(health.text).warnings ?? [];
  say(`${url}/healthz: ok${warnings.length ? `, with warnings:\n  - ${warnings.join("\n  - ")}` : ""}`);
} else if (health.status === 503 && health.text.includes("GEMINI_WEBHOOK_SECRETS")) {
  say(`${url}/healthz: deployed, not connected to Gemini yet. Next: npm run connect -- --url ${url}`);
} else {
  fail(`${url}/healthz answered ${health.status}: ${health.text.slice(0, 300)}`);
}
say(`deployed ${url}${Object.keys(kept).length || Object.keys(generate).length ? ` (the tokens, REGISTER_TOKENS, READ_TOKENS and ADMIN_TOKEN, and the other secrets deploy and connect made are in ${DEPLOY_VARS})` : ""}`);
