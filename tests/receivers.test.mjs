// The example receivers (examples/receivers/) against the built worker in workerd: the Python
// one (FastAPI, `standardwebhooks`, SQLite) as a real uvicorn process, and the TypeScript
// Worker (`standardwebhooks`, D1) bundled with the esbuild wrangler ships and run in a workerd
// of its own. Between the worker and each receiver runs a link that forwards every effect and
// loses one answer (the connection drops after the receiver answered), so the worker sends the
// same webhook-id again. Each effect runs once; the repeat is answered 2xx and not run again;
// a forged signature is answered 401 and runs nothing; a redelivery, a new webhook-id, runs.
// The Python dependencies come from scripts/setup-receivers.sh (.venv-receivers/).
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
import { startWorker, eventually, assertEffectValid, EFFECT_SECRET, GEMINI_SECRET } from "./helpers.mjs";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const examples = path.join(root, "examples/receivers");
const python = path.join(root, ".venv-receivers/bin/python");
const PROCESSED = /processed webhook-id=(\S+) key=(\S+) generation=(\d+) status=(\S+)/;

/**
 * The link from the worker to `target`: forwards each effect, records it with the receiver's
 * answer, and for the keys in `lose` destroys the connection after the receiver's first answer.
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
      const key = headers["idempotency-key"];
      if (lose.has(key) && !lost.has(key)) {
        lost.add(key);
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
    close: () => new Promise((r) => { server.closeAllConnections(); server.close(r); }),
  };
}

/** The Python receiver under uvicorn on a free port, its SQLite file in `dir`. */
async function startPythonReceiver(dir) {
  assert.ok(existsSync(python), "no .venv-receivers: run bash scripts/setup-receivers.sh");
  const port = await freePort();
  const db = path.join(dir, "effects.sqlite3");
  const lines = [];
  const child = spawn(python, ["-m", "uvicorn", "--app-dir", path.join(examples, "python"), "receiver:app", "--host", "127.0.0.1", "--port", String(port)], {
    env: { ...process.env, EFFECT_SIGNING_SECRET: EFFECT_SECRET, RECEIVER_DB: db },
    stdio: ["ignore", "pipe", "pipe"],
  });
  eachLine(child.stdout, (l) => lines.push(l));
  eachLine(child.stderr, (l) => lines.push(l));
  await eventually(() => lines.some((l) => l.includes("Uvicorn running on")), { what: "uvicorn to listen", timeoutMs: 30_000 });
  const query = "import json, sqlite3, sys; print(json.dumps(sqlite3.connect(sys.argv[1]).execute('SELECT webhook_id, idempotency_key, generation FROM effects ORDER BY received_at').fetchall()))";
  return {
    url: `http://127.0.0.1:${port}`,
    lines,
    async rows() {
      const out = spawnSync(python, ["-c", query, db], { encoding: "utf8" });
      assert.equal(out.status, 0, out.stderr);
      return JSON.parse(out.stdout).map(([webhook_id, idempotency_key, generation]) => ({ webhook_id, idempotency_key, generation }));
    },
    async close() {
      child.kill();
      await new Promise((r) => (child.exitCode !== null ? r() : child.once("exit", r)));
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
      const { results } = await db.prepare("SELECT webhook_id, idempotency_key, generation FROM effects ORDER BY received_at").all();
      return results;
    },
    close: () => mf.dispose(),
  };
}

const now = () => Math.floor(Date.now() / 1000);

/** One receiver behind the worker: the same scenario for each. */
function scenario(name, start, prefix) {
  describe(name, () => {
    let dir, receiver, link, w;
    const key = (s) => `batches/${prefix}-${s}`;
    const processed = () => receiver.lines.map((l) => l.match(PROCESSED)).filter(Boolean)
      .map(([, webhookId, k, generation]) => ({ webhookId, key: k, generation: Number(generation) }));
    const post = async (headers, body) => {
      const res = await fetch(`${receiver.url}/effects`, { method: "POST", headers: { ...headers, "content-type": "application/json" }, body });
      return { status: res.status, body: await res.json() };
    };

    before(async () => {
      dir = mkdtempSync(path.join(os.tmpdir(), "receivers-"));
      receiver = await start(dir);
      link = await startLink(receiver.url, new Set([key("lost")]));
      w = await startWorker({ EFFECT_URL: `${link.url}/effects`, EFFECT_RETRY_BASE_SECONDS: "1", UNREGISTERED_HOLD_SECONDS: "0" });
    });
    after(async () => {
      await w?.dispose();
      await link?.close();
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
      const again = await eventually(() => processed().find((p) => p.key === key("a") && p.generation === 2), { what: "the redelivery to run", timeoutMs: 30_000 });
      const [first, second] = link.to(key("a"));
      assert.equal(second.headers["effect-generation"], "2");
      assert.notEqual(second.headers["webhook-id"], first.headers["webhook-id"]);
      assert.equal(again.webhookId, second.headers["webhook-id"]);
      const rows = await receiver.rows();
      assert.deepEqual(rows.filter((x) => x.idempotency_key === key("a")).map((x) => Number(x.generation)), [1, 2]);
      assert.equal(new Set(processed().map((p) => p.webhookId)).size, processed().length, "no webhook-id ran twice");
    });
  });
}

scenario("the Python receiver (FastAPI, standardwebhooks, SQLite)", startPythonReceiver, "py");
scenario("the TypeScript Worker receiver (standardwebhooks, D1)", startWorkerReceiver, "ts");
