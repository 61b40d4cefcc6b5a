//! gemini-once: receives Gemini long-running-operation completions on Cloudflare's edge and
//! runs each completion's side effect effectively once.
//!
//! The modules at this level are the pure core: no I/O, no clock, no randomness of their own,
//! tested on the host by `cargo test`. [`edge`] (wasm32 only) is the thin Worker around them.
#![forbid(unsafe_code)]

pub mod admin;
pub mod alert;
pub mod config;
pub mod effect;
pub mod envelope;
pub mod gate;
pub mod gate_protocol;
pub mod jwt;
pub mod key;
pub mod ledger;
pub mod lifecycle;
pub mod log_event;
pub mod operation;
pub mod reconcile;
pub mod retry;
pub mod signature;
pub mod stats;
pub mod status;
pub mod timestamp;

#[cfg(target_arch = "wasm32")]
pub mod edge;
