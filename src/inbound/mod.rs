//! What arrives: Gemini's deliveries, their envelopes and tokens, and nudges naming operations
//! nobody registered.

pub mod envelope;
pub mod jwt;
pub mod stranger;
