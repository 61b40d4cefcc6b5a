//! When a call the worker makes is tried again, answered once for every caller. Whether: the
//! one answer type ([`PeerAnswer`]) and classification ([`Class`]) of every call to a peer (a
//! destination, Gemini's status API and webhook listing, an alert sink, the key-set endpoint).
//! When: the one backoff formula ([`Backoff`]) that effects, alerts, confirmations, ledger
//! writes, a failed alarm and a desk's probes all take. What next: the one decision of what an
//! attempt's answer means for the item it sent, the job's effect or a result, applied to it
//! ([`item::apply`]: [`Next`]).
//!
//! Guarantees: a 2xx is a success; a timeout, a network error, 408, 409, 429 and any 5xx are
//! worth retrying later (with backoff, or after the peer's `Retry-After`); every other answer,
//! and a body wanted whole that ran past its cap, is a refusal the peer will repeat. A wait
//! doubles from its first step and never passes its cap, nor does an asked wait. It sits below
//! `operation/` and `destination/`, so both call it rather than copy it. Jitter is a parameter.

pub mod item;

use crate::timestamp::parse_http_date_ms;

/// How an outbound answer ended, for the caller's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Success,
    /// Try again later: the peer or the path to it may recover.
    Retry,
    /// The peer refused and will refuse again.
    Refused,
}

/// The class of an HTTP status.
pub fn class_of_status(status: u16) -> Class {
    match status {
        200..=299 => Class::Success,
        408 | 409 | 429 | 500..=599 => Class::Retry,
        _ => Class::Refused,
    }
}

/// How an outbound call ended. `B` is the body as the call kept it: an excerpt, or a 2xx body
/// wanted whole (`String`); a status answer's body as the skimmer read it
/// ([`crate::reconciliation::status::StatusAnswer`]).
///
/// It is plain JSON too: a result sender hands the gate its destination's answers as they are.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PeerAnswer<B = String> {
    /// The peer answered: its status, its body as kept, its Retry-After.
    Http {
        status: u16,
        body: B,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after: Option<String>,
    },
    /// A 2xx body wanted whole ran past `cap` bytes: refused, and read no further.
    TooLarge { status: u16, cap: usize },
    /// The deadline passed first; the request was aborted.
    Timeout,
    /// The request could not be made or the connection failed.
    Network(String),
}

impl<B> PeerAnswer<B> {
    /// Whether a retry can help: a timeout or a network error is worth retrying; an answer is
    /// classified by its status.
    pub fn class(&self) -> Class {
        match self {
            PeerAnswer::Http { status, .. } => class_of_status(*status),
            // The peer would send the same body again: asking again soon does not help.
            PeerAnswer::TooLarge { .. } => Class::Refused,
            PeerAnswer::Timeout | PeerAnswer::Network(_) => Class::Retry,
        }
    }

    /// How long the peer asked to be left alone, from `now_ms`: a 429 or 503's `Retry-After`,
    /// in seconds or as an HTTP date (RFC 9110 §10.2.3). `None` without one, when it cannot be
    /// read, or on any other answer; a date already past asks for no wait (`Some(0)`).
    pub fn asked_wait_ms(&self, now_ms: i64) -> Option<i64> {
        let PeerAnswer::Http {
            status: 429 | 503,
            retry_after: Some(value),
            ..
        } = self
        else {
            return None;
        };
        let value = value.trim();
        if let Ok(secs) = value.parse::<u32>() {
            return Some(i64::from(secs) * 1_000);
        }
        parse_http_date_ms(value).map(|at| (at - now_ms).max(0))
    }
}

impl PeerAnswer {
    /// The answer in a few words, for logs and records.
    pub fn summary(&self) -> String {
        match self {
            PeerAnswer::Http { status, body, .. } => {
                format!("{status}: {}", body.chars().take(200).collect::<String>())
            }
            PeerAnswer::TooLarge { status, cap } => {
                format!("{status}: body over {cap} bytes, refused unread past the cap")
            }
            PeerAnswer::Timeout => "timeout".to_string(),
            PeerAnswer::Network(e) => format!("network: {e}"),
        }
    }
}

/// A capped exponential backoff: the wait after `failures` failures in a row (0 counts as 1) is
/// `first_ms * 2^(failures - 1)`, never more than `max_ms` (nor less than `first_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub first_ms: i64,
    pub max_ms: i64,
}

impl Backoff {
    pub const fn new(first_ms: i64, max_ms: i64) -> Backoff {
        Backoff { first_ms, max_ms }
    }

    /// The one formula.
    pub fn after(self, failures: u32) -> i64 {
        let doubled = self
            .first_ms
            .saturating_mul(1 << failures.saturating_sub(1).min(30));
        doubled.min(self.max_ms.max(self.first_ms))
    }

