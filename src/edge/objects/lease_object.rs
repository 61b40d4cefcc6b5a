//! The ReconcileLease Durable Object: one for the worker, admitting one reconciliation pass at
//! a time and keeping the durable cursor between passes.
//!
//! Storage (SQLite): `lease(id = 1, body)` holds [`crate::reconciliation::lease_state::Lease`] as JSON;
//! `last_pass(id = 1, body)` the summary of the newest pass. Guarantees: acquire, renew and
//! release are read-decide-write with no await in between, so two overlapping cron runs can
//! never both hold the lease; a holder that lost the lease can neither renew it nor move the
//! cursor. The lease is short and renewed by its pass's heartbeat (each renewal also saves the
//! pass's position), so a pass that dies blocks the next for one TTL. The audit over `op:`
//! keeps its own cursor in the same record ([`crate::reconciliation::lease_state::Audit`]), moved only by the
//! holder, like the routine cursor. The same record is the one status budget: a gate's
//! confirmation takes its slot here ([`crate::reconciliation::lease_state::Lease::take_slot`],
//! read-decide-write like the rest), after the pass's schedule and Gemini's back-off.

use worker::{durable_object, DurableObject, Env, Request, Response, Result, State};

use crate::reconciliation::lease_protocol::{decide, LeaseCommand, LeaseReply};
use crate::reconciliation::lease_state::Lease;
use crate::telemetry::worker_log::WorkerLog;

use crate::edge::error::bad_command;
use crate::edge::objects::row;
use crate::edge::runtime::now_ms;

/// The lease object's binding.
pub const LEASE_BINDING: &str = "RECONCILE_LEASE";
/// The one lease object's name.
pub const LEASE_NAME: &str = "reconcile";

/// Serializes reconciliation passes.
#[durable_object]
pub struct ReconcileLease {
    state: State,
}

impl DurableObject for ReconcileLease {
    fn new(state: State, _env: Env) -> Self {
        let ddl = [
            "CREATE TABLE IF NOT EXISTS lease (id INTEGER PRIMARY KEY CHECK (id = 1), body TEXT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS last_pass (id INTEGER PRIMARY KEY CHECK (id = 1), body TEXT NOT NULL)",
        ];
        row::create(&state, &ddl, |error| WorkerLog::LeaseSchemaError { error });
        Self { state }
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        let command: LeaseCommand = match req.json().await {
            Ok(c) => c,
            Err(e) => return bad_command("lease command", e),
        };
        Response::from_json(&self.lease_command(command, now_ms())?)
    }
}

impl ReconcileLease {
    /// A command on the lease: read, decided ([`decide`]) and written with no await in
    /// between, so two overlapping passes can never both hold it.
    fn lease_command(&self, command: LeaseCommand, now: i64) -> Result<LeaseReply> {
        let sql = self.state.storage().sql();
        let mut lease: Lease = row::read(&sql, "lease")?.unwrap_or_default();
        let status = command == LeaseCommand::Status;
        let turn = decide(&mut lease, command, now);
        if turn.save {
            row::write(&sql, "lease", &lease)?;
        }
        if let Some(summary) = &turn.last_pass {
            row::write(&sql, "last_pass", summary)?;
        }
        if status {
            let last_pass = row::read(&sql, "last_pass")?;
            return Ok(LeaseReply::State { lease, last_pass });
        }
        Ok(turn.reply)
    }
}
