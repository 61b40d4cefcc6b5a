//! How a desk's alarm releases what waits: one probe while the destination is open, a batch
//! while it drains.
//!
//! Guarantees: a key is taken out of `waiting` before its gate is called and put back when
//! the gate cannot be reached, so it is released once; a probe whose gate cannot be reached
//! moves that key back by its own backoff and tries the next due key instead, and a run that
//! releases no probe counts as a failed probe, so the alarm never spins on one gate.

use futures_util::future::join_all;
use worker::Result;

use crate::destination::desk::Desk;
use crate::operation::gate::protocol::{EffectReport, GateCommand, GateReply};

use crate::edge::objects::call::call_gate;

use serde::Deserialize;

use super::DestinationDesk;

#[derive(Deserialize)]
struct KeyRow {
    key: String,
}

/// Keys a probe may try in one run (gates that no longer owe their effect, or that cannot be
/// reached).
const PROBE_TRIES: u32 = 5;

impl DestinationDesk {
    /// Releases the soonest due waiting key as the probe. A gate that no longer owes its
    /// effect drops its key; one that cannot be reached moves its key back by the key's own
    /// backoff; either way the next due key is tried, a few at most per run.
    pub(super) async fn probe(&self, now: i64) -> Result<()> {
        let mut missed = false;
        let rows = self.due(now, PROBE_TRIES)?;
        for row in &rows {
            self.forget("waiting", &row.key)?;
            let mut desk = self.load()?;
            desk.released(&row.key, true, now);
            self.save(&desk)?;
            let answer = self.ready(&row.key, true).await;
            let mut desk = self.load()?;
            if answer.is_some() {
                self.forget("misses", &row.key)?;
            }
            match answer {
                Some(true) => return Ok(()),
                Some(false) => {}
                None => {
                    missed = true;
                    self.missed(&row.key, &desk, now)?;
                }
            }
            desk.probe = None;
            self.save(&desk)?;
        }
        if missed || rows.is_empty() {
            // Nothing was released: the next probe waits its backoff, never at once.
            let mut desk = self.load()?;
            desk.probe_missed(now);
            self.save(&desk)?;
        }
        Ok(())
    }

    /// Counts one more release that could not reach `key`'s gate, and queues the key again
    /// after its own backoff.
    fn missed(&self, key: &str, desk: &Desk, now: i64) -> Result<()> {
        let query =
            "INSERT INTO misses (key, n) VALUES (?, 1) ON CONFLICT(key) DO UPDATE SET n = n + 1";
        self.exec(query, vec![key.into()])?;
        let misses = self.n_of_key("SELECT n FROM misses WHERE key = ?", key)?;
        let misses = misses.map_or(1, |n| n.clamp(1, 64) as u32);
        self.enqueue(key, now + desk.probe_backoff().after(misses))
    }

    /// Up to `n` waiting keys due by `now`, soonest first.
    fn due(&self, now: i64, n: u32) -> Result<Vec<KeyRow>> {
        let query = "SELECT key FROM waiting WHERE due_ms <= ? ORDER BY due_ms, key LIMIT ?";
        let bindings = vec![(now as f64).into(), f64::from(n).into()];
        self.state.storage().sql().exec(query, bindings)?.to_array()
    }

    /// Releases the `n` soonest due waiting keys at once (their tokens are taken); a key whose
    /// gate cannot be reached is due again after its own backoff.
    pub(super) async fn drain(&self, n: u32, now: i64) -> Result<()> {
        let rows = self.due(now, n)?;
        let desk = self.load()?;
        for row in &rows {
            self.forget("waiting", &row.key)?;
            if desk.pace().limits() {
                self.take_slot(&row.key, &desk, now)?;
            }
        }
        let answers = join_all(rows.iter().map(|r| self.ready(&r.key, false))).await;
        for (row, answer) in rows.iter().zip(answers) {
            if answer != Some(true) {
                self.forget("slots", &row.key)?;
            }
            match answer {
                Some(_) => self.forget("misses", &row.key)?,
                None => self.missed(&row.key, &desk, now)?,
            }
        }
        Ok(())
    }

    /// Tells the gate of `key` its effect is released: `Some(true)` when it owes it (now due),
    /// `Some(false)` when it owes nothing, `None` when it could not be reached.
    async fn ready(&self, key: &str, probe: bool) -> Option<bool> {
        match call_gate(&self.env, key, &GateCommand::DestinationReady { probe }).await {
            Ok(GateReply::Effect { effect }) => Some(matches!(
                effect,
                EffectReport::Scheduled | EffectReport::RetryScheduled | EffectReport::InFlight
            )),
            Ok(_) => Some(false),
            Err(_) => None,
        }
    }
}
