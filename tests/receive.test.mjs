// `npm run receive`, the demo destination: run as a user runs it (its own process, port and
// secret as options), it verifies each side effect's Standard Webhooks signature, flags a
// forged one, and drops a repeated webhook-id.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { sign } from "../scripts/send.mjs";
import { eachLine, freePort } from "../scripts/local_worker.mjs";
import { eventually, EFFECT_SECRET } from "./helpers.mjs";

let child, url;
const lines = [];

before(async () => {
  const port = await freePort();
  child = spawn("node", ["scripts/receive.mjs", "--port", String(port), "--secret", EFFECT_SECRET], { stdio: ["ignore", "pipe", "inherit"] });
  eachLine(child.stdout, (line) => lines.push(line));
  url = `http://127.0.0.1:${port}/effects`;
  await eventually(() => lines.some((l) => l.includes(`demo destination at ${url}`)), { what: "the receiver to listen" });
});
after(() => child?.kill());

function effect(key, extra = {}) {
  return JSON.stringify({ version: 1, key, name: key, kind: "demo", status: "succeeded", settled_by: "webhook", settled_at: "2026-11-22T10:00:00Z", ...extra });
}

async function post(body, headers) {
  const res = await fetch(url, { method: "POST", headers, body });
  await res.text();
  return res.status;
}

const now = () => Math.floor(Date.now() / 1000);
const linesFor = (id) => eventually(() => { const l = lines.filter((x) => x.includes(`webhook-id=${id}`)); return l.length && l; }, { what: `a line for ${id}` });

