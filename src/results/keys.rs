//! A result's `result_key`: the request's own key when it has one, a stable fallback when it
//! has none, and distinct for every result of one operation.
//!
//! Guarantees: a file's result keys are the same on every read of the same file (its order is
//! fixed), including a read resumed from a checkpoint with the [`KeysSeen`] stored beside it;
//! an inline batch's result keys are the same however its items are ordered on a later read.
//! No two results of one operation share a key: a key already taken gets `#` and the line's
//! index (file) or its rank (inline) appended until it is free.
//!
//! A file's keys are checked against [`KeysSeen`], a Bloom filter of fixed size, so memory
//! does not grow with the file. It has no false negatives (a repeated key is always caught);
//! a false positive only gives a first-seen key a suffix, the same one on every read, because
//! the filter is stored with each chunk checkpoint and rebuilt the same way.

use std::collections::BTreeSet;

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Bytes of the filter: 8 Mi bits. With five probes a key, about 2% of first-seen keys near
/// the end of a million-line file take a suffix they did not need; 1 MiB stays under a
/// Durable Object SQLite row's 2 MB, so the filter is one row.
pub const KEYS_SEEN_BYTES: usize = 1 << 20;
/// Probes per key: near the best for a million keys in 8 Mi bits.
const HASHES: usize = 5;

/// The keys a file's results have taken so far, as a Bloom filter.
#[derive(Clone, PartialEq, Eq)]
pub struct KeysSeen {
    bits: Vec<u8>,
}

impl std::fmt::Debug for KeysSeen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = self.bits.iter().map(|b| b.count_ones()).sum::<u32>();
        write!(f, "KeysSeen({set} bits set)")
    }
}

impl Default for KeysSeen {
    fn default() -> Self {
        KeysSeen {
            bits: vec![0; KEYS_SEEN_BYTES],
        }
    }
}

impl KeysSeen {
    /// The filter as stored; [`KeysSeen::from_bytes`] reads it back.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bits
    }

    /// A stored filter; `None` when it is not one (wrong size).
    pub fn from_bytes(bytes: Vec<u8>) -> Option<KeysSeen> {
        (bytes.len() == KEYS_SEEN_BYTES).then_some(KeysSeen { bits: bytes })
    }

    fn probes(key: &str) -> [usize; HASHES] {
        let digest = Sha256::digest(key.as_bytes());
        let bits = KEYS_SEEN_BYTES * 8;
        std::array::from_fn(|i| {
            let word: [u8; 4] = digest[i * 4..i * 4 + 4].try_into().unwrap_or([0; 4]);
            u32::from_le_bytes(word) as usize % bits
        })
    }

    fn contains(&self, key: &str) -> bool {
        Self::probes(key)
            .iter()
            .all(|bit| self.bits[bit / 8] & (1 << (bit % 8)) != 0)
    }

    fn insert(&mut self, key: &str) {
        for bit in Self::probes(key) {
            self.bits[bit / 8] |= 1 << (bit % 8);
        }
    }

    /// The result key of the file's line at `index` whose request key is `key`.
    pub fn take(&mut self, key: Option<&str>, index: u64) -> String {
        let mut candidate = match key {
            Some(k) => k.to_string(),
            None => format!("line-{index}"),
        };
        while self.contains(&candidate) {
            candidate = format!("{candidate}#{index}");
        }
        self.insert(&candidate);
        candidate
    }
}

