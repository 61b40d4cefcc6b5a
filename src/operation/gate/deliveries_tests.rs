//! Deliveries and nudges as the gate decides them (`mod.rs`), step by step.

use serde_json::{json, Map};

use crate::operation::gate::fixtures::*;
use crate::operation::gate::protocol::{EffectReport, GateCommand, GateReply};
use crate::operation::gate::{step, Save};
use crate::operation::lifecycle::{DropReason, Source, Status};
use crate::operation::Operation;

#[test]
fn first_terminal_delivery_is_applied_and_its_effect_scheduled_not_run() {
    let s = step(Some(registered()), deliver(Status::Succeeded), 10);
    assert_eq!(
        s.reply,
        GateReply::Applied {
            status: Status::Succeeded,
            effect: EffectReport::Scheduled
        }
    );
    assert_eq!(s.save, Save::Durable);
    assert_eq!(whats(&s), ["applied"]);
    assert_eq!(
        s.wake_at(&LIMITS),
        Some(10),
        "the alarm runs the effect at once"
    );
}

#[test]
fn delivery_for_an_unknown_operation_creates_it_unless_registration_is_required() {
    let s = step(None, deliver(Status::Succeeded), 10);
    assert!(matches!(s.reply, GateReply::Applied { .. }));
    assert!(!s.record.unwrap().registered());
    let required = GateCommand::Deliver {
        key: "batches/a".into(),
        name: "batches/a".into(),
        event: event(Status::Succeeded, Source::Webhook),
        require_registration: true,
        hold_ms: 0,
        new_not_before_ms: 0,
    };
    let s = step(None, required, 10);
    assert_eq!(s.reply, GateReply::IgnoredUnregistered);
    assert!(s.record.is_none());
    assert_eq!(s.save, Save::Unchanged);
}

#[test]
fn duplicate_of_a_settled_operation_is_answered_from_memory() {
    let s = step(Some(settled()), deliver(Status::Succeeded), 30);
    assert_eq!(
        s.reply,
        GateReply::Dropped {
            reason: DropReason::Duplicate,
            status: Status::Succeeded,
            effect: EffectReport::Delivered
        }
    );
    assert_eq!(s.save, Save::MemoryOnly);
    assert!(s.history.is_empty());
}

#[test]
fn duplicate_while_the_effect_is_owed_is_stored_with_its_reason() {
    let first = step(Some(registered()), deliver(Status::Succeeded), 10);
    let s = step(first.record, deliver(Status::Succeeded), 11);
    assert_eq!(
        s.reply,
        GateReply::Dropped {
            reason: DropReason::Duplicate,
            status: Status::Succeeded,
            effect: EffectReport::Scheduled
        }
    );
    assert_eq!(s.save, Save::Durable);
    assert_eq!(whats(&s), ["dropped"]);
}

#[test]
fn conflicting_terminal_is_dropped_and_recorded() {
    let s = step(Some(settled()), deliver(Status::Failed), 30);
    assert!(matches!(
        s.reply,
        GateReply::Dropped {
            reason: DropReason::ConflictingTerminal,
            ..
        }
    ));
    assert_eq!(s.save, Save::Durable);
    assert_eq!(whats(&s), ["dropped"]);
}

#[test]
fn nudge_on_an_open_operation_waits_for_the_status_api() {
    let s = step(Some(registered()), nudge("failed"), 10);
    assert_eq!(
        s.reply,
        GateReply::Confirming {
            status: Status::Pending
        }
    );
    assert_eq!(whats(&s), ["nudged"]);
    assert_eq!(s.wake_at(&LIMITS), Some(10));
    assert_eq!(
        s.record.unwrap().status(),
        &Status::Pending,
        "the body decided nothing"
    );
}

#[test]
fn nudge_on_a_terminal_operation_is_a_drop_by_the_reducer() {
    let s = step(Some(settled()), nudge("succeeded"), 30);
    assert!(matches!(
        s.reply,
        GateReply::Dropped {
            reason: DropReason::Duplicate,
            ..
        }
    ));
    assert_eq!(s.save, Save::MemoryOnly);
    let s = step(Some(settled()), nudge("failed"), 30);
    assert!(matches!(
        s.reply,
        GateReply::Dropped {
            reason: DropReason::ConflictingTerminal,
            ..
        }
    ));
    assert_eq!(
        s.save,
        Save::MemoryOnly,
        "an unproven claim of another state writes nothing"
    );
    assert!(s.history.is_empty());
}

#[test]
fn a_nudge_within_the_confirmation_interval_of_the_last_question_changes_nothing() {
    let nudge_every = |interval_ms: i64| {
        let mut command = nudge("succeeded");
        if let GateCommand::Nudge {
            confirm_interval_ms,
            ..
        } = &mut command
        {
            *confirm_interval_ms = interval_ms;
        }
        command
    };
    // Gemini answered 404 at 100: the confirmation ended, and a nudge inside the
    // interval starts no other.
    let mut op = step(Some(registered()), nudge_every(60_000), 10)
        .record
        .unwrap();
    op.confirmation_asked(100);
    op.confirmation_gone();
    let version = op.version();
    let inside = step(Some(op), nudge_every(60_000), 60_099);
    assert!(matches!(inside.reply, GateReply::Confirming { .. }));
    assert_eq!(inside.save, Save::MemoryOnly);
    assert!(inside.history.is_empty());
    let op = inside.record.unwrap();
    assert_eq!(op.version(), version);
    assert!(op.confirmation().is_none(), "nothing is asked");
    // Once the interval has passed, a nudge asks again, at once.
    let after = step(Some(op), nudge_every(60_000), 60_100);
    assert_eq!(after.save, Save::Durable);
    assert_eq!(after.record.unwrap().confirmation().unwrap().due_ms, 60_100);
}

