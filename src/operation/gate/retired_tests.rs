//! Host tests of what a gate an earlier version retired decides, whoever asks: the tombstone it
//! kept ([`Operation::retire`]; retention's end now keeps only the name, in its retired names'
//! shard) runs nothing again for a registration, a poll, a nudge, a signed delivery or an
//! operator, for a batch (whose answers carry a time) and a video (whose answers carry none).

use serde_json::{json, Map};

use crate::operation::gate::alarm::{begin_attempt, retire_if_over};
use crate::operation::gate::fixtures::*;
use crate::operation::gate::protocol::{GateCommand, GateReply};
use crate::operation::gate::{step, Save};
use crate::operation::lifecycle::{DropReason, Source, Status};
use crate::operation::{OpEvent, Operation};

const KEYS: [(&str, &str); 2] = [
    ("batches/a", "batches/a"),
    ("operations/v", "models/veo-3/operations/v"),
];

/// A settled operation (effect done at 20) past its retention: the tombstone an earlier
/// version's alarm left.
fn tombstone(key: &str, name: &str) -> Operation {
    let mut op = settled();
    // The fixture's key is a batch's; a video's gate holds its own name.
    if key != "batches/a" {
        op = Operation::register(key, name, Some("publish".into()), 0);
        let s = step(Some(op), deliver_as(key, name, Status::Succeeded, 0), 10);
        let (claim, s) = begin_attempt(s.record.unwrap(), 10, &LIMITS).unwrap();
        op = crate::operation::gate::alarm::attempt_finished(
            s.record.unwrap(),
            &crate::operation::gate::alarm::Attempt {
                claim,
                outcome: crate::operation::AttemptOutcome::Delivered,
                started_ms: 10,
                finished_ms: 20,
                asked_wait_ms: None,
                target: Default::default(),
            },
            &LIMITS,
            0.5,
        )
        .record
        .unwrap();
    }
    let over = op.retires_at_ms(LIMITS.retention_ms).unwrap();
    let retired = retire_if_over(&op, over, &LIMITS).expect("retention over");
    assert!(
        retired.purge && retired.record.is_none(),
        "now everything is deleted"
    );
    op.retire(over);
    op
}

fn deliver_as(key: &str, name: &str, status: Status, update_time_ms: i64) -> GateCommand {
    deliver_from(key, name, status, update_time_ms, Source::Webhook)
}

fn deliver_from(
    key: &str,
    name: &str,
    status: Status,
    update_time_ms: i64,
    source: Source,
) -> GateCommand {
    GateCommand::Deliver {
        key: key.into(),
        name: name.into(),
        event: OpEvent {
            status,
            update_time_ms,
            source,
            details: Map::new(),
            delivery_id: Some("msg_late".into()),
        },
        require_registration: false,
        hold_ms: 0,
        new_not_before_ms: 0,
    }
}

fn register(key: &str, name: &str, kind: &str, tenant: &str) -> GateCommand {
    GateCommand::Register {
        key: key.into(),
        name: name.into(),
        kind: Some(kind.into()),
        user_metadata: Some(json!({ "tenant": tenant })),
        results: None,
        by: None,
    }
}

const LATE: i64 = 10 * LIMITS.retention_ms;

#[test]
fn a_tombstone_is_small_and_never_wakes() {
    for (key, name) in KEYS {
        let op = tombstone(key, name);
        assert!(op.is_settled() && !op.effect_owed());
        assert_eq!(op.wake_at_ms(LIMITS.retention_ms, 0), None);
        assert_eq!(op.expires_at_ms(LIMITS.retention_ms), None, "kept for good");
        let bytes = serde_json::to_string(&op).unwrap().len();
        assert!(bytes < 600, "{key}: {bytes} bytes");
    }
}

#[test]
fn a_registration_of_a_retired_name_is_refused_and_changes_nothing() {
    for (key, name) in KEYS {
        let op = tombstone(key, name);
        let s = step(
            Some(op.clone()),
            register(key, name, "billing", "attacker"),
            LATE,
        );
        match &s.reply {
            GateReply::Retired { operation } => {
                assert_eq!(operation["status"], "succeeded");
                assert!(operation["retired_at"].is_string());
            }
            other => panic!("{key}: {other:?}"),
        }
        assert_eq!(s.save, Save::Unchanged);
        assert_eq!(s.record, Some(op), "{key}: nothing changed");
        // The same registration as the first one: refused all the same.
        let s = step(s.record, register(key, name, "publish", "ours"), LATE);
        assert!(matches!(s.reply, GateReply::Retired { .. }), "{key}");
    }
}

