// `npm run register` against the built worker over real HTTP: registers an operation from a
// shell the way the admin API documents it.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { createServer } from "node:http";
import { promisify } from "node:util";
import { startWorker, ADMIN_TOKEN } from "./helpers.mjs";

const run = promisify(execFile);
let w;

before(async () => {
  w = await startWorker({}, { http: true });
});
after(() => w?.dispose());

const register = (...args) => run("node", ["scripts/register.mjs", ...args, "--url", w.url]);

describe("npm run register", () => {
  it("registers an operation as pending, and a second time changes nothing", async () => {
    const first = await register("batches/reg1", "--kind", "nightly-review", "--token", ADMIN_TOKEN);
    assert.match(first.stdout, /^register: 201 registered batches\/reg1: /);
    const op = await w.inspect("batches/reg1");
    assert.equal(op.status, 200);
    assert.equal(op.body.kind, "nightly-review");
    assert.equal(op.body.status, "pending");
    const again = await register("batches/reg1", "--kind", "nightly-review", "--token", ADMIN_TOKEN);
    assert.match(again.stdout, /^register: 200 already registered batches\/reg1: /);
    // Another kind: refused with what is recorded, and nothing changes.
    await assert.rejects(register("batches/reg1", "--kind", "billing", "--token", ADMIN_TOKEN), (e) => e.code === 1 && /^register: 409 refused: registered before with another kind/.test(e.stdout));
    assert.equal((await w.inspect("batches/reg1")).body.kind, "nightly-review");
  });

  it("registers a video operation under its key, keeping the full name", async () => {
    await register("models/veo-3/operations/reg2", "--kind", "video", "--token", ADMIN_TOKEN);
    const op = await w.inspect("operations/reg2");
    assert.equal(op.body.name, "models/veo-3/operations/reg2");
    assert.equal(op.body.kind, "video");
  });

  it("exits 1 on a wrong token, and the worker keeps nothing", async () => {
    await assert.rejects(register("batches/reg3", "--kind", "k", "--token", "wrong"), (e) => e.code === 1 && /register: 401 refused/.test(e.stdout));
    assert.equal((await w.inspect("batches/reg3")).status, 404);
  });

  it("explains its usage on bad arguments", async () => {
    await assert.rejects(register("batches/reg4", "--user-metadata", "[1]", "--token", ADMIN_TOKEN), (e) => e.code === 2 && /--user-metadata must be a JSON object/.test(e.stderr) && /usage: npm run register/.test(e.stderr));
    await assert.rejects(register("--token", ADMIN_TOKEN), (e) => e.code === 2 && /give one operation name/.test(e.stderr));
  });

  it("registers without a kind (the effect goes to EFFECT_URL) and with user_metadata", async () => {
    const r = await register("batches/reg6", "--user-metadata", '{"tenant":"acme","order":7}', "--token", ADMIN_TOKEN);
    assert.match(r.stdout, /^register: 201 registered batches\/reg6: /);
    const op = await w.inspect("batches/reg6");
    assert.equal(op.body.kind, null);
    assert.deepEqual(op.body.details.user_metadata, { tenant: "acme", order: 7 });
  });

  it("sends a Cloudflare Access service token when one is set", async () => {
    const seen = [];
    const server = createServer((req, res) => { seen.push(req.headers); res.writeHead(201, { "content-type": "application/json" }); res.end("{}"); });
    await new Promise((r) => server.listen(0, "127.0.0.1", r));
    try {
      const url = `http://127.0.0.1:${server.address().port}`;
      await run("node", ["scripts/register.mjs", "batches/reg7", "--token", "t", "--url", url], { env: { ...process.env, CF_ACCESS_CLIENT_ID: "id.access", CF_ACCESS_CLIENT_SECRET: "shh" } });
      assert.equal(seen[0]["cf-access-client-id"], "id.access");
      assert.equal(seen[0]["cf-access-client-secret"], "shh");
      await run("node", ["scripts/register.mjs", "batches/reg7", "--token", "t", "--url", url], { env: { ...process.env, CF_ACCESS_CLIENT_ID: "", CF_ACCESS_CLIENT_SECRET: "" } });
      assert.equal(seen[1]["cf-access-client-id"], undefined, "none without one");
    } finally {
      server.close();
    }
  });

  it("registers a batch with --results each: its record says so; a video cannot have results", async () => {
    const r = await register("batches/reg11", "--kind", "pages", "--results", "each", "--token", ADMIN_TOKEN);
    assert.match(r.stdout, /^register: 201 registered batches\/reg11: /);
    assert.equal((await w.inspect("batches/reg11")).body.results, "each");
    await register("batches/reg12", "--kind", "pages", "--token", ADMIN_TOKEN);
    assert.equal((await w.inspect("batches/reg12")).body.results, "none", "the default");
    await assert.rejects(register("models/veo-3/operations/reg13", "--results", "each", "--token", ADMIN_TOKEN), (e) => e.code === 1 && /^register: 400 refused/.test(e.stdout));
    assert.equal((await w.inspect("operations/reg13")).status, 404, "nothing kept");
  });

  it("sends --results each as the registration's `results`, and refuses any other value", async () => {
    const bodies = [];
    const server = createServer((req, res) => {
      let body = "";
      req.on("data", (c) => (body += c));
      req.on("end", () => { bodies.push(JSON.parse(body)); res.writeHead(201, { "content-type": "application/json" }); res.end("{}"); });
    });
    await new Promise((r) => server.listen(0, "127.0.0.1", r));
    try {
      const url = `http://127.0.0.1:${server.address().port}`;
      const r = await run("node", ["scripts/register.mjs", "batches/reg8", "--kind", "pages", "--results", "each", "--token", "t", "--url", url]);
      assert.match(r.stdout, /^register: 201 registered batches\/reg8/);
      assert.deepEqual(bodies[0], { name: "batches/reg8", kind: "pages", results: "each" });
      await run("node", ["scripts/register.mjs", "batches/reg9", "--token", "t", "--url", url]);
      assert.equal("results" in bodies[1], false, "without the flag the worker's default holds");
      await assert.rejects(run("node", ["scripts/register.mjs", "batches/reg10", "--results", "all", "--token", "t", "--url", url]),
        (e) => e.code === 2 && /--results is each or none/.test(e.stderr) && /usage: npm run register/.test(e.stderr));
      assert.equal(bodies.length, 2, "a refused flag sends nothing");
    } finally {
      server.close();
    }
  });

  it("says when no worker answers", async () => {
    await assert.rejects(run("node", ["scripts/register.mjs", "batches/reg5", "--kind", "k", "--token", "t", "--url", "http://127.0.0.1:9"]),
      (e) => e.code === 1 && /no answer from http:\/\/127\.0\.0\.1:9\/v1\/operations/.test(e.stderr));
  });
});
