// The README's reconciliation walk-through, end to end: the built worker in workerd with
// GEMINI_API_BASE at `npm run gemini-stub` (its own process, as a user runs it) and EFFECT_URL
// at the demo destination. Operations are registered, the stub says running, they are marked
// done with the stub's `done` command, the cron pass settles them, and each side effect
// arrives at the destination once, verified.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFile } from "node:child_process";
import { promisify } from "node:util";
import { eachLine, freePort } from "../scripts/local_worker.mjs";
import { effectReceiver, listen } from "../scripts/receive.mjs";
import { startWorker, eventually, sleep, EFFECT_SECRET } from "./helpers.mjs";

const run = promisify(execFile);
let stub, stubPort, receiver, w;
const stubLines = [];
const received = [];

before(async () => {
  stubPort = await freePort();
  stub = spawn("node", ["scripts/gemini_stub.mjs", "--port", String(stubPort)], { stdio: ["ignore", "pipe", "inherit"] });
  eachLine(stub.stdout, (line) => stubLines.push(line));
  await eventually(() => stubLines.some((l) => l.includes(`status API at http://127.0.0.1:${stubPort}`)), { what: "the stub to listen" });
  receiver = await listen(effectReceiver(EFFECT_SECRET, { log: (line) => received.push(line) }), 0);
  w = await startWorker({
    EFFECT_URL: `http://127.0.0.1:${receiver.address().port}/effects`,
    GEMINI_API_BASE: `http://127.0.0.1:${stubPort}`,
    RECONCILE_GRACE_SECONDS: "0",
    // A results file not there yet is asked for again with the side effect's backoff.
    EFFECT_RETRY_BASE_SECONDS: "1",
    EFFECT_RETRY_MAX_SECONDS: "2",
  });
});
after(async () => {
  await w?.dispose();
  stub?.kill();
  receiver?.closeAllConnections();
  receiver?.close();
});

const OPS = [
  // [registered name, key, marked, expected status, a field the effect must carry]
  ["batches/stub1", "batches/stub1", "succeeded", "succeeded", /output_file_uri=files\/stub1-results/],
  ["models/veo-3/operations/stub2", "operations/stub2", "succeeded", "succeeded", /status=succeeded/],
  ["interactions/stub3", "interactions/stub3", "succeeded", "succeeded", /status=succeeded/],
  ["batches/stub4", "batches/stub4", "failed", "failed", /error_code=13 error_message=stub: marked failed/],
  ["batches/stub5", "batches/stub5", "cancelled", "cancelled", /status=cancelled/],
  ["interactions/stub6", "interactions/stub6", "failed", "failed", /status=failed/],
];
const effectsFor = (key) => received.filter((l) => l.includes(`key=${key} `));

describe("npm run gemini-stub", () => {
  it("answers running until marked done; the cron pass then settles each and the effect arrives once", async () => {
    for (const [name] of OPS) assert.equal((await w.register(name, "stub-demo")).status, 201);
    await w.ledger(OPS.map(([, key]) => key));
    await w.scheduled();
    for (const [name, key] of OPS) {
      assert.ok(stubLines.includes(`gemini-stub: GET ${name}: running`), `the stub was asked about ${name}`);
      assert.equal((await w.inspect(key)).body.status, "running", key);
    }
    assert.equal(received.length, 0);

    for (const [name, , state] of OPS) {
      const { stdout } = await run("node", ["scripts/gemini_stub.mjs", "done", name, "--state", state, "--port", String(stubPort)]);
      assert.match(stdout, /gemini-stub: 200 /);
    }
    // A pass settles what the ledger lists; the ledger may show the running state a moment late.
    await eventually(async () => {
      await w.scheduled();
      return OPS.every(([, key]) => effectsFor(key).length > 0);
    }, { timeoutMs: 60_000, everyMs: 500, what: "every side effect at the destination" });

    for (const [name, key, , status, field] of OPS) {
      const op = (await w.inspect(key)).body;
      assert.equal(op.status, status, key);
      assert.equal(op.settled_by, "reconcile", key);
      assert.equal(op.effect_done, true, key);
      const lines = effectsFor(key);
      assert.equal(lines.length, 1, lines.join("\n"));
      assert.ok(lines[0].startsWith(`verified new key=${key} status=${status} settled_by=reconcile`), lines[0]);
      assert.match(lines[0], field, name);
    }
    // Settled and done: a later pass neither asks nor sends again.
    const asked = stubLines.length;
    await sleep(1100);
    await w.scheduled();
    assert.equal(stubLines.slice(asked).filter((l) => l.includes(" GET ")).length, 0);
    assert.equal(received.length, OPS.length);
  });

  it("refuses a name of no known collection, and the done command says so", async () => {
    await assert.rejects(run("node", ["scripts/gemini_stub.mjs", "done", "files/abc", "--port", String(stubPort)]), (e) => e.code === 1 && /400/.test(e.stdout));
    const res = await fetch(`http://127.0.0.1:${stubPort}/v1beta/files/abc`);
    assert.equal(res.status, 404);
  });
});

