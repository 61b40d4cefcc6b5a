// What `npm run deploy` and `npm run connect` share: the vars files they keep (`.dev.vars` for
// a local worker, `.deploy.vars` for the deployed one's generated secrets, both NAME=value and
// never committed), the wrangler command they run, and Gemini's subscribable events.
import { spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { chmodSync, existsSync, readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { ROOT } from "./dev_vars.mjs";

/**
 * Where deploy and connect keep the deployed worker's secrets they generated or received
 * (mode 0600, never committed): the only place the user reads them back.
 */
export const DEPLOY_VARS = process.env.GEMINI_ONCE_DEPLOY_VARS || path.join(ROOT, ".deploy.vars");

/**
 * Every event Gemini's WebhookService accepts a subscription to: `WebhookSubscribedEvent` in
 * the official SDKs (google-genai 3.x, @google/genai 2.x). `batch.cancelled` and
 * `interaction.cancelled` are not among them (the worker still handles them if they come).
 */
export const SDK_EVENTS = Object.freeze([
  "batch.succeeded",
  "batch.expired",
  "batch.failed",
  "interaction.requires_action",
  "interaction.completed",
  "interaction.failed",
  "video.generated",
]);

/** `whsec_` and 32 random bytes in base64: a Standard Webhooks signing secret. */
export const newSigningSecret = () => `whsec_${randomBytes(32).toString("base64")}`;
/** 32 random bytes, URL-safe: a bearer token (admin, register or read). */
export const newToken = () => randomBytes(32).toString("base64url");

/**
 * A token's short, non-secret name, as the worker logs it (`by.fingerprint`, `/v1/whoami`):
 * the first 8 hex digits of SHA-256("gemini-once:" + token) (src/access.rs, `fingerprint`).
 */
export const fingerprint = (token) => createHash("sha256").update(`gemini-once:${token}`).digest("hex").slice(0, 8);

/** A secret list as GEMINI_WEBHOOK_SECRETS holds it (spaces or commas), without blanks. */
export const secretList = (value) => (value ?? "").split(/[\s,]+/).filter(Boolean);

/**
 * Sets NAME=value lines in `file`: the first uncommented line of each name is replaced in
 * place, a name not there is appended; other lines and comments stay. A file this writes ends
 * readable by its owner only (0600), whether it created it or not: the values are secrets, and
 * an existing file may be a plain copy of .dev.vars.example (0644). Returns the names whose
 * value changed.
 */
export function writeVars(file, updates) {
  const existed = existsSync(file);
  const lines = existed ? readFileSync(file, "utf8").split("\n") : [];
  if (lines.length && lines[lines.length - 1] === "") lines.pop();
  const changed = [];
  for (const [name, value] of Object.entries(updates)) {
    const line = `${name}="${value}"`;
    const at = lines.findIndex((l) => new RegExp(`^\\s*${name}\\s*=`).test(l));
    if (at === -1) {
      lines.push(line);
      changed.push(name);
    } else if (lines[at] !== line) {
      lines[at] = line;
      changed.push(name);
    }
  }
  if (changed.length || !existed) {
    // An existing file is tightened before the secrets go in, so they are never readable by
    // others even for a moment; `mode` applies only to a file writeFileSync creates, and then
    // under the umask, hence the chmod after too.
    if (existed) chmodSync(file, 0o600);
    writeFileSync(file, `${lines.join("\n")}\n`, { mode: 0o600 });
    chmodSync(file, 0o600);
  }
  return changed;
}

/** The wrangler to run: `GEMINI_ONCE_WRANGLER` (a stand-in, in tests) or the project's own. */
export const wranglerPath = () => process.env.GEMINI_ONCE_WRANGLER || path.join(ROOT, "node_modules/.bin/wrangler");

/**
 * Runs wrangler with `args` (and `input` on its standard input), echoing its output when
 * `echo`; resolves to {code, stdout, stderr}. Never rejects on a non-zero exit.
 */
export function wrangler(args, { input, echo = false, env = {} } = {}) {
  return new Promise((resolve) => {
    const child = spawn(wranglerPath(), args, {
      cwd: ROOT,
      env: { ...process.env, WRANGLER_SEND_METRICS: "false", ...env },
      stdio: ["pipe", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d) => {
      stdout += d;
      if (echo) process.stdout.write(d);
    });
    child.stderr.on("data", (d) => {
      stderr += d;
      if (echo) process.stderr.write(d);
    });
    child.on("error", (e) => resolve({ code: 127, stdout, stderr: `${stderr}${e.message}` }));
    child.on("close", (code) => resolve({ code: code ?? 1, stdout, stderr }));
    child.stdin.end(input ?? "");
  });
}

/** The names of the deployed worker's secrets, or null when the worker does not exist yet. */
export async function remoteSecretNames() {
  const r = await wrangler(["secret", "list", "--format", "json"]);
  if (r.code !== 0) {
    if (/not found|does not exist|10007/i.test(r.stdout + r.stderr)) return null;
    throw new Error(`wrangler secret list failed (${r.code}): ${(r.stderr || r.stdout).trim()}`);
  }
  const start = r.stdout.indexOf("[");
  return new Set(JSON.parse(r.stdout.slice(start)).map((s) => s.name));
}
