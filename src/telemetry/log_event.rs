//! The worker's structured log lines: a documented contract that operators' queries,
//! `scripts/chaos.mjs` and `scripts/bench.mjs` read.
//!
//! Guarantees: a line is one JSON object serialized from a typed value (`GateLog`,
//! `PassLog`, `RouteLog`, `WorkerLog`, the usage meter's line) whose serde tag is its `event`:
//! the variant's own name is the only spelling of an event, so no table can drift from the
//! line (tests/log_events.rs serializes every variant, and fails on a name written by hand in
//! `src/`); lines never carry a secret.

use serde::Serialize;

/// The `event` a typed line serializes with (empty for a value that is not a line).
pub fn event_of(line: &impl Serialize) -> String {
    name_of(&serde_json::to_value(line).unwrap_or_default()["event"])
}

/// The name a unit variant serializes as: its one spelling, read for a label or a counter.
pub fn name_of(value: &impl Serialize) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}
