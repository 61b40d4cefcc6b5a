#!/usr/bin/env node
// A local stand-in for Gemini's status API, for trying reconciliation without Gemini: every
// operation it is asked about is running until you mark it done.
//
//   npm run gemini-stub [-- --port 8789]                    serve
//   npm run gemini-stub -- done NAME [--state S] [--inline] [--lines N] [--file-after SECONDS] [--port 8789]
//                                                           mark NAME done in a running stub
//
// It serves, in the shapes the worker's status reader (src/reconciliation/status.rs) takes from Gemini:
//   GET /v1beta/batches/{id}                      an Operation with metadata.state BATCH_STATE_*
//   GET /v1beta/models/{model}/operations/{id}    a long-running Operation (done, response/error)
//   GET /v1beta/interactions/{id}                 an Interaction with status and updated
//   GET /v1beta/webhooks                          no webhooks
//   GET /.well-known/jwks.json                    its key set: an Ed25519 key (`v1a,` signatures,
//                                                 as live dynamic webhooks are signed) and an
//                                                 RS256 key (tokens), whose private halves
//                                                 `npm run send -- --scheme v1a|jwt` signs with
//                                                 (scripts/gemini_keys.mjs)
//   GET /download/v1beta/files/{x}:download       a succeeded batch's results file (JSONL),
//                                                 honouring `Range: bytes=N-` with 206
// and `POST /done/{name}[?state=...&results=file|inline&lines=N&file_after=S]` marks an
// operation done (the `done` command sends that). NAME is the operation's name as registered:
// `batches/x`, `models/veo-3/operations/y`, `interactions/z`.
//
// A succeeded batch has results (a batch registered with `"results":"each"` gets one side
// effect per result): by default the status answer names `response.responsesFile`
// (`files/<id>-results`) and the stub serves the demo file there (four requests with keys, one
// of them an error; `--lines N` serves N generated lines instead); `--inline` puts the demo's
// results in the status answer (`response.inlinedResponses.inlinedResponses`, with
// `metadata.key`), in another order on every read, as Gemini does not promise one;
// `--file-after S` answers the file 404 for S seconds after `done`, as Gemini can right after
// SUCCEEDED.
import { createServer } from "node:http";
import { fileURLToPath } from "node:url";
import path from "node:path";
import { demoResults, generatedFile, memoryFile, serveFile } from "./results_file.mjs";
import { keySet, localKeys } from "./gemini_keys.mjs";

const STATES = ["succeeded", "failed", "cancelled", "expired"];

/**
 * Gemini's answer for `name` (the path after /v1beta/) in `op` ({state, createTime, updateTime,
 * inline}): a succeeded batch names its results file, or carries `inline` (an array of items)
 * as its inline responses.
 */
