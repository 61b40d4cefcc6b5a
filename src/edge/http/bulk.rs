//! `POST /v1/bulk/retry` and `POST /v1/bulk/redeliver`, behind an admin token (checked by
//! the admin API before it routes here); each gate call carries who asked.
//!
//! Guarantees: the request is parsed, judged and walked by the pure core
//! ([`crate::operator::bulk::BulkWalk`]); this file only performs its steps: lists the `op:` pages it
//! asks for (metadata, at most `MAX_BULK_PAGES` KV lists a request), calls the gate of each
//! operation it says to act on, one at a time and spaced by the request's pace, and answers
//! its counts with a cursor to resume from. Every change goes through the operation's gate as
//! the operator's single action; a dry run calls no gate. A redelivery run's cut-off is the
//! caller's (a dry run's is this worker's clock); each gate judges it against its own record.

use std::time::Duration;

use worker::{Delay, Env, Method, Request, Response};

use crate::config::Config;
use crate::operation::Actor;
use crate::operator::bulk::{
    command_result, parse_bulk, BulkAction, BulkStep, BulkWalk, CommandResult,
};
use crate::refusal::Refusal;
use crate::telemetry::worker_log::WorkerLog;

use crate::edge::http::admin_body::read_body;
use crate::edge::http::json_answer::ok_json;
use crate::edge::objects::call::call_gate;
use crate::edge::outbound::ledger_kv::{list_page, KV_BINDING};
use crate::edge::runtime::{log, now_ms};

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
    let kv = env.kv(KV_BINDING)?;
    let pause = Duration::from_millis(request.pause_ms());
    let mut walk =
        BulkWalk::new(request, now_ms()).map_err(|e| Refusal::BadRequest(e.to_string()))?;
    let command = walk.run.command().by(by);
    loop {
        match walk.step(now_ms().div_euclid(1_000), config.stuck_after_secs) {
            BulkStep::List { prefix, cursor } => {
                walk.on_page(list_page(&kv, &prefix, cursor).await?);
            }
            BulkStep::CallGate { key, pause_first } => {
                if pause_first {
                    Delay::from(pause).await;
                }
                let done = match call_gate(env, &key, &command).await {
                    Ok(reply) => command_result(&reply),
                    Err(e) => CommandResult::Failed(e.to_string()),
                };
                if let CommandResult::Failed(error) = &done {
                    let (error, key, bulk) = (error.clone(), Some(key), Some(action.as_str()));
                    log(WorkerLog::Unavailable { error, key, bulk }.to_value());
                }
                walk.run.record(&done);
            }
            BulkStep::Answer(body) => return ok_json(&body),
        }
    }
}
