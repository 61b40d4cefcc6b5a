// The operator's dashboard in a real headless browser (Debian's Chromium driven by
// playwright-core; no browser download): it renders, lists a stuck operation, and its
// retry-now button works.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { chromium } from "playwright-core";
import { startWorker, startServer, ADMIN_TOKEN, eventually } from "./helpers.mjs";

const CHROMIUM = process.env.CHROMIUM_PATH || "/usr/bin/chromium";

let w, dest, browser;
let destinationUp = false;

before(async () => {
  assert.ok(existsSync(CHROMIUM), `Chromium not found at ${CHROMIUM}: scripts/setup-browser.sh installs Debian's package`);
  dest = await startServer(() => (destinationUp ? { status: 200 } : { status: 400, body: { error: "unknown account" } }));
  w = await startWorker({ EFFECT_URL: `${dest.url}/effects`, STUCK_AFTER_SECONDS: "0" }, { http: true });
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync"],
  });
});
after(async () => {
  await browser?.close();
  await w?.dispose();
  await dest?.close();
});

describe("dashboard", () => {
  it("renders, lists a stuck operation, and retries a parked side effect now", async () => {
    await w.register("batches/ui-stuck", "nightly");
    await w.deliver("batch.succeeded", "batches/ui-parked");
    await eventually(async () => (await w.inspect("batches/ui-parked")).body.effect_parked, { what: "the park" });
    await w.ledger("batches/ui-stuck");
    await w.ledger("batches/ui-parked", (m) => m.parked);

    const page = await browser.newPage();
    const res = await page.goto(`${w.url}/dashboard`);
    assert.equal(res.status(), 200);
    assert.match(res.headers()["content-security-policy"], /default-src 'none'/);
    assert.equal(await page.locator("#login").isVisible(), true, "asks for the token first");
    assert.equal(await page.locator("#app").isVisible(), false);

    await page.fill("#token", "wrong-token");
    await page.click("#signin");
    await page.waitForFunction(() => document.getElementById("login-error").textContent.includes("refused"));

    await page.fill("#token", ADMIN_TOKEN);
    await page.click("#signin");
    await page.waitForSelector("#status[data-loaded=true]");
    assert.equal(await page.evaluate(() => sessionStorage.getItem("gemini-once-admin-token")), ADMIN_TOKEN);

    const stuckRows = await page.locator("#stuck tbody tr").allTextContents();
    assert.ok(stuckRows.some((t) => t.includes("batches/ui-stuck")), stuckRows.join("|"));
    const counters = await page.locator("#counters tbody tr").allTextContents();
    assert.ok(counters.some((t) => t.startsWith("effect_parks")), counters.join("|"));

    const button = page.locator('#failing button[data-key="batches/ui-parked"]');
    assert.equal(await button.count(), 1);
    destinationUp = true;
    await button.click();
    await page.waitForFunction(() => document.getElementById("status").textContent.startsWith("Retried batches/ui-parked"));
    const op = await eventually(async () => {
      const o = await w.inspect("batches/ui-parked");
      return o.body.effect_done && o;
    }, { what: "retried effect done" });
    const sent = dest.requests.filter((r) => r.headers["idempotency-key"] === "batches/ui-parked");
    assert.equal(sent.length, 2);
    assert.equal(sent[1].headers["effect-generation"], "1", "retry-now keeps the generation");
    assert.equal(sent[1].headers["webhook-id"], sent[0].headers["webhook-id"]);
    assert.equal(op.body.generation, 1);
    if (process.env.DASHBOARD_SCREENSHOT) await page.screenshot({ path: process.env.DASHBOARD_SCREENSHOT, fullPage: true });
  });

  it("serves a page that holds no data without a token", async () => {
    const res = await fetch(`${w.url}/dashboard`);
    const html = await res.text();
    assert.equal(res.status, 200);
    assert.ok(!html.includes("batches/ui-stuck"));
    assert.ok(!html.includes(ADMIN_TOKEN));
  });
});
