//! The elements of the arrays a [`Rule::Each`] names, handed out one by one as the skimmer
//! reads past them: how a batch's inline results are read from a status answer of any size
//! without holding it.
//!
//! Guarantees: an element is handed out whole (its bytes as they were written) when it is
//! within the cap; past the cap it is never held: it is handed out as its size, the SHA-256
//! of its bytes, and what a second skimmer keeps of it ([`Elements::new`]'s rules), and the
//! bytes held for it never pass the cap plus [`FLUSH_BYTES`]. Where the chunks split (inside
//! a string, an escape, a character) changes nothing. Elements are found by brackets and
//! strings only, so an element is not checked here: its reader parses it, and an empty one
//! (`[1,,2]`, `[1,]`) is handed out empty, for the reader to refuse.

use sha2::{Digest, Sha256};

use crate::reconciliation::skim::{Rule, Skim};

/// Bytes of an element over the cap gathered before they go to its hash and skimmer.
pub const FLUSH_BYTES: usize = 64 * 1024;

/// An element, as it is handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// Its bytes, within the cap.
    Whole(Vec<u8>),
    /// Over the cap: its size, the SHA-256 of its bytes, and what the over-cap skimmer kept
    /// of it (its reduced JSON), or why it could not.
    TooLarge {
        size: u64,
        sha256: [u8; 32],
        kept: Result<String, String>,
    },
}

/// What the skimmer met at a [`Rule::Each`] path, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// An array starts at the path of the rule at this index.
    Array { rule: usize },
    /// One of its elements.
    Element { rule: usize, body: Body },
}

/// The part over the cap of an element being read.
#[derive(Debug, Clone)]
struct Over {
    sha256: Sha256,
    kept: Box<Skim>,
}

/// The element being read.
#[derive(Debug, Clone, Default)]
struct Capture {
    bytes: Vec<u8>,
    size: u64,
    over: Option<Over>,
}

/// The skimmer's side for [`Rule::Each`]: the events not yet taken, the element being read.
#[derive(Debug, Clone, Default)]
pub struct Elements {
    cap: usize,
    over_rules: &'static [Rule],
    events: Vec<Event>,
    open: Option<Capture>,
    /// Whether the array being read had a separator (so `[1,]` ends with an empty element).
    separated: bool,
}

impl Elements {
    /// Elements within `cap` bytes handed out whole; larger ones skimmed with `over_rules`.
    pub fn new(cap: usize, over_rules: &'static [Rule]) -> Elements {
        Elements {
            cap,
            over_rules,
            ..Elements::default()
        }
    }

