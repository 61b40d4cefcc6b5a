//! A results file's lines, read from a stream of byte chunks of any size, in bounded memory.
//!
//! Guarantees: at most `cap` bytes of one line are ever held; a longer line is not buffered but
//! reported as [`Piece::TooLarge`] with its index, byte offset and size, and reading goes on after
//! its newline. Lines end at `\n` (a `\r` before it dropped); a last line without one is a line. A
//! blank line is not a result and takes no index, so a result's index is its position among the
//! file's results on every read. Reading resumes from a [`Checkpoint`], from a stream that starts
//! there (an honoured `Range`) or at byte 0 (the bytes before the checkpoint discarded unread).

use serde::{Deserialize, Serialize};

/// Where reading stands: the byte offset of the first line not yet handed out, and the index
/// that line will take. Everything before it has been handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Checkpoint {
    pub offset: u64,
    pub index: u64,
}

/// One result's line as the splitter found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// A line within the cap, without its `\n` or `\r\n`.
    Line {
        index: u64,
        offset: u64,
        bytes: Vec<u8>,
    },
    /// A line over the cap: never buffered. `size` counts its bytes before the `\n`.
    TooLarge { index: u64, offset: u64, size: u64 },
}

impl Piece {
    /// Where this line starts: the checkpoint to resume at when a chunk ends before it.
    pub fn start(&self) -> Checkpoint {
        let (Piece::Line { index, offset, .. } | Piece::TooLarge { index, offset, .. }) = *self;
        Checkpoint { offset, index }
    }
}

/// The incremental splitter. Feed it chunks with [`LineSplitter::push`], then call
/// [`LineSplitter::finish`] at the end of the stream.
#[derive(Debug)]
pub struct LineSplitter {
    cap: usize,
    /// Bytes of the stream seen so far (its position), counting discarded ones.
    position: u64,
    /// Bytes before this offset are discarded unread (a resumed read without `Range`).
    discard_until: u64,
    /// The current line's start, and the index its result will take if it is not blank.
    line_start: u64,
    next_index: u64,
    buffer: Vec<u8>,
    /// Set while a line over the cap is skipped: its size so far.
    skipping: Option<u64>,
}

impl LineSplitter {
    /// A splitter for a stream read from byte 0.
    #[cfg(test)]
    pub fn new(cap: usize) -> LineSplitter {
        LineSplitter::resume(cap, Checkpoint::default(), 0)
    }

    /// A splitter resuming at `from`, for a stream whose first byte is at `stream_start`: the
    /// checkpoint's offset when the server honoured a `Range`, 0 when it sent the whole file
    /// (the bytes before the checkpoint are then discarded).
    pub fn resume(cap: usize, from: Checkpoint, stream_start: u64) -> LineSplitter {
        LineSplitter {
            cap,
            position: stream_start.min(from.offset),
            discard_until: from.offset,
            line_start: from.offset,
            next_index: from.index,
            buffer: Vec::new(),
            skipping: None,
        }
    }

    /// Where reading stands: the start of the line being read, and its index.
    pub fn checkpoint(&self) -> Checkpoint {
        let (offset, index) = (self.line_start, self.next_index);
        Checkpoint { offset, index }
    }

    /// Takes the next chunk; returns the lines it completed, in order.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<Piece> {
        let mut chunk = chunk;
        if self.position < self.discard_until {
            let skip = (self.discard_until - self.position).min(chunk.len() as u64) as usize;
            self.position += skip as u64;
            chunk = &chunk[skip..];
        }
        let mut out = Vec::new();
        while !chunk.is_empty() {
            let newline = chunk.iter().position(|b| *b == b'\n');
            let segment = &chunk[..newline.unwrap_or(chunk.len())];
            self.take(segment);
            self.position += segment.len() as u64;
            let Some(at) = newline else { break };
            self.position += 1;
            out.extend(self.end_line(self.position));
            chunk = &chunk[at + 1..];
        }
        out
    }

    /// The end of the stream: the last line, when it had no newline.
    pub fn finish(mut self) -> (Option<Piece>, Checkpoint) {
        let last = self.end_line(self.position);
        (last, self.checkpoint())
    }

    fn take(&mut self, segment: &[u8]) {
        if let Some(size) = self.skipping.as_mut() {
            *size += segment.len() as u64;
        } else if self.buffer.len() + segment.len() > self.cap {
            // Over the cap: count the line instead of holding it.
            self.skipping = Some((self.buffer.len() + segment.len()) as u64);
            self.buffer = Vec::new();
        } else {
            self.buffer.extend_from_slice(segment);
        }
    }

    /// Closes the current line; `next_start` is where the next one begins.
    fn end_line(&mut self, next_start: u64) -> Option<Piece> {
        let offset = self.line_start;
        self.line_start = next_start;
        if let Some(size) = self.skipping.take() {
            return Some(self.numbered(|index| Piece::TooLarge {
                index,
                offset,
                size,
            }));
        }
        let mut bytes = std::mem::take(&mut self.buffer);
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        Some(self.numbered(|index| Piece::Line {
            index,
            offset,
            bytes,
        }))
    }

    fn numbered(&mut self, piece: impl FnOnce(u64) -> Piece) -> Piece {
        let index = self.next_index;
        self.next_index += 1;
        piece(index)
    }
}

