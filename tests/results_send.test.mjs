// Sending a batch's results, against the built worker in workerd (a local stand-in for Gemini
// serves the results file; local destinations count every request by its `webhook-id`):
// one body per `webhook-id` when an operator's retry changes the job effect's counts (a new
// generation); retry now on a job's effect that waits for its results is refused; a result that keeps failing is parked and alerted once, and `/metrics` counts
// the results by destination; results refused or failing past the threshold alert once per
// spell, each operator's retry a new spell, and the alert resolves once a spell parks none; a queue destination gets each body once and parks one over the
// queue's message limit; 60 KB keys to a failing destination keep the stored progress within
// a row (each send committed, no `alarm_failing`); at most 6 sends in flight per invocation;
// a result sender cut off by the gate's bound (`RESULTS_SENDER_TIMEOUT_MS`) loses nothing: its
// group is sent again under the same ids, and the destination is not counted as failing;
// result senders that answer nothing past the alert threshold alert once, park nothing, and
// the alert resolves once a sender answers again.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { Webhook } from "standardwebhooks";
import { startWorker, startServer, eventually, sleep, assertEffectValid, EFFECT_SECRET, READ_TOKEN } from "./helpers.mjs";
import { startGemini, succeeded, fileOf, split, distinct, untilJob, workerVars } from "./results_stub.mjs";

const enc = encodeURIComponent;

/** Every `webhook-id` the destination saw for `key`, with the distinct bodies sent under it. */
function bodiesById(dest, key) {
  const byId = new Map();
  for (const r of dest.requests) {
    if (JSON.parse(r.body).key !== key) continue;
    const id = r.headers["webhook-id"];
    byId.set(id, (byId.get(id) ?? new Set()).add(r.body));
  }
  return byId;
}

