// The destination-outage bench: N completions whose destination is down (503) for a while,
// then recovers. What it shows: how many requests the down destination receives per failing
// effect per hour (one first attempt each, then only the desk's probes), and how long after
// the recovery the last waiting effect is delivered (the desk's drain, soonest first, at 50 a
// second for an unpaced destination). Every count is the stand-in destination's own.
import http from "node:http";
import { ADMIN_TOKEN, now, round, sleep } from "./common.mjs";
import { startWorker } from "./worker.mjs";
import { send, signed, envelope } from "./load.mjs";

/** DESTINATION_PROBE_MAX_SECONDS' default: the longest wait between probes. */
const PROBE_MAX_MS = 15_000;

/** A destination that answers 503 while `down`, and counts what it receives. */
async function startDestination() {
  const d = { down: true, requests: 0, whileDown: 0, delivered: new Set(), lastDeliveryAt: 0, firstDownPerKey: new Set(), repeatsWhileDown: 0 };
  const server = http.createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      const key = req.headers["idempotency-key"];
      d.requests++;
      if (d.down) {
        d.whileDown++;
        if (d.firstDownPerKey.has(key)) d.repeatsWhileDown++;
        else d.firstDownPerKey.add(key);
        res.writeHead(503, { "content-type": "application/json" });
        return res.end('{"error":"down"}');
      }
      d.delivered.add(key);
      d.lastDeliveryAt = now();
      res.writeHead(200, { "content-type": "application/json" });
      res.end('{"ok":true}');
    });
  });
  server.keepAliveTimeout = 30_000;
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  d.url = `http://127.0.0.1:${server.address().port}`;
  d.close = () => new Promise((r) => { server.closeAllConnections?.(); server.close(r); });
  return d;
}

export async function benchOutage(dir, { waiting, downSeconds }) {
  const dest = await startDestination();
  console.error(`  outage of ${downSeconds} s with ${waiting} effects: starting worker`);
  const w = await startWorker(dir, { EFFECT_URL: `${dest.url}/effects`, UNREGISTERED_HOLD_SECONDS: "0" });
  const agent = new http.Agent({ keepAlive: true, maxSockets: 16 });
  const base = new URL(w.url);
  try {
    const keys = Array.from({ length: waiting }, (_, i) => `batches/outage-${i}`);
    const t0 = now();
    let next = 0;
    await Promise.all(Array.from({ length: 16 }, async () => {
      while (next < keys.length) {
        const key = keys[next++];
        const body = envelope("batch.succeeded", key);
        const r = await send(agent, base, { method: "POST", path: "/webhooks/gemini", headers: signed(body, `msg_${key}`), body });
        if (r.status !== 200) throw new Error(`deliver ${key}: ${r.status} ${r.body}`);
      }
    }));
    const deliveredMs = now() - t0;
    // Every effect has had its first attempt (and been told to wait), or the window ends.
    const firstBy = now() + Math.max(downSeconds * 1000, 60_000);
    while (dest.firstDownPerKey.size < waiting && now() < firstBy) await sleep(200);
    const downFor = downSeconds * 1000 - (now() - t0);
    if (downFor > 0) await sleep(downFor);
    const downMs = now() - t0;
    const stats = await desk(agent, base);
    dest.down = false;
    const recoveredAt = now();
    const deadline = recoveredAt + 30 * 60_000;
    while (dest.delivered.size < waiting && now() < deadline) await sleep(200);
    const drainedMs = dest.lastDeliveryAt - recoveredAt;
    const probes = dest.repeatsWhileDown;
    const result = {
      waiting,
      down_seconds: round(downMs / 1000, 1),
      seconds_to_deliver_completions: round(deliveredMs / 1000, 1),
      first_attempts: dest.firstDownPerKey.size,
      requests_while_down: dest.whileDown,
      repeats_while_down: probes,
      // Projected for an hour down: one first attempt each, the probes seen, then one probe
      // every DESTINATION_PROBE_MAX_SECONDS (15 s by default) for the rest of the hour.
      requests_per_failing_effect_per_hour: round((dest.firstDownPerKey.size + probes + Math.max(0, 3_600_000 - downMs) / PROBE_MAX_MS) / waiting, 4),
      desk_at_recovery: stats,
      delivered: dest.delivered.size,
      seconds_from_recovery_to_last_delivery: round(drainedMs / 1000, 1),
    };
    console.error(`  outage: ${result.requests_while_down} requests while down (${probes} repeats), ${result.requests_per_failing_effect_per_hour} per failing effect per hour; ${result.delivered}/${waiting} delivered, the last ${result.seconds_from_recovery_to_last_delivery} s after recovery`);
    return result;
  } finally {
    agent.destroy();
    await w.dispose();
    await dest.close();
  }
}

/** EFFECT_URL's desk, as /v1/stats shows it. */
async function desk(agent, base) {
  const r = await send(agent, base, { method: "GET", path: "/v1/stats", headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
  try {
    return JSON.parse(r.body).destinations?.[0] ?? null;
  } catch {
    return null;
  }
}
