// Bulk actions against the built worker in workerd: a destination refuses (parks) every side
// effect of one kind; a dry run counts them and changes nothing; once the destination is fixed,
// a bulk retry, resumed across requests with a small page, sends each one once more under the
// webhook-id of its refused attempt and skips what it does not apply to; a bulk redelivery
// needs a reason and sends each done effect again as a new generation; run again with its
// cut-off (`sent_before`, its identity), it sends nothing more, and a new run sends again.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { startWorker, startDestination, eventually } from "./helpers.mjs";

const PARKED = ["batches/bulk-p1", "batches/bulk-p2", "batches/bulk-p3", "batches/bulk-p4", "batches/bulk-p5"];
const DONE = "batches/bulk-done";
const OPEN = "batches/bulk-open";
const FORGOTTEN = "batches/bulk-forgot";
const OTHER = "batches/bulk-other";
const RERUN = ["batches/bulk-r1", "batches/bulk-r2", "batches/bulk-r3"];

let w, dest;
let billingUp = true;
const effectsFor = (key) => dest.requests.filter((r) => r.headers["idempotency-key"] === key);

before(async () => {
  dest = await startDestination((req) => (req.url === "/bill" && !billingUp ? { status: 400, body: { error: "unknown account" } } : { status: 200 }));
  w = await startWorker({
    EFFECT_URL: `${dest.url}/effects`,
    EFFECT_ROUTES: JSON.stringify({ billing: `${dest.url}/bill` }),
    UNREGISTERED_HOLD_SECONDS: "0",
  });
  // One billing effect done before the destination broke; one of another kind; one billing
  // operation with no outcome yet; one forgotten.
  for (const [key, kind] of [[DONE, "billing"], [OTHER, "nightly"], [OPEN, "billing"], [FORGOTTEN, "billing"], ...PARKED.map((k) => [k, "billing"])]) {
    assert.equal((await w.register(key, kind)).status, 201);
  }
  for (const key of RERUN) assert.equal((await w.register(key, "rerun")).status, 201);
  await w.deliver("batch.succeeded", DONE);
  await w.deliver("batch.succeeded", OTHER);
  for (const key of RERUN) await w.deliver("batch.succeeded", key);
  await w.ledger([DONE, OTHER, ...RERUN], (m) => m.effect_done);
  assert.equal((await w.admin(`/v1/operations/${FORGOTTEN}/forget`, { method: "POST", body: "{}" })).status, 200);
  billingUp = false;
  for (const key of PARKED) await w.deliver("batch.succeeded", key, { output_file_uri: `gs://out/${key}.jsonl` });
  await w.ledger(PARKED, (m) => m.parked);
  await w.ledger(FORGOTTEN, (m) => m.forgotten);
  await w.ledger(OPEN);
});
after(async () => {
  await w?.dispose();
  await dest?.close();
  dest?.assertAllValid();
});

const bulk = (action, body) => w.admin(`/v1/bulk/${action}`, { method: "POST", body: JSON.stringify(body) });

/** Runs a bulk action to the end, passing each answer's cursor back; returns every answer. */
async function runAll(action, body) {
  const answers = [];
  let cursor;
  do {
    const r = await bulk(action, { ...body, ...(cursor ? { cursor } : {}) });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    answers.push(r.body);
    cursor = r.body.cursor;
    assert.equal(r.body.complete, cursor === null);
  } while (cursor && answers.length < 50);
  return answers;
}

