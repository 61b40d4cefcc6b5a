// An open destination's wishes, and a desk that never spins, against the built worker in
// workerd: a destination answering 429 with `Retry-After: 600` is not asked again before that
// (one request per effect, no probe, nothing parked, a later completion waits with the rest);
// a desk whose soonest waiting effect's gate cannot load its record keeps probing the others
// on its schedule, calls that gate only on its own backoff, and drains the rest on recovery.
import { describe, it, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { startWorker, startDestination, startServer, eventually, sleep } from "./helpers.mjs";

const closers = [];
after(async () => {
  for (const c of closers.reverse()) await c();
});

const deskOf = async (w) => (await w.admin("/v1/stats")).body.destinations.find((d) => d.label.startsWith("EFFECT_URL:"));
const sentFor = (dest, key) => dest.requests.filter((r) => r.headers["idempotency-key"] === key);

describe("an open destination's Retry-After", () => {
  it("429 with Retry-After: 600 for 6 effects: one request each, no probe and nothing parked in the next 70 s; a 7th waits without a request", { timeout: 150_000 }, async () => {
    const dest = await startDestination(() => ({ status: 429, headers: { "retry-after": "600" }, body: { error: "slow down" } }));
    const alerts = await startServer(() => ({ status: 200 }));
    const w = await startWorker({
      EFFECT_URL: `${dest.url}/effects`,
      ALERT_URL: `${alerts.url}/alerts`,
      UNREGISTERED_HOLD_SECONDS: "0",
      EFFECT_RETRY_BASE_SECONDS: "1",
    });
    closers.push(async () => { await w.dispose(); await dest.close(); await alerts.close(); });
    const keys = Array.from({ length: 6 }, (_, i) => `batches/wish-${i}`);
    const start = Date.now();
    await Promise.all(keys.map((k) => w.deliver("batch.succeeded", k)));
    const opened = await eventually(async () => {
      const view = await deskOf(w);
      return view?.state === "open" && view;
    }, { what: "the destination open", timeoutMs: 60_000 });
    assert.match(opened.last_error ?? "", /429/);
    // A completion after it opened: its first attempt asks the desk (this isolate heard `Wait`)
    // and waits with the rest.
    const late = "batches/wish-late";
    await w.deliver("batch.succeeded", late);
    await eventually(async () => (await w.inspect(late)).body.waiting_on_destination === true, { what: "the late effect waiting" });
    await eventually(async () => Date.now() - start >= 70_000, { what: "70 s", timeoutMs: 80_000, everyMs: 1_000 });
    const inWindow = dest.requests.filter((r) => r.at - start <= 70_000);
    for (const k of keys) assert.ok(sentFor(dest, k).length <= 2, `${k}: ${sentFor(dest, k).length} requests`);
    assert.equal(sentFor(dest, late).length, 0, "the late effect sent nothing while open");
    assert.ok(inWindow.length <= keys.length + 1, `${inWindow.length} requests in 70 s (at most one per effect plus one probe)`);
    console.log(`retry-after 600: ${inWindow.length} requests in 70 s for ${keys.length} effects (+1 late, 0 sent)`);
    for (const k of [...keys, late]) {
      const { body } = await w.inspect(k);
      assert.equal(body.effect_parked, false, `${k} never parked`);
      assert.equal(body.effect_done, false);
    }
    const view = await deskOf(w);
    assert.equal(view.state, "open");
    dest.assertAllValid();
  });
});

describe("a desk whose soonest effect's gate cannot load", () => {
  it("keeps probing the others on its schedule, tries that gate only on its own backoff, and drains the rest", { timeout: 400_000 }, async (t) => {
    try {
      execFileSync("sqlite3", ["-version"]);
    } catch {
      t.skip("needs the sqlite3 command to write a record that cannot load");
      return;
    }
    let downUntil = Infinity;
    const dest = await startDestination(() => (Date.now() < downUntil ? { status: 503, body: { error: "down" } } : { status: 200 }));
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gemini-once-desk-"));
    const config = {
      EFFECT_URL: `${dest.url}/effects`,
      UNREGISTERED_HOLD_SECONDS: "0",
      EFFECT_RETRY_BASE_SECONDS: "1",
      EFFECT_RETRY_MAX_SECONDS: "20",
      DESTINATION_OPEN_AFTER: "2",
      DESTINATION_PROBE_MAX_SECONDS: "4",
    };
    let w = await startWorker(config, { persist: dir });
    closers.push(async () => { await w?.dispose(); await dest.close(); fs.rmSync(dir, { recursive: true, force: true }); });
    const stuck = "batches/desk-unreadable";
    const others = ["batches/desk-a", "batches/desk-b", "batches/desk-c"];
    // The unreadable one became owed first: the soonest in the desk's queue.
    await w.deliver("batch.succeeded", stuck);
    await sleep(1_000);
    await Promise.all(others.map((k) => w.deliver("batch.succeeded", k)));
    await eventually(async () => (await deskOf(w))?.waiting === 4, { what: "all four waiting", timeoutMs: 30_000, everyMs: 250 });
    const ns = await w.mf.getDurableObjectNamespace("OPERATION_GATE");
    const id = ns.idFromName(stuck).toString();
    await w.dispose();
    w = null;
    const files = fs.readdirSync(dir, { recursive: true }).filter((f) => String(f).endsWith(`${id}.sqlite`));
    assert.equal(files.length, 1);
    // A record of which nothing can be read: every call on its gate fails until a repair.
    execFileSync("sqlite3", [path.join(dir, String(files[0])), `UPDATE record SET body = '{"garbled":{"a":1}}' WHERE id = 1`]);

    const restarted = Date.now();
    w = await startWorker(config, { persist: dir });
    assert.equal((await w.inspect(stuck)).status, 503, "its record cannot load");
    const callsBefore = w.events("record_unreadable").length;
    // While still down, the desk probes the other three on its schedule (2 s, 4 s, 4 s…): the
    // outage lasts until two probes came (a fixed outage counted them against how fast the
    // restarted worker got going). The stop above may have caught a probe between its send and
    // its report: the desk then waits out that probe's lapse (`PROBE_LAPSE_MS`, 60 s) before
    // the next, so the wait allows for one lapse and two probe gaps.
    await eventually(() => dest.requests.filter((r) => r.at >= restarted).length >= 2, { what: "two probes while down", timeoutMs: 120_000, everyMs: 250 });
    downUntil = Date.now();
    const probes = dest.requests.filter((r) => r.at >= restarted && r.at < downUntil);
    console.log(`# ${probes.length} probes in the ${((downUntil - restarted) / 1000).toFixed(1)} s down after the restart`);
    assert.ok(probes.every((r) => r.headers["idempotency-key"] !== stuck));
    // The stop may also have caught a gate between its claim and its answer's commit: such a
    // gate has been seen, in workerd run locally, to run nothing for minutes after the restart,
    // its claim expired. The cron's reconciliation is what wakes a gate that lost its wake, so
    // the wait runs the cron's pass every 10 s (production runs it every 5 minutes).
    let views = [];
    let polls = 0;
    await eventually(async () => {
      if (++polls % 20 === 0) await w.scheduled();
      views = await Promise.all(others.map((k) => w.inspect(k)));
      return views.every((v) => v.body.effect_done);
    }, { what: "the other three delivered", timeoutMs: 150_000, everyMs: 500 }).catch((e) => {
      const left = views.filter((v) => !v.body.effect_done).map((v) => JSON.stringify(v.body));
      throw new Error(`${e.message}; not delivered: ${left.join(" ")}`);
    });
    await sleep(5_000);
    // Calls on the unreadable gate: its own backoff (2 s doubling to 4 s), not a spin.
    const seconds = (Date.now() - restarted) / 1_000;
    const calls = w.events("record_unreadable").length - callsBefore;
    console.log(`unreadable gate: ${probes.length} probes of the others while down; ${calls} calls on the unreadable gate in ${seconds.toFixed(0)} s`);
    assert.ok(calls <= seconds / 2 + 3, `${calls} calls in ${seconds} s`);
    for (const k of others) {
      const sent = sentFor(dest, k);
      assert.ok(sent.every((r) => r.headers["webhook-id"] === sent[0].headers["webhook-id"]), `${k} kept its webhook-id`);
    }
    dest.assertAllValid();
  });
});
