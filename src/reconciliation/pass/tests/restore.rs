//! Gemini's bad day, decision by decision: which webhook states a pass enables again, the call
//! it makes, the sweep onto the fan-out queue that follows, and what it alerts.

use super::*;
use crate::reconciliation::pass::restore::{swept_text, verdict, Verdict};
use crate::reconciliation::status::DISABLED_FOR_FAILURES;

const ENABLE_URL: &str = "http://gemini/v1beta/webhooks/w?update_mask=state";

fn restore_limits(fanout: Option<Fanout>) -> Limits {
    Limits {
        fanout,
        ..webhook_limits()
    }
}

fn queue() -> Option<Fanout> {
    Some(Fanout {
        rate_per_s: 20,
        above: 1_000,
    })
}

/// A grant whose saved cursor is mid-index, as a pass in its usual order would continue.
fn granted_mid_index(alerted: Option<&str>, fed_until_ms: i64) -> LeaseReply {
    LeaseReply::Granted {
        resume: at("open:batches/k2"),
        status_backoff_until_ms: 0,
        fed_until_ms,
        webhook_alerted_state: alerted.map(str::to_string),
        audit: audit_not_due(),
    }
}

fn disabled_world() -> World {
    World {
        grant: Ok(granted_mid_index(None, 0)),
        webhooks: vec![webhooks(DISABLED_FOR_FAILURES)],
        index: keys(5),
        ..World::default()
    }
}

fn enable_calls(out: &Outcome) -> Vec<(&str, &str)> {
    out.intents
        .iter()
        .filter_map(|i| match i {
            Intent::EnableWebhook { url, body } => Some((url.as_str(), body.as_str())),
            _ => None,
        })
        .collect()
}

fn alerts(out: &Outcome) -> Vec<&Value> {
    out.intents
        .iter()
        .filter_map(|i| match i {
            Intent::PostAlert(body) => Some(body),
            _ => None,
        })
        .collect()
}

fn text(alert: &Value) -> &str {
    alert["text"].as_str().unwrap()
}

#[test]
fn only_a_webhook_disabled_for_failures_is_restored_and_only_when_allowed_and_shown_answering() {
    let answering = || Ok(());
    let restore = Verdict::Restore { id: "w".into() };
    assert_eq!(
        verdict(DISABLED_FOR_FAILURES, Some("w"), true, answering()),
        restore
    );
    let left = |state, id, auto, answering| match verdict(state, id, auto, answering) {
        Verdict::Leave { why } => why,
        other => panic!("{state}: {other:?}"),
    };
    let why = left(DISABLED_FOR_FAILURES, Some("w"), false, answering());
    assert!(why.starts_with("GEMINI_WEBHOOK_AUTO_ENABLE=false"), "{why}");
    let why = left(
        DISABLED_FOR_FAILURES,
        Some("w"),
        true,
        Err("KV: unbound".into()),
    );
    assert!(
        why.contains("cannot show the worker answering (KV: unbound)"),
        "{why}"
    );
    let why = left(DISABLED_FOR_FAILURES, None, true, answering());
    assert!(why.contains("no id"), "{why}");
    for auto in [true, false] {
        let why = left("disabled", Some("w"), auto, answering());
        assert!(why.starts_with("Disabled by a person: left alone"), "{why}");
        let why = left("not_found", None, auto, answering());
        assert!(why.contains("npm run connect creates it"), "{why}");
        let why = left("paused_by_gemini", Some("w"), auto, answering());
        assert!(why.contains("unknown state"), "{why}");
    }
}

#[test]
fn the_alert_says_how_much_the_sweep_scheduled_and_whether_that_was_all() {
    let q = queue();
    let q = q.as_ref();
    let all = swept_text(q, 7, Some(Stop::Complete));
    assert!(
        all.starts_with(
            "Swept: 7 open operations scheduled for a poll on the fan-out queue, 20 a second."
        ),
        "{all}"
    );
    assert!(
        all.contains("every open operation the index lists"),
        "{all}"
    );
    assert!(swept_text(q, 7, Some(Stop::Scheduled)).contains("next passes"));
    assert!(swept_text(q, 7, Some(Stop::Window)).contains("next window"));
    let early = swept_text(q, 0, Some(Stop::Budget));
    assert!(early.contains("stopped early (budget)"), "{early}");
    let none = swept_text(None, 0, Some(Stop::Complete));
    assert!(none.starts_with("No fan-out queue is bound"), "{none}");
}

