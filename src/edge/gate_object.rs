//! The OperationGate Durable Object: one per operation key, the only place its state changes.
//!
//! Storage (SQLite): `operation(id = 1, body)` holds the record as JSON (see
//! [`crate::operation::Operation`]; after retention, a tombstone); `history(seq, at_ms,
//! entry)` keeps the newest [`HISTORY_LIMIT`] events applied and dropped, nudges and their
//! confirmations, claims, attempts, alerts and operator actions (trimmed in steps of
//! [`TRIM_EVERY`]). One alarm: the earliest of a due side effect or retry, a lapsed claim, a
//! confirmation to ask, an alert to send, a deferred ledger projection, counters to flush and
//! the end of retention.
//!
//! Guarantees: commands (deliveries, nudges, registrations, operator actions) only decide and
//! store: every read-decide-write runs without an await in between, so it is atomic in the
//! single-threaded object, and a reply is sent only after the new state and the alarm that
//! acts on it are stored, so no answer waits on a destination, the status API or an alert
//! sink. The alarm is the one runner of everything outbound (side effects, status-API
//! confirmations, alerts), so nothing is sent by two runners at once; the runtime runs one
//! alarm at a time per object. The side-effect call is the only await between claim and
//! commit, and the record is re-read after it, so the fencing token decides who may commit;
//! the claim is written (and the output gate makes it durable) before the call leaves. A
//! duplicate of a settled operation has no new state: it is answered from memory, its count
//! stored with the next write or flush, at most `STATS_FLUSH_SECONDS` later (a restart in
//! that window loses counts, never state). The record is kept in memory after the first read;
//! every write updates it. The KV projection and the counter flush follow the record from the
//! alarm, not while a claim is held (the commit follows within the effect timeout), at most
//! once a second for KV (its per-key write rate), with backoff when KV fails.

use std::cell::{Cell, RefCell};

use serde::Deserialize;
use serde_json::{json, Value};
use worker::wasm_bindgen::JsValue;
use worker::{
    durable_object, Date, DurableObject, Env, Request, Response, Result, ScheduledTime,
    State,
};

use crate::alert::{alert_body, UNKNOWN_TO_GEMINI};
use crate::config::Config;
use crate::effect::{build_request, classify};
use crate::gate_protocol::{EffectReport, GateCommand, GateReply};
use crate::key::Collection;
use crate::ledger::project;
use crate::lifecycle::{reduce, DropReason, Position, Source, Status, Verdict};
use crate::operation::{backoff_ms, AttemptOutcome, Finished, KindFill, OpEvent, Operation};
use crate::stats;
use crate::status::StatusError;

use super::ledger_kv::{write_projection, KV_BINDING};
use super::outbound::{post_alert, Answer};
use super::{destination, load_config, log, random_unit, status_api};

/// History rows kept per operation; older rows are deleted.
const HISTORY_LIMIT: i64 = 200;
/// History is trimmed on the first insert of each object instance and every this many
/// inserts after, not on every insert (a DELETE per duplicate delivery measurably cost), so
/// at most `HISTORY_LIMIT + TRIM_EVERY - 1` rows exist.
const TRIM_EVERY: u32 = 50;

/// One operation's serialized owner.
#[durable_object]
pub struct OperationGate {
    state: State,
    env: Env,
    /// The alarm time this instance last set, so an unchanged wake time costs no storage
    /// call; `None` when unknown (a new instance, or inside the alarm, which consumes it).
    alarm_at: Cell<Option<i64>>,
    /// History rows inserted by this instance, for trimming every [`TRIM_EVERY`].
    inserts: Cell<u32>,
    /// The record, kept after the first read (`Some(None)`: there is none). Every write goes
    /// through [`OperationGate::save`], so it equals storage, except for counts of settled
    /// duplicates not stored yet (see `Deliver`).
    cached: RefCell<Option<Option<Operation>>>,
}

