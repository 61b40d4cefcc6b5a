// The local HTTP stand-ins: Gemini's status API (answers from the schedule at the current time,
// with faults; and a results batch's file at the download path, with its own faults: not there
// yet right after the completion, a 503, a connection cut mid-file) and the side-effect
// destination (accepts on arrival or fails, sometimes slowly; checks each request's Standard
// Webhooks signature and records it).
import { createServer } from "node:http";
import { sign } from "../send.mjs";
import { memoryFile, serveFile } from "../results_file.mjs";

import { DEST_5XX, DEST_OVER_TIMEOUT, DEST_SLOW, EFFECT_SECRET, GEMINI_API_KEY, STATUS_429, STATUS_500, STATUS_STALE, sleep } from "./config.mjs";
import { makeRng } from "./schedule.mjs";

function verifyEffect(headers, body) {
  const id = headers["webhook-id"], ts = headers["webhook-timestamp"], sig = headers["webhook-signature"];
  if (!id || !ts || !sig) return false;
  const expected = sign(EFFECT_SECRET, id, ts, body)["webhook-signature"];
  return sig.split(" ").some((s) => s === expected);
}

function listen(handler) {
  return new Promise((resolve) => {
    const server = createServer(handler);
    server.keepAliveTimeout = 5000;
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      resolve({
        url: `http://127.0.0.1:${port}`,
        close: () => new Promise((r) => { server.closeAllConnections?.(); server.close(() => r()); }),
      });
    });
  });
}

function readBody(req) {
  return new Promise((resolve) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => resolve(Buffer.concat(chunks).toString()));
    req.on("error", () => resolve(Buffer.concat(chunks).toString()));
  });
}

export function iso(ms) {
  return new Date(ms).toISOString();
}

/** Gemini's status API: answers from the schedule at the current time, with faults. */
export async function startStatusApi(run) {
  const rng = makeRng(run.seed ^ 0x5a7a5);
  const byPath = new Map(run.schedule.ops.map((op) => [op.statusPath, op]));
  const stats = { calls: 0, status_429: 0, status_500: 0, status_stale: 0, terminal: 0, nonterminal: 0, not_found: 0, bad_key: 0, downloads: 0, ranged: 0, file_not_yet: 0, file_503: 0, file_cut: 0 };
  const files = new Map(run.schedule.ops.filter((op) => op.results).map((op) => [`/download/v1beta/${op.results.file}:download`, { op, file: memoryFile(op.results.lines) }]));
  const fileRng = makeRng(run.seed ^ 0xd0f1);
  const server = await listen(async (req, res) => {
    await readBody(req);
    const url = req.url.split("?")[0];
    const held = files.get(decodeURIComponent(url));
    if (held) {
      if (held.op.results.slowMs) await sleep(held.op.results.slowMs);
      return serveResults(req, res, held, run, fileRng, stats);
    }
    stats.calls++;
    if (req.headers["x-goog-api-key"] !== GEMINI_API_KEY) stats.bad_key++;
    const op = byPath.get(url);
    const send = (status, body, headers = {}) => {
      if (res.destroyed) return;
      res.writeHead(status, { "content-type": "application/json", ...headers });
      res.end(JSON.stringify(body));
    };
    if (!op) {
      stats.not_found++;
      return send(404, { error: { code: 404, message: "not found", status: "NOT_FOUND" } });
    }
    const x = rng.float();
    if (x < STATUS_429) {
      stats.status_429++;
      return send(429, { error: { code: 429, message: "chaos: rate limited", status: "RESOURCE_EXHAUSTED" } }, { "retry-after": String(rng.int(1, 2)) });
    }
    if (x < STATUS_429 + STATUS_500) {
      stats.status_500++;
      return send(rng.chance(0.5) ? 500 : 503, { error: { code: 500, message: "chaos: internal", status: "INTERNAL" } }, { "retry-after": "1" });
    }
    const now = Date.now() - run.t0;
    let phase;
    if (now < op.completeAt) phase = now < op.runningAt ? "pending" : "running";
    else if (rng.chance(STATUS_STALE)) {
      stats.status_stale++;
      phase = rng.chance(0.8) ? "running" : "pending";
    } else phase = "terminal";
    if (phase === "terminal") stats.terminal++;
    else stats.nonterminal++;
    send(200, statusBody(op, phase, run.t0, rng));
  });
  return { ...server, stats };
}

/**
 * A results file (after the batch's `slowMs`, when it has one): 404 for a moment after the completion (half the asks in its first 1.5 s),
 * 503 sometimes, cut after part of its bytes sometimes, else served (honouring `Range`).
 */
function serveResults(req, res, { op, file }, run, rng, stats) {
  stats.downloads++;
  if (req.headers.range) stats.ranged++;
  if (req.headers["x-goog-api-key"] !== GEMINI_API_KEY) stats.bad_key++;
  const sinceDone = Date.now() - run.t0 - op.completeAt;
  const x = rng.float();
  const fail = (status) => {
    res.writeHead(status, { "content-type": "application/json" });
    res.end(JSON.stringify({ error: { code: status, message: "chaos: results file", status: status === 404 ? "NOT_FOUND" : "UNAVAILABLE" } }));
  };
  if (sinceDone < 0 || (sinceDone < 1_500 && x < 0.5)) {
    stats.file_not_yet++;
    return fail(404);
  }
  if (x > 0.97) {
    stats.file_503++;
    return fail(503);
  }
  if (x > 0.92) {
    // Headers and part of the body, then the connection drops.
    stats.file_cut++;
    res.writeHead(200, { "content-type": "application/octet-stream", "content-length": String(file.size) });
    (async () => {
      for await (const chunk of file.slice(0, Math.floor(file.size * rng.uniform(0.1, 0.9)))) res.write(chunk);
      res.destroy();
    })();
    return;
  }
  serveFile(req, res, file);
}

