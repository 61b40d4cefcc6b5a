//! The record's transitions, one behaviour per test.

use super::confirmation::MAX_CONFIRM_ATTEMPTS;
use super::ledger_mark::PROJECTION_RETRY_MAX_MS;
use super::*;
use crate::operation::alert::AlertKind;
use crate::operation::lifecycle::{Source, Status, Verdict};
use crate::retry::Next;
use crate::telemetry::counters::{AskedBy, Counter, StatusCallAnswer};
use serde_json::{json, Map};

fn event(status: Status, t: i64) -> OpEvent {
    OpEvent {
        status,
        update_time_ms: t,
        source: Source::Webhook,
        details: Map::new(),
        delivery_id: None,
    }
}

fn settled() -> Operation {
    let mut op = Operation::register("batches/a", "batches/a", Some("k".into()), 1_000);
    assert_eq!(
        op.apply(&event(Status::Succeeded, 0), 2_000),
        Verdict::Apply
    );
    op
}

#[test]
fn transitions_that_change_nothing_keep_the_version() {
    let mut op = settled();
    let version = op.version;
    op.alert_delivered("none queued");
    op.alert_failed("none queued", 5, 5);
    op.confirmation_failed(5, 5);
    op.confirmation_gone();
    assert!(!op.request_confirmation(5, Map::new(), None, 0), "terminal");
    assert_eq!(op.fill_kind(None, 5), KindFill::Unchanged);
    assert_eq!(op.fill_kind(Some("k"), 5), KindFill::Unchanged);
    assert_eq!(op.version, version);
    let mut waiting = Operation::register("batches/w", "batches/w", None, 0);
    assert!(waiting.request_confirmation(1, Map::new(), None, 0));
    let version = waiting.version;
    assert!(waiting.request_confirmation(2, Map::new(), None, 0));
    assert_eq!(waiting.version, version, "the same nudge again");
    assert!(waiting.forget(3, "gone"));
    let version = waiting.version;
    assert!(!waiting.forget(4, "again"));
    assert!(
        !waiting.request_confirmation(5, Map::new(), None, 0),
        "forgotten"
    );
    assert!(!waiting.raise_alert(AlertKind::Stuck, 1, 5), "forgotten");
    assert_eq!(waiting.version, version);
}

#[test]
fn settled_means_terminal_with_nothing_owed() {
    let pending = Operation::register("batches/a", "batches/a", None, 0);
    assert!(!pending.is_settled(), "not terminal");
    let mut op = settled();
    assert!(!op.is_settled(), "terminal, effect owed");
    let c = op.claim(2_000, 600_000).unwrap();
    assert!(!op.is_settled(), "terminal, effect in flight");
    op.finish(&c, &Next::Delivered, 2_500);
    assert!(op.is_settled(), "terminal, effect done");
    op.redeliver(3_000, "again").unwrap();
    assert!(
        !op.is_settled(),
        "an operator's redelivery owes the effect again"
    );
    let mut parked = settled();
    let c = parked.claim(2_000, 600_000).unwrap();
    parked.finish(&c, &Next::Park("410".into()), 2_500);
    assert!(parked.is_settled(), "terminal, effect parked");
    let mut forgotten = settled();
    forgotten.forget(3_000, "by hand");
    assert!(forgotten.is_settled(), "terminal, given up by an operator");
}

#[test]
fn terminal_event_settles_and_makes_the_effect_due() {
    let op = settled();
    assert_eq!(op.settled_at_ms, Some(2_000));
    assert_eq!(op.settled_by, Some(Source::Webhook));
    assert!(op.effect_owed());
    assert_eq!(op.effect.next_attempt_ms, 2_000);
}

#[test]
fn dropped_event_changes_nothing() {
    let mut op = settled();
    let before = op.clone();
    let v = op.apply(&event(Status::Running, 99), 3_000);
    assert_ne!(v, Verdict::Apply);
    assert_eq!(op, before);
}

#[test]
fn only_one_live_claim_at_a_time() {
    let mut op = settled();
    let first = op.claim(2_000, 600_000).unwrap();
    assert!(op.claim(2_001, 600_000).is_none());
    assert_eq!(first.token, 1);
}

#[test]
fn lapsed_claim_can_be_taken_over_with_a_higher_token() {
    let mut op = settled();
    let first = op.claim(2_000, 1_000).unwrap();
    let second = op.claim(3_000, 1_000).unwrap();
    assert!(second.token > first.token);
    // The first holder's late refusal is fenced off and changes nothing (its late 2xx:
    // `a_lapsed_claims_2xx_for_the_current_generation_marks_it_done`).
    let before = op.clone();
    assert_eq!(
        op.finish(&first, &Next::Park("400".into()), 3_100),
        Finished::Fenced
    );
    assert_eq!(op, before);
    assert_eq!(op.finish(&second, &Next::Delivered, 3_200), Finished::Done);
    assert!(op.effect.done);
}

