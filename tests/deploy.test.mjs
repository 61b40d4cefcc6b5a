// `npm run deploy`. It runs with a stand-in for the wrangler CLI that records what it is asked
// and remembers the secrets it was given, as a logged-in Cloudflare account would; a dry run's
// bundling is the real wrangler's (it checks the bindings of this checkout's wrangler.toml
// without contacting Cloudflare, which these machines cannot reach). The script's checks,
// generation and /healthz check are the real ones, against the built worker. Logged out is the
// real wrangler too, with a configuration directory of its own that holds no login: offline and
// non-interactive, it fails at once, and the dry run fails with the deploy's words.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync, chmodSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { devVars } from "../scripts/dev_vars.mjs";
import { fingerprint } from "../scripts/deploy_vars.mjs";
import { startWorker } from "./helpers.mjs";

const run = promisify(execFile);
const dir = mkdtempSync(path.join(tmpdir(), "gemini-once-deploy-test-"));
const fake = path.join(dir, "wrangler");
const log = path.join(dir, "wrangler.log");
const state = path.join(dir, "account.json");
const deployVars = path.join(dir, ".deploy.vars");

// The Cloudflare CLI's stand-in: `secret list` (JSON, or "does not exist" before the first
// deploy), `deploy` (takes --secrets-file, prints the workers.dev address), `secret put`.
writeFileSync(fake, `#!/usr/bin/env node
const fs = require("fs");
const state = fs.existsSync(process.env.FAKE_STATE) ? JSON.parse(fs.readFileSync(process.env.FAKE_STATE, "utf8")) : { worker: false, secrets: {} };
const args = process.argv.slice(2);
const entry = { args };
let code = 0;
if (args[0] === "secret" && args[1] === "list") {
  if (!state.worker) { console.error("X [ERROR] This Worker does not exist on your account. [code: 10007]"); code = 1; }
  else console.log(JSON.stringify(Object.keys(state.secrets).map((name) => ({ name, type: "secret_text" }))));
} else if (args[0] === "queues" && args[1] === "create") {
  state.queues = state.queues || [];
  if (state.queues.includes(args[2])) { console.error("X [ERROR] A request to the Cloudflare API failed. Queue name already taken [code: 11009]"); code = 1; }
  else state.queues.push(args[2]);
} else if (args[0] === "deploy" && args.includes("--dry-run")) {
  // The bundling is the project's wrangler's: it contacts nothing for a dry run.
  const r = require("child_process").spawnSync(process.env.REAL_WRANGLER, args, { stdio: "inherit" });
  code = r.status ?? 1;
} else if (args[0] === "deploy") {
  const i = args.indexOf("--secrets-file");
  if (i >= 0) { entry.secretsFile = args[i + 1]; entry.secrets = JSON.parse(fs.readFileSync(args[i + 1], "utf8")); Object.assign(state.secrets, entry.secrets); }
  state.worker = true;
  console.log("Deployed gemini-once triggers\\n  https://gemini-once.example.workers.dev\\n  schedule: */5 * * * *");
}
fs.appendFileSync(process.env.FAKE_LOG, JSON.stringify(entry) + "\\n");
fs.writeFileSync(process.env.FAKE_STATE, JSON.stringify(state));
process.exit(code);
`);
chmodSync(fake, 0o755);

// No login anywhere: no token in the environment, and a wrangler configuration directory
// (where `wrangler login` keeps its credentials) that is empty.
const loggedOutEnv = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^CLOUDFLARE_/.test(k)));
loggedOutEnv.XDG_CONFIG_HOME = path.join(dir, "config");

const calls = () => (existsSync(log) ? readFileSync(log, "utf8").trim().split("\n").filter(Boolean).map((l) => JSON.parse(l)) : []);
const reset = () => rmSync(log, { force: true }) || rmSync(state, { force: true }) || rmSync(deployVars, { force: true });

/** Runs `npm run deploy -- args` with the stand-in; resolves to {code, out}. */
async function deploy(args, env = {}) {
  try {
    const { stdout, stderr } = await run(process.execPath, ["scripts/deploy.mjs", ...args], {
      env: { ...loggedOutEnv, GEMINI_API_KEY: "", CI: "true", GEMINI_ONCE_WRANGLER: fake, REAL_WRANGLER: path.resolve("node_modules/.bin/wrangler"), GEMINI_ONCE_DEPLOY_VARS: deployVars, FAKE_LOG: log, FAKE_STATE: state, ...env },
      maxBuffer: 16 * 1024 * 1024,
      timeout: 600_000,
    });
    return { code: 0, out: stdout + stderr };
  } catch (e) {
    return { code: e.code, out: `${e.stdout}${e.stderr}` };
  }
}

let w;
before(async () => {
  // Deployed, not yet connected to Gemini: no GEMINI_WEBHOOK_SECRETS.
  w = await startWorker({ GEMINI_WEBHOOK_SECRETS: undefined }, { http: true });
});
after(async () => {
  await w?.dispose();
  rmSync(dir, { recursive: true, force: true });
});

