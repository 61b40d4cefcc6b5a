//! A registration: the operation submitted to Gemini, named to its gate with its kind and its
//! `user_metadata` ([`GateCommand::Register`](crate::operation::gate::protocol::GateCommand::Register)).
//!
//! Guarantees (docs/DESIGN.md, invariant 4): registering is idempotent; a gate with no record
//! creates a pending one; a registration never changes what an earlier one recorded: one that names
//! another kind or gives other `user_metadata` is answered [`GateReply::Conflict`] and changes
//! nothing ([`Operation::registration_conflicts`]); a record that exists (its completion may have
//! come first) only gains the kind or metadata it lacks (see [`Operation::fill_kind`]), and is
//! stored only when it gained something; a name whose retention ended is answered
//! [`GateReply::Retired`] and nothing is created, so a name settled before retention never runs
//! again: the gate, finding no record, asks the retired names' shard before this step
//! (`src/edge/objects/gate/mod.rs`), and a tombstone an earlier version kept answers it here.

use serde_json::Value;

use crate::operation::gate::protocol::GateReply;
use crate::operation::history::HistoryEntry;
use crate::operation::{Actor, KindFill, Operation, ResultsMode};

use super::Step;

/// A registration for a name the gate holds no record of: a pending operation.
pub(super) fn register_new(
    key: &str,
    name: &str,
    kind: Option<String>,
    user_metadata: Option<Value>,
    results: Option<ResultsMode>,
    by: Option<Actor>,
    now: i64,
) -> Step {
    let mut op = Operation::register(key, name, kind, now);
    op.fill_user_metadata(user_metadata);
    op.fill_results_mode(results.unwrap_or_default(), now);
    let operation = op.view();
    let reply = GateReply::Created { operation };
    let kind = op.kind().map(str::to_string);
    Step::stored(op, reply).row(HistoryEntry::Registered { kind, by })
}

