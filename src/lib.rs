//! gemini-once: receives Gemini long-running-operation completions on Cloudflare's edge and
//! runs each completion's side effect effectively once.
//!
//! Everything but `edge` is the pure core: no I/O, no clock, no randomness of their own,
//! tested on the host by `cargo test`, grouped by capability: [`inbound`] (what arrives),
//! [`operation`] (one operation's life and its side effect), [`reconciliation`] (finding what
//! the webhooks missed), [`telemetry`] (what it counts and logs), [`destination`] (a
//! destination's health and pace), and the configuration, access
//! (who may call which admin route), listing and the two answers every room shares beside
//! them: [`retry`] (what a peer answered and whether a retry can help) and [`refusal`] (why
//! a request is refused, and with what status). [`results`] makes each result of a batch its
//! own side effect (its core only: the gate does not drive it yet).
//! Dependencies run one way: `inbound` and `reconciliation` use `operation`; `operation` uses
//! only the crate-level helpers and `telemetry`. `edge`
//! (wasm32 only, so not linked from host docs) is the thin Worker around them. docs/DESIGN.md states the invariants.
#![forbid(unsafe_code)]

pub mod inbound;
pub mod operation;
pub mod reconciliation;
pub mod results;
pub mod telemetry;

pub mod alert_format;
pub mod alert_line;
pub mod body_cap;
pub mod config;
pub mod destination;
pub mod destination_label;
pub mod operator;
pub mod redirect;
pub mod refusal;
pub mod retry;
pub mod signature;
pub mod skim;
pub mod timestamp;

#[cfg(target_arch = "wasm32")]
pub mod edge;

/// A value left at its default is not stored (it reads back as its default).
pub(crate) fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// The first `bytes` bytes of `digest` in lowercase hex.
pub fn hex(digest: &[u8], bytes: usize) -> String {
    digest
        .iter()
        .take(bytes)
        .map(|b| format!("{b:02x}"))
        .collect()
}
