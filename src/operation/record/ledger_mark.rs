//! The record's KV-ledger projection ([`Operation::projection`]: the entry and metadata that
//! mirror it, see [`crate::operation::ledger`]) and its bookkeeping: which version was written
//! and when, the backoff of failed writes, and whether an `open:` index entry may exist.
//!
//! Guarantees: writes of one operation are spaced by [`PROJECTION_SPACING_MS`] (KV's per-key
//! rate) and back off up to [`PROJECTION_RETRY_MAX_MS`]; a closed record keeps retention
//! waiting until its index entry is known deleted.

use serde::{Deserialize, Serialize};

use crate::operation::ledger::{
    may_need_work, meta_error, op_key, IndexWrite, LedgerMeta, Projection, MIN_TTL_SECS,
};
use crate::operation::record::Operation;
use crate::retry::Backoff;

/// What the ledger has of this record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct LedgerMark {
    /// The version last written to the KV ledger, and when.
    #[serde(rename = "projected_version", default)]
    pub(super) version: u64,
    #[serde(rename = "projected_at_ms", default)]
    pub(super) at_ms: i64,
    /// Ledger writes failed in a row, and when the next may be tried (capped backoff, so a
    /// KV outage does not become a storm of alarms).
    #[serde(rename = "projection_failures", default)]
    pub(super) failures: u32,
    #[serde(rename = "projection_retry_at_ms", default)]
    pub(super) retry_at_ms: i64,
    /// An `open:` index entry may exist in KV (a put of it was tried and no delete has
    /// succeeded since): the projection that closes the operation deletes it, and retention
    /// waits for that, so a tombstone (never projected again) leaves no index entry behind.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) indexed: bool,
}

/// KV accepts one write per second to a key: projections of one operation are spaced by this.
pub const PROJECTION_SPACING_MS: i64 = 1_000;
/// Longest wait between ledger writes that keep failing (a KV outage, or the Free plan's
/// daily write quota spent): the gate stays the truth meanwhile.
pub const PROJECTION_RETRY_MAX_MS: i64 = 300_000;

impl Operation {
    /// The ledger write that mirrors this record.
    pub fn projection(&self, retention_secs: i64) -> Projection {
        let secs = |ms: i64| ms.div_euclid(1_000);
        let (done, settled) = (self.effect.done_at_ms, self.settled_at_ms);
        let metadata = LedgerMeta {
            status: self.status().clone(),
            name: self.name().to_string(),
            submitted_at: secs(self.submitted_at_ms()),
            settled_at: self.settled_at_ms().map(secs),
            effect_done: self.effect().done(),
            parked: self.effect().parked().is_some(),
            claim_expires: self.effect().claim().map(|c| secs(c.expires_ms)),
            alerts: self.alerts_raised().to_vec(),
            forgotten: self.forgotten().is_some(),
            version: self.version(),
            // A kind is at most 100 bytes, but a control character would be escaped to six in
            // the metadata's JSON: such a kind is left out rather than risk KV's 1024 bytes.
            kind: self
                .kind()
                .map(str::to_string)
                .filter(|k| !k.chars().any(char::is_control)),
            settled_by: self.settled_by().map(|s| s.as_str().to_string()),
            error: match &self.effect.parked {
                _ if self.effect.done => None,
                Some(p) => Some(meta_error(&p.answer)),
                None => self.effect.last_error.as_deref().map(meta_error),
            },
            effect_ms: done.zip(settled).map(|(d, s)| (d - s).max(0)),
        };
        Projection {
            kv_key: op_key(self.key()),
            value: self.view().to_string(),
            open: may_need_work(&metadata),
            metadata,
            ttl_secs: self
                .is_closed()
                .then(|| (retention_secs.max(0) as u64).max(MIN_TTL_SECS)),
        }
    }

    /// A ledger write of `version` succeeded at `now_ms`: the backoff resets.
    pub fn projection_written(&mut self, version: u64, now_ms: i64) {
        let ledger = &mut self.ledger;
        ledger.version = ledger.version.max(version);
        ledger.at_ms = now_ms;
        ledger.failures = 0;
        ledger.retry_at_ms = 0;
    }

