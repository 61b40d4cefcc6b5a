// What an attacker can and cannot do at the edge, against the built worker in workerd: bodies
// capped while they stream (an upload held open is refused before it ends, a delivery's or an
// admin request's; a declared length ends the body however much follows), headers refused
// before a body is read, nothing run twice after retention (the gate keeps nothing; the
// name kept in its retired names' shard refuses a replay's record), alerts
// delivered at least once with a stable id. docs/SECURITY.md lists each case with its test.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import net from "node:net";
import { startWorker, startServer, eventually, signedHeaders, sleep, ADMIN_TOKEN } from "./helpers.mjs";

const CAP = 4096;
let w, dest, sink;
// The alert sink fails the first send of batches/stuck1's alert (the test below reads its
// retry); every other alert, whenever an earlier test raises one, goes through.
let sinkFailures = 1;
const failsNow = (req) => JSON.parse(req.body || "{}").key === "batches/stuck1" && sinkFailures-- > 0;

before(async () => {
  dest = await startServer(() => ({ status: 200 }));
  sink = await startServer((req) => (failsNow(req) ? { status: 500, body: "sink down" } : { status: 200 }));
  w = await startWorker({
    EFFECT_URL: `${dest.url}/effects`,
    MAX_BODY_BYTES: String(CAP),
    LEDGER_RETENTION_SECONDS: "2",
    ALERT_URL: `${sink.url}/alerts`,
    EFFECT_RETRY_BASE_SECONDS: "1",
    EFFECT_RETRY_MAX_SECONDS: "1",
    STUCK_AFTER_SECONDS: "0",
    RECONCILE_GRACE_SECONDS: "86400",
  }, { http: true });
});
after(async () => {
  await w?.dispose();
  await dest?.close();
  await sink?.close();
});

const effectsFor = (key) => dest.requests.filter((r) => r.headers["idempotency-key"] === key);

/**
 * Starts a chunked upload to `path` (the webhook unless said) with `headers`, writes `bytes` in
 * 1 KiB chunks and never ends it. Resolves with the status of the answer, which can only come
 * before the end.
 */
function heldOpenUpload(headers, bytes, path = "/webhooks/gemini") {
  return new Promise((resolve, reject) => {
    const url = new URL(`${w.url}${path}`);
    const req = http.request({ host: url.hostname, port: url.port, path: url.pathname, method: "POST", headers: { ...headers, "transfer-encoding": "chunked" } });
    req.on("response", (res) => {
      res.resume();
      resolve({ status: res.statusCode, upload: req });
    });
    req.on("error", (e) => (e.code === "ECONNRESET" || e.code === "EPIPE" ? undefined : reject(e)));
    const chunk = Buffer.alloc(1024, "x");
    let sent = 0;
    const pump = () => {
      while (sent < bytes) {
        sent += chunk.length;
        if (!req.write(chunk)) return req.once("drain", pump);
      }
    };
    pump();
  });
}

