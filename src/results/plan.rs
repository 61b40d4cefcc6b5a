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
//! record as stored when it is committed ([`crate::results::marks::decide`]). It never panics:
//! told what its stage does not expect, the step ends with [`Unexpected`], the alarm's error.

use crate::destination::protocol::Sent;
use crate::destination::sending::Sending;
use crate::operation::gate::alarm::Attempt;
use crate::operation::{Claim, DeskMark, Operation};
use crate::results::item::{ResultItem, Source};
use crate::results::lines::Checkpoint;
use crate::results::marks::{Answers, Claimed, Marking};
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
    /// `mark` (a `retry` asks first), at the desk of the record as the step found it:
    /// [`Seen::Turn`].
    Turn {
        mark: Option<DeskMark>,
        ready: u32,
        retry: bool,
    },
    /// The waiting rows' kept results, by index: [`Seen::Items`].
    LoadRows(Vec<u64>),
    /// Send these results, as the desk's turn lets them go, with the head of the record as
    /// the step found it: [`Seen::Sent`].
    Send(Vec<ResultItem>),
    /// Send the job's effect under this claim, built from the record as claimed:
    /// [`Seen::Attempted`].
    SendEffect(Claim),
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
    /// How the job's attempt went, and how the send went (as its desk hears it).
    Attempted(Box<Attempt>, Sent),
    /// The commit's claim, when it claimed a chunk or the job's effect.
    Committed(Option<Claimed>),
    /// `Some(paused)` when the desk queued the batch.
    Told(Option<bool>),
}

/// The chunk a step's sends carry the answers of: claim number `chunk`'s, before `reached`
/// (`None`: the rows').
type Carries = Option<(u64, Checkpoint)>;

/// Where the step stands: what it waits to be told, with what it holds.
#[derive(Debug, Clone, PartialEq)]
enum Stage {
    Start(Found),
    Stored(Found),
    Locating(Found, Progress),
    BackedOff(Found, Progress, Unlocated),
    Begun(Found, Progress),
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
    /// The job's effect (a batch of one): its turn, its claim, its send, its answer's commit
    /// and its report.
    Effect(bool),
    EffectAtDesk,
    EffectClaiming,
    EffectSending,
    EffectAnswered(Sent),
    EffectReported,
    Over,
}

/// One results step of a record, from the stored progress to its last commit.
#[derive(Debug, Clone, PartialEq)]
pub struct ResultsPlan {
    stage: Stage,
    limits: Limits,
    /// The record's desk mark as the step found it (an unspent release, when it is one).
    mark: Option<DeskMark>,
}

/// A batch's own (a job's plan has none), from the record as its step found it: when the step
/// started (its step is chosen then), when its results began (the batch's end, else the step's
/// start) and ended as the outcome says, and the file it names.
#[derive(Debug, Clone, PartialEq)]
struct Found {
    now: i64,
    since_ms: i64,
    ended_ms: Option<i64>,
    file: Option<String>,
}

impl ResultsPlan {
    /// The step of `op`'s results at `now`, when they are due (the alarm also runs for other
    /// work: a wait the results chose holds until it is over).
    pub fn new(op: &Operation, now: i64, limits: Limits) -> Option<ResultsPlan> {
        op.results_due_ms().filter(|&at| at <= now)?;
        let found = Found {
            now,
            since_ms: op.settled_at_ms().unwrap_or(now),
            ended_ms: Some(op.update_time_ms()).filter(|&t| t > 0),
            file: file_of_details(op.details()),
        };
        Some(ResultsPlan {
            stage: Stage::Start(found),
            limits,
            mark: op.effect().desk(),
        })
    }

    /// The job's effect of `op`, a batch of one, when the alarm's plan finds it due
    /// ([`crate::operation::gate::alarm::AlarmWork::Effect`]): its turn at the desk (a retry,
    /// after a failure, asks first), its claim committed on the record as stored then (none when it is no
    /// longer owed: the step ends), its send, its answer committed under the claim's fencing
    /// token, then the desk's report; a desk that queued it makes it wait.
    pub fn job(op: &Operation, limits: Limits) -> ResultsPlan {
        let retry = op.effect().failures_in_row() > 0;
        ResultsPlan {
            stage: Stage::Effect(retry),
            limits,
            mark: op.effect().desk(),
        }
    }

