//! `GET /v1/operations/{name}/results?state=parked|waiting|delivered&cursor=` and
//! `POST /v1/operations/{name}/results/retry` (`{"reason": ..., "dry_run": bool}`): a
//! `"results": "each"` batch's results, behind the token scope the admin API already checked
//! (reading is reading one operation back; the retry is an operator's action, admin only).
//!
//! Guarantees: one call to the operation's gate, which answers from its results tables; an
//! unknown operation is 404, a state it does not know 400.

use serde::Deserialize;
use worker::{Env, Method, Request, Response};

use crate::operation::gate::protocol::{GateCommand, GateReply};
use crate::operation::Actor;
use crate::refusal::Refusal;

use crate::edge::http::admin_body::{operation_key, read_body};
use crate::edge::http::json_answer::ok_json;
use crate::edge::objects::call::call_gate;

/// The answer when `rest` (the path after `/v1/operations/`) is a results route; `None`
/// otherwise.
pub async fn serve(
    req: &mut Request,
    method: &Method,
    rest: &str,
    env: &Env,
    by: &Actor,
) -> Option<Result<Response, Refusal>> {
    let (name, retry) = match (method, rest) {
        (Method::Get, _) => (rest.strip_suffix("/results")?, false),
        (Method::Post, _) => (rest.strip_suffix("/results/retry")?, true),
        _ => return None,
    };
    Some(answer(req, name, retry, env, by).await)
}

#[derive(Deserialize, Default)]
struct RetryBody {
    reason: Option<String>,
    #[serde(default)]
    dry_run: bool,
}

async fn answer(
    req: &mut Request,
    name: &str,
    retry: bool,
    env: &Env,
    by: &Actor,
) -> Result<Response, Refusal> {
    let key = operation_key(name)?;
    let command = if retry {
        let body = read_body(req).await?;
        let parsed: RetryBody = match body.iter().all(u8::is_ascii_whitespace) {
            true => RetryBody::default(),
            false => serde_json::from_slice(&body).map_err(|_| {
                Refusal::BadRequest("body must be {\"reason\": \"...\", \"dry_run\": bool}".into())
            })?,
        };
        GateCommand::RetryResults {
            reason: crate::operator::listing::kept_reason(parsed.reason),
            dry_run: parsed.dry_run,
            by: Some(by.clone()),
        }
    } else {
        let url = req.url().map_err(|e| Refusal::BadRequest(e.to_string()))?;
        let query = |k: &str| {
            url.query_pairs()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.into_owned())
        };
        let state = query("state").unwrap_or_else(|| "parked".into());
        let cursor = query("cursor").filter(|c| !c.is_empty());
        GateCommand::Results { state, cursor }
    };
    match call_gate(env, &key.key, &command).await? {
        GateReply::ResultsAnswer { answer } if answer.get("error").is_some() => Err(
            Refusal::BadRequest(answer["error"].as_str().unwrap_or("bad request").into()),
        ),
        GateReply::ResultsAnswer { answer } => ok_json(&answer),
        GateReply::NotFound => Err(Refusal::NotFound),
        other => Err(Refusal::unexpected("gate", &other)),
    }
}
