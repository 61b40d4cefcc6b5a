//! The order of one results step, pure: what the gate's alarm performs for a batch's results
//! in one run, one piece of I/O or one commit at a time ([`ResultsWork`]), each decided from
//! what the last one gave ([`Seen`]). The edge (`src/edge/objects/gate/results.rs`) performs
//! the work and decides nothing; the host tests that kill the gate at every storage point
//! (`kill_results_tests.rs`) drive this same plan.
//!
//! Guarantees: the step is the progress's, chosen once on the progress as stored when it
//! starts ([`Progress::next`], or [`Progress::next_released`] when the desk released the
//! batch) and kept to the end of the run, awaits included; the progress is read again after
//! every await that precedes a decision on it (the file's check, a desk's turn that awaited
//! or paused, a read, the sends), since an operator's retry may run meanwhile. A file its last
//! read could not give is tried before the desk's turn ([`reads_first`]), so a batch that
//! cannot send takes no place in the desk's queue; a release or a grant is spent before the
//! sends it lets go; a chunk's claim is committed before any of its results is sent, and its
//! or the rows' commit after every answer, before the desk hears of them; a release that finds
//! nothing to send is spent and told at once. Each write is a [`Marking`], decided on the
//! record as stored when it is committed ([`crate::results::marks::decide`]).

use crate::destination::protocol::Sent;
use crate::destination::sending::Sending;
use crate::operation::{DeskMark, Operation};
use crate::results::item::{ResultItem, Source};
use crate::results::lines::Checkpoint;
use crate::results::marks::{Answers, Marking};
use crate::results::progress::{ChunkClaim, FileTrouble, Limits, Phase, Progress};
use crate::results::progress::{ProgressWrite, Step};
use crate::results::source::{file_of_details, unlocated, StatusTrouble, Unlocated};
use crate::results::turn::reads_first;

/// What the results' status call said of where they are.
#[derive(Debug, Clone, PartialEq)]
pub enum Located {
    /// The results' source, and when the batch ended (when the answer says).
    Found(Source, Option<i64>),
    /// The status budget said to wait until then: nothing was asked.
    WaitForSlot(i64),
    /// No usable answer.
    Failed(StatusTrouble),
}

/// A read's results, where it stopped and whether that is the file's end; or why it gave
/// nothing.
pub type Read = Result<(Vec<ResultItem>, Checkpoint, bool), FileTrouble>;

/// What the desk let a step's sends do: whether it was called first (an await: commands may
/// have run), and how many may go now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Granted {
    pub awaited: bool,
    pub n: u32,
}

/// The next piece of work of a results step, and what the plan is to be told of it.
#[derive(Debug, Clone, PartialEq)]
pub enum ResultsWork {
    /// Read the progress as stored: [`Seen::Progress`].
    LoadProgress,
    /// Ask the status API where the results are (inline items staged as they come):
    /// [`Seen::Located`].
    Locate,
    /// Back every status call off until then: [`Seen::Nothing`].
    BackOff(i64),
    /// Read at most `max` results of `source` from `from`: [`Seen::Read`].
    Read {
        source: Source,
        from: Checkpoint,
        max: u32,
    },
    /// The step's turn at the destination's desk for `ready` results, from the record's desk
    /// `mark` (a `retry` asks first): [`Seen::Turn`].
    Turn {
        mark: Option<DeskMark>,
        ready: u32,
        retry: bool,
    },
    /// The waiting rows' kept results, by index: [`Seen::Items`].
    LoadRows(Vec<u64>),
    /// Send these results, as the desk's turn lets them go: [`Seen::Sent`].
    Send(Vec<ResultItem>),
    /// Commit this write on the record as stored now: [`Seen::Committed`].
    Commit(Box<Marking>),
    /// The desk hears how the sends went, when its turn says it must: [`Seen::Told`].
    Report(Sent),
    /// A release found nothing to send: the desk hears at once (nothing sent) and may queue
    /// the batch again, due then: [`Seen::Told`].
    Tell(i64),
    /// Read the record as stored (the step's result): [`Seen::Nothing`].
    LoadRecord,
}

/// What the last piece of work gave.
#[derive(Debug, Clone, PartialEq)]
pub enum Seen {
    /// Nothing to tell (the step's start, a backoff, the record read).
    Nothing,
    /// The progress as stored, if any.
    Progress(Option<Progress>),
    Located(Located),
    Read(Read),
    /// The desk's turn, or `Err(paused)` when it queued the batch.
    Turn(Result<Granted, bool>),
    Items(Vec<ResultItem>),
    /// Each result's answer, in order, and how the sends went.
    Sent(Vec<(ResultItem, Sending)>, Sent),
    /// The commit's claim, when it claimed a chunk.
    Committed(Option<ChunkClaim>),
    /// `Some(paused)` when the desk queued the batch.
    Told(Option<bool>),
}

