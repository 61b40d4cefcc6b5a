//! A result's `result_key`: the request's own key when it has one, a stable fallback when it
//! has none.
//!
//! Guarantees: a file's result keys are the same on every read of the same file (its order is
//! fixed), and are the keys as the requests wrote them: two lines with the same key keep it,
//! told apart by their `index` (unique in a file, and part of each result's `webhook-id`), so
//! reading a file needs no memory of the keys before. An inline batch's result keys are the
//! same however its items are ordered on a later read, and distinct: items sharing a key are
//! ranked by their content and take `#<rank>`, since an inline item's index is its place in
//! the order of its key.

use std::collections::BTreeSet;

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The result key of the file's line at `index` whose request key is `key`: the key as it
/// is, or `line-<index>` for a line without one.
pub fn file_result_key(key: Option<&str>, index: u64) -> String {
    match key {
        Some(k) => k.to_string(),
        None => format!("line-{index}"),
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
        assert_eq!(file_result_key(Some("req-1"), 0), "req-1");
        assert_eq!(file_result_key(None, 1), "line-1");
    }

    #[test]
    fn a_repeated_key_is_kept_as_written() {
        assert_eq!(file_result_key(Some("a"), 0), file_result_key(Some("a"), 7));
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
