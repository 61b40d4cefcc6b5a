//! What a send's answers mean, for the job's effect and a batch's results alike (the job's
//! effect is a batch of one): each answer's [`Sending`], and how the sends went as the
//! destination's desk hears it ([`Sent`]).
//!
//! Guarantees: an answer means for either what [`outcome`] says; one a result sender did not
//! bring back is [`Sending::Unanswered`], no failure of the destination: the desk hears only
//! of the answers the destination gave.

use crate::destination::protocol::Sent;
use crate::retry::{AttemptOutcome, Class, PeerAnswer};

/// How a send ended, as a step commits it.
#[derive(Debug, Clone, PartialEq)]
pub enum Sending {
    /// What the destination's answer means (a timeout or a network failure on the way to it
    /// included): its health and its desk hear of it.
    Answered(AttemptOutcome),
    /// The destination's answer, brought back by a result sender: as `Answered`, and the
    /// senders answer.
    Carried(AttemptOutcome),
    /// The result sender that carried it answered nothing usable (its call failed or passed
    /// its bound, `results::fanout`), saying why: [`crate::retry::Heard::Nothing`], not
    /// counted as failed.
    Unanswered(String),
}

#[cfg(test)]
impl From<AttemptOutcome> for Sending {
    fn from(outcome: AttemptOutcome) -> Sending {
        Sending::Answered(outcome)
    }
}

#[cfg(test)]
impl From<&AttemptOutcome> for Sending {
    fn from(outcome: &AttemptOutcome) -> Sending {
        Sending::Answered(outcome.clone())
    }
}

/// What the destination's answer to an attempt means for the side effect: its class
/// ([`PeerAnswer::class`]) decides, its summary is kept for the operator (a timeout says how long
/// it waited). An attempt keeps an excerpt, which is never refused for its size.
pub fn outcome(answer: &PeerAnswer, timeout_ms: i64) -> AttemptOutcome {
    let said = match answer {
        PeerAnswer::Timeout => format!("timeout after {timeout_ms} ms"),
        _ => answer.summary(),
    };
    match answer.class() {
        Class::Success => AttemptOutcome::Delivered,
        Class::Retry => AttemptOutcome::Retry(said),
        Class::Refused => AttemptOutcome::Park(said),
    }
}

/// A send's answers, read.
#[derive(Debug, Clone, PartialEq)]
pub struct Answered {
    /// Each send's outcome, in the order of the requests.
    pub outcomes: Vec<Sending>,
    /// Each send's HTTP status, when the destination answered one (a job's history row).
    pub statuses: Vec<Option<u16>>,
    /// How the sends went, as the desk hears it.
    pub sent: Sent,
    /// When the answers were read: the sends' end.
    pub at_ms: i64,
}