#[test]
fn a_lapsed_claims_2xx_for_the_current_generation_marks_it_done() {
    let mut op = settled();
    let first = op.claim(2_000, 1_000).unwrap();
    let second = op.claim(3_000, 1_000).unwrap();
    assert_eq!(
        op.finish(&first, &Next::Delivered, 3_100),
        Finished::LateDone
    );
    assert!(op.effect.done);
    assert_eq!(op.effect.done_at_ms, Some(3_100));
    assert!(!op.effect_owed(), "the next claim sends nothing again");
    assert!(op.claim(5_000, 1_000).is_none());
    // The newer claim of the same generation (same webhook-id) changes nothing after it,
    // whatever it got.
    let before = op.clone();
    assert_eq!(
        op.finish(&second, &Next::Park("400".into()), 3_200),
        Finished::Fenced
    );
    assert_eq!(op, before);
}

#[test]
fn a_lapsed_claims_2xx_for_an_older_generation_never_marks_a_redelivery_done() {
    let mut op = settled();
    let old = op.claim(2_000, 1_000).unwrap();
    let newer = op.claim(3_000, 1_000).unwrap();
    op.finish(&newer, &Next::Delivered, 3_100);
    assert_eq!(op.redeliver(4_000, "again"), Ok(2));
    let before = op.clone();
    assert_eq!(
        op.finish(&old, &Next::Delivered, 4_100),
        Finished::Fenced,
        "generation 1's answer says nothing about generation 2"
    );
    assert_eq!(op, before);
    assert!(op.effect_owed());
    // A claim stored before claims kept their generation (0) is never taken as current.
    let legacy = Claim {
        generation: 0,
        ..op.claim(4_200, 1_000).unwrap()
    };
    op.claim(6_000, 1_000).unwrap();
    assert_eq!(
        op.finish(&legacy, &Next::Delivered, 6_100),
        Finished::Fenced
    );
}

#[test]
fn failure_never_marks_done_and_schedules_a_retry() {
    let mut op = settled();
    let c = op.claim(2_000, 600_000).unwrap();
    assert_eq!(
        op.finish(&c, &Next::retry("503".into(), 2_500 + 30_000), 2_500),
        Finished::RetryAt(32_500)
    );
    assert!(!op.effect.done);
    assert!(op.effect_owed());
    assert!(op.claim(10_000, 600_000).is_none(), "not due yet");
    assert!(op.claim(32_500, 600_000).is_some());
}

#[test]
fn refusal_parks_and_stops_retries() {
    let mut op = settled();
    let c = op.claim(2_000, 600_000).unwrap();
    assert_eq!(
        op.finish(&c, &Next::Park("400: no".into()), 2_500),
        Finished::Parked
    );
    assert!(!op.effect.done);
    assert!(!op.effect_owed());
    assert!(op.is_closed());
    assert!(op.claim(9_999_999, 600_000).is_none());
}

#[test]
fn non_terminal_operation_has_no_effect_to_claim() {
    let mut op = Operation::register("batches/a", "batches/a", None, 0);
    assert!(op.claim(0, 1).is_none());
    op.apply(&event(Status::Running, 5), 1);
    assert!(op.claim(1, 1).is_none());
}

#[test]
fn done_effect_is_never_claimed_again() {
    let mut op = settled();
    let c = op.claim(2_000, 600_000).unwrap();
    op.finish(&c, &Next::Delivered, 2_100);
    assert!(op.claim(99_999_999, 600_000).is_none());
    assert_eq!(op.effect.attempts, 1);
}

#[test]
fn redelivery_of_a_done_effect_starts_a_new_generation() {
    let mut op = settled();
    let c = op.claim(2_000, 600_000).unwrap();
    op.finish(&c, &Next::Delivered, 2_100);
    assert_eq!(op.redeliver(3_000, "downstream lost it"), Ok(2));
    assert!(op.effect_owed());
    assert_eq!(op.notes.redeliveries[0].reason, "downstream lost it");
    let c2 = op.claim(3_000, 600_000).unwrap();
    assert!(c2.token > c.token);
    assert_eq!(op.finish(&c2, &Next::Delivered, 3_100), Finished::Done);
    assert_eq!(op.effect.generation, 2);
}

#[test]
fn an_effect_is_sent_since_its_acceptance_or_its_newest_redelivery() {
    let mut op = settled();
    assert!(!op.sent_since(0), "never accepted nor redelivered");
    let c = op.claim(2_000, 600_000).unwrap();
    op.finish(&c, &Next::Delivered, 2_100);
    assert!(op.sent_since(2_100), "accepted at the cut-off");
    assert!(!op.sent_since(2_101));
    op.redeliver(3_000, "lost").unwrap();
    assert!(op.sent_since(3_000), "redelivered, not yet accepted");
    assert!(!op.sent_since(3_001));
    let c = op.claim(3_000, 600_000).unwrap();
    op.finish(&c, &Next::Delivered, 3_200);
    assert!(op.sent_since(3_200) && !op.sent_since(3_201));
}

