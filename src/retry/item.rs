//! How a destination's answer is applied to the thing that was sent, the job's effect or one
//! result alike (the job's effect is a batch of one): [`apply`] decides once whether the
//! [`Item`] was delivered, is sent again at a time, is parked (refused), or is given up
//! (failing past its [`Policy`]'s limit), and makes that one change.
//!
//! Guarantees: pure (time and jitter are inputs); an answer changes an item through exactly
//! one of [`Item::delivered`], [`Item::retry_at`], [`Item::park`] and [`Item::give_up`]; an
//! item whose policy has no limit (the job's effect, docs/DESIGN.md invariant 3) is never given
//! up, only parked on a refusal. Whether an answer still counts (a stale claim's, a late one, a
//! row settled meanwhile) is its caller's to check first: what reaches [`apply`] is applied.

use crate::retry::{AttemptOutcome, Backoff, Heard, Next, Run};

/// A thing sent to a destination, as an answer changes it.
pub trait Item {
    /// Its run of failures, the attempt just answered included: the backoff's step.
    fn run(&self) -> Run;
    /// The destination accepted it at `now_ms`.
    fn delivered(&mut self, now_ms: i64);
    /// It is sent again no sooner than `at_ms`, after `why`, its run failing since
    /// `failing_since_ms` (for an item that keeps that clock).
    fn retry_at(&mut self, at_ms: i64, failing_since_ms: Option<i64>, why: &str);
    /// The destination refused it for good (`why`): parked at `now_ms`.
    fn park(&mut self, why: &str, now_ms: i64);
    /// Failing `_failing_ms`, past its policy's limit (`why`: the last answer): parked at
    /// `now_ms`, by default as a refusal is.
    fn give_up(&mut self, _failing_ms: i64, why: &str, now_ms: i64) {
        self.park(why, now_ms);
    }
}

/// How an item is retried: its backoff, and how long a run may fail before it is given up
/// (`None`: retried until delivered or refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub backoff: Backoff,
    pub give_up_after_ms: Option<i64>,
}

/// Applies what was `heard` at `now_ms` to `item` under `policy`, and says what it did. A
/// retry waits the jittered backoff, or the wait the destination asked for when longer, within
/// the cap (a `Retry-After` of a day holds nothing past `max_ms`). A run failing
/// `give_up_after_ms` (after one retry at least) is given up at its next failure.
pub fn apply(item: &mut impl Item, heard: Heard, policy: Policy, now_ms: i64, jitter: f64) -> Next {
    let next = decide(heard, item.run(), policy, now_ms, jitter);
    match &next {
        Next::Delivered => item.delivered(now_ms),
        Next::RetryAt {
            at_ms,
            failing_since_ms: since,
            why,
        } => item.retry_at(*at_ms, *since, why),
        Next::Park(why) => item.park(why, now_ms),
        Next::GaveUp { failing_ms, why } => item.give_up(*failing_ms, why, now_ms),
    }
    next
}