export function statusAnswer(name, op) {
  const { state, createTime, updateTime, inline } = op;
  const done = state !== "running";
  const failure = { failed: { code: 13, message: "stub: marked failed" }, cancelled: { code: 1, message: "stub: marked cancelled" }, expired: { code: 4, message: "stub: marked expired" } }[state];
  if (name.startsWith("batches/")) {
    const metadata = { "@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch", name, state: `BATCH_STATE_${state.toUpperCase()}`, createTime, updateTime };
    if (state === "succeeded") metadata.output = inline ? { inlinedResponses: { inlinedResponses: inline } } : { responsesFile: resultsFileName(name) };
    if (done) metadata.endTime = updateTime;
    return { name, metadata, done, ...(state === "succeeded" ? { response: { "@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatchOutput", ...metadata.output } } : {}), ...(failure && state !== "expired" ? { error: failure } : {}) };
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

/** The results file's name for the batch `name` (`batches/x` -> `files/x-results`). */
export const resultsFileName = (name) => `files/${name.split("/")[1]}-results`;

/** The demo's results as inline items (`metadata.key`, then `response` or `error`), turned by `turn` places. */
export function inlineItems(turn = 0) {
  const items = demoResults().map(({ key, ...rest }) => ({ metadata: { key }, ...rest }));
  const k = turn % items.length;
  return [...items.slice(k), ...items.slice(0, k)];
}

/** The results a succeeded batch `op` serves: inline items, or a file (with `lines`, generated). */
function attachResults(op, name, files, { results, lines, fileAfterS }, nowMs) {
  delete op.inlineReads;
  files.delete(resultsFileName(name));
  if (!name.startsWith("batches/") || op.state !== "succeeded") return;
  if (results === "inline") {
    op.inlineReads = 0;
    return;
  }
  files.set(resultsFileName(name), {
    file: lines ? generatedFile({ lines, lineBytes: 512, prefix: "req-", errorEvery: 10 }) : memoryFile(demoResults()),
    from: nowMs + 1000 * (fileAfterS ?? 0),
  });
}

/**
 * The stub's request handler. Operations live in memory; `log` gets one line per request.
 * Returns {handler, operations, files} (operations: Map name -> {state, createTime, updateTime};
 * files: Map `files/...` -> {file, from}: a results file, served from `from` ms). `keys` gives
 * the key set's private keys (scripts/gemini_keys.mjs); by default the local ones, read when
 * the key set is first asked for.
 */
export function geminiStub({ log = console.log, now = () => new Date(), keys } = {}) {
  const operations = new Map();
  const files = new Map();
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
        const results = url.searchParams.get("results") ?? "file";
        const lines = Number(url.searchParams.get("lines") ?? 0);
        const fileAfterS = Number(url.searchParams.get("file_after") ?? 0);
        if (!["file", "inline"].includes(results) || !Number.isInteger(lines) || lines < 0 || !(fileAfterS >= 0)) return answer(400, { error: "results is file or inline, lines a whole number, file_after seconds" });
        const op = known(name);
        Object.assign(op, { state, updateTime: now().toISOString() });
        attachResults(op, name, files, { results, lines, fileAfterS }, now().getTime());
        log(`marked ${name} ${state}`);
        return answer(200, { name, state });
      }
      const download = /^\/download\/v1beta\/(files\/[^/:]+):download$/.exec(decodeURIComponent(url.pathname));
      if (req.method === "GET" && download) {
        const held = files.get(download[1]);
        if (!held || now().getTime() < held.from) {
          log(`GET ${download[1]}: not found`);
          return answer(404, { error: { code: 404, message: `stub: no file ${download[1]}`, status: "NOT_FOUND" } });
        }
        log(`GET ${download[1]}: ${held.file.lines} lines${req.headers.range ? ` (${req.headers.range})` : ""}`);
        return serveFile(req, res, held.file);
      }
      if (req.method === "GET" && url.pathname === "/v1beta/webhooks") return answer(200, { webhooks: [] });
      if (req.method === "GET" && url.pathname === "/.well-known/jwks.json") {
        keys ??= localKeys();
        log("GET key set");
        return answer(200, keySet(keys));
      }
      if (req.method === "GET" && url.pathname.startsWith("/v1beta/")) {
        const op = statusAnswer(name, { state: "running" }) && known(name);
        const body = op && statusAnswer(name, { ...op, inline: op.inlineReads === undefined ? undefined : inlineItems(op.inlineReads++) });
        if (!body) return answer(404, { error: { code: 404, message: `stub: no such resource ${name}`, status: "NOT_FOUND" } });
        log(`GET ${name}: ${operations.get(name).state}`);
        return answer(200, body);
      }
      answer(404, { error: { code: 404, message: "stub: unknown route", status: "NOT_FOUND" } });
    });
  };
  return { handler, operations, files };
}

const USAGE = "usage: npm run gemini-stub [-- --port 8789]  |  npm run gemini-stub -- done NAME [--state succeeded|failed|cancelled|expired] [--inline] [--lines N] [--file-after SECONDS] [--port 8789]";

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
  const lines = option("--lines", "0");
  const fileAfter = option("--file-after", "0");
  const inline = args.includes("--inline") ? (args.splice(args.indexOf("--inline"), 1), true) : false;
  if (args[0] === "done" && args.length === 2) {
    const query = new URLSearchParams({ state, results: inline ? "inline" : "file", lines, file_after: fileAfter });
    const url = `http://127.0.0.1:${port}/done/${args[1].split("/").map(encodeURIComponent).join("/")}?${query}`;
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