/// Whose answers a step's sends carry, for their commit.
#[derive(Debug, Clone, PartialEq)]
enum Carries {
    /// Claim number `chunk`'s, before `reached`.
    Chunk {
        chunk: u64,
        reached: Checkpoint,
    },
    Rows,
}

/// Where the step stands: what it waits to be told, with what it holds.
#[derive(Debug, Clone, PartialEq)]
enum Stage {
    Start,
    Stored,
    Locating(Progress),
    BackedOff(Progress, Unlocated),
    Begun(Progress),
    ReleaseSpent(i64),
    ReleaseTold(i64),
    Checking(Progress, Step),
    Checked(Progress, Step, Option<FileTrouble>),
    AtDesk(Progress, Step),
    Spent(Progress, Step, Granted),
    Awaited(Progress, Step, u32),
    Paused(Progress),
    Reading(Progress, Option<ChunkClaim>),
    ReadThen(Progress, Option<ChunkClaim>, Read),
    Claiming(Progress, Vec<ResultItem>, Checkpoint),
    Rows(Progress),
    Sending(Progress, Carries),
    SentThen(Progress, Carries, Vec<(ResultItem, Sending)>, Sent),
    Reporting(Sent),
    Reported,
    Over,
}

/// One results step of a record, from the stored progress to its last commit.
#[derive(Debug, Clone, PartialEq)]
pub struct ResultsPlan {
    stage: Stage,
    /// When the step started: its step is chosen then.
    now: i64,
    limits: Limits,
    /// From the record as the step found it: its desk mark, when its results began, when the
    /// batch ended, and the file its outcome names.
    mark: Option<DeskMark>,
    settled_ms: Option<i64>,
    updated_ms: i64,
    file: Option<String>,
}

impl ResultsPlan {
    /// The step of `op`'s results at `now`; it does nothing unless they are due (the alarm
    /// also runs for other work: a wait the results chose holds until it is over).
    pub fn new(op: &Operation, now: i64, limits: Limits) -> ResultsPlan {
        let due = op.results_due_ms().is_some_and(|at| at <= now);
        ResultsPlan {
            stage: if due { Stage::Start } else { Stage::Over },
            now,
            limits,
            mark: op.effect().desk(),
            settled_ms: op.settled_at_ms(),
            updated_ms: op.update_time_ms(),
            file: file_of_details(op.details()),
        }
    }

    /// The next piece of work, given what the last one gave (`Seen::Nothing` first) at `now`;
    /// `None` when the step is over.
    pub fn next(&mut self, seen: Seen, now: i64) -> Option<ResultsWork> {
        let stage = std::mem::replace(&mut self.stage, Stage::Over);
        match (stage, seen) {
            (Stage::Start, _) => self.then(Stage::Stored, ResultsWork::LoadProgress),
            (Stage::Stored, Seen::Progress(stored)) => self.stored(stored),
            (Stage::Locating(p), Seen::Located(located)) => self.located(p, located, now),
            (Stage::BackedOff(p, next), _) => self.unlocated(p, next),
            (Stage::Begun(p), Seen::Committed(_)) => self.chosen(p),
            (Stage::ReleaseSpent(at), _) => {
                self.then(Stage::ReleaseTold(at), ResultsWork::Tell(at))
            }
            (Stage::ReleaseTold(at), Seen::Told(waits)) => match waits {
                Some(paused) => self.commit(Stage::Over, wait(paused, None)),
                None => self.commit(Stage::Over, Marking::DueAt(at)),
            },
            (Stage::Checking(p, step), Seen::Read(read)) => {
                let stage = Stage::Checked(p, step, read.err());
                self.then(stage, ResultsWork::LoadProgress)
            }
            (Stage::Checked(p, step, trouble), Seen::Progress(fresh)) => {
                let p = fresh.unwrap_or(p);
                match trouble {
                    Some(t) => self.commit(Stage::Over, Marking::ReadFailed(p, t)),
                    None => self.turn(p, step),
                }
            }
            (Stage::AtDesk(p, step), Seen::Turn(turn)) => self.at_desk(p, step, turn),
            (Stage::Spent(p, step, granted), _) => self.granted(p, step, granted),
            (Stage::Awaited(p, step, n), Seen::Progress(fresh)) => {
                self.act(fresh.unwrap_or(p), step, n)
            }
            (Stage::Paused(p), Seen::Progress(fresh)) => {
                let held = ProgressWrite::held_by_pause(fresh.unwrap_or(p));
                self.commit(Stage::Over, wait(true, held))
            }
            (Stage::Reading(p, claimed), Seen::Read(read)) => {
                self.then(Stage::ReadThen(p, claimed, read), ResultsWork::LoadProgress)
            }
            (Stage::ReadThen(p, claimed, read), Seen::Progress(fresh)) => {
                self.read(fresh.unwrap_or(p), claimed, read)
            }
            (Stage::Claiming(p, items, to), Seen::Committed(Some(claim))) => {
                let answers = Carries::Chunk {
                    chunk: claim.chunk,
                    reached: to,
                };
                self.then(Stage::Sending(p, answers), ResultsWork::Send(items))
            }
            (Stage::Rows(p), Seen::Items(items)) => {
                self.then(Stage::Sending(p, Carries::Rows), ResultsWork::Send(items))
            }
            (Stage::Sending(p, kind), Seen::Sent(answers, sent)) => {
                let stage = Stage::SentThen(p, kind, answers, sent);
                self.then(stage, ResultsWork::LoadProgress)
            }
            (Stage::SentThen(p, kind, answers, sent), Seen::Progress(fresh)) => {
                let answers = match kind {
                    Carries::Chunk { chunk, reached } => Answers::Chunk {
                        chunk,
                        reached,
                        answers,
                    },
                    Carries::Rows => Answers::Rows(answers),
                };
                let committed = Marking::Committed {
                    progress: fresh.unwrap_or(p),
                    answers,
                    asked_wait_ms: sent.asked_wait_ms,
                };
                self.commit(Stage::Reporting(sent), committed)
            }
            (Stage::Reporting(sent), _) => self.then(Stage::Reported, ResultsWork::Report(sent)),
            (Stage::Reported, Seen::Told(Some(paused))) => {
                self.commit(Stage::Over, wait(paused, None))
            }
            (Stage::Reported, _) => self.then(Stage::Over, ResultsWork::LoadRecord),
            (Stage::Over, _) => None,
            (stage, seen) => unreachable!("a results step at {stage:?} told {seen:?}"),
        }
    }

