// Alert formats and resolutions, against the built worker in workerd and local stand-ins for
// each sink (and a raw TCP sink that parses each request's bytes as strictly as HTTP asks): PagerDuty's Events API v2 (a trigger, then a resolve under the same dedup_key, for
// a destination that opens then recovers and for a stuck operation that settles), Slack's and
// Discord's incoming webhooks (a parked effect, then its delivery after an operator's retry),
// and the default JSON, checked against docs/alert.schema.json. Each sink checks every body it
// receives against the tool's documented shape, written out below as a JSON schema.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { createServer as createTcpServer } from "node:net";
import path from "node:path";
import { fileURLToPath } from "node:url";
import Ajv2020 from "ajv/dist/2020.js";
import { startWorker, startServer, startDestination, startStatusApi, eventually, sleep } from "./helpers.mjs";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
// `required` inside if/then names properties declared beside the `if`.
const ajv = new Ajv2020({ strict: true, strictRequired: false, allowUnionTypes: true, allErrors: true });
const ALERT_SCHEMA = ajv.compile(JSON.parse(readFileSync(path.join(root, "docs/alert.schema.json"), "utf8")));

// PagerDuty Events API v2 (developer.pagerduty.com, "Send an Alert Event" / "Resolve"):
// routing_key, event_action and, for a trigger, payload.summary (at most 1024 characters),
// payload.source and payload.severity (critical, error, warning or info); dedup_key at most
// 255 characters; links as {href, text}.
const PAGERDUTY = ajv.compile({
  type: "object",
  required: ["routing_key", "event_action", "dedup_key"],
  properties: {
    routing_key: { type: "string", minLength: 1 },
    event_action: { enum: ["trigger", "acknowledge", "resolve"] },
    dedup_key: { type: "string", minLength: 1, maxLength: 255 },
    payload: {
      type: "object",
      required: ["summary", "source", "severity"],
      properties: {
        summary: { type: "string", minLength: 1, maxLength: 1024 },
        source: { type: "string", minLength: 1 },
        severity: { enum: ["critical", "error", "warning", "info"] },
        timestamp: { type: "string" },
        component: { type: "string" },
        group: { type: "string" },
        class: { type: "string" },
        custom_details: { type: "object" },
      },
      additionalProperties: false,
    },
    links: { type: "array", items: { type: "object", required: ["href"], properties: { href: { type: "string" }, text: { type: "string" } }, additionalProperties: false } },
    images: { type: "array" },
    client: { type: "string" },
    client_url: { type: "string" },
  },
  additionalProperties: false,
  if: { properties: { event_action: { const: "trigger" } } },
  then: { required: ["payload"] },
  else: { not: { required: ["payload"] } },
});

// Slack incoming webhook (api.slack.com/messaging/webhooks): `text` is required (it is what
// notifications show, and the fallback when blocks are given); blocks are optional, each with
// a `type`; a section's text object is plain_text or mrkdwn, at most 3000 characters.
const SLACK = ajv.compile({
  type: "object",
  required: ["text"],
  properties: {
    text: { type: "string", minLength: 1 },
    blocks: {
      type: "array",
      maxItems: 50,
      items: {
        type: "object",
        required: ["type"],
        properties: {
          type: { enum: ["section", "context", "divider", "header", "actions"] },
          text: { type: "object", required: ["type", "text"], properties: { type: { enum: ["plain_text", "mrkdwn"] }, text: { type: "string", minLength: 1, maxLength: 3000 } } },
          elements: { type: "array" },
        },
      },
    },
  },
});

// Discord "Execute Webhook" (discord.com/developers/docs/resources/webhook): one of content,
// embeds, files; content at most 2000 characters; allowed_mentions.parse from roles, users,
// everyone.
const DISCORD = ajv.compile({
  type: "object",
  required: ["content"],
  properties: {
    content: { type: "string", minLength: 1, maxLength: 2000 },
    username: { type: "string" },
    allowed_mentions: { type: "object", properties: { parse: { type: "array", items: { enum: ["roles", "users", "everyone"] } } } },
  },
  additionalProperties: false,
});

