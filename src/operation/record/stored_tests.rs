//! Records as the gate stores them, one for each part of the record, kept as text: a
//! change to the stored shape fails here.

use crate::operation::alert::AlertKind;
use crate::operation::lifecycle::Status;
use crate::operation::record::Operation;

const OPEN_CONFIRMING: &str = r#"{"key":"batches/a","name":"projects/p/batches/a","kind":"nightly","status":"pending","update_time_ms":0,"version":5,"registered":true,"submitted_at_ms":1700000000000,"settled_at_ms":null,"settled_by":null,"details":{},"effect":{"done":false,"done_at_ms":null,"parked":null,"attempts":0,"failures_in_row":0,"generation":1,"fence":0,"claim":null,"next_attempt_ms":0,"last_error":null},"alerts":["status_unusable"],"unusable_status":"too large","pending_stats":[{"seq":1,"name":"deliveries","at_ms":1700000001000,"count":1},{"seq":2,"name":"dropped_stale_update_time","at_ms":1700000001500,"count":1},{"seq":3,"name":"deliveries","at_ms":1700000001600,"count":1}],"stats_seq":3,"stats_sealed_seq":2,"projected_version":0,"projected_at_ms":1700000002200,"projection_failures":1,"projection_retry_at_ms":1700000003200,"indexed":true,"confirmation":{"requested_at_ms":1700000001000,"due_ms":1700000032000,"attempts":1,"metadata":{"user_metadata":{"job":7}},"delivery_id":"jwt_abc"},"pending_alerts":[{"kind":"status_unusable","id":"alert_33ca057dade1b1526f194d1a","age_seconds":60,"attempts":1,"due_ms":1700000007100}]}"#;

const PARKED_FORGOTTEN: &str = r#"{"key":"operations/b","name":"operations/b","kind":null,"status":"succeeded","update_time_ms":1700000000500,"version":12,"registered":false,"submitted_at_ms":1700000000000,"settled_at_ms":1700000001000,"settled_by":"reconcile","details":{"error_code":null,"error_message":null,"output_file_uri":"gs://b/o","output_file_uris":["gs://b/o"],"provider":{}},"effect":{"done":false,"done_at_ms":null,"parked":{"at_ms":1700000040100,"answer":"400: bad"},"attempts":3,"failures_in_row":1,"generation":2,"fence":3,"claim":null,"next_attempt_ms":1700000040000,"last_error":"400: bad"},"alerts":["effect_failing"],"forgotten":{"at_ms":1700000050000,"reason":"by hand"},"redeliveries":[{"at_ms":1700000040000,"reason":"lost downstream"}],"stats_seq":0,"stats_sealed_seq":0,"projected_version":11,"projected_at_ms":1700000040200,"projection_failures":0,"projection_retry_at_ms":0}"#;

const TOMBSTONE: &str = r#"{"key":"operations/b","name":"operations/b","kind":null,"status":"succeeded","update_time_ms":1700000000500,"version":13,"registered":false,"submitted_at_ms":1700000000000,"settled_at_ms":1700000001000,"settled_by":"reconcile","details":{},"effect":{"done":false,"done_at_ms":null,"parked":{"at_ms":1700000040100,"answer":""},"attempts":3,"failures_in_row":1,"generation":2,"fence":3,"claim":null,"next_attempt_ms":1700000040000,"last_error":null},"forgotten":{"at_ms":1700000050000,"reason":""},"stats_seq":0,"stats_sealed_seq":0,"projected_version":13,"projected_at_ms":1700000040200,"projection_failures":0,"projection_retry_at_ms":0,"retired_at_ms":1800000000000}"#;

const CLAIMED: &str = r#"{"key":"interactions/d","name":"interactions/d","kind":null,"status":"failed","update_time_ms":0,"version":3,"registered":true,"submitted_at_ms":5,"settled_at_ms":6,"settled_by":"webhook","details":{"error_code":null,"error_message":null,"output_file_uri":null,"output_file_uris":[],"provider":{}},"effect":{"done":false,"done_at_ms":null,"parked":null,"attempts":1,"failures_in_row":1,"generation":1,"fence":1,"claim":{"token":1,"expires_ms":1006},"next_attempt_ms":6,"last_error":null},"stats_seq":0,"stats_sealed_seq":0,"projected_version":0,"projected_at_ms":0,"projection_failures":0,"projection_retry_at_ms":0}"#;

