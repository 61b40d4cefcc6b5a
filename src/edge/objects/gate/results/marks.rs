//! How a results step stores what it decided ([`crate::results::marks`]: a claim, a commit, a
//! failed read, the settled counts, an alert, its due time, a wait on the desk): through the
//! gate's commit, its history rows with the record's write; a step that answers something (a
//! claim: the chunk it claimed) hands it back.
//!
//! Guarantees: a decision is made on the record as stored now (commands may have run during
//! the step's awaits); its commit does not wait for the alarm (the alarm's upkeep sets it
//! last), so it does not await, and stores the step's progress with the record in one write.

use worker::Result;

use crate::operation::gate::Step;
use crate::operation::Operation;
use crate::results::marks::Marked;
use crate::results::progress::ProgressWrite;

use crate::edge::objects::gate::storage::Alarm;

use super::Driver;

impl Driver<'_> {
    /// Commits what `decide` makes of the record as stored now (else `op`), and returns it.
    pub(super) async fn mark(
        &self,
        op: Operation,
        decide: impl FnOnce(Operation) -> Marked,
    ) -> Result<Operation> {
        Ok(self.decide(op, decide).await?.0)
    }

    /// As [`Driver::mark`], with the step's answer (a claim's: the chunk it claimed).
    pub(super) async fn decide<R>(
        &self,
        op: Operation,
        decide: impl FnOnce(Operation) -> Step<R, ProgressWrite>,
    ) -> Result<(Operation, R)> {
        let current = self.storage.load()?.unwrap_or(op);
        let step = decide(current.clone());
        let (stored, answer) = self
            .storage
            .commit(step, &self.gate, Alarm::Deferred)
            .await?;
        Ok((stored.unwrap_or(current), answer))
    }
}
