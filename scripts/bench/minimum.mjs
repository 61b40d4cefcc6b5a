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
    this.sql.exec("CREATE TABLE IF NOT EXISTS op (key TEXT PRIMARY KEY, status TEXT NOT NULL, detail TEXT, due_ms INTEGER, claim INTEGER NOT NULL DEFAULT 0, done INTEGER NOT NULL DEFAULT 0)");
  }
  async fetch(request) {
    const { command, key, status, detail } = await request.json();
    const now = Date.now();
    const row = this.sql.exec("SELECT status FROM op WHERE key = ?", key).toArray()[0];
    if (command === "register") {
      if (row) return json({ outcome: "exists" });
      this.sql.exec("INSERT INTO op (key, status, due_ms) VALUES (?, 'pending', ?)", key, now);
      await this.wake(now);
      return json({ outcome: "registered" }, 201);
    }
    if (row && row.status !== "pending") return json({ outcome: "dropped", reason: "duplicate" });
    this.sql.exec("INSERT INTO op (key, status, detail, due_ms) VALUES (?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET status = excluded.status, detail = excluded.detail, due_ms = excluded.due_ms", key, status, detail, now);
    await this.wake(now);
    return json({ outcome: "applied", effect: "scheduled" });
  }
  async wake(at) {
    const set = await this.state.storage.getAlarm();
    if (set === null || set > at) await this.state.storage.setAlarm(at);
  }
  async alarm() {
    const now = Date.now();
    const due = this.sql.exec("SELECT key, status, detail, claim FROM op WHERE due_ms <= ?", now).toArray();
    await Promise.all(due.map((row) => this.settle(row, now)));
    const next = this.sql.exec("SELECT MIN(due_ms) AS at FROM op").one().at;
    if (next !== null) await this.state.storage.setAlarm(next);
  }
  async settle(row, now) {
    let done = 0;
    if (row.status !== "pending") {
      const claim = row.claim + 1;
      this.sql.exec("UPDATE op SET claim = ?, due_ms = ? WHERE key = ?", claim, now + CLAIM_TTL_MS, row.key);
      await this.state.storage.setAlarm(now + CLAIM_TTL_MS);
      const answer = await fetch(this.env.EFFECT_URL, { method: "POST", body: JSON.stringify({ key: row.key, status: row.status, detail: JSON.parse(row.detail) }),
        headers: { "content-type": "application/json", "idempotency-key": row.key } });
      await answer.arrayBuffer();
      if (!answer.ok) return; // the claim's expiry retries it
      done = this.sql.exec("UPDATE op SET done = 1, due_ms = NULL WHERE key = ? AND claim = ? RETURNING done", row.key, claim).toArray().length;
      if (!done) return; // fenced: a later claim owns it
    } else {
      this.sql.exec("UPDATE op SET due_ms = NULL WHERE key = ?", row.key);
    }
    await this.env.LEDGER.put("op:" + row.key, JSON.stringify({ key: row.key, status: row.status, effect_done: done === 1 }),
      { metadata: { status: row.status, effect_done: done === 1 } });
  }
}

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

/** Starts the minimum design `name` (a key of MINIMUM_DESIGNS), its effects going to `effectUrl`. */
export function startMinimum(name, effectUrl) {
  if (!(name in MINIMUM_DESIGNS)) throw new Error(`unknown minimum design ${name}`);
  return startPlain({
    code: SCRIPT,
    compatibilityDate: "2026-04-01",
    kvNamespaces: ["LEDGER"],
    durableObjects: { GATE: { className: "Gate", useSQLite: true } },
    bindings: { GEMINI_WEBHOOK_SECRETS: GEMINI_SECRET, EFFECT_URL: effectUrl, ADMIN_TOKEN, SHARDS: String(MINIMUM_DESIGNS[name]) },
  });
}
