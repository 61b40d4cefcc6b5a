// What a new user meets first, checked as they would meet it: the README's quick start (one
// port for the worker throughout), `.dev.vars.example` (each setting once), the worker started
// from that example (its /healthz warns about what works but should not stay so), and the
// Deploy section (the two commands, then registering operations).
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { devVars, LOCAL_WORKER_URL, DEMO_EFFECT_URL, GEMINI_STUB_URL } from "../scripts/dev_vars.mjs";
import { startWorker } from "./helpers.mjs";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const readme = readFileSync(path.join(root, "README.md"), "utf8");
const section = (title) => {
  const start = readme.indexOf(`\n## ${title}\n`);
  assert.ok(start >= 0, `README has no ## ${title}`);
  const end = readme.indexOf("\n## ", start + 1);
  return readme.slice(start, end === -1 ? undefined : end);
};

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
    const names = readFileSync(path.join(root, ".dev.vars.example"), "utf8").split("\n")
      .map((l) => l.replace(/^#\s*/, "").match(/^([A-Z][A-Z0-9_]*)=/)?.[1])
      .filter(Boolean);
    const twice = names.filter((n, i) => names.indexOf(n) !== i);
    assert.deepEqual(twice, []);
    assert.ok(names.length > 20);
  });

  it("the worker run from .dev.vars.example says in /healthz that alerts go nowhere and nudges cannot be confirmed", async () => {
    const vars = devVars(path.join(root, ".dev.vars.example"));
    assert.equal(vars.ALERT_URL, undefined);
    assert.equal(vars.GEMINI_API_KEY, undefined);
    const w = await startWorker({ ...vars, STATS_FLUSH_SECONDS: undefined });
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
    assert.doesNotMatch(deploy.replace(/\(`batch\.cancelled` and `interaction\.cancelled` are not subscribable[^)]*\)/, ""), /"batch\.cancelled"|"interaction\.cancelled"/, "no subscription to events the SDK does not list");
  });
});
