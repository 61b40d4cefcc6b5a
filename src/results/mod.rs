//! Every result of a batch, its own side effect, exactly once: the pure core the batch's gate
//! and its alarm drive (docs/DESIGN.md, "Results of a batch"; the edge's side is
//! `src/edge/objects/gate/results.rs`).
//!
//! Guarantees: a results file is read as a stream in bounded memory ([`lines`]); each line or
//! inline item is one result with a key that is stable on every read and distinct within the
//! operation ([`keys`], [`item`]); each result's effect has one body and one `webhook-id` for
//! good ([`body`]); and the progress through the file is a state machine over durable state
//! that resumes after a kill anywhere without sending a result under a new id ([`progress`]).
//! Dependencies run one way: this room uses `operation` (the job's effect body, its backoff
//! and the classification of an attempt) and `signature`; nothing in `operation` uses it.

pub mod body;
pub mod fanout;
pub mod inline;
pub mod item;
pub mod keys;
pub mod lines;
pub mod marks;
pub mod plan;
pub mod progress;
pub mod source;
pub mod turn;
