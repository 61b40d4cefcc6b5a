//! Counters for `GET /v1/stats`: names, hourly buckets, shards.
//!
//! Guarantees: the gate records each counted event in its own record in the same write as the
//! decision, with a per-operation sequence number, and hands it over once, to its isolate's
//! tally ([`crate::telemetry::isolate_tally`]: counted once while the isolate lives, lost if
//! the runtime evicts it first) or, for a batch with a drop, to a shard itself, named: a shard
//! adds a named batch only past the highest sequence it has seen from that operation, so a
//! retried flush never counts twice. Rejected requests are counted per isolate in the same
//! way (never a storage round trip on the rejected path). Counters are spread over
//! [`SHARDS`] objects, so there is no global lock.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::telemetry::log_event::name_of;

/// Stats shards; a gate always flushes to the same one (by key).
pub const SHARDS: u32 = 8;

/// Counter names. Dropped events count as `dropped_<reason>`, rejections as
/// `rejected_<reason>`.
pub const DELIVERIES: &str = "deliveries";
pub const DUPLICATES: &str = "duplicates_skipped";
pub const SETTLED_BY_WEBHOOK: &str = "settled_by_webhook";
pub const SETTLED_BY_RECONCILE: &str = "settled_by_reconcile";
pub const EFFECT_SUCCESSES: &str = "effect_successes";
pub const EFFECT_FAILURES: &str = "effect_failures";
pub const EFFECT_PARKS: &str = "effect_parks";
pub const ALERTS: &str = "alerts";
pub const REDELIVERIES: &str = "redeliveries";
/// Nudges for unregistered names Gemini's status API answered 404 for (nothing was stored).
pub const STRANGER_NUDGES: &str = "stranger_nudges";
/// Signed test deliveries (Gemini's `:ping`), answered 2xx and kept nowhere else.
pub const PINGS: &str = "pings";

/// Counters whose names carry a bounded label, built at run time (see [`labelled`]): a side
/// effect's attempts by result and destination (`effect_to:<result>:<destination label>`), the
/// settlement-to-acceptance histogram's buckets (`acceptance_le:<seconds>`, each counting the
/// effects that fell in it alone; `/metrics` makes them cumulative), alerts by kind
/// (`alerts_by_kind:<kind>`).
pub const EFFECT_TO_PREFIX: &str = "effect_to:";
/// A batch's results (`"results": "each"`) by how they ended and destination
/// (`result_to:<delivered|failed|parked|unanswered>:<destination label>`): results delivered,
/// failed attempts, results parked, results a result sender answered nothing for.
pub const RESULT_TO_PREFIX: &str = "result_to:";
pub const ACCEPTANCE_BUCKET_PREFIX: &str = "acceptance_le:";
pub const ALERTS_BY_KIND_PREFIX: &str = "alerts_by_kind:";
/// Milliseconds from settlement to acceptance, summed over accepted effects (the histogram's
/// `_sum`).
pub const ACCEPTANCE_MS_SUM: &str = "acceptance_ms_sum";
/// Failed attempts whose destination asked for a wait (`Retry-After`) that was honoured.
pub const EFFECT_RETRY_AFTER: &str = "effect_retry_after";
/// The histogram's upper bounds, in seconds: from an effect accepted at once to one that
/// waited out a day's outage. An effect past the last counts in `+Inf`.
pub const ACCEPTANCE_BUCKETS_SECS: [f64; 12] = [
    0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0, 21600.0, 86400.0,
];

/// A run-time name under one of the prefixes above.
pub fn labelled(prefix: &str, label: &str) -> String {
    format!("{prefix}{label}")
}

/// Status-API calls about an operation, by who asked and how Gemini answered:
/// `status_calls:<asked_by>:<answer>` ([`status_call`]).
pub const STATUS_CALLS_PREFIX: &str = "status_calls:";

