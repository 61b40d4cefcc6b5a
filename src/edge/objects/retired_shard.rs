//! The RetiredNames Durable Object: 256 of them (`retired-00` to `retired-ff`), each holding
//! the names whose retention ended that share its first hash byte
//! ([`crate::operation::retired_names`]).
//!
//! Storage (SQLite): `names(bucket, part, hashes) WITHOUT ROWID`, each row the sorted entries
//! (11 bytes a name) of one of the shard's 64 buckets, kept for good; and `retired(hash)`, the
//! 16-byte rows a shard wrote before the packing, read and never written. Guarantees: a `keep`
//! is answered only once the row that holds the name is written (the output gate holds the
//! answer until the write is durable), so a gate deletes its storage only after its name is
//! kept; a keep reads its bucket's last row and writes it (one row), or nothing when that row
//! already holds the name; an `ask` reads its bucket's rows (one per 4,096 names in it) and,
//! when the name is not there, at most one old row, and writes nothing. Every statement is counted by the usage meter (`USAGE_LOG`), as the cost bench
//! reads it.

use worker::{
    durable_object, DurableObject, Env, Request, Response, Result, SqlStorage, SqlStorageValue,
    State,
};

use crate::operation::retired_names::{
    holds, plan_keep, KeepPlan, RetiredCommand, RetiredName, RetiredReply, DDL, LAST_PART,
    LEGACY_ASK, LEGACY_DDL, PARTS, PUT,
};
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

/// A row `LEGACY_ASK` found.
#[derive(serde::Deserialize)]
struct Kept {
    #[allow(dead_code)]
    kept: i64,
}

impl DurableObject for RetiredNames {
    fn new(state: State, env: Env) -> Self {
        row::create(&state.storage().sql(), &[DDL, LEGACY_DDL], |error| {
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
        // No await between reading a bucket and writing it: a keep's read and write are one
        // step of the object, so two keeps of one bucket never interleave.
        let reply = match command {
            RetiredCommand::Keep { name } => {
                let last = self.parts(&sql, LAST_PART, &name)?;
                if let KeepPlan::Put { part, hashes } = plan_keep(last.first(), &name.entry()) {
                    let row = vec![name.bucket().into(), part.into(), hashes.into()];
                    self.meter.exec(&sql, PUT, row)?;
                }
                RetiredReply::Kept
            }
            RetiredCommand::Ask { name } => {
                let entry = name.entry();
                let packed = self
                    .parts(&sql, PARTS, &name)?
                    .iter()
                    .any(|(_, hashes)| holds(hashes, &entry));
                RetiredReply::Retired(packed || self.legacy_holds(&sql, &name)?)
            }
        };
        self.meter
            .end("retired_names", Invocation::Fetch, started, &sql);
        Response::from_json(&reply)
    }
}

impl RetiredNames {
    /// The rows of `name`'s bucket `query` reads (`part`, `hashes`).
    fn parts(
        &self,
        sql: &SqlStorage,
        query: &str,
        name: &RetiredName,
    ) -> Result<Vec<(i64, Vec<u8>)>> {
        let rows = self.meter.values(sql, query, vec![name.bucket().into()])?;
        rows.into_iter()
            .map(|row| match row.as_slice() {
                [SqlStorageValue::Integer(part), SqlStorageValue::Blob(hashes)] => {
                    Ok((*part, hashes.clone()))
                }
                other => Err(worker::Error::RustError(format!(
                    "retired names: a bucket's row is {other:?}"
                ))),
            })
            .collect()
    }

    /// Whether the table of shards written before the packing holds `name` (at most one row
    /// read; none in a shard created since).
    fn legacy_holds(&self, sql: &SqlStorage, name: &RetiredName) -> Result<bool> {
        let hash = vec![SqlStorageValue::Blob(name.0.to_vec())];
        let rows: Vec<Kept> = self.meter.rows(sql, LEGACY_ASK, hash)?;
        Ok(!rows.is_empty())
    }
}
