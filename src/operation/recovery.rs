//! Reading a stored record that does not load: what the gate does instead of failing every
//! delivery, command and alarm of its operation.
//!
//! Guarantees: [`recover`] never recurses on the stored text (a record nested past serde_json's
//! limit is read by an iterative scan that replaces what lies too deep with a marker), and
//! never forgets that the side effect may already have run: a record read whole (with deep
//! outside values replaced by markers) keeps every fact it had; one rebuilt from its readable
//! fields ([`Recovery::Salvaged`]) keeps its key, name, kind, state, effect generation, fencing
//! token and attempts, and an effect that was owed is parked, not run, until an operator retries
//! or forgets it. A record whose key or state cannot be read is not recovered (`None`). Either
//! way the gate keeps the raw text for inspection (`src/edge/objects/gate/tables.rs`), and
//! [`mark_recovered`] raises the `record_unreadable` alert once.

use serde_json::Value;

use crate::operation::gate::log::GateLog;
use crate::operation::history::HistoryEntry;
use crate::operation::{details, Actor, Operation};

/// Depth, from the record's top, past which the scan replaces a value with a marker: the
/// record's own fields nest a few levels, its outside values up to [`details::MAX_DEPTH`] more.
pub const SCAN_DEPTH: usize = details::MAX_DEPTH + 8;

/// How a record that did not load was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// Read whole once values nested too deep were replaced by markers.
    Pruned,
    /// Rebuilt from the fields that could be read; an owed effect is parked.
    Salvaged,
    /// Nothing could be read: rebuilt by an operator from the name alone ([`Operation::rebuild`]).
    Rebuilt,
}

impl Recovery {
    pub fn as_str(self) -> &'static str {
        match self {
            Recovery::Pruned => "pruned",
            Recovery::Salvaged => "salvaged",
            Recovery::Rebuilt => "rebuilt",
        }
    }
}

/// `text` (JSON) with every container nested deeper than `max_depth` replaced by a marker
/// object, without recursion. Valid JSON stays valid; anything else is copied as it is.
pub fn prune_depth(text: &str, max_depth: usize) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let (mut depth, mut copied, mut i) = (0usize, 0usize, 0usize);
    // Where the container being replaced opened, while one is.
    let mut cut_from = None;
    let mut cut = |out: &mut String, from: usize, end: usize| {
        out.push_str(&text[copied..from]);
        let skipped = &text[from..end];
        out.push_str(&details::marker("too_deep", None, skipped.len(), skipped).to_string());
        copied = end;
    };
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i = past_string(bytes, i);
                continue;
            }
            b'{' | b'[' => {
                if depth == max_depth && cut_from.is_none() {
                    cut_from = Some(i);
                }
                depth += 1;
            }
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                if let Some(from) = cut_from.filter(|_| depth == max_depth) {
                    cut(&mut out, from, i + 1);
                    cut_from = None;
                }
            }
            _ => {}
        }
        i += 1;
    }
    if let Some(from) = cut_from {
        cut(&mut out, from, bytes.len());
    }
    out.push_str(&text[copied..]);
    out
}

/// The index just past the string whose opening quote is at `start` (or the end of the text).
fn past_string(bytes: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    bytes.len()
}

/// Reads a stored record that `serde_json` refused: whole after pruning what is too deep, or
/// rebuilt from its readable fields. `None` when not even its key and state can be read.
pub fn recover(raw: &str) -> Option<(Operation, Recovery)> {
    let pruned = prune_depth(raw, SCAN_DEPTH);
    if let Ok(op) = serde_json::from_str::<Operation>(&pruned) {
        return Some((op.normalized(), Recovery::Pruned));
    }
    let value: Value = serde_json::from_str(&pruned).ok()?;
    Operation::salvage(&value).map(|op| (op, Recovery::Salvaged))
}

/// Marks a recovered record: raises the `record_unreadable` alert (once per operation) and
/// bumps the version so the ledger follows. Returns the history row (naming the operator
/// whose repair rebuilt it, `by`) and the log line's fields.
pub fn mark_recovered(
    op: &mut Operation,
    how: Recovery,
    error: &str,
    raw: &str,
    now_ms: i64,
    by: Option<Actor>,
) -> (HistoryEntry, GateLog) {
    op.mark_recovered(now_ms);
    let excerpt = details::bound_string(raw.chars().take(4_096).collect());
    let row = HistoryEntry::RecordRecovered {
        how: how.as_str(),
        error: error.to_string(),
        raw_bytes: raw.len(),
        raw_excerpt: excerpt,
        by,
    };
    let line = GateLog::RecordRecovered {
        key: op.key().to_string(),
        how: how.as_str(),
        error: error.to_string(),
        raw_bytes: raw.len(),
    };
    (row, line)
}