#[test]
fn an_effect_not_done_never_gets_a_new_generation() {
    let mut op = settled();
    let c = op.claim(2_000, 600_000).unwrap();
    op.finish(&c, &Next::retry("timeout".into(), 7_000 + 30_000), 7_000);
    assert_eq!(op.redeliver(8_000, "x"), Err(OperatorRefusal::NotDone));
    assert_eq!(op.effect.generation, 1);
}

#[test]
fn retry_now_keeps_the_generation_unparks_and_is_due_at_once() {
    let mut op = settled();
    let c = op.claim(2_000, 600_000).unwrap();
    op.finish(&c, &Next::Park("400".into()), 2_100);
    op.mark_alert(AlertKind::EffectFailing);
    assert_eq!(op.retry_now(3_000), Ok(()));
    assert!(op.effect_owed());
    assert!(
        op.alerts.is_empty(),
        "it may alert again if it keeps failing"
    );
    assert_eq!(op.effect.generation, 1, "the same webhook-id");
    assert!(
        op.claim(3_000, 600_000).is_some(),
        "due now, not after a backoff"
    );
}

#[test]
fn retry_now_is_refused_while_an_attempt_is_in_flight_or_once_done() {
    let mut op = settled();
    let c = op.claim(2_000, 10_000).unwrap();
    assert_eq!(op.retry_now(5_000), Err(OperatorRefusal::InFlight));
    assert_eq!(
        op.retry_now(12_000),
        Ok(()),
        "a lapsed claim is not in flight"
    );
    let mut done = settled();
    let c2 = done.claim(2_000, 10_000).unwrap();
    done.finish(&c2, &Next::Delivered, 2_100);
    assert_eq!(done.retry_now(3_000), Err(OperatorRefusal::AlreadyDone));
    // The retried claim's late failure is fenced off by the token, as ever (its late 2xx
    // would mark this generation done: `finish`).
    let again = op.claim(12_000, 10_000).unwrap();
    let late = Next::retry("503".into(), 20_000);
    assert_eq!(op.finish(&c, &late, 12_500), Finished::Fenced);
    assert_eq!(op.finish(&again, &Next::Delivered, 12_600), Finished::Done);
}

#[test]
fn a_late_registration_fills_in_the_kind_but_never_replaces_it() {
    let mut op = Operation::unregistered("batches/a", "batches/a", 0);
    assert_eq!(op.fill_kind(None, 0), KindFill::Unchanged);
    assert_eq!(op.fill_kind(Some("billing"), 0), KindFill::Filled);
    assert_eq!(op.kind.as_deref(), Some("billing"));
    assert!(op.registered);
    assert_eq!(op.fill_kind(Some("billing"), 0), KindFill::Unchanged);
    assert_eq!(op.fill_kind(Some("publish"), 0), KindFill::Conflict);
    assert_eq!(op.kind.as_deref(), Some("billing"));
}

#[test]
fn redelivery_needs_a_terminal_state() {
    let mut op = Operation::register("batches/a", "batches/a", None, 0);
    assert_eq!(op.redeliver(1, "x"), Err(OperatorRefusal::NotTerminal));
}

#[test]
fn forgotten_operation_owes_nothing_and_expires() {
    let mut op = settled();
    assert!(op.forget(5_000, "duplicate job"));
    assert!(!op.forget(6_000, "again"));
    assert!(!op.effect_owed());
    assert!(op.is_closed());
    assert_eq!(op.expires_at_ms(1_000), Some(6_000));
    assert_eq!(op.redeliver(7_000, "x"), Err(OperatorRefusal::Forgotten));
}

#[test]
fn stuck_alert_names_the_operation() {
    let op = Operation::register(
        "batches/a",
        "projects/p/batches/a",
        Some("nightly".into()),
        0,
    );
    let body = op.alert_body(AlertKind::Stuck, "alert_x", 21_600);
    assert_eq!(body["alert_id"], "alert_x");
    assert_eq!(body["alert"], "stuck");
    assert_eq!(body["key"], "batches/a");
    assert_eq!(body["name"], "projects/p/batches/a");
    assert_eq!(body["kind"], "nightly");
    assert_eq!(body["age_seconds"], 21_600);
    let text = body["text"].as_str().unwrap();
    assert!(
        text.contains("projects/p/batches/a") && text.contains("6h 0m") && text.contains("pending"),
        "{text}"
    );
}

