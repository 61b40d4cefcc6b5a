//! The alarm as a plan: what one run of a gate's alarm does, in what order, and what each
//! piece of its I/O changes, as pure functions of the record and the time.
//!
//! Guarantees (docs/DESIGN.md, invariants 1, 3 and 7): a run either retires the record
//! (retention over: nothing else runs) or works through, in this order, a due confirmation,
//! a due side effect, the alerts due (those the effect queued included), and last the upkeep
//! (counter flush and ledger projection); each piece is asked for with the record as it
//! stands after the previous one ([`AlarmPlan::next`]), since commands may run during every
//! await; each piece's answer is fed to its step ([`confirmed`], [`alert_sent`],
//! [`attempt_finished`], [`upkeep_done`]), whose answer is an [`AlarmDone`], never a
//! command's reply. The Durable Object only performs the work and stores the steps.
//!
//! An attempt's turn at its destination's desk is [`crate::operation::gate::desk_turn`]'s, as
//! for a batch's results (invariant 8); an effect the desk told to wait ([`wait_on_destination`])
//! keeps its generation and `webhook-id`, holds no claim, and is due again at the desk's word
//! or, should the desk be lost, after `EFFECT_RETRY_MAX_SECONDS` (a minute at least).

use std::collections::VecDeque;

use serde_json::Value;

use crate::operation::alert::AlertKind;
use crate::operation::gate::log::{AttemptLine, GateLog};
use crate::operation::gate::{count_delivery, GateLimits, Save, Step};
use crate::operation::history::HistoryEntry;
use crate::operation::key::Collection;
use crate::operation::ledger::{IndexWrite, Projection};
use crate::operation::lifecycle::{Source, Status, Verdict};
use crate::operation::observation::SlotAnswer;
use crate::operation::observation::{Observation, StatusError};
use crate::operation::{AttemptOutcome, Claim, Finished, OpEvent, Operation, PendingAlert, Queued};
use crate::retry::Heard;
use crate::telemetry::counters::{
    acceptance_bucket, labelled, Counter, StatEvent, ACCEPTANCE_BUCKET_PREFIX, ACCEPTANCE_MS_SUM,
    ALERTS_BY_KIND_PREFIX, EFFECT_RETRY_AFTER, EFFECT_TO_PREFIX,
};
use crate::telemetry::log_event::event_of;

/// What an alarm step did. Nobody waits on it: the object stores the step and goes on (a
/// retirement ends the run).
#[derive(Debug, Clone, PartialEq)]
pub enum AlarmDone {
    /// Retention ended: the gate's storage is deleted.
    Retired,
    /// A confirmation's answer was applied (or it waits to ask again).
    Confirmed,
    /// A queued alert was accepted by the sink (`true`) or waits to be sent again.
    AlertSent(bool),
    /// The side effect was claimed; its call may leave.
    Claimed,
    /// An attempt's answer was committed under its token (or fenced off).
    AttemptFinished(Finished),
    /// The counter flush and the ledger projection were recorded.
    UpkeepDone,
    /// The destination's desk said wait: the effect waits for its release (`true`), or was
    /// no longer waitable (`false`: not owed, or claimed).
    WaitsOnDestination(bool),
}

/// One piece of a run, in the order the run does them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Retire,
    Confirm,
    /// Send the alerts due, one at a time, in queue order: each once in a run, and one of a
    /// condition whose earlier alert failed waits with it.
    Alerts,
    Effect,
    Upkeep,
}

/// The order of one run: a retirement alone, or confirm, effect, alerts (an attempt that
/// parked the effect queued its alert: sent now, not on the next run), then upkeep. The
/// effect goes first so an alert sink that is down (each send waits up to its timeout)
/// never delays a side effect.
#[derive(Debug, Clone, PartialEq)]
pub struct AlarmPlan {
    stages: VecDeque<Stage>,
    /// The alerts this run sent (their ids): one the sink refused is not sent again in it.
    sent: Vec<String>,
}

/// What the status API is to be asked for a confirmation.
#[derive(Debug, Clone, PartialEq)]
pub enum ConfirmAsk {
    /// Ask Gemini about this operation.
    Ask {
        collection: Collection,
        key: String,
        name: String,
    },
    /// Nothing can be asked: this is the answer to feed to [`confirmed`].
    Answered(Result<Observation, StatusError>),
}

/// The next piece of work of a run, for the object to perform.
#[derive(Debug, Clone, PartialEq)]
pub enum AlarmWork {
    /// Store this step; the run ends.
    Retire(Box<Step<AlarmDone>>),
    /// Ask the status API (or not), then feed the answer to [`confirmed`].
    Confirm(ConfirmAsk),
    /// Post `body` to the alert sink, then feed the result to [`alert_sent`].
    SendAlert { alert: PendingAlert, body: Value },
    /// The side effect is owed, due and free: its turn at the destination's desk, its claim
    /// ([`begin_attempt`], stored with the alarm at its expiry, on the record as stored then),
    /// its call, its answer ([`attempt_finished`]) and the desk's report, or its wait
    /// ([`wait_on_destination`]), in the order the results' plan gives a batch of one
    /// (`results/plan.rs`).
    Effect,
    /// Keep `record` (it carries the seal) in memory, flush `upkeep.events` and write
    /// `upkeep.projection`, both at once, then feed the results to [`upkeep_done`].
    Upkeep {
        record: Box<Operation>,
        upkeep: Box<Upkeep>,
    },
    /// Nothing to flush or project: set the alarm for the record as it stands.
    SetAlarm,
}

/// Plans a run for the record as the alarm found it at `now`.
pub fn plan(op: &Operation, now: i64, limits: &GateLimits) -> AlarmPlan {
    let stages: &[Stage] = if retention_over(op, now, limits) {
        &[Stage::Retire]
    } else {
        &[Stage::Confirm, Stage::Effect, Stage::Alerts, Stage::Upkeep]
    };
    AlarmPlan {
        stages: stages.iter().copied().collect(),
        sent: Vec::new(),
    }
}

impl AlarmPlan {
    #[cfg(test)]
    pub fn stages(&self) -> Vec<Stage> {
        self.stages.iter().copied().collect()
    }

    /// The next piece of work for `op` (the record as it now stands) at `now`, skipping the
    /// stages with nothing due; `None` when the run is over. `status_api` says whether the
    /// status API can be asked (`GEMINI_API_KEY` is set).
    pub fn next(
        &mut self,
        op: &Operation,
        now: i64,
        limits: &GateLimits,
        status_api: bool,
    ) -> Option<AlarmWork> {
        while let Some(stage) = self.stages.pop_front() {
            match stage {
                Stage::Retire => {
                    self.stages.clear();
                    return retire_if_over(op, now, limits).map(|s| AlarmWork::Retire(Box::new(s)));
                }
                Stage::Confirm if op.confirmation_due(now) => {
                    return Some(AlarmWork::Confirm(confirm_ask(op, status_api)));
                }
                Stage::Confirm => {}
                Stage::Alerts => {
                    let mut due = op.due_alerts(now).into_iter();
                    if let Some(alert) = due.find(|a| !self.sent.contains(&a.id)) {
                        self.sent.push(alert.id.clone());
                        self.stages.push_front(Stage::Alerts);
                        let body = op.alert_body(alert.kind, &alert.id, alert.age_seconds);
                        return Some(AlarmWork::SendAlert { alert, body });
                    }
                }
                Stage::Effect => {
                    if op.claimable(now) {
                        return Some(AlarmWork::Effect);
                    }
                }
                Stage::Upkeep => {
                    let mut record = op.clone();
                    let upkeep = plan_upkeep(&mut record, now, limits);
                    if upkeep.is_empty() {
                        return Some(AlarmWork::SetAlarm);
                    }
                    return Some(AlarmWork::Upkeep {
                        record: Box::new(record),
                        upkeep: Box::new(upkeep),
                    });
                }
            }
        }
        None
    }
}

/// What to ask for a due confirmation: nothing when there is no key to ask with, or no
/// collection to ask about (the answer is then known).
fn confirm_ask(op: &Operation, status_api: bool) -> ConfirmAsk {
    match (Collection::of_key(op.key()), status_api) {
        (_, false) => ConfirmAsk::Answered(Err(StatusError::NoApiKey)),
        (None, true) => {
            ConfirmAsk::Answered(Err(StatusError::Malformed("key has no collection".into())))
        }
        (Some(collection), true) => ConfirmAsk::Ask {
            collection,
            key: op.key().to_string(),
            name: op.name().to_string(),
        },
    }
}

fn retention_over(op: &Operation, now: i64, limits: &GateLimits) -> bool {
    op.retires_at_ms(limits.retention_ms)
        .is_some_and(|t| t <= now)
}

