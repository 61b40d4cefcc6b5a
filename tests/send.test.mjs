// `npm run send` against the built worker over real HTTP: signs like Gemini, makes
// duplicates on purpose, and the destination still sees one side effect.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { startWorker, startServer, GEMINI_SECRET, ADMIN_TOKEN, READ_TOKEN } from "./helpers.mjs";
import { freePort } from "../scripts/local_worker.mjs";

const run = promisify(execFile);
let w, dest;

before(async () => {
  dest = await startServer(() => ({ status: 200 }));
  w = await startWorker({ EFFECT_URL: `${dest.url}/effects` }, { http: true });
});
after(async () => {
  await w?.dispose();
  await dest?.close();
});

describe("npm run send", () => {
  it("sends signed duplicates, concurrently, and one side effect results", async () => {
    const { stdout } = await run("node", ["scripts/send.mjs", "batch.succeeded", "batches/sent1", "--url", w.url, "--secret", GEMINI_SECRET,
      "--data", '{"output_file_uri":"gs://b/o.jsonl"}', "--repeat", "6", "--concurrency", "3"]);
    const lines = stdout.trim().split("\n");
    assert.equal(lines.filter((l) => / 200 /.test(l)).length, 6, stdout);
    assert.match(lines.at(-1), /^sent 6 batch\.succeeded for batches\/sent1 .*: 200=6$/);
    assert.equal(new Set(lines.slice(0, -1).map((l) => l.split(" ")[3])).size, 1, "one webhook-id: Gemini-style retries");
    const effects = dest.requests.filter((r) => r.headers["idempotency-key"] === "batches/sent1");
    assert.equal(effects.length, 1);
    assert.equal(JSON.parse(effects[0].body).output_file_uri, "gs://b/o.jsonl");
  });

  it("exits non-zero when the worker refuses the signature", async () => {
    await assert.rejects(
      run("node", ["scripts/send.mjs", "batch.succeeded", "batches/sent2", "--url", w.url, "--secret", "whsec_d3Jvbmc=", "--fresh-ids", "--repeat", "2"]),
      (e) => e.code === 1 && /401=2/.test(e.stdout),
    );
    assert.equal(dest.requests.filter((r) => r.headers["idempotency-key"] === "batches/sent2").length, 0);
  });

  it("explains its usage on bad arguments", async () => {
    await assert.rejects(run("node", ["scripts/send.mjs", "batch.succeeded"]), (e) => e.code === 2 && /usage: npm run send/.test(e.stderr));
  });
});

describe("npm run send: what became of the side effect", () => {
  it("says the effect was delivered, from the record, with a read token", async () => {
    const { stderr } = await run("node", ["scripts/send.mjs", "batch.succeeded", "batches/sent3", "--url", w.url, "--secret", GEMINI_SECRET, "--token", READ_TOKEN]);
    assert.match(stderr, /^effect: delivered to the destination/m);
    assert.doesNotMatch(stderr, /hint:/);
  });

  it("hints at the destination when nothing listens at EFFECT_URL", async () => {
    const nowhere = await startWorker({ EFFECT_URL: `http://127.0.0.1:${await freePort()}/effects` }, { http: true });
    try {
      const { stdout, stderr } = await run("node", ["scripts/send.mjs", "batch.succeeded", "batches/sent4", "--url", nowhere.url, "--secret", GEMINI_SECRET, "--admin-token", ADMIN_TOKEN]);
      assert.match(stdout, /200=1$/m, "the delivery itself was accepted");
      assert.match(stderr, /^effect: not delivered yet \(last_error: .+\); the worker retries it at /m);
      assert.match(stderr, /^hint: is anything listening at EFFECT_URL\? .*npm run receive/m);
      const op = await nowhere.inspect("batches/sent4");
      assert.equal(op.body.effect_done, false);
      assert.ok(op.body.last_error);
    } finally {
      await nowhere.dispose();
    }
  });
});
