// The cron slow path against the built worker in workerd, with local servers standing in for
// Gemini's status API, the destination and the alert sink.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { startWorker, startServer, startStatusApi, startDestination, assertEffectValid, eventually, sleep } from "./helpers.mjs";

// Gemini's status API: answers per path, set by each test; unknown paths are 404.
const gemini = new Map();
const plans = new Map();
let api, dest, sink;

const effectsFor = (key) => dest.requests.filter((r) => r.headers["idempotency-key"] === key);
const acceptedFor = (key) => effectsFor(key).filter((r) => r.answered >= 200 && r.answered < 300);
const statusCallsFor = (path) => api.callsFor(path);
const alertsFor = (key) => sink.requests.map((r) => JSON.parse(r.body)).filter((a) => a.key === key);
const lastPass = (w) => w.events("reconcile_pass").at(-1);
/** Two more passes, a second apart, then time for anything they sent to arrive. */
async function passesThenSettle(w) {
  for (let i = 0; i < 2; i++) {
    await sleep(1100);
    await w.scheduled();
  }
  await sleep(1000);
}

function batch(state, updateTime = new Date().toISOString(), extra = {}) {
  return { status: 200, body: { name: "batches/x", metadata: { state, updateTime }, ...extra } };
}

before(async () => {
  api = await startStatusApi(gemini);
  dest = await startDestination((req) => {
    const key = req.headers["idempotency-key"];
    const plan = plans.get(key);
    const answer = plan ? plan(effectsFor(key).length) : { status: 200 };
    req.answered = answer.status ?? 200;
    return answer;
  });
  sink = await startServer(() => ({ status: 200 }));
});
after(async () => {
  await api?.close();
  await dest?.close();
  await sink?.close();
  dest?.assertAllValid();
});