/** A sink stand-in that checks each body against `validate` and answers as the tool does. */
async function startSink(validate, answer = { status: 200 }) {
  const invalid = [];
  const server = await startServer((req) => {
    const body = JSON.parse(req.body);
    if (!validate(body)) invalid.push({ body, errors: validate.errors });
    return typeof answer === "function" ? answer(req) : answer;
  });
  return {
    ...server,
    bodies: () => server.requests.map((r) => JSON.parse(r.body)),
    assertAllValid() {
      assert.deepEqual(invalid, [], "every body matches the tool's documented shape");
    },
  };
}

function batch(state, extra = {}) {
  return { status: 200, body: { name: "batches/x", metadata: { state, updateTime: new Date().toISOString() }, ...extra } };
}

describe("PagerDuty: a trigger, then a resolve under the same dedup_key", () => {
  let pd, dest, api, w;
  let down = false;
  const gemini = new Map();
  before(async () => {
    pd = await startSink(PAGERDUTY, { status: 202, body: { status: "success", message: "Event processed" } });
    dest = await startDestination(() => (down ? { status: 503, body: { error: "down" } } : { status: 200 }));
    api = await startStatusApi(gemini);
    w = await startWorker({
      EFFECT_URL: `${dest.url}/effects`,
      ALERT_FORMAT: "pagerduty",
      ALERT_URL: `${pd.url}/v2/enqueue`,
      ALERT_ROUTING_KEY: "test-routing-key-0123456789abcdef",
      ALERT_DASHBOARD_URL: "https://once.example/dashboard",
      DESTINATION_OPEN_AFTER: "2",
      UNREGISTERED_HOLD_SECONDS: "0",
      GEMINI_API_BASE: api.url,
      GEMINI_API_KEY: "test-gemini-key",
      RECONCILE_GRACE_SECONDS: "0",
      STUCK_AFTER_SECONDS: "1",
    });
  });
  after(async () => {
    await w?.dispose();
    await dest?.close();
    await api?.close();
    await pd?.close();
    pd?.assertAllValid();
  });

  it("a destination that opens then recovers: destination_open triggers, destination_recovered resolves it", async () => {
    // Down until the trigger came (a fixed outage could end before a busy machine's attempts
    // had failed often enough to open it), then up again.
    down = true;
    const keys = ["batches/pd-down-1", "batches/pd-down-2", "batches/pd-down-3"];
    for (const k of keys) await w.deliver("batch.succeeded", k);
    const trigger = await eventually(() => pd.bodies().find((b) => b.payload?.class === "destination_open"), { what: "the trigger" });
    down = false;
    assert.equal(trigger.event_action, "trigger");
    assert.equal(trigger.routing_key, "test-routing-key-0123456789abcdef");
    assert.match(trigger.dedup_key, /^gemini-once:destination_open:EFFECT_URL: http:\/\/127\.0\.0\.1:\d+\/…$/);
    assert.equal(trigger.payload.severity, "error");
    assert.doesNotMatch(trigger.dedup_key, /\/effects/, "the label carries the origin only");
    assert.deepEqual(trigger.links, [{ href: "https://once.example/dashboard#issues?destination=default", text: "gemini-once dashboard" }]);
    assert.match(trigger.payload.summary, /^\[ALERT\] gemini-once destination_open: default \(destination\) http:\/\/127\.0\.0\.1:\d+\/… is failing \(/);
    await eventually(async () => {
      const views = await Promise.all(keys.map((k) => w.inspect(k)));
      return views.every((v) => v.body.effect_done);
    }, { what: "every effect delivered after the recovery", timeoutMs: 40_000, everyMs: 500 });
    const resolve = await eventually(() => pd.bodies().find((b) => b.event_action === "resolve" && b.dedup_key === trigger.dedup_key), { what: "the resolve" });
    assert.deepEqual(Object.keys(resolve).sort(), ["dedup_key", "event_action", "routing_key"]);
    const order = pd.bodies().filter((b) => b.dedup_key === trigger.dedup_key).map((b) => b.event_action);
    assert.deepEqual(order, ["trigger", "resolve"]);
  });

  it("a stuck operation that settles: stuck triggers, its outcome resolves it", async () => {
    const key = "batches/pd-stuck";
    await w.register(key, "nightly");
    gemini.set(key, batch("BATCH_STATE_RUNNING"));
    await w.ledger([key]);
    await sleep(1_100);
    await w.scheduled();
    const trigger = await eventually(() => pd.bodies().find((b) => b.dedup_key === `gemini-once:stuck:${key}`), { what: "the stuck trigger" });
    assert.equal(trigger.event_action, "trigger");
    assert.equal(trigger.payload.severity, "warning");
    assert.equal(trigger.payload.source, key);
    assert.match(trigger.payload.summary, /batches\/pd-stuck/);
    assert.equal(trigger.payload.custom_details.alert, "stuck");
    await w.deliver("batch.succeeded", key);
    await eventually(() => pd.bodies().some((b) => b.event_action === "resolve" && b.dedup_key === trigger.dedup_key), { what: "the stuck resolve" });
    const order = pd.bodies().filter((b) => b.dedup_key === trigger.dedup_key).map((b) => b.event_action);
    assert.deepEqual(order, ["trigger", "resolve"], "one of each");
  });
});

/** A parked effect (the destination refuses it), then its delivery after an operator's retry. */
async function parkThenRetry(w, refusing, key) {
  await w.deliver("batch.succeeded", key);
  await eventually(async () => (await w.inspect(key)).body.effect_parked, { what: "the park" });
  refusing.delete(key);
  const retried = await w.admin(`/v1/operations/${key}/redeliver`, { method: "POST", body: JSON.stringify({ reason: "destination fixed" }) });
  assert.equal(retried.status, 200, JSON.stringify(retried.body));
  await eventually(async () => (await w.inspect(key)).body.effect_done, { what: "the retried effect" });
}

for (const [format, validate, field] of [["slack", SLACK, "text"], ["discord", DISCORD, "content"]]) {
  describe(`${format}: a readable line for the alert and for its resolution`, () => {
    let sink, dest, w;
    const refusing = new Set();
    before(async () => {
      sink = await startSink(validate, { status: format === "discord" ? 204 : 200, body: "ok" });
      dest = await startDestination((req) => (refusing.has(req.headers["idempotency-key"]) ? { status: 422 } : { status: 200 }));
      w = await startWorker({
        EFFECT_URL: `${dest.url}/effects`,
        ALERT_FORMAT: format,
        ALERT_URL: `${sink.url}/hook`,
        ALERT_DASHBOARD_URL: "https://once.example/dashboard",
        UNREGISTERED_HOLD_SECONDS: "0",
      });
    });
    after(async () => {
      await w?.dispose();
      await dest?.close();
      await sink?.close();
      sink?.assertAllValid();
    });

    it("a parked effect alerts with the operation, destination, reason and dashboard, then resolves once delivered", async () => {
      const key = `batches/${format}-parked`;
      refusing.add(key);
      await parkThenRetry(w, refusing, key);
      const lines = await eventually(() => {
        const found = sink.bodies().map((b) => b[field]).filter((t) => t.includes(key));
        return found.length >= 2 && found;
      }, { what: "the alert and its resolution" });
      assert.equal(lines.length, 2, JSON.stringify(lines));
      const [alert, resolved] = lines;
      assert.match(alert, /^\[ALERT\] gemini-once effect_failing: batches\/\S+ \(unregistered kind\) succeeded but its side effect was refused and parked: 422/);
      assert.match(alert, /\(destination: EFFECT_URL: http:\/\/127\.0\.0\.1:\d+\/…\)/, "the origin, the path only as …");
      assert.match(alert, /dashboard: https:\/\/once\.example\/dashboard#op\/batches%2F\S+-parked$/, "a link to the operation's page");
      assert.match(resolved, /^\[RESOLVED\] gemini-once effect_recovered: /);
      if (format === "discord") {
        assert.deepEqual(sink.bodies()[0].allowed_mentions, { parse: [] }, "text from outside pings nobody");
      } else {
        assert.equal(sink.bodies()[0].blocks[0].type, "section");
      }
    });
  });
}

describe("json, the default: today's body, plus the resolution's form", () => {
  let sink, dest, w;
  let sinkDown = false;
  const refusing = new Set();
  const accepted = [];
  before(async () => {
    sink = await startSink(ALERT_SCHEMA, (req) => {
      if (sinkDown) return { status: 503, body: "down" };
      accepted.push(req);
      return { status: 200 };
    });
    dest = await startDestination((req) => (refusing.has(req.headers["idempotency-key"]) ? { status: 422 } : { status: 200 }));
    // An alert the sink refused is sent again after the effects' backoff: bounded to 2 s
    // here, so "the sink is back" is seen on the next retry however many sends failed.
    w = await startWorker({
      EFFECT_URL: `${dest.url}/effects`,
      ALERT_URL: `${sink.url}/alerts`,
      UNREGISTERED_HOLD_SECONDS: "0",
      EFFECT_RETRY_BASE_SECONDS: "1",
      EFFECT_RETRY_MAX_SECONDS: "2",
    });
  });
  after(async () => {
    await w?.dispose();
    await dest?.close();
    await sink?.close();
    sink?.assertAllValid();
  });

  it("effect_failing keeps its fields; effect_recovered names the condition it ends", async () => {
    const key = "batches/json-parked";
    refusing.add(key);
    await parkThenRetry(w, refusing, key);
    const [alert, resolved] = await eventually(() => {
      const found = sink.bodies().filter((b) => b.key === key);
      return found.length >= 2 && found;
    }, { what: "the alert and its resolution" });
    assert.deepEqual(Object.keys(alert).sort(), ["age_seconds", "alert", "alert_id", "destination", "key", "kind", "name", "text"]);
    assert.equal(alert.alert, "effect_failing");
    assert.equal(alert.resolves, undefined);
    assert.equal(resolved.alert, "effect_recovered");
    assert.equal(resolved.resolves, "effect_failing");
    assert.notEqual(resolved.alert_id, alert.alert_id);
    const headers = sink.requests.filter((r) => JSON.parse(r.body).key === key).map((r) => r.headers["alert-id"]);
    assert.deepEqual(headers, [alert.alert_id, resolved.alert_id]);
  });

  it("a sink that is down: the alert waits in the record, the side effects do not wait for it, and it arrives under the same id once the sink is back", async () => {
    sinkDown = true;
    const parked = "batches/json-sink-down";
    const others = Array.from({ length: 5 }, (_, i) => `batches/json-sink-down-ok-${i}`);
    refusing.add(parked);
    for (const k of [parked, ...others]) await w.deliver("batch.succeeded", k);
    await eventually(async () => {
      const views = await Promise.all(others.map((k) => w.inspect(k)));
      return views.every((v) => v.body.effect_done);
    }, { what: "the other effects delivered while the sink is down" });
    const refused = await eventually(() => {
      const tried = sink.requests.filter((r) => JSON.parse(r.body).key === parked);
      return tried.length >= 1 && tried;
    }, { what: "a refused send" });
    const { body: op } = await w.inspect(parked);
    assert.equal(op.effect_parked, true);
    assert.deepEqual(op.alerts_pending, ["effect_failing"], "kept until the sink takes it");
    const attempt = dest.requests.find((r) => r.headers["idempotency-key"] === parked);
    assert.ok(attempt.at <= refused[0].at, "the side effect went before its alert");
    sinkDown = false;
    await eventually(async () => (await w.inspect(parked)).body.alerts_pending.length === 0, { what: "the alert sent once the sink is back", timeoutMs: 120_000, everyMs: 250 });
    const ids = new Set(sink.requests.filter((r) => JSON.parse(r.body).key === parked).map((r) => r.headers["alert-id"]));
    assert.equal(ids.size, 1, "one alert-id across the retries");
  });

  it("a sink down across two spells: each trigger and the resolution arrive once, in order, each under its own id", async () => {
    sinkDown = true;
    const key = "batches/json-two-spells";
    const pending = async () => (await w.inspect(key)).body.alerts_pending;
    const retryNow = async () => {
      const retried = await w.admin(`/v1/operations/${key}/redeliver`, { method: "POST", body: JSON.stringify({ reason: "try again" }) });
      assert.equal(retried.status, 200, JSON.stringify(retried.body));
    };
    refusing.add(key);
    await w.deliver("batch.succeeded", key);
    await eventually(() => sink.requests.some((r) => JSON.parse(r.body).key === key), { what: "the first spell's alert refused" });
    // Retried by hand and refused again: a second spell, while the first one's alert waits.
    await retryNow();
    await eventually(async () => (await pending()).length === 2, { what: "the second spell's alert queued" });
    refusing.delete(key);
    await retryNow();
    await eventually(async () => (await w.inspect(key)).body.effect_done, { what: "the effect delivered" });
    assert.deepEqual(await pending(), ["effect_failing", "effect_failing", "effect_recovered"]);
    sinkDown = false;
    await eventually(async () => (await pending()).length === 0, { what: "every alert sent once the sink is back", timeoutMs: 120_000, everyMs: 250 });
    const heard = accepted.filter((r) => JSON.parse(r.body).key === key).map((r) => JSON.parse(r.body));
    assert.deepEqual(heard.map((b) => b.alert), ["effect_failing", "effect_failing", "effect_recovered"]);
    assert.equal(new Set(heard.map((b) => b.alert_id)).size, 3, "each its own alert_id: none dropped as a repeat");
  });
});

/**
 * A sink that reads each request's bytes itself (no HTTP library to forgive anything): the
 * request line and every header line must be printable ASCII (a header value must be, by RFC
 * 9110), each header a token, a colon and a value; the body is read by its content-length or
 * its chunks. Answers 200 and keeps each request's headers (names in lower case) and body.
 */
async function startStrictSink() {
  const requests = [];
  const violations = [];
  const server = createTcpServer((socket) => {
    let buf = Buffer.alloc(0);
    socket.on("data", (chunk) => {
      buf = Buffer.concat([buf, chunk]);
      for (;;) {
        const end = buf.indexOf("\r\n\r\n");
        if (end < 0) return;
        const head = buf.subarray(0, end);
        const lines = [];
        let start = 0;
        for (let i = 0; i + 1 < head.length + 2; i++) {
          if (i === head.length || (head[i] === 0x0d && head[i + 1] === 0x0a)) {
            lines.push(head.subarray(start, i));
            start = i + 2;
            i++;
          }
        }
        const headers = {};
        lines.forEach((line, n) => {
          const bad = [...line].findIndex((b) => b < 0x20 || b > 0x7e);
          if (bad >= 0) violations.push(`line ${n} byte ${bad} is 0x${line[bad].toString(16)}: ${JSON.stringify(line.toString("latin1"))}`);
          if (n === 0) return;
          const text = line.toString("latin1");
          const m = /^([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*(.*?)[ \t]*$/.exec(text);
          if (!m) violations.push(`not a header line: ${JSON.stringify(text)}`);
          else headers[m[1].toLowerCase()] = m[2];
        });
        let rest = buf.subarray(end + 4);
        let body;
        if (headers["transfer-encoding"]?.toLowerCase() === "chunked") {
          const parts = [];
          let at = 0;
          for (;;) {
            const lineEnd = rest.indexOf("\r\n", at);
            if (lineEnd < 0) return; // wait for more bytes
            const size = parseInt(rest.subarray(at, lineEnd).toString("latin1"), 16);
            if (rest.length < lineEnd + 2 + size + 2) return;
            parts.push(rest.subarray(lineEnd + 2, lineEnd + 2 + size));
            at = lineEnd + 2 + size + 2;
            if (size === 0) break;
          }
          body = Buffer.concat(parts);
          rest = rest.subarray(at);
        } else {
          const length = Number(headers["content-length"] ?? 0);
          if (rest.length < length) return;
          body = rest.subarray(0, length);
          rest = rest.subarray(length);
        }
        buf = rest;
        requests.push({ requestLine: lines[0].toString("latin1"), headers, body: body.toString("utf8") });
        socket.write("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok");
      }
    });
    socket.on("error", () => {});
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    requests,
    violations,
    bodies: () => requests.map((r) => JSON.parse(r.body)),
    close: () => new Promise((r) => server.close(r)),
  };
}

describe("every alert's request is ASCII where HTTP asks, and links to the page about it", () => {
  let sink, dest, w;
  let down = false;
  const refusing = new Set();
  before(async () => {
    sink = await startStrictSink();
    dest = await startDestination((req) => {
      if (refusing.has(req.headers["idempotency-key"])) return { status: 422 };
      return req.url.startsWith("/py") && down ? { status: 503 } : { status: 200 };
    });
    w = await startWorker({
      EFFECT_URL: `${dest.url}/effects`,
      EFFECT_ROUTES: JSON.stringify({ py: `${dest.url}/py/hook?token=not-shown` }),
      ALERT_URL: `${sink.url}/alerts`,
      ALERT_DASHBOARD_URL: "https://once.example/dashboard",
      DESTINATION_OPEN_AFTER: "2",
      UNREGISTERED_HOLD_SECONDS: "0",
    });
  });
  after(async () => {
    await w?.dispose();
    await dest?.close();
    await sink?.close();
  });

  it("a destination's alerts and an operation's: printable ASCII headers, the documented line, a link to the page", async () => {
    // Down until it opened (a fixed outage could end before a busy machine's attempts had
    // failed often enough), then up again.
    down = true;
    const keys = ["batches/strict-py-1", "batches/strict-py-2", "batches/strict-py-3"];
    for (const k of keys) {
      assert.equal((await w.register(k, "py")).status, 201);
      assert.equal((await w.deliver("batch.succeeded", k)).status, 200);
    }
    const parked = "batches/strict-parked";
    refusing.add(parked);
    await w.deliver("batch.succeeded", parked);
    const find = (alert) => sink.bodies().find((b) => b.alert === alert);
    await eventually(() => find("destination_open"), { what: "destination_open", everyMs: 250 });
    down = false;
    await eventually(() => find("destination_open") && find("destination_recovered") && find("effect_failing"), {
      what: "destination_open, destination_recovered and effect_failing", timeoutMs: 60_000, everyMs: 500,
    });
    assert.deepEqual(sink.violations, [], "every request line and header is printable ASCII");
    for (const r of sink.requests) {
      const body = JSON.parse(r.body);
      assert.match(r.headers["alert-id"], /^alert_[0-9a-f]{24}$/, `${body.alert}'s alert-id`);
      assert.equal(r.headers["alert-id"], body.alert_id, "the header is the body's id");
      assert.ok(ALERT_SCHEMA(body), JSON.stringify(ALERT_SCHEMA.errors));
    }
    const open = find("destination_open");
    assert.match(open.text, /^gemini-once destination_open: py \(destination\) http:\/\/127\.0\.0\.1:\d+\/… is failing \(\d+ failures in a row, last: /);
    assert.doesNotMatch(open.text, /token|not-shown/, "never a credential");
    assert.equal(open.name, "py");
    assert.equal(open.dashboard, "https://once.example/dashboard#issues?destination=py");
    const recovered = find("destination_recovered");
    assert.match(recovered.text, /^gemini-once destination_recovered: py \(destination\) http:\/\/127\.0\.0\.1:\d+\/… recovered after \d+ s/);
    assert.equal(recovered.dashboard, open.dashboard);
    const failing = find("effect_failing");
    assert.match(failing.text, /^gemini-once effect_failing: batches\/strict-parked \(unregistered kind\) succeeded but its side effect was refused and parked: 422/);
    assert.equal(failing.dashboard, "https://once.example/dashboard#op/batches%2Fstrict-parked");
  });
});
