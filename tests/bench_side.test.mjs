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
import { SIDE_SCENARIOS, sideSteps } from "../scripts/bench/side.mjs";
import { startStubs } from "../scripts/bench/stubs.mjs";
import { send } from "../scripts/bench/load.mjs";

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
  assert.ok(!t.some((x) => x.target.includes("minimum")), "no limit rows without the minimum designs");
});

test("first deliveries to a destination that takes time are targets of their own, beside those to one that answers at once", () => {
  const first = (dest_ms, ours, peer) => ({ scenario: "first", concurrency: 10, dest_ms, "gemini-once": ours, peer });
  const t = evaluateTargets({
    side: {
      table: [
        first(0, { rps: 130, p50_ms: 40 }, { rps: 500, p50_ms: 16 }),
        first(100, { rps: 128, p50_ms: 41 }, { rps: 90, p50_ms: 108 }),
        first(250, { rps: 120, p50_ms: 45 }, { rps: 39, p50_ms: 255 }),
      ],
    },
  });
  const holds = Object.fromEntries(t.map((x) => [x.target, x.holds]));
  assert.equal(holds["side by side: first delivery req/s >= the simple design's"], false, "read from the row at once, not a slow one");
  assert.equal(holds["side by side: first delivery answer p50 <= the simple design's"], false);
  assert.equal(holds["side by side: first delivery, destination taking 100 ms, req/s >= the simple design's"], true);
  assert.equal(holds["side by side: first delivery, destination taking 100 ms, answer p50 <= the simple design's"], true);
  assert.equal(holds["side by side: first delivery, destination taking 250 ms, answer p50 <= the simple design's"], true);
  assert.match(t.find((x) => x.target.startsWith("side by side: first delivery, destination taking 100 ms, req/s")).value, /^128 vs peer 90 req\/s \(c=10\)$/);
  // A slow destination that slows gemini-once's answer below the peer's is a miss, not a pass.
  const slowMiss = evaluateTargets({ side: { table: [first(100, { rps: 60, p50_ms: 150 }, { rps: 90, p50_ms: 108 })] } });
  assert.ok(slowMiss.filter((x) => x.target.includes("100 ms")).every((x) => x.holds === false));
});

test("the side-by-side cells: every scenario at once, then one first-delivery cell per positive destination delay", () => {
  assert.deepEqual(sideSteps([100, 0, 100, 250]).map((x) => `${x.name}@${x.destMs}`), [
    "registration@0", "first@0", "duplicate@0", "rejected@0", "floor@0", "first@100", "first@250",
  ]);
  assert.deepEqual(sideSteps([]).map((x) => x.name), SIDE_SCENARIOS);
});

test("the destination stand-in answers after the delay it is given, and refuses a bad one", { timeout: 30_000 }, async () => {
  const stubs = await startStubs();
  try {
    const post = () => send(false, new URL(stubs.url), { method: "POST", path: "/effects", headers: { "idempotency-key": "k" }, body: "{}" });
    await stubs.setDestinationDelay(300);
    const t0 = Date.now();
    assert.equal((await post()).status, 200);
    // A lower bound only: a timer never fires early, however loaded the machine.
    assert.ok(Date.now() - t0 >= 290, `answered after ${Date.now() - t0} ms`);
    await assert.rejects(stubs.setDestinationDelay(-1), /refused: 400/);
    await stubs.setDestinationDelay(0);
    assert.equal((await post()).status, 200);
    assert.equal((await stubs.stats()).effects, 2);
  } finally {
    stubs.stop();
  }
});

