// A destination's health and pace, against the built worker in workerd: a destination that
// is down is probed (one waiting effect after another), not hammered, and what waited is drained soon after it recovers, each
// effect under its first webhook-id; a paced route is held to its pace; a healthy
// destination's first delivery asks and reports nothing to its desk (at most a read-only check).
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { startWorker, startDestination, startServer, eventually } from "./helpers.mjs";

let down, paced, healthy, alerts, w;
let downUntil = Infinity;

before(async () => {
  down = await startDestination(() => (Date.now() < downUntil ? { status: 503, body: { error: "down" } } : { status: 200 }));
  paced = await startDestination(() => ({ status: 200 }));
  healthy = await startDestination(() => ({ status: 200 }));
  alerts = await startServer(() => ({ status: 200 }));
  w = await startWorker({
    EFFECT_URL: `${down.url}/effects`,
    EFFECT_ROUTES: JSON.stringify({
      paced: { url: `${paced.url}/effects`, per_second: 5 },
      healthy: `${healthy.url}/effects`,
    }),
    ALERT_URL: `${alerts.url}/alerts`,
    UNREGISTERED_HOLD_SECONDS: "0",
    // The destinations answer at once: an attempt past the default 5 s is a starved machine,
    // and its "timeout" would stand where the test reads the destination's 503.
    EFFECT_TIMEOUT_MS: "60000",
  });
});
after(async () => {
  await w?.dispose();
  for (const s of [down, paced, healthy]) {
    await s?.close();
    s?.assertAllValid();
  }
  await alerts?.close();
});

const destinations = async () => (await w.admin("/v1/stats")).body.destinations;
const desk = async (prefix) => (await destinations()).find((d) => d.label.startsWith(prefix));
const alertsOf = (name) => alerts.requests.map((r) => JSON.parse(r.body)).filter((a) => a.alert === name);

describe("a destination's health", () => {
  it("a first delivery to a healthy destination makes no ask or report to its desk", async () => {
    await w.register("batches/healthy-1", "healthy");
    await w.deliver("batch.succeeded", "batches/healthy-1");
    await eventually(async () => (await w.inspect("batches/healthy-1")).body.effect_done, { what: "the healthy effect" });
    const view = await desk("route healthy:");
    assert.equal(view.state, "healthy");
    assert.equal(view.calls, 0, JSON.stringify(view));
    assert.equal(view.waiting, 0);
  });

  it("60 effects to a destination down for 30 s: one attempt each plus the probes, then drained once each after recovery under their first webhook-id", async () => {
    const keys = Array.from({ length: 60 }, (_, i) => `batches/down-${i}`);
    downUntil = Date.now() + 30_000;
    await Promise.all(keys.map((k) => w.deliver("batch.succeeded", k)));
    const opened = await eventually(async () => {
      const view = await desk("EFFECT_URL:");
      return view?.state === "open" && view;
    }, { what: "the destination open" });
    assert.match(opened.last_error ?? "", /503/);
    await eventually(async () => Date.now() >= downUntil, { what: "the outage's end", timeoutMs: 40_000, everyMs: 250 });
    const recoveredAt = downUntil;
    const sentWhileDown = down.requests.filter((r) => r.at < recoveredAt);
    // One attempt each, plus the probes (2 s, then 4, 8, 15 s apart: four within 30 s), which
    // rotate over the waiting effects: no effect is probed twice while others wait.
    assert.ok(sentWhileDown.length <= 60 + 5, `${sentWhileDown.length} requests while down`);
    const sentTimes = (k) => sentWhileDown.filter((r) => r.headers["idempotency-key"] === k).length;
    const repeated = keys.filter((k) => sentTimes(k) > 1);
    assert.ok(repeated.length <= 5, `attempted more than once while down: ${repeated}`);
    assert.ok(keys.every((k) => sentTimes(k) <= 2), `probed twice: ${keys.filter((k) => sentTimes(k) > 2)}`);
    await eventually(async () => {
      const views = await Promise.all(keys.map((k) => w.inspect(k)));
      return views.every((v) => v.body.effect_done);
    }, { what: "every effect delivered", timeoutMs: 120_000, everyMs: 500 });
    // Drained by the desk once it recovered, not each on its own backoff: every effect sent
    // once after recovery (how fast is the bench's to say, not a timed test's).
    const sentAfter = (k) => down.requests.filter((r) => r.at >= recoveredAt && r.headers["idempotency-key"] === k).length;
    assert.deepEqual(keys.filter((k) => sentAfter(k) !== 1), [], "each sent once after recovery");
    for (const k of keys) {
      const sent = down.requests.filter((r) => r.headers["idempotency-key"] === k);
      assert.ok(sent.every((r) => r.headers["webhook-id"] === sent[0].headers["webhook-id"]), `${k} kept its webhook-id`);
    }
    await eventually(async () => alertsOf("destination_recovered").length === 1, { what: "the recovery alert" });
    assert.equal(alertsOf("destination_open").length, 1, "one alert when it opened");
    const [recovered] = alertsOf("destination_recovered");
    assert.ok(recovered.waited >= 50, JSON.stringify(recovered));
    assert.equal((await desk("EFFECT_URL:")).state, "healthy");
  });
});

describe("a destination's pace", () => {
  it("a route paced at 5 a second receives 50 effects at no more than 6 in any second", async () => {
    const keys = Array.from({ length: 50 }, (_, i) => `batches/paced-${i}`);
    await Promise.all(keys.map((k) => w.register(k, "paced")));
    await Promise.all(keys.map((k) => w.deliver("batch.succeeded", k)));
    await eventually(async () => new Set(paced.requests.map((r) => r.headers["idempotency-key"])).size === 50, {
      what: "50 paced deliveries", timeoutMs: 40_000, everyMs: 250,
    });
    const times = paced.requests.map((r) => r.at).sort((a, b) => a - b);
    for (const start of times) {
      const inSecond = times.filter((t) => t >= start && t < start + 1_000).length;
      assert.ok(inSecond <= 6, `${inSecond} requests within a second of ${start}`);
    }
    assert.equal(paced.requests.length, 50, "none failed, none sent twice");
    const view = await desk("route paced:");
    assert.deepEqual(view.pace, { per_second: 5 });
  });
});
