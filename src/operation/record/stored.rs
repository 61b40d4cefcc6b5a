//! How the record is stored: one flat JSON object (the gate's SQLite row, and what a repair
//! reads), whatever shape the record has in memory.
//!
//! Guarantees: the field names, their order and which are left out when empty are fixed
//! here; a field added later reads with its default, so every record stored before still
//! loads (its tests hold records as they were stored and checks they load and store back
//! unchanged).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::operation::alert::AlertKind;
use crate::operation::lifecycle::{Source, Status};
use crate::operation::record::alerts::Alerts;
use crate::operation::record::ledger_mark::LedgerMark;
use crate::operation::record::operator::OperatorNotes;
use crate::operation::record::outbox::Outbox;
use crate::operation::record::{Confirmation, Effect, Operation, OperatorNote, PendingAlert};
use crate::telemetry::counters::StatEvent;

/// The stored shape, as read.
#[derive(Deserialize)]
pub struct Stored {
    key: String,
    name: String,
    kind: Option<String>,
    status: Status,
    update_time_ms: i64,
    version: u64,
    registered: bool,
    submitted_at_ms: i64,
    settled_at_ms: Option<i64>,
    settled_by: Option<Source>,
    details: Map<String, Value>,
    effect: Effect,
    #[serde(default)]
    alerts: Vec<AlertKind>,
    #[serde(default)]
    unusable_status: Option<String>,
    #[serde(default)]
    forgotten: Option<OperatorNote>,
    #[serde(default)]
    redeliveries: Vec<OperatorNote>,
    #[serde(default)]
    pending_stats: Vec<StatEvent>,
    #[serde(default)]
    stats_seq: u64,
    #[serde(default)]
    stats_sealed_seq: u64,
    #[serde(default)]
    projected_version: u64,
    #[serde(default)]
    projected_at_ms: i64,
    #[serde(default)]
    projection_failures: u32,
    #[serde(default)]
    projection_retry_at_ms: i64,
    #[serde(default)]
    indexed: bool,
    #[serde(default)]
    confirmation: Option<Confirmation>,
    #[serde(default)]
    pending_alerts: Vec<PendingAlert>,
    #[serde(default)]
    retired_at_ms: Option<i64>,
}

/// The stored shape, as written (borrowed from the record).
#[derive(Serialize)]
struct StoredRef<'a> {
    key: &'a str,
    name: &'a str,
    kind: &'a Option<String>,
    status: &'a Status,
    update_time_ms: i64,
    version: u64,
    registered: bool,
    submitted_at_ms: i64,
    settled_at_ms: Option<i64>,
    settled_by: Option<Source>,
    details: &'a Map<String, Value>,
    effect: &'a Effect,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    alerts: &'a [AlertKind],
    #[serde(skip_serializing_if = "Option::is_none")]
    unusable_status: &'a Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    forgotten: &'a Option<OperatorNote>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    redeliveries: &'a [OperatorNote],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pending_stats: &'a [StatEvent],
    stats_seq: u64,
    stats_sealed_seq: u64,
    projected_version: u64,
    projected_at_ms: i64,
    projection_failures: u32,
    projection_retry_at_ms: i64,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    indexed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    confirmation: &'a Option<Confirmation>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pending_alerts: &'a [PendingAlert],
    #[serde(skip_serializing_if = "Option::is_none")]
    retired_at_ms: Option<i64>,
}

