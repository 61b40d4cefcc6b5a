// `npm run connect -- --url WORKER_URL --local` against a local stand-in of Gemini's
// WebhookService (tests/webhook_service.mjs, in the SDKs' shapes, refusing what they say the API
// refuses) and the real built worker, run as `npm start` runs it: from a .dev.vars, restarted
// when that file changes (wrangler dev reads it only when it starts).
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { chmodSync, copyFileSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync, appendFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { devVars } from "../scripts/dev_vars.mjs";
import { SDK_EVENTS, secretList } from "../scripts/deploy_vars.mjs";
import { startWorker, startServer, signedHeaders } from "./helpers.mjs";
import { startWebhookService } from "./webhook_service.mjs";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const dir = mkdtempSync(path.join(os.tmpdir(), "gemini-once-connect-"));
const devFile = path.join(dir, ".dev.vars");
let svc, w;

/** The worker's settings as `npm start` gives them: .dev.vars, minus what points nowhere here. */
const fromDevVars = () => ({ ...devVars(devFile), EFFECT_URL: "http://127.0.0.1:9/unset", STATS_FLUSH_SECONDS: "1" });

/**
 * Runs connect; whenever it rewrites `file`, restarts the worker with the new contents, as a
 * user restarts `npm start`. Resolves to {code, out}.
 */
function connect(args, file = devFile, worker = w, env = {}) {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [path.join(root, "scripts/connect.mjs"), "--dev-vars", file, "--wait", "30", ...args], {
      env: { ...process.env, GEMINI_API_KEY: "", GEMINI_API_BASE: "", ADMIN_TOKEN: "", READ_TOKENS: "", ...env },
    });
    let out = "";
    child.stdout.on("data", (d) => (out += d));
    child.stderr.on("data", (d) => (out += d));
    let seen = readFileSync(file, "utf8");
    let restarting = Promise.resolve();
    const watch = setInterval(() => {
      const now = readFileSync(file, "utf8");
      if (now !== seen && worker) {
        seen = now;
        restarting = restarting.then(() => worker.restart(fromDevVars()));
      }
    }, 100);
    child.on("close", async (code) => {
      clearInterval(watch);
      await restarting;
      resolve({ code, out });
    });
  });
}

/** The worker's admin API, with the ADMIN_TOKEN of .dev.vars. */
const admin = (p) => fetch(`${w.url}${p}`, { headers: { authorization: `Bearer ${devVars(devFile).ADMIN_TOKEN}` } }).then((r) => r.json());

/** POSTs a completion signed with `secret` alone. */
async function deliverWith(secret, name) {
  const body = JSON.stringify({ type: "batch.succeeded", version: "v1", timestamp: new Date().toISOString(), data: { id: name } });
  const res = await fetch(`${w.url}/webhooks/gemini`, { method: "POST", headers: signedHeaders(body, { secret }), body });
  return { status: res.status, body: await res.json().catch(() => null) };
}

before(async () => {
  svc = await startWebhookService();
  copyFileSync(path.join(root, ".dev.vars.example"), devFile);
  appendFileSync(devFile, `\nGEMINI_API_KEY="${svc.apiKey}"\nGEMINI_API_BASE="${svc.url}"\n`);
  // As a plain copy of the example leaves it: readable by all, until a secret is written in.
  chmodSync(devFile, 0o644);
  w = await startWorker(fromDevVars(), { http: true, persist: path.join(dir, "state") });
});
after(async () => {
  await w?.dispose();
  await svc?.close();
  rmSync(dir, { recursive: true, force: true });
});

