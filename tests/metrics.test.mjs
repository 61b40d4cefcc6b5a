// GET /metrics against the built worker in workerd, checked by the real tools: promtool accepts
// the page and the shipped rules, and a real Prometheus (Debian's package, installed by
// scripts/setup-prometheus.sh) scrapes the worker with a read token, so its query API returns
// the counts of known traffic (four completions, one duplicate, one parked effect, one effect
// held for a registration that never comes, one forged delivery, one operation still running
// and one nudged that Gemini does not know, both asked about by the status API's local
// stand-in) and its rules fire on them. A register token and no
// token are refused.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { generateKeyPairSync, sign as rsaSign } from "node:crypto";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { startWorker, startDestination, startServer, startStatusApi, eventually, sleep, READ_TOKEN, REGISTER_TOKEN } from "./helpers.mjs";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const RULES = path.join(root, "docs/prometheus-rules.yml");
const DONE = ["batches/metrics-1", "batches/metrics-2"];
const PARKED = "batches/metrics-parked";
// Still running when the pass asks; and one a nudge names that Gemini answers 404 for.
const OPEN = "batches/metrics-open";
const NUDGED = "batches/metrics-nudged";
// Completed unregistered: its effect waits (UNREGISTERED_HOLD_SECONDS) for a registration.
const HELD = "batches/metrics-held";

let w, dest, api, jwks, prom, dir, promUrl;