#[derive(Deserialize)]
struct BodyRow {
    body: String,
}

fn now_ms() -> i64 {
    Date::now().as_millis() as i64
}

impl DurableObject for OperationGate {
    fn new(state: State, env: Env) -> Self {
        let sql = state.storage().sql();
        for ddl in [
            "CREATE TABLE IF NOT EXISTS operation (id INTEGER PRIMARY KEY CHECK (id = 1), body TEXT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS history (seq INTEGER PRIMARY KEY AUTOINCREMENT, at_ms INTEGER NOT NULL, entry TEXT NOT NULL)",
        ] {
            if let Err(e) = sql.exec(ddl, None) {
                log(json!({"event": "gate_schema_error", "error": e.to_string()}));
            }
        }
        Self {
            state,
            env,
            alarm_at: Cell::new(None),
            inserts: Cell::new(0),
            cached: RefCell::new(None),
        }
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        let config = match load_config(&self.env) {
            Ok(c) => c,
            Err(e) => return Response::error(format!("configuration: {e}"), 503),
        };
        let command: GateCommand = match req.json().await {
            Ok(c) => c,
            Err(e) => return Response::error(format!("bad gate command: {e}"), 400),
        };
        let reply = self.handle(command, &config).await?;
        Response::from_json(&reply)
    }

    async fn alarm(&self) -> Result<Response> {
        // The alarm that woke us is spent: whatever this run needs next must be set again.
        self.alarm_at.set(None);
        let config = match load_config(&self.env) {
            Ok(c) => c,
            // Throwing makes the runtime retry the alarm once configuration is fixed.
            Err(e) => return Err(worker::Error::RustError(format!("configuration: {e}"))),
        };
        let Some(op) = self.load()? else {
            return Response::ok("empty");
        };
        let now = now_ms();
        if op
            .expires_at_ms(config.retention_ms())
            .is_some_and(|t| t <= now)
        {
            // Retention is over: the KV entry expires on its own TTL; a tombstone stays, so a
            // delivery that comes later is a duplicate and runs nothing.
            let mut op = op;
            self.state
                .storage()
                .sql()
                .exec("DELETE FROM history", None)?;
            op.retire(now);
            self.save(&op)?;
            self.record(now, json!({"what": "retired"}))?;
            self.sync_alarm(&op, &config).await?;
            log(json!({"event": "retention_expired", "key": op.key}));
            return Response::ok("retention expired");
        }
        let op = self.confirm_if_due(op, &config).await?;
        let op = self.send_due_alerts(op, &config).await?;
        // The effect first, so the flush and the ledger write that follow carry its outcome.
        let op = self.drive_effect(op, &config).await?;
        self.settle_storage(op, &config).await?;
        Response::ok("ok")
    }
}

