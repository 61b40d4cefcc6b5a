// The local configuration the scripts share: `.dev.vars` (what `wrangler dev` reads), and the
// local addresses `npm start` serves by default.
import { readFileSync, existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import path from "node:path";

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

/** The default EFFECT_URL of .dev.vars.example, where `npm start` runs the demo destination unless told otherwise. */
export const DEMO_EFFECT_URL = "http://127.0.0.1:8788/effects";
/** Where `npm run gemini-stub` listens by default. */
export const GEMINI_STUB_URL = "http://127.0.0.1:8789";
/** Where `wrangler dev` listens unless told otherwise. */
export const LOCAL_WORKER_URL = "http://127.0.0.1:8787";
/**
 * Where `npm start` writes the address its worker listens on (`{"url", "pid"}`) once it
 * answers, and removes it when it stops: the local commands' default worker. Under .wrangler/,
 * which git ignores and `wrangler dev` already owns.
 */
export const LOCAL_WORKER_FILE = process.env.GEMINI_ONCE_LOCAL_WORKER_FILE || path.join(ROOT, ".wrangler", "local-worker.json");

/**
 * The local worker the commands reach without `--url`: the one a running `npm start` wrote in
 * LOCAL_WORKER_FILE, else LOCAL_WORKER_URL. `from` says which, for messages.
 */
export function localWorker(file = LOCAL_WORKER_FILE) {
  try {
    const { url, pid } = JSON.parse(readFileSync(file, "utf8"));
    // A file left by an npm start that was killed outright names a worker that is gone.
    process.kill(pid, 0);
    if (typeof url === "string" && url.startsWith("http")) return { url, from: `npm start (${path.relative(ROOT, file)})` };
  } catch { /* no npm start running: the default */ }
  return { url: LOCAL_WORKER_URL, from: "the default" };
}

/** NAME=value lines of `file` (quotes stripped, comments and blank lines skipped); {} if absent. */
export function devVars(file = path.join(ROOT, ".dev.vars")) {
  const vars = {};
  if (!existsSync(file)) return vars;
  for (const line of readFileSync(file, "utf8").split("\n")) {
    const m = line.match(/^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$/);
    if (!m) continue;
    let value = m[2];
    const quoted = value.match(/^(["'])(.*)\1$/);
    if (quoted) value = quoted[2];
    else value = value.replace(/\s+#.*$/, "");
    vars[m[1]] = value;
  }
  return vars;
}

/** Whether `url` is on this machine (so a local admin token may be sent there). */
export function isLoopback(url) {
  try {
    return ["127.0.0.1", "localhost", "[::1]"].includes(new URL(url).hostname);
  } catch {
    return false;
  }
}

/**
 * Cloudflare Access's service-token headers for a worker whose `/v1/` sits behind an Access
 * application: from CF_ACCESS_CLIENT_ID and CF_ACCESS_CLIENT_SECRET, both or neither.
 */
export function accessHeaders(env = process.env) {
  const id = env.CF_ACCESS_CLIENT_ID?.trim();
  const secret = env.CF_ACCESS_CLIENT_SECRET?.trim();
  return id && secret ? { "cf-access-client-id": id, "cf-access-client-secret": secret } : {};
}