/// Ends retention if it is over: the gate's whole storage is deleted (record, history,
/// quarantine, results, alarm) and nothing is stored again; the object keeps the name in its
/// retired names' shard first ([`crate::operation::retired_names`]), and deletes nothing if it
/// cannot. A name retired runs nothing again, whoever asks: a registration is refused
/// (`Retired`), a signed delivery's record asks the shard in its first alarm and is deleted
/// with nothing run, a nudge or a poll finds no record and creates none, an operator's action
/// finds nothing; an answer without a time (a video's) needs no age to be judged by.
pub fn retire_if_over(op: &Operation, now: i64, limits: &GateLimits) -> Option<Step<AlarmDone>> {
    if !retention_over(op, now, limits) {
        return None;
    }
    let key = op.key().to_string();
    let mut step = Step::new(None, AlarmDone::Retired).log(GateLog::RetentionExpired { key });
    step.purge = true;
    Some(step)
}

/// The first alarm of a record a signed delivery created, its name found retired by the shard:
/// everything is deleted and nothing runs (no claim, no projection, no count).
pub fn refuse_retired(op: &Operation) -> Step<AlarmDone> {
    let key = op.key().to_string();
    let mut step = Step::new(None, AlarmDone::Retired).log(GateLog::RetiredNameRefused { key });
    step.purge = true;
    step
}

/// Applies a confirmation's answer (what the status API said when asked, or why nothing was
/// asked): what the status API says goes through the reducer as an event from the webhook
/// path; a 404 ends it and alerts; an unusable answer alerts; without `GEMINI_API_KEY` it waits
/// for an operator to set it; anything else waits and asks again, at most
/// `MAX_CONFIRM_ATTEMPTS` questions in all, then leaves the operation to the cron.
pub fn confirmed(
    op: Operation,
    answer: Result<Observation, StatusError>,
    now: i64,
    limits: &GateLimits,
    jitter: f64,
) -> Step<AlarmDone> {
    let attempts = op.confirmation().map_or(0, |c| c.attempts);
    // Each question waits at least the confirmation interval after the last, whoever nudges.
    let wait = limits.retry.jittered(attempts + 1, jitter);
    let wait = wait.max(limits.confirm_interval_ms);
    let mut op = op;
    if !matches!(answer, Err(StatusError::NoApiKey)) {
        op.confirmation_asked(now);
    }
    match answer {
        Ok(observation) if !matches!(observation.status, Status::Unknown(_)) => {
            confirmed_state(op, observation, now, wait, limits)
        }
        Ok(observation) => confirmed_unknown_state(op, &observation, now, wait),
        Err(StatusError::NoApiKey) => confirm_without_key(op, now, limits),
        Err(error) => confirm_failed(op, error, now, wait),
    }
}

/// A state Gemini confirmed: applied as an event from the webhook path.
fn confirmed_state(
    mut op: Operation,
    observation: Observation,
    now: i64,
    wait: i64,
    limits: &GateLimits,
) -> Step<AlarmDone> {
    let key = op.key().to_string();
    let event = OpEvent {
        status: observation.status,
        update_time_ms: observation.update_time_ms,
        source: Source::Webhook,
        details: observation.details,
        delivery_id: None,
    };
    let verdict = op.confirm_with(event.clone(), now, wait);
    if verdict == Verdict::Apply {
        op.hold_for_registration(limits.unregistered_hold_ms, now);
    }
    count_delivery(&mut op, &event, verdict, now, false);
    let still = op.confirmation().is_some();
    Step::stored(op, AlarmDone::Confirmed)
        .row(HistoryEntry::of_event(&event, verdict))
        .log(GateLog::Confirmed {
            key,
            status: event.status.as_str().to_string(),
            verdict: match verdict {
                Verdict::Apply => "applied",
                Verdict::Drop(reason) => reason.as_str(),
            },
            still_confirming: still,
        })
}

/// A state this worker does not know: nothing is applied; the confirmation asks again.
fn confirmed_unknown_state(
    mut op: Operation,
    observation: &Observation,
    now: i64,
    wait: i64,
) -> Step<AlarmDone> {
    let key = op.key().to_string();
    op.confirmation_failed(now, wait);
    Step::stored(op, AlarmDone::Confirmed).log(GateLog::StatusUnknownState {
        key,
        state: observation.status.as_str().to_string(),
    })
}

/// No state from the status API: a 404 ends the confirmation and raises
/// `unknown_to_gemini`; an unusable answer alerts and asks again (a bounded number of times);
/// anything else waits `wait`, or longer if Gemini asked.
fn confirm_failed(mut op: Operation, error: StatusError, now: i64, wait: i64) -> Step<AlarmDone> {
    let key = op.key().to_string();
    let age = (now - op.submitted_at_ms()).div_euclid(1_000);
    match error {
        StatusError::NotFound => {
            op.confirmation_gone();
            op.raise_alert(AlertKind::UnknownToGemini, age, now);
            Step::stored(op, AlarmDone::Confirmed)
                .row(HistoryEntry::ConfirmNotFound)
                .log(GateLog::StatusNotFound {
                    key,
                    path: "confirmation",
                })
        }
        StatusError::Malformed(reason) => {
            // Asking again is bounded; the cron keeps polling and the alert asks a person.
            op.confirmation_failed(now, wait);
            op.status_unusable(&reason, age, now);
            let still = op.confirmation().is_some();
            Step::stored(op, AlarmDone::Confirmed)
                .row(HistoryEntry::StatusUnusable {
                    reason: reason.clone(),
                })
                .log(GateLog::StatusUnusable {
                    key,
                    path: "confirmation",
                    error: reason,
                    still_confirming: still,
                })
        }
        e => {
            let wait = match e {
                StatusError::Transient { retry_after_secs } => {
                    wait.max(retry_after_secs.saturating_mul(1_000))
                }
                _ => wait,
            };
            op.confirmation_failed(now, wait);
            confirm_waiting(op, format!("{e:?}"), wait)
        }
    }
}

/// What the budget's holder (the lease) said to a confirmation about to ask the status API:
/// `Some(time)` to wait until, `None` to ask now. Gates told the same time come back spread
/// over the next second (`jitter` in [0, 1)), not all at once for one slot. An unreachable
/// lease is a wait of one confirmation interval (at least a second): no status call leaves
/// outside the budget, and the cron polls the operation meanwhile.
pub fn slot_wait(
    answer: Option<SlotAnswer>,
    now: i64,
    limits: &GateLimits,
    jitter: f64,
) -> Option<i64> {
    match answer {
        Some(SlotAnswer::Granted) => None,
        Some(SlotAnswer::WaitUntil { until_ms }) => {
            Some(until_ms.max(now + 1) + (jitter.clamp(0.0, 1.0) * 1_000.0) as i64)
        }
        None => Some(now + limits.confirm_interval_ms.max(1_000)),
    }
}

/// When a confirmation's answer asks every status call to wait (a 429 or 5xx): the time to
/// report to the lease, so the pass and its consumers back off too.
pub fn status_backoff_until(answer: &Result<Observation, StatusError>, now: i64) -> Option<i64> {
    let Err(StatusError::Transient { retry_after_secs }) = answer else {
        return None;
    };
    Some(now.saturating_add(retry_after_secs.saturating_mul(1_000)))
}

/// The budget said wait (or could not be asked): the confirmation is due again at `until`,
/// for its slot. Nothing was asked, so it is not one of its tries.
pub fn confirm_waits_for_slot(mut op: Operation, until: i64, now: i64) -> Step<AlarmDone> {
    let wait = (until - now).max(1);
    op.confirmation_deferred(now + wait);
    confirm_waiting(op, "status budget: waiting for a slot".into(), wait)
}

/// Nothing could be asked (`GEMINI_API_KEY` is not set). Not a try, so no try count grows its
/// backoff: the wait is the time waited so far, which doubles the total at each wake, within
/// the limits.
fn confirm_without_key(mut op: Operation, now: i64, limits: &GateLimits) -> Step<AlarmDone> {
    let waited = op.confirmation().map_or(0, |c| now - c.requested_at_ms);
    let wait = waited.min(limits.retry.max_ms).max(limits.retry.first_ms);
    op.confirmation_waits(now, wait);
    confirm_waiting(op, "GEMINI_API_KEY is not set".into(), wait)
}

/// The confirmation asks again in `wait` ms: the record stored, and a line saying why.
fn confirm_waiting(op: Operation, why: String, wait: i64) -> Step<AlarmDone> {
    let key = op.key().to_string();
    Step::stored(op, AlarmDone::Confirmed).log(GateLog::ConfirmWaiting {
        key,
        error: why,
        retry_in_ms: wait,
    })
}

