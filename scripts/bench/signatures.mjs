#!/usr/bin/env node
// A short run (about a minute): workerd's CPU per first delivery of a completion, by how the
// delivery is signed, against the built worker in Miniflare with local stand-ins for the
// destination, Gemini's key set and its status API. A command, not a test: it asserts nothing.
//
//   node scripts/bench/signatures.mjs [--ops 60] [--rounds 3] [--conc 4]
//
// Each cell sends `--ops` new completions (a new operation each) `--conc` at a time, waits until
// workerd is idle (the side effects sent, the confirmations asked), and divides workerd's CPU
// (all threads, from /proc) by the completions: the whole cost of a completion, deferred work
// included. Cells: `v1` (HMAC, unregistered: applied as it says), `v1 registered`, `v1a
// registered` (a nudge: the gate asks the status API from its alarm, in a slot of the budget),
// `v1a unregistered` (the status API asked in the request, the record created from its
// answer). Medians over rounds, cells interleaved within a round.
import { generateKeyPairSync, sign as cryptoSign } from "node:crypto";
import { startWorker, startServer, startDestination, signedHeaders, workerdChildren, eventually } from "../../tests/helpers.mjs";
import { statusAnswer } from "../gemini_stub.mjs";
import { cpuMeter, median, quiesce } from "./measure.mjs";

const arg = (name, fallback) => {
  const i = process.argv.indexOf(name);
  return i > 0 ? Number(process.argv[i + 1]) : fallback;
};
const OPS = arg("--ops", 60);
const ROUNDS = arg("--rounds", 3);
const CONC = arg("--conc", 4);

const pair = generateKeyPairSync("ed25519");
const jwks = await startServer(() => ({ status: 200, body: { keys: [{ ...pair.publicKey.export({ format: "jwk" }), kid: "bench", alg: "EdDSA", use: "sig" }] } }));
const dest = await startDestination(() => ({ status: 200 }));
const gemini = await startServer((req) => {
  const name = req.url.replace(/^\/v1beta\//, "");
  const t = new Date().toISOString();
  return { status: 200, body: statusAnswer(name, { state: "succeeded", createTime: t, updateTime: t }) };
});
const w = await startWorker({
  EFFECT_URL: `${dest.url}/effects`,
  GEMINI_JWKS_URL: `${jwks.url}/.well-known/jwks.json`,
  GEMINI_API_BASE: gemini.url,
  GEMINI_API_KEY: "bench-api-key",
  RECONCILE_POLL_RATE: "1000",
});
const [pid] = workerdChildren();

const now = () => Math.floor(Date.now() / 1000);
const envelope = (name) => JSON.stringify({ type: "batch.succeeded", version: "v1", timestamp: new Date().toISOString(), data: { id: name, output_file_uri: "gs://bench/out.jsonl" } });
function v1aHeaders(body, id) {
  const ts = now();
  const sig = cryptoSign(null, Buffer.from(`${id}.${ts}.${body}`), pair.privateKey).toString("base64");
  return { "content-type": "application/json", "webhook-id": id, "webhook-timestamp": String(ts), "webhook-signature": `v1a,${sig}` };
}
let seq = 0;
const cells = {
  "v1": { register: false, headers: (body, id) => signedHeaders(body, { webhookId: id }) },
  "v1 registered": { register: true, headers: (body, id) => signedHeaders(body, { webhookId: id }) },
  "v1a registered": { register: true, headers: v1aHeaders },
  "v1a unregistered": { register: false, headers: v1aHeaders },
};

async function run(label, cell) {
  const names = Array.from({ length: OPS }, () => `batches/bench-${++seq}`);
  if (cell.register) for (const name of names) await w.register(name);
  await quiesce(pid, 10_000, 300);
  const effectsBefore = dest.requests.length;
  const meter = cpuMeter(pid);
  let next = 0;
  const statuses = new Map();
  await Promise.all(Array.from({ length: CONC }, async () => {
    while (next < names.length) {
      const name = names[next++];
      const body = envelope(name);
      const r = await w.json("/webhooks/gemini", { method: "POST", headers: cell.headers(body, `msg_${name.replace("/", "_")}`), body });
      statuses.set(r.status, (statuses.get(r.status) ?? 0) + 1);
    }
  }));
  await eventually(() => dest.requests.length - effectsBefore >= OPS, { what: `${label}: every effect`, timeoutMs: 120_000 });
  await quiesce(pid, 10_000, 300);
  const cpu = meter(OPS);
  return { cpu: cpu.workerd_all_ms_per_req, statuses: Object.fromEntries(statuses) };
}

const results = Object.fromEntries(Object.keys(cells).map((k) => [k, []]));
// A warm-up round, not counted: the key set fetched, the isolate's caches filled.
for (const [label, cell] of Object.entries(cells)) await run(label, { ...cell });
for (let round = 0; round < ROUNDS; round += 1) {
  for (const [label, cell] of Object.entries(cells)) {
    const r = await run(label, cell);
    results[label].push(r.cpu);
    console.error(`round ${round + 1} ${label}: ${r.cpu} ms CPU per completion ${JSON.stringify(r.statuses)}`);
  }
}
const base = median(results.v1);
console.log(`workerd CPU per completion (all threads, until idle), median of ${ROUNDS} rounds of ${OPS} at ${CONC} at once:`);
for (const [label, xs] of Object.entries(results)) {
  const m = median(xs);
  console.log(`  ${label.padEnd(18)} ${m.toFixed(2)} ms  (${(m / base).toFixed(2)}x v1; rounds ${xs.map((x) => x.toFixed(2)).join(", ")})`);
}
await w.dispose();
for (const s of [jwks, dest, gemini]) await s.close();