function statusBody(op, phase, t0, rng) {
  const updateTime = iso(t0 + (phase === "terminal" ? op.completeAt : phase === "running" ? op.runningAt : op.createdAt));
  if (op.family === "batch") {
    const prefix = rng.chance(0.2) ? "JOB_STATE_" : "BATCH_STATE_";
    const state = phase === "terminal" ? op.outcome.toUpperCase() : phase.toUpperCase();
    const body = { name: op.key, metadata: { "@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch", state: prefix + state, createTime: iso(t0 + op.createdAt), updateTime } };
    if (phase === "terminal") {
      body.done = true;
      body.metadata.endTime = updateTime;
      if (op.outcome === "succeeded") body.response = { responsesFile: op.results?.file ?? `files/${op.id}-out` };
      if (op.outcome === "failed") body.error = { code: 13, message: "chaos: planned failure" };
      if (op.outcome === "cancelled" && rng.chance(0.5)) body.error = { code: 1, message: "cancelled" };
      if (op.outcome === "expired" && rng.chance(0.5)) body.error = { code: 4, message: "deadline exceeded" };
    }
    return body;
  }
  if (op.family === "interaction") {
    const status = phase === "pending" ? "queued" : phase === "running" ? "in_progress"
      : op.outcome === "succeeded" ? "completed" : op.outcome === "cancelled" ? "cancelled" : rng.pick(["failed", "incomplete", "budget_exceeded"]);
    return { id: op.id, status, created: iso(t0 + op.createdAt), updated: updateTime };
  }
  const body = { name: op.name, metadata: { updateTime } };
  if (phase !== "terminal") return { ...body, done: false };
  if (op.outcome === "succeeded") return { ...body, done: true, response: { generateVideoResponse: { generatedSamples: [{ video: { uri: `files/${op.id}` } }] } } };
  if (op.outcome === "cancelled") return { ...body, done: true, error: { code: 1, message: "cancelled" } };
  return { ...body, done: true, error: { code: 13, message: "chaos: planned failure" } };
}

/** The side-effect destination: accepts (commits) on arrival or fails, sometimes slowly. */
export async function startDestination(run) {
  const rng = makeRng(run.seed ^ 0xde57);
  const requests = [];
  const stats = { requests: 0, dest_5xx: 0, dest_outage: 0, dest_slow: 0, dest_over_timeout: 0, accepted: 0, bad_signature: 0 };
  const server = await listen(async (req, res) => {
    const arrivedAt = Date.now();
    const body = await readBody(req);
    stats.requests++;
    let parsed = null;
    try { parsed = JSON.parse(body); } catch {}
    // Drawn whatever the outage, so the seed's other faults stay where they were.
    const chance = rng.chance(DEST_5XX);
    const outage = run.schedule.outage;
    const down = Boolean(outage) && arrivedAt >= run.t0 + outage.at && arrivedAt < run.t0 + outage.at + outage.ms;
    if (down) stats.dest_outage++;
    const failing = chance || down;
    const status = failing ? rng.pick([500, 502, 503]) : rng.pick([200, 200, 200, 201, 202, 204]);
    const y = rng.float();
    const delayMs = y < DEST_OVER_TIMEOUT ? rng.uniform(1100, 1800) : y < DEST_OVER_TIMEOUT + DEST_SLOW ? rng.uniform(100, 700) : rng.uniform(0, 10);
    if (failing) stats.dest_5xx++;
    if (y < DEST_OVER_TIMEOUT) stats.dest_over_timeout++;
    else if (y < DEST_OVER_TIMEOUT + DEST_SLOW) stats.dest_slow++;
    const sigOk = verifyEffect(req.headers, body);
    if (!sigOk) stats.bad_signature++;
    const rec = {
      seq: requests.length,
      key: req.headers["idempotency-key"],
      webhookId: req.headers["webhook-id"],
      generation: req.headers["effect-generation"],
      bodyStatus: parsed?.status,
      bodyKey: parsed?.key,
      // A result's effect (it carries `result_key`), or the job's counts of a results batch.
      resultKey: parsed?.result_key,
      resultIndex: parsed?.index,
      resultKind: parsed && "result_key" in parsed ? ["response", "error", "unreadable"].find((k) => k in parsed) ?? null : undefined,
      bodyResults: parsed?.results,
      settledBy: parsed?.settled_by,
      arrivedAt,
      status,
      accepted: status >= 200 && status < 300,
      delayMs: Math.round(delayMs),
      finishedAt: null,
      closedAt: null,
      closedEarly: false,
      sigOk,
    };
    if (rec.accepted) stats.accepted++;
    requests.push(rec);
    res.on("close", () => {
      rec.closedAt = Date.now();
      if (!res.writableFinished) rec.closedEarly = true;
    });
    res.on("finish", () => { rec.finishedAt = Date.now(); });
    if (delayMs > 0) await sleep(delayMs);
    if (res.destroyed || res.writableEnded) {
      rec.closedEarly = true;
      return;
    }
    res.writeHead(status, { "content-type": "application/json" });
    res.end(status === 204 ? undefined : JSON.stringify(rec.accepted ? { ok: true } : { error: "chaos: destination failing" }));
  });
  return { ...server, stats, requests };
}
