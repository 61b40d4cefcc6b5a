//! A gate's dealings with its destination's desk, as pure decisions: whether an attempt asks
//! the desk first, whether it reports back, and what a `Wait` does to the record.
//!
//! Guarantees (docs/DESIGN.md, invariant 8): a first attempt to an unpaced destination neither
//! asks nor (when it succeeds) reports, so the happy path makes no extra object call and no
//! extra write, unless this isolate heard from the desk in the last
//! [`crate::destination::protocol::OPEN_MEMORY_MS`] that
//! the destination is open: then it asks, and waits with the rest; an effect told to wait
//! keeps its generation and `webhook-id`, holds no claim, and is due again at the desk's word
//! or, should the desk be lost, after `EFFECT_RETRY_MAX_SECONDS`.

use crate::operation::gate::alarm::AlarmDone;
use crate::operation::gate::{GateLimits, Step};
use crate::operation::{DeskMark, Operation};

/// What an attempt owes the desk before it leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeskTurn {
    /// Nothing: a first attempt to an unpaced destination (the happy path).
    None,
    /// Ask: a retry, or any attempt on a paced route.
    Ask,
    /// The desk released it: it goes, and reports back.
    Released { probe: bool },
}

/// The turn of the attempt the alarm is about to run for `op` (the record before its claim);
/// `paced` says whether its route has a pace, `open` whether this isolate remembers its
/// destination open.
pub fn turn(op: &Operation, paced: bool, open: bool) -> DeskTurn {
    match op.effect().desk() {
        Some(DeskMark::Released { probe }) => DeskTurn::Released { probe },
        _ if paced || open || op.effect().failures_in_row() > 0 => DeskTurn::Ask,
        _ => DeskTurn::None,
    }
}

/// Whether the attempt reports its end to the desk: every health failure (the desk counts
/// them), an asked retry (its success ends a run of failures: first attempts that succeed
/// say nothing), a probe (its success closes the destination), and any attempt that holds a
/// slot of a paced route (its end frees it). A drained, unpaced attempt that succeeds does
/// not: the probe already showed the destination up.
pub fn reports(turn: DeskTurn, paced: bool, health_failure: bool) -> bool {
    health_failure
        || matches!(turn, DeskTurn::Ask | DeskTurn::Released { probe: true })
        || (paced && turn != DeskTurn::None)
}

/// The desk said `Wait`: the effect waits for its release, with `EFFECT_RETRY_MAX_SECONDS` as
/// the fallback. Nothing changes when it is no longer owed or a live claim holds it.
pub fn wait_on_destination(mut op: Operation, now: i64, limits: &GateLimits) -> Step<AlarmDone> {
    let fallback = limits.retry.max_ms;
    if !op.wait_on_destination(now, fallback) {
        return Step::new(Some(op), AlarmDone::WaitsOnDestination(false));
    }
    Step::new(Some(op), AlarmDone::WaitsOnDestination(true)).durable()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operation::gate::alarm::{attempt_finished, begin_attempt, Attempt};
    use crate::operation::gate::fixtures::*;
    use crate::operation::gate::protocol::{EffectReport, GateCommand, GateReply};
    use crate::operation::gate::{step, Save};
    use crate::operation::lifecycle::Status;
    use crate::operation::AttemptOutcome;

    fn owed() -> Operation {
        step(Some(registered()), deliver(Status::Succeeded), 10)
            .record
            .unwrap()
    }

    fn failed_once() -> Operation {
        let (claim, s) = begin_attempt(owed(), 10, &LIMITS).unwrap();
        let attempt = Attempt {
            claim,
            outcome: AttemptOutcome::Retry("503".into()),
            started_ms: 10,
            finished_ms: 20,
            asked_wait_ms: None,
            target: Default::default(),
        };
        attempt_finished(s.record.unwrap(), &attempt, &LIMITS, 0.5)
            .record
            .unwrap()
    }

    #[test]
    fn a_first_attempt_to_an_unpaced_destination_asks_nothing_and_a_success_reports_nothing() {
        let t = turn(&owed(), false, false);
        assert_eq!(t, DeskTurn::None);
        assert!(!reports(t, false, false));
        assert!(
            reports(t, false, true),
            "a health failure is always reported"
        );
    }

    #[test]
    fn a_first_attempt_to_a_destination_remembered_open_asks() {
        assert_eq!(turn(&owed(), false, true), DeskTurn::Ask);
        // A release still goes without asking, whatever the memory says.
        let released = step(
            wait_on_destination(failed_once(), 30, &LIMITS).record,
            GateCommand::DestinationReady { probe: true },
            40,
        )
        .record
        .unwrap();
        assert_eq!(
            turn(&released, false, true),
            DeskTurn::Released { probe: true }
        );
    }

    #[test]
    fn a_retry_or_a_paced_route_asks_first() {
        assert_eq!(turn(&failed_once(), false, false), DeskTurn::Ask);
        assert_eq!(turn(&owed(), true, false), DeskTurn::Ask);
        assert!(reports(DeskTurn::Ask, true, false), "a paced slot is freed");
        assert!(
            reports(DeskTurn::Ask, false, false),
            "a retry's success ends a run of failures"
        );
    }

    #[test]
    fn a_wait_keeps_the_generation_holds_no_claim_and_falls_back_to_the_cap() {
        let op = failed_once();
        let generation = op.effect().generation();
        let s = wait_on_destination(op, 30, &LIMITS);
        assert_eq!(s.save, Save::Durable);
        let op = s.record.unwrap();
        assert_eq!(op.effect().next_attempt_ms(), 30 + 8_000);
        assert_eq!(op.effect().generation(), generation);
        assert!(op.effect().claim().is_none());
        assert_eq!(op.effect().desk(), Some(DeskMark::Waiting { since_ms: 30 }));
        assert_eq!(op.view()["waiting_on_destination"], true);
    }

    #[test]
    fn a_release_makes_it_due_now_and_its_attempt_goes_without_asking() {
        let waiting = wait_on_destination(failed_once(), 30, &LIMITS).record;
        let s = step(waiting, GateCommand::DestinationReady { probe: true }, 40);
        assert_eq!(
            s.reply,
            GateReply::Effect {
                effect: EffectReport::Scheduled
            }
        );
        assert!(s.reset_alarm);
        let op = s.record.unwrap();
        assert_eq!(op.effect().next_attempt_ms(), 40);
        let t = turn(&op, false, false);
        assert_eq!(t, DeskTurn::Released { probe: true });
        assert!(reports(t, false, false), "a probe reports its success");
        assert!(!reports(DeskTurn::Released { probe: false }, false, false));
        let (_, claimed) = begin_attempt(op, 40, &LIMITS).unwrap();
        assert_eq!(claimed.record.unwrap().effect().desk(), None, "spent");
    }

    #[test]
    fn a_release_of_an_effect_no_longer_owed_changes_nothing() {
        let s = step(
            Some(settled()),
            GateCommand::DestinationReady { probe: false },
            40,
        );
        assert_eq!(
            s.reply,
            GateReply::Effect {
                effect: EffectReport::Delivered
            }
        );
        assert_eq!(s.save, Save::Unchanged);
        let s = wait_on_destination(settled(), 40, &LIMITS);
        assert_eq!(s.reply, AlarmDone::WaitsOnDestination(false));
    }
}
