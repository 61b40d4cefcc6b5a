//! The messages between a gate (or the stats route) and a destination's desk, and the
//! settings a desk runs by.
//!
//! Guarantees: every message is plain JSON, so it is tested on the host and logged as is; the
//! settings travel with each command, so a desk always runs by the configuration of whoever
//! spoke to it last (every isolate parses the same variables), and needs none of its own.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::retry::PeerAnswer;

/// A route's pace (`per_second` and `concurrency` of an `EFFECT_ROUTES` entry, or
/// `EFFECT_PER_SECOND` and `EFFECT_CONCURRENCY` for `EFFECT_URL`): either may be absent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pace {
    /// Releases a second at most (a token bucket holding [`Pace::burst`] tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_second: Option<u32>,
    /// Attempts in flight at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
}

impl Pace {
    /// Whether anything is limited: an unlimited route asks its desk only off the happy path.
    pub fn limits(&self) -> bool {
        self.per_second.is_some() || self.concurrency.is_some()
    }

    /// The bucket's size: a tenth of a second's releases (at least one), so that in any
    /// second at most `per_second + burst` leave, and a slow pace is spread evenly.
    pub fn burst(&self) -> u32 {
        self.per_second.map_or(1, |r| (r / 10).max(1))
    }
}

/// What a desk runs by: the route's pace and the health settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeskSettings {
    /// The destination, as the operator's history names it.
    pub label: String,
    /// Consecutive failures that open the destination (`DESTINATION_OPEN_AFTER`).
    pub open_after: u32,
    /// Longest wait between probes (`DESTINATION_PROBE_MAX_SECONDS`, in ms).
    pub probe_max_ms: i64,
    /// How long a released effect's slot (or probe) is held without its report: a gate that
    /// died mid-attempt frees it when this passes (its claim's TTL).
    pub slot_ttl_ms: i64,
    #[serde(default)]
    pub pace: Pace,
    /// The longest `Retry-After` the desk honours before its next probe
    /// (`EFFECT_RETRY_MAX_SECONDS`, in ms: the cap an effect's own retry has too).
    #[serde(default = "default_asked_max_ms")]
    pub asked_max_ms: i64,
}

fn default_asked_max_ms() -> i64 {
    3_600_000
}

/// A request to a destination's desk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum DeskCommand {
    /// May `n` attempts for `key` (owed since `due_ms`) go now? A job's effect asks for one,
    /// a batch's step for its results. Asked before a retry, and before every attempt on a
    /// paced route.
    Ask {
        key: String,
        due_ms: i64,
        n: u32,
        settings: DeskSettings,
    },
    /// How the attempts the desk let go (asked, probed or released) ended: after a failure that
    /// says something about the destination's health, and after every attempt the desk let go.
    Report {
        key: String,
        due_ms: i64,
        #[serde(flatten)]
        sent: Sent,
        settings: DeskSettings,
    },
    /// The desk's state, for `/v1/stats`.
    Status { settings: DeskSettings },
    /// Must a first attempt ask? Read only (no write, not counted in `calls`): an isolate
    /// that has not heard from the desk lately checks before a first attempt, so a pause
    /// holds effects that would otherwise never speak to the desk.
    Check { settings: DeskSettings },
    /// An operator pauses the destination by hand (`by`: who, as the admin API names the
    /// caller), or, with `dry_run`, only asks what a pause would hold.
    Pause {
        by: Value,
        reason: String,
        #[serde(default)]
        dry_run: bool,
        settings: DeskSettings,
    },
    /// An operator resumes a paused destination: what waited is released in order.
    Resume {
        by: Value,
        reason: String,
        #[serde(default)]
        dry_run: bool,
        settings: DeskSettings,
    },
}

impl DeskCommand {
    /// The settings the desk runs by, which every command carries.
    pub fn settings(&self) -> &DeskSettings {
        match self {
            DeskCommand::Ask { settings, .. }
            | DeskCommand::Report { settings, .. }
            | DeskCommand::Status { settings }
            | DeskCommand::Check { settings }
            | DeskCommand::Pause { settings, .. }
            | DeskCommand::Resume { settings, .. } => settings,
        }
    }
}