describe("bodies are capped while they stream", () => {
  it("refuses an oversized chunked upload held open with 413 before it ends, and valid deliveries go on meanwhile", async () => {
    const headers = signedHeaders("irrelevant", {});
    const pending = heldOpenUpload({ ...headers, "content-type": "application/json" }, CAP * 4);
    // While that upload is open, a valid delivery is served as usual.
    const ok = await w.deliver("batch.succeeded", "batches/beside-upload");
    assert.equal(ok.status, 200);
    const { status, upload } = await pending;
    assert.equal(status, 413);
    upload.destroy();
    assert.ok(w.events("rejected").some((e) => e.reason === "body_too_large"));
  });

  it("refuses bad signature headers with 401 before reading the body, however large", async () => {
    const { status, upload } = await heldOpenUpload({ "content-type": "application/json", "webhook-id": "m", "webhook-timestamp": "1", "webhook-signature": "v1,AAAA" }, CAP * 4);
    upload.destroy();
    assert.equal(status, 401, "a stale timestamp is refused before the body");
  });

  it("a declared oversized content-length stays 413 first, whatever the headers", async () => {
    // Over real HTTP, so the request carries its content-length.
    const r = await fetch(`${w.url}/webhooks/gemini`, { method: "POST", headers: { "content-type": "application/json" }, body: "x".repeat(CAP + 1) });
    assert.equal(r.status, 413);
    await r.text();
  });

  it("a declared content-length within the cap ends the body: bytes sent after it are not read into it", async () => {
    // A body declared within the cap is read in one piece; HTTP framing ends it at the
    // declared length, so a sender that keeps writing cannot grow it past the cap.
    const body = JSON.stringify({ type: "batch.succeeded", version: "v1", data: { id: "batches/framed", output_file_uri: "gs://b/o" } });
    const headers = { ...signedHeaders(body), "content-type": "application/json", "content-length": String(Buffer.byteLength(body)), host: "localhost" };
    const url = new URL(w.url);
    const head = `POST /webhooks/gemini HTTP/1.1\r\n${Object.entries(headers).map(([k, v]) => `${k}: ${v}`).join("\r\n")}\r\n\r\n`;
    const answer = await new Promise((resolve, reject) => {
      const socket = net.connect(Number(url.port), url.hostname, () => socket.write(head + body + "x".repeat(CAP * 4)));
      let text = "";
      socket.on("data", (d) => {
        text += d;
        if (text.includes("\r\n\r\n")) { socket.destroy(); resolve(text); }
      });
      socket.on("error", (e) => (e.code === "ECONNRESET" ? resolve(text) : reject(e)));
    });
    assert.match(answer, /^HTTP\/1\.1 200/, answer.slice(0, 200));
    await eventually(() => effectsFor("batches/framed").length === 1, { what: "the delivery's effect" });
  });

  it("refuses an admin or bulk request held open past 16 KiB with 413 before it ends, and a declared one at once", async () => {
    const ADMIN_CAP = 16 * 1024;
    const auth = { authorization: `Bearer ${ADMIN_TOKEN}`, "content-type": "application/json" };
    for (const path of ["/v1/operations", "/v1/operations/batches%2Fheld/retry", "/v1/bulk/retry"]) {
      // Never ended: only a read that stops at the cap can answer it.
      const answered = heldOpenUpload(auth, ADMIN_CAP * 4, path);
      // A worker that waited for the upload's end would never answer: the bound only says how
      // long to wait for that failure, so it is long enough for a starved machine.
      let timer;
      const { status, upload } = await Promise.race([
        answered,
        new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(`${path}: no answer while the upload was held open`)), 60_000); }),
      ]).finally(() => clearTimeout(timer));
      upload.destroy();
      assert.equal(status, 413, path);
      // Declared over the cap: refused before a byte of it is read.
      const declared = await fetch(`${w.url}${path}`, { method: "POST", headers: auth, body: "x".repeat(ADMIN_CAP + 1) });
      assert.equal(declared.status, 413, `${path}, declared`);
      await declared.text();
    }
    // Within the cap, streamed or declared, a body is read and judged as before.
    const ok = await fetch(`${w.url}/v1/operations`, { method: "POST", headers: auth, body: JSON.stringify({ name: "batches/under-cap", kind: "nightly" }) });
    assert.equal(ok.status, 201, await ok.text());
  });

  it("a signed body exactly at the cap is accepted", async () => {
    const pad = "p".repeat(CAP);
    const base = JSON.stringify({ type: "batch.succeeded", version: "v1", data: { id: "batches/at-cap", pad: "" } });
    const body = base.replace('"pad":""', `"pad":"${pad.slice(0, CAP - base.length)}"`);
    assert.equal(Buffer.byteLength(body), CAP);
    const r = await w.json("/webhooks/gemini", { method: "POST", headers: signedHeaders(body), body });
    assert.equal(r.status, 200, JSON.stringify(r.body));
  });
});