fn decide(heard: Heard, run: Run, policy: Policy, now_ms: i64, jitter: f64) -> Next {
    let (why, since, asked) = match heard {
        Heard::Nothing(why) => (why, run.failing_since_ms, None),
        Heard::Answer(AttemptOutcome::Delivered, _) => return Next::Delivered,
        Heard::Answer(AttemptOutcome::Park(why), _) => return Next::Park(why.clone()),
        Heard::Answer(AttemptOutcome::Retry(why), asked) => {
            let since = run.failing_since_ms.unwrap_or(now_ms);
            let failing_ms = now_ms - since;
            let over = |after| failing_ms >= after && run.attempts > 1;
            if policy.give_up_after_ms.is_some_and(over) {
                let why = why.clone();
                return Next::GaveUp { failing_ms, why };
            }
            (why.as_str(), Some(since), asked)
        }
    };
    let wait = policy.backoff.jittered(run.attempts, jitter);
    Next::RetryAt {
        at_ms: now_ms + asked.map_or(wait, |asked| wait.max(asked.min(policy.backoff.max_ms))),
        failing_since_ms: since,
        why: why.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What an answer did, in short.
    #[derive(Debug, PartialEq)]
    enum Applied {
        Delivered,
        RetryAt(i64),
        Refused,
        GaveUp,
    }

    /// An item that keeps its run and every change an answer made to it.
    #[derive(Debug, Default)]
    struct Sent {
        run: Run,
        changes: Vec<String>,
    }

    impl Item for Sent {
        fn run(&self) -> Run {
            self.run
        }
        fn delivered(&mut self, now_ms: i64) {
            self.changes.push(format!("delivered at {now_ms}"));
        }
        fn retry_at(&mut self, at_ms: i64, failing_since_ms: Option<i64>, why: &str) {
            let change = format!("retry at {at_ms} failing since {failing_since_ms:?}: {why}");
            self.changes.push(change);
        }
        fn park(&mut self, why: &str, now_ms: i64) {
            self.changes.push(format!("parked at {now_ms}: {why}"));
        }
        fn give_up(&mut self, failing_ms: i64, why: &str, now_ms: i64) {
            let change = format!("given up at {now_ms} after failing {failing_ms}: {why}");
            self.changes.push(change);
        }
    }

    const NOW: i64 = 100_000;
    const BACKOFF: Backoff = Backoff::new(1_000, 60_000);
    /// The job's effect: never given up.
    const JOB: Policy = Policy {
        backoff: BACKOFF,
        give_up_after_ms: None,
    };
    /// A result's: given up after failing 10 s.
    const RESULT: Policy = Policy {
        backoff: BACKOFF,
        give_up_after_ms: Some(10_000),
    };

    /// What `heard` does to an item with `attempts` and `since`, under `policy`, at `jitter`:
    /// the answer applied and the item's one change.
    fn applied(
        heard: Heard,
        (attempts, since): (u32, Option<i64>),
        policy: Policy,
        jitter: f64,
    ) -> (Applied, String) {
        let run = Run {
            attempts,
            failing_since_ms: since,
        };
        let mut item = Sent {
            run,
            ..Sent::default()
        };
        let applied = match apply(&mut item, heard, policy, NOW, jitter) {
            Next::Delivered => Applied::Delivered,
            Next::RetryAt { at_ms, .. } => Applied::RetryAt(at_ms),
            Next::Park(_) => Applied::Refused,
            Next::GaveUp { .. } => Applied::GaveUp,
        };
        assert_eq!(item.changes.len(), 1, "one change: {:?}", item.changes);
        (applied, item.changes.remove(0))
    }

    #[test]
    fn a_2xx_delivers_whatever_the_run() {
        let ok = AttemptOutcome::Delivered;
        for policy in [JOB, RESULT] {
            let got = applied(Heard::Answer(&ok, Some(5_000)), (9, Some(0)), policy, 1.0);
            assert_eq!(got, (Applied::Delivered, "delivered at 100000".into()));
        }
    }

    #[test]
    fn a_failure_is_retried_after_the_jittered_backoff_or_the_longer_asked_wait() {
        let busy = AttemptOutcome::Retry("503".into());
        let retried = |at: i64, since: i64| {
            let change = format!("retry at {at} failing since Some({since}): 503");
            (Applied::RetryAt(at), change)
        };
        // The first failure starts the clock; the third waits 4 s, a quarter less at most.
        let first = applied(Heard::Answer(&busy, None), (1, None), RESULT, 1.0);
        assert_eq!(first, retried(101_000, NOW));
        let third = applied(Heard::Answer(&busy, None), (3, Some(95_000)), RESULT, 1.0);
        assert_eq!(third, retried(104_000, 95_000));
        let jittered = applied(Heard::Answer(&busy, None), (3, Some(95_000)), RESULT, 0.0);
        assert_eq!(jittered, retried(103_000, 95_000));
        // A longer Retry-After is waited, within the cap; a shorter one is not.
        let asked = applied(Heard::Answer(&busy, Some(20_000)), (1, None), JOB, 0.0);
        assert_eq!(asked, retried(120_000, NOW));
        let capped = applied(Heard::Answer(&busy, Some(86_400_000)), (1, None), JOB, 1.0);
        assert_eq!(capped, retried(160_000, NOW));
        let shorter = applied(Heard::Answer(&busy, Some(10)), (2, None), JOB, 1.0);
        assert_eq!(shorter, retried(102_000, NOW));
        // Nothing heard: retried, with no clock started.
        let nothing = applied(Heard::Nothing("sender failed"), (2, None), RESULT, 1.0);
        let change = "retry at 102000 failing since None: sender failed".to_string();
        assert_eq!(nothing, (Applied::RetryAt(102_000), change));
    }

    #[test]
    fn a_refusal_parks_at_once_for_the_job_and_a_result() {
        let no = AttemptOutcome::Park("400: bad".into());
        for (policy, run) in [
            (JOB, (1, None)),
            (RESULT, (1, None)),
            (RESULT, (9, Some(0))),
        ] {
            let got = applied(Heard::Answer(&no, None), run, policy, 1.0);
            assert_eq!(got, (Applied::Refused, "parked at 100000: 400: bad".into()));
        }
    }

    #[test]
    fn a_result_failing_past_its_limit_is_given_up_after_one_retry_at_least() {
        let busy = AttemptOutcome::Retry("503".into());
        let heard = Heard::Answer(&busy, None);
        let got = applied(heard, (2, Some(90_000)), RESULT, 1.0);
        let change = "given up at 100000 after failing 10000: 503".to_string();
        assert_eq!(got, (Applied::GaveUp, change));
        // Past the limit at its first attempt: one retry first.
        let first = applied(heard, (1, Some(0)), RESULT, 1.0);
        assert_eq!(first.0, Applied::RetryAt(101_000));
        // Within the limit: retried.
        let within = applied(heard, (2, Some(95_000)), RESULT, 1.0);
        assert_eq!(within.0, Applied::RetryAt(102_000));
    }

    /// An item with no way of its own to give up is parked as for a refusal.
    #[test]
    fn giving_up_parks_by_default() {
        struct Parks(Vec<String>);
        impl Item for Parks {
            fn run(&self) -> Run {
                Run {
                    attempts: 2,
                    failing_since_ms: Some(0),
                }
            }
            fn delivered(&mut self, _: i64) {}
            fn retry_at(&mut self, _: i64, _: Option<i64>, _: &str) {}
            fn park(&mut self, why: &str, now_ms: i64) {
                self.0.push(format!("parked at {now_ms}: {why}"));
            }
        }
        let busy = AttemptOutcome::Retry("503".into());
        let mut item = Parks(Vec::new());
        let next = apply(&mut item, Heard::Answer(&busy, None), RESULT, NOW, 1.0);
        let why = "503".to_string();
        assert_eq!(
            next,
            Next::GaveUp {
                failing_ms: NOW,
                why
            }
        );
        assert_eq!(item.0, ["parked at 100000: 503"]);
    }

    #[test]
    fn the_jobs_effect_is_never_given_up() {
        let busy = AttemptOutcome::Retry("503".into());
        let heard = Heard::Answer(&busy, None);
        for (attempts, since) in [(2, Some(90_000)), (9, Some(0)), (40, Some(i64::MIN / 2))] {
            let (got, _) = applied(heard, (attempts, since), JOB, 1.0);
            assert!(
                matches!(got, Applied::RetryAt(_)),
                "{attempts} {since:?}: {got:?}"
            );
            let (result, _) = applied(heard, (attempts, since), RESULT, 1.0);
            assert_eq!(result, Applied::GaveUp, "{attempts} {since:?}");
        }
    }
}
