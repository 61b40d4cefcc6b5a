"""A gemini-once destination in Python: FastAPI, the official `standardwebhooks` verifier, and
SQLite as the record of every `webhook-id` handled. A starting point to copy (docs/EFFECTS.md);
README.md beside it gives the commands that run it.

It takes both bodies the worker sends (docs/effect.schema.json): a job's effect (`status`:
succeeded, failed, cancelled, expired) and, for a batch registered with `"results": "each"`,
each result's own effect (`result_key`, `index`, and one of `response`, `error`,
`unreadable`; no `status`).

What it guarantees, and why:
- Nothing unverified runs: the raw body's Standard Webhooks signature is checked (with the
  worker's EFFECT_SIGNING_SECRET) before the body is parsed; a bad or stale one answers 401,
  which the worker parks (a real misconfiguration should not be retried forever).
- Each `webhook-id` runs once. The id's row is inserted first (INSERT OR IGNORE: the claim),
  and your side effect runs only when that insert added it; the row and the effect's own
  writes commit in one SQLite transaction, taken with BEGIN IMMEDIATE so two copies of one id
  (a retry that overtook a slow first attempt) run one after the other: the second finds the
  row and is answered 2xx without running anything. The 2xx goes out only after the commit, so an answer the worker never
  received (the receiver crashed, the connection dropped) brings a retry that is dropped here.
- A failure answers 500 and commits nothing: the worker retries the same `webhook-id` later.
- A redelivery an operator asked for is a new generation with a new `webhook-id` and runs
  again on purpose; `idempotency-key` is the operation's key, the same for every generation.
"""

import json
import os
import sqlite3
import sys
import time

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from standardwebhooks import Webhook, WebhookVerificationError

webhook = Webhook(os.environ["EFFECT_SIGNING_SECRET"])
DB_PATH = os.environ.get("RECEIVER_DB", "effects.sqlite3")
app = FastAPI()


def connect() -> sqlite3.Connection:
    # isolation_level=None: transactions are the explicit BEGIN IMMEDIATE below, not implicit.
    db = sqlite3.connect(DB_PATH, isolation_level=None, timeout=30)
    db.execute(
        "CREATE TABLE IF NOT EXISTS effects (webhook_id TEXT PRIMARY KEY,"
        " idempotency_key TEXT NOT NULL, generation INTEGER NOT NULL, result_key TEXT,"
        " outcome TEXT NOT NULL, body TEXT NOT NULL, received_at REAL NOT NULL)"
    )
    return db


def outcome(effect: dict) -> str:
    """What the effect says happened: a job's `status`, or which of `response`, `error` and
    `unreadable` a result carries (a result has no `status`)."""
    if "result_key" in effect:
        return next((k for k in ("response", "error", "unreadable") if k in effect), "unknown")
    return str(effect.get("status"))


def describe(effect: dict) -> str:
    """The effect's fields worth a log line: a result's key and index, or a job's status."""
    if "result_key" in effect:
        return f"result_key={effect['result_key']} index={effect.get('index')} outcome={outcome(effect)}"
    return f"status={outcome(effect)}"


def apply_effect(db: sqlite3.Connection, effect: dict, webhook_id: str, generation: int) -> None:
    """Your side effect goes here (publish, bill, notify). Writes made with `db` commit with the
    webhook-id's row, exactly once. A call outside this database may run again if the process
    dies before the commit: pass it `webhook_id` as its own idempotency key."""
    # One write, newline included: FastAPI runs this handler in a worker thread while
    # uvicorn's access log writes to the same stdout, and print's separate write of its
    # newline let that log land mid-line.
    line = f"processed webhook-id={webhook_id} key={effect['key']} generation={generation}"
    sys.stdout.write(f"{line} {describe(effect)}\n")
    sys.stdout.flush()


def handle(raw: bytes, effect: dict, headers: dict) -> bool:
    """Runs the effect unless its webhook-id is already recorded; True when it was new."""
    webhook_id = headers["webhook-id"]
    generation = int(headers.get("effect-generation", "1"))
    db = connect()
    try:
        db.execute("BEGIN IMMEDIATE")
        inserted = db.execute(
            "INSERT OR IGNORE INTO effects VALUES (?, ?, ?, ?, ?, ?, ?)",
            (webhook_id, headers.get("idempotency-key", effect["key"]), generation,
             effect.get("result_key"), outcome(effect), raw.decode(), time.time()),
        ).rowcount
        if inserted:
            apply_effect(db, effect, webhook_id, generation)
        db.execute("COMMIT")
        return bool(inserted)
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    finally:
        db.close()


@app.post("/effects")
async def receive(request: Request) -> JSONResponse:
    raw = await request.body()
    headers = dict(request.headers)
    try:
        effect = webhook.verify(raw, headers)
    except (WebhookVerificationError, ValueError):
        # ValueError: a signature header that is not base64 or not `v1,<sig>`.
        return JSONResponse({"error": "signature not verified"}, status_code=401)
    # SQLite blocks while another copy of this id holds the write lock: off the event loop.
    new = await run_in_threadpool(handle, raw, effect, headers)
    return JSONResponse({"ok": True, "duplicate": not new})