impl OperationGate {
    async fn handle(&self, command: GateCommand, config: &Config) -> Result<GateReply> {
        let now = now_ms();
        match command {
            GateCommand::Register { key, name, kind } => {
                if let Some(mut op) = self.load()? {
                    // The completion may have come first (short interactions often do): the
                    // registration fills in the kind, so later attempts route by it.
                    let fill = op.fill_kind(kind.as_deref());
                    if fill == KindFill::Filled {
                        self.save(&op)?;
                        self.record(now, json!({"what": "kind_filled", "kind": op.kind}))?;
                        self.sync_alarm(&op, config).await?;
                    }
                    return Ok(GateReply::Exists {
                        operation: op.view(),
                        kind: fill.as_str().to_string(),
                    });
                }
                let op = Operation::register(&key, &name, kind, now);
                self.save(&op)?;
                self.record(now, json!({"what": "registered", "kind": op.kind}))?;
                let view = op.view();
                self.sync_alarm(&op, config).await?;
                Ok(GateReply::Created { operation: view })
            }
            GateCommand::Deliver {
                key,
                name,
                event,
                require_registration,
            } => {
                let existing = self.load()?;
                let mut op = match existing {
                    Some(op) => op,
                    None if require_registration => return Ok(GateReply::IgnoredUnregistered),
                    None => Operation::unregistered(&key, &name, now),
                };
                let verdict = op.apply(&event, now);
                count_delivery(&mut op, &event, verdict, now, true);
                if verdict == Verdict::Drop(DropReason::Duplicate) && op.is_settled() {
                    // Nothing can change a settled operation, so nothing needs storing: the
                    // answer is the stored state. The count stays in memory until the next
                    // write or the flush alarm (set here if none is due sooner); a restart
                    // in between loses counts, never state. No history row: the worker logs
                    // the duplicate with its webhook-id. This is what lets a duplicate cost
                    // a round trip and no durable write (docs/PERFORMANCE.md).
                    let status = op.status.as_str().to_string();
                    self.cached.replace(Some(Some(op.clone())));
                    self.sync_alarm(&op, config).await?;
                    return Ok(GateReply::Dropped {
                        reason: DropReason::Duplicate.as_str().to_string(),
                        status,
                        effect: EffectReport::NotOwed,
                    });
                }
                // The decision and its count in one write; the side effect (if now owed) is
                // scheduled on the alarm, which is set before the answer: the answer never
                // waits on the destination.
                self.save(&op)?;
                self.record(now, history_of_event(&event, verdict))?;
                self.sync_alarm(&op, config).await?;
                let status = op.status.as_str().to_string();
                let effect = effect_report(&op, now);
                Ok(match verdict {
                    Verdict::Apply => GateReply::Applied { status, effect },
                    Verdict::Drop(reason) => GateReply::Dropped {
                        reason: reason.as_str().to_string(),
                        status,
                        effect,
                    },
                })
            }
            GateCommand::Nudge {
                key,
                name,
                claimed,
                metadata,
                delivery_id,
                require_registration,
            } => {
                let mut op = match self.load()? {
                    Some(op) => op,
                    None if require_registration => return Ok(GateReply::IgnoredUnregistered),
                    None => Operation::unregistered(&key, &name, now),
                };
                op.count(stats::DELIVERIES, now);
                if !op.request_confirmation(now, metadata, Some(delivery_id.clone())) {
                    // Terminal already: it absorbs, so no answer from Gemini could change it.
                    let claimed = Position {
                        status: Status::parse(&claimed),
                        update_time_ms: 0,
                    };
                    let reason = match reduce(&op_position(&op), &claimed) {
                        Verdict::Drop(reason) => reason,
                        Verdict::Apply => DropReason::Duplicate,
                    };
                    return self.answer_dropped(op, reason, config).await;
                }
                self.save(&op)?;
                self.record(
                    now,
                    json!({"what": "nudged", "claimed": claimed, "delivery_id": delivery_id}),
                )?;
                self.sync_alarm(&op, config).await?;
                Ok(GateReply::Confirming {
                    status: op.status.as_str().to_string(),
                })
            }
            GateCommand::RetryEffect => {
                // The alarm runs the effect if due: the backoff stands, and a lost alarm is
                // repaired because sync_alarm sets it again.
                let Some(op) = self.load()? else {
                    return Ok(GateReply::NotFound);
                };
                self.alarm_at.set(None);
                self.sync_alarm(&op, config).await?;
                Ok(GateReply::Effect {
                    effect: effect_report(&op, now),
                })
            }
            GateCommand::Alert { alert, age_seconds } => {
                let Some(mut op) = self.load()? else {
                    return Ok(GateReply::NotFound);
                };
                if !op.raise_alert(&alert, age_seconds, now) {
                    return Ok(GateReply::AlertSent { sent: false });
                }
                // Queued in the record and sent by the alarm, the one runner of alerts (two
                // runners would send it twice): if the object dies during the send, the next
                // alarm sends it again, under the same alert id.
                self.save(&op)?;
                self.sync_alarm(&op, config).await?;
                Ok(GateReply::AlertSent { sent: true })
            }
            GateCommand::Redeliver { reason } => {
                let Some(mut op) = self.load()? else {
                    return Ok(GateReply::NotFound);
                };
                // An effect not done may have reached the destination already: it is retried
                // under its own webhook-id, never given a new one.
                let retried = !op.effect.done;
                let outcome = if retried {
                    op.retry_now(now).map(|()| op.effect.generation)
                } else {
                    op.redeliver(now, &reason)
                };
                let generation = match outcome {
                    Ok(g) => g,
                    Err(refusal) => {
                        return Ok(GateReply::Refused {
                            reason: refusal.as_str().to_string(),
                        })
                    }
                };
                let action = if retried { "retry_now" } else { "redeliver" };
                if !retried {
                    op.count(stats::REDELIVERIES, now);
                }
                self.save(&op)?;
                self.record(
                    now,
                    json!({"what": action, "generation": generation, "reason": reason}),
                )?;
                log(
                    json!({"event": action, "key": op.key, "generation": generation, "reason": reason}),
                );
                self.alarm_at.set(None);
                self.sync_alarm(&op, config).await?;
                Ok(GateReply::Redelivered {
                    generation,
                    action: action.to_string(),
                    effect: effect_report(&op, now),
                })
            }
            GateCommand::RetryNow { reason } => {
                let Some(mut op) = self.load()? else {
                    return Ok(GateReply::NotFound);
                };
                if let Err(refusal) = op.retry_now(now) {
                    return Ok(GateReply::Refused {
                        reason: refusal.as_str().to_string(),
                    });
                }
                let generation = op.effect.generation;
                self.save(&op)?;
                self.record(
                    now,
                    json!({"what": "retry_now", "generation": generation, "reason": reason}),
                )?;
                log(json!({"event": "retry_now", "key": op.key, "generation": generation, "reason": reason}));
                self.alarm_at.set(None);
                self.sync_alarm(&op, config).await?;
                Ok(GateReply::Redelivered {
                    generation,
                    action: "retry_now".to_string(),
                    effect: effect_report(&op, now),
                })
            }
            GateCommand::Forget { reason } => {
                let Some(mut op) = self.load()? else {
                    return Ok(GateReply::NotFound);
                };
                let changed = op.forget(now, &reason);
                if changed {
                    self.save(&op)?;
                    self.record(now, json!({"what": "forgotten", "reason": reason}))?;
                    log(json!({"event": "forgotten_by_operator", "key": op.key, "reason": reason}));
                }
                self.sync_alarm(&op, config).await?;
                Ok(GateReply::Forgotten { changed })
            }
            GateCommand::Inspect => match self.load()? {
                Some(op) => Ok(GateReply::Found {
                    operation: op.view(),
                    history: self.history()?,
                }),
                None => Ok(GateReply::NotFound),
            },
        }
    }

