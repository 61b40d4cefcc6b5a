//! Finding what the webhooks missed: Gemini's status API read with bounded memory, the cron
//! pass as a state machine (`pass/`), the per-entry decision it applies (`entry_decision`),
//! and the lease that keeps one pass at a time with where the next one resumes
//! (`lease_state`, spoken to through `lease_protocol`).

pub mod entry_decision;
pub mod lease_protocol;
pub mod lease_state;
pub mod pass;
pub mod status;
