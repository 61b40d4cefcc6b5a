// Cloudflare's published Workers Paid rates (USD), as read on the pages cited, and the monthly
// bill of a given volume from per-completion counts the cost section measured. Rates change:
// re-read the pages before trusting a total, and update the dates here and in
// docs/PERFORMANCE.md together.
export const RATES = {
  source: {
    workers: "https://developers.cloudflare.com/workers/platform/pricing/ (last updated 2026-07-07)",
    durable_objects: "https://developers.cloudflare.com/durable-objects/platform/pricing/ (last updated 2026-06-19)",
    kv: "https://developers.cloudflare.com/kv/platform/pricing/ (last updated 2026-04-21)",
  },
  base_per_month: 5,
  worker_requests: { included: 10e6, per_million: 0.3 },
  worker_cpu_ms: { included: 30e6, per_million: 0.02 },
  do_requests: { included: 1e6, per_million: 0.15 },
  // Wall-clock while active, billed at 128 MB whatever is used.
  do_gb_s: { included: 400_000, per_million: 12.5 },
  do_rows_read: { included: 25e9, per_million: 0.001 },
  do_rows_written: { included: 50e6, per_million: 1.0 },
  do_storage_gb_month: { included: 5, per_gb: 0.2 },
  kv_reads: { included: 10e6, per_million: 0.5 },
  kv_writes: { included: 1e6, per_million: 5 },
  kv_lists: { included: 1e6, per_million: 5 },
  kv_storage_gb_month: { included: 1, per_gb: 0.5 },
};

/** Cron passes a month at `*\/5 * * * *`. */
export const CRON_PASSES_PER_MONTH = 12 * 24 * 30;

const over = (used, { included, per_million }) => Math.max(0, used - included) / 1e6 * per_million;
const overGb = (gb, { included, per_gb }) => Math.max(0, gb - included) * per_gb;

/**
 * What the hosted webhook gateways a user would compare with list per million events (USD),
 * as published on their pricing pages; re-read them before quoting.
 */
export const HOSTED = {
  source: {
    hookdeck: "https://hookdeck.com/pricing",
    svix: "https://www.svix.com/pricing/",
  },
  hookdeck: 10,
  hookdeck_at_volume: 3.3,
  svix: 100,
};

/**
 * The monthly bill of `completions` completions, each using `perOp` (units per completion:
 * worker_requests, worker_cpu_ms, do_requests, do_wall_ms, rows_read, rows_written, kv_reads,
 * kv_writes, kv_lists), plus `fixed` units a month (the cron's passes), and the storage held
 * (`stored`: bytes in DO storage and in KV per completion of a month, for the month billed).
 */
export function monthlyBill(completions, perOp, fixed, stored) {
  const use = (k) => completions * (perOp[k] ?? 0) + (fixed[k] ?? 0);
  const gbS = (use("do_wall_ms") / 1000) * 0.128;
  const units = {
    worker_requests: use("worker_requests"),
    worker_cpu_ms: use("worker_cpu_ms"),
    do_requests: use("do_requests"),
    do_gb_s: gbS,
    do_rows_read: use("rows_read"),
    do_rows_written: use("rows_written"),
    kv_reads: use("kv_reads"),
    kv_writes: use("kv_writes"),
    kv_lists: use("kv_lists"),
    do_storage_gb: (completions * stored.do_bytes) / 1e9,
    kv_storage_gb: (completions * stored.kv_bytes) / 1e9,
  };
  const dollars = {
    base: RATES.base_per_month,
    worker_requests: over(units.worker_requests, RATES.worker_requests),
    worker_cpu_ms: over(units.worker_cpu_ms, RATES.worker_cpu_ms),
    do_requests: over(units.do_requests, RATES.do_requests),
    do_gb_s: over(units.do_gb_s, RATES.do_gb_s),
    do_rows_read: over(units.do_rows_read, RATES.do_rows_read),
    do_rows_written: over(units.do_rows_written, RATES.do_rows_written),
    kv_reads: over(units.kv_reads, RATES.kv_reads),
    kv_writes: over(units.kv_writes, RATES.kv_writes),
    kv_lists: over(units.kv_lists, RATES.kv_lists),
    do_storage: overGb(units.do_storage_gb, RATES.do_storage_gb_month),
    kv_storage: overGb(units.kv_storage_gb, RATES.kv_storage_gb_month),
  };
  const total = Object.values(dollars).reduce((a, b) => a + b, 0);
  return { completions, units, dollars, total };
}

/**
 * What a million units cost at the rates beyond what a month includes (the marginal price,
 * no base fee), each unit using `perUnit` (do_requests, rows_read, rows_written (with alarm
 * writes), do_wall_ms, worker_requests, kv_writes): the price of a million results.
 */
export function perMillion(perUnit) {
  const m = (k) => (perUnit[k] ?? 0) * 1e6;
  const dollars = {
    worker_requests: (m("worker_requests") / 1e6) * RATES.worker_requests.per_million,
    do_requests: (m("do_requests") / 1e6) * RATES.do_requests.per_million,
    do_gb_s: ((m("do_wall_ms") / 1000) * 0.128 / 1e6) * RATES.do_gb_s.per_million,
    do_rows_read: (m("rows_read") / 1e6) * RATES.do_rows_read.per_million,
    do_rows_written: (m("rows_written") / 1e6) * RATES.do_rows_written.per_million,
    kv_writes: (m("kv_writes") / 1e6) * RATES.kv_writes.per_million,
  };
  return { dollars, total: Object.values(dollars).reduce((a, b) => a + b, 0) };
}
