// `npm run deploy -- --dry-run`: wrangler builds and bundles the worker and checks its
// bindings without contacting Cloudflare (these machines cannot reach it).
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { promisify } from "node:util";

const run = promisify(execFile);

describe("deploy", () => {
  it("bundles with every binding in a dry run", async () => {
    const outdir = mkdtempSync(path.join(tmpdir(), "gemini-once-dry-run-"));
    const { stdout } = await run("bash", ["scripts/deploy.sh", "--dry-run", "--outdir", outdir], {
      env: { ...process.env, CI: "true" },
      maxBuffer: 16 * 1024 * 1024,
      timeout: 600_000,
    });
    for (const binding of ["env.OPERATION_GATE (OperationGate)", "env.RECONCILE_LEASE (ReconcileLease)", "env.STATS (StatsShard)", "env.OPS_KV"]) {
      assert.ok(stdout.includes(binding), `${binding} missing from:\n${stdout}`);
    }
    assert.match(stdout, /--dry-run: exiting now/);
  });
});
