// The checks against the schedule's ground truth: what was sent against what arrived at the
// destination and what the worker reports.
//
// Definitions (docs/RELIABILITY.md, "What the oracle checks"):
// - effects: side-effect requests the destination accepted (it decided 2xx on arrival; a
//   destination commits before it answers, so an accepted request counts even when the worker
//   gave up waiting for the answer).
// - duplicate_effects: accepted requests beyond the first for a key.
// - explained: duplicates in the window no receiver can close: the previous accepted request
//   for the key was not recorded by the worker because the worker was killed (the attempt
//   that sent it never recorded its end, and a kill came between the two requests) or the
//   attempt timed out (the worker closed the connection before the answer, or its attempt
//   ended in a timeout or network failure); never after the gate recorded the commit; and each
//   carries the same idempotency-key and webhook-id as the first. The evidence is the
//   worker's own history: the claims taken before the accepted request arrived, and how their
//   attempts ended (a timeout or network failure; or no end recorded at all, with a kill after).
// - lost: operations (all are terminal at Gemini) with no accepted side effect.
// - regressions: operations whose observed status (admin API, every observation kept) ever
//   moved backward on pending < running, requires_action < terminal, changed from one terminal
//   to another, or vanished (404 after being seen); only pairs where the later request was sent
//   after the earlier answer arrived are compared.
// - unsettled: operations not terminal in the admin API or in the KV ledger at the end.
// - results (batches registered with `"results":"each"`, on the chaos-results line): every
//   line of each such batch's file reached the destination (accepted) under its stable
//   `webhook-id` (`res_` and a hash of the operation key, the result key and the line's index,
//   as src/results/body.rs makes it): none missing, no `res_` id outside the expected set, each
//   with its result key, index and kind (response, error, unreadable); the job's first
//   accepted effect arrived after every result's first acceptance and carries the right
//   counts. A result accepted again under its same id is counted (repeats), as the job's
//   duplicates are: a destination that dedups by `webhook-id` drops it. `kills_mid_file`
//   counts the kills that came while a batch had some of its results accepted and not all.
//   A batch whose registration a kill delayed past its job's first attempt is answered
//   `kind_change: "too_late"` and owes no results (that attempt's body has none): counted as
//   `registered_too_late`, checked against its record (an attempt claimed before the answer).
// - late_jobs (on the chaos-results line): operations whose job effect was first accepted more
//   than LATE_AFTER_MS (5 minutes) after the load phase's end, or never.
// Extra checks (also fail the run, printed on the chaos-detail lines): an accepted side effect
// whose status differs from the truth, a final status different from the truth, effect_done
// false at the end, side effects for unknown keys, side effects failing signature checks, a
// harness delivery refused with 400/401/413.
import { createHash } from "node:crypto";
import { EFFECT_TIMEOUT_MS, LATE_AFTER_MS, TERMINAL, rank } from "./config.mjs";
import { iso } from "./standins.mjs";

/** A result's `webhook-id`, as src/results/body.rs makes it. */
export function resultId(key, resultKey, index) {
  return `res_${createHash("sha256").update(`${key}\u0000${resultKey}\u0000${index}`).digest("hex").slice(0, 32)}`;
}

/** What a results file's lines must become: {id, resultKey, index, kind}, one per non-blank line. */
export function expectedResults(key, lines) {
  const out = [];
  for (const text of lines) {
    if (!text.trim()) continue;
    const index = out.length;
    let parsed = null;
    try { parsed = JSON.parse(text); } catch {}
    const ok = parsed && typeof parsed === "object" && !Array.isArray(parsed);
    const k = ok && parsed.key != null ? (typeof parsed.key === "string" ? parsed.key : JSON.stringify(parsed.key)) : null;
    const resultKey = k ?? `line-${index}`;
    const kind = ok && "response" in parsed ? "response" : ok && "error" in parsed ? "error" : "unreadable";
    out.push({ id: resultId(key, resultKey, index), resultKey, index, kind });
  }
  return out;
}

