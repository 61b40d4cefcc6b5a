//! The operator's side of the worker, pure: who may call which admin route
//! ([`access`]: tokens by scope), the ledger's listing and its filters ([`listing`]), and
//! bulk actions over it ([`bulk`]), and a destination paused by hand as the admin API takes it
//! ([`pause`]). The edge's admin API (`edge/http/`) performs them.

pub mod access;
pub mod bulk;
pub mod listing;
pub mod pause;
