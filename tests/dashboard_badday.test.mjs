// The dashboard's bad-day views in a real headless browser (Debian's Chromium driven by
// playwright-core), against the built worker in workerd with a real destination: one
// operation's attempts (destination without its credential, webhook-id, HTTP status, the
// answer's first bytes), its deliveries and duplicates, and the page refreshing itself while
// open; then the issues view: each destination's health, parked effects grouped by destination and error, and a group
// retried in bulk (a dry run counts first) once its destination is fixed; then the latency
// view: per hour, p50 and p95 from the delivery's answer to the effect's acceptance.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync, writeFileSync } from "node:fs";
import path from "node:path";
import { chromium } from "playwright-core";
import { startWorker, startServer, ADMIN_TOKEN, eventually } from "./helpers.mjs";

const CHROMIUM = process.env.CHROMIUM_PATH || "/usr/bin/chromium";
// DASHBOARD_SCREENSHOTS=<dir> (`npm run screenshots`): the issues and latency views are also
// written there (docs/ holds them).
const SHOTS = process.env.DASHBOARD_SCREENSHOTS;
const shoot = async (name) => { if (SHOTS) writeFileSync(path.join(SHOTS, name), await page.screenshot({ fullPage: true })); };
const ROUTE_SECRET = "route-secret-not-shown";

const FLAPPING = "batches/billing-0501";
const GEMINI_ID = "msg_gemini_badday_1";
const INVALID = ["batches/billing-0601", "batches/billing-0602", "batches/billing-0603"];
const REPORT = "batches/report-0701";
const INVALID_ERROR = '400: {"error":"invalid payload"}';

let w, dest, browser, page;
let billingUp = false;
let payloadFixed = false;

const effectsFor = (key) => dest.requests.filter((r) => r.headers["idempotency-key"] === key);

before(async () => {
  assert.ok(existsSync(CHROMIUM), `Chromium not found at ${CHROMIUM}: scripts/setup-browser.sh installs Debian's package`);
  dest = await startServer(async (req) => {
    const key = req.headers["idempotency-key"];
    if (INVALID.includes(key)) return payloadFixed ? { status: 200 } : { status: 400, body: { error: "invalid payload" } };
    if (key === REPORT) return { status: 400, body: { error: "unknown account" } };
    if (key === FLAPPING) return billingUp ? { status: 200, body: { ok: true } } : { status: 503, body: { error: "billing is down for maintenance" } };
    return { status: 200 };
  });
  w = await startWorker({
    EFFECT_URL: `${dest.url}/effects`,
    EFFECT_ROUTES: JSON.stringify({ billing: `${dest.url}/billing?token=${ROUTE_SECRET}` }),
    EFFECT_RETRY_BASE_SECONDS: "1",
    EFFECT_RETRY_MAX_SECONDS: "1",
    STATS_FLUSH_SECONDS: "0",
  }, { http: true });
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync"],
  });
  page = await browser.newPage({ viewport: { width: 1280, height: 900 } });

  await w.register(FLAPPING, "billing");
  // The quick start's five sends: one delivery and four duplicates of it.
  for (let i = 0; i < 5; i++) {
    assert.equal((await w.deliver("batch.succeeded", FLAPPING, {}, { webhookId: GEMINI_ID })).status, 200);
  }
  await eventually(async () => effectsFor(FLAPPING).length >= 2, { what: "two refused attempts" });

  for (const key of INVALID) await w.register(key, "billing");
  await w.register(REPORT, "reports");
  for (const key of [...INVALID, REPORT]) assert.equal((await w.deliver("batch.succeeded", key)).status, 200);
  await w.ledger([...INVALID, REPORT], (m) => m.parked && m.error);
});
after(async () => {
  await browser?.close();
  await w?.dispose();
  await dest?.close();
});

const loads = () => page.evaluate(() => Number(document.getElementById("status").dataset.loads || 0));
async function andLoad(action) {
  const before = await loads();
  await action();
  await page.waitForFunction((n) => Number(document.getElementById("status").dataset.loads || 0) > n, before);
  assert.equal(await page.evaluate(() => document.getElementById("status").dataset.error), undefined, "the view loaded without error");
}
const attemptRows = () => page.locator("#op-attempts tbody tr:not(.empty)").evaluateAll((trs) =>
  trs.map((tr) => ({ result: tr.dataset.result, cells: [...tr.children].map((td) => td.textContent) })));