#[test]
fn a_stuck_alert_is_not_raised_for_a_terminal_operation_and_one_sent_late_says_it_settled() {
    let mut op = Operation::register("batches/a", "batches/a", None, 0);
    assert!(op.raise_alert(AlertKind::Stuck, 21_600, 1_000));
    assert_eq!(
        op.apply(&event(Status::Succeeded, 0), 2_000),
        Verdict::Apply
    );
    let body = op.alert_body(AlertKind::Stuck, "alert_x", 21_600);
    let text = body["text"].as_str().unwrap();
    assert!(
        text.contains("it has one now: succeeded") && !text.contains("still"),
        "{text}"
    );
    assert!(!settled().raise_alert(AlertKind::Stuck, 21_600, 3_000));
}

#[test]
fn alerts_are_marked_once() {
    let mut op = Operation::register("batches/a", "batches/a", None, 0);
    assert!(op.mark_alert(AlertKind::Stuck));
    assert!(!op.mark_alert(AlertKind::Stuck));
    assert!(op.mark_alert(AlertKind::EffectFailing), "another kind");
}

#[test]
fn wake_time_follows_what_is_pending() {
    let retention = 1_000_000;
    let mut op = settled();
    op.ledger.version = op.version;
    assert_eq!(op.wake_at_ms(retention, 0), Some(2_000), "effect due");
    let c = op.claim(2_000, 600_000).unwrap();
    op.count(Counter::Deliveries, 2_000);
    assert_eq!(
        op.wake_at_ms(retention, 0),
        Some(602_000),
        "claim expiry: projection and flush wait for the commit"
    );
    op.finish(&c, &Next::Delivered, 2_500);
    assert_eq!(
        op.wake_at_ms(retention, 0),
        Some(1_000),
        "committed: projection due"
    );
    op.drop_flushed_stats(op.outbox.seq);
    op.ledger.version = op.version;
    let moment = op.wake_at_ms(retention, 0).unwrap();
    assert!(
        (1_002_500..1_002_500 + retention.min(86_400_000)).contains(&moment),
        "forget after retention, at its bucket's moment: {moment}"
    );
    assert_eq!(op.retires_at_ms(retention), Some(moment));
    op.ledger.version = op.version - 1;
    op.ledger.at_ms = 2_400;
    assert_eq!(
        op.wake_at_ms(retention, 0),
        Some(3_400),
        "deferred projection"
    );
}

#[test]
fn counted_events_wake_the_gate_until_flushed() {
    let mut op = Operation::register("batches/a", "batches/a", None, 0);
    op.ledger.version = op.version;
    assert_eq!(op.wake_at_ms(1, 10_000), None);
    op.count(Counter::Deliveries, 50);
    op.count(Counter::Duplicates, 60);
    assert_eq!(
        op.wake_at_ms(1, 10_000),
        Some(10_050),
        "the oldest event plus the delay"
    );
    assert_eq!(op.wake_at_ms(1, 0), Some(50));
    op.drop_flushed_stats(1);
    assert_eq!(op.outbox.pending.len(), 1);
    assert_eq!(op.wake_at_ms(1, 0), Some(60));
    op.drop_flushed_stats(2);
    assert_eq!(op.wake_at_ms(1, 0), None);
}

#[test]
fn a_record_created_again_numbers_its_events_past_the_first_one_s() {
    let day = 86_400_000;
    let mut first = Operation::register("batches/a", "batches/a", None, 1_800_000_000_000);
    for i in 0..1_000 {
        first.count(Counter::Dropped("stale"), 1_800_000_000_000 + i);
    }
    let last = first.seal_stats().unwrap();
    assert_eq!(last, 1_800_000_001_000, "numbered from the creation time");
    // Its storage is deleted at the end of retention (days later); a stats shard may still
    // keep its mark then, so the new record's first event must be past it.
    let mut again = Operation::unregistered("batches/a", "batches/a", 1_800_000_000_000 + 3 * day);
    again.count(Counter::Deliveries, 1_800_000_000_000 + 3 * day);
    assert!(again.outbox.pending[0].seq > last);
    let stored: Operation = serde_json::from_str(&serde_json::to_string(&again).unwrap()).unwrap();
    assert_eq!(stored.outbox, again.outbox, "stored as it is");
}

#[test]
fn a_record_read_by_a_new_instance_merges_nothing_into_what_may_have_been_sent() {
    let mut op = Operation::register("batches/a", "batches/a", None, 0);
    op.count(Counter::Deliveries, 100);
    // The last instance sealed event 1 in memory and stopped during the flush: storage
    // still shows it unsealed.
    let stored: Operation = serde_json::from_str(&serde_json::to_string(&op).unwrap()).unwrap();
    assert_eq!(stored.outbox.sealed_seq, 0);
    let mut loaded = stored.as_loaded();
    loaded.count(Counter::Deliveries, 200);
    assert_eq!(loaded.outbox.pending.len(), 2, "a new event, not a merge");
    assert_eq!(loaded.outbox.pending[0].count, 1);
}

