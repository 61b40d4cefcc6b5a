//! When a pass stops: its wall-clock deadline, why it ended ([`Stop`], the `stopped` of its
//! log line), and when a run of unanswered status calls backs off every status call.
//!
//! Guarantees: a pass starts no entry past its deadline ([`past_deadline`]); only a lost lease
//! keeps it from releasing ([`Stop::releases`]); a status call that got no answer (timeout,
//! network error) costs only its own entry, which the cursor moves past and the next coverage
//! of the ledger revisits, and [`StatusHealth`] turns [`UNANSWERED_BEFORE_BACKOFF`] of them in
//! a row into a back-off of every status call, as a 429 does.

/// True when a pass must start no further entry: its wall-clock deadline has come. The entry
/// in hand finishes (at most one status call and one gate call past the deadline).
pub fn past_deadline(now_ms: i64, deadline_ms: i64) -> bool {
    now_ms >= deadline_ms
}

/// Why a pass ended; logged as `stopped` in its `reconcile_pass` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// It reached the end of the ledger.
    Complete,
    /// It reached the end of a window of an index larger than
    /// [`MAX_INDEX_PAGES`](crate::reconciliation::lease_state::MAX_INDEX_PAGES) pages; the
    /// next pass lists the next window.
    Window,
    /// It reached the end, but skipped polls for a short status back-off; the next pass
    /// starts at the first entry it skipped.
    HeldForBackoff,
    /// The subrequest budget ran out; the next pass resumes at the saved cursor.
    Budget,
    /// The wall-clock deadline came; the next pass resumes at the saved cursor.
    Deadline,
    /// A renewal was refused: another pass holds the lease. Nothing is saved.
    LeaseLost,
    /// Renewals failed for a whole TTL; the release is still tried (it is fenced).
    LeaseLapsed,
    /// It scheduled a cron interval of polls on the fan-out queue (or Gemini's wait runs
    /// past it); the next pass schedules from the saved cursor.
    Scheduled,
    /// It was to start a new coverage of the index while polls scheduled on the fan-out queue
    /// (by passes, or sent back by consumers after a wait) may still be waiting: it schedules
    /// nothing, so no entry gets a second copy; a pass after their slots starts it.
    StillQueued,
    /// KV could not be listed.
    Error,
}

impl Stop {
    /// Whether the audit, when due, runs after the routine walk stopped this way: not after a
    /// lost or lapsed lease, or a KV error. After the routine walk's budget or deadline (its
    /// two thirds) it runs on the third kept for it.
    pub fn audits_after(self) -> bool {
        !matches!(self, Stop::LeaseLost | Stop::LeaseLapsed | Stop::Error)
    }

    /// Whether the pass may release the lease and save its cursor: not once another pass
    /// holds it (the release would be refused anyway; not sending it saves a subrequest).
    pub fn releases(self) -> bool {
        self != Stop::LeaseLost
    }
}

/// Status calls in a row that got no answer before every status call backs off: one or two
/// are one operation's trouble (that entry is skipped and revisited on the next coverage),
/// three in a row look like the API's.
pub const UNANSWERED_BEFORE_BACKOFF: u32 = 3;
/// The back-off after [`UNANSWERED_BEFORE_BACKOFF`] unanswered calls: as long as after a 429
/// without Retry-After, and shorter than a cron interval, so the next pass starts at the first
/// entry it skipped.
pub const UNANSWERED_BACKOFF_MS: i64 =
    crate::operation::observation::DEFAULT_RETRY_AFTER_SECS * 1_000;
// Bounded, and shorter than the */5 cron interval (checked when compiling).
const _: () = assert!(UNANSWERED_BACKOFF_MS > 0 && UNANSWERED_BACKOFF_MS < 300_000);

/// A pass's account of status calls that got no answer (timeout or network error).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatusHealth {
    /// Unanswered calls since the last answer of any kind.
    pub consecutive_unanswered: u32,
}

impl StatusHealth {
    /// Any HTTP answer, even an error: the API is there.
    pub fn answered(&mut self) {
        self.consecutive_unanswered = 0;
    }

    /// A call that timed out or failed to connect. Returns the time every status call must
    /// wait for, when this makes a run long enough to mean the API itself is in trouble.
    pub fn unanswered(&mut self, now_ms: i64) -> Option<i64> {
        self.consecutive_unanswered += 1;
        if self.consecutive_unanswered < UNANSWERED_BEFORE_BACKOFF {
            return None;
        }
        self.consecutive_unanswered = 0;
        Some(now_ms + UNANSWERED_BACKOFF_MS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_stops_new_work_when_it_comes() {
        assert!(!past_deadline(59_999, 60_000));
        assert!(past_deadline(60_000, 60_000));
        assert!(past_deadline(75_000, 60_000));
    }

    #[test]
    fn only_a_lost_lease_keeps_a_pass_from_releasing() {
        for stop in [
            Stop::Complete,
            Stop::Window,
            Stop::HeldForBackoff,
            Stop::Budget,
            Stop::Deadline,
            Stop::LeaseLapsed,
            Stop::Error,
        ] {
            assert!(stop.releases(), "{stop:?}");
        }
        assert!(!Stop::LeaseLost.releases());
    }

    #[test]
    fn one_or_two_unanswered_status_calls_cost_only_their_entries() {
        let mut h = StatusHealth::default();
        assert_eq!(h.unanswered(1_000), None);
        assert_eq!(h.unanswered(2_000), None);
    }

    #[test]
    fn three_unanswered_status_calls_in_a_row_back_off_every_call() {
        let mut h = StatusHealth::default();
        h.unanswered(1_000);
        h.unanswered(2_000);
        assert_eq!(h.unanswered(3_000), Some(3_000 + UNANSWERED_BACKOFF_MS));
        assert_eq!(h.unanswered(4_000), None, "the count starts again");
    }

    #[test]
    fn an_answer_between_unanswered_calls_resets_the_run() {
        let mut h = StatusHealth::default();
        h.unanswered(1_000);
        h.unanswered(2_000);
        h.answered();
        assert_eq!(h.unanswered(3_000), None);
        assert_eq!(h.unanswered(4_000), None);
    }
}