/// The line logged for a record that cannot be recovered.
pub fn unrecoverable(error: &str, raw: &str) -> GateLog {
    let (error, raw_bytes) = (error.to_string(), raw.len());
    GateLog::RecordUnreadable { error, raw_bytes }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operation::alert::AlertKind;
    use crate::operation::lifecycle::{Source, Status};
    use crate::operation::OpEvent;
    use crate::retry::Next;
    use serde_json::{json, Map};

    /// A record as an older version could store it: the nudge's metadata nested `levels`
    /// objects deep, written as text (as serde_json's writer would, which has no limit).
    fn deep_record(levels: usize) -> String {
        let mut op = Operation::register("batches/d", "batches/d", Some("k".into()), 1_000);
        op.request_confirmation(1_000, Map::new(), Some("jwt_1".into()), 0);
        let text = serde_json::to_string(&op).unwrap();
        let deep = format!("{}1{}", "{\"a\":".repeat(levels), "}".repeat(levels));
        text.replace(
            "\"metadata\":{}",
            &format!("\"metadata\":{{\"unverified_user_metadata\":{deep}}}"),
        )
    }

    #[test]
    fn pruning_keeps_shallow_json_as_it_is() {
        for text in [
            r#"{"a":[1,{"b":"}{]["}],"c":"\"{"}"#,
            r#"[]"#,
            r#""x""#,
            r#"{"é":"ü"}"#,
        ] {
            assert_eq!(prune_depth(text, 5), text);
        }
    }

    #[test]
    fn pruning_replaces_what_is_too_deep_with_a_marker() {
        let text = r#"{"a":{"b":{"c":[1,"]}"]},"d":2},"e":3}"#;
        let pruned: Value = serde_json::from_str(&prune_depth(text, 2)).unwrap();
        assert_eq!(pruned["a"]["b"]["truncated"], true);
        assert_eq!(pruned["a"]["b"]["reason"], "too_deep");
        assert_eq!(pruned["a"]["b"]["preview"], r#"{"c":[1,"]}"]}"#);
        assert_eq!(pruned["a"]["d"], 2);
        assert_eq!(pruned["e"], 3);
    }

    #[test]
    fn a_record_past_serde_json_s_limit_is_read_whole_with_a_marker() {
        let raw = deep_record(140);
        assert!(serde_json::from_str::<Operation>(&raw).is_err());
        let (op, how) = recover(&raw).unwrap();
        assert_eq!(how, Recovery::Pruned);
        assert_eq!(op.key(), "batches/d");
        assert_eq!(op.kind(), Some("k"));
        let meta = &op.confirmation().unwrap().metadata["unverified_user_metadata"];
        assert!(details::is_marker(meta), "{meta}");
        // Stored again, it loads.
        let again: Operation = serde_json::from_str(&serde_json::to_string(&op).unwrap()).unwrap();
        assert_eq!(again, op);
    }

    #[test]
    fn a_record_of_another_shape_is_salvaged_and_its_owed_effect_parked() {
        let mut op = Operation::register("batches/s", "projects/p/batches/s", None, 1_000);
        let event = OpEvent {
            status: Status::Succeeded,
            update_time_ms: 5,
            source: Source::Webhook,
            details: json!({"output_file_uri": "gs://o"})
                .as_object()
                .unwrap()
                .clone(),
            delivery_id: None,
        };
        op.apply(&event, 2_000);
        let c = op.claim(2_000, 600_000).unwrap();
        op.finish(&c, &Next::retry("503".into(), 3_000 + 1_000), 3_000);
        let mut v = serde_json::to_value(&op).unwrap();
        v["effect"]["attempts"] = json!("three"); // a field that no longer reads as its type
        v["pending_stats"] = json!({"not": "a list"});
        let raw = v.to_string();
        assert!(serde_json::from_str::<Operation>(&raw).is_err());
        let (back, how) = recover(&raw).unwrap();
        assert_eq!(how, Recovery::Salvaged);
        assert_eq!(back.name(), "projects/p/batches/s");
        assert_eq!(back.status(), &Status::Succeeded);
        assert_eq!(
            back.effect().fence(),
            1,
            "the fencing token never goes back"
        );
        assert_eq!(back.details()["output_file_uri"], "gs://o");
        assert!(!back.effect_owed(), "may have run: parked, not retried");
        assert!(back
            .effect()
            .parked()
            .unwrap()
            .answer
            .contains("may already have run"));
        assert!(back.version() > op.version());
    }

    #[test]
    fn a_salvaged_record_still_sends_its_queued_alerts() {
        let mut op = Operation::register("batches/q", "batches/q", None, 1_000);
        assert!(op.raise_alert(AlertKind::Stuck, 60, 2_000));
        assert_eq!(op.pending_alerts().len(), 1);
        let mut v = serde_json::to_value(&op).unwrap();
        v["effect"]["attempts"] = json!("three");
        let (back, how) = recover(&v.to_string()).unwrap();
        assert_eq!(how, Recovery::Salvaged);
        assert_eq!(
            back.pending_alerts(),
            op.pending_alerts(),
            "still owed to the sink"
        );
        assert_eq!(back.alerts_raised(), op.alerts_raised());
        // A queue that does not read: the kinds are forgotten, so each can be raised again.
        v["pending_alerts"] = json!("garbled");
        let (back, _) = recover(&v.to_string()).unwrap();
        assert!(back.alerts_raised().is_empty() && back.pending_alerts().is_empty());
        // Nothing queued (not stored when empty): the raised kinds stay raised.
        let mut v = serde_json::to_value(&op).unwrap();
        v.as_object_mut().unwrap().remove("pending_alerts");
        v["effect"]["attempts"] = json!("three");
        let (back, _) = recover(&v.to_string()).unwrap();
        assert_eq!(back.alerts_raised(), vec![AlertKind::Stuck]);
    }

    #[test]
    fn a_salvaged_done_effect_stays_done() {
        let op = Operation::register("batches/t", "batches/t", None, 1_000);
        let mut v = serde_json::to_value(&op).unwrap();
        v["status"] = json!("failed");
        v["effect"]["done"] = json!(true);
        v["effect"]["generation"] = json!(3);
        v["effect"]["claim"] = json!("garbled");
        let (back, _) = recover(&v.to_string()).unwrap();
        assert!(back.effect().done() && back.effect().parked().is_none());
        assert_eq!(back.effect().generation(), 3);
    }

    #[test]
    fn a_rebuilt_record_is_polled_and_never_runs_its_effect_unasked() {
        let mut op = Operation::rebuild("batches/r", "projects/p/batches/r", "unreadable", 50_000);
        assert_eq!(op.status(), &Status::Pending);
        assert!(op.registered(), "the cron polls it");
        assert_eq!(op.effect().fence(), 50_000);
        let event = OpEvent {
            status: Status::Succeeded,
            update_time_ms: 1,
            source: Source::Reconcile,
            details: Map::new(),
            delivery_id: None,
        };
        op.apply(&event, 60_000);
        assert!(!op.effect_owed(), "parked: an operator decides");
        assert!(op.claim(60_000, 1_000).is_none());
        op.retry_now(61_000).unwrap();
        let c = op.claim(61_000, 1_000).unwrap();
        assert!(c.token > 50_000);
    }

    #[test]
    fn no_key_or_state_means_not_recovered() {
        assert!(recover("not json").is_none());
        assert!(recover(r#"{"key":"batches/x","status":"exploded"}"#).is_none());
        assert!(recover(r#"{"status":"pending"}"#).is_none());
    }

    #[test]
    fn marking_alerts_once_and_keeps_an_excerpt() {
        let raw = deep_record(140);
        let (mut op, how) = recover(&raw).unwrap();
        let (row, line) =
            mark_recovered(&mut op, how, "recursion limit exceeded", &raw, 9_000, None);
        assert_eq!(op.alerts_raised(), [AlertKind::RecordUnreadable]);
        assert_eq!(op.pending_alerts().len(), 1);
        let row = row.to_value();
        assert_eq!(row["what"], "record_recovered");
        assert_eq!(row["raw_bytes"], raw.len());
        assert_eq!(line.to_value()["how"], "pruned");
        assert!(
            row.get("by").is_none(),
            "a load recovered it, not an operator"
        );
        let operator = Actor {
            scope: "admin".into(),
            fingerprint: "0a1b2c3d".into(),
        };
        let (row, _) = mark_recovered(&mut op, how, "again", &raw, 9_500, Some(operator));
        assert_eq!(row.to_value()["by"]["fingerprint"], "0a1b2c3d");
        assert_eq!(op.pending_alerts().len(), 1, "once per operation");
    }
}
