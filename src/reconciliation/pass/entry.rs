//! The entry run: what happens to one ledger entry, as its own machine ([`EntryRun`]) that
//! the index walk, the audit and the queue consumer each drive the same way: the actions
//! [`decide`] chose, the status call (paced, or skipped while Gemini asks us to wait), what its
//! answer leads to, and what a gate's reply leads to. What the run shares with its driver
//! (the counts, the lines, the budget and the pace of status calls) is [`Books`].
//!
//! Guarantees: an answer whose status the ledger already shows costs no gate call; a 404
//! asks for `unknown_to_gemini` and a malformed answer for `status_unusable` only while the
//! ledger shows them unraised; a 429 or 5xx, or a run of unanswered calls, backs off every
//! status call and settles nothing; an answer that settles the operation drops the `stuck`
//! alert its metadata asked for (stuck means without an outcome); a gate that answers that the
//! side effect is done is asked to re-index (the listing was stale), if the budget allows.

use std::collections::VecDeque;

use crate::operation::alert::AlertKind;
use crate::operation::gate::protocol::{EffectReport, GateCommand, GateReply};
use crate::operation::key::Collection;
use crate::operation::ledger::LedgerMeta;
use crate::operation::lifecycle::{Source, Status};
use crate::operation::observation::{Observation, StatusError};
use crate::operation::OpEvent;
use crate::reconciliation::entry_decision::{decide, Action};
use crate::reconciliation::lease_state::slot_spacing_ms;
use crate::reconciliation::status::{interpret_skimmed, status_url, StatusAnswer};
use crate::retry::PeerAnswer;

use super::stop::StatusHealth;
use super::{Intent, Limits, PassLog, PassReport, Performed, HOLD_BACKOFF_UP_TO_MS};

/// What an entry run shares with the machine that drives it (the pass, or the queue
/// consumer): the limits, the counts and lines, the budget, and the pace of status calls,
/// which holds across entries.
#[derive(Debug)]
pub(super) struct Books {
    pub(super) limits: Limits,
    pub(super) report: PassReport,
    pub(super) logs: Vec<PassLog>,
    /// The subrequests the current walk may spend (two thirds of the pass's when an audit is
    /// due; unbounded for a consumer, whose message bounds it).
    pub(super) budget_limit: u32,
    pub(super) status_backoff_until_ms: i64,
    health: StatusHealth,
    /// When the last status call started.
    last_poll_ms: Option<i64>,
}

impl Books {
    pub(super) fn new(budget_limit: u32, limits: Limits) -> Books {
        Books {
            limits,
            report: PassReport::default(),
            logs: Vec::new(),
            budget_limit,
            status_backoff_until_ms: 0,
            health: StatusHealth::default(),
            last_poll_ms: None,
        }
    }

    pub(super) fn log(&mut self, line: PassLog) {
        self.logs.push(line);
    }

    /// Logs `line` as an error, counted in the report.
    pub(super) fn error(&mut self, line: PassLog) {
        self.report.errors += 1;
        self.log(line);
    }

    /// Counts `n` subrequests against the budget the heartbeat shares (the report's count is
    /// the one the budget is held to).
    pub(super) fn spend(&mut self, n: u32) {
        self.report.subrequests += n;
    }

    /// Room for `cost` more subrequests in the current walk's share, keeping one for the
    /// lease release.
    pub(super) fn affords(&self, cost: u32) -> bool {
        self.report.subrequests + cost < self.budget_limit
    }

    /// What the entry with `meta` needs at `now_ms` ([`decide`]).
    pub(super) fn decide(&self, meta: &LedgerMeta, now_ms: i64) -> Vec<Action> {
        decide(meta, now_ms.div_euclid(1_000), &self.limits.thresholds)
    }

    /// An index entry whose metadata does not parse: an error, and the entry is passed over
    /// (the audit finds the operation through its `op:` entry).
    pub(super) fn unreadable_metadata(&mut self, key: &str) {
        let (key, error) = (Some(key.to_string()), "unreadable index metadata".into());
        self.error(PassLog::ReconcileError { key, error });
    }
}