describe("dashboard on a bad day: one operation", () => {
  it("records each attempt's destination (never its credential), webhook-id and HTTP status", async () => {
    const { body } = await w.inspect(FLAPPING);
    const attempts = body.history.filter((h) => h.what === "attempt");
    assert.ok(attempts.length >= 2, JSON.stringify(body.history));
    const sent = effectsFor(FLAPPING)[0].headers["webhook-id"];
    for (const a of attempts) {
      assert.equal(a.result, "effect_failed");
      assert.equal(a.http_status, 503);
      assert.equal(a.webhook_id, sent, "the id the destination received");
      assert.equal(a.destination, `route billing: ${dest.url}/\u2026`);
      assert.match(a.answer, /^503: .*billing is down/);
    }
    assert.ok(!JSON.stringify(body).includes(ROUTE_SECRET), "the route's token is never shown");
  });

  it("shows the attempts, the deliveries and the duplicates, and refreshes itself while open", async () => {
    await page.goto(`${w.url}/dashboard`);
    await page.fill("#token", ADMIN_TOKEN);
    await andLoad(() => page.click("#signin"));
    await andLoad(() => page.evaluate((k) => { location.hash = "op/" + encodeURIComponent(k); }, FLAPPING));

    const rows = await attemptRows();
    assert.ok(rows.length >= 2, JSON.stringify(rows));
    const sent = effectsFor(FLAPPING)[0].headers["webhook-id"];
    for (const { result, cells } of rows) {
      assert.equal(result, "effect_failed");
      const [, word, destination, id, status, answer] = cells;
      assert.equal(word, "failed, will retry");
      assert.equal(destination, `route billing: ${dest.url}/\u2026`);
      assert.equal(id, sent);
      assert.equal(status, "503");
      assert.match(answer, /billing is down/);
    }
    assert.ok(!(await page.content()).includes(ROUTE_SECRET), "the route's token is not on the page");

    const deliveries = await page.locator('#op-deliveries [data-field="deliveries"]').textContent();
    assert.equal(deliveries, "1 (1 distinct webhook-id)", "one delivery recorded; its four repeats wrote nothing");
    const duplicates = await page.locator('#op-deliveries [data-field="duplicates"]').textContent();
    assert.match(duplicates, /^\d+ in the last 24 h across the worker\. .*not counted per operation/);

    // The destination recovers; the open page shows the delivered attempt with no navigation.
    const loadsBefore = await loads();
    billingUp = true;
    await page.waitForFunction(() => [...document.querySelectorAll("#op-attempts tbody tr")].some((tr) => tr.dataset.result === "effect_delivered"), null, { timeout: 30_000 });
    assert.equal(await loads(), loadsBefore, "no navigation or reload: the page refreshed itself");
    assert.ok(Number(await page.locator("#op-refreshing").getAttribute("data-refreshes")) >= 1);
    const delivered = (await attemptRows()).find((r) => r.result === "effect_delivered");
    assert.equal(delivered.cells[4], "200");
    assert.equal(delivered.cells[3], effectsFor(FLAPPING).at(-1).headers["webhook-id"]);
    assert.equal(await page.locator(".badge.e-done").count(), 1, "the title's effect badge follows");
  });
});

