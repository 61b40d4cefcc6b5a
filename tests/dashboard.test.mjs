// The operator's dashboard in a real headless browser (Debian's Chromium driven by
// playwright-core; no browser download), against the built worker in workerd with a real
// destination and a real stand-in for Gemini's API: it signs in, lists operations with
// filters, searches, opens one and reads its timeline, runs retry now (and reads a 409),
// redelivers with a reason, forgets, settles by hand, retries and redelivers in bulk from the
// listing's filter after a dry-run count and a confirmation, draws the trend from the shards' hourly buckets, and
// shows health and configuration. Every view is screenshotted and the PNG decoded; with
// DASHBOARD_SCREENSHOTS=<dir> the three views are also written there (docs/ holds them).
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { inflateSync } from "node:zlib";
import { chromium } from "playwright-core";
import { startWorker, startServer, ADMIN_TOKEN, REGISTER_TOKEN, eventually } from "./helpers.mjs";

const CHROMIUM = process.env.CHROMIUM_PATH || "/usr/bin/chromium";
const SHOTS = process.env.DASHBOARD_SCREENSHOTS;

// The cast, named like a real deployment's operations (they appear in docs/ screenshots).
const STUCK = "batches/eval-run-17";
const PARKED = "batches/billing-0412";
const DONE = "batches/nightly-review-0411";
const FLAKY = "batches/billing-0413";
const SLOW = "batches/embeddings-2211";
const RECONCILED = "batches/nightly-review-0410";
const FORGET = "batches/abandoned-test-3";
const FILLER = ["batches/nightly-review-0409", "batches/translate-fr-551", "batches/translate-de-552"];
const REFUNDS = ["batches/refunds-0901", "batches/refunds-0902", "batches/refunds-0903"];
// A batch registered with "results": "each": six results, two of which its destination refuses.
const PAGES = "batches/pages-0902";
const PAGES_FILE = ["page-1", "page-2", "page-3", "page-4", "page-5", "page-6"]
  .map((key, i) => JSON.stringify(i === 3 ? { key, error: { code: 3, message: "no input" } } : { key, response: { candidates: [{ content: { parts: [{ text: `page ${i + 1}` }] } }] } }))
  .join("\n") + "\n";
const REFUSED_PAGES = ["page-2", "page-5"];
// A second one: chapter-2 fails (503) until the test lets it through, chapter-3 is refused.
const CHAPTERS = "batches/chapters-0903";
const CHAPTERS_FILE = ["chapter-1", "chapter-2", "chapter-3"]
  .map((key, i) => JSON.stringify({ key, response: { candidates: [{ content: { parts: [{ text: `chapter ${i + 1}` }] } }] } }))
  .join("\n") + "\n";
let chapterTwoUp = false;
let chapterThreeUp = false;

let w, dest, gemini, browser, page;
let billingUp = false;
let refundsUp = false;
let releaseSlow;
const slowHeld = new Promise((r) => { releaseSlow = r; });
const shotDir = mkdtempSync(path.join(tmpdir(), "dashboard-shots-"));

const effectsFor = (key) => dest.requests.filter((r) => r.headers["idempotency-key"] === key);

