//! Calls that leave the worker: the destination and the alert sink, Gemini's status API, and
//! the KV ledger's writes, over one bounded fetch.

pub mod analytics;
pub mod destination;
pub mod fetch;
pub mod ledger_kv;
pub mod results_file;
pub mod status_api;