    /// The next piece of work, given what the last one gave (`Seen::Nothing` first) at `now`;
    /// `None` when the step is over; [`Unexpected`] when told what its stage does not expect.
    pub fn next(&mut self, seen: Seen, now: i64) -> Result<Option<ResultsWork>, Unexpected> {
        let stage = std::mem::replace(&mut self.stage, Stage::Over);
        Ok(match (stage, seen) {
            (Stage::Start(f), _) => self.then(Stage::Stored(f), ResultsWork::LoadProgress),
            (Stage::Stored(f), Seen::Progress(stored)) => self.stored(f, stored),
            (Stage::Locating(f, p), Seen::Located(located)) => self.located(f, p, located, now),
            (Stage::BackedOff(f, p, next), _) => self.unlocated(f, p, next),
            (Stage::Begun(f, p), Seen::Committed(_)) => self.chosen(f, p),
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
                    None => self.ask_turn(p, step),
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
            (Stage::Claiming(p, items, to), Seen::Committed(Some(Claimed::Chunk(claim)))) => {
                let carries = Some((claim.chunk, to));
                self.then(Stage::Sending(p, carries), ResultsWork::Send(items))
            }
            (Stage::Rows(p), Seen::Items(items)) => {
                self.then(Stage::Sending(p, None), ResultsWork::Send(items))
            }
            (Stage::Sending(p, carries), Seen::Sent(answers, sent)) => {
                let stage = Stage::SentThen(p, carries, answers, sent);
                self.then(stage, ResultsWork::LoadProgress)
            }
            (Stage::SentThen(p, carries, answers, sent), Seen::Progress(fresh)) => {
                self.answered(fresh.unwrap_or(p), carries, answers, sent)
            }
            (Stage::Reporting(sent), _) => self.then(Stage::Reported, ResultsWork::Report(sent)),
            (Stage::Reported, Seen::Told(Some(paused))) => {
                self.commit(Stage::Over, wait(paused, None))
            }
            (Stage::Reported, _) => self.then(Stage::Over, ResultsWork::LoadRecord),
            (Stage::Over, _) => None,
            // The job's effect's stages.
            (stage, seen) => return self.effect(stage, seen),
        })
    }

