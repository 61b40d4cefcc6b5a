//! The KV ledger: a listing of operations for the reconciliation pass, never a source of truth.
//!
//! Layout: `op:<key>` holds the operation's public JSON view; its metadata ([`LedgerMeta`])
//! holds what the pass decides on, so it reads no value for entries needing no work.
//! `open:<key>` is the index of what may need work ([`may_need_work`]): an
//! empty value with the same metadata, written with every projection while the operation may
//! need work and deleted with the projection that closes it, so the routine pass lists open
//! operations only. It is a hint like the rest: a lost put is found by the daily audit over
//! `op:`, a lost delete costs a harmless trip through the gate (and is repaired by the audit).
//! `dead:<webhook-id>` holds a signed delivery that could not be used, for inspection.
//! Guarantees: metadata stays far under KV's 1024-byte limit (names are at most 400 bytes);
//! an entry gets an expiration only once its operation is terminal and its side effect done
//! or parked, so open records never expire. KV is eventually consistent and last-write-wins:
//! the gate writes a projection tagged with its version, and a stale one only costs a
//! redundant, harmless trip through the gate.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::operation::alert::AlertKind;
use crate::operation::lifecycle::Status;
use crate::operation::Operation;

/// Prefix of operation entries.
pub const OP_PREFIX: &str = "op:";
/// Prefix of the index of operations that may need reconciling.
pub const OPEN_PREFIX: &str = "open:";
/// Prefix of dead letters.
pub const DEAD_PREFIX: &str = "dead:";
/// KV's minimum `expirationTtl`.
pub const MIN_TTL_SECS: u64 = 60;

/// The metadata of an `op:` entry. Times are Unix seconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerMeta {
    /// Our status spelling (`pending` ... `expired`).
    pub status: Status,
    /// The full name, for the status API.
    pub name: String,
    pub submitted_at: i64,
    #[serde(default)]
    pub settled_at: Option<i64>,
    pub effect_done: bool,
    #[serde(default)]
    pub parked: bool,
    /// When the live claim lapses, if one is held.
    #[serde(default)]
    pub claim_expires: Option<i64>,
    /// Alert kinds already raised.
    #[serde(default)]
    pub alerts: Vec<AlertKind>,
    /// An operator stopped tracking it.
    #[serde(default)]
    pub forgotten: bool,
    /// The gate's record version this projection shows.
    pub version: u64,
    /// The registered kind, for the operator's listing filter (absent in entries written
    /// before it was kept, and when there is none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Which path settled it (`webhook`, `reconcile`, `operator`), for the same listing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled_by: Option<String>,
    /// The side effect's last refusal or failure while it is not done (the start of the
    /// answer, at most [`MAX_META_ERROR_BYTES`]), for grouping the operator's issues. Absent in
    /// entries written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Milliseconds from the outcome's settlement (the delivery's answer) to the side effect's
    /// acceptance, once done: the operator's latency view reads it from the listing, so it
    /// costs no write of its own. Absent in entries written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect_ms: Option<i64>,
}

/// Longest error kept in the metadata: with JSON's two-byte escapes of `"` and `\` it stays
/// far under KV's 1024 bytes beside a 400-byte name.
pub const MAX_META_ERROR_BYTES: usize = 80;

/// The start of `answer`, at most [`MAX_META_ERROR_BYTES`] bytes on a character boundary,
/// with control characters (six bytes once escaped) replaced by spaces.
pub fn meta_error(answer: &str) -> String {
    let mut out = String::new();
    for c in answer.chars() {
        let c = if c.is_control() { ' ' } else { c };
        if out.len() + c.len_utf8() > MAX_META_ERROR_BYTES {
            break;
        }
        out.push(c);
    }
    out.trim_end().to_string()
}

impl LedgerMeta {
    /// An entry as a test builds it: submitted at 1,000 s, nothing settled, raised or held.
    #[cfg(test)]
    pub(crate) fn sample(status: &str) -> LedgerMeta {
        LedgerMeta {
            status: Status::parse(status),
            name: "batches/a".into(),
            submitted_at: 1_000,
            settled_at: None,
            effect_done: false,
            parked: false,
            claim_expires: None,
            alerts: vec![],
            forgotten: false,
            version: 1,
            kind: None,
            settled_by: None,
            error: None,
            effect_ms: None,
        }
    }
}

/// Everything one ledger write needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Projection {
    pub kv_key: String,
    pub value: String,
    pub metadata: LedgerMeta,
    /// Set only for closed operations.
    pub ttl_secs: Option<u64>,
    /// Whether `open:<key>` should exist (the metadata says the pass may have work for it).
    pub open: bool,
}

/// What the projection does to the `open:` index entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexWrite {
    /// Put `open:<key>` with the projection's metadata (one KV write).
    Put,
    /// Delete `open:<key>` (one KV write).
    Delete,
    /// Nothing: closed, and no entry was ever written (or its delete already succeeded).
    None,
}

