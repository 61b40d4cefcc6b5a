// The example receivers (examples/receivers/) against the built worker in workerd: the Python
// one (FastAPI, `standardwebhooks`, SQLite) started by the commands of its README as written,
// and the TypeScript Worker (`standardwebhooks`, D1) bundled with the esbuild wrangler ships
// and run in a workerd of its own. Between the worker and each receiver runs a link that
// forwards every effect and loses some answers (the connection drops after the receiver
// answered), so the worker sends the same webhook-id again. Jobs (succeeded and failed) and a
// batch's results (responses and errors) each run once; a repeat is answered 2xx and not run
// again, two copies of one id at the same moment run it once; a forged signature is answered
// 401 and runs nothing; a redelivery, a new webhook-id, runs. The Worker's claim: a copy whose
// id another copy holds is answered 409 and runs nothing; a claim a crash left is taken over
// after its lease and runs once. scripts/setup-receivers.sh
// installs the Python receiver's dependencies with the README's commands, which then find them.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Miniflare } from "miniflare";

import { sign } from "../scripts/send.mjs";
import { eachLine, freePort } from "../scripts/local_worker.mjs";
import Ajv2020 from "ajv/dist/2020.js";
import { startWorker, eventually, assertEffectValid, EFFECT_SCHEMA, EFFECT_SECRET, GEMINI_SECRET } from "./helpers.mjs";
import { startGemini, succeeded, fileOf } from "./results_stub.mjs";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const examples = path.join(root, "examples/receivers");
const pythonDir = path.join(examples, "python");
const python = path.join(pythonDir, ".venv/bin/python");
// A job's line ends `status=...`; a result's `result_key=... index=... outcome=...`.
/** A result's body against docs/effect.schema.json's `$defs/result`. */
// strictRequired off: the oneOf branches name properties the enclosing object defines.
const validResult = new Ajv2020({ strict: true, strictRequired: false, allowUnionTypes: true, allErrors: true, validateFormats: false })
  .addSchema(EFFECT_SCHEMA).compile({ $ref: `${EFFECT_SCHEMA.$id}#/$defs/result` });
function assertResultValid(body) {
  const value = JSON.parse(body);
  assert.ok(validResult(value), `result body does not match $defs/result: ${JSON.stringify(validResult.errors)}\n${body}`);
}
const PROCESSED = /processed webhook-id=(\S+) key=(\S+) generation=(\d+) (?:status=(\S+)|result_key=(\S+) index=(\d+) outcome=(\S+))/;

/**
 * The link from the worker to `target`: forwards each effect, records it with the receiver's
 * answer, and when `lose(record)` says so destroys the connection after the receiver's first
 * answer to that webhook-id.
 */
async function startLink(target, lose) {
  const forwarded = [];
  const lost = new Set();
  const server = createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", async () => {
      const body = Buffer.concat(chunks).toString();
      const headers = Object.fromEntries(Object.entries(req.headers).filter(([k]) => /^(webhook-|idempotency-key|effect-generation|content-type)/.test(k)));
      const answer = await fetch(`${target}${req.url}`, { method: req.method, headers, body });
      const record = { headers, body, status: answer.status, answer: await answer.json() };
      forwarded.push(record);
      const id = headers["webhook-id"];
      if (!lost.has(id) && lose(record)) {
        lost.add(id);
        return res.socket.destroy();
      }
      res.writeHead(answer.status, { "content-type": "application/json" });
      res.end(JSON.stringify(record.answer));
    });
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    forwarded,
    to: (key) => forwarded.filter((r) => r.headers["idempotency-key"] === key),
    /** What was forwarded for operation `key`'s results, and for its job. */
    resultsOf: (key) => forwarded.filter((r) => { const b = JSON.parse(r.body); return b.key === key && "result_key" in b; }),
    close: () => new Promise((r) => { server.closeAllConnections(); server.close(r); }),
  };
}

