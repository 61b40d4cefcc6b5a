// The load generator: one HTTP request over node's http with a keep-alive agent, closed-loop load
// at a given concurrency, and Gemini deliveries signed the Standard Webhooks way.
import http from "node:http";
import { sign } from "../send.mjs";

import { GEMINI_SECRET, now } from "./common.mjs";

export function send(agent, base, req) {
  return new Promise((resolve) => {
    const headers = { ...(req.headers ?? {}) };
    if (req.body !== undefined) headers["content-length"] = Buffer.byteLength(req.body);
    const r = http.request({ host: base.hostname, port: base.port, method: req.method ?? "GET", path: req.path, headers, agent }, (res) => {
      const chunks = [];
      res.on("data", (c) => chunks.push(c));
      res.on("end", () => resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString() }));
      res.on("error", (e) => resolve({ status: 0, body: String(e) }));
    });
    r.setTimeout(30_000, () => r.destroy(new Error("client timeout")));
    r.on("error", (e) => resolve({ status: 0, body: String(e) }));
    r.end(req.body);
  });
}

/**
 * Closed-loop load: `concurrency` clients, each sending its next request when the last one
 * is answered, until `durationMs` passed or `maxRequests` were started.
 */
export async function load({ base, agent, concurrency, durationMs, maxRequests, make, check }) {
  const lat = [];
  const failures = new Map();
  let started = 0;
  let transport = 0; // no HTTP answer at all (connection reset or hang-up)
  const t0 = now();
  const deadline = t0 + durationMs;
  async function client() {
    while (now() < deadline && started < maxRequests) {
      const req = make(started++);
      const s = now();
      const res = await send(agent, base, req);
      lat.push(now() - s);
      if (res.status === 0) transport++;
      if (!check(res)) {
        const k = `${res.status} ${res.body.slice(0, 120)}`;
        failures.set(k, (failures.get(k) ?? 0) + 1);
      }
    }
  }
  await Promise.all(Array.from({ length: concurrency }, client));
  const elapsed = now() - t0;
  const failed = [...failures.values()].reduce((a, b) => a + b, 0);
  return { lat, elapsed_ms: elapsed, failures: Object.fromEntries(failures), failed, wrong_answers: failed - transport, transport_errors: transport };
}

/** A delivery's headers, signed as Gemini signs (with `secret`, by default Gemini's). */
export function signed(body, id, secret = GEMINI_SECRET) {
  return sign(secret, id, Math.floor(Date.now() / 1000), body);
}

export function envelope(type, id, data = {}, timestamp = new Date().toISOString()) {
  return JSON.stringify({ type, version: "v1", timestamp, data: { id, ...data } });
}

export const OUTPUT = { output_file_uri: "gs://bench-bucket/results/out.jsonl" };
