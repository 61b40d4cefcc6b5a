//! Records rebuilt from what could be read of a stored record that did not load (see
//! [`crate::operation::recovery`], which decides when).
//!
//! Guarantees: a salvaged record keeps its key, name, kind, state, effect generation, fencing
//! token and attempts, and an effect that was owed is parked, not run, until an operator
//! retries or forgets it; a rebuilt one is pending, registered and parked, with a fencing token
//! above any issued before.

use serde_json::Value;

use crate::operation::alert::AlertKind;
use crate::operation::details::{bound_members, normalize_details};
use crate::operation::lifecycle::{Source, Status};
use crate::operation::record::{Operation, OperatorNote, Parked};

impl Operation {
    /// A record rebuilt from the fields of `v` that read as their types.
    pub(crate) fn salvage(v: &Value) -> Option<Operation> {
        let key = v.get("key")?.as_str()?;
        let status = Status::parse(v.get("status")?.as_str()?);
        if status.rank() < 0 {
            return None;
        }
        let name = v["name"].as_str().unwrap_or(key);
        let kind = v["kind"].as_str().map(str::to_string);
        let submitted = v["submitted_at_ms"].as_i64().unwrap_or(0);
        let mut op = Operation::register(key, name, kind, submitted);
        op.registered = v["registered"].as_bool().unwrap_or(true);
        op.status = status;
        op.update_time_ms = v["update_time_ms"].as_i64().unwrap_or(0);
        op.version = v["version"].as_u64().unwrap_or(1) + 1;
        op.settled_at_ms = v["settled_at_ms"].as_i64();
        op.settled_by = serde_json::from_value::<Source>(v["settled_by"].clone()).ok();
        if let Value::Object(details) = &v["details"] {
            op.details = normalize_details(details);
        }
        let e = &v["effect"];
        op.effect.done = e["done"].as_bool().unwrap_or(false);
        op.effect.done_at_ms = e["done_at_ms"].as_i64();
        // Saturating, not wrapping: a wrapped generation could reuse a `webhook-id`.
        let small = |v: &Value, default: u64| {
            u32::try_from(v.as_u64().unwrap_or(default)).unwrap_or(u32::MAX)
        };
        op.effect.generation = small(&e["generation"], 1).max(1);
        op.effect.fence = e["fence"].as_u64().unwrap_or(0);
        op.effect.attempts = small(&e["attempts"], 0);
        op.effect.last_error = e["last_error"].as_str().map(str::to_string);
        op.effect.parked = serde_json::from_value::<Parked>(e["parked"].clone()).ok();
        // Alerts are sent at least once: one queued but not yet accepted by the sink must still go.
        // When the queue cannot be read, forget which kinds were raised, so each can be raised
        // again (a repeat alert, never a lost one). An empty queue is not stored (null).
        match serde_json::from_value::<Option<_>>(v["pending_alerts"].clone()) {
            Ok(pending) => {
                op.pending_alerts = pending.unwrap_or_default();
                op.alerts = serde_json::from_value(v["alerts"].clone()).unwrap_or_default();
            }
            Err(_) => op.alerts.clear(),
        }
        // A spell raised again goes under the id it had, never under an earlier spell's.
        op.alert_spells = serde_json::from_value(v["alert_spells"].clone()).unwrap_or_default();
        // A nudge waiting for its confirmation keeps its metadata and is asked about again.
        op.confirmation = serde_json::from_value(v["confirmation"].clone()).ok();
        op.notes.forgotten = serde_json::from_value::<OperatorNote>(v["forgotten"].clone()).ok();
        op.retired_at_ms = v["retired_at_ms"].as_i64();
        op.retired_unasked = v["retired_unasked"].as_bool().unwrap_or(false);
        // The ledger may hold an `open:` entry: the next projection puts or deletes it.
        op.ledger.indexed = true;
        if op.effect_owed() {
            // Whether an attempt reached the destination is not known: run nothing until an
            // operator decides (retry keeps the webhook-id, so a receiver drops a repeat).
            op.effect.parked = Some(Parked {
                at_ms: op.settled_at_ms.unwrap_or(submitted),
                answer: format!(
                    "the stored record could not be read and was rebuilt from what could; the side \
                     effect may already have run ({} attempts): retry or forget it",
                    op.effect.attempts
                ),
            });
        }
        Some(op)
    }

    /// The record an operator's repair writes when not even the key and state of the stored one
    /// can be read: the operation as registered and pending (so the cron asks Gemini about it
    /// again), its side effect parked before it is owed (whether it already ran is unknown: once
    /// the outcome is known, an operator retries or forgets it; the park alerts), and a fencing
    /// token above any issued before (tokens count attempts; this is the time in ms).
    pub fn rebuild(key: &str, name: &str, reason: &str, now_ms: i64) -> Operation {
        let mut op = Operation::register(key, name, None, now_ms);
        op.effect.fence = now_ms.max(0) as u64;
        op.effect.parked = Some(Parked {
            at_ms: now_ms,
            answer: format!(
                "rebuilt by an operator ({reason}) from a stored record that could not be read: \
                 whether the side effect already ran is unknown: retry or forget it"
            ),
        });
        op.ledger.indexed = true;
        op
    }

    /// A record read whole after pruning: its outside values reshaped and bounded as when
    /// they entered, so it stores and loads again.
    pub(crate) fn normalized(mut self) -> Operation {
        self.details = normalize_details(&self.details);
        if let Some(c) = &mut self.confirmation {
            c.metadata = bound_members(std::mem::take(&mut c.metadata));
        }
        self
    }

    /// A recovered record: its `record_unreadable` alert raised (once per operation) and its
    /// version bumped so the ledger follows.
    pub(crate) fn mark_recovered(&mut self, now_ms: i64) {
        let age = (now_ms - self.submitted_at_ms).div_euclid(1_000);
        self.raise_alert(AlertKind::RecordUnreadable, age, now_ms);
        self.changed();
    }
}
