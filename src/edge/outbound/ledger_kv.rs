//! Writes to the KV ledger: operation projections (with their `open:` index entry) and dead
//! letters.
//!
//! Guarantees: a failed write is reported, never hidden, so the caller can keep the truth
//! (the gate) dirty and try again; the ledger is never read on the webhook path. A projection
//! is one KV write, or two when the index changes with it (a put while the operation may need
//! work, one delete when it closes); the two go out together.

use serde_json::Value;
use worker::{Env, KvStore};

use crate::operation::ledger::{IndexWrite, Projection};
use crate::operation::ledger_walk::{ListedKey, ListedPage};
use crate::reconciliation::pass::PAGE_SIZE;
use crate::refusal::Refusal;

/// The KV namespace binding.
pub const KV_BINDING: &str = "OPS_KV";

/// One page of the ledger's keys under `prefix`, after `cursor`: the pass's page size (KV's
/// most, 1,000 keys), with each key's metadata.
pub async fn list_page(
    kv: &KvStore,
    prefix: &str,
    cursor: Option<String>,
) -> Result<ListedPage, Refusal> {
    let mut list = kv.list().prefix(prefix.to_string()).limit(PAGE_SIZE);
    if let Some(c) = cursor {
        list = list.cursor(c);
    }
    let page = list.execute().await?;
    Ok(ListedPage {
        keys: page
            .keys
            .into_iter()
            .map(|k| ListedKey {
                name: k.name,
                metadata: k.metadata,
            })
            .collect(),
        cursor: page.cursor,
        list_complete: page.list_complete,
    })
}

/// Writes one projection (value, metadata and, for closed operations, its TTL) and the index
/// write that goes with it; an error if either failed (both are safe to repeat).
pub async fn write_projection(env: &Env, p: &Projection, index: IndexWrite) -> Result<(), Refusal> {
    let kv = env.kv(KV_BINDING)?;
    let (entry, index) = futures_util::join!(write_entry(&kv, p), write_index(&kv, p, index));
    entry.and(index)
}

/// The `open:` entry: an empty value with the projection's metadata (the pass reads no value),
/// and no TTL (an open operation never expires; the close deletes it).
async fn write_index(kv: &KvStore, p: &Projection, index: IndexWrite) -> Result<(), Refusal> {
    match index {
        IndexWrite::None => Ok(()),
        IndexWrite::Put => kv
            .put(&p.open_key(), "")?
            .metadata(&p.metadata)?
            .execute()
            .await
            .map_err(|e| Refusal::Unavailable(format!("index put: {e:?}"))),
        IndexWrite::Delete => kv
            .delete(&p.open_key())
            .await
            .map_err(|e| Refusal::Unavailable(format!("index delete: {e:?}"))),
    }
}

async fn write_entry(kv: &KvStore, p: &Projection) -> Result<(), Refusal> {
    let mut put = kv.put(&p.kv_key, p.value.clone())?.metadata(&p.metadata)?;
    if let Some(ttl) = p.ttl_secs {
        put = put.expiration_ttl(ttl);
    }
    put.execute().await.map_err(Refusal::from)
}

/// Keeps a signed delivery that could not be used, for `ttl_secs`.
pub async fn write_dead_letter(
    env: &Env,
    key: &str,
    value: &Value,
    ttl_secs: u64,
) -> Result<(), Refusal> {
    env.kv(KV_BINDING)?
        .put(key, value.to_string())?
        .expiration_ttl(ttl_secs)
        .execute()
        .await
        .map_err(Refusal::from)
}
