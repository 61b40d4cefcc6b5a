// The least a design with a durable owner per operation does here (the measured limit a missed
// side-by-side target meets): a plain-JS Worker with gemini-once's routes and no framework, run
// in workerd beside the two real designs, in the same run and cells. Per delivery it verifies the
// HMAC like the simple design (keys imported once per isolate), then asks the operation's
// Durable Object, which stores the outcome with its due side effect (one SQLite statement) and
// sets its alarm before answering; the alarm claims (one statement, and the alarm re-armed at
// the claim's expiry before the call leaves), calls the destination with the key as
// idempotency key, commits (one statement) and writes the ledger entry (one KV put). A
// registration stores a pending row and writes its ledger entry from the alarm the same way.
// No history, counters, open index, retries, backoff, alerts, tombstones or operator API: what
// gemini-once does beyond this is its own cost, and what this costs is the shape's.
// For the cost section (cost.mjs), two bindings: `USAGE_LOG=true` logs one `usage` line per
// invocation with the same counts as gemini-once's (statements and the rows their cursors
// report, `setAlarm` calls, KV writes, database size, wall time), and `RETENTION_MS` (one
// operation per object only) keeps a settled operation that long, then deletes the object's
// storage from an alarm (`deleteAll`), as gemini-once does at the end of retention: the shape
// with storage that ends.
//
// Two layouts of the same object: `object-per-op` (one Durable Object per operation key, as
// gemini-once) and `sharded` (16 objects, each owning the operations whose key hashes to it:
// warm objects, one alarm multiplexed over many operations, so one slow destination delays
// the other operations of its object; shown for what it would buy, not adopted).
import { ADMIN_TOKEN, GEMINI_SECRET } from "./common.mjs";
import { startPlain } from "./peer.mjs";

/** The minimum designs the side-by-side section runs, by name: how many objects they share. */
export const MINIMUM_DESIGNS = { "object-per-op": 0, sharded: 16 };

