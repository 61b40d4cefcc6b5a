-- One row per webhook-id: the receiver's claim on it, then its record of what already ran.
-- `done_at` is NULL while the effect runs (the claim, taken at `claimed_at`), then when it ran.
CREATE TABLE IF NOT EXISTS effects (
  webhook_id TEXT PRIMARY KEY,
  idempotency_key TEXT NOT NULL,
  generation INTEGER NOT NULL,
  result_key TEXT,
  outcome TEXT NOT NULL,
  body TEXT NOT NULL,
  claimed_at INTEGER NOT NULL,
  done_at INTEGER
);
