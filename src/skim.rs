//! Reading a status-API answer of any size with bounded memory: a streaming JSON skimmer, and
//! the elements of the lists it is told to hand out one by one ([`Rule::Each`]: a batch's
//! inline results).
//!
//! Guarantees: fed the body's bytes in chunks of any size (where they split changes nothing),
//! it rebuilds a reduced JSON document that keeps the paths it is given ([`Rule`]s:
//! [`crate::reconciliation::status::READ`] lists what the status reader uses), holding at most
//! [`MAX_KEPT_BYTES`] of it plus O(1) state per kept nesting level. What it drops is marked,
//! never silently wrong:
//! - a member on no kept path (an echo of the requests, an interaction's input and outputs,
//!   usage) becomes `null`;
//! - an array at a [`Rule::Count`] path (a batch's inline results) becomes its element count;
//! - a kept string longer than [`MAX_STRING_BYTES`] keeps its first bytes (cut on a character
//!   boundary, never inside an escape) followed by [`TRUNCATED_MARK`];
//! - a kept object or array nested deeper than [`MAX_KEPT_DEPTH`] becomes `null`.
//!
//! Dropped values are skipped with O(1) state (a bracket depth and a string flag), checked only
//! as far as finding where they end. A body past [`MAX_BODY_BYTES`], a kept document past
//! [`MAX_KEPT_BYTES`], or a body that is not one JSON value is refused with a reason
//! ([`SkimError`]); the caller treats that answer as unusable.

use sha2::{Digest, Sha256};
use thiserror::Error;

/// Largest status answer read: far above what Gemini documents for an inline batch (its requests
/// are capped at 20 MB; results are of the same order), and at the skimmer's measured pace (a few
/// ns a byte) well inside a Worker's CPU budget. A larger body is refused unread past this point.
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
/// Longest member name compared with a rule (longer names match no rule).
const KEY_CAP: usize = 40;
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

/// What to keep at a path: member names joined by `.`, `*` for any element of an array
/// (`response.generateVideoResponse.generatedSamples.*.video.uri`). The objects on the way to
/// a kept path are kept with only the members that lead somewhere kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// The value and everything in it.
    Keep(&'static str),
    /// An array's element count in its place (any other value is kept).
    Count(&'static str),
    /// An array's element count in its place, and each of its elements handed out
    /// ([`Skim::take_events`]).
    Each(&'static str),
}

impl Rule {
    fn path(self) -> &'static str {
        match self {
            Rule::Keep(p) | Rule::Count(p) | Rule::Each(p) => p,
        }
    }
}

/// Keeps the whole document (only the size limits apply).
#[cfg(test)]
pub const EVERYTHING: &[Rule] = &[Rule::Keep("")];

/// What to do with a value, from its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// On the way to a kept path: keep the container, filter its members.
    Filter,
    /// Keep everything in it.
    Keep,
    Count,
    /// Counted, and each element handed out: the rule's index.
    Each(usize),
    Drop,
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
    /// Values dropped (replaced by `null`).
    pub dropped: u64,
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

/// A kept container: its kind, and whether its members are filtered by the rules (then its
/// path's last segment is on the skimmer's `path`) or all kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Frame {
    container: Container,
    filter: bool,
}

/// What the grammar allows next, between tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Expect {
    #[default]
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Lex {
    /// Between tokens.
    #[default]
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
    /// Inside a dropped value: the container depth (0 for a dropped string), a string flag,
    /// and for a counted array the separators and whether it has any element.
    Skip {
        depth: u64,
        in_str: bool,
        escaped: bool,
        count: bool,
        commas: u64,
        any: bool,
        /// The [`Rule::Each`] whose array this is (its index), when its elements are handed out.
        each: Option<usize>,
    },
}

