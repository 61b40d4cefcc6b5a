//! Whether a results step reads its file before its turn at the destination's desk (the
//! turn itself is [`crate::operation::gate::desk_turn`]'s, as for the job's effect: a batch's
//! results are one key at the desk, so they wait as one while the destination is open and
//! take one place in its queue).
//!
//! Guarantees: a batch that cannot send never waits in the desk's queue: a step that would
//! read a file its last read could not (missing, its download refused) tries the file's first
//! line before its turn ([`reads_first`]), so it takes a place in the queue (and a probe) only
//! once it can send; the desk hears nothing of it until then.

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