    /// Claims, runs and commits the side effect if it is owed and due: called only from the
    /// alarm, the one runner of side effects. Returns the record as it stands afterwards
    /// (re-read: other requests may have run during the call).
    async fn drive_effect(&self, mut op: Operation, config: &Config) -> Result<Operation> {
        let now = now_ms();
        let Some(claim) = op.claim(now, config.claim_ttl_secs * 1_000) else {
            return Ok(op);
        };
        self.save(&op)?;
        self.record(
            now,
            json!({"what": "claimed", "token": claim.token, "attempt": op.effect.attempts}),
        )?;
        // The alarm at the claim's expiry retries the effect if this call never returns.
        self.sync_alarm(&op, config).await?;

        let destination = config.destination_for(op.kind.as_deref());
        let request = build_request(&op, &config.effect_signing_secret, now / 1_000);
        let started = now_ms();
        let answer =
            destination::deliver(&self.env, &destination, &request, config.effect_timeout_ms).await;
        let outcome = match &answer {
            Answer::Http {
                status, excerpt, ..
            } => classify(*status, excerpt),
            Answer::Timeout => {
                AttemptOutcome::Retry(format!("timeout after {} ms", config.effect_timeout_ms))
            }
            Answer::Network(e) => AttemptOutcome::Retry(format!("network: {e}")),
        };
        let finished_at = now_ms();

        let mut op = self.load()?.unwrap_or(op);
        let backoff = backoff_ms(
            op.effect.failures_in_row,
            config.retry_base_secs,
            config.retry_max_secs,
            random_unit(),
        );
        let finished = op.finish(claim.token, &outcome, finished_at, backoff);
        let label = match &finished {
            Finished::Done => "effect_delivered",
            Finished::RetryAt(_) => "effect_failed",
            Finished::Parked => "effect_parked",
            Finished::Fenced => "effect_fenced",
        };
        if finished != Finished::Fenced {
            op.count(label_stat(&finished), finished_at);
            self.save(&op)?;
        }
        let answer_text = match &outcome {
            AttemptOutcome::Delivered => "2xx".to_string(),
            AttemptOutcome::Retry(a) | AttemptOutcome::Park(a) => a.clone(),
        };
        self.record(finished_at, json!({"what": "attempt", "token": claim.token, "result": label, "answer": answer_text, "ms": finished_at - started}))?;
        log(json!({
            "event": label,
            "key": op.key,
            "status": op.status.as_str(),
            "attempt": op.effect.attempts,
            "generation": op.effect.generation,
            "answer": answer_text,
            "ms": finished_at - started,
            // From the outcome's settlement (just before the delivery was answered) to this
            // attempt's start: the answer never waits for it; the benchmark reports it.
            "after_settled_ms": op.settled_at_ms.map(|t| started - t),
            "next_attempt_ms": matches!(finished, Finished::RetryAt(_)).then_some(op.effect.next_attempt_ms),
        }));
        Ok(op)
    }

