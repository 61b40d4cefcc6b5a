// A gemini-once destination as a Cloudflare Worker: the official `standardwebhooks` verifier,
// and D1 as the record of every `webhook-id` handled. A starting point to copy
// (docs/EFFECTS.md; wrangler.toml says how to deploy it).
//
// It takes both bodies gemini-once sends (docs/effect.schema.json): a job's effect (`status`:
// succeeded, failed, cancelled, expired) and, for a batch registered with `"results": "each"`,
// each result's own effect (`result_key`, `index`, one of `response`, `error`, `unreadable`;
// no `status`).
//
// What it guarantees, and why:
// - Nothing unverified runs: the raw body's Standard Webhooks signature is checked (with
//   gemini-once's EFFECT_SIGNING_SECRET) before the body is parsed; a bad or stale one answers
//   401, which gemini-once parks rather than retrying forever.
// - One copy of a `webhook-id` runs, whatever arrives at once. The id is claimed first, by
//   an insert its primary key lets through once (`ON CONFLICT DO NOTHING RETURNING`), and only
//   the copy whose insert went in runs the effect. A copy that finds the id done is answered
//   2xx and runs nothing; one that finds it still running is answered 409, which gemini-once
//   retries later (by then it is done, or the claim was given up). D1, not KV: KV is
//   eventually consistent (a write can take 60 s or more to be seen from another location),
//   so a copy landing elsewhere could miss the claim; D1's writes go to one primary.
// - Never lost: the 2xx goes out only once the effect ran and the id is marked done. An effect
//   that throws gives its claim up and answers 500, so gemini-once's retry runs it again; a
//   claim left by a crash is taken over after CLAIM_LEASE_MS. An effect outside D1 (a payment,
//   an email) should pass `webhook-id` on as its own idempotency key, so that a rerun after
//   such a crash is absorbed downstream.
// - A redelivery an operator asked for is a new generation with a new `webhook-id` and runs
//   again on purpose; `idempotency-key` is the operation's key (a result's own id for a
//   result), the same for every generation.
import { Webhook } from "standardwebhooks";

interface Env {
  DB: D1Database;
  EFFECT_SIGNING_SECRET: string;
}

/** A job's effect (`status`) or one result's (`result_key`, `index`, and what it carries). */
interface Effect {
  key: string;
  status?: string;
  result_key?: string;
  index?: number;
  [field: string]: unknown;
}

/**
 * How long a claim holds before another copy of its id may take it over: longer than any
 * effect takes, so a running effect is never run twice at once; short enough that a claim a
 * crash left behind is retried within gemini-once's backoff.
 */
const CLAIM_LEASE_MS = 60_000;

const json = (status: number, body: unknown) =>
  new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json" } });

/** What the effect says happened: a job's status, or which answer a result carries. */
function outcome(effect: Effect): string {
  if (effect.result_key === undefined) return String(effect.status);
  return ["response", "error", "unreadable"].find((k) => k in effect) ?? "unknown";
}

/** Your side effect goes here (publish, bill, notify); throwing answers 500 and gemini-once retries. */
async function applyEffect(effect: Effect, webhookId: string, generation: number, _env: Env): Promise<void> {
  const what = effect.result_key === undefined
    ? `status=${outcome(effect)}`
    : `result_key=${effect.result_key} index=${effect.index} outcome=${outcome(effect)}`;
  console.log(`processed webhook-id=${webhookId} key=${effect.key} generation=${generation} ${what}`);
}

export default {
  async fetch(request: Request, env: Env): Promise<Response> {
    if (request.method !== "POST" || new URL(request.url).pathname !== "/effects") return json(404, { error: "POST /effects" });
    const raw = await request.text();
    const headers = Object.fromEntries(request.headers);
    let effect: Effect;
    try {
      effect = new Webhook(env.EFFECT_SIGNING_SECRET).verify(raw, headers) as Effect;
    } catch {
      return json(401, { error: "signature not verified" });
    }
    const webhookId = headers["webhook-id"];
    const generation = Number(headers["effect-generation"] ?? "1");
    const now = Date.now();
    // The claim: a new id goes in; a claim older than the lease (a crash) is taken over.
    const claimed = await env.DB.prepare(
      `INSERT INTO effects (webhook_id, idempotency_key, generation, result_key, outcome, body, claimed_at)
       VALUES (?, ?, ?, ?, ?, ?, ?)
       ON CONFLICT (webhook_id) DO UPDATE SET claimed_at = excluded.claimed_at
         WHERE effects.done_at IS NULL AND effects.claimed_at < ?
       RETURNING webhook_id`,
    ).bind(webhookId, headers["idempotency-key"] ?? effect.key, generation, effect.result_key ?? null, outcome(effect), raw, now, now - CLAIM_LEASE_MS).first();
    if (!claimed) {
      const row = await env.DB.prepare("SELECT done_at FROM effects WHERE webhook_id = ?").bind(webhookId).first<{ done_at: number | null }>();
      if (row?.done_at != null) return json(200, { ok: true, duplicate: true });
      return json(409, { error: "this webhook-id is being handled now; retry later" });
    }
    try {
      await applyEffect(effect, webhookId, generation, env);
    } catch (e) {
      // Give the claim up (only ours: the same claimed_at), so the retry runs the effect.
      await env.DB.prepare("DELETE FROM effects WHERE webhook_id = ? AND claimed_at = ? AND done_at IS NULL").bind(webhookId, now).run();
      console.log(`failed webhook-id=${webhookId}: ${e instanceof Error ? e.message : String(e)}`);
      return json(500, { error: "the effect failed; gemini-once retries it" });
    }
    await env.DB.prepare("UPDATE effects SET done_at = ? WHERE webhook_id = ?").bind(Date.now(), webhookId).run();
    return json(200, { ok: true, duplicate: false });
  },
};
