// `npm start` as a user runs it (wrangler dev, with this tree's .dev.vars, created from the
// example when absent): `--fresh` starts from no local state; it serves the worker and the
// local stand-ins .dev.vars points at, runs a cron pass when the README's `/__scheduled` URL is
// called, turns off wrangler's inspector Network events (scripts/quiet_inspector.mjs: one
// relayed to wrangler's Node process per event, four or five a subrequest) so a subrequest
// leaves none behind for a DevTools to find, and a SIGTERM to npm stops all of them, leaving no
// process and no listening port behind.
import { describe, it, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import WebSocket from "ws";
import { eachLine, freePort } from "../scripts/local_worker.mjs";
import { eventually } from "./helpers.mjs";

const state = mkdtempSync(path.join(os.tmpdir(), "gemini-once-start-"));
after(() => rmSync(state, { recursive: true, force: true }));

/** Processes whose command line names one of `needles` (this run's state directory or port). */
function processesNaming(...needles) {
  const found = [];
  for (const pid of readdirSync("/proc").filter((p) => /^\d+$/.test(p))) {
    try {
      const cmd = readFileSync(`/proc/${pid}/cmdline`, "utf8").replaceAll("\0", " ");
      if (needles.some((n) => cmd.includes(n))) found.push(`${pid} ${cmd}`);
    } catch { /* gone meanwhile */ }
  }
  return found;
}

const answers = (url) => fetch(url).then(() => true, () => false);

/**
 * Connects to wrangler's inspector proxy at `port` as a DevTools does: the proxy first hands
 * over the runtime's events it kept while none was attached. Resolves to their methods (those
 * before the answer to a command sent once connected), then disconnects.
 */
function keptInspectorEvents(port) {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`ws://127.0.0.1:${port}/ws`);
    const methods = [];
    ws.on("open", () => ws.send(JSON.stringify({ id: 424242, method: "Runtime.getIsolateId" })));
    ws.on("message", (m) => {
      const d = JSON.parse(String(m));
      if (d.method) methods.push(d.method);
      if (d.id === 424242) {
        ws.close();
        resolve(methods);
      }
    });
    ws.on("error", reject);
    ws.on("close", (code) => code !== 1000 && code !== 1005 && reject(new Error(`inspector closed ${code}`)));
  });
}

describe("npm start", () => {
  it("serves the worker, runs a cron pass on /__scheduled, and stops with everything it started on SIGTERM", { timeout: 240000 }, async () => {
    const port = await freePort();
    // State left by an earlier run: --fresh removes it before the worker starts.
    writeFileSync(path.join(state, "left-from-before"), "x");
    // npm start creates .dev.vars when there is none (a fresh checkout): owner-only, since it
    // holds secrets. An existing one is the user's and is left as it is.
    const devVarsFile = fileURLToPath(new URL("../.dev.vars", import.meta.url));
    const created = !existsSync(devVarsFile);
    const npm = spawn("npm", ["start", "--", "--fresh", "--port", String(port), "--ip", "127.0.0.1", "--persist-to", state], { stdio: ["ignore", "pipe", "pipe"] });
    const lines = [];
    eachLine(npm.stdout, (l) => lines.push(l));
    eachLine(npm.stderr, (l) => lines.push(l));
    const exited = new Promise((resolve) => npm.on("exit", resolve));
    try {
      await eventually(() => lines.some((l) => l.includes(`Ready on http://127.0.0.1:${port}`)), { timeoutMs: 200000, everyMs: 500, what: "wrangler dev to be ready" });
      assert.ok(lines.some((l) => l.startsWith("start: --fresh: removed")), lines.join("\n"));
      assert.equal(existsSync(path.join(state, "left-from-before")), false, "the old state is gone");
      if (created) assert.equal(statSync(devVarsFile).mode & 0o777, 0o600, "the .dev.vars npm start made is owner-only");
      const health = await fetch(`http://127.0.0.1:${port}/healthz`);
      assert.equal(health.status, 200, await health.text());
      // The README's cron pass on demand: wrangler dev's --test-scheduled route.
      const [, scheduled] = readFileSync(fileURLToPath(new URL("../README.md", import.meta.url)), "utf8").match(/http:\/\/127\.0\.0\.1:8787(\/__scheduled\?cron=[^"\s]+)/);
      const cron = await fetch(`http://127.0.0.1:${port}${scheduled}`);
      assert.equal(cron.status, 200, await cron.text());
      await eventually(() => lines.some((l) => l.includes('"event":"reconcile_pass"')), { what: "the pass's log line" });
      // A subrequest (the side effect of a completion, POSTed to EFFECT_URL whoever answers
      // there) with the inspector's Network events off leaves none of them behind.
      const quiet = await eventually(() => lines.find((l) => l.startsWith("start: wrangler's inspector at ")), { what: "npm start turning the inspector's Network events off" });
      assert.match(quiet, /Network events turned off/);
      const inspectorPort = Number(quiet.match(/127\.0\.0\.1:(\d+)/)[1]);
      const sent = spawnSync(process.execPath, ["scripts/send.mjs", "batch.succeeded", "batches/start-quiet", "--url", `http://127.0.0.1:${port}`], { cwd: fileURLToPath(new URL("..", import.meta.url)), encoding: "utf8" });
      assert.equal(sent.status, 0, sent.stdout + sent.stderr);
      await eventually(() => lines.some((l) => /"event":"effect_(delivered|failed)".*batches\/start-quiet/.test(l)), { timeoutMs: 30000, what: "the completion's side effect attempted" });
      const kept = await keptInspectorEvents(inspectorPort);
      assert.deepEqual(kept.filter((m) => m.startsWith("Network.")), [], `events kept: ${kept.join(", ")}`);
      const demo = lines.find((l) => l.startsWith("start: demo destination at "));
      if (demo) assert.equal((await fetch("http://127.0.0.1:8788/effects")).status, 200, "the demo destination answers");
      assert.ok(processesNaming(state).length > 0);
    } finally {
      npm.kill("SIGTERM");
    }
    await exited;
    try {
      await eventually(async () => processesNaming(state, `entry=127.0.0.1:${port} `).length === 0 && !(await answers(`http://127.0.0.1:${port}/healthz`)),
        { timeoutMs: 20000, what: "no process of this npm start left, the worker's port closed" });
    } finally {
      // Orphans hold our pipes open and would keep the test running: end them, then fail.
      for (const p of processesNaming(state)) process.kill(Number(p.split(" ")[0]), "SIGTERM");
      npm.stdout.destroy();
      npm.stderr.destroy();
    }
    if (lines.some((l) => l.startsWith("start: demo destination at "))) assert.equal(await answers("http://127.0.0.1:8788/effects"), false, "the demo destination stopped");
  });
});
