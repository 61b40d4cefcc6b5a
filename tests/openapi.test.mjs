// docs/openapi.yaml against the built worker in workerd: every answer the test provokes is
// validated against the schema the document gives for its path, method and status, and the
// set of (route, method, status) the test provoked must equal the set the document lists, so
// a route or status added on one side only fails here. A second worker with a missing
// variable gives every route's 503. Every route under /v1/ (and /metrics) is also walked with a token of
// each scope, and answers as its `security` says (403 naming the scope it needs, or served).
//
// Adding a route: describe it in docs/openapi.yaml, then provoke each of its statuses with
// `call(worker, METHOD, "/the/{template}", url, ...)` in an `it` of its own below.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { generateKeyPairSync, sign as rsaSign } from "node:crypto";
import Ajv2020 from "ajv/dist/2020.js";
import YAML from "yaml";
import { startWorker, startServer, startDestination, eventually, signedHeaders, ADMIN_TOKEN, REGISTER_TOKEN, READ_TOKEN, GEMINI_SECRET, EFFECT_SECRET } from "./helpers.mjs";
import { fingerprint } from "../scripts/deploy_vars.mjs";

const read = (p) => readFileSync(new URL(`../${p}`, import.meta.url), "utf8");
const doc = YAML.parse(read("docs/openapi.yaml"));

// OpenAPI 3.1 schemas are JSON Schema 2020-12. They refer to each other as
// `#/components/schemas/X`; here they become `$defs` of one schema that ajv knows by URI.
const DEFS = "https://gemini-once.test/openapi/defs.json";
const toDefs = (value) => JSON.parse(JSON.stringify(value).replaceAll('"#/components/schemas/', `"${DEFS}#/$defs/`));
// `format` is documentation (`pattern` checks timestamps); strict mode still refuses unknown
// keywords and misplaced ones, so a typo in the document fails here.
const ajv = new Ajv2020({ strict: true, allowUnionTypes: true, allErrors: true, validateFormats: false });
ajv.addSchema({ $id: DEFS, $defs: toDefs(doc.components.schemas) });
const compiled = new Map();
function validator(schema) {
  const text = JSON.stringify(schema);
  if (!compiled.has(text)) compiled.set(text, ajv.compile(toDefs(schema)));
  return compiled.get(text);
}

/** Follows `$ref`s inside the document (responses, parameters, request bodies). */
function resolve(node) {
  while (node?.$ref) {
    node = node.$ref.slice(2).split("/").map((s) => s.replaceAll("~1", "/").replaceAll("~0", "~")).reduce((o, k) => o?.[k], doc);
    assert.ok(node, "every $ref resolves");
  }
  return node;
}

const METHODS = ["get", "head", "post", "put", "patch", "delete", "options"];
/** Answers any route may give, documented once under components.responses. */
const ANY_ROUTE = ["NotFound", "MethodNotAllowed"];

function documentedAnswers() {
  const all = [];
  for (const [route, item] of Object.entries(doc.paths)) {
    for (const method of METHODS.filter((m) => item[m])) {
      for (const status of Object.keys(item[method].responses)) all.push(`${method.toUpperCase()} ${route} ${status}`);
    }
  }
  return all.concat(ANY_ROUTE.map((r) => `any route: ${r}`)).sort();
}

function documentedQueryParams() {
  const all = [];
  for (const [route, item] of Object.entries(doc.paths)) {
    for (const method of METHODS.filter((m) => item[m])) {
      for (const p of [...(item.parameters ?? []), ...(item[method].parameters ?? [])].map(resolve)) {
        if (p.in === "query") all.push(`${method.toUpperCase()} ${route} ?${p.name}`);
      }
    }
  }
  return all.sort();
}

const exercised = new Set();
const queried = new Set();

/**
 * Sends a request and checks its answer against the document: `route` is the path template
 * as documented ("/v1/operations/{name}"), or `any route: NotFound` / `any route:
 * MethodNotAllowed`. `token` is the bearer: the admin token (`true`), none (`false`) or the
 * one given. Fails on a status the document does not list for it, a content type other than
 * the documented one, or a body its schema refuses. Returns {status, body, headers}.
 */
async function call(worker, method, route, url, { body, headers = {}, token = true, expect } = {}) {
  const init = { method, headers: { ...headers } };
  if (token) init.headers.authorization = `Bearer ${token === true ? ADMIN_TOKEN : token}`;
  if (body !== undefined) {
    init.body = typeof body === "string" ? body : JSON.stringify(body);
    init.headers["content-type"] ??= "application/json";
  }
  const res = await worker.fetch(url, init);
  const text = await res.text();
  const where = `${method} ${url} answered ${res.status} ${text.slice(0, 300)}`;
  if (expect !== undefined) assert.equal(res.status, expect, where);

  let operation;
  let answer;
  if (route.startsWith("any route: ")) {
    answer = doc.components.responses[route.slice("any route: ".length)];
    assert.ok(answer, `${route} is documented`);
    exercised.add(route);
  } else {
    operation = doc.paths[route]?.[method.toLowerCase()];
    assert.ok(operation, `${method} ${route} is documented in docs/openapi.yaml`);
    answer = operation.responses[String(res.status)];
    assert.ok(answer, `${where}: status ${res.status} is not documented for ${method} ${route}`);
    exercised.add(`${method} ${route} ${res.status}`);
    const params = [...(doc.paths[route].parameters ?? []), ...(operation.parameters ?? [])].map(resolve);
    for (const [name] of new URL(url, "http://x").searchParams) {
      assert.ok(params.some((p) => p.in === "query" && p.name === name), `query parameter ${name} of ${method} ${route} is documented`);
      queried.add(`${method} ${route} ?${name}`);
    }
  }
  answer = resolve(answer);

  const content = answer.content ?? {};
  const types = Object.keys(content);
  let parsed = text;
  if (types.length === 0) {
    assert.equal(text, "", `${where}: documented without a body`);
  } else {
    const type = (res.headers.get("content-type") ?? "").split(";")[0].trim();
    assert.ok(types.includes(type), `${where}: content type ${type} is not one of ${types}`);
    if (type === "application/json") {
      parsed = JSON.parse(text);
      const validate = validator(content[type].schema);
      assert.ok(validate(parsed), `${where}: does not match docs/openapi.yaml: ${JSON.stringify(validate.errors, null, 1)}`);
    } else {
      assert.ok(text.length > 0, `${where}: empty ${type}`);
    }
  }

  // What a successful request sent is what the document says may be sent.
  const requestBody = resolve(operation?.requestBody);
  if (res.ok && init.body && requestBody) {
    const validate = validator(requestBody.content["application/json"].schema);
    assert.ok(validate(JSON.parse(init.body)), `${method} ${route}: the request body ${init.body} does not match the document: ${JSON.stringify(validate.errors)}`);
  }
  return { status: res.status, body: parsed, headers: res.headers };
}