describe("npm run gemini-stub: a batch's results", () => {
  const base = () => `http://127.0.0.1:${stubPort}`;
  const done = (name, ...flags) => run("node", ["scripts/gemini_stub.mjs", "done", name, ...flags, "--port", String(stubPort)]);
  const download = (file, headers = {}) => fetch(`${base()}/download/v1beta/${file}:download?alt=media`, { headers });

  it("names a succeeded batch's results file and serves it, honouring Range with 206", async () => {
    await done("batches/res1");
    const status = await (await fetch(`${base()}/v1beta/batches/res1`)).json();
    assert.equal(status.response.responsesFile, "files/res1-results");
    assert.equal(status.metadata.output.responsesFile, "files/res1-results");
    const whole = await download("files/res1-results");
    assert.equal(whole.status, 200);
    const text = await whole.text();
    const lines = text.split("\n").filter(Boolean).map((l) => JSON.parse(l));
    assert.deepEqual(lines.map((l) => l.key), ["review-1", "review-2", "review-3", "review-4"]);
    assert.deepEqual(lines.map((l) => ("response" in l ? "response" : "error")), ["response", "response", "error", "response"]);
    assert.equal(Number(whole.headers.get("content-length")), Buffer.byteLength(text));
    // A resumed read: the bytes from an offset, as Gemini's download would answer them.
    const from = text.indexOf('{"key":"review-3"');
    const rest = await download("files/res1-results", { range: `bytes=${from}-` });
    assert.equal(rest.status, 206);
    assert.equal(rest.headers.get("content-range"), `bytes ${from}-${Buffer.byteLength(text) - 1}/${Buffer.byteLength(text)}`);
    assert.equal(await rest.text(), text.slice(from));
    const past = await download("files/res1-results", { range: `bytes=${Buffer.byteLength(text)}-` });
    assert.equal(past.status, 416);
    assert.ok(stubLines.includes("gemini-stub: GET files/res1-results: 4 lines"), stubLines.join("\n"));
    // No file for a batch not succeeded, nor for a name never marked.
    await done("batches/res2", "--state", "failed");
    assert.equal((await download("files/res2-results")).status, 404);
    assert.equal((await download("files/nothing-results")).status, 404);
  });

  it("generates a file of --lines lines, whole JSON lines at any offset", async () => {
    await done("batches/res3", "--lines", "500");
    const text = await (await download("files/res3-results")).text();
    const lines = text.split("\n").filter(Boolean).map((l) => JSON.parse(l));
    assert.equal(lines.length, 500);
    assert.equal(new Set(lines.map((l) => l.key)).size, 500);
    assert.equal(lines.filter((l) => "error" in l).length, 50);
    const tail = await (await download("files/res3-results", { range: "bytes=1000-" })).text();
    assert.equal(tail, text.slice(1000));
  });

  it("answers the file 404 for --file-after seconds after done, then serves it", async () => {
    await done("batches/res4", "--file-after", "1");
    assert.equal((await download("files/res4-results")).status, 404);
    await eventually(async () => (await download("files/res4-results")).status === 200, { timeoutMs: 60_000, what: "the file to appear" });
  });

  it("--inline carries the results in the status answer, in another order on every read", async () => {
    await done("batches/res5", "--inline");
    const read = async () => (await (await fetch(`${base()}/v1beta/batches/res5`)).json()).response.inlinedResponses.inlinedResponses;
    const first = await read();
    const second = await read();
    assert.deepEqual(first.map((i) => i.metadata.key), ["review-1", "review-2", "review-3", "review-4"]);
    assert.notDeepEqual(second.map((i) => i.metadata.key), first.map((i) => i.metadata.key));
    assert.deepEqual([...second].sort((a, b) => a.metadata.key.localeCompare(b.metadata.key)), first);
    assert.equal(first.filter((i) => "error" in i).length, 1);
    assert.equal((await download("files/res5-results")).status, 404, "no file for an inline batch");
  });
});

