//! An operator's repair of a gate whose record does not load: recovered as a load would
//! recover it, or, when not even its key and state can be read, rebuilt from the key and name
//! the operator gives ([`Operation::rebuild`]).
//!
//! Guarantees: a record that does not load is never lost: its raw text stays in `quarantine`
//! until retention ends; a record that loads is left as it is; a rebuilt record's
//! `record_unreadable` alert is queued for the alarm.

use worker::Result;

use crate::operation::{recovery, Actor, Operation};

use crate::edge::objects::gate::storage::{Cached, GateStorage};
use crate::edge::objects::gate::tables;
use crate::edge::runtime::now_ms;

/// `None` when there is no record; `Some(false)` when it loads as it is (nothing done);
/// `Some(true)` when it did not: recovered as [`GateStorage::load`] would, or, when not even
/// its key and state can be read, kept in `quarantine` and replaced by
/// [`Operation::rebuild`] of `key` and `name`, with its alert queued and `by` (the operator)
/// in its history row.
pub(super) fn repair(
    storage: &GateStorage,
    key: &str,
    name: &str,
    reason: &str,
    by: Option<&Actor>,
) -> Result<Option<bool>> {
    let Some(body) = storage.stored_body()? else {
        return Ok(None);
    };
    let Err(error) = serde_json::from_str::<Operation>(&body) else {
        return Ok(Some(false));
    };
    storage.cached.replace(Cached::Unread);
    if recovery::recover(&body).is_some() {
        storage.load()?;
        return Ok(Some(true));
    }
    let now = now_ms();
    let error = error.to_string();
    tables::quarantine(storage.meter(), &storage.sql(), &body, &error, now)?;
    let mut op = Operation::rebuild(key, name, reason, now);
    let rebuilt = recovery::Recovery::Rebuilt;
    let (entry, line) = recovery::mark_recovered(&mut op, rebuilt, &error, &body, now, by.cloned());
    storage.store_recovered(&op, entry, line, now)?;
    Ok(Some(true))
}