/// A desk's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum DeskReply {
    /// Attempt this many of those asked for (at least one; on a paced route, a slot each is
    /// taken until the report), the `i`th no sooner than `after_ms[i]` from now (none given:
    /// all at once).
    Granted {
        n: u32,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        after_ms: Vec<i64>,
    },
    /// Wait: the key is queued and the desk will make it due (`DestinationReady`).
    Wait,
    /// Wait: the destination is paused by hand; the key is queued (in its place, soonest
    /// due first) and made due when an operator resumes it. Nothing of it is a failure.
    Paused,
    /// A check's answer: whether a first attempt must ask (the destination is paused or
    /// open) or may go.
    Checked { ask: bool },
    /// Keep the effect's own backoff: the destination is not open.
    OwnSchedule,
    /// Recorded.
    Noted,
    /// The desk's state.
    View(DeskView),
    /// A pause or resume: whether it changed the desk (a dry run changes nothing), and the
    /// desk as it now stands (its `waiting`: what the pause holds, or the resume releases).
    PauseSet { changed: bool, view: DeskView },
}

/// How the attempts one report stands for ended: one for a job's effect, a step's for a
/// batch's results (sent at once, back in no order).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sent {
    /// Attempts that went (0: it could not send, a results file missing, a download refused).
    pub sent: u32,
    /// Health failures among them ([`health_failure`]), the last in a few words.
    pub failures: u32,
    pub failure: Option<String>,
    /// The longest wait the destination asked for (a 429 or 503's `Retry-After`), in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked_wait_ms: Option<i64>,
}

impl Sent {
    /// How the answers `answers` (at `now`) went.
    pub fn of<'a>(answers: impl IntoIterator<Item = &'a PeerAnswer>, now: i64) -> Sent {
        answers.into_iter().fold(Sent::default(), |mut s, a| {
            s.sent += 1;
            if health_failure(a) {
                s.failures += 1;
                s.failure = Some(a.summary());
            }
            s.asked_wait_ms = s.asked_wait_ms.max(a.asked_wait_ms(now));
            s
        })
    }
}

/// A destination's health as `/v1/stats` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeskView {
    pub label: String,
    /// `healthy`, `open` (failing: effects wait, one probe at a time) or `draining`
    /// (recovered: what waited is released at the destination's pace).
    pub state: String,
    pub waiting: u64,
    pub in_flight: u64,
    pub failures_in_row: u32,
    pub last_error: Option<String>,
    /// Unix ms.
    pub opened_at_ms: Option<i64>,
    #[serde(default)]
    pub pace: Pace,
    /// Asks and reports this desk received.
    #[serde(default)]
    pub calls: u64,
    /// The pause an operator set, if any (`state` is then `paused`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<PauseNote>,
}

/// A pause by hand: who set it, why, and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PauseNote {
    /// Who paused it, as the admin API names a caller (scope and token fingerprint).
    pub by: Value,
    pub reason: String,
    /// Unix ms.
    pub at_ms: i64,
}

/// Whether an attempt's answer says the destination itself is failing: a timeout, a network
/// error, a 5xx or a 429. A 408 or 409 is retried but is about the request, not the health.
pub fn health_failure(answer: &PeerAnswer) -> bool {
    match answer {
        PeerAnswer::Timeout | PeerAnswer::Network(_) => true,
        PeerAnswer::Http { status, .. } => *status == 429 || (500..=599).contains(status),
        PeerAnswer::TooLarge { .. } => false,
    }
}

/// How long an isolate remembers a desk's word that its destination is open: about the
/// longest a probe goes unanswered, so a recovered destination's first attempts pay one desk
/// call each for at most a minute after this isolate last heard `Wait`.
pub const OPEN_MEMORY_MS: i64 = 60_000;

/// How long an isolate trusts a desk's word that its destination is neither open nor paused:
/// a first attempt after that checks ([`DeskCommand::Check`], one read, no write) before it
/// goes. So a pause holds every first attempt that starts this long after it, and a busy
/// isolate pays one check per destination per this long, not one per effect.
pub const CLEAR_MEMORY_MS: i64 = 10_000;

/// What a desk's reply tells an isolate's memory of its destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remember {
    /// It is open (or drains what waited) or paused: first attempts ask until then.
    OpenUntil(i64),
    /// It let an attempt go, or a success was noted, or a check found it neither open nor
    /// paused: first attempts go without asking until then.
    ClearUntil(i64),
    /// Nothing new.
    Keep,
}

impl DeskReply {
    /// What this reply teaches an isolate's memory of its destination at `now`.
    pub fn remembered(&self, now: i64) -> Remember {
        match self {
            DeskReply::Wait | DeskReply::Paused | DeskReply::Checked { ask: true } => {
                Remember::OpenUntil(now + OPEN_MEMORY_MS)
            }
            DeskReply::Granted { .. } | DeskReply::Noted | DeskReply::Checked { ask: false } => {
                Remember::ClearUntil(now + CLEAR_MEMORY_MS)
            }
            DeskReply::OwnSchedule | DeskReply::View(_) | DeskReply::PauseSet { .. } => {
                Remember::Keep
            }
        }
    }

