// Tokens by scope against the built worker in workerd: a register token registers and reads
// its job back and does nothing else; a read token reads and never acts; an admin token does
// everything (tests/openapi.test.mjs walks every documented route with each); several tokens
// of one scope are accepted together (a rotation); a token in two scopes, or a scope token
// equal to the admin token, stops the worker with 503 naming the setting, on every route
// and in /healthz; and who acted is logged and kept in the history by the token's scope and
// fingerprint, never the token itself.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { startWorker, startServer, eventually, ADMIN_TOKEN, REGISTER_TOKEN, READ_TOKEN } from "./helpers.mjs";
import { fingerprint } from "../scripts/deploy_vars.mjs";

let w, dest;
before(async () => {
  dest = await startServer(() => ({ status: 200 }));
  w = await startWorker({ EFFECT_URL: `${dest.url}/effects` });
});
after(async () => {
  await w?.dispose();
  await dest?.close();
});

/** Every log line printed so far, as one text: no token may be in it. */
const allLogs = () => w.logs.join("\n");

describe("tokens by scope", () => {
  it("a register token registers its job and reads it back, and is refused the rest with 403 naming the scope", async () => {
    const submitter = w.as(REGISTER_TOKEN);
    const created = await submitter.register("batches/acc-reg", "nightly-review");
    assert.equal(created.status, 201, JSON.stringify(created.body));
    const again = await submitter.register("batches/acc-reg", "nightly-review");
    assert.equal(again.status, 200);
    const job = await submitter.inspect("batches/acc-reg");
    assert.deepEqual([job.status, job.body.status, job.body.kind], [200, "pending", "nightly-review"]);
    // Any single operation, registered by it or not: it may register any name anyway.
    assert.equal((await w.deliver("batch.succeeded", "batches/acc-other")).status, 200);
    assert.equal((await submitter.inspect("batches/acc-other")).status, 200);
    for (const [method, path, needs] of [
      ["GET", "/v1/operations", "read"],
      ["GET", "/v1/stats", "read"],
      ["GET", "/v1/config", "read"],
      ["POST", "/v1/operations/batches/acc-reg/forget", "admin"],
      ["POST", "/v1/operations/batches/acc-reg/settle", "admin"],
      ["POST", "/v1/bulk/redeliver", "admin"],
    ]) {
      const res = await submitter.json(path, { method, body: method === "POST" ? "{}" : undefined });
      assert.equal(res.status, 403, `${method} ${path}: ${JSON.stringify(res.body)}`);
      assert.deepEqual([res.body.scope, res.body.needs], ["register", needs]);
      assert.match(res.body.error, new RegExp(`^forbidden: a register token may not do this; it needs an? ${needs} token`));
    }
    assert.equal((await w.inspect("batches/acc-reg")).body.forgotten ?? null, null, "nothing it was refused happened");
    const line = w.events("registered").find((e) => e.key === "batches/acc-reg");
    assert.deepEqual(line.by, { scope: "register", fingerprint: fingerprint(REGISTER_TOKEN) });
  });

  it("a read token reads and never acts", async () => {
    const reader = w.as(READ_TOKEN);
    for (const path of ["/v1/operations?limit=5", "/v1/operations/batches/acc-other", "/v1/stats", "/v1/config", "/v1/whoami"]) {
      assert.equal((await reader.json(path)).status, 200, path);
    }
    const refused = await reader.json("/v1/operations/batches/acc-other/redeliver", { method: "POST", body: JSON.stringify({ reason: "try" }) });
    assert.equal(refused.status, 403);
    assert.deepEqual([refused.body.scope, refused.body.needs], ["read", "admin"]);
    const registering = await reader.register("batches/acc-by-reader", "k");
    assert.deepEqual([registering.status, registering.body.needs], [403, "register"]);
    assert.equal((await w.inspect("batches/acc-by-reader")).status, 404, "nothing registered");
    const { body } = await w.inspect("batches/acc-other");
    assert.equal(body.generation, 1, "nothing redelivered");
    // The refusal is logged with who tried: the first of each window in full, the rest counted.
    const line = await eventually(async () => {
      await reader.json("/v1/bulk/retry", { method: "POST", body: "{}" });
      return w.events("rejected").find((e) => e.reason === "admin_forbidden" && e.by?.scope === "read");
    }, { everyMs: 250, what: "the 403's log line" });
    assert.deepEqual([line.method, line.needs, line.by.fingerprint], ["POST", "admin", fingerprint(READ_TOKEN)]);
  });

  it("an unknown token is 401 on every route, a known one is told its scope", async () => {
    for (const token of ["", "nope", `${READ_TOKEN}x`, READ_TOKEN.slice(1), `${REGISTER_TOKEN} ${ADMIN_TOKEN}`]) {
      for (const [method, path] of [["GET", "/v1/stats"], ["POST", "/v1/operations"], ["GET", "/v1/operations/batches/acc-reg"]]) {
        const res = await w.as(token).json(path, { method, body: method === "POST" ? "{}" : undefined });
        assert.equal(res.status, 401, `${JSON.stringify(token)} ${method} ${path}`);
        assert.deepEqual(res.body, { error: "unauthorized" });
      }
    }
    for (const [token, scope] of [[READ_TOKEN, "read"], [ADMIN_TOKEN, "admin"]]) {
      assert.deepEqual((await w.as(token).json("/v1/whoami")).body, { scope, fingerprint: fingerprint(token) });
    }
  });

  it("an admin action is logged and kept in the history by the scope and fingerprint of the token that acted", async () => {
    const key = "batches/acc-acted";
    await w.register(key, "k");
    await w.deliver("batch.succeeded", key);
    await eventually(async () => (await w.inspect(key)).body.effect_done, { what: "the effect" });
    const admin = w.as(ADMIN_TOKEN);
    assert.equal((await admin.json(`/v1/operations/${key}/redeliver`, { method: "POST", body: JSON.stringify({ reason: "lost" }) })).status, 200);
    const who = { scope: "admin", fingerprint: fingerprint(ADMIN_TOKEN) };
    const { body } = await w.inspect(key);
    assert.deepEqual(body.history.find((h) => h.what === "redeliver").by, who);
    const action = w.events("admin_action").find((e) => e.path === `/v1/operations/${key}/redeliver`);
    assert.deepEqual([action.method, action.status, action.by], ["POST", 200, who]);
    assert.deepEqual(await eventually(() => w.events("redeliver").find((e) => e.key === key)?.by), who, "the gate's line too");
    // A bulk run: each operation it acts on is named by who ran it.
    await eventually(async () => (await w.inspect(key)).body.effect_done, { what: "the redelivery" });
    await w.ledger(key, (m) => m.effect_done);
    const bulk = await admin.json("/v1/bulk/redeliver", { method: "POST", body: JSON.stringify({ filter: { prefix: key }, reason: "bulk", sent_before: new Date().toISOString() }) });
    assert.equal(bulk.body.redelivered, 1, JSON.stringify(bulk.body));
    const rows = (await w.inspect(key)).body.history.filter((h) => h.what === "redeliver");
    assert.equal(rows.length, 2);
    assert.deepEqual(rows[1].by, who);
    assert.ok(w.events("admin_action").some((e) => e.path === "/v1/bulk/redeliver" && e.status === 200 && e.by.fingerprint === who.fingerprint));
    // Reads are not actions: no admin_action line for them.
    assert.ok(!w.events("admin_action").some((e) => e.method === "GET"));
    for (const token of [ADMIN_TOKEN, REGISTER_TOKEN, READ_TOKEN]) assert.ok(!allLogs().includes(token), "no token in the logs");
  });

  it("the fingerprint is the documented hash, the same in deploy's output and the worker's answers", () => {
    const documented = createHash("sha256").update(`gemini-once:${ADMIN_TOKEN}`).digest("hex").slice(0, 8);
    assert.equal(fingerprint(ADMIN_TOKEN), documented);
    assert.equal(fingerprint("admin-token-0123456789"), "892b052f", "src/operator/access.rs's known answer");
  });
});

