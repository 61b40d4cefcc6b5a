//! A delivery's body: read under its cap ([`read_capped`], the reader every request body
//! shares, in `edge/capped_read.rs`), and kept as a dead letter when it is proven but cannot be
//! used.
//!
//! Guarantees: at most the cap plus one chunk is held, whatever `content-length` says or
//! omits (a declared length within the cap is read in one piece: HTTP framing ends the body
//! there, and a longer one is refused all the same); a dead letter that cannot be kept is a
//! 503, so a signed delivery is never dropped unseen.

use serde_json::json;
use worker::Env;

use crate::config::Config;
use crate::inbound::route_log::RouteLog;
use crate::operation::ledger::dead_key;
use crate::timestamp::format_rfc3339;

use crate::edge::outbound::ledger_kv::{write_dead_letter, KV_BINDING};
use crate::edge::{log, EdgeError};

pub use crate::edge::capped_read::read_capped;

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
