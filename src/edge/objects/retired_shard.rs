//! The RetiredNames Durable Object: 256 of them (`retired-00` to `retired-ff`), each holding
//! the names whose retention ended that share its first hash byte
//! ([`crate::operation::retired_names`]).
//!
//! Storage (SQLite): `names(bucket, part, hashes) WITHOUT ROWID`, each row the sorted entries
//! (11 bytes a name) of one of the shard's 64 buckets, kept for good; and `retired(hash)`, the
//! 16-byte rows a shard wrote before the packing, read and never written.
//!
//! Guarantees: keeps are stored in batches. The first keep of a batch waits
//! `RETIRED_KEEP_WAIT_MS`; the keeps that arrive meanwhile (the names of one bucket's
//! retirement moment, whose gates' alarms were set for the same millisecond) join it; then, in
//! one step of the object (no await between a bucket's read and its write, so two batches never
//! interleave), each bucket of the batch has its last row read and its names merged in
//! ([`plan_keeps`]: one row written a bucket, more only when the row fills past 4,096). Every
//! keep of the batch is answered only after that step: with what the write said (a failed
//! write fails every keep of the batch, whose gates delete nothing and retry), and no sooner
//! than the write is durable (the output gate holds every answer of the object until its
//! writes are), so a gate deletes its storage only after its name is kept. A batch whose first
//! keep's request is dropped before it stores fails its keeps (each gate retries). An `ask`
//! reads its bucket's rows (one per 4,096 names in it) and, when the name is not there, at
//! most one old row, and writes nothing. Every statement is counted by the usage meter
//! (`USAGE_LOG`), as the cost bench reads it, and each batch stored logs one
//! `retired_names_kept` line (names, rows written).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::Duration;

use futures_channel::oneshot;
use worker::{
    durable_object, Delay, DurableObject, Env, Request, Response, Result, SqlStorage,
    SqlStorageValue, State,
};

use crate::operation::retired_names::{
    holds, plan_keeps, RetiredCommand, RetiredName, RetiredReply, DDL, LAST_PART, LEGACY_ASK,
    LEGACY_DDL, PARTS, PUT,
};
use crate::telemetry::usage::Invocation;
use crate::telemetry::worker_log::WorkerLog;

use crate::edge::error::bad_command;
use crate::edge::objects::row;
use crate::edge::objects::usage_meter::Meter;
use crate::edge::runtime::{load_config, log, now_ms};

/// What a batch's write said, sent to each of its keeps.
type Stored = std::result::Result<(), String>;

/// The keeps gathered for the next write, each with where to send what the write said.
#[derive(Default)]
struct Batch {
    names: Vec<RetiredName>,
    waiting: Vec<oneshot::Sender<Stored>>,
}

/// One shard of the retired names.
#[durable_object]
pub struct RetiredNames {
    state: State,
    meter: Meter,
    /// `RETIRED_KEEP_WAIT_MS`.
    wait_ms: u64,
    /// The batch being gathered, if one is.
    batch: RefCell<Option<Batch>>,
}

/// Fails the gathered batch's keeps if the keep that gathers it is dropped before it stores
/// (its senders dropped: each waiting keep sees its batch was never stored).
struct Gathering<'a>(&'a RefCell<Option<Batch>>);

impl Drop for Gathering<'_> {
    fn drop(&mut self) {
        self.0.borrow_mut().take();
    }
}

impl DurableObject for RetiredNames {
    fn new(state: State, env: Env) -> Self {
        row::create(&state, &[DDL, LEGACY_DDL], |error| {
            WorkerLog::RetiredSchemaError { error }
        });
        let config = load_config(&env).ok();
        let meter = Meter::default();
        meter.begin(config.as_ref().is_some_and(|c| c.usage_log));
        let wait_ms = config.map_or(crate::config::DEFAULT_RETIRED_KEEP_WAIT_MS, |c| {
            c.retired_keep_wait_ms
        });
        Self {
            state,
            meter,
            wait_ms: wait_ms.max(0) as u64,
            batch: RefCell::new(None),
        }
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        let started = now_ms();
        let command: RetiredCommand = match req.json().await {
            Ok(c) => c,
            Err(e) => return bad_command("retired-names command", e),
        };
        let sql = self.state.storage().sql();
        let reply = match command {
            RetiredCommand::Keep { name } => self.keep(&sql, name).await,
            RetiredCommand::Ask { name } => self.ask(&sql, &name),
        };
        self.meter
            .end("retired_names", Invocation::Fetch, started, &sql);
        Response::from_json(&reply?)
    }
}

