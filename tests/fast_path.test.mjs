// The webhook fast path against the built worker in workerd: one side effect per completion
// however often and however concurrently it arrives.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { Webhook } from "standardwebhooks";
import { startWorker, startDestination, assertEffectValid, eventually, sleep, EFFECT_SECRET, signedHeaders } from "./helpers.mjs";

// The destination's behaviour per operation key, set by each test.
const plans = new Map();
let dest;
let w;

const effectsFor = (key) => dest.requests.filter((r) => r.headers["idempotency-key"] === key);
const acceptedFor = (key) => effectsFor(key).filter((r) => r.answered === 200);

before(async () => {
  dest = await startDestination((req, n) => {
    const key = req.headers["idempotency-key"];
    const plan = plans.get(key);
    const answer = plan ? plan(effectsFor(key).length) : { status: 200 };
    req.answered = answer.status ?? 200;
    return answer;
  });
  // The destination answers at once (or after 300 ms): an attempt that times out is a starved
  // machine, and its retry would be a second request where these tests count one. The test
  // of a destination slower than the timeout has a worker of its own.
  w = await startWorker({ EFFECT_URL: `${dest.url}/effects`, EFFECT_RETRY_BASE_SECONDS: "1", EFFECT_RETRY_MAX_SECONDS: "2", EFFECT_TIMEOUT_MS: "60000" });
});
after(async () => {
  await w?.dispose();
  await dest?.close();
  dest?.assertAllValid();
});

