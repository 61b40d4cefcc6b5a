// The local stand-ins the bench runs against, in a child process of their own so that answering
// them does not compete with the load generator's event loop: the destination (200 at once, or
// after the delay the parent set: a real destination takes time) and Gemini's status API
// (RUNNING; `batches/done-*` SUCCEEDED), counting what they see; and the parent's handle on them.
import { spawn } from "node:child_process";
import http from "node:http";

import { MAX_DEST_MS, SELF, children, killGroup } from "./common.mjs";
import { send } from "./load.mjs";

/** The destination (200 at once, or after `delayMs`) and Gemini's status API (RUNNING), counting what they see. */
export function runStubs() {
  let stats = freshStats();
  let delayMs = 0;
  function freshStats() {
    return { effects: 0, effectKeys: new Set(), effectRepeats: 0, effectOwnMs: 0, effectOwnMax: 0, polls: 0, pollPaths: new Map(), other: 0 };
  }
  const server = http.createServer((req, res) => {
    const t0 = process.hrtime.bigint();
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const url = req.url;
      if (req.method === "POST" && url.startsWith("/effects")) {
        const key = req.headers["idempotency-key"] ?? "";
        stats.effects++;
        if (stats.effectKeys.has(key)) stats.effectRepeats++;
        else stats.effectKeys.add(key);
        const answer = () => {
          res.writeHead(200, { "content-type": "application/json" });
          res.end('{"ok":true}');
          const own = Number(process.hrtime.bigint() - t0) / 1e6;
          stats.effectOwnMs += own;
          stats.effectOwnMax = Math.max(stats.effectOwnMax, own);
        };
        if (delayMs > 0) setTimeout(answer, delayMs);
        else answer();
        return;
      }
      if (req.method === "POST" && url.startsWith("/probe-effects")) {
        res.writeHead(200, { "content-type": "application/json" });
        return res.end('{"ok":true}');
      }
      if (req.method === "GET" && url.startsWith("/v1beta/")) {
        const p = url.slice("/v1beta/".length);
        stats.polls++;
        stats.pollPaths.set(p, (stats.pollPaths.get(p) ?? 0) + 1);
        res.writeHead(200, { "content-type": "application/json" });
        // Operations named `batches/done-*` have finished (the cost section's cron-recovered
        // completions); every other one is still running.
        const done = p.startsWith("batches/done-");
        const state = done ? "BATCH_STATE_SUCCEEDED" : "BATCH_STATE_RUNNING";
        const metadata = { "@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch", state, updateTime: "2026-11-22T10:00:00Z" };
        if (done) metadata.output = { responsesFile: `files/${p.slice("batches/".length)}` };
        return res.end(JSON.stringify({ name: p, ...(done ? { done: true } : {}), metadata }));
      }
      if (url === "/__delay") {
        // How long the destination takes to answer from now on (ms); the stats are kept.
        const ms = Number(Buffer.concat(chunks).toString());
        if (!Number.isFinite(ms) || ms < 0 || ms > MAX_DEST_MS) {
          res.writeHead(400);
          return res.end("{}");
        }
        delayMs = ms;
        res.writeHead(200);
        return res.end("{}");
      }
      if (url === "/__reset") {
        stats = freshStats();
        res.writeHead(200);
        return res.end("{}");
      }
      if (url.startsWith("/__stats")) {
        const withPaths = url.includes("paths=1");
        res.writeHead(200, { "content-type": "application/json" });
        return res.end(JSON.stringify({
          effects: stats.effects,
          effect_keys: stats.effectKeys.size,
          effect_repeats: stats.effectRepeats,
          effect_own_ms_mean: stats.effects ? stats.effectOwnMs / stats.effects : null,
          effect_own_ms_max: stats.effectOwnMax,
          polls: stats.polls,
          poll_paths: withPaths ? Object.fromEntries(stats.pollPaths) : undefined,
          other: stats.other,
        }));
      }
      stats.other++;
      res.writeHead(404);
      res.end("{}");
    });
  });
  server.keepAliveTimeout = 30_000;
  server.listen(0, "127.0.0.1", () => {
    process.stdout.write(JSON.stringify({ port: server.address().port }) + "\n");
  });
  const stop = () => server.close(() => process.exit(0));
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
  // Never outlive the bench: exit when the parent's pipe closes.
  process.stdin.on("close", () => process.exit(0));
  process.stdin.resume();
}

export async function startStubs() {
  const child = spawn(process.execPath, [SELF, "--_stubs"], { stdio: ["pipe", "pipe", "inherit"], detached: true });
  children.add(child);
  const port = await new Promise((resolve, reject) => {
    let buf = "";
    const timer = setTimeout(() => reject(new Error("stub server did not start")), 10_000);
    child.stdout.on("data", (c) => {
      buf += c;
      const nl = buf.indexOf("\n");
      if (nl >= 0) {
        clearTimeout(timer);
        resolve(JSON.parse(buf.slice(0, nl)).port);
      }
    });
    child.on("exit", (code) => reject(new Error(`stub server exited ${code}`)));
  });
  const base = new URL(`http://127.0.0.1:${port}`);
  const agent = new http.Agent({ keepAlive: true, maxSockets: 2 });
  return {
    pid: child.pid,
    url: base.href.replace(/\/$/, ""),
    async stats(paths = false) {
      return JSON.parse((await send(agent, base, { path: `/__stats${paths ? "?paths=1" : ""}` })).body);
    },
    async reset() {
      await send(agent, base, { method: "POST", path: "/__reset", body: "" });
    },
    /** From now on the destination answers after `ms` (0: at once). */
    async setDestinationDelay(ms) {
      const r = await send(agent, base, { method: "POST", path: "/__delay", body: String(ms) });
      if (r.status !== 200) throw new Error(`destination delay ${ms} ms refused: ${r.status}`);
    },
    stop() {
      agent.destroy();
      killGroup(child, "SIGTERM");
      children.delete(child);
    },
  };
}
