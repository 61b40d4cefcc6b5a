//! A batch's inline results, read from its status answer as a stream: each item becomes a
//! result to store as soon as it is read, and the answer is never held.
//!
//! Guarantees: fed the answer in chunks split anywhere, [`InlineRead`] hands out the same
//! items, each once, holding at most one item under [`LINE_CAP`], the chunk in hand, the
//! skimmed document (the file's name, the batch's times, a list's count) and 32 bytes an item
//! for their order ([`crate::results::keys::Place`]). An item is parsed on its own and its
//! `response` or `error` taken, never cloned; an item over [`LINE_CAP`] is never held: its
//! result is `unreadable` with its size, keyed by its `metadata.key` (else its bytes' hash).
//! Every way an answer cannot be read is a reason, never zero results: not JSON (an item
//! included), over [`INLINE_MAX_BYTES`] or [`INLINE_MAX_ITEMS`], a list that is not a list, two
//! lists that disagree, or an answer that names no results. Of the same list held twice
//! (`response` and `metadata.output`), the first read is stored, the other only checked.

use serde_json::{json, Value};

use crate::results::item::{payload_of, Payload, LINE_CAP};
use crate::results::keys::{inline_base, item_hash, key_text, Place};
use crate::results::source::{ended_in_status, found_in_status, Found, INLINE_LISTS};
use crate::skim::{Body, Event, Rule, Skim};

/// Largest status answer read for its inline results: Gemini caps an inline batch's requests
/// at 20 MB, and its answer holds the responses twice (`response` and `metadata.output`). A
/// larger one parks the results with that reason (and its alert), unread past the cap.
pub const INLINE_MAX_BYTES: u64 = 64 << 20;
/// Most inline items read: their order takes 32 bytes each (6.4 MB at the cap), and each is
/// a stored row. More parks the results with that reason.
pub const INLINE_MAX_ITEMS: u64 = 200_000;

/// What the skimmer keeps of the answer: the results file's name, the batch's times, and
/// each inline list's items (rule `FIRST_LIST + i` is `INLINE_LISTS[i]`).
const RULES: &[Rule] = &[
    Rule::Keep("response.responsesFile"),
    Rule::Keep("metadata.output.responsesFile"),
    Rule::Keep("metadata.endTime"),
    Rule::Keep("metadata.updateTime"),
    Rule::Each("response.inlinedResponses.inlinedResponses"),
    Rule::Each("response.inlinedEmbedContentResponses.inlinedResponses"),
    Rule::Each("metadata.output.inlinedResponses.inlinedResponses"),
    Rule::Each("metadata.output.inlinedEmbedContentResponses.inlinedResponses"),
];
const FIRST_LIST: usize = 4;
/// What is kept of an item over the cap: its key.
const KEY_ONLY: &[Rule] = &[Rule::Keep("metadata.key")];

/// One inline item, to store as it is read.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Its place in the answer's list (where it is stored).
    pub seq: u64,
    /// `metadata.key`, when the request had one.
    pub key: Option<String>,
    /// The hash of its content (hex, 16 characters).
    pub hash: String,
    pub payload: Payload,
}

impl Entry {
    /// Its key before it is made distinct ([`crate::results::keys::inline_order`]).
    pub fn base(&self) -> String {
        inline_base(self.key.as_deref(), &self.hash)
    }
}

/// What was seen of one inline list.
#[derive(Debug, Clone, Copy, Default)]
struct List {
    array: bool,
    count: u64,
    /// The items' hashes summed: the same for the same items in any order.
    digest: u64,
}

/// What an answer said, once read to its end.
#[derive(Debug, Clone, PartialEq)]
pub struct Located {
    pub found: Found,
    /// When the batch ended (`metadata.endTime`, else `updateTime`).
    pub ended_ms: Option<i64>,
    /// The stored items' places (none unless `found` is inline).
    pub places: Vec<Place>,
}

