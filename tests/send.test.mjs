// `npm run send` against the built worker over real HTTP: signs like Gemini, makes
// duplicates on purpose, and the destination still sees one side effect.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { createServer } from "node:http";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { startWorker, startServer, eventually, sleep, GEMINI_SECRET, ADMIN_TOKEN, READ_TOKEN } from "./helpers.mjs";
import { freePort } from "../scripts/local_worker.mjs";
import { geminiStub } from "../scripts/gemini_stub.mjs";
import { localKeys } from "../scripts/gemini_keys.mjs";

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
    // Without a token, send cannot wait for the effect: it goes from the gate's alarm, after
    // the answers. Wait for it, then for any second one.
    const sentFor = () => dest.requests.filter((r) => r.headers["idempotency-key"] === "batches/sent1");
    await eventually(() => sentFor().length > 0, { what: "the side effect" });
    await sleep(500);
    const effects = sentFor();
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

describe("npm run send --scheme: signed as dynamic webhooks are, with the Gemini stand-in's keys", () => {
  it("v1a (as delivered live) and jwt (as documented) verify against the key set npm run gemini-stub serves", async () => {
    const keysFile = path.join(mkdtempSync(path.join(tmpdir(), "gemini-keys-")), "keys.json");
    const env = { ...process.env, GEMINI_STUB_KEYS: keysFile };
    const { handler } = geminiStub({ log: () => {}, keys: localKeys(keysFile) });
    const stub = createServer(handler);
    await new Promise((r) => stub.listen(0, "127.0.0.1", r));
    const stubUrl = `http://127.0.0.1:${stub.address().port}`;
    const dynamic = await startWorker({
      EFFECT_URL: `${dest.url}/effects`,
      GEMINI_JWKS_URL: `${stubUrl}/.well-known/jwks.json`,
      GEMINI_API_BASE: stubUrl,
      GEMINI_API_KEY: "local",
      CONFIRM_INTERVAL_SECONDS: "1",
    }, { http: true });
    try {
      for (const name of ["batches/sent-v1a", "batches/sent-jwt"]) await fetch(`${stubUrl}/done/${name}`, { method: "POST" });
      // v1a: a job never registered, settled once the stub (asked with our key) knows it.
      const v1a = await run("node", ["scripts/send.mjs", "batch.succeeded", "batches/sent-v1a", "--url", dynamic.url, "--scheme", "v1a", "--repeat", "2"], { env });
      assert.match(v1a.stdout, /200=2$/m, v1a.stdout);
      assert.match(v1a.stdout, /"outcome":"applied"/);
      // jwt: a token only hastens a registered job.
      await dynamic.register("batches/sent-jwt");
      const jwt = await run("node", ["scripts/send.mjs", "batch.succeeded", "batches/sent-jwt", "--url", dynamic.url, "--scheme", "jwt"], { env });
      assert.match(jwt.stdout, /"outcome":"confirming"/, jwt.stdout);
      for (const name of ["batches/sent-v1a", "batches/sent-jwt"]) {
        await eventually(() => dest.requests.filter((r) => r.headers["idempotency-key"] === name).length === 1, { what: `${name}'s effect` });
      }
      // Signed by another key set's keys: refused.
      const otherEnv = { ...process.env, GEMINI_STUB_KEYS: path.join(path.dirname(keysFile), "other.json") };
      await assert.rejects(
        run("node", ["scripts/send.mjs", "batch.succeeded", "batches/sent-forged", "--url", dynamic.url, "--scheme", "v1a"], { env: otherEnv }),
        (e) => e.code === 1 && /401=1/.test(e.stdout),
      );
      await assert.rejects(run("node", ["scripts/send.mjs", "batch.succeeded", "batches/x", "--scheme", "v2"]), (e) => e.code === 2 && /--scheme is one of v1, v1a, jwt/.test(e.stderr));
    } finally {
      await dynamic.dispose();
      await new Promise((r) => stub.close(r));
    }
  });
});
