// The schedule: seeded randomness (splitmix32 seeding an sfc32 generator) and the randomized
// schedule of operations, deliveries, faults, cron passes and kills, a pure function of
// (seed, ops, kills). Times are ms after the run's t0.

export function makeRng(seed) {
  let s = seed >>> 0;
  const mix = () => {
    s = (s + 0x9e3779b9) >>> 0;
    let z = s;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
    return (z ^ (z >>> 16)) >>> 0;
  };
  let a = mix(), b = mix(), c = mix(), d = mix();
  const u32 = () => {
    const t = (((a + b) | 0) + d) | 0;
    d = (d + 1) | 0;
    a = b ^ (b >>> 9);
    b = (c + (c << 3)) | 0;
    c = (c << 21) | (c >>> 11);
    c = (c + t) | 0;
    return t >>> 0;
  };
  for (let i = 0; i < 12; i++) u32();
  const float = () => u32() / 4294967296;
  const rng = {
    float,
    u32,
    int: (lo, hi) => lo + Math.floor(float() * (hi - lo + 1)),
    uniform: (lo, hi) => lo + float() * (hi - lo),
    chance: (p) => float() < p,
    pick: (arr) => arr[Math.floor(float() * arr.length)],
    weighted(pairs) {
      const total = pairs.reduce((n, [, w]) => n + w, 0);
      let x = float() * total;
      for (const [v, w] of pairs) if ((x -= w) < 0) return v;
      return pairs[pairs.length - 1][0];
    },
    shuffle(arr) {
      for (let i = arr.length - 1; i > 0; i--) {
        const j = Math.floor(float() * (i + 1));
        [arr[i], arr[j]] = [arr[j], arr[i]];
      }
      return arr;
    },
    fork: (salt) => makeRng((u32() ^ Math.imul(salt, 0x27d4eb2d)) >>> 0),
  };
  return rng;
}

// ---------------------------------------------------------------------------------------------
// The schedule: a pure function of (seed, ops, kills). Times are ms after the run's t0.

const BATCH_OUTCOMES = [["succeeded", 0.55], ["failed", 0.2], ["cancelled", 0.12], ["expired", 0.13]];
const INTERACTION_OUTCOMES = [["succeeded", 0.6], ["failed", 0.25], ["cancelled", 0.15]];
const VIDEO_OUTCOMES = [["succeeded", 0.6], ["failed", 0.25], ["cancelled", 0.15]];

function eventTypeFor(family, outcome, rng) {
  if (family === "batch") return outcome === "succeeded" ? (rng.chance(0.15) ? "batch.completed" : "batch.succeeded") : `batch.${outcome}`;
  if (family === "interaction") return outcome === "succeeded" ? "interaction.completed" : `interaction.${outcome}`;
  return "video.generated";
}

function detailsFor(op, type) {
  if (type === "batch.succeeded" || type === "batch.completed") return { output_file_uri: `gs://chaos-out/${op.id}.jsonl` };
  if (type === "video.generated") return { output_file_uri: `gs://chaos-out/${op.id}.mp4`, file_name: `files/${op.id}` };
  if (type.endsWith(".failed")) return { error_code: op.i % 2 ? 13 : "INTERNAL", error_message: "chaos: planned failure" };
  return {};
}

export function loadMsFor(ops) {
  return Math.min(90_000, Math.max(15_000, ops * 110));
}

/**
 * The lines of a results batch's file (JSONL): `lines` requests with keys `r-<i>`, most with a
 * response, some with an error; one without a key, one repeating the key before it, and one
 * that is not JSON (a result that says it is unreadable).
 */
export function resultLines(id, lines) {
  const out = [];
  for (let i = 0; i < lines; i++) {
    const response = { candidates: [{ content: { parts: [{ text: `chaos result ${i} of ${id}` }], role: "model" }, finishReason: "STOP" }] };
    if (i === 11) out.push(JSON.stringify({ response }));
    else if (i === 23) out.push(JSON.stringify({ key: `r-${i - 1}`, response }));
    else if (i === 31) out.push(`{"key":"r-${i}","response":{"candidates":[`);
    else if (i % 50 === 7) out.push(JSON.stringify({ key: `r-${i}`, error: { code: 3, message: `chaos: request ${i} refused`, status: "INVALID_ARGUMENT" } }));
    else out.push(JSON.stringify({ key: `r-${i}`, response }));
  }
  return out;
}

