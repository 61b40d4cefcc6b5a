//! Counters for `GET /v1/stats`: names, hourly buckets, shards.
//!
//! Guarantees: delivery outcomes are counted exactly: the gate records each counted event in
//! its own record in the same write as the decision, with a per-operation sequence number, and
//! a stats shard adds a batch only if its sequence is past the highest one it has seen from
//! that operation, so a retried flush never counts twice. Rejected requests are counted per
//! isolate and flushed now and then (approximate, and never a storage round trip on the
//! rejected path). Counters are spread over [`SHARDS`] objects, so there is no global lock.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Stats shards; a gate always flushes to the same one (by key).
pub const SHARDS: u32 = 8;

/// Counter names. Dropped events count as `dropped_<reason>`, rejections as
/// `rejected_<reason>`.
pub const DELIVERIES: &str = "deliveries";
pub const DUPLICATES: &str = "duplicates_skipped";
pub const SETTLED_BY_WEBHOOK: &str = "settled_by_webhook";
pub const SETTLED_BY_RECONCILE: &str = "settled_by_reconcile";
pub const EFFECT_SUCCESSES: &str = "effect_successes";
pub const EFFECT_FAILURES: &str = "effect_failures";
pub const EFFECT_PARKS: &str = "effect_parks";
pub const ALERTS: &str = "alerts";
pub const REDELIVERIES: &str = "redeliveries";

/// One counted event awaiting its flush to a shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatEvent {
    pub seq: u64,
    pub name: String,
    pub at_ms: i64,
    /// How many occurrences this event stands for (a batch of rejections is one event).
    #[serde(default = "one")]
    pub count: u64,
}

fn one() -> u64 {
    1
}

/// Counter totals by name.
pub type Tally = BTreeMap<String, u64>;

/// How often a shard prunes old hourly buckets and dedupe marks.
pub const PRUNE_EVERY_MS: i64 = 3_600_000;

/// True when a shard that last pruned at `last_ms` should prune again (it starts at 0: the
/// first flush of an instance prunes).
pub fn prune_due(now_ms: i64, last_ms: i64) -> bool {
    now_ms.saturating_sub(last_ms) >= PRUNE_EVERY_MS
}

/// The hour bucket of a time.
pub fn hour_of(ms: i64) -> i64 {
    ms.div_euclid(3_600_000)
}

/// The shard an operation's counts go to.
pub fn shard_of(key: &str) -> u32 {
    let digest = Sha256::digest(key.as_bytes());
    u32::from_le_bytes([digest[0], digest[1], digest[2], digest[3]]) % SHARDS
}

/// Adds `other` into `into`.
pub fn merge(into: &mut Tally, other: &Tally) {
    for (name, n) in other {
        *into.entry(name.clone()).or_default() += n;
    }
}

/// The events of a batch a shard has not counted yet, given the highest sequence it saw.
pub fn unseen(events: &[StatEvent], seen_seq: u64) -> impl Iterator<Item = &StatEvent> {
    events.iter().filter(move |e| e.seq > seen_seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_prunes_on_its_first_flush_then_hourly() {
        let now = 1_795_000_000_000;
        assert!(prune_due(now, 0), "a new instance prunes");
        assert!(!prune_due(now, now));
        assert!(!prune_due(now + PRUNE_EVERY_MS - 1, now));
        assert!(prune_due(now + PRUNE_EVERY_MS, now));
        assert!(prune_due(now, i64::MIN), "no overflow whatever the mark");
    }

    fn ev(seq: u64, name: &str) -> StatEvent {
        StatEvent {
            seq,
            name: name.into(),
            at_ms: 0,
            count: 1,
        }
    }

    #[test]
    fn retried_batch_is_not_counted_twice() {
        let batch = vec![ev(1, DELIVERIES), ev(2, EFFECT_SUCCESSES)];
        assert_eq!(unseen(&batch, 0).count(), 2);
        assert_eq!(unseen(&batch, 2).count(), 0);
        let longer = vec![
            ev(1, DELIVERIES),
            ev(2, EFFECT_SUCCESSES),
            ev(3, DUPLICATES),
        ];
        let fresh: Vec<_> = unseen(&longer, 2).collect();
        assert_eq!(fresh, vec![&ev(3, DUPLICATES)]);
    }

    #[test]
    fn shards_are_stable_and_in_range() {
        assert_eq!(shard_of("batches/a"), shard_of("batches/a"));
        let used: std::collections::BTreeSet<u32> = (0..200)
            .map(|i| shard_of(&format!("batches/{i}")))
            .collect();
        assert!(used.iter().all(|s| *s < SHARDS));
        assert_eq!(used.len() as u32, SHARDS, "keys spread over every shard");
    }

    #[test]
    fn merge_adds_by_name() {
        let mut a = Tally::from([("x".to_string(), 1)]);
        merge(
            &mut a,
            &Tally::from([("x".to_string(), 2), ("y".to_string(), 5)]),
        );
        assert_eq!(a, Tally::from([("x".to_string(), 3), ("y".to_string(), 5)]));
    }

    #[test]
    fn hours_bucket_time() {
        assert_eq!(hour_of(0), 0);
        assert_eq!(hour_of(3_599_999), 0);
        assert_eq!(hour_of(3_600_000), 1);
    }
}