    /// [`Backoff::after`] shortened by up to a quarter (`jitter` in [0, 1)), so that callers
    /// failing together do not retry in lockstep.
    pub fn jittered(self, failures: u32, jitter: f64) -> i64 {
        (self.after(failures) as f64 * (0.75 + 0.25 * jitter.clamp(0.0, 1.0))) as i64
    }

    /// The step after `wait_ms` (one this backoff gave, or 0), for a caller that keeps its
    /// last wait rather than its count of failures.
    pub fn following(self, wait_ms: i64) -> i64 {
        let steps = (1..32).find(|&n| self.after(n) >= wait_ms).unwrap_or(32);
        self.after(steps + 1)
    }
}

/// How one attempt ended, as its sender saw it: the class of the destination's answer
/// ([`Class`]), with the answer in a few words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptOutcome {
    Delivered,
    Retry(String),
    Park(String),
}

/// What the sender of an attempt heard back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard<'a> {
    /// The destination's answer, and the wait it asked for ([`PeerAnswer::asked_wait_ms`]).
    Answer(&'a AttemptOutcome, Option<i64>),
    /// Nothing, and why (a result sender's call failed): the item may have reached the
    /// destination, which was not judged, so it is never parked for it and its failing clock
    /// stays as it was (a running one runs on, none starts).
    Nothing(&'a str),
}

/// An item's run of failures (the job's effect, or one result), as its record keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Run {
    /// Attempts in the run, the one just answered included: the backoff's step.
    pub attempts: u32,
    /// When the run's first failure was answered: `None` before it, or where none is kept.
    pub failing_since_ms: Option<i64>,
}

/// What happens next to the item an attempt sent: accepted, sent again, or parked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    Delivered,
    /// Sent again no sooner than `at_ms` (`why`: what answered), with the run's clock.
    RetryAt {
        at_ms: i64,
        failing_since_ms: Option<i64>,
        why: String,
    },
    /// Refused for good: parked, with the answer.
    Park(String),
    /// Failing `failing_ms`, past its threshold: parked, and an alert is owed.
    GaveUp {
        failing_ms: i64,
        why: String,
    },
}

