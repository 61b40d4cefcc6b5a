// Strangers: anyone can obtain valid dynamic-webhook tokens (a job of their own pointed at this
// worker) and put any name in the body. A nudge only hastens an operation the worker holds: one
// for any other name (whatever Gemini's status API, a local stand-in, would say of it) makes no
// status call and leaves nothing open, no record, no Durable Object storage and no KV entry,
// pages nobody per name, and raises one aggregated alert. A token's claims never reach a side
// effect as verified; nothing runs twice after retention (the gate keeps nothing, its name is
// kept in its retired names' shard),
// however late a nudge, a poll or a signed delivery comes; a registered job whose nudge beat its registration still settles once.
// Beside them: a repeated nudge writes nothing, forget stops everything, a late registration
// with routes, and the warning for REQUIRE_REGISTRATION without GEMINI_API_KEY. Tokens are
// signed with a local RSA key whose key set a local server publishes.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, readdirSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { generateKeyPairSync, sign as rsaSign } from "node:crypto";
import { startWorker, startServer, startDestination, eventually, sleep, signedHeaders } from "./helpers.mjs";

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

let jwks, gemini, alerts, dest;
/**
 * The status stand-in's answers by path: a batch state, an HTTP status (with Retry-After
 * 3600), or a whole body (an object) answered 200.
 */
const states = new Map();
const statusCalls = (key) => gemini.requests.filter((r) => r.url === `/v1beta/${key}`);
const alertsSent = () => alerts.requests.map((r) => JSON.parse(r.body));
const gateUsage = (worker, from = 0) =>
  worker.logs.slice(from).map((l) => { try { return JSON.parse(l); } catch { return null; } })
    .filter((e) => e && e.event === "usage" && e.object === "gate");

before(async () => {
  dest = await startDestination(() => ({ status: 200 }));
  jwks = await startServer(() => ({ status: 200, body: { keys: [jwk] } }));
  alerts = await startServer(() => ({ status: 200 }));
  gemini = await startServer((req) => {
    const state = states.get(req.url);
    if (state === undefined) return { status: 404, body: { error: { code: 404, message: "not found" } } };
    if (typeof state === "number") return { status: state, headers: { "retry-after": "3600" }, body: { error: { code: state } } };
    if (typeof state === "object") return { status: 200, body: state };
    return {
      status: 200,
      body: { name: req.url.replace("/v1beta/", ""), metadata: { state: `BATCH_STATE_${state}`, updateTime: new Date().toISOString() }, done: state === "SUCCEEDED" },
    };
  });
});
after(async () => {
  for (const s of [jwks, gemini, alerts, dest]) await s?.close();
  dest?.assertAllValid();
});
const effectsFor = (key) => dest.requests.filter((r) => r.headers["idempotency-key"] === key).map((r) => JSON.parse(r.body));

const base = (extra = {}) => ({
  GEMINI_JWKS_URL: `${jwks.url}/jwks`,
  GEMINI_API_BASE: gemini.url,
  GEMINI_API_KEY: "test-api-key",
  ALERT_URL: `${alerts.url}/alerts`,
  EFFECT_URL: `${dest.url}/effects`,
  USAGE_LOG: "true",
  ...extra,
});

