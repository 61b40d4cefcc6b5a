// Retirement moments: the names of one bucket whose retention ends together retire at the
// same moment of their bucket, reach their retired names' shard together, and are stored in
// fewer row writes than names (the shard's `retired_names_kept` lines count both); each gate
// deletes its storage only once its name is kept, and each name is then refused as retired.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { startWorker, startDestination, eventually } from "./helpers.mjs";

/** Names (`batches/<prefix>-<i>`) of one bucket of retired names: the same first byte of
 * their key's SHA-256 (the shard) and the same top 6 bits of the second (the bucket). */
function namesOfOneBucket(prefix, n) {
  const groups = new Map();
  for (let i = 0; ; i++) {
    const name = `batches/${prefix}-${i}`;
    const h = createHash("sha256").update(name).digest();
    const bucket = `${h[0]}/${h[1] >> 2}`;
    const group = groups.get(bucket) ?? [];
    group.push(name);
    groups.set(bucket, group);
    if (group.length === n) return group;
  }
}

let dest, w;
before(async () => {
  dest = await startDestination(() => ({ status: 200 }));
  w = await startWorker({
    EFFECT_URL: `${dest.url}/effects`,
    // Moments are one per retention when it is shorter than a day: one per 8 s here, so
    // completions a few seconds apart share one.
    LEDGER_RETENTION_SECONDS: "8",
    // Generous, so that a busy machine's alarms, set for one millisecond, still reach the
    // shard inside one batch.
    RETIRED_KEEP_WAIT_MS: "3000",
  });
});
after(async () => {
  await w?.dispose();
  await dest?.close();
  dest?.assertAllValid();
});

describe("retired names of one bucket", () => {
  it("retire at one moment and are kept in fewer row writes than names, each then refused", async () => {
    const names = namesOfOneBucket(`rb-${Date.now().toString(36)}`, 6);
    const effects = (name) => dest.requests.filter((r) => r.headers["idempotency-key"] === name).length;
    for (const name of names) {
      const r = await w.deliver("batch.succeeded", name, { output_file_uri: "files/out" });
      assert.equal(r.status, 200, JSON.stringify(r.body));
    }
    await eventually(() => names.every((n) => effects(n) === 1), { what: "each effect" });

    // Retention ends, at the bucket's moment: every gate keeps its name, then deletes all.
    const expired = () => new Set(w.events("retention_expired").map((l) => l.key));
    await eventually(() => names.every((n) => expired().has(n)), { timeoutMs: 90_000, what: "every gate to retire" });
    const kept = w.events("retired_names_kept");
    const stored = kept.reduce((a, l) => a + l.names, 0);
    const rows = kept.reduce((a, l) => a + l.rows, 0);
    assert.ok(stored >= names.length, `every name stored: ${JSON.stringify(kept)}`);
    assert.ok(rows < names.length, `fewer row writes than names: ${JSON.stringify(kept)}`);
    assert.ok(kept.some((l) => l.names >= 2 && l.rows === 1), `a batch of names in one row: ${JSON.stringify(kept)}`);

    for (const name of names) {
      assert.equal((await w.inspect(name)).status, 404, `${name}: nothing left in its gate`);
      const again = await w.register(name, "billing");
      assert.equal(again.status, 409, JSON.stringify(again.body));
      assert.equal(again.body.error, "retired");
      assert.equal(again.body.operation.key, name);
      assert.equal(effects(name), 1, `${name}: one effect in all`);
    }
  });
});