describe("nothing runs twice after retention", () => {
  it("keeps nothing in the gate at retention's end, and a replay after it runs nothing", async () => {
    const sent = new Date().toISOString();
    const body = JSON.stringify({ type: "batch.succeeded", version: "v1", timestamp: sent, data: { id: "batches/late", output_file_uri: "gs://b/o" } });
    const headers = signedHeaders(body, { webhookId: "msg_late_1" });
    assert.equal((await w.json("/webhooks/gemini", { method: "POST", headers, body })).status, 200);
    await eventually(() => effectsFor("batches/late").length === 1, { what: "the effect" });
    // Retention (2 s here) ends: the name goes to its shard, the gate deletes everything.
    await eventually(() => w.events("retention_expired").some((l) => l.key === "batches/late"), { what: "retention to end" });
    assert.equal((await w.inspect("batches/late")).status, 404, "nothing left in the gate");
    // The captured delivery replayed (re-signed: a fresh webhook-timestamp, as Gemini's own
    // retry would be) and a different outcome of the same time create nothing: the event is
    // older than retention (`ignored_too_old`), or the same outcome is answered from this
    // isolate's memory of it (a fact that never changes). A different outcome signed now
    // creates a record, which its first alarm deletes on finding the name retired.
    const replay = await w.json("/webhooks/gemini", { method: "POST", headers: signedHeaders(body, { webhookId: "msg_late_2" }), body });
    assert.equal(replay.status, 200);
    assert.notEqual(replay.body.outcome, "applied", JSON.stringify(replay.body));
    const old = await w.deliver("batch.failed", "batches/late", {}, { timestamp: sent });
    assert.equal(old.status, 200);
    assert.equal(old.body.outcome, "ignored_too_old", JSON.stringify(old.body));
    const fresh = await w.deliver("batch.failed", "batches/late", {});
    assert.equal(fresh.status, 200);
    assert.equal(fresh.body.outcome, "applied", "answered as for a new name: nothing on the answer path asks");
    await eventually(() => w.events("retired_name_refused").some((l) => l.key === "batches/late"), { what: "the fresh delivery's record refused", timeoutMs: 60_000 });
    await eventually(async () => (await w.inspect("batches/late")).status === 404, { what: "the gate empty again", timeoutMs: 60_000 });
    await sleep(1500);
    assert.equal(effectsFor("batches/late").length, 1, "nothing ran again");
    assert.equal((await w.inspect("batches/late")).status, 404, "nothing kept");
    const redeliver = await w.admin(`/v1/operations/${encodeURIComponent("batches/late")}/redeliver`, { method: "POST", body: "{}" });
    assert.equal(redeliver.status, 404, "an operator finds nothing to redeliver");
  });
});

describe("alerts are delivered at least once", () => {
  it("sends an alert whose first send failed later, under the same alert-id", async () => {
    await w.register("batches/stuck1", "nightly");
    await w.ledger("batches/stuck1");
    await w.scheduled();
    const sent = await eventually(() => {
      const mine = sink.requests.filter((r) => JSON.parse(r.body).key === "batches/stuck1");
      return mine.length >= 2 && mine;
    }, { what: "the alert's retry (EFFECT_RETRY_MAX_SECONDS=1 bounds its wait)", timeoutMs: 120_000 });
    assert.equal(JSON.parse(sent[0].body).alert, "stuck");
    assert.ok(sent[0].headers["alert-id"], "an alert-id header");
    assert.equal(sent[1].headers["alert-id"], sent[0].headers["alert-id"], "stable across retries");
    await eventually(async () => (await w.inspect("batches/stuck1")).body.alerts_pending.length === 0, { what: "the queue to empty", timeoutMs: 120_000 });
    await w.scheduled();
    await sleep(500);
    assert.equal(sink.requests.filter((r) => JSON.parse(r.body).key === "batches/stuck1").length, 2, "raised once");
  });
});