/// A record without the stats, projection and index fields, as older versions stored it.
const OLDEST: &str = r#"{"key":"batches/o","name":"batches/o","kind":null,"status":"succeeded","update_time_ms":5,"version":3,"registered":true,"submitted_at_ms":1,"settled_at_ms":2,"settled_by":"webhook","details":{},"effect":{"done":true,"done_at_ms":3,"parked":null,"attempts":1,"failures_in_row":1,"generation":1,"fence":1,"claim":null,"next_attempt_ms":2,"last_error":null}}"#;
/// A `stuck` alert raised and its condition still open (`open_alerts`, the newest field).
const STUCK_OPEN: &str = r#"{"key":"batches/s","name":"batches/s","kind":"nightly","status":"running","update_time_ms":1700000000500,"version":4,"registered":true,"submitted_at_ms":1700000000000,"settled_at_ms":null,"settled_by":null,"details":{},"effect":{"done":false,"done_at_ms":null,"parked":null,"attempts":0,"failures_in_row":0,"generation":1,"fence":0,"claim":null,"next_attempt_ms":0,"last_error":null},"alerts":["stuck"],"stats_seq":0,"stats_sealed_seq":0,"projected_version":4,"projected_at_ms":1700021600500,"projection_failures":0,"projection_retry_at_ms":0,"open_alerts":["stuck"]}"#;

/// A batch's results owed and waiting on their destination's desk, as a version that kept
/// their due time in the job effect's `next_attempt_ms` stored it (no `results_retry_at_ms`).
const RESULTS_OWED_WAITING: &str = r#"{"key":"batches/r","name":"projects/p/batches/r","kind":"pages","status":"succeeded","update_time_ms":1700000000500,"version":4,"registered":true,"submitted_at_ms":1700000000000,"settled_at_ms":1700000001000,"settled_by":"webhook","details":{"error_code":null,"error_message":null,"output_file_uri":"files/out","output_file_uris":["files/out"],"provider":{}},"effect":{"done":false,"done_at_ms":null,"parked":null,"attempts":0,"failures_in_row":0,"generation":1,"fence":0,"claim":null,"next_attempt_ms":1700003602000,"last_error":null,"desk":{"desk":"waiting","since_ms":1700000002000}},"stats_seq":0,"stats_sealed_seq":0,"projected_version":4,"projected_at_ms":1700000002100,"projection_failures":0,"projection_retry_at_ms":0,"results":"each"}"#;

#[test]
fn records_stored_before_load_and_store_back_unchanged() {
    for stored in [
        OPEN_CONFIRMING,
        PARKED_FORGOTTEN,
        TOMBSTONE,
        CLAIMED,
        STUCK_OPEN,
        RESULTS_OWED_WAITING,
    ] {
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

#[test]
fn a_stored_open_condition_is_resolved_when_it_ends() {
    let mut op: Operation = serde_json::from_str(STUCK_OPEN).unwrap();
    assert!(op.resolve_alert(AlertKind::Stuck, 1_700_021_700_000));
    assert_eq!(op.pending_alerts()[0].kind, AlertKind::StuckSettled);
}

/// After a deploy, results a record stored as owed, with their due time in the job effect's
/// `next_attempt_ms`, go on from it: the wait stored holds, the desk's release or a step moves
/// their own due time from then on, and once they settle the job's effect is due.
#[test]
fn results_stored_owed_go_on_from_the_due_time_the_jobs_effect_kept() {
    let mut op: Operation = serde_json::from_str(RESULTS_OWED_WAITING).unwrap();
    let due = 1_700_003_602_000;
    assert_eq!(op.results_due_ms(), Some(due), "the stored wait holds");
    assert_eq!(op.wake_at_ms(i64::MAX / 4, 0), Some(due));
    assert_eq!(
        op.job_due_ms(),
        None,
        "the job's effect waits for its results"
    );
    assert!(op.claim(due, 1_000).is_none());
    let now = 1_700_000_010_000;
    assert!(op.destination_ready(false, now));
    assert_eq!(op.results_due_ms(), Some(now));
    let stored = serde_json::to_string(&op).unwrap();
    assert!(
        stored.contains(r#""results_retry_at_ms":1700000010000"#),
        "{stored}"
    );
    assert!(op.results_due_at(now + 5_000));
    op.projection_written(op.version(), now);
    assert_eq!(op.wake_at_ms(i64::MAX / 4, 0), Some(now + 5_000));
    op.results_settled(serde_json::json!({"total": 1}), 0, now + 6_000);
    assert_eq!(op.effect_due_after_results_ms(), Some(now + 6_000));
    assert_eq!(op.results_due_ms(), None);
    assert_eq!(op.job_due_ms(), Some(now + 6_000));
    assert!(op.claim(now + 6_000, 1_000).is_some());
}

/// When a batch's results made its job's effect due is a field later than every record
/// above: a record that never had results never stores it, whatever it went through.
#[test]
fn a_record_without_results_stores_no_time_its_results_made_its_effect_due() {
    use crate::retry::Next;
    let mut op: Operation = serde_json::from_str(CLAIMED).unwrap();
    let claim = op.effect().claim().unwrap();
    op.finish(&claim, &Next::retry("503".into(), 2_000), 1_000);
    let claim = op.claim(2_000, 1_000).unwrap();
    op.finish(&claim, &Next::Delivered, 2_100);
    assert_eq!(op.effect_due_after_results_ms(), None);
    let stored = serde_json::to_string(&op).unwrap();
    assert!(!stored.contains("results"), "{stored}");
}