    fn then(&mut self, stage: Stage, work: ResultsWork) -> Option<ResultsWork> {
        self.stage = stage;
        Some(work)
    }

    fn commit(&mut self, stage: Stage, marking: Marking) -> Option<ResultsWork> {
        self.then(stage, ResultsWork::Commit(Box::new(marking)))
    }

    /// The progress as stored: the step goes on from it, or where the results are is asked
    /// first (the outcome's file, else the status answer), and stored.
    fn stored(&mut self, stored: Option<Progress>) -> Option<ResultsWork> {
        let since = stored.as_ref().map(|p| p.since_ms);
        if let Some(p) = stored.filter(|p| !p.wants_locating()) {
            return self.chosen(p);
        }
        // Counted from an operator's retry, when one asks again.
        let since = since.unwrap_or_else(|| self.settled_ms.unwrap_or(self.now));
        let mut p = Progress::begin(Source::Inline, since);
        p.ended_ms = Some(self.updated_ms).filter(|&t| t > 0);
        match self.file.clone() {
            Some(name) => {
                p.source = Source::File { name };
                self.commit(Stage::Begun(p.clone()), Marking::Progress(p))
            }
            None => self.then(Stage::Locating(p), ResultsWork::Locate),
        }
    }

    /// The status call's answer: the source stored; or the results due when it may be asked
    /// again (its budget said wait), or after its backoff ([`unlocated`] decides).
    fn located(&mut self, mut p: Progress, located: Located, now: i64) -> Option<ResultsWork> {
        match located {
            Located::Found(source, ended) => {
                p.source = source;
                p.ended_ms = ended.or(p.ended_ms);
                self.commit(Stage::Begun(p.clone()), Marking::Progress(p))
            }
            Located::WaitForSlot(at) => self.commit(Stage::Over, Marking::DueAt(at)),
            Located::Failed(trouble) => {
                let (next, backoff) = unlocated(&trouble, now, p.since_ms, &self.limits);
                match backoff {
                    Some(until) => {
                        self.then(Stage::BackedOff(p, next), ResultsWork::BackOff(until))
                    }
                    None => self.unlocated(p, next),
                }
            }
        }
    }

    /// No answer: asked again then, or (Gemini cannot say where they are) the results are
    /// parked with the reason.
    fn unlocated(&mut self, mut p: Progress, next: Unlocated) -> Option<ResultsWork> {
        match next {
            Unlocated::AskAt(at) => self.commit(Stage::Over, Marking::DueAt(at)),
            Unlocated::Park(reason) => {
                p.phase = Phase::FileParked { reason };
                p.unlocated = true;
                self.commit(Stage::Begun(p.clone()), Marking::Progress(p))
            }
        }
    }