describe("npm run deploy -- --dry-run", () => {
  it("passes on this checkout's wrangler.toml as it is, logged in, and says what is missing", async () => {
    reset();
    const outdir = path.join(dir, "bundle");
    const { code, out } = await deploy(["--dry-run", "--outdir", outdir, "--set", "EFFECT_URL=https://dest.example/hooks/gemini"]);
    assert.equal(code, 0, out);
    // It asked Cloudflare which secrets the worker has, as the deploy does, and uploaded nothing.
    assert.deepEqual(calls().map((c) => c.args.slice(0, 2)), [["secret", "list"], ["deploy", "--config"]]);
    assert.ok(calls()[1].args.includes("--dry-run") && !calls()[1].args.includes("--secrets-file"));
    for (const binding of ["env.OPERATION_GATE (OperationGate)", "env.RECONCILE_LEASE (ReconcileLease)", "env.STATS (StatsShard)", "env.DESTINATION_DESK (DestinationDesk)", "env.STRANGER_WATCH (StrangerWatch)", "env.RETIRED_NAMES (RetiredNames)", "env.RESULT_SENDER (ResultSender)", "env.OPS_KV"]) {
      assert.ok(out.includes(binding), `${binding} missing from:\n${out}`);
    }
    assert.match(out, /--dry-run: exiting now/);
    assert.match(out, /dry run passed: nothing was uploaded/);
    assert.match(out, /OPS_KV: no id in wrangler.toml, so wrangler creates the namespace/);
    assert.match(out, /npm run connect/);
    assert.match(out, /advised: ALERT_URL/);
    // The three tokens, and which goes where.
    assert.match(out, /REGISTER_TOKENS: generated on deploy .*register token: for the code that submits jobs/);
    assert.match(out, /READ_TOKENS: generated on deploy .*read token: for whoever only looks/);
    assert.match(out, /ADMIN_TOKEN: generated on deploy .*admin token: for operators only/);
    assert.ok(!existsSync(deployVars), "a dry run generates nothing");
  });

  it("fails where the deploy would: no EFFECT_URL is refused, not passed", async () => {
    reset();
    const { code, out } = await deploy(["--dry-run"]);
    assert.equal(code, 1, out);
    assert.match(out, /EFFECT_URL is not set/);
    assert.match(out, /not deploying: 1 problem/);
    assert.doesNotMatch(out, /dry run passed/);
  });

  it("fails logged out, with the words the deploy fails with, as --help, OPERATIONS.md and the README say", async () => {
    // The real wrangler, logged out: offline and non-interactive, it fails at once.
    const args = ["--set", "EFFECT_URL=https://dest.example/hooks/gemini"];
    const dry = await deploy(["--dry-run", ...args], { GEMINI_ONCE_WRANGLER: "" });
    const real = await deploy(args, { GEMINI_ONCE_WRANGLER: "" });
    assert.equal(dry.code, 1, dry.out);
    assert.equal(real.code, 1, real.out);
    assert.doesNotMatch(dry.out, /dry run passed/);
    // wrangler names a log file of its own each run; the rest is word for word the same.
    const words = (out) => out.replace(/wrangler-[\w.-]+\.log/g, "wrangler-LOG.log").trim();
    assert.equal(words(dry.out), words(real.out));
    assert.match(dry.out, /^deploy: wrangler secret list failed \(1\): /m);
    assert.match(dry.out, /\(npx wrangler login once, or CLOUDFLARE_API_TOKEN in the environment\)$/m);
    // What the docs say about it.
    const { stdout: help } = await run(process.execPath, ["scripts/deploy.mjs", "--help"]);
    const said = /fails wherever the deploy would/;
    assert.match(help.replace(/\s+/g, " "), said);
    assert.match(help.replace(/\s+/g, " "), /needs wrangler logged in/);
    for (const doc of ["docs/OPERATIONS.md", "README.md"]) {
      const text = readFileSync(doc, "utf8").replace(/\s+/g, " ");
      assert.match(text, said, doc);
      assert.match(text, /--dry-run[^.]*needs wrangler logged in|needs wrangler logged in[^.]*--dry-run|dry run[^.]*needs wrangler logged in/, doc);
      assert.doesNotMatch(text, /could not ask Cloudflare|judges as for a worker that has none|without contacting Cloudflare/, doc);
    }
  });

  it("refuses a placeholder KV id before running wrangler", async () => {
    reset();
    const config = path.join(dir, "placeholder.toml");
    writeFileSync(config, readFileSync("wrangler.toml", "utf8").replace('binding = "OPS_KV"', 'binding = "OPS_KV"\nid = "00000000000000000000000000000000"'));
    const { code, out } = await deploy(["--dry-run", "--config", config]);
    assert.equal(code, 1, out);
    assert.match(out, /OPS_KV's id "0{32}" is a placeholder/);
    assert.deepEqual(calls(), []);
  });

  it("never prints the value of a malformed --set pair, which may be a secret", async () => {
    reset();
    const secret = "sk-live-0123456789abcdef";
    for (const pair of [`gemini_api_key=${secret}`, secret, `GEMINI API KEY=${secret}`]) {
      const { code, out } = await deploy(["--dry-run", "--set", pair]);
      assert.equal(code, 1, out);
      assert.match(out, /--set takes NAME=value/);
      assert.ok(!out.includes(secret), out);
    }
    assert.deepEqual(calls(), []);
  });
});

describe("npm run deploy on a fresh account, then again", () => {
  it("refuses to deploy without EFFECT_URL, having asked only which secrets exist", async () => {
    reset();
    const { code, out } = await deploy(["--url", w.url]);
    assert.equal(code, 1, out);
    assert.match(out, /EFFECT_URL is not set/);
    assert.deepEqual(calls().map((c) => c.args.slice(0, 2)), [["secret", "list"]]);
    assert.ok(!existsSync(deployVars));
  });

  it("generates the missing secrets, keeps them for the user, deploys them with the given ones, checks /healthz", async () => {
    reset();
    // A .deploy.vars made by hand, readable by all: it ends owner-only once secrets are in it.
    writeFileSync(deployVars, "# kept by hand\n");
    chmodSync(deployVars, 0o644);
    const { code, out } = await deploy(["--set", "EFFECT_URL=https://dest.example/hooks/gemini", "--url", w.url], { GEMINI_API_KEY: "AIza-test" });
    assert.equal(code, 0, out);
    const deployCall = calls().find((c) => c.args[0] === "deploy");
    assert.ok(deployCall, out);
    // The fan-out queue exists before the deploy that binds it.
    const names = calls().map((c) => c.args.slice(0, 3).join(" "));
    assert.ok(names.indexOf("queues create gemini-once-polls") >= 0, names.join("; "));
    assert.ok(names.indexOf("queues create gemini-once-polls") < names.findIndex((n) => n.startsWith("deploy")), names.join("; "));
    assert.deepEqual(Object.keys(deployCall.secrets).sort(), ["ADMIN_TOKEN", "EFFECT_SIGNING_SECRET", "EFFECT_URL", "GEMINI_API_KEY", "READ_TOKENS", "REGISTER_TOKENS"]);
    assert.equal(deployCall.secrets.EFFECT_URL, "https://dest.example/hooks/gemini");
    assert.match(deployCall.secrets.EFFECT_SIGNING_SECRET, /^whsec_[A-Za-z0-9+/]{43}=$/);
    const tokens = ["ADMIN_TOKEN", "REGISTER_TOKENS", "READ_TOKENS"].map((name) => deployCall.secrets[name]);
    for (const token of tokens) assert.match(token, /^[A-Za-z0-9_-]{43}$/, "one token, which the worker reads as a list of one");
    assert.equal(new Set(tokens).size, 3, "a token has one scope");
    assert.ok(!existsSync(deployCall.secretsFile), "the secrets file is removed after the deploy");
    const kept = devVars(deployVars);
    assert.equal(kept.ADMIN_TOKEN, deployCall.secrets.ADMIN_TOKEN, "the user reads the admin token back here");
    assert.equal(kept.REGISTER_TOKENS, deployCall.secrets.REGISTER_TOKENS, "and the register token");
    assert.equal(kept.READ_TOKENS, deployCall.secrets.READ_TOKENS, "and the read token");
    // Which goes where, each named by the fingerprint the worker's logs use, never printed itself.
    for (const [name, use] of [["REGISTER_TOKENS", /the code that submits jobs/], ["READ_TOKENS", /sign in to \/dashboard with it/], ["ADMIN_TOKEN", /for operators only/]]) {
      const line = out.split("\n").find((l) => l.includes(`${name} [${fingerprint(kept[name])}]`));
      assert.ok(line, `${name} with its fingerprint in:\n${out}`);
      assert.match(line, use);
      assert.ok(!out.includes(kept[name]), `${name}'s value is not printed`);
    }
    assert.equal(kept.EFFECT_SIGNING_SECRET, deployCall.secrets.EFFECT_SIGNING_SECRET);
    assert.equal(statSync(deployVars).mode & 0o777, 0o600);
    assert.match(readFileSync(deployVars, "utf8"), /^# kept by hand\n/, "its own lines stay");
    assert.ok(out.includes(deployVars), out);
    // The worker answers 503 naming GEMINI_WEBHOOK_SECRETS until connected: the next step.
    assert.match(out, /not connected to Gemini yet. Next: npm run connect -- --url /);
  });

  it("changes nothing on a second run: nothing generated, nothing uploaded", async () => {
    const before = readFileSync(deployVars, "utf8");
    const seen = calls().length;
    await w.restart({ GEMINI_WEBHOOK_SECRETS: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", ALERT_URL: "https://alerts.example/x" });
    const { code, out } = await deploy(["--url", w.url]);
    assert.equal(code, 0, out);
    const deployCall = calls().slice(seen).find((c) => c.args[0] === "deploy");
    assert.ok(deployCall && !deployCall.args.includes("--secrets-file"), JSON.stringify(deployCall));
    assert.equal(readFileSync(deployVars, "utf8"), before);
    assert.match(out, /queue gemini-once-polls: exists/, "an existing queue is kept");
    assert.match(out, /healthz: ok/);
  });
});
