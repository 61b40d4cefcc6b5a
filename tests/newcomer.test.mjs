// What a new user meets first, checked as they would meet it: the README's quick start (one
// port for the worker throughout), `.dev.vars.example` (each setting once), the worker started
// from that example (its /healthz warns about what works but should not stay so), the Deploy
// section (the two commands, then registering operations), and every shell command the README
// shows: the loop, the reconciliation walk-through and registering from a shell are run here
// as written, against the built worker started from `.dev.vars.example`; every other command
// is named with the test that runs it; every `npm run` and `npm start` is a script whose usage
// takes each flag the README passes it; every `curl` calls a route the worker serves.
//
// What running "as written" changes, and only that: the worker listens on a free port instead
// of 8787 (`localhost:8787` and the deployed `https://gemini-once.<you>.workers.dev` become its
// address; `npm run register` and `npm run send` to the local worker get `--url` for it, and the
// example's secret and tokens, which they would read from a `.dev.vars` copied from it, while a
// checkout's own `.dev.vars` may hold others); `export GEMINI_ONCE_REGISTER_TOKEN=...` sets the
// example's register token in place of the placeholder; the stub listens on a free
// port (`npm run gemini-stub -- done` gets `--port` for it); and wrangler dev's
// `/__scheduled?cron=...` route, which Miniflare does not serve, becomes a scheduled event with
// that cron (tests/start.test.mjs calls the route itself, under `npm start`).
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFile, spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import YAML from "yaml";
import { devVars, LOCAL_WORKER_URL, DEMO_EFFECT_URL, GEMINI_STUB_URL } from "../scripts/dev_vars.mjs";
import { eachLine, freePort } from "../scripts/local_worker.mjs";
import { effectReceiver, listen } from "../scripts/receive.mjs";
import { startWorker, eventually } from "./helpers.mjs";

const run = promisify(execFile);
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const read = (file) => readFileSync(path.join(root, file), "utf8");
const readme = read("README.md");
const pkg = JSON.parse(read("package.json"));
const example = devVars(path.join(root, ".dev.vars.example"));
const firstOf = (list) => list?.split(/\s+/).find(Boolean);

const section = (title) => {
  const start = readme.indexOf(`\n## ${title}\n`);
  assert.ok(start >= 0, `README has no ## ${title}`);
  const end = readme.indexOf("\n## ", start + 1);
  return readme.slice(start, end === -1 ? undefined : end);
};

/** `command` without its trailing shell comment (an unquoted `#` that starts a word). */
function code(command) {
  let quote = null;
  for (let i = 0; i < command.length; i++) {
    const c = command[i];
    if (quote) { if (c === quote) quote = null; }
    else if (c === "'" || c === '"') quote = c;
    else if (c === "#" && (i === 0 || /\s/.test(command[i - 1]))) return command.slice(0, i).trimEnd();
  }
  return command.trimEnd();
}

/**
 * The README's fenced blocks of `lang`, each with the heading it sits under (the nearest `##`
 * or `###`) and its lines; for shell blocks, one command per entry (`\` continuations joined,
 * comment-only lines left out).
 */
function blocks(lang) {
  const found = [];
  let heading = "";
  const lines = readme.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const h = lines[i].match(/^#{2,3} (.*)/);
    if (h) heading = h[1];
    if (lines[i] !== "```" + lang) continue;
    const body = [];
    for (i++; lines[i] !== "```"; i++) body.push(lines[i]);
    if (lang !== "sh") { found.push({ heading, lines: body }); continue; }
    const commands = [];
    for (const line of body.join("\n").replace(/\\\n\s*/g, "").split("\n")) {
      if (code(line).trim()) commands.push(line.trim());
    }
    found.push({ heading, lines: commands });
  }
  return found;
}
const shell = blocks("sh");
const commandsUnder = (heading) => {
  const found = shell.filter((b) => b.heading === heading).flatMap((b) => b.lines);
  assert.ok(found.length > 0, `no shell block under "${heading}"`);
  return found;
};

// The sections whose commands the tests below run, in order, as a user would.
const LOOP = "The loop: register, send, see the effect once";
const RECONCILE = "Try reconciliation: a completion that never arrives";
const FROM_A_SHELL = "Registering operations from your code";
const RESULTS = "A batch's results, each its own side effect";