    /// The index write that went with a projection was `write`, and it succeeded (`ok`) or
    /// not. A put, even a failed one, may have landed; only a delete that succeeded clears
    /// the mark; no write leaves it as it stands (a [`Operation::reindex`] may have set it
    /// while the write was in flight).
    pub fn index_written(&mut self, write: IndexWrite, ok: bool) {
        match (write, ok) {
            (IndexWrite::Put, _) => self.ledger.indexed = true,
            (IndexWrite::Delete, true) => self.ledger.indexed = false,
            _ => {}
        }
    }

    /// The reconciliation audit found the KV index out of step with this record (missing, or left
    /// behind): project it again, and treat the index entry as possibly present, so a closed record
    /// deletes it and an open one puts it back. A tombstone is never projected again (false).
    pub fn reindex(&mut self) -> bool {
        if self.retired_at_ms.is_some() {
            return false;
        }
        self.ledger.indexed = true;
        self.changed();
        true
    }

    /// A ledger write failed at `now_ms`: the next waits twice as long as the last, 1 s,
    /// 2 s, 4 s, ... up to `PROJECTION_RETRY_MAX_MS`.
    pub fn projection_failed(&mut self, now_ms: i64) {
        let ledger = &mut self.ledger;
        ledger.failures = ledger.failures.saturating_add(1);
        let wait =
            Backoff::new(PROJECTION_SPACING_MS, PROJECTION_RETRY_MAX_MS).after(ledger.failures);
        ledger.at_ms = now_ms;
        ledger.retry_at_ms = now_ms + wait;
    }
}

#[cfg(test)]
mod tests {
    use crate::operation::alert::AlertKind;
    use crate::operation::key::MAX_NAME_BYTES;
    use crate::operation::ledger::{IndexWrite, MAX_META_ERROR_BYTES, MIN_TTL_SECS};
    use crate::operation::lifecycle::{Source, Status};
    use crate::operation::{OpEvent, Operation};
    use crate::retry::Next;

    fn succeeded(op: &mut Operation) {
        op.apply(
            &OpEvent {
                status: Status::Succeeded,
                update_time_ms: 0,
                source: Source::Webhook,
                details: Default::default(),
                delivery_id: None,
            },
            5_000,
        );
    }

    #[test]
    fn open_operation_never_expires() {
        let op = Operation::register("batches/a", "batches/a", None, 1_000);
        let p = op.projection(1_209_600);
        assert_eq!(p.kv_key, "op:batches/a");
        assert_eq!(p.ttl_secs, None);
        assert_eq!(p.metadata.status, Status::Pending);
        assert_eq!(p.metadata.submitted_at, 1);
    }

    #[test]
    fn terminal_but_not_done_never_expires() {
        let mut op = Operation::register("batches/a", "batches/a", None, 1_000);
        succeeded(&mut op);
        let p = op.projection(1_209_600);
        assert_eq!(p.ttl_secs, None);
        assert_eq!(p.metadata.settled_at, Some(5));
        assert!(!p.metadata.effect_done);
    }

    #[test]
    fn done_or_parked_operation_expires_after_retention() {
        let mut op = Operation::register("batches/a", "batches/a", None, 1_000);
        succeeded(&mut op);
        let c = op.claim(5_000, 600_000).unwrap();
        assert_eq!(op.projection(100).metadata.claim_expires, Some(605));
        op.finish(&c, &Next::Delivered, 6_000);
        assert_eq!(op.projection(1_209_600).ttl_secs, Some(1_209_600));
        assert_eq!(op.projection(1).ttl_secs, Some(MIN_TTL_SECS));

        let mut parked = Operation::register("batches/p", "batches/p", None, 1_000);
        succeeded(&mut parked);
        let c = parked.claim(5_000, 600_000).unwrap();
        parked.finish(&c, &Next::Park("400".into()), 6_000);
        let p = parked.projection(1_209_600);
        assert!(p.metadata.parked);
        assert_eq!(p.ttl_secs, Some(1_209_600));
    }

