//! A results step's turn at its destination's desk: how many of the results it has ready may
//! go now, and whether it asks first.
//!
//! Guarantees (docs/DESIGN.md, invariant 8, as for the job's effect): a batch's results are
//! one key at the desk, so they wait as one while the destination is open and take one place
//! in its queue. A step asks ([`crate::destination::protocol::DeskCommand::Ask`]) on a
//! paced route, when this isolate remembers the destination open, before retrying results and
//! while the record says they wait; the desk grants a number. A release goes without asking:
//! as the probe, one result; on a paced route, one (the release took one token); else the
//! whole step. Otherwise (the happy path) the whole step goes and no desk hears of it.

use crate::operation::gate::alarm::DeskTurn;

/// How many of `ready` results go without asking; `None`: ask the desk for `ready`.
pub fn goes_now(turn: DeskTurn, paced: bool, ready: u32) -> Option<u32> {
    match turn {
        DeskTurn::Ask => None,
        DeskTurn::None => Some(ready),
        DeskTurn::Released { probe: false } if !paced => Some(ready),
        DeskTurn::Released { .. } => Some(ready.min(1)),
    }
}

/// How many go when the desk granted `granted` of `ready` (`None`: the desk could not be
/// reached, and an unreachable desk never strands results: they all go, each result's own
/// backoff still bounding it).
pub fn granted(ready: u32, granted: Option<u32>) -> u32 {
    granted.map_or(ready, |n| n.max(1).min(ready))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_happy_path_sends_the_whole_step_and_a_release_sends_what_it_stands_for() {
        assert_eq!(goes_now(DeskTurn::None, false, 40), Some(40));
        assert_eq!(goes_now(DeskTurn::Ask, false, 40), None);
        assert_eq!(
            goes_now(DeskTurn::Released { probe: true }, false, 40),
            Some(1)
        );
        assert_eq!(
            goes_now(DeskTurn::Released { probe: false }, false, 40),
            Some(40)
        );
        assert_eq!(
            goes_now(DeskTurn::Released { probe: false }, true, 40),
            Some(1)
        );
        assert_eq!(
            goes_now(DeskTurn::Released { probe: true }, true, 0),
            Some(0)
        );
    }

    #[test]
    fn a_grant_is_at_least_one_and_at_most_what_is_ready() {
        assert_eq!(granted(40, Some(5)), 5);
        assert_eq!(granted(3, Some(40)), 3);
        assert_eq!(granted(40, Some(0)), 1);
        assert_eq!(granted(40, None), 40);
    }
}