test("a missed first-delivery target is shown beside the minimum of the shape, as information", () => {
  const first = { scenario: "first", concurrency: 10, "gemini-once": { rps: 120, p50_ms: 45 }, peer: { rps: 400, p50_ms: 24 } };
  first.minimum = { "object-per-op": { rps: 220, p50_ms: 44, rps_ratio: 0.55, p50_ratio: 1.83 } };
  const t = evaluateTargets({ side: { table: [first] } });
  const limit = t.find((x) => x.target === "side by side: first delivery of the object-per-op minimum (informational: the shape's limit)");
  assert.ok(limit, "the limit row");
  assert.equal(limit.holds, null);
  assert.match(limit.value, /^220 vs peer 400 req\/s \(0\.55x\), p50 44 vs 24 ms; gemini-once 120 req\/s, p50 45 ms$/);
  assert.equal(t.find((x) => x.target === "side by side: first delivery req/s >= the simple design's").holds, false);
});

test("the minimum designs keep the shape's promises: one effect per completion, a ledger entry each", { timeout: 120_000 }, async () => {
  const { startMinimum, MINIMUM_DESIGNS } = await import("../scripts/bench/minimum.mjs");
  const { send, signed, envelope } = await import("../scripts/bench/load.mjs");
  const { ADMIN_TOKEN, OTHER_SECRET } = await import("../scripts/bench/common.mjs");
  const http = await import("node:http");
  const effects = [];
  const destination = http.createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      effects.push({ key: req.headers["idempotency-key"], body: JSON.parse(body) });
      res.end("ok");
    });
  });
  await new Promise((r) => destination.listen(0, "127.0.0.1", r));
  const effectUrl = `http://127.0.0.1:${destination.address().port}/effects`;
  try {
    for (const design of Object.keys(MINIMUM_DESIGNS)) {
      effects.length = 0;
      const w = await startMinimum(design, effectUrl);
      try {
        const admin = { authorization: `Bearer ${ADMIN_TOKEN}`, "content-type": "application/json" };
        const register = (name, headers = admin) => send(false, w.url, { method: "POST", path: "/v1/operations", headers, body: JSON.stringify({ name }) });
        const deliver = (id, secret) => {
          const body = envelope("batch.succeeded", id, { output_file_uri: `gs://b/${id}` });
          return send(false, w.url, { method: "POST", path: "/webhooks/gemini", headers: signed(body, `msg_${id}`, secret), body });
        };
        assert.equal((await register("batches/a")).status, 201, design);
        assert.equal((await register("batches/a")).status, 200, `${design}: registering again`);
        assert.equal((await register("batches/a", {})).status, 401, `${design}: registration needs the token`);
        assert.equal((await deliver("batches/x", OTHER_SECRET)).status, 401, `${design}: a forged delivery`);
        for (const id of ["batches/a", "projects/p/locations/l/batches/b"]) {
          const first = await deliver(id);
          assert.equal(first.status, 200);
          assert.match(first.body, /"outcome":"applied"/, `${design}: first delivery of ${id}`);
          assert.match((await deliver(id)).body, /"reason":"duplicate"/, `${design}: the same again`);
        }
        // The effects run from the alarm, after the answers.
        const kv = await w.mf.getKVNamespace("LEDGER");
        // How long to wait for a failure only: a busy machine may take many times a quiet one's.
        const deadline = Date.now() + 60_000;
        let listed = [];
        while (Date.now() < deadline) {
          listed = (await kv.list({ prefix: "op:" })).keys;
          if (effects.length >= 2 && listed.filter((k) => k.metadata?.effect_done).length === 2) break;
          await new Promise((r) => setTimeout(r, 50));
        }
        assert.deepEqual(effects.map((e) => e.key).sort(), ["batches/a", "batches/b"], `${design}: one effect per completion, keyed by the operation`);
        assert.equal(effects.find((e) => e.key === "batches/b").body.detail.output_file_uri, "gs://b/projects/p/locations/l/batches/b");
        assert.deepEqual(listed.map((k) => [k.name, k.metadata]), [
          ["op:batches/a", { status: "succeeded", effect_done: true }],
          ["op:batches/b", { status: "succeeded", effect_done: true }],
        ], `${design}: the ledger`);
      } finally {
        await w.dispose();
      }
    }
  } finally {
    destination.close();
  }
});
