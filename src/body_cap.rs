//! A body from outside, read under a cap while it streams: the pure part of every capped read
//! at the edge (a delivery's body, an admin or bulk request's body, a destination's or an alert
//! sink's answer, the dynamic-webhook key set, Gemini's webhook listing).
//!
//! Guarantees: a [`CappedBody`] is fed the chunks as they arrive and says after each one whether to
//! read on ([`Read::More`]) or to stop and cancel the rest ([`Read::Enough`]); it never holds more
//! than its cap. A [`CappedBody::whole`] body stops at the first chunk that passes the cap, which
//! is not kept, and is refused ([`TooLarge`]); a [`CappedBody::excerpt`] stops once it holds its
//! cap and keeps the first `cap` bytes (an answer read only to be quoted). A declared length over
//! the cap is refused before a byte is read ([`declared_over`]). So the edge holds at most the cap
//! plus the one chunk in hand, however long the body is or however long its sender keeps it open.

/// What to do after a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// Read the next chunk.
    More,
    /// Stop here: the rest is cancelled, never read.
    Enough,
}

/// A whole body passed its cap: refused, and read no further.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("body over {cap} bytes")]
pub struct TooLarge {
    pub cap: usize,
}

/// A body being read under a cap.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CappedBody {
    cap: usize,
    /// Past the cap, keep the first `cap` bytes (an excerpt) rather than refuse the body.
    cut: bool,
    kept: Vec<u8>,
    /// The body passed the cap: bytes were left unread (or, for an excerpt, dropped).
    over: bool,
}

impl CappedBody {
    /// A body wanted whole: one longer than `cap` bytes is refused.
    pub fn whole(cap: usize) -> CappedBody {
        CappedBody {
            cap,
            ..CappedBody::default()
        }
    }

    /// A body wanted only as an excerpt: its first `cap` bytes, the rest never read.
    pub fn excerpt(cap: usize) -> CappedBody {
        CappedBody {
            cut: true,
            ..CappedBody::whole(cap)
        }
    }

    /// The next chunk as it arrived; whether to read another.
    pub fn feed(&mut self, chunk: &[u8]) -> Read {
        if self.over {
            return Read::Enough;
        }
        let room = self.cap - self.kept.len();
        if chunk.len() > room {
            self.over = true;
            if self.cut {
                self.kept.extend_from_slice(&chunk[..room]);
            }
            return Read::Enough;
        }
        self.kept.extend_from_slice(chunk);
        // An excerpt that is full needs nothing more; a whole body must learn whether more
        // comes, so it reads on until the end or the first byte past the cap.
        if self.cut && self.kept.len() == self.cap {
            return Read::Enough;
        }
        Read::More
    }

    /// Whether the body went past the cap (an excerpt then lacks its end).
    #[cfg(test)]
    pub fn over(&self) -> bool {
        self.over
    }

    /// The body: whole, or refused past the cap; an excerpt is never refused.
    pub fn finish(self) -> Result<Vec<u8>, TooLarge> {
        if self.over && !self.cut {
            return Err(TooLarge { cap: self.cap });
        }
        Ok(self.kept)
    }
}

/// A declared length (`content-length`) over `cap`: refused before a byte is read.
pub fn declared_over(declared: Option<usize>, cap: usize) -> bool {
    declared.is_some_and(|n| n > cap)
}

/// Bytes to read for an excerpt of `max_chars` characters: UTF-8 takes at most 4 a character.
pub fn excerpt_bytes(max_chars: usize) -> usize {
    max_chars.saturating_mul(4)
}