describe("fast path", () => {
  it("answers /healthz when configured", async () => {
    const r = await w.json("/healthz");
    assert.equal(r.status, 200);
    assert.equal(r.body.ok, true);
  });

  it("runs one side effect for five sequential duplicates", async () => {
    await w.register("batches/seq5", "nightly-review");
    const headers = {};
    for (let i = 0; i < 5; i++) {
      // Retries of one delivery (same webhook-id) and fresh deliveries of the same completion.
      const r = await w.deliver("batch.succeeded", "batches/seq5", { output_file_uri: "gs://b/out.jsonl" }, i < 3 ? { webhookId: "msg_seq5" } : {});
      assert.equal(r.status, 200, JSON.stringify(r.body));
      headers[i] = r.body;
    }
    assert.equal(headers[0].outcome, "applied");
    assert.equal(headers[0].effect, "scheduled", "the answer does not wait for the destination");
    for (let i = 1; i < 5; i++) assert.equal(headers[i].reason, "duplicate");
    // The isolate remembers the terminal outcome its gate answered: the duplicates are
    // answered without a gate round trip.
    for (let i = 1; i < 5; i++) assert.equal(headers[i].effect, "not_asked", JSON.stringify(headers[i]));
    assert.equal(w.events("duplicate").filter((l) => l.key === "batches/seq5" && l.answered_by === "edge").length, 4);
    const op = await eventually(async () => {
      const o = await w.inspect("batches/seq5");
      return o.body.effect_done && o;
    }, { what: "the effect" });
    assert.equal(effectsFor("batches/seq5").length, 1);
    assert.equal(op.body.status, "succeeded");
    assert.equal(op.body.effect_done, true);
    assert.equal(op.body.settled_by, "webhook");
    assert.equal(op.body.kind, "nightly-review");
    assert.equal(op.body.attempts, 1);
  });

  it("runs one side effect for ten concurrent duplicates", async () => {
    // A slow destination widens the window in which the duplicates overlap the first attempt.
    plans.set("batches/conc10", () => ({ status: 200, delayMs: 300 }));
    await w.register("batches/conc10", "k");
    const results = await Promise.all(
      Array.from({ length: 10 }, (_, i) => w.deliver("batch.succeeded", i % 2 ? "batches/conc10" : "conc10", {}, { webhookId: `msg_conc_${i % 3}` })),
    );
    for (const r of results) assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal(results.filter((r) => r.body.outcome === "applied").length, 1);
    await eventually(() => effectsFor("batches/conc10").length >= 1, { what: "the effect" });
    await sleep(500);
    assert.equal(effectsFor("batches/conc10").length, 1);
  });

  it("delivers a failed batch once with its error", async () => {
    await w.register("batches/failed1", "k");
    for (let i = 0; i < 3; i++) {
      const r = await w.deliver("batch.failed", "failed1", { error_code: 13, error_message: "quota exhausted" });
      assert.equal(r.status, 200);
    }
    const sent = await eventually(() => effectsFor("batches/failed1").length && effectsFor("batches/failed1"), { what: "the effect" });
    assert.equal(sent.length, 1);
    const body = assertEffectValid(sent[0].body);
    assert.equal(body.version, 1);
    assert.equal(body.key, "batches/failed1");
    assert.equal(body.status, "failed");
    assert.equal(body.error_code, 13);
    assert.equal(body.error_message, "quota exhausted");
    assert.equal(body.settled_by, "webhook");
  });

  it("forwards a side effect that verifies with a Standard Webhooks library", async () => {
    await w.deliver("video.generated", "models/veo-3/operations/vid1", { output_file_uri: "gs://v/1.mp4", file_name: "files/1" });
    const [req] = await eventually(() => effectsFor("operations/vid1").length && effectsFor("operations/vid1"), { what: "the side effect" });
    assert.ok(req, "side effect sent");
    const verified = new Webhook(EFFECT_SECRET).verify(req.body, {
      "webhook-id": req.headers["webhook-id"],
      "webhook-timestamp": req.headers["webhook-timestamp"],
      "webhook-signature": req.headers["webhook-signature"],
    });
    assert.equal(verified.key, "operations/vid1");
    assert.equal(verified.name, "models/veo-3/operations/vid1");
    assert.equal(verified.output_file_uri, "gs://v/1.mp4");
    assertEffectValid(verified);
    assert.deepEqual(verified.output_file_uris, ["gs://v/1.mp4"]);
    assert.equal(verified.provider.file_name, "files/1", "other webhook data goes under provider");
    assert.equal(verified.file_name, undefined);
    assert.equal(req.headers["effect-generation"], "1");
    assert.match(req.headers["webhook-id"], /^msg_[0-9a-f]{24}_1$/);
    assert.throws(() => new Webhook(EFFECT_SECRET).verify(req.body + " ", {
      "webhook-id": req.headers["webhook-id"],
      "webhook-timestamp": req.headers["webhook-timestamp"],
      "webhook-signature": req.headers["webhook-signature"],
    }));
  });

  it("changes nothing for a rejected signature", async () => {
    const body = JSON.stringify({ type: "batch.succeeded", data: { id: "batches/forged" } });
    const cases = [
      signedHeaders(body, { secret: "whsec_d3JvbmctZ2VtaW5pLXNlY3JldA==" }),
      signedHeaders(body, { signature: "v1," }),
      // Well outside the 300 s tolerance (the exact boundary is hostile.test's): a request
      // signed at the end of a second is judged in the next, and +301 would then read 300.
      signedHeaders(body, { ts: Math.floor(Date.now() / 1000) - 310 }),
      signedHeaders(body, { ts: Math.floor(Date.now() / 1000) + 310 }),
      { "content-type": "application/json" },
    ];
    for (const headers of cases) {
      const r = await w.json("/webhooks/gemini", { method: "POST", headers, body });
      assert.equal(r.status, 401);
      assert.deepEqual(r.body, { error: "unauthorized" });
    }
    assert.equal((await w.inspect("batches/forged")).status, 404);
    assert.equal(effectsFor("batches/forged").length, 0);
    assert.equal((await w.kvList("op:batches/forged")).length, 0);
    assert.equal((await w.kvList("dead:")).filter((k) => k.name.includes("forged")).length, 0);
  });

  it("logs a flood of forged requests once per reason, not once per request", async () => {
    // A worker of its own: every rejection it counts is one of these 30.
    const flood = await startWorker();
    try {
      const body = JSON.stringify({ type: "batch.succeeded", data: { id: "batches/flood" } });
      for (let i = 0; i < 30; i++) {
        const r = await flood.json("/webhooks/gemini", { method: "POST", headers: signedHeaders(body, { secret: "whsec_d3JvbmctZ2VtaW5pLXNlY3JldA==" }), body });
        assert.equal(r.status, 401);
      }
      // One line per reason per flush window, and each window ends in one `rejected_summary`
      // (STATS_FLUSH_SECONDS=1 here): how many windows the 30 requests span depends on how
      // fast they went, so the lines are counted against the windows, not a fixed number.
      const summaries = await eventually(() => {
        const s = flood.events("rejected_summary");
        return s.reduce((n, e) => n + (e.counts?.rejected_signature_invalid ?? 0), 0) === 30 && s;
      }, { what: "the 30 forged requests counted in summaries" });
      const lines = flood.events("rejected").filter((e) => e.reason === "signature_invalid").length;
      assert.ok(lines >= 1, "the first of a window is logged in full");
      // A window that straddles an hour (counts are kept by the hour) logs one more line.
      assert.ok(lines <= summaries.length + 1, `${lines} rejected lines for 30 forged requests in ${summaries.length} flush windows`);
    } finally {
      await flood.dispose();
    }
  });

  it("retries a failing destination to done without marking done early", async () => {
    plans.set("batches/flaky", (n) => (n <= 2 ? { status: 503 } : { status: 200 }));
    await w.register("batches/flaky", "k");
    const r = await w.deliver("batch.succeeded", "batches/flaky");
    assert.equal(r.status, 200, "a failed attempt does not fail the delivery");
    assert.equal(r.body.effect, "scheduled");
    let op = await w.inspect("batches/flaky");
    assert.equal(op.body.effect_done, false);
    assert.equal(op.body.status, "succeeded");
    op = await eventually(async () => {
      const o = await w.inspect("batches/flaky");
      return o.body.effect_done && o;
    }, { what: "retries to finish" });
    assert.equal(op.body.attempts, 3);
    const sent = effectsFor("batches/flaky");
    assert.equal(sent.length, 3);
    assert.equal(new Set(sent.map((s) => s.headers["webhook-id"])).size, 1, "same webhook-id on every retry");
    assert.equal(new Set(sent.map((s) => s.body)).size, 1, "same body on every retry");
    assert.equal(acceptedFor("batches/flaky").length, 1);
  });

  it("answers Gemini before the destination answers, and the effect still arrives once", async () => {
    // The destination holds its answer until the test has seen the delivery's 2xx: if the
    // answer waited on the destination, this would never finish.
    let release;
    const seen = new Promise((resolve) => { release = resolve; });
    plans.set("batches/held", () => seen.then(() => ({ status: 200 })));
    const r = await w.deliver("batch.succeeded", "batches/held");
    assert.equal(r.status, 200);
    assert.equal(r.body.outcome, "applied");
    assert.equal(r.body.effect, "scheduled");
    release();
    const op = await eventually(async () => {
      const o = await w.inspect("batches/held");
      return o.body.effect_done && o;
    }, { what: "the held effect" });
    assert.equal(op.body.attempts, 1);
    const sent = effectsFor("batches/held");
    assert.equal(sent.length, 1);
    assert.equal(new Set(sent.map((s) => s.headers["webhook-id"])).size, 1);
  });

  it("retries a destination slower than the timeout, under the same webhook-id", async () => {
    // The first attempt is held until the worker gives up on it and tries again: slower than
    // the timeout however busy the machine, and the retry is seen, not assumed.
    let retried;
    const second = new Promise((resolve) => { retried = resolve; });
    plans.set("batches/slow", (n) => (n === 1 ? second.then(() => ({ status: 200 })) : (retried(), { status: 200 })));
    const slow = await startWorker({ EFFECT_URL: `${dest.url}/effects`, EFFECT_RETRY_BASE_SECONDS: "1", EFFECT_RETRY_MAX_SECONDS: "2", EFFECT_TIMEOUT_MS: "1500" });
    try {
      const r = await slow.deliver("batch.succeeded", "batches/slow");
      assert.equal(r.status, 200);
      assert.equal(r.body.effect, "scheduled");
      const op = await eventually(async () => { const o = (await slow.inspect("batches/slow")).body; return o.effect_done && o; }, { what: "slow retry", timeoutMs: 60_000 });
      assert.ok(op.attempts >= 2, `${op.attempts} attempts`);
      const sent = effectsFor("batches/slow");
      assert.ok(sent.length >= 2, `${sent.length} requests`);
      assert.equal(new Set(sent.map((s) => s.headers["webhook-id"])).size, 1, "a receiver that saw the slow one drops the retry");
    } finally {
      await slow.dispose();
    }
  });

  it("parks a side effect the destination refuses with 400", async () => {
    plans.set("batches/refused", () => ({ status: 400, body: { error: "unknown batch" } }));
    const r = await w.deliver("batch.succeeded", "batches/refused");
    assert.equal(r.status, 200);
    assert.equal(r.body.effect, "scheduled");
    await eventually(async () => (await w.inspect("batches/refused")).body.effect_parked, { what: "the park" });
    await sleep(2500);
    assert.equal(effectsFor("batches/refused").length, 1, "no retries once parked");
    const op = await w.inspect("batches/refused");
    assert.equal(op.body.effect_done, false);
    assert.equal(op.body.effect_parked, true);
    assert.match(op.body.parked_answer, /^400/);
  });

  it("drops a late non-terminal state after a terminal one", async () => {
    await w.deliver("interaction.completed", "interactions/late1");
    const r = await w.deliver("interaction.requires_action", "interactions/late1");
    assert.equal(r.status, 200);
    assert.equal(r.body.outcome, "dropped");
    assert.equal(r.body.reason, "regress_from_terminal");
    const c = await w.deliver("interaction.failed", "interactions/late1");
    assert.equal(c.body.reason, "conflicting_terminal");
    const op = await w.inspect("interactions/late1");
    assert.equal(op.body.status, "succeeded");
    const reasons = op.body.history.filter((h) => h.what === "dropped").map((h) => h.reason);
    assert.deepEqual(reasons, ["regress_from_terminal", "conflicting_terminal"]);
    assert.equal(effectsFor("interactions/late1").length, 1);
  });

  it("registers a completion that arrives before registration", async () => {
    const r = await w.deliver("batch.succeeded", "batch_early1");
    assert.equal(r.status, 200);
    assert.equal(r.body.key, "batches/batch_early1");
    const op = await eventually(async () => {
      const o = await w.inspect("batches/batch_early1");
      return o.body.effect_done && o;
    }, { what: "the effect" });
    assert.equal(op.body.registered, false);
    assert.equal(op.body.effect_done, true);
    const reg = await w.register("batches/batch_early1", "late-kind");
    assert.equal(reg.status, 200, "registration after completion changes its state in nothing");
    assert.equal(reg.body.status, "succeeded");
    assert.equal(reg.body.kind_change, "filled", "but fills in the kind the record lacked");
  });

  it("keeps signed but unusable deliveries as dead letters", async () => {
    const junk = "this is not json";
    const r = await w.json("/webhooks/gemini", { method: "POST", headers: signedHeaders(junk, { webhookId: "msg_junk1" }), body: junk });
    assert.equal(r.status, 400);
    const unknown = await w.deliver("batch.exploded", "batches/x1", {}, { webhookId: "msg_unknown1" });
    assert.equal(unknown.status, 200);
    assert.equal(unknown.body.outcome, "ignored_unknown_type");
    const kv = await w.kv();
    const dead = await kv.get("dead:msg_junk1", "json");
    assert.equal(dead.reason, "not_json");
    assert.equal(dead.body, junk);
    assert.equal((await kv.get("dead:msg_unknown1", "json")).reason, "unknown_event_type");
    assert.equal((await w.inspect("batches/x1")).status, 404);
  });

  it("answers 413 for a body over MAX_BODY_BYTES before checking the signature", async () => {
    const big = "x".repeat(1024 * 1024 + 1);
    // Well-formed headers whose signature covers other bytes: only the cap can refuse it first.
    const headers = { "content-type": "application/json", ...signedHeaders("something else") };
    const r = await w.json("/webhooks/gemini", { method: "POST", headers, body: big });
    assert.equal(r.status, 413);
  });

  it("projects the operation into the KV ledger with metadata", async () => {
    let destinationUp = false;
    plans.set("batches/ledger1", () => (destinationUp ? { status: 200 } : { status: 500 }));
    await w.register("projects/p/locations/l/batches/ledger1", "k");
    await w.ledger("batches/ledger1");
    let [entry] = await w.kvList("op:batches/ledger1");
    assert.equal(entry.metadata.status, "pending");
    assert.equal(entry.metadata.name, "projects/p/locations/l/batches/ledger1");
    assert.equal(entry.expiration, undefined, "open records never expire");
    await w.deliver("batch.succeeded", "ledger1");
    // Projections are spaced a second apart (KV's per-key write rate), so this one may follow.
    entry = await eventually(async () => {
      const [e] = await w.kvList("op:batches/ledger1");
      return e.metadata.status === "succeeded" && e;
    }, { what: "terminal projection" });
    assert.equal(entry.metadata.effect_done, false);
    assert.equal(entry.expiration, undefined, "terminal without effect_done never expires");
    destinationUp = true;
    entry = await eventually(async () => {
      const [e] = await w.kvList("op:batches/ledger1");
      return e.metadata.effect_done && e;
    }, { what: "done projection" });
    assert.ok(entry.expiration > Date.now() / 1000 + 13 * 86400, "retention TTL once done");
    assert.ok(JSON.stringify(entry.metadata).length < 1024);
  });

  it("finds an operation by any form of its name in the admin path", async () => {
    await w.register("models/veo-3/operations/form1", "k");
    for (const p of ["operations/form1", "models%2Fveo-3%2Foperations%2Fform1", "models/veo-3/operations/form1/"]) {
      const r = await w.admin(`/v1/operations/${p}`);
      assert.equal(r.status, 200, p);
      assert.equal(r.body.key, "operations/form1");
    }
    assert.equal((await w.admin("/v1/operations/batches/nope")).status, 404);
    assert.equal((await w.admin("/v1/operations/batches/..%2Fetc")).status, 400);
  });
});

