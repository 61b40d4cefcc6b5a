//! A nudge (a token-signed delivery): the body only names the operation. Nothing in it
//! decides state; the gate confirms with the status API.
//!
//! Guarantees: a nudge naming an operation its gate has no record of is not stored on the
//! token's word (anyone can obtain tokens): Gemini's status API is asked first, within the
//! strangers' guard's limit, and only what Gemini vouches for is stored
//! ([`crate::inbound::stranger`] decides).

use serde_json::{Map, Value};
use worker::{Env, Response};

use crate::config::Config;
use crate::inbound::answer::Answer;
use crate::inbound::classify::Refusal;
use crate::inbound::route_log::{Handled, RouteLog};
use crate::inbound::stranger::{self, GuardLimits, Next};
use crate::operation::gate_protocol::{GateCommand, GateReply};
use crate::operation::key::{Collection, OperationKey};
use crate::operation::lifecycle::Status;
use crate::operation::observation::StatusError;
use crate::reconciliation::lease_protocol::{LeaseCommand, LeaseReply};
use crate::telemetry::counters;

use super::{answer, answered, log_line, refuse, respond};
use crate::edge::objects::lease_object::GUARD_NAME;
use crate::edge::objects::stats_shard::count_at_edge;
use crate::edge::outbound::status_api;
use crate::edge::reconcile_pass::LEASE_BINDING;
use crate::edge::{call_gate, EdgeError};

/// A classified nudge.
pub struct Nudge {
    pub key: OperationKey,
    pub event_type: String,
    pub claimed: Status,
    pub metadata: Map<String, Value>,
    pub delivery_id: String,
}

pub async fn deliver(
    env: &Env,
    config: &Config,
    nudge: Nudge,
    now: i64,
) -> Result<Response, EdgeError> {
    let Nudge {
        key,
        event_type,
        claimed,
        metadata,
        delivery_id,
    } = nudge;
    let command_for = |metadata, vouched| GateCommand::Nudge {
        key: key.key.clone(),
        name: key.name.clone(),
        claimed: claimed.as_str().to_string(),
        metadata,
        delivery_id: delivery_id.clone(),
        require_registration: config.require_registration,
        vouched,
    };
    let command = command_for(metadata.clone(), false);
    let reply = call_gate(env, &key.key, &command).await?;
    if reply != GateReply::Unregistered {
        return respond(&key.key, &command, reply, &event_type, &delivery_id, now);
    }
    // A name the gate has never seen: Gemini's status API decides, before anything is stored.
    let limits = guard_limits(config);
    let permit = guard_call(env, &LeaseCommand::StrangerPermit { limits }).await?;
    if let LeaseReply::StrangerPermit {
        retry_after: Some(secs),
    } = permit
    {
        return refuse(Refusal::StrangerLimit {
            key: key.key.clone(),
            retry_after: secs,
        });
    }
    let asked = match (&config.gemini_api_key, Collection::of_key(&key.key)) {
        (None, _) => None,
        (Some(_), None) => Some(Err(StatusError::Malformed("key has no collection".into()))),
        (Some(_), Some(collection)) => {
            Some(status_api::ask(config, collection, &key.key, &key.name).await)
        }
    };
    match stranger::next_step(asked, &metadata, &delivery_id) {
        Next::Deliver(event) => {
            let command = GateCommand::Deliver {
                key: key.key.clone(),
                name: key.name.clone(),
                event,
                require_registration: config.require_registration,
                hold_ms: config.unregistered_hold_ms(),
                new_not_before_ms: 0,
            };
            answer(env, &key.key, &command, &event_type, &delivery_id, now).await
        }
        Next::Confirm => {
            let command = command_for(metadata, true);
            answer(env, &key.key, &command, &event_type, &delivery_id, now).await
        }
        Next::Unknown => {
            count_at_edge(counters::STRANGER_NUDGES);
            let counted = guard_call(env, &LeaseCommand::StrangerUnknown { limits }).await;
            let answer = Answer::UnknownToGemini {
                key: key.key.clone(),
            };
            if let Some(line) = RouteLog::handled(Handled {
                answer: answer.clone(),
                event_type,
                webhook_id: delivery_id,
                ms: None,
                answered_by: None,
                alert: Some(matches!(
                    counted,
                    Ok(LeaseReply::StrangerCounted { alert: true })
                )),
            }) {
                log_line(line);
            }
            answered(&answer)
        }
        Next::RetryLater(secs) => {
            log_line(RouteLog::StrangerUnconfirmed {
                key: key.key.clone(),
                webhook_id: delivery_id,
                retry_after: secs,
                reason: if config.gemini_api_key.is_none() {
                    "GEMINI_API_KEY is not set"
                } else {
                    "the status API did not answer"
                },
            });
            Err(EdgeError::RetryLater(secs.clamp(1, 3_600) as u32))
        }
    }
}

/// The strangers' guard's limits, from the configuration.
fn guard_limits(config: &Config) -> GuardLimits {
    GuardLimits {
        per_minute: config.stranger_nudges_per_minute,
        threshold: config.stranger_alert_threshold,
        window_ms: config.stranger_alert_window_secs * 1_000,
    }
}

async fn guard_call(env: &Env, command: &LeaseCommand) -> Result<LeaseReply, EdgeError> {
    crate::edge::post_json(
        &crate::edge::stub_for(env, LEASE_BINDING, GUARD_NAME)?,
        command,
    )
    .await
}
