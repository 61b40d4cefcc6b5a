// Gemini's bad day against the built worker in workerd: the project's webhook, held by the
// WebhookService stand-in (tests/webhook_service.mjs), is disabled by Gemini for failed
// deliveries; a cron pass enables it again with the update_mask call `npm run connect` makes,
// sweeps every open operation onto the fan-out queue (whose consumer polls and settles each
// once), and alerts what it did. A webhook a person disabled is left alone and alerted, and
// GEMINI_WEBHOOK_AUTO_ENABLE=false leaves it disabled and alerts.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { startWorker, startServer, startDestination, eventually } from "./helpers.mjs";
import { startWebhookService } from "./webhook_service.mjs";
import { SDK_EVENTS } from "../scripts/deploy_vars.mjs";

// Gemini's API as the worker sees it at GEMINI_API_BASE: the WebhookService stand-in under
// v1beta/webhooks, and the status API answering per path (unknown paths are 404).
const status = new Map();
let service, gemini, dest, sink;

const effectsFor = (key) => dest.requests.filter((r) => r.headers["idempotency-key"] === key);
const alerts = (kind) => sink.requests.map((r) => JSON.parse(r.body)).filter((a) => a.alert === kind);
const patches = () => service.calls.filter((c) => c.method === "PATCH");
const statusCalls = (keys) => gemini.requests.filter((r) => keys.some((k) => r.url === `/v1beta/${k}`));

function succeeded() {
  return { status: 200, body: { name: "batches/x", metadata: { state: "BATCH_STATE_SUCCEEDED", updateTime: new Date().toISOString() }, done: true } };
}