describe("dashboard on a bad day: issues", () => {
  it("keeps each parked effect's destination and error in the listing, and filters by the error", async () => {
    const { body } = await w.admin("/v1/operations?effect_done=false&limit=500");
    const byKey = Object.fromEntries(body.operations.map((o) => [o.key, o]));
    for (const key of INVALID) {
      assert.equal(byKey[key].error, INVALID_ERROR);
      assert.equal(byKey[key].destination, `route billing: ${dest.url}/\u2026`);
    }
    assert.equal(byKey[REPORT].error, '400: {"error":"unknown account"}');
    assert.equal(byKey[REPORT].destination, `EFFECT_URL: ${dest.url}/\u2026`);
    assert.ok(!JSON.stringify(body).includes(ROUTE_SECRET));
    const group = await w.admin(`/v1/operations?error=${encodeURIComponent(INVALID_ERROR)}`);
    assert.deepEqual(group.body.operations.map((o) => o.key).sort(), [...INVALID].sort());
  });

  it("groups parked effects by destination and error and retries one group after a dry run", async () => {
    await w.ledger(FLAPPING, (m) => m.effect_done);
    await andLoad(() => page.evaluate(() => { location.hash = "issues"; }));
    const groups = await page.locator("#issues tbody tr:not(.empty)").evaluateAll((trs) => trs.map((tr) => ({ ...tr.dataset })));
    assert.deepEqual(groups, [
      { destination: `route billing: ${dest.url}/\u2026`, state: "parked", count: "3", error: INVALID_ERROR },
      { destination: `EFFECT_URL: ${dest.url}/\u2026`, state: "parked", count: "1", error: '400: {"error":"unknown account"}' },
    ]);
    // Each configured destination's health, from /v1/stats, above the groups.
    const desks = await page.locator("#destinations tbody tr:not(.empty)").evaluateAll((trs) => trs.map((tr) => tr.dataset.label));
    assert.deepEqual(desks.sort(), [`EFFECT_URL: ${dest.url}/\u2026`, `route billing: ${dest.url}/\u2026`].sort());
    await shoot("dashboard-issues.png");
    const refusedIds = Object.fromEntries(INVALID.map((k) => [k, effectsFor(k)[0].headers["webhook-id"]]));
    const before = Object.fromEntries(INVALID.map((k) => [k, effectsFor(k).length]));

    await page.click('#issues tbody tr[data-count="3"] button');
    await page.waitForFunction(() => document.getElementById("issues-message")?.dataset.state === "confirm");
    const panel = page.locator("#issues-message");
    assert.equal(await panel.getAttribute("data-matched"), "3");
    assert.equal(await panel.getAttribute("data-eligible"), "3");
    assert.match(await panel.textContent(), /3 would be retried now/);
    for (const k of INVALID) assert.equal(effectsFor(k).length, before[k], "a dry run sends nothing");

    payloadFixed = true;
    await page.click("#issues-confirm");
    await page.waitForFunction(() => document.getElementById("issues-message")?.dataset.state === "done", null, { timeout: 30_000 });
    assert.equal(await page.locator("#issues-message").getAttribute("data-done"), "3");
    for (const key of INVALID) {
      await eventually(async () => (await w.inspect(key)).body.effect_done, { what: `${key} done` });
      const sent = effectsFor(key);
      assert.equal(sent.length, before[key] + 1, "one effect each");
      assert.equal(sent.at(-1).headers["webhook-id"], refusedIds[key], "under the webhook-id of its refused attempt");
    }
    assert.equal(effectsFor(REPORT).length, 1, "the other group is left alone");
    assert.equal((await w.inspect(REPORT)).body.effect_parked, true);

    await w.ledger(INVALID, (m) => m.effect_done);
    await andLoad(() => page.evaluate(() => window.route()));
    const left = await page.locator("#issues tbody tr:not(.empty)").evaluateAll((trs) => trs.map((tr) => tr.dataset.count));
    assert.deepEqual(left, ["1"], "only the unfixed group remains");
  });
});

describe("dashboard on a bad day: latency", () => {
  it("shows per hour the p50 and p95 from the delivery's answer to the effect's acceptance", async () => {
    await w.ledger([FLAPPING, ...INVALID], (m) => m.effect_done && m.effect_ms != null);
    const since = new Date(Date.now() - 24 * 3600 * 1000).toISOString().replace(/\.\d+Z$/, "Z");
    const { body } = await w.admin(`/v1/operations?effect_done=true&settled_after=${since}&limit=500`);
    const byKey = Object.fromEntries(body.operations.map((o) => [o.key, o]));
    const flapping = (await w.inspect(FLAPPING)).body;
    assert.equal(byKey[FLAPPING].effect_latency_ms, Date.parse(flapping.effect_done_at) - Date.parse(flapping.settled_at),
      "settlement to acceptance, as the record has them");
    assert.ok(byKey[FLAPPING].effect_latency_ms >= 1000, "it waited out at least one retry");

    const want = new Map();
    for (const o of body.operations) {
      const hour = o.settled_at.slice(0, 13) + ":00:00Z";
      want.set(hour, [...(want.get(hour) || []), o.effect_latency_ms].sort((a, b) => a - b));
    }
    const rank = (ms, p) => ms[Math.max(0, Math.ceil((p / 100) * ms.length) - 1)];
    await andLoad(() => page.evaluate(() => { location.hash = "latency"; }));
    const rows = await page.locator("#latency tbody tr:not(.empty)").evaluateAll((trs) => trs.map((tr) => ({ ...tr.dataset })));
    assert.deepEqual(rows, [...want.keys()].sort().reverse().map((hour) => {
      const ms = want.get(hour);
      return { hour, count: String(ms.length), p50: String(rank(ms, 50)), p95: String(rank(ms, 95)), max: String(ms.at(-1)) };
    }));
    assert.ok(rows.reduce((n, r) => n + Number(r.count), 0) >= 4, "the retried effects are counted");
    await shoot("dashboard-latency.png");
  });
});
