//! What an outbound call answered and whether a retry can help: the one answer type
//! ([`Answer`]) and the one classification ([`Class`]) of every call the worker makes to a peer
//! (a destination, Gemini's status API and webhook listing, an alert sink, the key-set
//! endpoint).
//!
//! Guarantees: a 2xx is a success; a timeout, a network error, 408, 409, 429 and any 5xx are
//! worth retrying later (with backoff, or after the peer's `Retry-After`); every other answer,
//! and a body wanted whole that ran past its cap, is a refusal the peer will repeat, so
//! retrying it is pointless. Every caller asks [`Answer::class`] (or [`class_of_status`]), so
//! the rule cannot drift apart.

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
#[derive(Debug, Clone, PartialEq)]
pub enum Answer<B = String> {
    /// The peer answered: its status, its body as kept, its Retry-After.
    Http {
        status: u16,
        body: B,
        retry_after: Option<String>,
    },
    /// A 2xx body wanted whole ran past `cap` bytes: refused, and read no further.
    TooLarge { status: u16, cap: usize },
    /// The deadline passed first; the request was aborted.
    Timeout,
    /// The request could not be made or the connection failed.
    Network(String),
}

impl<B> Answer<B> {
    /// Whether a retry can help: a timeout or a network error is worth retrying; an answer is
    /// classified by its status.
    pub fn class(&self) -> Class {
        match self {
            Answer::Http { status, .. } => class_of_status(*status),
            // The peer would send the same body again: asking again soon does not help.
            Answer::TooLarge { .. } => Class::Refused,
            Answer::Timeout | Answer::Network(_) => Class::Retry,
        }
    }
}

impl<B> Answer<B> {
    /// How long the peer asked to be left alone, from `now_ms`: a 429 or 503's `Retry-After`,
    /// in seconds or as an HTTP date (RFC 9110 §10.2.3). `None` without one, when it cannot be
    /// read, or on any other answer; a date already past asks for no wait (`Some(0)`).
    pub fn asked_wait_ms(&self, now_ms: i64) -> Option<i64> {
        let Answer::Http {
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

impl Answer {
    /// The answer in a few words, for logs and records.
    pub fn summary(&self) -> String {
        match self {
            Answer::Http { status, body, .. } => {
                format!("{status}: {}", body.chars().take(200).collect::<String>())
            }
            Answer::TooLarge { status, cap } => {
                format!("{status}: body over {cap} bytes, refused unread past the cap")
            }
            Answer::Timeout => "timeout".to_string(),
            Answer::Network(e) => format!("network: {e}"),
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
            Answer::Http {
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
        assert_eq!(Answer::<String>::Timeout.asked_wait_ms(now), None);
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
        let http = |status| Answer::Http {
            status,
            body: "x".repeat(300),
            retry_after: None,
        };
        assert_eq!(http(204).class(), Class::Success);
        assert_eq!(http(503).class(), Class::Retry);
        assert_eq!(http(400).class(), Class::Refused);
        let too_large: Answer = Answer::TooLarge {
            status: 200,
            cap: 10,
        };
        assert_eq!(too_large.class(), Class::Refused);
        assert_eq!(Answer::<String>::Timeout.class(), Class::Retry);
        assert_eq!(
            Answer::<String>::Network("reset".into()).class(),
            Class::Retry
        );
        assert_eq!(http(400).summary(), format!("400: {}", "x".repeat(200)));
        assert_eq!(
            too_large.summary(),
            "200: body over 10 bytes, refused unread past the cap"
        );
        assert_eq!(Answer::<String>::Timeout.summary(), "timeout");
        assert_eq!(
            Answer::<String>::Network("reset".into()).summary(),
            "network: reset"
        );
    }
}