    /// The job's effect, a batch of one: its turn; a queued effect waits; its claim committed
    /// on the record as stored (none: no longer owed, the step ends); its send under the
    /// claim; its answer committed; the desk's report, which may make it wait.
    fn effect(&mut self, stage: Stage, seen: Seen) -> Result<Option<ResultsWork>, Unexpected> {
        Ok(match (stage, seen) {
            (Stage::Effect(retry), _) => {
                let (mark, ready) = (self.mark, 1);
                let turn = ResultsWork::Turn { mark, ready, retry };
                self.then(Stage::EffectAtDesk, turn)
            }
            (Stage::EffectAtDesk, Seen::Turn(Err(paused))) => {
                self.commit(Stage::Over, Marking::EffectWaits(paused))
            }
            (Stage::EffectAtDesk, Seen::Turn(Ok(_))) => {
                self.commit(Stage::EffectClaiming, Marking::EffectClaim)
            }
            (Stage::EffectClaiming, Seen::Committed(Some(Claimed::Effect(claim)))) => {
                self.then(Stage::EffectSending, ResultsWork::SendEffect(claim))
            }
            (Stage::EffectClaiming, Seen::Committed(_)) => None,
            (Stage::EffectSending, Seen::Attempted(attempt, sent)) => {
                let answered = Marking::EffectAnswered(attempt);
                self.commit(Stage::EffectAnswered(sent), answered)
            }
            (Stage::EffectAnswered(sent), _) => {
                self.then(Stage::EffectReported, ResultsWork::Report(sent))
            }
            (Stage::EffectReported, Seen::Told(Some(paused))) => {
                self.commit(Stage::Over, Marking::EffectWaits(paused))
            }
            (Stage::EffectReported, _) => None,
            (stage, seen) => return Err(Unexpected(variant(&stage), variant(&seen))),
        })
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
    fn stored(&mut self, f: Found, stored: Option<Progress>) -> Option<ResultsWork> {
        let since = stored.as_ref().map(|p| p.since_ms);
        if let Some(p) = stored.filter(|p| !p.wants_locating()) {
            return self.chosen(f, p);
        }
        // Counted from an operator's retry, when one asks again.
        let mut p = Progress::begin(Source::Inline, since.unwrap_or(f.since_ms));
        p.ended_ms = f.ended_ms;
        match f.file.clone() {
            Some(name) => {
                p.source = Source::File { name };
                self.commit(Stage::Begun(f, p.clone()), Marking::Progress(p))
            }
            None => self.then(Stage::Locating(f, p), ResultsWork::Locate),
        }
    }

    /// The status call's answer: the source stored; or the results due when it may be asked
    /// again (its budget said wait), or after its backoff ([`unlocated`] decides).
    fn located(
        &mut self,
        f: Found,
        mut p: Progress,
        located: Located,
        now: i64,
    ) -> Option<ResultsWork> {
        match located {
            Located::Found(source, ended) => {
                p.source = source;
                p.ended_ms = ended.or(p.ended_ms);
                self.commit(Stage::Begun(f, p.clone()), Marking::Progress(p))
            }
            Located::WaitForSlot(at) => self.commit(Stage::Over, Marking::DueAt(at)),
            Located::Failed(trouble) => {
                let (next, backoff) = unlocated(&trouble, now, p.since_ms, &self.limits);
                match backoff {
                    Some(until) => {
                        self.then(Stage::BackedOff(f, p, next), ResultsWork::BackOff(until))
                    }
                    None => self.unlocated(f, p, next),
                }
            }
        }
    }

    /// No answer: asked again then, or (Gemini cannot say where they are) the results are
    /// parked with the reason.
    fn unlocated(&mut self, f: Found, mut p: Progress, next: Unlocated) -> Option<ResultsWork> {
        match next {
            Unlocated::AskAt(at) => self.commit(Stage::Over, Marking::DueAt(at)),
            Unlocated::Park(reason) => {
                p.phase = Phase::FileParked { reason };
                p.unlocated = true;
                self.commit(Stage::Begun(f, p.clone()), Marking::Progress(p))
            }
        }
    }

    /// The step chosen on the progress `p`: a release that finds nothing to send is spent and
    /// told; a file the last read could not give is tried first; else the desk's turn.
    fn chosen(&mut self, f: Found, p: Progress) -> Option<ResultsWork> {
        let released = matches!(self.mark, Some(DeskMark::Released { .. }));
        let step = match released {
            true => p.next_released(f.now),
            false => p.next(f.now),
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
            None => self.ask_turn(p, step),
        }
    }

    /// The desk's turn for the step's sends, if it sends any.
    fn ask_turn(&mut self, p: Progress, step: Step) -> Option<ResultsWork> {
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

    /// A chunk's read, on the progress as stored after it: a failed read committed (then the
    /// desk hears, when its turn says it must, that nothing went); the next chunk claimed
    /// before its sends; or the claimed one's
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
        let send = ResultsWork::Send(items.collect());
        self.then(Stage::Sending(p, Some((claim.chunk, reached))), send)
    }

    /// The sends' answers, committed on the progress as stored after them, before the desk
    /// hears of them.
    fn answered(
        &mut self,
        progress: Progress,
        carries: Carries,
        answers: Vec<(ResultItem, Sending)>,
        sent: Sent,
    ) -> Option<ResultsWork> {
        let answers = match carries {
            Some((chunk, reached)) => Answers::Chunk {
                chunk,
                reached,
                answers,
            },
            None => Answers::Rows(answers),
        };
        let committed = Marking::Committed {
            progress,
            answers,
            asked_wait_ms: sent.asked_wait_ms,
        };
        self.commit(Stage::Reporting(sent), committed)
    }
}

/// A step told what its stage does not expect, by their names (not what they hold: results):
/// the alarm's error, counted and alerted as any failing alarm's, never a panic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a results step at {0} was told {1}")]
pub struct Unexpected(String, String);

/// A value's variant, by name: its `Debug` form up to its fields.
fn variant(value: &impl std::fmt::Debug) -> String {
    let debug = format!("{value:?}");
    debug.split(['(', ' ', '{']).next().unwrap_or("").into()
}

/// The desk queued the batch.
fn wait(paused: bool, held: Option<ProgressWrite>) -> Marking {
    Marking::Wait { paused, held }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::results::item::Payload;
    use crate::results::marks::tests::succeeded;
    use crate::retry::{AttemptOutcome, Backoff};

    const NOW: i64 = 100;
    const LIMITS: Limits = Limits {
        file_wait_ms: 30 * 60 * 1_000,
        retry: Backoff::new(1_000, 60_000),
        alert_after_ms: 86_400_000,
    };

    fn at(index: u64) -> Checkpoint {
        Checkpoint { offset: 0, index }
    }

    fn item(index: u64) -> ResultItem {
        ResultItem {
            result_key: format!("k{index}"),
            index,
            payload: Payload::Response(json!({"n": index})),
        }
    }

    /// A file's progress, read to `done`.
    fn reading(done: u64) -> Progress {
        let name = "files/out".to_string();
        let mut p = Progress::begin(Source::File { name }, 10);
        p.done_through = at(done);
        p
    }

    /// A file whose last read did not give it, asked for again at `next_at_ms`.
    fn troubled(next_at_ms: i64) -> Progress {
        let mut p = reading(0);
        p.phase = Phase::WaitingForFile {
            failures: 1,
            next_at_ms,
        };
        p
    }

    /// What the world answers: the progress as `stored`, a read of three results from where
    /// it starts, the desk's grant of all (no await), each result delivered, the desk silent.
    fn world(stored: Progress) -> impl FnMut(&ResultsWork) -> Seen {
        move |work| match work {
            ResultsWork::LoadProgress => Seen::Progress(Some(stored.clone())),
            ResultsWork::Read { from, max, .. } => {
                let n = u64::from(*max).min(3);
                let items = (from.index..from.index + n).map(item).collect();
                Seen::Read(Ok((items, at(from.index + n), n < 3)))
            }
            ResultsWork::Turn { ready, .. } => Seen::Turn(Ok(Granted {
                awaited: false,
                n: *ready,
            })),
            ResultsWork::LoadRows(indexes) => {
                Seen::Items(indexes.iter().map(|&i| item(i)).collect())
            }
            ResultsWork::Send(items) => {
                let delivered = Sending::Answered(AttemptOutcome::Delivered);
                let answers = items.iter().map(|i| (i.clone(), delivered.clone()));
                Seen::Sent(answers.collect(), Sent::default())
            }
            ResultsWork::Commit(m) => match &**m {
                Marking::Claimed { progress, to, last } => {
                    let claim = progress.clone().claim(*to, *last);
                    Seen::Committed(Some(Claimed::Chunk(claim)))
                }
                _ => Seen::Committed(None),
            },
            ResultsWork::SendEffect(claim) => Seen::Attempted(
                Box::new(Attempt {
                    claim: *claim,
                    outcome: AttemptOutcome::Delivered,
                    started_ms: NOW,
                    finished_ms: NOW + 10,
                    asked_wait_ms: None,
                    target: Default::default(),
                }),
                Sent::default(),
            ),
            ResultsWork::Report(_) | ResultsWork::Tell(_) => Seen::Told(None),
            ResultsWork::Locate | ResultsWork::BackOff(_) | ResultsWork::LoadRecord => {
                Seen::Nothing
            }
        }
    }

    /// The step of `op`, each work answered by `answer`: the works in order.
    fn drive(op: &Operation, mut answer: impl FnMut(&ResultsWork) -> Seen) -> Vec<ResultsWork> {
        let mut plan = ResultsPlan::new(op, NOW, LIMITS).expect("due");
        let (mut works, mut seen) = (Vec::new(), Seen::Nothing);
        while let Some(work) = plan.next(seen, NOW).expect("told what it expects") {
            seen = answer(&work);
            works.push(work);
            assert!(works.len() < 40, "{works:?}");
        }
        works
    }

    /// Each work by name (a commit by its marking's).
    fn names(works: &[ResultsWork]) -> Vec<&'static str> {
        let name = |w: &ResultsWork| match w {
            ResultsWork::LoadProgress => "load",
            ResultsWork::Locate => "locate",
            ResultsWork::BackOff(_) => "back off",
            ResultsWork::Read { max: 1, .. } => "check",
            ResultsWork::Read { .. } => "read",
            ResultsWork::Turn { .. } => "turn",
            ResultsWork::LoadRows(_) => "rows",
            ResultsWork::Send(_) | ResultsWork::SendEffect(_) => "send",
            ResultsWork::Commit(m) => match **m {
                Marking::Progress(_) => "progress",
                Marking::Claimed { .. } => "claim",
                Marking::Committed { .. } => "commit",
                Marking::ReadFailed(..) => "read failed",
                Marking::Wait { .. } => "wait",
                Marking::DueAt(_) => "due",
                Marking::DeskSpent => "spent",
                Marking::EffectClaim => "claim effect",
                Marking::EffectAnswered(_) => "commit effect",
                Marking::EffectWaits(_) => "effect waits",
                _ => "alert or settled",
            },
            ResultsWork::Report(_) => "report",
            ResultsWork::Tell(_) => "tell",
            ResultsWork::LoadRecord => "record",
        };
        works.iter().map(name).collect()
    }

