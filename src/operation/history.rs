//! An operation's history rows: what the gate did, one typed entry per row, stored as JSON with its
//! kind under `what` (the admin API's `history`, the chaos oracle and the dashboard read them).
//!
//! Guarantees: every row the gate stores is one of [`HistoryEntry`]'s variants, so its spelling is
//! fixed here; the stored time (`at`) is added by the storage, not the entry. [`HistoryLog`] is how
//! the rows are kept: inside the record's own SQLite row (the write the record makes anyway carries
//! them, so a row costs no write of its own), newest [`HISTORY_LIMIT`] kept, in order.

use serde::Serialize;
use serde_json::Value;

use crate::operation::alert::AlertKind;
use crate::operation::lifecycle::{Source, Verdict};
use crate::operation::{Actor, OpEvent};

/// One history row (an operator's `by`: who asked, when an operator did through the admin
/// API; rows before it was kept lack it).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "what", rename_all = "snake_case")]
pub enum HistoryEntry {
    /// Registered through the admin API.
    Registered {
        kind: Option<String>,
        /// Whose token registered it (rows before it was kept lack it).
        #[serde(skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
    /// A registration filled in the kind of an operation its completion created.
    KindFilled { kind: Option<String> },
    /// An event the reducer applied.
    Applied(EventRow),
    /// An event the reducer dropped.
    Dropped(EventRow),
    /// A dynamic-webhook delivery now waiting for the status API.
    Nudged {
        claimed: String,
        delivery_id: String,
    },
    Forgotten {
        reason: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
    /// A status-API answer that could not be used.
    StatusUnusable { reason: String },
    /// An operator's deliberate redelivery (a new generation).
    Redeliver {
        generation: u32,
        reason: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
    /// An operator's retry of an effect not done (the same generation).
    RetryNow {
        generation: u32,
        reason: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
    /// An operator's retry of a batch's parked results: `taken` parked results put back, and
    /// the results file read again when `file_reread`.
    ResultsRetried {
        taken: u64,
        file_reread: bool,
        reason: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
    /// A batch's results file is gone or unreadable: its unread results are parked.
    ResultsFileParked { reason: String },
    /// `parked` results were parked in this spell, refused or failing past the alert threshold
    /// (the `results_failing` alert).
    ResultsGaveUp { parked: u64 },
    /// The result senders answered nothing for `silent_ms` while `waiting` results wait.
    ResultSendersSilent { waiting: u64, silent_ms: i64 },
    /// A result sender answered again, or nothing waits for one.
    ResultSendersBack,
    /// Every result is delivered or parked: the job's effect carries these counts (as a new
    /// `generation` when it went out before with others).
    ResultsSettled {
        counts: Value,
        #[serde(skip_serializing_if = "Option::is_none")]
        generation: Option<u32>,
    },
    /// The status API does not know the operation a nudge named.
    ConfirmNotFound,
    /// The alert sink accepted an alert.
    Alert { alert: AlertKind, alert_id: String },
    /// The side effect was claimed under `token`.
    Claimed { token: u64, attempt: u32 },
    /// How an attempt ended: `result` is its log event's name.
    /// Rows stored before `destination`, `webhook_id` and `http_status` were kept lack them.
    Attempt {
        token: u64,
        result: String,
        answer: String,
        ms: i64,
        /// The route's name and the destination's origin, never a credential.
        #[serde(skip_serializing_if = "Option::is_none")]
        destination: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        webhook_id: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        http_status: Option<u16>,
    },
    /// A stored record that did not load was recovered.
    RecordRecovered {
        how: &'static str,
        error: String,
        raw_bytes: usize,
        raw_excerpt: String,
        /// The operator whose repair rebuilt it; none when a load recovered it.
        #[serde(skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
}

/// An event offered to the reducer, as its row shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventRow {
    /// Why it was dropped (an operator's reason when one settled it; none when applied).
    pub reason: Option<String>,
    pub status: String,
    pub source: &'static str,
    pub update_time_ms: i64,
    pub delivery_id: Option<String>,
    /// Who settled it, when an operator did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settled_by: Option<&'static str>,
    /// Which operator, when one did through the admin API.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<Actor>,
}

impl HistoryEntry {
    /// The row for `event`, applied or dropped as `verdict` says.
    pub fn of_event(event: &OpEvent, verdict: Verdict) -> HistoryEntry {
        let row = |reason: Option<&str>| EventRow {
            reason: reason.map(str::to_string),
            status: event.status.as_str().to_string(),
            source: event.source.as_str(),
            update_time_ms: event.update_time_ms,
            delivery_id: event.delivery_id.clone(),
            settled_by: None,
            by: None,
        };
        match verdict {
            Verdict::Apply => HistoryEntry::Applied(row(None)),
            Verdict::Drop(r) => HistoryEntry::Dropped(row(Some(r.as_str()))),
        }
    }

    /// The row for an outcome an operator (`by`) gave, with their reason.
    pub fn settled_by_operator(event: &OpEvent, reason: &str, by: Option<Actor>) -> HistoryEntry {
        match HistoryEntry::of_event(event, Verdict::Apply) {
            HistoryEntry::Applied(row) => HistoryEntry::Applied(EventRow {
                reason: Some(reason.to_string()),
                settled_by: Some(Source::Operator.as_str()),
                by,
                ..row
            }),
            other => other,
        }
    }

    /// The row as stored.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// History rows kept per operation; older rows are dropped as new ones come.
pub const HISTORY_LIMIT: usize = 100;

/// An operation's history as its gate keeps it: `(at_ms, entry as JSON)`, oldest first, at
/// most [`HISTORY_LIMIT`], stored as one JSON array beside the record.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistoryLog {
    rows: Vec<(i64, String)>,
}

impl HistoryLog {
    /// The log stored as `text` ([`HistoryLog::encode`]'s form); a text that does not parse
    /// loses only the history, never the record.
    pub fn decode(text: &str) -> HistoryLog {
        let rows: Vec<(i64, Value)> = serde_json::from_str(text).unwrap_or_default();
        let rows = rows.into_iter().map(|(at, e)| (at, e.to_string()));
        let rows = rows.collect();
        HistoryLog { rows }
    }

    /// A log of rows read one by one (an object that kept them in a table of their own).
    pub fn from_rows(rows: Vec<(i64, String)>) -> HistoryLog {
        let mut log = HistoryLog { rows };
        log.trim();
        log
    }

    /// Adds `entries`, all at `at_ms`; false when there were none.
    pub fn append(&mut self, at_ms: i64, entries: Vec<HistoryEntry>) -> bool {
        if entries.is_empty() {
            return false;
        }
        for e in entries {
            self.rows.push((at_ms, e.to_value().to_string()));
        }
        self.trim();
        true
    }

    fn trim(&mut self) {
        let over = self.rows.len().saturating_sub(HISTORY_LIMIT);
        self.rows.drain(..over);
    }

    /// The stored form: `[[at_ms, entry], ...]`, each entry's JSON as it was written.
    pub fn encode(&self) -> String {
        let rows = self.rows.iter().map(|(at, e)| format!("[{at},{e}]"));
        format!("[{}]", rows.collect::<Vec<_>>().join(","))
    }

    /// The rows as the admin API shows them, oldest first: each entry with its time as `at`.
    pub fn view(&self) -> Vec<Value> {
        self.rows
            .iter()
            .map(|(at, entry)| {
                let mut entry: Value = serde_json::from_str(entry).unwrap_or(Value::Null);
                let at = Value::String(crate::timestamp::format_rfc3339(*at));
                if let Value::Object(map) = &mut entry {
                    map.insert("at".into(), at);
                }
                entry
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operation::lifecycle::{DropReason, Status};
    use serde_json::{json, Map};

    fn event() -> OpEvent {
        OpEvent {
            status: Status::Succeeded,
            update_time_ms: 7,
            source: Source::Webhook,
            details: Map::new(),
            delivery_id: Some("msg_1".into()),
        }
    }

    fn actor() -> Actor {
        Actor {
            scope: "admin".into(),
            fingerprint: "0a1b2c3d".into(),
        }
    }

    /// Each entry serializes to exactly this row (the admin API, the chaos oracle and the
    /// dashboard read these spellings).
    #[test]
    fn every_entry_keeps_its_stored_shape() {
        let cases = [
            (
                HistoryEntry::Registered {
                    kind: None,
                    by: None,
                },
                json!({"what": "registered", "kind": null}),
            ),
            (
                HistoryEntry::KindFilled {
                    kind: Some("k".into()),
                },
                json!({"what": "kind_filled", "kind": "k"}),
            ),
            (
                HistoryEntry::of_event(&event(), Verdict::Apply),
                json!({"what": "applied", "reason": null, "status": "succeeded",
                    "source": "webhook", "update_time_ms": 7, "delivery_id": "msg_1"}),
            ),
            (
                HistoryEntry::of_event(&event(), Verdict::Drop(DropReason::Duplicate)),
                json!({"what": "dropped", "reason": "duplicate", "status": "succeeded",
                    "source": "webhook", "update_time_ms": 7, "delivery_id": "msg_1"}),
            ),
            (
                HistoryEntry::settled_by_operator(&event(), "checked", None),
                json!({"what": "applied", "reason": "checked", "status": "succeeded",
                    "source": "webhook", "update_time_ms": 7, "delivery_id": "msg_1",
                    "settled_by": "operator"}),
            ),
            (
                HistoryEntry::settled_by_operator(&event(), "checked", Some(actor())),
                json!({"what": "applied", "reason": "checked", "status": "succeeded",
                    "source": "webhook", "update_time_ms": 7, "delivery_id": "msg_1",
                    "settled_by": "operator",
                    "by": {"scope": "admin", "fingerprint": "0a1b2c3d"}}),
            ),
            (
                HistoryEntry::Nudged {
                    claimed: "succeeded".into(),
                    delivery_id: "jwt_1".into(),
                },
                json!({"what": "nudged", "claimed": "succeeded", "delivery_id": "jwt_1"}),
            ),
            (
                HistoryEntry::Forgotten {
                    reason: "r".into(),
                    by: None,
                },
                json!({"what": "forgotten", "reason": "r"}),
            ),
            (
                HistoryEntry::Forgotten {
                    reason: "r".into(),
                    by: Some(actor()),
                },
                json!({"what": "forgotten", "reason": "r",
                    "by": {"scope": "admin", "fingerprint": "0a1b2c3d"}}),
            ),
            (
                HistoryEntry::StatusUnusable { reason: "r".into() },
                json!({"what": "status_unusable", "reason": "r"}),
            ),
            (
                HistoryEntry::Redeliver {
                    generation: 2,
                    reason: "r".into(),
                    by: Some(actor()),
                },
                json!({"what": "redeliver", "generation": 2, "reason": "r",
                    "by": {"scope": "admin", "fingerprint": "0a1b2c3d"}}),
            ),
            (
                HistoryEntry::RetryNow {
                    generation: 1,
                    reason: "r".into(),
                    by: None,
                },
                json!({"what": "retry_now", "generation": 1, "reason": "r"}),
            ),
            (
                HistoryEntry::ResultsRetried {
                    taken: 2,
                    file_reread: true,
                    reason: "r".into(),
                    by: None,
                },
                json!({"what": "results_retried", "taken": 2, "file_reread": true, "reason": "r"}),
            ),
            (
                HistoryEntry::ResultsSettled {
                    counts: json!({"total": 2}),
                    generation: Some(2),
                },
                json!({"what": "results_settled", "counts": {"total": 2}, "generation": 2}),
            ),
            (
                HistoryEntry::ResultsGaveUp { parked: 3 },
                json!({"what": "results_gave_up", "parked": 3}),
            ),
            (
                HistoryEntry::ResultSendersSilent {
                    waiting: 40,
                    silent_ms: 9,
                },
                json!({"what": "result_senders_silent", "waiting": 40, "silent_ms": 9}),
            ),
            (
                HistoryEntry::ResultSendersBack,
                json!({"what": "result_senders_back"}),
            ),
            (
                HistoryEntry::ConfirmNotFound,
                json!({"what": "confirm_not_found"}),
            ),
            (
                HistoryEntry::Alert {
                    alert: AlertKind::Stuck,
                    alert_id: "alert_x".into(),
                },
                json!({"what": "alert", "alert": "stuck", "alert_id": "alert_x"}),
            ),
            (
                HistoryEntry::Claimed {
                    token: 3,
                    attempt: 2,
                },
                json!({"what": "claimed", "token": 3, "attempt": 2}),
            ),
            (
                HistoryEntry::Attempt {
                    token: 3,
                    result: "effect_delivered".into(),
                    answer: "2xx".into(),
                    ms: 12,
                    destination: None,
                    webhook_id: None,
                    http_status: None,
                },
                json!({"what": "attempt", "token": 3, "result": "effect_delivered",
                    "answer": "2xx", "ms": 12}),
            ),
            (
                HistoryEntry::Attempt {
                    token: 4,
                    result: "effect_parked".into(),
                    answer: "400: invalid payload".into(),
                    ms: 9,
                    destination: Some("route billing: https://billing.example/\u{2026}".into()),
                    webhook_id: Some("msg_1_1".into()),
                    http_status: Some(400),
                },
                json!({"what": "attempt", "token": 4, "result": "effect_parked",
                    "answer": "400: invalid payload", "ms": 9,
                    "destination": "route billing: https://billing.example/\u{2026}",
                    "webhook_id": "msg_1_1", "http_status": 400}),
            ),
            (
                HistoryEntry::RecordRecovered {
                    how: "salvaged",
                    error: "e".into(),
                    raw_bytes: 5,
                    raw_excerpt: "{oops".into(),
                    by: None,
                },
                json!({"what": "record_recovered", "how": "salvaged", "error": "e",
                    "raw_bytes": 5, "raw_excerpt": "{oops"}),
            ),
        ];
        for (entry, want) in cases {
            assert_eq!(entry.to_value(), want);
        }
    }

    #[test]
    fn the_log_round_trips_keeps_the_newest_and_shows_each_time() {
        let mut log = HistoryLog::default();
        assert!(!log.append(5, vec![]));
        assert_eq!(log.encode(), "[]");
        assert!(log.append(1_000, vec![HistoryEntry::ConfirmNotFound]));
        log.append(
            2_000,
            vec![HistoryEntry::Forgotten {
                reason: "r".into(),
                by: None,
            }],
        );
        let text = log.encode();
        assert_eq!(
            text,
            r#"[[1000,{"what":"confirm_not_found"}],[2000,{"reason":"r","what":"forgotten"}]]"#
        );
        assert_eq!(HistoryLog::decode(&text), log);
        let view = log.view();
        assert_eq!(view[0]["what"], "confirm_not_found");
        assert_eq!(view[0]["at"], "1970-01-01T00:00:01Z");
        assert_eq!(view[1]["reason"], "r");
        for i in 0..(HISTORY_LIMIT as i64 + 5) {
            log.append(3_000 + i, vec![HistoryEntry::ConfirmNotFound]);
        }
        assert_eq!(log.rows.len(), HISTORY_LIMIT);
        assert_eq!(log.view()[0]["at"], crate::timestamp::format_rfc3339(3_005));
        assert!(
            HistoryLog::decode("not json").rows.is_empty(),
            "only the history is lost"
        );
        // A row of a kind no longer written (a tombstone's `retired`) still reads as stored.
        let rows = (0..(HISTORY_LIMIT as i64 + 1))
            .map(|i| (i, r#"{"what":"retired"}"#.to_string()))
            .collect();
        let kept = HistoryLog::from_rows(rows);
        assert_eq!(kept.rows.len(), HISTORY_LIMIT);
        assert_eq!(kept.view()[0]["what"], "retired");
    }
}