/// One chunk's lines, gathered from the splitter's output: at most `max_results` lines and,
/// past `max_bytes` of them, no more. What is not taken is read again by the next chunk.
#[derive(Debug, Default)]
pub struct ChunkFill {
    max_results: usize,
    max_bytes: u64,
    pieces: Vec<Piece>,
    bytes: u64,
    /// The first line not taken, once the chunk is full.
    stop: Option<Checkpoint>,
}

impl ChunkFill {
    /// An empty chunk with its bounds.
    pub fn new(max_results: usize, max_bytes: u64) -> ChunkFill {
        ChunkFill {
            max_results,
            max_bytes,
            ..ChunkFill::default()
        }
    }

    /// Takes lines while there is room; returns whether the chunk is full (stop reading).
    pub fn offer(&mut self, pieces: impl IntoIterator<Item = Piece>) -> bool {
        for piece in pieces {
            if self.stop.is_some() {
                break;
            }
            if self.pieces.len() >= self.max_results || self.bytes >= self.max_bytes {
                self.stop = Some(piece.start());
                break;
            }
            if let Piece::Line { bytes, .. } = &piece {
                self.bytes += bytes.len() as u64;
            }
            self.pieces.push(piece);
        }
        self.stop.is_some() || self.pieces.len() >= self.max_results
    }