const ADMIN_CAP = 16 * 1024;
const MAX_BODY_BYTES = 4096;
const oversized = (n) => JSON.stringify({ reason: "x".repeat(n) });
const enc = encodeURIComponent;

// A dynamic webhook's token: a local RSA key, served as the key set by a local stand-in.
const { privateKey, publicKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
const jwk = { ...publicKey.export({ format: "jwk" }), kid: "k1", alg: "RS256", use: "sig" };
const b64u = (v) => Buffer.from(JSON.stringify(v)).toString("base64url");
function token() {
  const input = `${b64u({ alg: "RS256", kid: "k1", typ: "JWT" })}.${b64u({ exp: Math.floor(Date.now() / 1000) + 300 })}`;
  return `${input}.${rsaSign("sha256", Buffer.from(input), privateKey).toString("base64url")}`;
}

const envelope = (type, id, data = {}) => JSON.stringify({ type, version: "v1", timestamp: new Date().toISOString(), data: { id, ...data } });
/** A Gemini-signed delivery, checked against the document. */
const deliver = (worker, type, id, opts = {}) => {
  const body = opts.rawBody ?? envelope(type, id, opts.data);
  return call(worker, "POST", "/webhooks/gemini", "/webhooks/gemini", { token: false, body, headers: signedHeaders(body, opts), expect: opts.expect });
};

const WEBHOOK_NAME = "webhooks/oa-receiver";
const ROUTE_TOKEN = "oa-route-credential";
let w, broken, dest, jwks, gemini, alerts;
/** Per key, what the destination answers. */
const plans = new Map();

before(async () => {
  dest = await startDestination((req) => plans.get(req.headers["idempotency-key"])?.() ?? { status: 200 });
  jwks = await startServer(() => ({ status: 200, body: { keys: [jwk] } }));
  alerts = await startServer(() => ({ status: 200 }));
  // Gemini's API: the webhook the passes check (GEMINI_WEBHOOK_NAME) is disabled; every
  // operation, asked about by a pass or to confirm a dynamic webhook, is still running.
  gemini = await startServer((req) => req.url.startsWith("/v1beta/webhooks")
    ? { status: 200, body: { webhooks: [{ id: "w1", name: WEBHOOK_NAME, state: "disabled" }] } }
    : { status: 200, body: { name: req.url.replace("/v1beta/", ""), metadata: { state: "BATCH_STATE_RUNNING" }, done: false } });
  [w, broken] = await Promise.all([
    startWorker({
      EFFECT_URL: `${dest.url}/effects`,
      MAX_BODY_BYTES: String(MAX_BODY_BYTES),
      GEMINI_JWKS_URL: `${jwks.url}/.well-known/jwks.json`,
      GEMINI_API_BASE: gemini.url,
      GEMINI_API_KEY: "test-api-key",
      GEMINI_WEBHOOK_NAME: WEBHOOK_NAME,
      ALERT_URL: `${alerts.url}/alerts`,
      // Side effects go out at once (no wait for a late registration's kind).
      UNREGISTERED_HOLD_SECONDS: "0",
      // Routes for kinds no test registers: only /v1/config shows them.
      EFFECT_ROUTES: JSON.stringify({ "oa-queue": "queue:OA_QUEUE", "oa-service": "service:OA_SERVICE", "oa-url": `${dest.url}/routed?token=${ROUTE_TOKEN}` }),
    }),
    startWorker({ ADMIN_TOKEN: undefined }),
  ]);
});
after(async () => {
  await Promise.all([w?.dispose(), broken?.dispose()]);
  await Promise.all([dest?.close(), jwks?.close(), gemini?.close(), alerts?.close()]);
  dest?.assertAllValid();
});

/** Registers `name` (checked) and returns the answer. */
const register = (name, kind, expect) => call(w, "POST", "/v1/operations", "/v1/operations", { body: { name, kind }, expect });
/** Delivers a success and waits for its side effect to be done. */
async function settled(key) {
  await deliver(w, "batch.succeeded", key, { expect: 200 });
  await eventually(async () => (await w.inspect(key)).body.effect_done, { what: `the side effect of ${key}` });
}

describe("docs/openapi.yaml against the worker's answers", () => {
  it("GET and HEAD /healthz, GET /dashboard", async () => {
    assert.deepEqual((await call(w, "GET", "/healthz", "/healthz", { token: false, expect: 200 })).body, { ok: true });
    await call(w, "HEAD", "/healthz", "/healthz", { token: false, expect: 200 });
    const page = await call(w, "GET", "/dashboard", "/dashboard", { token: false, expect: 200 });
    assert.match(page.body, /<html/i);
  });

  it("unknown paths and methods", async () => {
    await call(w, "GET", "any route: NotFound", "/nowhere", { expect: 404 });
    await call(w, "GET", "any route: NotFound", "/v1/nowhere", { expect: 404 });
    for (const [method, url] of [["POST", "/healthz"], ["POST", "/dashboard"], ["GET", "/webhooks/gemini"], ["PUT", "/v1/operations"], ["DELETE", "/v1/operations/batches/x"], ["POST", "/v1/operations/batches/x/undo"], ["POST", "/v1/stats"], ["POST", "/v1/config"], ["POST", "/metrics"]]) {
      await call(w, method, "any route: MethodNotAllowed", url, { expect: 405 });
    }
  });

  it("POST /webhooks/gemini", async () => {
    const applied = await deliver(w, "batch.succeeded", "batches/oa-hook", { expect: 200 });
    assert.equal(applied.body.outcome, "applied");
    const again = await deliver(w, "batch.succeeded", "batches/oa-hook", { expect: 200 });
    assert.deepEqual([again.body.outcome, again.body.reason], ["dropped", "duplicate"]);
    const conflicting = await deliver(w, "batch.failed", "batches/oa-hook", { expect: 200 });
    assert.deepEqual([conflicting.body.outcome, conflicting.body.reason], ["dropped", "conflicting_terminal"]);
    assert.equal((await deliver(w, "batch.paused_forever", "batches/oa-hook", { expect: 200 })).body.outcome, "ignored_unknown_type");
    assert.equal((await deliver(w, "webhook.ping", "batches/oa-hook", { expect: 200 })).body.outcome, "pong");
    await register("batches/oa-jwt", "nightly-review", 201);
    const nudge = envelope("batch.succeeded", "batches/oa-jwt");
    const confirming = await call(w, "POST", "/webhooks/gemini", "/webhooks/gemini", {
      token: false,
      body: nudge,
      headers: { "webhook-id": "msg_jwt_1", "webhook-timestamp": String(Math.floor(Date.now() / 1000)), "webhook-signature": token() },
      expect: 200,
    });
    assert.equal(confirming.body.outcome, "confirming");
    const notHeld = await call(w, "POST", "/webhooks/gemini", "/webhooks/gemini", {
      token: false,
      body: envelope("batch.succeeded", "batches/oa-jwt-never-registered"),
      headers: { "webhook-id": "msg_jwt_2", "webhook-timestamp": String(Math.floor(Date.now() / 1000)), "webhook-signature": token() },
      expect: 200,
    });
    assert.equal(notHeld.body.outcome, "not_held");
    await deliver(w, "batch.succeeded", null, { rawBody: "not an envelope", expect: 400 });
    await deliver(w, "batch.succeeded", "batches/oa-hook", { signature: "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", expect: 401 });
    await deliver(w, "batch.succeeded", "batches/oa-big", { data: { pad: "x".repeat(MAX_BODY_BYTES) }, expect: 413 });
  });

  it("POST /v1/operations", async () => {
    const created = await register("batches/oa-reg", "nightly-review", 201);
    assert.deepEqual([created.body.key, created.body.status, created.body.kind], ["batches/oa-reg", "pending", "nightly-review"]);
    assert.equal((await register("projects/p/locations/l/batches/oa-reg", "nightly-review", 200)).body.kind_change, "unchanged");
    const conflict = await register("batches/oa-reg", "billing", 409);
    assert.deepEqual([conflict.body.error, conflict.body.conflicts], ["conflict", ["kind"]]);
    assert.equal(conflict.body.operation.kind, "nightly-review");
    await deliver(w, "batch.succeeded", "batches/oa-first", { expect: 200 });
    await eventually(async () => (await w.inspect("batches/oa-first")).body.effect_done, { what: "the first effect" });
    assert.equal((await register("batches/oa-first", "nightly-review", 200)).body.kind_change, "filled");
    await call(w, "POST", "/v1/operations", "/v1/operations", { body: "not json", expect: 400 });
    await call(w, "POST", "/v1/operations", "/v1/operations", { body: { name: "no-collection" }, expect: 400 });
    await call(w, "POST", "/v1/operations", "/v1/operations", { body: { name: "batches/x" }, token: false, expect: 401 });
    await call(w, "POST", "/v1/operations", "/v1/operations", { body: JSON.stringify({ name: "batches/x", pad: "x".repeat(ADMIN_CAP) }), expect: 413 });
  });

  it("GET /v1/operations with its filters and cursor", async () => {
    const keys = ["batches/oa-list-1", "batches/oa-list-2", "batches/oa-list-3"];
    for (const k of keys) await register(k, "nightly-review", 201);
    await w.ledger(keys);
    const seen = [];
    let cursor;
    let pages = 0;
    for (;;) {
      const url = `/v1/operations?limit=1${cursor ? `&cursor=${enc(cursor)}` : ""}`;
      const page = await call(w, "GET", "/v1/operations", url, { expect: 200 });
      seen.push(...page.body.operations.map((o) => o.key));
      pages++;
      if (page.body.complete) break;
      cursor = page.body.cursor;
    }
    assert.ok(pages > keys.length, "one entry a page, then the last page");
    for (const k of keys) assert.equal(seen.filter((s) => s === k).length, 1, `${k} listed once across the pages`);
    const pending = await call(w, "GET", "/v1/operations", "/v1/operations?status=pending&effect_done=false&stuck=false&limit=500", { expect: 200 });
    assert.ok(pending.body.complete);
    for (const k of keys) assert.ok(pending.body.operations.some((o) => o.key === k), `${k} is pending`);
    assert.ok(pending.body.operations.every((o) => o.status === "pending" && !o.effect_done && !o.stuck));
    await call(w, "GET", "/v1/operations", "/v1/operations?status=done", { expect: 400 });
    await call(w, "GET", "/v1/operations", "/v1/operations", { token: false, expect: 401 });
  });

  it("GET /v1/operations/{name}", async () => {
    await register("batches/oa-inspect", "nightly-review", 201);
    const raw = await call(w, "GET", "/v1/operations/{name}", "/v1/operations/batches/oa-inspect", { expect: 200 });
    const encoded = await call(w, "GET", "/v1/operations/{name}", `/v1/operations/${enc("batches/oa-inspect")}`, { expect: 200 });
    assert.deepEqual(encoded.body, raw.body);
    assert.equal(raw.body.history[0].what, "registered");
    await call(w, "GET", "/v1/operations/{name}", "/v1/operations/batches/oa-never", { expect: 404 });
    await call(w, "GET", "/v1/operations/{name}", "/v1/operations/no-collection", { expect: 400 });
    await call(w, "GET", "/v1/operations/{name}", "/v1/operations/batches/oa-inspect", { token: false, expect: 401 });
  });

  it("POST /v1/operations/{name}/retry", async () => {
    const route = "/v1/operations/{name}/retry";
    const key = "batches/oa-park";
    let refuse = true;
    plans.set(key, () => ({ status: refuse ? 422 : 200 }));
    await deliver(w, "batch.succeeded", key, { expect: 200 });
    await eventually(async () => (await w.inspect(key)).body.effect_parked, { what: "the park" });
    refuse = false;
    const retried = await call(w, "POST", route, `/v1/operations/${key}/retry`, { body: { reason: "destination fixed" }, expect: 200 });
    assert.deepEqual([retried.body.action, retried.body.generation], ["retry_now", 1]);
    await settled("batches/oa-retry-done");
    const refused = await call(w, "POST", route, "/v1/operations/batches/oa-retry-done/retry", { expect: 409 });
    assert.match(refused.body.error, /done/);
    await call(w, "POST", route, "/v1/operations/batches/oa-never/retry", { expect: 404 });
    await call(w, "POST", route, `/v1/operations/${key}/retry`, { body: "not json", expect: 400 });
    await call(w, "POST", route, `/v1/operations/${key}/retry`, { token: false, expect: 401 });
    await call(w, "POST", route, `/v1/operations/${key}/retry`, { body: oversized(ADMIN_CAP), expect: 413 });
  });

  it("GET /v1/operations/{name}/results and POST /v1/operations/{name}/results/retry", async () => {
    const key = "batches/oa-results";
    const created = await call(w, "POST", "/v1/operations", "/v1/operations", { body: { name: key, kind: "nightly-review", results: "each" }, expect: 201 });
    assert.equal(created.body.results, "each");
    const notBatch = await call(w, "POST", "/v1/operations", "/v1/operations", { body: { name: "interactions/oa-results", results: "each" }, expect: 400 });
    assert.match(notBatch.body.error, /batch/);
    const list = "/v1/operations/{name}/results";
    const page = await call(w, "GET", list, `/v1/operations/${key}/results?state=parked`, { expect: 200 });
    assert.deepEqual([page.body.results, page.body.cursor], [[], null]);
    await call(w, "GET", list, `/v1/operations/${enc(key)}/results?state=waiting&cursor=3`, { expect: 200 });
    const delivered = await call(w, "GET", list, `/v1/operations/${key}/results?state=delivered`, { expect: 200 });
    assert.equal(delivered.body.count, 0);
    await call(w, "GET", list, `/v1/operations/${key}/results?state=done`, { expect: 400 });
    await call(w, "GET", list, "/v1/operations/batches/oa-never/results", { expect: 404 });
    await call(w, "GET", list, `/v1/operations/${key}/results`, { token: false, expect: 401 });
    const retry = "/v1/operations/{name}/results/retry";
    const dry = await call(w, "POST", retry, `/v1/operations/${key}/results/retry`, { body: { reason: "check", dry_run: true }, expect: 200 });
    assert.equal(dry.body.would_retry, 0);
    await call(w, "POST", retry, "/v1/operations/batches/oa-never/results/retry", { expect: 404 });
    await call(w, "POST", retry, `/v1/operations/${key}/results/retry`, { body: "not json", expect: 400 });
    await call(w, "POST", retry, `/v1/operations/${key}/results/retry`, { token: false, expect: 401 });
    await call(w, "POST", retry, `/v1/operations/${key}/results/retry`, { body: oversized(ADMIN_CAP), expect: 413 });
  });

  it("POST /v1/destinations/{name}/pause and /resume", async () => {
    const pause = "/v1/destinations/{name}/pause";
    const resume = "/v1/destinations/{name}/resume";
    const dry = await call(w, "POST", pause, "/v1/destinations/default/pause", { body: { reason: "check", dry_run: true }, expect: 200 });
    assert.equal(dry.body.changed, false);
    const paused = await call(w, "POST", pause, "/v1/destinations/default/pause", { body: { reason: "planned outage" }, expect: 200 });
    assert.equal(paused.body.state, "paused");
    await call(w, "POST", pause, "/v1/destinations/default/pause", { body: {}, expect: 400 });
    await call(w, "POST", pause, "/v1/destinations/nope/pause", { body: { reason: "x" }, expect: 404 });
    await call(w, "POST", pause, "/v1/destinations/default/pause", { token: false, expect: 401 });
    await call(w, "POST", pause, "/v1/destinations/default/pause", { body: oversized(ADMIN_CAP), expect: 413 });
    const resumed = await call(w, "POST", resume, "/v1/destinations/default/resume", { body: { reason: "done" }, expect: 200 });
    assert.equal(resumed.body.changed, true);
    await call(w, "POST", resume, "/v1/destinations/default/resume", { body: "not json", expect: 400 });
    await call(w, "POST", resume, "/v1/destinations/nope/resume", { expect: 404 });
    await call(w, "POST", resume, "/v1/destinations/default/resume", { token: false, expect: 401 });
    await call(w, "POST", resume, "/v1/destinations/default/resume", { body: oversized(ADMIN_CAP), expect: 413 });
  });

  it("POST /v1/operations/{name}/redeliver", async () => {
    const route = "/v1/operations/{name}/redeliver";
    await settled("batches/oa-redeliver");
    const again = await call(w, "POST", route, "/v1/operations/batches/oa-redeliver/redeliver", { body: { reason: "downstream lost it" }, expect: 200 });
    assert.deepEqual([again.body.action, again.body.generation], ["redeliver", 2]);
    await register("batches/oa-redeliver-pending", "nightly-review", 201);
    const refused = await call(w, "POST", route, "/v1/operations/batches/oa-redeliver-pending/redeliver", { expect: 409 });
    assert.match(refused.body.error, /no outcome yet/);
    await call(w, "POST", route, "/v1/operations/batches/oa-never/redeliver", { expect: 404 });
    await call(w, "POST", route, "/v1/operations/no-collection/redeliver", { expect: 400 });
    await call(w, "POST", route, "/v1/operations/batches/oa-redeliver/redeliver", { token: false, expect: 401 });
    await call(w, "POST", route, "/v1/operations/batches/oa-redeliver/redeliver", { body: oversized(ADMIN_CAP), expect: 413 });
  });

  it("POST /v1/operations/{name}/repair", async () => {
    // A record that loads needs no repair (tests/durable.test.mjs repairs one that does not).
    const route = "/v1/operations/{name}/repair";
    await register("batches/oa-repair", "nightly-review", 201);
    const url = "/v1/operations/batches/oa-repair/repair";
    const answer = await call(w, "POST", route, url, { body: { reason: "checking" }, expect: 200 });
    assert.deepEqual([answer.body.repaired, answer.body.operation.kind], [false, "nightly-review"]);
    await call(w, "POST", route, "/v1/operations/batches/oa-never/repair", { expect: 404 });
    await call(w, "POST", route, "/v1/operations/no-collection/repair", { expect: 400 });
    await call(w, "POST", route, url, { token: false, expect: 401 });
    await call(w, "POST", route, url, { body: oversized(ADMIN_CAP), expect: 413 });
  });

  it("POST /v1/operations/{name}/forget", async () => {
    const route = "/v1/operations/{name}/forget";
    await register("batches/oa-forget", "nightly-review", 201);
    const url = "/v1/operations/batches/oa-forget/forget";
    assert.equal((await call(w, "POST", route, url, { body: { reason: "cancelled upstream" }, expect: 200 })).body.changed, true);
    assert.equal((await call(w, "POST", route, url, { expect: 200 })).body.changed, false);
    await call(w, "POST", route, "/v1/operations/batches/oa-never/forget", { expect: 404 });
    await call(w, "POST", route, "/v1/operations/no-collection/forget", { expect: 400 });
    await call(w, "POST", route, url, { token: false, expect: 401 });
    await call(w, "POST", route, url, { body: oversized(ADMIN_CAP), expect: 413 });
  });

  it("POST /v1/operations/{name}/settle", async () => {
    const route = "/v1/operations/{name}/settle";
    await register("batches/oa-settle", "nightly-review", 201);
    const url = "/v1/operations/batches/oa-settle/settle";
    const body = { status: "failed", reason: "the status answer is unusable; checked by hand" };
    const done = await call(w, "POST", route, url, { body, expect: 200 });
    assert.deepEqual([done.body.settled_by, done.body.status], ["operator", "failed"]);
    const refused = await call(w, "POST", route, url, { body, expect: 409 });
    assert.match(refused.body.error, /already has an outcome/);
    await call(w, "POST", route, "/v1/operations/batches/oa-never/settle", { body, expect: 404 });
    await call(w, "POST", route, url, { body: { status: "running", reason: "r" }, expect: 400 });
    await call(w, "POST", route, url, { token: false, body, expect: 401 });
    await call(w, "POST", route, url, { body: oversized(ADMIN_CAP), expect: 413 });
  });

  it("GET /v1/operations with the dashboard's filters: kind, parked, settled_by, forgotten, prefix, q", async () => {
    const list = async (query) => (await call(w, "GET", "/v1/operations", `/v1/operations?${query}&limit=500`, { expect: 200 })).body;
    const keys = (page) => page.operations.map((o) => o.key).sort();
    // a: settled by its webhook, then parked by the destination; b: pending, registered by its
    // full name; c: forgotten. All three of one kind no other test uses.
    const [a, b, c] = ["batches/oa-filter-a", "batches/oa-filter-b", "batches/oa-filter-c"];
    plans.set(a, () => ({ status: 422 }));
    await register(a, "oa-filter", 201);
    await register("projects/p/locations/europe-west4/batches/oa-filter-b", "oa-filter", 201);
    await register(c, "oa-filter", 201);
    await deliver(w, "batch.succeeded", a, { expect: 200 });
    await call(w, "POST", "/v1/operations/{name}/forget", `/v1/operations/${c}/forget`, { expect: 200 });
    await w.ledger(a, (m) => m.parked && m.settled_by === "webhook");
    await w.ledger(c, (m) => m.forgotten);
    await w.ledger(b);

    const all = await list("kind=oa-filter");
    assert.deepEqual(keys(all), [a, b, c]);
    assert.ok(all.complete);
    const entry = Object.fromEntries(all.operations.map((o) => [o.key, o]));
    assert.deepEqual([entry[a].kind, entry[a].settled_by, entry[a].status, entry[a].effect_parked], ["oa-filter", "webhook", "succeeded", true]);
    assert.deepEqual([entry[b].settled_by, entry[b].name], [null, "projects/p/locations/europe-west4/batches/oa-filter-b"]);
    assert.deepEqual(keys(await list("kind=oa-filter&parked=true")), [a]);
    assert.deepEqual(keys(await list("kind=oa-filter&parked=false")), [b, c]);
    assert.deepEqual(keys(await list("kind=oa-filter&settled_by=webhook")), [a]);
    assert.deepEqual(keys(await list("kind=oa-filter&settled_by=reconcile")), []);
    assert.deepEqual(keys(await list("kind=oa-filter&forgotten=true")), [c]);
    assert.deepEqual(keys(await list("kind=oa-filter&forgotten=false")), [a, b]);
    // The parked effect's error, kept in the metadata, selects exactly it.
    assert.match(entry[a].error, /^422/);
    assert.deepEqual(keys(await list(`kind=oa-filter&error=${enc(entry[a].error)}`)), [a]);
    assert.deepEqual(keys(await list(`kind=oa-filter&error=${enc("422: not this")}`)), []);
    // The prefix alone (no kind): the listing starts from it.
    assert.deepEqual(keys(await list(`prefix=${enc("batches/oa-filter-")}`)), [a, b, c]);
    // Text in the key, any case; text only in the full name.
    assert.deepEqual(keys(await list("q=OA-FILTER-B")), [b]);
    assert.deepEqual(keys(await list(`q=${enc("locations/europe-west4/batches/oa-filter")}`)), [b]);
    assert.deepEqual(keys(await list("kind=no-such-kind")), []);
    for (const bad of ["settled_by=registration", "kind=", "error=", "parked=yes", "forgotten=1", "prefix=%20", `q=${"x".repeat(401)}`, `kind=${"k".repeat(101)}`]) {
      await call(w, "GET", "/v1/operations", `/v1/operations?${bad}`, { expect: 400 });
    }
  });

  it("POST /v1/bulk/retry and /v1/bulk/redeliver; the listing's time ranges", async () => {
    const [parked, done] = ["batches/oa-bulk-parked", "batches/oa-bulk-done"];
    let refuse = true;
    plans.set(parked, () => ({ status: refuse ? 422 : 200 }));
    await register(parked, "oa-bulk", 201);
    await register(done, "oa-bulk", 201);
    await settled(done);
    await deliver(w, "batch.succeeded", parked, { expect: 200 });
    await w.ledger(parked, (m) => m.parked);
    await w.ledger(done, (m) => m.effect_done);
    refuse = false;
    const filter = { kind: "oa-bulk" };
    const dry = await call(w, "POST", "/v1/bulk/retry", "/v1/bulk/retry", { body: { filter, dry_run: true }, expect: 200 });
    assert.deepEqual([dry.body.matched, dry.body.eligible, dry.body.complete], [2, 1, true]);
    const first = await call(w, "POST", "/v1/bulk/retry", "/v1/bulk/retry", { body: { filter, reason: "fixed", limit: 1 }, expect: 200 });
    assert.equal(first.body.complete, false);
    const rest = await call(w, "POST", "/v1/bulk/retry", "/v1/bulk/retry", { body: { filter, reason: "fixed", limit: 1, cursor: first.body.cursor }, expect: 200 });
    assert.equal(rest.body.complete, true);
    assert.deepEqual([rest.body.total.matched, rest.body.total.retried, rest.body.total.skipped_by], [2, 1, { done: 1 }]);
    await call(w, "POST", "/v1/bulk/retry", "/v1/bulk/retry", { body: { filter: { status: "done" } }, expect: 400 });
    await call(w, "POST", "/v1/bulk/retry", "/v1/bulk/retry", { body: { filter }, token: false, expect: 401 });
    await call(w, "POST", "/v1/bulk/retry", "/v1/bulk/retry", { body: oversized(ADMIN_CAP), expect: 413 });
    await w.ledger(parked, (m) => m.effect_done);
    const again = await call(w, "POST", "/v1/bulk/redeliver", "/v1/bulk/redeliver", { body: { filter, reason: "receiver lost them", sent_before: new Date().toISOString() }, expect: 200 });
    assert.deepEqual([again.body.matched, again.body.redelivered, again.body.complete], [2, 2, true]);
    await call(w, "POST", "/v1/bulk/redeliver", "/v1/bulk/redeliver", { body: { filter }, expect: 400 });
    await call(w, "POST", "/v1/bulk/redeliver", "/v1/bulk/redeliver", { body: { filter, reason: "no identity" }, expect: 400 });
    await call(w, "POST", "/v1/bulk/redeliver", "/v1/bulk/redeliver", { body: { filter, reason: "r" }, token: false, expect: 401 });
    await call(w, "POST", "/v1/bulk/redeliver", "/v1/bulk/redeliver", { body: oversized(ADMIN_CAP), expect: 413 });
    // The same time range filters in the listing: both were registered and settled in the last hour.
    const hourAgo = new Date(Date.now() - 3_600_000).toISOString();
    const later = new Date(Date.now() + 3_600_000).toISOString();
    const range = `submitted_after=${enc(hourAgo)}&submitted_before=${enc(later)}&settled_after=${enc(hourAgo)}&settled_before=${enc(later)}`;
    const listed = await call(w, "GET", "/v1/operations", `/v1/operations?kind=oa-bulk&${range}`, { expect: 200 });
    assert.deepEqual(listed.body.operations.map((o) => o.key).sort(), [done, parked]);
    const none = await call(w, "GET", "/v1/operations", `/v1/operations?kind=oa-bulk&settled_before=${enc(hourAgo)}`, { expect: 200 });
    assert.deepEqual(none.body.operations, []);
    await call(w, "GET", "/v1/operations", "/v1/operations?settled_after=yesterday", { expect: 400 });
  });

  it("GET /v1/config", async () => {
    const res = await call(w, "GET", "/v1/config", "/v1/config", { expect: 200 });
    // Every variable the document names is shown, each once.
    const documented = doc.components.schemas.PublicConfig.properties.settings.items.oneOf
      .flatMap((o) => o.properties.name.enum ?? [o.properties.name.const]).sort();
    const names = res.body.settings.map((s) => s.name);
    assert.deepEqual([...names].sort(), documented);
    const value = Object.fromEntries(res.body.settings.map((s) => [s.name, s.value]));
    assert.deepEqual(value.EFFECT_ROUTES, { "oa-queue": "queue:OA_QUEUE", "oa-service": "service:OA_SERVICE", "oa-url": `${dest.url}/\u2026` });
    assert.equal(value.EFFECT_URL, `${dest.url}/\u2026`);
    assert.deepEqual([value.GEMINI_WEBHOOK_SECRETS, value.GEMINI_API_KEY, value.ADMIN_TOKEN, value.REGISTER_TOKENS, value.READ_TOKENS, value.GEMINI_WEBHOOK_NAME, value.MAX_BODY_BYTES], ["set (1)", "set", "set (1)", "set (1)", "set (1)", WEBHOOK_NAME, MAX_BODY_BYTES]);
    const text = JSON.stringify(res.body);
    for (const secret of [ADMIN_TOKEN, REGISTER_TOKEN, READ_TOKEN, GEMINI_SECRET, EFFECT_SECRET, "test-api-key", ROUTE_TOKEN]) assert.ok(!text.includes(secret), `${secret} is not shown`);
    await call(w, "GET", "/v1/config", "/v1/config", { token: false, expect: 401 });
  });

  it("GET /v1/stats", async () => {
    await w.scheduled();
    // Counts reach the shards within STATS_FLUSH_SECONDS (1 s in tests).
    const stats = await eventually(async () => {
      const s = await call(w, "GET", "/v1/stats", "/v1/stats", { expect: 200 });
      return s.body.recent_drops.length > 0 && s.body.reconcile?.last && s.body.hourly.some((h) => h.deliveries > 0) && s;
    }, { what: "a dropped event, a reconcile pass and hourly deliveries in /v1/stats" });
    assert.ok(stats.body.total.deliveries >= 1);
    assert.ok(stats.body.recent_drops.some((d) => d.key === "batches/oa-hook" && d.reason === "conflicting_terminal"));
    // 24 consecutive hours, oldest first.
    const hours = stats.body.hourly.map((h) => Date.parse(h.hour));
    for (let i = 1; i < hours.length; i++) assert.equal(hours[i] - hours[i - 1], 3_600_000);
    assert.ok(stats.body.hourly.some((h) => h.dropped > 0), "the dropped events are in the trend");
    // The pass found the configured Gemini webhook disabled.
    assert.deepEqual(stats.body.gemini_webhook, { name: WEBHOOK_NAME, alerted_state: "disabled" });
    await call(w, "GET", "/v1/stats", "/v1/stats", { token: false, expect: 401 });
  });

  it("GET /metrics", async () => {
    const text = await call(w, "GET", "/metrics", "/metrics", { token: READ_TOKEN, expect: 200 });
    assert.match(text.headers.get("content-type"), /^text\/plain; version=0\.0\.4/);
    assert.match(text.body, /^# TYPE gemini_once_deliveries_total counter$/m);
    const om = await call(w, "GET", "/metrics", "/metrics", { token: READ_TOKEN, headers: { accept: "application/openmetrics-text" }, expect: 200 });
    assert.match(om.body, /# EOF\n$/);
    await call(w, "GET", "/metrics", "/metrics", { token: false, expect: 401 });
  });

  it("GET /v1/whoami", async () => {
    for (const [scope, token] of [["read", READ_TOKEN], ["admin", ADMIN_TOKEN]]) {
      const me = await call(w, "GET", "/v1/whoami", "/v1/whoami", { token, expect: 200 });
      assert.deepEqual(me.body, { scope, fingerprint: fingerprint(token) });
    }
    await call(w, "GET", "/v1/whoami", "/v1/whoami", { token: false, expect: 401 });
  });

  it("every route under /v1/, with a token of each scope, answers as its security says", async () => {
    const TOKENS = { registerToken: ["register", REGISTER_TOKEN], readToken: ["read", READ_TOKEN], adminToken: ["admin", ADMIN_TOKEN] };
    const NARROWEST_FIRST = ["registerToken", "readToken", "adminToken"];
    const key = "batches/oa-walk";
    await register(key, "oa-walk", 201);
    const none = { filter: { kind: "oa-walk-none" }, dry_run: true };
    // A request each route serves, for the scopes it accepts (a new route needs one here).
    const sample = {
      "POST /v1/operations": (scope) => ({ url: "/v1/operations", body: { name: `batches/oa-walk-${scope}`, kind: "oa-walk" } }),
      "GET /v1/operations": () => ({ url: "/v1/operations?limit=1" }),
      "GET /v1/operations/{name}": () => ({ url: `/v1/operations/${key}` }),
      "POST /v1/operations/{name}/retry": () => ({ url: `/v1/operations/${key}/retry`, body: { reason: "walk" } }),
      "POST /v1/operations/{name}/redeliver": () => ({ url: `/v1/operations/${key}/redeliver`, body: { reason: "walk" } }),
      "GET /v1/operations/{name}/results": () => ({ url: `/v1/operations/${key}/results?state=parked` }),
      "POST /v1/operations/{name}/results/retry": () => ({ url: `/v1/operations/${key}/results/retry`, body: { reason: "walk" } }),
      "POST /v1/operations/{name}/forget": () => ({ url: `/v1/operations/${key}/forget`, body: { reason: "walk" } }),
      "POST /v1/operations/{name}/repair": () => ({ url: `/v1/operations/${key}/repair`, body: { reason: "walk" } }),
      "POST /v1/operations/{name}/settle": () => ({ url: `/v1/operations/${key}/settle`, body: { status: "failed", reason: "walk" } }),
      "POST /v1/destinations/{name}/pause": () => ({ url: "/v1/destinations/default/pause", body: { reason: "walk", dry_run: true } }),
      "POST /v1/destinations/{name}/resume": () => ({ url: "/v1/destinations/default/resume", body: { dry_run: true } }),
      "POST /v1/bulk/retry": () => ({ url: "/v1/bulk/retry", body: none }),
      "POST /v1/bulk/redeliver": () => ({ url: "/v1/bulk/redeliver", body: { ...none, reason: "walk", sent_before: new Date().toISOString() } }),
      "GET /v1/stats": () => ({ url: "/v1/stats" }),
      "GET /metrics": () => ({ url: "/metrics" }),
      "GET /v1/whoami": () => ({ url: "/v1/whoami" }),
      "GET /v1/config": () => ({ url: "/v1/config" }),
    };
    let walked = 0;
    for (const [route, item] of Object.entries(doc.paths).filter(([r]) => r.startsWith("/v1/") || r === "/metrics")) {
      for (const method of METHODS.filter((m) => item[m])) {
        const name = `${method.toUpperCase()} ${route}`;
        const accepted = (item[method].security ?? doc.security).flatMap(Object.keys);
        assert.ok(accepted.length && accepted.every((s) => TOKENS[s]), `${name} states its scopes`);
        assert.ok(accepted.includes("adminToken"), `${name}: an admin token does everything`);
        assert.ok(sample[name], `${name} has a sample request in this walk`);
        const needs = TOKENS[NARROWEST_FIRST.find((s) => accepted.includes(s))][0];
        for (const [scheme, [scope, token]] of Object.entries(TOKENS)) {
          const { url, body } = sample[name](scope);
          const res = await call(w, method.toUpperCase(), route, url, { token, body });
          const where = `${name} with a ${scope} token answered ${res.status} ${JSON.stringify(res.body).slice(0, 200)}`;
          if (accepted.includes(scheme)) {
            assert.ok(![401, 403].includes(res.status) && res.status < 500, where);
            // The narrower scopes are served in full: a register token registers and reads its
            // job back, a read token reads every GET.
            if (scope !== "admin") assert.ok([200, 201].includes(res.status), where);
          } else {
            assert.equal(res.status, 403, where);
            assert.deepEqual([res.body.scope, res.body.needs], [scope, needs], where);
            assert.match(res.body.error, new RegExp(`needs an? ${needs} token`), where);
          }
          walked++;
        }
      }
    }
    assert.equal(walked, Object.keys(sample).length * 3, "every sample was walked with each scope");
    // What the narrower tokens were refused changed nothing: only the admin's actions show.
    const history = (await w.inspect(key)).body.history;
    const byOperator = history.filter((h) => h.by);
    assert.ok(byOperator.length > 0 && byOperator.every((h) => h.by.scope === "admin" && h.by.fingerprint === fingerprint(ADMIN_TOKEN)), JSON.stringify(history));
  });

  it("every route answers 503 naming the variable while the configuration is incomplete", async () => {
    const some = { body: { name: "batches/x" } };
    const requests = [
      ["GET", "/healthz", "/healthz", {}],
      ["HEAD", "/healthz", "/healthz", {}],
      ["POST", "/webhooks/gemini", "/webhooks/gemini", { body: envelope("batch.succeeded", "batches/x") }],
      ["POST", "/v1/operations", "/v1/operations", some],
      ["GET", "/v1/operations", "/v1/operations", {}],
      ["GET", "/v1/operations/{name}", "/v1/operations/batches/x", {}],
      ["POST", "/v1/operations/{name}/retry", "/v1/operations/batches/x/retry", {}],
      ["POST", "/v1/operations/{name}/redeliver", "/v1/operations/batches/x/redeliver", {}],
      ["GET", "/v1/operations/{name}/results", "/v1/operations/batches/x/results", {}],
      ["POST", "/v1/operations/{name}/results/retry", "/v1/operations/batches/x/results/retry", {}],
      ["POST", "/v1/operations/{name}/forget", "/v1/operations/batches/x/forget", {}],
      ["POST", "/v1/operations/{name}/repair", "/v1/operations/batches/x/repair", {}],
      ["POST", "/v1/operations/{name}/settle", "/v1/operations/batches/x/settle", {}],
      ["GET", "/v1/stats", "/v1/stats", {}],
      ["GET", "/metrics", "/metrics", {}],
      ["GET", "/v1/whoami", "/v1/whoami", {}],
      ["GET", "/v1/config", "/v1/config", {}],
      ["POST", "/v1/bulk/retry", "/v1/bulk/retry", {}],
      ["POST", "/v1/bulk/redeliver", "/v1/bulk/redeliver", {}],
      ["POST", "/v1/destinations/{name}/pause", "/v1/destinations/default/pause", {}],
      ["POST", "/v1/destinations/{name}/resume", "/v1/destinations/default/resume", {}],
    ];
    for (const [method, route, url, opts] of requests) {
      const res = await call(broken, method, route, url, { ...opts, expect: 503 });
      if (method !== "HEAD") assert.equal(res.body.variable, "ADMIN_TOKEN");
    }
    // The page holds no data and needs no configuration.
    await call(broken, "GET", "/dashboard", "/dashboard", { token: false, expect: 200 });
  });

  it("provoked every documented answer and query parameter, and nothing undocumented", () => {
    assert.deepEqual([...exercised].sort(), documentedAnswers());
    assert.deepEqual([...queried].sort(), documentedQueryParams());
  });

  it("documents every route the router names and every list parameter ListQuery::parse accepts", () => {
    // The routes are string literals in the router; a new one must be described.
    const router = read("src/edge/mod.rs") + read("src/edge/http/admin_api.rs") + read("src/edge/http/one_operation.rs") + read("src/edge/http/bulk.rs");
    const paths = Object.keys(doc.paths);
    for (const [, literal] of router.matchAll(/"(\/[a-z0-9_/]*)"/g)) {
      assert.ok(paths.some((p) => p === literal || p.startsWith(literal)), `route ${literal} is in docs/openapi.yaml`);
    }
    for (const [, action] of router.matchAll(/Some\(\(name, "([a-z_]+)"\)\)/g)) {
      assert.ok(paths.includes(`/v1/operations/{name}/${action}`), `action ${action} is in docs/openapi.yaml`);
    }
    // The listing's parameters are the match arms of ListQuery::parse, one name or several
    // (`"prefix" | "q" =>`); `"true" => Ok(true)` is a value, not a parameter.
    const admin = read("src/operator/listing.rs");
    const parse = admin.slice(admin.indexOf("pub fn parse<'a>("), admin.indexOf("Ok(q)"));
    const accepted = [...parse.matchAll(/((?:"[a-z_]+" \| )*"[a-z_]+") => (?!Ok\()/g)]
      .flatMap(([, arm]) => [...arm.matchAll(/"([a-z_]+)"/g)].map(([, name]) => `GET /v1/operations ?${name}`))
      .sort();
    assert.ok(accepted.length > 0, "found ListQuery::parse");
    assert.deepEqual(accepted, documentedQueryParams().filter((p) => p.startsWith("GET /v1/operations ?")));
  });
});