describe("bulk actions", () => {
  it("a dry run counts what matches and changes nothing", async () => {
    const sent = dest.requests.length;
    const parked = await bulk("retry", { filter: { kind: "billing", parked: true }, dry_run: true });
    assert.equal(parked.status, 200, JSON.stringify(parked.body));
    assert.deepEqual([parked.body.matched, parked.body.eligible, parked.body.complete, parked.body.dry_run], [5, 5, true, true]);
    const all = await bulk("retry", { filter: { kind: "billing" }, dry_run: true });
    assert.deepEqual([all.body.matched, all.body.eligible, all.body.skipped], [8, 5, 3]);
    assert.deepEqual(all.body.skipped_by, { done: 1, forgotten: 1, no_outcome: 1 });
    assert.equal(all.body.retried, undefined, "a dry run retries nothing");
    assert.equal(dest.requests.length, sent, "no side effect went out");
    for (const key of PARKED) {
      const op = (await w.inspect(key)).body;
      assert.equal(op.effect_parked, true);
      assert.ok(!op.history.some((h) => h.what === "retry_now"), `${key}: no action recorded`);
    }
  });

  it("refuses what it cannot do as asked", async () => {
    for (const body of [{ filter: { status: "done" } }, { filter: { parked: 1 } }, { filter: { limit: "5" } }, { limit: 0 }, { per_second: 0 }, { cursor: "nope" }, { filters: {} }]) {
      assert.equal((await bulk("retry", body)).status, 400, JSON.stringify(body));
    }
    assert.equal((await w.admin("/v1/bulk/undo", { method: "POST", body: "{}" })).status, 404);
    assert.equal((await w.admin("/v1/bulk/retry")).status, 405);
    const anonymous = await w.json("/v1/bulk/retry", { method: "POST", body: JSON.stringify({ dry_run: true }) });
    assert.equal(anonymous.status, 401);
  });

  it("retries every parked effect once, under its refused attempt's webhook-id, resuming across small pages", async () => {
    billingUp = true;
    const refused = Object.fromEntries(PARKED.map((k) => [k, effectsFor(k)]));
    for (const key of PARKED) assert.equal(refused[key].length, 1, `${key}: one refused attempt`);
    const answers = await runAll("retry", { filter: { kind: "billing" }, reason: "billing route fixed", limit: 2, per_second: 20 });
    assert.equal(answers.length, 4, "8 matches, 2 a request: the last request ends complete");
    for (const a of answers) assert.ok(a.matched <= 2, "a page takes at most limit operations");
    // Progress: each answer's totals include the ones before it.
    for (let i = 1; i < answers.length; i++) assert.ok(answers[i].total.matched >= answers[i - 1].total.matched);
    const total = answers.at(-1).total;
    assert.deepEqual([total.matched, total.retried, total.skipped, total.failed], [8, 5, 3, 0]);
    assert.deepEqual(total.skipped_by, { done: 1, forgotten: 1, no_outcome: 1 });
    assert.deepEqual(answers.at(-1).pace, { per_second: 20, limit: 2 });
    await w.ledger(PARKED, (m) => m.effect_done && !m.parked);
    for (const key of PARKED) {
      const effects = effectsFor(key);
      assert.equal(effects.length, 2, `${key}: one more attempt`);
      assert.equal(effects[1].headers["webhook-id"], refused[key][0].headers["webhook-id"], `${key}: the same webhook-id`);
      assert.equal(effects[1].headers["effect-generation"], "1");
      const op = (await w.inspect(key)).body;
      assert.ok(op.history.some((h) => h.what === "retry_now" && h.reason === "bulk retry: billing route fixed"), `${key}: the reason is recorded`);
    }
    assert.equal(effectsFor(DONE).length, 1, "a done effect is not sent again");
    assert.equal(effectsFor(OTHER).length, 1, "another kind is not touched");
    // Run again: everything matching is done now, so nothing is retried.
    const again = await runAll("retry", { filter: { kind: "billing" }, limit: 100 });
    assert.deepEqual([again.at(-1).total.retried, again.at(-1).total.skipped_by.done], [0, 6]);
  });

  it("a cursor resumes only the run that issued it", async () => {
    const first = await bulk("retry", { filter: { kind: "billing" }, dry_run: true });
    assert.equal(first.body.complete, true);
    const page = await bulk("retry", { filter: { kind: "billing" }, limit: 1 });
    assert.equal(page.body.complete, false);
    const cursor = page.body.cursor;
    assert.equal((await bulk("retry", { filter: { kind: "nightly" }, limit: 1, cursor })).status, 400);
    assert.equal((await bulk("retry", { filter: { kind: "billing" }, dry_run: true, cursor })).status, 400);
    assert.equal((await bulk("redeliver", { filter: { kind: "billing" }, reason: "r", cursor })).status, 400);
    assert.equal((await bulk("retry", { filter: { kind: "billing" }, limit: 1, cursor })).status, 200);
  });

  it("redelivers done effects on purpose: a reason is required, each one goes out as a new generation", async () => {
    const none = await bulk("redeliver", { filter: { kind: "billing" } });
    assert.equal(none.status, 400);
    assert.match(none.body.error, /reason/);
    const dry = await bulk("redeliver", { filter: { prefix: "batches/bulk-p" }, reason: "receiver lost them", dry_run: true });
    assert.deepEqual([dry.body.matched, dry.body.eligible], [5, 5]);
    const before = Object.fromEntries(PARKED.map((k) => [k, effectsFor(k).at(-1).headers["webhook-id"]]));
    const answers = await runAll("redeliver", { filter: { prefix: "batches/bulk-p" }, reason: "receiver lost them", limit: 3, per_second: 20, sent_before: dry.body.sent_before });
    assert.equal(answers.length, 2);
    assert.deepEqual([answers.at(-1).total.matched, answers.at(-1).total.redelivered, answers.at(-1).total.skipped], [5, 5, 0]);
    await eventually(() => PARKED.every((k) => effectsFor(k).length === 3), { what: "the redeliveries" });
    for (const key of PARKED) {
      const last = effectsFor(key).at(-1);
      assert.equal(last.headers["effect-generation"], "2");
      assert.notEqual(last.headers["webhook-id"], before[key], `${key}: a new webhook-id`);
      assert.equal(last.headers["idempotency-key"], key);
      const op = await eventually(async () => { const o = (await w.inspect(key)).body; return o.effect_done && o; }, { what: `${key} done` });
      assert.equal(op.generation, 2);
      assert.equal(op.redeliveries[0].reason, "bulk redeliver: receiver lost them");
    }
    // Not done (no outcome) and forgotten ones are skipped by redelivery too.
    const rest = await runAll("redeliver", { filter: { kind: "billing", effect_done: false }, reason: "r", dry_run: true });
    assert.deepEqual([rest.at(-1).total.eligible, rest.at(-1).total.skipped_by], [0, { forgotten: 1, no_outcome: 1 }]);
  });

  it("a redelivery run has an identity, its cut-off: run again with it, it sends nothing more; a new run sends again", async () => {
    const body = { filter: { kind: "rerun" }, reason: "receiver restored from backup", limit: 2, per_second: 20 };
    /** Waits until each key's effect of `generation` is done, in its record and its ledger entry. */
    const settledAt = async (generation) => {
      for (const key of RERUN) {
        const op = await eventually(async () => { const o = (await w.inspect(key)).body; return o.generation === generation && o.effect_done && o; }, { what: `${key} generation ${generation} done` });
        await w.ledger(key, (m) => m.effect_done && m.version >= op.version);
      }
    };
    for (const key of RERUN) assert.equal(effectsFor(key).length, 1);

    // A run needs its identity from the caller: without one, a request sent again (its answer
    // lost) would be a new run and send everything again.
    const unnamed = await bulk("redeliver", body);
    assert.equal(unnamed.status, 400);
    assert.match(unnamed.body.error, /needs sent_before/);
    // The dry run answers the cut-off: when it counted.
    const counted = await bulk("redeliver", { ...body, dry_run: true });
    const sent_before = counted.body.sent_before;
    assert.ok(Date.parse(sent_before) > 0, JSON.stringify(counted.body));
    // The run: 3 settled operations, 3 redeliveries, one cut-off across its two requests.
    const first = await runAll("redeliver", { ...body, sent_before });
    assert.equal(first.length, 2);
    for (const a of first) assert.equal(a.sent_before, sent_before, "every answer gives the run's cut-off");
    assert.deepEqual([first.at(-1).total.matched, first.at(-1).total.redelivered, first.at(-1).total.skipped], [3, 3, 0]);
    await eventually(() => RERUN.every((k) => effectsFor(k).length === 2), { what: "the run's redeliveries" });
    const ids = Object.fromEntries(RERUN.map((k) => [k, effectsFor(k).map((e) => e.headers["webhook-id"])]));

    // The same run sent again as it was sent, first request included, at once (the generation
    // it sent may still be on its way): nothing.
    const again = await runAll("redeliver", { ...body, sent_before });
    assert.deepEqual([again.at(-1).total.matched, again.at(-1).total.redelivered, again.at(-1).total.retried, again.at(-1).total.skipped], [3, 0, 0, 3]);
    // Again once the ledger shows them done: each gate refuses, having sent it since the cut-off.
    await settledAt(2);
    const later = await runAll("redeliver", { ...body, sent_before });
    assert.deepEqual([later.at(-1).total.redelivered, later.at(-1).total.skipped_by], [0, { sent_since_cutoff: 3 }]);
    assert.equal(later.at(-1).sent_before, sent_before);
    // A cut-off may not change mid-run (the cursor carries it), be in the future, or go with a retry.
    const part = await bulk("redeliver", { ...body, limit: 1, sent_before });
    assert.deepEqual([part.body.complete, part.body.redelivered], [false, 0]);
    const moved = await bulk("redeliver", { ...body, limit: 1, sent_before: new Date(Date.parse(sent_before) - 1).toISOString(), cursor: part.body.cursor });
    assert.equal(moved.status, 400);
    assert.match(moved.body.error, /cursor/);
    const future = await bulk("redeliver", { ...body, sent_before: new Date(Date.now() + 60_000).toISOString() });
    assert.equal(future.status, 400);
    assert.match(future.body.error, /sent_before is in the future/);
    assert.equal((await bulk("retry", { filter: { kind: "rerun" }, sent_before })).status, 400);
    await new Promise((r) => setTimeout(r, 500));
    for (const key of RERUN) {
      assert.equal(effectsFor(key).length, 2, `${key}: no effect sent by running it again`);
      const op = (await w.inspect(key)).body;
      assert.equal(op.generation, 2);
      assert.equal(op.redeliveries.length, 1);
    }


    // A new run (a new cut-off, counted now): each one goes out once more, as a new generation.
    const recount = await bulk("redeliver", { ...body, dry_run: true });
    const fresh = await runAll("redeliver", { ...body, sent_before: recount.body.sent_before });
    assert.ok(Date.parse(fresh[0].sent_before) > Date.parse(sent_before));
    assert.deepEqual([fresh.at(-1).total.matched, fresh.at(-1).total.redelivered], [3, 3]);
    await eventually(() => RERUN.every((k) => effectsFor(k).length === 3), { what: "the new run's redeliveries" });
    for (const key of RERUN) {
      const last = effectsFor(key).at(-1);
      assert.equal(last.headers["effect-generation"], "3");
      assert.ok(!ids[key].includes(last.headers["webhook-id"]), `${key}: a new webhook-id`);
    }
  });
});
