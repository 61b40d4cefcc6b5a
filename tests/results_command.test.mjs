// `npm run results -- list|retry NAME` against the built worker over real HTTP: a batch whose
// destination refuses two results (parked), listed from a shell, counted by a dry run that
// changes nothing, then sent again once the destination accepts them, each once under its
// first webhook-id; a read token may list but not retry; and without --url or --token it
// finds the worker `npm start` wrote down and the tokens of a .dev.vars-shaped file.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { parseArgs } from "../scripts/results.mjs";
import { localWorker, LOCAL_WORKER_URL } from "../scripts/dev_vars.mjs";
import { startWorker, startServer, eventually, sleep, ADMIN_TOKEN, READ_TOKEN } from "./helpers.mjs";
import { startGemini, succeeded, fileOf, split, workerVars } from "./results_stub.mjs";

const exec = promisify(execFile);
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const dir = mkdtempSync(path.join(os.tmpdir(), "results-command-"));
const refuse = new Set(["k3", "k7"]);
let gemini, dest, sink, w;

/** `npm run results -- args` as a user runs it; resolves to {code, out, err}. */
async function results(args, env = {}) {
  try {
    const { stdout, stderr } = await exec("npm", ["run", "--silent", "results", "--", ...args], { cwd: root, env: { ...process.env, ...env }, timeout: 60_000 });
    return { code: 0, out: stdout, err: stderr };
  } catch (e) {
    return { code: e.code, out: e.stdout ?? "", err: e.stderr ?? "" };
  }
}

before(async () => {
  gemini = await startGemini();
  sink = await startServer(() => ({ status: 200 }));
  dest = await startServer((req) => (refuse.has(JSON.parse(req.body).result_key) ? { status: 422 } : { status: 200 }));
  w = await startWorker({ ...workerVars({ dest, gemini, sink }), DESTINATION_OPEN_AFTER: "1000" }, { http: true });
});
after(async () => {
  await w?.dispose();
  await gemini?.close();
  await dest?.close();
  await sink?.close();
  rmSync(dir, { recursive: true, force: true });
});