    /// What was met since the last call.
    pub fn take(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// An array at the rule's path starts.
    pub(crate) fn array(&mut self, rule: usize) {
        self.events.push(Event::Array { rule });
        self.open = None;
        self.separated = false;
    }

    /// One byte of the array, with the skipper's state before it: `depth` 1 is the array's
    /// own level.
    pub(crate) fn byte(&mut self, rule: usize, b: u8, depth: u64, in_str: bool) {
        if depth >= 2 || in_str {
            return self.keep(b);
        }
        match b {
            b',' => {
                self.separated = true;
                self.close(rule);
            }
            b']' | b'}' => {
                if self.open.is_some() || self.separated {
                    self.close(rule);
                }
            }
            b' ' | b'\t' | b'\n' | b'\r' if self.open.is_none() => {}
            _ => self.keep(b),
        }
    }

    fn keep(&mut self, b: u8) {
        let capture = self.open.get_or_insert_with(Capture::default);
        capture.bytes.push(b);
        capture.size += 1;
        let full = match capture.over {
            Some(_) => capture.bytes.len() >= FLUSH_BYTES,
            None => capture.bytes.len() > self.cap,
        };
        if full {
            let over = capture.over.get_or_insert_with(|| Over {
                sha256: Sha256::new(),
                kept: Box::new(Skim::new(self.over_rules)),
            });
            over.sha256.update(&capture.bytes);
            // An error stays in the skimmer and is told when the element ends.
            let _ = over.kept.feed(&capture.bytes);
            capture.bytes.clear();
        }
    }

    fn close(&mut self, rule: usize) {
        let capture = self.open.take().unwrap_or_default();
        let body = match capture.over {
            None => Body::Whole(capture.bytes),
            Some(mut over) => {
                over.sha256.update(&capture.bytes);
                let fed = over.kept.feed(&capture.bytes);
                let kept = fed
                    .and_then(|_| over.kept.finish())
                    .map(|s| s.json)
                    .map_err(|e| e.to_string());
                Body::TooLarge {
                    size: capture.size,
                    sha256: over.sha256.finalize().into(),
                    kept,
                }
            }
        };
        self.events.push(Event::Element { rule, body });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconciliation::skim::Skim;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    const RULES: &[Rule] = &[
        Rule::Keep("done"),
        Rule::Each("response.list"),
        Rule::Each("metadata.list"),
    ];
    const KEY: &[Rule] = &[Rule::Keep("metadata.key")];

    /// Skims `body` in pieces cut at `cuts`: the events and the reduced document.
    fn read(body: &[u8], cuts: &[usize], cap: usize) -> (Vec<Event>, Result<String, String>) {
        let mut s = Skim::new(RULES).with_elements(cap, KEY);
        let mut events = Vec::new();
        let mut at = 0;
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
        points.sort_unstable();
        for p in points.into_iter().chain([body.len()]) {
            if s.feed(&body[at..p]).is_err() {
                break;
            }
            events.extend(s.take_events());
            at = p;
        }
        (
            events,
            s.finish().map(|d| d.json).map_err(|e| e.to_string()),
        )
    }

    fn wholes(events: &[Event]) -> Vec<Value> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Element {
                    body: Body::Whole(b),
                    ..
                } => Some(serde_json::from_slice(b).unwrap()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn each_element_is_handed_out_as_written_and_the_array_becomes_its_count() {
        let items = json!([{"response": {"t": "a\"]}"}}, "x", 3, [1, [2]], {"error": {}}]);
        let body = json!({"done": true, "response": {"list": items, "other": [1]}}).to_string();
        let (events, doc) = read(body.as_bytes(), &[], 1 << 20);
        assert_eq!(events[0], Event::Array { rule: 1 });
        assert_eq!(Value::Array(wholes(&events)), items);
        let doc: Value = serde_json::from_str(&doc.unwrap()).unwrap();
        assert_eq!(
            doc,
            json!({"done": true, "response": {"list": 5, "other": null}})
        );
    }

    #[test]
    fn an_element_over_the_cap_is_its_size_hash_and_kept_key_never_held() {
        let big = json!({"metadata": {"key": "img"}, "response": {"data": "é".repeat(200_000)}});
        let text = big.to_string();
        let body = format!(r#"{{"metadata":{{"list":[{text}, {{"response":{{}}}}]}}}}"#);
        for cuts in [
            vec![],
            vec![7, 9, 1_000, 250_001],
            (0..400).map(|i| i * 997).collect(),
        ] {
            let (events, _) = read(body.as_bytes(), &cuts, 1_000);
            let Event::Element {
                rule: 2,
                body: Body::TooLarge { size, sha256, kept },
            } = &events[1]
            else {
                panic!("{:?}", &events[1])
            };
            assert_eq!(*size, text.len() as u64);
            assert_eq!(sha256[..], Sha256::digest(text.as_bytes())[..]);
            let kept: Value = serde_json::from_str(kept.as_ref().unwrap()).unwrap();
            assert_eq!(kept["metadata"]["key"], "img");
            assert_eq!(wholes(&events), vec![json!({"response": {}})]);
        }
    }

    #[test]
    fn empty_elements_are_handed_out_empty_for_the_reader_to_refuse() {
        let body = br#"{"response":{"list":[1,,2,]}}"#;
        let (events, _) = read(body, &[], 100);
        let empties = events
            .iter()
            .filter(|e| matches!(e, Event::Element { body: Body::Whole(b), .. } if b.is_empty()))
            .count();
        assert_eq!(empties, 2);
        let (events, _) = read(br#"{"response":{"list":[ ]}}"#, &[], 100);
        assert_eq!(events, vec![Event::Array { rule: 1 }]);
    }

    fn arb_item() -> impl Strategy<Value = Value> {
        ("\\PC{0,40}", any::<i32>(), "[a-z\"\\\\\\]\\[{}]{0,12}").prop_map(|(text, n, odd)| {
            json!({"response": {"text": text, "n": n, "odd": odd}, "metadata": {"key": odd}})
        })
    }

    proptest! {
        #[test]
        fn any_split_hands_out_the_same_elements(
            items in prop::collection::vec(arb_item(), 0..8),
            cuts in prop::collection::vec(any::<usize>(), 0..12),
            cap in 8usize..200,
        ) {
            let body = json!({"response": {"list": items}}).to_string();
            let (whole, doc) = read(body.as_bytes(), &[], cap);
            let (split, doc_split) = read(body.as_bytes(), &cuts, cap);
            prop_assert_eq!(&split, &whole);
            prop_assert_eq!(doc_split, doc);
            let n = whole.iter().filter(|e| matches!(e, Event::Element { .. })).count();
            prop_assert_eq!(n, items.len());
            for (event, item) in whole.iter().skip(1).zip(&items) {
                match event {
                    Event::Element { body: Body::Whole(b), .. } => {
                        prop_assert!(b.len() <= cap);
                        prop_assert_eq!(&serde_json::from_slice::<Value>(b).unwrap(), item);
                    }
                    Event::Element { body: Body::TooLarge { size, .. }, .. } => {
                        prop_assert!(*size as usize > cap);
                        prop_assert_eq!(*size as usize, item.to_string().len());
                    }
                    other => prop_assert!(false, "{:?}", other),
                }
            }
        }
    }
}
