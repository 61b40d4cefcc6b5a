//! The Durable Objects: the gate of each operation (its alarm run and its storage), the reconciliation
//! lease (and the strangers' guard), and the stats shards with their usage meter.

pub mod gate_alarm;
pub mod gate_object;
pub mod gate_repair;
pub mod gate_storage;
pub mod lease_object;
pub mod stats_shard;
pub mod usage_meter;
