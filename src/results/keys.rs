//! A result's `result_key`: the request's own key when it has one, a stable fallback when it
//! has none.
//!
//! Guarantees: a file's result keys are the same on every read of the file, as the requests
//! wrote them: two lines with the same key keep it, told apart by their `index` (unique in a
//! file, and part of each `webhook-id`), so reading needs no memory of the keys before. An
//! inline batch's keys are the same however its items come back, and distinct: items sharing a
//! key are ranked by content and take `#<rank>`, an item's index its place in the order of (its
//! key's hash, its content hash) ([`inline_order`]: 32 bytes an item, never the keys).

use std::collections::BTreeSet;

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The result key of the file's line at `index` whose request key is `key`: the key as it
/// is, or `line-<index>` for a line without one.
pub fn file_result_key(key: Option<&str>, index: u64) -> String {
    key.map_or_else(|| format!("line-{index}"), str::to_string)
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
/// position the item came back in. Written into the hash, never into a string.
pub fn item_hash(item: &Value) -> String {
    let mut hasher = Sha256::new();
    // Writing into a hasher cannot fail.
    let _ = serde_json::to_writer(&mut hasher, item);
    crate::hex(&hasher.finalize(), 8)
}

/// An inline item's key before it is made distinct: the request's key, else `inline-{hash}`.
pub fn inline_base(key: Option<&str>, hash: &str) -> String {
    key.map_or_else(|| format!("inline-{hash}"), str::to_string)
}

/// Where an inline item goes in the results' order, in 32 bytes, so a batch's whole order is
/// held without its keys: the hash of its base key ([`inline_base`]), its content hash, and
/// where its item is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Place {
    pub base_hash: [u8; 16],
    pub hash: u64,
    pub seq: u64,
}

impl Place {
    /// The place of the item stored at `seq` with this base key and content hash (hex).
    pub fn new(base: &str, hash: &str, seq: u64) -> Place {
        Place {
            base_hash: base_hash(base),
            hash: u64::from_str_radix(hash, 16).unwrap_or_default(),
            seq,
        }
    }
}

fn base_hash(base: &str) -> [u8; 16] {
    let digest = Sha256::digest(base.as_bytes());
    digest[..16].try_into().expect("16 of its 32 bytes")
}

/// An inline batch's order: for each index, the stored item's `seq` and the suffix its key
/// takes (`""`, or `#<rank>`, repeated while the key is taken). Items are ordered by (base
/// key's hash, content hash), never by how they came back, so index and key are the same on
/// every read; items sharing a base key are ranked by content. A suffixed key is distinct
/// from every base key and every other suffixed key. Equal items are interchangeable, so
/// which of them takes which rank does not matter. `base_of(seq)` gives a stored item's base
/// key (asked only for an item whose base repeats).
pub fn inline_order<E>(
    mut places: Vec<Place>,
    mut base_of: impl FnMut(u64) -> Result<String, E>,
) -> Result<Vec<(u64, String)>, E> {
    places.sort_unstable();
    let mut suffixed = BTreeSet::new();
    let mut out = Vec::with_capacity(places.len());
    let mut rank = 0;
    for (i, place) in places.iter().enumerate() {
        let repeated = i > 0 && places[i - 1].base_hash == place.base_hash;
        rank = if repeated { rank + 1 } else { 1 };
        if rank == 1 {
            out.push((place.seq, String::new()));
            continue;
        }
        let base = base_of(place.seq)?;
        let mut suffix = format!("#{rank}");
        loop {
            let h = base_hash(&format!("{base}{suffix}"));
            let is_base = places.binary_search_by(|p| p.base_hash.cmp(&h)).is_ok();
            if !is_base && suffixed.insert(h) {
                break;
            }
            suffix.push_str(&format!("#{rank}"));
        }
        out.push((place.seq, suffix));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keyed_line_keeps_its_key_and_a_keyless_one_takes_its_index() {
        assert_eq!(file_result_key(Some("req-1"), 0), "req-1");
        assert_eq!(file_result_key(None, 1), "line-1");
    }

    #[test]
    fn a_repeated_key_is_kept_as_written() {
        assert_eq!(file_result_key(Some("a"), 0), file_result_key(Some("a"), 7));
    }

    /// The keys of `items` (base key, content hash) in their order, as a map seq -> key.
    fn keys(items: &[(Option<&str>, &str)]) -> Vec<(String, u64)> {
        let places = items
            .iter()
            .enumerate()
            .map(|(seq, (k, h))| Place::new(&inline_base(*k, h), h, seq as u64))
            .collect();
        let order = inline_order(places, |seq| {
            let (k, h) = items[seq as usize];
            Ok::<_, ()>(inline_base(k, h))
        })
        .unwrap();
        order
            .into_iter()
            .enumerate()
            .map(|(index, (seq, suffix))| {
                let (k, h) = items[seq as usize];
                (format!("{}{suffix}", inline_base(k, h)), index as u64)
            })
            .collect()
    }

    #[test]
    fn inline_keys_and_indexes_do_not_depend_on_order() {
        let items = [
            (None, "00000000000000a1"),
            (Some("k"), "00000000000000a2"),
            (None, "00000000000000a1"),
            (Some("k"), "00000000000000a3"),
            (Some("k#2"), "00000000000000a4"),
        ];
        let mut first = keys(&items);
        let mut reversed = items;
        reversed.reverse();
        let mut again = keys(&reversed);
        first.sort();
        again.sort();
        assert_eq!(first, again, "the same keys at the same indexes");
        let names: BTreeSet<&str> = first.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names.len(), 5, "distinct");
        assert!(names.contains("k") && names.contains("k#2"));
        assert!(
            names.contains("k#2#2"),
            "a suffix never takes a request's key"
        );
        assert!(names.contains("inline-00000000000000a1#2"));
        let indexes: BTreeSet<u64> = first.iter().map(|(_, i)| *i).collect();
        assert_eq!(indexes, (0..5).collect());
    }

    #[test]
    fn an_items_hash_is_its_canonical_json() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":[2]}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{ "a" : [2], "b" : 1 }"#).unwrap();
        assert_eq!(item_hash(&a), item_hash(&b));
        assert_eq!(
            item_hash(&a),
            crate::hex(&Sha256::digest(a.to_string().as_bytes()), 8)
        );
    }

    #[test]
    fn key_text_reads_strings_and_other_values() {
        assert_eq!(key_text(Some(&Value::from("a"))), Some("a".into()));
        assert_eq!(key_text(Some(&Value::from(7))), Some("7".into()));
        assert_eq!(key_text(Some(&Value::Null)), None);
        assert_eq!(key_text(None), None);
    }
}
