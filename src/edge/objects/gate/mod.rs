//! The OperationGate Durable Object: one per operation key, the only place its state changes.
//!
//! Storage: the record and its history in one SQLite row, cached in memory, and one alarm
//! (see `storage.rs` and `tables.rs`): the earliest of a due side effect or retry, a lapsed
//! claim, a confirmation to ask, an alert to send, a ledger projection, counters to hand over
//! and the end of retention.
//!
//! Guarantees (docs/DESIGN.md, invariants 1, 3 and 7): every decision is a pure step of
//! [`crate::operation::gate`] (commands) or [`crate::operation::gate::alarm`] (the alarm's plan and
//! its pieces); this object only loads the record, calls a step, performs the I/O the alarm
//! needs (`alarm.rs`) and stores what the step says (`storage.rs`). Commands (deliveries,
//! nudges, registrations, operator actions) only decide and store: every read-decide-write
//! runs without an await in between, so it is atomic in the single-threaded object, and a
//! reply is sent only after the new state and the alarm that acts on it are stored, so no
//! answer waits on a destination, the status API or an alert sink. The alarm is the one runner
//! of everything outbound (side effects, status-API confirmations, alerts), so nothing is sent
//! by two runners at once; the runtime runs one alarm at a time per object. The side-effect
//! call is the only await between claim and commit, and the record is re-read after it, so the
//! fencing token decides who may commit; the claim is written (and the output gate makes it
//! durable) before the call leaves. A duplicate of a settled operation has no new state: it is
//! answered from memory, its count stored with the next write or flush, at most
//! `STATS_FLUSH_SECONDS` later (a restart in that window loses counts, never state). The
//! record is kept in memory after the first read; every write updates it. The KV projection
//! and the counter flush follow the record from the alarm, not while a claim is held (the
//! commit follows within the effect timeout), at most once a second for KV (its per-key write
//! rate), with backoff when KV fails; the counters go to the isolate's tally, which sends many
//! gates' counts in one shard call.

mod alarm;
pub(crate) mod desk_turn;
mod repair;
mod results;
mod results_admin;
mod results_store;
mod retirement;
mod storage;
mod tables;

use std::cell::Cell;

use worker::{durable_object, DurableObject, Env, Request, Response, Result, State};

use crate::config::Config;
use crate::operation::gate::alarm_failure;
use crate::operation::gate::log::GateLog;
use crate::operation::gate::protocol::{GateCommand, GateReply};
use crate::operation::gate::GateLimits;
use crate::refusal::Refusal;
use crate::retry::Backoff;
use crate::telemetry::usage::Invocation;

use crate::edge::error::bad_command;
use crate::edge::outbound::fetch::post_alert;
use crate::edge::runtime::{load_config, log, now_ms, random_unit};

use storage::{Alarm, GateStorage};

/// What the gate's steps need of the configuration.
fn limits(config: &Config) -> GateLimits {
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
        desk_fallback_ms: config.desk_fallback_ms(),
        effect_alert_after_ms: config.effect_alert_after_secs * 1_000,
    }
}

/// One operation's serialized owner.
#[durable_object]
pub struct OperationGate {
    env: Env,
    storage: GateStorage,
    /// A run of this instance's alarm failed and none has succeeded since.
    alarm_failing: Cell<bool>,
}

impl DurableObject for OperationGate {
    fn new(state: State, env: Env) -> Self {
        Self {
            env,
            storage: GateStorage::open(state),
            alarm_failing: Cell::new(false),
        }
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        let config = match load_config(&self.env) {
            Ok(c) => c,
            Err(e) => return Refusal::Config(e).into_response(),
        };
        let started = self.storage.meter().begin(config.usage_log);
        let mut command: GateCommand = match req.json().await {
            Ok(c) => c,
            Err(e) => return bad_command("gate command", e),
        };
        // An operator's repair runs before the record is loaded: loading is what it repairs.
        let repaired = match &command {
            GateCommand::Repair {
                key,
                name,
                reason,
                by,
            } => Some(
                repair::repair(&self.storage, key, name, reason, by.as_ref())?.unwrap_or(false),
            ),
            _ => None,
        };
        // Dispatched by command: a results command is answered from the results tables, and
        // only a registration may ask the retired names' shard; every other command (a
        // delivery among them) goes straight to its step.
        match &command {
            GateCommand::Results { state, cursor } => {
                let reply = results_admin::list(&self.storage, state, cursor.as_deref())?;
                return Response::from_json(&reply);
            }
            GateCommand::RetryResults {
                reason,
                dry_run,
                by,
            } => {
                let (storage, by) = (&self.storage, by.clone());
                let reply = results_admin::retry(storage, &config, reason, *dry_run, by).await?;
                return Response::from_json(&reply);
            }
            GateCommand::Register { key, name, .. } => {
                let asked = retirement::registration(&self.env, &self.storage, key, name).await?;
                if let Some(answer) = asked {
                    self.end(Invocation::Fetch, started);
                    return answer;
                }
            }
            _ => {}
        }
        let (now, limits) = (now_ms(), limits(&config));
        command.limit_new_records(now - config.retention_ms());
        command.limit_alerts(limits.effect_alert_after_ms);
        let step = crate::operation::gate::step(self.storage.load()?, command, now);
        let attach_history = step.attach_history;
        let (_, mut reply) = self.storage.commit(step, &limits, Alarm::Sync).await?;
        if let (true, GateReply::Found { history, .. }) = (attach_history, &mut reply) {
            *history = self.storage.history()?;
        }
        results_admin::annotate(&self.storage, &mut reply)?;
        if self.storage.take_recovered() {
            // The record was recovered on load: its alert waits for the alarm.
            if let Some(op) = self.storage.load()? {
                self.storage.sync_alarm(&op, &limits).await?;
            }
        }
        self.end(Invocation::Fetch, started);
        if let (Some(repaired), GateReply::Found { operation, history }) = (repaired, &reply) {
            return Response::from_json(&GateReply::Repaired {
                repaired,
                operation: operation.clone(),
                history: history.clone(),
            });
        }
        Response::from_json(&reply)
    }

