//! Writes to the KV ledger: operation projections and dead letters.
//!
//! Guarantees: a failed write is reported, never hidden, so the caller can keep the truth
//! (the gate) dirty and try again; the ledger is never read on the webhook path.

use serde_json::Value;
use worker::KvStore;

use crate::ledger::Projection;

/// The KV namespace binding.
pub const KV_BINDING: &str = "OPS_KV";

/// Writes one projection (value, metadata and, for closed operations, its TTL).
pub async fn write_projection(kv: &KvStore, p: &Projection) -> Result<(), String> {
    let mut put = kv
        .put(&p.kv_key, p.value.clone())
        .map_err(|e| format!("{e:?}"))?
        .metadata(&p.metadata)
        .map_err(|e| format!("{e:?}"))?;
    if let Some(ttl) = p.ttl_secs {
        put = put.expiration_ttl(ttl);
    }
    put.execute().await.map_err(|e| format!("{e:?}"))
}

/// Keeps a signed delivery that could not be used, for `ttl_secs`.
pub async fn write_dead_letter(
    kv: &KvStore,
    key: &str,
    value: &Value,
    ttl_secs: u64,
) -> Result<(), String> {
    kv.put(key, value.to_string())
        .map_err(|e| format!("{e:?}"))?
        .expiration_ttl(ttl_secs)
        .execute()
        .await
        .map_err(|e| format!("{e:?}"))
}