/// A request key as a string: a JSON string as it is, any other value (but null) as its JSON.
pub fn key_text(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// The hash of an inline item's canonical JSON (keys sorted), in hex: the same whatever
/// position the item came back in.
pub fn item_hash(item: &Value) -> String {
    let digest = Sha256::digest(item.to_string().as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Result keys for an inline batch's items, in the items' order: `metadata.key` when given,
/// else `inline-{hash}`; items sharing a key are ranked by their content hash, so the ranks
/// (and the `#n` suffixes) do not depend on the order the items came in. Equal items are
/// interchangeable, so which of them takes which rank does not matter.
pub fn inline_keys(items: &[(Option<String>, String)]) -> Vec<String> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    let base = |i: usize| -> String {
        let (key, hash) = &items[i];
        key.clone().unwrap_or_else(|| format!("inline-{hash}"))
    };
    order.sort_by(|a, b| (base(*a), &items[*a].1).cmp(&(base(*b), &items[*b].1)));
    let mut taken = BTreeSet::new();
    let mut keys = vec![String::new(); items.len()];
    let mut rank = 0;
    let mut previous: Option<String> = None;
    for i in order {
        let mut candidate = base(i);
        rank = if previous.as_deref() == Some(candidate.as_str()) {
            rank + 1
        } else {
            1
        };
        previous = Some(candidate.clone());
        if taken.contains(&candidate) {
            candidate = format!("{candidate}#{rank}");
        }
        while taken.contains(&candidate) {
            candidate = format!("{candidate}#{rank}");
        }
        taken.insert(candidate.clone());
        keys[i] = candidate;
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keyed_line_keeps_its_key_and_a_keyless_one_takes_its_index() {
        let mut seen = KeysSeen::default();
        assert_eq!(seen.take(Some("req-1"), 0), "req-1");
        assert_eq!(seen.take(None, 1), "line-1");
    }

    #[test]
    fn repeated_keys_are_told_apart_by_index_and_never_collide() {
        let mut seen = KeysSeen::default();
        let keys = [
            seen.take(Some("a"), 0),
            seen.take(Some("a"), 1),
            seen.take(Some("a#1"), 2),
            seen.take(Some("line-4"), 3),
            seen.take(None, 4),
        ];
        assert_eq!(keys, ["a", "a#1", "a#1#2", "line-4", "line-4#4"]);
    }

    #[test]
    fn a_stored_filter_resumes_with_the_same_keys() {
        let mut seen = KeysSeen::default();
        seen.take(Some("a"), 0);
        let stored = seen.as_bytes().to_vec();
        let mut resumed = KeysSeen::from_bytes(stored).unwrap();
        assert_eq!(resumed.take(Some("a"), 1), seen.take(Some("a"), 1));
        assert!(KeysSeen::from_bytes(vec![0; 3]).is_none());
    }

    #[test]
    fn distinct_keys_rarely_take_a_suffix() {
        // 300,000 keys keep the host run short; a million stay under 2% (checked once).
        let mut seen = KeysSeen::default();
        let n = 300_000u64;
        let suffixed = (0..n)
            .filter(|i| seen.take(Some(&format!("request-{i}")), *i).contains('#'))
            .count();
        assert!(suffixed < (n / 1_000) as usize, "{suffixed} of {n}");
    }

    #[test]
    fn inline_keys_do_not_depend_on_order() {
        let items = vec![
            (None, "h1".to_string()),
            (Some("k".to_string()), "h2".to_string()),
            (None, "h1".to_string()),
            (Some("k".to_string()), "h3".to_string()),
        ];
        let keys = inline_keys(&items);
        let mut reversed = items.clone();
        reversed.reverse();
        let mut again = inline_keys(&reversed);
        again.reverse();
        assert_eq!(keys[1], again[1]);
        assert_eq!(keys[3], again[3]);
        assert_eq!(keys[1], "k");
        assert_eq!(keys[3], "k#2");
        let mut equal = [keys[0].clone(), keys[2].clone()];
        equal.sort();
        assert_eq!(equal, ["inline-h1", "inline-h1#2"]);
        let distinct: BTreeSet<&String> = keys.iter().collect();
        assert_eq!(distinct.len(), 4);
    }

    #[test]
    fn key_text_reads_strings_and_other_values() {
        assert_eq!(key_text(Some(&Value::from("a"))), Some("a".into()));
        assert_eq!(key_text(Some(&Value::from(7))), Some("7".into()));
        assert_eq!(key_text(Some(&Value::Null)), None);
        assert_eq!(key_text(None), None);
    }
}