/// The reader: [`InlineRead::feed`] each chunk (store what it hands out), then
/// [`InlineRead::finish`].
#[derive(Debug)]
pub struct InlineRead {
    skim: Skim,
    lists: [List; 4],
    /// The list whose items are stored: the first one read.
    stored: Option<usize>,
    places: Vec<Place>,
}

impl Default for InlineRead {
    fn default() -> Self {
        InlineRead {
            skim: Skim::new(RULES).with_elements(LINE_CAP, KEY_ONLY),
            lists: [List::default(); 4],
            stored: None,
            places: Vec::new(),
        }
    }
}

impl InlineRead {
    /// Takes the next chunk of the answer: the items it completed, to store now; or why the
    /// answer cannot be read (stop reading).
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Vec<Entry>, String> {
        if self.skim.bytes_read() + chunk.len() as u64 > INLINE_MAX_BYTES {
            return Err(format!(
                "status answer is larger than {} MiB: its inline results are not read",
                INLINE_MAX_BYTES >> 20
            ));
        }
        self.skim.feed(chunk).map_err(not_json)?;
        let mut entries = Vec::new();
        for event in self.skim.take_events() {
            match event {
                Event::Array { rule } => {
                    let list = &mut self.lists[rule - FIRST_LIST];
                    if list.array {
                        let name = INLINE_LISTS[rule - FIRST_LIST];
                        return Err(format!("status answer repeats {name}"));
                    }
                    list.array = true;
                }
                Event::Element { rule, body } => {
                    entries.extend(self.item(rule - FIRST_LIST, body)?);
                }
            }
        }
        Ok(entries)
    }

    /// One item of list `at`: its entry when that list is the one stored.
    fn item(&mut self, at: usize, body: Body) -> Result<Option<Entry>, String> {
        let list = &mut self.lists[at];
        let seq = list.count;
        list.count += 1;
        if list.count > INLINE_MAX_ITEMS {
            return Err(format!(
                "status answer holds more than {INLINE_MAX_ITEMS} inline responses"
            ));
        }
        let (key, hash, payload) = read_item(seq, body)?;
        let summed = u64::from_str_radix(&hash, 16).unwrap_or_default();
        list.digest = list.digest.wrapping_add(summed);
        if *self.stored.get_or_insert(at) != at {
            return Ok(None);
        }
        let entry = Entry {
            seq,
            key,
            hash,
            payload,
        };
        self.places
            .push(Place::new(&entry.base(), &entry.hash, seq));
        Ok(Some(entry))
    }

    /// The answer ended: where its results are, or why they cannot be read.
    pub fn finish(self) -> Result<Located, String> {
        let skimmed = self.skim.finish().map_err(not_json)?;
        let doc: Value =
            serde_json::from_str(&skimmed.json).map_err(|e| not_json(e.to_string()))?;
        let mut located = Located {
            ended_ms: ended_in_status(&doc),
            found: found_in_status(&doc)?,
            places: Vec::new(),
        };
        let Found::Inline { list, count } = located.found else {
            return Ok(located);
        };
        let (seen, name) = (self.lists[list], INLINE_LISTS[list]);
        if !seen.array {
            return Err(format!("status answer: {name} is a number, not a list"));
        }
        let stored = self.stored.map(|s| self.lists[s]);
        let same = stored.is_some_and(|s| (s.count, s.digest) == (seen.count, seen.digest));
        match (count, same) {
            (0, _) => {}
            (_, true) => located.places = self.places,
            (_, false) => {
                return Err(format!(
                "status answer's inline lists disagree: {name} holds {} items, not the ones read first",
                seen.count
            ))
            }
        }
        Ok(located)
    }
}

fn not_json(e: impl std::fmt::Display) -> String {
    format!("status answer is not JSON: {e}")
}

