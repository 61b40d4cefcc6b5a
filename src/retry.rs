//! Whether a retry can help: the one classification of every answer the worker gets from a
//! peer it called (a destination, Gemini's status API, an alert sink, the key-set endpoint).
//!
//! Guarantees: a 2xx is a success; a timeout, a network error, 408, 409, 429 and any 5xx are
//! worth retrying later (with backoff, or after the peer's `Retry-After`); every other answer
//! is a refusal the peer will repeat, so retrying it is pointless. Every outbound call asks
//! this one function (through the edge's `Answer::class`), so the rule cannot drift apart.

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
