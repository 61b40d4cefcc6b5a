//! Reading a status-API answer of any size with bounded memory: a streaming JSON skimmer.
//!
//! Guarantees: fed the body's bytes in chunks of any size (the result does not depend on
//! where the chunks split), it rebuilds a reduced JSON document that keeps everything
//! [`crate::status`] reads, and never holds more than [`MAX_KEPT_BYTES`] of it plus O(1)
//! state per kept nesting level. What it drops is marked, never silently wrong:
//! - an array under a member named in [`COUNTED`] (a batch's inline results, an
//!   interaction's outputs) becomes its element count (a JSON number);
//! - a string longer than [`MAX_STRING_BYTES`] keeps its first bytes (cut on a character
//!   boundary, never inside an escape) followed by [`TRUNCATED_MARK`];
//! - an object or array nested deeper than [`MAX_KEPT_DEPTH`] becomes `null`.
//!
//! Dropped values are skipped with O(1) state (a bracket depth and a string flag), so their
//! size costs time, not memory. A body past [`MAX_BODY_BYTES`], a kept document past
//! [`MAX_KEPT_BYTES`], or a body that is not one JSON value is refused with a reason
//! ([`SkimError`]); the caller treats that answer as unusable.

use thiserror::Error;

/// Largest status answer read: far above what Gemini documents for an inline batch (its
/// requests are capped at 20 MB; results are of the same order), and at the skimmer's
/// measured pace (a few ns a byte) well inside a Worker's CPU budget. A larger body is
/// refused unread past this point.
pub const MAX_BODY_BYTES: u64 = 256 * 1024 * 1024;
/// Largest reduced document kept: everything the worker reads is a few KB (state, times,
/// output location, error, counts, batch stats).
pub const MAX_KEPT_BYTES: usize = 256 * 1024;
/// Longest string kept whole: output URIs and error messages are far shorter; inline media
/// (base64 video or image bytes) is not.
pub const MAX_STRING_BYTES: usize = 16 * 1024;
/// Deepest object or array kept: what is read sits at depth 5 or less.
pub const MAX_KEPT_DEPTH: usize = 32;
/// Longest number or literal accepted.
const MAX_ATOM_BYTES: usize = 256;
/// Members whose array value is replaced by its element count: a batch's inline results
/// (`output.inlinedResponses.inlinedResponses`, also for embedding batches) and an
/// interaction's outputs. A member of that name holding an object is kept and read through.
pub const COUNTED: [&str; 3] = [
    "inlinedResponses",
    "inlinedEmbedContentResponses",
    "outputs",
];
/// Appended to a string that was cut.
pub const TRUNCATED_MARK: &str = "…[truncated]";

/// Why a body could not be skimmed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SkimError {
    #[error("answer is larger than {MAX_BODY_BYTES} bytes")]
    BodyTooLarge,
    #[error("kept part of the answer is larger than {MAX_KEPT_BYTES} bytes")]
    KeptTooLarge,
    #[error("not JSON: {0} at byte {1}")]
    Malformed(&'static str, u64),
}

/// A skimmed answer: the reduced document and what reading it cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skimmed {
    /// The reduced document (valid UTF-8 JSON when the body was).
    pub json: String,
    /// Bytes of the body read.
    pub bytes_read: u64,
    /// Bytes of the reduced document (what is kept).
    pub bytes_kept: usize,
    /// Arrays replaced by their count.
    pub counted: u64,
    /// Strings cut.
    pub truncated: u64,
    /// The largest chunk fed at once (the other part of the memory bound).
    pub max_chunk: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Container {
    Object,
    Array,
}