/// Records how sending a queued alert ended: the sink's acceptance takes it off the queue; a
/// failure waits with backoff for the alarm to send it again.
pub fn alert_sent(
    mut op: Operation,
    alert: &PendingAlert,
    sent: bool,
    now: i64,
    limits: &GateLimits,
    jitter: f64,
) -> Step<AlarmDone> {
    if sent {
        op.alert_delivered(&alert.id);
        op.count(Counter::Alerts, now);
        op.count_by(labelled(ALERTS_BY_KIND_PREFIX, alert.kind.as_str()), 1, now);
        Step::stored(op, AlarmDone::AlertSent(true)).row(HistoryEntry::Alert {
            alert: alert.kind,
            alert_id: alert.id.clone(),
        })
    } else {
        let wait = limits.retry.jittered(alert.attempts + 1, jitter);
        op.alert_failed(&alert.id, now, wait);
        Step::stored(op, AlarmDone::AlertSent(false))
    }
}

/// Claims the side effect if it is owed, due and not held: the claim is stored before the
/// call leaves, and its expiry wakes the gate if the call never returns.
pub fn begin_attempt(
    mut op: Operation,
    now: i64,
    limits: &GateLimits,
) -> Option<(Claim, Step<AlarmDone>)> {
    let claim = op.claim(now, limits.claim_ttl_ms)?;
    let attempt = op.effect().attempts();
    let step = Step::stored(op, AlarmDone::Claimed).row(HistoryEntry::Claimed {
        token: claim.token,
        attempt,
    });
    Some((claim, step))
}

/// How one attempt ended, as the runner saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    pub claim: Claim,
    pub outcome: AttemptOutcome,
    pub started_ms: i64,
    pub finished_ms: i64,
    /// The wait the destination asked for (a 429 or 503's `Retry-After`), if it did.
    pub asked_wait_ms: Option<i64>,
    /// Where it went and under which id, for the operator's history row.
    pub target: AttemptTarget,
}

/// What the operator's history row says about where an attempt went: never a credential.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AttemptTarget {
    /// The route's name and the destination's origin (`route billing: https://host/…`).
    pub destination: String,
    /// The `webhook-id` the request carried.
    pub webhook_id: String,
    /// The destination's HTTP status, when it answered one.
    pub http_status: Option<u16>,
}

/// An attempt's counts: its result, then those that carry a label: by result and
/// destination, the bucket of an acceptance's time since settlement (and its sum), and a
/// failure whose `Retry-After` was honoured. A fenced answer changed nothing and counts nothing.
fn count_attempt(op: &mut Operation, finished: &Finished, attempt: &Attempt) {
    let at = attempt.finished_ms;
    let (result, counter) = match finished {
        Finished::Done | Finished::LateDone => ("delivered", Counter::EffectSuccesses),
        Finished::RetryAt(_) => ("failed", Counter::EffectFailures),
        Finished::Parked => ("parked", Counter::EffectParks),
        Finished::Fenced => return,
    };
    op.count(counter, at);
    let to = format!("{result}:{}", attempt.target.destination);
    op.count_by(labelled(EFFECT_TO_PREFIX, &to), 1, at);
    match (result, op.settled_at_ms()) {
        ("delivered", Some(settled)) => {
            let ms = (at - settled).max(0);
            let bucket = labelled(ACCEPTANCE_BUCKET_PREFIX, &acceptance_bucket(ms));
            op.count_by(bucket, 1, at);
            op.count_by(ACCEPTANCE_MS_SUM.to_string(), ms as u64, at);
        }
        ("failed", _) if attempt.asked_wait_ms.is_some() => {
            op.count_by(EFFECT_RETRY_AFTER.to_string(), 1, at);
        }
        _ => {}
    }
}

/// Commits an attempt under its claim's fencing token: done, a retry after backoff, or parked;
/// an answer under a token no longer current changes nothing (another attempt took over).
pub fn attempt_finished(
    mut op: Operation,
    attempt: &Attempt,
    limits: &GateLimits,
    jitter: f64,
) -> Step<AlarmDone> {
    let heard = Heard::Answer(&attempt.outcome, attempt.asked_wait_ms);
    let at = attempt.finished_ms;
    let finished = op.finish_attempt(&attempt.claim, heard, limits.retry, at, jitter);
    count_attempt(&mut op, &finished, attempt);
    if finished == Finished::Parked {
        // A refusal the destination will repeat needs a person now: the alert is queued here
        // and sent by this alarm, not left for the next cron pass.
        let age =
            (attempt.finished_ms - op.settled_at_ms().unwrap_or(op.submitted_at_ms())) / 1_000;
        op.raise_alert(AlertKind::EffectFailing, age, attempt.finished_ms);
    }
    let answer = match &attempt.outcome {
        AttemptOutcome::Delivered => "2xx".to_string(),
        AttemptOutcome::Retry(a) | AttemptOutcome::Park(a) => a.clone(),
    };
    let ms = attempt.finished_ms - attempt.started_ms;
    let line = AttemptLine {
        key: op.key().to_string(),
        status: op.status().as_str().to_string(),
        attempt: op.effect().attempts(),
        generation: op.effect().generation(),
        answer: answer.clone(),
        ms,
        after_settled_ms: op.settled_at_ms().map(|t| attempt.started_ms - t),
        next_attempt_ms: matches!(finished, Finished::RetryAt(_))
            .then_some(op.effect().next_attempt_ms()),
    };
    let line = match &finished {
        Finished::Done | Finished::LateDone => GateLog::EffectDelivered(line),
        Finished::RetryAt(_) => GateLog::EffectFailed(line),
        Finished::Parked => GateLog::EffectParked(line),
        Finished::Fenced => GateLog::EffectFenced(line),
    };
    let mut step = Step::new(Some(op), AlarmDone::AttemptFinished(finished.clone()))
        .row(HistoryEntry::Attempt {
            token: attempt.claim.token,
            // The history names the result as the log line does.
            result: event_of(&line),
            answer,
            ms,
            destination: Some(attempt.target.destination.clone()).filter(|d| !d.is_empty()),
            webhook_id: Some(attempt.target.webhook_id.clone()).filter(|d| !d.is_empty()),
            http_status: attempt.target.http_status,
        })
        .log(line);
    if finished != Finished::Fenced {
        step.save = Save::Durable;
        // The commit's write takes its counts (and any still pending) out of the record and
        // the object hands them to its isolate's tally: the upkeep that follows has nothing
        // of theirs to flush, so a success's upkeep needs no write of its own.
        if let Some(op) = step.record.as_mut() {
            step.tally = op.take_stats_for_tally();
        }
    }
    step
}

/// Whether the alarm is set as soon as `step` is stored rather than at the end of the run:
/// an attempt that left work owed (its retry, a parked effect's alert) moves the alarm from
/// the claim's expiry to that work at once, so a run cut short before its end does not wait
/// out the claim. A success leaves the alarm to the end of the run.
pub fn sets_alarm_at_once(step: &Step<AlarmDone>) -> bool {
    matches!(step.reply, AlarmDone::AttemptFinished(_))
        && step.record.as_ref().is_some_and(|op| !op.effect().done())
}

/// The upkeep the alarm does last: counted events to flush to a stats shard and the record
/// to project into the KV ledger (with its `open:` index entry), when each is due.
#[derive(Debug, Clone, PartialEq)]
pub struct Upkeep {
    /// The last sequence sealed for the flush: events up to it are never changed again.
    pub sealed: Option<u64>,
    /// The events to flush (those up to `sealed`).
    pub events: Vec<StatEvent>,
    pub projection: Option<(Projection, IndexWrite)>,
}

impl Upkeep {
    /// Nothing to do.
    pub fn is_empty(&self) -> bool {
        self.sealed.is_none() && self.projection.is_none()
    }
}

/// Plans the upkeep, sealing the events to flush (store the record before sending them, so
/// counts made meanwhile go to new events). Only the alarm projects, one at a time, so two
/// ledger writes never race; a projection waits a second after the last (KV's per-key rate).
pub fn plan_upkeep(op: &mut Operation, now: i64, limits: &GateLimits) -> Upkeep {
    let sealed = op.seal_stats();
    let projection =
        (op.projected_version() < op.version() && now >= op.projection_due_ms()).then(|| {
            let p = op.projection(limits.retention_ms / 1_000);
            let index = p.index_write(op.indexed());
            (p, index)
        });
    let events = sealed.map_or(Vec::new(), |_| op.pending_stats().to_vec());
    Upkeep {
        sealed,
        events,
        projection,
    }
}