describe("nudges for operations the worker does not hold", () => {
  let w;
  before(async () => {
    w = await startWorker(base({ STRANGER_ALERT_THRESHOLD: "20", RECONCILE_GRACE_SECONDS: "0", STUCK_AFTER_SECONDS: "0" }));
  });
  after(() => w?.dispose());

  it("a concurrent burst of 200 makes no status call, stores nothing, and raises one aggregated alert", async () => {
    const alertsBefore = alerts.requests.length;
    const callsBefore = gemini.requests.length;
    // Whatever Gemini would answer for them: 403, 404, 429, 503, or a finished job of
    // someone else's.
    const answers = [403, undefined, 429, 503, "SUCCEEDED"];
    const names = Array.from({ length: 200 }, (_, i) => `batches/junk-${i}`);
    names.forEach((name, i) => answers[i % 5] !== undefined && states.set(`/v1beta/${name}`, answers[i % 5]));
    const token = jwt(); // one stolen token, many invented names
    const outcomes = [];
    for (let i = 0; i < names.length; i += 20) {
      const batch = await Promise.all(names.slice(i, i + 20).map((name) => nudge(w, name, token)));
      outcomes.push(...batch);
    }
    for (const r of outcomes) {
      assert.equal(r.status, 200, JSON.stringify(r.body));
      assert.equal(r.body.outcome, "not_held");
    }
    assert.equal(gemini.requests.length - callsBefore, 0, "no status call for any of them");
    // Log lines come through workerd's output, apart from the answers: wait for them.
    await eventually(() => w.events("stranger_nudge").length >= 200, { what: "the 200 stranger_nudge lines" });
    assert.equal(w.events("stranger_nudge").length, 200, "each counted and logged");
    const [alert] = await eventually(() => {
      const sent = alerts.requests.slice(alertsBefore).map((r) => JSON.parse(r.body));
      return sent.length && sent;
    }, { what: "the aggregated alert" });
    assert.equal(alert.alert, "stranger_nudges");
    assert.equal(alert.count, 20, "raised when the threshold was crossed");
    assert.match(alert.text, /register/);
    await w.scheduled(); // a cron pass finds nothing open for them
    await sleep(1500);
    assert.equal(gemini.requests.length - callsBefore, 0, "nor from the cron pass");
    const sent = alerts.requests.slice(alertsBefore).map((r) => JSON.parse(r.body));
    assert.deepEqual(sent.map((a) => a.alert), ["stranger_nudges"], "one alert, none per name");
    assert.deepEqual((await w.kvList("open:")).map((k) => k.name), [], "no open: entry");
    assert.deepEqual((await w.kvList("op:")).map((k) => k.name), [], "no op: entry");
    assert.deepEqual((await w.kvList("")).map((k) => k.name), ["jwks:cache"], "no KV write but the key set's copy");
    await eventually(() => gateUsage(w).length >= 200, { what: "each name's gate usage line" });
    const usage = gateUsage(w);
    assert.deepEqual(usage.filter((u) => u.rows_written || u.kv_writes || u.alarm_writes), [], "no gate stored anything");
    assert.equal((await w.inspect("batches/junk-4")).status, 404);
    assert.equal(effectsFor("batches/junk-4").length, 0);
    await eventually(async () => (await w.admin("/v1/stats")).body.total.stranger_nudges === 200, { what: "the count in /v1/stats", everyMs: 500 });
  });

  it("a registered job whose nudge came before its registration settles once, by the registration's poll", async () => {
    const key = "batches/nudged-first";
    states.set(`/v1beta/${key}`, "SUCCEEDED");
    const early = await nudge(w, key, jwt({ user_metadata: { tenant: "claimed" } }));
    assert.equal(early.body.outcome, "not_held", "answered 2xx: Gemini does not retry it");
    assert.equal(statusCalls(key).length, 0);
    assert.equal((await w.register(key, "billing", { user_metadata: { tenant: "ours" } })).status, 201);
    // The gate projects the registration to the ledger from its alarm, just after it answers:
    // a pass that listed before that would not see it (the next pass would).
    await w.ledger(key);
    await w.scheduled(); // RECONCILE_GRACE_SECONDS=0: the pass polls it now
    const [effect] = await eventually(() => effectsFor(key).length && effectsFor(key), { what: "the effect" });
    assert.equal(effect.settled_by, "reconcile");
    assert.deepEqual(effect.user_metadata, { tenant: "ours" }, "the registration's metadata");
    assert.equal(effect.unverified_user_metadata, undefined, "nothing of the early nudge was kept");
    await w.scheduled();
    await sleep(1000);
    assert.equal(effectsFor(key).length, 1, "once");
  });

  it("a stranger's token claims never reach an effect as verified", async () => {
    // Our job, registered with its metadata; a stranger's token names it first, with theirs.
    const ours = "batches/ours-with-meta";
    states.set(`/v1beta/${ours}`, "SUCCEEDED");
    await w.register(ours, "billing", { user_metadata: { tenant: "ours" } });
    assert.equal((await nudge(w, ours, jwt({ user_metadata: { tenant: "attacker" } }))).body.outcome, "confirming");
    assert.equal((await nudge(w, ours, jwt({ user_metadata: { tenant: "genuine" } }))).status, 200);
    const [effect] = await eventually(() => effectsFor(ours).length && effectsFor(ours), { what: "the effect" });
    assert.deepEqual(effect.user_metadata, { tenant: "ours" });
    assert.deepEqual(effect.unverified_user_metadata, { tenant: "attacker" }, "a claim, labelled as one");
    // Registered without metadata: a token's claim is still only unverified.
    const bare = "batches/ours-bare";
    states.set(`/v1beta/${bare}`, "SUCCEEDED");
    await w.register(bare, "billing");
    await nudge(w, bare, jwt({ user_metadata: { tenant: "attacker" } }));
    const [plain] = await eventually(() => effectsFor(bare).length && effectsFor(bare), { what: "the effect" });
    assert.equal(plain.user_metadata, undefined);
    assert.deepEqual(plain.unverified_user_metadata, { tenant: "attacker" });
  });

  it("an interaction's metadata comes from its status answer, read with our key", async () => {
    const key = "interactions/meta-echo";
    states.set(`/v1beta/${key}`, { id: "meta-echo", status: "completed", updated: new Date().toISOString(), webhook_config: { uris: ["https://x"], user_metadata: { tenant: "echoed" } } });
    await w.register(key);
    await nudge(w, key, jwt({ user_metadata: { tenant: "attacker" } }), "interaction.completed");
    const [effect] = await eventually(() => effectsFor(key).length && effectsFor(key), { what: "the effect" });
    assert.deepEqual(effect.user_metadata, { tenant: "echoed" });
    assert.deepEqual(effect.unverified_user_metadata, { tenant: "attacker" });
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

describe("nothing runs twice after retention", () => {
  it("a video settled and purged, then nudged, polled and redelivered with a valid signature, runs nothing", async () => {
    const w = await startWorker(base({ LEDGER_RETENTION_SECONDS: "2", RECONCILE_GRACE_SECONDS: "0", STRANGER_ALERT_THRESHOLD: "1000" }));
    try {
      const name = "models/veo-3/operations/vid-late";
      const key = "operations/vid-late";
      // A video's status answer carries no time to judge its age by.
      states.set(`/v1beta/${name}`, { name, done: true, response: { generateVideoResponse: { generatedSamples: [{ video: { uri: "files/v-late" } }] } } });
      assert.equal((await w.register(name, "publish")).status, 201);
      const pending = await w.ledger(key);
      const sent = new Date().toISOString();
      const body = JSON.stringify({ type: "video.generated", version: "v1", timestamp: sent, data: { id: name, file_name: "files/v-late" } });
      assert.equal((await w.json("/webhooks/gemini", { method: "POST", headers: signedHeaders(body), body })).status, 200);
      await eventually(() => effectsFor(key).length === 1, { what: "the effect" });
      await eventually(() => w.events("retention_expired").some((l) => l.key === key), { what: "retention to end" });
      assert.equal((await w.inspect(key)).status, 404, "the gate keeps nothing");
      const callsBefore = statusCalls(name).length;
      // A nudge, however valid its token: the gate holds nothing, nothing asked or created.
      const nudged = await nudge(w, name, jwt(), "video.generated");
      assert.notEqual(nudged.body.outcome, "applied", JSON.stringify(nudged.body));
      assert.equal(statusCalls(name).length, callsBefore, "no status call");
      assert.equal((await w.inspect(key)).status, 404, "the nudge created nothing");
      // A poll: an index entry left behind (a lost delete) makes the pass ask Gemini, whose
      // answer (no time) finds no record and creates none.
      const kv = await w.kv();
      await kv.put(`open:${key}`, "", { metadata: pending });
      await w.scheduled();
      await eventually(() => statusCalls(name).length > callsBefore, { what: "the pass's poll" });
      await eventually(async () => (await w.kvList(`open:${key}`)).length === 0, { what: "the stale index entry deleted" });
      assert.equal((await w.inspect(key)).status, 404, "the poll created nothing");
      const callsAfterPoll = statusCalls(name).length;
      // The captured delivery, re-signed as Gemini's own retry would be: its record's first
      // alarm finds the name retired and deletes it, nothing run.
      const again = await w.json("/webhooks/gemini", { method: "POST", headers: signedHeaders(body), body });
      assert.equal(again.status, 200);
      assert.ok(["ignored_too_old", "dropped", "applied"].includes(again.body.outcome), JSON.stringify(again.body));
      await eventually(async () => (await w.inspect(key)).status === 404, { what: "the gate empty again", timeoutMs: 60_000 });
      await sleep(2000);
      assert.equal(effectsFor(key).length, 1, "nothing ran again");
      assert.equal(statusCalls(name).length, callsAfterPoll, "nothing asked");
      assert.equal((await w.inspect(key)).status, 404, "and nothing was stored");
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
      // The gate's usage lines come through workerd's output, after its answers: wait for the ten.
      await eventually(() => gateUsage(w, from).filter((u) => u.invocation === "fetch").length >= 10, { what: "the usage lines of the ten nudges" });
      const usage = gateUsage(w, from);
      const fetches = usage.filter((u) => u.invocation === "fetch");
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
      assert.equal(r.body.outcome, "not_held");
      const h = await w.deliver("batch.succeeded", "batches/nobody-registered-hmac");
      assert.equal(h.body.outcome, "ignored_unregistered");
      await eventually(() => gateUsage(w).length >= 2, { what: "the two gates' usage lines" });
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
      const [written] = await eventually(() => gateUsage(w, from).length > 0 && gateUsage(w, from), { what: "the registered gate's usage line" });
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