#[test]
fn a_signed_delivery_to_a_tombstone_runs_nothing_with_or_without_a_time() {
    for (key, name) in KEYS {
        for (status, time) in [
            (Status::Succeeded, 0),
            (Status::Succeeded, LATE),
            (Status::Failed, 0),
        ] {
            let s = step(
                Some(tombstone(key, name)),
                deliver_as(key, name, status.clone(), time),
                LATE,
            );
            assert!(
                matches!(s.reply, GateReply::Dropped { .. }),
                "{key} {status:?}: {:?}",
                s.reply
            );
            let op = s.record.unwrap();
            assert!(!op.effect_owed(), "{key} {status:?}: no effect owed");
            let version = tombstone(key, name).version();
            assert_eq!(
                op.version(),
                version,
                "{key} {status:?}: never projected again"
            );
            assert!(
                begin_attempt(op, LATE, &LIMITS).is_none(),
                "{key}: nothing to claim"
            );
        }
        let s = step(
            Some(tombstone(key, name)),
            deliver_as(key, name, Status::Succeeded, 0),
            LATE,
        );
        assert_eq!(
            s.save,
            Save::MemoryOnly,
            "{key}: a duplicate writes nothing"
        );
    }
}

#[test]
fn a_poll_of_a_tombstone_has_its_index_entry_deleted_and_changes_nothing() {
    for (key, name) in KEYS {
        let poll = deliver_from(key, name, Status::Succeeded, 0, Source::Reconcile);
        let s = step(Some(tombstone(key, name)), poll, LATE);
        assert_eq!(
            s.reply,
            GateReply::Unregistered,
            "{key}: the pass deletes the entry"
        );
        assert!(s.record.is_none() && s.save == Save::Unchanged, "{key}");
    }
}

#[test]
fn a_nudge_to_a_tombstone_asks_nothing_and_runs_nothing() {
    for (key, name) in KEYS {
        let nudge = GateCommand::Nudge {
            key: key.into(),
            name: name.into(),
            claimed: "succeeded".into(),
            metadata: Map::new(),
            delivery_id: "jwt_late".into(),
            confirm_interval_ms: 60_000,
        };
        let s = step(Some(tombstone(key, name)), nudge, LATE);
        assert_eq!(
            s.reply.clone(),
            GateReply::Dropped {
                reason: DropReason::Duplicate,
                status: Status::Succeeded,
                effect: crate::operation::gate::protocol::EffectReport::Delivered,
            },
            "{key}"
        );
        let op = s.record.unwrap();
        assert!(op.confirmation().is_none(), "{key}: no status call asked");
        assert!(!op.effect_owed(), "{key}");
    }
}

#[test]
fn an_operator_cannot_send_a_tombstones_effect_again() {
    for (key, name) in KEYS {
        for command in [
            GateCommand::Redeliver {
                reason: "again".into(),
                sent_before_ms: None,
                by: None,
            },
            GateCommand::RetryNow {
                reason: "again".into(),
                by: None,
            },
        ] {
            let s = step(Some(tombstone(key, name)), command, LATE);
            assert!(
                matches!(s.reply, GateReply::Refused { .. }),
                "{key}: {:?}",
                s.reply
            );
            assert!(!s.record.unwrap().effect_owed());
        }
        let forget = GateCommand::Forget {
            reason: "stop".into(),
            by: None,
        };
        let s = step(Some(tombstone(key, name)), forget, LATE);
        assert_eq!(s.reply, GateReply::Forgotten { changed: false }, "{key}");
        assert_eq!(
            s.save,
            Save::Unchanged,
            "{key}: the tombstone stays as it is"
        );
    }
}

/// Retirement ends the results as it ends the job: a tombstone an earlier version left while
/// an operator's retry of parked results ran kept the results' due time, and never wakes for
/// it (a late signed delivery and an operator's retry of its results included); the
/// tombstone this version's tests build drops it.
#[test]
fn a_tombstone_never_wakes_for_its_results() {
    let mut stored = serde_json::to_value(tombstone("batches/a", "batches/a")).unwrap();
    stored["results"] = json!("each");
    stored["results_counts"] = json!({"total": 2, "parked": 1});
    stored["results_retry_at_ms"] = json!(LATE / 2);
    let op: Operation = serde_json::from_value(stored).unwrap();
    // (A late delivery's count still wakes the gate to hand it over; nothing else does.)
    let quiet = |op: &Operation| {
        assert_eq!(op.results_due_ms(), None);
        let counted = op.pending_stats().first().map(|e| e.at_ms);
        assert_eq!(op.wake_at_ms(LIMITS.retention_ms, 0), counted, "{op:?}");
    };
    quiet(&op);
    let late = step(
        Some(op.clone()),
        deliver_as("batches/a", "batches/a", Status::Succeeded, LATE),
        LATE,
    );
    quiet(late.record.as_ref().unwrap());
    let taken = crate::operation::gate::ResultsTaken {
        taken: 1,
        file_reread: false,
        parked_left: 0,
        hurried: 0,
    };
    let retried = crate::operation::gate::results_retried::<()>(op, taken, "r".into(), None, LATE);
    quiet(retried.record.as_ref().unwrap());
    // Retiring a record whose results run (the tombstone's constructor) clears their due time.
    let mut running = settled();
    running.results_retried(30);
    assert_eq!(running.results_due_ms(), Some(30));
    running.retire(40);
    let text = serde_json::to_string(&running).unwrap();
    assert!(!text.contains("results_retry_at_ms"), "{text}");
    quiet(&running);
}
