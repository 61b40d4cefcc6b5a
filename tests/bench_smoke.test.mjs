// A smoke run of the benchmark (scripts/bench/main.mjs --quick) against the built worker: every row
// of the report is there, the reconciliation pass spends nothing on settled, done entries, and
// the cost section's counts add up (one effect, the expected KV writes, every gate left empty
// at retention's end, its name kept in its retired names' shard: bytes the bill keeps for good).
// It asserts no timing: the figures of a shared CI machine mean nothing.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

test("npm run bench -- --quick reports every row", { timeout: 300_000 }, () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "bench-smoke-"));
  const json = path.join(dir, "bench.json");
  try {
    const run = spawnSync(
      process.execPath,
      ["scripts/bench/main.mjs", "--quick", "--no-build", "--no-wrangler", "--only", "build,fast,reconcile,backlog,cost", "--cost-ops", "5", "--backlog", "300", "--backlog-rate", "500", "--no-variants", "--sizes", "300", "--seconds", "0.2", "--json", json],
      { cwd: root, encoding: "utf8", timeout: 280_000 },
    );
    assert.equal(run.status, 0, `bench failed:\n${run.stdout}\n${run.stderr}`);
    const r = JSON.parse(fs.readFileSync(json, "utf8"));

    for (const c of [1, 10, 50]) {
      for (const s of ["floor", "first", "duplicate", "rejected"]) {
        const row = r.fast.table.find((x) => x.scenario === s && x.concurrency === c);
        assert.ok(row, `row ${s} at concurrency ${c}`);
        assert.ok(row.n > 0, `${s} at ${c} measured nothing`);
        assert.equal(row.wrong_answers, 0, `${s} at ${c}: wrong answers`);
        assert.ok(row.p50_ratio > 0 && row.rps_ratio > 0, `${s} at ${c}: ratios`);
      }
    }
    assert.equal(r.fast.effects.repeated_idempotency_keys, 0, "a side effect went out twice");
    for (const row of r.fast.table.filter((x) => x.scenario === "first")) {
      assert.ok(Number.isFinite(row.effect_start_after_answer_ms.p50), `first at ${row.concurrency}: effect delay after the answer measured`);
    }
    assert.equal(r.fast.effects.effects_at_destination, r.fast.effects.first_deliveries_measured_and_warmup);

    // The backlog fanned out on the queue: each open operation polled once, by a consumer, and
    // the 1% that Gemini says are done settled with one side effect each.
    const b = r.backlog;
    assert.equal(b.distinct_polled, b.indexed, "every open operation polled");
    assert.equal(b.polled_twice, 0, "none polled twice");
    assert.equal(b.fed, b.indexed, "all scheduled on the queue");
    assert.equal(b.consumer_status_calls, b.indexed, "polled by the consumer, not the pass");
    assert.equal(b.effect_keys, b.done_expected);
    assert.equal(b.effect_repeats, 0);
    assert.ok(b.messages >= Math.ceil(b.indexed / 50), `${b.messages} messages`);

    const [ledger] = r.reconcile;
    assert.equal(ledger.size, 300);
    // The audit over the whole ledger: every seeded entry listed, nothing missing from the index.
    assert.ok(ledger.audit.complete, "the audit reached the end of op:");
    assert.equal(ledger.audit.audit_listed, ledger.seeded_done);
    assert.equal(ledger.audit.found, 0);
    assert.equal(ledger.audit.bodies_read, 0);
    assert.equal(ledger.index_entries, ledger.needing_work, "only open operations are indexed");
    assert.deepEqual(ledger.coverages.map((c) => c.phase), ["first", "steady", "all_done"]);
    for (const c of ledger.coverages) {
      assert.ok(c.complete, `${c.phase}: covered the ledger`);
      assert.equal(c.audits, 0, `${c.phase}: routine passes only`);
      assert.ok(c.every_pass_lists_every_open_entry, `${c.phase}: each pass lists the open entries, only those`);
      assert.equal(c.listed, c.passes * c.needing_status, `${c.phase}: nothing but the index listed`);
      assert.equal(c.status_calls_for_done_entries, 0, `${c.phase}: polled a done entry`);
      assert.equal(c.bodies_read, 0, `${c.phase}: read a ledger value`);
      assert.equal(c.status_calls, c.needing_status, `${c.phase}: status calls`);
      assert.ok(c.max_subrequests <= ledger.budget, `${c.phase}: over budget`);
    }
    assert.equal(ledger.coverages[2].status_calls, 0);
    assert.equal(ledger.coverages[2].gate_calls, 0);
    assert.equal(ledger.coverages[2].kv_lists, 1, "a quiet ledger: one empty index page");

    // The cost section: what the objects count themselves (USAGE_LOG), per completion.
    const f = r.cost.flows;
    for (const flow of ["webhook", "registered_webhook", "cron"]) {
      assert.equal(f[flow].effects_per_op, 1, `${flow}: one side effect per completion`);
      assert.equal(f[flow].total.outbound_fetches, 1, `${flow}: the effect is the gate's one outbound call`);
      assert.ok(f[flow].total.rows_written > 0 && f[flow].total.do_requests >= 2, `${flow}: a gate call and its alarm, with writes`);
    }
    assert.equal(f.webhook.total.kv_writes, 1, "an unregistered completion writes its op: entry only");
    assert.equal(f.registration.total.kv_writes + f.registered_webhook.total.kv_writes, 4, "registered: op: and open: put, then op: put and open: delete");
    assert.equal(f.cron.settled, 5, "the cron recovered every completion the webhook never brought");
    assert.equal(f.duplicate.effects_per_op, 0);
    assert.equal(f.retirement.retired, 5, "every operation retired");
    assert.equal(f.retirement.purged, 5, "every retired gate keeps nothing");
    assert.equal(f.retirement.tombstones, 0);
    assert.equal(f.retirement.registered_again_refused, 5, "a retired name registered again is 409 retired");
    assert.equal(f.retirement.objects["retired_names.fetch"]?.invocations, 1, "one shard call a retirement");
    assert.equal(f.retirement.objects["retired_names.fetch"]?.rows_written, 1, "one row a retired name");
    assert.equal(f.webhook.objects["retired_names.fetch"]?.invocations, 1, "an unregistered completion asks its shard once, from its first alarm");
    const kept = r.cost.bill.stored_per_completion;
    assert.ok(kept.do_bytes_retired > 0 && kept.do_bytes_retired <= 40, "a name's row, billed for good");
    for (const p of Object.values(r.cost.bill.profiles)) assert.ok(p.months.every((m) => m.total_month_12 >= m.total && m.total_month_36 >= m.total_month_12), "later months bill at least what month 1 does");
    for (const p of Object.values(r.cost.bill.profiles)) assert.equal(p.months.length, 3);
    // The shape's floor: the object-per-op minimum metered and priced the same way.
    const s = r.cost.shape.flows;
    assert.equal(s.webhook.total.do_requests, 2, "the minimum: one object call and its alarm");
    assert.equal(s.webhook.total.alarm_writes, 3, "the minimum: the effect's alarm, the claim's expiry, retention");
    assert.equal(s.webhook.total.kv_writes, 1, "the minimum writes its ledger entry once");
    assert.equal(s.retirement.retired, 10, "every minimum object (5 unregistered, 5 registered) retired");
    for (const p of ["webhook", "registered"]) {
      const floor = r.cost.shape.bill.profiles[p].months.at(-1);
      assert.ok(floor.total > 5 && floor.steady, `${p}: the floor is priced at 100 M, the same each month`);
    }

    assert.ok(r.build.wasm_raw_bytes > 0 && r.build.wasm_gzip_bytes > 0);
    assert.ok(r.build.startup.miniflare_process_ms[0] > 0);
    assert.ok(r.targets.length > 0);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("npm run bench -- --only results at a tiny size: every result once, then the job's effect; memory, CPU and the bill reported", { timeout: 200_000 }, () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "bench-results-"));
  const json = path.join(dir, "bench.json");
  try {
    const run = spawnSync(
      process.execPath,
      ["scripts/bench/main.mjs", "--quick", "--no-build", "--only", "results", "--results-lines", "600", "--results-dest-ms", "0", "--json", json],
      { cwd: root, encoding: "utf8", timeout: 190_000 },
    );
    assert.equal(run.status, 0, `bench failed:\n${run.stdout}\n${run.stderr}`);
    const r = JSON.parse(fs.readFileSync(json, "utf8"));
    const [c] = r.results.cells;
    assert.equal(c.lines, 600);
    assert.ok(c.finished, "the job's effect came");
    assert.equal(c.delivered, 600, "every line a result at the destination");
    assert.equal(c.job_effects, 1);
    assert.ok(c.job_after_last_result, "the job's effect after its results");
    assert.deepEqual(c.job_results, { total: 600, delivered: 600, errors: 6, parked: 0 });
    assert.ok(c.downloads >= 3, `a file of 600 lines is read in waves of 240 (${c.downloads} downloads)`);
    assert.ok(c.ranged_downloads >= 2, "later chunks resume with Range");
    assert.ok(c.rss_peak_mb > 0 && c.workerd_cpu_ms_per_line > 0 && c.lines_per_second > 0);
    assert.ok(c.per_result.do_requests > 0 && c.per_result.rows_written >= 0, JSON.stringify(c.per_result));
    assert.ok(r.results.bill.measured.per_million.total > 0 && r.results.bill.design.per_million.total > 0);
    assert.match(run.stdout, /Results of a batch/);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
