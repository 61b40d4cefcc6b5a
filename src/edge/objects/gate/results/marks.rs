//! How a step stores what it decided (a [`Marking`] the plan names: a claim, a commit, a
//! failed read, the settled counts, an alert, its due time, a wait on the desk; the job's
//! claim, answer or wait), through the gate's commit, its history rows with the record's
//! write; a claim hands back the chunk, or the job's claim, it claimed.
//!
//! Guarantees: a decision is made on the record as stored now (commands may have run during
//! the step's awaits) by [`on_record::decide`], at the clock's time then, with the edge's
//! jitter; a results step's commit does not wait for the alarm (the alarm's upkeep sets it
//! last) and stores the step's progress with the record in one write; the job's claim (the
//! alarm at its expiry, before the send), its wait, and an answer that leaves work owed set the
//! alarm with their write ([`on_record::Decided::alarm_at_once`]); the counts a commit took
//! out of the record go to the isolate's tally once it is stored.

use worker::Result;

use crate::operation::Operation;
use crate::results::marks::{self as on_record, Claimed, Context, Marking};

use crate::edge::objects::gate::storage::Alarm;
use crate::edge::objects::stats_shard;
use crate::edge::runtime::{now_ms, random_unit};

use super::Driver;

impl Driver<'_> {
    /// Commits what `marking` makes of the record as stored now (else `op`), and returns it,
    /// with what it claimed, if anything; the counts the step took out of the record then go
    /// to the isolate's tally.
    pub(super) async fn commit(
        &self,
        op: Operation,
        marking: Box<Marking>,
    ) -> Result<(Operation, Option<Claimed>)> {
        let current = self.storage.load()?.unwrap_or(op);
        let to = self.config.destination_label(current.kind());
        let cx = Context {
            limits: &self.limits,
            gate: &self.gate,
            to: &to,
        };
        let clock = (now_ms(), random_unit);
        let mut decided = on_record::decide(*marking, current.clone(), &cx, clock);
        let alarm = match decided.alarm_at_once {
            true => Alarm::Sync,
            false => Alarm::Deferred,
        };
        let tally = std::mem::take(&mut decided.step.tally);
        let (stored, ()) = self.storage.commit(decided.step, &self.gate, alarm).await?;
        if !tally.is_empty() {
            let every_ms = self.config.stats_flush_secs * 1_000;
            let (state, meter) = (self.storage.state(), self.storage.meter());
            stats_shard::hand_over(state, meter, self.env, &tally, now_ms(), every_ms).await;
        }
        Ok((stored.unwrap_or(current), decided.claimed))
    }
}
