// Strangers: anyone can obtain valid dynamic-webhook tokens (a job of their own pointed at this
// worker) and put any name in the body. A name the gate has never seen is stored only once
// Gemini's status API (a local stand-in) vouches for it: a 404 leaves nothing open, no record,
// no Durable Object storage and no KV entry, and pages nobody per name; a worker-wide guard
// limits the status calls such names get and raises one aggregated alert. Beside them: a
// repeated nudge writes nothing, forget stops everything, a late registration with routes, and
// the warning for REQUIRE_REGISTRATION without GEMINI_API_KEY. Tokens are signed with a local
// RSA key whose key set a local server publishes.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, readdirSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { generateKeyPairSync, sign as rsaSign } from "node:crypto";
import { startWorker, startServer, startDestination, eventually, sleep } from "./helpers.mjs";

const { privateKey, publicKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
const jwk = { ...publicKey.export({ format: "jwk" }), kid: "k1", alg: "RS256", use: "sig" };
const b64u = (v) => Buffer.from(typeof v === "string" ? v : JSON.stringify(v)).toString("base64url");
const now = () => Math.floor(Date.now() / 1000);
function jwt(claims = {}) {
  const input = `${b64u({ alg: "RS256", kid: "k1", typ: "JWT" })}.${b64u({ exp: now() + 300, ...claims })}`;
  return `${input}.${rsaSign("sha256", Buffer.from(input), privateKey).toString("base64url")}`;
}
function nudge(worker, id, token = jwt(), type = "batch.succeeded") {
  const body = JSON.stringify({ type, version: "v1", timestamp: new Date().toISOString(), data: { id } });
  return worker.json("/webhooks/gemini", {
    method: "POST",
    headers: { "content-type": "application/json", "webhook-id": `msg_${Math.random()}`, "webhook-timestamp": String(now()), "webhook-signature": token },
    body,
  });
}

let jwks, gemini, alerts;
/** The status stand-in's answers by path: a batch state, or an HTTP status (with Retry-After 3600). */
const states = new Map();
const statusCalls = (key) => gemini.requests.filter((r) => r.url === `/v1beta/${key}`);
const alertsSent = () => alerts.requests.map((r) => JSON.parse(r.body));
const gateUsage = (worker, from = 0) =>
  worker.logs.slice(from).map((l) => { try { return JSON.parse(l); } catch { return null; } })
    .filter((e) => e && e.event === "usage" && e.object === "gate");

before(async () => {
  jwks = await startServer(() => ({ status: 200, body: { keys: [jwk] } }));
  alerts = await startServer(() => ({ status: 200 }));
  gemini = await startServer((req) => {
    const state = states.get(req.url);
    if (state === undefined) return { status: 404, body: { error: { code: 404, message: "not found" } } };
    if (typeof state === "number") return { status: state, headers: { "retry-after": "3600" }, body: { error: { code: state } } };
    return {
      status: 200,
      body: { name: req.url.replace("/v1beta/", ""), metadata: { state: `BATCH_STATE_${state}`, updateTime: new Date().toISOString() }, done: state === "SUCCEEDED" },
    };
  });
});
after(async () => {
  for (const s of [jwks, gemini, alerts]) await s?.close();
});

const base = (extra = {}) => ({
  GEMINI_JWKS_URL: `${jwks.url}/jwks`,
  GEMINI_API_BASE: gemini.url,
  GEMINI_API_KEY: "test-api-key",
  ALERT_URL: `${alerts.url}/alerts`,
  USAGE_LOG: "true",
  ...extra,
});

describe("nudges for names Gemini does not know", () => {
  let w;
  before(async () => {
    w = await startWorker(base({ STRANGER_ALERT_THRESHOLD: "20", STRANGER_NUDGES_PER_MINUTE: "100", RECONCILE_GRACE_SECONDS: "0", STUCK_AFTER_SECONDS: "0" }));
  });
  after(() => w?.dispose());

  it("50 of them leave no operation, no KV entry and no storage, and raise one aggregated alert", async () => {
    const alertsBefore = alerts.requests.length;
    const token = jwt(); // one stolen token, many invented names
    for (let i = 0; i < 50; i++) {
      const r = await nudge(w, `batches/junk-${i}`, token);
      assert.equal(r.status, 200, JSON.stringify(r.body));
      assert.equal(r.body.outcome, "unknown_to_gemini");
    }
    for (let i = 0; i < 50; i++) assert.equal(statusCalls(`batches/junk-${i}`).length, 1, "asked once each");
    assert.equal(w.events("stranger_nudge").length, 50, "each counted and logged");
    const [alert] = await eventually(() => {
      const sent = alerts.requests.slice(alertsBefore).map((r) => JSON.parse(r.body));
      return sent.length && sent;
    }, { what: "the aggregated alert" });
    assert.equal(alert.alert, "stranger_nudges");
    assert.equal(alert.count, 20, "raised when the threshold was crossed");
    await w.scheduled(); // a cron pass finds nothing open for them
    await sleep(1500);
    const sent = alerts.requests.slice(alertsBefore).map((r) => JSON.parse(r.body));
    assert.deepEqual(sent.map((a) => a.alert), ["stranger_nudges"], "one alert, none per name");
    assert.deepEqual((await w.kvList("open:")).map((k) => k.name), [], "no open: entry");
    assert.deepEqual((await w.kvList("op:")).map((k) => k.name), [], "no op: entry");
    assert.deepEqual((await w.kvList("")).map((k) => k.name), ["jwks:cache"], "no KV write but the key set's copy");
    const usage = gateUsage(w);
    assert.ok(usage.length >= 50, "each name reached its gate");
    assert.deepEqual(usage.filter((u) => u.rows_written || u.kv_writes || u.alarm_writes), [], "no gate stored anything");
    assert.equal((await w.inspect("batches/junk-7")).status, 404);
    await eventually(async () => (await w.admin("/v1/stats")).body.total.stranger_nudges === 50, { what: "the count in /v1/stats", everyMs: 500 });
  });

  it("a name Gemini knows is applied from what the status API says, without a confirmation round", async () => {
    states.set("/v1beta/batches/genuine-unregistered", "SUCCEEDED");
    const r = await nudge(w, "batches/genuine-unregistered");
    assert.equal(r.status, 200);
    assert.equal(r.body.outcome, "applied");
    const op = (await w.inspect("batches/genuine-unregistered")).body;
    assert.equal(op.status, "succeeded");
    assert.equal(op.settled_by, "webhook");
  });

  it("a name Gemini knows but has not finished waits in its record, whose alarm asks again", async () => {
    const key = "batches/genuine-running";
    states.set(`/v1beta/${key}`, "RUNNING");
    const r = await nudge(w, key);
    assert.equal(r.status, 200);
    assert.equal(r.body.outcome, "confirming");
    const op = (await w.inspect(key)).body;
    assert.ok(["pending", "running"].includes(op.status), op.status); // running once the gate asked
    assert.equal(op.registered, false);
    // The edge asked once; the gate's alarm asks again (and keeps asking with backoff), and
    // applies the state it is told, forward only.
    await eventually(() => statusCalls(key).length >= 2, { what: "the gate's own confirmation" });
    await eventually(async () => (await w.inspect(key)).body.status === "running", { what: "the running state applied" });
  });

  it("a name Gemini cannot be asked about now is answered 503, so Gemini retries; nothing is stored", async () => {
    states.set("/v1beta/batches/api-down", 503);
    const r = await nudge(w, "batches/api-down");
    assert.equal(r.status, 503);
    assert.equal((await w.inspect("batches/api-down")).status, 404);
  });

  it("a registered operation Gemini does not know alerts unknown_to_gemini once, not stuck on top", async () => {
    const alertsBefore = alerts.requests.length;
    await w.register("batches/registered-unknown", "billing");
    assert.equal((await nudge(w, "batches/registered-unknown")).body.outcome, "confirming");
    await eventually(() => alertsSent().slice(alertsBefore).some((a) => a.key === "batches/registered-unknown"), { what: "the alert" });
    await w.ledger("batches/registered-unknown", (m) => (m.alerts || []).includes("unknown_to_gemini"));
    await w.scheduled(); // past STUCK_AFTER_SECONDS=0: it would alert stuck
    await sleep(1500);
    const mine = alertsSent().slice(alertsBefore).filter((a) => a.key === "batches/registered-unknown");
    assert.deepEqual(mine.map((a) => a.alert), ["unknown_to_gemini"]);
  });
});

describe("the guard's limit", () => {
  it("past STRANGER_NUDGES_PER_MINUTE unknown names, unregistered nudges are answered 503 unasked; registered ones still go through", async () => {
    const w = await startWorker(base({ STRANGER_NUDGES_PER_MINUTE: "5", STRANGER_ALERT_THRESHOLD: "1000" }));
    try {
      for (let i = 0; i < 5; i++) assert.equal((await nudge(w, `batches/limited-${i}`)).status, 200);
      const refused = await w.fetch("/webhooks/gemini", {
        method: "POST",
        headers: { "content-type": "application/json", "webhook-id": "m", "webhook-timestamp": String(now()), "webhook-signature": jwt() },
        body: JSON.stringify({ type: "batch.succeeded", data: { id: "batches/limited-5" } }),
      });
      assert.equal(refused.status, 503);
      assert.ok(Number(refused.headers.get("retry-after")) >= 1);
      await refused.text();
      assert.equal(statusCalls("batches/limited-5").length, 0, "no status call past the limit");
      states.set("/v1beta/batches/limited-registered", 503);
      await w.register("batches/limited-registered", "billing");
      assert.equal((await nudge(w, "batches/limited-registered")).body.outcome, "confirming");
      assert.ok(w.events("rejected").some((e) => e.reason === "stranger_limit"));
    } finally {
      await w.dispose();
    }
  });
});

describe("a command that changes nothing writes nothing", () => {
  it("repeated identical nudges for a known operation keep its version and write no row and no KV entry", async () => {
    const w = await startWorker(base());
    try {
      states.set("/v1beta/batches/steady", 503); // the confirmation then waits an hour (Retry-After)
      await w.register("batches/steady", "billing");
      const token = jwt();
      assert.equal((await nudge(w, "batches/steady", token)).body.outcome, "confirming");
      await eventually(() => statusCalls("batches/steady").length === 1, { what: "the first status call" });
      const settled = await eventually(async () => {
        const op = (await w.inspect("batches/steady")).body;
        const { metadata } = await (await w.kv()).getWithMetadata("op:batches/steady");
        return metadata && metadata.version === op.version && op;
      }, { what: "the ledger to follow the record" });
      await sleep(1500);
      const from = w.logs.length;
      for (let i = 0; i < 10; i++) {
        const r = await nudge(w, "batches/steady", token);
        assert.equal(r.body.outcome, "confirming");
      }
      await sleep(2500); // the counters' flush (STATS_FLUSH_SECONDS=1) runs meanwhile
      const op = (await w.inspect("batches/steady")).body;
      assert.equal(op.version, settled.version, "no version bump");
      const { metadata } = await (await w.kv()).getWithMetadata("op:batches/steady");
      assert.equal(metadata.version, settled.version, "no projection");
      const usage = gateUsage(w, from);
      const fetches = usage.filter((u) => u.invocation === "fetch");
      assert.ok(fetches.length >= 10);
      assert.deepEqual(fetches.filter((u) => u.rows_written), [], "no row written by a repeated nudge");
      assert.deepEqual(usage.filter((u) => u.kv_writes), [], "no KV write");
      assert.equal(statusCalls("batches/steady").length, 1, "no extra status call");
      assert.equal(op.history.filter((h) => h.what === "nudged").length, 1, "one history row");
    } finally {
      await w.dispose();
    }
  });
});

describe("forget stops everything", () => {
  it("nudges for a forgotten operation call no status API and raise no alert", async () => {
    const w = await startWorker(base({ RECONCILE_GRACE_SECONDS: "0", STUCK_AFTER_SECONDS: "0" }));
    try {
      const alertsBefore = alerts.requests.length;
      await w.register("batches/forgotten", "billing");
      await w.ledger("batches/forgotten");
      const f = await w.admin("/v1/operations/batches%2Fforgotten/forget", { method: "POST", body: JSON.stringify({ reason: "job deleted" }) });
      assert.equal(f.status, 200, JSON.stringify(f.body));
      await w.ledger("batches/forgotten", (m) => m.forgotten);
      await eventually(async () => (await w.kvList("open:")).length === 0, { what: "the index entry to go" });
      for (let i = 0; i < 3; i++) {
        const r = await nudge(w, "batches/forgotten");
        assert.equal(r.status, 200);
        assert.equal(r.body.outcome, "ignored_forgotten");
      }
      await w.scheduled();
      await sleep(1500);
      assert.equal(statusCalls("batches/forgotten").length, 0, "never asked");
      assert.deepEqual(alertsSent().slice(alertsBefore).filter((a) => a.key === "batches/forgotten"), [], "never alerted");
    } finally {
      await w.dispose();
    }
  });
});

describe("REQUIRE_REGISTRATION=true", () => {
  it("leaves no Durable Object storage for an unregistered name", async () => {
    const dir = mkdtempSync(path.join(tmpdir(), "strangers-"));
    const w = await startWorker(base({ REQUIRE_REGISTRATION: "true" }), { persist: dir });
    try {
      const r = await nudge(w, "batches/nobody-registered");
      assert.equal(r.status, 200);
      assert.equal(r.body.outcome, "ignored_unregistered");
      const h = await w.deliver("batch.succeeded", "batches/nobody-registered-hmac");
      assert.equal(h.body.outcome, "ignored_unregistered");
      const untouched = gateUsage(w);
      assert.equal(untouched.length, 2);
      for (const u of untouched) {
        assert.equal(u.rows_written, 0, JSON.stringify(u));
        // One read of which tables exist (none): not even the schema is written.
        assert.equal(u.sql_statements, 1, JSON.stringify(u));
      }
      assert.equal(statusCalls("batches/nobody-registered").length, 0);
      // For comparison, a registered operation's gate writes its tables and record.
      const from = w.logs.length;
      await w.register("batches/somebody-registered", "billing");
      const [written] = gateUsage(w, from);
      assert.ok(written.rows_written > 0 && written.db_bytes > untouched[0].db_bytes, JSON.stringify(written));
      for (const u of untouched) assert.ok(u.db_bytes <= 4096, `at most the empty database's one page: ${u.db_bytes}`);
      // Miniflare's persisted objects: only the registered operation's database holds anything.
      const all = (d) => readdirSync(d, { withFileTypes: true }).flatMap((e) =>
        e.isDirectory() ? all(path.join(d, e.name)) : [path.join(d, e.name)]);
      const gateDbs = all(dir).filter((f) => /OperationGate\/[0-9a-f]{64}\.sqlite$/.test(f));
      assert.equal(gateDbs.length, 3, gateDbs.join());
      const bytes = (f) => statSync(f).size + (existsSync(`${f}-wal`) ? statSync(`${f}-wal`).size : 0);
      assert.equal(gateDbs.filter((f) => bytes(f) > 4096).length, 1, "one database with anything written to it");
    } finally {
      await w.dispose();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("warns in /healthz and the dashboard's configuration when GEMINI_API_KEY is not set", async () => {
    const w = await startWorker(base({ REQUIRE_REGISTRATION: "true", GEMINI_API_KEY: undefined }));
    try {
      const health = await w.json("/healthz");
      assert.equal(health.status, 200);
      assert.ok(health.body.warnings.some((x) => x.includes("REQUIRE_REGISTRATION") && x.includes("GEMINI_API_KEY")), JSON.stringify(health.body));
      const config = await w.admin("/v1/config");
      assert.ok(config.body.warnings.some((x) => x.includes("REQUIRE_REGISTRATION")), "the dashboard shows /v1/config's warnings");
      const page = await (await w.fetch("/dashboard")).text();
      assert.ok(page.includes("config.warnings"), "the dashboard renders them");
    } finally {
      await w.dispose();
    }
    const keyed = await startWorker(base({ REQUIRE_REGISTRATION: "true" }));
    try {
      assert.equal((await keyed.json("/healthz")).body.warnings, undefined);
    } finally {
      await keyed.dispose();
    }
  });
});

describe("a completion that arrives before its registration, with EFFECT_ROUTES", () => {
  it("waits UNREGISTERED_HOLD_SECONDS for the registration, then goes to the kind's route once", async () => {
    const dest = await startDestination(() => ({ status: 200 }));
    const w = await startWorker(base({
      EFFECT_URL: `${dest.url}/effects`,
      EFFECT_ROUTES: JSON.stringify({ billing: `${dest.url}/billing` }),
      UNREGISTERED_HOLD_SECONDS: "60",
    }));
    try {
      assert.equal((await w.deliver("batch.succeeded", "batches/early")).body.outcome, "applied");
      await sleep(500);
      assert.equal(dest.requests.length, 0, "held for a registration");
      const reg = await w.register("batches/early", "billing");
      assert.equal(reg.body.kind_change, "filled", JSON.stringify(reg.body));
      await eventually(() => dest.requests.length === 1, { what: "the effect" });
      await sleep(500);
      assert.equal(dest.requests.length, 1);
      assert.equal(dest.requests[0].url, "/billing");
      assert.equal(JSON.parse(dest.requests[0].body).kind, "billing");
    } finally {
      await w.dispose();
      await dest.close();
    }
  });

  it("a registration after the first attempt went out leaves the kind alone: one webhook-id, one body", async () => {
    let failFirst = true;
    const dest = await startDestination(() => {
      if (failFirst) { failFirst = false; return { status: 503 }; }
      return { status: 200 };
    });
    const w = await startWorker(base({
      EFFECT_URL: `${dest.url}/effects`,
      EFFECT_ROUTES: JSON.stringify({ billing: `${dest.url}/billing` }),
      UNREGISTERED_HOLD_SECONDS: "0",
      EFFECT_RETRY_BASE_SECONDS: "2",
      EFFECT_RETRY_MAX_SECONDS: "2",
    }));
    try {
      await w.deliver("batch.succeeded", "batches/too-late");
      await eventually(() => dest.requests.length === 1, { what: "the first attempt" });
      const reg = await w.register("batches/too-late", "billing");
      assert.equal(reg.body.kind_change, "too_late", JSON.stringify(reg.body));
      await eventually(() => dest.requests.length === 2, { what: "the retry" });
      const [first, second] = dest.requests;
      assert.equal(first.url, "/effects");
      assert.equal(second.url, "/effects", "the same destination");
      assert.equal(second.headers["webhook-id"], first.headers["webhook-id"]);
      const body = (r) => { const b = JSON.parse(r.body); delete b.attempt; return b; };
      assert.deepEqual(body(second), body(first), "the same body under the same webhook-id");
      assert.equal(JSON.parse(second.body).kind, null);
    } finally {
      await w.dispose();
      await dest.close();
    }
  });
});