/**
 * The Python receiver, started by its README's commands as written, but for what a test must
 * change: the port (a free one in place of 8795, which may be taken here), the secret (the
 * test's in place of `whsec_...`) and the database (in `dir`, not the example's folder).
 */
async function startPythonReceiver(dir) {
  const readme = readFileSync(path.join(pythonDir, "README.md"), "utf8");
  const block = readme.match(/```sh\n([\s\S]*?)```/)?.[1] ?? assert.fail("the README's commands");
  const commands = block.trim().split("\n");
  assert.equal(commands[0], "cd examples/receivers/python");
  const install = commands.slice(0, -1);
  assert.deepEqual(install.slice(1), ["python3 -m venv .venv", ".venv/bin/pip install -r requirements.txt"], "make a venv, install into it");
  // Fast when scripts/setup-receivers.sh ran these already: everything pinned is installed.
  const installed = spawnSync("bash", ["-c", install.join(" && ")], { cwd: root, encoding: "utf8", timeout: 300_000 });
  assert.equal(installed.status, 0, `${install.join(" && ")}\n${installed.stdout}${installed.stderr}`);
  const port = await freePort();
  const db = path.join(dir, "effects.sqlite3");
  const serve = commands.at(-1);
  assert.match(serve, /^EFFECT_SIGNING_SECRET=whsec_\.\.\. RECEIVER_DB=effects\.sqlite3 \.venv\/bin\/uvicorn receiver:app --host 127\.0\.0\.1 --port 8795$/);
  const asRun = serve.replace("whsec_...", EFFECT_SECRET).replace("RECEIVER_DB=effects.sqlite3", `RECEIVER_DB=${db}`).replace("--port 8795", `--port ${port}`);
  assert.match(readme, /EFFECT_URL=http:\/\/127\.0\.0\.1:8795\/effects/, "the worker pointed at the port the receiver listens on");
  const lines = [];
  // A process group of its own: the shell and the uvicorn it starts stop together.
  const child = spawn("bash", ["-c", `${commands[0]} && ${asRun}`], { cwd: root, stdio: ["ignore", "pipe", "pipe"], detached: true });
  eachLine(child.stdout, (l) => lines.push(l));
  eachLine(child.stderr, (l) => lines.push(l));
  await eventually(() => lines.some((l) => l.includes("Uvicorn running on")), { what: "uvicorn to listen", timeoutMs: 30_000 });
  const query = "import json, sqlite3, sys; print(json.dumps(sqlite3.connect(sys.argv[1]).execute('SELECT webhook_id, idempotency_key, generation, result_key, outcome FROM effects ORDER BY rowid').fetchall()))";
  return {
    url: `http://127.0.0.1:${port}`,
    lines,
    async rows() {
      const out = spawnSync(python, ["-c", query, db], { encoding: "utf8" });
      assert.equal(out.status, 0, out.stderr);
      return JSON.parse(out.stdout).map(([webhook_id, idempotency_key, generation, result_key, outcome]) => ({ webhook_id, idempotency_key, generation, result_key, outcome }));
    },
    async close() {
      const exited = new Promise((r) => (child.exitCode !== null ? r() : child.once("exit", r)));
      try { process.kill(-child.pid, "SIGTERM"); } catch { /* already gone */ }
      await exited;
    },
  };
}

