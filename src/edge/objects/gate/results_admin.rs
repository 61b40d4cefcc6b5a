//! The results' commands, answered by the gate object from its results tables: the listing
//! of one state (`parked`, `waiting`, `delivered`) with a cursor (each row's attempts, what
//! answered its last one and when), an operator's retry of
//! parked results, and the progress shown on the operation's record.
//!
//! Guarantees: a listing reads at most one page; delivered results are not stored, so
//! `delivered` answers their count only; a retry takes at most the room left below
//! `MAX_WAITING` (a page) of the parked rows back to waiting (the results waiting for a retry
//! made due now), each then sent by the alarm under its first `webhook-id`, and a parked results
//! file is read again (its status answer first, when that never said where the results are);
//! the progress and the record's part (a history row, the results due now) are one gate step,
//! stored in one storage write, the alarm set after; a dry run changes nothing.

use serde_json::{json, Value};
use worker::Result;

use crate::config::Config;
use crate::operation::gate::protocol::GateReply;
use crate::results::marks as on_record;
use crate::results::progress::Phase;
use crate::results::source;

use super::limits;
use crate::edge::objects::gate::results_store::ResultsStore;
use crate::edge::objects::gate::storage::{Alarm, GateStorage};
use crate::edge::runtime::now_ms;

/// Results listed a page.
const PAGE: usize = 100;

fn results_answer(answer: Value) -> Result<GateReply> {
    Ok(GateReply::ResultsAnswer { answer })
}

/// One page of the results in `state`.
pub(super) fn list(storage: &GateStorage, state: &str, cursor: Option<&str>) -> Result<GateReply> {
    let Some(op) = storage.load()? else {
        return Ok(GateReply::NotFound);
    };
    let store = ResultsStore::new(storage);
    let progress = store.load()?;
    let after: Option<u64> = cursor.and_then(|c| c.parse().ok());
    let rows = match state {
        "parked" if progress.is_none() => Vec::new(),
        "parked" => store.parked(after, PAGE)?,
        "waiting" => progress
            .iter()
            .flat_map(|p| p.rows.values())
            .filter(|r| after.is_none_or(|a| r.index > a))
            .take(PAGE)
            .cloned()
            .collect(),
        "delivered" => {
            let count = progress.as_ref().map_or(0, |p| p.counts.delivered);
            let note = "delivered results are not stored: their count only";
            let answer = json!({"key": op.key(), "state": state, "count": count, "note": note});
            return results_answer(answer);
        }
        _ => return results_answer(json!({"error": "state must be parked, waiting or delivered"})),
    };
    let next = (rows.len() == PAGE).then(|| rows.last().map(|r| r.index.to_string()));
    let results: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({"result_key": r.result_key, "index": r.index, "attempts": r.attempts,
            "last_error": r.last_error, "last_attempt_ms": r.last_attempt_ms,
            "next_attempt_ms": r.next_at_ms})
        })
        .collect();
    let cursor = next.flatten();
    results_answer(json!({"key": op.key(), "state": state, "results": results, "cursor": cursor}))
}

/// Puts a page of parked results back, and a parked file to be read again (or counts them,
/// for a dry run), as [`crate::results::marks::retried`] decides (a history row, the results
/// due now, the alarm set); the progress rides the gate's commit, with the record in one
/// write (the alarm's call comes last).
pub(super) async fn retry(
    storage: &GateStorage,
    config: &Config,
    reason: &str,
    dry_run: bool,
    by: Option<crate::operation::Actor>,
) -> Result<GateReply> {
    let Some(op) = storage.load()? else {
        return Ok(GateReply::NotFound);
    };
    let store = ResultsStore::new(storage);
    let Some(mut progress) = store.load()? else {
        return results_answer(json!({"key": op.key(), "retried": 0, "would_retry": 0}));
    };
    let parked = store.parked(None, progress.room())?;
    let now = now_ms();
    if dry_run {
        let file = matches!(progress.phase, Phase::FileParked { .. });
        return results_answer(json!({"key": op.key(), "dry_run": true,
            "would_retry": parked.len(), "would_reread_file": file,
            "parked": progress.counts.parked, "would_hurry": progress.waiting_later(now)}));
    }
    let step = on_record::retried(op, &mut progress, parked, (reason.to_string(), by), now);
    let (_, reply) = storage.commit(step, &limits(config), Alarm::Sync).await?;
    Ok(reply)
}

/// Adds where the results stand to a record's view (`results_progress`), when they began.
pub(super) fn annotate(storage: &GateStorage, reply: &mut GateReply) -> Result<()> {
    if let GateReply::Found { operation, .. } = reply {
        if operation["results"] == "each" {
            if let Some(progress) = ResultsStore::new(storage).load()? {
                operation["results_progress"] = source::view(&progress);
            }
        }
    }
    Ok(())
}
