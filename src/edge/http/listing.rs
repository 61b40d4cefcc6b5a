//! `GET /v1/operations`: the ledger's entries that match a query, read from KV metadata only.
//!
//! Guarantees: at most [`MAX_LIST_PAGES`] KV lists a request; an answer that stopped early
//! carries a cursor to resume from, and no entry is answered twice across the pages.

use serde_json::{json, Value};
use worker::{Env, Request, Response};

use crate::admin::{encode_cursor, ListQuery};
use crate::config::Config;
use crate::operation::ledger::{LedgerMeta, OP_PREFIX};
use crate::reconciliation::lease_state::Resume;
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
    let kv = env
        .kv(KV_BINDING)
        .map_err(|e| Refusal::Unavailable(e.to_string()))?;
    let now_secs = now_ms().div_euclid(1_000);
    let mut resume = query.resume.clone();
    let mut found: Vec<Value> = Vec::new();
    for _ in 0..MAX_LIST_PAGES {
        // A key prefix narrows the listing itself; every other filter reads metadata.
        let prefix = format!("{OP_PREFIX}{}", query.prefix.as_deref().unwrap_or(""));
        let page = list_page(&kv, &prefix, resume.cursor.clone()).await?;
        for entry in &page.keys {
            if resume.already_done(&entry.name) {
                continue;
            }
            if found.len() == query.limit {
                return ok_json(
                    &json!({"operations": found, "cursor": encode_cursor(&resume), "complete": false}),
                );
            }
            resume.after_key = Some(entry.name.clone());
            let Some(meta) = entry
                .metadata
                .clone()
                .and_then(|m| serde_json::from_value::<LedgerMeta>(m).ok())
            else {
                continue;
            };
            let key = &entry.name[OP_PREFIX.len()..];
            if query.matches(&meta, now_secs, config.stuck_after_secs)
                && query.matches_key(key, &meta)
            {
                found.push(entry_view(key, &meta, now_secs, config));
            }
        }
        if page.list_complete || page.cursor.is_none() {
            return ok_json(&json!({"operations": found, "cursor": null, "complete": true}));
        }
        resume = Resume {
            cursor: page.cursor.clone(),
            after_key: None,
        };
    }
    ok_json(&json!({"operations": found, "cursor": encode_cursor(&resume), "complete": false}))
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