/**
 * `count` batches registered with `"results":"each"`, each succeeding with a file of a few
 * hundred lines; the first ones complete a few seconds before a kill, so the kill comes while
 * their file is read. From their own generator: the rest of a seed's schedule stays as it was.
 */
function resultsBatches(seed, count, killAt, loadMs) {
  const rng = makeRng(seed ^ 0x7e5017);
  const ops = [];
  for (let j = 0; j < count; j++) {
    const id = `c${seed}r${j}`;
    const key = `batches/${id}`;
    const lines = rng.int(200, 400);
    const completeAt = j < killAt.length ? Math.max(8_000, killAt[j] - rng.uniform(1_000, 2_000)) : rng.uniform(0.2, 0.7) * loadMs;
    const registerAt = Math.max(0, completeAt - rng.uniform(3_000, 6_000));
    const op = {
      i: -1 - j, id, family: "batch", cls: "results", key, name: key, statusPath: `/v1beta/${key}`, outcome: "succeeded",
      // A batch read across a kill answers each download after `slowMs`, so its file takes
      // seconds to read and the kill comes while it is.
      results: { file: `files/${id}-out`, lines: resultLines(id, lines), slowMs: j < killAt.length ? 600 : 0 },
      registerAt, createdAt: registerAt, runningAt: (registerAt + completeAt) / 2, completeAt, deliveries: [], conflict: null, messages: {},
    };
    // The last one is silent (the cron finds it); the others come by webhook, some twice.
    if (j < count - 1 || count === 1) {
      const webhookId = `msg_${id}_${rng.u32().toString(16)}`;
      const type = "batch.succeeded";
      op.messages[webhookId] = { type, secret: 0, eventAt: completeAt + rng.uniform(0, 50), body: JSON.stringify({ type, version: "v1", timestamp: null, data: { id: key, output_file_uri: op.results.file } }) };
      const times = rng.int(1, 3);
      for (let k = 0; k < times; k++) op.deliveries.push({ webhookId, at: completeAt + rng.uniform(0, 500) + k * rng.uniform(0, 3_000), concurrent: false, reuse: k > 0, terminal: true });
    }
    ops.push(op);
  }
  return ops;
}

/**
 * Registers a `share` (0 to 1) of the succeeded batches among the operations registered before
 * they complete with `"results":"each"`, each with a file of 50 to 150 lines, the webhook's
 * `output_file_uri` naming it (a silent one is found by the cron, its status answer naming it).
 * From its own generator, and after the rest is drawn: the seed's schedule is otherwise what it
 * was. A batch delivered before it is registered keeps plain (its registration comes after the
 * completion).
 */
function shareResults(seed, ops, share) {
  if (!(share > 0)) return;
  const rng = makeRng(seed ^ 0x5ea7e5);
  for (const op of ops) {
    if (op.family !== "batch" || op.outcome !== "succeeded" || op.registerAt === null) continue;
    if (!rng.chance(share)) continue;
    op.results = { file: `files/${op.id}-out`, lines: resultLines(op.id, rng.int(50, 150)), slowMs: 0 };
    for (const m of Object.values(op.messages ?? {})) {
      m.body = m.body.replace(`"gs://chaos-out/${op.id}.jsonl"`, JSON.stringify(op.results.file));
    }
  }
}

