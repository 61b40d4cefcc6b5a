// `npm start` after the build: runs `wrangler dev --test-scheduled` with the given arguments
// and, in this same process, the local stand-ins .dev.vars points at: the demo destination
// (scripts/receive.mjs) when EFFECT_URL is http://127.0.0.1:8788/effects, the Gemini stub
// (scripts/gemini_stub.mjs) when GEMINI_API_BASE is http://127.0.0.1:8789. They live and die
// with this process, and this process with wrangler: Ctrl-C, SIGTERM (to npm or to this
// process) or the end of its parent stops wrangler, then exits, so nothing is left listening.
// `--fresh` first removes the local state (the `--persist-to` directory, else .wrangler/state):
// operations, ledger, counters, so the quick start's demo runs as the first time. The demo
// destination's lines are set apart from the worker's JSON log lines (a blank line before,
// bold on a terminal), so they can be found among them.
import { spawn } from "node:child_process";
import { rmSync, existsSync } from "node:fs";
import { constants } from "node:os";
import path from "node:path";
import { devVars, ROOT, DEMO_EFFECT_URL, GEMINI_STUB_URL } from "./dev_vars.mjs";
import { effectReceiver, listen } from "./receive.mjs";
import { geminiStub } from "./gemini_stub.mjs";

const vars = devVars();
const argv = process.argv.slice(2);
if (argv.includes("--fresh")) {
  argv.splice(argv.indexOf("--fresh"), 1);
  const at = argv.indexOf("--persist-to");
  const state = path.resolve(ROOT, at >= 0 && argv[at + 1] ? argv[at + 1] : ".wrangler/state");
  const had = existsSync(state);
  rmSync(state, { recursive: true, force: true });
  console.log(`start: --fresh: ${had ? `removed ${path.relative(ROOT, state) || state}` : "no local state yet"}; the worker starts with no operations, ledger or counters`);
}
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

if (same(vars.EFFECT_URL, DEMO_EFFECT_URL)) {
  await beside("demo destination", DEMO_EFFECT_URL, () => effectReceiver(vars.EFFECT_SIGNING_SECRET, { log: (line) => console.log(standOut(`receive: ${line}`)) }),
    " (prints each side effect; EFFECT_URL in .dev.vars)");
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
wrangler.on("exit", (code, signal) => process.exit(code ?? 128 + (constants.signals[signal] ?? 0)));
