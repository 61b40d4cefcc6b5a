//! The admin API under `/v1/operations`, behind `Authorization: Bearer <ADMIN_TOKEN>`.
//!
//! Guarantees: the token is checked (constant time) before anything else is read; every
//! change goes through the operation's gate; a name in the path may be percent-encoded, may
//! contain slashes and may be any accepted form of the name.

use percent_encoding::percent_decode_str;
use serde_json::json;
use worker::{Env, Method, Request, Response};

use crate::admin::{authorized, parse_registration};
use crate::config::Config;
use crate::gate_protocol::{GateCommand, GateReply};
use crate::key::normalize;

use super::{call_gate, json_response, log, ok_json, EdgeError};

const PREFIX: &str = "/v1/operations";

pub async fn handle(
    mut req: Request,
    method: Method,
    env: &Env,
    config: &Config,
) -> Result<Response, EdgeError> {
    let auth = req.headers().get("authorization").ok().flatten();
    if !authorized(auth.as_deref(), &config.admin_token.0) {
        log(json!({"event": "rejected", "reason": "admin_unauthorized"}));
        return Err(EdgeError::Unauthorized);
    }
    let path = req.path();
    let rest = path[PREFIX.len()..].trim_start_matches('/');
    match (rest.is_empty(), method) {
        (true, Method::Post) => {
            let body = req
                .bytes()
                .await
                .map_err(|e| EdgeError::BadRequest(e.to_string()))?;
            if body.len() > 16 * 1024 {
                return Err(EdgeError::TooLarge);
            }
            let reg =
                parse_registration(&body).map_err(|e| EdgeError::BadRequest(e.to_string()))?;
            let command = GateCommand::Register {
                key: reg.key.key.clone(),
                name: reg.key.name.clone(),
                kind: reg.kind,
            };
            match call_gate(env, &reg.key.key, &command)
                .await
                .map_err(EdgeError::Unavailable)?
            {
                GateReply::Created { operation } => {
                    log(json!({"event": "registered", "key": reg.key.key}));
                    json_response(&operation, 201)
                }
                GateReply::Exists { operation } => ok_json(&operation),
                other => Err(EdgeError::Unavailable(format!(
                    "unexpected gate reply {other:?}"
                ))),
            }
        }
        (false, Method::Get) => {
            let name = percent_decode_str(rest)
                .decode_utf8()
                .map_err(|_| EdgeError::BadRequest("name is not UTF-8".into()))?;
            let key =
                normalize(&name, None).map_err(|e| EdgeError::BadRequest(format!("name: {e}")))?;
            match call_gate(env, &key.key, &GateCommand::Inspect)
                .await
                .map_err(EdgeError::Unavailable)?
            {
                GateReply::Found {
                    mut operation,
                    history,
                } => {
                    operation["history"] = json!(history);
                    ok_json(&operation)
                }
                GateReply::NotFound => Err(EdgeError::NotFound),
                other => Err(EdgeError::Unavailable(format!(
                    "unexpected gate reply {other:?}"
                ))),
            }
        }
        _ => Err(EdgeError::MethodNotAllowed),
    }
}
