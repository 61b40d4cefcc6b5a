//! `/v1/operations/{name}` and its actions (`redeliver`, `retry`, `forget`, `repair`,
//! `settle`), behind a token whose scope the admin API has already checked.
//!
//! Guarantees: the name may be percent-encoded, may contain slashes and may be any accepted
//! form of the name; every action is one call to the operation's gate carrying who asked,
//! and the gate's reply is the answer (a refusal 409, an unknown operation 404).

use serde_json::json;
use worker::{Env, Method, Request, Response};

use crate::operation::gate::protocol::{GateCommand, GateReply};
use crate::operation::key::OperationKey;
use crate::operation::Actor;
use crate::operator::listing::parse_settle;
use crate::refusal::Refusal;

use crate::edge::http::admin_body::{operation_key, read_body, read_reason};
use crate::edge::http::json_answer::ok_json;
use crate::edge::objects::call::call_gate;

/// `rest` is the path after `/v1/operations/`: a name, or a name and an action.
pub async fn serve(
    req: &mut Request,
    method: Method,
    rest: &str,
    env: &Env,
    by: Actor,
) -> Result<Response, Refusal> {
    if let Some(answer) = super::results_routes::serve(req, &method, rest, env, &by).await {
        return answer;
    }
    let (name, action) = match (method, rest.rsplit_once('/')) {
        (
            Method::Post,
            Some((name, action @ ("redeliver" | "retry" | "forget" | "repair" | "settle"))),
        ) => (name, Some(action)),
        (Method::Get, _) => (rest, None),
        _ => return Err(Refusal::MethodNotAllowed),
    };
    let key = operation_key(name)?;
    let command = command(req, action, &key, by).await?;
    answer(&key, call_gate(env, &key.key, &command).await?)
}

/// The gate command an action asks for, with its body read (a reason, or a settlement).
async fn command(
    req: &mut Request,
    action: Option<&str>,
    key: &OperationKey,
    by: Actor,
) -> Result<GateCommand, Refusal> {
    let Some(action) = action else {
        return Ok(GateCommand::Inspect);
    };
    let by = Some(by);
    if action == "settle" {
        let body = read_body(req).await?;
        let settle = parse_settle(&body).map_err(|e| Refusal::BadRequest(e.to_string()))?;
        return Ok(GateCommand::Settle {
            status: settle.status.as_str().to_string(),
            reason: settle.reason,
            by,
        });
    }
    let reason = read_reason(req).await?;
    Ok(match action {
        "redeliver" => GateCommand::Redeliver {
            reason,
            sent_before_ms: None,
            by,
        },
        "retry" => GateCommand::RetryNow { reason, by },
        "repair" => GateCommand::Repair {
            key: key.key.clone(),
            name: key.name.clone(),
            reason,
            by,
        },
        _ => GateCommand::Forget { reason, by },
    })
}

/// The answer to the gate's reply.
fn answer(key: &OperationKey, reply: GateReply) -> Result<Response, Refusal> {
    match reply {
        GateReply::Found {
            mut operation,
            history,
        } => {
            operation["history"] = json!(history);
            ok_json(&operation)
        }
        GateReply::Repaired {
            repaired,
            mut operation,
            history,
        } => {
            operation["history"] = json!(history);
            ok_json(&json!({"key": key.key, "repaired": repaired, "operation": operation}))
        }
        GateReply::Redelivered {
            generation,
            action,
            effect,
        } => ok_json(
            &json!({"key": key.key, "action": action, "generation": generation, "effect": effect}),
        ),
        GateReply::Forgotten { changed } => {
            ok_json(&json!({"key": key.key, "forgotten": true, "changed": changed}))
        }
        GateReply::Applied { status, effect } => ok_json(
            &json!({"key": key.key, "settled": true, "settled_by": "operator", "status": status, "effect": effect}),
        ),
        GateReply::Refused { reason } => Err(Refusal::Conflict(reason)),
        GateReply::NotFound => Err(Refusal::NotFound),
        other => Err(Refusal::unexpected("gate", &other)),
    }
}
