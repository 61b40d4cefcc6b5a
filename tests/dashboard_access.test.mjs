// The dashboard by token scope, in a real headless browser (Debian's Chromium driven by
// playwright-core) against the built worker in workerd: a read token signs in, sees every
// view and no action button (none on the listing, one operation or the issues view); a
// register token is refused with a sentence saying which tokens sign in; an admin token finds
// the actions. The header names the scope and the token's fingerprint, never the token.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { chromium } from "playwright-core";
import { startWorker, startServer, ADMIN_TOKEN, READ_TOKEN, REGISTER_TOKEN } from "./helpers.mjs";
import { fingerprint } from "../scripts/deploy_vars.mjs";

const CHROMIUM = process.env.CHROMIUM_PATH || "/usr/bin/chromium";

const PARKED = "batches/access-parked";
const DONE = "batches/access-done";
const OPEN = "batches/access-open";

let w, dest, browser, page;

before(async () => {
  assert.ok(existsSync(CHROMIUM), `Chromium not found at ${CHROMIUM}: scripts/setup-browser.sh installs Debian's package`);
  dest = await startServer((req) => (req.headers["idempotency-key"] === PARKED ? { status: 400, body: { error: "unknown account" } } : { status: 200 }));
  w = await startWorker({ EFFECT_URL: `${dest.url}/effects`, STATS_FLUSH_SECONDS: "0" }, { http: true });
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync"],
  });
  // One operation of each kind the views offer actions on: open (settle, forget), done
  // (redeliver), parked (retry now, and the issues view's group retry).
  for (const key of [PARKED, DONE, OPEN]) assert.equal((await w.register(key, "access")).status, 201);
  for (const key of [PARKED, DONE]) assert.equal((await w.deliver("batch.succeeded", key)).status, 200);
  await w.ledger(PARKED, (m) => m.parked && m.error);
  await w.ledger(DONE, (m) => m.effect_done);
  await w.ledger(OPEN);
});
after(async () => {
  await browser?.close();
  await w?.dispose();
  await dest?.close();
});

const loads = () => page.evaluate(() => Number(document.getElementById("status").dataset.loads || 0));
/** Runs `action` and waits for the view it leads to to finish loading, without error. */
async function andLoad(action) {
  const before = await loads();
  await action();
  await page.waitForFunction((n) => Number(document.getElementById("status").dataset.loads || 0) > n, before);
  assert.equal(await page.evaluate(() => document.getElementById("status").dataset.error), undefined, "the view loaded without error");
}
const go = (hash) => andLoad(() => page.evaluate((h) => { if (location.hash === "#" + h) window.route(); else location.hash = h; }, hash));

async function signIn(token) {
  page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  await page.goto(`${w.url}/dashboard`);
  await page.fill("#token", token);
  await andLoad(() => page.click("#signin"));
}

/** The visible buttons that act (not navigation, filters, refresh or sign-out), by view. */
async function actionButtons() {
  const found = {};
  await go("operations");
  found.listing = await page.locator("#bulk button:visible").count();
  for (const key of [PARKED, DONE, OPEN]) {
    await go(`op/${encodeURIComponent(key)}`);
    found[key] = await page.locator("#op-actions button:visible").count();
  }
  await go("issues");
  found.issues = await page.locator("#issues button:visible").count();
  return found;
}

describe("the dashboard by token scope", () => {
  it("a read token sees every view and no action button", async () => {
    await signIn(READ_TOKEN);
    assert.equal(await page.locator("#whoami").textContent(), `read token ${fingerprint(READ_TOKEN)}`);
    assert.ok(!(await page.content()).includes(READ_TOKEN), "the page never shows the token");
    const listed = await page.locator("#operations tbody a[data-key]").evaluateAll((as) => as.map((a) => a.dataset.key));
    for (const key of [PARKED, DONE, OPEN]) assert.ok(listed.includes(key), `${key} listed`);
    assert.deepEqual(await actionButtons(), { listing: 0, [PARKED]: 0, [DONE]: 0, [OPEN]: 0, issues: 0 });
    await go(`op/${encodeURIComponent(PARKED)}`);
    assert.match(await page.locator("#actions-need-admin").textContent(), /need an admin token/);
    await go("issues");
    assert.equal(await page.locator("#issues tbody tr[data-state='parked']").count(), 1, "the issue shows, without its retry");
    await go("overview");
    assert.ok(await page.locator("#config tbody tr").count() > 30, "the configuration shows");
    await page.close();
  });

  it("a register token is refused, with a sentence saying which tokens sign in", async () => {
    page = await browser.newPage();
    await page.goto(`${w.url}/dashboard`);
    await page.fill("#token", REGISTER_TOKEN);
    await page.click("#signin");
    await page.waitForFunction(() => document.getElementById("login-error").textContent.includes("register token"));
    assert.match(await page.locator("#login-error").textContent(), /read token \(READ_TOKENS\) or an admin token/);
    assert.equal(await page.locator("#view-operations").isVisible(), false);
    assert.equal(await page.evaluate(() => sessionStorage.getItem("gemini-once-admin-token")), null, "not kept");
    await page.close();
  });

  it("an admin token finds the actions", async () => {
    await signIn(ADMIN_TOKEN);
    assert.equal(await page.locator("#whoami").textContent(), `admin token ${fingerprint(ADMIN_TOKEN)}`);
    const found = await actionButtons();
    assert.equal(found.listing, 2, "retry not done, redeliver done");
    assert.ok(found[PARKED] >= 2, "retry now, forget");
    assert.ok(found[DONE] >= 2, "redeliver, forget");
    assert.ok(found[OPEN] >= 2, "settle, forget");
    assert.equal(found.issues, 1, "the group's retry");
    // An action from the page goes through: forget the open one, named in its history row.
    await go(`op/${encodeURIComponent(OPEN)}`);
    await page.click("#act-forget");
    await page.click("#act-forget-confirm");
    await page.waitForSelector("#action-message");
    assert.match(await page.locator("#action-message").textContent(), /^Forgot /);
    const { body } = await w.inspect(OPEN);
    const row = body.history.find((h) => h.what === "forgotten");
    assert.deepEqual(row.by, { scope: "admin", fingerprint: fingerprint(ADMIN_TOKEN) });
    // The timeline says who did it.
    const item = page.locator('#op-timeline li[data-what="forgotten"]');
    assert.match(await item.textContent(), new RegExp(`by admin token ${fingerprint(ADMIN_TOKEN)}`));
    await page.close();
  });
});