    fn last_marking(works: &[ResultsWork]) -> Marking {
        match works.last() {
            Some(ResultsWork::Commit(m)) => (**m).clone(),
            other => panic!("{other:?}"),
        }
    }

    /// The job's effect of `op` (a batch of one), each work answered by `answer`, its claim's
    /// commit claiming the effect when it is still `owed`: the works in order.
    fn drive_job(
        op: &Operation,
        owed: bool,
        mut answer: impl FnMut(&ResultsWork) -> Seen,
    ) -> Vec<ResultsWork> {
        let mut plan = ResultsPlan::job(op, LIMITS);
        let (mut works, mut seen) = (Vec::new(), Seen::Nothing);
        let claim = Claim {
            token: 7,
            expires_ms: NOW + 600_000,
            generation: 1,
        };
        while let Some(work) = plan.next(seen, NOW).expect("told what it expects") {
            seen = match &work {
                ResultsWork::Commit(m) if **m == Marking::EffectClaim => {
                    Seen::Committed(owed.then_some(Claimed::Effect(claim)))
                }
                w => answer(w),
            };
            works.push(work);
            assert!(works.len() < 20, "{works:?}");
        }
        works
    }

    /// A job whose effect failed once (its next attempt a retry).
    fn failed_once() -> Operation {
        use crate::operation::gate::fixtures::{answered, deliver, registered};
        use crate::operation::gate::step as gate_step;
        use crate::operation::lifecycle::Status;
        let owed = gate_step(Some(registered()), deliver(Status::Succeeded), 10);
        let retry = AttemptOutcome::Retry("503".into());
        let failed = answered(owed.record.unwrap(), 10, 20, retry)
            .record
            .unwrap();
        assert_eq!(failed.effect().failures_in_row(), 1);
        failed
    }