describe("the WebhookService stand-in refuses what the SDK says the API refuses", () => {
  it("events outside WebhookSubscribedEvent, unknown fields, a missing key, a page over 1000", async () => {
    const post = (body, key = svc.apiKey) => fetch(`${svc.url}/v1beta/webhooks`, { method: "POST", headers: { "x-goog-api-key": key, "content-type": "application/json" }, body: JSON.stringify(body) });
    // A subscription that names the cancelled types: they are not subscribable.
    for (const extra of ["batch.cancelled", "interaction.cancelled"]) {
      const r = await post({ name: "x", uri: "https://example.test/webhooks/gemini", subscribed_events: [...SDK_EVENTS, extra] });
      assert.equal(r.status, 400, extra);
      assert.match((await r.json()).error.message, new RegExp(extra.replace(".", "\\.")));
    }
    assert.equal((await post({ uri: "https://example.test/x", subscribed_events: SDK_EVENTS, secret: "mine" })).status, 400);
    assert.equal((await post({ uri: "https://example.test/x", subscribed_events: [] })).status, 400);
    assert.equal((await post({ uri: "https://example.test/x", subscribed_events: SDK_EVENTS }, "wrong")).status, 403);
    assert.equal((await fetch(`${svc.url}/v1beta/webhooks?page_size=1001`, { headers: { "x-goog-api-key": svc.apiKey } })).status, 400);
    assert.equal(svc.hooks.size, 0, "nothing created by refused calls");
  });
});

describe("npm run connect -- --url WORKER_URL --local", () => {
  let id;

  it("creates one webhook with the SDK's events, keeps its secret in .dev.vars, and the worker receives the ping", async () => {
    const { code, out } = await connect(["--url", w.url, "--local"]);
    assert.equal(code, 0, out);
    assert.equal(svc.hooks.size, 1, out);
    const [hook] = svc.hooks.values();
    id = hook.id;
    assert.equal(hook.uri, `${w.url}/webhooks/gemini`);
    assert.deepEqual([...hook.events].sort(), [...SDK_EVENTS].sort());
    assert.equal(hook.events.length, 7);
    const vars = devVars(devFile);
    assert.deepEqual(secretList(vars.GEMINI_WEBHOOK_SECRETS), svc.secretsOf(id), "the one-time secret, alone");
    assert.equal(vars.GEMINI_WEBHOOK_NAME, id);
    assert.equal(statSync(devFile).mode & 0o777, 0o600, "the 0644 .dev.vars is owner-only once it holds the secret");
    assert.match(out, /ping: the worker received it/);
    // The ping reached the worker signed with the new secret, was answered 2xx, kept nowhere.
    assert.equal(svc.pings.length, 1);
    assert.equal(svc.pings[0].status, 200, svc.pings[0].answer);
    assert.equal(JSON.parse(svc.pings[0].answer).outcome, "pong");
    assert.equal((await w.kvList("dead:")).length, 0, "a ping is not a dead letter");
    assert.ok(w.events("ping").some((e) => e.type === "webhook.ping"));
    assert.ok((await admin("/v1/stats")).total.pings >= 1);
    // The worker watches the webhook's own state.
    assert.equal((await admin("/v1/config")).settings.find((s) => s.name === "GEMINI_WEBHOOK_NAME").value, id);
  });

  it("changes nothing when run again", async () => {
    const before = readFileSync(devFile, "utf8");
    const calls = svc.calls.length;
    const { code, out } = await connect(["--url", w.url, "--local"]);
    assert.equal(code, 0, out);
    assert.match(out, /already delivers/);
    assert.equal(svc.hooks.size, 1);
    assert.equal(readFileSync(devFile, "utf8"), before);
    const writes = svc.calls.slice(calls).filter((c) => c.method !== "GET" && !c.path.endsWith(":ping"));
    assert.deepEqual(writes, [], "no create, patch or rotation");
    assert.equal(svc.pings.length, 2, "pinged again, and received");
    assert.equal(svc.pings[1].status, 200);
  });

  it("--rotate keeps the old and the new secret accepted together; --finish drops the old one once Gemini does", async () => {
    const old = secretList(devVars(devFile).GEMINI_WEBHOOK_SECRETS)[0];
    const { code, out } = await connect(["--url", w.url, "--local", "--rotate"]);
    assert.equal(code, 0, out);
    const held = secretList(devVars(devFile).GEMINI_WEBHOOK_SECRETS);
    assert.equal(held.length, 2, out);
    assert.equal(held[0], old);
    assert.deepEqual(held, svc.secretsOf(id), "the worker holds exactly Gemini's live secrets");
    assert.equal((await deliverWith(held[0], "batches/rotate-old")).status, 200, "signed with the old one");
    assert.equal((await deliverWith(held[1], "batches/rotate-new")).status, 200, "signed with the new one");
    assert.match(out, /ping: the worker received it/);

    // Gemini still signs with the old one for 24 hours: finishing now is refused unless --now.
    const early = await connect(["--url", w.url, "--local", "--rotate", "--finish"]);
    assert.equal(early.code, 1, early.out);
    assert.match(early.out, /still signs with 2 secrets/);
    assert.equal(secretList(devVars(devFile).GEMINI_WEBHOOK_SECRETS).length, 2);

    const done = await connect(["--url", w.url, "--local", "--rotate", "--finish", "--now", "--no-ping"]);
    assert.equal(done.code, 0, done.out);
    assert.deepEqual(secretList(devVars(devFile).GEMINI_WEBHOOK_SECRETS), [held[1]]);
    assert.equal((await deliverWith(held[0], "batches/rotate-old-2")).status, 401, "the old one is refused");
    assert.equal((await deliverWith(held[1], "batches/rotate-new-2")).status, 200);
    assert.equal(svc.hooks.size, 1, "never a second webhook");
  });

  it("fixes a hand-made webhook in place: the SDK's events (no cancelled types), enabled again", async () => {
    const other = path.join(dir, "other.dev.vars");
    writeFileSync(other, `GEMINI_API_KEY="${svc.apiKey}"\nGEMINI_API_BASE="${svc.url}"\n`);
    chmodSync(other, 0o644);
    const url = "http://127.0.0.1:9";
    const seeded = svc.seed({ name: "by-hand", uri: `${url}/webhooks/gemini`, events: ["batch.succeeded", "batch.cancelled"], state: "disabled_due_to_failed_deliveries" });
    const { code, out } = await connect(["--url", url, "--local", "--no-ping"], other, null);
    assert.equal(code, 0, out);
    const hook = svc.hooks.get(seeded.id);
    assert.deepEqual([...hook.events].sort(), [...SDK_EVENTS].sort());
    assert.equal(hook.state, "enabled");
    assert.equal(devVars(other).GEMINI_WEBHOOK_NAME, seeded.id);
    assert.equal(statSync(other).mode & 0o777, 0o600);
    assert.match(out, /secret is not known here/);
    assert.equal(svc.hooks.size, 2, "found by its URL, not created again");
  });
});