/// Who asked Gemini's status API about an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AskedBy {
    /// A reconcile pass polling by itself.
    Pass,
    /// A fan-out queue consumer polling what a pass scheduled.
    Queue,
    /// A gate confirming a nudge (a dynamic webhook's delivery).
    Nudge,
}

impl AskedBy {
    pub const ALL: [AskedBy; 3] = [AskedBy::Pass, AskedBy::Queue, AskedBy::Nudge];
}

/// How a status call ended, as the pass and the gate tell answers apart
/// (`crate::reconciliation::status::call_answer` classifies one): a 2xx (usable or not: an
/// unusable one is alerted `status_unusable` on its own), a 404 (`unknown_to_gemini`), any
/// other status (a 429 or 5xx that backs every status call off, or a refusal), or no answer at
/// all (a timeout or a network error: the pass's `status_unanswered`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StatusCallAnswer {
    Answered,
    NotFound,
    Refused,
    Unanswered,
}

impl StatusCallAnswer {
    pub const ALL: [StatusCallAnswer; 4] = [
        StatusCallAnswer::Answered,
        StatusCallAnswer::NotFound,
        StatusCallAnswer::Refused,
        StatusCallAnswer::Unanswered,
    ];
}

/// The counter of a status call asked by `asked_by` that ended as `answer`.
pub fn status_call(asked_by: AskedBy, answer: StatusCallAnswer) -> String {
    let (asked_by, answer) = (name_of(&asked_by), name_of(&answer));
    format!("{STATUS_CALLS_PREFIX}{asked_by}:{answer}")
}

/// The bucket an acceptance `ms` after settlement falls in: its upper bound as `/metrics`
/// writes `le` (`0.5`, `1`, ... or `+Inf`).
pub fn acceptance_bucket(ms: i64) -> String {
    let secs = ms.max(0) as f64 / 1_000.0;
    ACCEPTANCE_BUCKETS_SECS
        .iter()
        .find(|le| secs <= **le)
        .map_or_else(|| "+Inf".to_string(), |le| le.to_string())
}

/// A counter a gate counts in its record, by name ([`Counter::name`] gives the spelling the
/// shards, `/v1/stats` and the dashboard read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    Deliveries,
    Duplicates,
    SettledByWebhook,
    SettledByReconcile,
    EffectSuccesses,
    EffectFailures,
    EffectParks,
    Alerts,
    Redeliveries,
    /// A delivery the reducer dropped, by the reason's name: `dropped_<reason>`.
    Dropped(&'static str),
}

/// The prefix of a dropped delivery's counter.
pub const DROPPED_PREFIX: &str = "dropped_";

/// Whether a gate sends these events to its shard itself, named by its key, rather than
/// through its isolate's tally: when they include a drop, since the shard lists each drop by
/// the key it came from ("recently dropped"), and counts a named batch once by sequence.
pub fn sent_named(events: &[StatEvent]) -> bool {
    events.iter().any(|e| e.name.starts_with(DROPPED_PREFIX))
}

impl Counter {
    pub fn name(self) -> Cow<'static, str> {
        Cow::Borrowed(match self {
            Counter::Deliveries => DELIVERIES,
            Counter::Duplicates => DUPLICATES,
            Counter::SettledByWebhook => SETTLED_BY_WEBHOOK,
            Counter::SettledByReconcile => SETTLED_BY_RECONCILE,
            Counter::EffectSuccesses => EFFECT_SUCCESSES,
            Counter::EffectFailures => EFFECT_FAILURES,
            Counter::EffectParks => EFFECT_PARKS,
            Counter::Alerts => ALERTS,
            Counter::Redeliveries => REDELIVERIES,
            Counter::Dropped(reason) => return Cow::Owned(format!("{DROPPED_PREFIX}{reason}")),
        })
    }

    /// Whether counts of it may merge into one pending event: drops stay one event each,
    /// since the shard lists every one as a recent drop.
    pub fn merges(self) -> bool {
        !matches!(self, Counter::Dropped(_))
    }
}

