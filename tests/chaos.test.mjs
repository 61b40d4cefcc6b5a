// A short chaos run in the test suite: the chaos driver with a fixed seed, about 100
// operations and one hard kill, on the already built worker (npm test builds before the
// integration tests). The full run is `npm run chaos`; see docs/RELIABILITY.md.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const SUMMARY = /^chaos: seed=(\d+) ops=(\d+) deliveries=(\d+) faults=(\d+) effects=(\d+) duplicate_effects=(\d+) explained=(\d+) lost=(\d+) regressions=(\d+) unsettled=(\d+)$/;

test("chaos: seed 7, 100 operations and two results batches, one kill: nothing lost, nothing regressed, every duplicate explained, every result once", { timeout: 200_000 }, async () => {
  // The settle phase waits for every effect, up to 75 s after the load's end (a full run allows
  // 5 minutes); what counts is the state it ends in (nothing lost, nothing unsettled), not when.
  const args = ["scripts/chaos/main.mjs", "--no-build", "--seed", "7", "--ops", "100", "--kills", "1", "--late-after", "75"];
  const child = spawn(process.execPath, args, { cwd: root, stdio: ["ignore", "pipe", "pipe"] });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (c) => { stdout += c; });
  child.stderr.on("data", (c) => { stderr += c; });
  // The driver bounds itself; this is the backstop (SIGTERM lets it kill its worker first).
  const backstop = setTimeout(() => child.kill("SIGTERM"), 190_000);
  const code = await new Promise((resolve) => child.on("exit", (c) => resolve(c)));
  clearTimeout(backstop);
  const lines = stdout.trim().split("\n");
  const last = lines.at(-1);
  const m = SUMMARY.exec(last ?? "");
  assert.ok(m, `last line is the summary; got ${JSON.stringify(last)}\n${stdout}\n${stderr.slice(-3000)}`);
  const [, seed, ops, deliveries, faults, effects, duplicates, explained, lost, regressions, unsettled] = m.slice(0).map(Number);
  const report = `\n${stdout}`;
  assert.equal(seed, 7);
  // The 100 operations asked for, and one batch with results per kill plus one.
  assert.equal(ops, 102);
  assert.ok(deliveries > ops, `deliveries ${deliveries}${report}`);
  assert.ok(faults > 0, `faults injected${report}`);
  assert.ok(effects >= ops, `at least one accepted side effect per operation${report}`);
  assert.equal(lost, 0, `lost${report}`);
  assert.equal(regressions, 0, `regressions${report}`);
  assert.equal(unsettled, 0, `unsettled${report}`);
  assert.equal(explained, duplicates, `every duplicate explained${report}`);
  assert.match(stdout, /kills=1 /, "one hard kill happened");
  const results = /^chaos-results: batches=2 registered_too_late=0 results=(\d+) delivered=(\d+) missing=0 unknown_ids=0 repeats=\d+ job_after_results=2\/2 counts_right=2\/2 /m.exec(stdout);
  assert.ok(results && results[1] === results[2], `every result of both batches delivered once under its id, then the job with its counts${report}`);
  assert.equal(code, 0, `driver exit code${report}\n${stderr.slice(-3000)}`);
});
