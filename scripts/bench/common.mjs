// What every part of the bench shares: the repository root and this bench's entry file, the
// secrets and constants of the local run, wrangler.toml's layout (read once by main), the
// registry of child processes, Miniflare instances and temp directories that clean-up ends,
// and small helpers (sleep, clock, rounding, chunking, ISO time).
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

export const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
// The entry file: its header is the --help text, and it runs the child modes (stubs, serve).
export const SELF = fileURLToPath(new URL("./main.mjs", import.meta.url));

export const GEMINI_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
export const OTHER_SECRET = "whsec_b3RoZXItc2VjcmV0LW5vdC1nZW1pbmlzLWtleQ==";
export const EFFECT_SECRET = "whsec_c2lkZS1lZmZlY3Qtc2VjcmV0LWZvci10ZXN0cw==";
export const ADMIN_TOKEN = "bench-admin-token-0123456789";
export const CRON = "*/5 * * * *";
export const DEFAULT_BUDGET = 900;
export const RETENTION_SECS = 14 * 86_400;
/** The longest the destination stand-in may be told to take (--dest-ms, /__delay). */
export const MAX_DEST_MS = 10_000;

export const children = new Set();
export const workers = new Set();
export const tempDirs = new Set();
let cleaning = null;

/** Kills every child process group and disposes every Miniflare; idempotent. */
export function cleanup() {
  cleaning ??= (async () => {
    // Bounded: a Miniflare that hangs while disposing must not keep the bench alive.
    for (const w of workers) await Promise.race([w.mf.dispose().catch(() => {}), sleep(10_000)]);
    workers.clear();
    for (const c of children) killGroup(c);
    children.clear();
    for (const d of tempDirs) fs.rmSync(d, { recursive: true, force: true });
    tempDirs.clear();
  })();
  return cleaning;
}

export function killGroup(child, signal = "SIGKILL") {
  if (child.exitCode !== null || child.signalCode !== null) return;
  try {
    process.kill(-child.pid, signal); // the child's own process group (spawned detached)
  } catch {
    try { child.kill(signal); } catch {}
  }
}

/** In the bench's own process only (child modes have their own handlers). */
export function installSignalHandlers() {
  for (const sig of ["SIGINT", "SIGTERM"]) {
    process.on(sig, async () => {
      console.error(`\n${sig}: stopping children`);
      await cleanup();
      process.exit(130);
    });
  }
  process.on("exit", () => {
    for (const c of children) killGroup(c);
    for (const d of tempDirs) fs.rmSync(d, { recursive: true, force: true });
  });
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
export const now = () => performance.now();

export const round = (x, d = 2) => (x === null || x === undefined || Number.isNaN(x) ? null : Math.round(x * 10 ** d) / 10 ** d);

/** wrangler.toml's bindings and [vars] (scripts/local_worker.mjs), read once by main(). */
export let WRANGLER;
export function setWrangler(layout) {
  WRANGLER = layout;
}

export function chunked(xs, parts) {
  const out = Array.from({ length: parts }, () => []);
  xs.forEach((x, i) => out[i % parts].push(x));
  return out;
}

export function iso(secs) {
  return new Date(secs * 1000).toISOString().replace(/\.000Z$/, "Z");
}
