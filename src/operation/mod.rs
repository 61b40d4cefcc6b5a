//! One operation: its name, its lifecycle and record, the gate's pure steps and the protocol
//! the edge speaks to it, its side effect, its alerts, and its projection into the KV ledger.

pub mod alarm;
pub mod alarm_failure;
pub mod alert;
pub mod effect;
pub mod gate;
pub mod gate_log;
pub mod gate_protocol;
pub mod history;
pub mod key;
pub mod ledger;
pub mod lifecycle;
pub mod observation;
mod record;
pub mod recovery;

pub use record::*;
