//! A key's turn at its destination's desk (docs/DESIGN.md, invariant 8), one decision for the
//! job's effect and a batch's results alike (the job's effect is a batch of one): whether its
//! ready sends ask the desk first ([`desk_turn`]), how many of them go ([`goes_now`],
//! [`granted`]), and whether the desk hears of them after ([`reports`]).
//!
//! Guarantees: a first attempt to an unpaced destination (a batch's results are one key at the
//! desk, so a first step of them too) neither asks nor, when it succeeds, reports, so the
//! happy path makes no extra object call and no extra write, unless this isolate heard in the
//! last [`crate::destination::protocol::OPEN_MEMORY_MS`] that the destination is open: then
//! it asks, and waits with the rest. A retry, a paced route, and a key the record says waits
//! ask; the desk grants a number, at least one and at most what is ready, and a desk that
//! cannot be reached lets them all go (an unreachable desk never strands an effect: each
//! send's own backoff still bounds it). A release goes without asking: as the probe, one
//! send; on a paced route, one (the release took one token); else all that are ready.

use crate::operation::DeskMark;

/// What a key's sends owe the desk before they leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeskTurn {
    /// Nothing: a first attempt to an unpaced destination (the happy path).
    #[default]
    None,
    /// Ask: a retry, or any attempt on a paced route.
    Ask,
    /// The desk released it: it goes, and reports back.
    Released { probe: bool },
}

/// The turn of a key's sends given the record's `mark`: a release lets them go; a `retry`, a paced
/// route, a destination remembered `open` or a key still marked waiting (its fallback came before a
/// release: the desk may be paused, so it asks again rather than go) asks; else nothing.
pub fn desk_turn(mark: Option<DeskMark>, paced: bool, open: bool, retry: bool) -> DeskTurn {
    match mark {
        Some(DeskMark::Released { probe }) => DeskTurn::Released { probe },
        Some(DeskMark::Waiting { .. }) => DeskTurn::Ask,
        _ if paced || open || retry => DeskTurn::Ask,
        _ => DeskTurn::None,
    }
}

/// How many of `ready` sends go without asking; `None`: ask the desk for `ready` (none
/// ready: none go, and nothing is asked).
pub fn goes_now(turn: DeskTurn, paced: bool, ready: u32) -> Option<u32> {
    match turn {
        _ if ready == 0 => Some(0),
        DeskTurn::Ask => None,
        DeskTurn::None => Some(ready),
        DeskTurn::Released { probe: false } if !paced => Some(ready),
        DeskTurn::Released { .. } => Some(ready.min(1)),
    }
}

/// How many go when the desk granted `granted` of `ready` (`None`: the desk could not be
/// reached, and then they all go).
pub fn granted(ready: u32, granted: Option<u32>) -> u32 {
    granted.map_or(ready, |n| n.max(1).min(ready))
}

/// Whether the sends report their end to the desk: every health failure (the desk counts
/// them), an asked turn (a retry's success ends a run of failures: first attempts that
/// succeed say nothing), a probe (its success closes the destination), and any send that
/// holds a slot of a paced route (its end frees it). A drained, unpaced send that succeeds
/// does not: the probe already showed the destination up.
pub fn reports(turn: DeskTurn, paced: bool, health_failure: bool) -> bool {
    health_failure
        || matches!(turn, DeskTurn::Ask | DeskTurn::Released { probe: true })
        || (paced && turn != DeskTurn::None)
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAITING: Option<DeskMark> = Some(DeskMark::Waiting {
        since_ms: 1,
        paused: false,
    });
    const PROBE: Option<DeskMark> = Some(DeskMark::Released { probe: true });
    const DRAINED: Option<DeskMark> = Some(DeskMark::Released { probe: false });
    const ASK: DeskTurn = DeskTurn::Ask;
    const NONE: DeskTurn = DeskTurn::None;

    #[test]
    fn the_turn_follows_the_mark_then_the_route_the_memory_and_a_retry() {
        // (mark, paced, open, retry, turn)
        let table = [
            (None, false, false, false, NONE),
            (None, true, false, false, ASK),
            (None, false, true, false, ASK),
            (None, false, false, true, ASK),
            (WAITING, false, false, false, ASK),
            (PROBE, true, true, true, DeskTurn::Released { probe: true }),
            (
                DRAINED,
                false,
                true,
                true,
                DeskTurn::Released { probe: false },
            ),
        ];
        for (mark, paced, open, retry, turn) in table {
            let case = (mark, paced, open, retry);
            assert_eq!(desk_turn(mark, paced, open, retry), turn, "{case:?}");
        }
    }

    #[test]
    fn the_happy_path_sends_all_and_a_release_sends_what_it_stands_for() {
        // (turn, paced, ready, goes now)
        let table = [
            (NONE, false, 40, Some(40)),
            (NONE, false, 1, Some(1)),
            (ASK, false, 40, None),
            (ASK, true, 1, None),
            (ASK, false, 0, Some(0)),
            (DeskTurn::Released { probe: true }, false, 40, Some(1)),
            (DeskTurn::Released { probe: false }, false, 40, Some(40)),
            (DeskTurn::Released { probe: false }, true, 40, Some(1)),
            (DeskTurn::Released { probe: true }, true, 0, Some(0)),
        ];
        for (turn, paced, ready, n) in table {
            assert_eq!(goes_now(turn, paced, ready), n, "{turn:?} {paced} {ready}");
        }
    }

    #[test]
    fn a_grant_is_at_least_one_and_at_most_what_is_ready() {
        for (ready, desk, n) in [(40, Some(5), 5), (3, Some(40), 3), (40, Some(0), 1)] {
            assert_eq!(granted(ready, desk), n);
        }
        assert_eq!(granted(40, None), 40, "an unreachable desk strands nothing");
        assert_eq!(granted(1, Some(1)), 1, "the job's effect: a batch of one");
    }

    #[test]
    fn only_a_first_unpaced_success_or_a_drained_one_says_nothing_to_the_desk() {
        // (turn, paced, health failure, reports)
        let table = [
            (NONE, false, false, false),
            (NONE, false, true, true),
            (NONE, true, false, false),
            (ASK, false, false, true),
            (ASK, true, false, true),
            (DeskTurn::Released { probe: true }, false, false, true),
            (DeskTurn::Released { probe: false }, false, false, false),
            (DeskTurn::Released { probe: false }, true, false, true),
            (DeskTurn::Released { probe: false }, false, true, true),
        ];
        for (turn, paced, failure, says) in table {
            assert_eq!(
                reports(turn, paced, failure),
                says,
                "{turn:?} {paced} {failure}"
            );
        }
    }
}
