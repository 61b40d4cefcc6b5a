//! The record's bookkeeping of its KV-ledger projection: which version was written and when,
//! the backoff of failed writes, and whether an `open:` index entry may exist.
//!
//! Guarantees: writes of one operation are spaced by [`PROJECTION_SPACING_MS`] (KV's per-key
//! rate) and back off up to [`PROJECTION_RETRY_MAX_MS`]; a closed record keeps retention
//! waiting until its index entry is known deleted.

use crate::operation::ledger::IndexWrite;
use crate::operation::record::Operation;

/// What the ledger has of this record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct LedgerMark {
    /// The version last written to the KV ledger, and when.
    pub(super) version: u64,
    pub(super) at_ms: i64,
    /// Ledger writes failed in a row, and when the next may be tried (capped backoff, so a
    /// KV outage does not become a storm of alarms).
    pub(super) failures: u32,
    pub(super) retry_at_ms: i64,
    /// An `open:` index entry may exist in KV (a put of it was tried and no delete has
    /// succeeded since): the projection that closes the operation deletes it, and retention
    /// waits for that, so a tombstone (never projected again) leaves no index entry behind.
    pub(super) indexed: bool,
}

/// KV accepts one write per second to a key: projections of one operation are spaced by this.
pub const PROJECTION_SPACING_MS: i64 = 1_000;
/// Longest wait between ledger writes that keep failing (a KV outage, or the Free plan's
/// daily write quota spent): the gate stays the truth meanwhile.
pub const PROJECTION_RETRY_MAX_MS: i64 = 300_000;

impl LedgerMark {
    /// When the next write may be tried.
    fn due_ms(&self) -> i64 {
        (self.at_ms + PROJECTION_SPACING_MS).max(self.retry_at_ms)
    }

    /// A write of `version` succeeded at `now_ms`: the backoff resets.
    fn written(&mut self, version: u64, now_ms: i64) {
        self.version = self.version.max(version);
        self.at_ms = now_ms;
        self.failures = 0;
        self.retry_at_ms = 0;
    }

    /// A write failed at `now_ms`: the next waits twice as long as the last, capped.
    fn failed(&mut self, now_ms: i64) {
        self.failures = self.failures.saturating_add(1);
        let exponent = (self.failures - 1).min(20);
        let wait = (PROJECTION_SPACING_MS << exponent).min(PROJECTION_RETRY_MAX_MS);
        self.at_ms = now_ms;
        self.retry_at_ms = now_ms + wait;
    }

    /// Whether an index entry may exist after `write` ended `ok` or not.
    fn index_written(&mut self, write: IndexWrite, ok: bool) {
        match (write, ok) {
            (IndexWrite::Put, _) => self.indexed = true,
            (IndexWrite::Delete, true) => self.indexed = false,
            _ => {}
        }
    }
}

impl Operation {
    /// When the next ledger write may be tried: one second after the last (KV's per-key write
    /// rate), or later after failures.
    pub fn projection_due_ms(&self) -> i64 {
        self.ledger.due_ms()
    }

    /// A ledger write of `version` succeeded at `now_ms`.
    pub fn projection_written(&mut self, version: u64, now_ms: i64) {
        self.ledger.written(version, now_ms);
    }

    /// The index write that went with a projection was `write`, and it succeeded (`ok`) or
    /// not. A put, even a failed one, may have landed; only a delete that succeeded clears
    /// the mark; no write leaves it as it stands (a [`Operation::reindex`] may have set it
    /// while the write was in flight).
    pub fn index_written(&mut self, write: IndexWrite, ok: bool) {
        self.ledger.index_written(write, ok);
    }

    /// The reconciliation audit found the KV index out of step with this record (missing, or
    /// left behind): project it again, and treat the index entry as possibly present, so a
    /// closed record deletes it and an open one puts it back. A tombstone is never projected
    /// again (false).
    pub fn reindex(&mut self) -> bool {
        if self.retired_at_ms.is_some() {
            return false;
        }
        self.ledger.indexed = true;
        self.changed();
        true
    }

    /// A ledger write failed at `now_ms`: the next waits 1 s, 2 s, 4 s, ... up to
    /// [`PROJECTION_RETRY_MAX_MS`].
    pub fn projection_failed(&mut self, now_ms: i64) {
        self.ledger.failed(now_ms);
    }
}
