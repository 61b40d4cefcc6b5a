// `npm start` after the build: runs `wrangler dev --test-scheduled` with the given arguments
// and, in this same process, the local stand-ins .dev.vars (or the `--env-file` given to
// wrangler) points at: the demo destination
// (scripts/receive.mjs) when EFFECT_URL is on this machine (127.0.0.1, localhost, [::1]) and
// nothing listens at its port yet (your own receiver started first keeps it), the Gemini stub
// (scripts/gemini_stub.mjs) when GEMINI_API_BASE is http://127.0.0.1:8789. They live and die
// with this process, and this process with wrangler: Ctrl-C, SIGTERM (to npm or to this
// process) or the end of its parent stops wrangler, then exits, so nothing is left listening.
// The worker's port (8787, or `--port N`) must be free: wrangler would move to another port
// without a word, and every command would reach whatever holds 8787, so it stops and says so
// instead. Once the worker answers, it prints its address and writes it to
// .wrangler/local-worker.json, where `register`, `send` and `results` find it (removed on exit).
// `--fresh` first removes the local state (the `--persist-to` directory, else .wrangler/state):
// operations, ledger, counters, so the quick start's demo runs as the first time. Once the
// worker answers, wrangler's inspector (on `--inspector-port`, a free port unless given) is
// kept from relaying a flood of Network events while no DevTools is open
// (scripts/quiet_inspector.mjs: it halved a batch's results rate). The demo
// destination's lines are set apart from the worker's JSON log lines (a blank line before,
// bold on a terminal), so they can be found among them.
import { spawn } from "node:child_process";
import { rmSync, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import net from "node:net";
import { constants } from "node:os";
import path from "node:path";
import { devVars, isLoopback, ROOT, GEMINI_STUB_URL, LOCAL_WORKER_FILE, LOCAL_WORKER_URL } from "./dev_vars.mjs";
import { effectReceiver, listen } from "./receive.mjs";
import { geminiStub } from "./gemini_stub.mjs";
import { keepQuiet } from "./quiet_inspector.mjs";

const argv = process.argv.slice(2);
// wrangler dev reads its settings from .dev.vars, or only from the files `--env-file` names
// (later ones winning): read the same, so the stand-ins follow what the worker is given.
const envFiles = argv.flatMap((a, i) => (a === "--env-file" ? [argv[i + 1]] : a.startsWith("--env-file=") ? [a.slice(11)] : [])).filter(Boolean);
const vars = envFiles.length ? Object.assign({}, ...envFiles.map((f) => devVars(path.resolve(ROOT, f)))) : devVars();
/** The value of `--name N` or `--name=N` in argv, or undefined. */
function option(name) {
  const at = argv.findIndex((a) => a === name || a.startsWith(`${name}=`));
  if (at < 0) return undefined;
  return argv[at].includes("=") ? argv[at].slice(name.length + 1) : argv[at + 1];
}

/** A port free on 127.0.0.1 now. */
function freePort() {
  return new Promise((resolve) => {
    const probe = net.createServer();
    probe.listen(0, "127.0.0.1", () => {
      const { port: free } = probe.address();
      probe.close(() => resolve(free));
    });
  });
}

/** Resolves to the reason `port` cannot be listened on at `host`, or null when it can. */
function taken(host, port) {
  return new Promise((resolve) => {
    const probe = net.createServer();
    probe.once("error", (e) => resolve(e.code === "EADDRINUSE" ? "something already listens there" : e.message));
    probe.listen(port, host, () => probe.close(() => resolve(null)));
  });
}

const port = Number(option("--port") ?? new URL(LOCAL_WORKER_URL).port);
const ip = option("--ip");
// wrangler's own default is localhost; 127.0.0.1 is what the commands call.
for (const host of new Set(["127.0.0.1", ...(ip && ip !== "localhost" ? [ip] : [])])) {
  const why = Number.isInteger(port) && port > 0 ? await taken(host, port) : null;
  if (why) {
    console.error(`start: not starting: port ${port} on ${host} is taken (${why}; another npm start?). Stop what holds it, or choose another port: npm start -- --port 8790 (register, send and results then find the worker there, through ${path.relative(ROOT, LOCAL_WORKER_FILE)})`);
    process.exit(1);
  }
}
// Only once the port is known to be free: a start that stops removes nothing.
if (argv.includes("--fresh")) {
  argv.splice(argv.indexOf("--fresh"), 1);
  const at = argv.indexOf("--persist-to");
  const state = path.resolve(ROOT, at >= 0 && argv[at + 1] ? argv[at + 1] : ".wrangler/state");
  const had = existsSync(state);
  rmSync(state, { recursive: true, force: true });
  console.log(`start: --fresh: ${had ? `removed ${path.relative(ROOT, state) || state}` : "no local state yet"}; the worker starts with no operations, ledger or counters`);
}
if (option("--port") === undefined) argv.push("--port", String(port));
// wrangler's inspector proxy, on a port known here: its flood of Network events is turned off
// once the worker answers (scripts/quiet_inspector.mjs).
const inspectorPort = Number(option("--inspector-port") ?? (await freePort()));
if (option("--inspector-port") === undefined) argv.push("--inspector-port", String(inspectorPort));
const workerUrl = `http://${ip && ip !== "0.0.0.0" && ip !== "localhost" ? (ip.includes(":") ? `[${ip}]` : ip) : "127.0.0.1"}:${port}`;

const standOut = process.stdout.isTTY ? (line) => `\n\x1b[1m${line}\x1b[0m` : (line) => `\n${line}`;
const same = (a, b) => (a ?? "").replace(/\/+$/, "") === b;

async function beside(what, url, makeHandler, hint) {
  try {
    await listen(makeHandler(), Number(new URL(url).port));
    console.log(`start: ${what} at ${url}${hint}`);
  } catch (e) {
    console.log(`start: not starting the ${what} at ${url}: ${e.code === "EADDRINUSE" ? "something already listens there" : e.message}`);
  }
}

// The demo destination listens on 127.0.0.1, so it serves an EFFECT_URL there or at localhost.
if (vars.EFFECT_URL && isLoopback(vars.EFFECT_URL) && new URL(vars.EFFECT_URL).hostname !== "[::1]" && new URL(vars.EFFECT_URL).protocol === "http:") {
  const at = new URL(vars.EFFECT_URL);
  const effectPort = Number(at.port || 80);
  if (effectPort === port) console.log(`start: EFFECT_URL is ${vars.EFFECT_URL}, the worker's own port: not starting the demo destination (point EFFECT_URL at another port)`);
  else {
    try {
      await listen(effectReceiver(vars.EFFECT_SIGNING_SECRET, { log: (line) => console.log(standOut(`receive: ${line}`)) }), effectPort);
      console.log(`start: demo destination at ${vars.EFFECT_URL} (prints each side effect; EFFECT_URL in .dev.vars)`);
    } catch (e) {
      // Your own receiver, started first, listens there: the effects go to it.
      console.log(`start: EFFECT_URL is ${vars.EFFECT_URL}: ${e.code === "EADDRINUSE" ? "something already listens there (your receiver?); side effects go to it" : `cannot listen there (${e.message})`} (no demo destination)`);
    }
  }
} else {
  console.log(`start: EFFECT_URL is ${vars.EFFECT_URL}; side effects go there (no demo destination)`);
}
if (same(vars.GEMINI_API_BASE, GEMINI_STUB_URL)) {
  await beside("Gemini stub", GEMINI_STUB_URL, () => geminiStub({ log: (line) => console.log(`gemini-stub: ${line}`) }).handler,
    " (GEMINI_API_BASE; mark an operation done with npm run gemini-stub -- done NAME)");
}

// wrangler dev runs the [build] command once more as soon as its watcher on src/ is ready,
// saying "The file src changed, restarting build..." though nothing changed: build.sh finds
// build/ fresh and returns at once.
console.log("start: wrangler's \"The file src changed, restarting build...\" at start is its own re-run of the build once it watches src/; nothing changed (the build is skipped)");
const wrangler = spawn(path.join(ROOT, "node_modules/.bin/wrangler"), ["dev", "--test-scheduled", ...argv], { cwd: ROOT, stdio: "inherit" });
let stopping = false;
function stop() {
  if (stopping) return;
  stopping = true;
  wrangler.kill("SIGTERM");
  setTimeout(() => wrangler.kill("SIGKILL"), 10000).unref();
}
for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"]) process.on(signal, stop);
// `npm start` runs this under a shell that dies on SIGTERM without passing it on, which would
// leave this process and wrangler running: follow the parent, and stop when it is gone.
const parent = process.ppid;
setInterval(() => process.ppid !== parent && stop(), 500).unref();
wrangler.on("error", (e) => {
  console.error(`start: cannot run wrangler (${e.message}); run npm install first`);
  process.exit(1);
});
/** Removes LOCAL_WORKER_FILE if this process wrote it. */
function forget() {
  try {
    if (JSON.parse(readFileSync(LOCAL_WORKER_FILE, "utf8")).pid === process.pid) rmSync(LOCAL_WORKER_FILE, { force: true });
  } catch { /* not there, or another npm start's */ }
}
wrangler.on("exit", (code, signal) => {
  forget();
  process.exit(code ?? 128 + (constants.signals[signal] ?? 0));
});

// The worker's address, said once it answers there (any HTTP answer: /healthz is 503 until
// the settings are complete), and kept for the commands that default to the local worker.
(async () => {
  while (!stopping) {
    const answered = await fetch(`${workerUrl}/healthz`, { signal: AbortSignal.timeout(2000) }).then((r) => r.body?.cancel().then(() => true, () => true) ?? true, () => false);
    if (answered) {
      mkdirSync(path.dirname(LOCAL_WORKER_FILE), { recursive: true });
      writeFileSync(LOCAL_WORKER_FILE, JSON.stringify({ url: workerUrl, pid: process.pid }) + "\n");
      console.log(standOut(`start: the worker listens at ${workerUrl} (npm run register, send and results go there: ${path.relative(ROOT, LOCAL_WORKER_FILE)})`));
      keepQuiet(inspectorPort, {
        stopped: () => stopping,
        onFirst: (how) => console.log(`start: wrangler's inspector at 127.0.0.1:${inspectorPort}: ${how === "quiet" ? "its per-subrequest Network events turned off while no DevTools is open (scripts/quiet_inspector.mjs)" : "a DevTools is attached; its Network events left on"}`),
      });
      return;
    }
    await new Promise((r) => setTimeout(r, 500));
  }
})();