// A dynamic webhook's token, signed with a local key whose key set `jwks` publishes.
const { privateKey, publicKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
const jwk = { ...publicKey.export({ format: "jwk" }), kid: "k1", alg: "RS256", use: "sig" };
const b64u = (v) => Buffer.from(typeof v === "string" ? v : JSON.stringify(v)).toString("base64url");
function nudge(id) {
  const input = `${b64u({ alg: "RS256", kid: "k1", typ: "JWT" })}.${b64u({ exp: Math.floor(Date.now() / 1000) + 300 })}`;
  const token = `${input}.${rsaSign("sha256", Buffer.from(input), privateKey).toString("base64url")}`;
  const body = JSON.stringify({ type: "batch.succeeded", version: "v1", timestamp: new Date().toISOString(), data: { id } });
  return w.json("/webhooks/gemini", {
    method: "POST",
    headers: { "content-type": "application/json", "webhook-id": "msg_nudge", "webhook-timestamp": String(Math.floor(Date.now() / 1000)), "webhook-signature": token },
    body,
  });
}

/** A free loopback port (listen on 0, read it, close). */
async function freePort() {
  const server = createServer();
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address();
  await new Promise((r) => server.close(r));
  return port;
}

const scrape = (token, headers = {}) => w.fetch("/metrics", { headers: { ...(token ? { authorization: `Bearer ${token}` } : {}), ...headers } });

/** One instant query's vector from the Prometheus server, as [{metric, value}]. */
async function query(expr) {
  const res = await fetch(`${promUrl}/api/v1/query?query=${encodeURIComponent(expr)}`);
  const body = await res.json();
  assert.equal(body.status, "success", JSON.stringify(body));
  return body.data.result.map((r) => ({ metric: r.metric, value: Number(r.value[1]) }));
}

/** Waits until `expr` gives exactly one sample of `value`. */
const expect = (expr, value) => eventually(async () => {
  const r = await query(expr);
  return r.length === 1 && r[0].value === value;
}, { timeoutMs: 60_000, what: `${expr} == ${value}` });

before(async () => {
  dest = await startDestination((req) => (req.url === "/bill" ? { status: 400, body: { error: "unknown account" } } : { status: 200 }));
  // Any other name is a 404, as Gemini answers for one it does not know.
  api = await startStatusApi(new Map([[OPEN, { status: 200, body: { name: OPEN, metadata: { state: "BATCH_STATE_RUNNING", updateTime: new Date().toISOString() } } }]]));
  jwks = await startServer(() => ({ status: 200, body: { keys: [jwk] } }));
  w = await startWorker({
    EFFECT_URL: `${dest.url}/effects`,
    EFFECT_ROUTES: JSON.stringify({ billing: `${dest.url}/bill` }),
    UNREGISTERED_HOLD_SECONDS: "3600",
    GEMINI_API_BASE: api.url,
    GEMINI_API_KEY: "test-api-key",
    GEMINI_JWKS_URL: `${jwks.url}/jwks`,
    // The pass polls what is open at once.
    RECONCILE_GRACE_SECONDS: "0",
  }, { http: true });
  dir = mkdtempSync(path.join(tmpdir(), "gemini-once-prom-"));
  writeFileSync(path.join(dir, "token"), READ_TOKEN);
  const target = new URL(w.url).host;
  writeFileSync(path.join(dir, "prometheus.yml"), [
    "global: { scrape_interval: 1s, evaluation_interval: 1s }",
    `rule_files: [${JSON.stringify(RULES)}]`,
    "scrape_configs:",
    "  - job_name: gemini-once",
    "    metrics_path: /metrics",
    "    authorization:",
    "      type: Bearer",
    `      credentials_file: ${JSON.stringify(path.join(dir, "token"))}`,
    "    static_configs:",
    `      - targets: [${JSON.stringify(target)}]`,
    "",
  ].join("\n"));
  const port = await freePort();
  promUrl = `http://127.0.0.1:${port}`;
  prom = spawn("prometheus", [
    `--config.file=${path.join(dir, "prometheus.yml")}`,
    `--storage.tsdb.path=${path.join(dir, "data")}`,
    `--web.listen-address=127.0.0.1:${port}`,
  ], { stdio: ["ignore", "ignore", process.env.SHOW_PROMETHEUS_LOGS ? "inherit" : "ignore"] });
  await eventually(async () => (await fetch(`${promUrl}/-/ready`).catch(() => null))?.ok, { timeoutMs: 30000, what: "prometheus ready" });
  // Scraped before any traffic: every counter starts at 0, so `increase` sees what follows.
  await expect('up{job="gemini-once"}', 1);
  await expect('gemini_once_effects_total{result="parked"}', 0);

  for (const key of DONE) assert.equal((await w.register(key, "nightly")).status, 201);
  assert.equal((await w.register(PARKED, "billing")).status, 201);
  for (const key of [...DONE, PARKED]) assert.equal((await w.deliver("batch.succeeded", key)).status, 200);
  assert.equal((await w.deliver("batch.succeeded", DONE[0])).status, 200, "the duplicate");
  assert.equal((await w.deliver("batch.succeeded", DONE[1], {}, { signature: "v1,Zm9yZ2Vk" })).status, 401, "a forgery");
  await w.ledger(DONE, (m) => m.effect_done);
  await w.ledger(PARKED, (m) => m.parked);
  assert.equal((await w.deliver("batch.succeeded", HELD)).status, 200);
  await w.ledger(HELD, (m) => m.status === "succeeded" && !m.effect_done);
  for (const key of [OPEN, NUDGED]) assert.equal((await w.register(key, "nightly")).status, 201);
  const nudged = await nudge(NUDGED);
  assert.equal(nudged.status, 200, JSON.stringify(nudged.body));
  assert.equal(nudged.body.outcome, "confirming", JSON.stringify(nudged.body));
  // Its gate asks Gemini (404), then raises unknown_to_gemini: the confirmation is over.
  await w.ledger(NUDGED, (m) => m.alerts.includes("unknown_to_gemini"));
  await w.ledger(OPEN);
  await w.scheduled();
});

after(async () => {
  if (prom && prom.exitCode === null) {
    const exited = new Promise((r) => prom.once("exit", r));
    prom.kill("SIGTERM");
    await exited;
  }
  if (dir) rmSync(dir, { recursive: true, force: true });
  await w?.dispose();
  await dest?.close();
  await api?.close();
  await jwks?.close();
  dest?.assertAllValid();
});

describe("GET /metrics", () => {
  it("a real Prometheus scrapes it with a read token and reads the traffic's counts", async () => {
    await expect('gemini_once_settled_total{path="webhook"}', 4);
    await expect("gemini_once_duplicates_total", 1);
    await expect('gemini_once_effects_total{result="delivered"}', 2);
    await expect('gemini_once_effects_total{result="parked"}', 1);
    await expect('gemini_once_effects_total{result="failed"}', 0);
    await expect('gemini_once_rejected_total{reason="signature_invalid"}', 1);
    await expect("gemini_once_reconcile_passes_completed_total", 1);
    // By destination: the two delivered went to the default route, the park to billing.
    const byDest = await query("gemini_once_effects_by_destination_total");
    const seen = byDest.map((s) => `${s.metric.result} ${s.metric.destination} ${s.value}`).sort();
    assert.deepEqual(seen, ["delivered default 2", "parked billing 1"], JSON.stringify(byDest));
    // A query can name a destination by its short name; its host is in an info series.
    await expect('sum(gemini_once_effects_by_destination_total{destination="default"})', 2);
    const info = await query("gemini_once_destination_info");
    const hosts = info.map((s) => `${s.metric.destination} ${s.metric.host} ${s.value}`).sort();
    const host = new URL(dest.url).host;
    assert.deepEqual(hosts, [`billing ${host} 1`, `default ${host} 1`], JSON.stringify(info));
    await expect(`gemini_once_effects_by_destination_total{result="parked"} * on(destination) group_left(host) gemini_once_destination_info{host="${host}"}`, 1);
    // Which build serves the page: Cargo.toml's version and the commit it was built from.
    const version = /^version = "([^"]+)"/m.exec(readFileSync(path.join(root, "Cargo.toml"), "utf8"))[1];
    const build = await query("gemini_once_build_info");
    assert.equal(build.length, 1, JSON.stringify(build));
    assert.equal(build[0].metric.version, version);
    assert.match(build[0].metric.commit, /^([0-9a-f]{7,40}(\+modified)?|unknown)$/);
    // The time from settlement to acceptance: both accepted effects, within the day bucket.
    await expect("gemini_once_effect_acceptance_seconds_count", 2);
    await expect('gemini_once_effect_acceptance_seconds_bucket{le="86400"}', 2);
    const sum = await query("gemini_once_effect_acceptance_seconds_sum");
    assert.ok(sum.length === 1 && sum[0].value >= 0 && sum[0].value < 120, JSON.stringify(sum));
    await expect('gemini_once_alerts_by_kind_total{kind="effect_failing"}', 1);
    // Both destinations are configured, labelled by route, and healthy (a 400 parks; it
    // says nothing of the destination's health).
    const healthy = await query('gemini_once_destination_state{state="healthy"}');
    assert.equal(healthy.length, 2, JSON.stringify(healthy));
    assert.ok(healthy.every((s) => s.value === 1), JSON.stringify(healthy));
    assert.deepEqual(healthy.map((s) => s.metric.destination).sort(), ["billing", "default"], JSON.stringify(healthy));
    const lastComplete = await query("time() - gemini_once_reconcile_last_complete_pass_timestamp_seconds");
    assert.ok(lastComplete.length === 1 && lastComplete[0].value >= 0 && lastComplete[0].value < 300, JSON.stringify(lastComplete));
  });

  it("status calls are counted by who asked and how they ended; the pass's listing gives the gauges", async () => {
    // The nudge's confirmation asked once (404), counted in its gate's record; the pass asked
    // about both open operations (the running one, the unknown one), counted in its isolate.
    await expect('gemini_once_status_calls_total{asked_by="nudge",answer="not_found"}', 1);
    await expect('gemini_once_status_calls_total{asked_by="pass",answer="answered"}', 1);
    await expect('gemini_once_status_calls_total{asked_by="pass",answer="not_found"}', 1);
    await expect("sum(gemini_once_status_calls_total)", 3);
    await expect("count(gemini_once_status_calls_total)", 12);
    assert.equal(api.callsFor(NUDGED).length, 2, "one call each from the nudge and the pass");
    assert.equal(api.callsFor(OPEN).length, 1);
    // The index as the pass listed it: two operations open (neither alerted stuck) and the
    // held effect owed; the parked one left the index as it parked (alerted at once).
    await expect("gemini_once_open_operations", 2);
    await expect("gemini_once_stuck_operations", 0);
    await expect("gemini_once_effects_not_done", 1);
  });

  it("the shipped rules pass promtool and fire on the park in a real Prometheus", async () => {
    const check = spawnSync("promtool", ["check", "rules", RULES], { encoding: "utf8" });
    assert.equal(check.status, 0, check.stdout + check.stderr);
    const alerts = await eventually(async () => {
      const body = await (await fetch(`${promUrl}/api/v1/alerts`)).json();
      const names = body.data.alerts.filter((a) => a.state === "firing").map((a) => a.labels.alertname);
      return names.includes("GeminiOnceEffectsParked") && names;
    }, { timeoutMs: 60_000, what: "the parked alert firing" });
    assert.ok(!alerts.includes("GeminiOnceDown"), JSON.stringify(alerts));
    // Absent before the first pass, the complete-pass rule was pending; once the pass has run
    // it is neither pending nor firing, and nothing else is.
    await eventually(async () => {
      const body = await (await fetch(`${promUrl}/api/v1/alerts`)).json();
      const names = body.data.alerts.map((a) => a.labels.alertname);
      return ["GeminiOnceNoCompleteReconcilePass", "GeminiOnceDestinationOpen", "GeminiOnceDown", "GeminiOnceGeminiWebhookNotOk", "GeminiOnceStuckOperations"].every((n) => !names.includes(n));
    }, { timeoutMs: 60_000, what: "no alert but the park's" });
  });

  it("promtool check metrics accepts the page; OpenMetrics is served when asked", async () => {
    const res = await scrape(READ_TOKEN);
    assert.equal(res.status, 200);
    assert.match(res.headers.get("content-type"), /^text\/plain; version=0\.0\.4/);
    assert.equal(res.headers.get("cache-control"), "no-store");
    const page = await res.text();
    assert.match(page, /^gemini_once_effects_total\{result="parked"\} 1$/m);
    assert.doesNotMatch(page, /batches\/metrics/, "no operation's name in any label");
    assert.doesNotMatch(page, /destination="[^"]*[ :…/]/, "a destination label is a short name");
    const check = spawnSync("promtool", ["check", "metrics"], { input: page, encoding: "utf8" });
    assert.equal(check.status, 0, check.stdout + check.stderr);
    assert.equal((check.stdout + check.stderr).trim(), "", "no lint finding");
    const om = await scrape(READ_TOKEN, { accept: "application/openmetrics-text; version=1.0.0" });
    assert.equal(om.status, 200);
    assert.match(om.headers.get("content-type"), /^application\/openmetrics-text; version=1\.0\.0/);
    const omPage = await om.text();
    assert.match(omPage, /^# TYPE gemini_once_effects counter$/m);
    assert.ok(omPage.endsWith("# EOF\n"));
  });

  it("a register token and no token are refused, as on every read route", async () => {
    const none = await scrape(null);
    assert.equal(none.status, 401);
    const register = await scrape(REGISTER_TOKEN);
    assert.equal(register.status, 403);
    assert.equal((await register.json()).needs, "read");
    const post = await w.fetch("/metrics", { method: "POST", headers: { authorization: `Bearer ${READ_TOKEN}` } });
    assert.equal(post.status, 403, "a POST is an action");
  });
});

