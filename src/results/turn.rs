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
//!
//! A batch that cannot send never waits in the desk's queue: a step that would read a file
//! its last read could not (missing, its download refused) tries the file's first line before
//! its turn ([`reads_first`]), so it takes a place in the queue (and a probe) only once it can
//! send; the desk hears nothing of it until then.

use crate::operation::gate::alarm::DeskTurn;
use crate::results::lines::Checkpoint;
use crate::results::progress::{Phase, Step};

/// Where a step reads its file's first line before its turn at the desk (`None`: it takes its
/// turn first): a read of a file the last read could not give, unless the desk released the
/// batch (the release is spent either way, and its report says nothing went).
pub fn reads_first(step: &Step, phase: &Phase, released: bool) -> Option<Checkpoint> {
    let troubled = matches!(phase, Phase::WaitingForFile { failures, .. } if *failures > 0);
    match step {
        _ if released || !troubled => None,
        Step::ReadChunk { from, .. } => Some(*from),
        Step::ResendChunk(claim) => Some(claim.from),
        _ => None,
    }
}

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
    fn a_file_the_last_read_could_not_give_is_tried_before_the_desk_unless_released() {
        let at = |index| Checkpoint { offset: 0, index };
        let read = Step::ReadChunk {
            chunk: 0,
            from: at(3),
        };
        let missing = Phase::WaitingForFile {
            failures: 2,
            next_at_ms: 0,
        };
        assert_eq!(reads_first(&read, &missing, false), Some(at(3)));
        assert_eq!(reads_first(&read, &missing, true), None, "released");
        assert_eq!(reads_first(&read, &Phase::Reading, false), None);
        let reopened = Phase::WaitingForFile {
            failures: 0,
            next_at_ms: 0,
        };
        assert_eq!(reads_first(&read, &reopened, false), None, "not failed yet");
        let claim = crate::results::progress::ChunkClaim {
            chunk: 1,
            from: at(40),
            to: at(80),
            last: false,
        };
        let resend = Step::ResendChunk(claim);
        assert_eq!(reads_first(&resend, &missing, false), Some(at(40)));
        assert_eq!(
            reads_first(&Step::RetryRows(vec![1]), &missing, false),
            None
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