/// One entry's run: the entry in hand, what is left to do for it, and the answer it owes.
#[derive(Debug)]
pub(super) struct EntryRun {
    /// The KV key it was listed under (`open:…` or `op:…`).
    pub(super) name: String,
    /// The operation's key.
    key: String,
    meta: LedgerMeta,
    steps: VecDeque<Step>,
    /// False once a poll was skipped for a back-off that ends within a cron interval.
    pub(super) polled: bool,
    /// A poll was skipped for a back-off, or answered by one (a queue consumer sends the
    /// entry back).
    pub(super) skipped_poll: bool,
    owed: Option<Owed>,
}

/// The answer an entry run owes.
#[derive(Debug, Clone, PartialEq)]
enum Owed {
    /// A status call: when it started, and the collection its answer is read as.
    Status((i64, Collection)),
    Gate(AfterGate),
    IndexDelete,
    Sleep,
}

/// One thing left to do for the entry.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Step {
    Act(Action),
    Gate(GateCommand, AfterGate),
    /// Ask the gate to project again; `stale`: log that the index entry was stale.
    Reindex {
        stale: bool,
    },
    /// Delete the index entry: the gate holds no record for it, so no projection ever will.
    DeleteIndex,
}

/// What a gate's reply leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterGate {
    Nothing,
    /// Count an alert the gate raised now.
    CountAlert,
    /// Re-index when the gate says the side effect is done.
    ReindexIfDone,
    /// Count a terminal status applied, then as [`AfterGate::ReindexIfDone`].
    Settled,
}

impl EntryRun {
    pub(super) fn new(name: &str, key: &str, meta: LedgerMeta, steps: Vec<Step>) -> EntryRun {
        EntryRun {
            name: name.to_string(),
            key: key.to_string(),
            meta,
            steps: steps.into(),
            polled: true,
            skipped_poll: false,
            owed: None,
        }
    }

    pub(super) fn owes(&self) -> bool {
        self.owed.is_some()
    }

    /// The next intent for the entry; `None` when nothing is left to do for it.
    pub(super) fn step(&mut self, books: &mut Books, now_ms: i64) -> Option<Intent> {
        loop {
            let intent = match self.steps.pop_front()? {
                Step::Act(Action::Poll) => self.poll(books, now_ms),
                Step::Act(Action::RetryEffect) => {
                    books.report.effects_retried += 1;
                    Some(self.gate(books, GateCommand::RetryEffect, AfterGate::ReindexIfDone))
                }
                Step::Act(Action::Alert { kind, age_secs }) => {
                    let command = GateCommand::Alert {
                        alert: kind,
                        age_seconds: age_secs,
                        effect_alert_after_ms: 0, // the gate's own, not on the wire
                    };
                    Some(self.gate(books, command, AfterGate::CountAlert))
                }
                Step::Gate(command, after) => Some(self.gate(books, command, after)),
                Step::Reindex { stale } => {
                    if stale {
                        let key = self.key.clone();
                        books.log(PassLog::IndexStale { key });
                    }
                    books.report.reindexed += 1;
                    Some(self.gate(books, GateCommand::Reindex, AfterGate::Nothing))
                }
                Step::DeleteIndex => {
                    let key = self.key.clone();
                    books.log(PassLog::IndexStale { key: key.clone() });
                    books.spend(1);
                    books.report.reindexed += 1;
                    self.owed = Some(Owed::IndexDelete);
                    Some(Intent::DeleteIndex { key })
                }
            };
            if intent.is_some() {
                return intent;
            }
        }
    }

    fn gate(&mut self, books: &mut Books, command: GateCommand, after: AfterGate) -> Intent {
        books.spend(1);
        books.report.gate_calls += 1;
        self.owed = Some(Owed::Gate(after));
        let key = self.key.clone();
        Intent::CallGate { key, command }
    }