#[test]
fn counts_merge_until_sealed_and_never_into_a_sealed_event() {
    let mut op = Operation::register("batches/a", "batches/a", None, 0);
    for i in 0..1_000 {
        op.count(Counter::Duplicates, 100 + i);
    }
    op.count(Counter::Deliveries, 2_000);
    assert_eq!(op.outbox.pending.len(), 2, "a burst stays two events");
    assert_eq!(op.outbox.pending[0].count, 1_000);
    let sent = op.seal_stats().unwrap();
    assert_eq!(sent, 2);
    // Counted while the flush is in flight: a new event, not a change to a sent one.
    op.count(Counter::Duplicates, 3_000);
    assert_eq!(op.outbox.pending.len(), 3);
    assert_eq!(
        op.outbox.pending[0].count, 1_000,
        "sealed events are never changed"
    );
    assert_eq!(op.outbox.pending[2].seq, 3);
    op.drop_flushed_stats(sent);
    assert_eq!(op.outbox.pending.len(), 1);
    assert_eq!(op.outbox.pending[0].count, 1);
    // A new hour starts a new event, so the shard's hourly buckets stay right.
    op.count(Counter::Duplicates, 3_600_000);
    assert_eq!(op.outbox.pending.len(), 2);
    // Drops stay one event each: the shard lists every one as a recent drop.
    op.count(Counter::Dropped("regress_from_terminal"), 3_600_001);
    op.count(Counter::Dropped("regress_from_terminal"), 3_600_002);
    assert_eq!(op.outbox.pending.len(), 4);
}

#[test]
fn retention_waits_for_the_index_entry_to_be_deleted() {
    use crate::operation::ledger::IndexWrite;
    let mut op = settled();
    let c = op.claim(2_000, 600_000).unwrap();
    op.finish(&c, &Next::Delivered, 3_000);
    op.index_written(IndexWrite::Put, true);
    assert!(op.is_closed());
    assert_eq!(op.expires_at_ms(1_000), None, "index entry may exist");
    op.index_written(IndexWrite::Delete, false);
    assert_eq!(op.expires_at_ms(1_000), None, "failed delete keeps it");
    op.index_written(IndexWrite::None, true);
    assert!(op.ledger.indexed, "no write changes nothing");
    op.index_written(IndexWrite::Delete, true);
    assert!(op.expires_at_ms(1_000).is_some());
}

#[test]
fn reindex_forces_a_projection_that_may_delete() {
    let mut op = settled();
    op.ledger.version = op.version;
    assert!(op.reindex());
    assert!(op.ledger.indexed);
    assert!(op.ledger.version < op.version, "a projection is pending");
    op.retire(99_000);
    assert!(!op.reindex(), "a tombstone never projects");
}

#[test]
fn open_operation_is_never_forgotten() {
    let op = Operation::register("batches/a", "batches/a", None, 0);
    assert_eq!(op.expires_at_ms(1), None);
}

fn status_event(status: Status, t: i64, output: &str) -> OpEvent {
    let mut details = Map::new();
    details.insert("output_file_uri".into(), json!(output));
    OpEvent {
        details,
        ..event(status, t)
    }
}

#[test]
fn nudge_on_open_operation_waits_for_confirmation() {
    let mut op = Operation::register("batches/a", "batches/a", None, 0);
    let mut meta = Map::new();
    meta.insert("user_metadata".into(), json!({"job": 1}));
    assert!(op.request_confirmation(100, meta, Some("jwt_x".into()), 0));
    assert!(op.confirmation_due(100));
    assert_eq!(
        op.status,
        Status::Pending,
        "the nudge itself applies nothing"
    );
    assert_eq!(op.wake_at_ms(1, 0), Some(100));
}

#[test]
fn nudge_on_terminal_operation_has_nothing_to_confirm() {
    let mut op = settled();
    assert!(!op.request_confirmation(3_000, Map::new(), None, 0));
    assert!(op.confirmation.is_none());
}

#[test]
fn replayed_nudges_keep_the_schedule_and_add_metadata() {
    let mut op = Operation::register("batches/a", "batches/a", None, 0);
    op.request_confirmation(100, Map::new(), None, 0);
    op.confirmation_failed(150, 10_000);
    let mut meta = Map::new();
    meta.insert("unverified_user_metadata".into(), json!("x"));
    assert!(op.request_confirmation(200, meta, None, 0));
    let c = op.confirmation.as_ref().unwrap();
    assert_eq!(
        c.due_ms, 10_150,
        "a replay does not buy an earlier status call"
    );
    assert_eq!(c.metadata["unverified_user_metadata"], "x");
}

