// What the parts of the chaos run share: the entry file and the repository root, the secrets and
// the worker configuration of the local run, the fault rates, the order of statuses, and small
// helpers (sleep, a JSON request with a timeout, a percentile).
import path from "node:path";
import { fileURLToPath } from "node:url";

// The entry file, which also runs the worker child mode (supervisor.mjs spawns it).
export const SELF = fileURLToPath(new URL("./main.mjs", import.meta.url));
export const ROOT = path.resolve(path.dirname(SELF), "../..");

// Secrets of this local run only (the same test values as tests/helpers.mjs, plus a second
// Gemini secret so that rotation is exercised).
export const GEMINI_SECRETS = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_Y2hhb3Mtcm90YXRlZC1nZW1pbmktc2VjcmV0"];
export const EFFECT_SECRET = "whsec_c2lkZS1lZmZlY3Qtc2VjcmV0LWZvci10ZXN0cw==";
export const ADMIN_TOKEN = "chaos-admin-token-0123456789";
export const GEMINI_API_KEY = "chaos-gemini-key";

// Worker configuration for the run: short timings so that it finishes in minutes.
export const EFFECT_TIMEOUT_MS = 1000;
export const WORKER_VARS = {
  CLAIM_TTL_SECONDS: "3",
  EFFECT_RETRY_BASE_SECONDS: "1",
  EFFECT_RETRY_MAX_SECONDS: "2",
  EFFECT_TIMEOUT_MS: String(EFFECT_TIMEOUT_MS),
  RECONCILE_GRACE_SECONDS: "0",
  RECONCILE_LEASE_SECONDS: "5",
  RECONCILE_BUDGET: "300",
  STUCK_AFTER_SECONDS: "86400",
  // A pass with 20 or more open operations to visit fans their polls out on the queue, so both
  // paths (polled by the pass, polled by the queue's consumer) run under the same faults.
  RECONCILE_FANOUT_ABOVE: "20",
  RECONCILE_POLL_RATE: "200",
};
export const CRON = "*/5 * * * *";
// By default, a side effect first accepted later than this after the load phase's end is late
// (and the settle phase waits this long at most for the last one); --late-after S sets it.
export const LATE_AFTER_MS = 300_000;

// Fault rates.
export const STATUS_429 = 0.05;
export const STATUS_500 = 0.03;
export const STATUS_STALE = 0.15;
export const DEST_5XX = 0.1;
export const DEST_SLOW = 0.15; // 100..700 ms: inside the side-effect timeout
export const DEST_OVER_TIMEOUT = 0.02; // 1100..1800 ms: past it

export const TERMINAL = new Set(["succeeded", "failed", "cancelled", "expired"]);
export const rank = (s) => (s === "absent" ? -1 : s === "pending" ? 0 : s === "running" || s === "requires_action" ? 1 : TERMINAL.has(s) ? 2 : -2);
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export async function httpJson(url, init = {}, timeoutMs = 15_000) {
  const res = await fetch(url, { ...init, signal: AbortSignal.timeout(timeoutMs) });
  const text = await res.text();
  let body;
  try { body = JSON.parse(text); } catch { body = text; }
  return { status: res.status, body };
}

export function percentile(values, p) {
  if (!values.length) return null;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}