    /// Asks Gemini about the entry, unless Gemini asked us to wait: then the next pass asks
    /// again, starting here if the wait ends within a cron interval.
    fn poll(&mut self, books: &mut Books, now_ms: i64) -> Option<Intent> {
        let backoff_until = books.status_backoff_until_ms;
        if now_ms < backoff_until {
            self.skipped_poll = true;
            self.polled &= backoff_until - now_ms > HOLD_BACKOFF_UP_TO_MS;
            return None;
        }
        // The one budget: never sooner than `1 / RECONCILE_POLL_RATE` after the last call.
        let slot = books
            .last_poll_ms
            .map(|last| last + slot_spacing_ms(books.limits.poll_rate));
        if let Some(until_ms) = slot.filter(|slot| now_ms < *slot) {
            self.steps.push_front(Step::Act(Action::Poll));
            self.owed = Some(Owed::Sleep);
            return Some(Intent::Sleep { until_ms });
        }
        books.last_poll_ms = Some(now_ms);
        let collection = Collection::of_key(&self.key)?;
        let base = &books.limits.api_base;
        let url = status_url(base, collection, &self.key, &self.meta.name);
        books.report.status_calls += 1;
        books.spend(1);
        self.owed = Some(Owed::Status((now_ms, collection)));
        let key = self.key.clone();
        Some(Intent::Poll { key, url })
    }

    /// What performing the run's last intent got, at `now_ms`.
    pub(super) fn answer(&mut self, books: &mut Books, performed: Performed, now_ms: i64) {
        match (self.owed.take(), performed) {
            // The status API's answer, at `now_ms` (when it ended).
            (Some(Owed::Status((started_ms, collection))), Performed::Status(answer)) => {
                let (PeerAnswer::Http { status, .. } | PeerAnswer::TooLarge { status, .. }) =
                    answer
                else {
                    return self.status_unanswered(books, answer, now_ms);
                };
                books.health.answered();
                match interpret_skimmed(collection, &answer) {
                    Ok(observation) => self.status_observed(books, observation),
                    Err(error) => self.status_failed(books, error, status, started_ms),
                }
            }
            (Some(Owed::Gate(after)), Performed::Gate(reply)) => self.on_gate(books, after, reply),
            // A failed delete: the next coverage finds the entry again.
            (Some(Owed::IndexDelete), Performed::IndexDeleted(Err(error))) => {
                let key = Some(self.key.clone());
                books.error(PassLog::ReconcileError { key, error });
            }
            (Some(Owed::IndexDelete), Performed::IndexDeleted(Ok(()))) => {}
            (Some(Owed::Sleep), Performed::Slept) => {}
            (owed, performed) => {
                debug_assert!(false, "{performed:?} while {owed:?} is owed");
                self.owed = owed;
            }
        }
    }

    /// No answer (a timeout or a network error): only this entry's trouble, unless a run of
    /// them says the API's: the cursor moves past it and the next coverage of the ledger asks
    /// again.
    fn status_unanswered(&mut self, books: &mut Books, answer: StatusAnswer, now_ms: i64) {
        books.report.status_unanswered += 1;
        let backoff = books.health.unanswered(now_ms);
        if let Some(until) = backoff {
            books.status_backoff_until_ms = books.status_backoff_until_ms.max(until);
            // A queue consumer sends the entry back with the entries it skips.
            self.skipped_poll = true;
        }
        let answer = match answer {
            PeerAnswer::Network(e) => e,
            _ => "timeout".to_string(),
        };
        books.error(PassLog::StatusUnanswered {
            key: self.key.clone(),
            answer,
            backoff_secs: backoff.map(|until| (until - now_ms).div_euclid(1_000)),
        });
    }

    /// An answer that says nothing about the state: a 404 asks for `unknown_to_gemini` and a
    /// malformed answer for `status_unusable` (each only while the ledger shows it unraised);
    /// a 429 or 5xx backs off every status call.
    fn status_failed(&mut self, books: &mut Books, error: StatusError, answer: u16, started: i64) {
        let key = self.key.clone();
        let age_seconds = started.div_euclid(1_000) - self.meta.submitted_at;
        let (alert, command) = match error {
            StatusError::NotFound => {
                books.log(PassLog::StatusNotFound { key });
                let alert = AlertKind::UnknownToGemini;
                let command = GateCommand::Alert {
                    alert,
                    age_seconds,
                    effect_alert_after_ms: 0,
                };
                (alert, command)
            }
            StatusError::Transient { retry_after_secs } => {
                // A queue consumer sends the entry back with the entries it skips.
                self.skipped_poll = true;
                let until = started + retry_after_secs * 1_000;
                books.status_backoff_until_ms = books.status_backoff_until_ms.max(until);
                let line = PassLog::StatusTransient {
                    key,
                    retry_after_secs,
                    answer,
                };
                return books.error(line);
            }
            StatusError::Malformed(reason) => {
                // The answer will not get better by asking again: alert once, with the reason,
                // so a person can settle it (the gate keeps the mark; the ledger carries it).
                let error = reason.clone();
                books.error(PassLog::StatusUnusable { key, error });
                let command = GateCommand::StatusUnusable {
                    reason,
                    age_seconds,
                };
                (AlertKind::StatusUnusable, command)
            }
            e => {
                let error = format!("{e:?}");
                return books.error(PassLog::StatusUnusable { key, error });
            }
        };
        // Each only while the ledger shows it unraised.
        if !self.meta.alerts.contains(&alert) {
            self.steps
                .push_front(Step::Gate(command, AfterGate::CountAlert));
        }
    }

