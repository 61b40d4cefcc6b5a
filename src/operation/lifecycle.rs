//! The operation lifecycle and its reducer: state only moves forward.
//!
//! Guarantees (docs/DESIGN.md, invariant 2): states sit on the lattice PENDING(0) <
//! RUNNING, REQUIRES_ACTION(1) < SUCCEEDED, FAILED, CANCELLED, EXPIRED(2); unknown states rank
//! -1 and are never applied. Terminal states absorb: the first terminal to reach the reducer
//! wins and a later, different terminal is dropped with its own reason. Between non-terminal
//! states of equal rank only a strictly newer server update time moves state (a missing one
//! counts as the epoch and loses ties). Every drop is a [`DropReason`] value, never silence.
//! The reducer is a pure function of the current state and the event.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

/// Where an operation stands. `Unknown` carries whatever the wire said.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    #[default]
    Pending,
    Running,
    RequiresAction,
    Succeeded,
    Failed,
    Cancelled,
    Expired,
    #[serde(untagged)]
    Unknown(String),
}

impl Status {
    /// Position on the lattice; unknown states rank below everything.
    pub fn rank(&self) -> i8 {
        match self {
            Status::Pending => 0,
            Status::Running | Status::RequiresAction => 1,
            Status::Succeeded | Status::Failed | Status::Cancelled | Status::Expired => 2,
            Status::Unknown(_) => -1,
        }
    }

    /// Terminal states end the operation and carry a side effect.
    pub fn is_terminal(&self) -> bool {
        self.rank() == 2
    }

    /// The wire and API spelling.
    pub fn as_str(&self) -> &str {
        match self {
            Status::Pending => "pending",
            Status::Running => "running",
            Status::RequiresAction => "requires_action",
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
            Status::Expired => "expired",
            Status::Unknown(s) => s,
        }
    }

    /// Parses our own spelling (as in the ledger and the API); anything else is `Unknown`.
    pub fn parse(s: &str) -> Status {
        // The serde spelling is `as_str`'s, and any other string is `Unknown` (untagged).
        serde_json::from_value(s.into()).unwrap_or_else(|_| Status::Unknown(s.to_string()))
    }
}

/// Which path brought an event to the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Webhook,
    Reconcile,
    Registration,
    Operator,
}

impl Source {
    /// The spelling used in records, logs and side effects.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Webhook => "webhook",
            Source::Reconcile => "reconcile",
            Source::Registration => "registration",
            Source::Operator => "operator",
        }
    }
}

/// The part of an operation's state the reducer looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    pub status: Status,
    /// Server update time in Unix milliseconds; 0 when the server gave none.
    pub update_time_ms: i64,
}

/// Why an event was not applied. Each is logged, counted and answered 2xx.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// The same terminal state again (a retry, or webhook and reconcile both saw it).
    Duplicate,
    /// A different terminal after the first one: recorded, never applied.
    ConflictingTerminal,
    /// A lower-ranked state than the current one (a late RUNNING after SUCCEEDED).
    RegressFromTerminal,
    /// A lower-ranked non-terminal state than the current non-terminal one.
    Regression,
    /// Same rank, not strictly newer by server update time.
    StaleUpdateTime,
    /// A state this receiver does not know: never applied.
    UnknownState,
}

impl DropReason {
    /// The label used in logs, history and counters.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::Duplicate => "duplicate",
            DropReason::ConflictingTerminal => "conflicting_terminal",
            DropReason::RegressFromTerminal => "regress_from_terminal",
            DropReason::Regression => "regression",
            DropReason::StaleUpdateTime => "stale_update_time",
            DropReason::UnknownState => "unknown_state",
        }
    }
}

/// The reducer's verdict on one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Apply,
    Drop(DropReason),
}