/// The skimmer: [`Skim::feed`] chunks, then [`Skim::finish`].
#[derive(Debug, Clone, Default)]
pub struct Skim {
    rules: &'static [Rule],
    out: Vec<u8>,
    stack: Vec<Frame>,
    /// The path of the innermost filtered container below the document, a segment each.
    path: Vec<Vec<u8>>,
    expect: Expect,
    lex: Lex,
    /// The last key read, up to [`KEY_CAP`] + 1 bytes (longer keys never match a rule).
    key: Vec<u8>,
    read: u64,
    counted: u64,
    dropped: u64,
    truncated: u64,
    max_chunk: usize,
    failed: Option<SkimError>,
    /// What [`Rule::Each`] hands out, and the element being read.
    each: Elements,
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl Skim {
    /// A skimmer keeping what `rules` name.
    pub fn new(rules: &'static [Rule]) -> Self {
        Skim {
            rules,
            ..Skim::default()
        }
    }

    /// Hands out the elements of the [`Rule::Each`] arrays ([`Skim::take_events`]): whole
    /// within `cap` bytes, else their size, hash and what `over_rules` keep of them.
    pub fn with_elements(mut self, cap: usize, over_rules: &'static [Rule]) -> Self {
        self.each = Elements {
            cap,
            over_rules,
            ..Elements::default()
        };
        self
    }

    /// What the [`Rule::Each`] arrays held since the last call, in order.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.each.events)
    }

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
        result.inspect_err(|e| self.failed = Some(e.clone()))
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
            dropped: self.dropped,
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
                self.expect = match self.stack.last().map(|f| f.container) {
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

    /// What the rules say about the value starting now: its path is the innermost filtered
    /// container's path plus its member name (or `*` in an array).
    fn fate(&self) -> Fate {
        let Some(parent) = self.stack.last() else {
            // The document itself: everything with [`EVERYTHING`], else filtered.
            return if self.rules.iter().any(|r| r.path().is_empty()) {
                Fate::Keep
            } else {
                Fate::Filter
            };
        };
        if !parent.filter {
            return Fate::Keep;
        }
        let last: &[u8] = match parent.container {
            Container::Object => &self.key,
            Container::Array => b"*",
        };
        let mut fate = Fate::Drop;
        for (at, rule) in self.rules.iter().enumerate() {
            let mut segments = rule.path().split('.');
            let on_path = self
                .path
                .iter()
                .map(Vec::as_slice)
                .chain(std::iter::once(last))
                .all(|have| segments.next().is_some_and(|want| want.as_bytes() == have));
            if !on_path {
                continue;
            }
            match (segments.next().is_none(), rule) {
                (true, Rule::Keep(_)) => return Fate::Keep,
                (true, Rule::Count(_)) => return Fate::Count,
                (true, Rule::Each(_)) => return Fate::Each(at),
                (false, _) => fate = Fate::Filter,
            }
        }
        fate
    }

    /// A value starts with `b`.
    fn value(&mut self, b: u8) -> Result<(), SkimError> {
        let fate = self.fate();
        let container = matches!(b, b'{' | b'[');
        match (fate, b) {
            (Fate::Count | Fate::Each(_), b'[') => {
                self.counted += 1;
                let each = match fate {
                    Fate::Each(rule) => Some(rule),
                    _ => None,
                };
                each.inspect(|rule| self.each.array(*rule));
                self.start_skip(true, false, each);
                return Ok(());
            }
            (Fate::Drop, b'{' | b'[' | b'"') => {
                self.dropped += 1;
                self.start_skip(false, b == b'"', None);
                return Ok(());
            }
            _ if container && self.stack.len() >= MAX_KEPT_DEPTH => {
                self.dropped += 1;
                self.start_skip(false, false, None);
                return Ok(());
            }
            _ => {}
        }
        match b {
            b'{' | b'[' => {
                let filter = fate == Fate::Filter;
                if filter && !self.stack.is_empty() {
                    let segment = match self.stack.last().map(|f| f.container) {
                        Some(Container::Array) => b"*".to_vec(),
                        _ => self.key.clone(),
                    };
                    self.path.push(segment);
                }
                self.out.push(b);
                let (container, expect) = match b {
                    b'{' => (Container::Object, Expect::KeyOrEnd),
                    _ => (Container::Array, Expect::ValueOrEnd),
                };
                self.expect = expect;
                self.stack.push(Frame { container, filter });
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
        let Some(frame) = self.stack.pop().filter(|f| f.container == container) else {
            return Err(self.malformed("mismatched bracket"));
        };
        if frame.filter && !self.stack.is_empty() {
            self.path.pop();
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
            escape,
            high_surrogate,
            len,
            cut,
        } = &mut self.lex
        else {
            return Ok(());
        };
        let malformed = |what| SkimError::Malformed(what, self.read);
        // A cut lands only where a character starts outside any escape, so the kept prefix
        // is valid JSON text on its own.
        if !*cut
            && *len >= MAX_STRING_BYTES
            && *escape == Escape::None
            && !*high_surrogate
            && b & 0xC0 != 0x80
        {
            *cut = true;
            self.truncated += 1;
        }
        match *escape {
            Escape::None => match b {
                b'"' => {
                    if *cut {
                        self.out.extend_from_slice(TRUNCATED_MARK.as_bytes());
                    }
                    self.out.push(b'"');
                    let key = *key;
                    self.lex = Lex::Between;
                    if key {
                        self.expect = Expect::Colon;
                    } else {
                        self.after_value();
                    }
                    return Ok(());
                }
                b'\\' => *escape = Escape::Backslash,
                0..=0x1f => return Err(malformed("control character in a string")),
                _ => *high_surrogate = false,
            },
            Escape::Backslash => match b {
                b'u' => *escape = Escape::Hex(4, 0),
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {
                    *escape = Escape::None;
                    *high_surrogate = false;
                }
                _ => return Err(malformed("bad escape")),
            },
            Escape::Hex(left, value) => {
                let digit = (b as char).to_digit(16);
                let value = (value << 4) | digit.ok_or_else(|| malformed("bad \\u escape"))? as u16;
                if left == 1 {
                    *escape = Escape::None;
                    *high_surrogate = (0xD800..0xDC00).contains(&value);
                } else {
                    *escape = Escape::Hex(left - 1, value);
                }
            }
        }
        if !*cut {
            self.out.push(b);
            *len += 1;
            if *key && self.key.len() <= KEY_CAP {
                self.key.push(b);
            }
        }
        Ok(())
    }

    /// Skips the value that starts here: a container, or a string (`string`); a counted array's
    /// elements handed out for the [`Rule::Each`] at `each`.
    fn start_skip(&mut self, count: bool, string: bool, each: Option<usize>) {
        self.lex = Lex::Skip {
            depth: u64::from(!string),
            in_str: string,
            escaped: false,
            count,
            commas: 0,
            any: false,
            each,
        };
    }

    /// One byte of a dropped container: only strings and brackets matter.
    fn skip(&mut self, b: u8) {
        let Lex::Skip {
            depth,
            in_str,
            escaped,
            count,
            commas,
            any,
            each,
        } = &mut self.lex
        else {
            return;
        };
        if let Some(rule) = *each {
            self.each.byte(rule, b, *depth, *in_str);
        }
        let ended = match b {
            _ if *in_str => {
                if *escaped {
                    *escaped = false;
                } else if b == b'\\' {
                    *escaped = true;
                } else if b == b'"' {
                    *in_str = false;
                }
                !*in_str && *depth == 0
            }
            _ if is_ws(b) => false,
            b']' | b'}' => {
                *depth -= 1;
                *depth == 0
            }
            b',' if *depth == 1 => {
                *commas += 1;
                false
            }
            _ => {
                *any |= *depth == 1;
                match b {
                    b'"' => *in_str = true,
                    b'[' | b'{' => *depth += 1,
                    _ => {}
                }
                false
            }
        };
        if ended {
            // A dropped value (a string, or a container) is `null`; a counted array its count.
            let replacement = match (*count, *any) {
                (true, true) => (*commas + 1).to_string(),
                (true, false) => "0".to_string(),
                (false, _) => "null".to_string(),
            };
            self.out.extend_from_slice(replacement.as_bytes());
            self.lex = Lex::Between;
            self.after_value();
        }
    }
}

/// Skims a whole body at once (the host tests' shortcut).
#[cfg(test)]
pub fn skim(rules: &'static [Rule], body: &[u8]) -> Result<Skimmed, SkimError> {
    let mut s = Skim::new(rules);
    s.feed(body)?;
    s.finish()
}

// ---- The elements of the arrays a [`Rule::Each`] names ----
//
// Handed out one by one as the skimmer reads past them, so a status answer of any size is
// never held: whole (its bytes as written) within the cap; past it, its size, the SHA-256 of
// its bytes and what a second skimmer keeps of it ([`Skim::with_elements`]' rules), never holding
// more than the cap plus [`FLUSH_BYTES`]. Where the chunks split changes nothing. Elements are
// found by brackets and strings only: the reader parses each, and refuses an empty one
// (`[1,,2]`, `[1,]`), handed out empty.

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
/// Elements within `cap` bytes are handed out whole; larger ones skimmed with `over_rules`.
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
            b']' | b'}' if self.open.is_some() || self.separated => self.close(rule),
            b']' | b'}' => {}
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
                let (size, sha256) = (capture.size, over.sha256.finalize().into());
                Body::TooLarge { size, sha256, kept }
            }
        };
        self.events.push(Event::Element { rule, body });
    }
}