/** The TypeScript receiver, bundled as wrangler would, in a workerd of its own with a local D1. */
async function startWorkerReceiver() {
  const dir = path.join(examples, "worker");
  const esbuild = await import("esbuild");
  const out = await esbuild.build({
    entryPoints: [path.join(dir, "src/index.ts")], bundle: true, format: "esm", platform: "browser",
    conditions: ["workerd", "worker", "browser"], target: "es2022", write: false, logLevel: "silent",
  });
  const { unstable_readConfig } = await import("wrangler");
  const config = unstable_readConfig({ config: path.join(dir, "wrangler.toml") });
  const lines = [];
  const mf = new Miniflare({
    host: "127.0.0.1",
    port: 0,
    modules: [{ type: "ESModule", path: "receiver.mjs", contents: out.outputFiles[0].text }],
    compatibilityDate: config.compatibility_date,
    d1Databases: config.d1_databases.map((d) => d.binding),
    bindings: { EFFECT_SIGNING_SECRET: EFFECT_SECRET },
    handleRuntimeStdio(stdout, stderr) {
      eachLine(stdout, (l) => lines.push(l));
      eachLine(stderr, (l) => lines.push(l));
    },
  });
  const url = String(await mf.ready).replace(/\/$/, "");
  const db = await mf.getD1Database("DB");
  await db.prepare(readFileSync(path.join(dir, "schema.sql"), "utf8")).run();
  return {
    url,
    lines,
    async rows() {
      const { results } = await db.prepare("SELECT webhook_id, idempotency_key, generation, result_key, outcome FROM effects WHERE done_at IS NOT NULL ORDER BY rowid").all();
      return results;
    },
    db,
    close: () => mf.dispose(),
  };
}

const now = () => Math.floor(Date.now() / 1000);

