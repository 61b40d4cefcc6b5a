//! `GET /v1/operations`: the ledger's entries that match a query, read from KV metadata only.
//!
//! Guarantees: at most [`MAX_LIST_PAGES`] KV lists a request; an answer that stopped early
//! carries a cursor to resume from, and no entry is answered twice across the pages.

use serde_json::{json, Value};
use worker::{Env, Request, Response};

use crate::config::Config;
use crate::operation::ledger::{LedgerMeta, OP_PREFIX};
use crate::operation::ledger_walk::{LedgerWalk, WalkStep};
use crate::operator::listing::{encode_cursor, ListQuery};
use crate::refusal::Refusal;
use crate::timestamp::format_rfc3339;

use crate::edge::http::json_answer::ok_json;
use crate::edge::outbound::ledger_kv::{list_page, KV_BINDING};
use crate::edge::runtime::now_ms;

/// KV pages one listing request may scan looking for matches.
const MAX_LIST_PAGES: usize = 5;

/// Lists ledger entries matching the query, from metadata only.
pub async fn list(req: &Request, env: &Env, config: &Config) -> Result<Response, Refusal> {
    let url = req.url().map_err(|e| Refusal::BadRequest(e.to_string()))?;
    let pairs: Vec<(String, String)> = url
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let query = ListQuery::parse(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .map_err(|e| Refusal::BadRequest(e.to_string()))?;
    let kv = env.kv(KV_BINDING)?;
    let now_secs = now_ms().div_euclid(1_000);
    // A key prefix narrows the listing itself; every other filter reads metadata.
    let prefix = format!("{OP_PREFIX}{}", query.prefix.as_deref().unwrap_or(""));
    let mut walk = LedgerWalk::new(query.resume.clone(), MAX_LIST_PAGES);
    let mut found: Vec<Value> = Vec::new();
    let end = loop {
        match walk.step() {
            WalkStep::List { cursor } => walk.on_page(list_page(&kv, &prefix, cursor).await?),
            // A full answer stops before its next entry, which the cursor resumes at.
            WalkStep::Entry(_) if found.len() == query.limit => break Some(walk.cursor()),
            WalkStep::Entry(entry) => {
                walk.pass();
                let meta = entry
                    .metadata
                    .and_then(|m| serde_json::from_value::<LedgerMeta>(m).ok());
                let key = &entry.name[OP_PREFIX.len()..];
                if let Some(meta) = meta.filter(|m| {
                    query.matches(m, now_secs, config.stuck_after_secs) && query.matches_key(key, m)
                }) {
                    found.push(entry_view(key, &meta, now_secs, config));
                }
            }
            WalkStep::End(end) => break end,
        }
    };
    let cursor = end.as_ref().map(encode_cursor);
    ok_json(&json!({"operations": found, "cursor": cursor, "complete": end.is_none()}))
}

fn entry_view(key: &str, meta: &LedgerMeta, now_secs: i64, config: &Config) -> Value {
    let terminal = meta.status.is_terminal();
    json!({
        "key": key,
        "name": meta.name,
        "kind": meta.kind,
        "status": meta.status,
        "settled_by": meta.settled_by,
        "effect_done": meta.effect_done,
        "effect_parked": meta.parked,
        "forgotten": meta.forgotten,
        "submitted_at": format_rfc3339(meta.submitted_at * 1_000),
        "settled_at": meta.settled_at.map(|s| format_rfc3339(s * 1_000)),
        "age_seconds": now_secs - meta.submitted_at,
        "stuck": !terminal && !meta.forgotten && now_secs - meta.submitted_at >= config.stuck_after_secs,
        "alerts": meta.alerts,
        "destination": config.destination_label(meta.kind.as_deref()),
        "error": meta.error,
        "effect_latency_ms": meta.effect_ms,
    })
}
