//! A nudge (a token-signed delivery): the body only names the operation. Nothing in it
//! decides state; the gate confirms with the status API.
//!
//! Guarantees: a nudge only hastens what the worker holds open. Its gate is called once; a
//! gate with no record stores nothing ([`crate::operation::gate::step`], `Nudge`), and such a
//! nudge makes no call outside the worker: it is answered 2xx (Gemini does not retry it; a
//! registered job's own poll settles it, docs/DESIGN.md), counted, logged, and tallied for
//! the one aggregated alert ([`crate::inbound::stranger`]).

use serde_json::{Map, Value};
use worker::{Env, Response};

use crate::config::Config;
use crate::inbound::answer::Answer;
use crate::inbound::route_log::{Handled, RouteLog};
use crate::inbound::stranger::AlertLimits;
use crate::operation::gate_protocol::{GateCommand, GateReply};
use crate::operation::key::OperationKey;
use crate::operation::lifecycle::Status;
use crate::reconciliation::lease_protocol::{LeaseCommand, LeaseReply};
use crate::telemetry::counters;

use super::{answered, log_line, respond};
use crate::edge::objects::lease_object::GUARD_NAME;
use crate::edge::objects::stats_shard::count_at_edge;
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
    let command = GateCommand::Nudge {
        key: key.key.clone(),
        name: key.name.clone(),
        claimed: claimed.as_str().to_string(),
        metadata,
        delivery_id: delivery_id.clone(),
    };
    let reply = call_gate(env, &key.key, &command).await?;
    if reply != GateReply::Unregistered {
        return respond(&key.key, &command, reply, &event_type, &delivery_id, now);
    }
    // Not held: nothing was stored, nothing is asked. The tally's answer only says whether
    // this nudge raised the window's alert; a failed call loses a count, never a delivery.
    count_at_edge(counters::STRANGER_NUDGES);
    let limits = AlertLimits {
        threshold: config.stranger_alert_threshold,
        window_ms: config.stranger_alert_window_secs * 1_000,
    };
    let counted = tally(env, &LeaseCommand::StrangerNudge { limits }).await;
    let answer = Answer::NotHeld {
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

async fn tally(env: &Env, command: &LeaseCommand) -> Result<LeaseReply, EdgeError> {
    crate::edge::post_json(
        &crate::edge::stub_for(env, LEASE_BINDING, GUARD_NAME)?,
        command,
    )
    .await
}