describe("reconciliation", () => {
  let w;
  before(async () => {
    w = await startWorker({
      EFFECT_URL: `${dest.url}/effects`,
      GEMINI_API_BASE: api.url,
      GEMINI_API_KEY: "test-gemini-key",
      ALERT_URL: `${sink.url}/alerts`,
      RECONCILE_GRACE_SECONDS: "0",
      EFFECT_RETRY_BASE_SECONDS: "1",
      EFFECT_RETRY_MAX_SECONDS: "1",
    });
  });
  after(() => w?.dispose());

  it("settles a batch, a video operation and an interaction whose webhooks never came", async () => {
    await w.register("batches/nohook1", "nightly");
    await w.register("models/veo-3/operations/nohook2", "video");
    await w.register("interactions/nohook3", "chat");
    gemini.set("batches/nohook1", batch("BATCH_STATE_SUCCEEDED", "2026-11-22T10:00:00Z", { done: true, response: { responsesFile: "files/out1" } }));
    gemini.set("models/veo-3/operations/nohook2", { status: 200, body: { name: "models/veo-3/operations/nohook2", done: true, response: {} } });
    gemini.set("interactions/nohook3", { status: 200, body: { id: "nohook3", status: "budget_exceeded", updated: "2026-11-22T10:00:00Z" } });
    await w.ledger(["batches/nohook1", "operations/nohook2", "interactions/nohook3"]);
    await w.scheduled();
    for (const [key, status] of [["batches/nohook1", "succeeded"], ["operations/nohook2", "succeeded"], ["interactions/nohook3", "failed"]]) {
      // The pass settles it; the effect follows from the gate's alarm.
      const op = await eventually(async () => {
        const o = await w.inspect(key);
        return o.body.effect_done && o;
      }, { what: `the effect of ${key}` });
      assert.equal(op.body.status, status, key);
      assert.equal(op.body.settled_by, "reconcile", key);
      assert.equal(op.body.effect_done, true, key);
      assert.equal(effectsFor(key).length, 1, key);
      assert.equal(assertEffectValid(effectsFor(key)[0].body).settled_by, "reconcile");
    }
    // Gemini's own spelling of the state goes under `provider` (it was a loose `gemini_status`).
    assert.equal(assertEffectValid(effectsFor("interactions/nohook3")[0].body).provider.state, "budget_exceeded");
    assert.equal(assertEffectValid(effectsFor("batches/nohook1")[0].body).output_file_uri, "files/out1");
    assert.equal(statusCallsFor("batches/nohook1")[0].headers["x-goog-api-key"], "test-gemini-key");
    assert.equal(statusCallsFor("models/veo-3/operations/nohook2").length, 1, "video polled by full name");
    const pass = lastPass(w);
    assert.ok(pass.settled >= 3);
    assert.equal(pass.bodies_read, 0);
    // Settled and done: later passes leave them alone.
    await sleep(1100);
    await w.scheduled();
    assert.equal(statusCallsFor("batches/nohook1").length, 1);
  });

  it("gives one side effect per operation when a webhook and cron passes race", async () => {
    const keys = Array.from({ length: 6 }, (_, i) => `batches/race${i}`);
    for (const key of keys) {
      await w.register(key, "race");
      gemini.set(key, (n) => batch(n % 2 ? "BATCH_STATE_SUCCEEDED" : "BATCH_STATE_RUNNING"));
      plans.set(key, () => ({ status: 200, delayMs: 150 }));
    }
    await Promise.all([
      ...keys.map((key) => w.deliver("batch.succeeded", key)),
      w.scheduled(),
      w.scheduled(),
      ...keys.map((key) => w.deliver("batch.succeeded", key)),
      w.scheduled(),
    ]);
    // Each effect goes from its gate's alarm, after the race: wait for each to be done.
    for (const key of keys) await eventually(async () => (await w.inspect(key)).body.effect_done, { what: `the effect of ${key}`, timeoutMs: 60_000 });
    // A later pass runs none of them again.
    await sleep(1200);
    await w.scheduled();
    await sleep(500);
    for (const key of keys) assert.equal(effectsFor(key).length, 1, key);
  });

  it("drops a stale RUNNING from the status API after the webhook's SUCCEEDED", async () => {
    const key = "batches/stale1";
    await w.register(key, "k");
    gemini.set(key, batch("BATCH_STATE_RUNNING", "2026-11-22T12:00:00Z"));
    await w.deliver("batch.succeeded", key);
    await w.ledger(key, (m) => m.effect_done);
    // KV is eventually consistent: make the ledger and its open: index show the old state, as
    // a lagging replica (or a lost delete of the index entry) would.
    const kv = await w.kv();
    await eventually(async () => (await kv.get(`open:${key}`)) === null, { what: "index entry deleted on close" });
    const stale = await kv.getWithMetadata(`op:${key}`);
    const old = { ...stale.metadata, status: "pending", settled_at: null, effect_done: false, version: 1 };
    await kv.put(`op:${key}`, stale.value, { metadata: old });
    await kv.put(`open:${key}`, "", { metadata: old });
    await w.scheduled();
    assert.equal(statusCallsFor(key).length, 1, "the stale entry cost one status call");
    const op = await w.inspect(key);
    assert.equal(op.body.status, "succeeded");
    assert.equal(op.body.settled_by, "webhook");
    const dropped = op.body.history.filter((h) => h.what === "dropped");
    assert.deepEqual(dropped.map((h) => [h.source, h.reason, h.status]), [["reconcile", "regress_from_terminal", "running"]]);
    assert.equal(effectsFor(key).length, 1);
    // The gate said the effect is done: the pass asked it to project again, which deletes the
    // stale index entry and rewrites the ledger, so the lost delete cost one trip, not one a pass.
    assert.ok(lastPass(w).reindexed >= 1, JSON.stringify(lastPass(w)));
    await eventually(async () => (await kv.get(`open:${key}`)) === null, { what: "stale index entry deleted" });
    await w.ledger(key, (m) => m.effect_done && m.status === "succeeded");
    await w.scheduled();
    assert.equal(statusCallsFor(key).length, 1, "not polled again");
  });

  it("delivers once to a destination that fails twice and then recovers", async () => {
    const key = "batches/recover1";
    await w.register(key, "k");
    gemini.set(key, batch("BATCH_STATE_FAILED", "2026-11-22T12:00:00Z", { done: true, error: { code: 13, message: "internal" } }));
    plans.set(key, (n) => (n <= 2 ? { status: 502 } : { status: 200 }));
    await w.ledger(key);
    await w.scheduled();
    await eventually(async () => {
      await w.scheduled();
      return (await w.inspect(key)).body.effect_done;
    }, { what: "effect done after recovery", everyMs: 400 });
    assert.equal(acceptedFor(key).length, 1);
    assert.equal(effectsFor(key).length, 3);
    const body = assertEffectValid(effectsFor(key)[2].body);
    assert.equal(body.status, "failed");
    assert.equal(body.error_code, 13);
    assert.equal(body.error_message, "internal");
  });

  it("sends the same body fields, of the same types, whether the webhook or the cron settled the outcome", async () => {
    // Each row: one operation settled by its webhook, another of the same kind and outcome
    // whose webhook was lost and which the cron settles from the status API.
    const rows = [
      {
        what: "batch succeeded", webhook: ["batch.succeeded", "batches/same-ws", { output_file_uri: "gs://b/out.jsonl" }],
        cron: ["batches/same-cs", "batches/same-cs", batch("BATCH_STATE_SUCCEEDED", "2026-11-22T10:00:00Z", { done: true, metadata: { state: "BATCH_STATE_SUCCEEDED", updateTime: "2026-11-22T10:00:00Z", output: { responsesFile: "files/same-cs" } } })],
        check: (wb, cb) => { assert.equal(wb.output_file_uri, "gs://b/out.jsonl"); assert.equal(cb.output_file_uri, "files/same-cs"); },
      },
      {
        what: "batch failed", webhook: ["batch.failed", "batches/same-wf", { error_code: 13, error_message: "internal" }],
        cron: ["batches/same-cf", "batches/same-cf", batch("BATCH_STATE_FAILED", "2026-11-22T10:00:00Z", { done: true, error: { code: 13, message: "internal" } })],
        check: (wb, cb) => { for (const b of [wb, cb]) { assert.equal(b.error_code, 13); assert.equal(b.error_message, "internal"); } },
      },
      {
        what: "video succeeded", webhook: ["video.generated", "models/veo-3/operations/same-ws", { output_file_uri: "gs://v/same.mp4", file_name: "files/same" }],
        cron: ["operations/same-cs", "models/veo-3/operations/same-cs", { status: 200, body: { name: "models/veo-3/operations/same-cs", done: true, response: { generateVideoResponse: { generatedSamples: [{ video: { uri: "files/v-same-1" } }, { video: { uri: "files/v-same-2" } }] } } } }],
        check: (wb, cb) => {
          assert.equal(wb.output_file_uri, "gs://v/same.mp4");
          assert.equal(cb.output_file_uri, "files/v-same-1", "the first sample");
          assert.deepEqual(cb.output_file_uris, ["files/v-same-1", "files/v-same-2"]);
        },
      },
      {
        // Gemini has no webhook for a failed video (only `video.generated`): the cron's video
        // failure is compared with a webhook's batch failure, both google.rpc codes.
        what: "video failed", webhook: ["batch.failed", "batches/same-wvf", { error_code: 3, error_message: "bad prompt" }],
        cron: ["operations/same-cf", "models/veo-3/operations/same-cf", { status: 200, body: { name: "models/veo-3/operations/same-cf", done: true, error: { code: 3, message: "bad prompt" } } }],
        check: (wb, cb) => { assert.equal(cb.status, "failed"); assert.equal(cb.error_code, 3); assert.equal(cb.error_message, "bad prompt"); },
      },
      {
        what: "interaction succeeded", webhook: ["interaction.completed", "interactions/same-ws", {}],
        cron: ["interactions/same-cs", "interactions/same-cs", { status: 200, body: { id: "same-cs", status: "completed", updated: "2026-11-22T10:00:00Z" } }],
        check: (wb, cb) => { assert.equal(cb.provider.state, "completed"); },
      },
      {
        what: "interaction failed", webhook: ["interaction.failed", "interactions/same-wf", { error_code: "RESOURCE_EXHAUSTED", error_message: "quota" }],
        cron: ["interactions/same-cf", "interactions/same-cf", { status: 200, body: { id: "same-cf", status: "failed", updated: "2026-11-22T10:00:00Z", errors: [{ code: "RESOURCE_EXHAUSTED", message: "quota" }] } }],
        check: (wb, cb) => { for (const b of [wb, cb]) { assert.equal(b.error_code, "RESOURCE_EXHAUSTED"); assert.equal(b.error_message, "quota"); } },
      },
    ];
    for (const { webhook: [, id], cron: [key, name, answer] } of rows) {
      await w.register(id, "same");
      await w.register(name, "same");
      gemini.set(name, answer);
      gemini.set(id, { status: 200, body: { name: id, done: false, metadata: { state: "BATCH_STATE_RUNNING" }, status: "in_progress" } });
    }
    for (const { webhook: [type, id, data] } of rows) {
      const r = await w.deliver(type, id, data);
      assert.equal(r.body.outcome, "applied", JSON.stringify(r.body));
    }
    await w.ledger(rows.map((r) => r.cron[0]));
    await w.scheduled();
    const shape = (b) => Object.entries(b).map(([k, v]) => [k, v === null ? "null" : Array.isArray(v) ? "array" : typeof v]).sort();
    for (const { what, webhook: [type, id], cron: [key], check } of rows) {
      const webhookKey = id.replace(/^models\/[^/]+\//, "");
      const [sentByWebhook] = await eventually(() => effectsFor(webhookKey).length && effectsFor(webhookKey), { what: `${what}: webhook's effect` });
      const [sentByCron] = await eventually(() => effectsFor(key).length && effectsFor(key), { what: `${what}: cron's effect` });
      const wb = assertEffectValid(sentByWebhook.body);
      const cb = assertEffectValid(sentByCron.body);
      assert.equal(wb.settled_by, "webhook", what);
      assert.equal(cb.settled_by, "reconcile", what);
      assert.equal(wb.status, cb.status, what);
      assert.deepEqual(shape(wb), shape(cb), `${what} (${type}): same fields, same types`);
      check(wb, cb);
    }
  });

  it("settles nothing on 404, 429 and 500 from the status API", async () => {
    const keys = { "batches/e404": null, "batches/e429": { status: 429, headers: { "retry-after": "5" }, body: { error: { code: 429 } } }, "batches/e500": { status: 500, body: "oops" } };
    for (const [key, answer] of Object.entries(keys)) {
      await w.register(key, "k");
      if (answer) gemini.set(key, answer);
    }
    await w.ledger(Object.keys(keys));
    await w.scheduled();
    // Retry-After is honoured: the pass right after (well inside the 5 s it asks for) polls
    // nothing, a later one polls again.
    const before429 = statusCallsFor("batches/e429").length + statusCallsFor("batches/e500").length;
    await w.scheduled();
    assert.equal(statusCallsFor("batches/e429").length + statusCallsFor("batches/e500").length, before429);
    for (const key of Object.keys(keys)) {
      const op = await w.inspect(key);
      assert.equal(op.body.status, "pending", key);
      assert.equal(effectsFor(key).length, 0, key);
    }
    await eventually(() => alertsFor("batches/e404").length === 1, { what: "unknown_to_gemini alert" });
    assert.equal(alertsFor("batches/e404")[0].alert, "unknown_to_gemini");
    await eventually(async () => {
      await w.scheduled();
      return statusCallsFor("batches/e429").length + statusCallsFor("batches/e500").length > before429;
    }, { what: "a pass after the Retry-After to poll again", everyMs: 1000, timeoutMs: 60_000 });
    await w.scheduled();
    assert.equal(alertsFor("batches/e404").length, 1, "404 alerts once");
    assert.equal((await w.inspect("batches/e404")).body.status, "pending");
  });
});

describe("reconciliation alerts", () => {
  let w;
  before(async () => {
    w = await startWorker({
      EFFECT_URL: `${dest.url}/effects`,
      GEMINI_API_BASE: api.url,
      ALERT_URL: `${sink.url}/alerts`,
      RECONCILE_GRACE_SECONDS: "0",
      STUCK_AFTER_SECONDS: "1",
      EFFECT_ALERT_AFTER_SECONDS: "1",
    });
  });
  after(() => w?.dispose());

  it("alerts once for an operation stuck past the threshold and keeps it open", async () => {
    const key = "batches/stuck1";
    await w.register(key, "nightly");
    gemini.set(key, batch("BATCH_STATE_RUNNING", "2026-11-22T12:00:00Z"));
    // A pass sees it once its registration is in the ledger; it is stuck a second later.
    await w.ledger(key);
    await sleep(1100);
    // Passes until its alert arrives (sent from its gate after the pass), then two more.
    await eventually(async () => { await w.scheduled(); return alertsFor(key).length > 0; }, { what: "the stuck alert", everyMs: 1100, timeoutMs: 60_000 });
    await passesThenSettle(w);
    const alerts = alertsFor(key);
    assert.equal(alerts.length, 1);
    assert.equal(alerts[0].alert, "stuck");
    assert.equal(alerts[0].name, key);
    assert.equal(alerts[0].kind, "nightly");
    assert.ok(alerts[0].age_seconds >= 1);
    assert.match(alerts[0].text, /batches\/stuck1/);
    const op = await w.inspect(key);
    assert.equal(op.body.status, "running");
    assert.equal(op.body.settled_at, null);
  });

  it("raises no stuck alert for 30 completions a pass recovers past the threshold", async () => {
    // A night of lost webhooks: each operation is open past STUCK_AFTER_SECONDS when the pass
    // that finds its completion runs. Stuck means without an outcome, so none is alerted.
    const keys = Array.from({ length: 30 }, (_, i) => `batches/lostnight${i}`);
    for (const key of keys) await w.register(key, "nightly");
    for (const key of keys) gemini.set(key, batch("BATCH_STATE_SUCCEEDED", "2026-11-22T12:00:00Z", { done: true }));
    await w.ledger(keys);
    await sleep(1100);
    await w.scheduled();
    const pass = lastPass(w);
    assert.equal(pass.settled, 30, "the pass settles all 30");
    for (const key of keys) {
      await eventually(async () => (await w.inspect(key)).body.effect_done, { what: `the effect of ${key}` });
      assert.equal(effectsFor(key).length, 1, key);
    }
    await w.scheduled();
    await sleep(500);
    const stuck = keys.flatMap((key) => alertsFor(key)).filter((a) => a.alert === "stuck");
    assert.deepEqual(stuck, [], "no stuck alert for a recovered completion");
    assert.equal(pass.alerts, 0);
  });

  it("alerts once for a parked side effect", async () => {
    const key = "batches/parked1";
    plans.set(key, () => ({ status: 410, body: "gone" }));
    await w.deliver("batch.succeeded", key);
    await eventually(async () => (await w.inspect(key)).body.effect_parked, { what: "the park" });
    await eventually(async () => { await w.scheduled(); return alertsFor(key).length > 0; }, { what: "the parked effect's alert", everyMs: 1100, timeoutMs: 60_000 });
    await passesThenSettle(w);
    const alerts = alertsFor(key);
    assert.equal(alerts.length, 1);
    assert.equal(alerts[0].alert, "effect_failing");
    assert.match(alerts[0].text, /parked/);
    assert.equal(effectsFor(key).length, 1, "parked effects are not retried");
  });
});

describe("reconciliation cost", () => {
  it("spends nothing on entries that are terminal and done", async () => {
    const w = await startWorker({ EFFECT_URL: `${dest.url}/effects`, GEMINI_API_BASE: api.url, RECONCILE_GRACE_SECONDS: "0" });
    try {
      const keys = Array.from({ length: 20 }, (_, i) => `batches/done${i}`);
      for (const key of keys) await w.deliver("batch.succeeded", key);
      // The last projections (one write a second per key): each entry done, none left open.
      await w.ledger(keys, (m) => m.effect_done);
      await eventually(async () => (await w.kvList("open:")).length === 0, { what: "no open: entry left" });
      // The first pass also audits the whole ledger (the first audit is due at once).
      await w.scheduled();
      const audit = lastPass(w);
      assert.equal(audit.audit, true);
      assert.equal(audit.audit_listed, 20);
      assert.equal(audit.index_listed, 0, "nothing open");
      assert.equal(audit.audit_found, 0);
      // A routine pass lists the open: index only: one empty page.
      await w.scheduled();
      const pass = lastPass(w);
      assert.equal(pass.audit, false);
      assert.equal(pass.listed, 0);
      assert.equal(pass.status_calls, 0);
      assert.equal(pass.bodies_read, 0);
      assert.equal(pass.effects_retried, 0);
      assert.equal(pass.subrequests, 3, "lease, one index list page, release");
      assert.equal(pass.complete, true);
    } finally {
      await w.dispose();
    }
  });

  it("covers a ledger larger than one pass's budget over successive passes", async () => {
    const budget = 10;
    const w = await startWorker({ EFFECT_URL: `${dest.url}/effects`, GEMINI_API_BASE: api.url, RECONCILE_GRACE_SECONDS: "0", RECONCILE_BUDGET: String(budget) });
    try {
      const keys = Array.from({ length: 25 }, (_, i) => `batches/bulk${String(i).padStart(2, "0")}`);
      for (const key of keys) {
        await w.register(key, "bulk");
        gemini.set(key, batch("BATCH_STATE_RUNNING", "2026-11-22T12:00:00Z"));
      }
      await w.ledger(keys);
      let passes = 0;
      while (passes < 30) {
        await w.scheduled();
        passes++;
        if (lastPass(w).complete) break;
      }
      const all = w.events("reconcile_pass");
      assert.equal(all.length, passes);
      assert.ok(passes > 1, "needed more than one pass");
      assert.ok(lastPass(w).complete, "reached the end of the ledger");
      for (const p of all) assert.ok(p.subrequests <= budget, `pass spent ${p.subrequests} > ${budget}`);
      for (const key of keys) assert.ok(statusCallsFor(key).length >= 1, `${key} never polled`);
      for (const p of all) assert.equal(p.index_listed, keys.length, "each pass lists the whole index");
      assert.equal(all.reduce((n, p) => n + p.visited, 0), keys.length, "each entry visited once across the passes");
    } finally {
      await w.dispose();
    }
  });
});

describe("reconciliation under a rate limit", () => {
  it("starts the next pass at the first entry skipped for a 429, not past it", async () => {
    const w = await startWorker({ EFFECT_URL: `${dest.url}/effects`, GEMINI_API_BASE: api.url, RECONCILE_GRACE_SECONDS: "0" });
    try {
      const keys = Array.from({ length: 8 }, (_, i) => `batches/rl${i}`);
      let limited = 0;
      for (const key of keys) {
        await w.register(key, "rl");
        gemini.set(key, batch("BATCH_STATE_RUNNING", "2026-11-22T12:00:00Z"));
      }
      // The third entry's first poll is refused; Gemini asks for a second's pause.
      gemini.set("batches/rl2", () => (limited++ === 0
        ? { status: 429, headers: { "retry-after": "1" }, body: { error: { code: 429 } } }
        : batch("BATCH_STATE_RUNNING", "2026-11-22T12:00:00Z")));
      await w.ledger(keys);
      await w.scheduled();
      assert.equal(lastPass(w).complete, false, "a pass that skipped polls has not covered the ledger");
      for (const key of keys.slice(3)) assert.equal(statusCallsFor(key).length, 0, `${key} skipped during the pause`);
      await sleep(1100);
      await w.scheduled();
      assert.equal(lastPass(w).complete, true);
      for (const key of keys.slice(3)) assert.equal(statusCallsFor(key).length, 1, `${key} polled by the next pass`);
      for (const key of keys.slice(0, 3)) assert.equal(statusCallsFor(key).length, 1, `${key} polled once, not again`);
    } finally {
      await w.dispose();
    }
  });
});

describe("Gemini webhook state", () => {
  it("alerts once when the Gemini webhook is disabled, and again after it recovers and fails", async () => {
    const w = await startWorker({ EFFECT_URL: `${dest.url}/effects`, GEMINI_API_BASE: api.url, ALERT_URL: `${sink.url}/alerts`, GEMINI_WEBHOOK_NAME: "webhooks/gemini-once" });
    const listing = (state) => ({ status: 200, body: { webhooks: [{ id: "w1", name: "webhooks/other", state: "enabled" }, { id: "w2", name: "webhooks/gemini-once", state }] } });
    const webhookAlerts = () => sink.requests.map((r) => JSON.parse(r.body)).filter((a) => a.alert === "webhook_disabled");
    try {
      const before = webhookAlerts().length;
      gemini.set("webhooks?page_size=1000", listing("enabled"));
      await w.scheduled();
      assert.equal(webhookAlerts().length, before);
      gemini.set("webhooks?page_size=1000", listing("disabled_due_to_failed_deliveries"));
      await w.scheduled();
      await w.scheduled();
      assert.equal(webhookAlerts().length, before + 1, "once, not once per pass");
      assert.match(webhookAlerts().at(-1).text, /disabled_due_to_failed_deliveries/);
      gemini.set("webhooks?page_size=1000", listing("enabled"));
      await w.scheduled();
      gemini.set("webhooks?page_size=1000", listing("disabled"));
      await w.scheduled();
      assert.equal(webhookAlerts().length, before + 2);
      assert.ok(w.events("webhook_state").length >= 5);
    } finally {
      await w.dispose();
    }
  });
});