    /// Sends every queued alert that is due, one at a time; the sink's acceptance is what
    /// takes an alert off the queue (a failure waits with backoff, and the alarm retries).
    async fn send_due_alerts(&self, mut op: Operation, config: &Config) -> Result<Operation> {
        for alert in op.due_alerts(now_ms()) {
            let body = alert_body(&alert.kind, &alert.id, &op, alert.age_seconds);
            let sent = post_alert(config, &body).await;
            let now = now_ms();
            op = self.load()?.unwrap_or(op);
            if sent {
                op.alert_delivered(&alert.kind);
                op.count(stats::ALERTS, now);
                self.record(
                    now,
                    json!({"what": "alert", "alert": alert.kind, "alert_id": alert.id}),
                )?;
            } else {
                let wait = backoff_ms(
                    alert.attempts + 1,
                    config.retry_base_secs,
                    config.retry_max_secs,
                    random_unit(),
                );
                op.alert_failed(&alert.kind, now, wait);
            }
            self.save(&op)?;
        }
        Ok(op)
    }

    /// From the alarm: asks Gemini's status API about a dynamic-webhook delivery waiting for
    /// confirmation and applies what it says, through the reducer, as settled by `webhook`.
    /// The record is re-read after the call (other requests may have run meanwhile).
    async fn confirm_if_due(&self, op: Operation, config: &Config) -> Result<Operation> {
        let now = now_ms();
        if !op.confirmation_due(now) {
            return Ok(op);
        }
        let attempts = op.confirmation.as_ref().map_or(0, |c| c.attempts);
        let wait = backoff_ms(
            attempts + 1,
            config.retry_base_secs,
            config.retry_max_secs,
            random_unit(),
        );
        let answer = match (Collection::of_key(&op.key), &config.gemini_api_key) {
            (None, _) => Err(StatusError::Malformed("key has no collection".into())),
            // Without a key Gemini would refuse; wait for an operator to set one.
            (Some(_), None) => Err(StatusError::Transient {
                retry_after_secs: 0,
            }),
            (Some(collection), Some(_)) => {
                status_api::ask(config, collection, &op.key, &op.name).await
            }
        };
        let now = now_ms();
        let mut op = self.load()?.unwrap_or(op);
        match answer {
            Ok(observation) if !matches!(observation.status, Status::Unknown(_)) => {
                let event = OpEvent {
                    status: observation.status,
                    update_time_ms: observation.update_time_ms,
                    source: Source::Webhook,
                    details: observation.details,
                    delivery_id: None,
                };
                let verdict = op.confirm_with(event.clone(), now, wait);
                count_delivery(&mut op, &event, verdict, now, false);
                self.record(now, history_of_event(&event, verdict))?;
                log(json!({"event": "confirmed", "key": op.key, "status": event.status.as_str(),
                    "verdict": verdict_label(verdict), "still_confirming": op.confirmation.is_some()}));
            }
            Ok(observation) => {
                log(json!({"event": "status_unknown_state", "key": op.key, "state": observation.status.as_str()}));
                op.confirmation_failed(now, wait);
            }
            Err(StatusError::NotFound) => {
                op.confirmation_gone();
                let age = (now - op.submitted_at_ms).div_euclid(1_000);
                op.raise_alert(UNKNOWN_TO_GEMINI, age, now);
                self.record(now, json!({"what": "confirm_not_found"}))?;
                log(json!({"event": "status_not_found", "key": op.key, "path": "confirmation"}));
            }
            Err(e) => {
                let wait = match e {
                    StatusError::Transient { retry_after_secs } => {
                        wait.max(retry_after_secs.saturating_mul(1_000))
                    }
                    _ => wait,
                };
                op.confirmation_failed(now, wait);
                let error = match (&e, &config.gemini_api_key) {
                    (_, None) => "GEMINI_API_KEY is not set".to_string(),
                    (e, _) => format!("{e:?}"),
                };
                log(json!({"event": "confirm_waiting", "key": op.key, "error": error, "retry_in_ms": wait}));
            }
        }
        self.save(&op)?;
        Ok(op)
    }