    /// The one runner of everything outbound: performs the run
    /// [`crate::operation::gate::alarm::plan`] decides (a retirement, or a due confirmation, due
    /// alerts, a due side effect, then the ledger projection and the counters), each piece
    /// stored by its step before and after its I/O (the record is re-read after each await:
    /// commands may have run meanwhile); see `alarm.rs`.
    ///
    /// A run that fails (a configuration that does not parse, a storage error) never throws:
    /// the runtime would retry it only six times and then drop the alarm. It logs, stores its
    /// failure streak and sets the alarm again with capped backoff
    /// ([`crate::operation::gate::alarm_failure`]), so the work resumes once the fault clears,
    /// however long it lasted.
    async fn alarm(&self) -> Result<Response> {
        let run = match load_config(&self.env) {
            Ok(config) => {
                let started = self.storage.meter().begin(config.usage_log);
                let run = alarm::Run {
                    env: &self.env,
                    storage: &self.storage,
                    config: &config,
                    limits: limits(&config),
                };
                let answer = run.perform().await;
                self.end(Invocation::Alarm, started);
                answer.map_err(|e| e.to_string())
            }
            Err(e) => Err(format!("configuration: {e}")),
        };
        match run {
            Ok(answer) => {
                if self.alarm_failing.replace(false) {
                    let _ = self.storage.alarm_recovered().await;
                    log(GateLog::AlarmRecovered { key: self.key() }.to_value());
                }
                Ok(answer)
            }
            Err(error) => self.alarm_failed(&error).await,
        }
    }
}

impl OperationGate {
    /// The key of this gate's operation, when its record can be read (for log lines).
    fn key(&self) -> Option<String> {
        let loaded = || Some(self.storage.load().ok()??.key().to_string());
        self.storage.cached_key().or_else(loaded)
    }

    /// Records a failed alarm run and sets the alarm again after the streak's backoff. Only
    /// when even that cannot be stored does the handler throw (the runtime's retries are then
    /// all that is left).
    async fn alarm_failed(&self, error: &str) -> Result<Response> {
        let now = now_ms();
        let previous = self.storage.alarm_failures().await.unwrap_or(None);
        let (streak, retry_at) = alarm_failure::failed(previous, error, now, random_unit());
        self.alarm_failing.set(true);
        let key = self.key();
        log(GateLog::AlarmFailed {
            key: key.clone(),
            error: error.to_string(),
            failures: streak.failures,
            failing_since: crate::timestamp::format_rfc3339(streak.first_at_ms),
            retry_in_ms: retry_at - now,
        }
        .to_value());
        if alarm_failure::alerts_at(streak.failures) {
            // Best effort, and only when the configuration (the sink's address) can be read;
            // a later doubling of the streak alerts again.
            if let Ok(config) = load_config(&self.env) {
                // The object's id names it when its record cannot be read.
                let id = self.storage.state().id().to_string();
                let alert = alarm_failure::alert(&streak, key.as_deref(), &id, now);
                post_alert(&config, &alert).await;
            }
        }
        if let Err(e) = self.storage.alarm_failed(&streak, retry_at).await {
            if self.storage.alarm_set_at() != Some(retry_at) {
                return Err(worker::Error::RustError(format!(
                    "alarm failed ({error}) and could not be set again: {e}"
                )));
            }
        }
        Response::ok("alarm failed; set again")
    }

    /// Logs what this invocation used, when `USAGE_LOG` is on.
    fn end(&self, invocation: Invocation, started: i64) {
        let sql = self.storage.sql();
        self.storage.meter().end("gate", invocation, started, &sql);
    }
}
