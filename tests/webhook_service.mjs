// A local stand-in for Gemini's WebhookService (`v1beta/webhooks`), in the shapes of the
// official SDKs' webhook types (google-genai 3.x `_gaos/types/webhooks`, @google/genai
// `Webhooks`): create, list (paged), get, patch (update_mask), delete, `:ping` and
// `:rotateSigningSecret`. It refuses what the SDKs' types say the API refuses: a missing API
// key, a missing `uri` or `subscribed_events`, an event outside `WebhookSubscribedEvent` (such
// as `batch.cancelled`), an unknown field, a `page_size` over 1000, an unknown
// `revocation_behavior`. `:ping` answers `{}` (WebhookPingResponse) and then POSTs a test
// delivery to the webhook's `uri`, signed Standard Webhooks style with every live secret (the
// body's type, `webhook.ping`, is this stand-in's guess: no public source shows a ping's body).
import { createServer } from "node:http";
import { randomBytes } from "node:crypto";
import { sign } from "../scripts/send.mjs";
import { SDK_EVENTS } from "../scripts/deploy_vars.mjs";

const DAY_MS = 86_400_000;

export async function startWebhookService({ apiKey = "test-gemini-key", pageSize = 50, now = () => Date.now() } = {}) {
  const hooks = new Map();
  const calls = [];
  const pings = [];
  let serial = 0;
  const secret = () => `whsec_${randomBytes(24).toString("base64")}`;
  const truncated = (s) => `whsec_...${s.slice(-4)}`;
  const live = (h) => h.secrets.filter((s) => s.expire === undefined || s.expire > now());
  const view = (h) => ({
    id: h.id,
    name: h.name,
    uri: h.uri,
    subscribed_events: [...h.events],
    state: h.state,
    create_time: h.created,
    update_time: h.updated,
    signing_secrets: live(h).map((s) => ({ truncated_secret: truncated(s.value), ...(s.expire ? { expire_time: new Date(s.expire).toISOString() } : {}) })),
  });
  const error = (status, message, code = status === 400 ? "INVALID_ARGUMENT" : status === 404 ? "NOT_FOUND" : "PERMISSION_DENIED") =>
    ({ status, body: { error: { code: status, message, status: code } } });
  const checkEvents = (events) => {
    if (!Array.isArray(events) || !events.length) return "subscribed_events is required";
    const bad = events.filter((e) => !SDK_EVENTS.includes(e));
    return bad.length ? `Invalid value at 'webhook.subscribed_events' (${bad.join(", ")})` : null;
  };
  const unknownFields = (body, allowed) => Object.keys(body).filter((k) => !allowed.includes(k));

  async function deliverPing(h) {
    const body = JSON.stringify({ type: "webhook.ping", version: "v1", timestamp: new Date(now()).toISOString(), data: { webhook_id: h.id } });
    const id = `msg_ping_${++serial}`;
    const ts = Math.floor(now() / 1000);
    const signatures = live(h).map((s) => sign(s.value, id, ts, body)["webhook-signature"]).join(" ");
    const headers = { ...sign(live(h)[0].value, id, ts, body), "webhook-signature": signatures, "content-type": "application/json" };
    try {
      const res = await fetch(h.uri, { method: "POST", headers, body });
      pings.push({ webhook: h.id, status: res.status, answer: await res.text() });
    } catch (e) {
      pings.push({ webhook: h.id, status: 0, answer: e.message });
    }
  }

  function handle(method, url, body, headers) {
    if (headers["x-goog-api-key"] !== apiKey) return error(403, "API key not valid. Please pass a valid API key.");
    const m = url.pathname.match(/^\/v1beta\/webhooks(?:\/([^/:]+))?(?::(ping|rotateSigningSecret))?$/);
    if (!m) return error(404, `no route ${method} ${url.pathname}`);
    const [, id, verb] = m;
    if (!id) {
      if (method === "POST") {
        const extra = unknownFields(body, ["name", "uri", "subscribed_events"]);
        if (extra.length) return error(400, `Invalid JSON payload received. Unknown name "${extra[0]}": Cannot find field.`);
        if (typeof body.uri !== "string" || !/^https?:\/\//.test(body.uri)) return error(400, "uri is required");
        const bad = checkEvents(body.subscribed_events);
        if (bad) return error(400, bad);
        const s = secret();
        const h = { id: randomBytes(18).toString("hex"), name: body.name, uri: body.uri, events: body.subscribed_events, state: "enabled", secrets: [{ value: s }], created: new Date(now()).toISOString() };
        h.updated = h.created;
        hooks.set(h.id, h);
        return { status: 200, body: { ...view(h), new_signing_secret: s } };
      }
      if (method === "GET") {
        const size = Number(url.searchParams.get("page_size") ?? pageSize);
        if (!(size >= 0 && size <= 1000)) return error(400, "page_size must be at most 1000");
        const all = [...hooks.values()];
        const from = Number(url.searchParams.get("page_token") || 0);
        const step = Math.min(size || pageSize, pageSize);
        const page = all.slice(from, from + step);
        return { status: 200, body: { webhooks: page.map(view), ...(from + step < all.length ? { next_page_token: String(from + step) } : {}) } };
      }
      return error(405, "method not allowed", "UNIMPLEMENTED");
    }
    const h = hooks.get(id);
    if (!h) return error(404, `webhook ${id} not found`);
    if (verb === "ping" && method === "POST") {
      setTimeout(() => deliverPing(h), 10);
      return { status: 200, body: {} };
    }
    if (verb === "rotateSigningSecret" && method === "POST") {
      const extra = unknownFields(body, ["revocation_behavior"]);
      if (extra.length) return error(400, `Invalid JSON payload received. Unknown name "${extra[0]}": Cannot find field.`);
      const behavior = body.revocation_behavior ?? "revoke_previous_secrets_after_h24";
      if (!["revoke_previous_secrets_after_h24", "revoke_previous_secrets_immediately"].includes(behavior)) return error(400, `Invalid value at 'revocation_behavior' (${behavior})`);
      const expire = behavior === "revoke_previous_secrets_immediately" ? now() : now() + DAY_MS;
      for (const s of live(h)) s.expire = expire;
      const s = secret();
      h.secrets.push({ value: s });
      return { status: 200, body: { secret: s } };
    }
    if (verb) return error(405, "method not allowed", "UNIMPLEMENTED");
    if (method === "GET") return { status: 200, body: view(h) };
    if (method === "DELETE") {
      hooks.delete(id);
      return { status: 200, body: {} };
    }
    if (method === "PATCH") {
      const extra = unknownFields(body, ["name", "uri", "subscribed_events", "state"]);
      if (extra.length) return error(400, `Invalid JSON payload received. Unknown name "${extra[0]}": Cannot find field.`);
      const mask = (url.searchParams.get("update_mask") ?? Object.keys(body).join(",")).split(",").filter(Boolean);
      for (const field of mask) {
        if (!["name", "uri", "subscribed_events", "state"].includes(field)) return error(400, `update_mask names an unknown field ${field}`);
        if (field === "subscribed_events") {
          const bad = checkEvents(body.subscribed_events);
          if (bad) return error(400, bad);
          h.events = body.subscribed_events;
        } else if (field === "state") {
          if (!["enabled", "disabled"].includes(body.state)) return error(400, `Invalid value at 'webhook.state' (${body.state})`);
          h.state = body.state;
        } else {
          h[field] = body[field];
        }
      }
      h.updated = new Date(now()).toISOString();
      return { status: 200, body: view(h) };
    }
    return error(405, "method not allowed", "UNIMPLEMENTED");
  }

  const server = createServer((req, res) => {
    let raw = "";
    req.on("data", (c) => (raw += c));
    req.on("end", () => {
      const url = new URL(req.url, "http://stand-in");
      let body = {};
      let answer;
      try {
        body = raw ? JSON.parse(raw) : {};
      } catch {
        answer = error(400, "Invalid JSON payload received.");
      }
      answer ??= handle(req.method, url, body, req.headers);
      calls.push({ method: req.method, path: `${url.pathname}${url.search}`, body, status: answer.status });
      res.writeHead(answer.status, { "content-type": "application/json" });
      res.end(JSON.stringify(answer.body));
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    apiKey,
    hooks,
    calls,
    pings,
    /** The live secrets of webhook `id`, oldest first. */
    secretsOf: (id) => live(hooks.get(id)).map((s) => s.value),
    /** Marks the webhook as Gemini does after long failure. */
    disable: (id) => { hooks.get(id).state = "disabled_due_to_failed_deliveries"; },
    /** Adds a webhook as a user's hand-written curl once did (any events), without the API's checks. */
    seed: (h) => {
      const v = { id: randomBytes(18).toString("hex"), state: "enabled", secrets: [{ value: secret() }], created: new Date(now()).toISOString(), ...h };
      hooks.set(v.id, v);
      return v;
    },
    close: () => new Promise((resolve) => server.close(resolve)),
  };
}