    /// Answers a delivery that changes nothing (a duplicate or another dropped event on a
    /// terminal operation). A settled operation stores nothing: its count waits in memory.
    async fn answer_dropped(
        &self,
        op: Operation,
        reason: DropReason,
        config: &Config,
    ) -> Result<GateReply> {
        let now = now_ms();
        let mut op = op;
        match reason {
            DropReason::Duplicate => op.count(stats::DUPLICATES, now),
            other => op.count(&format!("dropped_{}", other.as_str()), now),
        }
        if reason == DropReason::Duplicate && op.is_settled() {
            self.cached.replace(Some(Some(op.clone())));
        } else {
            self.save(&op)?;
        }
        self.sync_alarm(&op, config).await?;
        Ok(GateReply::Dropped {
            reason: reason.as_str().to_string(),
            status: op.status.as_str().to_string(),
            effect: effect_report(&op, now),
        })
    }

    /// From the alarm: sends counted events to this operation's stats shard and projects the
    /// record to the ledger if it changed (at most once a second), both at once, then stores
    /// the outcome in one write and sets the alarm for whatever is pending next. A failed
    /// flush keeps its events (sealed) and a failed ledger write keeps the gate the truth;
    /// the alarm tries both again.
    async fn settle_storage(&self, mut op: Operation, config: &Config) -> Result<()> {
        let now = now_ms();
        // Sealed and stored before the call: counts made while it is in flight go to new
        // events, so what the shard receives is never changed afterwards.
        let sealed = op.seal_stats();
        if sealed.is_some() {
            self.save(&op)?;
        }
        // Only the alarm projects, and one alarm runs at a time: two writes never race in KV.
        let projection = (op.projected_version < op.version && now >= op.projection_due_ms())
            .then(|| project(&op, config.retention_ms() / 1_000));
        if sealed.is_none() && projection.is_none() {
            return self.sync_alarm(&op, config).await;
        }
        let flush = async {
            match sealed {
                None => None,
                Some(_) => Some(
                    super::stats::add(
                        &self.env,
                        stats::shard_of(&op.key),
                        Some(op.key.clone()),
                        op.pending_stats.clone(),
                    )
                    .await,
                ),
            }
        };
        let write = async {
            match &projection {
                None => None,
                Some(p) => Some(match self.env.kv(KV_BINDING) {
                    Ok(kv) => write_projection(&kv, p).await,
                    Err(e) => Err(e.to_string()),
                }),
            }
        };
        let (flushed, written) = futures_util::join!(flush, write);

        let mut op = self.load()?.unwrap_or(op);
        match (sealed, flushed) {
            (Some(last), Some(Ok(()))) => op.drop_flushed_stats(last),
            (_, Some(Err(e))) => {
                log(json!({"event": "stats_flush_failed", "key": op.key, "error": e}));
                // Retried by the alarm: push the wake time a little into the future.
                let retry_at = now_ms() + 5_000;
                for event in &mut op.pending_stats {
                    event.at_ms = event.at_ms.max(retry_at);
                }
            }
            _ => {}
        }
        match (&projection, written) {
            (Some(p), Some(Ok(()))) => op.projection_written(p.metadata.version, now),
            (_, Some(Err(e))) => {
                // The gate stays the truth; the alarm writes the projection again, with
                // backoff, so a KV outage does not become a storm of alarms.
                op.projection_failed(now);
                log(json!({"event": "ledger_write_failed", "key": op.key, "error": e,
                    "failures": op.projection_failures}));
            }
            _ => {}
        }
        self.save(&op)?;
        self.sync_alarm(&op, config).await
    }

