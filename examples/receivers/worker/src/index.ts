// A gemini-once destination as a Cloudflare Worker: the official `standardwebhooks` verifier,
// and D1 as the record of every `webhook-id` handled. A starting point to copy
// (docs/EFFECTS.md; wrangler.toml says how to deploy it).
//
// What it guarantees, and why:
// - Nothing unverified runs: the raw body's Standard Webhooks signature is checked (with
//   gemini-once's EFFECT_SIGNING_SECRET) before the body is parsed; a bad or stale one answers
//   401, which gemini-once parks rather than retrying forever.
// - A `webhook-id` already recorded is answered 2xx and not run again. D1, not KV: KV is
//   eventually consistent (a write can take 60 s or more to be seen from another location),
//   so a retry landing elsewhere could miss the first copy's mark and run the effect twice.
//   D1's writes go to one primary, and the row's primary key refuses a second copy of an id.
// - The id is recorded only after the effect ran, and the 2xx only after that: a crash in
//   between brings a retry of the same id that runs the effect again, so the effect is never
//   lost. An effect outside D1 (a payment, an email) should pass `webhook-id` on as its own
//   idempotency key so that such a rerun is absorbed downstream.
// - A redelivery an operator asked for is a new generation with a new `webhook-id` and runs
//   again on purpose; `idempotency-key` is the operation's key, the same for every generation.
import { Webhook } from "standardwebhooks";

interface Env {
  DB: D1Database;
  EFFECT_SIGNING_SECRET: string;
}

interface Effect {
  key: string;
  status: string;
  [field: string]: unknown;
}

const json = (status: number, body: unknown) =>
  new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json" } });

/** Your side effect goes here (publish, bill, notify); throwing answers 500 and gemini-once retries. */
async function applyEffect(effect: Effect, webhookId: string, generation: number, _env: Env): Promise<void> {
  console.log(`processed webhook-id=${webhookId} key=${effect.key} generation=${generation} status=${effect.status}`);
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
    const seen = await env.DB.prepare("SELECT 1 FROM effects WHERE webhook_id = ?").bind(webhookId).first();
    if (seen) return json(200, { ok: true, duplicate: true });
    await applyEffect(effect, webhookId, generation, env);
    await env.DB.prepare("INSERT INTO effects VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (webhook_id) DO NOTHING")
      .bind(webhookId, headers["idempotency-key"] ?? effect.key, generation, effect.status, raw, Date.now())
      .run();
    return json(200, { ok: true, duplicate: false });
  },
};
