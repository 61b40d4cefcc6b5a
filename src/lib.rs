//! gemini-once: receives Gemini long-running-operation completions on Cloudflare's edge and
//! runs each completion's side effect effectively once.
//!
//! Everything but `edge` is the pure core: no I/O, no clock, no randomness of their own,
//! tested on the host by `cargo test`, grouped by capability: [`inbound`] (what arrives),
//! [`operation`] (one operation's life and its side effect), [`reconciliation`] (finding what
//! the webhooks missed), and the configuration, counters and listing beside them. `edge`
//! (wasm32 only, so not linked from host docs) is the thin Worker around them. docs/DESIGN.md states the invariants.
#![forbid(unsafe_code)]

/// What arrives: signatures and tokens verified, envelopes parsed, operation keys normalized.
pub mod inbound {
    pub mod envelope;
    pub mod jwt;
    pub mod key;
    pub mod signature;
    pub mod stranger;
}

/// One operation: its lifecycle, its record and transitions, the gate's steps and protocol,
/// its side effect and its alerts.
pub mod operation {
    pub mod alarm_failure;
    pub mod alert;
    pub mod effect;
    pub mod gate;
    pub mod gate_protocol;
    pub mod lifecycle;
    mod record;
    pub mod recovery;

    pub use record::*;
}

/// Finding what the webhooks missed: the ledger's projection, Gemini's status API, the cron
/// pass's decisions and lease.
pub mod reconciliation {
    pub mod ledger;
    pub mod reconcile;
    pub mod skim;
    pub mod status;
}

pub mod admin;
pub mod bounds;
pub mod config;
pub mod log_event;
pub mod retry;
pub mod stats;
pub mod stats_store;
pub mod timestamp;
pub mod usage;

// The short paths every module uses (`crate::signature`, `crate::gate`, ...).
pub use inbound::{envelope, jwt, key, signature, stranger};
pub use operation::{alert, effect, gate, gate_protocol, lifecycle};
pub use reconciliation::{ledger, reconcile, skim, status};

#[cfg(target_arch = "wasm32")]
pub mod edge;
