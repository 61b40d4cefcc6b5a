//! The OperationGate's alarm run: performs, piece by piece, the work of
//! [`crate::operation::gate::alarm::AlarmPlan`] (after a batch's results' step, `results.rs`).
//!
//! Guarantees: nothing here decides what runs or in what order (the plan does); each await
//! is followed by a fresh read of the record, so commands that ran meanwhile are kept; the
//! alarm is set last, by the upkeep, for the record as it then stands. The job's effect is a
//! batch of one: `results.rs` performs it through the results' own plan
//! ([`crate::results::plan::ResultsPlan::job`]: the desk's turn, the claim stored with the
//! alarm at its expiry before the call leaves, the call, its answer committed under the
//! claim's fencing token, the desk's report), on the machine a batch's results use
//! (`desk_turn.rs`).

use worker::{Env, Response, Result};

use crate::config::Config;
use crate::operation::gate::alarm::{self, AlarmDone, AlarmWork, ConfirmAsk, Upkeep};
use crate::operation::gate::{GateLimits, Step};
use crate::operation::ledger::IndexWrite;
use crate::operation::{Operation, PendingAlert};
use crate::refusal::Refusal;
use crate::telemetry::counters::{self, StatEvent};

use crate::edge::objects::call::{status_backoff, status_slot};
use crate::edge::objects::gate::storage::{Alarm, GateStorage};
use crate::edge::objects::stats_shard;
use crate::edge::outbound::fetch::post_alert;
use crate::edge::outbound::ledger_kv::write_projection;
use crate::edge::outbound::status_api;
use crate::edge::runtime::{now_ms, random_unit};

/// One run of a gate's alarm: what it performs with, for as long as it runs.
pub(super) struct Run<'a> {
    pub(super) env: &'a Env,
    pub(super) storage: &'a GateStorage,
    pub(super) config: &'a Config,
    pub(super) limits: GateLimits,
}

impl<'a> Run<'a> {
    /// The alarm's work, as the plan says, for the record as each piece leaves it.
    pub(super) async fn perform(&self) -> Result<Response> {
        // The alarm that woke us is spent: whatever this run needs next must be set again.
        self.storage.forget_alarm();
        let config = self.config;
        let Some(op) = self.storage.load()? else {
            return Response::ok("empty");
        };
        // Retention's end comes before anything else, a batch's results included: nothing of
        // a retired operation runs again or stays due.
        if let Some(step) = alarm::retire_if_over(&op, now_ms(), &self.limits) {
            return self.retire(&op, step).await;
        }
        let Some(op) = self.ask_retired(op).await? else {
            return Response::ok("retired name: nothing ran");
        };
        let mut op = super::results::step(self.env, self.storage, config, op).await?;
        let limits = &self.limits;
        let status_api = config.gemini_api_key.is_some();
        let mut plan = alarm::plan(&op, now_ms(), limits);
        while let Some(work) = plan.next(&op, now_ms(), limits, status_api) {
            op = match work {
                AlarmWork::Retire(step) => return self.retire(&op, *step).await,
                AlarmWork::Confirm(ask) => self.confirm(op, ask).await?,
                AlarmWork::SendAlert { alert, body } => self.send_alert(op, &alert, &body).await?,
                AlarmWork::Effect => {
                    super::results::effect(self.env, self.storage, config, op).await?
                }
                AlarmWork::Upkeep { record, upkeep } => {
                    self.settle_storage(*record, *upkeep).await?
                }
                AlarmWork::SetAlarm => {
                    self.storage.sync_alarm(&op, limits).await?;
                    op
                }
            };
        }
        Response::ok("ok")
    }

    /// Commits an alarm step and returns the record (or `fallback` if the step left none);
    /// the counts it took out of the record then go to the isolate's tally.
    async fn apply(
        &self,
        mut step: Step<AlarmDone>,
        fallback: Operation,
        alarm: Alarm,
    ) -> Result<Operation> {
        let tally = std::mem::take(&mut step.tally);
        let (op, _) = self.storage.commit(step, &self.limits, alarm).await?;
        if !tally.is_empty() {
            self.hand_over(&tally).await;
        }
        Ok(op.unwrap_or(fallback))
    }

    /// Commits what `decide` makes of the record as it now stands (commands may have run
    /// during the await before), `op` if there is none.
    async fn decide(
        &self,
        op: Operation,
        alarm: Alarm,
        decide: impl FnOnce(Operation) -> Step<AlarmDone>,
    ) -> Result<Operation> {
        let current = self.storage.load()?.unwrap_or(op);
        self.apply(decide(current.clone()), current, alarm).await
    }

