//! Reading a stream from outside chunk by chunk, under a cap: the one reading loop behind every
//! body the worker takes from outside (a delivery's, an admin or bulk request's, an outbound
//! call's answer, and a status answer through its skimmer). What to keep and when to stop is
//! the pure core's ([`crate::body_cap`], [`crate::skim`]).
//!
//! Guarantees: each chunk is handed over as the runtime delivers it, and as soon as the taker
//! has enough the rest of the stream is cancelled, never read; so memory is what the taker
//! keeps plus the chunk in hand, whatever the sender declares or however long it keeps the
//! stream open. A request declared over its cap is refused before a byte is read; one declared
//! within it is read in one piece (HTTP framing ends it at the declared length, and its length
//! is checked all the same).

use worker::wasm_bindgen::{JsCast, JsValue};
use worker::wasm_bindgen_futures::JsFuture;
use worker::{js_sys, web_sys, Request, Response, ResponseBody};

use crate::body_cap::{declared_over, CappedBody, Read};
use crate::inbound::intake::Headers;
use crate::refusal::Refusal;

use crate::edge::runtime::js_error;

/// Hands each chunk of `stream` to `take` as it arrives, until the stream ends or `take` says
/// [`Read::Enough`]: the rest is then cancelled (not awaited: the caller answers at once and
/// the runtime drops the rest).
pub async fn each_chunk(
    stream: &web_sys::ReadableStream,
    mut take: impl FnMut(&[u8]) -> Read,
) -> Result<(), JsValue> {
    let reader: web_sys::ReadableStreamDefaultReader = stream.get_reader().unchecked_into();
    loop {
        let step = JsFuture::from(reader.read()).await?;
        if js_sys::Reflect::get(&step, &JsValue::from_str("done"))?
            .as_bool()
            .unwrap_or(true)
        {
            return Ok(());
        }
        let chunk =
            js_sys::Uint8Array::new(&js_sys::Reflect::get(&step, &JsValue::from_str("value"))?);
        if take(&chunk.to_vec()) == Read::Enough {
            let _ = reader.cancel();
            return Ok(());
        }
    }
}

/// A request's body, under `cap`: `None` when it is longer. With a `declared` length within
/// the cap (`content-length`, which the caller already held to the cap), in one read: the
/// runtime ends the body at the declared length, so it cannot bring more (and the length is
/// checked all the same). Without one, chunk by chunk as it streams in, refused as soon as it
/// passes `cap` (the rest is cancelled, never buffered). One read costs a request one promise
/// instead of one per chunk and the end.
pub async fn read_capped(
    req: &web_sys::Request,
    cap: usize,
    declared: Option<usize>,
) -> Result<Option<Vec<u8>>, JsValue> {
    let Some(stream) = req.body() else {
        return Ok(Some(Vec::new()));
    };
    if declared.is_some_and(|n| n <= cap) {
        let buffer = JsFuture::from(req.array_buffer()?).await?;
        let bytes = js_sys::Uint8Array::new(&buffer);
        return Ok((bytes.length() as usize <= cap).then(|| bytes.to_vec()));
    }
    let mut body = CappedBody::whole(cap);
    each_chunk(&stream, |chunk| body.feed(chunk)).await?;
    Ok(body.finish().ok())
}

/// An admin or bulk request's body, under `cap`: 413 at once for a `content-length` over it,
/// else 413 as soon as the streamed bytes pass it; 400 for a body that cannot be read.
pub async fn request_body(req: &Request, cap: usize) -> Result<Vec<u8>, Refusal> {
    let length = req.headers().get("content-length").ok().flatten();
    let declared = Headers {
        content_length: length.as_deref(),
        ..Headers::default()
    }
    .declared_length();
    if declared_over(declared, cap) {
        return Err(Refusal::TooLarge);
    }
    let body = read_capped(req.inner(), cap, declared).await;
    body.map_err(|e| unreadable(&e))?.ok_or(Refusal::TooLarge)
}

/// A body that could not be read: 400.
pub fn unreadable(e: &JsValue) -> Refusal {
    Refusal::BadRequest(format!("unreadable body: {}", js_error(e)))
}

/// Reads `response`'s body into `body` as far as it wants: chunk by chunk, the rest cancelled
/// once it has enough. A body the runtime already holds is fed at once.
pub async fn read_answer(response: &Response, mut body: CappedBody) -> Result<CappedBody, JsValue> {
    match response.body() {
        ResponseBody::Empty => {}
        ResponseBody::Body(bytes) => {
            body.feed(bytes);
        }
        ResponseBody::Stream(stream) => each_chunk(stream, |chunk| body.feed(chunk)).await?,
    }
    Ok(body)
}
