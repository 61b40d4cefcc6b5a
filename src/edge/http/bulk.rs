//! `POST /v1/bulk/retry` and `POST /v1/bulk/redeliver`, behind an admin token (checked by
//! the admin API before it routes here); each gate call carries who asked.
//!
//! Guarantees: the request is parsed and judged by the pure core ([`crate::bulk`]); this file
//! only lists the `op:` ledger (metadata, at most `MAX_PAGES` KV lists a request), calls the
//! gate of each operation the core says to act on, one at a time and spaced by the request's
//! pace, and answers the core's counts with a cursor to resume from. Every change goes through
//! the operation's gate as the operator's single action; a dry run calls no gate. A
//! redelivery run's cut-off is this worker's clock at the run's first request unless the body
//! gives one; each gate judges it against its own record.

use std::time::Duration;

use worker::{Delay, Env, Method, Request, Response};

use crate::bulk::{outcome, parse_bulk, BulkAction, BulkRun, Outcome};
use crate::config::Config;
use crate::operation::ledger::{LedgerMeta, OP_PREFIX};
use crate::operation::Actor;
use crate::reconciliation::lease_state::Resume;
use crate::refusal::Refusal;
use crate::telemetry::worker_log::WorkerLog;

use crate::edge::http::admin_body::read_body;
use crate::edge::http::json_answer::ok_json;
use crate::edge::objects::call::call_gate;
use crate::edge::outbound::ledger_kv::{list_page, KV_BINDING};
use crate::edge::runtime::{log, now_ms};

/// KV lists (1,000 entries each) one request may make looking for matches.
const MAX_PAGES: usize = 5;

pub async fn handle(
    req: &mut Request,
    method: Method,
    action: &str,
    env: &Env,
    config: &Config,
    by: Actor,
) -> Result<Response, Refusal> {
    let Some(action) = BulkAction::from_path(action) else {
        return Err(Refusal::NotFound);
    };
    if method != Method::Post {
        return Err(Refusal::MethodNotAllowed);
    }
    // 413 for a declared length over the cap, or as soon as the streamed bytes pass it.
    let body = read_body(req).await?;
    let request = parse_bulk(action, &body).map_err(|e| Refusal::BadRequest(e.to_string()))?;
    let kv = env
        .kv(KV_BINDING)
        .map_err(|e| Refusal::Unavailable(e.to_string()))?;
    let pause = Duration::from_millis(request.pause_ms());
    let prefix = format!(
        "{OP_PREFIX}{}",
        request.filter.prefix.as_deref().unwrap_or("")
    );
    let mut resume = request.resume.clone();
    // A redelivery run's first request sets its cut-off from this clock (carried on in the
    // cursor): every redelivery it causes is recorded by its gate after this.
    let mut run =
        BulkRun::new(request, now_ms()).map_err(|e| Refusal::BadRequest(e.to_string()))?;
    let command = run.command().by(by);
    let mut acted = false;
    for _ in 0..MAX_PAGES {
        // A key prefix narrows the listing itself; every other filter reads metadata.
        let page = list_page(&kv, &prefix, resume.cursor.clone()).await?;
        for entry in &page.keys {
            if resume.already_done(&entry.name) {
                continue;
            }
            let meta = entry
                .metadata
                .clone()
                .and_then(|m| serde_json::from_value::<LedgerMeta>(m).ok());
            let key = &entry.name[OP_PREFIX.len()..];
            let now_secs = now_ms().div_euclid(1_000);
            let matches = meta.as_ref().is_some_and(|m| {
                run.request
                    .matches(key, m, now_secs, config.stuck_after_secs)
            });
            // A full request stops before its next match, so the last part of a run that
            // has no more matches ends complete.
            if matches && run.full() {
                return ok_json(&run.answer(Some(&resume)));
            }
            resume.after_key = Some(entry.name.clone());
            let Some(meta) = meta.filter(|_| matches) else {
                continue;
            };
            if !run.take(&meta, now_secs) {
                continue;
            }
            // Spaced so a destination that just recovered gets a trickle, not the backlog.
            if acted {
                Delay::from(pause).await;
            }
            acted = true;
            let done = match call_gate(env, key, &command).await {
                Ok(reply) => outcome(&reply),
                Err(e) => Outcome::Failed(e.to_string()),
            };
            if let Outcome::Failed(error) = &done {
                log(WorkerLog::Unavailable {
                    error: error.clone(),
                    key: Some(key.to_string()),
                    bulk: Some(run.request.action.as_str()),
                }
                .to_value());
            }
            run.record(&done);
        }
        if page.list_complete || page.cursor.is_none() {
            return ok_json(&run.answer(None));
        }
        resume = Resume {
            cursor: page.cursor.clone(),
            after_key: None,
        };
    }
    ok_json(&run.answer(Some(&resume)))
}