describe("npm run gemini-stub: a batch's results through the worker, to the demo destination", () => {
  const done = (name, ...flags) => run("node", ["scripts/gemini_stub.mjs", "done", name, ...flags, "--port", String(stubPort)]);
  const linesOf = (key) => received.filter((l) => l.includes(` key=${key} `));
  /** Registers `name` with results each, marks it done with `flags`, runs passes until the job's effect arrives. */
  async function settle(name, ...flags) {
    assert.equal((await w.register(name, "stub-demo", { results: "each" })).status, 201);
    await w.ledger(name);
    await done(name, ...flags);
    return eventually(async () => {
      await w.scheduled();
      const lines = linesOf(name);
      return lines.some((l) => !l.includes("result_key=")) && lines;
    }, { timeoutMs: 30_000, everyMs: 1000, what: `the job's effect of ${name}` });
  }
  const DEMO = [["review-1", 0, /response=The first page reads well; tighten the intro\. /], ["review-2", 1, /response=Two broken links on the pricing page\. /], ["review-3", 2, /error=3 stub: request review-3 named no model input /], ["review-4", 3, /response=Nothing to change\. /]];

  it("a file: each of its results once, under a res_ id, then the job with its counts", async () => {
    const lines = await settle("batches/resw1");
    await sleep(500);
    const all = linesOf("batches/resw1");
    assert.equal(all.length, 5, all.join("\n"));
    for (const [key, index, what] of DEMO) {
      const found = all.filter((l) => l.includes(`result_key=${key} index=${index} `));
      assert.equal(found.length, 1, `${key}:\n${all.join("\n")}`);
      assert.match(found[0], /^verified new result key=batches\/resw1 /);
      assert.match(found[0], what);
      assert.match(found[0], / webhook-id=res_[0-9a-f]{32}$/);
    }
    assert.match(lines.at(-1), /^verified new key=batches\/resw1 status=succeeded settled_by=reconcile output_file_uri=files\/resw1-results results=\{"total":4,"delivered":4,"errors":1,"parked":0\} webhook-id=msg_/);
    assert.ok(stubLines.some((l) => l === "gemini-stub: GET files/resw1-results: 4 lines"), stubLines.join("\n"));
  });

  it("inline results, in another order on every read: each once, the same ids as their keys say", async () => {
    await settle("batches/resw2", "--inline");
    await sleep(500);
    const all = linesOf("batches/resw2");
    assert.equal(all.filter((l) => l.includes("result_key=")).length, 4, all.join("\n"));
    for (const [key] of DEMO) assert.equal(all.filter((l) => l.includes(`result_key=${key} `)).length, 1, `${key}:\n${all.join("\n")}`);
    assert.match(all.at(-1), /results=\{"total":4,"delivered":4,"errors":1,"parked":0\}/);
  });

  it("a file that answers 404 for a while after done is read once it is there", async () => {
    await settle("batches/resw3", "--file-after", "3");
    assert.ok(stubLines.includes("gemini-stub: GET files/resw3-results: not found"), "asked before it was there");
    const all = linesOf("batches/resw3");
    assert.equal(all.filter((l) => l.includes("result_key=")).length, 4, all.join("\n"));
    assert.match(all.at(-1), /"total":4,"delivered":4/);
  });
});
