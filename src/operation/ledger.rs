//! The KV ledger: a listing of operations for the reconciliation pass, never a source of truth.
//!
//! Layout: `op:<key>` holds the operation's public JSON view; its metadata ([`LedgerMeta`]) holds
//! what the pass decides on, so it reads no value for entries needing no work. `open:<key>` is the
//! index of what may need work ([`may_need_work`]): an empty value with the same metadata, written
//! with every projection while the operation may need work and deleted with the projection that
//! closes it, so the routine pass lists open operations only. It is a hint like the rest: a lost
//! put is found by the daily audit over `op:`, a lost delete costs a harmless trip through the gate
//! (and is repaired by the audit). `dead:<webhook-id>` holds a signed delivery that could not be
//! used, for inspection. Guarantees: metadata stays far under KV's 1024-byte limit (names are at
//! most 400 bytes); an entry gets an expiration only once its operation is terminal and its side
//! effect done or parked, so open records never expire. KV is eventually consistent and
//! last-write-wins: the gate writes a projection tagged with its version, and a stale one only
//! costs a redundant, harmless trip through the gate.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::operation::alert::AlertKind;
use crate::operation::lifecycle::Status;

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
        let hex = crate::hex(&Sha256::digest(webhook_id.as_bytes()), 32);
        format!("{DEAD_PREFIX}sha256-{hex}")
    }
}

/// True when the cron pass ([`crate::reconciliation::entry_decision::decide`]) may return an action for this metadata now or later: the operation
/// belongs in the `open:` index. Not forgotten, and either not terminal (polled once past the
/// grace; an unknown status is never acted on) or terminal with the side effect neither done
/// nor parked (retried), or parked with its `effect_failing` alert not yet raised. Alerts the
/// gate has queued are its own alarm's business, not the pass's.
pub fn may_need_work(meta: &LedgerMeta) -> bool {
    if meta.forgotten {
        return false;
    }
    if meta.status.is_terminal() {
        !meta.effect_done && (!meta.parked || !meta.alerts.contains(&AlertKind::EffectFailing))
    } else {
        meta.status.rank() >= 0
    }
}

/// What the `open:` index holds, counted from its entries' metadata when a pass lists it
/// whole (served as `/metrics` gauges): operations not terminal, those of them alerted
/// `stuck`, and terminal ones whose side effect is not done. An entry forgotten by an operator
/// counts nowhere, nor does one whose effect is done (an index entry left behind). A parked
/// effect is not among them: parking raises its `effect_failing` alert in the same step, and
/// that takes it out of the index ([`may_need_work`]); the parks are counted as they happen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct OpenCounts {
    pub operations: u64,
    pub stuck: u64,
    pub effects_not_done: u64,
}

impl OpenCounts {
    /// The counts of `entries`, each an index entry's metadata.
    pub fn of<'a>(entries: impl IntoIterator<Item = &'a LedgerMeta>) -> OpenCounts {
        let mut counts = OpenCounts::default();
        for meta in entries.into_iter().filter(|m| !m.forgotten) {
            if !meta.status.is_terminal() {
                counts.operations += 1;
                counts.stuck += u64::from(meta.alerts.contains(&AlertKind::Stuck));
            } else if !meta.effect_done {
                counts.effects_not_done += 1;
            }
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_counts_split_the_index_by_what_each_entry_waits_for() {
        let with = |status: &str, edit: fn(&mut LedgerMeta)| {
            let mut m = LedgerMeta::sample(status);
            edit(&mut m);
            m
        };
        let entries = [
            with("pending", |_| {}),
            with("running", |m| m.alerts = vec![AlertKind::Stuck]),
            with("running", |m| m.alerts = vec![AlertKind::UnknownToGemini]),
            with("succeeded", |_| {}),
            with("failed", |m| m.parked = true),
            with("failed", |m| {
                m.parked = true;
                m.alerts = vec![AlertKind::EffectFailing];
            }),
            with("succeeded", |m| m.effect_done = true),
            with("running", |m| m.forgotten = true),
            with("expired", |m| {
                m.parked = true;
                m.forgotten = true;
            }),
        ];
        assert_eq!(
            OpenCounts::of(&entries),
            OpenCounts {
                operations: 3,
                stuck: 1,
                effects_not_done: 3,
            },
            "a done effect (a stale entry) and a forgotten operation count nowhere"
        );
        assert_eq!(OpenCounts::of(&[]), OpenCounts::default());
        let listed: Vec<LedgerMeta> = entries
            .iter()
            .filter(|m| may_need_work(m))
            .cloned()
            .collect();
        assert_eq!(
            OpenCounts::of(&listed).effects_not_done,
            2,
            "a parked effect alerted effect_failing is not in the index to be counted"
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