    /// Whether the desk queued the key: the effect (or the batch) waits for its release, and
    /// `Some(true)` when that is a pause's (no failure: no attempt, no alert while it holds).
    pub fn waits(&self) -> Option<bool> {
        match self {
            DeskReply::Wait => Some(false),
            DeskReply::Paused => Some(true),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_isolates_memory_of_open_destinations_follows_the_desks_answers() {
        assert_eq!(
            DeskReply::Wait.remembered(100),
            Remember::OpenUntil(100 + OPEN_MEMORY_MS)
        );
        assert_eq!(
            DeskReply::Paused.remembered(100),
            Remember::OpenUntil(100 + OPEN_MEMORY_MS)
        );
        assert_eq!(
            DeskReply::Checked { ask: true }.remembered(100),
            Remember::OpenUntil(100 + OPEN_MEMORY_MS)
        );
        let clear = Remember::ClearUntil(100 + CLEAR_MEMORY_MS);
        let go = DeskReply::Granted {
            n: 1,
            after_ms: Vec::new(),
        };
        assert_eq!(go.remembered(100), clear);
        assert_eq!(DeskReply::Noted.remembered(100), clear);
        assert_eq!(DeskReply::Checked { ask: false }.remembered(100), clear);
        assert_eq!(DeskReply::OwnSchedule.remembered(100), Remember::Keep);
        assert_eq!(DeskReply::Wait.waits(), Some(false));
        assert_eq!(DeskReply::Paused.waits(), Some(true));
        assert_eq!(DeskReply::OwnSchedule.waits(), None);
    }

    #[test]
    fn only_timeouts_network_errors_5xx_and_429_count_against_health() {
        let http = |status| PeerAnswer::Http {
            status,
            body: String::new(),
            retry_after: None,
        };
        assert!(health_failure(&PeerAnswer::Timeout));
        assert!(health_failure(&PeerAnswer::Network("reset".into())));
        assert!(health_failure(&http(503)));
        assert!(health_failure(&http(429)));
        assert!(!health_failure(&http(408)));
        assert!(!health_failure(&http(400)));
        assert!(!health_failure(&http(200)));
    }

    #[test]
    fn a_pace_bursts_a_tenth_of_a_second_at_least_one() {
        let p = |r| Pace {
            per_second: Some(r),
            concurrency: None,
        };
        assert_eq!(p(5).burst(), 1);
        assert_eq!(p(50).burst(), 5);
        assert!(!Pace::default().limits());
        assert!(p(1).limits());
    }

    #[test]
    fn commands_are_tagged_json() {
        let c = DeskCommand::Status {
            settings: DeskSettings {
                label: "EFFECT_URL: https://x".into(),
                open_after: 5,
                probe_max_ms: 15_000,
                slot_ttl_ms: 600_000,
                pace: Pace::default(),
                asked_max_ms: 3_600_000,
            },
        };
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["command"], "status");
        assert_eq!(serde_json::from_value::<DeskCommand>(v).unwrap(), c);
        // One report each way, its attempts' counts beside the key.
        let report = DeskCommand::Report {
            key: "batches/b".into(),
            due_ms: 5,
            sent: Sent {
                sent: 40,
                failures: 2,
                failure: Some("503: down".into()),
                asked_wait_ms: Some(4_000),
            },
            settings: c.settings().clone(),
        };
        let v = serde_json::to_value(&report).unwrap();
        assert_eq!(
            (&v["command"], &v["sent"], &v["failures"]),
            (&"report".into(), &40.into(), &2.into())
        );
        assert_eq!(serde_json::from_value::<DeskCommand>(v).unwrap(), report);
    }

    #[test]
    fn a_report_counts_what_went_its_health_failures_the_last_of_them_and_the_longest_wait() {
        let http = |status, retry_after: Option<&str>| PeerAnswer::Http {
            status,
            body: String::new(),
            retry_after: retry_after.map(Into::into),
        };
        let answers = [
            http(429, Some("4")),
            http(200, None),
            http(503, Some("9")),
            http(400, None),
        ];
        let sent = Sent::of(&answers, 0);
        assert_eq!((sent.sent, sent.failures), (4, 2));
        assert_eq!(sent.failure.as_deref(), Some("503: "));
        assert_eq!(sent.asked_wait_ms, Some(9_000));
        // A job's effect: one attempt.
        assert_eq!(Sent::of([&PeerAnswer::Timeout], 0).failures, 1);
        assert_eq!(Sent::of([&http(200, None)], 0).failure, None);
        assert_eq!(Sent::of([], 0), Sent::default());
    }
}