/// What the grammar allows next, between tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Value,
    /// Right after `[`: a value or `]`.
    ValueOrEnd,
    /// Right after `{`: a key or `}`.
    KeyOrEnd,
    /// After `,` in an object.
    Key,
    Colon,
    CommaOrEnd,
    /// The top value is complete: only whitespace may follow.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Escape {
    None,
    Backslash,
    /// Hex digits still to come in `\uXXXX`, and the value so far.
    Hex(u8, u16),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lex {
    /// Between tokens.
    Between,
    /// Inside a kept string.
    Str {
        key: bool,
        escape: Escape,
        /// A `\uD800`-`\uDBFF` escape waits for its low half: no cut here.
        high_surrogate: bool,
        len: usize,
        cut: bool,
    },
    /// Inside a number or literal.
    Atom { len: usize },
    /// Inside a dropped container: its depth, a string flag, and for a counted array the
    /// separators and whether it has any element.
    Skip {
        depth: u64,
        in_str: bool,
        escaped: bool,
        count: bool,
        commas: u64,
        any: bool,
    },
}

/// The skimmer: [`Skim::feed`] chunks, then [`Skim::finish`].
#[derive(Debug, Clone)]
pub struct Skim {
    out: Vec<u8>,
    stack: Vec<Container>,
    expect: Expect,
    lex: Lex,
    /// The last key read, up to the longest name in [`COUNTED`] (longer keys never match).
    key: Vec<u8>,
    key_counted: bool,
    read: u64,
    counted: u64,
    truncated: u64,
    max_chunk: usize,
    failed: Option<SkimError>,
}

impl Default for Skim {
    fn default() -> Self {
        Self::new()
    }
}

const KEY_CAP: usize = 32;

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

fn hex(b: u8) -> Option<u16> {
    (b as char).to_digit(16).map(|d| d as u16)
}

impl Skim {
    pub fn new() -> Self {
        Skim {
            out: Vec::new(),
            stack: Vec::new(),
            expect: Expect::Value,
            lex: Lex::Between,
            key: Vec::new(),
            key_counted: false,
            read: 0,
            counted: 0,
            truncated: 0,
            max_chunk: 0,
            failed: None,
        }
    }

    /// Bytes read so far.
    pub fn bytes_read(&self) -> u64 {
        self.read
    }

