//! Finding what the webhooks missed: Gemini's status API read with bounded memory, the cron
//! pass's decisions, and the lease that keeps one pass at a time.

pub mod lease_protocol;
pub mod reconcile;
pub mod skim;
pub mod status;