describe("sending a batch's results", () => {
  let gemini, dest, sink;
  const refuse = new Set(), failing = new Set(), jobFails = new Set();
  const vars = (extra = {}) => ({
    ...workerVars({ dest, gemini, sink }),
    DESTINATION_OPEN_AFTER: "1000",
    STATS_FLUSH_SECONDS: "0",
    ...extra,
  });
  before(async () => {
    gemini = await startGemini();
    sink = await startServer(() => ({ status: 200 }));
    dest = await startServer((req) => {
      const body = JSON.parse(req.body);
      if (body.result_key && refuse.has(body.result_key)) return { status: 422 };
      if (body.result_key && failing.has(body.result_key)) return { status: 503 };
      if (!body.result_key && jobFails.has(body.key)) return { status: 503 };
      return { status: 200 };
    });
  });
  after(async () => { await gemini.close(); await dest.close(); await sink.close(); });

  it("one body per webhook-id: a retry that changes the counts sends the job's effect as a new generation, never a new body under its id", { timeout: 120_000 }, async () => {
    const w = await startWorker(vars());
    const key = "batches/recount1";
    try {
      gemini.files.set("files/recount1", fileOf(20));
      gemini.status.set(key, succeeded(key, { responsesFile: "files/recount1" }));
      refuse.add("k5");
      jobFails.add(key);
      await w.register(key, "other", { results: "each" });
      await w.deliver("batch.succeeded", key);
      const { jobs } = await untilJob(dest, key);
      assert.deepEqual(jobs[0].body.results, { total: 20, delivered: 19, errors: 0, parked: 1 });
      // The job's effect keeps failing (retried under its id) while an operator retries the
      // refused result, which the destination now accepts.
      await eventually(() => split(dest, key).jobs.length >= 2, { timeoutMs: 30_000, what: "a retry of the job's effect" });
      refuse.delete("k5");
      const retry = await w.admin(`/v1/operations/${enc(key)}/results/retry`, { method: "POST", body: JSON.stringify({ reason: "fixed" }) });
      assert.equal(retry.body.retried, 1);
      const recounted = await eventually(async () => {
        const op = (await w.inspect(key)).body;
        return op.results_counts?.parked === 0 && op;
      }, { timeoutMs: 30_000, what: "the results settled again" });
      assert.equal(recounted.generation, 2, "a new generation of the job's effect");
      jobFails.delete(key);
      await eventually(async () => (await w.inspect(key)).body.effect_done, { timeoutMs: 30_000, what: "the new generation delivered" });
      // Every id the destination saw carried one body.
      for (const [id, bodies] of bodiesById(dest, key)) assert.equal(bodies.size, 1, `one body under ${id}`);
      const all = split(dest, key);
      const jobIds = [...new Set(all.jobs.map((j) => j.id))];
      assert.equal(jobIds.length, 2, "the first generation, then the second");
      assert.deepEqual(all.jobs.find((j) => j.id === jobIds[0]).body.results.parked, 1);
      const second = all.jobs.filter((j) => j.id === jobIds[1]);
      assert.deepEqual(second[0].body.results, { total: 20, delivered: 20, errors: 0, parked: 0 });
      assert.ok(all.jobs.findIndex((j) => j.id === jobIds[1]) > all.jobs.findLastIndex((j) => j.id === jobIds[0]), "the first generation is not sent after the second began");
      const gen = dest.requests.filter((r) => r.headers["webhook-id"] === jobIds[1]).map((r) => r.headers["effect-generation"]);
      assert.ok(gen.every((g) => g === "2"), gen.join());
      // Each result once by id, k5 twice under its one id (refused, then accepted).
      assert.equal(distinct(all.results.map((r) => r.id)), 20);
      assert.equal(all.results.filter((r) => r.body.result_key === "k5").length, 2);
    } finally {
      refuse.clear();
      jobFails.clear();
      await w.dispose();
    }
  });

  it("retry now on a job's effect that waits for its results is refused (409, naming the results' retry) and changes nothing; the results' retry moves them", { timeout: 120_000 }, async () => {
    const w = await startWorker(vars());
    const key = "batches/owed1";
    try {
      gemini.files.set("files/owed1", fileOf(5));
      gemini.status.set(key, succeeded(key, { responsesFile: "files/owed1" }));
      failing.add("k2");
      await w.register(key, "other", { results: "each" });
      await w.deliver("batch.succeeded", key);
      // k2 failed once and waits for its retry (EFFECT_ALERT_AFTER_SECONDS is an hour): the
      // job's effect waits for it.
      await eventually(() => split(dest, key).results.some((r) => r.body.result_key === "k2"), { what: "k2 tried" });
      const refused = await w.admin(`/v1/operations/${enc(key)}/retry`, { method: "POST", body: JSON.stringify({ reason: "impatient" }) });
      assert.equal(refused.status, 409, JSON.stringify(refused.body));
      assert.match(refused.body.error, /waits for the batch's results.*results\/retry/);
      const after = (await w.inspect(key)).body;
      assert.ok(!after.history.some((h) => h.what === "retry_now"), "no retry recorded");
      assert.equal(after.effect_done, false);
      assert.equal(split(dest, key).jobs.length, 0, "the job's effect did not go");
      failing.delete("k2");
      const retry = await w.admin(`/v1/operations/${enc(key)}/results/retry`, { method: "POST", body: JSON.stringify({ reason: "fixed" }) });
      assert.equal(retry.status, 200, JSON.stringify(retry.body));
      const { jobs } = await untilJob(dest, key);
      assert.deepEqual(jobs[0].body.results, { total: 5, delivered: 5, errors: 0, parked: 0 });
    } finally {
      failing.clear();
      await w.dispose();
    }
  });

  it("a result that keeps failing is parked past EFFECT_ALERT_AFTER_SECONDS, alerted once naming the batch and how many; the job's effect goes; /metrics counts the results by destination", { timeout: 120_000 }, async () => {
    const w = await startWorker(vars({ EFFECT_ALERT_AFTER_SECONDS: "3" }));
    const key = "batches/failing1";
    try {
      gemini.files.set("files/failing1", fileOf(20));
      gemini.status.set(key, succeeded(key, { responsesFile: "files/failing1" }));
      failing.add("k7");
      await w.register(key, "other", { results: "each" });
      const started = Date.now();
      await w.deliver("batch.succeeded", key);
      const { jobs } = await untilJob(dest, key, 60_000);
      assert.ok(Date.now() - started >= 3_000, "not before the threshold");
      assert.deepEqual(jobs[0].body.results, { total: 20, delivered: 19, errors: 0, parked: 1 });
      const sent = split(dest, key).results.filter((r) => r.body.result_key === "k7");
      assert.ok(sent.length >= 2 && distinct(sent.map((r) => r.id)) === 1, "retried under its one id, then parked");
      const parked = await w.admin(`/v1/operations/${enc(key)}/results?state=parked`);
      assert.deepEqual(parked.body.results.map((r) => r.result_key), ["k7"]);
      assert.match(parked.body.results[0].last_error, /^failing for .*503/);
      const alerts = await eventually(() => {
        const a = sink.requests.map((r) => JSON.parse(r.body)).filter((b) => b.key === key);
        return a.length > 0 && a;
      }, { what: "the alert" });
      await sleep(1_500);
      const again = sink.requests.map((r) => JSON.parse(r.body)).filter((b) => b.key === key);
      assert.deepEqual(again.map((a) => a.alert), ["results_failing"], "one alert");
      assert.equal(alerts[0].name, key);
      assert.match(alerts[0].text, /1 of its results are parked, refused by their destination or still failing after/);
      // /metrics: the results by how they ended and where they went.
      const metric = (result) => async () => {
        const page = await (await w.fetch("/metrics", { headers: { authorization: `Bearer ${READ_TOKEN}` } })).text();
        const line = page.split("\n").find((l) => l.startsWith(`gemini_once_results_by_destination_total{result="${result}",destination="default"}`));
        return line ? Number(line.split(" ").pop()) : 0;
      };
      await eventually(async () => (await metric("delivered")()) === 19, { timeoutMs: 60_000, what: "19 delivered" });
      await eventually(async () => (await metric("parked")()) === 1, { timeoutMs: 60_000, what: "1 parked" });
      assert.equal(await metric("failed")(), sent.length, "each failed attempt");
    } finally {
      failing.clear();
      await w.dispose();
    }
  });

  it("results_failing: one per spell for results refused or failing past the threshold; an operator's retry begins a new spell that alerts again; it resolves (results_recovered) once a spell parks none", { timeout: 150_000 }, async () => {
    const w = await startWorker(vars({ EFFECT_ALERT_AFTER_SECONDS: "3" }));
    const key = "batches/failing2";
    const alerts = () => sink.requests.map((r) => JSON.parse(r.body)).filter((b) => b.key === key);
    const failingAlerts = () => alerts().filter((a) => a.alert === "results_failing");
    const retry = async () => {
      const r = await w.admin(`/v1/operations/${enc(key)}/results/retry`, { method: "POST", body: JSON.stringify({ reason: "fixed" }) });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      return r.body;
    };
    /** Waits for the results to settle the `spell`th time with these counts, every alert sent. */
    const settledWith = (spell, counts) => eventually(async () => {
      const op = (await w.inspect(key)).body;
      const settledRows = op.history.filter((h) => h.what === "results_settled").length;
      const same = Object.keys(counts).every((k) => op.results_counts?.[k] === counts[k]);
      return settledRows === spell && same && op.alerts_pending?.length === 0 && op;
    }, { timeoutMs: 60_000, what: `spell ${spell} settled with ${JSON.stringify(counts)}` });
    try {
      gemini.files.set("files/failing2", fileOf(10));
      gemini.status.set(key, succeeded(key, { responsesFile: "files/failing2" }));
      // k3 keeps failing (parked past the threshold); k4 is refused (parked at once): one
      // alert for the spell.
      failing.add("k3");
      refuse.add("k4");
      await w.register(key, "other", { results: "each" });
      await w.deliver("batch.succeeded", key);
      await untilJob(dest, key, 60_000);
      await settledWith(1, { total: 10, delivered: 8, errors: 0, parked: 2 });
      assert.deepEqual(alerts().map((a) => a.alert), ["results_failing"], "one alert for the spell");
      assert.match(failingAlerts()[0].text, /of its results are parked, refused by their destination or still failing after/);
      // The destination takes k3 now; k4 is still refused: a new spell, alerted again, and
      // nothing resolved.
      failing.delete("k3");
      assert.equal((await retry()).retried, 2);
      await settledWith(2, { total: 10, delivered: 9, errors: 0, parked: 1 });
      const failings = failingAlerts();
      assert.deepEqual(alerts().map((a) => a.alert), ["results_failing", "results_failing"]);
      assert.match(failings[1].text, /1 of its results are parked/);
      assert.notEqual(failings[1].alert_id, failings[0].alert_id, "a new alert, not a repeat of the first");
      // A third spell: k4 now fails instead of being refused, past the threshold again.
      refuse.delete("k4");
      failing.add("k4");
      assert.equal((await retry()).retried, 1);
      await eventually(() => failingAlerts().length === 3, { timeoutMs: 60_000, what: "a third results_failing" });
      let op = await settledWith(3, { total: 10, delivered: 9, errors: 0, parked: 1 });
      assert.equal(distinct(failingAlerts().map((a) => a.alert_id)), 3);
      assert.ok(op.history.filter((h) => h.what === "results_gave_up").length === 3, JSON.stringify(op.history.map((h) => h.what)));
      // Delivered at last: a spell that parks none resolves it.
      failing.delete("k4");
      assert.equal((await retry()).retried, 1);
      const recovered = await eventually(() => alerts().find((a) => a.alert === "results_recovered"), { timeoutMs: 30_000, what: "the results_recovered resolution" });
      assert.equal(recovered.resolves, "results_failing");
      op = await settledWith(4, { total: 10, delivered: 10, errors: 0, parked: 0 });
      assert.deepEqual(alerts().map((a) => a.alert), ["results_failing", "results_failing", "results_failing", "results_recovered"]);
      assert.ok(op.history.some((h) => h.what === "results_settled" && h.counts.parked === 0), JSON.stringify(op.history.map((h) => h.what)));
    } finally {
      failing.clear();
      refuse.clear();
      await w.dispose();
    }
  });

  it("40 results with 60 KB keys to a failing destination: every send committed (bounded, counted), no alarm_failing; all delivered once it recovers", { timeout: 120_000 }, async () => {
    const w = await startWorker(vars());
    const key = "batches/longkeys1";
    try {
      const keyOf = (i) => `${i}-${"k".repeat(60 * 1024)}`;
      const lines = Array.from({ length: 40 }, (_, i) => JSON.stringify({ key: keyOf(i), response: { n: i } }));
      gemini.files.set("files/longkeys1", Buffer.from(lines.join("\n") + "\n"));
      gemini.status.set(key, succeeded(key, { responsesFile: "files/longkeys1" }));
      for (let i = 0; i < 40; i++) failing.add(keyOf(i));
      await w.register(key, "other", { results: "each" });
      await w.deliver("batch.succeeded", key);
      await eventually(() => {
        const { results } = split(dest, key);
        return results.length >= 120;
      }, { timeoutMs: 60_000, what: "three rounds of sends" });
      // Each send was committed: the stored rows count the attempts the destination saw (a
      // round may be in flight), with the key shown cut.
      const waiting = await w.admin(`/v1/operations/${enc(key)}/results?state=waiting`);
      assert.equal(waiting.body.results.length, 40);
      const sends = new Map();
      for (const r of split(dest, key).results) sends.set(r.id, (sends.get(r.id) ?? 0) + 1);
      assert.equal(sends.size, 40, "one id each");
      const stored = waiting.body.results.reduce((n, r) => n + r.attempts, 0);
      const seen = [...sends.values()].reduce((n, c) => n + c, 0);
      assert.ok(seen >= stored && seen <= stored + 40, `sent ${seen}, committed ${stored}`);
      assert.ok(waiting.body.results.every((r) => r.attempts >= 2 && r.result_key.length <= 257), "each committed, its key shown cut");
      assert.ok([...sends.values()].every((c) => c <= 12), "each id a bounded number of times");
      failing.clear();
      const { jobs } = await untilJob(dest, key, 60_000);
      assert.deepEqual(jobs[0].body.results, { total: 40, delivered: 40, errors: 0, parked: 0 });
      assert.equal(distinct(split(dest, key).results.map((r) => r.id)), 40);
      const alarmFailing = sink.requests.map((r) => JSON.parse(r.body)).filter((a) => a.alert === "alarm_failing");
      assert.equal(alarmFailing.length, 0);
    } finally {
      failing.clear();
      await w.dispose();
    }
  });
});

describe("sends in flight", () => {
  it("a step fans its results out to 6 senders, each sending at most 6 at a time (production's outgoing connections per invocation)", { timeout: 90_000 }, async () => {
    const gemini = await startGemini();
    const sink = await startServer(() => ({ status: 200 }));
    let inFlight = 0, most = 0;
    const seen = [];
    const server = createServer((req, res) => {
      inFlight++;
      most = Math.max(most, inFlight);
      const chunks = [];
      req.on("data", (c) => chunks.push(c));
      req.on("end", () => setTimeout(() => {
        seen.push({ id: req.headers["webhook-id"], body: JSON.parse(Buffer.concat(chunks).toString()) });
        inFlight--;
        res.writeHead(200).end("{}");
      }, 150));
    });
    await new Promise((r) => server.listen(0, "127.0.0.1", r));
    const dest = { url: `http://127.0.0.1:${server.address().port}` };
    const w = await startWorker(workerVars({ dest, gemini, sink }));
    try {
      const key = "batches/inflight1";
      gemini.files.set("files/inflight1", fileOf(80));
      gemini.status.set(key, succeeded(key, { responsesFile: "files/inflight1" }));
      await w.register(key, "other", { results: "each" });
      await w.deliver("batch.succeeded", key);
      await eventually(() => seen.some((r) => r.body.key === key && !("result_key" in r.body)), { timeoutMs: 60_000, what: "the job effect" });
      assert.equal(new Set(seen.filter((r) => r.body.result_key).map((r) => r.id)).size, 80);
      // 80 results: 6 groups of 13 or 14, each sent by its own invocation at most 6 at a time.
      assert.ok(most <= 36, `at most 6 senders of 6 in flight: ${most}`);
      assert.ok(most > 6, `more than one invocation's 6 in flight: ${most}`);
    } finally {
      await w.dispose();
      await new Promise((r) => { server.closeAllConnections(); server.close(r); });
      await gemini.close();
      await sink.close();
    }
  });
});

describe("a fanned-out batch", () => {
  it("delivers every result exactly once, under one webhook-id each, through several waves of senders", { timeout: 180_000 }, async () => {
    const gemini = await startGemini();
    const sink = await startServer(() => ({ status: 200 }));
    // Each result's first attempt fails (503) for one key in 50: its group's other results
    // are committed delivered, and it goes again under its same id, never doubled.
    const tries = new Map(), accepted = new Map();
    const dest = await startServer((req) => {
      const body = JSON.parse(req.body);
      const id = req.headers["webhook-id"];
      tries.set(id, (tries.get(id) ?? 0) + 1);
      if (body.result_key && Number(body.result_key.slice(1)) % 50 === 0 && tries.get(id) === 1) return { status: 503 };
      if (body.result_key) accepted.set(id, (accepted.get(id) ?? 0) + 1);
      return { status: 200 };
    });
    const w = await startWorker(workerVars({ dest, gemini, sink }));
    try {
      const key = "batches/fanout1";
      const lines = 600;
      gemini.files.set("files/fanout1", fileOf(lines));
      gemini.status.set(key, succeeded(key, { responsesFile: "files/fanout1" }));
      await w.register(key, "other", { results: "each" });
      await w.deliver("batch.succeeded", key);
      const { jobs } = await untilJob(dest, key, 150_000);
      assert.deepEqual(jobs[0].body.results, { total: lines, delivered: lines, errors: 0, parked: 0 });
      const { results } = split(dest, key);
      assert.equal(distinct(results.map((r) => r.id)), lines, "one webhook-id per result");
      assert.equal(distinct(results.map((r) => r.body.result_key)), lines);
      assert.equal(accepted.size, lines, "every result accepted");
      assert.ok([...accepted.values()].every((n) => n === 1), "none accepted twice");
      // The failed ones went again under their first id, with the same body.
      const failedIds = [...tries].filter(([, n]) => n > 1).map(([id]) => id);
      assert.ok(failedIds.length >= 1);
      for (const id of failedIds) assert.equal(new Set(results.filter((r) => r.id === id).map((r) => JSON.stringify(r.body))).size, 1, `one body under ${id}`);
    } finally {
      await w.dispose();
      await gemini.close();
      await dest.close();
      await sink.close();
    }
  });
});

describe("a result sender that answers too late", () => {
  it("its group is sent again under the same ids (a repeat only of what left), the other groups are committed, nothing counts as the destination failing, and the batch finishes", { timeout: 120_000 }, async () => {
    const gemini = await startGemini();
    const sink = await startServer(() => ({ status: 200 }));
    // The destination holds k13's first copy 4 s (inside EFFECT_TIMEOUT_MS, 5 s, so the
    // sender gets its 200), past the gate's 2 s wait for that sender: the gate gives up on the
    // sender that carries it. Every other request is answered at once.
    const seen = [];
    let held = 0;
    const server = createServer((req, res) => {
      const chunks = [];
      req.on("data", (c) => chunks.push(c));
      req.on("end", () => {
        const body = Buffer.concat(chunks).toString();
        const id = req.headers["webhook-id"];
        seen.push({ id, body: JSON.parse(body), raw: body });
        const first = JSON.parse(body).result_key === "k13" && held++ === 0;
        setTimeout(() => res.writeHead(200).end("{}"), first ? 4_000 : 0);
      });
    });
    await new Promise((r) => server.listen(0, "127.0.0.1", r));
    const dest = { url: `http://127.0.0.1:${server.address().port}` };
    const w = await startWorker({ ...workerVars({ dest, gemini, sink }), RESULTS_SENDER_TIMEOUT_MS: "2000", STATS_FLUSH_SECONDS: "0" });
    const key = "batches/latesender1";
    const lines = 80;
    try {
      gemini.files.set("files/latesender1", fileOf(lines));
      gemini.status.set(key, succeeded(key, { responsesFile: "files/latesender1" }));
      await w.register(key, "other", { results: "each" });
      await w.deliver("batch.succeeded", key);
      const job = await eventually(() => seen.find((r) => r.body.key === key && !("result_key" in r.body)), { timeoutMs: 60_000, what: "the job effect" });
      assert.deepEqual(job.body.results, { total: lines, delivered: lines, errors: 0, parked: 0 });
      await eventually(async () => (await w.inspect(key)).body.effect_done, { timeoutMs: 30_000, what: "the batch finished" });
      const results = seen.filter((r) => r.body.key === key && r.body.result_key);
      const byId = new Map();
      for (const r of results) byId.set(r.id, [...(byId.get(r.id) ?? []), r]);
      assert.equal(byId.size, lines, "every result arrived, under one id each");
      for (const [id, copies] of byId) assert.equal(new Set(copies.map((c) => c.raw)).size, 1, `one body under ${id}`);
      assert.equal(new Set(results.map((r) => r.body.result_key)).size, lines);
      // k13's sender was cut off: k13 went again under its id, and so did the results its
      // sender had sent (they left: a repeat the id makes harmless); a group whose sender
      // answered in time was committed, not sent again.
      const k13 = results.filter((r) => r.body.result_key === "k13");
      assert.ok(k13.length >= 2 && new Set(k13.map((r) => r.id)).size === 1, `k13 sent again under its id: ${k13.length}`);
      const repeated = [...byId.values()].filter((c) => c.length > 1).map((c) => c[0].body.result_key);
      assert.ok(repeated.length < lines, `not every group was sent again: ${repeated.length}`);
      // Not the destination's failure: no result failed, parked or alerted for it.
      const metric = async (result) => {
        const page = await (await w.fetch("/metrics", { headers: { authorization: `Bearer ${READ_TOKEN}` } })).text();
        const line = page.split("\n").find((l) => l.startsWith(`gemini_once_results_by_destination_total{result="${result}",destination="default"}`));
        return line ? Number(line.split(" ").pop()) : 0;
      };
      await eventually(async () => (await metric("delivered")) === lines, { timeoutMs: 20_000, what: "every result counted delivered" });
      assert.equal(await metric("failed"), 0, "a sender's trouble is no failed attempt");
      assert.equal(await metric("parked"), 0);
      const alerts = sink.requests.map((r) => JSON.parse(r.body)).filter((a) => a.key === key);
      assert.deepEqual(alerts, [], "nothing alerted");
    } finally {
      await w.dispose();
      await new Promise((r) => { server.closeAllConnections(); server.close(r); });
      await gemini.close();
      await sink.close();
    }
  });
});

describe("result senders that answer nothing for ever", () => {
  it("alert results_sender_failing once past EFFECT_ALERT_AFTER_SECONDS (naming how many wait), park nothing, count them unanswered in /metrics; once a sender answers, every result arrives under one id, the batch finishes and results_sender_recovered resolves it", { timeout: 180_000 }, async () => {
    const gemini = await startGemini();
    const sink = await startServer(() => ({ status: 200 }));
    // While `holding`, the destination answers each request 200 after 4 s: past the gate's
    // 2 s wait for a result sender (RESULTS_SENDER_TIMEOUT_MS), so every sender's call is cut
    // off (its sends still arrive: repeats under their ids); the gate's own sends (a few rows
    // due at once) wait for their 200, so nothing is the destination failing. Once released,
    // it answers at once and the senders answer in time.
    const seen = [];
    let holding = true;
    const server = createServer((req, res) => {
      const chunks = [];
      req.on("data", (c) => chunks.push(c));
      req.on("end", () => {
        const raw = Buffer.concat(chunks).toString();
        seen.push({ id: req.headers["webhook-id"], body: JSON.parse(raw), raw });
        setTimeout(() => res.writeHead(200).end("{}"), holding ? 4_000 : 0);
      });
    });
    await new Promise((r) => server.listen(0, "127.0.0.1", r));
    const dest = { url: `http://127.0.0.1:${server.address().port}` };
    const w = await startWorker({ ...workerVars({ dest, gemini, sink }), RESULTS_SENDER_TIMEOUT_MS: "2000", EFFECT_ALERT_AFTER_SECONDS: "3", STATS_FLUSH_SECONDS: "0" });
    const key = "batches/silentsenders1";
    const lines = 120;
    const alerts = () => sink.requests.map((r) => JSON.parse(r.body)).filter((a) => a.key === key);
    const metric = async (result) => {
      const page = await (await w.fetch("/metrics", { headers: { authorization: `Bearer ${READ_TOKEN}` } })).text();
      const line = page.split("\n").find((l) => l.startsWith(`gemini_once_results_by_destination_total{result="${result}",destination="default"}`));
      return line ? Number(line.split(" ").pop()) : 0;
    };
    try {
      gemini.files.set("files/silentsenders1", fileOf(lines));
      gemini.status.set(key, succeeded(key, { responsesFile: "files/silentsenders1" }));
      await w.register(key, "other", { results: "each" });
      await w.deliver("batch.succeeded", key);
      const alert = await eventually(() => alerts().find((a) => a.alert === "results_sender_failing"), { timeoutMs: 90_000, what: "results_sender_failing" });
      assert.match(alert.text, /result senders have answered nothing for .*; \d+ of its results wait/);
      assert.equal(alert.name, key);
      // Nothing parked, nothing failed: the results wait, sent again with backoff.
      const parked = await w.admin(`/v1/operations/${enc(key)}/results?state=parked`);
      assert.deepEqual(parked.body.results, []);
      await eventually(async () => (await metric("unanswered")) > 0, { timeoutMs: 30_000, what: "unanswered results counted" });
      assert.equal(await metric("failed"), 0, "a sender answering nothing is no failed attempt");
      let op = (await w.inspect(key)).body;
      assert.equal(op.effect_done, false, "the batch waits");
      assert.ok(op.history.some((h) => h.what === "result_senders_silent" && h.waiting > 0), JSON.stringify(op.history.map((h) => h.what)));
      holding = false;
      const recovered = await eventually(() => alerts().find((a) => a.alert === "results_sender_recovered"), { timeoutMs: 60_000, what: "results_sender_recovered" });
      assert.equal(recovered.resolves, "results_sender_failing");
      const job = await eventually(() => seen.find((r) => r.body.key === key && !("result_key" in r.body)), { timeoutMs: 60_000, what: "the job effect" });
      assert.deepEqual(job.body.results, { total: lines, delivered: lines, errors: 0, parked: 0 });
      await eventually(async () => (await w.inspect(key)).body.effect_done, { timeoutMs: 30_000, what: "the batch finished" });
      // Every result arrived, each under one id with one body (a sender cut off had sent
      // some already: repeats under their ids, which receivers drop).
      const results = seen.filter((r) => r.body.key === key && r.body.result_key);
      const byKey = new Map();
      for (const r of results) byKey.set(r.body.result_key, [...(byKey.get(r.body.result_key) ?? []), r]);
      assert.equal(byKey.size, lines, "every result arrived");
      for (const [k, copies] of byKey) {
        assert.equal(new Set(copies.map((c) => c.id)).size, 1, `one id for ${k}`);
        assert.equal(new Set(copies.map((c) => c.raw)).size, 1, `one body for ${k}`);
      }
      assert.deepEqual(alerts().map((a) => a.alert), ["results_sender_failing", "results_sender_recovered"], "one alert, one resolution");
      op = (await w.inspect(key)).body;
      assert.deepEqual(op.results_counts, { total: lines, delivered: lines, errors: 0, parked: 0 });
    } finally {
      await w.dispose();
      await new Promise((r) => { server.closeAllConnections(); server.close(r); });
      await gemini.close();
      await sink.close();
    }
  });
});

// A queue consumer: forwards each message as it came, then acknowledges it.
const CONSUMER = `export default {
  async queue(batch, env) {
    for (const m of batch.messages) {
      await fetch(env.SINK + "/queue", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(m.body) });
      m.ack();
    }
  },
};`;

describe("results to a queue", () => {
  it("each body once (a 100 KB result fits), and one over the queue's 128 KB message limit is parked with the reason", { timeout: 90_000 }, async () => {
    const gemini = await startGemini();
    const sink = await startServer(() => ({ status: 200 }));
    const dest = await startServer(() => ({ status: 200 }));
    const w = await startWorker(
      { ...workerVars({ dest, gemini, sink }), EFFECT_ROUTES: JSON.stringify({ billing: "queue:BILLING_EFFECTS" }) },
      {
        main: { queueProducers: { BILLING_EFFECTS: "billing-effects" } },
        workers: [{ name: "billing-consumer", modules: true, script: CONSUMER, compatibilityDate: "2026-04-01", bindings: { SINK: sink.url }, queueConsumers: { "billing-effects": { maxBatchTimeout: 0 } } }],
      },
    );
    try {
      const key = "batches/queued-results1";
      const lines = [
        { key: "small", response: { text: "s" } },
        { key: "fits", response: { text: "f".repeat(100_000) } },
        { key: "over", response: { text: "o".repeat(140_000) } },
      ].map((l) => JSON.stringify(l));
      gemini.files.set("files/queued-results1", Buffer.from(lines.join("\n") + "\n"));
      gemini.status.set(key, succeeded(key, { responsesFile: "files/queued-results1" }));
      await w.register(key, "billing", { results: "each" });
      await w.deliver("batch.succeeded", key);
      const messages = () => sink.requests.filter((r) => r.url === "/queue").map((r) => JSON.parse(r.body)).filter((m) => JSON.parse(m.raw_body).key === key);
      const job = await eventually(() => messages().find((m) => !("result_key" in JSON.parse(m.raw_body))), { timeoutMs: 60_000, what: "the job effect on the queue" });
      for (const m of messages()) {
        assert.deepEqual(Object.keys(m).sort(), ["headers", "raw_body"], "the body once");
        const verified = new Webhook(EFFECT_SECRET).verify(m.raw_body, {
          "webhook-id": m.headers["webhook-id"],
          "webhook-timestamp": m.headers["webhook-timestamp"],
          "webhook-signature": m.headers["webhook-signature"],
        });
        assert.equal(verified.key, key);
      }
      const results = messages().map((m) => JSON.parse(m.raw_body)).filter((b) => b.result_key);
      assert.deepEqual(results.map((b) => b.result_key).sort(), ["fits", "small"]);
      assert.deepEqual(assertEffectValid(JSON.parse(job.raw_body)).results, { total: 3, delivered: 2, errors: 0, parked: 1 });
      const parked = await w.admin(`/v1/operations/${enc(key)}/results?state=parked`);
      assert.deepEqual(parked.body.results.map((r) => r.result_key), ["over"]);
      assert.match(parked.body.results[0].last_error, /^413: a queue message of \d+ bytes is over the queue's limit of 128000 bytes: not sent/);
      assert.equal(parked.body.results[0].attempts, 1, "refused at once, never retried");
    } finally {
      await w.dispose();
      await gemini.close();
      await sink.close();
      await dest.close();
    }
  });
});