/// One counted event awaiting its flush to a shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatEvent {
    pub seq: u64,
    pub name: String,
    pub at_ms: i64,
    /// How many occurrences this event stands for (a batch of rejections is one event).
    #[serde(default = "one")]
    pub count: u64,
}

fn one() -> u64 {
    1
}

/// Counter totals by name.
pub type Tally = BTreeMap<String, u64>;

/// Counts by hour bucket ([`hour_of`]).
pub type Hourly = BTreeMap<i64, Tally>;

/// Hours in the trend of `/v1/stats` (the current hour last).
pub const TREND_HOURS: i64 = 24;

/// One hour of the trend: what an operator charts. `dropped` sums every `dropped_<reason>`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HourPoint {
    /// The hour's start, RFC 3339.
    pub hour: String,
    pub deliveries: u64,
    pub settled_by_webhook: u64,
    pub settled_by_reconcile: u64,
    pub effect_successes: u64,
    pub effect_failures: u64,
    pub dropped: u64,
}

/// The last [`TREND_HOURS`] hours up to the one holding `now_ms`, oldest first, each present
/// (an hour with nothing counted is zeros, so a chart's axis is time, not data).
pub fn hourly_series(buckets: &Hourly, now_ms: i64) -> Vec<HourPoint> {
    let now_hour = hour_of(now_ms);
    (now_hour - TREND_HOURS + 1..=now_hour)
        .map(|hour| {
            let empty = Tally::new();
            let tally = buckets.get(&hour).unwrap_or(&empty);
            let get = |name: &str| tally.get(name).copied().unwrap_or(0);
            HourPoint {
                hour: crate::timestamp::format_rfc3339(hour * 3_600_000),
                deliveries: get(DELIVERIES),
                settled_by_webhook: get(SETTLED_BY_WEBHOOK),
                settled_by_reconcile: get(SETTLED_BY_RECONCILE),
                effect_successes: get(EFFECT_SUCCESSES),
                effect_failures: get(EFFECT_FAILURES),
                dropped: tally
                    .iter()
                    .filter(|(name, _)| name.starts_with(DROPPED_PREFIX))
                    .map(|(_, n)| n)
                    .sum(),
            }
        })
        .collect()
}

pub fn merge_hourly(into: &mut Hourly, other: &Hourly) {
    for (hour, tally) in other {
        merge(into.entry(*hour).or_default(), tally);
    }
}

/// How often a shard prunes old hourly buckets and dedupe marks.
pub const PRUNE_EVERY_MS: i64 = 3_600_000;

/// True when a shard that last pruned at `last_ms` should prune again (it starts at 0: the
/// first flush of an instance prunes).
pub fn prune_due(now_ms: i64, last_ms: i64) -> bool {
    now_ms.saturating_sub(last_ms) >= PRUNE_EVERY_MS
}

pub fn hour_of(ms: i64) -> i64 {
    ms.div_euclid(3_600_000)
}

/// The shard an operation's counts go to.
pub fn shard_of(key: &str) -> u32 {
    let digest = Sha256::digest(key.as_bytes());
    u32::from_le_bytes([digest[0], digest[1], digest[2], digest[3]]) % SHARDS
}

pub fn merge(into: &mut Tally, other: &Tally) {
    for (name, n) in other {
        *into.entry(name.clone()).or_default() += n;
    }
}

/// The events a shard counts: a gate's past the highest sequence it has seen from that gate
/// (`Some`), or all of an isolate's edge counts, which carry no sequence (`None`: rejections
/// and duplicates answered at the edge, counted approximately by design).
pub fn to_count(events: &[StatEvent], gate_seen: Option<u64>) -> Vec<&StatEvent> {
    let unseen = |e: &&StatEvent| gate_seen.is_none_or(|seen| e.seq > seen);
    events.iter().filter(unseen).collect()
}

// The shard protocol: what a gate or an isolate sends to a stats shard, and what a read
// returns.

/// A request to a stats shard.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum ShardCommand {
    /// Count `events`; with `gate`, only those past the highest sequence seen from it.
    Add {
        gate: Option<String>,
        events: Vec<StatEvent>,
    },
    Read,
}