    /// The job's effect through the plan: its turn (one send, a retry asks), the claim
    /// committed before the send, the answer committed under that claim before the desk's
    /// report; a desk that queues it on the report makes it wait after the answer's commit.
    #[test]
    fn a_jobs_effect_is_claimed_before_its_send_and_committed_before_the_report() {
        let works = drive_job(&failed_once(), true, world(reading(0)));
        let shape = ["turn", "claim effect", "send", "commit effect", "report"];
        assert_eq!(names(&works), shape);
        assert_eq!(
            works[0],
            ResultsWork::Turn {
                mark: None,
                ready: 1,
                retry: true
            }
        );
        let ResultsWork::SendEffect(claim) = works[2] else {
            panic!("{works:?}");
        };
        let Marking::EffectAnswered(attempt) = works[3].as_marking() else {
            panic!("{works:?}");
        };
        assert_eq!(
            (attempt.claim, claim.token),
            (claim, 7),
            "under the claim's token"
        );
        let mut answer = world(reading(0));
        let queued = drive_job(&succeeded(), true, |w: &ResultsWork| match w {
            ResultsWork::Report(_) => Seen::Told(Some(true)),
            w => answer(w),
        });
        assert_eq!(
            &names(&queued)[3..],
            ["commit effect", "report", "effect waits"]
        );
        assert_eq!(last_marking(&queued), Marking::EffectWaits(true));
    }

    /// A desk that queues the effect (a wait, or a pause) makes it wait: nothing is claimed or
    /// sent.
    #[test]
    fn a_jobs_effect_the_desk_queues_waits_unclaimed() {
        for paused in [false, true] {
            let mut answer = world(reading(0));
            let works = drive_job(&succeeded(), true, |w: &ResultsWork| match w {
                ResultsWork::Turn { .. } => Seen::Turn(Err(paused)),
                w => answer(w),
            });
            assert_eq!(names(&works), ["turn", "effect waits"]);
            assert_eq!(last_marking(&works), Marking::EffectWaits(paused));
        }
    }

