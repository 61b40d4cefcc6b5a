//! A step's results fanned out past one invocation's 6 connections: how a step's sends are
//! split among result senders (each its own invocation, with its own 6 connections), and what
//! goes to a sender and comes back.
//!
//! Guarantees: a step of at most [`SENDS_IN_FLIGHT`] results goes from the gate itself; a
//! larger one is split into at most [`SENDERS`] groups of at most [`CHUNK_RESULTS`], in order,
//! covering each result once, sizes within one of each other so they end together. The gate
//! calls at most [`SENDERS`] at once, each call one of its own 6 connections, and a sender
//! sends at most [`SENDS_IN_FLIGHT`] at a time: every invocation keeps production's limit. A
//! request comes back unchanged (the same headers, so the same `webhook-id` and signature, and
//! body); the gate alone claims and commits (`progress`), so a sender holds no state and a kill
//! anywhere is the gate's claim sent again. The gate waits for a sender no longer than
//! [`call_bound_ms`]; a sender that fails, answers something else or passes its bound answers
//! nothing for its group ([`group_answers`]): those results were not judged (the destination's
//! health and the desk hear nothing) and are sent again later under their same ids.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::destination_label::Destination;
use crate::operation::effect::EffectRequest;
pub use crate::results::progress::SENDERS;
use crate::results::progress::{CHUNK_RESULTS, SENDS_IN_FLIGHT};
use crate::retry::PeerAnswer;

/// The groups `n` results go in, one a sender, as ranges of their order; empty when the gate
/// sends them itself (no more than one round trip's worth).
pub fn groups(n: usize) -> Vec<Range<usize>> {
    if n <= SENDS_IN_FLIGHT {
        return Vec::new();
    }
    let by_size = n.div_ceil(CHUNK_RESULTS as usize);
    let by_time = n.div_ceil(SENDS_IN_FLIGHT).min(SENDERS);
    let g = by_size.max(by_time);
    // The first `extra` groups take one more.
    let (base, extra) = (n / g, n % g);
    let start = |i: usize| i * base + i.min(extra);
    (0..g).map(|i| start(i)..start(i + 1)).collect()
}

/// What a sender's call may take past its sends' own deadlines: the way there and back and a
/// sender's cold start (its wasm compiled) take well under this, so a sender that answers
/// later than its sends can take has failed (stopped, or cut off), and its group is sent
/// again rather than holding the gate's alarm for as long as the runtime allows.
pub const SENDER_MARGIN_MS: i64 = 5_000;

/// How long the gate waits for a sender's answer to a group of `n` sends: each leaves no
/// sooner than its `after_ms` from the sender's start (the latest, `last_after_ms`) and at
/// most [`SENDS_IN_FLIGHT`] are in flight, each bounded by `timeout_ms`, so the sends end
/// within `last_after_ms` and one `timeout_ms` a round; then [`SENDER_MARGIN_MS`]. `cap`
/// (`RESULTS_SENDER_TIMEOUT_MS`, when set) shortens it, never lengthens it.
pub fn call_bound_ms(n: usize, timeout_ms: i64, last_after_ms: u64, cap: Option<i64>) -> i64 {
    let rounds = n.div_ceil(SENDS_IN_FLIGHT) as i64;
    let bound = (last_after_ms as i64)
        .saturating_add(rounds.saturating_mul(timeout_ms.max(1)))
        .saturating_add(SENDER_MARGIN_MS);
    cap.map_or(bound, |cap| bound.min(cap.max(1)))
}

/// A group's answers, one a send, from its sender's reply (`Err`: the call failed or passed
/// its bound, saying why): the destination's answer for each send, or `Err` for each (its
/// sender answered nothing usable: a sender may have sent before failing, so each result is
/// sent again under its same `webhook-id`, and none is a failure of the destination).
pub fn group_answers(
    reply: Result<Vec<PeerAnswer>, String>,
    n: usize,
) -> Vec<Result<PeerAnswer, String>> {
    let why = match reply {
        Ok(answers) if answers.len() == n => return answers.into_iter().map(Ok).collect(),
        Ok(answers) => format!("{} answers for {n} sends", answers.len()),
        Err(why) => why,
    };
    vec![Err(format!("result sender: {why}")); n]
}

/// The headers a side effect's request carries ([`crate::operation::effect::signed_request`]):
/// a sender takes back only these names.
pub const HEADER_NAMES: [&str; 7] = [
    "content-type",
    "user-agent",
    "idempotency-key",
    "effect-generation",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
];

/// One result's request, signed by the gate, and when it may leave (ms from the sender's
/// start: a paced route's token).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireSend {
    pub headers: Vec<(String, String)>,
    pub body: String,
    #[serde(default, skip_serializing_if = "crate::is_default")]
    pub after_ms: u64,
}

/// What the gate asks a sender: send these, to there, each within `timeout_ms`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SendOrder {
    pub to: Destination,
    pub timeout_ms: i64,
    pub sends: Vec<WireSend>,
}

impl WireSend {
    /// The request as the gate built it, to go at `after_ms`.
    pub fn of(request: &EffectRequest, after_ms: u64) -> WireSend {
        WireSend {
            headers: request
                .headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            body: request.body.clone(),
            after_ms,
        }
    }