/// The first `max_chars` characters of `bytes` as text. A character cut by the end of an excerpt is
/// left out; bytes that are not UTF-8 become U+FFFD, so a binary answer still shows what it was.
pub fn excerpt_text(bytes: &[u8], max_chars: usize) -> String {
    let whole = match std::str::from_utf8(bytes) {
        // Only an incomplete character at the very end: drop it.
        Err(e) if e.error_len().is_none() => &bytes[..e.valid_up_to()],
        _ => bytes,
    };
    String::from_utf8_lossy(whole)
        .chars()
        .take(max_chars)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed_all(body: &mut CappedBody, chunks: &[&[u8]]) -> (usize, Read) {
        let mut read = 0;
        for chunk in chunks {
            read += 1;
            if body.feed(chunk) == Read::Enough {
                return (read, Read::Enough);
            }
        }
        (read, Read::More)
    }

    #[test]
    fn a_whole_body_within_the_cap_is_kept_and_read_to_its_end() {
        let mut body = CappedBody::whole(10);
        assert_eq!(
            feed_all(&mut body, &[b"hello", b" ", b"you!"]),
            (3, Read::More)
        );
        assert!(!body.over());
        assert_eq!(body.finish().unwrap(), b"hello you!");
    }

    #[test]
    fn a_whole_body_exactly_at_the_cap_reads_on_to_learn_whether_more_comes() {
        let mut body = CappedBody::whole(4);
        assert_eq!(
            body.feed(b"abcd"),
            Read::More,
            "full, but its end is not known yet"
        );
        assert_eq!(body.clone().finish().unwrap(), b"abcd");
        assert_eq!(body.feed(b"e"), Read::Enough, "one byte past the cap");
        assert_eq!(body.finish(), Err(TooLarge { cap: 4 }));
    }

    #[test]
    fn a_whole_body_stops_at_the_first_chunk_past_the_cap_and_keeps_nothing_of_it() {
        let mut body = CappedBody::whole(16 * 1024);
        let chunk = vec![b'x'; 1024];
        let mut fed = 0;
        // An endless upload: the reader stops at the chunk that passes the cap.
        while body.feed(&chunk) == Read::More {
            fed += 1;
            assert!(fed <= 16, "read past the cap");
        }
        assert_eq!(fed, 16);
        assert!(body.kept.len() <= 16 * 1024, "never more than the cap held");
        assert_eq!(body.feed(b"more"), Read::Enough, "and stays stopped");
        let refused = body.finish().unwrap_err();
        assert_eq!(refused.to_string(), "body over 16384 bytes");
    }

    #[test]
    fn an_excerpt_keeps_the_first_cap_bytes_and_stops_as_soon_as_it_has_them() {
        let mut body = CappedBody::excerpt(6);
        assert_eq!(
            feed_all(&mut body, &[b"abc", b"defgh", b"never read"]),
            (2, Read::Enough)
        );
        assert!(body.over());
        assert_eq!(body.finish().unwrap(), b"abcdef");
        let mut exact = CappedBody::excerpt(3);
        assert_eq!(
            exact.feed(b"abc"),
            Read::Enough,
            "full: nothing more is needed"
        );
        assert!(!exact.over(), "nothing was dropped");
        let mut short = CappedBody::excerpt(300);
        assert_eq!(short.feed(b"ok"), Read::More);
        assert_eq!(short.finish().unwrap(), b"ok");
    }

    #[test]
    fn an_empty_body_is_empty() {
        assert_eq!(CappedBody::whole(0).finish().unwrap(), b"");
        let mut zero = CappedBody::whole(0);
        assert_eq!(zero.feed(b""), Read::More);
        assert_eq!(zero.feed(b"x"), Read::Enough);
        assert!(zero.finish().is_err());
    }

    #[test]
    fn a_declared_length_over_the_cap_is_refused_before_reading() {
        assert!(declared_over(Some(16 * 1024 + 1), 16 * 1024));
        assert!(!declared_over(Some(16 * 1024), 16 * 1024));
        assert!(
            !declared_over(None, 16 * 1024),
            "unknown: read and capped as it streams"
        );
    }

    #[test]
    fn an_excerpt_as_text_drops_a_character_cut_at_its_end_and_marks_bytes_that_are_not_utf8() {
        let text = "héé".as_bytes(); // h, then two 2-byte characters
        assert_eq!(excerpt_text(&text[..4], 10), "hé", "the cut é is left out");
        assert_eq!(excerpt_text(text, 2), "hé", "at most max_chars");
        assert_eq!(excerpt_text(b"a\xffb", 10), "a\u{fffd}b");
        assert_eq!(excerpt_text(b"", 10), "");
        assert_eq!(excerpt_bytes(300), 1_200);
        // The bytes an excerpt reads hold max_chars characters of any width.
        let wide = "😀".repeat(400);
        let mut body = CappedBody::excerpt(excerpt_bytes(300));
        body.feed(wide.as_bytes());
        assert_eq!(
            excerpt_text(&body.finish().unwrap(), 300).chars().count(),
            300
        );
    }
}