/// Records how the upkeep went: flushed events are dropped; a failed flush keeps them for the
/// alarm to send again a little later; a failed ledger write backs off (the gate stays the
/// truth).
///
/// Stored only when something in it must outlive this instance: events flushed from the
/// record (a new instance must not send them again), a failure's backoff, or a change of the
/// index mark (retention waits for it). A ledger write that succeeded and changed nothing else
/// is marked in memory only ([`Save::MemoryOnly`]), as a success's upkeep is (its commit
/// handed its counts over): the record as stored still says that version is not projected,
/// so a new instance that runs the alarm before retention writes the same entry again (one
/// KV write then, instead of a row written for every completion now), and one that does not
/// retires it as it is.
pub fn upkeep_done(
    mut op: Operation,
    upkeep: &Upkeep,
    flushed: Option<Result<(), String>>,
    written: Option<Result<(), String>>,
    now: i64,
) -> Step<AlarmDone> {
    let key = op.key().to_string();
    let indexed = op.indexed();
    let mut stored = upkeep.sealed.is_some() || matches!(flushed, Some(Err(_)));
    let mut logs = Vec::new();
    match (upkeep.sealed, flushed) {
        (Some(last), Some(Ok(()))) => op.drop_flushed_stats(last),
        (_, Some(Err(e))) => {
            op.stats_flush_failed(now + STATS_RETRY_MS);
            logs.push(GateLog::StatsFlushFailed {
                key: key.clone(),
                error: e,
            });
        }
        _ => {}
    }
    if let (Some((projection, index)), Some(result)) = (&upkeep.projection, written) {
        op.index_written(*index, result.is_ok());
        match result {
            Ok(()) => op.projection_written(projection.metadata.version, now),
            Err(e) => {
                stored = true;
                op.projection_failed(now);
                logs.push(GateLog::LedgerWriteFailed {
                    key,
                    error: e,
                    failures: op.projection_failures(),
                });
            }
        }
    }
    stored |= op.indexed() != indexed;
    let save = match stored {
        true => Save::Durable,
        false => Save::MemoryOnly,
    };
    Step {
        logs,
        ..Step::new(Some(op), AlarmDone::UpkeepDone).saved(save)
    }
}

