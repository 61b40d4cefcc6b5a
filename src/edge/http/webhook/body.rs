//! A delivery's body, read under its cap.
//!
//! Guarantees: at most the cap plus one chunk is held, whatever `content-length` says or
//! omits (a declared length within the cap is read in one piece: HTTP framing ends the body
//! there, and a longer one is refused all the same).

use worker::wasm_bindgen::{JsCast, JsValue};
use worker::wasm_bindgen_futures::JsFuture;
use worker::{js_sys, web_sys};

/// The body, under `cap`: `None` when it is longer. With a `declared` length within the cap
/// (`content-length`, which the headers' screen already held to the cap), in one read: the
/// runtime ends the body at the declared length, so it cannot bring more (and the length is
/// checked all the same). Without one, chunk by chunk as it streams in, refused as soon as it
/// passes `cap` (the rest is cancelled, never buffered). One read costs a delivery one promise
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
    let reader: web_sys::ReadableStreamDefaultReader = stream.get_reader().unchecked_into();
    let mut body = Vec::new();
    loop {
        let step = JsFuture::from(reader.read()).await?;
        if js_sys::Reflect::get(&step, &JsValue::from_str("done"))?
            .as_bool()
            .unwrap_or(true)
        {
            return Ok(Some(body));
        }
        let chunk =
            js_sys::Uint8Array::new(&js_sys::Reflect::get(&step, &JsValue::from_str("value"))?);
        let len = chunk.length() as usize;
        if body.len() + len > cap {
            // Not awaited: the answer goes out now; the runtime drops the rest of the upload.
            let _ = reader.cancel();
            return Ok(None);
        }
        let start = body.len();
        body.resize(start + len, 0);
        chunk.copy_to(&mut body[start..]);
    }
}
