//! What the pass does for one entry: the actions [`decide`] chose, what a status answer
//! leads to, and what a gate's reply leads to.
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
use crate::reconciliation::entry_decision::Action;
use crate::reconciliation::lease_state::slot_spacing_ms;
use crate::reconciliation::status::{interpret_skimmed, status_url, StatusAnswer};
use crate::retry::PeerAnswer;

use super::{Awaiting, Intent, Pass, PassLog, HOLD_BACKOFF_UP_TO_MS};

#[cfg(doc)]
use crate::reconciliation::entry_decision::decide;

/// The entry in hand.
#[derive(Debug)]
pub(super) struct Entry {
    /// The KV key it was listed under (`open:…` or `op:…`).
    pub(super) name: String,
    /// The operation's key.
    pub(super) key: String,
    pub(super) meta: LedgerMeta,
    pub(super) steps: VecDeque<Step>,
    /// False once a poll was skipped for a back-off that ends within a cron interval.
    pub(super) polled: bool,
    /// A poll was skipped for a back-off, or answered by one (a queue consumer sends the
    /// entry back).
    pub(super) skipped_poll: bool,
}

impl Entry {
    pub(super) fn new(name: &str, key: &str, meta: LedgerMeta, steps: Vec<Step>) -> Entry {
        Entry {
            name: name.to_string(),
            key: key.to_string(),
            meta,
            steps: steps.into(),
            polled: true,
            skipped_poll: false,
        }
    }
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

impl Pass {
    /// The next intent for the entry in hand; `None` when nothing is left to do for it.
    pub(super) fn entry_step(&mut self, now_ms: i64) -> Option<Intent> {
        loop {
            let step = self.entry.as_mut()?.steps.pop_front()?;
            let intent = match step {
                Step::Act(Action::Poll) => self.poll(now_ms),
                Step::Act(Action::RetryEffect) => {
                    self.report.effects_retried += 1;
                    Some(self.gate(GateCommand::RetryEffect, AfterGate::ReindexIfDone))
                }
                Step::Act(Action::Alert { kind, age_secs }) => Some(self.gate(
                    GateCommand::Alert {
                        alert: kind,
                        age_seconds: age_secs,
                    },
                    AfterGate::CountAlert,
                )),
                Step::Gate(command, after) => Some(self.gate(command, after)),
                Step::Reindex { stale } => {
                    if stale {
                        let key = self.entry.as_ref()?.key.clone();
                        self.log(PassLog::IndexStale { key });
                    }
                    self.report.reindexed += 1;
                    Some(self.gate(GateCommand::Reindex, AfterGate::Nothing))
                }
                Step::DeleteIndex => {
                    let key = self.entry.as_ref()?.key.clone();
                    self.log(PassLog::IndexStale { key: key.clone() });
                    self.spend(1);
                    self.report.reindexed += 1;
                    self.awaiting = Some(Awaiting::IndexDelete);
                    Some(Intent::DeleteIndex { key })
                }
            };
            if intent.is_some() {
                return intent;
            }
        }
    }

    fn gate(&mut self, command: GateCommand, after: AfterGate) -> Intent {
        self.spend(1);
        self.report.gate_calls += 1;
        self.awaiting = Some(Awaiting::Gate(after));
        let key = self
            .entry
            .as_ref()
            .map_or_else(String::new, |e| e.key.clone());
        Intent::CallGate { key, command }
    }

    /// Asks Gemini about the entry, unless Gemini asked us to wait: then the next pass asks
    /// again, starting here if the wait ends within a cron interval.
    fn poll(&mut self, now_ms: i64) -> Option<Intent> {
        let backoff_until = self.status_backoff_until_ms;
        // The one budget: never sooner than `1 / RECONCILE_POLL_RATE` after the last call.
        let slot = self
            .last_poll_ms
            .map(|last| last + slot_spacing_ms(self.limits.poll_rate));
        let entry = self.entry.as_mut()?;
        if now_ms < backoff_until {
            entry.skipped_poll = true;
            entry.polled &= backoff_until - now_ms > HOLD_BACKOFF_UP_TO_MS;
            return None;
        }
        if let Some(until_ms) = slot.filter(|slot| now_ms < *slot) {
            entry.steps.push_front(Step::Act(Action::Poll));
            self.awaiting = Some(Awaiting::Sleep);
            return Some(Intent::Sleep { until_ms });
        }
        self.last_poll_ms = Some(now_ms);
        let collection = Collection::of_key(&entry.key)?;
        let url = status_url(
            &self.limits.api_base,
            collection,
            &entry.key,
            &entry.meta.name,
        );
        let key = entry.key.clone();
        self.report.status_calls += 1;
        self.spend(1);
        self.awaiting = Some(Awaiting::Status {
            started_ms: now_ms,
            collection,
        });
        Some(Intent::Poll { key, url })
    }

