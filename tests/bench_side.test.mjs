// The side-by-side part of the bench (scripts/bench/side.mjs, peer.mjs, report.mjs) on the
// host, without the real peer (it lives outside the repository) and without timing: a peer
// written in TypeScript is bundled to one ES module with the esbuild wrangler ships, its
// wrangler.toml read; and the side-by-side targets are computed from the figures given.
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

import { bundlePeer } from "../scripts/bench/peer.mjs";
import { evaluateTargets } from "../scripts/bench/report.mjs";

test("a TypeScript peer is bundled to one ES module, with its wrangler.toml's runtime", async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "bench-peer-"));
  try {
    fs.mkdirSync(path.join(dir, "src"));
    fs.writeFileSync(path.join(dir, "src/helper.ts"), "export const greet = (who: string): string => `hi ${who}`;\n");
    fs.writeFileSync(path.join(dir, "src/index.ts"), [
      'import { greet } from "./helper";',
      "interface Env { OPS_KV: KVNamespace }",
      "export default { async fetch(_req: Request, _env: Env): Promise<Response> { return new Response(greet(\"peer\")); } };",
    ].join("\n"));
    fs.writeFileSync(path.join(dir, "wrangler.toml"), [
      'name = "tiny-peer"', 'main = "src/index.ts"', 'compatibility_date = "2025-06-01"', 'compatibility_flags = ["nodejs_compat"]',
      "[[kv_namespaces]]", 'binding = "OPS_KV"', 'id = "00000000000000000000000000000000"',
    ].join("\n"));
    const b = await bundlePeer(dir);
    assert.equal(b.name, "tiny-peer");
    assert.equal(b.compatibilityDate, "2025-06-01");
    assert.deepEqual(b.compatibilityFlags, ["nodejs_compat"]);
    assert.deepEqual(b.kvNamespaces, ["OPS_KV"]);
    assert.doesNotMatch(b.code, /^import /m, "one module: the helper is inlined");
    assert.doesNotMatch(b.code, /interface Env|: string/, "types are stripped");
    assert.match(b.code, /export\s*\{[^}]*as default/);
    const mod = await import(`data:text/javascript,${encodeURIComponent(b.code)}`);
    assert.equal(await (await mod.default.fetch(new Request("http://x/"), {})).text(), "hi peer");
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("the side-by-side targets follow the figures, at concurrency 10", () => {
  const fig = (rps, p50_ms) => ({ rps, p50_ms });
  const row = (scenario, concurrency, ours, peer) => ({ scenario, concurrency, "gemini-once": ours, peer });
  const side = {
    table: [
      row("duplicate", 1, fig(1, 100), fig(1000, 1)),
      row("duplicate", 10, fig(2000, 2), fig(1500, 3)),
      row("first", 10, fig(400, 9), fig(500, 8)),
      row("rejected", 10, fig(3000, 2), fig(3000, 2)),
    ],
  };
  const t = evaluateTargets({ side });
  const holds = Object.fromEntries(t.map((x) => [x.target, x.holds]));
  assert.equal(holds["side by side: duplicate req/s >= the simple design's"], true);
  assert.equal(holds["side by side: duplicate answer p50 <= the simple design's"], true);
  assert.equal(holds["side by side: first delivery req/s >= the simple design's"], false);
  assert.equal(holds["side by side: first delivery answer p50 <= the simple design's"], false);
  assert.equal(holds["side by side: rejected (informational; target: unchanged)"], null);
  assert.ok(!t.some((x) => x.target.includes("floor")), "no floor row without floor figures");
});