/// An item as a result: its `metadata.key`, its content hash, and its payload (`response` or
/// `error` taken out of it, never copied).
fn read_item(seq: u64, body: Body) -> Result<(Option<String>, String, Payload), String> {
    let unreadable =
        |why: &str, size: u64| Payload::Unreadable(json!({"reason": why, "size": size}));
    match body {
        Body::Whole(bytes) => {
            let item: Value = serde_json::from_slice(&bytes)
                .map_err(|e| not_json(format!("inline item {seq}: {e}")))?;
            let key = key_text(item.get("metadata").and_then(|m| m.get("key")));
            let hash = item_hash(&item);
            let size = bytes.len() as u64;
            drop(bytes);
            let payload = payload_of(item, |why| unreadable(why, size));
            Ok((key, hash, payload))
        }
        Body::TooLarge { size, sha256, kept } => {
            let kept = kept.map_err(|e| not_json(format!("inline item {seq}: {e}")))?;
            let kept: Value = serde_json::from_str(&kept).unwrap_or_default();
            let key = key_text(kept.pointer("/metadata/key"));
            // Kept whole it would pass a stored row's 2 MB; the destination can read it from
            // the batch's status answer by its key.
            let payload = unreadable("item over the size cap", size);
            Ok((key, crate::hex(&sha256, 8), payload))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Reads `body` in pieces cut at `cuts`: the entries, then where the results are.
    fn read(body: &[u8], cuts: &[usize]) -> (Vec<Entry>, Result<Located, String>) {
        let mut r = InlineRead::default();
        let mut entries = Vec::new();
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
        points.sort_unstable();
        let mut at = 0;
        for p in points.into_iter().chain([body.len()]) {
            match r.feed(&body[at..p]) {
                Ok(e) => entries.extend(e),
                Err(why) => return (entries, Err(why)),
            }
            at = p;
        }
        (entries, r.finish())
    }

    fn batch(items: &Value, twice: bool) -> String {
        let meta = match twice {
            true => json!({"endTime": "2026-01-02T00:00:00Z",
                "output": {"inlinedResponses": {"inlinedResponses": items}}}),
            false => json!({"endTime": "2026-01-02T00:00:00Z"}),
        };
        json!({"name": "batches/b", "done": true, "metadata": meta,
            "response": {"@type": "x", "inlinedResponses": {"inlinedResponses": items}}})
        .to_string()
    }

    fn items(n: usize) -> Value {
        (0..n)
            .map(|i| match i % 3 {
                0 => json!({"response": {"text": format!("é\"\\😀 {i}")}, "metadata": {"key": format!("k{i}")}}),
                1 => json!({"error": {"code": 3, "message": format!("bad {i}")}}),
                _ => json!({"response": {"text": "same"}}),
            })
            .collect()
    }

    #[test]
    fn each_item_is_read_once_with_its_payload_and_key() {
        let body = batch(&items(6), true);
        let (entries, located) = read(body.as_bytes(), &[]);
        let located = located.unwrap();
        assert_eq!(located.found, Found::Inline { list: 0, count: 6 });
        assert_eq!(located.ended_ms, Some(1_767_312_000_000));
        assert_eq!(entries.len(), 6, "the second list is checked, not stored");
        assert_eq!(located.places.len(), 6);
        assert_eq!(entries[0].key.as_deref(), Some("k0"));
        assert_eq!(
            entries[0].payload,
            Payload::Response(json!({"text": "é\"\\😀 0"}))
        );
        assert_eq!(
            entries[1].payload,
            Payload::Error(json!({"code": 3, "message": "bad 1"}))
        );
        assert_eq!(entries[2].key, None);
        assert_eq!(
            entries[2].hash,
            item_hash(&json!({"response": {"text": "same"}}))
        );
    }

    #[test]
    fn chunks_split_anywhere_read_the_same() {
        let body = batch(&items(5), true);
        let whole = read(body.as_bytes(), &[]);
        for size in [1, 2, 3, 5, 7, 64] {
            let cuts: Vec<usize> = (1..body.len() / size + 1).map(|i| i * size).collect();
            assert_eq!(read(body.as_bytes(), &cuts), whole, "chunks of {size}");
        }
    }

    #[test]
    fn a_file_wins_and_no_results_is_a_reason_never_zero() {
        let file = json!({"response": {"responsesFile": "files/out"}}).to_string();
        let (entries, located) = read(file.as_bytes(), &[]);
        assert!(entries.is_empty());
        assert_eq!(located.unwrap().found, Found::File("files/out".into()));
        let (_, none) = read(br#"{"response":{}}"#, &[]);
        assert!(none.unwrap_err().contains("names neither"));
        let (_, empty) = read(batch(&json!([]), false).as_bytes(), &[]);
        assert_eq!(empty.unwrap().found, Found::Inline { list: 0, count: 0 });
        let number = br#"{"response":{"inlinedResponses":{"inlinedResponses":4}}}"#;
        assert!(read(number, &[]).1.unwrap_err().contains("not a list"));
    }

    #[test]
    fn malformed_answers_are_refused_with_a_reason() {
        for (body, why) in [
            (
                r#"{"response":{"inlinedResponses":{"inlinedResponses":[{"response":{}},{"response":]}}}"#,
                "inline item 1",
            ),
            (
                r#"{"response":{"inlinedResponses":{"inlinedResponses":[{"response":{}},]}}}"#,
                "inline item 1",
            ),
            (
                r#"{"response":{"inlinedResponses":{"inlinedResponses":[{"response":{}}]}}"#,
                "not JSON",
            ),
            (
                r#"{"response":{"inlinedResponses":{"inlinedResponses":[{"response":"\x"}]}}}"#,
                "inline item 0",
            ),
            ("<html>", "not JSON"),
        ] {
            let (_, located) = read(body.as_bytes(), &[]);
            let err = located.unwrap_err();
            assert!(err.starts_with("status answer"), "{err}");
            assert!(err.contains(why), "{body}: {err}");
        }
    }

    #[test]
    fn lists_that_disagree_are_refused() {
        let a = json!([{"response": {"t": 1}}, {"response": {"t": 2}}]);
        let b = json!([{"response": {"t": 2}}, {"response": {"t": 1}}]);
        let body = json!({"metadata": {"output": {"inlinedResponses": {"inlinedResponses": a}}},
            "response": {"inlinedResponses": {"inlinedResponses": b}}})
        .to_string();
        assert!(
            read(body.as_bytes(), &[]).1.is_ok(),
            "the same items in another order"
        );
        let c = json!([{"response": {"t": 2}}, {"response": {"t": 3}}]);
        let body = json!({"metadata": {"output": {"inlinedResponses": {"inlinedResponses": a}}},
            "response": {"inlinedResponses": {"inlinedResponses": c}}})
        .to_string();
        assert!(read(body.as_bytes(), &[])
            .1
            .unwrap_err()
            .contains("disagree"));
    }

    #[test]
    fn an_item_over_the_cap_keeps_its_key_and_size_not_its_bytes() {
        let big = json!({"metadata": {"key": "img"}, "response": {"data": "x".repeat(LINE_CAP)}});
        let size = big.to_string().len() as u64;
        let body = batch(&json!([big, {"response": {"t": 1}}]), false);
        let (entries, located) = read(body.as_bytes(), &[100, 70_000, 1_000_000]);
        assert_eq!(located.unwrap().places.len(), 2);
        assert_eq!(entries[0].key.as_deref(), Some("img"));
        assert_eq!(
            entries[0].payload,
            Payload::Unreadable(json!({"reason": "item over the size cap", "size": size}))
        );
    }

    #[test]
    fn the_caps_park_with_their_reason() {
        let mut r = InlineRead::default();
        r.feed(b"[").unwrap();
        let filler = vec![b' '; 1 << 20];
        let mut last = Ok(Vec::new());
        for _ in 0..=(INLINE_MAX_BYTES >> 20) {
            last = r.feed(&filler);
            if last.is_err() {
                break;
            }
        }
        assert!(last.unwrap_err().contains("larger than 64 MiB"));
    }

    proptest! {
        #[test]
        fn any_split_gives_the_same_entries(n in 0usize..12, cuts in prop::collection::vec(any::<usize>(), 0..16)) {
            let body = batch(&items(n), true);
            prop_assert_eq!(read(body.as_bytes(), &cuts), read(body.as_bytes(), &[]));
        }
    }
}