impl Projection {
    /// The index write that goes with this projection, given whether an `open:` entry may
    /// exist (`indexed`, the gate's own belief). An open operation's entry is rewritten with
    /// every projection, so its metadata is as fresh as `op:`'s; a closed one's is deleted
    /// only if it may exist, so an operation that closes in its first projection (a completion
    /// whose effect succeeded at once) costs one KV write, as before the index.
    pub fn index_write(&self, indexed: bool) -> IndexWrite {
        match (self.open, indexed) {
            (true, _) => IndexWrite::Put,
            (false, true) => IndexWrite::Delete,
            (false, false) => IndexWrite::None,
        }
    }

    /// The KV key of the index entry.
    pub fn open_key(&self) -> String {
        format!("{OPEN_PREFIX}{}", &self.kv_key[OP_PREFIX.len()..])
    }
}

/// The KV key of an operation's entry.
pub fn op_key(key: &str) -> String {
    format!("{OP_PREFIX}{key}")
}

/// The KV key of an operation's index entry.
pub fn open_key(key: &str) -> String {
    format!("{OPEN_PREFIX}{key}")
}

/// The KV key of a dead letter. Long or odd delivery ids are hashed to stay a valid key.
pub fn dead_key(webhook_id: &str) -> String {
    let plain = webhook_id.len() <= 200
        && webhook_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'));
    if plain {
        format!("{DEAD_PREFIX}{webhook_id}")
    } else {
        let digest = Sha256::digest(webhook_id.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        format!("{DEAD_PREFIX}sha256-{hex}")
    }
}

/// True when the cron pass ([`crate::reconciliation::reconcile::decide`]) may return an action for this metadata now or later: the operation
/// belongs in the `open:` index. Not forgotten, and either not terminal (polled once past the
/// grace; an unknown status is never acted on) or terminal with the side effect neither done
/// nor parked (retried), or parked with its `effect_failing` alert not yet raised. Alerts the
/// gate has queued are its own alarm's business, not the pass's.
pub fn may_need_work(meta: &LedgerMeta) -> bool {
    if meta.forgotten {
        return false;
    }
    let status = meta.status.clone();
    if status.is_terminal() {
        !meta.effect_done && (!meta.parked || !meta.alerts.contains(&AlertKind::EffectFailing))
    } else {
        status.rank() >= 0
    }
}

/// The ledger write that mirrors `op`.
pub fn project(op: &Operation, retention_secs: i64) -> Projection {
    let secs = |ms: i64| ms.div_euclid(1_000);
    let metadata = LedgerMeta {
        status: op.status().clone(),
        name: op.name().to_string(),
        submitted_at: secs(op.submitted_at_ms()),
        settled_at: op.settled_at_ms().map(secs),
        effect_done: op.effect().done(),
        parked: op.effect().parked().is_some(),
        claim_expires: op.effect().claim().map(|c| secs(c.expires_ms)),
        alerts: op.alerts_raised().to_vec(),
        forgotten: op.forgotten().is_some(),
        version: op.version(),
        // A kind is at most 100 bytes, but a control character would be escaped to six in
        // the metadata's JSON: such a kind is left out rather than risk KV's 1024 bytes.
        kind: op
            .kind()
            .map(str::to_string)
            .filter(|k| !k.chars().any(char::is_control)),
        settled_by: op.settled_by().map(|s| s.as_str().to_string()),
        error: (!op.effect().done())
            .then(|| {
                op.effect()
                    .parked()
                    .map(|p| p.answer.as_str())
                    .or(op.effect().last_error())
            })
            .flatten()
            .map(meta_error),
        effect_ms: op
            .effect()
            .done_at_ms()
            .zip(op.settled_at_ms())
            .map(|(done, settled)| (done - settled).max(0)),
    };
    Projection {
        kv_key: op_key(op.key()),
        value: op.view().to_string(),
        open: may_need_work(&metadata),
        metadata,
        ttl_secs: op
            .is_closed()
            .then(|| (retention_secs.max(0) as u64).max(MIN_TTL_SECS)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operation::key::MAX_NAME_BYTES;
    use crate::operation::lifecycle::{Source, Status};
    use crate::operation::{AttemptOutcome, OpEvent};

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
        let p = project(&op, 1_209_600);
        assert_eq!(p.kv_key, "op:batches/a");
        assert_eq!(p.ttl_secs, None);
        assert_eq!(p.metadata.status, Status::Pending);
        assert_eq!(p.metadata.submitted_at, 1);
    }

    #[test]
    fn terminal_but_not_done_never_expires() {
        let mut op = Operation::register("batches/a", "batches/a", None, 1_000);
        succeeded(&mut op);
        let p = project(&op, 1_209_600);
        assert_eq!(p.ttl_secs, None);
        assert_eq!(p.metadata.settled_at, Some(5));
        assert!(!p.metadata.effect_done);
    }

    #[test]
    fn done_or_parked_operation_expires_after_retention() {
        let mut op = Operation::register("batches/a", "batches/a", None, 1_000);
        succeeded(&mut op);
        let c = op.claim(5_000, 600_000).unwrap();
        assert_eq!(project(&op, 100).metadata.claim_expires, Some(605));
        op.finish(c.token, &AttemptOutcome::Delivered, 6_000, 0);
        assert_eq!(project(&op, 1_209_600).ttl_secs, Some(1_209_600));
        assert_eq!(project(&op, 1).ttl_secs, Some(MIN_TTL_SECS));

        let mut parked = Operation::register("batches/p", "batches/p", None, 1_000);
        succeeded(&mut parked);
        let c = parked.claim(5_000, 600_000).unwrap();
        parked.finish(c.token, &AttemptOutcome::Park("400".into()), 6_000, 0);
        let p = project(&parked, 1_209_600);
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
        op.finish(c.token, &AttemptOutcome::Retry("\"".repeat(300)), 5_000, 0);
        op.claim(5_000, 600_000);
        let meta = serde_json::to_string(&project(&op, 1).metadata).unwrap();
        assert!(meta.contains(r#""settled_by":"webhook""#), "{meta}");
        assert!(meta.len() < 1024, "{} bytes", meta.len());
    }

    #[test]
    fn open_operation_is_indexed_and_closing_deletes_its_entry() {
        let mut op = Operation::register("batches/a", "batches/a", None, 1_000);
        let p = project(&op, 100);
        assert!(p.open);
        assert_eq!(p.open_key(), "open:batches/a");
        assert_eq!(p.index_write(false), IndexWrite::Put);
        assert_eq!(p.index_write(true), IndexWrite::Put, "metadata kept fresh");
        succeeded(&mut op);
        let c = op.claim(5_000, 600_000).unwrap();
        assert!(project(&op, 100).open, "terminal, effect in flight");
        op.finish(c.token, &AttemptOutcome::Delivered, 6_000, 0);
        let p = project(&op, 100);
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
        assert!(!project(&op, 100).open);
    }

    #[test]
    fn metadata_keeps_the_kind_unless_it_would_escape_long() {
        let op = Operation::register("batches/a", "batches/a", Some("nightly".into()), 1_000);
        assert_eq!(project(&op, 1).metadata.kind.as_deref(), Some("nightly"));
        let op = Operation::register("batches/a", "batches/a", Some("\u{1}".repeat(100)), 1_000);
        assert_eq!(project(&op, 1).metadata.kind, None);
    }

    #[test]
    fn metadata_keeps_a_bounded_error_while_the_effect_is_not_done() {
        let mut op = Operation::register("batches/p", "batches/p", None, 1_000);
        succeeded(&mut op);
        let c = op.claim(5_000, 600_000).unwrap();
        op.finish(
            c.token,
            &AttemptOutcome::Retry("503: down".into()),
            6_000,
            0,
        );
        assert_eq!(project(&op, 1).metadata.error.as_deref(), Some("503: down"));
        let c = op.claim(7_000, 600_000).unwrap();
        let long = format!("400: {}", "\"\n\u{e9}".repeat(100));
        op.finish(c.token, &AttemptOutcome::Park(long), 8_000, 0);
        let error = project(&op, 1).metadata.error.unwrap();
        assert!(error.starts_with("400: \" \u{e9}"), "{error}");
        assert!(error.len() <= MAX_META_ERROR_BYTES);
        assert!(!error.chars().any(char::is_control));

        let mut done = Operation::register("batches/d", "batches/d", None, 1_000);
        succeeded(&mut done);
        let c = done.claim(5_000, 600_000).unwrap();
        done.finish(c.token, &AttemptOutcome::Delivered, 6_000, 0);
        assert_eq!(
            project(&done, 1).metadata.error,
            None,
            "done: nothing to group"
        );
    }

    #[test]
    fn an_entry_written_before_the_error_was_kept_still_reads() {
        let old = r#"{"status":"succeeded","name":"batches/a","submitted_at":1,"effect_done":false,"parked":true,"version":3}"#;
        let meta: LedgerMeta = serde_json::from_str(old).unwrap();
        assert_eq!(meta.error, None);
        assert_eq!(meta.effect_ms, None);
        assert!(meta.parked);
    }

    #[test]
    fn dead_keys_are_valid_kv_keys() {
        assert_eq!(dead_key("msg_abc"), "dead:msg_abc");
        let odd = dead_key(&"é/".repeat(400));
        assert!(odd.starts_with("dead:sha256-"));
        assert!(odd.len() < 512);
    }
}