    /// Feeds the next chunk of the body. After an error, every further call returns it.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<(), SkimError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        self.max_chunk = self.max_chunk.max(chunk.len());
        let result = self.feed_inner(chunk);
        if let Err(e) = &result {
            self.failed = Some(e.clone());
        }
        result
    }

    fn feed_inner(&mut self, chunk: &[u8]) -> Result<(), SkimError> {
        if self.read.saturating_add(chunk.len() as u64) > MAX_BODY_BYTES {
            self.read = self.read.saturating_add(chunk.len() as u64);
            return Err(SkimError::BodyTooLarge);
        }
        for &b in chunk {
            self.byte(b)?;
            self.read += 1;
        }
        if self.out.len() > MAX_KEPT_BYTES {
            return Err(SkimError::KeptTooLarge);
        }
        Ok(())
    }

    /// The body ended: the reduced document, or why there is none.
    pub fn finish(mut self) -> Result<Skimmed, SkimError> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        if let Lex::Atom { .. } = self.lex {
            self.lex = Lex::Between;
            self.after_value();
        }
        if self.expect != Expect::Done || self.lex != Lex::Between {
            return Err(self.malformed("unexpected end"));
        }
        let bytes_kept = self.out.len();
        let json = String::from_utf8(self.out).map_err(|e| {
            SkimError::Malformed("invalid UTF-8", e.utf8_error().valid_up_to() as u64)
        })?;
        Ok(Skimmed {
            json,
            bytes_read: self.read,
            bytes_kept,
            counted: self.counted,
            truncated: self.truncated,
            max_chunk: self.max_chunk,
        })
    }

    fn malformed(&self, what: &'static str) -> SkimError {
        SkimError::Malformed(what, self.read)
    }

    fn after_value(&mut self) {
        self.expect = if self.stack.is_empty() {
            Expect::Done
        } else {
            Expect::CommaOrEnd
        };
    }

    fn byte(&mut self, b: u8) -> Result<(), SkimError> {
        match self.lex {
            Lex::Between => self.between(b),
            Lex::Str { .. } => self.string(b),
            Lex::Atom { len } => {
                if b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.') {
                    if len >= MAX_ATOM_BYTES {
                        return Err(self.malformed("number or literal too long"));
                    }
                    self.out.push(b);
                    self.lex = Lex::Atom { len: len + 1 };
                    Ok(())
                } else {
                    self.lex = Lex::Between;
                    self.after_value();
                    self.between(b)
                }
            }
            Lex::Skip { .. } => {
                self.skip(b);
                Ok(())
            }
        }
    }

    fn between(&mut self, b: u8) -> Result<(), SkimError> {
        if is_ws(b) {
            return Ok(());
        }
        match (self.expect, b) {
            (Expect::Value | Expect::ValueOrEnd, _) if b != b']' => self.value(b),
            (Expect::ValueOrEnd, b']') => self.close(Container::Array, b),
            (Expect::KeyOrEnd | Expect::Key, b'"') => {
                self.key.clear();
                self.open_string(true);
                Ok(())
            }
            (Expect::KeyOrEnd, b'}') => self.close(Container::Object, b),
            (Expect::Colon, b':') => {
                self.out.push(b);
                self.expect = Expect::Value;
                Ok(())
            }
            (Expect::CommaOrEnd, b',') => {
                self.out.push(b);
                self.expect = match self.stack.last() {
                    Some(Container::Object) => Expect::Key,
                    _ => Expect::Value,
                };
                Ok(())
            }
            (Expect::CommaOrEnd, b'}') => self.close(Container::Object, b),
            (Expect::CommaOrEnd, b']') => self.close(Container::Array, b),
            (Expect::Done, _) => Err(self.malformed("content after the value")),
            _ => Err(self.malformed("unexpected character")),
        }
    }

    /// A value starts with `b`.
    fn value(&mut self, b: u8) -> Result<(), SkimError> {
        let counted = std::mem::take(&mut self.key_counted);
        match b {
            b'[' if counted => {
                self.counted += 1;
                self.start_skip(true);
                Ok(())
            }
            b'{' | b'[' if self.stack.len() >= MAX_KEPT_DEPTH => {
                self.start_skip(false);
                Ok(())
            }
            b'{' | b'[' => {
                self.out.push(b);
                if b == b'{' {
                    self.stack.push(Container::Object);
                    self.expect = Expect::KeyOrEnd;
                } else {
                    self.stack.push(Container::Array);
                    self.expect = Expect::ValueOrEnd;
                }
                Ok(())
            }
            b'"' => {
                self.open_string(false);
                Ok(())
            }
            b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => {
                self.out.push(b);
                self.lex = Lex::Atom { len: 1 };
                Ok(())
            }
            _ => Err(self.malformed("unexpected character")),
        }
    }

    fn close(&mut self, container: Container, b: u8) -> Result<(), SkimError> {
        if self.stack.pop() != Some(container) {
            return Err(self.malformed("mismatched bracket"));
        }
        self.out.push(b);
        self.after_value();
        Ok(())
    }

    fn open_string(&mut self, key: bool) {
        self.out.push(b'"');
        self.lex = Lex::Str {
            key,
            escape: Escape::None,
            high_surrogate: false,
            len: 0,
            cut: false,
        };
    }

    fn string(&mut self, b: u8) -> Result<(), SkimError> {
        let Lex::Str {
            key,
            mut escape,
            mut high_surrogate,
            mut len,
            mut cut,
        } = self.lex
        else {
            return Ok(());
        };
        // A cut lands only where a character starts outside any escape, so the kept prefix
        // is valid JSON text on its own.
        if !cut
            && len >= MAX_STRING_BYTES
            && escape == Escape::None
            && !high_surrogate
            && b & 0xC0 != 0x80
        {
            cut = true;
            self.truncated += 1;
        }
        match escape {
            Escape::None => match b {
                b'"' => {
                    if cut {
                        self.out.extend_from_slice(TRUNCATED_MARK.as_bytes());
                    }
                    self.out.push(b'"');
                    self.lex = Lex::Between;
                    if key {
                        self.key_counted = COUNTED.iter().any(|n| n.as_bytes() == self.key);
                        self.expect = Expect::Colon;
                    } else {
                        self.after_value();
                    }
                    return Ok(());
                }
                b'\\' => escape = Escape::Backslash,
                0..=0x1f => return Err(self.malformed("control character in a string")),
                _ => high_surrogate = false,
            },
            Escape::Backslash => match b {
                b'u' => escape = Escape::Hex(4, 0),
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {
                    escape = Escape::None;
                    high_surrogate = false;
                }
                _ => return Err(self.malformed("bad escape")),
            },
            Escape::Hex(left, value) => {
                let digit = hex(b).ok_or_else(|| self.malformed("bad \\u escape"))?;
                let value = (value << 4) | digit;
                if left == 1 {
                    escape = Escape::None;
                    high_surrogate = (0xD800..0xDC00).contains(&value);
                } else {
                    escape = Escape::Hex(left - 1, value);
                }
            }
        }
        if !cut {
            self.out.push(b);
            len += 1;
            if key && self.key.len() <= KEY_CAP {
                self.key.push(b);
            }
        }
        self.lex = Lex::Str {
            key,
            escape,
            high_surrogate,
            len,
            cut,
        };
        Ok(())
    }

    fn start_skip(&mut self, count: bool) {
        self.lex = Lex::Skip {
            depth: 1,
            in_str: false,
            escaped: false,
            count,
            commas: 0,
            any: false,
        };
    }

    /// One byte of a dropped container: only strings and brackets matter.
    fn skip(&mut self, b: u8) {
        let Lex::Skip {
            mut depth,
            mut in_str,
            mut escaped,
            count,
            mut commas,
            mut any,
        } = self.lex
        else {
            return;
        };
        if in_str {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_str = false;
            }
        } else if !is_ws(b) {
            match b {
                b']' | b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        let replacement = if count {
                            (if any { commas + 1 } else { 0 }).to_string()
                        } else {
                            "null".to_string()
                        };
                        self.out.extend_from_slice(replacement.as_bytes());
                        self.lex = Lex::Between;
                        self.after_value();
                        return;
                    }
                }
                b',' if depth == 1 => commas += 1,
                _ => {
                    if depth == 1 {
                        any = true;
                    }
                    match b {
                        b'"' => in_str = true,
                        b'[' | b'{' => depth += 1,
                        _ => {}
                    }
                }
            }
        }
        self.lex = Lex::Skip {
            depth,
            in_str,
            escaped,
            count,
            commas,
            any,
        };
    }
}