/** The results batches' check (see the header). */
export function checkResults(ops, requests, kills, tooLate = [], finalViews = new Map()) {
  // A registration answered "too_late" came after the job's first attempt (a kill delayed it
  // past the completion): that attempt's body has no results, so none are owed. The worker's
  // answer is checked against the record: an attempt must have been claimed before it.
  const late = new Map(tooLate);
  const problems = [];
  for (const [key, answeredAt] of late) {
    const claimed = (finalViews.get(key)?.history ?? []).filter((h) => h.what === "claimed").map((h) => Date.parse(h.at));
    if (!claimed.some((at) => at <= answeredAt)) problems.push(`${key}: its registration was answered too_late at ${iso(answeredAt)}, but no attempt of its effect was claimed before`);
  }
  const batches = ops.filter((op) => op.results && !late.has(op.key));
  const r = { batches: batches.length, registered_too_late: ops.filter((op) => op.results && late.has(op.key)).length, expected: 0, delivered: 0, missing: 0, unknown: 0, repeats: 0, job_after_results: 0, counts_right: 0, kills_mid_file: 0 };
  const expectedIds = new Map();
  const spans = [];
  for (const op of batches) {
    const want = expectedResults(op.key, op.results.lines);
    r.expected += want.length;
    for (const w of want) expectedIds.set(w.id, { op, ...w });
  }
  const firstAccepted = new Map();
  for (const q of requests) {
    if (!q.accepted || !q.webhookId?.startsWith("res_")) continue;
    const w = expectedIds.get(q.webhookId);
    if (!w) {
      r.unknown++;
      if (r.unknown <= 5) problems.push(`result accepted under an id outside the expected set: ${q.webhookId} (key ${q.bodyKey}, result_key ${q.resultKey}, index ${q.resultIndex})`);
      continue;
    }
    if (firstAccepted.has(q.webhookId)) { r.repeats++; continue; }
    firstAccepted.set(q.webhookId, q);
    if (q.bodyKey !== w.op.key || q.resultKey !== w.resultKey || q.resultIndex !== w.index || q.resultKind !== w.kind) {
      problems.push(`result ${q.webhookId} of ${w.op.key} carried key ${q.bodyKey}, result_key ${q.resultKey}, index ${q.resultIndex}, ${q.resultKind}; expected ${w.resultKey}, ${w.index}, ${w.kind}`);
    }
  }
  for (const op of batches) {
    const want = expectedResults(op.key, op.results.lines);
    const got = want.map((w) => firstAccepted.get(w.id)).filter(Boolean);
    r.delivered += got.length;
    const missing = want.filter((w) => !firstAccepted.has(w.id));
    r.missing += missing.length;
    if (missing.length) problems.push(`${op.key}: ${missing.length} of ${want.length} results never accepted (first: ${missing.slice(0, 5).map((w) => `${w.resultKey}@${w.index}`).join(", ")})`);
    const job = requests.filter((q) => q.accepted && q.key === op.key && !q.webhookId?.startsWith("res_")).sort((a, b) => a.arrivedAt - b.arrivedAt)[0];
    const last = Math.max(...got.map((q) => q.arrivedAt));
    if (job && !missing.length && job.arrivedAt >= last) r.job_after_results++;
    else problems.push(`${op.key}: the job's effect ${job ? `arrived at ${iso(job.arrivedAt)}, the last result at ${got.length ? iso(last) : "none"}` : "never accepted"}`);
    const errors = want.filter((w) => w.kind !== "response").length;
    const c = job?.bodyResults;
    if (c && c.total === want.length && c.delivered === want.length && c.errors === errors && c.parked === 0 && !c.file_parked) r.counts_right++;
    else problems.push(`${op.key}: the job's results ${JSON.stringify(c ?? null)}, expected total ${want.length}, delivered ${want.length}, errors ${errors}, parked 0, no file_parked`);
    if (got.length) spans.push([Math.min(...got.map((q) => q.arrivedAt)), last]);
  }
  r.kills_mid_file = kills.filter((k) => spans.some(([a, b]) => k.at > a && k.at < b)).length;
  return { ...r, ok: problems.length === 0, problems };
}

/**
 * The operations whose job effect (not a result's) was first accepted more than
 * [`LATE_AFTER_MS`] after the load phase's end, or never; and when the last first acceptance
 * came, in seconds after that end.
 */