    /// After a desk await the claim is the commit's, taken on the record as stored then
    /// (`marks::decide`): a commit that claims nothing (no longer owed) ends the effect,
    /// nothing sent, the desk not told.
    #[test]
    fn a_jobs_effect_no_longer_owed_after_the_desk_ends_unsent() {
        let mut answer = world(reading(0));
        let works = drive_job(&failed_once(), false, |w: &ResultsWork| match w {
            ResultsWork::Turn { .. } => Seen::Turn(Ok(Granted {
                awaited: true,
                n: 1,
            })),
            w => answer(w),
        });
        assert_eq!(names(&works), ["turn", "claim effect"]);
    }

    /// A plan told what its stage does not expect ends the step with an error naming both
    /// (the alarm's `Err`), not a panic; nothing of what it was told is in it.
    #[test]
    fn a_plan_told_the_wrong_thing_returns_an_error() {
        let mut job = ResultsPlan::job(&succeeded(), LIMITS);
        let turn = job.next(Seen::Nothing, NOW);
        assert!(
            matches!(turn, Ok(Some(ResultsWork::Turn { .. }))),
            "{turn:?}"
        );
        let told = job.next(Seen::Items(vec![item(0)]), NOW).unwrap_err();
        let said = "a results step at EffectAtDesk was told Items";
        assert_eq!(told.to_string(), said);
        assert_eq!(job.next(Seen::Nothing, NOW), Ok(None), "the step is over");
        let mut batch = ResultsPlan::new(&succeeded(), NOW, LIMITS).expect("due");
        assert_eq!(
            batch.next(Seen::Nothing, NOW),
            Ok(Some(ResultsWork::LoadProgress))
        );
        let told = batch.next(Seen::Told(Some(true)), NOW).unwrap_err();
        assert_eq!(told.to_string(), "a results step at Stored was told Told");
    }

    #[test]
    fn a_step_that_is_not_due_does_nothing() {
        let mut op = succeeded();
        op.results_due_at(NOW + 1);
        assert_eq!(ResultsPlan::new(&op, NOW, LIMITS), None);
        assert!(ResultsPlan::new(&op, NOW + 1, LIMITS).is_some());
    }

    /// A chunk: claimed before any send, its answers committed after them (on the progress as
    /// stored then) and before the desk's report, then the record read as stored.
    #[test]
    fn a_chunk_is_claimed_before_its_sends_and_committed_before_the_report() {
        let works = drive(&succeeded(), world(reading(0)));
        let happy = [
            "load", "turn", "read", "load", "claim", "send", "load", "commit", "report", "record",
        ];
        assert_eq!(names(&works), happy);
        let Marking::Committed { answers, .. } = works[7].as_marking() else {
            panic!("{works:?}");
        };
        let Answers::Chunk {
            chunk,
            reached,
            answers,
        } = answers
        else {
            panic!("{answers:?}");
        };
        assert_eq!((chunk, reached, answers.len()), (0, at(3), 3));
        // The desk queues the batch on the report: the wait is committed after the commit.
        let mut answer = world(reading(0));
        let queued = drive(&succeeded(), |w: &ResultsWork| match w {
            ResultsWork::Report(_) => Seen::Told(Some(false)),
            w => answer(w),
        });
        let tail = &names(&queued)[6..];
        assert_eq!(tail, ["load", "commit", "report", "wait"]);
    }

    /// A claim found stored is sent again without a new claim: only its results, and its
    /// commit reaches no further than its end.
    #[test]
    fn a_claimed_chunk_is_sent_again_without_a_new_claim() {
        let mut p = reading(0);
        let claim = p.claim(at(2), false);
        let works = drive(&succeeded(), world(p));
        let shape = [
            "load", "turn", "read", "load", "send", "load", "commit", "report", "record",
        ];
        assert_eq!(names(&works), shape);
        assert_eq!(works[4], ResultsWork::Send(vec![item(0), item(1)]));
        let Marking::Committed { answers, .. } = works[6].as_marking() else {
            panic!("{works:?}");
        };
        assert!(
            matches!(answers, Answers::Chunk { chunk, reached, .. } if chunk == claim.chunk && reached == at(2))
        );
    }