/** One receiver behind the worker: the same scenario for each. */
function scenario(name, start, prefix) {
  describe(name, () => {
    let dir, receiver, link, w, gemini;
    const key = (s) => `batches/${prefix}-${s}`;
    const processed = () => receiver.lines.map((l) => l.match(PROCESSED)).filter(Boolean)
      .map(([, webhookId, k, generation, status, resultKey, index, outcome]) => ({ webhookId, key: k, generation: Number(generation), status, resultKey, index: index && Number(index), outcome }));
    const post = async (headers, body) => {
      const res = await fetch(`${receiver.url}/effects`, { method: "POST", headers: { ...headers, "content-type": "application/json" }, body });
      return { status: res.status, body: await res.json() };
    };

    before(async () => {
      dir = mkdtempSync(path.join(os.tmpdir(), "receivers-"));
      receiver = await start(dir);
      // The job of key("lost") and one result of key("results") lose their first answer.
      link = await startLink(receiver.url, (r) => {
        const body = JSON.parse(r.body);
        return (body.key === key("lost") && !("result_key" in body)) || (body.key === key("results") && body.index === 2);
      });
      gemini = await startGemini();
      w = await startWorker({ EFFECT_URL: `${link.url}/effects`, EFFECT_RETRY_BASE_SECONDS: "1", EFFECT_RETRY_MAX_SECONDS: "2", UNREGISTERED_HOLD_SECONDS: "0", GEMINI_API_BASE: gemini.url, GEMINI_API_KEY: "test-gemini-key" });
    });
    after(async () => {
      await w?.dispose();
      await link?.close();
      await gemini?.close();
      await receiver?.close();
      if (dir) rmSync(dir, { recursive: true, force: true });
    });

    it("runs each effect once; the worker's repeat of a lost answer is answered 2xx and not run again", async () => {
      const keys = [key("a"), key("b"), key("lost")];
      for (const k of keys) assert.equal((await w.deliver("batch.succeeded", k)).status, 200);
      for (const k of keys) {
        await eventually(async () => (await w.inspect(k)).body.effect_done, { what: `${k}'s effect done`, timeoutMs: 30_000 });
      }
      for (const r of link.forwarded) assertEffectValid(r.body);
      const repeat = link.to(key("lost"));
      assert.equal(repeat.length, 2, "the lost answer brought one retry");
      assert.equal(repeat[0].headers["webhook-id"], repeat[1].headers["webhook-id"], "the retry carries the same webhook-id");
      assert.deepEqual(repeat.map((r) => [r.status, r.answer.duplicate]), [[200, false], [200, true]]);
      const ran = processed();
      assert.deepEqual(ran.map((p) => p.key).sort(), [...keys].sort(), "each effect ran once");
      for (const p of ran) assert.equal(p.webhookId, link.to(p.key)[0].headers["webhook-id"]);
      assert.deepEqual((await receiver.rows()).map((r) => r.idempotency_key).sort(), [...keys].sort(), "one row per webhook-id");
    });

    it("answers 401 to a forged signature, a wrong secret and a tampered body, and runs none of them", async () => {
      const genuine = link.to(key("a"))[0];
      const forged = { ...genuine.headers, "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=" };
      assert.equal((await post(forged, genuine.body)).status, 401);
      assert.equal((await post(sign(GEMINI_SECRET, "msg_forged_1", now(), genuine.body), genuine.body)).status, 401, "another secret");
      assert.equal((await post(genuine.headers, genuine.body.replace('"succeeded"', '"failed"'))).status, 401, "a tampered body");
      assert.equal((await post({ ...genuine.headers, "webhook-signature": "not-a-signature" }, genuine.body)).status, 401, "a malformed header");
      const replay = await post(genuine.headers, genuine.body);
      assert.deepEqual([replay.status, replay.body.duplicate], [200, true], "a genuine replay is a repeat");
      assert.equal(processed().length, 3, "nothing more ran");
      assert.equal((await receiver.rows()).length, 3);
    });

    it("runs a redelivery, a new generation under a new webhook-id, once more", async () => {
      const r = await w.admin(`/v1/operations/${key("a")}/redeliver`, { method: "POST", body: JSON.stringify({ reason: "receiver test" }) });
      assert.ok(r.status >= 200 && r.status < 300, JSON.stringify(r.body));
      // The receiver prints before it answers, and the link records after: wait for both.
      const again = await eventually(() => link.to(key("a")).length >= 2 && processed().find((p) => p.key === key("a") && p.generation === 2), { what: "the redelivery to run and be answered", timeoutMs: 30_000 });
      const [first, second] = link.to(key("a"));
      assert.equal(second.headers["effect-generation"], "2");
      assert.notEqual(second.headers["webhook-id"], first.headers["webhook-id"]);
      assert.equal(again.webhookId, second.headers["webhook-id"]);
      const rows = await receiver.rows();
      assert.deepEqual(rows.filter((x) => x.idempotency_key === key("a")).map((x) => Number(x.generation)), [1, 2]);
      assert.equal(new Set(processed().map((p) => p.webhookId)).size, processed().length, "no webhook-id ran twice");
    });

    it("takes a failed job, and a batch's results (responses and errors, one answer lost) each once, then its job", { timeout: 120_000 }, async () => {
      const failed = key("failed");
      assert.equal((await w.deliver("batch.failed", failed, { error_code: 13, error_message: "internal" })).status, 200);
      const batch = key("results");
      // Six results: lines 0 and 3 are errors, the rest responses.
      gemini.files.set(`files/${prefix}-results`, fileOf(6, { errorEvery: 3 }));
      gemini.status.set(batch, succeeded(batch, { responsesFile: `files/${prefix}-results` }));
      assert.equal((await w.register(batch, "other", { results: "each" })).status, 201);
      assert.equal((await w.deliver("batch.succeeded", batch)).status, 200);
      for (const k of [failed, batch]) await eventually(async () => (await w.inspect(k)).body.effect_done, { what: `${k}'s effect done`, timeoutMs: 90_000 });
      for (const r of link.resultsOf(batch)) assertResultValid(r.body);

      const job = processed().filter((p) => p.key === failed);
      assert.deepEqual(job.map((p) => p.status), ["failed"], "the failed job ran once");
      const results = processed().filter((p) => p.key === batch && p.resultKey);
      assert.deepEqual(results.map((p) => `${p.index}:${p.resultKey}:${p.outcome}`).sort(),
        ["0:k0:error", "1:k1:response", "2:k2:response", "3:k3:error", "4:k4:response", "5:k5:response"], "each result ran once");
      const lost = link.resultsOf(batch).filter((r) => JSON.parse(r.body).index === 2);
      assert.deepEqual(lost.map((r) => [r.status, r.answer.duplicate]), [[200, false], [200, true]], "the lost answer's retry was a repeat");
      assert.deepEqual(processed().filter((p) => p.key === batch && p.status).map((p) => p.status), ["succeeded"], "then the batch's job, once");
      const rows = (await receiver.rows()).filter((r) => r.result_key !== null && results.some((p) => p.webhookId === r.webhook_id));
      assert.equal(rows.length, 6, "one row per result");
      for (const row of rows) assert.equal(row.idempotency_key, row.webhook_id, "a result's idempotency-key is its own id");
      assert.equal(new Set(processed().map((p) => p.webhookId)).size, processed().length, "no webhook-id ran twice");
    });

    it("runs two copies of one webhook-id that arrive at the same moment once", async () => {
      const [template] = link.resultsOf(key("results"));
      const body = template.body;
      for (const round of [1, 2, 3]) {
        const id = `msg_concurrent_${prefix}_${round}`;
        const headers = sign(EFFECT_SECRET, id, now(), body);
        const answers = await Promise.all(Array.from({ length: 4 }, () => post(headers, body)));
        const ran = processed().filter((p) => p.webhookId === id);
        assert.equal(ran.length, 1, `${id} ran once: ${JSON.stringify(answers)}`);
        // One copy ran it; each other was answered a repeat (2xx) or "being handled, retry" (409).
        assert.equal(answers.filter((a) => a.status === 200 && a.body.duplicate === false).length, 1, JSON.stringify(answers));
        for (const a of answers) assert.ok((a.status === 200 && a.body.duplicate !== undefined) || a.status === 409, JSON.stringify(a));
        const again = await post(headers, body);
        assert.deepEqual([again.status, again.body.duplicate], [200, true], "after it ran, a copy is a repeat");
        assert.equal(processed().filter((p) => p.webhookId === id).length, 1);
      }
    });
  });
}

