//! Finding what the webhooks missed: Gemini's status API read with bounded memory, the cron
//! pass as a state machine and its per-entry decisions, and the lease that keeps one pass at
//! a time.

pub mod lease_protocol;
pub mod pass;
pub mod reconcile;
pub mod skim;
pub mod status;
