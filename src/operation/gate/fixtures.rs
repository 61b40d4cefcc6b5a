//! Records and commands the gate's and the alarm's tests share.

use serde_json::Map;

use crate::operation::alarm::{attempt_finished, begin_attempt, Attempt, ConfirmAnswer};
use crate::operation::gate_protocol::GateCommand;
use crate::operation::lifecycle::{Source, Status};
use crate::operation::observation::Observation;
use crate::operation::{AttemptOutcome, OpEvent, Operation};

use super::{step, Limits, Step};

pub(crate) const LIMITS: Limits = Limits {
    retention_ms: 100_000,
    stats_delay_ms: 0,
    claim_ttl_ms: 10_000,
    retry_base_secs: 1,
    retry_max_secs: 8,
    unregistered_hold_ms: 0,
};

pub(crate) fn event(status: Status, source: Source) -> OpEvent {
    OpEvent {
        status,
        update_time_ms: 0,
        source,
        details: Map::new(),
        delivery_id: Some("msg_1".into()),
    }
}

pub(crate) fn deliver(status: Status) -> GateCommand {
    GateCommand::Deliver {
        key: "batches/a".into(),
        name: "batches/a".into(),
        event: event(status, Source::Webhook),
        require_registration: false,
        hold_ms: 0,
        new_not_before_ms: 0,
    }
}

pub(crate) fn nudge(claimed: &str) -> GateCommand {
    GateCommand::Nudge {
        key: "batches/a".into(),
        name: "batches/a".into(),
        claimed: claimed.into(),
        metadata: Map::new(),
        delivery_id: "jwt_1".into(),
    }
}

pub(crate) fn registered() -> Operation {
    Operation::register("batches/a", "batches/a", Some("billing".into()), 0)
}

/// A terminal operation whose effect is done.
pub(crate) fn settled() -> Operation {
    let s = step(Some(registered()), deliver(Status::Succeeded), 10);
    let (claim, s) = begin_attempt(s.record.unwrap(), 10, &LIMITS).unwrap();
    let attempt = Attempt {
        claim,
        outcome: AttemptOutcome::Delivered,
        started_ms: 10,
        finished_ms: 20,
        target: Default::default(),
    };
    attempt_finished(s.record.unwrap(), &attempt, &LIMITS, 0.5)
        .record
        .unwrap()
}

pub(crate) fn whats<R>(step: &Step<R>) -> Vec<String> {
    step.history
        .iter()
        .map(|h| h.to_value()["what"].as_str().unwrap_or("").to_string())
        .collect()
}

pub(crate) fn events<R>(step: &Step<R>) -> Vec<String> {
    step.logs
        .iter()
        .map(|l| l.event().as_str().to_string())
        .collect()
}

pub(crate) fn nudged() -> Operation {
    step(Some(registered()), nudge("succeeded"), 10)
        .record
        .unwrap()
}

pub(crate) fn observed(status: Status) -> ConfirmAnswer {
    ConfirmAnswer::Answer(Ok(Observation {
        status,
        update_time_ms: 5,
        details: Map::new(),
    }))
}

/// An unregistered operation's completion, its first attempt held `hold_ms`.
pub(crate) fn deliver_unregistered(hold_ms: i64) -> GateCommand {
    GateCommand::Deliver {
        key: "batches/a".into(),
        name: "batches/a".into(),
        event: event(Status::Succeeded, Source::Webhook),
        require_registration: false,
        hold_ms,
        new_not_before_ms: 0,
    }
}
