//! A delivery's body: read under its cap, and kept as a dead letter when it is proven but
//! cannot be used.
//!
//! Guarantees: at most the cap plus one chunk is held, whatever `content-length` says or
//! omits (a declared length within the cap is read in one piece: HTTP framing ends the body
//! there, and a longer one is refused all the same); a dead letter that cannot be kept is a
//! 503, so a signed delivery is never dropped unseen.

use serde_json::json;
use worker::wasm_bindgen::{JsCast, JsValue};
use worker::wasm_bindgen_futures::JsFuture;
use worker::{js_sys, web_sys, Env};

use crate::config::Config;
use crate::inbound::route_log::RouteLog;
use crate::operation::ledger::dead_key;
use crate::timestamp::format_rfc3339;

use crate::edge::outbound::ledger_kv::{write_dead_letter, KV_BINDING};
use crate::edge::{log, EdgeError};

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

/// A delivery as received, for its dead letter.
pub struct Received<'a> {
    pub delivery_id: &'a str,
    pub timestamp: Option<&'a str>,
    pub body: &'a [u8],
    pub now: i64,
}

/// Keeps a verified but unusable delivery as `dead:<webhook-id>`.
pub async fn keep_dead_letter(
    env: &Env,
    config: &Config,
    received: &Received<'_>,
    reason: &'static str,
) -> Result<(), EdgeError> {
    let key = dead_key(received.delivery_id);
    let value = json!({
        "webhook_id": received.delivery_id,
        "webhook_timestamp": received.timestamp,
        "received_at": format_rfc3339(received.now),
        "reason": reason,
        "body": String::from_utf8_lossy(received.body),
        "body_is_utf8": std::str::from_utf8(received.body).is_ok(),
    });
    let kv = env
        .kv(KV_BINDING)
        .map_err(|e| EdgeError::Unavailable(e.to_string()))?;
    write_dead_letter(&kv, &key, &value, config.kv_ttl_secs()).await?;
    let line = RouteLog::DeadLetter {
        reason,
        webhook_id: received.delivery_id.to_string(),
        kv_key: key,
    };
    log(line.to_value());
    Ok(())
}
