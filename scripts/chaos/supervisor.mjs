// The worker process: the built worker in workerd through Miniflare in a child process of its own
// (its own process group, state persisted on disk), started, hard-killed (SIGKILL of the whole
// group) and restarted on the same state; and the child mode that runs it.
import { spawn } from "node:child_process";
import { createServer } from "node:http";
import fs from "node:fs";
import path from "node:path";
import { eachLine, freePort, logObject } from "../local_worker.mjs";

import { SELF, sleep } from "./config.mjs";
import { iso } from "./standins.mjs";

const liveGroups = new Set();
function killGroupSync(pid) {
  try { process.kill(-pid, "SIGKILL"); } catch {}
}
process.on("exit", () => { for (const pid of liveGroups) killGroupSync(pid); });

function groupAlive(pid) {
  try {
    process.kill(-pid, 0);
    return true;
  } catch {
    return false;
  }
}

export class WorkerSupervisor {
  constructor({ dir, bindings, layout, onEvent, logFile }) {
    this.dir = dir;
    this.layout = layout;
    this.bindings = bindings;
    this.onEvent = onEvent;
    this.logStream = fs.createWriteStream(logFile, { flags: "a" });
    this.child = null;
    this.base = null;
    this.generation = 0;
    this.up = false;
  }

  async start() {
    const port = await freePort();
    const controlPort = await freePort();
    this.generation++;
    const cfg = {
      ...this.layout,
      scriptPath: path.join(this.dir, "build", "index.js"),
      persistRoot: path.join(this.dir, "state"),
      port,
      controlPort,
      bindings: this.bindings,
    };
    const cfgPath = path.join(this.dir, `worker-${this.generation}.json`);
    fs.writeFileSync(cfgPath, JSON.stringify(cfg));
    this.logStream.write(`=== worker generation ${this.generation} starting at ${iso(Date.now())}\n`);
    // workerd resolves the module paths from its working directory: run it where build/ is.
    const child = spawn(process.execPath, [SELF, "--worker-child", cfgPath], {
      cwd: this.dir,
      detached: true,
      stdio: ["pipe", "pipe", "pipe"],
    });
    this.child = child;
    liveGroups.add(child.pid);
    const exited = new Promise((resolve) => child.on("exit", (code, signal) => resolve({ code, signal })));
    child.exitedPromise = exited;
    const ready = new Promise((resolve, reject) => {
      eachLine(child.stdout, (line) => {
        if (line.startsWith("CHAOS_WORKER_READY ")) {
          resolve(JSON.parse(line.slice("CHAOS_WORKER_READY ".length)));
          return;
        }
        this.logStream.write(line + "\n");
        const event = logObject(line);
        if (event) this.onEvent(event);
      });
      child.stderr.on("data", (chunk) => this.logStream.write(chunk));
      exited.then(({ code, signal }) => reject(new Error(`worker child exited before ready (code ${code}, signal ${signal})`)));
    });
    const timeout = sleep(30_000).then(() => { throw new Error("worker did not start within 30 s"); });
    const info = await Promise.race([ready, timeout]);
    this.base = info.url.replace(/\/$/, "");
    this.control = info.control;
    this.up = true;
    return this;
  }

  /** SIGKILL of the whole process group (node child and workerd), then wait until it is gone. */
  async kill() {
    const child = this.child;
    if (!child) return;
    this.up = false;
    killGroupSync(child.pid);
    await Promise.race([child.exitedPromise, sleep(10_000)]);
    for (let i = 0; i < 100 && groupAlive(child.pid); i++) await sleep(50);
    if (groupAlive(child.pid)) throw new Error(`process group ${child.pid} survived SIGKILL`);
    liveGroups.delete(child.pid);
    this.child = null;
  }

  async stop() {
    await this.kill();
    await new Promise((r) => this.logStream.end(r));
  }
}

/** Child mode: runs the built worker in workerd with persisted state and an HTTP port. */
export async function workerChild(cfgPath) {
  const cfg = JSON.parse(fs.readFileSync(cfgPath, "utf8"));
  // If the driver goes away (its end of stdin closes) or after an hour at most, this process
  // kills its own group, workerd included.
  const die = () => { try { process.kill(-process.pid, "SIGKILL"); } catch {} process.exit(1); };
  process.stdin.on("end", die);
  process.stdin.on("close", die);
  process.stdin.resume();
  setTimeout(die, 3_600_000).unref();
  const { Miniflare } = await import("miniflare");
  const mf = new Miniflare({
    modules: true,
    scriptPath: cfg.scriptPath,
    modulesRules: [{ type: "CompiledWasm", include: ["**/*.wasm"] }],
    compatibilityDate: cfg.compatibilityDate,
    kvNamespaces: cfg.kvNamespaces,
    durableObjects: cfg.durableObjects,
    queueProducers: cfg.queueProducers,
    queueConsumers: cfg.queueConsumers,
    bindings: cfg.bindings,
    defaultPersistRoot: cfg.persistRoot,
    host: "127.0.0.1",
    port: cfg.port,
    unsafeTriggerHandlers: true,
    handleRuntimeStdio(stdout, stderr) {
      stdout.pipe(process.stdout);
      stderr.pipe(process.stderr);
    },
  });
  const url = await mf.ready;
  // A small control server: lists the KV ledger with metadata for the final check.
  const control = createServer(async (req, res) => {
    try {
      const u = new URL(req.url, "http://x");
      const kv = await mf.getKVNamespace("OPS_KV");
      const all = [];
      let cursor;
      for (let page = 0; page < 1000; page++) {
        const r = await kv.list({ prefix: u.searchParams.get("prefix") ?? "", cursor });
        all.push(...r.keys);
        if (r.list_complete) break;
        cursor = r.cursor;
      }
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify(all));
    } catch (e) {
      res.writeHead(500);
      res.end(String(e));
    }
  });
  await new Promise((r) => control.listen(cfg.controlPort, "127.0.0.1", r));
  process.stdout.write(`CHAOS_WORKER_READY ${JSON.stringify({ url: String(url), control: `http://127.0.0.1:${cfg.controlPort}` })}\n`);
}