scenario("the Python receiver (FastAPI, standardwebhooks, SQLite)", startPythonReceiver, "py");
scenario("the TypeScript Worker receiver (standardwebhooks, D1)", startWorkerReceiver, "ts");

describe("the TypeScript Worker receiver's claim", () => {
  let receiver;
  before(async () => { receiver = await startWorkerReceiver(); });
  after(async () => { await receiver?.close(); });
  const body = JSON.stringify({ version: 1, key: "batches/claim", name: "batches/claim", kind: null, result_key: "k1", index: 0, response: { candidates: [] } });
  const post = async (id) => {
    const res = await fetch(`${receiver.url}/effects`, { method: "POST", headers: sign(EFFECT_SECRET, id, now(), body), body });
    return { status: res.status, body: await res.json() };
  };
  const ran = (id) => receiver.lines.filter((l) => l.startsWith(`processed webhook-id=${id} `));
  const claim = (id, claimedAt) => receiver.db.prepare("INSERT INTO effects (webhook_id, idempotency_key, generation, result_key, outcome, body, claimed_at) VALUES (?, ?, 1, 'k1', 'response', ?, ?)")
    .bind(id, id, body, claimedAt).run();

  it("answers 409 to a copy whose id another copy is running, and runs nothing", async () => {
    await claim("res_running", Date.now());
    const answer = await post("res_running");
    assert.equal(answer.status, 409, JSON.stringify(answer.body));
    assert.equal(ran("res_running").length, 0);
    const row = await receiver.db.prepare("SELECT done_at FROM effects WHERE webhook_id = ?").bind("res_running").first();
    assert.equal(row.done_at, null, "the running copy's claim is left as it is");
  });

  it("takes over a claim a crash left (older than the lease) and runs the effect once", async () => {
    await claim("res_crashed", Date.now() - 61_000);
    const answer = await post("res_crashed");
    assert.deepEqual([answer.status, answer.body.duplicate], [200, false]);
    await eventually(() => ran("res_crashed").length === 1, { what: "the effect to run" });
    assert.deepEqual([(await post("res_crashed")).body.duplicate], [true], "then a repeat");
    assert.equal(ran("res_crashed").length, 1);
  });
});