#[test]
fn confirmation_applies_what_the_status_api_says_with_the_nudge_metadata_unverified() {
    let mut op = Operation::register("batches/a", "batches/a", None, 0);
    let mut meta = Map::new();
    // As an earlier version stored a token's claim: it still travels as unverified.
    meta.insert("user_metadata".into(), json!({"job": 7}));
    op.request_confirmation(100, meta, Some("jwt_x".into()), 0);
    let v = op.confirm_with(status_event(Status::Succeeded, 50, "gs://b/o"), 200, 1_000);
    assert_eq!(v, Verdict::Apply);
    assert_eq!(op.status, Status::Succeeded);
    assert_eq!(op.settled_by, Some(Source::Webhook));
    assert_eq!(op.details["unverified_user_metadata"], json!({"job": 7}));
    assert!(op.details.get("user_metadata").is_none());
    assert_eq!(op.details["output_file_uri"], "gs://b/o");
    assert!(
        op.confirmation.is_none(),
        "terminal: nothing left to confirm"
    );
    assert!(op.effect_owed());
}

#[test]
fn a_v1a_signed_bodys_metadata_is_the_jobs_own_once_the_status_api_answered() {
    use crate::operation::details::SIGNED_USER_METADATA;
    let signed = |op: &mut Operation| {
        let mut meta = Map::new();
        meta.insert(SIGNED_USER_METADATA.into(), json!({"job": "signed"}));
        op.request_confirmation(100, meta, Some("msg_1".into()), 0);
        op.confirm_with(status_event(Status::Succeeded, 50, "gs://b/o"), 200, 1_000)
    };
    let mut op = Operation::unregistered("batches/a", "batches/a", 0);
    assert_eq!(signed(&mut op), Verdict::Apply);
    assert_eq!(op.details["user_metadata"], json!({"job": "signed"}));
    assert!(op.details.get("unverified_user_metadata").is_none());
    assert!(op.details.get(SIGNED_USER_METADATA).is_none());
    // A registration's metadata still wins.
    let mut op = Operation::register("batches/a", "batches/a", None, 0);
    op.fill_user_metadata(Some(json!({"job": "registered"})));
    signed(&mut op);
    assert_eq!(op.details["user_metadata"], json!({"job": "registered"}));
}

#[test]
fn a_status_api_that_contradicts_the_nudge_wins() {
    // The body said failed; Gemini says running: running is applied, failed never is.
    let mut op = Operation::register("batches/a", "batches/a", None, 0);
    op.request_confirmation(100, Map::new(), None, 0);
    op.confirm_with(event(Status::Running, 50), 200, 1_000);
    assert_eq!(op.status, Status::Running);
    assert!(!op.effect_owed());
    assert_eq!(
        op.confirmation.as_ref().map(|c| c.due_ms),
        Some(1_200),
        "asked again: Gemini may answer a moment behind its webhook"
    );
    for i in 1..MAX_CONFIRM_ATTEMPTS {
        op.confirm_with(event(Status::Running, 50), 1_200 + i64::from(i), 1_000);
    }
    assert!(op.confirmation.is_none(), "then left to the cron");
}

#[test]
fn unknown_to_gemini_ends_the_confirmation() {
    let mut op = Operation::register("batches/a", "batches/a", None, 0);
    op.request_confirmation(100, Map::new(), None, 0);
    op.confirmation_gone();
    assert!(op.confirmation.is_none());
    assert_eq!(op.status, Status::Pending);
}

#[test]
fn alerts_stay_queued_until_the_sink_accepts_them() {
    let mut op = Operation::register("batches/a", "batches/a", None, 0);
    assert!(op.raise_alert(AlertKind::Stuck, 60, 1_000));
    op.ledger.version = u64::MAX;
    assert!(
        !op.raise_alert(AlertKind::Stuck, 61, 1_001),
        "raised once per kind"
    );
    let due = op.due_alerts(1_000);
    assert_eq!(due.len(), 1);
    let id = due[0].id.clone();
    op.alert_failed(&op.queued_id(AlertKind::Stuck), 1_000, 5_000);
    assert!(op.due_alerts(2_000).is_empty());
    assert_eq!(op.wake_at_ms(1, 0), Some(6_000), "the alarm retries it");
    let retry = op.due_alerts(6_000);
    assert_eq!(retry[0].id, id, "the same alert id on every retry");
    assert_eq!(retry[0].attempts, 1);
    op.alert_delivered(&op.queued_id(AlertKind::Stuck));
    assert!(op.pending_alerts.is_empty());
    assert_eq!(op.alerts, vec![AlertKind::Stuck]);
}