/// Skims a whole body at once (the host tests' and small callers' shortcut).
pub fn skim(body: &[u8]) -> Result<Skimmed, SkimError> {
    let mut s = Skim::new();
    s.feed(body)?;
    s.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn kept(body: &str) -> Value {
        serde_json::from_str(&skim(body.as_bytes()).unwrap().json).unwrap()
    }

    fn by_bytes(body: &[u8]) -> Result<Skimmed, SkimError> {
        let mut s = Skim::new();
        for b in body {
            s.feed(std::slice::from_ref(b))?;
        }
        s.finish()
    }

    fn inline_batch(n: usize, text_len: usize) -> String {
        let item = json!({"response": {"candidates": [{"content": {"parts": [{"text": "x".repeat(text_len)}]}}]},
            "metadata": {"key": "k]\"}{"}});
        let items = vec![item.to_string(); n].join(",");
        format!(
            r#"{{"name":"batches/b","done":true,"metadata":{{"@type":"type.googleapis.com/google.ai.generativelanguage.v1beta.GenerateContentBatch","state":"BATCH_STATE_SUCCEEDED","updateTime":"2026-01-22T12:00:00Z","batchStats":{{"requestCount":"{n}"}},"output":{{"inlinedResponses":{{"inlinedResponses":[{items}]}}}}}},"response":{{"@type":"x","inlinedResponses":{{"inlinedResponses":[{items}]}}}}}}"#
        )
    }

    #[test]
    fn small_documents_are_kept_as_they_are() {
        for body in [
            r#"{"a":1,"b":[true,false,null],"c":{"d":"e\"\\\u00e9\ud83d\ude00"},"n":-1.5e3}"#,
            r#"{}"#,
            r#"[]"#,
            r#" { "a" : [ ] , "b" : { } } "#,
            r#""just a string""#,
            "12",
        ] {
            let want: Value = serde_json::from_str(body).unwrap();
            assert_eq!(kept(body), want, "{body}");
        }
    }

    #[test]
    fn inline_results_become_their_count() {
        let body = inline_batch(3, 10);
        let v = kept(&body);
        assert_eq!(
            v["metadata"]["output"]["inlinedResponses"]["inlinedResponses"],
            3
        );
        assert_eq!(v["response"]["inlinedResponses"]["inlinedResponses"], 3);
        assert_eq!(v["metadata"]["state"], "BATCH_STATE_SUCCEEDED");
        assert_eq!(v["metadata"]["batchStats"]["requestCount"], "3");
        let empty = kept(r#"{"outputs":[],"x":{"inlinedEmbedContentResponses":[ 1 ]}}"#);
        assert_eq!(
            empty,
            json!({"outputs": 0, "x": {"inlinedEmbedContentResponses": 1}})
        );
    }

    #[test]
    fn a_counted_name_inside_an_array_or_as_a_value_is_kept() {
        let v = kept(r#"{"a":["outputs",[1,2]],"b":"inlinedResponses","outputs":{"x":[1]}}"#);
        assert_eq!(
            v,
            json!({"a": ["outputs", [1, 2]], "b": "inlinedResponses", "outputs": {"x": [1]}})
        );
    }

    #[test]
    fn twenty_megabytes_of_inline_results_keep_a_few_hundred_bytes() {
        let body = inline_batch(2_000, 5_000);
        assert!(body.len() > 20_000_000);
        let mut s = Skim::new();
        for chunk in body.as_bytes().chunks(64 * 1024) {
            s.feed(chunk).unwrap();
        }
        let out = s.finish().unwrap();
        assert_eq!(out.bytes_read, body.len() as u64);
        assert!(out.bytes_kept < 1_000, "{}", out.bytes_kept);
        assert_eq!(out.counted, 2);
        assert_eq!(out.max_chunk, 64 * 1024);
    }

    #[test]
    fn long_strings_are_cut_with_a_mark() {
        let long = "é".repeat(MAX_STRING_BYTES); // two bytes each
        let v = kept(&json!({"s": long, "t": "short"}).to_string());
        let s = v["s"].as_str().unwrap();
        assert!(s.ends_with(TRUNCATED_MARK));
        assert_eq!(s.len(), MAX_STRING_BYTES + TRUNCATED_MARK.len());
        assert_eq!(v["t"], "short");
        // Never inside an escape or between the halves of a surrogate pair.
        for pad in 0..8 {
            let body = format!(
                r#"{{"s":"{}{}"}}"#,
                "a".repeat(MAX_STRING_BYTES - pad),
                r"\ud83d\ude00\n\u00e9".repeat(4)
            );
            let out = skim(body.as_bytes()).unwrap();
            let v: Value = serde_json::from_str(&out.json).unwrap();
            assert!(v["s"].as_str().unwrap().ends_with(TRUNCATED_MARK), "{pad}");
            assert_eq!(out.truncated, 1);
        }
    }

    #[test]
    fn deep_nesting_is_dropped_past_the_kept_depth() {
        let depth = 10_000;
        let body = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let v = kept(&format!(r#"{{"state":"S","deep":{body}}}"#));
        assert_eq!(v["state"], "S");
        let mut inner = &v["deep"];
        for _ in 0..MAX_KEPT_DEPTH - 2 {
            inner = &inner[0];
        }
        assert_eq!(inner, &json!([null]));
    }

    #[test]
    fn malformed_bodies_are_refused() {
        for body in [
            "",
            "not json",
            "{",
            r#"{"a"}"#,
            r#"{"a":}"#,
            r#"{"a":1,}"#,
            "[1,]",
            "[1}",
            "{]",
            r#"{"a":"\x"}"#,
            r#"{"a":"\u12g4"}"#,
            "{} {}",
            r#"{"a":"b"#,
            "\"\u{1}\"",
        ] {
            assert!(
                matches!(skim(body.as_bytes()), Err(SkimError::Malformed(..))),
                "{body:?}"
            );
        }
        assert!(matches!(
            skim(b"{\"a\":\"\xff\"}"),
            Err(SkimError::Malformed("invalid UTF-8", _))
        ));
        let long_number = format!("[{}]", "1".repeat(MAX_ATOM_BYTES + 1));
        assert!(matches!(
            skim(long_number.as_bytes()),
            Err(SkimError::Malformed(..))
        ));
    }

    #[test]
    fn each_cap_refuses_with_its_reason() {
        let mut s = Skim::new();
        s.feed(b"[").unwrap();
        let filler = vec![b' '; 1024 * 1024];
        let mut result = Ok(());
        for _ in 0..(MAX_BODY_BYTES / filler.len() as u64) + 1 {
            result = s.feed(&filler);
            if result.is_err() {
                break;
            }
        }
        assert_eq!(result, Err(SkimError::BodyTooLarge));
        assert_eq!(s.feed(b"]"), Err(SkimError::BodyTooLarge), "stays failed");
        assert_eq!(s.finish(), Err(SkimError::BodyTooLarge));

        let many = format!("[{}]", vec!["\"abcdefgh\""; MAX_KEPT_BYTES / 8].join(","));
        assert_eq!(skim(many.as_bytes()), Err(SkimError::KeptTooLarge));
    }

    #[test]
    fn byte_by_byte_gives_the_same_document() {
        let body = inline_batch(5, 100);
        assert_eq!(
            by_bytes(body.as_bytes()).map(|s| s.json),
            skim(body.as_bytes()).map(|s| s.json)
        );
        let unicode =
            json!({"s": "é😀\u{1}\"\\", "t": "x".repeat(MAX_STRING_BYTES + 3)}).to_string();
        assert_eq!(
            by_bytes(unicode.as_bytes()).map(|s| s.json),
            skim(unicode.as_bytes()).map(|s| s.json)
        );
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            "\\PC{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(6, 64, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec(
                    (
                        prop_oneof![Just("outputs".to_string()), "[a-z]{1,6}"],
                        inner
                    ),
                    0..6
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn any_split_gives_the_same_result(value in arb_json(), cuts in prop::collection::vec(any::<usize>(), 0..8)) {
            let body = value.to_string();
            let whole = skim(body.as_bytes());
            let mut points: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
            points.sort_unstable();
            let mut s = Skim::new();
            let mut at = 0;
            for p in points.into_iter().chain([body.len()]) {
                s.feed(&body.as_bytes()[at..p]).unwrap();
                at = p;
            }
            prop_assert_eq!(s.finish().map(|s| s.json), whole.clone().map(|s| s.json));
            // Without counted members, the kept document is the input.
            if !body.contains("\"outputs\"") {
                let kept: Value = serde_json::from_str(&whole.unwrap().json).unwrap();
                prop_assert_eq!(kept, value);
            }
        }

        #[test]
        fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = skim(&bytes);
            let _ = by_bytes(&bytes);
        }
    }
}
