//! Counts held in one isolate's memory until they are sent to a stats shard, so counting costs
//! no object call per event: many gates' (or requests') counts go in one call per window.
//!
//! Guarantees: a count is added to exactly one bucket (its name and hour) and leaves the
//! tally only in a batch taken for sending, which goes back in whole if the send fails; at
//! most one send is taken per window (`every_ms` since the last), and at most one delayed
//! send is scheduled at a time, due when the window ends (one that has not run a window past
//! its time is taken for lost, its object gone, and scheduled again), so nothing waits much
//! longer than a window once its isolate runs on. What it cannot guarantee is the isolate:
//! counts still in memory when the runtime evicts it are lost (never state, which the gates
//! keep).

use std::collections::BTreeMap;

use crate::telemetry::counters::{hour_of, StatEvent};

/// An hour, in milliseconds: a bucket's events are sent at its start.
const HOUR_MS: i64 = 3_600_000;
/// A scheduled send this late (or a window late, if longer) is taken for lost.
const MIN_OVERDUE_MS: i64 = 1_000;

/// One isolate's counts not yet sent.
#[derive(Debug, Default)]
pub struct IsolateTally {
    /// Counts by name and hour.
    counts: BTreeMap<(String, i64), u64>,
    /// When a batch was last taken for sending (0: never).
    sent_at_ms: i64,
    /// When the delayed send scheduled and not run yet is due.
    scheduled: Option<i64>,
}

impl IsolateTally {
    pub const fn new() -> Self {
        IsolateTally {
            counts: BTreeMap::new(),
            sent_at_ms: 0,
            scheduled: None,
        }
    }

    /// Adds `n` occurrences of `name` at `at_ms`; returns its bucket's count now.
    pub fn add(&mut self, name: &str, at_ms: i64, n: u64) -> u64 {
        let key = (name.to_string(), hour_of(at_ms));
        let count = self.counts.entry(key).or_default();
        *count += n;
        *count
    }

    /// Adds counted events (their sequence numbers are a gate's business, not the tally's), or
    /// puts back a batch whose send failed, to go with the next.
    pub fn add_events(&mut self, events: &[StatEvent]) {
        for e in events {
            self.add(&e.name, e.at_ms, e.count);
        }
    }

    /// Everything, as a batch to send now, when the window since the last send has passed
    /// (always with `every_ms` 0); `None` when empty or not yet due.
    pub fn take_due(&mut self, now_ms: i64, every_ms: i64) -> Option<Vec<StatEvent>> {
        let due = !self.counts.is_empty() && now_ms - self.sent_at_ms >= every_ms;
        due.then(|| self.take(now_ms))
    }

    /// How long until a delayed send is due, when one should be scheduled now: there are
    /// counts and none is scheduled (or the one scheduled is a window overdue: the object that
    /// held its timer is gone). The caller must then run [`IsolateTally::take_scheduled`]
    /// after that delay.
    pub fn schedule(&mut self, now_ms: i64, every_ms: i64) -> Option<i64> {
        let pending = self
            .scheduled
            .is_some_and(|due| now_ms <= due + every_ms.max(MIN_OVERDUE_MS));
        if self.counts.is_empty() || pending {
            return None;
        }
        let delay = (self.sent_at_ms + every_ms - now_ms).max(0);
        self.scheduled = Some(now_ms + delay);
        Some(delay)
    }

    /// The scheduled send's batch: everything left (maybe nothing, if a due send took it).
    pub fn take_scheduled(&mut self, now_ms: i64) -> Vec<StatEvent> {
        self.scheduled = None;
        if self.counts.is_empty() {
            return Vec::new();
        }
        self.take(now_ms)
    }