    /// The step chosen on the progress `p`: a release that finds nothing to send is spent and
    /// told; a file the last read could not give is tried first; else the desk's turn.
    fn chosen(&mut self, p: Progress) -> Option<ResultsWork> {
        let released = matches!(self.mark, Some(DeskMark::Released { .. }));
        let step = match released {
            true => p.next_released(self.now),
            false => p.next(self.now),
        };
        if let (true, &Step::WaitUntil(at)) = (released, &step) {
            return self.commit(Stage::ReleaseSpent(at), Marking::DeskSpent);
        }
        match reads_first(&step, &p.phase, released) {
            Some(from) => {
                let source = p.source.clone();
                let read = ResultsWork::Read {
                    source,
                    from,
                    max: 1,
                };
                self.then(Stage::Checking(p, step), read)
            }
            None => self.turn(p, step),
        }
    }

    /// The desk's turn for the step's sends, if it sends any.
    fn turn(&mut self, p: Progress, step: Step) -> Option<ResultsWork> {
        let Some((ready, retry)) = step.sends() else {
            return self.act(p, step, 0);
        };
        let turn = ResultsWork::Turn {
            mark: self.mark,
            ready: ready as u32,
            retry,
        };
        self.then(Stage::AtDesk(p, step), turn)
    }

    /// The desk's answer: a release or a grant is spent before the sends; a queued batch
    /// waits (a pause holds the failing clocks of the progress as stored then).
    fn at_desk(
        &mut self,
        p: Progress,
        step: Step,
        turn: Result<Granted, bool>,
    ) -> Option<ResultsWork> {
        match turn {
            Ok(granted) if self.mark.is_some() && granted.n > 0 => {
                self.commit(Stage::Spent(p, step, granted), Marking::DeskSpent)
            }
            Ok(granted) => self.granted(p, step, granted),
            Err(true) => self.then(Stage::Paused(p), ResultsWork::LoadProgress),
            Err(false) => self.commit(Stage::Over, wait(false, None)),
        }
    }

    /// The step goes on with its grant, on the progress as stored when the desk was called.
    fn granted(&mut self, p: Progress, step: Step, granted: Granted) -> Option<ResultsWork> {
        match granted.awaited {
            true => self.then(
                Stage::Awaited(p, step, granted.n),
                ResultsWork::LoadProgress,
            ),
            false => self.act(p, step, granted.n),
        }
    }

    /// The step itself, `n` of its results let go.
    fn act(&mut self, p: Progress, step: Step, n: u32) -> Option<ResultsWork> {
        let source = p.source.clone();
        let read = |from| ResultsWork::Read {
            source,
            from,
            max: n,
        };
        let marking = match step {
            Step::WaitUntil(at) => Marking::DueAt(at),
            Step::ReadChunk { from, .. } => return self.then(Stage::Reading(p, None), read(from)),
            Step::ResendChunk(c) => return self.then(Stage::Reading(p, Some(c)), read(c.from)),
            Step::RetryRows(indexes) => {
                let indexes = indexes.into_iter().take(n as usize).collect();
                return self.then(Stage::Rows(p), ResultsWork::LoadRows(indexes));
            }
            Step::Alert(reason) => Marking::FileParked(p, reason),
            Step::AlertFailing(n) => Marking::GaveUp(p, n),
            Step::AlertSenders(n) => Marking::Senders(p, Some(n)),
            Step::SendersBack => Marking::Senders(p, None),
            Step::Settled(counts) => Marking::Settled {
                counts,
                failing_parked: p.gave_up,
            },
        };
        self.commit(Stage::Over, marking)
    }

    /// A chunk's read, on the progress as stored after it: a failed read committed (the desk
    /// hears nothing went); the next chunk claimed before its sends; or the claimed one's
    /// results (those before its end) sent again under their same ids, in parts when the desk
    /// let fewer go than it holds (the rest stays claimed).
    fn read(
        &mut self,
        p: Progress,
        claimed: Option<ChunkClaim>,
        read: Read,
    ) -> Option<ResultsWork> {
        let (items, to, last) = match read {
            Err(trouble) => {
                let stage = Stage::Reporting(Sent::default());
                return self.commit(stage, Marking::ReadFailed(p, trouble));
            }
            Ok(read) => read,
        };
        let Some(claim) = claimed else {
            let claimed = Marking::Claimed {
                progress: p.clone(),
                to,
                last,
            };
            return self.commit(Stage::Claiming(p, items, to), claimed);
        };
        let items = items.into_iter().filter(|i| i.index < claim.to.index);
        let reached = std::cmp::min_by_key(claim.to, to, |c| c.index);
        let answers = Carries::Chunk {
            chunk: claim.chunk,
            reached,
        };
        let send = ResultsWork::Send(items.collect());
        self.then(Stage::Sending(p, answers), send)
    }
}

/// The desk queued the batch.
fn wait(paused: bool, held: Option<ProgressWrite>) -> Marking {
    Marking::Wait { paused, held }
}