before(async () => {
  assert.ok(existsSync(CHROMIUM), `Chromium not found at ${CHROMIUM}: scripts/setup-browser.sh installs Debian's package`);
  dest = await startServer(async (req) => {
    const key = req.headers["idempotency-key"];
    if (REFUSED_PAGES.some((k) => req.body.includes(`"result_key":"${k}"`))) return { status: 422, body: { error: "page template missing" } };
    if (req.body.includes(`"result_key":"chapter-3"`) && !chapterThreeUp) return { status: 422, body: { error: "chapter template missing" } };
    if (req.body.includes(`"result_key":"chapter-2"`) && !chapterTwoUp) return { status: 503, body: { error: "renderer overloaded" } };
    if (key === PARKED) return billingUp ? { status: 200 } : { status: 400, body: { error: "unknown account" } };
    if (REFUNDS.includes(key)) return refundsUp ? { status: 200 } : { status: 400, body: { error: "refunds API misconfigured" } };
    if (key === FLAKY) return effectsFor(FLAKY).length === 1 ? { status: 503 } : { status: 200 };
    if (key === SLOW && effectsFor(SLOW).length === 1) { await slowHeld; return { status: 200 }; }
    return { status: 200 };
  });
  gemini = await startServer((req) => {
    if (req.url.startsWith(`/download/v1beta/files/${PAGES.split("/")[1]}:download`)) return { status: 200, body: PAGES_FILE };
    if (req.url === `/v1beta/${PAGES}`) return { status: 200, body: { name: PAGES, done: true, metadata: { state: "BATCH_STATE_SUCCEEDED", updateTime: new Date().toISOString() }, response: { responsesFile: `files/${PAGES.split("/")[1]}` } } };
    if (req.url.startsWith(`/download/v1beta/files/${CHAPTERS.split("/")[1]}:download`)) return { status: 200, body: CHAPTERS_FILE };
    if (req.url === `/v1beta/${CHAPTERS}`) return { status: 200, body: { name: CHAPTERS, done: true, metadata: { state: "BATCH_STATE_SUCCEEDED", updateTime: new Date().toISOString() }, response: { responsesFile: `files/${CHAPTERS.split("/")[1]}` } } };
    const p = req.url.replace(/^\/v1beta\//, "");
    if (p.startsWith("webhooks")) {
      // Disabled by a person: the pass leaves it so (one disabled for failed deliveries it would
      // enable again: tests/webhook_restore.test.mjs) and the health view says so.
      return { status: 200, body: { webhooks: [{ name: "webhooks/gemini-once", state: "disabled" }] } };
    }
    const state = p.startsWith(RECONCILED) ? "BATCH_STATE_SUCCEEDED" : "BATCH_STATE_RUNNING";
    return { status: 200, body: { name: p, metadata: { state, updateTime: new Date().toISOString(), output: { responsesFile: "files/out-0410" } }, done: state.endsWith("SUCCEEDED") } };
  });
  w = await startWorker({
    EFFECT_URL: `${dest.url}/effects`,
    GEMINI_API_BASE: gemini.url,
    GEMINI_API_KEY: "test-gemini-key-not-shown",
    GEMINI_WEBHOOK_NAME: "gemini-once",
    STUCK_AFTER_SECONDS: "0",
    RECONCILE_GRACE_SECONDS: "0",
    EFFECT_RETRY_BASE_SECONDS: "1",
    EFFECT_RETRY_MAX_SECONDS: "1",
    STATS_FLUSH_SECONDS: "0",
    // A claim shorter than the timeout plus the runtime's grace: works, and is warned about.
    EFFECT_TIMEOUT_MS: "20000",
    CLAIM_TTL_SECONDS: "40",
    // A result failing every second stays waiting (its row shown) rather than opening the
    // destination for the other tests' effects.
    DESTINATION_OPEN_AFTER: "1000",
  }, { http: true });
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync"],
  });

  // The operations the views show.
  await w.register(STUCK, "nightly-eval");
  await w.register(FORGET, "experiment");
  await w.register(RECONCILED, "nightly-review");
  await w.register(DONE, "nightly-review");
  await w.register(PARKED, "billing");
  await w.register(FLAKY, "billing");
  for (const key of FILLER) await w.register(key, key.includes("translate") ? "translation" : "nightly-review");
  for (const key of [DONE, PARKED, FLAKY, ...FILLER]) {
    assert.equal((await w.deliver("batch.succeeded", key, { output_file_uri: `gs://results/${key.split("/")[1]}.jsonl` })).status, 200);
  }
  // A later, different terminal is recorded and dropped: the timeline and the trend show it.
  const late = await w.deliver("batch.failed", DONE, { error_code: "13", error_message: "late" });
  assert.equal(late.body.reason, "conflicting_terminal");
  await eventually(async () => (await w.inspect(PARKED)).body.effect_parked, { what: "the park" });
  await eventually(async () => (await w.inspect(FLAKY)).body.effect_done, { what: "the flaky effect retried" });
  await w.ledger([STUCK, FORGET, RECONCILED, DONE, FLAKY, ...FILLER]);
  await w.ledger(PARKED, (m) => m.parked);
  // A cron pass settles one whose webhook never came and checks the Gemini webhook's state.
  await w.scheduled();
  await eventually(async () => (await w.inspect(RECONCILED)).body.settled_by === "reconcile", { what: "settled by reconcile" });
  await w.ledger(RECONCILED, (m) => m.settled_by === "reconcile" && m.effect_done);
  await w.ledger(STUCK, (m) => m.alerts.includes("stuck"));

  page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
});
after(async () => {
  releaseSlow?.();
  await browser?.close();
  await w?.dispose();
  await dest?.close();
  await gemini?.close();
});

/** Decodes a PNG fully (chunks, zlib stream, every scanline) and returns its size in pixels. */
function decodePng(buf) {
  assert.deepEqual([...buf.subarray(0, 8)], [137, 80, 78, 71, 13, 10, 26, 10], "PNG signature");
  let offset = 8, width, height, depth, colorType;
  const idat = [];
  while (offset < buf.length) {
    const length = buf.readUInt32BE(offset);
    const type = buf.toString("ascii", offset + 4, offset + 8);
    const data = buf.subarray(offset + 8, offset + 8 + length);
    if (type === "IHDR") [width, height, depth, colorType] = [data.readUInt32BE(0), data.readUInt32BE(4), data[8], data[9]];
    if (type === "IDAT") idat.push(data);
    offset += 12 + length;
    if (type === "IEND") break;
  }
  const channels = { 0: 1, 2: 3, 4: 2, 6: 4 }[colorType];
  assert.ok(channels && depth === 8, `plain 8-bit PNG (color type ${colorType}, depth ${depth})`);
  const pixels = inflateSync(Buffer.concat(idat));
  assert.equal(pixels.length, height * (1 + width * channels), "every scanline present");
  return { width, height };
}

