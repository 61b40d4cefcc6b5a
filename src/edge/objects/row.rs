//! The one-row JSON tables of the small Durable Objects (the lease, the strangers' watch, a
//! destination's desk): `<table>(id = 1, body)`, read and written whole.
//!
//! Guarantees: a table that cannot be created is logged with its object's own event, never a
//! panic (its first read then fails, and the call with it); a row whose body is not the JSON
//! asked for reads as no row.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use worker::{Result, SqlStorage, State};

use crate::edge::runtime::log;
use crate::telemetry::worker_log::WorkerLog;

#[derive(Deserialize)]
struct BodyRow {
    body: String,
}

/// Runs each statement of `ddl`, logging a failure as `failed` words it.
pub fn create(state: &State, ddl: &[&str], failed: fn(String) -> WorkerLog) {
    let sql = state.storage().sql();
    for statement in ddl {
        if let Err(e) = sql.exec(statement, None) {
            log(failed(e.to_string()).to_value());
        }
    }
}

/// The row of `table` (an error when the table does not exist).
pub fn read<T: DeserializeOwned>(sql: &SqlStorage, table: &str) -> Result<Option<T>> {
    let query = format!("SELECT body FROM {table} WHERE id = 1");
    let rows: Vec<BodyRow> = sql.exec(&query, None)?.to_array()?;
    let row = rows.first();
    Ok(row.and_then(|r| serde_json::from_str(&r.body).ok()))
}

/// Stores `value` as the row of `table`.
pub fn write(sql: &SqlStorage, table: &str, value: &impl Serialize) -> Result<()> {
    let body = serde_json::to_string(value).map_err(|e| worker::Error::RustError(e.to_string()))?;
    let query = format!("INSERT INTO {table} (id, body) VALUES (1, ?) ON CONFLICT(id) DO UPDATE SET body = excluded.body");
    sql.exec(&query, vec![body.into()])?;
    Ok(())
}
