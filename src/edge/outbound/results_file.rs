//! Reading one chunk of a batch's results from the results file (downloaded with our key from
//! `GEMINI_API_BASE`, from the chunk's checkpoint with an HTTP `Range`), and the status answer
//! that says where the results are, its inline responses stored as they stream in
//! ([`status_results`], under [`crate::results::inline::INLINE_MAX_BYTES`]).
//!
//! Guarantees: the file is streamed through the splitter ([`crate::results::lines`]) and
//! cancelled once the chunk is full, so memory is one chunk plus one line under its cap; a
//! server that ignores `Range` (200) is read from byte 0 with the bytes before the checkpoint
//! discarded, and a 206 is used only when its `Content-Range` starts at the checkpoint (else a
//! [`FileTrouble::Unavailable`], retried); our key goes only to `GEMINI_API_BASE`'s origin,
//! whatever a redirect says ([`crate::redirect`]); the headers come within
//! [`HEAD_TIMEOUT_MS`] and the chunk within [`BODY_TIMEOUT_MS`] more, and every way the call
//! ends is a chunk or a [`FileTrouble`].

use worker::ResponseBody;

use crate::body_cap::Read;
use crate::config::Config;
use crate::redirect::KEY_HEADER;
use crate::results::inline::{Entry, InlineRead, Located};
use crate::results::item::LINE_CAP;
use crate::results::lines::{Checkpoint, ChunkFill, LineSplitter, Piece};
use crate::results::progress::{FileTrouble, CHUNK_BYTES};
use crate::results::source::{
    body_start, download_url, past_the_end, trouble_of_status, StatusTrouble,
};

use crate::edge::capped_read::each_chunk;
use crate::edge::outbound::status_api::get_head;
use crate::edge::runtime::{js_error, within};

/// The download's headers get this long.
const HEAD_TIMEOUT_MS: i64 = 10_000;
/// A chunk's bytes get this long once the headers came: 8 MiB at a slow 1 MB/s, and the
/// discarded prefix of a server that ignores `Range` on a file of some hundreds of MB.
const BODY_TIMEOUT_MS: i64 = 25_000;

/// One chunk of the file: its lines, where the next chunk starts, and whether this one ends
/// the file.
pub type Chunk = (Vec<Piece>, Checkpoint, bool);

/// Reads the chunk of `file` that starts at `from`: at most `max_results` lines.
pub async fn read_chunk(
    config: &Config,
    file: &str,
    from: Checkpoint,
    max_results: usize,
) -> Result<Chunk, FileTrouble> {
    let url = download_url(&config.gemini_api_base, file);
    // Our key, and a `Range` from the checkpoint (none from byte 0).
    let mut headers = Vec::new();
    if let Some(key) = &config.gemini_api_key {
        headers.push((KEY_HEADER, key.0.clone()));
    }
    if from.offset > 0 {
        headers.push(("range", format!("bytes={}-", from.offset)));
    }
    let (response, controller) = match get_head(&url, &headers, HEAD_TIMEOUT_MS).await {
        Some(Ok(head)) => head,
        Some(Err(e)) => return Err(unavailable(&e.to_string())),
        None => return Err(unavailable("timeout waiting for the download")),
    };
    let status = response.status_code();
    if past_the_end(status, from.offset) {
        controller.abort();
        return Ok((Vec::new(), from, true));
    }
    if let Some(trouble) = trouble_of_status(status) {
        controller.abort();
        return Err(trouble);
    }
    // 206: the stream starts at the checkpoint (its `Content-Range` says so, or the answer
    // is not used); 200: at byte 0, the done part discarded.
    let content_range = response.headers().get("content-range").ok().flatten();
    let stream_start = match body_start(status, content_range.as_deref(), from.offset) {
        Ok(start) => start,
        Err(trouble) => {
            controller.abort();
            return Err(trouble);
        }
    };
    let read = async move {
        let mut splitter = LineSplitter::resume(LINE_CAP, from, stream_start);
        let mut fill = ChunkFill::new(max_results, CHUNK_BYTES);
        let mut full = false;
        if let ResponseBody::Stream(stream) = response.body() {
            each_chunk(stream, |bytes| {
                full = fill.offer(splitter.push(bytes));
                if full {
                    return Read::Enough;
                }
                Read::More
            })
            .await
            .map_err(|e| js_error(&e))?;
        }
        Ok::<_, String>((splitter, fill, full))
    };
    let outcome = within(BODY_TIMEOUT_MS, read).await;
    controller.abort();
    let (splitter, mut fill, full) = match outcome {
        Some(Ok(read)) => read,
        Some(Err(e)) => return Err(unavailable(&e)),
        None => return Err(unavailable("timeout reading the results file")),
    };
    if full {
        return Ok(fill.close(splitter.checkpoint(), false));
    }
    let (tail, end) = splitter.finish();
    fill.offer(tail);
    Ok(fill.close(end, true))
}

fn unavailable(why: &str) -> FileTrouble {
    FileTrouble::Unavailable(why.to_string())
}

/// The operation's status answer, read as a stream for its results ([`InlineRead`]): each
/// inline item is handed to `store` as soon as it is read, so the answer is never held (one
/// chunk, one item under its cap, and 32 bytes an item for their order). Where the results
/// are, or why the answer gave none: the HTTP status and `Retry-After` of an answer that was
/// not a 2xx, or the reason an answer cannot be read (parked, never zero results).
pub async fn status_results(
    config: &Config,
    url: &str,
    mut store: impl FnMut(Vec<Entry>) -> worker::Result<()>,
) -> Result<Located, StatusTrouble> {
    let failed = |trouble, http_status, retry_after| StatusTrouble {
        trouble,
        http_status,
        retry_after,
    };
    let lost = |why: &str| failed(unavailable(why), None, None);
    let headers = super::status_api::headers(config);
    let (response, controller) = match get_head(url, &headers, HEAD_TIMEOUT_MS).await {
        Some(Ok(head)) => head,
        Some(Err(e)) => return Err(lost(&e.to_string())),
        None => return Err(lost("timeout waiting for the status API")),
    };
    let status = response.status_code();
    let retry_after = response.headers().get("retry-after").ok().flatten();
    if let Some(trouble) = trouble_of_status(status).or_else(|| {
        (status != 200).then(|| FileTrouble::Unreadable(format!("{status} from the status API")))
    }) {
        controller.abort();
        return Err(failed(trouble, Some(status), retry_after));
    }
    let read = async {
        let mut reader = InlineRead::default();
        let mut refused: Option<FileTrouble> = None;
        if let ResponseBody::Stream(stream) = response.body() {
            each_chunk(stream, |chunk| {
                let stored = match reader.feed(chunk) {
                    Ok(entries) => store(entries)
                        .map_err(|e| unavailable(&format!("storing the inline results: {e}"))),
                    Err(why) => Err(FileTrouble::Unreadable(why)),
                };
                match stored {
                    Ok(()) => Read::More,
                    Err(trouble) => {
                        refused = Some(trouble);
                        Read::Enough
                    }
                }
            })
            .await
            .map_err(|e| unavailable(&js_error(&e)))?;
        }
        match refused {
            Some(trouble) => Err(trouble),
            None => reader.finish().map_err(FileTrouble::Unreadable),
        }
    };
    let outcome = within(BODY_TIMEOUT_MS, read).await;
    controller.abort();
    match outcome {
        Some(Ok(located)) => Ok(located),
        Some(Err(trouble)) => Err(failed(trouble, None, None)),
        None => Err(lost("timeout reading the status answer")),
    }
}