#[cfg(test)]
mod each_tests {
    use super::*;
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    /// A batch reader's rules, as the tests' example.
    const INLINE: &[Rule] = &[
        Rule::Keep("done"),
        Rule::Keep("metadata.state"),
        Rule::Keep("metadata.batchStats"),
        Rule::Count("metadata.output.inlinedResponses.inlinedResponses"),
        Rule::Count("response.inlinedResponses.inlinedResponses"),
        Rule::Keep("items.*.uri"),
    ];

    fn kept(rules: &'static [Rule], body: &str) -> Value {
        serde_json::from_str(&skim(rules, body.as_bytes()).unwrap().json).unwrap()
    }

    fn by_bytes(rules: &'static [Rule], body: &[u8]) -> Result<Skimmed, SkimError> {
        let mut s = Skim::new(rules);
        for b in body {
            s.feed(std::slice::from_ref(b))?;
        }
        s.finish()
    }

    fn inline_batch(n: usize, text_len: usize) -> String {
        let item = json!({"response": {"candidates": [{"content": {"parts": [{"text": "x".repeat(text_len)}]}}]},
            "metadata": {"key": "k]\"}{"}});
        let items = vec![item.to_string(); n].join(",");
        let request =
            json!({"request": {"contents": [{"parts": [{"text": "y".repeat(text_len)}]}]}})
                .to_string();
        let requests = vec![request; n].join(",");
        format!(
            r#"{{"name":"batches/b","done":true,"metadata":{{"@type":"type.googleapis.com/google.ai.generativelanguage.v1beta.GenerateContentBatch","state":"BATCH_STATE_SUCCEEDED","updateTime":"2026-01-22T12:00:00Z","inputConfig":{{"requests":{{"requests":[{requests}]}}}},"batchStats":{{"requestCount":"{n}"}},"output":{{"inlinedResponses":{{"inlinedResponses":[{items}]}}}}}},"response":{{"@type":"x","inlinedResponses":{{"inlinedResponses":[{items}]}}}}}}"#
        )
    }

