//! What a results step writes on the operation's record besides its due time: the settled
//! counts (the job's effect built with them, or, after it went out, a new generation when
//! they changed), the one `results_failing` alert, and `/metrics`' count of the results.
//!
//! Guarantees: each is stored with the step's commit (no await between, one write); nothing
//! here decides ([`crate::results::progress::Progress`] and
//! [`crate::operation::Operation::results_settled`] do).

use serde_json::Value;
use worker::Result;

use crate::operation::gate::log::GateLog;
use crate::operation::{AttemptOutcome, Operation};
use crate::results::item::ResultItem;
use crate::results::progress::{Metered, Progress};
use crate::telemetry::counters::{labelled, RESULT_TO_PREFIX};

use crate::edge::runtime::{log, now_ms};

use super::Driver;

/// How many of a step's answers were failures to retry.
pub(super) fn failed_among(answers: &[(ResultItem, AttemptOutcome)]) -> u64 {
    answers
        .iter()
        .filter(|(_, outcome)| matches!(outcome, AttemptOutcome::Retry(_)))
        .count() as u64
}

impl Driver<'_> {
    /// Counts what the progress metered for `/metrics` (`results_by_destination`), by
    /// destination, in the record: stored with the commit (no await between, one write),
    /// flushed by the alarm's upkeep.
    pub(super) fn count(&self, op: Operation, metered: Option<Metered>) -> Result<Operation> {
        let Some(m) = metered else {
            return Ok(op);
        };
        let mut op = self.storage.load()?.unwrap_or(op);
        let to = self.config.destination_label(op.kind());
        let now = now_ms();
        let ended = [
            ("delivered", m.delivered),
            ("failed", m.failed),
            ("parked", m.parked),
        ];
        for (result, n) in ended.into_iter().filter(|(_, n)| *n > 0) {
            op.count_by(
                labelled(RESULT_TO_PREFIX, &format!("{result}:{to}")),
                n,
                now,
            );
        }
        self.storage.save(&op)?;
        Ok(op)
    }

    /// Results kept failing past the alert threshold and were parked: the batch's one
    /// `results_failing` alert, naming how many, through the record's alerts.
    pub(super) fn alert_failing(
        &self,
        op: Operation,
        mut progress: Progress,
        n: u64,
    ) -> Result<Operation> {
        let mut op = self.storage.load()?.unwrap_or(op);
        op.results_gave_up(n, self.limits.alert_after_ms / 1_000, now_ms());
        self.storage.save(&op)?;
        progress.failing_alert_raised();
        self.store.save(&progress, Vec::new())?;
        Ok(op)
    }

    /// Every result is settled: the counts go on the record, and the job's effect is due
    /// (after it went out, as a new generation when the counts changed).
    pub(super) fn settled(&self, op: Operation, counts: Value) -> Result<Operation> {
        let mut op = self.storage.load()?.unwrap_or(op);
        if let Some(generation) = op.results_settled(counts, now_ms()) {
            let key = op.key().to_string();
            log(GateLog::ResultsRecounted { key, generation }.to_value());
        }
        self.storage.save(&op)?;
        Ok(op)
    }
}