const SCRIPT = String.raw`
const enc = new TextEncoder();
const CLAIM_TTL_MS = 600000;
const TERMINAL = { "batch.succeeded": "succeeded", "batch.failed": "failed", "batch.cancelled": "cancelled",
  "batch.expired": "expired", "video.generated": "succeeded", "interaction.completed": "succeeded" };
const json = (body, status = 200) => new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json" } });

let hmacKeys = null;
function secretKeys(env) {
  hmacKeys ??= Promise.all(env.GEMINI_WEBHOOK_SECRETS.split(/[ ,]+/).filter(Boolean).map((s) =>
    crypto.subtle.importKey("raw", Uint8Array.from(atob(s.replace(/^whsec_/, "")), (c) => c.charCodeAt(0)),
      { name: "HMAC", hash: "SHA-256" }, false, ["verify"])));
  return hmacKeys;
}
async function verified(env, headers, body) {
  const id = headers.get("webhook-id");
  const ts = headers.get("webhook-timestamp") ?? "";
  const sig = headers.get("webhook-signature");
  if (!id || !sig || !/^\d+$/.test(ts) || Math.abs(Date.now() / 1000 - Number(ts)) > 300) return false;
  const data = enc.encode(id + "." + ts + "." + body);
  for (const key of await secretKeys(env)) {
    for (const part of sig.split(" ")) {
      const [version, b64] = part.split(",");
      if (version !== "v1" || !b64) continue;
      let mac;
      try { mac = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0)); } catch { continue; }
      if (mac.length === 32 && (await crypto.subtle.verify("HMAC", key, mac, data))) return true;
    }
  }
  return false;
}
function keyOf(name, type) {
  const trimmed = name.trim().replace(/\/+$/, "");
  const pair = /(batches|operations|interactions)\/[^/]+$/.exec(trimmed);
  if (pair) return pair[0];
  if (!trimmed || trimmed.includes("/")) return null;
  return (type.startsWith("video.") ? "operations/" : type.startsWith("interaction.") ? "interactions/" : "batches/") + trimmed;
}
function owner(env, key) {
  const shards = Number(env.SHARDS);
  let h = 2166136261;
  for (let i = 0; i < key.length; i++) h = Math.imul(h ^ key.charCodeAt(i), 16777619) >>> 0;
  return env.GATE.get(env.GATE.idFromName(shards ? "shard-" + (h % shards) : key));
}

export class Gate {
  constructor(state, env) {
    this.state = state;
    this.env = env;
    this.sql = state.storage.sql;
    this.metered = env.USAGE_LOG === "true";
    this.retainMs = Number(env.RETENTION_MS) || 0;
    this.usage = unused();
    this.run("CREATE TABLE IF NOT EXISTS op (key TEXT PRIMARY KEY, status TEXT NOT NULL, detail TEXT, due_ms INTEGER, claim INTEGER NOT NULL DEFAULT 0, done INTEGER NOT NULL DEFAULT 0, retire_ms INTEGER) WITHOUT ROWID");
  }
  /** One statement, its rows (and, metered, what its cursor reports). */
  run(query, ...args) {
    const cursor = this.sql.exec(query, ...args);
    const rows = cursor.toArray();
    if (this.metered) {
      this.usage.sql_statements++;
      this.usage.rows_read += cursor.rowsRead;
      this.usage.rows_written += cursor.rowsWritten;
    }
    return rows;
  }
  async setAlarm(at) {
    this.usage.alarm_writes++;
    await this.state.storage.setAlarm(at);
  }
  /** The invocation's usage line, shaped like gemini-once's (src/telemetry/usage.rs). */
  report(invocation, t0) {
    if (!this.metered) return;
    console.log(JSON.stringify({ event: "usage", object: "gate", invocation, ...this.usage, db_bytes: this.sql.databaseSize, wall_ms: Date.now() - t0 }));
    this.usage = unused();
  }
  async fetch(request) {
    const t0 = Date.now();
    const answer = await this.command(await request.json());
    this.report("fetch", t0);
    return answer;
  }
  async command({ command, key, status, detail }) {
    const now = Date.now();
    const row = this.run("SELECT status FROM op WHERE key = ?", key)[0];
    if (command === "register") {
      if (row) return json({ outcome: "exists" });
      this.run("INSERT INTO op (key, status, due_ms) VALUES (?, 'pending', ?)", key, now);
      await this.wake(now);
      return json({ outcome: "registered" }, 201);
    }
    if (row && row.status !== "pending") return json({ outcome: "dropped", reason: "duplicate" });
    this.run("INSERT INTO op (key, status, detail, due_ms) VALUES (?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET status = excluded.status, detail = excluded.detail, due_ms = excluded.due_ms", key, status, detail, now);
    await this.wake(now);
    return json({ outcome: "applied", effect: "scheduled" });
  }
  async wake(at) {
    const set = await this.state.storage.getAlarm();
    if (set === null || set > at) await this.setAlarm(at);
  }
  async alarm() {
    const t0 = Date.now();
    const now = t0;
    if (this.retainMs && this.run("SELECT 1 FROM op WHERE retire_ms <= ? LIMIT 1", now).length) {
      await this.state.storage.deleteAll();
      this.report("retire", t0);
      return;
    }
    const due = this.run("SELECT key, status, detail, claim FROM op WHERE due_ms <= ?", now);
    await Promise.all(due.map((row) => this.settle(row, now)));
    const next = this.run(this.retainMs ? "SELECT MIN(COALESCE(due_ms, retire_ms)) AS at FROM op" : "SELECT MIN(due_ms) AS at FROM op")[0].at;
    if (next !== null) await this.setAlarm(next);
    this.report("alarm", t0);
  }
  async settle(row, now) {
    let done = 0;
    if (row.status !== "pending") {
      const claim = row.claim + 1;
      this.run("UPDATE op SET claim = ?, due_ms = ? WHERE key = ?", claim, now + CLAIM_TTL_MS, row.key);
      await this.setAlarm(now + CLAIM_TTL_MS);
      const answer = await fetch(this.env.EFFECT_URL, { method: "POST", body: JSON.stringify({ key: row.key, status: row.status, detail: JSON.parse(row.detail) }),
        headers: { "content-type": "application/json", "idempotency-key": row.key } });
      await answer.arrayBuffer();
      if (!answer.ok) return; // the claim's expiry retries it
      done = this.run("UPDATE op SET done = 1, due_ms = NULL, retire_ms = ? WHERE key = ? AND claim = ? RETURNING done", this.retainMs ? Date.now() + this.retainMs : null, row.key, claim).length;
      if (!done) return; // fenced: a later claim owns it
    } else {
      this.run("UPDATE op SET due_ms = NULL WHERE key = ?", row.key);
    }
    this.usage.kv_writes++;
    await this.env.LEDGER.put("op:" + row.key, JSON.stringify({ key: row.key, status: row.status, effect_done: done === 1 }),
      { metadata: { status: row.status, effect_done: done === 1 } });
  }
}
const unused = () => ({ sql_statements: 0, rows_read: 0, rows_written: 0, alarm_writes: 0, kv_writes: 0 });

export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    if (url.pathname === "/healthz") return json({ ok: true });
    if (request.method === "POST" && url.pathname === "/v1/operations") {
      if (request.headers.get("authorization") !== "Bearer " + env.ADMIN_TOKEN) return json({ error: "unauthorized" }, 401);
      const body = await request.json().catch(() => ({}));
      const key = keyOf(String(body.name ?? ""), "batch.");
      if (!key) return json({ error: "bad name" }, 400);
      return forward(owner(env, key), { command: "register", key });
    }
    if (request.method === "POST" && url.pathname === "/webhooks/gemini") {
      const body = await request.text();
      if (!(await verified(env, request.headers, body))) return json({ error: "invalid signature" }, 401);
      let event;
      try { event = JSON.parse(body); } catch { return json({ error: "bad json" }, 400); }
      const key = keyOf(String(event?.data?.id ?? ""), String(event?.type ?? ""));
      if (!key) return json({ error: "bad envelope" }, 400);
      const status = TERMINAL[event.type];
      if (!status) return json({ outcome: "ignored" });
      return forward(owner(env, key), { command: "deliver", key, status, detail: JSON.stringify(event.data) });
    }
    return json({ error: "not found" }, 404);
  },
};
async function forward(stub, command) {
  const answer = await stub.fetch("https://gate/", { method: "POST", body: JSON.stringify(command) });
  return new Response(answer.body, { status: answer.status, headers: { "content-type": "application/json" } });
}
`;

/**
 * Starts the minimum design `name` (a key of MINIMUM_DESIGNS), its effects going to `effectUrl`;
 * `extraBindings` may set `USAGE_LOG` and `RETENTION_MS` (see the header).
 */
export function startMinimum(name, effectUrl, extraBindings = {}) {
  if (!(name in MINIMUM_DESIGNS)) throw new Error(`unknown minimum design ${name}`);
  if (extraBindings.RETENTION_MS && MINIMUM_DESIGNS[name]) throw new Error("RETENTION_MS needs one operation per object");
  return startPlain({
    code: SCRIPT,
    compatibilityDate: "2026-04-01",
    kvNamespaces: ["LEDGER"],
    durableObjects: { GATE: { className: "Gate", useSQLite: true } },
    bindings: { GEMINI_WEBHOOK_SECRETS: GEMINI_SECRET, EFFECT_URL: effectUrl, ADMIN_TOKEN, SHARDS: String(MINIMUM_DESIGNS[name]), ...extraBindings },
  });
}