/// A shard's counts.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ShardCounts {
    pub total: Tally,
    pub last_24h: Tally,
    #[serde(default)]
    pub recent_drops: Vec<RecentDrop>,
    /// The last day's buckets by hour, for the trend.
    #[serde(default)]
    pub hourly: Hourly,
}

/// A dropped event, for the dashboard.
#[derive(Debug, Serialize, Deserialize)]
pub struct RecentDrop {
    pub at_ms: i64,
    pub key: String,
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edge_counts_without_a_sequence_are_all_counted() {
        let events = [
            ev(0, "rejected_signature_invalid"),
            ev(0, "duplicates_skipped"),
        ];
        assert_eq!(
            to_count(&events, None).len(),
            2,
            "an isolate's counts have no sequence"
        );
        assert_eq!(to_count(&events, Some(0)).len(), 0, "a gate's start at 1");
        let gate = [ev(1, "deliveries"), ev(2, "duplicates_skipped")];
        assert_eq!(
            to_count(&gate, Some(1)).len(),
            1,
            "a retried flush counts once"
        );
    }

    #[test]
    fn only_a_batch_with_a_drop_is_sent_named() {
        assert!(!sent_named(&[ev(1, DELIVERIES), ev(2, EFFECT_SUCCESSES)]));
        let drop = Counter::Dropped("stale_update_time").name();
        assert!(sent_named(&[ev(1, DELIVERIES), ev(2, &drop)]));
        assert!(!sent_named(&[]));
    }

    #[test]
    fn a_shard_prunes_on_its_first_flush_then_hourly() {
        let now = 1_795_000_000_000;
        assert!(prune_due(now, 0), "a new instance prunes");
        assert!(!prune_due(now, now));
        assert!(!prune_due(now + PRUNE_EVERY_MS - 1, now));
        assert!(prune_due(now + PRUNE_EVERY_MS, now));
        assert!(prune_due(now, i64::MIN), "no overflow whatever the mark");
    }

    fn ev(seq: u64, name: &str) -> StatEvent {
        StatEvent {
            seq,
            name: name.into(),
            at_ms: 0,
            count: 1,
        }
    }

    #[test]
    fn retried_batch_is_not_counted_twice() {
        let batch = vec![ev(1, DELIVERIES), ev(2, EFFECT_SUCCESSES)];
        assert_eq!(to_count(&batch, Some(0)).len(), 2);
        assert_eq!(to_count(&batch, Some(2)).len(), 0);
        let longer = vec![
            ev(1, DELIVERIES),
            ev(2, EFFECT_SUCCESSES),
            ev(3, DUPLICATES),
        ];
        let fresh = to_count(&longer, Some(2));
        assert_eq!(fresh, vec![&ev(3, DUPLICATES)]);
    }

    #[test]
    fn an_acceptance_falls_in_the_smallest_bucket_that_holds_it() {
        assert_eq!(acceptance_bucket(0), "0.5");
        assert_eq!(acceptance_bucket(500), "0.5");
        assert_eq!(acceptance_bucket(501), "1");
        assert_eq!(acceptance_bucket(4_000), "5");
        assert_eq!(acceptance_bucket(86_400_000), "86400");
        assert_eq!(acceptance_bucket(86_400_001), "+Inf");
        assert_eq!(
            acceptance_bucket(-5),
            "0.5",
            "a clock that stepped back counts as at once"
        );
        assert_eq!(
            labelled(EFFECT_TO_PREFIX, "delivered:EFFECT_URL: https://x/…"),
            "effect_to:delivered:EFFECT_URL: https://x/…"
        );
    }

    #[test]
    fn a_status_call_counts_under_who_asked_and_how_it_ended() {
        assert_eq!(
            status_call(AskedBy::Queue, StatusCallAnswer::NotFound),
            "status_calls:queue:not_found"
        );
        let names: std::collections::BTreeSet<String> = AskedBy::ALL
            .iter()
            .flat_map(|a| StatusCallAnswer::ALL.map(|b| status_call(*a, b)))
            .collect();
        assert_eq!(names.len(), 12, "every pair a name of its own");
    }