    fn take(&mut self, now_ms: i64) -> Vec<StatEvent> {
        self.sent_at_ms = now_ms;
        std::mem::take(&mut self.counts)
            .into_iter()
            .map(|((name, hour), count)| StatEvent {
                seq: 0,
                name,
                at_ms: hour * HOUR_MS,
                count,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_800_000_000_000;

    fn event(name: &str, at_ms: i64, count: u64) -> StatEvent {
        StatEvent {
            seq: 7,
            name: name.into(),
            at_ms,
            count,
        }
    }

    fn sum(events: &[StatEvent], name: &str) -> u64 {
        events
            .iter()
            .filter(|e| e.name == name)
            .map(|e| e.count)
            .sum()
    }

    #[test]
    fn counts_of_many_gates_go_in_one_batch_per_name_and_hour() {
        let mut t = IsolateTally::new();
        t.add_events(&[event("deliveries", T0, 1), event("effect_successes", T0, 1)]);
        t.add_events(&[event("deliveries", T0 + 5, 1)]);
        t.add_events(&[event("deliveries", T0 + HOUR_MS, 2)]);
        let batch = t
            .take_due(T0 + HOUR_MS, 0)
            .expect("due at once with no window");
        assert_eq!(
            batch.len(),
            3,
            "two hours of deliveries and one of successes"
        );
        assert_eq!(sum(&batch, "deliveries"), 4);
        assert_eq!(sum(&batch, "effect_successes"), 1);
        assert!(batch.iter().all(|e| e.at_ms % HOUR_MS == 0 && e.seq == 0));
        assert_eq!(t.take_scheduled(T0 + HOUR_MS), [], "everything was taken");
        assert_eq!(
            t.take_due(T0 + 2 * HOUR_MS, 0),
            None,
            "nothing left to send"
        );
    }

    #[test]
    fn one_send_per_window_and_the_rest_waits_for_the_scheduled_one() {
        let mut t = IsolateTally::new();
        let every = 10_000;
        t.add("deliveries", T0, 1);
        assert!(
            t.take_due(T0, every).is_some(),
            "a first count goes at once"
        );
        t.add("deliveries", T0 + 1_000, 1);
        assert_eq!(t.take_due(T0 + 1_000, every), None, "inside the window");
        assert_eq!(
            t.schedule(T0 + 1_000, every),
            Some(9_000),
            "due at the window's end"
        );
        t.add("deliveries", T0 + 2_000, 1);
        assert_eq!(
            t.schedule(T0 + 2_000, every),
            None,
            "one scheduled at a time"
        );
        let batch = t.take_scheduled(T0 + 10_000);
        assert_eq!(sum(&batch, "deliveries"), 2);
        assert_eq!(t.schedule(T0 + 10_500, every), None, "nothing to schedule");
        t.add("deliveries", T0 + 11_000, 1);
        assert_eq!(
            t.take_due(T0 + 11_000, every),
            None,
            "the scheduled send began a window"
        );
        assert_eq!(t.schedule(T0 + 11_000, every), Some(9_000));
    }

    #[test]
    fn a_scheduled_send_after_a_due_one_sends_nothing_twice() {
        let mut t = IsolateTally::new();
        t.add("deliveries", T0 - 10, 1);
        assert_eq!(t.schedule(T0 - 10, 1_000), Some(0), "never sent: due now");
        assert!(!t.take_scheduled(T0 - 10).is_empty());
        t.add("deliveries", T0, 1);
        assert_eq!(t.schedule(T0, 1_000), Some(990));
        let due = t.take_due(T0 + 1_000, 1_000).unwrap();
        assert_eq!(sum(&due, "deliveries"), 1);
        assert!(t.take_scheduled(T0 + 1_000).is_empty());
        t.add("deliveries", T0 + 1_100, 1);
        assert_eq!(
            t.schedule(T0 + 1_100, 1_000),
            Some(900),
            "scheduling works again"
        );
    }

    #[test]
    fn a_scheduled_send_that_never_ran_is_scheduled_again_a_window_later() {
        let mut t = IsolateTally::new();
        t.add("deliveries", T0, 1);
        assert!(t.take_due(T0, 5_000).is_some());
        t.add("deliveries", T0 + 1_000, 1);
        assert_eq!(t.schedule(T0 + 1_000, 5_000), Some(4_000));
        // Its object was evicted with the timer: nothing took the batch.
        t.add("deliveries", T0 + 10_000, 1);
        assert_eq!(
            t.schedule(T0 + 10_000, 5_000),
            None,
            "not yet a window overdue"
        );
        assert_eq!(
            t.schedule(T0 + 10_001, 5_000),
            Some(0),
            "taken for lost: due at once"
        );
        assert_eq!(sum(&t.take_scheduled(T0 + 10_001), "deliveries"), 2);
    }

    #[test]
    fn a_failed_send_is_put_back_and_goes_with_the_next() {
        let mut t = IsolateTally::new();
        t.add("deliveries", T0, 3);
        let batch = t.take_due(T0, 0).unwrap();
        t.add("deliveries", T0 + 10, 1);
        t.add_events(&batch);
        let next = t.take_due(T0 + 20, 0).unwrap();
        assert_eq!(sum(&next, "deliveries"), 4, "nothing lost, nothing twice");
    }

    #[test]
    fn add_returns_the_bucket_s_count() {
        let mut t = IsolateTally::new();
        assert_eq!(t.add("rejected_bad_signature", T0, 1), 1);
        assert_eq!(t.add("rejected_bad_signature", T0 + 1, 1), 2);
        assert_eq!(
            t.add("rejected_bad_signature", T0 + HOUR_MS, 1),
            1,
            "a new hour"
        );
    }
}
