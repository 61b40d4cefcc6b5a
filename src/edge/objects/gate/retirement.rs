//! Retention's end and the retired names, as the gate performs them: keeping the name in its
//! retired names' shard before the storage is deleted, and asking the shard where a record is
//! about to be created (a registration finding none, and the first alarm of a record a signed
//! delivery created). What the shard holds and why: [`crate::operation::retired_names`].
//!
//! Guarantees: nothing is deleted before the shard said the name is kept; nothing of a record
//! a delivery created runs or leaves before the shard said its name is new; a shard that cannot
//! be reached fails the alarm's run (retried with backoff, nothing claimed or deleted) or a
//! registration (503, which the caller retries).

use worker::{Env, Response, Result};

use crate::operation::gate::alarm::{self, AlarmDone};
use crate::operation::gate::protocol::GateReply;
use crate::operation::gate::Step;
use crate::operation::retired_names::{RetiredCommand, RetiredName, RetiredReply};
use crate::operation::Operation;
use crate::refusal::Refusal;

use crate::edge::objects::call::call_retired;
use crate::edge::objects::gate::alarm::Run;
use crate::edge::objects::gate::storage::{Alarm, GateStorage};
use crate::edge::objects::retired_shard::failed;
use crate::edge::runtime::now_ms;

/// A registration that finds no record (or only one a signed delivery created, whose first
/// alarm has not asked yet) asks the retired names' shard once: a name whose retention ended
/// is answered 409 `retired` and nothing is created; a shard that cannot be reached is a 503,
/// which the caller retries. `None`: go on with the step.
pub(super) async fn registration(
    env: &Env,
    storage: &GateStorage,
    key: &str,
    name: &str,
) -> Result<Option<Result<Response>>> {
    if storage.load()?.is_some_and(|op| !op.retired_unasked()) {
        return Ok(None);
    }
    let retired = RetiredName::of(key);
    let ask = RetiredCommand::Ask { name: retired };
    let why = match call(env, storage, retired, &ask).await {
        Ok(RetiredReply::Retired(false)) => return Ok(None),
        Ok(RetiredReply::Retired(true)) => {
            // Nothing of it is left but its name.
            let operation = serde_json::json!({"key": key, "name": name});
            return Ok(Some(Response::from_json(&GateReply::Retired { operation })));
        }
        Ok(other) => format!("{other:?}"),
        Err(e) => e.to_string(),
    };
    Ok(Some(
        Refusal::Unavailable(format!("retired names: {why}")).into_response(),
    ))
}

/// One call to the retired names' shard that holds `name`, counted on the gate's meter.
async fn call(
    env: &Env,
    storage: &GateStorage,
    name: RetiredName,
    command: &RetiredCommand,
) -> std::result::Result<RetiredReply, Refusal> {
    storage.meter().add(|u| u.object_calls += 1);
    call_retired(env, name, command).await
}

impl Run<'_> {
    /// Ends retention: keeps the name in its retired names' shard, then deletes the gate's
    /// storage. A shard that cannot be reached fails the run, so nothing is deleted and the
    /// alarm tries again with backoff (`alarm_failed`); a run that dies between the two leaves
    /// the whole record, and its alarm retires it again (keeping a name twice writes nothing).
    /// A command that ran during the shard's call and holds retention (an operator's retry of
    /// parked results, accepted) is kept: nothing is deleted, the alarm follows the record, and
    /// the name kept early changes nothing for a record that exists.
    pub(super) async fn retire(&self, op: &Operation, step: Step<AlarmDone>) -> Result<Response> {
        let name = RetiredName::of(op.key());
        match call(self.env, self.storage, name, &RetiredCommand::Keep { name }).await {
            Ok(RetiredReply::Kept) => {}
            Ok(other) => return Err(failed(format!("{other:?}"))),
            Err(e) => return Err(failed(e)),
        }
        let current = self.storage.load()?;
        let over = |op: &Operation| alarm::retire_if_over(op, now_ms(), &self.limits).is_some();
        if let Some(current) = current.filter(|op| !over(op)) {
            self.storage.sync_alarm(&current, &self.limits).await?;
            return Response::ok("retention held by a command that ran meanwhile");
        }
        self.storage.commit(step, &self.limits, Alarm::Sync).await?;
        Response::ok("retention expired")
    }

    /// For a record a signed delivery created, asks the retired names' shard first, before
    /// anything of it runs or leaves: a retired name's record is deleted with nothing run
    /// (`None`). A shard that cannot be reached fails the run: nothing is claimed, and the
    /// alarm asks again with backoff. Told the name is new, the record goes on, the answer
    /// kept in memory and stored with its next write (the claim's).
    pub(super) async fn ask_retired(&self, op: Operation) -> Result<Option<Operation>> {
        if !op.retired_unasked() {
            return Ok(Some(op));
        }
        let name = RetiredName::of(op.key());
        let ask = RetiredCommand::Ask { name };
        let retired = match call(self.env, self.storage, name, &ask).await {
            Ok(RetiredReply::Retired(retired)) => retired,
            Ok(other) => return Err(failed(format!("{other:?}"))),
            Err(e) => return Err(failed(e)),
        };
        // Commands may have run during the call: the record is read afresh.
        let mut current = self.storage.load()?.unwrap_or(op);
        if retired {
            let step = alarm::refuse_retired(&current);
            self.storage.commit(step, &self.limits, Alarm::Sync).await?;
            return Ok(None);
        }
        current.retired_asked();
        self.storage.keep_in_memory(&current);
        Ok(Some(current))
    }
}
