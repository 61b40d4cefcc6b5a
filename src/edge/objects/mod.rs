//! The Durable Objects: the gate of each operation (`gate/`: its commands, its alarm run and
//! its storage), the reconciliation lease, the strangers' watch (nudges naming operations the
//! worker does not hold), the stats shards with their usage meter, each destination's desk
//! (its health and pace), the retired names' shards, the result senders (a batch's results
//! past one invocation's 6 connections); and how the rest of the worker calls one (`call.rs`).

pub mod call;
pub mod destination_desk;
pub mod gate;
pub mod lease_object;
pub mod result_sender;
pub mod retired_shard;
pub mod row;
pub mod stats_shard;
pub mod stranger_watch;
pub mod usage_meter;