    /// Hands counted events to the isolate's tally ([`stats_shard::hand_over`]).
    async fn hand_over(&self, events: &[StatEvent]) {
        let every_ms = self.config.stats_flush_secs * 1_000;
        let (state, meter) = (self.storage.state(), self.storage.meter());
        stats_shard::hand_over(state, meter, self.env, events, now_ms(), every_ms).await;
    }

    /// Asks Gemini's status API about a nudge waiting for confirmation (unless the plan
    /// already knows the answer), in a slot of the one status budget the lease keeps (one
    /// object call), and stores what the answer decides; a 429 or 5xx is reported to the lease,
    /// so every status call backs off. Told to wait, the confirmation waits for its slot.
    async fn confirm(&self, op: Operation, ask: ConfirmAsk) -> Result<Operation> {
        let config = self.config;
        let (answer, asked) = match ask {
            ConfirmAsk::Answered(answer) => (answer, None),
            ConfirmAsk::Ask {
                collection,
                key,
                name,
            } => {
                let meter = self.storage.meter();
                let slot = status_slot(self.env, meter, config.reconcile_poll_rate).await;
                if let Some(until) = alarm::slot_wait(slot, now_ms(), &self.limits, random_unit()) {
                    let wait = |op| alarm::confirm_waits_for_slot(op, until, now_ms());
                    return self.decide(op, Alarm::Deferred, wait).await;
                }
                self.storage.meter().add(|u| u.outbound_fetches += 1);
                let (answer, asked) = status_api::ask(config, collection, &key, &name).await;
                let until = alarm::status_backoff_until(&answer, now_ms());
                status_backoff(self.env, meter, until).await;
                (answer, Some(asked))
            }
        };
        let mut current = self.storage.load()?.unwrap_or(op);
        current.count_status_call(counters::AskedBy::Nudge, asked, now_ms());
        let now = now_ms();
        let step = alarm::confirmed(current.clone(), answer, now, &self.limits, random_unit());
        self.apply(step, current, Alarm::Deferred).await
    }

    /// Sends one queued alert and stores whether the sink accepted it.
    async fn send_alert(
        &self,
        op: Operation,
        alert: &PendingAlert,
        body: &serde_json::Value,
    ) -> Result<Operation> {
        let config = self.config;
        self.storage.meter().add(|u| u.outbound_fetches += 1);
        let sent = post_alert(config, body).await;
        let step = |op| alarm::alert_sent(op, alert, sent, now_ms(), &self.limits, random_unit());
        self.decide(op, Alarm::Deferred, step).await
    }

    /// Last: hands the sealed events to the counters and projects the record to the ledger,
    /// both at once, then keeps how that went (and sets the alarm). Events with a drop go to
    /// this operation's shard, named (it lists each drop by its key, and counts a named batch
    /// once by sequence); the rest join the isolate's tally.
    async fn settle_storage(&self, op: Operation, upkeep: Upkeep) -> Result<Operation> {
        if upkeep.sealed.is_some() {
            // In memory only: commands during the flush must see the seal; a new instance
            // seals whatever it loads (`Operation::as_loaded`), so nothing is stored for it.
            self.storage.keep_in_memory(&op);
        }
        let flush = async {
            upkeep.sealed?;
            if !counters::sent_named(&upkeep.events) {
                self.hand_over(&upkeep.events).await;
                return Some(Ok(()));
            }
            self.storage.meter().add(|u| u.object_calls += 1);
            let shard = counters::shard_of(op.key());
            let key = Some(op.key().to_string());
            Some(stats_shard::add(self.env, shard, key, upkeep.events.clone()).await)
        };
        let write = async {
            let (p, index) = upkeep.projection.as_ref()?;
            let writes = if *index == IndexWrite::None { 1 } else { 2 };
            self.storage.meter().add(|u| u.kv_writes += writes);
            Some(write_projection(self.env, p, *index).await)
        };
        let (flushed, written) = futures_util::join!(flush, write);
        let text =
            |r: Option<std::result::Result<(), Refusal>>| r.map(|r| r.map_err(|e| e.to_string()));
        let (flushed, written) = (text(flushed), text(written));
        let step = |op| alarm::upkeep_done(op, &upkeep, flushed, written, now_ms());
        self.decide(op, Alarm::Sync, step).await
    }
}