/// Decides whether `incoming` moves an operation that stands at `current`.
pub fn reduce(current: &Position, incoming: &Position) -> Verdict {
    let (have, want) = (current.status.rank(), incoming.status.rank());
    if want < 0 {
        return Verdict::Drop(DropReason::UnknownState);
    }
    if current.status.is_terminal() {
        return Verdict::Drop(if incoming.status == current.status {
            DropReason::Duplicate
        } else if incoming.status.is_terminal() {
            DropReason::ConflictingTerminal
        } else {
            DropReason::RegressFromTerminal
        });
    }
    match want.cmp(&have) {
        Ordering::Greater => Verdict::Apply,
        Ordering::Less => Verdict::Drop(DropReason::Regression),
        Ordering::Equal if incoming.update_time_ms > current.update_time_ms => Verdict::Apply,
        Ordering::Equal => Verdict::Drop(DropReason::StaleUpdateTime),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(status: Status, t: i64) -> Position {
        Position {
            status,
            update_time_ms: t,
        }
    }

    #[test]
    fn pending_to_running_applies() {
        assert_eq!(
            reduce(&at(Status::Pending, 5), &at(Status::Running, 1)),
            Verdict::Apply
        );
    }

    #[test]
    fn pending_to_terminal_applies() {
        for t in [
            Status::Succeeded,
            Status::Failed,
            Status::Cancelled,
            Status::Expired,
        ] {
            assert_eq!(reduce(&at(Status::Pending, 0), &at(t, 0)), Verdict::Apply);
        }
    }

    #[test]
    fn running_to_succeeded_applies_even_with_older_update_time() {
        assert_eq!(
            reduce(&at(Status::Running, 100), &at(Status::Succeeded, 1)),
            Verdict::Apply
        );
    }

    #[test]
    fn late_running_after_succeeded_is_dropped() {
        assert_eq!(
            reduce(&at(Status::Succeeded, 1), &at(Status::Running, 999)),
            Verdict::Drop(DropReason::RegressFromTerminal)
        );
    }

    #[test]
    fn same_terminal_again_is_a_duplicate() {
        assert_eq!(
            reduce(&at(Status::Failed, 1), &at(Status::Failed, 2)),
            Verdict::Drop(DropReason::Duplicate)
        );
    }

    #[test]
    fn different_terminal_after_first_is_recorded_not_applied() {
        assert_eq!(
            reduce(&at(Status::Succeeded, 1), &at(Status::Failed, 999)),
            Verdict::Drop(DropReason::ConflictingTerminal)
        );
    }

    #[test]
    fn pending_after_running_is_a_regression() {
        assert_eq!(
            reduce(&at(Status::Running, 1), &at(Status::Pending, 999)),
            Verdict::Drop(DropReason::Regression)
        );
    }

    #[test]
    fn equal_rank_needs_strictly_newer_update_time() {
        assert_eq!(
            reduce(&at(Status::Running, 10), &at(Status::RequiresAction, 11)),
            Verdict::Apply
        );
        assert_eq!(
            reduce(&at(Status::Running, 10), &at(Status::RequiresAction, 10)),
            Verdict::Drop(DropReason::StaleUpdateTime)
        );
        assert_eq!(
            reduce(&at(Status::RequiresAction, 10), &at(Status::Running, 9)),
            Verdict::Drop(DropReason::StaleUpdateTime)
        );
    }

    #[test]
    fn missing_update_time_loses_ties() {
        assert_eq!(
            reduce(&at(Status::Running, 0), &at(Status::RequiresAction, 0)),
            Verdict::Drop(DropReason::StaleUpdateTime)
        );
        assert_eq!(
            reduce(&at(Status::Pending, 0), &at(Status::Pending, 0)),
            Verdict::Drop(DropReason::StaleUpdateTime)
        );
    }

    #[test]
    fn unknown_state_is_never_applied() {
        assert_eq!(
            reduce(
                &at(Status::Pending, 0),
                &at(Status::Unknown("X".into()), 99)
            ),
            Verdict::Drop(DropReason::UnknownState)
        );
        assert_eq!(
            reduce(
                &at(Status::Succeeded, 0),
                &at(Status::Unknown("X".into()), 99)
            ),
            Verdict::Drop(DropReason::UnknownState)
        );
    }

    #[test]
    fn status_spellings_round_trip() {
        for s in [
            "pending",
            "running",
            "requires_action",
            "succeeded",
            "failed",
            "cancelled",
            "expired",
        ] {
            assert_eq!(Status::parse(s).as_str(), s);
            let json = serde_json::to_string(&Status::parse(s)).unwrap();
            assert_eq!(json, format!("\"{s}\""));
        }
        assert_eq!(Status::parse("weird"), Status::Unknown("weird".into()));
    }
}