    /// The request again, for the sender to send; `Err` names a header no side effect carries
    /// (then nothing is sent).
    pub fn request(self) -> Result<EffectRequest, String> {
        let headers = self
            .headers
            .into_iter()
            .map(|(k, v)| match HEADER_NAMES.iter().find(|n| **n == k) {
                Some(name) => Ok((*name, v)),
                None => Err(format!("a result sender sends no header {k:?}")),
            })
            .collect::<Result<_, _>>()?;
        let body = self.body;
        Ok(EffectRequest { headers, body })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operation::effect::signed_request;
    use crate::results::progress::WAVE_RESULTS;
    use crate::signature::Secret;

    #[test]
    fn a_few_go_from_the_gate_and_more_are_split_evenly_in_order() {
        assert!(groups(0).is_empty());
        assert!(groups(SENDS_IN_FLIGHT).is_empty());
        for n in (SENDS_IN_FLIGHT + 1)..=(WAVE_RESULTS as usize) {
            let g = groups(n);
            assert!(g.len() <= SENDERS, "{n}: {} senders", g.len());
            assert_eq!(g.first().unwrap().start, 0);
            assert_eq!(g.last().unwrap().end, n);
            for pair in g.windows(2) {
                assert_eq!(pair[0].end, pair[1].start, "{n}: in order, no gap");
            }
            let lens: Vec<usize> = g.iter().map(|r| r.len()).collect();
            let (min, max) = (lens.iter().min().unwrap(), lens.iter().max().unwrap());
            assert!(max - min <= 1, "{n}: {lens:?}");
            assert!(
                *max <= CHUNK_RESULTS as usize,
                "{n}: a chunk a sender at most"
            );
            assert!(*min >= 1);
        }
        // A full wave: a chunk for each sender, 6 at a time in each (7 round trips).
        assert_eq!(groups(WAVE_RESULTS as usize).len(), SENDERS);
        // A chunk's worth: every sender, so it takes 2 round trips, not 7.
        assert_eq!(groups(CHUNK_RESULTS as usize).len(), SENDERS);
    }

    #[test]
    fn a_request_comes_back_from_its_sender_as_the_gate_signed_it() {
        let secret = Secret::parse("whsec_c2VjcmV0").unwrap();
        let extra = Some(("effect-generation", "2".to_string()));
        let request = signed_request(
            &secret,
            "res_1".into(),
            "res_1".into(),
            extra,
            7,
            "{}".into(),
        );
        let wire = WireSend::of(&request, 30);
        let json = serde_json::to_string(&wire).unwrap();
        let back: WireSend = serde_json::from_str(&json).unwrap();
        assert_eq!(back.after_ms, 30);
        assert_eq!(back.request().unwrap(), request);
        let mut odd = WireSend::of(&request, 0);
        odd.headers.push(("x-other".into(), "1".into()));
        assert!(odd.request().is_err(), "an unknown header sends nothing");
    }

    #[test]
    fn an_answer_comes_back_from_its_sender_unchanged() {
        let answers = vec![
            PeerAnswer::Http {
                status: 429,
                body: "slow".into(),
                retry_after: Some("4".into()),
            },
            PeerAnswer::Http {
                status: 200,
                body: String::new(),
                retry_after: None,
            },
            PeerAnswer::TooLarge {
                status: 200,
                cap: 9,
            },
            PeerAnswer::Timeout,
            PeerAnswer::Network("reset".into()),
        ];
        for answer in answers {
            let json = serde_json::to_string(&answer).unwrap();
            let back: PeerAnswer = serde_json::from_str(&json).unwrap();
            assert_eq!(back, answer);
        }
    }

    #[test]
    fn a_sender_that_fails_or_answers_otherwise_answers_nothing_for_its_group() {
        let ok = PeerAnswer::Http {
            status: 200,
            body: String::new(),
            retry_after: None,
        };
        let answers = group_answers(Ok(vec![ok.clone(), PeerAnswer::Timeout]), 2);
        assert_eq!(answers, vec![Ok(ok.clone()), Ok(PeerAnswer::Timeout)]);
        for reply in [Err("no answer within 40000 ms".to_string()), Ok(vec![ok])] {
            let answers = group_answers(reply, 3);
            assert_eq!(answers.len(), 3, "one a send");
            assert!(answers
                .iter()
                .all(|a| matches!(a, Err(why) if why.starts_with("result sender: "))));
        }
    }

    #[test]
    fn the_gate_waits_for_a_sender_as_long_as_its_sends_can_take_and_a_margin() {
        // A chunk: 7 rounds of 6, each up to the timeout.
        let chunk = CHUNK_RESULTS as usize;
        assert_eq!(
            call_bound_ms(chunk, 5_000, 0, None),
            7 * 5_000 + SENDER_MARGIN_MS
        );
        // A paced group leaves at its tokens: the last one's delay comes first.
        assert_eq!(
            call_bound_ms(7, 1_000, 2_500, None),
            2_500 + 2 * 1_000 + SENDER_MARGIN_MS
        );
        // Whatever the sends, never less than they can take.
        for n in 1..=chunk {
            for timeout in [1, 300, 5_000, 600_000] {
                let rounds = n.div_ceil(SENDS_IN_FLIGHT) as i64;
                assert!(call_bound_ms(n, timeout, 0, None) > rounds * timeout);
            }
        }
        // RESULTS_SENDER_TIMEOUT_MS shortens it, never lengthens it.
        assert_eq!(call_bound_ms(chunk, 5_000, 0, Some(2_000)), 2_000);
        assert_eq!(
            call_bound_ms(6, 5_000, 0, Some(60_000)),
            5_000 + SENDER_MARGIN_MS
        );
    }
}