export function buildSchedule(seed, n, kills, results = kills + 1, share = 0) {
  const rng = makeRng(seed);
  const loadMs = loadMsFor(n);
  const classes = [];
  const silent = Math.round(n * 0.2);
  const early = Math.round(n * 0.1);
  for (let i = 0; i < n; i++) classes.push(i < silent ? "silent" : i < silent + early ? "early" : "normal");
  rng.shuffle(classes);
  const ops = [];
  for (let i = 0; i < n; i++) {
    const cls = classes[i];
    const family = rng.weighted([["batch", 0.7], ["interaction", 0.15], ["video", 0.15]]);
    const id = `c${seed}x${String(i).padStart(4, "0")}`;
    let key, name, statusPath, forms;
    if (family === "batch") {
      key = `batches/${id}`;
      name = rng.chance(0.2) ? `projects/chaos/locations/us-central1/batches/${id}` : key;
      statusPath = `/v1beta/${key}`;
      forms = [[key, 0.5], [id, 0.3], [`projects/chaos/locations/us-central1/batches/${id}`, 0.2]];
    } else if (family === "interaction") {
      key = `interactions/${id}`;
      name = key;
      statusPath = `/v1beta/${key}`;
      forms = [[key, 0.6], [id, 0.4]];
    } else {
      key = `operations/${id}`;
      name = `models/veo-3/operations/${id}`;
      statusPath = `/v1beta/${name}`;
      forms = [[name, 1]];
    }
    // A video's webhook only says "generated": a failed or cancelled video is only seen
    // through the status API, so only silent videos end that way.
    const outcomes = family === "batch" ? BATCH_OUTCOMES : family === "interaction" ? INTERACTION_OUTCOMES : VIDEO_OUTCOMES;
    const outcome = family === "video" && cls !== "silent" ? "succeeded" : rng.weighted(outcomes);
    const op = { i, id, family, cls, key, name, statusPath, outcome, deliveries: [], conflict: null };
    if (cls === "early") {
      op.registerAt = null;
      op.completeAt = rng.uniform(0.05, 0.85) * loadMs;
      op.runningAt = op.completeAt - rng.uniform(1000, 4000);
      op.createdAt = op.runningAt - rng.uniform(500, 3000);
      op.lateRegister = rng.chance(0.5);
      op.lateRegisterDelay = rng.uniform(0, 3000);
    } else {
      op.registerAt = rng.uniform(0, 0.75) * loadMs;
      op.createdAt = op.registerAt - rng.uniform(0, 500);
      op.completeAt = op.registerAt + rng.uniform(500, 8000);
      op.runningAt = op.registerAt + (op.completeAt - op.registerAt) * rng.uniform(0.2, 0.6);
    }
    if (cls !== "silent") {
      const count = rng.int(1, 6);
      const ids = [];
      for (let j = 0; j < count; j++) {
        const reuse = j > 0 && rng.chance(0.45);
        let webhookId;
        if (reuse) webhookId = rng.pick(ids);
        else {
          webhookId = `msg_${id}_${j}_${rng.u32().toString(16)}`;
          ids.push(webhookId);
        }
        const concurrent = j > 0 && rng.chance(0.3);
        const at = concurrent ? op.deliveries[j - 1].at : op.completeAt + rng.uniform(0, 6000);
        op.deliveries.push({ webhookId, at, concurrent, reuse, terminal: true });
      }
      // One body per webhook-id: a retry of a delivery is byte for byte the same message.
      op.messages = {};
      for (const webhookId of ids) {
        const type = eventTypeFor(family, outcome, rng);
        const form = rng.weighted(forms);
        op.messages[webhookId] = {
          type,
          secret: rng.chance(0.1) ? 1 : 0,
          body: JSON.stringify({ type, version: "v1", timestamp: null, data: { id: form, ...detailsFor(op, type) } }),
        };
      }
      if (family === "interaction" && rng.chance(0.35)) {
        const webhookId = `msg_${id}_ra_${rng.u32().toString(16)}`;
        const type = "interaction.requires_action";
        op.messages[webhookId] = { type, secret: 0, body: JSON.stringify({ type, version: "v1", timestamp: null, data: { id: rng.weighted(forms) } }), eventAt: (op.runningAt + op.completeAt) / 2 };
        op.deliveries.push({ webhookId, at: rng.uniform(op.runningAt, op.completeAt + 6000), concurrent: false, reuse: false, terminal: false });
      }
      if (family === "batch" && rng.chance(0.06)) {
        const other = rng.pick(["succeeded", "failed", "cancelled", "expired"].filter((o) => o !== outcome));
        const webhookId = `msg_${id}_conflict_${rng.u32().toString(16)}`;
        const type = eventTypeFor(family, other, rng);
        op.messages[webhookId] = { type, secret: 0, body: JSON.stringify({ type, version: "v1", timestamp: null, data: { id: key, ...detailsFor(op, type) } }) };
        op.conflict = { webhookId, delay: rng.uniform(200, 3000), status: other };
      }
      // Envelope timestamps: when Gemini produced the event.
      for (const m of Object.values(op.messages)) m.eventAt ??= op.completeAt + rng.uniform(0, 50);
    }
    ops.push(op);
  }
  const killAt = [];
  for (let k = 1; k <= kills; k++) killAt.push((loadMs * k) / (kills + 1) * rng.uniform(0.92, 1.08));
  // One destination outage (every effect answered 5xx) in the load phase, from its own
  // generator so the rest of a seed's schedule is what it was before outages existed.
  const o = makeRng(seed ^ 0x07a9e);
  const outage = { at: loadMs * o.uniform(0.25, 0.55), ms: o.uniform(8_000, 15_000) };
  shareResults(seed, ops, share);
  ops.push(...resultsBatches(seed, results, killAt, loadMs));
  return { seed, loadMs, ops, killAt, outage };
}