describe("npm run connect -- --url WORKER_URL (deployed)", () => {
  it("puts the secret with wrangler and leaves its copy in a pre-existing 0644 .deploy.vars owner-only", async () => {
    // A stand-in for the wrangler CLI that takes every `secret put` and records its arguments.
    const fake = path.join(dir, "wrangler");
    const log = path.join(dir, "wrangler.log");
    writeFileSync(fake, `#!/bin/sh\ncat >/dev/null\necho "$*" >>"${log}"\n`);
    chmodSync(fake, 0o755);
    const deployVars = path.join(dir, ".deploy.vars");
    writeFileSync(deployVars, "# kept by hand\n");
    chmodSync(deployVars, 0o644);
    const url = "https://gemini-once.example.workers.dev";
    const { code, out } = await connect(["--url", url, "--no-ping"], devFile, null, { GEMINI_ONCE_WRANGLER: fake, GEMINI_ONCE_DEPLOY_VARS: deployVars });
    assert.equal(code, 0, out);
    const hook = [...svc.hooks.values()].find((h) => h.uri === `${url}/webhooks/gemini`);
    assert.ok(hook, out);
    assert.deepEqual(readFileSync(log, "utf8").trim().split("\n"), ["secret put GEMINI_WEBHOOK_SECRETS", "secret put GEMINI_WEBHOOK_NAME"]);
    const kept = devVars(deployVars);
    assert.deepEqual(secretList(kept.GEMINI_WEBHOOK_SECRETS), svc.secretsOf(hook.id));
    assert.match(readFileSync(deployVars, "utf8"), /^# kept by hand\n/);
    assert.equal(statSync(deployVars).mode & 0o777, 0o600, "the secret's copy is readable by its owner only");
  });
});

describe("npm run connect holds no more power than it needs and shows no secret", () => {
  it("reads the worker with a read token only, never the admin token", async () => {
    // A stand-in for the worker that records who asks; it never says it runs the new settings.
    const worker = await startServer(() => ({ status: 200, body: { settings: [], total: { pings: 0 } } }));
    const file = path.join(dir, "scoped.dev.vars");
    writeFileSync(file, `GEMINI_API_KEY="${svc.apiKey}"\nGEMINI_API_BASE="${svc.url}"\nADMIN_TOKEN="admin-token-not-for-connect"\nREAD_TOKENS="read-token-one read-token-two"\n`);
    try {
      const access = { CF_ACCESS_CLIENT_ID: "access-id.access", CF_ACCESS_CLIENT_SECRET: "access-secret" };
      const { out } = await connect(["--url", worker.url, "--local", "--no-ping", "--wait", "1"], file, null, access);
      assert.ok(worker.requests.length >= 1, out);
      for (const r of worker.requests) {
        assert.equal(r.method, "GET", r.url);
        assert.equal(r.headers.authorization, "Bearer read-token-one", r.url);
        // A worker behind Cloudflare Access: the service token goes with every read.
        assert.equal(r.headers["cf-access-client-id"], "access-id.access", r.url);
        assert.equal(r.headers["cf-access-client-secret"], "access-secret", r.url);
      }
      assert.doesNotMatch(out, /admin-token-not-for-connect/);
    } finally {
      await worker.close();
    }
  });

  it("says at once that the worker refused the read token (a rotation not copied to the vars file)", async () => {
    const worker = await startServer(() => ({ status: 401, body: { error: "unauthorized" } }));
    const file = path.join(dir, "stale.dev.vars");
    writeFileSync(file, `GEMINI_API_KEY="${svc.apiKey}"\nGEMINI_API_BASE="${svc.url}"\nREAD_TOKENS="rotated-away"\n`);
    try {
      const { code, out } = await connect(["--url", worker.url, "--local", "--no-ping", "--wait", "30"], file, null);
      assert.equal(code, 1, out);
      assert.match(out, /refused the read token \(401/);
      assert.equal(worker.requests.length, 1, "no waiting on a token that cannot work");
    } finally {
      await worker.close();
    }
  });

  it("refuses a plain http:// address that is not this machine, before calling Gemini", async () => {
    const calls = svc.calls.length;
    const { code, out } = await connect(["--url", "http://gemini-once.example.com", "--local", "--no-ping"], devFile, null);
    assert.equal(code, 1, out);
    assert.match(out, /must be https:\/\//);
    assert.equal(svc.calls.length, calls, "no call to Gemini");
  });

  it("keeps a new secret in .deploy.vars, not on screen, when wrangler cannot store it", async () => {
    const fake = path.join(dir, "failing-wrangler");
    writeFileSync(fake, "#!/bin/sh\ncat >/dev/null\necho 'not logged in' >&2\nexit 1\n");
    chmodSync(fake, 0o755);
    const deployVars = path.join(dir, "failed.deploy.vars");
    const url = "https://gemini-once-failing.example.workers.dev";
    const { code, out } = await connect(["--url", url, "--no-ping"], devFile, null, { GEMINI_ONCE_WRANGLER: fake, GEMINI_ONCE_DEPLOY_VARS: deployVars });
    assert.equal(code, 1, out);
    const hook = [...svc.hooks.values()].find((h) => h.uri === `${url}/webhooks/gemini`);
    const [secret] = svc.secretsOf(hook.id);
    assert.ok(!out.includes(secret), out);
    assert.match(out, /kept in .*failed\.deploy\.vars/);
    assert.deepEqual(secretList(devVars(deployVars).GEMINI_WEBHOOK_SECRETS), [secret]);
    assert.equal(statSync(deployVars).mode & 0o777, 0o600);
  });
});
