// Workers Analytics Engine, optional: with the ANALYTICS binding the built worker writes one
// data point per side-effect attempt and one per delivery; without it nothing changes.
// Miniflare's own stand-in for the dataset drops every point, so the binding here is a
// stand-in that prints each point as a log line the test reads (Cloudflare's service is the
// only part not real).
import { describe, it, after } from "node:test";
import assert from "node:assert/strict";
import { startWorker, startDestination, eventually } from "./helpers.mjs";

const RECORDER = `export default function () {
  return {
    writeDataPoint(point) {
      console.log(JSON.stringify({ analytics_point: point }));
    },
  };
}`;

const withBinding = {
  main: { wrappedBindings: { ANALYTICS: { scriptName: "analytics-stand-in" } } },
  workers: [{
    name: "analytics-stand-in",
    modules: [{ type: "ESModule", path: "analytics-stand-in.mjs", contents: RECORDER }],
  }],
};

// The stand-in's lines carry no \`event\`: they are not the worker's own log lines.
const written = (w) => w.logs.flatMap((line) => {
  try {
    const o = JSON.parse(line);
    return o && o.analytics_point ? [o.analytics_point] : [];
  } catch {
    return [];
  }
});
const points = (w, blob1) => written(w).filter((p) => p.blobs[0] === blob1);

describe("Analytics Engine", () => {
  const open = [];
  after(async () => {
    for (const x of open) {
      if (x.dispose) await x.dispose();
      else await x.close();
    }
  });

  it("writes a point per attempt and per delivery when the binding is declared", async () => {
    let n = 0;
    const dest = await startDestination(() => (++n === 1 ? { status: 503 } : { status: 204 }));
    open.push(dest);
    const w = await startWorker({
      EFFECT_URL: `${dest.url}/effects`,
      EFFECT_RETRY_BASE_SECONDS: "1",
      EFFECT_RETRY_MAX_SECONDS: "1",
    }, withBinding);
    open.push(w);
    await w.register("batches/ae1", "publish");
    const first = await w.deliver("batch.succeeded", "batches/ae1", { output_file_uri: "gs://b/o" }, { webhookId: "msg_ae1" });
    assert.equal(first.body.outcome, "applied");
    const again = await w.deliver("batch.succeeded", "batches/ae1", { output_file_uri: "gs://b/o" }, { webhookId: "msg_ae1" });
    assert.equal(again.body.reason, "duplicate");
    const forged = await w.fetch("/webhooks/gemini", {
      method: "POST",
      headers: { "content-type": "application/json", "webhook-id": "x", "webhook-timestamp": "1", "webhook-signature": "v1,AAAA" },
      body: "{}",
    });
    assert.ok(forged.status >= 400 && forged.status < 500, String(forged.status));

    const attempts = await eventually(() => {
      const a = points(w, "effect_attempt");
      return a.length >= 2 && a;
    }, { what: "two attempt points" });
    assert.deepEqual(attempts.map((p) => p.blobs[3]), ["retry", "delivered"]);
    assert.deepEqual(attempts.map((p) => p.blobs[4]), ["503", "204"]);
    for (const p of attempts) {
      assert.equal(p.blobs[2], "publish");
      assert.match(p.blobs[1], /^EFFECT_URL: http:\/\/127\.0\.0\.1:\d+\/…$/);
      assert.deepEqual(p.indexes, [p.blobs[1]]);
      assert.ok(p.doubles[0] >= 0 && p.doubles[1] >= p.doubles[0], JSON.stringify(p));
    }
    assert.equal(attempts[1].doubles[2], 204);

    const deliveries = points(w, "delivery");
    const seen = deliveries.map((p) => p.blobs.slice(1).join(" "));
    assert.ok(seen.includes("delivered  batch.succeeded"), seen.join("; "));
    assert.ok(seen.includes("duplicate duplicate batch.succeeded"), seen.join("; "));
    assert.ok(seen.some((s) => s.startsWith("rejected ") && s.endsWith(" unknown")), seen.join("; "));
    for (const p of deliveries) {
      assert.equal(p.doubles.length, 1);
      assert.ok(!JSON.stringify(p).includes("batches/ae1"), "no operation name in a point");
    }
  });

  it("runs the same without the binding", async () => {
    const dest = await startDestination(() => ({ status: 204 }));
    open.push(dest);
    const w = await startWorker({ EFFECT_URL: `${dest.url}/effects` });
    open.push(w);
    await w.register("batches/ae2", "publish");
    const r = await w.deliver("batch.succeeded", "batches/ae2", { output_file_uri: "gs://b/o" });
    assert.equal(r.body.outcome, "applied");
    await eventually(async () => (await w.inspect("batches/ae2")).body.effect_done, { what: "the effect" });
    assert.equal(dest.requests.length, 1);
    assert.equal(w.events("rejected").length, 0, "no error of a missing binding");
  });
});