#[test]
fn a_nudge_creates_nothing_for_a_name_the_gate_does_not_hold() {
    // Never seen, purged at retention, or under REQUIRE_REGISTRATION: the same answer,
    // and nothing stored, whatever the token claimed.
    let s = step(None, nudge("succeeded"), 10);
    assert_eq!(s.reply, GateReply::Unregistered);
    assert!(s.record.is_none());
    assert_eq!(s.save, Save::Unchanged);
    assert!(s.history.is_empty() && s.logs.is_empty());
    // Held open (registered, or opened by a signed delivery): the nudge hastens it.
    let s = step(Some(registered()), nudge("succeeded"), 10);
    assert!(matches!(s.reply, GateReply::Confirming { .. }));
    assert_eq!(s.save, Save::Durable);
    let opened = step(None, deliver(Status::Running), 5).record;
    let s = step(opened, nudge("succeeded"), 10);
    assert!(matches!(s.reply, GateReply::Confirming { .. }));
}

#[test]
fn a_poll_creates_nothing_for_a_name_the_gate_does_not_hold() {
    // A status answer may carry no time (a video's): a gate purged at retention is not
    // rebuilt from it, however old it is.
    let poll = GateCommand::Deliver {
        key: "operations/v".into(),
        name: "models/veo/operations/v".into(),
        event: event(Status::Succeeded, Source::Reconcile),
        require_registration: false,
        hold_ms: 0,
        new_not_before_ms: 0,
    };
    let s = step(None, poll.clone(), 10);
    assert_eq!(s.reply, GateReply::Unregistered);
    assert!(s.record.is_none());
    assert_eq!(s.save, Save::Unchanged);
    // A record it can apply to is settled by it as before.
    let held = Operation::register("operations/v", "models/veo/operations/v", None, 0);
    assert!(matches!(
        step(Some(held), poll, 10).reply,
        GateReply::Applied { .. }
    ));
}

#[test]
fn the_same_nudge_again_while_its_confirmation_waits_writes_nothing() {
    let first = step(Some(registered()), nudge("succeeded"), 10);
    let op = first.record.unwrap();
    let version = op.version();
    let again = step(Some(op), nudge("succeeded"), 11);
    assert!(matches!(again.reply, GateReply::Confirming { .. }));
    assert_eq!(again.save, Save::MemoryOnly, "only the count, in memory");
    assert!(again.history.is_empty());
    let op = again.record.unwrap();
    assert_eq!(op.version(), version, "no version: no ledger projection");
    let mut meta = Map::new();
    meta.insert("user_metadata".into(), json!({"a": 1}));
    let mut with_meta = nudge("succeeded");
    if let GateCommand::Nudge { metadata, .. } = &mut with_meta {
        *metadata = meta;
    }
    let gained = step(Some(op), with_meta, 12);
    assert_eq!(gained.save, Save::Durable, "new metadata is a change");
    assert!(gained.record.unwrap().version() > version);
}

/// An unregistered completion whose event happened at `event_ms`, to a gate that
/// refuses new records for events before `not_before`.
fn deliver_at(event_ms: i64, not_before: i64) -> GateCommand {
    let mut command = deliver_unregistered(0);
    if let GateCommand::Deliver { event, .. } = &mut command {
        event.update_time_ms = event_ms;
    }
    command.limit_new_records(not_before);
    command
}

#[test]
fn an_event_older_than_retention_creates_no_record() {
    // Retention ended for an operation closed before `not_before`: its gate is empty and
    // an event of it, however signed, is a replay.
    let s = step(None, deliver_at(999, 1_000), 5_000);
    assert_eq!(s.reply, GateReply::IgnoredTooOld);
    assert!(s.record.is_none());
    assert_eq!(s.save, Save::Unchanged);
    assert!(s.history.is_empty());
    // Newer than the limit, or with no time of its own (the signature's window decides):
    // a record is created and the effect runs.
    for event_ms in [1_000, 4_000, 0] {
        let s = step(None, deliver_at(event_ms, 1_000), 5_000);
        assert!(matches!(s.reply, GateReply::Applied { .. }), "{event_ms}");
        assert_eq!(s.save, Save::Durable);
    }
    // A gate that has the record applies it as always (terminal absorbs).
    let kept = step(None, deliver_at(4_000, 1_000), 5_000).record;
    let s = step(kept, deliver_at(999, 1_000), 6_000);
    assert!(matches!(s.reply, GateReply::Dropped { .. }));
}

#[test]
fn the_limit_on_new_records_is_never_on_the_wire() {
    let command = deliver_at(999, 1_000);
    let wire = serde_json::to_string(&command).unwrap();
    assert!(!wire.contains("not_before"), "{wire}");
    let back: GateCommand = serde_json::from_str(&wire).unwrap();
    let s = step(None, back, 5_000);
    assert!(
        matches!(s.reply, GateReply::Applied { .. }),
        "only the gate sets it"
    );
}
