-- One row per webhook-id handled: the receiver's record of what already ran.
CREATE TABLE IF NOT EXISTS effects (
  webhook_id TEXT PRIMARY KEY,
  idempotency_key TEXT NOT NULL,
  generation INTEGER NOT NULL,
  status TEXT NOT NULL,
  body TEXT NOT NULL,
  received_at INTEGER NOT NULL
);
