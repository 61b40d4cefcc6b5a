//! How a results step stores what it decided (a [`Marking`] the plan names: a claim, a
//! commit, a failed read, the settled counts, an alert, its due time, a wait on the desk),
//! through the gate's commit, its history rows with the record's write; a claim hands back the
//! chunk it claimed.
//!
//! Guarantees: a decision is made on the record as stored now (commands may have run during
//! the step's awaits) by [`on_record::decide`], at the clock's time then, with the edge's
//! jitter; its commit does not wait for the alarm (the alarm's upkeep sets it last), so it
//! does not await, and stores the step's progress with the record in one write.

use worker::Result;

use crate::operation::Operation;
use crate::results::marks::{self as on_record, Context, Marking};
use crate::results::progress::ChunkClaim;

use crate::edge::objects::gate::storage::Alarm;
use crate::edge::runtime::{now_ms, random_unit};

use super::Driver;

impl Driver<'_> {
    /// Commits what `marking` makes of the record as stored now (else `op`), and returns it,
    /// with the chunk claimed when it claims one.
    pub(super) async fn commit(
        &self,
        op: Operation,
        marking: Box<Marking>,
    ) -> Result<(Operation, Option<ChunkClaim>)> {
        let current = self.storage.load()?.unwrap_or(op);
        let to = self.config.destination_label(current.kind());
        let cx = Context {
            limits: &self.limits,
            desk_fallback_ms: self.gate.desk_fallback_ms,
            to: &to,
        };
        let clock = (now_ms(), random_unit);
        let (step, claim) = on_record::decide(*marking, current.clone(), &cx, clock);
        let (stored, ()) = self
            .storage
            .commit(step, &self.gate, Alarm::Deferred)
            .await?;
        Ok((stored.unwrap_or(current), claim))
    }
}
