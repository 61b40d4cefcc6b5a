//! What one decision of the gate is: the record after it, how the object keeps it, the history
//! rows, log lines and answer it carries ([`Step`]); and the settings decisions read
//! ([`GateLimits`]).
//!
//! Guarantees: a decision is a value, nothing more; the gate's Durable Object stores it as
//! [`Save`] says before it answers. The commands' steps and the alarm's pieces
//! ([`crate::operation::gate::alarm`]) both decide in this shape.

use crate::operation::gate::log::GateLog;
use crate::operation::gate::protocol::GateReply;
use crate::operation::history::HistoryEntry;
use crate::operation::Operation;
use crate::retry::Backoff;
use crate::telemetry::counters::StatEvent;

/// The settings a step needs, from the configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GateLimits {
    pub retention_ms: i64,
    pub stats_delay_ms: i64,
    pub claim_ttl_ms: i64,
    /// A side effect's, an alert's and a confirmation's retries:
    /// `EFFECT_RETRY_BASE_SECONDS` doubling to `EFFECT_RETRY_MAX_SECONDS`.
    pub retry: Backoff,
    /// See [`Operation::hold_for_registration`].
    pub unregistered_hold_ms: i64,
    /// `CONFIRM_INTERVAL_SECONDS` in ms: least time between a confirmation's questions.
    pub confirm_interval_ms: i64,
    /// How long an effect (or a batch's results) its desk queued waits before asking again,
    /// should the desk be lost ([`crate::config::Config::desk_fallback_ms`]).
    pub desk_fallback_ms: i64,
}

/// How the record is kept after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Save {
    /// Nothing changed.
    Unchanged,
    /// Kept in memory and stored with the next write or flush: only counts changed, of an
    /// operation nothing can change (a restart loses counts, never state), or only the mark of
    /// a ledger write that succeeded (a restart finds it not written, and writes it again).
    MemoryOnly,
    /// Stored before the answer (and before anything outbound is awaited).
    Durable,
}

/// What one step decided. `R` is its answer: a [`GateReply`] for a command, an
/// [`crate::operation::gate::alarm::AlarmDone`] for a piece of the alarm's work.
#[derive(Debug, Clone, PartialEq)]
pub struct Step<R = GateReply> {
    /// The record after the step (`None`: there is none).
    pub record: Option<Operation>,
    pub save: Save,
    /// History rows to insert.
    pub history: Vec<HistoryEntry>,
    /// Log lines to print.
    pub logs: Vec<GateLog>,
    pub reply: R,
    /// The answer carries the stored history (`Inspect`): the object reads and attaches it.
    pub attach_history: bool,
    /// Set the alarm again even if this instance believes it is set (repairs a lost one).
    pub reset_alarm: bool,
    /// Delete all of the object's storage, its alarm included, then store `record` alone (the
    /// tombstone, with no history) if there is one (retention ended).
    pub purge: bool,
    /// Counted events the step took out of the record
    /// ([`Operation::take_stats_for_tally`]): the object hands them to its isolate's tally
    /// once the record is stored without them.
    pub tally: Vec<StatEvent>,
}

impl<R> Step<R> {
    pub(crate) fn new(record: Option<Operation>, reply: R) -> Step<R> {
        Step {
            record,
            save: Save::Unchanged,
            history: Vec::new(),
            logs: Vec::new(),
            reply,
            attach_history: false,
            reset_alarm: false,
            purge: false,
            tally: Vec::new(),
        }
    }

    pub(crate) fn durable(mut self) -> Step<R> {
        self.save = Save::Durable;
        self
    }

    pub(crate) fn row(mut self, entry: HistoryEntry) -> Step<R> {
        self.history.push(entry);
        self
    }

    pub(crate) fn log(mut self, line: GateLog) -> Step<R> {
        self.logs.push(line);
        self
    }

    /// When the alarm must next fire for the record as it stands after the step.
    #[cfg(test)]
    pub fn wake_at(&self, limits: &GateLimits) -> Option<i64> {
        self.record
            .as_ref()
            .and_then(|op| op.wake_at_ms(limits.retention_ms, limits.stats_delay_ms))
    }
}