/// A resolution never goes before its trigger: queued while the trigger waits its backoff,
/// or queued before the trigger's send failed, it is due when the trigger is, after it.
#[test]
fn a_resolution_waits_for_its_trigger_still_queued() {
    let mut op = Operation::register("batches/a", "batches/a", None, 0);
    assert!(op.raise_alert(AlertKind::EffectFailing, 60, 1_000));
    op.alert_failed(&op.queued_id(AlertKind::EffectFailing), 1_000, 5_000);
    assert!(op.resolve_alert(AlertKind::EffectFailing, 2_000));
    assert!(op.due_alerts(2_000).is_empty(), "the resolution waits");
    op.ledger.version = u64::MAX;
    assert_eq!(op.wake_at_ms(1, 0), Some(6_000), "not before the trigger");
    let kinds = |due: Vec<PendingAlert>| due.into_iter().map(|a| a.kind).collect::<Vec<_>>();
    let both = vec![AlertKind::EffectFailing, AlertKind::EffectRecovered];
    assert_eq!(kinds(op.due_alerts(6_000)), both);
    // Both due, the trigger's send fails: the resolution waits again with it.
    op.alert_failed(&op.queued_id(AlertKind::EffectFailing), 6_000, 5_000);
    assert!(op.due_alerts(10_000).is_empty());
    assert_eq!(kinds(op.due_alerts(11_000)), both);
    op.alert_delivered(&op.queued_id(AlertKind::EffectFailing));
    assert_eq!(
        kinds(op.due_alerts(11_000)),
        vec![AlertKind::EffectRecovered]
    );
}

#[test]
fn retirement_keeps_a_tombstone_that_absorbs_late_deliveries() {
    let mut op = settled();
    let c = op.claim(2_000, 600_000).unwrap();
    op.finish(&c, &Next::Delivered, 2_500);
    op.ledger.version = op.version;
    assert_eq!(op.expires_at_ms(10_000), Some(12_500));
    op.retire(12_500);
    assert_eq!(op.expires_at_ms(10_000), None, "a tombstone never expires");
    assert_eq!(
        op.wake_at_ms(10_000, 0),
        None,
        "and never wakes, nor projects"
    );
    // A late replay of the same completion, or a different one: nothing is owed.
    assert_eq!(
        op.apply(&event(Status::Succeeded, 0), 99_000),
        Verdict::Drop(crate::operation::lifecycle::DropReason::Duplicate)
    );
    assert_ne!(op.apply(&event(Status::Failed, 9), 99_000), Verdict::Apply);
    assert!(op.claim(99_000, 600_000).is_none());
    assert!(!op.request_confirmation(99_000, Map::new(), None, 0));
    assert_eq!(op.redeliver(99_000, "x"), Err(OperatorRefusal::Retired));
    assert!(op.effect.done && op.status == Status::Succeeded);
}

#[test]
fn tombstone_is_small() {
    let mut op = Operation::register(
        "batches/abcdefghijklmnopqrstuvwxyz0123456789",
        "projects/my-project/locations/us-central1/batches/abcdefghijklmnopqrstuvwxyz0123456789",
        Some("nightly-review".into()),
        1_700_000_000_000,
    );
    op.apply(
        &status_event(Status::Succeeded, 1_700_000_100_000, &"x".repeat(2_000)),
        1_700_000_100_500,
    );
    let c = op.claim(1_700_000_100_500, 600_000).unwrap();
    op.finish(&c, &Next::Delivered, 1_700_000_101_000);
    let before = serde_json::to_string(&op).unwrap().len();
    op.retire(1_701_209_701_000);
    let after = serde_json::to_string(&op).unwrap().len();
    assert!(after < before / 3, "{after} bytes vs {before}");
    // A tombstone an earlier version kept still loads and absorbs late deliveries
    // (docs/RELIABILITY.md, "Retention's end"); it stays small.
    // Its stats sequence numbers count from the record's creation time (13 digits each).
    assert!(after <= 750, "tombstone is {after} bytes");
    println!("tombstone: {after} bytes of JSON (the record before: {before})");
}

#[test]
fn failed_ledger_writes_back_off_up_to_a_cap() {
    let mut op = Operation::register("batches/a", "batches/a", None, 0);
    op.projection_failed(10_000);
    assert_eq!(op.projection_due_ms(), 11_000);
    op.projection_failed(11_000);
    assert_eq!(op.projection_due_ms(), 13_000);
    for i in 0..40 {
        op.projection_failed(20_000 + i);
    }
    assert_eq!(op.projection_due_ms(), 20_039 + PROJECTION_RETRY_MAX_MS);
    op.projection_written(op.version, 400_000);
    assert_eq!(
        op.projection_due_ms(),
        401_000,
        "a success resets the backoff"
    );
}

#[test]
fn record_round_trips_through_json() {
    let mut op = settled();
    op.claim(2_000, 10).unwrap();
    let text = serde_json::to_string(&op).unwrap();
    let back: Operation = serde_json::from_str(&text).unwrap();
    assert_eq!(back, op);
}