describe("admin API", () => {
  it("refuses requests without the right token", async () => {
    for (const headers of [{}, { authorization: "Bearer wrong" }, { authorization: "test-admin-token-0123456789" }, { authorization: "Bearer test-admin-token-012345678X" }]) {
      const r = await w.json("/v1/operations/batches/seq5", { headers });
      assert.equal(r.status, 401);
      const p = await w.json("/v1/operations", { method: "POST", headers, body: JSON.stringify({ name: "batches/sneaky" }) });
      assert.equal(p.status, 401);
    }
    assert.equal((await w.inspect("batches/sneaky")).status, 404);
  });

  it("registers with 201, then 200 changing nothing, 409 for another kind, and refuses bad names", async () => {
    const first = await w.register("batches/reg1", "nightly");
    assert.equal(first.status, 201);
    assert.equal(first.body.status, "pending");
    assert.equal(first.body.kind, "nightly");
    assert.equal(first.body.effect_done, false);
    assert.equal(first.body.settled_by, null);
    assert.equal(first.body.settled_at, null);
    assert.match(first.body.submitted_at, /^\d{4}-\d\d-\d\dT/);
    const again = await w.register("batches/reg1", "nightly");
    assert.equal(again.status, 200);
    assert.equal(again.body.kind_change, "unchanged");
    const other = await w.register("batches/reg1", "other");
    assert.equal(other.status, 409);
    assert.equal(other.body.operation.kind, "nightly");
    assert.equal((await w.inspect("batches/reg1")).body.kind, "nightly");
    for (const body of [{}, { name: "" }, { name: "batches/" + "a".repeat(400) }, { name: 5 }]) {
      const r = await w.admin("/v1/operations", { method: "POST", body: JSON.stringify(body) });
      assert.equal(r.status, 400, JSON.stringify(body).slice(0, 40));
    }
  });
});

