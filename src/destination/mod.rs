//! A destination's health and pace: one desk per destination (as
//! [`crate::config::Config::destination_label`] names it) decides whether an effect to it may go
//! now, waits, or keeps its own schedule, and when what waited is released.
//!
//! Guarantees (docs/DESIGN.md, invariant 8): [`desk`] is a pure state machine (time is an
//! input), so every decision has a host test; [`protocol`] holds the messages between a gate and
//! its destination's desk, [`sending`] what a send's answers mean (the job's effect's and a
//! batch's results' alike). Nothing here knows an operation's record: a desk only holds keys,
//! their due times and counts, and never changes an effect's `webhook-id` (the gate does not
//! change it for any of this either).

pub mod desk;
pub mod protocol;
pub mod sending;
