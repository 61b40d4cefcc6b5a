//! The RetiredNames Durable Object: 256 of them (`retired-00` to `retired-ff`), each holding
//! the names whose retention ended that share its first hash byte
//! ([`crate::operation::retired_names`]).
//!
//! Storage (SQLite): `retired(hash BLOB PRIMARY KEY) WITHOUT ROWID`, one 16-byte row a name,
//! kept for good. Guarantees: a `keep` is answered only once its row is written (the output
//! gate holds the answer until the write is durable), so a gate deletes its storage only after
//! its name is kept; an `ask` reads at most one row and writes nothing. Every statement is
//! counted by the usage meter (`USAGE_LOG`), as the cost bench reads it.

use worker::{
    durable_object, DurableObject, Env, Request, Response, Result, SqlStorageValue, State,
};

use crate::operation::retired_names::{RetiredCommand, RetiredReply, ASK, DDL, KEEP};
use crate::refusal::Refusal;
use crate::telemetry::usage::Invocation;
use crate::telemetry::worker_log::WorkerLog;

use crate::edge::objects::row;
use crate::edge::objects::usage_meter::Meter;
use crate::edge::runtime::load_config;

/// One shard of the retired names.
#[durable_object]
pub struct RetiredNames {
    state: State,
    meter: Meter,
}

/// A row `ASK` found.
#[derive(serde::Deserialize)]
struct Kept {
    #[allow(dead_code)]
    kept: i64,
}

impl DurableObject for RetiredNames {
    fn new(state: State, env: Env) -> Self {
        row::create(&state.storage().sql(), &[DDL], |error| {
            WorkerLog::RetiredSchemaError { error }
        });
        let meter = Meter::default();
        meter.begin(load_config(&env).is_ok_and(|c| c.usage_log));
        Self { state, meter }
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        let started = self.meter.start();
        let command: RetiredCommand = match req.json().await {
            Ok(c) => c,
            Err(e) => {
                return Refusal::BadRequest(format!("bad retired-names command: {e}"))
                    .into_response()
            }
        };
        let sql = self.state.storage().sql();
        let reply = match command {
            RetiredCommand::Keep { name } => {
                let hash: Vec<SqlStorageValue> = vec![SqlStorageValue::Blob(name.0.to_vec())];
                self.meter.exec(&sql, KEEP, hash)?;
                RetiredReply::Kept
            }
            RetiredCommand::Ask { name } => {
                let hash: Vec<SqlStorageValue> = vec![SqlStorageValue::Blob(name.0.to_vec())];
                let rows: Vec<Kept> = self.meter.rows(&sql, ASK, hash)?;
                RetiredReply::Retired(!rows.is_empty())
            }
        };
        self.meter
            .end("retired_names", Invocation::Fetch, started, &sql);
        Response::from_json(&reply)
    }
}