/// What a send's `answers` mean at `now` (`carried`: brought back by the result senders;
/// `Err`: a sender answered nothing), a timeout said as waited for `timeout_ms`.
pub fn answered(
    answers: Vec<Result<PeerAnswer, String>>,
    carried: bool,
    timeout_ms: i64,
    now: i64,
) -> Answered {
    let sent = Sent::of(answers.iter().flatten(), now);
    let statuses = answers.iter().map(|answer| match answer {
        Ok(PeerAnswer::Http { status, .. }) => Some(*status),
        _ => None,
    });
    let statuses = statuses.collect();
    let outcomes = answers.into_iter().map(|answer| match answer {
        Ok(answer) if carried => Sending::Carried(outcome(&answer, timeout_ms)),
        Ok(answer) => Sending::Answered(outcome(&answer, timeout_ms)),
        Err(why) => Sending::Unanswered(why),
    });
    Answered {
        outcomes: outcomes.collect(),
        statuses,
        sent,
        at_ms: now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: i64 = 10_000;
    const NOW: i64 = 1_000_000;

    fn http(status: u16, retry_after: Option<&str>) -> PeerAnswer {
        PeerAnswer::Http {
            status,
            body: "said".into(),
            retry_after: retry_after.map(str::to_string),
        }
    }

    fn answers() -> Vec<PeerAnswer> {
        vec![
            http(200, None),
            http(429, Some("7")),
            http(503, Some("Thu, 01 Jan 1970 00:20:00 GMT")),
            http(400, None),
            http(500, None),
            PeerAnswer::TooLarge {
                status: 200,
                cap: 10,
            },
            PeerAnswer::Timeout,
            PeerAnswer::Network("reset".into()),
        ]
    }

    /// A job's one answer reads as its attempt read it before it went through here: its
    /// outcome, its status, the wait it asked for (the `Sent`'s, one answer's), the desk's
    /// `Sent` and the attempt's end.
    #[test]
    fn a_jobs_one_answer_means_what_its_attempt_read() {
        for answer in answers() {
            let read = answered(vec![Ok(answer.clone())], false, TIMEOUT, NOW);
            let status = match &answer {
                PeerAnswer::Http { status, .. } => Some(*status),
                _ => None,
            };
            let was = Sending::Answered(outcome(&answer, TIMEOUT));
            assert_eq!(read.outcomes, vec![was]);
            assert_eq!(read.statuses, vec![status]);
            assert_eq!(read.sent, Sent::of([&answer], NOW));
            assert_eq!(read.sent.asked_wait_ms, answer.asked_wait_ms(NOW));
            assert_eq!(read.at_ms, NOW);
        }
        let waits = |a: &PeerAnswer| answered(vec![Ok(a.clone())], false, TIMEOUT, NOW);
        assert_eq!(waits(&answers()[1]).sent.asked_wait_ms, Some(7_000));
        assert_eq!(waits(&answers()[2]).sent.asked_wait_ms, Some(200_000));
        let timeout = waits(&PeerAnswer::Timeout).outcomes;
        let said = AttemptOutcome::Retry(format!("timeout after {TIMEOUT} ms"));
        assert_eq!(timeout, vec![Sending::Answered(said)]);
    }

    /// A step's answers, in order: each carried one as the destination's, each a sender did
    /// not bring back unanswered and unknown to the desk; sent from the gate, each answered.
    #[test]
    fn a_steps_answers_keep_their_order_and_the_desk_hears_only_the_destinations() {
        let mut mixed: Vec<Result<PeerAnswer, String>> = answers().into_iter().map(Ok).collect();
        mixed.insert(1, Err("no answer within 5 ms".into()));
        let read = answered(mixed.clone(), true, TIMEOUT, NOW);
        assert_eq!(read.outcomes.len(), mixed.len());
        for (sending, answer) in read.outcomes.iter().zip(&mixed) {
            let was = match answer {
                Ok(answer) => Sending::Carried(outcome(answer, TIMEOUT)),
                Err(why) => Sending::Unanswered(why.clone()),
            };
            assert_eq!(*sending, was);
        }
        assert_eq!(read.sent, Sent::of(&answers(), NOW));
        assert_eq!(read.sent.sent, 8);
        assert_eq!(read.sent.failures, 5);
        assert_eq!(read.sent.asked_wait_ms, Some(200_000));
        assert_eq!(read.statuses[1], None);
        assert_eq!(read.statuses[2], Some(429));

        let direct = answered(vec![Ok(http(200, None))], false, TIMEOUT, NOW);
        assert_eq!(
            direct.outcomes,
            vec![Sending::Answered(AttemptOutcome::Delivered)]
        );
        let none = answered(Vec::new(), true, TIMEOUT, NOW);
        assert_eq!((none.outcomes.len(), none.sent), (0, Sent::default()));
    }

    #[test]
    fn answers_are_classified() {
        let http = |status: u16, body: &str| PeerAnswer::Http {
            status,
            body: body.to_string(),
            retry_after: None,
        };
        let classify = |status, body| outcome(&http(status, body), 10_000);
        assert_eq!(classify(200, ""), AttemptOutcome::Delivered);
        assert_eq!(classify(204, ""), AttemptOutcome::Delivered);
        for s in [408, 409, 429, 500, 502, 503, 599] {
            assert!(matches!(classify(s, ""), AttemptOutcome::Retry(_)), "{s}");
        }
        for s in [300, 400, 401, 403, 404, 410, 422] {
            assert!(matches!(classify(s, ""), AttemptOutcome::Park(_)), "{s}");
        }
        assert_eq!(
            classify(400, "bad request"),
            AttemptOutcome::Park("400: bad request".into())
        );
        assert_eq!(
            classify(503, &"é".repeat(300)),
            AttemptOutcome::Retry(format!("503: {}", "é".repeat(200)))
        );
        assert_eq!(
            outcome(&PeerAnswer::Timeout, 10_000),
            AttemptOutcome::Retry("timeout after 10000 ms".into())
        );
        assert_eq!(
            outcome(&PeerAnswer::Network("reset".into()), 10_000),
            AttemptOutcome::Retry("network: reset".into())
        );
    }
}