    #[test]
    fn everything_keeps_small_documents_as_they_are() {
        for body in [
            r#"{"a":1,"b":[true,false,null],"c":{"d":"e\"\\\u00e9\ud83d\ude00"},"n":-1.5e3}"#,
            r#"{}"#,
            r#"[]"#,
            r#" { "a" : [ ] , "b" : { } } "#,
            r#""just a string""#,
            "12",
        ] {
            let want: Value = serde_json::from_str(body).unwrap();
            assert_eq!(kept(EVERYTHING, body), want, "{body}");
        }
    }

    #[test]
    fn inline_results_become_their_count_and_echoed_requests_are_dropped() {
        let body = inline_batch(3, 10);
        let v = kept(INLINE, &body);
        assert_eq!(
            v["metadata"]["output"]["inlinedResponses"]["inlinedResponses"],
            3
        );
        assert_eq!(v["response"]["inlinedResponses"]["inlinedResponses"], 3);
        assert_eq!(v["metadata"]["state"], "BATCH_STATE_SUCCEEDED");
        assert_eq!(v["metadata"]["batchStats"]["requestCount"], "3");
        assert_eq!(v["done"], true);
        assert_eq!(v["metadata"]["inputConfig"], Value::Null);
        assert_eq!(v["name"], Value::Null);
        assert_eq!(v["response"]["@type"], Value::Null);
        let empty = kept(
            INLINE,
            r#"{"response":{"inlinedResponses":{"inlinedResponses":[ ]}}}"#,
        );
        assert_eq!(empty["response"]["inlinedResponses"]["inlinedResponses"], 0);
    }