/// A failed counter flush is sent again this much later.
pub(crate) const STATS_RETRY_MS: i64 = 5_000;
/// The desk said `Wait` (or `Paused`: `paused`): the effect waits for its release, with
/// [`GateLimits::desk_fallback_ms`] as the fallback (when it asks again). Nothing changes when it is
/// no longer owed or a live claim holds it. A pause's wait raises no `effect_failing`.
pub fn wait_on_destination(
    mut op: Operation,
    now: i64,
    limits: &GateLimits,
    paused: bool,
) -> Step<AlarmDone> {
    let waits = op.wait_on_desk(Queued::Effect, now, limits.desk_fallback_ms, paused);
    Step::new(Some(op), AlarmDone::WaitsOnDestination(waits)).durable_if(waits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operation::gate::protocol::GateCommand;
    use crate::operation::gate::step;
    use serde_json::Map;

    use crate::operation::gate::fixtures::LIMITS;

    const FULL_RUN: [Stage; 4] = [Stage::Confirm, Stage::Effect, Stage::Alerts, Stage::Upkeep];

    fn registered(key: &str) -> Operation {
        Operation::register(key, key, Some("billing".into()), 0)
    }

    fn deliver(op: Operation, status: Status, now: i64) -> Operation {
        let command = GateCommand::Deliver {
            key: op.key().into(),
            name: op.name().into(),
            event: OpEvent {
                status,
                update_time_ms: 0,
                source: Source::Webhook,
                details: Map::new(),
                delivery_id: None,
            },
            require_registration: false,
            hold_ms: 0,
            new_not_before_ms: 0,
        };
        step(Some(op), command, now).record.unwrap()
    }

    /// A registered operation with a nudge waiting for the status API, asked at 10.
    fn nudged() -> Operation {
        let mut op = registered("batches/a");
        assert!(op.request_confirmation(10, Map::new(), Some("jwt_1".into()), 0));
        op
    }

    /// The record after every piece of upkeep was done at `now` (nothing left to flush or
    /// project).
    fn kept(op: Operation, now: i64) -> Operation {
        let mut sealed = op.clone();
        let upkeep = plan_upkeep(&mut sealed, now, &LIMITS);
        let ok = || Some(Ok(()));
        upkeep_done(sealed, &upkeep, ok(), ok(), now)
            .record
            .unwrap()
    }

    fn kinds(work: &Option<AlarmWork>) -> &'static str {
        match work {
            None => "none",
            Some(AlarmWork::Retire(_)) => "retire",
            Some(AlarmWork::Confirm(_)) => "confirm",
            Some(AlarmWork::SendAlert { .. }) => "alert",
            Some(AlarmWork::Effect) => "effect",
            Some(AlarmWork::Upkeep { .. }) => "upkeep",
            Some(AlarmWork::SetAlarm) => "set_alarm",
        }
    }

    #[test]
    fn a_record_past_retention_is_retired_and_nothing_else_runs() {
        let op = deliver(registered("batches/a"), Status::Succeeded, 10);
        let done = crate::operation::gate::fixtures::delivered_at_20(op);
        let op = kept(done.record.unwrap(), 30);
        // Retention ends 20 + retention; the gate retires at its bucket's next moment.
        let over = op.retires_at_ms(LIMITS.retention_ms).unwrap();
        assert!(over >= 20 + LIMITS.retention_ms);
        assert_eq!(plan(&op, over - 1, &LIMITS).stages(), FULL_RUN);
        let mut run = plan(&op, over, &LIMITS);
        assert_eq!(run.stages(), [Stage::Retire]);
        match run.next(&op, over, &LIMITS, true) {
            Some(AlarmWork::Retire(s)) => {
                assert_eq!(s.reply, AlarmDone::Retired);
                assert!(s.purge);
                assert!(
                    s.record.is_none(),
                    "nothing is stored again: the name is the shard's"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(kinds(&run.next(&op, over, &LIMITS, true)), "none");
    }

    #[test]
    fn an_open_record_runs_confirm_effect_alerts_upkeep_in_that_order() {
        // A nudge waits, an alert is queued and counts are pending: each piece in turn, the
        // effect becoming owed by the confirmation's answer.
        let mut op = nudged();
        op.count(Counter::Deliveries, 10);
        assert!(op.raise_alert(AlertKind::Stuck, 60, 10));
        let mut run = plan(&op, 20, &LIMITS);
        assert_eq!(run.stages(), FULL_RUN);
        let mut seen = Vec::new();
        while let Some(work) = run.next(&op, 20, &LIMITS, true) {
            seen.push(kinds(&Some(work.clone())));
            op = match work {
                AlarmWork::Confirm(_) => {
                    let answer = Ok(Observation {
                        status: Status::Succeeded,
                        update_time_ms: 5,
                        details: Map::new(),
                    });
                    confirmed(op, answer, 20, &LIMITS, 0.5).record.unwrap()
                }
                AlarmWork::SendAlert { alert, .. } => {
                    alert_sent(op, &alert, true, 20, &LIMITS, 0.5)
                        .record
                        .unwrap()
                }
                AlarmWork::Effect => {
                    let (claim, step) = begin_attempt(op, 20, &LIMITS).unwrap();
                    let attempt = Attempt {
                        claim,
                        outcome: AttemptOutcome::Delivered,
                        started_ms: 20,
                        finished_ms: 20,
                        asked_wait_ms: None,
                        target: Default::default(),
                    };
                    attempt_finished(step.record.unwrap(), &attempt, &LIMITS, 0.5)
                        .record
                        .unwrap()
                }
                AlarmWork::Upkeep { record, .. } => *record,
                other => panic!("{other:?}"),
            };
        }
        // The stuck alert, then its resolution (the confirmation gave it an outcome).
        assert_eq!(seen, ["confirm", "effect", "alert", "alert", "upkeep"]);
    }

    #[test]
    fn a_confirmation_is_asked_only_when_due() {
        let op = nudged();
        let mut run = plan(&op, 10, &LIMITS);
        assert_eq!(
            run.next(&op, 10, &LIMITS, true),
            Some(AlarmWork::Confirm(ConfirmAsk::Ask {
                collection: Collection::Batches,
                key: "batches/a".into(),
                name: "batches/a".into(),
            }))
        );
        let mut later = op.clone();
        later.confirmation_failed(10, 5_000);
        let mut run = plan(&later, 20, &LIMITS);
        assert_eq!(
            kinds(&run.next(&later, 20, &LIMITS, true)),
            "set_alarm",
            "not due: nothing asked"
        );
    }

    #[test]
    fn without_an_api_key_the_confirmation_is_answered_without_asking() {
        let op = nudged();
        assert_eq!(
            plan(&op, 10, &LIMITS).next(&op, 10, &LIMITS, false),
            Some(AlarmWork::Confirm(ConfirmAsk::Answered(Err(
                StatusError::NoApiKey
            ))))
        );
    }

    #[test]
    fn a_key_of_no_known_collection_is_answered_as_malformed() {
        let mut op = registered("files/a");
        op.request_confirmation(10, Map::new(), None, 0);
        match plan(&op, 10, &LIMITS).next(&op, 10, &LIMITS, true) {
            Some(AlarmWork::Confirm(ConfirmAsk::Answered(Err(StatusError::Malformed(why))))) => {
                assert_eq!(why, "key has no collection")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn due_alerts_are_sent_one_at_a_time_in_queue_order_and_later_ones_wait() {
        let mut op = kept(registered("batches/a"), 0);
        op.raise_alert(AlertKind::Stuck, 60, 10);
        op.raise_alert(AlertKind::StatusUnusable, 60, 10);
        op.raise_alert(AlertKind::WebhookDisabled, 60, 500);
        let mut run = plan(&op, 20, &LIMITS);
        let mut sent = Vec::new();
        while let Some(AlarmWork::SendAlert { alert, body }) = run.next(&op, 20, &LIMITS, true) {
            assert_eq!(body["alert_id"], alert.id.as_str());
            sent.push(alert.kind);
            op = alert_sent(op, &alert, true, 20, &LIMITS, 0.5)
                .record
                .unwrap();
        }
        assert_eq!(
            sent,
            [AlertKind::Stuck, AlertKind::StatusUnusable],
            "the alert due at 500 waits"
        );
    }

    #[test]
    fn the_effect_is_claimed_only_when_owed_and_due() {
        let open = kept(registered("batches/a"), 0);
        assert_eq!(
            kinds(&plan(&open, 20, &LIMITS).next(&open, 20, &LIMITS, true)),
            "set_alarm",
            "no outcome, no effect"
        );
        let owed = deliver(open, Status::Succeeded, 10);
        let (claim, step) = match plan(&owed, 20, &LIMITS).next(&owed, 20, &LIMITS, true) {
            Some(AlarmWork::Effect) => begin_attempt(owed.clone(), 20, &LIMITS).unwrap(),
            other => panic!("{other:?}"),
        };
        assert_eq!(claim.token, 1);
        assert_eq!(step.reply, AlarmDone::Claimed);
        assert_eq!(step.save, Save::Durable);
        let held = step.record.clone().unwrap();
        assert!(
            !matches!(
                plan(&held, 21, &LIMITS).next(&held, 21, &LIMITS, true),
                Some(AlarmWork::Effect)
            ),
            "a live claim: not claimed again"
        );
        let attempt = Attempt {
            claim,
            outcome: AttemptOutcome::Retry("503".into()),
            started_ms: 20,
            finished_ms: 30,
            asked_wait_ms: None,
            target: Default::default(),
        };
        let failed = attempt_finished(held, &attempt, &LIMITS, 0.5)
            .record
            .unwrap();
        let due = failed.effect().next_attempt_ms();
        assert!(
            !matches!(
                plan(&failed, due - 1, &LIMITS).next(&failed, due - 1, &LIMITS, true),
                Some(AlarmWork::Effect)
            ),
            "owed but not due yet"
        );
        assert!(matches!(
            plan(&failed, due, &LIMITS).next(&failed, due, &LIMITS, true),
            Some(AlarmWork::Effect)
        ));
    }

    #[test]
    fn an_attempt_row_names_its_destination_id_and_status() {
        let op = kept(deliver(registered("batches/a"), Status::Succeeded, 10), 10);
        let mut run = plan(&op, 20, &LIMITS);
        let Some(AlarmWork::Effect) = run.next(&op, 20, &LIMITS, true) else {
            panic!("the effect is due");
        };
        let (claim, step) = begin_attempt(op.clone(), 20, &LIMITS).unwrap();
        let attempt = Attempt {
            claim,
            outcome: AttemptOutcome::Park("400: invalid payload".into()),
            started_ms: 20,
            finished_ms: 30,
            asked_wait_ms: None,
            target: AttemptTarget {
                destination: "route billing: https://billing.example/\u{2026}".into(),
                webhook_id: "msg_x_1".into(),
                http_status: Some(400),
            },
        };
        let done = attempt_finished(step.record.unwrap(), &attempt, &LIMITS, 0.5);
        let row = done
            .history
            .iter()
            .map(HistoryEntry::to_value)
            .find(|r| r["what"] == "attempt")
            .expect("an attempt row");
        assert_eq!(
            row["destination"],
            "route billing: https://billing.example/\u{2026}"
        );
        assert_eq!(row["webhook_id"], "msg_x_1");
        assert_eq!(row["http_status"], 400);
        assert_eq!(row["answer"], "400: invalid payload");
    }

    #[test]
    fn an_alert_the_attempt_queued_is_sent_in_the_same_run() {
        let op = kept(deliver(registered("batches/a"), Status::Succeeded, 10), 10);
        let mut run = plan(&op, 20, &LIMITS);
        let Some(AlarmWork::Effect) = run.next(&op, 20, &LIMITS, true) else {
            panic!("the effect is due");
        };
        let (claim, step) = begin_attempt(op.clone(), 20, &LIMITS).unwrap();
        let attempt = Attempt {
            claim,
            outcome: AttemptOutcome::Park("400: no".into()),
            started_ms: 20,
            finished_ms: 30,
            asked_wait_ms: None,
            target: Default::default(),
        };
        let parked = attempt_finished(step.record.unwrap(), &attempt, &LIMITS, 0.5);
        assert_eq!(parked.reply, AlarmDone::AttemptFinished(Finished::Parked));
        let op = parked.record.unwrap();
        match run.next(&op, 30, &LIMITS, true) {
            Some(AlarmWork::SendAlert { alert, .. }) => {
                assert_eq!(alert.kind, AlertKind::EffectFailing)
            }
            other => panic!("{other:?}"),
        }
        // The park's counts left with its write; the ledger waits out its spacing.
        assert!(!parked.tally.is_empty());
        assert_eq!(kinds(&run.next(&op, 30, &LIMITS, true)), "set_alarm");
        assert_eq!(kinds(&run.next(&op, 30, &LIMITS, true)), "none");
    }

    #[test]
    fn an_attempt_that_leaves_work_owed_sets_the_alarm_at_once_a_success_at_the_end() {
        let op = deliver(registered("batches/a"), Status::Succeeded, 10);
        let (claim, s) = begin_attempt(op, 10, &LIMITS).unwrap();
        assert!(
            !sets_alarm_at_once(&s),
            "a claim: its expiry is set with it"
        );
        let held = s.record.unwrap();
        let finish = |outcome| {
            let attempt = Attempt {
                claim,
                outcome,
                started_ms: 10,
                finished_ms: 20,
                asked_wait_ms: None,
                target: Default::default(),
            };
            attempt_finished(held.clone(), &attempt, &LIMITS, 0.5)
        };
        assert!(sets_alarm_at_once(&finish(AttemptOutcome::Retry(
            "503".into()
        ))));
        assert!(sets_alarm_at_once(&finish(AttemptOutcome::Park(
            "400".into()
        ))));
        assert!(!sets_alarm_at_once(&finish(AttemptOutcome::Delivered)));
    }

    #[test]
    fn upkeep_comes_last_with_the_sealed_events_and_the_projection() {
        let mut op = registered("batches/a");
        op.count(Counter::Deliveries, 10);
        let mut run = plan(&op, 2_000, &LIMITS);
        match run.next(&op, 2_000, &LIMITS, true) {
            Some(AlarmWork::Upkeep { record, upkeep }) => {
                assert_eq!(upkeep.sealed, Some(1));
                assert_eq!(upkeep.events, op.pending_stats());
                assert!(upkeep.projection.is_some());
                let mut again = record.clone();
                assert!(
                    plan_upkeep(&mut again, 2_000, &LIMITS).sealed.is_some(),
                    "sealed events stay until flushed"
                );
                assert_eq!(record.pending_stats().len(), 1);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(kinds(&run.next(&op, 2_000, &LIMITS, true)), "none");
    }

    #[test]
    fn with_nothing_to_flush_or_project_the_run_only_sets_the_alarm() {
        let op = kept(registered("batches/a"), 0);
        let mut run = plan(&op, 20, &LIMITS);
        assert_eq!(kinds(&run.next(&op, 20, &LIMITS, true)), "set_alarm");
        assert_eq!(kinds(&run.next(&op, 20, &LIMITS, true)), "none");
    }
}

/// The steps that take each piece's answer, one behaviour per test.
#[cfg(test)]
mod feeder_tests {
    use super::*;
    use crate::operation::gate::fixtures::*;
    use crate::operation::gate::protocol::GateCommand;
    use crate::operation::gate::step;
    use crate::operation::record::confirmation::MAX_CONFIRM_ATTEMPTS;

    #[test]
    fn retirement_comes_only_when_retention_is_over() {
        let op = settled();
        let end = 20 + LIMITS.retention_ms;
        let moment = op.retires_at_ms(LIMITS.retention_ms).unwrap();
        assert!(
            (end..end + LIMITS.retention_ms).contains(&moment),
            "{moment}"
        );
        assert!(retire_if_over(&op, moment - 1, &LIMITS).is_none());
        let s = retire_if_over(&op, moment, &LIMITS).unwrap();
        assert!(s.purge);
        assert_eq!(events(&s), ["retention_expired"]);
        assert!(s.record.is_none(), "the gate keeps nothing");
        assert!(
            s.history.is_empty(),
            "no row: the history goes with the rest"
        );
    }

    #[test]
    fn a_retired_name_found_by_the_first_alarm_leaves_nothing() {
        let s = step(None, deliver(Status::Succeeded), 10);
        let op = s.record.unwrap();
        assert!(
            op.retired_unasked(),
            "a record a delivery created asks first"
        );
        let s = refuse_retired(&op);
        assert!(s.purge && s.record.is_none() && s.history.is_empty());
        assert_eq!(events(&s), ["retired_name_refused"]);
        assert!(
            !registered().retired_unasked(),
            "a registration asked already"
        );
    }

    #[test]
    fn a_confirmed_terminal_state_is_applied_as_settled_by_webhook() {
        let s = confirmed(nudged(), observed(Status::Succeeded), 20, &LIMITS, 0.5);
        let op = s.record.unwrap();
        assert_eq!(op.status(), &Status::Succeeded);
        assert_eq!(op.settled_by(), Some(Source::Webhook));
        assert!(op.confirmation().is_none());
        assert!(op.effect_owed());
    }

    #[test]
    fn a_status_api_that_says_not_yet_is_asked_again() {
        let s = confirmed(nudged(), observed(Status::Running), 20, &LIMITS, 1.0);
        let op = s.record.unwrap();
        assert_eq!(op.status(), &Status::Running);
        assert_eq!(op.confirmation().map(|c| c.due_ms), Some(20 + 1_000));
        let mut op = op;
        for i in 1..MAX_CONFIRM_ATTEMPTS {
            op = confirmed(
                op,
                observed(Status::Running),
                2_000 * i64::from(i),
                &LIMITS,
                1.0,
            )
            .record
            .unwrap();
        }
        assert!(op.confirmation().is_none(), "then left to the cron");
    }

    #[test]
    fn an_unknown_state_applies_nothing_and_waits() {
        let s = confirmed(
            nudged(),
            observed(Status::Unknown("PARTIAL".into())),
            20,
            &LIMITS,
            1.0,
        );
        assert_eq!(events(&s), ["status_unknown_state"]);
        let op = s.record.unwrap();
        assert_eq!(op.status(), &Status::Pending);
        assert!(op.confirmation().is_some());
    }

    #[test]
    fn a_404_ends_the_confirmation_and_raises_unknown_to_gemini() {
        let s = confirmed(nudged(), Err(StatusError::NotFound), 20, &LIMITS, 1.0);
        let op = s.record.unwrap();
        assert!(op.confirmation().is_none());
        assert_eq!(op.pending_alerts()[0].kind, AlertKind::UnknownToGemini);
    }

    #[test]
    fn a_transient_answer_waits_at_least_its_retry_after() {
        let s = confirmed(
            nudged(),
            Err(StatusError::Transient {
                retry_after_secs: 30,
            }),
            20,
            &LIMITS,
            1.0,
        );
        assert_eq!(
            s.record.unwrap().confirmation().unwrap().due_ms,
            20 + 30_000
        );
        assert_eq!(
            events(&confirmed(
                nudged(),
                Err(StatusError::NoApiKey),
                20,
                &LIMITS,
                1.0
            )),
            ["confirm_waiting"]
        );
    }

    #[test]
    fn questions_about_one_operation_are_a_confirmation_interval_apart() {
        let limits = GateLimits {
            confirm_interval_ms: 60_000,
            ..LIMITS
        };
        // Still running: asked again no sooner than the interval, however short the backoff.
        let op = confirmed(nudged(), observed(Status::Running), 20, &limits, 1.0)
            .record
            .unwrap();
        assert_eq!(op.confirmation().map(|c| c.due_ms), Some(20 + 60_000));
        // 404: the confirmation ends, and a nudge inside the interval starts none.
        let mut op = confirmed(nudged(), Err(StatusError::NotFound), 20, &limits, 1.0)
            .record
            .unwrap();
        let version = op.version();
        assert!(op.request_confirmation(59_000, serde_json::Map::new(), None, 60_000));
        assert!(op.confirmation().is_none());
        assert_eq!(op.version(), version, "nothing changed");
        assert!(op.request_confirmation(60_020, serde_json::Map::new(), None, 60_000));
        assert_eq!(op.confirmation().map(|c| c.due_ms), Some(60_020));
        // Without a key nothing was asked: the next nudge is not held back.
        let mut op = confirmed(nudged(), Err(StatusError::NoApiKey), 20, &limits, 1.0)
            .record
            .unwrap();
        op.confirmation_gone();
        assert!(op.request_confirmation(21, serde_json::Map::new(), None, 60_000));
        assert!(op.confirmation().is_some());
    }

    #[test]
    fn the_budget_decides_when_a_confirmation_may_ask() {
        let limits = GateLimits {
            confirm_interval_ms: 60_000,
            ..LIMITS
        };
        let wait = |until_ms| Some(SlotAnswer::WaitUntil { until_ms });
        assert_eq!(
            slot_wait(Some(SlotAnswer::Granted), 100, &limits, 0.5),
            None
        );
        assert_eq!(slot_wait(wait(900), 100, &limits, 0.0), Some(900));
        assert_eq!(
            slot_wait(wait(900), 100, &limits, 0.5),
            Some(1_400),
            "spread over a second"
        );
        assert_eq!(
            slot_wait(wait(50), 100, &limits, 0.0),
            Some(101),
            "never due in the past"
        );
        assert_eq!(
            slot_wait(None, 100, &limits, 0.0),
            Some(60_100),
            "no lease, no call"
        );
        // Told to wait, the confirmation waits for its slot: not one of its tries, and no
        // version (no ledger projection for a wait).
        let op = nudged();
        let version = op.version();
        let s = confirm_waits_for_slot(op, 900, 100);
        assert_eq!(events(&s), ["confirm_waiting"]);
        assert_eq!(s.save, Save::Durable);
        let op = s.record.unwrap();
        assert_eq!(op.version(), version);
        let c = op.confirmation().cloned().unwrap();
        assert_eq!((c.due_ms, c.attempts), (900, 0));
        // A 429 or 5xx a confirmation saw backs off every status call; nothing else does.
        let transient = Err(StatusError::Transient {
            retry_after_secs: 30,
        });
        assert_eq!(status_backoff_until(&transient, 1_000), Some(31_000));
        assert_eq!(
            status_backoff_until(&Err(StatusError::NotFound), 1_000),
            None
        );
        assert_eq!(
            status_backoff_until(&observed(Status::Running), 1_000),
            None
        );
    }

    #[test]
    fn an_alert_leaves_the_queue_only_when_the_sink_accepted_it() {
        let raised = step(
            Some(registered()),
            GateCommand::Alert {
                alert: AlertKind::Stuck,
                age_seconds: 1,
                effect_alert_after_ms: 0,
            },
            10,
        )
        .record
        .unwrap();
        let alert = raised.due_alerts(10)[0].clone();
        let failed = alert_sent(raised, &alert, false, 11, &LIMITS, 1.0)
            .record
            .unwrap();
        assert_eq!(failed.pending_alerts().len(), 1);
        assert!(failed.due_alerts(11).is_empty(), "after a backoff");
        let again = failed.due_alerts(2_000)[0].clone();
        assert_eq!(again.id, alert.id, "the same alert id");
        let sent = alert_sent(failed, &again, true, 2_000, &LIMITS, 1.0);
        assert_eq!(whats(&sent), ["alert"]);
        assert!(sent.record.unwrap().pending_alerts().is_empty());
    }

    #[test]
    fn an_attempt_is_claimed_only_when_owed_and_due() {
        assert!(
            begin_attempt(registered(), 10, &LIMITS).is_none(),
            "nothing owed"
        );
        let first = step(Some(registered()), deliver(Status::Succeeded), 10)
            .record
            .unwrap();
        let (claim, s) = begin_attempt(first, 10, &LIMITS).unwrap();
        assert_eq!(whats(&s), ["claimed"]);
        assert_eq!(
            s.wake_at(&LIMITS),
            Some(claim.expires_ms),
            "the claim's expiry wakes the gate"
        );
        assert!(
            begin_attempt(s.record.unwrap(), 11, &LIMITS).is_none(),
            "held by a live claim"
        );
    }

    #[test]
    fn a_retry_waits_what_the_destination_asked_within_the_cap() {
        let first = step(Some(registered()), deliver(Status::Succeeded), 10)
            .record
            .unwrap();
        let (claim, s) = begin_attempt(first, 10, &LIMITS).unwrap();
        let op = s.record.unwrap();
        let next_after = |asked_wait_ms| {
            let done = attempt_finished(
                op.clone(),
                &Attempt {
                    claim,
                    outcome: AttemptOutcome::Retry("429: slow down".into()),
                    started_ms: 10,
                    finished_ms: 30,
                    asked_wait_ms,
                    target: Default::default(),
                },
                &LIMITS,
                1.0,
            );
            done.record.unwrap().effect().next_attempt_ms() - 30
        };
        // The backoff's own first wait is a second (LIMITS: base 1 s, cap 8 s).
        assert_eq!(next_after(None), 1_000);
        assert_eq!(next_after(Some(4_000)), 4_000, "no sooner than asked");
        assert_eq!(next_after(Some(0)), 1_000, "never sooner than the backoff");
        assert_eq!(
            next_after(Some(3_600_000)),
            8_000,
            "an hour asked waits the cap"
        );
    }

    #[test]
    fn attempt_outcomes_commit_done_retry_or_park_and_a_stale_token_changes_nothing() {
        let first = step(Some(registered()), deliver(Status::Succeeded), 10)
            .record
            .unwrap();
        let (claim, s) = begin_attempt(first, 10, &LIMITS).unwrap();
        let op = s.record.unwrap();
        let finish = |op: Operation, claim: Claim, outcome: AttemptOutcome| {
            attempt_finished(
                op,
                &Attempt {
                    claim,
                    outcome,
                    started_ms: 10,
                    finished_ms: 30,
                    asked_wait_ms: None,
                    target: Default::default(),
                },
                &LIMITS,
                1.0,
            )
        };
        let retry = finish(op.clone(), claim, AttemptOutcome::Retry("503".into()));
        assert_eq!(events(&retry), ["effect_failed"]);
        assert_eq!(retry.logs[0].to_value()["after_settled_ms"], 0);
        assert_eq!(
            retry.record.as_ref().unwrap().effect().next_attempt_ms(),
            30 + 1_000
        );
        let parked = finish(op.clone(), claim, AttemptOutcome::Park("400".into()));
        assert_eq!(events(&parked), ["effect_parked"]);
        let parked_op = parked.record.as_ref().unwrap();
        assert_eq!(
            parked_op
                .due_alerts(30)
                .iter()
                .map(|a| a.kind)
                .collect::<Vec<_>>(),
            [AlertKind::EffectFailing],
            "a parked effect alerts at once, from the gate"
        );
        assert!(
            parked.wake_at(&LIMITS).unwrap() <= 30,
            "sent by the alarm now"
        );
        assert!(retry.record.as_ref().unwrap().pending_alerts().is_empty());
        let done = finish(op.clone(), claim, AttemptOutcome::Delivered);
        assert_eq!(events(&done), ["effect_delivered"]);
        assert!(done.record.as_ref().unwrap().effect().done());
        let stale = Claim {
            token: claim.token + 7,
            ..claim
        };
        let fenced = finish(op.clone(), stale, AttemptOutcome::Retry("503".into()));
        assert_eq!(events(&fenced), ["effect_fenced"]);
        assert_eq!(fenced.save, Save::Unchanged);
        assert_eq!(fenced.record.unwrap(), op);
        // A stale 2xx for the generation still owed is kept: the destination has it.
        let late = finish(op.clone(), stale, AttemptOutcome::Delivered);
        assert_eq!(events(&late), ["effect_delivered"]);
        assert_eq!(late.save, Save::Durable);
        assert!(late.record.unwrap().effect().done());
        let older = Claim {
            generation: claim.generation - 1,
            ..stale
        };
        let fenced = finish(op.clone(), older, AttemptOutcome::Delivered);
        assert_eq!(events(&fenced), ["effect_fenced"]);
    }

    #[test]
    fn upkeep_projects_an_open_operation_with_its_index_entry_and_flushes_its_counts() {
        let mut op = step(Some(registered()), deliver(Status::Running), 10)
            .record
            .unwrap();
        let upkeep = plan_upkeep(&mut op, 2_000, &LIMITS);
        assert!(upkeep.sealed.is_some());
        let (projection, index) = upkeep.projection.clone().unwrap();
        assert_eq!(index, IndexWrite::Put, "open: indexed for the cron");
        let done = upkeep_done(op, &upkeep, Some(Ok(())), Some(Ok(())), 2_000);
        let op = done.record.unwrap();
        assert!(op.pending_stats().is_empty());
        assert_eq!(op.projected_version(), projection.metadata.version);
        assert!(op.indexed());
        assert!(plan_upkeep(&mut op.clone(), 2_500, &LIMITS).is_empty());
    }

    #[test]
    fn failed_upkeep_keeps_counts_and_backs_off_the_ledger() {
        let mut op = step(Some(registered()), deliver(Status::Running), 10)
            .record
            .unwrap();
        let upkeep = plan_upkeep(&mut op, 2_000, &LIMITS);
        let s = upkeep_done(
            op,
            &upkeep,
            Some(Err("shard down".into())),
            Some(Err("KV down".into())),
            2_000,
        );
        assert_eq!(events(&s), ["stats_flush_failed", "ledger_write_failed"]);
        let op = s.record.unwrap();
        assert!(!op.pending_stats().is_empty(), "kept for the next flush");
        assert!(op
            .pending_stats()
            .iter()
            .all(|e| e.at_ms >= 2_000 + STATS_RETRY_MS));
        assert_eq!(op.projection_failures(), 1);
        assert!(op.projection_due_ms() > 2_000);
    }

    /// A name nobody registered, its first delivery's effect claimed and delivered at 20:
    /// the commit's step.
    fn first_success() -> Step<AlarmDone> {
        delivered_at_20(step(None, deliver(Status::Succeeded), 10).record.unwrap())
    }

    #[test]
    fn a_commit_takes_its_counts_and_the_deliverys_out_of_the_record_for_the_tally() {
        let done = first_success();
        assert_eq!(done.save, Save::Durable);
        let names: Vec<&str> = done.tally.iter().map(|e| e.name.as_str()).collect();
        assert!(names.contains(&"effect_successes"), "{names:?}");
        assert!(names.contains(&"deliveries"), "{names:?}");
        let op = done.record.unwrap();
        assert!(op.pending_stats().is_empty());
        let last = done.tally.iter().map(|e| e.seq).max().unwrap();
        assert_eq!(
            op.stats_sealed_seq(),
            last,
            "nothing merges into them again"
        );
    }

    #[test]
    fn counts_with_a_drop_stay_in_the_record_for_the_named_send_and_a_fenced_answer_takes_none() {
        let first = step(None, deliver(Status::Succeeded), 10).record.unwrap();
        let dropped = step(Some(first), deliver(Status::Running), 11);
        assert!(crate::telemetry::counters::sent_named(
            dropped.record.as_ref().unwrap().pending_stats()
        ));
        let (claim, s) = begin_attempt(dropped.record.unwrap(), 12, &LIMITS).unwrap();
        let attempt = |claim: Claim| Attempt {
            claim,
            outcome: AttemptOutcome::Delivered,
            started_ms: 12,
            finished_ms: 20,
            asked_wait_ms: None,
            target: Default::default(),
        };
        let op = s.record.unwrap();
        let done = attempt_finished(op.clone(), &attempt(claim), &LIMITS, 0.5);
        assert!(done.tally.is_empty());
        assert!(crate::telemetry::counters::sent_named(
            done.record.unwrap().pending_stats()
        ));
        let stale = Claim {
            token: claim.token + 1,
            ..claim
        };
        let fenced = attempt_finished(op, &attempt(stale), &LIMITS, 0.5);
        assert!(fenced.tally.is_empty());
    }

    #[test]
    fn a_successs_upkeep_is_kept_in_memory_and_the_record_as_stored_still_retires() {
        let stored = first_success().record.unwrap();
        let mut op = stored.clone();
        let upkeep = plan_upkeep(&mut op, 1_100, &LIMITS);
        assert_eq!(upkeep.sealed, None, "the commit handed its counts over");
        let (projection, index) = upkeep.projection.clone().unwrap();
        assert_eq!(index, IndexWrite::None, "closed in its first projection");
        let done = upkeep_done(op, &upkeep, None, Some(Ok(())), 1_100);
        assert_eq!(done.save, Save::MemoryOnly);
        let kept = done.record.unwrap();
        assert_eq!(kept.projected_version(), projection.metadata.version);
        // The alarm follows the record in memory: retention, nothing before it.
        let retires = kept.retires_at_ms(LIMITS.retention_ms).unwrap();
        assert_eq!(kept.wake_at_ms(LIMITS.retention_ms, 0), Some(retires));
        // A new instance reads the commit's row: the projection looks owed, and retention
        // ends at the same moment, before anything else runs.
        let loaded = stored.as_loaded();
        assert!(loaded.projected_version() < loaded.version());
        assert_eq!(loaded.retires_at_ms(LIMITS.retention_ms), Some(retires));
        assert!(retire_if_over(&loaded, retires, &LIMITS).is_some());
        assert_eq!(plan(&loaded, retires, &LIMITS).stages(), [Stage::Retire]);
    }

    #[test]
    fn an_upkeep_is_stored_when_it_flushed_stored_counts_failed_or_moved_the_index() {
        let op = first_success().record.unwrap();
        // Counts from the record, flushed: a new instance must not send them again.
        let mut counted = op.clone();
        counted.count(Counter::Duplicates, 1_050);
        let upkeep = plan_upkeep(&mut counted, 1_100, &LIMITS);
        assert!(upkeep.sealed.is_some());
        let s = upkeep_done(counted, &upkeep, Some(Ok(())), Some(Ok(())), 1_100);
        assert_eq!(s.save, Save::Durable);
        // A ledger write that failed: its backoff.
        let mut failing = op.clone();
        let upkeep = plan_upkeep(&mut failing, 1_100, &LIMITS);
        let s = upkeep_done(failing, &upkeep, None, Some(Err("KV down".into())), 1_100);
        assert_eq!(s.save, Save::Durable);
        // An open operation's first projection puts its index entry: retention waits on the mark.
        let mut open = step(Some(registered()), deliver(Status::Running), 10)
            .record
            .unwrap();
        open.take_stats_for_tally();
        let upkeep = plan_upkeep(&mut open, 2_000, &LIMITS);
        assert_eq!(upkeep.projection.as_ref().unwrap().1, IndexWrite::Put);
        let s = upkeep_done(open, &upkeep, None, Some(Ok(())), 2_000);
        assert_eq!(s.save, Save::Durable);
    }

    #[test]
    fn a_malformed_confirmation_answer_alerts_and_asks_a_bounded_number_of_times() {
        let malformed = || Err(StatusError::Malformed("not JSON".into()));
        let s = confirmed(nudged(), malformed(), 20, &LIMITS, 1.0);
        assert_eq!(events(&s), ["status_unusable"]);
        let mut op = s.record.unwrap();
        assert_eq!(op.pending_alerts().len(), 1);
        assert_eq!(op.pending_alerts()[0].kind, AlertKind::StatusUnusable);
        for i in 1..MAX_CONFIRM_ATTEMPTS {
            assert!(op.confirmation().is_some(), "try {i}");
            op = confirmed(op, malformed(), 20 + i64::from(i), &LIMITS, 1.0)
                .record
                .unwrap();
        }
        assert!(
            op.confirmation().is_none(),
            "then left to the cron and the alert"
        );
        assert_eq!(op.pending_alerts().len(), 1, "alerted once");
    }

    #[test]
    fn transient_confirmation_failures_stop_after_the_bound_too() {
        let mut op = nudged();
        for i in 0..MAX_CONFIRM_ATTEMPTS {
            assert!(op.confirmation().is_some(), "try {i}");
            op = confirmed(
                op,
                Err(StatusError::Transient {
                    retry_after_secs: 0,
                }),
                20 + i64::from(i),
                &LIMITS,
                1.0,
            )
            .record
            .unwrap();
        }
        assert!(op.confirmation().is_none());
        assert_eq!(op.status(), &Status::Pending, "nothing applied");
    }

    #[test]
    fn without_an_api_key_a_confirmation_waits_however_long() {
        let mut op = nudged();
        for i in 0..3 * MAX_CONFIRM_ATTEMPTS {
            op = confirmed(
                op,
                Err(StatusError::NoApiKey),
                20 + i64::from(i),
                &LIMITS,
                1.0,
            )
            .record
            .unwrap();
        }
        assert!(op.confirmation().is_some(), "kept until the key is set");
        let due_after = |now: i64| {
            let op = confirmed(op.clone(), Err(StatusError::NoApiKey), now, &LIMITS, 1.0).record;
            let op = op.unwrap();
            let c = op.confirmation().unwrap();
            (c.due_ms - now, now - c.requested_at_ms)
        };
        let (wait, waited) = due_after(5_000);
        assert_eq!(wait, waited, "waits as long again");
        assert_eq!(due_after(500_000).0, 8_000, "within the backoff cap");
        let op = confirmed(op, observed(Status::Succeeded), 100, &LIMITS, 1.0)
            .record
            .unwrap();
        assert_eq!(op.status(), &Status::Succeeded);
    }
}

#[cfg(test)]
mod desk_turn_tests {
    use super::*;
    use crate::operation::gate::desk_turn::{desk_turn, reports, DeskTurn};
    use crate::operation::gate::fixtures::*;
    use crate::operation::gate::protocol::{EffectReport, GateCommand, GateReply};
    use crate::operation::gate::{step, Save};
    use crate::operation::lifecycle::Status;
    use crate::operation::AttemptOutcome;
    use crate::operation::DeskMark;

    /// The turn the edge takes for the effect of `op` (the record before its claim).
    fn turn(op: &Operation, paced: bool, open: bool) -> DeskTurn {
        let retry = op.effect().failures_in_row() > 0;
        desk_turn(op.effect().desk(), paced, open, retry)
    }

    fn owed() -> Operation {
        step(Some(registered()), deliver(Status::Succeeded), 10)
            .record
            .unwrap()
    }

    fn failed_once() -> Operation {
        let failed = AttemptOutcome::Retry("503".into());
        answered(owed(), 10, 20, failed).record.unwrap()
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
            wait_on_destination(failed_once(), 30, &LIMITS, false).record,
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
    fn a_wait_keeps_the_generation_holds_no_claim_and_falls_back_after_the_desks_fallback() {
        let op = failed_once();
        let generation = op.effect().generation();
        let s = wait_on_destination(op, 30, &LIMITS, false);
        assert_eq!(s.save, Save::Durable);
        let op = s.record.unwrap();
        assert_eq!(op.effect().next_attempt_ms(), 30 + LIMITS.desk_fallback_ms);
        assert_eq!(op.effect().generation(), generation);
        assert!(op.effect().claim().is_none());
        assert_eq!(
            op.effect().desk(),
            Some(DeskMark::Waiting {
                since_ms: 30,
                paused: false
            })
        );
        assert_eq!(op.view()["waiting_on_destination"], true);
    }

    #[test]
    fn a_pauses_wait_makes_no_attempt_raises_no_effect_failing_and_asks_again_at_its_fallback() {
        // A first attempt told `Paused` by its check's ask: no claim, no attempt counted.
        let op = owed();
        let s = wait_on_destination(op, 30, &LIMITS, true);
        let mut op = s.record.unwrap();
        assert!(op.held_by_pause());
        assert_eq!(op.view()["paused_at_destination"], true);
        assert_eq!(op.effect().attempts(), 0);
        assert_eq!(op.effect().failures_in_row(), 0);
        // The cron's alert past EFFECT_ALERT_AFTER_SECONDS is refused while it holds.
        assert!(!op.raise_alert(AlertKind::EffectFailing, 99_999, 40));
        assert!(op.alerts_raised().is_empty());
        // Its fallback comes before the resume: it asks again (a first attempt would go).
        assert_eq!(turn(&op, false, false), DeskTurn::Ask);
        // Asked again and told `Paused` again: still no attempt, the same wait.
        let again = wait_on_destination(op, 8_100, &LIMITS, true)
            .record
            .unwrap();
        assert_eq!(again.effect().attempts(), 0);
        assert!(again.held_by_pause());
        // Resumed: the release makes it due, and it may fail and alert as any effect.
        let released = step(
            Some(again),
            GateCommand::DestinationReady { probe: false },
            9_000,
        )
        .record
        .unwrap();
        assert!(!released.held_by_pause());
        assert_eq!(released.effect().next_attempt_ms(), 9_000);
        assert_eq!(
            turn(&released, false, false),
            DeskTurn::Released { probe: false }
        );
    }

    #[test]
    fn a_wait_for_health_after_a_pause_is_no_longer_a_pauses() {
        let paused = wait_on_destination(failed_once(), 30, &LIMITS, true)
            .record
            .unwrap();
        assert!(paused.held_by_pause());
        let open = wait_on_destination(paused, 40, &LIMITS, false)
            .record
            .unwrap();
        assert!(!open.held_by_pause());
        assert_eq!(
            open.effect().desk(),
            Some(DeskMark::Waiting {
                since_ms: 30,
                paused: false
            })
        );
    }

    #[test]
    fn a_release_makes_it_due_now_and_its_attempt_goes_without_asking() {
        let waiting = wait_on_destination(failed_once(), 30, &LIMITS, false).record;
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
        let s = wait_on_destination(settled(), 40, &LIMITS, false);
        assert_eq!(s.reply, AlarmDone::WaitsOnDestination(false));
    }
}
