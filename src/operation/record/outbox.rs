//! The stats outbox: events counted in the record, in the same write as the decision they
//! count, until a stats shard has them, or until a write takes them out to hand them to the
//! isolate's tally ([`Operation::take_stats_for_tally`]: an attempt's commit does).
//!
//! Guarantees: every event has a sequence number that only grows; events up to the sealed
//! sequence may be on their way to a shard and are never changed again, so the shard's
//! per-sequence dedupe keeps counts exact. A record's numbers start at its creation time in
//! milliseconds, so a record created again for the same key after the first one's storage
//! was deleted (days later, at the end of retention) numbers its events past every one the
//! first sent, and the mark a shard may still keep from the first never hides them.

use serde::{Deserialize, Serialize};

use crate::operation::record::Operation;
use crate::telemetry::counters::{
    hour_of, sent_named, status_call, AskedBy, Counter, StatEvent, StatusCallAnswer,
};

/// Counted events not yet flushed, and the last sequence issued and sealed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Outbox {
    #[serde(
        rename = "pending_stats",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub(super) pending: Vec<StatEvent>,
    #[serde(rename = "stats_seq", default)]
    pub(super) seq: u64,
    /// Events up to this sequence may be on their way to a shard: they are never changed
    /// again, so a count is merged only into a newer event (see [`Operation::count`]).
    #[serde(rename = "stats_sealed_seq", default)]
    pub(super) sealed_seq: u64,
}

impl Outbox {
    /// An empty outbox whose first event is numbered just after `now_ms`.
    pub(super) fn starting_at(now_ms: i64) -> Outbox {
        let start = now_ms.max(0) as u64;
        Outbox {
            pending: Vec::new(),
            seq: start,
            sealed_seq: start,
        }
    }

    /// Adds `by` to the counter `name`: merged into an unsealed pending event of the same name
    /// and hour when the counter merges, else a new event with the next sequence.
    fn add(&mut self, name: std::borrow::Cow<'_, str>, by: u64, mergeable: bool, now_ms: i64) {
        let sealed = self.sealed_seq;
        if let Some(event) = self.pending.iter_mut().find(|e| {
            mergeable && e.seq > sealed && e.name == *name && hour_of(e.at_ms) == hour_of(now_ms)
        }) {
            event.count += by;
            return;
        }
        self.seq += 1;
        self.pending.push(StatEvent {
            seq: self.seq,
            name: name.into_owned(),
            at_ms: now_ms,
            count: by,
        });
    }

    /// Seals every pending event; the last sequence sealed, if any.
    fn seal(&mut self) -> Option<u64> {
        let last = self.pending.last()?.seq;
        self.sealed_seq = last;
        Some(last)
    }
}

impl Operation {
    /// Counts an event for `/v1/stats`; it is flushed to a stats shard later. A count joins
    /// an unsealed pending event of the same name and hour, so the record stays small however
    /// many duplicates arrive between flushes (a replayed delivery can arrive hundreds of times
    /// a second); sealed events are left alone, which keeps the shard's per-sequence dedupe
    /// exact. `dropped_*` events stay one per drop: the shard lists each as a recent drop.
    pub fn count(&mut self, counter: Counter, now_ms: i64) {
        self.outbox.add(counter.name(), 1, counter.merges(), now_ms);
    }

    /// Adds `by` to a counter whose name is built at run time (a destination's, a bucket's:
    /// [`crate::telemetry::counters::labelled`]); such counters merge like the fixed ones.
    pub fn count_by(&mut self, name: String, by: u64, now_ms: i64) {
        self.outbox.add(name.into(), by, true, now_ms);
    }

    /// Counts the status call `by` made, by how it ended (`None`: no call was made, the
    /// answer was known without one), in the same write as what the answer decides.
    pub fn count_status_call(&mut self, by: AskedBy, answer: Option<StatusCallAnswer>, now: i64) {
        if let Some(answer) = answer {
            self.count_by(status_call(by, answer), 1, now);
        }
    }

    /// The record as a new object instance reads it from storage: any pending event may
    /// already be at a shard (the last instance may have stopped during a flush), so every one
    /// is sealed and nothing merges into it. This is why a flush need not store its seal
    /// first: within an instance the seal in memory is enough, and a new instance seals again.
    pub fn as_loaded(mut self) -> Operation {
        self.seal_stats();
        self
    }

    /// Seals the pending events before they are sent; returns the last sequence sent, if any.
    pub fn seal_stats(&mut self) -> Option<u64> {
        self.outbox.seal()
    }

    /// A flush failed: its events wait until `retry_at_ms` (the wake time follows the oldest).
    pub fn stats_flush_failed(&mut self, retry_at_ms: i64) {
        for event in &mut self.outbox.pending {
            event.at_ms = event.at_ms.max(retry_at_ms);
        }
    }

    /// Forgets counted events up to `seq`, once a shard has them.
    pub fn drop_flushed_stats(&mut self, seq: u64) {
        self.outbox.pending.retain(|e| e.seq > seq);
    }

    /// Takes every pending event out of the record, sealed, for the isolate's tally: the
    /// write that stores the record without them hands them over, with no await between
    /// (so the upkeep has nothing of theirs to flush, and no write of its own to record that
    /// it did). None when they include a drop: those go to the shard named, from the upkeep,
    /// whose send can fail and is retried from the record.
    pub fn take_stats_for_tally(&mut self) -> Vec<StatEvent> {
        if sent_named(&self.outbox.pending) {
            return Vec::new();
        }
        self.outbox.seal();
        std::mem::take(&mut self.outbox.pending)
    }
}
