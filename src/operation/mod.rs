//! One operation: its name, its lifecycle and record, the gate's pure steps and the protocol
//! the edge speaks to it, its side effect and the shape of its details, its alerts, and its
//! projection into the KV ledger.
//!
//! The record (`record/`) is private; what the rest of the crate uses of it is named here, one
//! by one.

pub mod alert;
pub mod details;
pub mod effect;
pub mod gate;
pub mod history;
pub mod key;
pub mod ledger;
pub mod ledger_walk;
pub mod lifecycle;
pub mod observation;
mod record;
pub mod recovery;
pub mod retired_names;

pub use record::{
    Actor, AttemptOutcome, Claim, DeskMark, Finished, KindFill, OpEvent, Operation,
    OperatorRefusal, PendingAlert, Queued, ResultsMode,
};