    /// A state: offered to the gate unless the ledger already shows it (the round trip saved)
    /// or it is one this worker does not know.
    fn status_observed(&mut self, books: &mut Books, observation: Observation) {
        let key = self.key.clone();
        if let Status::Unknown(raw) = &observation.status {
            let state = raw.clone();
            return books.log(PassLog::StatusUnknownState { key, state });
        }
        if observation.status == self.meta.status {
            return; // nothing new for the gate: save the round trip
        }
        if observation.status.is_terminal() {
            // The stuck check follows the poll: an operation this answer settles is not stuck
            // (the gate refuses it too; this saves the call).
            self.steps.retain(|s| {
                !matches!(s, Step::Act(Action::Alert { kind, .. }) if *kind == AlertKind::Stuck)
            });
        }
        let command = GateCommand::Deliver {
            key,
            name: self.meta.name.clone(),
            event: OpEvent {
                status: observation.status,
                update_time_ms: observation.update_time_ms,
                source: Source::Reconcile,
                details: observation.details,
                delivery_id: None,
            },
            require_registration: false,
            hold_ms: books.limits.unregistered_hold_ms,
            new_not_before_ms: 0,
        };
        self.steps
            .push_front(Step::Gate(command, AfterGate::Settled));
    }

    /// The gate's reply to [`Intent::CallGate`] (`Err`: the call failed).
    fn on_gate(&mut self, books: &mut Books, after: AfterGate, reply: Result<GateReply, String>) {
        let key = self.key.clone();
        let reply = match reply {
            Ok(reply) => reply,
            Err(error) => {
                let key = Some(key);
                return books.error(PassLog::ReconcileError { key, error });
            }
        };
        match after {
            AfterGate::Nothing => {}
            AfterGate::CountAlert => {
                books.report.alerts += u64::from(reply == GateReply::AlertSent { sent: true });
            }
            AfterGate::ReindexIfDone => self.reindex_if_done(books, &reply),
            // A poll reached a gate that holds no record (it creates none from a status
            // answer): the index entry outlived the operation, and only deleting it stops the
            // polls.
            AfterGate::Settled if reply == GateReply::Unregistered => {
                if books.affords(1) {
                    self.steps.push_front(Step::DeleteIndex);
                }
            }
            AfterGate::Settled => {
                if let GateReply::Applied { status, .. } = &reply {
                    if status.is_terminal() {
                        books.report.settled += 1;
                        let status = status.clone();
                        books.log(PassLog::SettledByReconcile { key, status });
                    }
                }
                self.reindex_if_done(books, &reply);
            }
        }
    }

    /// The entry was listed as needing work, but its gate says the side effect is done: the
    /// listing is stale (an index entry whose delete was lost, or a list lagging behind a
    /// close). Ask the gate to project again, which deletes the index entry, so a lost delete
    /// costs one trip, not one per pass. A pass-level race (closed since it was listed) costs
    /// at most one redundant projection.
    fn reindex_if_done(&mut self, books: &Books, reply: &GateReply) {
        let (GateReply::Effect { effect } | GateReply::Dropped { effect, .. }) = reply else {
            return;
        };
        if *effect == EffectReport::Delivered && books.affords(1) {
            self.steps.push_front(Step::Reindex { stale: true });
        }
    }
}