before(async () => {
  service = await startWebhookService();
  gemini = await startServer(async (req) => {
    if (req.url.startsWith("/v1beta/webhooks")) {
      const res = await fetch(`${service.url}${req.url}`, {
        method: req.method,
        headers: { "x-goog-api-key": req.headers["x-goog-api-key"] ?? "", "content-type": "application/json" },
        body: req.method === "GET" ? undefined : req.body,
      });
      return { status: res.status, body: await res.text() };
    }
    return status.get(req.url.replace(/^\/v1beta\//, "")) ?? { status: 404, body: { error: { code: 404, status: "NOT_FOUND" } } };
  });
  dest = await startDestination(() => ({ status: 200 }));
  sink = await startServer(() => ({ status: 200 }));
});
after(async () => {
  await service?.close();
  await gemini?.close();
  await dest?.close();
  await sink?.close();
  dest?.assertAllValid();
});

/** A worker watching a new webhook of the stand-in's; `vars` on top. */
async function workerWithWebhook(vars = {}) {
  const hook = service.seed({ name: "gemini-once", uri: "https://gemini-once.example/webhooks/gemini", events: [...SDK_EVENTS] });
  const w = await startWorker({
    EFFECT_URL: `${dest.url}/effects`,
    GEMINI_API_BASE: gemini.url,
    GEMINI_API_KEY: service.apiKey,
    ALERT_URL: `${sink.url}/alerts`,
    GEMINI_WEBHOOK_NAME: hook.id,
    RECONCILE_GRACE_SECONDS: "0",
    RECONCILE_POLL_RATE: "20",
    ...vars,
  });
  return { w, hook };
}

/** Runs a cron pass and returns its line. */
async function pass(w) {
  const before = w.events("reconcile_pass").length;
  await w.scheduled();
  return eventually(() => w.events("reconcile_pass").length > before && w.events("reconcile_pass").at(-1), { what: "the pass's line" });
}

describe("a webhook Gemini disabled for failed deliveries", () => {
  let w, hook;
  before(async () => ({ w, hook } = await workerWithWebhook()));
  after(() => w?.dispose());

  it("is enabled again by a pass, and the open operations are polled in that pass's fan-out", async () => {
    const keys = Array.from({ length: 6 }, (_, i) => `batches/missed${i}`);
    for (const k of keys) await w.register(k, "nightly");
    await w.ledger(keys);
    // Their completions came while the webhook was disabled: only polling finds them.
    for (const k of keys) status.set(k, succeeded());
    service.disable(hook.id);
    const reenabledBefore = alerts("webhook_reenabled").length;

    const line = await pass(w);
    // connect's call: PATCH webhooks/{id}?update_mask=state {state: "enabled"}, answered 200.
    assert.deepEqual(
      patches().map((c) => [c.path, c.body, c.status]),
      [[`/v1beta/webhooks/${hook.id}?update_mask=state`, { state: "enabled" }, 200]],
    );
    assert.equal(service.hooks.get(hook.id).state, "enabled");
    // Six open operations is far under RECONCILE_FANOUT_ABOVE (200): a pass in its usual order
    // polls them itself; this one schedules them all on the queue.
    assert.equal(line.fed, keys.length, JSON.stringify(line));
    assert.equal(line.status_calls, 0, "the pass polls nothing itself");
    assert.ok(line.queue_sends >= 1);
    assert.equal(line.stopped, "complete");
    const enabled = w.events("webhook_enabled").at(-1);
    assert.equal(enabled.webhook, hook.id);
    assert.equal(enabled.was, "disabled_due_to_failed_deliveries");
    assert.equal(enabled.swept, true);
    const [alert] = alerts("webhook_reenabled").slice(reenabledBefore);
    assert.ok(alert, "the alert says what was done");
    assert.match(alert.text, /was disabled_due_to_failed_deliveries: re-enabled by a cron pass/);
    assert.match(alert.text, /Swept: 6 open operations scheduled for a poll on the fan-out queue/);
    assert.equal(alerts("webhook_reenabled").length, reenabledBefore + 1);

    // The consumer polls each once and the gates settle them: one side effect each.
    for (const k of keys) {
      await eventually(async () => (await w.inspect(k)).body.effect_done, { what: `the effect of ${k}`, timeoutMs: 30_000 });
    }
    for (const k of keys) {
      assert.equal(effectsFor(k).length, 1, k);
      assert.equal((await w.inspect(k)).body.settled_by, "reconcile", k);
    }
    assert.equal(statusCalls(keys).length, keys.length, "each polled once");
    // A consumer's line is logged when its batch ends, which may come after the effects.
    const jobCalls = () => w.events("reconcile_job").reduce((n, j) => n + j.status_calls, 0);
    await eventually(() => jobCalls() >= keys.length, { what: "the consumers' lines" });
    assert.equal(jobCalls(), keys.length, "by the queue's consumer");

    // Enabled now: the next pass leaves it be and alerts nothing.
    const next = await pass(w);
    assert.equal(patches().length, 1);
    assert.equal(alerts("webhook_reenabled").length, reenabledBefore + 1);
    assert.equal(next.fed, 0);
    const stats = await w.admin("/v1/stats");
    assert.deepEqual(stats.body.gemini_webhook, { name: hook.id, alerted_state: null }, "nothing outstanding");
  });

  it("is left alone and alerted when a person disabled it", async () => {
    service.hooks.get(hook.id).state = "disabled";
    const before = alerts("webhook_disabled").length;
    const patched = patches().length;
    const key = "batches/by-hand";
    await w.register(key, "nightly");
    await w.ledger(key);
    status.set(key, { status: 200, body: { name: key, metadata: { state: "BATCH_STATE_RUNNING" } } });
    const line = await pass(w);
    assert.equal(patches().length, patched, "no call to enable it");
    assert.equal(service.hooks.get(hook.id).state, "disabled");
    const [alert] = alerts("webhook_disabled").slice(before);
    assert.ok(alert);
    assert.match(alert.text, /is disabled; completions now arrive only through reconciliation\. Disabled by a person: left alone/);
    // No sweep: the pass polls in its usual order (by itself, for so few).
    assert.equal(line.fed, 0, JSON.stringify(line));
    assert.ok(line.status_calls >= 1);
    // Once per state: the next pass does not alert again.
    await pass(w);
    assert.equal(alerts("webhook_disabled").length, before + 1);
    status.delete(key);
  });
});

describe("GEMINI_WEBHOOK_AUTO_ENABLE=false", () => {
  it("leaves a webhook Gemini disabled for failed deliveries disabled, and alerts", async () => {
    const { w, hook } = await workerWithWebhook({ GEMINI_WEBHOOK_AUTO_ENABLE: "false" });
    try {
      service.disable(hook.id);
      const before = alerts("webhook_disabled").length;
      const patched = patches().length;
      const line = await pass(w);
      assert.equal(patches().length, patched, "no call to enable it");
      assert.equal(service.hooks.get(hook.id).state, "disabled_due_to_failed_deliveries");
      const [alert] = alerts("webhook_disabled").slice(before);
      assert.ok(alert);
      assert.match(alert.text, /is disabled_due_to_failed_deliveries; .*GEMINI_WEBHOOK_AUTO_ENABLE=false: left disabled/);
      assert.equal(line.fed, 0);
      assert.deepEqual(w.events("webhook_enabled"), []);
      const config = await w.admin("/v1/config");
      assert.equal(config.body.settings.find((s) => s.name === "GEMINI_WEBHOOK_AUTO_ENABLE")?.value, false);
    } finally {
      await w.dispose();
    }
  });
});