describe("rotation and configuration", () => {
  it("several tokens of each scope work together, old and new", async () => {
    const tokens = {
      ADMIN_TOKEN: ["rot-admin-old-0123456789", "rot-admin-new-0123456789"],
      REGISTER_TOKENS: ["rot-register-old-0123456789", "rot-register-new-0123456789"],
      READ_TOKENS: ["rot-read-old-0123456789", "rot-read-new-0123456789"],
    };
    const r = await startWorker(Object.fromEntries(Object.entries(tokens).map(([k, v]) => [k, v.join(" ")])));
    try {
      const config = (await r.as(tokens.READ_TOKENS[1]).json("/v1/config")).body;
      const shown = Object.fromEntries(config.settings.map((s) => [s.name, s.value]));
      assert.deepEqual([shown.ADMIN_TOKEN, shown.REGISTER_TOKENS, shown.READ_TOKENS], ["set (2)", "set (2)", "set (2)"]);
      for (const [i, token] of tokens.REGISTER_TOKENS.entries()) {
        assert.equal((await r.as(token).register(`batches/rot-${i}`, "k")).status, 201, token);
        assert.equal((await r.as(token).json("/v1/stats")).status, 403);
      }
      await r.ledger(["batches/rot-0", "batches/rot-1"]);
      for (const token of tokens.READ_TOKENS) {
        assert.equal((await r.as(token).json("/v1/operations?limit=10")).body.operations.length, 2);
        assert.equal((await r.as(token).json("/v1/operations/batches/rot-0/forget", { method: "POST" })).status, 403);
      }
      for (const [i, token] of tokens.ADMIN_TOKEN.entries()) {
        assert.equal((await r.as(token).json(`/v1/operations/batches/rot-${i}/forget`, { method: "POST" })).status, 200, token);
        assert.equal((await r.as(token).json("/v1/whoami")).body.fingerprint, fingerprint(token));
      }
      // The old tokens dropped: only the new ones work.
      await r.restart(Object.fromEntries(Object.entries(tokens).map(([k, v]) => [k, v[1]])));
      assert.equal((await r.as(tokens.REGISTER_TOKENS[0]).register("batches/rot-2", "k")).status, 401);
      assert.equal((await r.as(tokens.REGISTER_TOKENS[1]).register("batches/rot-2", "k")).status, 201);
    } finally {
      await r.dispose();
    }
  });

  it("a token in two scopes, or a scope token equal to the admin token, answers 503 naming the setting, /healthz included", async () => {
    const cases = [
      [{ READ_TOKENS: `${READ_TOKEN} ${REGISTER_TOKEN}` }, "READ_TOKENS", "REGISTER_TOKENS"],
      [{ REGISTER_TOKENS: ADMIN_TOKEN }, "REGISTER_TOKENS", "ADMIN_TOKEN"],
      [{ READ_TOKENS: `${ADMIN_TOKEN}` }, "READ_TOKENS", "ADMIN_TOKEN"],
    ];
    for (const [vars, setting, other] of cases) {
      const bad = await startWorker(vars);
      try {
        for (const [method, path, token] of [["GET", "/healthz"], ["GET", "/v1/stats", ADMIN_TOKEN], ["POST", "/v1/operations", REGISTER_TOKEN], ["GET", "/v1/whoami", READ_TOKEN]]) {
          const res = await bad.as(token ?? "").json(path, { method, body: method === "POST" ? JSON.stringify({ name: "batches/x" }) : undefined });
          assert.equal(res.status, 503, `${setting}: ${method} ${path}`);
          assert.equal(res.body.variable, setting);
          assert.match(res.body.problem, new RegExp(`also in ${other}`));
          for (const token of [ADMIN_TOKEN, REGISTER_TOKEN, READ_TOKEN]) assert.ok(!JSON.stringify(res.body).includes(token), "never the token");
        }
        // Deliveries wait too (Gemini retries them): the worker runs on no half-read configuration.
        assert.equal((await bad.deliver("batch.succeeded", "batches/x")).status, 503);
      } finally {
        await bad.dispose();
      }
    }
  });

  it("without narrower tokens the admin token does everything, as before; a short token is warned about", async () => {
    const plain = await startWorker({ REGISTER_TOKENS: undefined, READ_TOKENS: "short-read", ALERT_URL: "http://127.0.0.1:9/alerts", GEMINI_API_KEY: "k" });
    try {
      assert.equal((await plain.register("batches/plain-1", "k")).status, 201);
      const config = Object.fromEntries((await plain.admin("/v1/config")).body.settings.map((s) => [s.name, s.value]));
      assert.deepEqual([config.REGISTER_TOKENS, config.READ_TOKENS], ["not set", "set (1)"]);
      const health = await plain.json("/healthz");
      assert.equal(health.status, 200);
      assert.deepEqual(health.body.warnings.map((x) => x.split(" holds")[0]), ["READ_TOKENS"]);
      assert.ok(!JSON.stringify(health.body).includes("short-read"));
    } finally {
      await plain.dispose();
    }
  });
});