impl Serialize for Operation {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        StoredRef {
            key: &self.key,
            name: &self.name,
            kind: &self.kind,
            status: &self.status,
            update_time_ms: self.update_time_ms,
            version: self.version,
            registered: self.registered,
            submitted_at_ms: self.submitted_at_ms,
            settled_at_ms: self.settled_at_ms,
            settled_by: self.settled_by,
            details: &self.details,
            effect: &self.effect,
            alerts: &self.alerts.raised,
            unusable_status: &self.notes.unusable_status,
            forgotten: &self.notes.forgotten,
            redeliveries: &self.notes.redeliveries,
            pending_stats: &self.outbox.pending,
            stats_seq: self.outbox.seq,
            stats_sealed_seq: self.outbox.sealed_seq,
            projected_version: self.ledger.version,
            projected_at_ms: self.ledger.at_ms,
            projection_failures: self.ledger.failures,
            projection_retry_at_ms: self.ledger.retry_at_ms,
            indexed: self.ledger.indexed,
            confirmation: &self.confirmation,
            pending_alerts: &self.alerts.pending,
            retired_at_ms: self.retired_at_ms,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Operation {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Stored::deserialize(deserializer).map(Operation::from)
    }
}

impl From<Stored> for Operation {
    fn from(s: Stored) -> Operation {
        Operation {
            key: s.key,
            name: s.name,
            kind: s.kind,
            status: s.status,
            update_time_ms: s.update_time_ms,
            version: s.version,
            registered: s.registered,
            submitted_at_ms: s.submitted_at_ms,
            settled_at_ms: s.settled_at_ms,
            settled_by: s.settled_by,
            details: s.details,
            effect: s.effect,
            alerts: Alerts {
                raised: s.alerts,
                pending: s.pending_alerts,
            },
            notes: OperatorNotes {
                unusable_status: s.unusable_status,
                forgotten: s.forgotten,
                redeliveries: s.redeliveries,
            },
            outbox: Outbox {
                pending: s.pending_stats,
                seq: s.stats_seq,
                sealed_seq: s.stats_sealed_seq,
            },
            ledger: LedgerMark {
                version: s.projected_version,
                at_ms: s.projected_at_ms,
                failures: s.projection_failures,
                retry_at_ms: s.projection_retry_at_ms,
                indexed: s.indexed,
            },
            confirmation: s.confirmation,
            retired_at_ms: s.retired_at_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    //! Records as the gate stores them, one for each part of the record, kept as text: a
    //! change to the stored shape fails here.
    use super::*;
    use crate::operation::lifecycle::Status;

    const OPEN_CONFIRMING: &str = r#"{"key":"batches/a","name":"projects/p/batches/a","kind":"nightly","status":"pending","update_time_ms":0,"version":5,"registered":true,"submitted_at_ms":1700000000000,"settled_at_ms":null,"settled_by":null,"details":{},"effect":{"done":false,"done_at_ms":null,"parked":null,"attempts":0,"failures_in_row":0,"generation":1,"fence":0,"claim":null,"next_attempt_ms":0,"last_error":null},"alerts":["status_unusable"],"unusable_status":"too large","pending_stats":[{"seq":1,"name":"deliveries","at_ms":1700000001000,"count":1},{"seq":2,"name":"dropped_stale_update_time","at_ms":1700000001500,"count":1},{"seq":3,"name":"deliveries","at_ms":1700000001600,"count":1}],"stats_seq":3,"stats_sealed_seq":2,"projected_version":0,"projected_at_ms":1700000002200,"projection_failures":1,"projection_retry_at_ms":1700000003200,"indexed":true,"confirmation":{"requested_at_ms":1700000001000,"due_ms":1700000032000,"attempts":1,"metadata":{"user_metadata":{"job":7}},"delivery_id":"jwt_abc"},"pending_alerts":[{"kind":"status_unusable","id":"alert_33ca057dade1b1526f194d1a","age_seconds":60,"attempts":1,"due_ms":1700000007100}]}"#;

    const PARKED_FORGOTTEN: &str = r#"{"key":"operations/b","name":"operations/b","kind":null,"status":"succeeded","update_time_ms":1700000000500,"version":12,"registered":false,"submitted_at_ms":1700000000000,"settled_at_ms":1700000001000,"settled_by":"reconcile","details":{"error_code":null,"error_message":null,"output_file_uri":"gs://b/o","output_file_uris":["gs://b/o"],"provider":{}},"effect":{"done":false,"done_at_ms":null,"parked":{"at_ms":1700000040100,"answer":"400: bad"},"attempts":3,"failures_in_row":1,"generation":2,"fence":3,"claim":null,"next_attempt_ms":1700000040000,"last_error":"400: bad"},"alerts":["effect_failing"],"forgotten":{"at_ms":1700000050000,"reason":"by hand"},"redeliveries":[{"at_ms":1700000040000,"reason":"lost downstream"}],"stats_seq":0,"stats_sealed_seq":0,"projected_version":11,"projected_at_ms":1700000040200,"projection_failures":0,"projection_retry_at_ms":0}"#;

    const TOMBSTONE: &str = r#"{"key":"operations/b","name":"operations/b","kind":null,"status":"succeeded","update_time_ms":1700000000500,"version":13,"registered":false,"submitted_at_ms":1700000000000,"settled_at_ms":1700000001000,"settled_by":"reconcile","details":{},"effect":{"done":false,"done_at_ms":null,"parked":{"at_ms":1700000040100,"answer":""},"attempts":3,"failures_in_row":1,"generation":2,"fence":3,"claim":null,"next_attempt_ms":1700000040000,"last_error":null},"forgotten":{"at_ms":1700000050000,"reason":""},"stats_seq":0,"stats_sealed_seq":0,"projected_version":13,"projected_at_ms":1700000040200,"projection_failures":0,"projection_retry_at_ms":0,"retired_at_ms":1800000000000}"#;

    const CLAIMED: &str = r#"{"key":"interactions/d","name":"interactions/d","kind":null,"status":"failed","update_time_ms":0,"version":3,"registered":true,"submitted_at_ms":5,"settled_at_ms":6,"settled_by":"webhook","details":{"error_code":null,"error_message":null,"output_file_uri":null,"output_file_uris":[],"provider":{}},"effect":{"done":false,"done_at_ms":null,"parked":null,"attempts":1,"failures_in_row":1,"generation":1,"fence":1,"claim":{"token":1,"expires_ms":1006},"next_attempt_ms":6,"last_error":null},"stats_seq":0,"stats_sealed_seq":0,"projected_version":0,"projected_at_ms":0,"projection_failures":0,"projection_retry_at_ms":0}"#;

    /// A record without the stats, projection and index fields, as older versions stored it.
    const OLDEST: &str = r#"{"key":"batches/o","name":"batches/o","kind":null,"status":"succeeded","update_time_ms":5,"version":3,"registered":true,"submitted_at_ms":1,"settled_at_ms":2,"settled_by":"webhook","details":{},"effect":{"done":true,"done_at_ms":3,"parked":null,"attempts":1,"failures_in_row":1,"generation":1,"fence":1,"claim":null,"next_attempt_ms":2,"last_error":null}}"#;

    #[test]
    fn records_stored_before_load_and_store_back_unchanged() {
        for stored in [OPEN_CONFIRMING, PARKED_FORGOTTEN, TOMBSTONE, CLAIMED] {
            let op: Operation = serde_json::from_str(stored).unwrap();
            assert_eq!(serde_json::to_string(&op).unwrap(), stored);
        }
    }

    #[test]
    fn what_a_stored_record_says_is_what_the_record_reads() {
        let op: Operation = serde_json::from_str(OPEN_CONFIRMING).unwrap();
        assert_eq!(op.version(), 5);
        assert_eq!(op.pending_stats().len(), 3);
        assert_eq!(op.stats_sealed_seq(), 2);
        assert_eq!(op.projection_failures(), 1);
        assert!(op.indexed());
        assert_eq!(op.unusable_status(), Some("too large"));
        assert_eq!(op.confirmation().unwrap().attempts, 1);
        assert_eq!(op.pending_alerts()[0].kind, AlertKind::StatusUnusable);
        let op: Operation = serde_json::from_str(PARKED_FORGOTTEN).unwrap();
        assert_eq!(op.effect().generation(), 2);
        assert_eq!(op.redeliveries()[0].reason, "lost downstream");
        assert_eq!(op.forgotten().unwrap().reason, "by hand");
        assert_eq!(op.alerts_raised(), [AlertKind::EffectFailing]);
        let op: Operation = serde_json::from_str(TOMBSTONE).unwrap();
        assert_eq!(op.retired_at_ms(), Some(1_800_000_000_000));
        let op: Operation = serde_json::from_str(CLAIMED).unwrap();
        assert_eq!(op.effect().claim().unwrap().expires_ms, 1_006);
    }

    #[test]
    fn a_record_from_before_the_newer_fields_loads_with_their_defaults() {
        let op: Operation = serde_json::from_str(OLDEST).unwrap();
        assert_eq!(op.status(), &Status::Succeeded);
        assert!(op.effect().done());
        assert_eq!((op.projected_version(), op.stats_sealed_seq()), (0, 0));
        assert!(!op.indexed() && op.pending_stats().is_empty());
        let again: Operation = serde_json::from_str(&serde_json::to_string(&op).unwrap()).unwrap();
        assert_eq!(again, op);
    }
}