#[test]
fn a_webhook_disabled_for_failures_is_enabled_again_and_every_open_operation_swept_on_the_queue() {
    let out = run(restore_limits(queue()), disabled_world());
    assert_eq!(
        enable_calls(&out),
        vec![(ENABLE_URL, r#"{"state":"enabled"}"#)],
        "connect's update_mask call"
    );
    // From the index's start, not the saved cursor, and all of it on the queue though the
    // backlog is under RECONCILE_FANOUT_ABOVE.
    assert_eq!(out.lists(), vec![("open:", None)]);
    assert!(out.polls().is_empty(), "the pass polls nothing itself");
    let names: Vec<String> = out
        .queued()
        .iter()
        .flat_map(|(j, _)| j.entries.iter().map(|e| e.name.clone()))
        .collect();
    let want: Vec<String> = (0..5).map(|i| format!("open:batches/k{i}")).collect();
    assert_eq!(names, want);
    assert_eq!(out.report.fed, 5);
    assert_eq!(out.report.stopped, Some(Stop::Complete));
    // Alerted once the sweep is scheduled, before the release.
    let sent = alerts(&out);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0]["alert"], "webhook_reenabled");
    assert!(
        text(sent[0]).contains("was disabled_due_to_failed_deliveries: re-enabled"),
        "{}",
        text(sent[0])
    );
    assert!(text(sent[0]).contains("Swept: 5 open operations"));
    let alert_at = out.position(|i| matches!(i, Intent::PostAlert(_))).unwrap();
    assert!(
        out.position(|i| matches!(i, Intent::Enqueue { .. }))
            .unwrap()
            < alert_at
    );
    assert!(
        alert_at
            < out
                .position(|i| matches!(i, Intent::Lease(LeaseCommand::Release { .. })))
                .unwrap()
    );
    assert_eq!(out.report.alerts, 1);
    // Enabled: nothing outstanding, so the next disabling alerts (and restores) again.
    assert_eq!(webhook_release(&out), (true, None));
    let enabled = out.events("webhook_enabled");
    assert_eq!(enabled.len(), 1);
    assert_eq!(enabled[0]["was"], DISABLED_FOR_FAILURES);
    assert_eq!(enabled[0]["swept"], true);
    assert_eq!(
        out.report.subrequests, 7,
        "lease, listing page, enabling call, index list, send, alert, release"
    );
}

#[test]
fn the_sweep_does_not_wait_for_copies_still_queued_but_schedules_after_their_slots() {
    let mut w = disabled_world();
    w.grant = Ok(LeaseReply::Granted {
        resume: LedgerCursor::default(),
        status_backoff_until_ms: 0,
        fed_until_ms: NOW + 100_000,
        webhook_alerted_state: None,
        audit: audit_not_due(),
    });
    let out = run(restore_limits(queue()), w);
    assert_eq!(out.report.stopped, Some(Stop::Complete), "not still_queued");
    let queued = out.queued();
    assert_eq!(queued.len(), 1);
    assert_eq!(
        queued[0].0.not_before_ms,
        NOW + 100_000,
        "after the slots taken: the rate holds"
    );
    assert_eq!(out.report.fed, 5);
}

#[test]
fn a_sweep_larger_than_a_cron_interval_of_polls_is_continued_by_the_next_passes() {
    // 1 a second: 300 slots in one cron interval.
    let limits = restore_limits(Some(Fanout {
        rate_per_s: 1,
        above: 1_000,
    }));
    let out = run(
        limits,
        World {
            index: keys(400),
            ..disabled_world()
        },
    );
    assert_eq!(out.report.fed, 300);
    assert_eq!(out.report.stopped, Some(Stop::Scheduled));
    assert!(
        out.resume().after_key.is_some(),
        "the next pass goes on from there"
    );
    assert!(text(alerts(&out)[0]).contains("Swept: 300 open operations"));
    assert!(text(alerts(&out)[0]).contains("scheduled by the next passes"));
}

#[test]
fn without_a_queue_the_webhook_is_enabled_and_the_walk_keeps_its_usual_order() {
    let out = run(restore_limits(None), disabled_world());
    assert_eq!(enable_calls(&out).len(), 1);
    assert_eq!(
        out.polls(),
        vec!["batches/k3", "batches/k4"],
        "from the saved cursor, by the pass itself"
    );
    let sent = alerts(&out);
    assert!(
        text(sent[0]).contains("No fan-out queue is bound"),
        "{}",
        text(sent[0])
    );
    assert_eq!(out.events("webhook_enabled")[0]["swept"], false);
    assert_eq!(webhook_release(&out), (true, None));
}