    async fn sync_alarm(&self, op: &Operation, config: &Config) -> Result<()> {
        let storage = self.state.storage();
        let wake = op.wake_at_ms(config.retention_ms(), config.stats_flush_secs * 1_000);
        if wake.is_some() && wake == self.alarm_at.get() {
            return Ok(());
        }
        // Forgotten first: if the call fails, the next one sets the alarm again.
        self.alarm_at.set(None);
        match wake {
            Some(at) => {
                let date = worker::js_sys::Date::new(&JsValue::from_f64(at as f64));
                storage.set_alarm(ScheduledTime::new(date)).await?;
            }
            None => storage.delete_alarm().await?,
        }
        self.alarm_at.set(wake);
        Ok(())
    }

    fn load(&self) -> Result<Option<Operation>> {
        if let Some(cached) = self.cached.borrow().as_ref() {
            return Ok(cached.clone());
        }
        let rows: Vec<BodyRow> = self
            .state
            .storage()
            .sql()
            .exec("SELECT body FROM operation WHERE id = 1", None)?
            .to_array()?;
        let op: Option<Operation> =
            match rows.first() {
                None => None,
                Some(row) => Some(serde_json::from_str(&row.body).map_err(|e| {
                    worker::Error::RustError(format!("stored record unreadable: {e}"))
                })?),
            };
        self.cached.replace(Some(op.clone()));
        Ok(op)
    }

    fn save(&self, op: &Operation) -> Result<()> {
        let body =
            serde_json::to_string(op).map_err(|e| worker::Error::RustError(e.to_string()))?;
        self.state.storage().sql().exec(
            "INSERT INTO operation (id, body) VALUES (1, ?) ON CONFLICT(id) DO UPDATE SET body = excluded.body",
            vec![body.into()],
        )?;
        self.cached.replace(Some(Some(op.clone())));
        Ok(())
    }

