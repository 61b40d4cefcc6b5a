//! `POST /v1/destinations/{name}/pause` and `…/resume` (`{"reason": ..., "dry_run": bool}`):
//! an operator pauses a destination by hand, or resumes it, behind the admin token the admin
//! API already checked (every `POST` is an action).
//!
//! Guarantees: `{name}` is a route's kind or `default` (percent-encoded or not); an unknown
//! name is 404 naming the known ones; one call to the destination's desk, which keeps the
//! pause with who asked and why ([`crate::operator::pause`]).

use percent_encoding::percent_decode_str;
use serde_json::json;
use worker::{Env, Method, Request, Response};

use crate::config::Config;
use crate::destination::protocol::{DeskCommand, DeskReply};
use crate::operation::Actor;
use crate::operator::pause::{answer, parse};
use crate::refusal::Refusal;

use crate::edge::http::admin_body::read_body;
use crate::edge::http::json_answer::{json_response, ok_json};
use crate::edge::objects::call::call_desk;

/// `rest` is the path after `/v1/destinations/`.
pub async fn serve(
    req: &mut Request,
    method: Method,
    rest: &str,
    env: &Env,
    config: &Config,
    by: Actor,
) -> Result<Response, Refusal> {
    let (name, pausing) = match rest.rsplit_once('/') {
        Some((name, "pause")) => (name, true),
        Some((name, "resume")) => (name, false),
        _ => return Err(Refusal::NotFound),
    };
    if method != Method::Post {
        return Err(Refusal::MethodNotAllowed);
    }
    let name = percent_decode_str(name)
        .decode_utf8()
        .map_err(|_| Refusal::BadRequest("name is not UTF-8".into()))?;
    let Some(settings) = config.destination_named(&name) else {
        let known = config.destination_names();
        let body = json!({"error": "no destination has this name", "destinations": known});
        return json_response(&body, 404);
    };
    let body = read_body(req).await?;
    let asked = parse(&body, pausing).map_err(Refusal::BadRequest)?;
    let (by, reason, dry_run) = (json!(by), asked.reason, asked.dry_run);
    let command = match pausing {
        true => DeskCommand::Pause {
            by,
            reason,
            dry_run,
            settings: settings.clone(),
        },
        false => DeskCommand::Resume {
            by,
            reason,
            dry_run,
            settings: settings.clone(),
        },
    };
    match call_desk(env, &settings, &command).await? {
        DeskReply::PauseSet { changed, view } => ok_json(&answer(&name, dry_run, changed, &view)),
        other => Err(Refusal::unexpected("desk", &other)),
    }
}