#[test]
fn a_stuck_operation_that_settles_queues_the_resolution_after_the_trigger() {
    let mut op = Operation::register("batches/a", "batches/a", None, 0);
    assert!(op.raise_alert(AlertKind::Stuck, 21_600, 1_000));
    op.apply(&event(Status::Succeeded, 0), 30_000);
    let queued: Vec<AlertKind> = op.due_alerts(30_000).iter().map(|a| a.kind).collect();
    assert_eq!(queued, [AlertKind::Stuck, AlertKind::StuckSettled]);
    let body = op.alert_body(AlertKind::StuckSettled, "alert_y", 30);
    assert_eq!(body["resolves"], "stuck");
    assert_eq!(body["key"], "batches/a");
    assert!(
        !op.resolve_alert(AlertKind::Stuck, 40_000),
        "one end per opening"
    );
    assert!(
        !settled().resolve_alert(AlertKind::Stuck, 3_000),
        "never alerted: nothing to resolve"
    );
}

#[test]
fn a_parked_effect_delivered_after_a_retry_resolves_its_alert() {
    let mut op = settled();
    let c = op.claim(2_000, 600_000).unwrap();
    op.finish(&c, &Next::Park("400".into()), 2_100);
    assert!(op.raise_alert(AlertKind::EffectFailing, 1, 2_100));
    op.alert_delivered(&op.queued_id(AlertKind::EffectFailing));
    assert_eq!(op.retry_now(3_000), Ok(()));
    let c = op.claim(3_000, 600_000).unwrap();
    assert_eq!(op.finish(&c, &Next::Delivered, 3_500), Finished::Done);
    let queued: Vec<AlertKind> = op.due_alerts(3_500).iter().map(|a| a.kind).collect();
    assert_eq!(queued, [AlertKind::EffectRecovered]);
    let body = op.alert_body(AlertKind::EffectRecovered, "alert_z", 1);
    assert_eq!(body["resolves"], "effect_failing");
}

#[test]
fn an_effect_delivered_without_an_alert_resolves_nothing() {
    let mut op = settled();
    let c = op.claim(2_000, 600_000).unwrap();
    op.finish(&c, &Next::Delivered, 2_100);
    assert!(op.pending_alerts.is_empty());
}

#[test]
fn a_status_call_counts_in_the_record_and_a_call_not_made_counts_nothing() {
    let mut op = Operation::register("batches/a", "batches/a", None, 0);
    op.count_status_call(AskedBy::Nudge, None, 10);
    assert!(op.outbox.pending.is_empty(), "the plan knew the answer");
    op.count_status_call(AskedBy::Nudge, Some(StatusCallAnswer::Refused), 20);
    op.count_status_call(AskedBy::Nudge, Some(StatusCallAnswer::Refused), 30);
    op.count_status_call(AskedBy::Nudge, Some(StatusCallAnswer::Answered), 40);
    let counted: Vec<_> = op
        .outbox
        .pending
        .iter()
        .map(|e| (e.name.as_str(), e.count))
        .collect();
    assert_eq!(
        counted,
        [
            ("status_calls:nudge:refused", 2),
            ("status_calls:nudge:answered", 1)
        ]
    );
}

/// The record takes an event's details as they come, so every path that builds an event
/// outside the envelope and the status API's observation gives them the one shape itself: an
/// operator's settle, and a confirmation's merge of the nudge's metadata (a key an earlier
/// version kept included).
#[test]
fn an_operators_settle_and_a_confirmations_merge_keep_the_details_one_shape() {
    use crate::operation::details::{normalize_details, ERROR_CODE, OUTPUT_FILE_URI, PROVIDER};
    let mut op = Operation::register("batches/a", "batches/a", None, 0);
    op.settle_by_operator(Status::Failed, "stuck upstream", 10)
        .unwrap();
    assert_eq!(op.details, normalize_details(&op.details));
    assert_eq!(op.details[OUTPUT_FILE_URI], Value::Null);
    assert_eq!(op.details[PROVIDER]["operator_reason"], "stuck upstream");

    let mut op = Operation::register("batches/b", "batches/b", None, 0);
    let mut meta = Map::new();
    meta.insert("unverified_user_metadata".into(), json!({"job": 1}));
    assert!(op.request_confirmation(100, meta, None, 0));
    // An earlier version's confirmation may hold a key this one does not write.
    let c = op.confirmation.as_mut().unwrap();
    c.metadata.insert("gemini_state".into(), json!("DONE"));
    let answer = OpEvent {
        details: normalize_details(&Map::new()),
        ..event(Status::Succeeded, 5)
    };
    assert_eq!(op.confirm_with(answer, 200, 1_000), Verdict::Apply);
    assert_eq!(op.details, normalize_details(&op.details));
    assert_eq!(op.details["unverified_user_metadata"], json!({"job": 1}));
    assert_eq!(op.details[PROVIDER]["state"], "DONE");
    assert_eq!(op.details[ERROR_CODE], Value::Null);
}
