//! What arrives: Gemini's deliveries, their envelopes and tokens, and nudges naming operations
//! nobody registered.

pub mod answer;
pub mod classify;
pub mod envelope;
pub mod intake;
pub mod jwt;
pub mod key_set;
pub mod route_log;
pub mod stranger;