export function lateJobs(ops, requests, loadEndAt, lateAfterMs = LATE_AFTER_MS) {
  const first = new Map();
  for (const q of requests) {
    if (!q.accepted || q.webhookId?.startsWith("res_")) continue;
    if (!first.has(q.key) || q.arrivedAt < first.get(q.key)) first.set(q.key, q.arrivedAt);
  }
  const keys = [];
  let last = -Infinity;
  for (const op of ops) {
    const at = first.get(op.key);
    if (at !== undefined) last = Math.max(last, at);
    if (at === undefined || (loadEndAt && at > loadEndAt + lateAfterMs)) keys.push(op.key);
  }
  const lastAfterLoadS = loadEndAt && Number.isFinite(last) ? Math.round((last - loadEndAt) / 100) / 10 : null;
  return { count: keys.length, keys, lastAfterLoadS };
}

export function check({ o, t0, ops, byKey, dest, api, kills, observations, finalViews, finalKv, loadEndAt, tooLate = [] }) {
  const problems = [];
  const checks = { wrong_effect_status: 0, unknown_keys: 0, final_wrong_status: 0, effect_not_done: 0, version_rollbacks: 0, done_rollbacks: 0 };
  const accepted = new Map();
  for (const r of dest.requests) {
    if (!r.accepted) continue;
    // A result's effect is checked by checkResults, under its own id.
    if (r.webhookId?.startsWith("res_")) continue;
    if (!byKey.has(r.key)) {
      checks.unknown_keys++;
      problems.push(`side effect accepted for a key not in the schedule: ${r.key}`);
      continue;
    }
    if (!accepted.has(r.key)) accepted.set(r.key, []);
    accepted.get(r.key).push(r);
  }
  let effects = 0, duplicates = 0, explained = 0, lost = 0, regressions = 0, unsettled = 0;
  const causes = { killed: 0, timeout: 0, unexplained: 0 };
  const duplicateDetails = [];
  const silentDetails = [];
  const settledBy = {};
  const silentLatency = [];
  for (const op of ops) {
    const acc = (accepted.get(op.key) ?? []).sort((a, b) => a.arrivedAt - b.arrivedAt || a.seq - b.seq);
    effects += acc.length;
    const view = finalViews.get(op.key);
    const history = (view?.history ?? []).map((h) => ({ ...h, atMs: Date.parse(h.at) }));
    if (acc.length === 0) {
      lost++;
      problems.push(`lost ${op.key} (${op.cls}, truth ${op.outcome}): no accepted side effect; final ${JSON.stringify(brief(view))}`);
    }
    for (const r of acc) {
      if (r.bodyStatus !== op.outcome || r.bodyKey !== op.key) {
        checks.wrong_effect_status++;
        problems.push(`wrong side effect for ${op.key}: status ${r.bodyStatus} key ${r.bodyKey}, truth ${op.outcome}`);
      }
    }
    if (acc[0]?.settledBy) settledBy[acc[0].settledBy] = (settledBy[acc[0].settledBy] ?? 0) + 1;
    if (op.cls === "silent" && view?.settled_at) {
      const latency = Date.parse(view.settled_at) - (t0 + op.completeAt);
      silentLatency.push(latency);
      silentDetails.push({ key: op.key, latency_ms: Math.round(latency), settled_by: view.settled_by });
    }
    // Duplicates and their explanation.
    const commitAt = Math.min(Infinity, ...history.filter((h) => h.what === "attempt" && h.result === "effect_delivered").map((h) => h.atMs));
    const attempts = new Map(history.filter((h) => h.what === "attempt").map((h) => [h.token, h]));
    for (let j = 1; j < acc.length; j++) {
      duplicates++;
      const d = acc[j], p = acc[j - 1], first = acc[0];
      const sameIds = d.key === first.key && d.webhookId === first.webhookId && d.generation === first.generation;
      const afterCommit = commitAt < d.arrivedAt;
      // The worker's own account: the attempts of the claims taken before p arrived (one of
      // them sent p) that were still running when p arrived. Their rows may be written after
      // d arrived: a CPU-starved worker notices its deadline late, and its claim may have
      // lapsed and been taken over meanwhile.
      const candidates = history.filter((h) => h.what === "claimed" && h.atMs <= p.arrivedAt + 50).map((c) => attempts.get(c.token) ?? { token: c.token, missing: true, claimedAt: c.atMs });
      const live = candidates.filter((a) => a.missing || a.atMs >= p.arrivedAt - 50);
      const timedOut = p.closedEarly || live.some((a) => !a.missing && /^(timeout|network)/.test(a.answer ?? ""));
      const workerAttempt = live.at(-1);
      // Killed: a claim that may have sent p (taken before p arrived, and not already ended by
      // an earlier kill) never recorded how its attempt ended, and the worker was killed after
      // p arrived and before d: the destination accepted, the worker died before the commit.
      const killedInFlight = live.some((a) => a.missing && !kills.some((k) => k.at > a.claimedAt && k.at < p.arrivedAt - 5));
      const killed = killedInFlight && kills.some((k) => k.at >= p.arrivedAt - 5 && k.at <= d.arrivedAt);
      duplicateDetails.push({ key: op.key, cause: sameIds && !afterCommit && (killed || timedOut) ? (killed ? "killed" : "timeout") : "unexplained", prev_dest_delay_ms: p.delayMs, prev_closed_early: p.closedEarly, worker_attempt: workerAttempt ? { token: workerAttempt.token, missing: !!workerAttempt.missing, answer: workerAttempt.answer, ms: workerAttempt.ms, result: workerAttempt.result } : null, gap_ms: d.arrivedAt - p.arrivedAt });
      if (sameIds && !afterCommit && (killed || timedOut)) {
        explained++;
        causes[killed ? "killed" : "timeout"]++;
        // Which side was slow: the destination (answer later than the timeout) or the worker
        // (the answer left in time, the worker's deadline fired first under CPU load).
        if (!killed) causes[p.delayMs >= EFFECT_TIMEOUT_MS ? "timeout_destination_slow" : "timeout_worker_late"] = (causes[p.delayMs >= EFFECT_TIMEOUT_MS ? "timeout_destination_slow" : "timeout_worker_late"] ?? 0) + 1;
      } else {
        causes.unexplained++;
        problems.push(`unexplained duplicate side effect for ${op.key}: previous accepted at ${iso(p.arrivedAt)} (answered ${p.finishedAt ? iso(p.finishedAt) : "never"}, closed early ${p.closedEarly}, delay ${p.delayMs} ms), duplicate at ${iso(d.arrivedAt)}; same ids ${sameIds}; commit recorded ${Number.isFinite(commitAt) ? iso(commitAt) : "never"}; kills ${kills.map((k) => iso(k.at)).join(",")}; history ${JSON.stringify(view?.history ?? []).slice(0, 1500)}`);
      }
    }
    // Final state: admin API and KV ledger.
    const meta = finalKv.get(op.key);
    if (!view || !TERMINAL.has(view.status) || !meta || !TERMINAL.has(meta.status)) {
      unsettled++;
      problems.push(`unsettled ${op.key} (${op.cls}, truth ${op.outcome}): admin ${JSON.stringify(brief(view))}, ledger ${JSON.stringify(meta ?? null)}`);
    }
    if (view && TERMINAL.has(view.status) && view.status !== op.outcome) {
      checks.final_wrong_status++;
      problems.push(`final status of ${op.key} is ${view.status}, truth ${op.outcome}`);
    }
    if (view && TERMINAL.has(view.status) && !view.effect_done) {
      checks.effect_not_done++;
      problems.push(`effect not done at the end for ${op.key}: ${JSON.stringify(brief(view))}`);
    }
    // Regressions over every observation.
    const obs = observations.get(op.key).slice().sort((a, b) => a.sent - b.sent);
    let regressed = false, rolledBack = false, undone = false;
    for (let b = 0; b < obs.length; b++) {
      for (let a = 0; a < b; a++) {
        const A = obs[a], B = obs[b];
        if (A.recv >= B.sent) continue; // overlapping requests: order unknown
        const backward = rank(B.status) < rank(A.status) || (TERMINAL.has(A.status) && TERMINAL.has(B.status) && A.status !== B.status);
        if (backward && !regressed) {
          regressed = true;
          problems.push(`regression ${op.key}: observed ${A.status} (v${A.version}) then ${B.status} (v${B.version}); observations ${obs.map((x) => x.status + "@v" + x.version).join(" ").slice(0, 600)}`);
        }
        if (B.version < A.version && B.status !== "absent" && !rolledBack) {
          rolledBack = true;
          problems.push(`version rollback ${op.key}: v${A.version} then v${B.version}`);
        }
        if (A.done && !B.done && B.status !== "absent" && !undone) {
          undone = true;
          problems.push(`effect_done went back to false for ${op.key}`);
        }
      }
    }
    if (regressed) regressions++;
    if (rolledBack) checks.version_rollbacks++;
    if (undone) checks.done_rollbacks++;
  }
  const faults = {
    status_429: api.stats.status_429,
    status_500: api.stats.status_500,
    status_stale: api.stats.status_stale,
    dest_5xx: dest.stats.dest_5xx,
    dest_outage: dest.stats.dest_outage,
    dest_slow: dest.stats.dest_slow,
    dest_over_timeout: dest.stats.dest_over_timeout,
    file_not_yet: api.stats.file_not_yet ?? 0,
    file_503: api.stats.file_503 ?? 0,
    file_cut: api.stats.file_cut ?? 0,
    kills: kills.length,
  };
  const faultTotal = Object.values(faults).reduce((a, b) => a + b, 0);
  const deliveries = ops.reduce((n, op) => n + op.deliveries.length + (op.conflict ? 1 : 0), 0);
  const line = `chaos: seed=${o.seed} ops=${ops.length} deliveries=${deliveries} faults=${faultTotal} effects=${effects} duplicate_effects=${duplicates} explained=${explained} lost=${lost} regressions=${regressions} unsettled=${unsettled}`;
  const extraBad = checks.wrong_effect_status + checks.unknown_keys + checks.final_wrong_status + checks.effect_not_done + checks.version_rollbacks + checks.done_rollbacks + dest.stats.bad_signature;
  if (kills.length < o.kills) problems.push(`only ${kills.length} of ${o.kills} kills happened`);
  const results = checkResults(ops, dest.requests, kills, tooLate, finalViews);
  problems.push(...results.problems);
  const lateAfterMs = o.lateAfterMs ?? LATE_AFTER_MS;
  const late = lateJobs(ops, dest.requests, loadEndAt, lateAfterMs);
  if (late.count) problems.push(`${late.count} job effects not accepted within ${lateAfterMs / 1000} s of the load's end: ${late.keys.slice(0, 10).join(", ")}`);
  const ok = lost === 0 && regressions === 0 && unsettled === 0 && duplicates === explained && extraBad === 0 && kills.length >= o.kills && results.ok && late.count === 0;
  const stats = {
    schedule: {
      ops: ops.length,
      batches: ops.filter((op) => op.family === "batch").length,
      results_batches: ops.filter((op) => op.results).length,
      interactions: ops.filter((op) => op.family === "interaction").length,
      videos: ops.filter((op) => op.family === "video").length,
      silent: ops.filter((op) => op.cls === "silent").length,
      early: ops.filter((op) => op.cls === "early").length,
      late_registered: ops.filter((op) => op.cls === "early" && op.lateRegister).length,
      never_registered: ops.filter((op) => op.cls === "early" && !op.lateRegister).length,
      outcomes: ops.reduce((m, op) => ((m[op.outcome] = (m[op.outcome] ?? 0) + 1), m), {}),
      same_id_repeats: ops.reduce((n, op) => n + op.deliveries.filter((d) => d.reuse).length, 0),
      fresh_id_duplicates: ops.reduce((n, op) => n + Math.max(0, op.deliveries.filter((d) => d.terminal && !d.reuse).length - 1), 0),
      concurrent: ops.reduce((n, op) => n + op.deliveries.filter((d) => d.concurrent).length, 0),
      conflicting: ops.filter((op) => op.conflict).length,
      requires_action: ops.reduce((n, op) => n + op.deliveries.filter((d) => !d.terminal).length, 0),
    },
    effect_keys: accepted.size,
    settled_by: settledBy,
  };
  return { line, ok, causes, faults, checks, problems, stats, silentLatency, duplicateDetails, silentDetails, results, late };
}

function brief(view) {
  if (!view) return null;
  const { status, version, effect_done, effect_parked, attempts, settled_by, last_error } = view;
  return { status, version, effect_done, effect_parked, attempts, settled_by, last_error };
}