    /// A file the last read could not give is tried (its first line) before the desk's turn:
    /// still missing, the failed read is committed and the desk hears nothing.
    #[test]
    fn the_file_is_checked_before_the_turn_and_a_failed_check_takes_no_turn() {
        let mut answer = world(troubled(50));
        let missing = drive(&succeeded(), |w: &ResultsWork| match w {
            ResultsWork::Read { .. } => Seen::Read(Err(FileTrouble::Missing)),
            w => answer(w),
        });
        assert_eq!(names(&missing), ["load", "check", "load", "read failed"]);
        let works = drive(&succeeded(), world(troubled(50)));
        assert_eq!(
            names(&works)[..5],
            ["load", "check", "load", "turn", "read"]
        );
    }

    /// The desk queued the batch: a pause holds the failing clocks of the progress as stored
    /// after the desk's call (an operator may have changed it), stored with the wait; a wait
    /// that is no pause stores no progress.
    #[test]
    fn a_pause_holds_the_progress_as_stored_after_the_turn() {
        let mut fresh = reading(4);
        fresh.unanswered_since_ms = Some(20);
        let mut loads = 0;
        let mut answer = world(reading(0));
        let paused = drive(&succeeded(), |w: &ResultsWork| match w {
            ResultsWork::Turn { .. } => Seen::Turn(Err(true)),
            ResultsWork::LoadProgress if loads > 0 => Seen::Progress(Some(fresh.clone())),
            w => {
                loads += 1;
                answer(w)
            }
        });
        assert_eq!(names(&paused), ["load", "turn", "load", "wait"]);
        let held = ProgressWrite::held_by_pause(fresh.clone());
        assert!(held
            .as_ref()
            .is_some_and(|h| h.progress.done_through == at(4)));
        assert_eq!(last_marking(&paused), wait(true, held));
        let mut answer = world(reading(0));
        let waits = drive(&succeeded(), |w: &ResultsWork| match w {
            ResultsWork::Turn { .. } => Seen::Turn(Err(false)),
            w => answer(w),
        });
        assert_eq!(names(&waits), ["load", "turn", "wait"]);
        assert_eq!(last_marking(&waits), wait(false, None));
    }

    /// The desk released the batch: its mark goes with the turn, and the release is spent
    /// (committed) before the read and the sends it lets go; no mark, nothing to spend.
    #[test]
    fn a_release_is_spent_before_the_read() {
        let mut op = succeeded();
        assert!(op.destination_ready(true, 15));
        let works = drive(&op, world(reading(0)));
        assert_eq!(names(&works)[..4], ["load", "turn", "spent", "read"]);
        let mark = Some(DeskMark::Released { probe: true });
        assert!(matches!(works[1], ResultsWork::Turn { mark: m, .. } if m == mark));
        let unmarked = drive(&succeeded(), world(reading(0)));
        assert!(!names(&unmarked).contains(&"spent"));
    }

    /// A release that finds nothing to send (the file is not there yet) is spent, and the desk
    /// hears at once (due when the step is); the desk may queue the batch again.
    #[test]
    fn a_release_with_nothing_to_send_is_spent_and_told() {
        let mut op = succeeded();
        assert!(op.destination_ready(false, 15));
        let works = drive(&op, world(troubled(500)));
        assert_eq!(names(&works), ["load", "spent", "tell", "due"]);
        assert_eq!(works[2], ResultsWork::Tell(500));
        assert_eq!(last_marking(&works), Marking::DueAt(500));
        let mut answer = world(troubled(500));
        let queued = drive(&op, |w: &ResultsWork| match w {
            ResultsWork::Tell(_) => Seen::Told(Some(true)),
            w => answer(w),
        });
        assert_eq!(last_marking(&queued), wait(true, None));
    }