    #[test]
    fn only_what_leads_to_a_kept_path_is_kept() {
        let v = kept(
            INLINE,
            r#"{"items":[{"uri":"files/a","bytes":"AAAA","n":[1]},{"uri":"files/b"},"loose"],
                "metadata":{"output":{"inlinedResponses":{"inlinedResponses":{"not":"an array"}}}},
                "y":"drop","z":{"deep":[1,2]},"n":5}"#,
        );
        assert_eq!(
            v,
            json!({"items": [{"uri": "files/a", "bytes": null, "n": null}, {"uri": "files/b"}, "loose"],
                "metadata": {"output": {"inlinedResponses": {"inlinedResponses": {"not": "an array"}}}},
                "y": null, "z": null, "n": 5})
        );
    }

    #[test]
    fn twenty_megabytes_of_inline_results_keep_a_few_hundred_bytes() {
        let body = inline_batch(1_400, 5_000);
        assert!(body.len() > 20_000_000);
        let mut s = Skim::new(INLINE);
        for chunk in body.as_bytes().chunks(64 * 1024) {
            s.feed(chunk).unwrap();
        }
        let out = s.finish().unwrap();
        assert_eq!(out.bytes_read, body.len() as u64);
        assert!(out.bytes_kept < 500, "{}", out.bytes_kept);
        assert_eq!(out.counted, 2);
        assert_eq!(out.max_chunk, 64 * 1024);
    }

    #[test]
    fn long_strings_are_cut_with_a_mark() {
        let long = "é".repeat(MAX_STRING_BYTES); // two bytes each
        let v = kept(EVERYTHING, &json!({"s": long, "t": "short"}).to_string());
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
            let out = skim(EVERYTHING, body.as_bytes()).unwrap();
            let v: Value = serde_json::from_str(&out.json).unwrap();
            assert!(v["s"].as_str().unwrap().ends_with(TRUNCATED_MARK), "{pad}");
            assert_eq!(out.truncated, 1);
        }
    }

    #[test]
    fn deep_nesting_is_dropped_past_the_kept_depth() {
        let depth = 10_000;
        let body = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let v = kept(EVERYTHING, &format!(r#"{{"state":"S","deep":{body}}}"#));
        assert_eq!(v["state"], "S");
        let mut inner = &v["deep"];
        for _ in 0..MAX_KEPT_DEPTH - 2 {
            inner = &inner[0];
        }
        assert_eq!(inner, &json!([null]));
    }

    #[test]
    fn malformed_bodies_are_refused() {
        // Kept values are checked to the byte; dropped ones only as far as finding their end.
        let structural = [
            "",
            "not json",
            "{",
            r#"{"a"}"#,
            r#"{"a":}"#,
            r#"{"a":1,}"#,
            "[1,]",
            "[1}",
            "{]",
            "{} {}",
            r#"{"a":"b"#,
            "\"\u{1}\"",
            r#"{"y":[1}"#,
            r#"{"y":"open"#,
        ];
        let in_kept_strings = [r#"{"a":"\x"}"#, r#"{"a":"\u12g4"}"#, "{\"a\":\"\u{1}\"}"];
        for (rules, bodies) in [
            (EVERYTHING, [&structural[..], &in_kept_strings[..]].concat()),
            (INLINE, structural.to_vec()),
        ] {
            for body in bodies {
                assert!(
                    matches!(skim(rules, body.as_bytes()), Err(SkimError::Malformed(..))),
                    "{body:?}"
                );
            }
        }
        assert!(matches!(
            skim(EVERYTHING, b"{\"a\":\"\xff\"}"),
            Err(SkimError::Malformed("invalid UTF-8", _))
        ));
        let long_number = format!("[{}]", "1".repeat(MAX_ATOM_BYTES + 1));
        assert!(matches!(
            skim(EVERYTHING, long_number.as_bytes()),
            Err(SkimError::Malformed(..))
        ));
    }

    #[test]
    fn each_cap_refuses_with_its_reason() {
        let mut s = Skim::new(EVERYTHING);
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
        assert_eq!(
            skim(EVERYTHING, many.as_bytes()),
            Err(SkimError::KeptTooLarge)
        );
        // The same under a dropped member costs nothing kept.
        let dropped = format!(r#"{{"labels":{many},"done":true}}"#);
        assert_eq!(
            kept(INLINE, &dropped),
            json!({"labels": null, "done": true})
        );
    }

    #[test]
    fn byte_by_byte_gives_the_same_document() {
        for rules in [EVERYTHING, INLINE] {
            let body = inline_batch(5, 100);
            assert_eq!(
                by_bytes(rules, body.as_bytes()).map(|s| s.json),
                skim(rules, body.as_bytes()).map(|s| s.json)
            );
            let unicode =
                json!({"s": "é😀\u{1}\"\\", "t": "x".repeat(MAX_STRING_BYTES + 3), "done": "é😀"})
                    .to_string();
            assert_eq!(
                by_bytes(rules, unicode.as_bytes()).map(|s| s.json),
                skim(rules, unicode.as_bytes()).map(|s| s.json)
            );
        }
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
                        prop_oneof![
                            Just("metadata".to_string()),
                            Just("items".to_string()),
                            Just("uri".to_string()),
                            "[a-z]{1,6}"
                        ],
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
            for rules in [EVERYTHING, INLINE] {
                let whole = skim(rules, body.as_bytes());
                let mut points: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
                points.sort_unstable();
                let mut s = Skim::new(rules);
                let mut at = 0;
                for p in points.iter().copied().chain([body.len()]) {
                    s.feed(&body.as_bytes()[at..p]).unwrap();
                    at = p;
                }
                prop_assert_eq!(s.finish().map(|s| s.json), whole.clone().map(|s| s.json));
                // Every document skims to valid JSON, and with everything kept, to itself.
                let kept: Value = serde_json::from_str(&whole.unwrap().json).unwrap();
                if rules == EVERYTHING {
                    prop_assert_eq!(kept, value.clone());
                }
            }
        }

        #[test]
        fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            for rules in [EVERYTHING, INLINE] {
                let _ = skim(rules, &bytes);
                let _ = by_bytes(rules, &bytes);
            }
        }
    }
}