impl RetiredNames {
    /// Keeps `name` with the batch it joins (or gathers), answered once that batch is stored.
    async fn keep(&self, sql: &SqlStorage, name: RetiredName) -> Result<RetiredReply> {
        let (sent, stored) = oneshot::channel();
        let gathers = {
            let mut batch = self.batch.borrow_mut();
            let gathers = batch.is_none();
            let batch = batch.get_or_insert_with(Batch::default);
            batch.names.push(name);
            batch.waiting.push(sent);
            gathers
        };
        if gathers {
            let gathering = Gathering(&self.batch);
            Delay::from(Duration::from_millis(self.wait_ms)).await;
            let batch = gathering.0.borrow_mut().take().unwrap_or_default();
            let result = self.store(sql, &batch.names);
            for waiting in batch.waiting {
                let _ = waiting.send(result.clone());
            }
        }
        match stored.await {
            Ok(Ok(())) => Ok(RetiredReply::Kept),
            Ok(Err(e)) => Err(failed(e)),
            Err(_) => Err(failed("its batch was dropped before it was stored")),
        }
    }

    /// Stores `names`, one write per bucket row they change, in one step of the object.
    fn store(&self, sql: &SqlStorage, names: &[RetiredName]) -> Stored {
        let mut buckets: BTreeMap<i64, Vec<_>> = BTreeMap::new();
        for name in names {
            buckets.entry(name.bucket()).or_default().push(*name);
        }
        let mut rows = 0;
        for (bucket, names) in &buckets {
            let last = self
                .parts(sql, LAST_PART, names[0])
                .map_err(|e| e.to_string())?;
            let entries: Vec<_> = names.iter().map(RetiredName::entry).collect();
            for (part, hashes) in plan_keeps(last.first(), &entries) {
                let row = vec![(*bucket).into(), part.into(), hashes.into()];
                self.meter.exec(sql, PUT, row).map_err(|e| e.to_string())?;
                rows += 1;
            }
        }
        let names = names.len();
        log(WorkerLog::RetiredNamesKept { names, rows }.to_value());
        Ok(())
    }

    /// Whether `name` was kept: its bucket's rows, then the old table.
    fn ask(&self, sql: &SqlStorage, name: &RetiredName) -> Result<RetiredReply> {
        let entry = name.entry();
        let parts = self.parts(sql, PARTS, *name)?;
        if parts.iter().any(|(_, hashes)| holds(hashes, &entry)) {
            return Ok(RetiredReply::Retired(true));
        }
        // The table of shards written before the packing (at most one row read; none in a
        // shard created since): only whether a row came back matters.
        let hash = vec![SqlStorageValue::Blob(name.0.to_vec())];
        let rows: Vec<serde_json::Value> = self.meter.rows(sql, LEGACY_ASK, hash)?;
        Ok(RetiredReply::Retired(!rows.is_empty()))
    }

    /// The rows of `name`'s bucket `query` reads (`part`, `hashes`).
    fn parts(
        &self,
        sql: &SqlStorage,
        query: &str,
        name: RetiredName,
    ) -> Result<Vec<(i64, Vec<u8>)>> {
        let rows = self.meter.values(sql, query, vec![name.bucket().into()])?;
        rows.into_iter()
            .map(|row| match row.as_slice() {
                [SqlStorageValue::Integer(part), SqlStorageValue::Blob(hashes)] => {
                    Ok((*part, hashes.clone()))
                }
                other => Err(failed(format!("a bucket's row is {other:?}"))),
            })
            .collect()
    }
}

/// A failure about the retired names: a shard's is answered 500, a gate's (a reply other than
/// the one asked for, or none) fails its alarm's run; the gate retries either.
pub(crate) fn failed(what: impl std::fmt::Display) -> worker::Error {
    worker::Error::RustError(format!("retired names: {what}"))
}