/// A registration of an operation the gate holds. The completion may have come first (short
/// interactions often do): the registration fills in the kind and the metadata, so later
/// attempts route by it and carry them.
pub(super) fn register_again(
    mut op: Operation,
    kind: Option<&str>,
    user_metadata: Option<Value>,
    results: Option<ResultsMode>,
    now: i64,
) -> Step {
    if op.retired_at_ms().is_some() {
        // Retention ended: the tombstone says the outcome was settled; registering the name
        // again would let the next poll find it terminal and run its effect a second time.
        let operation = op.view();
        return Step::new(Some(op), GateReply::Retired { operation });
    }
    let mut fields = op.registration_conflicts(kind, user_metadata.as_ref());
    if op.registered() && results.is_some_and(|r| r != op.results_mode()) {
        fields.push("results");
    }
    if !fields.is_empty() {
        let operation = op.view();
        let fields = fields.into_iter().map(str::to_string).collect();
        return Step::new(Some(op), GateReply::Conflict { operation, fields });
    }
    // Read before the kind's fill, which marks the record registered, so a first registration
    // naming a kind and `"results": "each"` fills both.
    let first = !op.registered();
    let fill = op.fill_kind(kind, now);
    // A record its completion created takes the registration's `results` while no effect went out.
    let filled_results = first && results.is_some_and(|r| op.fill_results_mode(r, now));
    let filled_metadata = op.fill_user_metadata(user_metadata) | filled_results;
    if filled_metadata {
        op.note_registration();
    }
    let (operation, kind) = (op.view(), fill);
    let reply = GateReply::Exists { operation, kind };
    let kind = op.kind().map(str::to_string);
    let step = Step::new(Some(op), reply);
    match (fill, filled_metadata) {
        (KindFill::Filled, _) => step.durable().row(HistoryEntry::KindFilled { kind }),
        (_, true) => step.durable(),
        _ => step,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::operation::gate::alarm::{attempt_finished, begin_attempt, Attempt};
    use crate::operation::gate::fixtures::*;
    use crate::operation::gate::protocol::{GateCommand, GateReply};
    use crate::operation::gate::{step, Save};
    use crate::operation::lifecycle::{Source, Status};
    use crate::operation::{AttemptOutcome, KindFill, Operation, ResultsMode};

    #[test]
    fn register_creates_a_pending_record() {
        let s = step(
            None,
            GateCommand::Register {
                key: "batches/a".into(),
                name: "batches/a".into(),
                kind: Some("k".into()),
                user_metadata: None,
                results: None,
                by: Some(crate::operation::Actor {
                    scope: "register".into(),
                    fingerprint: "0a1b2c3d".into(),
                }),
            },
            5,
        );
        assert!(matches!(s.reply, GateReply::Created { .. }));
        assert_eq!(s.save, Save::Durable);
        assert_eq!(whats(&s), ["registered"]);
        let row = s.history[0].to_value();
        assert_eq!(
            row["by"],
            json!({"scope": "register", "fingerprint": "0a1b2c3d"}),
            "the history says whose token registered it"
        );
        assert_eq!(s.record.unwrap().status(), &Status::Pending);
    }

    #[test]
    fn results_each_is_recorded_and_a_registration_asking_otherwise_conflicts() {
        let reg = |results| GateCommand::Register {
            key: "batches/r".into(),
            name: "batches/r".into(),
            kind: None,
            user_metadata: None,
            results,
            by: None,
        };
        let op = step(None, reg(Some(ResultsMode::Each)), 5).record.unwrap();
        assert_eq!(op.results_mode(), ResultsMode::Each);
        let again = step(Some(op.clone()), reg(Some(ResultsMode::Each)), 6);
        assert!(matches!(again.reply, GateReply::Exists { .. }));
        let silent = step(Some(op.clone()), reg(None), 6);
        assert!(
            matches!(silent.reply, GateReply::Exists { .. }),
            "stating nothing agrees"
        );
        let other = step(Some(op), reg(Some(ResultsMode::None)), 7);
        let GateReply::Conflict { fields, .. } = other.reply else {
            panic!("a conflict")
        };
        assert_eq!(fields, ["results"]);
        // A record its completion created takes the registration's results.
        let first = Operation::unregistered("batches/r", "batches/r", 0);
        let filled = step(Some(first), reg(Some(ResultsMode::Each)), 8);
        assert_eq!(filled.record.unwrap().results_mode(), ResultsMode::Each);
    }

    #[test]
    fn a_first_registration_after_the_completion_fills_its_kind_and_its_results() {
        let unregistered = Operation::unregistered("batches/k", "batches/k", 0);
        let s = step(
            Some(unregistered),
            GateCommand::Register {
                key: "batches/k".into(),
                name: "batches/k".into(),
                kind: Some("billing".into()),
                user_metadata: None,
                results: Some(ResultsMode::Each),
                by: None,
            },
            5,
        );
        assert_eq!(whats(&s), ["kind_filled"]);
        let op = s.record.unwrap();
        assert_eq!(op.kind(), Some("billing"));
        assert_eq!(
            op.results_mode(),
            ResultsMode::Each,
            "the kind's fill must not hide the results' fill"
        );
    }

    #[test]
    fn register_of_a_known_operation_fills_a_missing_kind_only() {
        let unregistered = Operation::unregistered("batches/a", "batches/a", 0);
        let reg = |kind: &str| GateCommand::Register {
            key: "batches/a".into(),
            name: "batches/a".into(),
            kind: Some(kind.into()),
            user_metadata: None,
            results: None,
            by: None,
        };
        let s = step(Some(unregistered), reg("billing"), 5);
        assert!(matches!(
            s.reply,
            GateReply::Exists {
                kind: KindFill::Filled,
                ..
            }
        ));
        assert_eq!(
            (s.save, whats(&s)),
            (Save::Durable, vec!["kind_filled".to_string()])
        );
        let s = step(s.record, reg("other"), 6);
        match &s.reply {
            GateReply::Conflict { operation, fields } => {
                assert_eq!(fields, &["kind"]);
                assert_eq!(
                    operation["kind"], "billing",
                    "the answer shows what is recorded"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(s.save, Save::Unchanged);
        assert_eq!(s.record.unwrap().kind(), Some("billing"));
    }

    #[test]
    fn a_registrations_metadata_reaches_the_effect_over_every_other_source() {
        let register = |meta: serde_json::Value| GateCommand::Register {
            key: "batches/a".into(),
            name: "batches/a".into(),
            kind: None,
            user_metadata: Some(meta),
            results: None,
            by: None,
        };
        let op = step(None, register(json!({"tenant": "ours"})), 1).record;
        // A second registration does not replace the first's.
        let s = step(op, register(json!({"tenant": "other"})), 2);
        assert_eq!(s.save, Save::Unchanged);
        let mut done = event(Status::Succeeded, Source::Reconcile);
        done.details
            .insert("user_metadata".into(), json!({"tenant": "echo"}));
        let op = step(
            s.record,
            GateCommand::Deliver {
                key: "batches/a".into(),
                name: "batches/a".into(),
                event: done,
                require_registration: false,
                hold_ms: 0,
                new_not_before_ms: 0,
            },
            3,
        )
        .record
        .unwrap();
        assert_eq!(op.details()["user_metadata"], json!({"tenant": "ours"}));
        // A registration after the outcome, before any attempt, still gives it; after an
        // attempt went out it changes nothing (one webhook-id, one body).
        let unregistered = step(None, deliver(Status::Succeeded), 5).record;
        let s = step(unregistered, register(json!({"late": true})), 6);
        assert_eq!(s.save, Save::Durable);
        let op = s.record.unwrap();
        assert_eq!(op.details()["user_metadata"], json!({"late": true}));
        let (_, started) = begin_attempt(op, 7, &LIMITS).unwrap();
        let s = step(started.record, register(json!({"later": true})), 8);
        assert_eq!(s.save, Save::Unchanged);
        assert_eq!(
            s.record.unwrap().details()["user_metadata"],
            json!({"late": true})
        );
    }

    fn reg(kind: &str, tenant: &str) -> GateCommand {
        GateCommand::Register {
            key: "batches/a".into(),
            name: "batches/a".into(),
            kind: Some(kind.into()),
            user_metadata: Some(json!({ "tenant": tenant })),
            results: None,
            by: None,
        }
    }

    fn conflicts(s: &crate::operation::gate::Step) -> Vec<String> {
        match &s.reply {
            GateReply::Conflict { fields, .. } => fields.clone(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_second_registration_never_changes_what_the_first_recorded() {
        let first = step(None, reg("billing", "ours"), 1);
        assert!(matches!(first.reply, GateReply::Created { .. }));
        let op = first.record.unwrap();
        // The same registration again: an idempotent answer, nothing stored.
        let again = step(Some(op.clone()), reg("billing", "ours"), 2);
        assert!(matches!(
            again.reply,
            GateReply::Exists {
                kind: KindFill::Unchanged,
                ..
            }
        ));
        assert_eq!(
            (again.save, again.record.as_ref()),
            (Save::Unchanged, Some(&op))
        );
        // Other metadata, other kind, or both: refused with what is recorded.
        let s = step(Some(op.clone()), reg("billing", "attacker"), 3);
        assert_eq!(conflicts(&s), ["user_metadata"]);
        if let GateReply::Conflict { operation, .. } = &s.reply {
            assert_eq!(
                operation["details"]["user_metadata"],
                json!({"tenant": "ours"})
            );
        }
        assert_eq!((s.save, s.record.as_ref()), (Save::Unchanged, Some(&op)));
        assert_eq!(
            conflicts(&step(Some(op.clone()), reg("other", "ours"), 3)),
            ["kind"]
        );
        assert_eq!(
            conflicts(&step(Some(op.clone()), reg("other", "attacker"), 3)),
            ["kind", "user_metadata"]
        );
        // A registration that leaves a field out states nothing about it.
        let bare = GateCommand::Register {
            key: "batches/a".into(),
            name: "batches/a".into(),
            kind: None,
            user_metadata: None,
            results: None,
            by: None,
        };
        assert!(matches!(
            step(Some(op.clone()), bare, 3).reply,
            GateReply::Exists { .. }
        ));
        // Settled, its first attempt not run yet (a paced or open destination can make that
        // hours): still refused, and the effect carries the first registration's metadata.
        let settled = step(Some(op), deliver(Status::Succeeded), 4)
            .record
            .unwrap();
        assert_eq!(settled.effect().attempts(), 0);
        let s = step(Some(settled.clone()), reg("billing", "attacker"), 5);
        assert_eq!(conflicts(&s), ["user_metadata"]);
        assert_eq!(s.save, Save::Unchanged);
        let (_, started) = begin_attempt(s.record.unwrap(), 6, &LIMITS).unwrap();
        let op = started.record.unwrap();
        assert_eq!(op.details()["user_metadata"], json!({"tenant": "ours"}));
    }

    #[test]
    fn a_completion_first_takes_the_first_registration_then_refuses_another() {
        let unregistered = step(None, deliver_unregistered(15_000), 10).record;
        let first = step(unregistered, reg("billing", "ours"), 20);
        assert!(matches!(first.reply, GateReply::Exists { .. }));
        assert_eq!(first.save, Save::Durable);
        let op = first.record.unwrap();
        assert!(op.registered());
        assert_eq!(op.details()["user_metadata"], json!({"tenant": "ours"}));
        let s = step(Some(op.clone()), reg("billing", "attacker"), 30);
        assert_eq!(conflicts(&s), ["user_metadata"]);
        assert_eq!(s.record, Some(op));
    }

    #[test]
    fn an_unregistered_completion_waits_for_a_late_registration_then_runs_at_once() {
        let s = step(None, deliver_unregistered(15_000), 10);
        let held = s.record.as_ref().unwrap().effect().next_attempt_ms();
        assert_eq!(held, 10 + 15_000, "held");
        assert!(begin_attempt(s.record.clone().unwrap(), 11, &LIMITS).is_none());
        let late = step(
            s.record,
            GateCommand::Register {
                key: "batches/a".into(),
                name: "batches/a".into(),
                kind: Some("billing".into()),
                user_metadata: None,
                results: None,
                by: None,
            },
            2_000,
        );
        assert!(matches!(
            late.reply,
            GateReply::Exists {
                kind: KindFill::Filled,
                ..
            }
        ));
        let due = late.record.as_ref().unwrap().effect().next_attempt_ms();
        assert_eq!(due, 2_000, "due now");
        let op = late.record.unwrap();
        assert_eq!(op.kind(), Some("billing"));
        assert!(begin_attempt(op, 2_000, &LIMITS).is_some());
        let registered_first = step(Some(registered()), deliver(Status::Succeeded), 10);
        let due = registered_first.record.unwrap().effect().next_attempt_ms();
        assert_eq!(due, 10, "no hold");
    }

    #[test]
    fn a_registration_after_the_first_attempt_leaves_the_kind_and_the_body_alone() {
        let s = step(None, deliver_unregistered(0), 10);
        let (claim, s) = begin_attempt(s.record.unwrap(), 10, &LIMITS).unwrap();
        let failed = attempt_finished(
            s.record.unwrap(),
            &Attempt {
                claim,
                outcome: AttemptOutcome::Retry("503".into()),
                started_ms: 10,
                finished_ms: 20,
                asked_wait_ms: None,
                target: Default::default(),
            },
            &LIMITS,
            1.0,
        );
        let op = failed.record.unwrap();
        let late = step(
            Some(op.clone()),
            GateCommand::Register {
                key: "batches/a".into(),
                name: "batches/a".into(),
                kind: Some("billing".into()),
                user_metadata: None,
                results: None,
                by: None,
            },
            30,
        );
        assert!(matches!(
            late.reply,
            GateReply::Exists {
                kind: KindFill::TooLate,
                ..
            }
        ));
        assert_eq!(late.save, Save::Unchanged);
        assert_eq!(
            late.record.unwrap(),
            op,
            "kind, version and schedule unchanged"
        );
    }
}