    /// The status API's answer to [`Intent::Poll`], at `now_ms` (when it ended).
    pub fn on_status(&mut self, answer: StatusAnswer, now_ms: i64) {
        let Some(Awaiting::Status {
            started_ms,
            collection,
        }) = self.answered(|a| matches!(a, Awaiting::Status { .. }))
        else {
            return;
        };
        let Some(key) = self.entry.as_ref().map(|e| e.key.clone()) else {
            return;
        };
        let (PeerAnswer::Http { status, .. } | PeerAnswer::TooLarge { status, .. }) = answer else {
            return self.status_unanswered(key, answer, now_ms);
        };
        self.health.answered();
        match interpret_skimmed(collection, &answer) {
            Ok(observation) => self.status_observed(key, observation),
            Err(error) => self.status_failed(key, error, status, started_ms),
        }
    }

    /// No answer (a timeout or a network error): only this entry's trouble, unless a run of
    /// them says the API's: the cursor moves past it and the next coverage of the ledger asks
    /// again.
    fn status_unanswered(&mut self, key: String, answer: StatusAnswer, now_ms: i64) {
        self.report.errors += 1;
        self.report.status_unanswered += 1;
        let backoff = self.health.unanswered(now_ms);
        if let Some(until) = backoff {
            self.status_backoff_until_ms = self.status_backoff_until_ms.max(until);
            self.ask_again_after_backoff();
        }
        let answer = match answer {
            PeerAnswer::Network(e) => e,
            _ => "timeout".to_string(),
        };
        self.log(PassLog::StatusUnanswered {
            key,
            answer,
            backoff_secs: backoff.map(|until| (until - now_ms).div_euclid(1_000)),
        });
    }

    /// An answer that says nothing about the state: a 404 asks for `unknown_to_gemini` and a
    /// malformed answer for `status_unusable` (each only while the ledger shows it unraised);
    /// a 429 or 5xx backs off every status call.
    fn status_failed(&mut self, key: String, error: StatusError, answer: u16, started_ms: i64) {
        let Some(meta) = self.entry.as_ref().map(|e| &e.meta) else {
            return;
        };
        let age_seconds = started_ms.div_euclid(1_000) - meta.submitted_at;
        let unraised = |kind: AlertKind| !meta.alerts.contains(&kind);
        match error {
            StatusError::NotFound => {
                let ask = unraised(AlertKind::UnknownToGemini);
                self.log(PassLog::StatusNotFound { key });
                if ask {
                    let command = GateCommand::Alert {
                        alert: AlertKind::UnknownToGemini,
                        age_seconds,
                    };
                    self.push_front(Step::Gate(command, AfterGate::CountAlert));
                }
            }
            StatusError::Transient { retry_after_secs } => {
                self.ask_again_after_backoff();
                self.report.errors += 1;
                self.status_backoff_until_ms = self
                    .status_backoff_until_ms
                    .max(started_ms + retry_after_secs * 1_000);
                self.log(PassLog::StatusTransient {
                    key,
                    retry_after_secs,
                    answer,
                });
            }
            StatusError::Malformed(reason) => {
                // The answer will not get better by asking again: alert once, with the reason,
                // so a person can settle it (the gate keeps the mark; the ledger carries it).
                let ask = unraised(AlertKind::StatusUnusable);
                self.report.errors += 1;
                self.log(PassLog::StatusUnusable {
                    key,
                    error: reason.clone(),
                });
                if ask {
                    let command = GateCommand::StatusUnusable {
                        reason,
                        age_seconds,
                    };
                    self.push_front(Step::Gate(command, AfterGate::CountAlert));
                }
            }
            e => {
                self.report.errors += 1;
                self.log(PassLog::StatusUnusable {
                    key,
                    error: format!("{e:?}"),
                });
            }
        }
    }