#[cfg(test)]
impl Next {
    /// A retry at `at_ms` after `why`, with no clock kept (a job's effect).
    pub fn retry(why: String, at_ms: i64) -> Next {
        let failing_since_ms = None;
        Next::RetryAt {
            at_ms,
            failing_since_ms,
            why,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_429_or_503_says_how_long_to_wait_in_seconds_or_as_a_date() {
        let now = 784_111_777_000; // Sun, 06 Nov 1994 08:49:37 GMT
        let asked = |status, value: &str| {
            PeerAnswer::Http {
                status,
                body: String::new(),
                retry_after: Some(value.to_string()),
            }
            .asked_wait_ms(now)
        };
        assert_eq!(asked(429, "4"), Some(4_000));
        assert_eq!(asked(503, " 120 "), Some(120_000));
        assert_eq!(asked(503, "Sun, 06 Nov 1994 08:49:47 GMT"), Some(10_000));
        assert_eq!(asked(503, "Sun, 06 Nov 1994 08:00:00 GMT"), Some(0));
        for junk in ["soon", "-4", "4.5", ""] {
            assert_eq!(asked(429, junk), None, "{junk}");
        }
        // Only where HTTP gives Retry-After that meaning.
        assert_eq!(asked(500, "4"), None);
        assert_eq!(asked(200, "4"), None);
        assert_eq!(PeerAnswer::<String>::Timeout.asked_wait_ms(now), None);
    }

    #[test]
    fn statuses_are_classified_once() {
        for s in [200, 201, 202, 204, 299] {
            assert_eq!(class_of_status(s), Class::Success, "{s}");
        }
        for s in [408, 409, 429, 500, 502, 503, 504, 599] {
            assert_eq!(class_of_status(s), Class::Retry, "{s}");
        }
        for s in [100, 301, 304, 400, 401, 403, 404, 410, 413, 422, 600] {
            assert_eq!(class_of_status(s), Class::Refused, "{s}");
        }
    }

    #[test]
    fn an_answer_is_classified_by_its_status_and_no_answer_is_worth_retrying() {
        let http = |status| PeerAnswer::Http {
            status,
            body: "x".repeat(300),
            retry_after: None,
        };
        assert_eq!(http(204).class(), Class::Success);
        assert_eq!(http(503).class(), Class::Retry);
        assert_eq!(http(400).class(), Class::Refused);
        let too_large: PeerAnswer = PeerAnswer::TooLarge {
            status: 200,
            cap: 10,
        };
        assert_eq!(too_large.class(), Class::Refused);
        assert_eq!(PeerAnswer::<String>::Timeout.class(), Class::Retry);
        assert_eq!(
            PeerAnswer::<String>::Network("reset".into()).class(),
            Class::Retry
        );
        assert_eq!(http(400).summary(), format!("400: {}", "x".repeat(200)));
        assert_eq!(
            too_large.summary(),
            "200: body over 10 bytes, refused unread past the cap"
        );
        assert_eq!(PeerAnswer::<String>::Timeout.summary(), "timeout");
        assert_eq!(
            PeerAnswer::<String>::Network("reset".into()).summary(),
            "network: reset"
        );
    }

    #[test]
    fn the_one_backoff_doubles_from_its_first_step_to_its_cap() {
        let b = Backoff::new(30_000, 3_600_000);
        let waits: Vec<i64> = (1..=9).map(|n| b.after(n)).collect();
        assert_eq!(
            waits,
            [30_000, 60_000, 120_000, 240_000, 480_000, 960_000, 1_920_000, 3_600_000, 3_600_000]
        );
        assert_eq!(b.after(0), 30_000);
        assert_eq!(b.after(u32::MAX), 3_600_000);
        // Jitter shortens by at most a quarter, never lengthens.
        assert_eq!(b.jittered(1, 1.0), 30_000);
        assert_eq!(b.jittered(1, 0.0), 22_500);
        assert_eq!(b.jittered(200, 0.5), 3_150_000);
        // A cap below the first step holds the first step.
        assert_eq!(Backoff::new(2_000, 500).after(4), 2_000);
        // A kept wait steps to the next one, and stays at the cap.
        let probe = Backoff::new(2_000, 15_000);
        assert_eq!(probe.following(0), 4_000);
        assert_eq!(probe.following(2_000), 4_000);
        assert_eq!(probe.following(8_000), 15_000);
        assert_eq!(probe.following(15_000), 15_000);
    }

    const B: Backoff = Backoff::new(1_000, 60_000);

    /// A run as an item that keeps nothing: what an answer means next for it
    /// ([`item::apply`], under the backoff `B` and the patience `give_up`).
    impl item::Item for Run {
        fn run(&self) -> Run {
            *self
        }
        fn delivered(&mut self, _: i64) {}
        fn retry_at(&mut self, _: i64, _: Option<i64>, _: &str) {}
        fn park(&mut self, _: &str, _: i64) {}
    }

    fn decide(heard: Heard, run: Run, give_up: Option<i64>, now: i64, jitter: f64) -> Next {
        let policy = item::Policy {
            backoff: B,
            give_up_after_ms: give_up,
        };
        item::apply(&mut run.clone(), heard, policy, now, jitter)
    }
    /// The job's effect: never given up.
    const JOB: Option<i64> = None;
    /// A result's: given up after failing 10 s.
    const RESULT: Option<i64> = Some(10_000);

    fn retry_at(at_ms: i64, since: Option<i64>, why: &str) -> Next {
        let why = why.to_string();
        Next::RetryAt {
            at_ms,
            failing_since_ms: since,
            why,
        }
    }

    #[test]
    fn a_peers_asked_wait_moves_the_next_attempt_within_the_cap() {
        let busy = AttemptOutcome::Retry("503".into());
        // attempts, asked wait, the next attempt's wait (no jitter).
        let table = [
            (1, None, 1_000),
            (3, None, 4_000),
            (3, Some(500), 4_000),
            (3, Some(30_000), 30_000),
            (3, Some(86_400_000), 60_000),
            (20, Some(0), 60_000),
        ];
        for (attempts, asked, wait) in table {
            let run = Run {
                attempts,
                failing_since_ms: None,
            };
            let next = decide(Heard::Answer(&busy, asked), run, JOB, 0, 1.0);
            assert_eq!(next, retry_at(wait, Some(0), "503"), "{attempts} {asked:?}");
        }
    }

    #[test]
    fn whether_an_answer_is_retried_then_when() {
        let http = |status, retry_after: Option<&str>| PeerAnswer::Http {
            status,
            body: String::new(),
            retry_after: retry_after.map(str::to_string),
        };
        // answer, whether it is retried, the wait before the next attempt after 2 failures.
        let table: [(PeerAnswer, Class, Option<i64>); 6] = [
            (http(204, None), Class::Success, None),
            (http(400, Some("5")), Class::Refused, None),
            (http(503, None), Class::Retry, Some(2_000)),
            (http(429, Some("30")), Class::Retry, Some(30_000)),
            (http(503, Some("7200")), Class::Retry, Some(60_000)),
            (PeerAnswer::Timeout, Class::Retry, Some(2_000)),
        ];
        let run = Run {
            attempts: 2,
            failing_since_ms: None,
        };
        for (answer, class, wait) in table {
            assert_eq!(answer.class(), class, "{answer:?}");
            let outcome = match class {
                Class::Success => AttemptOutcome::Delivered,
                Class::Retry => AttemptOutcome::Retry("x".into()),
                Class::Refused => AttemptOutcome::Park("x".into()),
            };
            let heard = Heard::Answer(&outcome, answer.asked_wait_ms(0));
            let next = match decide(heard, run, JOB, 0, 1.0) {
                Next::RetryAt { at_ms, .. } => Some(at_ms),
                _ => None,
            };
            assert_eq!(next, wait, "{answer:?}");
        }
    }

    /// One row per branch of [`item::apply`], for the job's effect (no threshold) and a result (10 s).
    #[test]
    fn what_an_answer_means_next_for_the_job_and_a_result_alike() {
        let ok = AttemptOutcome::Delivered;
        let busy = AttemptOutcome::Retry("503".into());
        let no = AttemptOutcome::Park("400".into());
        let run = |attempts, failing_since_ms| Run {
            attempts,
            failing_since_ms,
        };
        let given_up = |failing_ms| Next::GaveUp {
            failing_ms,
            why: "503".into(),
        };
        // case, what was heard at 100_000, the run, the patience, what comes next.
        let table: Vec<(&str, Heard, Run, Option<i64>, Next)> = vec![
            (
                "a 2xx",
                Heard::Answer(&ok, None),
                run(3, Some(0)),
                RESULT,
                Next::Delivered,
            ),
            (
                "a refusal parks at once",
                Heard::Answer(&no, None),
                run(1, None),
                RESULT,
                Next::Park("400".into()),
            ),
            (
                "a refusal past the threshold is still a refusal",
                Heard::Answer(&no, None),
                run(9, Some(0)),
                RESULT,
                Next::Park("400".into()),
            ),
            (
                "a first failure starts the clock",
                Heard::Answer(&busy, None),
                run(1, None),
                RESULT,
                retry_at(101_000, Some(100_000), "503"),
            ),
            (
                "the clock runs on, the backoff doubles",
                Heard::Answer(&busy, None),
                run(3, Some(95_000)),
                RESULT,
                retry_at(104_000, Some(95_000), "503"),
            ),
            (
                "a Retry-After longer than the backoff",
                Heard::Answer(&busy, Some(20_000)),
                run(1, None),
                RESULT,
                retry_at(120_000, Some(100_000), "503"),
            ),
            (
                "failing past the threshold gives up",
                Heard::Answer(&busy, None),
                run(2, Some(90_000)),
                RESULT,
                given_up(10_000),
            ),
            (
                "past the threshold, one retry first",
                Heard::Answer(&busy, None),
                run(1, Some(0)),
                RESULT,
                retry_at(101_000, Some(0), "503"),
            ),
            (
                "the job's effect is never given up",
                Heard::Answer(&busy, None),
                run(9, Some(0)),
                JOB,
                retry_at(160_000, Some(0), "503"),
            ),
            (
                "a threshold of 0 gives up at the first retry's failure",
                Heard::Answer(&busy, None),
                run(2, None),
                Some(0),
                given_up(0),
            ),
            (
                "no answer keeps no clock it did not have",
                Heard::Nothing("sender failed"),
                run(2, None),
                RESULT,
                retry_at(102_000, None, "sender failed"),
            ),
            (
                "no answer is never given up",
                Heard::Nothing("sender failed"),
                run(9, Some(0)),
                RESULT,
                retry_at(160_000, Some(0), "sender failed"),
            ),
        ];
        for (case, heard, run, give_up, next) in table {
            assert_eq!(decide(heard, run, give_up, 100_000, 1.0), next, "{case}");
        }
    }

    #[test]
    fn a_retry_is_jittered_down_by_a_quarter_at_most() {
        let busy = AttemptOutcome::Retry("503".into());
        let heard = Heard::Answer(&busy, None);
        let at = |jitter| match decide(heard, Run::default(), JOB, 0, jitter) {
            Next::RetryAt { at_ms, .. } => at_ms,
            other => panic!("{other:?}"),
        };
        assert_eq!((at(0.0), at(1.0)), (750, 1_000));
        // An asked wait is not shortened.
        let asked = Heard::Answer(&busy, Some(5_000));
        let next = decide(asked, Run::default(), JOB, 0, 0.0);
        assert_eq!(next, retry_at(5_000, Some(0), "503"));
    }
}
