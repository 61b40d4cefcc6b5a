//! One result of a batch, from a file's line or an inline item.
//!
//! Guarantees: every line and item is one result, whatever it holds: one that is not JSON, or
//! has neither `response` nor `error`, says why it could not be read (never a stop); one over
//! the cap says where it is (file, index, byte offset, size; an inline item its key, index and
//! size), so every stored result fits a row. `response` and `error` are kept as written.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::results::keys::{file_result_key, key_text};
use crate::results::lines::{Checkpoint, Piece};

/// A line's (or an inline item's) cap: larger ones are not loaded, their result says where
/// they are. Below a Durable Object SQLite row's 2 MB, so a failed result's row always fits;
/// an inline item over it is never held ([`crate::results::inline`]).
pub const LINE_CAP: usize = 1 << 20;

/// What a result carries to its destination.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Payload {
    /// The request's `response`, as Gemini wrote it.
    Response(Value),
    /// The request's `error`, as Gemini wrote it.
    Error(Value),
    /// The line could not be read as a result: why, and where it is.
    Unreadable(Value),
}

impl Payload {
    /// Whether the result is an error (Gemini's, or a line that could not be read).
    pub fn is_error(&self) -> bool {
        !matches!(self, Payload::Response(_))
    }
}

/// A result, ready to become its own side effect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultItem {
    pub result_key: String,
    pub index: u64,
    pub payload: Payload,
}

/// Where the results come from, for the unreadable ones' locations.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum Source {
    /// A results file, by its `files/...` name.
    File { name: String },
    /// The status answer's inline responses.
    #[default]
    Inline,
}

/// The payload of a parsed line or item: `response`, else `error` (taken out of it, never
/// copied), else unreadable.
pub fn payload_of(mut value: Value, unreadable: impl Fn(&str) -> Payload) -> Payload {
    let mut take = |k| value.as_object_mut().and_then(|o| o.remove(k));
    if let Some(response) = take("response") {
        Payload::Response(response)
    } else if let Some(error) = take("error") {
        Payload::Error(error)
    } else {
        unreadable("neither response nor error")
    }
}

/// A file's line as a result.
pub fn from_piece(piece: &Piece, file: &str) -> ResultItem {
    let Checkpoint { index, offset } = piece.start();
    let locate = |reason: &str, size| json!({"reason": reason, "file": file, "index": index, "byte_offset": offset, "size": size});
    let unreadable = |reason: &str, size: u64| Payload::Unreadable(locate(reason, size));
    let (key, payload) = match piece {
        Piece::TooLarge { size, .. } => (None, unreadable("line over the size cap", *size)),
        Piece::Line { bytes, .. } => match serde_json::from_slice::<Value>(bytes) {
            Ok(value) if value.is_object() => (
                key_text(value.get("key")),
                payload_of(value, |why| unreadable(why, bytes.len() as u64)),
            ),
            _ => (None, unreadable("not a JSON object", bytes.len() as u64)),
        },
    };
    ResultItem {
        result_key: file_result_key(key.as_deref(), index),
        index,
        payload,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(index: u64, text: &str) -> Piece {
        Piece::Line {
            index,
            offset: index * 100,
            bytes: text.as_bytes().to_vec(),
        }
    }

    #[test]
    fn a_line_with_a_response_keeps_it_as_gemini_wrote_it() {
        let r = from_piece(
            &line(0, r#"{"key":"a","response":{"candidates":[1]}}"#),
            "files/f",
        );
        assert_eq!(r.result_key, "a");
        assert_eq!(r.payload, Payload::Response(json!({"candidates": [1]})));
    }

    #[test]
    fn a_line_with_an_error_is_an_error_result() {
        let r = from_piece(
            &line(3, r#"{"key":"b","error":{"code":3,"message":"bad"}}"#),
            "files/f",
        );
        assert_eq!(
            r.payload,
            Payload::Error(json!({"code": 3, "message": "bad"}))
        );
        assert!(r.payload.is_error());
    }

    #[test]
    fn a_line_that_is_not_json_is_one_unreadable_result_with_its_place() {
        let r = from_piece(&line(2, "{oops"), "files/f");
        assert_eq!(r.result_key, "line-2");
        let Payload::Unreadable(why) = r.payload else {
            panic!("unreadable")
        };
        assert_eq!(why["reason"], "not a JSON object");
        assert_eq!(why["byte_offset"], 200);
        assert_eq!(why["size"], 5);
        assert_eq!(why["file"], "files/f");
    }

    #[test]
    fn a_line_with_neither_response_nor_error_is_unreadable_but_keeps_its_key() {
        let r = from_piece(&line(0, r#"{"key":"c"}"#), "files/f");
        assert_eq!(r.result_key, "c");
        assert!(matches!(r.payload, Payload::Unreadable(_)));
    }

    #[test]
    fn a_line_over_the_cap_says_where_it_is() {
        let piece = Piece::TooLarge {
            index: 7,
            offset: 4096,
            size: 9_000_000,
        };
        let r = from_piece(&piece, "files/big");
        assert_eq!(
            r.payload,
            Payload::Unreadable(
                json!({"reason": "line over the size cap", "file": "files/big",
                "index": 7, "byte_offset": 4096, "size": 9_000_000})
            )
        );
        assert_eq!(r.result_key, "line-7");
    }
}