describe("npm run receive", () => {
  it("verifies a genuine signature and prints the effect's key fields", async () => {
    const body = effect("batches/r1", { output_file_uri: "gs://b/r1.jsonl" });
    assert.equal(await post(body, sign(EFFECT_SECRET, "msg_r1_1", now(), body)), 200);
    const [line] = await linesFor("msg_r1_1");
    assert.match(line, /^receive: verified new key=batches\/r1 status=succeeded settled_by=webhook output_file_uri=gs:\/\/b\/r1\.jsonl webhook-id=msg_r1_1$/);
  });

  it("prints a failure's error fields", async () => {
    const body = effect("batches/r2", { status: "failed", settled_by: "reconcile", error_code: 13, error_message: "boom" });
    assert.equal(await post(body, sign(EFFECT_SECRET, "msg_r2_1", now(), body)), 200);
    const [line] = await linesFor("msg_r2_1");
    assert.match(line, /verified new key=batches\/r2 status=failed settled_by=reconcile error_code=13 error_message=boom /);
  });

  it("flags a forged signature, a wrong secret and a tampered body, and answers 401", async () => {
    const body = effect("batches/r3");
    const genuine = sign(EFFECT_SECRET, "msg_r3_1", now(), body);
    assert.equal(await post(body, { ...genuine, "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=" }), 401);
    assert.equal(await post(body, sign("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_r3_2", now(), body)), 401);
    assert.equal(await post(effect("batches/r3", { status: "failed" }), genuine), 401);
    assert.equal(await post(body, sign(EFFECT_SECRET, "msg_r3_3", now() - 3600, body)), 401, "a stale timestamp");
    for (const id of ["msg_r3_1", "msg_r3_2", "msg_r3_3"]) {
      const found = await linesFor(id);
      assert.ok(found.every((l) => l.startsWith("receive: NOT verified (")), found.join("\n"));
    }
    assert.equal(lines.filter((l) => l.includes("key=batches/r3")).length, 0, "nothing unverified is printed as an effect");
  });

  it("drops a repeated webhook-id, and takes a redelivery's new one", async () => {
    const body = effect("batches/r4");
    for (let i = 0; i < 3; i++) assert.equal(await post(body, sign(EFFECT_SECRET, "msg_r4_1", now(), body)), 200);
    const found = await eventually(() => { const l = lines.filter((x) => x.includes("webhook-id=msg_r4_1")); return l.length === 3 && l; }, { what: "three lines" });
    assert.equal(found.filter((l) => l.startsWith("receive: verified new ")).length, 1);
    assert.equal(found.filter((l) => l.startsWith("receive: verified repeat ") && l.endsWith("already handled, dropped")).length, 2);
    assert.equal(await post(body, sign(EFFECT_SECRET, "msg_r4_2", now(), body)), 200);
    assert.match((await linesFor("msg_r4_2"))[0], /^receive: verified new key=batches\/r4 /);
  });

  it("prints each result's effect as a result, apart from the job's effect with its counts", async () => {
    const job = { version: 1, key: "batches/r5", name: "batches/r5", kind: "pages" };
    const results = [
      ["res_r5_0", { ...job, result_key: "page-1", index: 0, response: { candidates: [{ content: { parts: [{ text: "A title\nand a long generated body that goes on and on past any line's width" }] } }] } }],
      ["res_r5_1", { ...job, result_key: "page-2", index: 1, error: { code: 3, message: "bad request" } }],
      ["res_r5_2", { ...job, result_key: "line-2", index: 2, unreadable: { reason: "not a JSON object", index: 2 } }],
      ["res_r5_3", { ...job, result_key: "page-4", index: 3, response: { embedding: { values: [0.1, 0.2] } } }],
    ];
    for (const [id, body] of results) {
      const text = JSON.stringify(body);
      assert.equal(await post(text, sign(EFFECT_SECRET, id, now(), text)), 200);
    }
    const done = effect("batches/r5", { kind: "pages", output_file_uri: "files/r5-results", results: { delivered: 4, errors: 2, parked: 0, total: 4 } });
    assert.equal(await post(done, sign(EFFECT_SECRET, "msg_r5", now(), done)), 200);
    assert.equal((await linesFor("res_r5_0"))[0], "receive: verified new result key=batches/r5 result_key=page-1 index=0 response=A title and a long generated body that goes on and on past… webhook-id=res_r5_0");
    assert.equal((await linesFor("res_r5_1"))[0], "receive: verified new result key=batches/r5 result_key=page-2 index=1 error=3 bad request webhook-id=res_r5_1");
    assert.match((await linesFor("res_r5_2"))[0], /^receive: verified new result key=batches\/r5 result_key=line-2 index=2 unreadable=\{"reason":"not a JSON object","index":2\} webhook-id=res_r5_2$/);
    assert.match((await linesFor("res_r5_3"))[0], /result_key=page-4 index=3 response=\{"embedding":\{"values":\[0\.1,0\.2\]\}\} webhook-id=res_r5_3$/);
    const [line] = await linesFor("msg_r5");
    assert.match(line, /^receive: verified new key=batches\/r5 status=succeeded settled_by=webhook output_file_uri=files\/r5-results results=\{"total":4,"delivered":4,"errors":2,"parked":0\} webhook-id=msg_r5$/);
    assert.ok(!line.includes("result_key"), "the job's effect is not a result");
    // A result repeated under its webhook-id is dropped like any effect.
    const [id, body] = results[0];
    const text = JSON.stringify(body);
    assert.equal(await post(text, sign(EFFECT_SECRET, id, now(), text)), 200);
    const both = await eventually(() => { const l = lines.filter((x) => x.includes(`webhook-id=${id}`)); return l.length === 2 && l; }, { what: "the repeat" });
    assert.match(both[1], /^receive: verified repeat result key=batches\/r5 result_key=page-1 index=0 .*already handled, dropped$/);
  });

  it("refuses to start without a secret", async () => {
    const r = spawn("node", ["scripts/receive.mjs", "--port", "0", "--secret", "nope"], { stdio: ["ignore", "ignore", "pipe"] });
    let err = "";
    r.stderr.on("data", (c) => (err += c));
    const code = await new Promise((resolve) => r.on("exit", resolve));
    assert.equal(code, 2);
    assert.match(err, /usage: npm run receive/);
  });
});
