// Cloudflare-native destinations, against the built worker in workerd: EFFECT_ROUTES naming a
// real local Queue (consumed by a second local worker) and a Service Binding to a third local
// worker. Each forwards what it received to a local HTTP server so the test can read it.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { Webhook } from "standardwebhooks";
import { startWorker, startServer, startDestination, assertEffectValid, eventually, sleep, EFFECT_SECRET } from "./helpers.mjs";

let sink, dest, w;
let serviceStatus = 200;

// A queue consumer: forwards each message as it came, then acknowledges it.
const CONSUMER = `export default {
  async queue(batch, env) {
    for (const m of batch.messages) {
      await fetch(env.SINK + "/queue", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(m.body) });
      m.ack();
    }
  },
};`;

// A service: forwards the request's signed headers and body, answers what the sink says.
const PUBLISHER = `export default {
  async fetch(request, env) {
    const headers = { "content-type": "application/json" };
    for (const name of ["webhook-id", "webhook-timestamp", "webhook-signature", "idempotency-key", "effect-generation"]) headers[name] = request.headers.get(name) ?? "";
    const r = await fetch(env.SINK + "/service", { method: "POST", headers, body: await request.text() });
    return new Response(await r.text(), { status: r.status });
  },
};`;

before(async () => {
  sink = await startServer((req) => (req.url === "/service" ? { status: serviceStatus } : { status: 200 }));
  dest = await startDestination(() => ({ status: 200 }));
  w = await startWorker(
    {
      EFFECT_URL: `${dest.url}/effects`,
      EFFECT_ROUTES: JSON.stringify({ billing: "queue:BILLING_EFFECTS", publish: "service:PUBLISHER" }),
      // Unregistered operations here need no wait for a late registration's kind.
      UNREGISTERED_HOLD_SECONDS: "0",
      EFFECT_RETRY_BASE_SECONDS: "1",
      EFFECT_RETRY_MAX_SECONDS: "1",
    },
    {
      main: { queueProducers: { BILLING_EFFECTS: "billing-effects" }, serviceBindings: { PUBLISHER: "publisher" } },
      workers: [
        { name: "billing-consumer", modules: true, script: CONSUMER, compatibilityDate: "2026-04-01", bindings: { SINK: sink.url }, queueConsumers: { "billing-effects": { maxBatchTimeout: 0 } } },
        { name: "publisher", modules: true, script: PUBLISHER, compatibilityDate: "2026-04-01", bindings: { SINK: sink.url } },
      ],
    },
  );
});
after(async () => {
  await w?.dispose();
  await sink?.close();
  await dest?.close();
  dest?.assertAllValid();
});

/** What the sink got at `path` for `key`: queue messages carry the effect once, as the bytes
 * signed, under `raw_body`. */
const at = (path, key) => sink.requests.filter((r) => r.url === path && (path === "/queue" ? JSON.parse(JSON.parse(r.body).raw_body ?? "{}").key : JSON.parse(r.body).key) === key);

describe("Cloudflare-native destinations", () => {
  it("sends to a Queue: a successful send is done, and the message carries the signed headers beside the body", async () => {
    const key = "batches/queued1";
    await w.register(key, "billing");
    await w.deliver("batch.succeeded", key, { output_file_uri: "gs://b/q.jsonl" });
    await eventually(async () => (await w.inspect(key)).body.effect_done, { what: "the queue send to count as done" });
    const [message] = await eventually(() => at("/queue", key).length && at("/queue", key), { what: "the consumer to receive it" });
    const m = JSON.parse(message.body);
    assert.deepEqual(Object.keys(m).sort(), ["headers", "raw_body"], "the body once, as the bytes signed");
    const body = assertEffectValid(JSON.parse(m.raw_body));
    assert.equal(body.kind, "billing");
    assert.equal(m.headers["idempotency-key"], key, "the consumer dedupes by the key the message carries");
    const verified = new Webhook(EFFECT_SECRET).verify(m.raw_body, {
      "webhook-id": m.headers["webhook-id"],
      "webhook-timestamp": m.headers["webhook-timestamp"],
      "webhook-signature": m.headers["webhook-signature"],
    });
    assert.equal(verified.key, key);
    assert.equal(dest.requests.length, 0, "nothing went to EFFECT_URL");
  });

  it("calls a Service Binding signed like an HTTPS destination, and retries its 5xx", async () => {
    const key = "batches/served1";
    serviceStatus = 503;
    await w.register(key, "publish");
    await w.deliver("batch.succeeded", key);
    await eventually(() => at("/service", key).length >= 1, { what: "the first call" });
    serviceStatus = 200;
    const op = await eventually(async () => {
      const o = await w.inspect(key);
      return o.body.effect_done && o;
    }, { what: "the retry to succeed" });
    assert.ok(op.body.attempts >= 2);
    const calls = at("/service", key);
    assert.equal(new Set(calls.map((c) => c.headers["webhook-id"])).size, 1, "one webhook-id across retries");
    const last = calls[calls.length - 1];
    const verified = new Webhook(EFFECT_SECRET).verify(last.body, {
      "webhook-id": last.headers["webhook-id"],
      "webhook-timestamp": last.headers["webhook-timestamp"],
      "webhook-signature": last.headers["webhook-signature"],
    });
    assertEffectValid(verified);
    assert.equal(verified.kind, "publish");
  });

  it("keeps other kinds on EFFECT_URL", async () => {
    await w.deliver("batch.succeeded", "batches/plain-dest");
    await eventually(() => dest.requests.some((r) => r.headers["idempotency-key"] === "batches/plain-dest"), { what: "the URL effect" });
    await sleep(200);
    assert.equal(at("/queue", "batches/plain-dest").length + at("/service", "batches/plain-dest").length, 0);
  });
});