    /// A state: offered to the gate unless the ledger already shows it (the round trip saved)
    /// or it is one this worker does not know.
    fn status_observed(&mut self, key: String, observation: Observation) {
        if let Status::Unknown(raw) = &observation.status {
            self.log(PassLog::StatusUnknownState {
                key,
                state: raw.clone(),
            });
            return;
        }
        let Some(entry) = self.entry.as_mut() else {
            return;
        };
        if observation.status == entry.meta.status {
            return; // nothing new for the gate: save the round trip
        }
        if observation.status.is_terminal() {
            // The stuck check follows the poll: an operation this answer settles is not stuck
            // (the gate refuses it too; this saves the call).
            let stuck = |s: &Step| {
                matches!(
                    s,
                    Step::Act(Action::Alert {
                        kind: AlertKind::Stuck,
                        ..
                    })
                )
            };
            entry.steps.retain(|s| !stuck(s));
        }
        let meta = &entry.meta;
        let command = GateCommand::Deliver {
            key,
            name: meta.name.clone(),
            event: OpEvent {
                status: observation.status,
                update_time_ms: observation.update_time_ms,
                source: Source::Reconcile,
                details: observation.details,
                delivery_id: None,
            },
            require_registration: false,
            hold_ms: self.limits.unregistered_hold_ms,
            new_not_before_ms: 0,
        };
        self.push_front(Step::Gate(command, AfterGate::Settled));
    }

    /// The gate's reply to [`Intent::CallGate`] (`Err`: the call failed).
    pub fn on_gate(&mut self, reply: Result<GateReply, String>) {
        let Some(Awaiting::Gate(after)) = self.answered(|a| matches!(a, Awaiting::Gate(_))) else {
            return;
        };
        let key = self
            .entry
            .as_ref()
            .map_or_else(String::new, |e| e.key.clone());
        let reply = match reply {
            Ok(reply) => reply,
            Err(error) => {
                self.report.errors += 1;
                self.log(PassLog::ReconcileError {
                    key: Some(key),
                    error,
                });
                return;
            }
        };
        match after {
            AfterGate::Nothing => {}
            AfterGate::CountAlert => {
                if reply == (GateReply::AlertSent { sent: true }) {
                    self.report.alerts += 1;
                }
            }
            AfterGate::ReindexIfDone => self.reindex_if_done(&reply),
            // A poll reached a gate that holds no record (it creates none from a status
            // answer): the index entry outlived the operation, and only deleting it stops the
            // polls.
            AfterGate::Settled if reply == GateReply::Unregistered => {
                if self.affords(1) {
                    self.push_front(Step::DeleteIndex);
                }
            }
            AfterGate::Settled => {
                if let GateReply::Applied { status, .. } = &reply {
                    if status.is_terminal() {
                        self.report.settled += 1;
                        self.log(PassLog::SettledByReconcile {
                            key,
                            status: status.clone(),
                        });
                    }
                }
                self.reindex_if_done(&reply);
            }
        }
    }

    /// The answer to [`Intent::DeleteIndex`] (`Err`: the delete failed; the next coverage
    /// finds the entry again).
    pub fn on_index_deleted(&mut self, deleted: Result<(), String>) {
        if self
            .answered(|a| matches!(a, Awaiting::IndexDelete))
            .is_none()
        {
            return;
        }
        if let Err(error) = deleted {
            let key = self.entry.as_ref().map(|e| e.key.clone());
            self.report.errors += 1;
            self.log(PassLog::ReconcileError { key, error });
        }
    }

    /// The entry was listed as needing work, but its gate says the side effect is done: the
    /// listing is stale (an index entry whose delete was lost, or a list lagging behind a
    /// close). Ask the gate to project again, which deletes the index entry, so a lost delete
    /// costs one trip, not one per pass. A pass-level race (closed since it was listed) costs
    /// at most one redundant projection.
    fn reindex_if_done(&mut self, reply: &GateReply) {
        let done = matches!(
            reply,
            GateReply::Effect {
                effect: EffectReport::Delivered
            } | GateReply::Dropped {
                effect: EffectReport::Delivered,
                ..
            }
        );
        if done && self.affords(1) {
            self.push_front(Step::Reindex { stale: true });
        }
    }

    /// The entry in hand got no usable answer because Gemini asks us to wait: a queue
    /// consumer sends it back with the entries it skips.
    fn ask_again_after_backoff(&mut self) {
        if let Some(entry) = self.entry.as_mut() {
            entry.skipped_poll = true;
        }
    }

    fn push_front(&mut self, step: Step) {
        if let Some(entry) = self.entry.as_mut() {
            entry.steps.push_front(step);
        }
    }
}