describe("a newcomer's first steps", () => {
  it("the quick start talks to the worker on one port, the one npm start serves", () => {
    const quick = section("Quick start");
    const ports = new Set([...quick.matchAll(/(?:127\.0\.0\.1|localhost):(\d+)/g)].map((m) => m[1]));
    const known = new Map([[new URL(LOCAL_WORKER_URL).port, "the worker"], [new URL(DEMO_EFFECT_URL).port, "the demo destination"], [new URL(GEMINI_STUB_URL).port, "the Gemini stub"]]);
    for (const port of ports) assert.ok(known.has(port), `the quick start uses port ${port}, which npm start does not serve by default`);
    assert.ok(ports.has("8787"), "the worker's own address is in the quick start");
    assert.match(quick, /npm start -- --fresh/, "a way to start from no state");
  });

  it(".dev.vars.example lists each setting once", () => {
    const names = read(".dev.vars.example").split("\n")
      .map((l) => l.replace(/^#\s*/, "").match(/^([A-Z][A-Z0-9_]*)=/)?.[1])
      .filter(Boolean);
    const twice = names.filter((n, i) => names.indexOf(n) !== i);
    assert.deepEqual(twice, []);
    assert.ok(names.length > 20);
  });

  it("the worker run from .dev.vars.example says in /healthz that alerts go nowhere and nudges cannot be confirmed", async () => {
    assert.equal(example.ALERT_URL, undefined);
    assert.equal(example.GEMINI_API_KEY, undefined);
    const w = await startWorker({ ...example, STATS_FLUSH_SECONDS: undefined });
    try {
      const health = await w.json("/healthz");
      assert.equal(health.status, 200, JSON.stringify(health.body));
      const warnings = health.body.warnings ?? [];
      assert.ok(warnings.some((x) => x.startsWith("ALERT_URL is not set")), JSON.stringify(warnings));
      assert.ok(warnings.some((x) => x.startsWith("DYNAMIC_WEBHOOKS is true but GEMINI_API_KEY is not set")), JSON.stringify(warnings));
    } finally {
      await w.dispose();
    }
  });

  it("the Deploy section is the two commands, then registering operations, and says what a Free plan and Access need", () => {
    const deploy = section("Deploy");
    const at = (s) => deploy.indexOf(s);
    assert.ok(at("npm run deploy") >= 0 && at("npm run deploy") < at("npm run connect -- --url"), "deploy, then connect");
    assert.ok(at("npm run connect -- --url") < at("register operations as you submit them"));
    assert.match(deploy, /RECONCILE_BUDGET=45/);
    assert.match(deploy, /Cloudflare Access/);
    assert.doesNotMatch(deploy, /"batch\.cancelled"|"interaction\.cancelled"/, "no subscription to events the SDK does not list");
  });

  it("the local tokens the README uses are the ones .dev.vars.example sets, one of each scope", () => {
    assert.equal(firstOf(example.REGISTER_TOKENS), "local-register-token");
    assert.equal(firstOf(example.READ_TOKENS), "local-read-token");
    assert.equal(firstOf(example.ADMIN_TOKEN), "local-admin-token");
    for (const token of ["local-register-token", "local-read-token", "local-admin-token"]) assert.ok(readme.includes(token), token);
  });
});

describe("the README's loop, run as written", () => {
  let w, receiver, stub, stubPort, host;
  const received = [];
  const stubLines = [];
  let env;

  before(async () => {
    stubPort = await freePort();
    stub = spawn(process.execPath, ["scripts/gemini_stub.mjs", "--port", String(stubPort)], { cwd: root, stdio: ["ignore", "pipe", "inherit"] });
    eachLine(stub.stdout, (line) => stubLines.push(line));
    await eventually(() => stubLines.some((l) => l.includes(`status API at http://127.0.0.1:${stubPort}`)), { what: "the stub to listen" });
    receiver = await listen(effectReceiver(example.EFFECT_SIGNING_SECRET, { log: (line) => received.push(line) }), 0);
    // The .dev.vars lines the reconciliation walk-through adds, with the stub at its port.
    const added = {};
    const [ini] = blocks("ini").filter((b) => b.heading === RECONCILE);
    assert.ok(ini, "the walk-through shows the .dev.vars lines it adds");
    for (const line of ini.lines) {
      const [, name, value] = line.match(/^([A-Z][A-Z0-9_]*)=(.*)$/) ?? assert.fail(`not a NAME=value line: ${line}`);
      assert.ok(read(".dev.vars.example").includes(`${name}=`), `${name} is a setting of .dev.vars.example`);
      added[name] = value;
    }
    assert.equal(added.GEMINI_API_BASE, GEMINI_STUB_URL, "the stub's address, where npm start runs it");
    added.GEMINI_API_BASE = `http://127.0.0.1:${stubPort}`;
    w = await startWorker({ ...example, STATS_FLUSH_SECONDS: undefined, ...added, EFFECT_URL: `http://127.0.0.1:${receiver.address().port}/effects` }, { http: true });
    host = new URL(w.url).host;
    env = { ...process.env, GEMINI_ONCE_REGISTER_TOKEN: undefined };
    delete env.GEMINI_ONCE_REGISTER_TOKEN;
  });
  after(async () => {
    await w?.dispose();
    stub?.kill();
    receiver?.closeAllConnections();
    receiver?.close();
  });

  /** Runs one README command as written here (see the header); resolves to {code, out, err}. */
  async function sh(command) {
    let c = code(command)
      .replaceAll("https://gemini-once.<you>.workers.dev", w.url)
      .replace(/\b(?:localhost|127\.0\.0\.1):8787\b/g, host);
    const exported = c.match(/^export ([A-Z_]+)=(.*)$/);
    if (exported) {
      assert.equal(exported[1], "GEMINI_ONCE_REGISTER_TOKEN", "the one variable the README exports");
      assert.equal(exported[2], "...", "a placeholder for one of REGISTER_TOKENS");
      env[exported[1]] = firstOf(example.REGISTER_TOKENS);
      return { code: 0, out: "", err: "" };
    }
    const scheduled = c.match(/^curl "?http:\/\/[^/]+\/__scheduled\?cron=([^"\s]+)"?$/);
    if (scheduled) {
      const cron = decodeURIComponent(scheduled[1].replaceAll("+", " "));
      assert.ok(read("wrangler.toml").includes(`crons = ["${cron}"]`), `the cron the worker runs deployed: ${cron}`);
      await w.scheduled(cron);
      return { code: 0, out: "", err: "" };
    }
    if (/^npm run register -- /.test(c) && !c.includes(" --url ")) c += ` --url ${w.url} --token ${firstOf(example.REGISTER_TOKENS)}`;
    if (/^npm run send -- /.test(c)) c += ` --url ${w.url} --secret ${firstOf(example.GEMINI_WEBHOOK_SECRETS)} --token ${firstOf(example.READ_TOKENS)}`;
    if (/^npm run gemini-stub -- done /.test(c)) c += ` --port ${stubPort}`;
    assert.match(c, /^(npm run (register|send|gemini-stub) -- |curl )/, `a command this test knows how to run: ${command}`);
    try {
      const { stdout, stderr } = await run("bash", ["-c", c], { cwd: root, env, timeout: 60_000 });
      return { code: 0, out: stdout, err: stderr };
    } catch (e) {
      return { code: e.code, out: e.stdout ?? "", err: `${e.stderr ?? ""}${e.message}` };
    }
  }
  const json = (out) => JSON.parse(out.trim());
  const effectsFor = (key) => received.filter((l) => l.includes(`key=${key} `));
  /** The line the README shows the demo destination printing for `key`, up to its `…` or `...`. */
  const shownLine = (key) => {
    const line = readme.split("\n").map((l) => l.replace(/^`|`\)?\.?$/g, "")).find((l) => l.includes(`receive: verified new key=${key} `))
      ?? assert.fail(`the README shows the destination's line for ${key}`);
    return line.replace(/^.*receive: /, "").replace(/(…|\.\.\.).*$/, "");
  };

  it("register, send five times, read the record: one applied, four dropped as duplicates, one effect", async () => {
    const [register, send, curl, ...rest] = commandsUnder(LOOP);
    assert.deepEqual(rest, [], "three commands");
    const registered = await sh(register);
    assert.equal(registered.code, 0, registered.err);
    assert.match(registered.out, /201/, registered.out);

    const sent = await sh(send);
    assert.equal(sent.code, 0, sent.err);
    const answers = sent.out.split("\n").filter((l) => /^#\d+ /.test(l)).map((l) => JSON.parse(l.slice(l.indexOf("{"))));
    assert.equal(answers.length, 5, sent.out);
    assert.equal(answers.filter((a) => a.outcome === "applied").length, 1, sent.out);
    assert.deepEqual(answers.filter((a) => a.outcome !== "applied").map((a) => `${a.outcome} ${a.reason}`), Array(4).fill("dropped duplicate"), sent.out);
    assert.match(sent.err, /effect: delivered to the destination/, sent.err);

    const record = json((await sh(curl)).out);
    assert.equal(record.status, "succeeded", JSON.stringify(record));
    assert.equal(record.settled_by, "webhook");
    assert.equal(record.effect_done, true);
    const lines = effectsFor("batches/demo1");
    assert.equal(lines.length, 1, lines.join("\n"));
    assert.ok(lines[0].startsWith(shownLine("batches/demo1")), `${lines[0]}\nas the README shows it:\n${shownLine("batches/demo1")}`);

    // "... --fresh-ids sends the completion again under a new webhook-id (...: dropped as a
    // duplicate all the same)".
    const [, anew] = readme.match(/`(npm run send -- batch\.succeeded batches\/demo1 --fresh-ids)`/) ?? assert.fail("the README's --fresh-ids example");
    const resent = await sh(anew);
    assert.equal(resent.code, 0, resent.err);
    const answer = JSON.parse(resent.out.split("\n").find((l) => /^#1 /.test(l)).replace(/^[^{]*/, ""));
    assert.deepEqual([answer.outcome, answer.reason], ["dropped", "duplicate"], resent.out);
    assert.ok(!resent.out.includes(sent.out.match(/ (msg_\w+) /)[1]), "a new webhook-id");
    // It says the effect went out earlier, not that this send delivered it.
    assert.match(resent.err, /^this send applied nothing: the worker had already applied this completion/m, resent.err);
    assert.match(resent.err, /^effect: delivered to the destination earlier, not by this send/m, resent.err);
    assert.doesNotMatch(resent.err, /^effect: delivered to the destination(?! earlier)/m, resent.err);
    await new Promise((resolve) => setTimeout(resolve, 500));
    assert.equal(effectsFor("batches/demo1").length, 1, "no second effect");
  });

  it("reconciliation: the stub says running until marked done, then one cron pass settles it and the effect arrives once", async () => {
    const [register, done, pass, curl, ...rest] = commandsUnder(RECONCILE);
    assert.deepEqual(rest, [], "four commands");
    const registered = await sh(register);
    assert.equal(registered.code, 0, registered.err);
    await w.ledger("batches/demo2");
    // "A pass before `done` finds it running and settles nothing."
    await sh(pass);
    assert.ok(stubLines.includes("gemini-stub: GET batches/demo2: running"), stubLines.join("\n"));
    assert.equal(json((await sh(curl)).out).settled_by, null);

    const marked = await sh(done);
    assert.equal(marked.code, 0, marked.err);
    await sh(pass);
    assert.ok(stubLines.includes("gemini-stub: GET batches/demo2: succeeded"), stubLines.join("\n"));
    const record = await eventually(async () => {
      const r = json((await sh(curl)).out);
      return r.effect_done && r;
    }, { what: "the effect of batches/demo2 done" });
    assert.equal(record.status, "succeeded");
    assert.equal(record.settled_by, "reconcile");
    const lines = effectsFor("batches/demo2");
    assert.equal(lines.length, 1, lines.join("\n"));
    assert.ok(lines[0].startsWith(shownLine("batches/demo2")), `${lines[0]}\nas the README shows it:\n${shownLine("batches/demo2")}`);
  });

  it("a batch's results: registered with --results each, marked done, one pass: each result once, then the job with its counts", async () => {
    const [register, done, pass, ...rest] = commandsUnder(RESULTS);
    assert.deepEqual(rest, [], "three commands");
    const registered = await sh(register);
    assert.equal(registered.code, 0, registered.err);
    assert.match(registered.out, /201/, registered.out);
    await w.ledger("batches/demo3");
    assert.equal((await sh(done)).code, 0);
    await sh(pass);
    const shown = readme.split("\n").filter((l) => l.startsWith("receive: verified new ") && l.includes("key=batches/demo3 ")).map((l) => l.replace(/^receive: /, "").replace(/(…|\.\.\.)$/, ""));
    assert.equal(shown.length, 5, "four results and the job, as the README shows them");
    const lines = await eventually(() => { const l = effectsFor("batches/demo3"); return l.length >= 5 && l; }, { timeoutMs: 30_000, what: "the results and the job's effect of batches/demo3" });
    await new Promise((resolve) => setTimeout(resolve, 500));
    assert.equal(effectsFor("batches/demo3").length, 5, effectsFor("batches/demo3").join("\n"));
    for (const expected of shown) assert.ok(lines.some((l) => l.startsWith(expected)), `${expected}\nnot among:\n${lines.join("\n")}`);
    assert.ok(lines.at(-1).startsWith(shown.at(-1)), "the job's effect comes after its results");
    assert.ok(lines.slice(0, 4).every((l) => / webhook-id=res_\w+$/.test(l)), lines.join("\n"));
  });

  it("registering from a shell: npm run register, then curl, with the register token", async () => {
    const [exported, register, curl, ...rest] = commandsUnder(FROM_A_SHELL);
    assert.deepEqual(rest, [], "three commands");
    await sh(exported);
    const registered = await sh(register);
    assert.equal(registered.code, 0, registered.err);
    assert.match(registered.out, /201/, registered.out);
    const again = json((await sh(curl)).out);
    assert.equal(again.key, "batches/abc123", JSON.stringify(again));
    assert.equal(again.kind_change, "unchanged", "the same name again: known, nothing changed");
    const record = await w.as(firstOf(example.READ_TOKENS)).inspect("batches/abc123");
    assert.equal(record.body.status, "pending");
    assert.equal(record.body.kind, "nightly-review");
  });
});

/**
 * Commands outside the sections run above, with the test that runs each: [the command as the
 * README writes it, the test file, the title of the test in it].
 */
const RUN_ELSEWHERE = [
  [/^npm install && npm start$/, "tests/start.test.mjs", "serves the worker, runs a cron pass on /__scheduled, and stops with everything it started on SIGTERM"],
  [/^npm start -- --fresh$/, "tests/start.test.mjs", "serves the worker, runs a cron pass on /__scheduled, and stops with everything it started on SIGTERM"],
  [/^npm start -- --port \d+ --ip 127\.0\.0\.1 --persist-to \S+$/, "tests/start.test.mjs", "serves the worker, runs a cron pass on /__scheduled, and stops with everything it started on SIGTERM"],
  [/^npm run deploy -- --set EFFECT_URL=\S+ --set ALERT_URL=\S+$/, "tests/deploy.test.mjs", "generates the missing secrets, keeps them for the user, deploys them with the given ones, checks /healthz"],
  [/^npm run connect -- --url https:\/\/\S+$/, "tests/connect.test.mjs", "puts the secret with wrangler and leaves its copy in a pre-existing 0644 .deploy.vars owner-only"],
];

describe("every command in the README", () => {
  it("is run by a test: above, or by the one named for it", () => {
    const here = new Set([LOOP, RECONCILE, FROM_A_SHELL, RESULTS]);
    const unaccounted = [];
    for (const { heading, lines } of shell) {
      if (here.has(heading)) continue;
      for (const command of lines.map(code)) {
        if (command === "npm install && npm test") {
          // `npm test` is the suite this test is part of.
          assert.equal(pkg.scripts.test, "bash scripts/test.sh");
          assert.match(read("scripts/test.sh"), /^node --test .*tests\/$/m);
          continue;
        }
        const rows = RUN_ELSEWHERE.filter(([pattern]) => pattern.test(command));
        if (rows.length === 0) unaccounted.push(`${heading}: ${command}`);
        for (const [, file, title] of rows) {
          const test = read(file);
          assert.ok(test.includes(`it("${title}"`), `${file} has the test "${title}" that runs: ${command}`);
          for (const [, flag] of command.matchAll(/(?:^|\s)(--[a-z][a-z0-9-]*)/g)) assert.ok(test.includes(`"${flag}"`), `${file} passes ${flag}, as the README does: ${command}`);
        }
      }
    }
    assert.deepEqual(unaccounted, [], "commands no test runs");
  });

  it("calls npm scripts that exist, with flags their usage lists", async () => {
    // In shell blocks and in the text's code spans alike.
    const commands = [...shell.flatMap((b) => b.lines), ...[...readme.matchAll(/`(npm (?:start|test|run [\w-]+)[^`]*)`/g)].map((m) => m[1].replace(/\s+/g, " "))]
      .filter((c) => c.startsWith("npm "));
    assert.ok(commands.length > 20, `${commands.length} commands`);
    const usage = new Map();
    const usageOf = async (script) => {
      if (!usage.has(script)) {
        const line = pkg.scripts[script];
        let text;
        if (script === "start") {
          // npm start takes --fresh itself and passes the rest to wrangler dev.
          assert.match(read("scripts/start.mjs"), /argv\.includes\("--fresh"\)/);
          const { stdout } = await run(path.join(root, "node_modules/.bin/wrangler"), ["dev", "--help"], { cwd: root, env: { ...process.env, WRANGLER_SEND_METRICS: "false" } });
          text = `--fresh\n${stdout}`;
        } else {
          assert.match(line, /^node scripts\/[\w/]+\.mjs$/, `npm run ${script} runs a node script that answers --help`);
          // Usage on stdout or stderr, and exit 0: asking for help is not an error.
          text = await run("bash", ["-c", `exec ${line} --help`], { cwd: root, timeout: 30_000 }).then(({ stdout, stderr }) => stdout + stderr, (e) => assert.fail(`npm run ${script} -- --help exited ${e.code}: ${e.stderr}`));
          assert.match(text, /usage/i, `npm run ${script} -- --help`);
        }
        usage.set(script, text);
      }
      return usage.get(script);
    };
    for (const command of commands) {
      for (const part of command.split("&&").map((p) => p.trim())) {
        const m = part.match(/^npm (?:run ([\w-]+)|(start|test|install))(?: -- (.*))?(?:\s|$)/) ?? assert.fail(`not an npm command: ${part}`);
        const script = m[1] ?? m[2];
        if (script === "install") continue;
        assert.ok(pkg.scripts[script], `npm ${m[1] ? "run " : ""}${script} is a script of package.json`);
        const args = m[3] ?? "";
        if (!args) continue;
        const text = await usageOf(script);
        for (const [, flag] of args.matchAll(/(?:^|\s)(--[a-z][a-z0-9-]*)/g)) {
          assert.match(text, new RegExp(`${flag}(?![a-z0-9-])`), `npm ${m[1] ? "run " : ""}${script} takes ${flag} (${command})`);
        }
        for (const [, name] of args.matchAll(/--set ([A-Z][A-Z0-9_]*)=/g)) {
          assert.ok(read(".dev.vars.example").includes(`${name}=`), `--set ${name}: a setting the worker reads`);
        }
      }
    }
  });

  it("calls with curl only routes the worker serves, by the method it takes", () => {
    const spec = YAML.parse(read("docs/openapi.yaml"));
    const routes = Object.entries(spec.paths).flatMap(([p, ops]) => Object.keys(ops).map((method) => ({
      method: method.toUpperCase(),
      pattern: new RegExp(`^${p.replace(/\{name\}/g, ".+")}$`),
    })));
    const curls = shell.flatMap((b) => b.lines).map(code).filter((c) => c.startsWith("curl "));
    assert.ok(curls.length >= 4, curls.join("\n"));
    for (const command of curls) {
      const url = new URL((command.match(/(?:https?:\/\/)?(?:localhost|127\.0\.0\.1|[\w.<>-]+\.dev)(?::\d+)?\/[^\s"']*/) ?? assert.fail(`no URL in ${command}`))[0].replace(/^(?!https?:)/, "http://").replace(/<you>/, "you"));
      const method = command.match(/-X (\w+)/)?.[1] ?? "GET";
      if (url.pathname === "/__scheduled") {
        // wrangler dev's --test-scheduled route, which npm start turns on.
        assert.match(read("scripts/start.mjs"), /"dev", "--test-scheduled"/);
        continue;
      }
      assert.ok(routes.some((r) => r.method === method && r.pattern.test(url.pathname)), `${method} ${url.pathname} is a route of docs/openapi.yaml (${command})`);
    }
  });
});

/** Processes whose command line names `needle` (this run's state directory). */
function processesNaming(needle) {
  const found = [];
  for (const pid of readdirSync("/proc").filter((p) => /^\d+$/.test(p))) {
    try {
      const cmd = readFileSync(`/proc/${pid}/cmdline`, "utf8").replaceAll("\0", " ");
      if (cmd.includes(needle)) found.push(Number(pid));
    } catch { /* gone meanwhile */ }
  }
  return found;
}

/**
 * What a newcomer meets beyond the loop, walked as written: `npm start` with 8787 taken, with
 * EFFECT_URL moved to another port, beside the Python receiver started by its README, and the
 * deploy's dry run logged out. What running "as written" changes here: the worker's port is a
 * free one (`--port`), its settings are `.dev.vars.example`'s with the EFFECT_URL under test
 * (`--env-file`, which wrangler dev reads in place of .dev.vars, so the checkout's own stays as
 * it is), its state a directory of its own (`--persist-to`), and npm start writes its address
 * to a file of the test's (GEMINI_ONCE_LOCAL_WORKER_FILE), where register and send read it.
 */
describe("a newcomer's first hour, walked", () => {
  const scratch = mkdtempSync(path.join(os.tmpdir(), "gemini-once-newcomer-"));
  const addressFile = path.join(scratch, "local-worker.json");
  const env = { ...process.env, GEMINI_ONCE_LOCAL_WORKER_FILE: addressFile, WRANGLER_SEND_METRICS: "false" };
  delete env.GEMINI_ONCE_REGISTER_TOKEN;
  after(() => rmSync(scratch, { recursive: true, force: true }));

  /** `npm start -- args`, its output as lines; `stop()` ends it and everything it started. */
  function npmStart(args) {
    const child = spawn("npm", ["start", "--", ...args], { cwd: root, env, stdio: ["ignore", "pipe", "pipe"] });
    const lines = [];
    eachLine(child.stdout, (l) => lines.push(l));
    eachLine(child.stderr, (l) => lines.push(l));
    const exited = new Promise((resolve) => child.on("exit", (code) => resolve(code)));
    const state = args[args.indexOf("--persist-to") + 1];
    return {
      lines,
      exited,
      async stop() {
        child.kill("SIGTERM");
        await exited;
        await eventually(() => processesNaming(state).length === 0, { timeoutMs: 20_000, what: "no process of this npm start left" }).catch((e) => {
          for (const pid of processesNaming(state)) process.kill(pid, "SIGTERM");
          throw e;
        });
        child.stdout.destroy();
        child.stderr.destroy();
      },
    };
  }

  /** .dev.vars.example with `EFFECT_URL` set to `url`, as a file for `--env-file`. */
  function settingsWith(url, name) {
    const file = path.join(scratch, name);
    writeFileSync(file, read(".dev.vars.example").replace(/^EFFECT_URL=.*$/m, `EFFECT_URL="${url}"`));
    assert.equal(devVars(file).EFFECT_URL, url);
    return file;
  }

  /** An npm command as a user types it, with the test's env; resolves to {code, out, err}. */
  async function npm(command) {
    try {
      const { stdout, stderr } = await run("bash", ["-c", command], { cwd: root, env, timeout: 60_000 });
      return { code: 0, out: stdout, err: stderr };
    } catch (e) {
      return { code: e.code, out: e.stdout ?? "", err: `${e.stderr ?? ""}${e.message}` };
    }
  }

  /** Starts npm start with `settings`, waits for the address it prints; returns it and the run. */
  async function startWith(settings) {
    const port = await freePort();
    const state = mkdtempSync(path.join(scratch, "state-"));
    const started = npmStart(["--port", String(port), "--ip", "127.0.0.1", "--persist-to", state, "--env-file", settings]);
    const url = `http://127.0.0.1:${port}`;
    try {
      await eventually(() => started.lines.some((l) => l.includes(`start: the worker listens at ${url} `)), { timeoutMs: 200_000, everyMs: 500, what: `npm start to say where the worker listens:\n${started.lines.join("\n")}` });
    } catch (e) {
      await started.stop();
      throw e;
    }
    assert.deepEqual(JSON.parse(readFileSync(addressFile, "utf8")).url, url, "written where register and send read it");
    return { url, started };
  }

  it("a taken 8787: npm start stops before starting anything and says so, naming --port", { timeout: 240_000 }, async () => {
    let holder = null;
    try {
      holder = await listen((req, res) => res.end("not gemini-once"), 8787);
    } catch (e) {
      // Something else holds 8787 already: the same case.
      assert.equal(e.code, "EADDRINUSE");
    }
    try {
      const state = mkdtempSync(path.join(scratch, "state-"));
      writeFileSync(path.join(state, "kept"), "x");
      const started = npmStart(["--fresh", "--persist-to", state]);
      const code = await started.exited;
      const out = started.lines.join("\n");
      assert.equal(code, 1, out);
      assert.match(out, /^start: not starting: port 8787 on 127\.0\.0\.1 is taken \(something already listens there; another npm start\?\)\. Stop what holds it, or choose another port: npm start -- --port 8790 \(register, send and results then find the worker there/m);
      assert.doesNotMatch(out, /Ready on|the worker listens at/);
      assert.ok(existsSync(path.join(state, "kept")), "--fresh removed nothing: it stopped first");
      assert.equal(processesNaming(state).length, 0, "no wrangler started");
      // The README says the same.
      assert.match(readme.replace(/\s+/g, " "), /If 8787 is taken, `npm start` stops and says so/);
    } finally {
      await new Promise((r) => (holder ? holder.close(r) : r()));
    }
  });

  it("a moved EFFECT_URL: the demo destination follows it, and register and send reach the worker npm start names", { timeout: 300_000 }, async () => {
    const effectPort = await freePort();
    const effectUrl = `http://127.0.0.1:${effectPort}/hooks/gemini`;
    const { url, started } = await startWith(settingsWith(effectUrl, "moved.env"));
    try {
      assert.ok(started.lines.includes(`start: demo destination at ${effectUrl} (prints each side effect; EFFECT_URL in .dev.vars)`), started.lines.join("\n"));
      // No --url: both read the address npm start wrote.
      const registered = await npm(`npm run register -- batches/moved1 --kind nightly-review --token ${firstOf(example.REGISTER_TOKENS)}`);
      assert.equal(registered.code, 0, registered.err);
      assert.match(registered.out, /201 registered batches\/moved1/);
      const sent = await npm(`npm run send -- batch.succeeded batches/moved1 --secret ${firstOf(example.GEMINI_WEBHOOK_SECRETS)} --token ${firstOf(example.READ_TOKENS)}`);
      assert.equal(sent.code, 0, sent.err);
      assert.ok(sent.out.includes(`to ${url}/webhooks/gemini`), sent.out);
      assert.match(sent.err, /^effect: delivered to the destination/m);
      await eventually(() => started.lines.some((l) => l.startsWith("receive: verified new key=batches/moved1 ")), { what: "the demo destination at the moved EFFECT_URL to print the effect" });
    } finally {
      await started.stop();
    }
    assert.equal(existsSync(addressFile), false, "npm start removes its address when it stops");
  });

  it("the Python receiver's README, beside npm start: the effect goes to it, once", { timeout: 400_000 }, async () => {
    const pythonDir = path.join(root, "examples/receivers/python");
    const guide = readFileSync(path.join(pythonDir, "README.md"), "utf8");
    const commands = (guide.match(/```sh\n([\s\S]*?)```/)?.[1] ?? assert.fail("the README's commands")).trim().split("\n");
    const install = spawnSync("bash", ["-c", commands.slice(0, -1).join(" && ")], { cwd: root, encoding: "utf8", timeout: 300_000 });
    assert.equal(install.status, 0, `${install.stdout}${install.stderr}`);
    // As written, on a free port for 8795, with the example's secret and a database of its own.
    const receiverPort = await freePort();
    const serve = commands.at(-1).replace("whsec_...", example.EFFECT_SIGNING_SECRET).replace("RECEIVER_DB=effects.sqlite3", `RECEIVER_DB=${path.join(scratch, "effects.sqlite3")}`).replace("--port 8795", `--port ${receiverPort}`);
    const [, effectUrl] = guide.match(/^EFFECT_URL=(http:\/\/127\.0\.0\.1:8795\/effects)$/m) ?? assert.fail("the EFFECT_URL the README sets");
    const receiverLines = [];
    // A process group of its own: the shell and the uvicorn it starts stop together.
    const receiver = spawn("bash", ["-c", `${commands[0]} && ${serve}`], { cwd: root, stdio: ["ignore", "pipe", "pipe"], detached: true });
    eachLine(receiver.stdout, (l) => receiverLines.push(l));
    eachLine(receiver.stderr, (l) => receiverLines.push(l));
    try {
      await eventually(() => receiverLines.some((l) => l.includes("Uvicorn running on")), { timeoutMs: 30_000, what: `uvicorn to listen:\n${receiverLines.join("\n")}` });
      const moved = effectUrl.replace(":8795/", `:${receiverPort}/`);
      const { started } = await startWith(settingsWith(moved, "python.env"));
      try {
        assert.ok(started.lines.includes(`start: EFFECT_URL is ${moved}: something already listens there (your receiver?); side effects go to it (no demo destination)`), started.lines.join("\n"));
        const registered = await npm(`npm run register -- batches/py1 --token ${firstOf(example.REGISTER_TOKENS)}`);
        assert.equal(registered.code, 0, registered.err);
        const sent = await npm(`npm run send -- batch.succeeded batches/py1 --repeat 3 --secret ${firstOf(example.GEMINI_WEBHOOK_SECRETS)} --token ${firstOf(example.READ_TOKENS)}`);
        assert.equal(sent.code, 0, sent.err);
        assert.match(sent.err, /^effect: delivered to the destination/m);
        const ran = await eventually(() => { const l = receiverLines.filter((x) => / key=batches\/py1 /.test(x)); return l.length > 0 && l; }, { what: "the receiver to run the effect" });
        assert.equal(ran.length, 1, ran.join("\n"));
        assert.match(ran[0], /^processed webhook-id=msg_\w+ key=batches\/py1 generation=1 status=succeeded$/);
      } finally {
        await started.stop();
      }
    } finally {
      try { process.kill(-receiver.pid, "SIGTERM"); } catch { /* already gone */ }
    }
  });

  it("the deploy's dry run, logged out: it fails, as the deploy would, naming the login", { timeout: 120_000 }, async () => {
    const deployEnv = Object.fromEntries(Object.entries(env).filter(([k]) => !/^CLOUDFLARE_/.test(k)));
    // No login: a wrangler configuration directory of its own, empty; non-interactive.
    Object.assign(deployEnv, { XDG_CONFIG_HOME: path.join(scratch, "config"), CI: "true", GEMINI_ONCE_DEPLOY_VARS: path.join(scratch, ".deploy.vars") });
    let result;
    try {
      const { stdout, stderr } = await run("bash", ["-c", "npm run deploy -- --dry-run --set EFFECT_URL=https://your.app/hooks/gemini"], { cwd: root, env: deployEnv, timeout: 110_000 });
      result = { code: 0, out: stdout + stderr };
    } catch (e) {
      result = { code: e.code, out: `${e.stdout}${e.stderr}` };
    }
    assert.equal(result.code, 1, result.out);
    assert.match(result.out, /deploy: wrangler secret list failed/);
    assert.match(result.out, /\(npx wrangler login once, or CLOUDFLARE_API_TOKEN in the environment\)/);
    assert.doesNotMatch(result.out, /dry run passed/);
    assert.equal(existsSync(path.join(scratch, ".deploy.vars")), false, "nothing generated");
  });
});