    /// The chunk's lines, where the next chunk starts, and whether this one ends the file.
    /// `reader_at` is the splitter's checkpoint; `at_end` says the stream was read to its end
    /// (and [`LineSplitter::finish`] offered).
    pub fn close(self, reader_at: Checkpoint, at_end: bool) -> (Vec<Piece>, Checkpoint, bool) {
        match self.stop {
            Some(stop) => (self.pieces, stop, false),
            None => (self.pieces, reader_at, at_end),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(piece: &Piece) -> String {
        match piece {
            Piece::Line { bytes, .. } => String::from_utf8(bytes.clone()).unwrap(),
            Piece::TooLarge { size, .. } => format!("<{size}>"),
        }
    }

    /// Feeds `file` in chunks of `size` bytes and returns every piece and the end checkpoint.
    fn split(file: &[u8], size: usize, cap: usize) -> (Vec<Piece>, Checkpoint) {
        let mut s = LineSplitter::new(cap);
        let mut out: Vec<Piece> = file.chunks(size).flat_map(|c| s.push(c)).collect();
        let (last, end) = s.finish();
        out.extend(last);
        (out, end)
    }

    #[test]
    fn lines_spanning_chunks_of_any_size_read_the_same() {
        let file = b"{\"a\":1}\n{\"b\":22}\n{\"c\":333}";
        let (whole, end) = split(file, file.len(), 100);
        for size in 1..file.len() {
            assert_eq!(split(file, size, 100).0, whole, "chunks of {size}");
        }
        let texts: Vec<String> = whole.iter().map(text).collect();
        assert_eq!(texts, ["{\"a\":1}", "{\"b\":22}", "{\"c\":333}"]);
        let offsets: Vec<u64> = whole
            .iter()
            .map(|p| match p {
                Piece::Line { offset, .. } | Piece::TooLarge { offset, .. } => *offset,
            })
            .collect();
        assert_eq!(offsets, [0, 8, 17]);
        assert_eq!(
            end,
            Checkpoint {
                offset: file.len() as u64,
                index: 3
            }
        );
    }

    #[test]
    fn blank_lines_are_skipped_and_take_no_index() {
        let (pieces, end) = split(b"\n{\"a\":1}\n  \r\n\n{\"b\":2}\n\n", 3, 100);
        let indexes: Vec<u64> = pieces.iter().map(|p| p.start().index).collect();
        assert_eq!(indexes, [0, 1]);
        assert_eq!(end.index, 2);
    }

    #[test]
    fn crlf_reads_like_lf() {
        let (crlf, _) = split(b"{\"a\":1}\r\n{\"b\":2}\r\n", 4, 100);
        let (lf, _) = split(b"{\"a\":1}\n{\"b\":2}\n", 4, 100);
        let t = |v: &[Piece]| v.iter().map(text).collect::<Vec<_>>();
        assert_eq!(t(&crlf), t(&lf));
    }

    #[test]
    fn a_line_over_the_cap_is_counted_not_held_and_reading_goes_on() {
        let long = "x".repeat(50);
        let file = format!("{{\"a\":1}}\n{long}\n{{\"b\":2}}\n");
        for size in [1, 7, 64, file.len()] {
            let mut s = LineSplitter::new(10);
            let mut out = Vec::new();
            for c in file.as_bytes().chunks(size) {
                out.extend(s.push(c));
                assert!(s.buffer.len() <= 10, "never more than the cap held");
            }
            assert_eq!(
                out[1],
                Piece::TooLarge {
                    index: 1,
                    offset: 8,
                    size: 50
                }
            );
            assert_eq!(text(&out[2]), "{\"b\":2}");
            assert_eq!(out[2].start().index, 2);
        }
    }

    #[test]
    fn a_line_exactly_at_the_cap_is_a_line() {
        let (pieces, _) = split(b"0123456789\n", 4, 10);
        assert_eq!(text(&pieces[0]), "0123456789");
    }

    #[test]
    fn resuming_from_a_checkpoint_with_or_without_range_gives_the_rest() {
        let file = b"{\"a\":1}\n\n{\"b\":2}\n{\"c\":3}\n{\"d\":4}";
        let (all, _) = split(file, 5, 100);
        let mut first = LineSplitter::new(100);
        let mut seen = first.push(&file[..20]);
        let at = first.checkpoint();
        assert_eq!(seen.len(), 2);
        // A server that honoured Range sends from the checkpoint on.
        let mut ranged = LineSplitter::resume(100, at, at.offset);
        let mut rest: Vec<Piece> = file[at.offset as usize..]
            .chunks(3)
            .flat_map(|c| ranged.push(c))
            .collect();
        rest.extend(ranged.finish().0);
        // One that did not sends the whole file again: the done part is discarded.
        let mut whole = LineSplitter::resume(100, at, 0);
        let mut again: Vec<Piece> = file.chunks(3).flat_map(|c| whole.push(c)).collect();
        again.extend(whole.finish().0);
        assert_eq!(rest, again);
        seen.extend(rest);
        assert_eq!(seen, all);
    }

    #[test]
    fn chunks_cover_the_file_once_and_resume_where_the_last_stopped() {
        let file: String = (0..10).map(|i| format!("{{\"k\":{i}}}\n")).collect();
        let mut from = Checkpoint::default();
        let mut taken = Vec::new();
        loop {
            let mut s = LineSplitter::resume(100, from, 0);
            let mut fill = ChunkFill::new(4, 1_000);
            let mut full = false;
            for c in file.as_bytes().chunks(5) {
                if fill.offer(s.push(c)) {
                    full = true;
                    break;
                }
            }
            let (pieces, to, last) = if full {
                fill.close(s.checkpoint(), false)
            } else {
                let (tail, end) = s.finish();
                fill.offer(tail);
                fill.close(end, true)
            };
            assert!(pieces.len() <= 4);
            taken.extend(pieces.iter().map(|p| p.start().index));
            from = to;
            if last {
                break;
            }
        }
        assert_eq!(taken, (0..10).collect::<Vec<u64>>());
    }

    #[test]
    fn a_chunk_stops_past_its_bytes() {
        let mut fill = ChunkFill::new(100, 10);
        let line = |index| Piece::Line {
            index,
            offset: index * 9,
            bytes: b"12345678".to_vec(),
        };
        assert!(!fill.offer([line(0)]));
        assert!(fill.offer([line(1), line(2)]));
        let (pieces, to, last) = fill.close(Checkpoint::default(), true);
        assert_eq!(pieces.len(), 2);
        assert_eq!(
            to,
            Checkpoint {
                offset: 18,
                index: 2
            }
        );
        assert!(!last);
    }
}