/** Screenshots the page, checks it is a real picture, and copies it to DASHBOARD_SCREENSHOTS. */
async function shoot(name) {
  const buf = await page.screenshot({ fullPage: true });
  writeFileSync(path.join(shotDir, name), buf);
  assert.ok(buf.length > 20_000, `${name} is ${buf.length} bytes: a blank page is smaller`);
  const { width, height } = decodePng(buf);
  assert.ok(width >= 1000 && height >= 500, `${name} is ${width}x${height}`);
  if (SHOTS) writeFileSync(path.join(SHOTS, name), buf);
}

const loads = () => page.evaluate(() => Number(document.getElementById("status").dataset.loads || 0));
/** Runs `action` and waits for the view it leads to to finish loading, without error. */
async function andLoad(action) {
  const before = await loads();
  await action();
  await page.waitForFunction((n) => Number(document.getElementById("status").dataset.loads || 0) > n, before);
  const error = await page.evaluate(() => document.getElementById("status").dataset.error);
  assert.equal(error, undefined, `the view loaded without error`);
}
const listedKeys = () => page.locator("#operations tbody a[data-key]").evaluateAll((as) => as.map((a) => a.dataset.key));
/** Opens a view by its hash (loading it again when it is already open). */
function go(hash) {
  return andLoad(() => page.evaluate((h) => {
    if (location.hash === "#" + h) window.route(); else location.hash = h;
  }, hash));
}
const click = (selector) => andLoad(() => page.click(selector));
/** The operation page's waiting and parked results, as shown. */
const resultRows = () => page.locator("#op-results tbody tr:not(.empty)").evaluateAll((trs) => trs.map((tr) => {
  const cells = [...tr.children].map((td) => td.textContent);
  return { key: cells[0], index: tr.dataset.index, state: tr.dataset.state, attempts: tr.dataset.attempts, http: tr.dataset.http,
    answered: cells[5], last: cells[6], next: cells[7], lastAttempt: tr.dataset.lastAttempt, nextAttempt: tr.dataset.nextAttempt };
}));