#[test]
fn an_enabling_call_that_fails_changes_nothing_alerts_once_and_is_made_again_next_pass() {
    let refused = PeerAnswer::Http {
        status: 403,
        body: String::new(),
        retry_after: None,
    };
    let still_disabled = PeerAnswer::Http {
        status: 200,
        body: json!({"id": "w", "state": DISABLED_FOR_FAILURES}).to_string(),
        retry_after: None,
    };
    for (answer, error) in [
        (refused, "Refused(403)"),
        (PeerAnswer::Timeout, "Transient"),
        (
            still_disabled,
            "answered with the webhook disabled_due_to_failed_deliveries",
        ),
    ] {
        let out = run(
            restore_limits(queue()),
            World {
                enable: answer.clone(),
                ..disabled_world()
            },
        );
        assert_eq!(enable_calls(&out).len(), 1);
        let failed = out.events("webhook_enable_failed");
        assert!(
            failed[0]["error"].as_str().unwrap().contains(error),
            "{failed:?}"
        );
        assert_eq!(out.report.errors, 1);
        assert!(out.queued().is_empty(), "no sweep");
        assert_eq!(
            out.polls(),
            vec!["batches/k3", "batches/k4"],
            "the usual order"
        );
        let sent = alerts(&out);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0]["alert"], "webhook_disabled");
        assert!(
            text(sent[0]).contains("Enabling it failed ("),
            "{}",
            text(sent[0])
        );
        assert_eq!(
            webhook_release(&out),
            (true, Some(DISABLED_FOR_FAILURES.to_string()))
        );
        assert_eq!(
            out.events("webhook_state").len(),
            1,
            "the state is logged once"
        );
        // The next pass makes the call again, and does not alert the same state twice.
        let again = run(
            restore_limits(queue()),
            World {
                grant: Ok(granted_mid_index(Some(DISABLED_FOR_FAILURES), 0)),
                enable: answer,
                ..disabled_world()
            },
        );
        assert_eq!(enable_calls(&again).len(), 1);
        assert!(alerts(&again).is_empty());
    }
}

#[test]
fn with_auto_enable_off_a_webhook_disabled_for_failures_is_only_alerted() {
    let limits = Limits {
        webhook_auto_enable: false,
        ..restore_limits(queue())
    };
    let out = run(limits, disabled_world());
    assert!(enable_calls(&out).is_empty());
    assert!(out.queued().is_empty());
    let sent = alerts(&out);
    assert_eq!(sent[0]["alert"], "webhook_disabled");
    assert!(text(sent[0]).contains("GEMINI_WEBHOOK_AUTO_ENABLE=false: left disabled"));
    assert_eq!(
        webhook_release(&out),
        (true, Some(DISABLED_FOR_FAILURES.to_string()))
    );
}

#[test]
fn a_webhook_a_person_disabled_is_left_alone_and_alerted() {
    let out = run(
        restore_limits(queue()),
        World {
            webhooks: vec![webhooks("disabled")],
            ..disabled_world()
        },
    );
    assert!(enable_calls(&out).is_empty());
    assert!(out.queued().is_empty());
    let sent = alerts(&out);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0]["alert"], "webhook_disabled");
    assert!(text(sent[0]).contains("is disabled;"));
    assert!(text(sent[0]).contains("Disabled by a person: left alone"));
    assert_eq!(webhook_release(&out), (true, Some("disabled".to_string())));
}

#[test]
fn a_pass_that_cannot_show_the_worker_answering_does_not_restore() {
    let mut pass = Pass::new(restore_limits(queue()), "pass-1".into(), NOW);
    pass.on_kv_unbound("OPS_KV: not bound".into());
    let out = drive(pass, disabled_world());
    assert!(enable_calls(&out).is_empty());
    assert!(
        text(alerts(&out)[0]).contains("cannot show the worker answering (KV: OPS_KV: not bound)")
    );
}

#[test]
fn no_enabling_call_without_room_for_it_the_alert_and_the_release() {
    let limits = Limits {
        budget: 4,
        ..restore_limits(queue())
    };
    let out = run(limits, disabled_world());
    assert!(enable_calls(&out).is_empty());
    assert!(text(alerts(&out)[0]).contains("no budget"));
}

#[test]
fn a_restoring_pass_keeps_room_for_the_alert_within_its_budget() {
    for budget in 5..12 {
        let out = run(
            Limits {
                budget,
                ..restore_limits(None)
            },
            World {
                index: keys(30),
                ..disabled_world()
            },
        );
        assert_eq!(enable_calls(&out).len(), 1, "budget {budget}");
        assert_eq!(alerts(&out).len(), 1, "budget {budget}");
        assert!(out.release().is_some());
        assert!(
            out.report.subrequests <= budget,
            "budget {budget}: {:?}",
            out.report
        );
    }
}

#[test]
fn an_alert_not_sent_is_not_retried_and_the_line_says_what_was_done() {
    let out = run(
        restore_limits(queue()),
        World {
            alert_sent: false,
            ..disabled_world()
        },
    );
    assert_eq!(out.report.alerts, 0);
    assert_eq!(out.events("webhook_enabled").len(), 1);
    assert_eq!(webhook_release(&out), (true, None));
    assert_eq!(out.report.fed, 5);
}
