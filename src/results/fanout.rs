//! A step's results fanned out past one invocation's 6 connections: how a step's sends are
//! split among result senders (each its own invocation, with its own 6 connections), and what
//! goes to a sender and comes back.
//!
//! Guarantees: a step of at most [`SENDS_IN_FLIGHT`] results goes from the gate itself (one
//! round trip); a larger one is split into at most [`SENDERS`] groups of at most
//! [`CHUNK_RESULTS`], in order, each covering its results once and the groups covering them
//! all, sizes within one of each other so they end together. The gate calls at most
//! [`SENDERS`] (6) senders at once, counting each call as one of its own 6 connections, and a
//! sender sends its group at most [`SENDS_IN_FLIGHT`] at a time: every invocation that sends
//! keeps production's limit, whether or not the platform counts an object call. A request goes
//! to its sender and comes back unchanged: the same headers (so the same `webhook-id` and
//! signature), the same body; the gate alone claims and commits (`progress`), so a sender
//! holds no state and a kill anywhere is the gate's claim sent again.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::destination_label::Destination;
use crate::operation::effect::EffectRequest;
use crate::results::progress::{CHUNK_RESULTS, SENDS_IN_FLIGHT};
pub use crate::results::progress::{SENDERS, WAVE_RESULTS};
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
    let (base, extra) = (n / g, n % g);
    let mut start = 0;
    (0..g)
        .map(|i| {
            let len = base + usize::from(i < extra);
            let range = start..start + len;
            start += len;
            range
        })
        .collect()
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
    #[serde(default, skip_serializing_if = "is_zero")]
    pub after_ms: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
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
        Ok(EffectRequest {
            headers,
            body: self.body,
        })
    }
}

/// The answers of a group whose sender could not be called or answered something else than
/// one answer a send: each may have reached the destination (a sender may have sent before
/// failing), so each is a network failure, retried under its same `webhook-id`.
pub fn sender_failed(n: usize, why: &str) -> Vec<PeerAnswer> {
    (0..n)
        .map(|_| PeerAnswer::Network(format!("result sender: {why}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operation::effect::signed_request;
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
        let failed = sender_failed(3, "object answered 500");
        assert_eq!(failed.len(), 3);
        assert!(failed
            .iter()
            .all(|a| a.class() == crate::retry::Class::Retry));
    }
}