describe("dashboard", () => {
  it("asks for the token, refuses a wrong one, and holds no data without it", async () => {
    const res = await page.goto(`${w.url}/dashboard`);
    assert.equal(res.status(), 200);
    assert.match(res.headers()["content-security-policy"], /default-src 'none'/);
    const html = await (await fetch(`${w.url}/dashboard`)).text();
    assert.ok(!html.includes(DONE) && !html.includes(ADMIN_TOKEN), "the page itself holds no data");
    assert.equal(await page.locator("#login").isVisible(), true, "asks for the token first");
    assert.equal(await page.locator("#view-operations").isVisible(), false);
    await page.fill("#token", "wrong-token");
    await page.click("#signin");
    await page.waitForFunction(() => document.getElementById("login-error").textContent.includes("refused"));
    await page.fill("#token", ADMIN_TOKEN);
    await click("#signin");
    assert.equal(await page.evaluate(() => sessionStorage.getItem("gemini-once-admin-token")), ADMIN_TOKEN);
  });

  it("lists operations and filters them by status, kind, stuck, effect, parked and settled by", async () => {
    const all = await listedKeys();
    for (const key of [STUCK, PARKED, DONE, FLAKY, RECONCILED, FORGET, ...FILLER]) assert.ok(all.includes(key), `${key} in ${all}`);
    assert.match(await page.locator("#ops-count").textContent(), /whole ledger/);
    await shoot("dashboard-operations.png");

    await page.selectOption("#f-status", "running");
    await page.fill("#f-kind", "nightly-eval");
    await click("#f-apply");
    assert.match(await page.evaluate(() => location.hash), /kind=nightly-eval/);
    assert.deepEqual(await listedKeys(), [STUCK]);

    await click("#f-clear");
    await click('[data-preset="stuck=true"]');
    assert.deepEqual((await listedKeys()).sort(), [FORGET, STUCK].sort(), "not terminal past the threshold");
    assert.match(await page.locator("#operations tbody").textContent(), /stuck/, "the alert sent is shown");

    await click('[data-preset="parked=true"]');
    assert.deepEqual(await listedKeys(), [PARKED]);
    assert.equal(await page.locator("#f-parked").inputValue(), "true", "the form shows the filter in force");

    await click('[data-preset="effect_done=false"]');
    const notDone = await listedKeys();
    assert.ok(notDone.includes(PARKED) && notDone.includes(STUCK), notDone.join());
    assert.ok(!notDone.includes(DONE), notDone.join());

    await click('[data-preset="settled_by=reconcile"]');
    assert.deepEqual(await listedKeys(), [RECONCILED]);
    await click("#f-clear");
    await page.selectOption("#f-settled_by", "webhook");
    await page.selectOption("#f-effect_done", "true");
    await click("#f-apply");
    const byWebhook = await listedKeys();
    assert.ok(byWebhook.includes(DONE) && byWebhook.includes(FLAKY), byWebhook.join());
    assert.ok(!byWebhook.includes(RECONCILED) && !byWebhook.includes(PARKED), byWebhook.join());
  });

  it("searches by part of a name, and opens an operation named exactly", async () => {
    await go("operations");
    await page.fill("#f-q", "BILLING");
    await click("#f-apply");
    assert.deepEqual((await listedKeys()).sort(), [FLAKY, PARKED].sort(), "any part of the name, ignoring case");

    await page.fill("#f-q", "projects/p/locations/us/" + DONE);
    await click("#f-apply");
    assert.equal(await page.evaluate(() => location.hash), "#op/" + encodeURIComponent(DONE));
    assert.match(await page.locator("#op-title").textContent(), new RegExp(DONE));
  });

  it("pages a filtered search with the listing's cursor, and lists from a key prefix", async () => {
    const seen = [];
    let cursor = null;
    for (let pages = 0; pages < 20; pages++) {
      const r = await w.admin(`/v1/operations?q=nightly-review&limit=1${cursor ? `&cursor=${cursor}` : ""}`);
      assert.equal(r.status, 200);
      seen.push(...r.body.operations.map((o) => o.key));
      if (r.body.complete) break;
      cursor = r.body.cursor;
    }
    assert.deepEqual(seen, ["batches/nightly-review-0409", RECONCILED, DONE], "each once, in key order");
    const byPrefix = await w.admin("/v1/operations?prefix=batches/billing-&parked=false");
    assert.deepEqual(byPrefix.body.operations.map((o) => [o.key, o.kind, o.settled_by]), [[FLAKY, "billing", "webhook"]]);
    const refused = await w.admin("/v1/operations?settled_by=registration");
    assert.equal(refused.status, 400);
    assert.match(refused.body.error, /settled_by/);
  });

  it("shows one operation's record and its history as a timeline, and redelivers it with a reason", async () => {
    await go("op/" + encodeURIComponent(DONE));
    assert.equal(await page.locator('#op-record dd[data-field="kind"]').textContent(), "nightly-review");
    const whats = await page.locator("#op-timeline li").evaluateAll((lis) => lis.map((li) => li.dataset.what));
    for (const what of ["registered", "applied", "claimed", "attempt", "dropped"]) assert.ok(whats.includes(what), `${what} in ${whats}`);
    const timeline = await page.locator("#op-timeline").textContent();
    assert.match(timeline, /Dropped: failed from webhook/);
    assert.match(timeline, /reason conflicting_terminal/);
    assert.match(timeline, /Attempt delivered/);
    assert.match(timeline, /answer 2xx/);
    assert.equal(await page.locator("#act-retry").count(), 0, "retry now does not fit a done effect");
    assert.match(await page.locator("#op-actions").textContent(), /new webhook-id/);

    await page.click("#act-redeliver");
    assert.match(await page.locator("#action-message").textContent(), /Give a reason/);
    assert.equal(effectsFor(DONE).length, 1, "nothing sent without a reason");
    await page.fill("#redeliver-reason", "destination lost its copy (INC-2231)");
    await page.click("#act-redeliver");
    await page.waitForFunction(() => /Redelivering/.test(document.getElementById("action-message")?.textContent));
    const sent = await eventually(() => effectsFor(DONE).length === 2 && effectsFor(DONE), { what: "the redelivery" });
    assert.equal(sent[1].headers["effect-generation"], "2");
    assert.notEqual(sent[1].headers["webhook-id"], sent[0].headers["webhook-id"]);
    await eventually(async () => {
      await go("op/" + encodeURIComponent(DONE));
      return (await page.locator("#op-timeline li[data-what=attempt]").count()) === 2;
    }, { what: "the redelivery's attempt in the timeline" });
    assert.match(await page.locator("#op-timeline").textContent(), /Operator: redeliver.*INC-2231/);
    assert.equal(await page.locator('#op-record dd[data-field="generation"]').textContent(), "2");
    await shoot("dashboard-operation.png");
  });

  it("shows the refusal's text when retry now meets an attempt in flight", async () => {
    await w.deliver("batch.succeeded", SLOW);
    await eventually(() => effectsFor(SLOW).length === 1, { what: "the slow attempt in flight" });
    await go("op/" + encodeURIComponent(SLOW));
    await page.click("#act-retry");
    await page.waitForSelector("#action-message");
    const text = await page.locator("#action-message").textContent();
    assert.match(text, /Retry now refused \(409\): an attempt is in flight/);
    assert.equal(effectsFor(SLOW).length, 1, "no second attempt beside the first");
    releaseSlow();
    await eventually(async () => (await w.inspect(SLOW)).body.effect_done, { what: "the slow attempt done" });
  });

  it("retries a parked side effect now under the same webhook-id", async () => {
    await go("op/" + encodeURIComponent(PARKED));
    assert.match(await page.locator('#op-record dd[data-field="parked_answer"]').textContent(), /400/);
    assert.match(await page.locator("#op-timeline").textContent(), /Attempt parked/);
    billingUp = true;
    await page.fill("#retry-reason", "account restored");
    await page.click("#act-retry");
    await page.waitForFunction(() => /Retrying .* same webhook-id/.test(document.getElementById("action-message")?.textContent));
    await eventually(async () => (await w.inspect(PARKED)).body.effect_done, { what: "retried effect done" });
    const sent = effectsFor(PARKED);
    assert.equal(sent.length, 2);
    assert.equal(sent[1].headers["effect-generation"], "1", "retry now keeps the generation");
    assert.equal(sent[1].headers["webhook-id"], sent[0].headers["webhook-id"]);
    await go("op/" + encodeURIComponent(PARKED));
    assert.match(await page.locator("#op-timeline").textContent(), /Operator: retry now.*account restored/);
  });

  it("forgets an operation after a confirmation", async () => {
    await go("op/" + encodeURIComponent(FORGET));
    await page.fill("#forget-reason", "test job, abandoned");
    await page.click("#act-forget");
    assert.equal((await w.inspect(FORGET)).body.forgotten, null, "one click does not forget");
    await page.click("#act-forget-confirm");
    await page.waitForFunction(() => /Forgot/.test(document.getElementById("action-message")?.textContent));
    assert.equal((await w.inspect(FORGET)).body.forgotten.reason, "test job, abandoned");
    assert.match(await page.locator("#op-actions").textContent(), /No action applies/);
    assert.match(await page.locator("#op-timeline").textContent(), /Operator: forgotten/);
  });

  it("draws the last day's trend from the hourly buckets, with health and configuration", async () => {
    const hourly = await eventually(async () => {
      const s = (await w.admin("/v1/stats")).body;
      // Summed over the day, not read from the last bucket: a run that crosses the hour
      // (CI once did, at midnight) splits the suite's counts over two buckets.
      const day = (key) => (s.hourly ?? []).reduce((sum, h) => sum + (h[key] || 0), 0);
      return day("deliveries") > 0 && day("settled_by_reconcile") > 0 && day("effect_failures") > 0 && day("dropped") > 0 && s.hourly;
    }, { what: "the hourly buckets" });
    assert.equal(hourly.length, 24);
    await go("overview");
    const bars = await page.locator("#trend rect").evaluateAll((rs) => rs.map((r) => [r.dataset.series, Number(r.getAttribute("height"))]));
    const drawn = new Set(bars.filter(([, h]) => h > 0).map(([series]) => series));
    assert.deepEqual([...drawn].sort(), ["deliveries", "dropped", "effect_failures", "settled_by_reconcile", "settled_by_webhook"], "a bar for each counter that counted");
    const legend = await page.locator("#legend").textContent();
    assert.match(legend, /Deliveries: [1-9]/);
    assert.match(legend, /Settled by reconcile: 1/);
    assert.match(legend, /Dropped events: [1-9]/);
    assert.match(legend, /Effect failures: [1-9]/);

    const health = await page.locator("#health").textContent();
    assert.match(health, /last reconcile pass/);
    assert.match(health, /settled 1/);
    assert.match(health, /gemini-once is disabled \(alert sent\)/);
    assert.match(await page.locator("#warnings").textContent(), /CLAIM_TTL_SECONDS \(40\)/);
    const config = Object.fromEntries((await page.locator("#config tbody tr").evaluateAll((trs) => trs.map((tr) => [tr.cells[0].textContent, tr.cells[1].textContent]))));
    assert.deepEqual([config.ADMIN_TOKEN, config.REGISTER_TOKENS, config.READ_TOKENS], ["set (1)", "set (1)", "set (1)"]);
    assert.equal(config.GEMINI_API_KEY, "set");
    assert.equal(config.STUCK_AFTER_SECONDS, "0");
    assert.equal(config.ALERT_URL, "not set");
    const text = await page.locator("body").textContent();
    assert.ok(!text.includes(ADMIN_TOKEN) && !text.includes("test-gemini-key-not-shown"), "no secret on the page");
    assert.match(await page.locator("#drops").textContent(), /conflicting_terminal/);
    await shoot("dashboard-trend-health.png");
  });

  it("settles by hand an operation with no outcome, after a reason and a confirmation", async () => {
    const key = "batches/inline-results-88";
    await w.register(key, "inline");
    await go("op/" + encodeURIComponent(key));
    await page.selectOption("#settle-status", "failed");
    await page.click("#act-settle");
    await page.waitForFunction(() => /Give a reason/.test(document.getElementById("action-message")?.textContent));
    await page.fill("#settle-reason", "checked in AI Studio");
    await page.click("#act-settle");
    assert.equal((await w.inspect(key)).body.status, "pending", "one click does not settle");
    await page.click("#act-settle-confirm");
    await page.waitForFunction(() => /Settled/.test(document.getElementById("action-message")?.textContent));
    const op = (await w.inspect(key)).body;
    assert.deepEqual([op.status, op.settled_by], ["failed", "operator"]);
    await eventually(() => effectsFor(key).length === 1, { what: "the effect" });
    assert.equal(JSON.parse(effectsFor(key)[0].body).provider.operator_reason, "checked in AI Studio");
    await go("op/" + encodeURIComponent(key));
    assert.match(await page.locator("#op-timeline").textContent(), /Applied: failed from operator.*checked in AI Studio/);
    assert.equal(await page.locator("#act-settle").count(), 0, "settle does not fit an operation with an outcome");
  });

  it("retries and redelivers in bulk from the listing's filter, counting first and acting only once confirmed", async () => {
    for (const key of REFUNDS) {
      await w.register(key, "refunds");
      await w.deliver("batch.succeeded", key);
    }
    await w.ledger(REFUNDS, (m) => m.parked);
    await go("operations?kind=refunds&parked=true");
    assert.deepEqual((await listedKeys()).sort(), REFUNDS);
    const panel = () => page.locator("#bulk-message");
    const state = (s) => page.waitForFunction((want) => document.getElementById("bulk-message")?.dataset.state === want, s);

    await page.click("#bulk-retry");
    await state("confirm");
    assert.match(await panel().textContent(), /3 operations match this filter: 3 with a side effect not done will be retried now/);
    await shoot("dashboard-bulk.png");
    await page.click("#bulk-cancel");
    assert.equal(await panel().count(), 0, "cancelled");
    for (const key of REFUNDS) assert.equal(effectsFor(key).length, 1, "the count sent nothing");

    refundsUp = true;
    await page.fill("#bulk-reason", "refunds API fixed (INC-2240)");
    await page.click("#bulk-retry");
    await state("confirm");
    await page.click("#bulk-confirm");
    await state("done");
    assert.match(await panel().textContent(), /Retry now done: 3 matched, 3 retried, 0 skipped/);
    await w.ledger(REFUNDS, (m) => m.effect_done);
    for (const key of REFUNDS) {
      const sent = effectsFor(key);
      assert.equal(sent.length, 2, `${key}: one more attempt`);
      assert.equal(sent[1].headers["webhook-id"], sent[0].headers["webhook-id"], `${key}: its refused attempt's webhook-id`);
    }
    const op = (await w.inspect(REFUNDS[0])).body;
    assert.ok(op.history.some((h) => h.what === "retry_now" && h.reason === "bulk retry: refunds API fixed (INC-2240)"));

    await go("operations?kind=refunds");
    await page.fill("#bulk-reason", "");
    await page.click("#bulk-redeliver");
    await state("refused");
    assert.match(await panel().textContent(), /Give a reason/);
    await page.fill("#bulk-reason", "ledger rebuilt downstream");
    // What the page asks of /v1/bulk/redeliver, and what it is answered.
    const redelivers = [];
    const seen = (res) => {
      if (res.url().endsWith("/v1/bulk/redeliver")) redelivers.push(res.json().then((answer) => ({ body: JSON.parse(res.request().postData()), answer })));
    };
    page.on("response", seen);
    await page.click("#bulk-redeliver");
    await state("confirm");
    assert.match(await panel().textContent(), /3 with a done side effect will be redelivered as a new generation/);
    await page.click("#bulk-confirm");
    await state("done");
    page.off("response", seen);
    assert.match(await panel().textContent(), /Redeliver done: 3 matched, 3 redelivered/);
    // The run confirmed is the one counted: it carries the dry run's cut-off, its identity.
    const [dry, ...run] = await Promise.all(redelivers);
    assert.equal(dry.body.dry_run, true);
    assert.ok(dry.answer.sent_before);
    assert.ok(run.length > 0);
    for (const r of run) assert.deepEqual([r.body.dry_run, r.body.sent_before, r.answer.sent_before], [undefined, dry.answer.sent_before, dry.answer.sent_before]);
    await eventually(() => REFUNDS.every((k) => effectsFor(k).length === 3), { what: "the redeliveries" });
    for (const key of REFUNDS) {
      const [first, , again] = effectsFor(key);
      assert.equal(again.headers["effect-generation"], "2");
      assert.notEqual(again.headers["webhook-id"], first.headers["webhook-id"]);
    }
  });
  it("shows a results batch's counts and its parked results", async () => {
    assert.equal((await w.register(PAGES, "pages", { results: "each" })).status, 201);
    await w.ledger(PAGES);
    await w.scheduled();
    await eventually(() => effectsFor(PAGES).length === 1, { timeoutMs: 30_000, what: "the job's effect, after its results" });
    await go("op/" + encodeURIComponent(PAGES));
    // Errors are counted within what was read, apart from how their effects ended.
    assert.equal(await page.locator('#op-record dd[data-field="results_progress"]').textContent(),
      "6 read (1 of them carries an error from Gemini); effects: 4 delivered, 2 parked; every result read");
    const rows = await resultRows();
    assert.deepEqual(rows.map((r) => [r.key, r.index, r.state, r.attempts, r.http]),
      [["page-2", "1", "parked", "1", "422"], ["page-5", "4", "parked", "1", "422"]]);
    for (const r of rows) {
      assert.match(r.answered, /^422: .*page template missing/);
      assert.match(r.last, /^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(\d+m \d+s ago\)$/, r.last);
      assert.ok(Number(r.lastAttempt) <= Date.now() && Number(r.lastAttempt) > Date.now() - 120_000, "answered during this test");
      assert.match(r.next, /^parked/);
    }
    // An operation without results shows neither.
    await go("op/" + encodeURIComponent(DONE));
    assert.equal(await page.locator('#op-record dd[data-field="results_progress"]').count(), 0);
    assert.equal(await page.locator("#op-results-box").isVisible(), false);
  });
  it("shows each waiting and parked result's attempts: what answered, when, and when it goes again", async () => {
    assert.equal((await w.register(CHAPTERS, "chapters", { results: "each" })).status, 201);
    await w.ledger(CHAPTERS);
    await w.scheduled();
    const chapterTwo = () => dest.requests.filter((r) => r.body.includes(`"result_key":"chapter-2"`));
    await eventually(() => chapterTwo().length >= 2, { timeoutMs: 30_000, what: "chapter-2 failing and retried" });
    await go("op/" + encodeURIComponent(CHAPTERS));
    assert.match(await page.locator('#op-record dd[data-field="results_progress"]').textContent(),
      /^3 read; effects: 1 delivered, 1 parked, 1 waiting for a retry; every result read$/);
    const [waiting, parked] = await resultRows();
    assert.deepEqual([waiting.key, waiting.index, waiting.state, waiting.http], ["chapter-2", "1", "waiting", "503"]);
    assert.ok(Number(waiting.attempts) >= 1, waiting.attempts);
    assert.match(waiting.answered, /^503: .*renderer overloaded/);
    assert.match(waiting.last, / UTC \(\d+m \d+s ago\)$/, waiting.last);
    assert.match(waiting.next, /^(due now|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(in \d+m \d+s\))$/, waiting.next);
    assert.ok(Number(waiting.nextAttempt) >= Number(waiting.lastAttempt), "due again after its last answer");
    assert.deepEqual([parked.key, parked.state, parked.attempts, parked.http], ["chapter-3", "parked", "1", "422"]);
    assert.match(parked.answered, /^422: .*chapter template missing/);
    assert.ok(parked.lastAttempt !== "", "a parked result says when it was answered");
    // The job's effect waits for them: no "Retry now" that would send nothing, but what happens.
    assert.equal(await page.locator("#act-retry").count(), 0);
    assert.match(await page.locator("#op-actions").textContent(), /The job's effect waits for its results/);
    assert.equal(await page.locator("#act-results-retry").count(), 1, "the waiting and parked ones can be sent now");
    await shoot("dashboard-results.png");
    // Kept while it waits: the page's own refresh shows its later attempts, the last one later.
    const seen = Number(waiting.attempts);
    await page.waitForFunction((n) => Number(document.querySelector('#op-results tr[data-state="waiting"]')?.dataset.attempts) > n, seen, { timeout: 30_000 });
    const [later] = await resultRows();
    assert.equal(later.state, "waiting");
    assert.ok(Number(later.lastAttempt) > Number(waiting.lastAttempt), "its last attempt moved on");
    // Delivered at last: the waiting row goes, the parked one stays, and the job's effect goes.
    chapterTwoUp = true;
    await eventually(() => effectsFor(CHAPTERS).length === 1, { timeoutMs: 30_000, what: "the job's effect, after its results" });
    await go("op/" + encodeURIComponent(CHAPTERS));
    assert.deepEqual((await resultRows()).map((r) => [r.key, r.state]), [["chapter-3", "parked"]]);
    // Its template fixed, an operator sends the parked result again from the page: once, under
    // its first webhook-id; the counts changed, so the job's effect goes again as a new
    // generation under a new webhook-id.
    chapterThreeUp = true;
    const chapterThree = () => dest.requests.filter((r) => r.body.includes(`"result_key":"chapter-3"`));
    const refusedId = chapterThree()[0].headers["webhook-id"];
    await page.fill("#results-retry-reason", "template fixed");
    await page.click("#act-results-retry");
    await page.waitForFunction(() => /Sending/.test(document.getElementById("action-message")?.textContent));
    assert.match(await page.locator("#action-message").textContent(), /^Sending 1 parked result again for batches\/chapters-0903, each under its first webhook-id\.$/);
    await eventually(() => chapterThree().length === 2, { timeoutMs: 30_000, what: "chapter-3 sent again" });
    assert.equal(chapterThree()[1].headers["webhook-id"], refusedId);
    await eventually(async () => (await w.inspect(CHAPTERS)).body.results_progress?.counts.delivered === 3, { what: "chapter-3 counted delivered" });
    await go("op/" + encodeURIComponent(CHAPTERS));
    assert.equal(await page.locator("#op-results-box").isVisible(), false, "nothing waits or is parked");
    assert.equal(await page.locator("#act-results-retry").count(), 0);
    await eventually(() => effectsFor(CHAPTERS).length === 2, { timeoutMs: 30_000, what: "the job's new generation" });
    const [firstJob, newJob] = effectsFor(CHAPTERS);
    assert.notEqual(newJob.headers["webhook-id"], firstJob.headers["webhook-id"]);
    assert.equal(newJob.headers["effect-generation"], "2");
    assert.deepEqual(JSON.parse(newJob.body).results, { total: 3, delivered: 3, errors: 0, parked: 0 });
  });
  it("says a time ahead is ahead, and which token registered an operation", async () => {
    const inAnHour = await page.evaluate(() => when(new Date(Date.now() + 3_600_000).toISOString()));
    assert.match(inAnHour, / UTC \(in (1h 0m|59m 59s)\)$/);
    const ago = await page.evaluate(() => when(new Date(Date.now() - 65_000).toISOString()));
    assert.match(ago, / UTC \(1m [45]s ago\)$/);
    // Registered by the code that submits jobs (a register token), then completed with an
    // envelope whose time is an hour ahead of this machine's clock.
    const AHEAD = "batches/clock-ahead-1";
    assert.equal((await w.as(REGISTER_TOKEN).register(AHEAD, "nightly-review")).status, 201);
    const ahead = new Date(Date.now() + 3_600_000).toISOString();
    assert.equal((await w.deliver("batch.succeeded", AHEAD, {}, { timestamp: ahead })).status, 200);
    await go("op/" + encodeURIComponent(AHEAD));
    const field = (name) => page.locator(`#op-record dd[data-field="${name}"]`).textContent();
    assert.match(await field("registered"), /^yes, by your code \(register token [0-9a-f]+\)$/);
    const update = await field("update_time");
    assert.match(update, /\(in (1h 0m|59m \d+s): ahead of this browser's clock\)$/, update);
    assert.doesNotMatch(update, /ago/);
    await go("op/" + encodeURIComponent(DONE));
    assert.match(await field("registered"), /^yes, by an operator \(admin token [0-9a-f]+\)$/);
  });
  it("opens the page an alert links to, from the link's fragment, after signing in", async () => {
    const fresh = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    try {
      await fresh.goto(`${w.url}/dashboard#op/${encodeURIComponent(PARKED)}`);
      assert.equal(await fresh.locator("#login").isVisible(), true, "a new tab asks for the token");
      await fresh.fill("#token", ADMIN_TOKEN);
      await fresh.click("#signin");
      await fresh.waitForFunction(() => document.getElementById("status").dataset.loaded === "true");
      assert.equal(await fresh.locator("#view-operation").isVisible(), true);
      assert.match(await fresh.locator("#op-title").textContent(), new RegExp("^" + PARKED));
      // A destination's alert links to its row on the issues page.
      await fresh.evaluate(() => { location.hash = "issues?destination=default"; });
      await fresh.waitForFunction(() => document.querySelector("#destinations tr[data-focus]"));
      const focused = await fresh.locator("#destinations tr[data-focus]").evaluate((tr) => [tr.dataset.name, tr.dataset.label]);
      assert.equal(focused[0], "default");
      assert.match(focused[1], /^EFFECT_URL: http:\/\/127\.0\.0\.1:\d+/);
    } finally {
      await fresh.close();
    }
  });
  it("shows who paused a destination by hand, when and why, and its resume", async () => {
    const post = (p, body) => w.admin(p, { method: "POST", body: JSON.stringify(body) });
    const paused = await post("/v1/destinations/default/pause", { reason: "database migration until 14:00" });
    assert.equal(paused.status, 200, JSON.stringify(paused.body));
    const fingerprint = paused.body.paused.by.fingerprint;
    await go("issues");
    const desk = page.locator('#destinations tr[data-name="default"]');
    assert.equal(await desk.getAttribute("data-state"), "paused");
    assert.equal(await desk.getAttribute("data-paused-by"), fingerprint);
    const text = await desk.textContent();
    assert.match(text, new RegExp(`paused by admin ${fingerprint} at \\d{4}-\\d\\d-\\d\\dT[\\d:.]+Z: database migration until 14:00`), text);
    assert.equal((await post("/v1/destinations/default/resume", { reason: "migration done" })).status, 200);
    await go("issues");
    assert.notEqual(await desk.getAttribute("data-state"), "paused");
    assert.equal(await desk.getAttribute("data-paused-by"), null);
  });
});