    /// The step is chosen before the desk's call and kept after it: an operator's retry that
    /// ran meanwhile (rows due now) changes the progress the chunk is claimed on, not the step.
    #[test]
    fn the_step_chosen_before_a_desk_await_is_kept_after_it() {
        let mut fresh = reading(0);
        fresh.rows.insert(9, row(9));
        fresh.counts.parked = 7;
        assert_eq!(
            fresh.next(NOW),
            Step::RetryRows(vec![9]),
            "another step now"
        );
        let mut loads = 0;
        let mut answer = world(reading(0));
        let works = drive(&succeeded(), |w: &ResultsWork| match w {
            ResultsWork::Turn { .. } => Seen::Turn(Ok(Granted {
                awaited: true,
                n: 2,
            })),
            ResultsWork::LoadProgress if loads > 0 => Seen::Progress(Some(fresh.clone())),
            w => {
                loads += 1;
                answer(w)
            }
        });
        assert_eq!(names(&works)[..5], ["load", "turn", "load", "read", "load"]);
        let read = ResultsWork::Read {
            source: reading(0).source,
            from: at(0),
            max: 2,
        };
        assert_eq!(works[3], read, "the chunk chosen first, as many as granted");
        let Marking::Claimed { progress, .. } = works[5].as_marking() else {
            panic!("{works:?}");
        };
        assert_eq!(
            progress.counts.parked, 7,
            "claimed on the progress as stored"
        );
    }

    /// Waiting rows due: as many as the desk let go are loaded and sent, then committed as
    /// rows.
    #[test]
    fn due_rows_go_as_many_as_the_desk_lets() {
        let mut p = reading(0);
        p.phase = Phase::Read;
        for index in [3, 5, 8] {
            p.rows.insert(index, row(index));
        }
        let mut answer = world(p.clone());
        let works = drive(&succeeded(), |w: &ResultsWork| match w {
            ResultsWork::Turn { ready, retry, .. } => {
                assert_eq!((*ready, *retry), (3, true));
                Seen::Turn(Ok(Granted {
                    awaited: false,
                    n: 2,
                }))
            }
            w => answer(w),
        });
        assert_eq!(works[2], ResultsWork::LoadRows(vec![3, 5]));
        let Marking::Committed { answers, .. } = works[5].as_marking() else {
            panic!("{works:?}");
        };
        assert!(matches!(answers, Answers::Rows(a) if a.len() == 2));
    }

    /// Where the results are, asked when no progress is stored and the outcome names no
    /// file: stored before the step goes on; the budget's wait or a busy answer's backoff
    /// makes them due later; an answer that cannot say parks them (then the alert is the step).
    #[test]
    fn the_results_are_located_and_stored_before_the_step() {
        let op = succeeded();
        let locate = |located: Located| {
            let mut answer = world(reading(0));
            drive(&op, move |w: &ResultsWork| match w {
                ResultsWork::LoadProgress => Seen::Progress(None),
                ResultsWork::Locate => Seen::Located(located.clone()),
                w => answer(w),
            })
        };
        let found = locate(Located::Found(Source::Inline, Some(5)));
        assert_eq!(names(&found)[..4], ["load", "locate", "progress", "turn"]);
        let Marking::Progress(p) = found[2].as_marking() else {
            panic!("{found:?}");
        };
        assert_eq!(
            (p.source, p.ended_ms, p.since_ms),
            (Source::Inline, Some(5), 10)
        );
        let slot = locate(Located::WaitForSlot(500));
        assert_eq!(names(&slot), ["load", "locate", "due"]);
        let busy = StatusTrouble {
            trouble: FileTrouble::Unavailable("503".into()),
            http_status: Some(503),
            retry_after: Some("30".into()),
        };
        let busy = locate(Located::Failed(busy));
        assert_eq!(names(&busy), ["load", "locate", "back off", "due"]);
        assert_eq!(busy[2], ResultsWork::BackOff(NOW + 30_000));
        let gone = StatusTrouble {
            trouble: FileTrouble::Missing,
            http_status: Some(404),
            retry_after: None,
        };
        let gone = locate(Located::Failed(gone));
        let parked = ["load", "locate", "progress", "alert or settled"];
        assert_eq!(names(&gone), parked);
        let Marking::Progress(p) = gone[2].as_marking() else {
            panic!("{gone:?}");
        };
        assert!(p.unlocated && matches!(p.phase, Phase::FileParked { .. }));
    }

    fn row(index: u64) -> crate::results::progress::Row {
        crate::results::progress::Row {
            result_key: format!("k{index}"),
            index,
            attempts: 1,
            last_error: "503".into(),
            next_at_ms: Some(NOW),
            failing_since_ms: Some(0),
            last_attempt_ms: None,
            unanswered: false,
        }
    }

    impl ResultsWork {
        fn as_marking(&self) -> Marking {
            match self {
                ResultsWork::Commit(m) => (**m).clone(),
                other => panic!("{other:?}"),
            }
        }
    }
}
