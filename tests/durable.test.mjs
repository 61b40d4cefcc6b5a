// An operation's work survives what it is given and what goes wrong around it, against the
// built worker in workerd with persisted state: metadata nested at and past every limit (in an
// HMAC-signed delivery and in a dynamic-webhook nudge) loads again after a restart; a stored
// record that no longer loads is recovered, kept, and alerted on once; an alarm that fails
// under a configuration broken for longer than the runtime's retries sets itself again, and the
// work resumes once the configuration is fixed; a parked effect alerts at once; a video's
// `video_uri` is its output location; a retention under KV's minimum TTL still keeps dead letters;
// a parked effect's alert whose send was cut short is sent again without waiting for the claim;
// a success's ledger mark, kept in memory only, lost to a restart: the gate still retires as
// stored, and a late duplicate only writes the ledger entry again.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { generateKeyPairSync, sign as rsaSign } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { startWorker, startServer, startDestination, eventually, signedHeaders, sleep, ADMIN_TOKEN } from "./helpers.mjs";
import { fingerprint } from "../scripts/deploy_vars.mjs";

const AUDIENCE = "gemini-once-test";
const { privateKey, publicKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
const jwk = { ...publicKey.export({ format: "jwk" }), kid: "k1", alg: "RS256", use: "sig" };
const b64u = (v) => Buffer.from(typeof v === "string" ? v : JSON.stringify(v)).toString("base64url");
const nowSecs = () => Math.floor(Date.now() / 1000);

function jwt(claims) {
  const input = `${b64u({ alg: "RS256", kid: "k1", typ: "JWT" })}.${b64u(claims)}`;
  return `${input}.${rsaSign("sha256", Buffer.from(input), privateKey).toString("base64url")}`;
}

/** `levels` nested objects as JSON text: `{"a":{"a":...1}}`. */
const nested = (levels) => `${'{"a":'.repeat(levels)}1${"}".repeat(levels)}`;

/** A Gemini-signed delivery with a raw body. */
function deliverRaw(w, body) {
  return w.json("/webhooks/gemini", { method: "POST", headers: signedHeaders(body), body });
}

/** A dynamic-webhook delivery (RS256 token) with a raw body. */
function nudgeRaw(w, body, claims = {}) {
  const token = jwt({ iss: "https://generativelanguage.googleapis.com", aud: AUDIENCE, exp: nowSecs() + 300, ...claims });
  return w.json("/webhooks/gemini", {
    method: "POST",
    headers: { "content-type": "application/json", "webhook-id": `msg_jwt_${Math.random()}`, "webhook-timestamp": String(nowSecs()), "webhook-signature": token },
    body,
  });
}

const tempDir = (what) => fs.mkdtempSync(path.join(os.tmpdir(), `gemini-once-${what}-`));
const effectsFor = (dest, key) => dest.requests.filter((r) => r.headers["idempotency-key"] === key).map((r) => JSON.parse(r.body));
/** `list` when it is not empty (for `eventually`: an empty array is truthy). */
const some = (list) => list.length > 0 && list;

describe("metadata nested at and past every limit", () => {
  let jwks, dest, gemini, sink;
  let destUp = false;
  before(async () => {
    jwks = await startServer(() => ({ status: 200, body: { keys: [jwk] } }));
    dest = await startDestination(() => ({ status: destUp ? 200 : 503 }));
    sink = await startServer(() => ({ status: 200 }));
    // Gemini's status API: every batch is still running, so a nudge's confirmation stays.
    gemini = await startServer((req) => ({ status: 200, body: { name: req.url.replace("/v1beta/", ""), metadata: { state: "BATCH_STATE_RUNNING" }, done: false } }));
  });
  after(async () => {
    for (const s of [jwks, dest, gemini, sink]) await s?.close();
    dest?.assertAllValid();
  });

  const config = () => ({
    EFFECT_URL: `${dest.url}/effects`,
    GEMINI_JWKS_URL: `${jwks.url}/.well-known/jwks.json`,
    GEMINI_JWT_AUDIENCE: AUDIENCE,
    GEMINI_API_BASE: gemini.url,
    GEMINI_API_KEY: "test-api-key",
    ALERT_URL: `${sink.url}/alerts`,
    EFFECT_RETRY_BASE_SECONDS: "1",
    EFFECT_RETRY_MAX_SECONDS: "1",
  });

  it("is stored bounded, loads again after a restart, and a signed completion then runs one effect", { timeout: 120_000 }, async () => {
    const dir = tempDir("deep");
    let w;
    try {
      w = await startWorker(config(), { persist: dir });
      // HMAC: `data.user_metadata` at the deepest serde_json reads (128 levels in all), a
      // provider detail just past the record's bound (33), one exactly at it (32).
      const hmacKey = "batches/deep-hmac";
      const body = `{"type":"batch.succeeded","data":{"id":"${hmacKey}","output_file_uri":"gs://o/deep.jsonl","user_metadata":${nested(125)},"past":${nested(33)},"at":${nested(32)}}}`;
      const applied = await deliverRaw(w, body);
      assert.equal(applied.status, 200, JSON.stringify(applied.body));
      assert.equal(applied.body.outcome, "applied");
      // One level more does not parse at all: a signed body kept as a dead letter, answered 400.
      const tooDeep = await deliverRaw(w, `{"type":"batch.succeeded","data":{"id":"batches/deeper","user_metadata":${nested(126)}}}`);
      assert.equal(tooDeep.status, 400);
      // JWT: the body's top-level `user_metadata` (becomes `unverified_user_metadata`, stored
      // three levels deeper in the record's confirmation) and the token's own.
      // Registered first, so each nudge waits in its record for the status API (a name no gate
      // knows would be asked about at the edge and applied at once).
      const jwtKey = "batches/deep-jwt";
      const tokenKey = "batches/deep-token";
      for (const key of [jwtKey, tokenKey]) assert.equal((await w.register(key, "nightly")).status, 201);
      const nudged = await nudgeRaw(w, `{"type":"batch.succeeded","user_metadata":${nested(126)},"data":{"id":"${jwtKey}"}}`);
      assert.equal(nudged.status, 200, JSON.stringify(nudged.body));
      assert.equal(nudged.body.outcome, "confirming");
      const claimsNudge = await nudgeRaw(w, `{"type":"batch.succeeded","data":{"id":"${tokenKey}"}}`, { user_metadata: JSON.parse(nested(100)) });
      assert.equal(claimsNudge.status, 200, JSON.stringify(claimsNudge.body));
      const pastJwt = await nudgeRaw(w, `{"type":"batch.succeeded","user_metadata":${nested(127)},"data":{"id":"batches/x"}}`);
      assert.equal(pastJwt.status, 400);
      await eventually(() => gemini.requests.some((r) => r.url === `/v1beta/${jwtKey}`), { what: "the nudge's confirmation" });
      await eventually(() => effectsFor(dest, hmacKey).length > 0, { what: "a first attempt (refused: destination down)" });
      const stored = (await w.inspect(jwtKey)).body;
      assert.equal(stored.confirming, true);

      // A restart on the same state: every record is read from storage again.
      await w.dispose();
      w = await startWorker(config(), { persist: dir });
      destUp = true;
      for (const key of [hmacKey, jwtKey, tokenKey]) {
        const seen = await w.inspect(key);
        assert.equal(seen.status, 200, `${key}: ${JSON.stringify(seen.body).slice(0, 300)}`);
      }
      const record = (await w.inspect(hmacKey)).body;
      assert.equal(record.details.user_metadata.truncated, true);
      assert.equal(record.details.user_metadata.reason, "too_deep");
      assert.equal(record.details.provider.past.reason, "too_deep");
      assert.deepEqual(record.details.provider.at, JSON.parse(nested(32)), "at the bound: carried whole");

      // Signed completions: the JWT-nudged one settles, the HMAC one is a duplicate.
      for (const key of [jwtKey, hmacKey, tokenKey]) {
        const done = await w.deliver("batch.succeeded", key, { output_file_uri: `gs://o/${key}.jsonl` });
        assert.equal(done.status, 200, `${key}: ${JSON.stringify(done.body)}`);
      }
      for (const key of [hmacKey, jwtKey, tokenKey]) {
        await eventually(async () => (await w.inspect(key)).body.effect_done, { what: `${key}'s effect done` });
      }
      const delivered = (key) => dest.requests.filter((r) => r.headers["idempotency-key"] === key && r.at > 0);
      const bodies = effectsFor(dest, hmacKey);
      assert.ok(bodies.every((b) => b.user_metadata.truncated === true), "the marker in every attempt");
      assert.equal(new Set(delivered(hmacKey).map((r) => r.headers["webhook-id"])).size, 1, "one effect (one webhook-id)");
      assert.equal(effectsFor(dest, jwtKey).length, 1, "one effect");
      assert.equal(effectsFor(dest, tokenKey).length, 1, "one effect");
      assert.equal(w.events("record_unreadable").length, 0);
    } finally {
      await w?.dispose();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it("a gate an earlier version wrote (record and history in tables of their own) is read as it is and moved to one row by its next write", { timeout: 120_000 }, async (t) => {
    try {
      execFileSync("sqlite3", ["-version"]);
    } catch {
      t.skip("needs the sqlite3 command to write the tables an older version stored");
      return;
    }
    const dir = tempDir("legacy");
    let w;
    try {
      destUp = true;
      w = await startWorker(config(), { persist: dir });
      const key = "batches/legacy-layout";
      assert.equal((await w.register(key, "nightly")).status, 201);
      await w.ledger(key);
      const ns = await w.mf.getDurableObjectNamespace("OPERATION_GATE");
      const id = ns.idFromName(key).toString();
      await w.dispose();
      w = null;
      const files = fs.readdirSync(dir, { recursive: true }).filter((f) => String(f).endsWith(`${id}.sqlite`));
      assert.equal(files.length, 1);
      const db = path.join(dir, String(files[0]));
      const sql = (q) => execFileSync("sqlite3", [db, q], { encoding: "utf8" }).trim();
      // The earlier layout: `operation(id, body)` and `history(seq, at_ms, entry)`.
      sql(`CREATE TABLE operation (id INTEGER PRIMARY KEY CHECK (id = 1), body TEXT NOT NULL);
           CREATE TABLE history (seq INTEGER PRIMARY KEY, at_ms INTEGER NOT NULL, entry TEXT NOT NULL);
           INSERT INTO operation SELECT id, body FROM record;
           INSERT INTO history (at_ms, entry) VALUES (1700000000000, '{"what":"registered","kind":"nightly"}'), (1700000001000, '{"what":"forgotten","reason":"an older row"}');
           DROP TABLE record;`);
      w = await startWorker(config(), { persist: dir });
      const seen = await w.inspect(key);
      assert.equal(seen.status, 200, JSON.stringify(seen.body));
      assert.deepEqual(seen.body.history.map((h) => h.what), ["registered", "forgotten"], "the old history table is read");
      assert.equal(seen.body.history[1].at, "2023-11-14T22:13:21Z");
      const done = await w.deliver("batch.succeeded", key, { output_file_uri: "gs://o/legacy.jsonl" });
      assert.equal(done.body.outcome, "applied", JSON.stringify(done.body));
      await eventually(() => effectsFor(dest, key).length === 1, { what: "its effect" });
      await eventually(async () => (await w.inspect(key)).body.effect_done, { what: "the commit" });
      const after = (await w.inspect(key)).body.history.map((h) => h.what);
      assert.deepEqual(after.slice(0, 2), ["registered", "forgotten"], "kept through the move");
      assert.ok(after.includes("claimed") && after.includes("attempt"), after.join());
      await w.dispose();
      w = null;
      assert.equal(sql("SELECT group_concat(name) FROM sqlite_master WHERE type = 'table' AND name IN ('operation', 'history', 'record')"), "record", "moved to one row");
    } finally {
      await w?.dispose();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it("a stored record that no longer loads is recovered (or repaired by an operator), kept, alerted on once, and settles once", { timeout: 120_000 }, async (t) => {
    try {
      execFileSync("sqlite3", ["-version"]);
    } catch {
      t.skip("needs the sqlite3 command to write a record an older version could have stored");
      return;
    }
    const dir = tempDir("unreadable");
    let w;
    try {
      destUp = true;
      w = await startWorker(config(), { persist: dir });
      const deep = "batches/unreadable";
      const garbled = "batches/garbled";
      for (const key of [deep, garbled]) assert.equal((await w.register(key, "nightly")).status, 201);
      await w.ledger([deep, garbled]);
      const ns = await w.mf.getDurableObjectNamespace("OPERATION_GATE");
      const ids = { [deep]: ns.idFromName(deep).toString(), [garbled]: ns.idFromName(garbled).toString() };
      await w.dispose();
      w = null;
      const dbOf = (key) => {
        const files = fs.readdirSync(dir, { recursive: true }).filter((f) => String(f).endsWith(`${ids[key]}.sqlite`));
        assert.equal(files.length, 1, `the gate's database in ${dir}`);
        return path.join(dir, String(files[0]));
      };
      const store = (key, raw) => execFileSync("sqlite3", [dbOf(key), `UPDATE record SET body = '${raw.replaceAll("'", "''")}' WHERE id = 1`]);
      // What an older version stored for a nudge whose body nested its metadata deep: a
      // record serde_json's reader refuses (past 128 levels).
      const body = JSON.parse(execFileSync("sqlite3", [dbOf(deep), "SELECT body FROM record WHERE id = 1"], { encoding: "utf8" }));
      body.confirmation = { requested_at_ms: Date.now(), due_ms: Date.now() + 3_600_000, attempts: 0, metadata: { unverified_user_metadata: "DEEP" }, delivery_id: "jwt_old" };
      const raw = JSON.stringify(body).replace('"DEEP"', nested(140));
      store(deep, raw);
      // And one of which nothing can be read (neither key nor state).
      store(garbled, `{"garbled":${nested(3)}}`);

      const before = sink.requests.length;
      const unreadableAlerts = (key) => sink.requests.filter((r) => JSON.parse(r.body).alert === "record_unreadable" && JSON.parse(r.body).key === key);
      w = await startWorker(config(), { persist: dir });
      const seen = await w.inspect(deep);
      assert.equal(seen.status, 200, JSON.stringify(seen.body).slice(0, 300));
      assert.equal(seen.body.kind, "nightly");
      const row = seen.body.history.find((h) => h.what === "record_recovered");
      assert.ok(row, JSON.stringify(seen.body.history));
      assert.equal(row.how, "pruned");
      assert.equal(row.raw_bytes, raw.length);
      assert.equal(w.events("record_recovered").length, 1);
      const alerted = await eventually(() => some(unreadableAlerts(deep)), { what: "the record_unreadable alert" });
      assert.ok(sink.requests.indexOf(alerted[0]) >= before);
      const done = await w.deliver("batch.succeeded", deep, { output_file_uri: "gs://o/u.jsonl" });
      assert.equal(done.body.outcome, "applied", JSON.stringify(done.body));
      await eventually(() => effectsFor(dest, deep).length === 1, { what: "its effect" });

      // The garbled one cannot be recovered on its own: every call fails until a repair.
      assert.equal((await w.inspect(garbled)).status, 503);
      assert.equal((await w.deliver("batch.succeeded", garbled, { output_file_uri: "gs://o/g.jsonl" })).status, 503);
      assert.ok(w.events("record_unreadable").length > 0);
      const repaired = await w.admin(`/v1/operations/${garbled}/repair`, { method: "POST", body: JSON.stringify({ reason: "garbled row" }) });
      assert.equal(repaired.status, 200, JSON.stringify(repaired.body));
      assert.equal(repaired.body.repaired, true);
      assert.equal(repaired.body.operation.status, "pending");
      assert.equal(repaired.body.operation.effect_parked, true, "may already have run: parked");
      assert.equal(repaired.body.operation.history.at(-1).how, "rebuilt");
      assert.deepEqual(repaired.body.operation.history.at(-1).by, { scope: "admin", fingerprint: fingerprint(ADMIN_TOKEN) }, "who repaired it");
      await eventually(() => some(unreadableAlerts(garbled)), { what: "the repaired record's alert" });
      // Its completion settles it; the effect waits for an operator, who retries it.
      assert.equal((await w.deliver("batch.succeeded", garbled, { output_file_uri: "gs://o/g.jsonl" })).body.outcome, "applied");
      await sleep(1_000);
      assert.equal(effectsFor(dest, garbled).length, 0, "not run unasked");
      assert.equal((await w.admin(`/v1/operations/${garbled}/retry`, { method: "POST" })).status, 200);
      await eventually(() => effectsFor(dest, garbled).length === 1, { what: "the retried effect" });
      const again = await w.admin(`/v1/operations/${garbled}/repair`, { method: "POST" });
      assert.equal(again.body.repaired, false, "nothing left to repair");

      // Loaded again from storage: the recovered records read, nothing is recovered twice.
      await w.dispose();
      w = await startWorker(config(), { persist: dir });
      for (const key of [deep, garbled]) assert.equal((await w.inspect(key)).body.effect_done, true, key);
      assert.equal(w.events("record_recovered").length, 0);
      await sleep(1_000);
      for (const key of [deep, garbled]) {
        assert.equal(unreadableAlerts(key).length, 1, `${key}: alerted once`);
        assert.equal(effectsFor(dest, key).length, 1, `${key}: one effect`);
      }
    } finally {
      await w?.dispose();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("a parked effect, a video's video_uri, a short retention", () => {
  let dest, sink, w;
  before(async () => {
    dest = await startDestination((req) => ({ status: req.headers["idempotency-key"].includes("refused") ? 400 : 200 }));
    sink = await startServer(() => ({ status: 200 }));
    w = await startWorker({
      EFFECT_URL: `${dest.url}/effects`,
      ALERT_URL: `${sink.url}/alerts`,
      // No cron pass runs in this test; this would make one alert at once too.
      EFFECT_ALERT_AFTER_SECONDS: "86400",
    });
  });
  after(async () => {
    await w?.dispose();
    for (const s of [dest, sink]) await s?.close();
    dest?.assertAllValid();
  });

  it("a parked effect alerts at once, from the gate, with no cron pass", async () => {
    const key = "batches/refused-1";
    assert.equal((await w.deliver("batch.succeeded", key, { output_file_uri: "gs://o/r" })).body.outcome, "applied");
    const alerts = await eventually(() => some(sink.requests.filter((r) => JSON.parse(r.body).key === key)), { what: "the effect_failing alert" });
    const alert = JSON.parse(alerts[0].body);
    assert.equal(alert.alert, "effect_failing");
    assert.match(alert.text, /parked: 400/);
    assert.equal(w.events("reconcile_pass").length, 0, "no cron pass ran");
    const seen = (await w.inspect(key)).body;
    assert.equal(seen.effect_parked, true);
    assert.deepEqual(seen.alerts, ["effect_failing"]);
    assert.deepEqual(seen.alerts_pending, []);
    // The ledger closes it: parked and alerted, nothing for the cron to do.
    await w.ledger(key, (m) => m.parked && m.alerts.includes("effect_failing"));
    await eventually(async () => (await w.kvList(`open:${key}`)).length === 0, { what: "the index entry deleted" });
  });

  it("a video.generated webhook's data.video_uri is the effect's output_file_uri", async () => {
    const key = "operations/vid-uri";
    const r = await w.deliver("video.generated", "models/veo-3/operations/vid-uri", { video_uri: "gs://v/uri.mp4", file_name: "files/u" });
    assert.equal(r.body.outcome, "applied");
    await eventually(() => effectsFor(dest, key).length === 1, { what: "the video's effect" });
    const [body] = effectsFor(dest, key);
    assert.equal(body.output_file_uri, "gs://v/uri.mp4");
    assert.deepEqual(body.output_file_uris, ["gs://v/uri.mp4"]);
    assert.equal(body.provider.file_name, "files/u");
    assert.equal(body.provider.video_uri, undefined);
    dest.assertAllValid();
  });

  it("with LEDGER_RETENTION_SECONDS under KV's minimum TTL, a dead letter is still kept", async () => {
    // A worker of its own: with a 2 s retention, the parked record above could be retired
    // before a busy machine's test had read it.
    const short = await startWorker({ EFFECT_URL: `${dest.url}/effects`, LEDGER_RETENTION_SECONDS: "2" });
    try {
      const body = `{"type":"batch.succeeded","data":{}}`;
      const headers = signedHeaders(body, { webhookId: "msg_dead_short_retention" });
      const r = await short.json("/webhooks/gemini", { method: "POST", headers, body });
      assert.equal(r.status, 400, JSON.stringify(r.body));
      const kv = await short.kv();
      assert.ok(await kv.get("dead:msg_dead_short_retention"), "kept");
    } finally {
      await short.dispose();
    }
  });
});

describe("a configuration broken for longer than the runtime's alarm retries", () => {
  let dest, sink;
  let up = false;
  before(async () => {
    dest = await startDestination((req) => ({ status: req.headers["idempotency-key"].includes("refused") ? 400 : up ? 200 : 503 }));
    sink = await startServer(() => ({ status: up ? 200 : 500 }));
  });
  after(async () => {
    for (const s of [dest, sink]) await s?.close();
    dest?.assertAllValid();
  });

  it("leaves every gate's alarm set; once fixed, queued alerts and effects resume", { timeout: 420_000 }, async () => {
    const dir = tempDir("broken-config");
    const good = {
      EFFECT_URL: `${dest.url}/effects`,
      ALERT_URL: `${sink.url}/alerts`,
      EFFECT_RETRY_BASE_SECONDS: "1",
      EFFECT_RETRY_MAX_SECONDS: "1",
      // The effect is retried every second, so a restart may cut an attempt short after it
      // left: its claim then holds the effect until it expires (10 minutes by default). The
      // claim must outlast the attempt's timeout: the worker's default 5 s here.
      CLAIM_TTL_SECONDS: "8",
      EFFECT_TIMEOUT_MS: "5000",
    };
    let w;
    try {
      w = await startWorker(good, { persist: dir });
      // An effect retrying (destination down) and a parked one whose alert the sink refuses.
      const retrying = "batches/broken-retrying";
      const parked = "batches/broken-refused";
      for (const key of [retrying, parked]) {
        assert.equal((await w.deliver("batch.succeeded", key, { output_file_uri: `gs://o/${key}` })).body.outcome, "applied");
      }
      await eventually(() => effectsFor(dest, retrying).length >= 2, { what: "the effect retried" });
      await eventually(() => sink.requests.some((r) => JSON.parse(r.body).key === parked), { what: "the alert tried" });
      await w.dispose();

      // A bad deploy: a variable that does not parse, on the same state.
      w = await startWorker({ ...good, EFFECT_RETRY_BASE_SECONDS: "soon" }, { persist: dir });
      const failures = (key) => w.events("alarm_failed").filter((e) => e.key === key);
      await eventually(() => failures(retrying).length > 0 && failures(parked).length > 0, { what: "both alarms to fail", timeoutMs: 30_000 });
      const firstFailure = Date.now();
      const attemptsBroken = effectsFor(dest, retrying).length;
      // The runtime retries a throwing alarm 6 times (2 s, 4 s, ... 64 s: about 126 s) and then
      // drops it. Here every run fails, and each sets the next.
      await eventually(
        () => Date.now() - firstFailure > 130_000 && failures(retrying).length >= 7 && failures(parked).length >= 7,
        { what: "more failed runs than the runtime's retries, past its window", timeoutMs: 200_000, everyMs: 1_000 },
      );
      const last = failures(retrying).at(-1);
      assert.match(last.error, /EFFECT_RETRY_BASE_SECONDS/);
      assert.ok(last.failures >= 7 && last.retry_in_ms <= 60_000, JSON.stringify(last));
      assert.equal(effectsFor(dest, retrying).length, attemptsBroken, "nothing sent while broken");
      console.error(`# broken for ${Date.now() - firstFailure} ms: ${failures(retrying).length} and ${failures(parked).length} failed alarm runs, waits ${failures(retrying).map((e) => e.retry_in_ms).join(", ")} ms`);
      const sinkBefore = sink.requests.length;
      await w.dispose();

      // Fixed: the alarms still set run, and the work resumes.
      up = true;
      w = await startWorker(good, { persist: dir });
      const fixedAt = Date.now();
      await eventually(async () => (await w.inspect(retrying)).body.effect_done, { what: "the effect delivered", timeoutMs: 90_000, everyMs: 1_000 });
      await eventually(() => sink.requests.slice(sinkBefore).some((r) => r.body && JSON.parse(r.body).key === parked), { what: "the queued alert sent", timeoutMs: 90_000, everyMs: 1_000 });
      console.error(`# work resumed ${Date.now() - fixedAt} ms after the fix (${Date.now() - firstFailure} ms after the first failure)`);
      assert.deepEqual((await w.inspect(parked)).body.alerts_pending, []);
      assert.equal(new Set(dest.requests.filter((r) => r.headers["idempotency-key"] === retrying).map((r) => r.headers["webhook-id"])).size, 1);
    } finally {
      await w?.dispose();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("an alarm run cut short after a failed attempt", () => {
  // The run that attempts the effect sets the claim's expiry (CLAIM_TTL_SECONDS, 10 minutes by
  // default) before the call leaves. What the failed attempt leaves owed (its alert, its retry)
  // must not wait for that expiry if the run is cut short (an eviction, a deploy) before it ends.
  it("a parked effect's alert whose send was cut short is sent again soon after a restart", { timeout: 120_000 }, async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cut-short-"));
    let hold = true;
    const dest = await startDestination(() => ({ status: 400 }));
    const sink = await startServer(async () => {
      if (hold) await sleep(20_000);
      return { status: 200 };
    });
    const vars = { EFFECT_URL: `${dest.url}/effects`, ALERT_URL: `${sink.url}/alerts` };
    let w = await startWorker(vars, { persist: dir });
    try {
      const key = "batches/cut-short-parked";
      assert.equal((await w.deliver("batch.succeeded", key, { output_file_uri: "gs://o/c" })).body.outcome, "applied");
      await eventually(() => sink.requests.length === 1, { what: "the alert out" });
      await w.dispose(); // the gate's alarm is still waiting for the sink's answer
      hold = false;
      w = await startWorker(vars, { persist: dir });
      const [again] = await eventually(() => sink.requests.length > 1 && sink.requests.slice(1), {
        what: "the alert sent again", timeoutMs: 60_000, everyMs: 500,
      });
      assert.equal(JSON.parse(again.body).key, key);
      assert.equal(JSON.parse(again.body).alert_id, JSON.parse(sink.requests[0].body).alert_id, "the same alert");
      await eventually(async () => (await w.inspect(key)).body.alerts_pending?.length === 0, { what: "the alert accepted" });
      assert.equal(dest.requests.length, 1, "the parked effect is not run again");
    } finally {
      await w.dispose();
      await Promise.all([dest.close(), sink.close()]);
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("a success's upkeep kept in memory only", () => {
  // A first unregistered delivery whose effect succeeds at once: its alarm stores the claim and
  // the commit (its counts leave with the commit's write) and marks the ledger entry written in
  // memory only. A restart then loses the mark: the gate still retires at its moment, and a
  // late duplicate before that writes the same entry again and runs nothing.
  it("stores two rows in its alarm; after a restart it retires as stored, and a late duplicate only writes the ledger again", { timeout: 180_000 }, async () => {
    const dir = tempDir("upkeep");
    const dest = await startDestination(() => ({ status: 200 }));
    const vars = { EFFECT_URL: `${dest.url}/effects`, USAGE_LOG: "true", LEDGER_RETENTION_SECONDS: "30" };
    let w = await startWorker(vars, { persist: dir });
    const gateAlarms = (from) => w.events("usage").slice(from).filter((u) => u.object === "gate" && u.invocation === "alarm");
    try {
      const [quiet, duplicated] = ["batches/upkeep-quiet", "batches/upkeep-dup"];
      for (const key of [quiet, duplicated]) {
        const applied = await w.deliver("batch.succeeded", key, { output_file_uri: `gs://o/${key}` }, { webhookId: `msg_${key}` });
        assert.equal(applied.body.outcome, "applied", JSON.stringify(applied.body));
      }
      await w.ledger([quiet, duplicated], (m) => m.effect_done === true);
      // Each gate's first alarm run: the effect and the upkeep.
      const runs = await eventually(() => gateAlarms(0).length >= 2 && gateAlarms(0).slice(0, 2), { what: "both alarm runs' usage lines" });
      for (const run of runs) {
        assert.equal(run.rows_written, 2, `the claim and the commit only: ${JSON.stringify(run)}`);
        assert.equal(run.alarm_writes, 2, `the claim's expiry and retention: ${JSON.stringify(run)}`);
        assert.equal(run.kv_writes, 1, JSON.stringify(run));
      }
      assert.equal(w.events("retention_expired").length, 0, "the restart comes before retention");

      // A restart: every record is read again as the commit stored it.
      await w.dispose();
      w = await startWorker(vars, { persist: dir });
      const dup = await w.deliver("batch.succeeded", duplicated, { output_file_uri: `gs://o/${duplicated}` }, { webhookId: `msg_${duplicated}_again` });
      assert.equal(dup.body.reason, "duplicate", JSON.stringify(dup.body));
      const again = await eventually(() => gateAlarms(0).find((u) => u.kv_writes > 0), { what: "the duplicate's alarm run" });
      assert.equal(again.kv_writes, 1, `the same entry written again: ${JSON.stringify(again)}`);
      assert.equal(again.outbound_fetches, 0, "nothing sent");

      for (const key of [quiet, duplicated]) {
        await eventually(() => w.events("retention_expired").some((l) => l.key === key), { what: `${key} retired`, timeoutMs: 120_000, everyMs: 500 });
        assert.equal((await w.inspect(key)).status, 404, `${key}: nothing left in the gate`);
        assert.equal(dest.requests.filter((r) => r.headers["idempotency-key"] === key).length, 1, `${key}: one effect`);
      }
    } finally {
      await w.dispose();
      await dest.close();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
