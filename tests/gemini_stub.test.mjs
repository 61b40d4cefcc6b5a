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
    }, { timeoutMs: 20000, everyMs: 500, what: "every side effect at the destination" });

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
