//! What the worker counts and says: per-hour counters, the stats shards' store, usage
//! metering, and the typed log lines.

pub mod analytics;
pub mod counters;
pub mod isolate_tally;
pub mod log_event;
pub mod metrics;
pub mod shard_store;
pub mod usage;
pub mod worker_log;
