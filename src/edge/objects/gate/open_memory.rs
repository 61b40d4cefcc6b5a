//! This isolate's memory of the destinations a desk said are open, so that a first attempt
//! to one asks its desk instead of going (docs/DESIGN.md, invariant 8).
//!
//! Guarantees: memory only; what it remembers and for how long is decided by
//! [`DeskReply::remembered`]. A stale entry costs one desk call; an isolate
//! without one lets a first attempt go, and its report's answer makes it wait.

use std::cell::RefCell;
use std::collections::HashMap;

use crate::destination::protocol::{DeskReply, Remember};

thread_local! {
    static OPEN_UNTIL: RefCell<HashMap<String, i64>> = RefCell::new(HashMap::new());
}

/// Whether a desk said lately that `label` is open.
pub(super) fn is_open(label: &str, now: i64) -> bool {
    OPEN_UNTIL.with(|m| m.borrow().get(label).is_some_and(|until| *until > now))
}

/// Remembers what a desk's `reply` says about `label`.
pub(super) fn note(label: &str, reply: &DeskReply, now: i64) {
    OPEN_UNTIL.with(|m| {
        let mut m = m.borrow_mut();
        match reply.remembered(now) {
            Remember::OpenUntil(until) => {
                m.insert(label.to_string(), until);
            }
            Remember::Closed => {
                m.remove(label);
            }
            Remember::Keep => {}
        }
    });
}