describe("configuration", () => {
  it("answers 503 naming a missing variable on every route, never panicking", async () => {
    const bad = await startWorker({ ADMIN_TOKEN: undefined, EFFECT_URL: "http://127.0.0.1:9/x" });
    try {
      for (const [p, init] of [["/healthz"], ["/webhooks/gemini", { method: "POST", body: "{}" }], ["/v1/operations"]]) {
        const r = await bad.json(p, init);
        assert.equal(r.status, 503);
        assert.equal(r.body.variable, "ADMIN_TOKEN");
      }
    } finally {
      await bad.dispose();
    }
  });

  it("ignores unregistered completions when REQUIRE_REGISTRATION=true", async () => {
    const strict = await startWorker({ REQUIRE_REGISTRATION: "true", EFFECT_URL: `${dest.url}/effects` });
    try {
      const r = await strict.deliver("batch.succeeded", "batches/unreg1");
      assert.equal(r.status, 200);
      assert.equal(r.body.outcome, "ignored_unregistered");
      assert.equal((await strict.inspect("batches/unreg1")).status, 404);
      assert.equal(effectsFor("batches/unreg1").length, 0);
      assert.equal(strict.events("ignored_unregistered").length, 1);
      await strict.register("batches/reg2", "k");
      const ok = await strict.deliver("batch.succeeded", "batches/reg2");
      assert.equal(ok.body.outcome, "applied");
    } finally {
      await strict.dispose();
    }
  });
});
