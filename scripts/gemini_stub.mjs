#!/usr/bin/env node
// A local stand-in for Gemini's status API, for trying reconciliation without Gemini: every
// operation it is asked about is running until you mark it done.
//
//   npm run gemini-stub [-- --port 8789]                    serve
//   npm run gemini-stub -- done NAME [--state S] [--port 8789]   mark NAME done in a running stub
//
// It serves, in the shapes the worker's status reader (src/reconciliation/status.rs) takes from Gemini:
//   GET /v1beta/batches/{id}                      an Operation with metadata.state BATCH_STATE_*
//   GET /v1beta/models/{model}/operations/{id}    a long-running Operation (done, response/error)
//   GET /v1beta/interactions/{id}                 an Interaction with status and updated
//   GET /v1beta/webhooks                          no webhooks
// and `POST /done/{name}[?state=succeeded|failed|cancelled|expired]` marks an operation done
// (the `done` command sends that). NAME is the operation's name as registered:
// `batches/x`, `models/veo-3/operations/y`, `interactions/z`.
import { createServer } from "node:http";
import { fileURLToPath } from "node:url";
import path from "node:path";

const STATES = ["succeeded", "failed", "cancelled", "expired"];

/** Gemini's answer for `name` (the path after /v1beta/) in `op` ({state, createTime, updateTime}). */
export function statusAnswer(name, op) {
  const { state, createTime, updateTime } = op;
  const done = state !== "running";
  const failure = { failed: { code: 13, message: "stub: marked failed" }, cancelled: { code: 1, message: "stub: marked cancelled" }, expired: { code: 4, message: "stub: marked expired" } }[state];
  if (name.startsWith("batches/")) {
    const metadata = { "@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch", name, state: `BATCH_STATE_${state.toUpperCase()}`, createTime, updateTime };
    if (state === "succeeded") metadata.output = { responsesFile: `files/${name.split("/")[1]}-results` };
    if (done) metadata.endTime = updateTime;
    return { name, metadata, done, ...(state === "succeeded" ? { response: { "@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatchOutput", responsesFile: metadata.output.responsesFile } } : {}), ...(failure && state !== "expired" ? { error: failure } : {}) };
  }
  if (/^models\/[^/]+\/operations\//.test(name)) {
    if (!done) return { name, done: false };
    if (failure) return { name, done: true, error: failure };
    const uri = `https://generativelanguage.googleapis.com/v1beta/files/${name.split("/").at(-1)}:download?alt=media`;
    return { name, done: true, response: { "@type": "type.googleapis.com/google.ai.generativelanguage.v1beta.PredictLongRunningResponse", generateVideoResponse: { generatedSamples: [{ video: { uri } }] } } };
  }
  if (name.startsWith("interactions/")) {
    const status = { running: "in_progress", succeeded: "completed", failed: "failed", cancelled: "cancelled", expired: "incomplete" }[state];
    return { id: name.split("/")[1], status, created: createTime, updated: updateTime, ...(failure ? { errors: [{ code: "internal", message: failure.message }] } : {}) };
  }
  return null;
}

/**
 * The stub's request handler. Operations live in memory; `log` gets one line per request.
 * Returns {handler, operations} (operations: Map name -> {state, createTime, updateTime}).
 */
export function geminiStub({ log = console.log, now = () => new Date() } = {}) {
  const operations = new Map();
  const known = (name) => {
    if (!operations.has(name)) {
      const t = now().toISOString();
      operations.set(name, { state: "running", createTime: t, updateTime: t });
    }
    return operations.get(name);
  };
  const handler = (req, res) => {
    const answer = (status, body) => {
      res.writeHead(status, { "content-type": "application/json" });
      res.end(JSON.stringify(body));
    };
    req.resume();
    req.on("end", () => {
      const url = new URL(req.url, "http://stub");
      const name = decodeURIComponent(url.pathname).replace(/^\/(v1beta|done)\//, "").replace(/\/+$/, "");
      if (req.method === "POST" && url.pathname.startsWith("/done/")) {
        const state = url.searchParams.get("state") ?? "succeeded";
        if (!STATES.includes(state) || !statusAnswer(name, { state })) return answer(400, { error: `give a batches/, models/M/operations/ or interactions/ name and a state in ${STATES.join(", ")}` });
        const op = known(name);
        Object.assign(op, { state, updateTime: now().toISOString() });
        log(`marked ${name} ${state}`);
        return answer(200, { name, state });
      }
      if (req.method === "GET" && url.pathname === "/v1beta/webhooks") return answer(200, { webhooks: [] });
      if (req.method === "GET" && url.pathname.startsWith("/v1beta/")) {
        const body = statusAnswer(name, { state: "running" }) && statusAnswer(name, known(name));
        if (!body) return answer(404, { error: { code: 404, message: `stub: no such resource ${name}`, status: "NOT_FOUND" } });
        log(`GET ${name}: ${operations.get(name).state}`);
        return answer(200, body);
      }
      answer(404, { error: { code: 404, message: "stub: unknown route", status: "NOT_FOUND" } });
    });
  };
  return { handler, operations };
}

const USAGE = "usage: npm run gemini-stub [-- --port 8789]  |  npm run gemini-stub -- done NAME [--state succeeded|failed|cancelled|expired] [--port 8789]";

async function main() {
  const args = process.argv.slice(2);
  if (args.includes("--help") || args.includes("-h")) {
    console.log(USAGE);
    process.exit(0);
  }
  const option = (name, fallback) => {
    const i = args.indexOf(name);
    return i >= 0 ? args.splice(i, 2)[1] : fallback;
  };
  const port = Number(option("--port", 8789));
  const state = option("--state", "succeeded");
  if (args[0] === "done" && args.length === 2) {
    const url = `http://127.0.0.1:${port}/done/${args[1].split("/").map(encodeURIComponent).join("/")}?state=${encodeURIComponent(state)}`;
    try {
      const res = await fetch(url, { method: "POST" });
      console.log(`gemini-stub: ${res.status} ${await res.text()}`);
      process.exit(res.ok ? 0 : 1);
    } catch (e) {
      console.error(`gemini-stub: no stub at 127.0.0.1:${port} (${e.cause?.code ?? e.message}); start one with npm run gemini-stub`);
      process.exit(1);
    }
  }
  if (args.length > 0 || !Number.isInteger(port)) {
    console.error(USAGE);
    process.exit(2);
  }
  const { handler } = geminiStub({ log: (line) => console.log(`gemini-stub: ${line}`) });
  const server = createServer(handler);
  server.on("error", (e) => {
    console.error(`gemini-stub: cannot listen on 127.0.0.1:${port}: ${e.code ?? e.message}`);
    process.exit(1);
  });
  server.listen(port, "127.0.0.1", () => console.log(`gemini-stub: Gemini's status API at http://127.0.0.1:${port} (GEMINI_API_BASE); mark an operation done with: npm run gemini-stub -- done NAME`));
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) main();