    fn record(&self, at_ms: i64, entry: Value) -> Result<()> {
        let sql = self.state.storage().sql();
        sql.exec(
            "INSERT INTO history (at_ms, entry) VALUES (?, ?)",
            vec![at_ms.into(), entry.to_string().into()],
        )?;
        let inserts = self.inserts.get();
        self.inserts.set(inserts.wrapping_add(1));
        if inserts.is_multiple_of(TRIM_EVERY) {
            sql.exec(
                "DELETE FROM history WHERE seq <= (SELECT MAX(seq) FROM history) - ?",
                vec![HISTORY_LIMIT.into()],
            )?;
        }
        Ok(())
    }

    fn history(&self) -> Result<Vec<Value>> {
        #[derive(Deserialize)]
        struct Row {
            at_ms: f64,
            entry: String,
        }
        let rows: Vec<Row> = self
            .state
            .storage()
            .sql()
            .exec("SELECT at_ms, entry FROM history ORDER BY seq", None)?
            .to_array()?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let mut entry: Value = serde_json::from_str(&r.entry).unwrap_or(Value::Null);
                if let Value::Object(map) = &mut entry {
                    map.insert(
                        "at".into(),
                        json!(crate::timestamp::format_rfc3339(r.at_ms as i64)),
                    );
                }
                entry
            })
            .collect())
    }
}

/// Counts a delivery's outcome in the record, exactly once (same write as the decision).
/// `arrived` is false for a confirmation, whose delivery was counted when it arrived.
fn count_delivery(op: &mut Operation, event: &OpEvent, verdict: Verdict, now: i64, arrived: bool) {
    if arrived && event.source == Source::Webhook {
        op.count(stats::DELIVERIES, now);
    }
    match verdict {
        Verdict::Drop(DropReason::Duplicate) => op.count(stats::DUPLICATES, now),
        Verdict::Drop(reason) => op.count(&format!("dropped_{}", reason.as_str()), now),
        Verdict::Apply if op.status.is_terminal() => op.count(
            match event.source {
                Source::Reconcile => stats::SETTLED_BY_RECONCILE,
                _ => stats::SETTLED_BY_WEBHOOK,
            },
            now,
        ),
        Verdict::Apply => {}
    }
}

fn label_stat(finished: &Finished) -> &'static str {
    match finished {
        Finished::Done => stats::EFFECT_SUCCESSES,
        Finished::RetryAt(_) => stats::EFFECT_FAILURES,
        Finished::Parked | Finished::Fenced => stats::EFFECT_PARKS,
    }
}

fn history_of_event(event: &OpEvent, verdict: Verdict) -> Value {
    let (what, reason) = match verdict {
        Verdict::Apply => ("applied", None),
        Verdict::Drop(r) => ("dropped", Some(r.as_str())),
    };
    json!({
        "what": what,
        "reason": reason,
        "status": event.status.as_str(),
        "source": event.source.as_str(),
        "update_time_ms": event.update_time_ms,
        "delivery_id": event.delivery_id,
    })
}

fn op_position(op: &Operation) -> Position {
    Position {
        status: op.status.clone(),
        update_time_ms: op.update_time_ms,
    }
}

fn verdict_label(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::Apply => "applied",
        Verdict::Drop(reason) => reason.as_str(),
    }
}

/// Where the side effect stands, without running it (the alarm runs it).
fn effect_report(op: &Operation, now: i64) -> EffectReport {
    if !op.effect_owed() {
        if op.effect.done {
            EffectReport::Delivered
        } else if op.effect.parked.is_some() {
            EffectReport::Parked
        } else {
            EffectReport::NotOwed
        }
    } else if op.effect.claim.is_some_and(|c| c.expires_ms > now) {
        EffectReport::InFlight
    } else if op.effect.next_attempt_ms <= now {
        EffectReport::Scheduled
    } else {
        EffectReport::RetryScheduled
    }
}