describe("npm run results", () => {
  const key = "batches/cmd1";

  it("lists the parked results, counts a dry run, then retries each once under its first id", { timeout: 120_000 }, async () => {
    gemini.files.set("files/cmd1", fileOf(10));
    gemini.status.set(key, succeeded(key, { responsesFile: "files/cmd1" }));
    assert.equal((await w.register(key, "other", { results: "each" })).status, 201);
    assert.equal((await w.deliver("batch.succeeded", key)).status, 200);
    const { jobs } = await eventually(() => { const s = split(dest, key); return s.jobs.length > 0 && s; }, { timeoutMs: 60_000, what: "the job effect" });
    assert.deepEqual(jobs[0].body.results, { total: 10, delivered: 8, errors: 0, parked: 2 });
    const firstIds = Object.fromEntries(split(dest, key).results.map((r) => [r.body.result_key, r.id]));

    const listed = await results(["list", key, "--url", w.url, "--token", READ_TOKEN]);
    assert.equal(listed.code, 0, listed.err);
    const lines = listed.out.trim().split("\n");
    assert.deepEqual(lines.slice(0, -1).map((l) => l.match(/result_key=(\S+)/)[1]), ["k3", "k7"], listed.out);
    for (const l of lines.slice(0, -1)) assert.match(l, /^index=\d+ result_key=k\d attempts=1 last_attempt=\d{4}-\d\d-\d\dT[\d:.]+Z last_error=".*422/);
    assert.match(lines.at(-1), new RegExp(`^results: ${key}: 2 parked; send them again: npm run results -- retry ${key}`));

    const delivered = await results(["list", key, "--state", "delivered", "--url", w.url, "--token", READ_TOKEN]);
    assert.match(delivered.out, new RegExp(`^results: ${key}: 8 delivered`, "m"), delivered.out);

    // A read token may look, not act: the worker refuses, and the command says why.
    const notAdmin = await results(["retry", key, "--url", w.url, "--token", READ_TOKEN]);
    assert.equal(notAdmin.code, 1, notAdmin.out);
    assert.match(notAdmin.err, /^results: 403 /m);

    refuse.clear();
    const before = dest.requests.length;
    const dry = await results(["retry", key, "--dry-run", "--url", w.url, "--token", ADMIN_TOKEN]);
    assert.equal(dry.code, 0, dry.err);
    assert.match(dry.out, /dry run: would retry 2 of the 2 parked now; nothing changed/);
    await sleep(1_000);
    assert.equal(dest.requests.length, before, "a dry run sends nothing");
    assert.equal((await w.admin(`/v1/operations/${encodeURIComponent(key)}/results?state=parked`)).body.results.length, 2, "and changes nothing");

    const retried = await results(["retry", key, "--reason", "destination fixed", "--url", w.url, "--token", ADMIN_TOKEN]);
    assert.equal(retried.code, 0, retried.err);
    assert.match(retried.out, /retried 2, each due at once under its first webhook-id$/m);
    // The two results again, then (the counts changed: parked 2 -> 0) the job's effect as a
    // new generation under a new webhook-id, never the old id with another body.
    const after = await eventually(() => {
      const s = split(dest, key);
      return s.results.length >= 12 && s.jobs.length >= 2 && s;
    }, { timeoutMs: 60_000, what: "the parked results again, then the job's new generation" });
    const again = after.results.slice(10);
    assert.deepEqual(again.map((r) => r.body.result_key).sort(), ["k3", "k7"], "each once");
    for (const r of again) assert.equal(r.id, firstIds[r.body.result_key], "under its first webhook-id");
    assert.equal(after.jobs.length, 2, "one new job effect");
    assert.notEqual(after.jobs[1].id, after.jobs[0].id, "under a new webhook-id");
    assert.deepEqual(after.jobs[1].body.results, { total: 10, delivered: 10, errors: 0, parked: 0 });
    const none = await results(["list", key, "--url", w.url, "--token", READ_TOKEN]);
    assert.match(none.out, new RegExp(`^results: ${key}: 0 parked$`, "m"), none.out);
  });

  it("without --url reaches the worker npm start wrote down; without --token, a local worker's tokens", async () => {
    const file = path.join(dir, "local-worker.json");
    // What a running npm start writes: its address and its pid (this process stands in for it).
    writeFileSync(file, JSON.stringify({ url: w.url, pid: process.pid }));
    const listed = await results(["list", key, "--token", READ_TOKEN], { GEMINI_ONCE_LOCAL_WORKER_FILE: file });
    assert.equal(listed.code, 0, listed.err);
    assert.match(listed.out, /0 parked/);
    assert.equal(localWorker(file).url, w.url);
    // A pid that is gone (an npm start killed outright): the file is stale, the default is used.
    writeFileSync(file, JSON.stringify({ url: w.url, pid: 2 ** 22 + 7 }));
    assert.deepEqual(localWorker(file), { url: LOCAL_WORKER_URL, from: "the default" });
    const vars = { READ_TOKENS: "read-a read-b", ADMIN_TOKEN: "admin-a" };
    assert.equal(parseArgs(["list", key, "--url", "http://127.0.0.1:1"], vars).token, "read-a", "list: the read token");
    assert.equal(parseArgs(["retry", key, "--url", "http://127.0.0.1:1"], vars).token, "admin-a", "retry: the admin token");
    assert.equal(parseArgs(["list", key, "--url", "https://gemini-once.example.workers.dev", "--token", "given"], vars).token, "given");
    const remote = await results(["list", key, "--url", "https://gemini-once.example.workers.dev"]);
    assert.equal(remote.code, 2, "a local token never goes to another machine");
    assert.match(remote.err, /give --token/);
  });
});