    #[test]
    fn metadata_of_the_longest_name_fits_in_kv() {
        let name = format!("batches/{}", "x".repeat(MAX_NAME_BYTES - 8));
        let mut op = Operation::register(&name, &name, Some("k".repeat(100)), 1_000);
        for (i, a) in [
            AlertKind::Stuck,
            AlertKind::UnknownToGemini,
            AlertKind::EffectFailing,
            AlertKind::StatusUnusable,
        ]
        .into_iter()
        .enumerate()
        {
            op.raise_alert(a, 1, i as i64);
        }
        succeeded(&mut op);
        let c = op.claim(5_000, 600_000).unwrap();
        op.finish(&c, &Next::retry("\"".repeat(300), 5_000), 5_000);
        op.claim(5_000, 600_000);
        let meta = serde_json::to_string(&op.projection(1).metadata).unwrap();
        assert!(meta.contains(r#""settled_by":"webhook""#), "{meta}");
        assert!(meta.len() < 1024, "{} bytes", meta.len());
    }

    #[test]
    fn open_operation_is_indexed_and_closing_deletes_its_entry() {
        let mut op = Operation::register("batches/a", "batches/a", None, 1_000);
        let p = op.projection(100);
        assert!(p.open);
        assert_eq!(p.open_key(), "open:batches/a");
        assert_eq!(p.index_write(false), IndexWrite::Put);
        assert_eq!(p.index_write(true), IndexWrite::Put, "metadata kept fresh");
        succeeded(&mut op);
        let c = op.claim(5_000, 600_000).unwrap();
        assert!(op.projection(100).open, "terminal, effect in flight");
        op.finish(&c, &Next::Delivered, 6_000);
        let p = op.projection(100);
        assert!(!p.open);
        assert_eq!(p.index_write(true), IndexWrite::Delete);
        assert_eq!(
            p.index_write(false),
            IndexWrite::None,
            "closed in its first projection: one KV write, no delete"
        );
    }

    #[test]
    fn forgotten_operation_leaves_the_index() {
        let mut op = Operation::register("batches/a", "batches/a", None, 1_000);
        op.forget(2_000, "by hand");
        assert!(!op.projection(100).open);
    }

    #[test]
    fn metadata_keeps_the_kind_unless_it_would_escape_long() {
        let op = Operation::register("batches/a", "batches/a", Some("nightly".into()), 1_000);
        assert_eq!(op.projection(1).metadata.kind.as_deref(), Some("nightly"));
        let op = Operation::register("batches/a", "batches/a", Some("\u{1}".repeat(100)), 1_000);
        assert_eq!(op.projection(1).metadata.kind, None);
    }

    #[test]
    fn metadata_keeps_a_bounded_error_while_the_effect_is_not_done() {
        let mut op = Operation::register("batches/p", "batches/p", None, 1_000);
        succeeded(&mut op);
        let c = op.claim(5_000, 600_000).unwrap();
        op.finish(&c, &Next::retry("503: down".into(), 6_000), 6_000);
        assert_eq!(
            op.projection(1).metadata.error.as_deref(),
            Some("503: down")
        );
        let c = op.claim(7_000, 600_000).unwrap();
        let long = format!("400: {}", "\"\n\u{e9}".repeat(100));
        op.finish(&c, &Next::Park(long), 8_000);
        let error = op.projection(1).metadata.error.unwrap();
        assert!(error.starts_with("400: \" \u{e9}"), "{error}");
        assert!(error.len() <= MAX_META_ERROR_BYTES);
        assert!(!error.chars().any(char::is_control));

        let mut done = Operation::register("batches/d", "batches/d", None, 1_000);
        succeeded(&mut done);
        let c = done.claim(5_000, 600_000).unwrap();
        done.finish(&c, &Next::Delivered, 6_000);
        assert_eq!(
            done.projection(1).metadata.error,
            None,
            "done: nothing to group"
        );
    }
}