describe("GET /metrics when traffic stops", () => {
  let quiet, sink;
  before(async () => {
    sink = await startDestination();
    // The tests' flush window: 1 s (STATS_FLUSH_SECONDS), so the documented lag is 2 s.
    quiet = await startWorker({ EFFECT_URL: `${sink.url}/effects`, STATS_FLUSH_SECONDS: "1" });
  });
  after(async () => {
    await quiet?.dispose();
    await sink?.close();
  });

  it("what the edge counted reaches its shard though no request follows", async () => {
    const key = "batches/metrics-quiet";
    assert.equal((await quiet.deliver("batch.succeeded", key)).status, 200);
    await quiet.ledger(key, (m) => m.effect_done);
    // Duplicates of a settled outcome and forgeries, answered at the edge in a burst, within
    // one window: only the first of the window could be flushed by its own request.
    for (let i = 0; i < 5; i++) {
      assert.equal((await quiet.deliver("batch.succeeded", key)).status, 200);
      assert.equal((await quiet.deliver("batch.succeeded", key, {}, { signature: "v1,Zm9yZ2Vk" })).status, 401);
    }
    // No request to the worker until the counts are in: a request would flush them the old
    // way (after the next request), hiding what this checks. The shards are read directly
    // (a Durable Object's own fetch flushes nothing), until the burst's counts are there;
    // the documented lag is twice the window (2 s here), which a busy machine may stretch.
    const burst = Date.now();
    const stats = await quiet.mf.getDurableObjectNamespace("STATS");
    await eventually(async () => {
      const total = {};
      for (let i = 0; i < 8; i++) {
        const res = await stats.get(stats.idFromName(`stats-${i}`)).fetch("https://object/command", { method: "POST", body: JSON.stringify({ command: "read" }) });
        for (const [k, v] of Object.entries((await res.json()).total ?? {})) total[k] = (total[k] ?? 0) + v;
      }
      return total.duplicates_skipped === 5 && total.rejected_signature_invalid === 5;
    }, { what: "the burst's counts in the shards, with no request", timeoutMs: 60_000, everyMs: 250 });
    console.log(`# the burst's counts reached the shards ${Date.now() - burst} ms after it, with no request`);
    const { status, body } = await quiet.admin("/v1/stats");
    assert.equal(status, 200);
    assert.equal(body.total.duplicates_skipped, 5, JSON.stringify(body.total));
    assert.equal(body.total.rejected_signature_invalid, 5, JSON.stringify(body.total));
  });
});
