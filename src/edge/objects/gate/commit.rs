//! Storing what a step decided ([`crate::operation::gate::Step`]): its record and history
//! rows, its log lines, and the alarm for the record it leaves.
//!
//! Guarantees: history rows ride in the record's own write; a step that changed nothing
//! costs no storage call (not even for the alarm, unless it asks to repair one); a purge
//! deletes everything the object stores, then stores the tombstone it leaves. Nothing here decides: the step did.

use worker::Result;

use crate::config::Config;
use crate::operation::gate::{GateLimits, Save, Step};
use crate::operation::Operation;
use crate::retry::Backoff;

use crate::edge::objects::gate::storage::GateStorage;
use crate::edge::runtime::{log, now_ms};

/// Whether a committed step sets the alarm for the record it leaves.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Alarm {
    Sync,
    /// Inside the alarm, between its I/O steps: its last step (the upkeep) sets the alarm
    /// last, for the record as it then stands, so the steps before it need not. If the
    /// run dies in between, the alarm already set (a claim's expiry, or this one, retried by
    /// the runtime when the handler throws) wakes the object again.
    Deferred,
}

/// What the gate's steps need of the configuration.
pub(super) fn limits(config: &Config) -> GateLimits {
    GateLimits {
        retention_ms: config.retention_ms(),
        stats_delay_ms: config.stats_flush_secs * 1_000,
        claim_ttl_ms: config.claim_ttl_secs * 1_000,
        retry: Backoff::new(
            config.retry_base_secs * 1_000,
            config.retry_max_secs * 1_000,
        ),
        unregistered_hold_ms: config.unregistered_hold_ms(),
        confirm_interval_ms: config.confirm_interval_secs * 1_000,
    }
}

/// Stores what a step decided (its record, history rows, logs), sets the alarm for the
/// record as it now stands, and returns the record and the answer.
pub(super) async fn commit<R>(
    storage: &GateStorage,
    step: Step<R>,
    config: &Config,
    alarm: Alarm,
) -> Result<(Option<Operation>, R)> {
    let now = now_ms();
    if step.purge {
        storage.purge().await?;
        // The tombstone alone, with no history row; it never wakes (`deleteAll` deleted the
        // alarm), so no alarm call follows.
        if let Some(tombstone) = &step.record {
            storage.save(tombstone)?;
        }
        for line in step.logs {
            log(line.to_value());
        }
        return Ok((step.record, step.reply));
    }
    // History rows ride in the record's own write; a step that has rows but no write of its
    // own stores the record as it stands with them.
    let rows = storage.record(now, step.history);
    match (&step.record, step.save) {
        (Some(op), Save::Durable) => storage.save(op)?,
        (Some(op), Save::MemoryOnly) if rows => storage.save(op)?,
        (Some(op), Save::MemoryOnly) => storage.keep_in_memory(op),
        (Some(op), Save::Unchanged) if rows => storage.save(op)?,
        _ => {}
    }
    for line in step.logs {
        log(line.to_value());
    }
    if step.reset_alarm {
        storage.forget_alarm();
    }
    // A step that changed nothing needs no alarm call, unless asked to repair one.
    if let (Some(op), true) = (
        &step.record,
        (step.save != Save::Unchanged || step.reset_alarm) && alarm == Alarm::Sync,
    ) {
        storage.sync_alarm(op, &limits(config)).await?;
    }
    Ok((step.record, step.reply))
}