    #[test]
    fn counter_names_are_the_documented_spellings() {
        let names: Vec<_> = [
            Counter::Deliveries,
            Counter::Duplicates,
            Counter::SettledByWebhook,
            Counter::SettledByReconcile,
            Counter::EffectSuccesses,
            Counter::EffectFailures,
            Counter::EffectParks,
            Counter::Alerts,
            Counter::Redeliveries,
            Counter::Dropped("regress_from_terminal"),
        ]
        .iter()
        .map(|c| c.name().into_owned())
        .collect();
        assert_eq!(
            names,
            [
                "deliveries",
                "duplicates_skipped",
                "settled_by_webhook",
                "settled_by_reconcile",
                "effect_successes",
                "effect_failures",
                "effect_parks",
                "alerts",
                "redeliveries",
                "dropped_regress_from_terminal",
            ]
        );
        assert!(Counter::Deliveries.merges());
        assert!(!Counter::Dropped("stale").merges());
    }

    #[test]
    fn shards_are_stable_and_in_range() {
        assert_eq!(shard_of("batches/a"), shard_of("batches/a"));
        let used: std::collections::BTreeSet<u32> = (0..200)
            .map(|i| shard_of(&format!("batches/{i}")))
            .collect();
        assert!(used.iter().all(|s| *s < SHARDS));
        assert_eq!(used.len() as u32, SHARDS, "keys spread over every shard");
    }

    #[test]
    fn merge_adds_by_name() {
        let mut a = Tally::from([("x".to_string(), 1)]);
        merge(
            &mut a,
            &Tally::from([("x".to_string(), 2), ("y".to_string(), 5)]),
        );
        assert_eq!(a, Tally::from([("x".to_string(), 3), ("y".to_string(), 5)]));
    }

    #[test]
    fn trend_has_every_hour_of_the_last_day_oldest_first() {
        let now = 1_795_000_000_000; // 2026-11-18T11:06:40Z
        let h = hour_of(now);
        let mut a = Hourly::new();
        a.insert(
            h,
            Tally::from([
                (DELIVERIES.to_string(), 3),
                ("dropped_stale_update_time".to_string(), 1),
                ("dropped_regress_from_terminal".to_string(), 2),
                (DUPLICATES.to_string(), 9),
            ]),
        );
        a.insert(h - 23, Tally::from([(SETTLED_BY_RECONCILE.to_string(), 4)]));
        a.insert(h - 24, Tally::from([(DELIVERIES.to_string(), 100)]));
        let mut b = Hourly::new();
        b.insert(
            h,
            Tally::from([
                (DELIVERIES.to_string(), 2),
                (EFFECT_FAILURES.to_string(), 5),
            ]),
        );
        merge_hourly(&mut a, &b);
        let series = hourly_series(&a, now);
        assert_eq!(series.len(), 24);
        assert_eq!(series[23].hour, "2026-11-18T11:00:00Z");
        assert_eq!(series[23].deliveries, 5, "summed across shards");
        assert_eq!(
            series[23].dropped, 3,
            "every dropped reason, not duplicates"
        );
        assert_eq!(series[23].effect_failures, 5);
        assert_eq!(series[0].settled_by_reconcile, 4, "the oldest hour kept");
        assert!(
            series.iter().all(|p| p.deliveries != 100),
            "an hour older than the day is left out"
        );
        assert_eq!(
            series[5],
            HourPoint {
                hour: series[5].hour.clone(),
                ..HourPoint::default()
            }
        );
    }

    #[test]
    fn hours_bucket_time() {
        assert_eq!(hour_of(0), 0);
        assert_eq!(hour_of(3_599_999), 0);
        assert_eq!(hour_of(3_600_000), 1);
    }
}
