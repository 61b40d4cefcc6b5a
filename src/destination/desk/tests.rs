//! The desk's decisions, one test per row of its table.

use super::*;

fn settings(pace: Pace) -> DeskSettings {
    DeskSettings {
        label: "EFFECT_URL: https://down.example".into(),
        open_after: 3,
        probe_max_ms: 15_000,
        slot_ttl_ms: 60_000,
        pace,
        asked_max_ms: 3_600_000,
    }
}

fn desk(pace: Pace) -> Desk {
    Desk {
        settings: Some(settings(pace)),
        ..Desk::default()
    }
}

fn facts(waiting: u64, in_flight: u64) -> Facts {
    Facts {
        waiting,
        in_flight,
        next_due_ms: 0,
    }
}

fn paced(per_second: u32, concurrency: Option<u32>) -> Pace {
    Pace {
        per_second: Some(per_second),
        concurrency,
    }
}

/// What one attempt (a job's effect) reports: a health failure, and the wait it asked for.
fn one(failure: Option<String>, asked_wait_ms: Option<i64>) -> Sent {
    chunk(1, u32::from(failure.is_some()), failure, asked_wait_ms)
}

/// What a step of a batch's results reports: `sent` attempts, `failures` of them health
/// failures (the last `failure`), the longest wait asked for.
fn chunk(sent: u32, failures: u32, failure: Option<String>, asked_wait_ms: Option<i64>) -> Sent {
    Sent {
        sent,
        failures,
        failure,
        asked_wait_ms,
    }
}

/// A grant of one attempt, all at once: what a job's effect's ask is answered when it may go.
fn go() -> DeskReply {
    DeskReply::Granted {
        n: 1,
        after_ms: Vec::new(),
    }
}

/// A paced route's grant of one attempt, its token due now.
fn go_paced() -> DeskReply {
    DeskReply::Granted {
        n: 1,
        after_ms: vec![0],
    }
}

fn fail(d: &mut Desk, key: &str, now: i64) -> Decision {
    d.report(key, one(Some("503".into()), None), facts(0, 0), now)
}

#[test]
fn a_healthy_unpaced_destination_lets_a_retry_go() {
    let mut d = desk(Pace::default());
    assert_eq!(d.ask(1, facts(0, 0), 0).reply, go());
    assert_eq!(d.ask(1, facts(0, 0), 0).slots, 0);
}

#[test]
fn failures_below_the_threshold_keep_their_own_schedule() {
    let mut d = desk(Pace::default());
    assert_eq!(fail(&mut d, "a", 0).reply, DeskReply::OwnSchedule);
    assert_eq!(fail(&mut d, "b", 1).reply, DeskReply::OwnSchedule);
    assert!(!d.is_open());
    assert!(d.alerts.is_empty());
}

#[test]
fn the_threshold_opens_it_alerts_once_and_queues_the_failing_key() {
    let mut d = desk(Pace::default());
    fail(&mut d, "a", 0);
    fail(&mut d, "b", 1);
    let third = fail(&mut d, "c", 2);
    assert_eq!(third.reply, DeskReply::Wait);
    assert!(third.enqueue);
    assert_eq!(third.alarm_at_ms, Some(2 + PROBE_FIRST_MS));
    assert!(d.is_open());
    let fourth = fail(&mut d, "d", 3);
    assert_eq!(fourth.reply, DeskReply::Wait);
    assert_eq!(d.alerts.len(), 1);
    assert_eq!(d.alerts[0]["alert"], "destination_open");
    assert_eq!(d.view(facts(2, 0)).state, "open");
    assert_eq!(d.view(facts(2, 0)).last_error.as_deref(), Some("503"));
}

#[test]
fn a_success_between_failures_resets_the_count() {
    let mut d = desk(Pace::default());
    fail(&mut d, "a", 0);
    fail(&mut d, "b", 1);
    d.report("x", one(None, None), facts(0, 0), 2);
    assert_eq!(fail(&mut d, "c", 3).reply, DeskReply::OwnSchedule);
}

fn opened() -> Desk {
    let mut d = desk(Pace::default());
    for (i, k) in ["a", "b", "c"].iter().enumerate() {
        fail(&mut d, k, i as i64);
    }
    d.alerts.clear();
    d
}

#[test]
fn while_open_an_ask_waits() {
    let mut d = opened();
    let ask = d.ask(1, facts(3, 0), 10);
    assert_eq!(ask.reply, DeskReply::Wait);
    assert!(ask.enqueue);
}

#[test]
fn the_alarm_probes_one_key_after_the_backoff_and_no_second_while_it_is_out() {
    let mut d = opened();
    assert_eq!(d.wake(facts(3, 0), 2 + PROBE_FIRST_MS - 1), Wake::Idle);
    assert_eq!(d.wake(facts(3, 0), 2 + PROBE_FIRST_MS), Wake::Probe);
    d.released("a", true, 2 + PROBE_FIRST_MS);
    assert_eq!(d.wake(facts(2, 0), 3 + PROBE_FIRST_MS), Wake::Idle);
}

#[test]
fn a_failed_probe_doubles_the_backoff_up_to_the_cap_and_requeues_its_key() {
    let mut d = opened();
    let mut now = 2 + PROBE_FIRST_MS;
    let mut waits = Vec::new();
    for _ in 0..5 {
        assert_eq!(d.wake(facts(3, 0), now), Wake::Probe);
        d.released("a", true, now);
        let failed = fail(&mut d, "a", now + 100);
        assert!(failed.enqueue);
        waits.push(d.next_probe_ms - (now + 100));
        now = d.next_probe_ms;
    }
    assert_eq!(waits, vec![4_000, 8_000, 15_000, 15_000, 15_000]);
    assert!(d.is_open());
}

#[test]
fn a_probe_that_never_reports_lapses_as_a_failure() {
    let mut d = opened();
    let at = 2 + PROBE_FIRST_MS;
    assert_eq!(d.wake(facts(3, 0), at), Wake::Probe);
    d.released("a", true, at);
    assert_eq!(d.wake(facts(2, 0), at + 59_999), Wake::Idle);
    // Lapsed: the backoff doubles, and the next probe waits for it.
    assert_eq!(d.wake(facts(2, 0), at + 60_000), Wake::Idle);
    assert_eq!(d.next_probe_ms, at + 60_000 + 4_000);
}

#[test]
fn a_probe_success_closes_it_alerts_recovery_and_starts_the_drain() {
    let mut d = opened();
    let at = 2 + PROBE_FIRST_MS;
    d.wake(facts(60, 0), at);
    d.released("a", true, at);
    let ok = d.report("a", one(None, None), facts(59, 0), at + 10_000);
    assert_eq!(ok.reply, DeskReply::Noted);
    assert_eq!(ok.alarm_at_ms, Some(at + 10_000));
    assert!(!d.is_open());
    assert_eq!(d.alerts.len(), 1);
    assert_eq!(d.alerts[0]["alert"], "destination_recovered");
    assert_eq!(d.alerts[0]["waited"], 60);
    assert_eq!(d.alerts[0]["outage_seconds"], (at + 10_000 - 2) / 1_000);
    assert_eq!(d.view(facts(59, 0)).state, "draining");
    // Unpaced: a batch of MAX_RELEASES_PER_RUN, the next a second later.
    assert_eq!(d.wake(facts(59, 0), at + 10_000), Wake::Drain(50));
    assert_eq!(d.wake(facts(9, 0), at + 10_500), Wake::Idle);
    assert_eq!(d.wake(facts(9, 0), at + 11_000), Wake::Drain(9));
}

#[test]
fn while_draining_a_new_ask_queues_behind_the_waiting() {
    let mut d = desk(Pace::default());
    assert_eq!(d.ask(1, facts(4, 0), 0).reply, DeskReply::Wait);
}

#[test]
fn a_paced_route_lets_one_go_per_interval_and_queues_the_rest() {
    let mut d = desk(paced(5, None));
    let first = d.ask(1, facts(0, 0), 1_000);
    assert_eq!(first.reply, go_paced());
    assert_eq!(first.slots, 1);
    let second = d.ask(1, facts(0, 1), 1_050);
    assert_eq!(second.reply, DeskReply::Wait);
    assert_eq!(second.alarm_at_ms, Some(1_200));
    assert_eq!(d.wake(facts(1, 1), 1_199), Wake::Idle);
    assert_eq!(d.wake(facts(1, 1), 1_200), Wake::Drain(1));
}

#[test]
fn a_paced_route_never_releases_more_than_its_rate_plus_burst_in_a_second() {
    let mut d = desk(paced(5, None));
    let mut released = Vec::new();
    for now in (0..3_000).step_by(10) {
        if let Wake::Drain(n) = d.wake(facts(100, 0), now) {
            released.extend(std::iter::repeat_n(now, n as usize));
        }
    }
    for start in (0..2_000).step_by(10) {
        let in_window = released
            .iter()
            .filter(|t| **t >= start && **t < start + 1_000)
            .count();
        assert!(in_window <= 6, "{in_window} at {start}");
    }
    assert_eq!(released.len(), 15);
}

#[test]
fn concurrency_holds_releases_until_a_slot_frees() {
    let mut d = desk(Pace {
        per_second: None,
        concurrency: Some(2),
    });
    assert_eq!(d.ask(1, facts(0, 0), 0).reply, go_paced());
    assert_eq!(d.ask(1, facts(0, 1), 0).reply, go_paced());
    assert_eq!(d.ask(1, facts(0, 2), 0).reply, DeskReply::Wait);
    assert_eq!(d.wake(facts(1, 2), 5), Wake::Idle);
    assert_eq!(d.next_alarm_ms(facts(1, 2), 5), Some(5 + 30_000));
    let done = d.report("a", one(None, None), facts(1, 1), 6);
    assert_eq!(done.alarm_at_ms, Some(6));
    assert_eq!(d.wake(facts(1, 1), 6), Wake::Drain(1));
}

#[test]
fn alerts_are_kept_until_the_sink_takes_them_and_never_hold_a_probe_back() {
    let mut d = desk(Pace::default());
    for (i, k) in ["a", "b", "c"].iter().enumerate() {
        fail(&mut d, k, i as i64);
    }
    // Owed and due: the alarm comes at once.
    assert!(d.alerts_due(10));
    assert_eq!(d.next_alarm_ms(facts(1, 0), 10), Some(20));
    // Refused: tried again ALERT_RETRY_MS later; the probe keeps its own time.
    d.alerts_tried(0, true, 10);
    assert!(!d.alerts_due(20));
    assert!(d.alerts_due(10 + ALERT_RETRY_MS));
    assert_eq!(d.next_alarm_ms(facts(1, 0), 10), Some(2 + PROBE_FIRST_MS));
    assert_eq!(d.next_alarm_ms(facts(0, 0), 10), Some(10 + ALERT_RETRY_MS));
    d.alerts_tried(1, false, 11);
    assert!(d.alerts.is_empty());
    assert_eq!(d.next_alarm_ms(facts(1, 0), 10), Some(2 + PROBE_FIRST_MS));
    assert_eq!(d.next_alarm_ms(facts(0, 0), 10), None);
}

#[test]
fn a_sink_down_for_long_keeps_the_newest_alerts_and_counts_the_rest() {
    let mut d = desk(Pace::default());
    for i in 0..(MAX_OWED_ALERTS + 3) {
        d.owe(serde_json::json!({"alert": "destination_open", "n": i}));
    }
    assert_eq!(d.alerts.len(), MAX_OWED_ALERTS);
    assert_eq!(d.alerts_dropped, 3);
    assert_eq!(d.alerts[0]["n"], 3, "the oldest went first");
}

#[test]
fn a_recovery_resolves_the_opening() {
    let mut d = desk(Pace::default());
    for (i, k) in ["a", "b", "c"].iter().enumerate() {
        fail(&mut d, k, i as i64);
    }
    let open = d.alerts[0].clone();
    d.alerts.clear();
    d.close(4, 50_000);
    let recovered = &d.alerts[0];
    assert_eq!(recovered["resolves"], "destination_open");
    assert_eq!(recovered["key"], open["key"]);
    assert_eq!(open.get("resolves"), None);
}

#[test]
fn the_stored_state_round_trips() {
    let d = opened();
    let text = serde_json::to_string(&d).unwrap();
    assert_eq!(serde_json::from_str::<Desk>(&text).unwrap(), d);
}

#[test]
fn failures_far_apart_are_not_in_a_row() {
    let mut d = desk(Pace::default());
    fail(&mut d, "a", 0);
    fail(&mut d, "b", 1_000);
    fail(&mut d, "c", 1_000 + FAILURE_RUN_GAP_MS + 1);
    assert_eq!(d.failures_in_row, 1);
    fail(&mut d, "d", 40_000);
    assert!(!d.is_open());
}

/// The outage with the defaults: 60 effects, a destination down for 30 s; the desk
/// probes it a handful of times and drains everything within 20 s of its recovery.
#[test]
fn sixty_effects_down_thirty_seconds_drain_within_twenty_seconds_of_recovery() {
    let mut d = Desk {
        settings: Some(DeskSettings {
            open_after: 5,
            ..settings(Pace::default())
        }),
        ..Desk::default()
    };
    let up_at = 30_000;
    let mut waiting = 0u64;
    for i in 0..60 {
        if d.report(
            &format!("k{i}"),
            one(Some("503".into()), None),
            facts(waiting, 0),
            i,
        )
        .enqueue
        {
            waiting += 1;
        }
    }
    // The four that kept their own schedule ask at their retry (about 30 s later) and wait.
    waiting += 4;
    let (mut probes, mut last_release, mut probe_out) = (0, 0, None);
    for now in (100..120_000).step_by(10) {
        if let Some(sent) = probe_out {
            if now >= sent + 50 {
                probe_out = None;
                let failure = (sent < up_at).then(|| "503".to_string());
                if d.report("p", one(failure, None), facts(waiting, 0), now)
                    .enqueue
                {
                    waiting += 1;
                }
            }
        }
        match d.wake(facts(waiting, 0), now) {
            Wake::Probe => {
                probes += 1;
                waiting -= 1;
                d.released("p", true, now);
                probe_out = Some(now);
            }
            Wake::Drain(n) => {
                waiting -= u64::from(n);
                last_release = now;
            }
            Wake::Idle => {}
        }
        if waiting == 0 && !d.is_open() && probe_out.is_none() {
            break;
        }
    }
    assert_eq!(waiting, 0);
    assert!(probes <= 6, "{probes} probes");
    assert!(
        last_release - up_at <= 20_000,
        "drained {} ms after recovery",
        last_release - up_at
    );
}

fn fail_asking(d: &mut Desk, key: &str, asked: i64, now: i64) -> Decision {
    d.report(key, one(Some("429".into()), Some(asked)), facts(0, 0), now)
}

#[test]
fn a_retry_after_on_the_report_that_opens_it_holds_the_first_probe_that_long() {
    let mut d = desk(Pace::default());
    fail_asking(&mut d, "a", 600_000, 0);
    fail_asking(&mut d, "b", 600_000, 1);
    let third = fail_asking(&mut d, "c", 600_000, 2);
    assert_eq!(third.reply, DeskReply::Wait);
    assert_eq!(third.alarm_at_ms, Some(600_002), "not the 2 s probe");
    assert_eq!(d.wake(facts(1, 0), 600_001), Wake::Idle);
    d.alerts_tried(1, false, 0);
    assert!(d.next_alarm_ms(facts(1, 0), 70_000).unwrap() >= 600_002);
    assert_eq!(d.wake(facts(1, 0), 600_002), Wake::Probe);
}

#[test]
fn a_probes_retry_after_pushes_the_next_probe_past_its_backoff_within_the_cap() {
    let mut d = opened();
    let at = 2 + PROBE_FIRST_MS;
    assert_eq!(d.wake(facts(3, 0), at), Wake::Probe);
    d.released("a", true, at);
    let failed = fail_asking(&mut d, "a", 90_000, at + 100);
    assert!(failed.enqueue);
    assert_eq!(d.next_probe_ms, at + 100 + 90_000, "not the 4 s backoff");
    assert_eq!(failed.alarm_at_ms, Some(at + 100 + 90_000));
    // An attempt's answer while open asks too; a day is held to EFFECT_RETRY_MAX_SECONDS.
    let other = fail_asking(&mut d, "z", 86_400_000, at + 200);
    assert_eq!(other.reply, DeskReply::Wait);
    assert_eq!(d.next_probe_ms, at + 200 + 3_600_000);
    // A shorter ask never brings the probe sooner.
    fail_asking(&mut d, "y", 1_000, at + 300);
    assert_eq!(d.next_probe_ms, at + 200 + 3_600_000);
}

#[test]
fn a_retry_after_below_the_threshold_is_left_to_the_effects_own_backoff() {
    let mut d = desk(Pace::default());
    let first = fail_asking(&mut d, "a", 600_000, 0);
    assert_eq!(first.reply, DeskReply::OwnSchedule);
    assert!(!first.enqueue);
    assert!(!d.is_open());
}

#[test]
fn a_key_whose_gate_cannot_be_reached_backs_off_on_its_own_from_the_first_probe_wait() {
    let d = opened();
    let waits: Vec<i64> = (1..=5).map(|n| d.probe_backoff().after(n)).collect();
    assert_eq!(waits, vec![2_000, 4_000, 8_000, 15_000, 15_000]);
    assert_eq!(d.probe_backoff().after(u32::MAX), 15_000);
}

#[test]
fn a_probe_run_that_reaches_no_gate_counts_as_a_failed_probe_and_never_spins() {
    let mut d = opened();
    let mut now = 2 + PROBE_FIRST_MS;
    let mut gaps = Vec::new();
    for _ in 0..5 {
        assert_eq!(d.wake(facts(2, 0), now), Wake::Probe);
        // The edge tried the due keys and reached none of their gates.
        d.released("a", true, now);
        d.probe_missed(now);
        assert!(d.probe.is_none());
        let next = d.next_alarm_ms(facts(2, 0), now).unwrap();
        gaps.push(next - now);
        assert_eq!(d.wake(facts(2, 0), next - 1), Wake::Idle);
        now = next;
    }
    assert_eq!(gaps, vec![4_000, 8_000, 15_000, 15_000, 15_000]);
    assert!(gaps.iter().all(|g| *g >= PROBE_FIRST_MS));
}

#[test]
fn a_key_due_later_is_not_released_sooner_and_the_alarm_waits_for_it() {
    // Draining: the only waiting key's gate could not be reached; it is due again in 4 s.
    let mut d = desk(Pace::default());
    let later = Facts {
        next_due_ms: 5_000,
        ..facts(1, 0)
    };
    assert_eq!(d.wake(later, 1_000), Wake::Idle);
    assert_eq!(
        d.next_alarm_ms(later, 1_000),
        Some(5_000),
        "not every 10 ms"
    );
    assert_eq!(d.wake(later, 5_000), Wake::Drain(1));
    // Open: the same holds for the probe.
    let mut d = opened();
    assert_eq!(d.wake(later, 4_000), Wake::Idle);
    d.alerts_tried(1, false, 0);
    assert_eq!(d.next_alarm_ms(later, 4_000), Some(5_000));
}

/// The times a grant's results may leave, from `now`.
fn spaced(reply: &DeskReply, now: i64) -> Vec<i64> {
    match reply {
        DeskReply::Granted { n, after_ms } if after_ms.is_empty() => vec![now; *n as usize],
        DeskReply::Granted { after_ms, .. } => after_ms.iter().map(|a| now + a).collect(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_batchs_chunk_goes_whole_to_an_unpaced_route_and_spaced_at_the_pace_to_a_paced_one() {
    let mut d = desk(Pace::default());
    let go = d.ask(40, facts(0, 0), 0);
    assert_eq!(spaced(&go.reply, 0), vec![0; 40], "all at once");
    assert_eq!(go.slots, 0, "an unpaced route keeps no slots");
    // 50 a second bursts 5: the 5 tokens there are at once, then one every 20 ms, the whole
    // chunk within PACED_SPREAD_MS, a slot each.
    let mut d = desk(paced(50, None));
    let go = d.ask(40, facts(0, 0), 1_000);
    let times = spaced(&go.reply, 1_000);
    assert_eq!(times.len(), 40);
    assert_eq!(go.slots, 40);
    assert_eq!(&times[..6], &[1_000, 1_000, 1_000, 1_000, 1_000, 1_020]);
    assert_eq!(times[39], 1_000 + 35 * 20);
    // Taken ahead, the tokens hold the rest back: the next batch waits its turn as one key,
    // and so does an effect.
    let wait = d.ask(40, facts(0, 40), 1_001);
    assert_eq!(wait.reply, DeskReply::Wait);
    assert!(wait.enqueue);
    assert_eq!(d.ask(1, facts(0, 0), 1_100).reply, DeskReply::Wait);
    // 10 a second: 40 results over 4 s, never more than 11 in any second.
    let mut d = desk(paced(10, None));
    let mut sent = Vec::new();
    let mut now = 0;
    while sent.len() < 120 {
        let ask = d.ask(40, facts(0, 0), now);
        if ask.reply != DeskReply::Wait {
            sent.extend(spaced(&ask.reply, now));
        }
        now += 250;
    }
    for start in &sent {
        let in_second = sent
            .iter()
            .filter(|t| **t >= *start && **t < start + 1_000)
            .count();
        assert!(in_second <= 11, "{in_second} in the second from {start}");
    }
    assert!(
        now <= 13_000,
        "120 results at 10 a second took {now} ms of asks"
    );
    // Concurrency bounds a chunk as it bounds effects.
    let mut d = desk(Pace {
        per_second: None,
        concurrency: Some(3),
    });
    let go = d.ask(40, facts(0, 1), 0);
    assert_eq!(spaced(&go.reply, 0), vec![0, 0]);
}

#[test]
fn a_batchs_chunk_waits_while_the_destination_is_open_or_others_wait() {
    let mut d = opened();
    assert!(d.ask(40, facts(0, 0), 10).enqueue);
    let mut d = desk(Pace::default());
    assert_eq!(d.ask(40, facts(2, 0), 10).reply, DeskReply::Wait);
}

#[test]
fn a_chunk_that_fails_whole_opens_the_destination_and_a_mixed_one_says_neither() {
    let mut d = desk(Pace::default());
    fail(&mut d, "job", 0);
    let mixed = d.report("b", chunk(40, 39, Some("503".into()), None), facts(0, 0), 0);
    assert_eq!(
        mixed.reply,
        DeskReply::OwnSchedule,
        "a mixed chunk says neither"
    );
    assert_eq!(d.failures_in_row, 1, "the job's run of failures stands");
    assert!(!d.is_open());
    let ok = d.report("b", chunk(40, 0, None, None), facts(0, 0), 0);
    assert_eq!(ok.reply, DeskReply::Noted);
    assert_eq!(d.failures_in_row, 0, "a chunk of answers ends the run");
    let whole = d.report("b", chunk(40, 40, Some("503".into()), None), facts(0, 0), 1);
    assert_eq!(whole.reply, DeskReply::Wait);
    assert!(whole.enqueue, "the batch waits for its release");
    assert!(d.is_open());
    assert_eq!(d.failures_in_row, 40);
    assert_eq!(d.alerts.len(), 1);
    // Two failures out of two (below the threshold of three) keep their own schedule.
    let mut d = desk(Pace::default());
    let two = d.report("b", chunk(2, 2, Some("503".into()), None), facts(0, 0), 0);
    assert_eq!(two.reply, DeskReply::OwnSchedule);
}

#[test]
fn a_batch_released_as_the_probe_closes_the_destination_with_one_answer() {
    let mut d = opened();
    let at = 2 + PROBE_FIRST_MS;
    assert_eq!(d.wake(facts(1, 0), at), Wake::Probe);
    d.released("b", true, at);
    let ok = d.report("b", chunk(1, 0, None, None), facts(0, 0), at + 10);
    assert_eq!(ok.reply, DeskReply::Noted);
    assert!(!d.is_open());
    assert!(d.probe.is_none());
}

#[test]
fn a_chunk_that_sent_nothing_frees_its_slots_and_says_nothing_of_health() {
    let mut d = opened();
    let at = 2 + PROBE_FIRST_MS;
    assert_eq!(d.wake(facts(1, 0), at), Wake::Probe);
    d.released("b", true, at);
    let none = d.report("b", chunk(0, 0, None, None), facts(0, 0), at + 10);
    assert!(d.is_open(), "an empty chunk does not close it");
    assert!(!none.enqueue, "it leaves the queue until it can send");
    assert!(d.probe.is_none(), "the probe is over, not failed");
    let mut d = desk(paced(5, None));
    let empty = d.report("b", chunk(0, 0, None, None), facts(1, 0), 10);
    assert_eq!(empty.reply, DeskReply::OwnSchedule);
    assert_eq!(
        empty.alarm_at_ms,
        Some(10),
        "its slots are free for what waits"
    );
}

fn by() -> Value {
    serde_json::json!({"scope": "admin", "fingerprint": "1a2b3c4d"})
}

#[test]
fn a_pause_holds_every_ask_and_report_in_its_place_and_releases_nothing() {
    let mut d = desk(Pace::default());
    assert!(d.pause(by(), "planned outage".into(), 100));
    assert!(
        !d.pause(by(), "again".into(), 200),
        "a pause already set stands"
    );
    assert_eq!(d.paused.as_ref().unwrap().reason, "planned outage");
    // A first attempt's check must ask; its ask is queued, with no alarm to release it.
    assert_eq!(d.check(), DeskReply::Checked { ask: true });
    let ask = d.ask(1, facts(0, 0), 300);
    assert_eq!(ask.reply, DeskReply::Paused);
    assert!(ask.enqueue);
    assert_eq!(ask.queue_at_ms, None, "in its place: when it became owed");
    assert_eq!(ask.alarm_at_ms, None);
    let chunk = d.ask(40, facts(1, 0), 301);
    assert_eq!(chunk.reply, DeskReply::Paused);
    assert!(chunk.enqueue);
    // Nothing is released however long it holds, and the alarm is not set for releases.
    for now in [400, 60_000, 86_400_000] {
        assert_eq!(d.wake(facts(50, 0), now), Wake::Idle);
        assert_eq!(d.next_alarm_ms(facts(50, 0), now), None);
    }
    assert_eq!(d.view(facts(50, 0)).state, "paused");
    assert_eq!(d.view(facts(50, 0)).paused.unwrap().by, by());
}

#[test]
fn a_pause_is_not_health_it_never_opens_closes_nor_alerts() {
    let mut d = desk(Pace::default());
    d.pause(by(), "planned outage".into(), 0);
    // Failures reported while paused (attempts in flight when it came) count for nothing.
    for (i, k) in ["a", "b", "c", "d", "e"].iter().enumerate() {
        let r = fail(&mut d, k, i as i64);
        assert_eq!(r.reply, DeskReply::Paused);
        assert!(r.enqueue, "the failed attempt waits for the resume");
    }
    let whole = d.report("b", chunk(40, 40, Some("503".into()), None), facts(5, 0), 9);
    assert_eq!(whole.reply, DeskReply::Paused);
    assert!(!d.is_open());
    assert_eq!(d.failures_in_row, 0);
    assert!(d.alerts.is_empty(), "no alert for a pause");
    // A success says nothing either: an open desk stays open through a pause.
    let mut d = opened();
    d.pause(by(), "planned outage".into(), 10);
    let ok = d.report("a", one(None, None), facts(3, 0), 11);
    assert_eq!(ok.reply, DeskReply::Paused);
    assert!(d.is_open());
    assert!(d.alerts.is_empty());
}

#[test]
fn a_resume_drains_what_waited_soonest_first_and_an_open_desk_probes_again() {
    let mut d = desk(Pace::default());
    d.pause(by(), "planned outage".into(), 0);
    d.ask(1, facts(0, 0), 1);
    assert!(d.resume());
    assert!(!d.resume(), "resuming twice changes nothing");
    assert_eq!(d.check(), DeskReply::Checked { ask: false });
    assert_eq!(d.next_alarm_ms(facts(50, 0), 1_000), Some(1_010));
    assert_eq!(d.wake(facts(50, 0), 1_000), Wake::Drain(50));
    assert!(d.alerts.is_empty(), "no alert for a resume");
    // Open before the pause: open after it, and probed on its backoff.
    let mut d = opened();
    d.pause(by(), "x".into(), 10);
    assert_eq!(d.wake(facts(3, 0), 100_000), Wake::Idle);
    d.resume();
    assert_eq!(d.wake(facts(3, 0), 100_000), Wake::Probe);
}

#[test]
fn a_pause_survives_the_desks_restart() {
    let mut d = desk(Pace::default());
    d.pause(by(), "planned outage".into(), 5);
    let stored = serde_json::to_string(&d).unwrap();
    let loaded: Desk = serde_json::from_str(&stored).unwrap();
    assert_eq!(loaded, d);
    assert_eq!(loaded.paused.unwrap().at_ms, 5);
    // A desk stored before pauses existed loads unpaused.
    let old = serde_json::to_value(desk(Pace::default())).unwrap();
    assert!(old.get("paused").is_none());
    assert_eq!(serde_json::from_value::<Desk>(old).unwrap().paused, None);
}

/// A queue the way the desk object keeps it (`waiting(key, due_ms)`, released soonest due
/// first, a key placed by [`Desk::queue_place`]), driven by the desk's decisions: which keys
/// its probes release.
struct Queue {
    waiting: Vec<(String, i64)>,
}

impl Queue {
    fn soonest(&mut self) -> String {
        self.waiting.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
        self.waiting.remove(0).0
    }

    fn apply(&mut self, d: &Desk, key: &str, due_ms: i64, decision: &Decision, now: i64) {
        let waiting = self.waiting.iter().find(|(k, _)| k == key).map(|w| w.1);
        if let Some(at) = d.queue_place(key, waiting, due_ms, decision, now) {
            self.waiting.retain(|(k, _)| k != key);
            self.waiting.push((key.to_string(), at));
        }
    }

    fn facts(&self) -> Facts {
        facts(self.waiting.len() as u64, 0)
    }
}

#[test]
fn a_probe_rotates_so_four_throttled_keys_do_not_hold_ten_good_ones() {
    // The case: 4 keys the destination keeps answering 429 (Retry-After: 4 s),
    // owed first, then 10 it would accept; the desk is open.
    let mut d = opened();
    let mut q = Queue {
        waiting: (0..4)
            .map(|i| (format!("throttled-{i}"), i))
            .chain((0..10).map(|i| (format!("good-{i}"), 100 + i)))
            .collect(),
    };
    let owed: std::collections::HashMap<String, i64> = q.waiting.iter().cloned().collect();
    let throttled = |k: &str| k.starts_with("throttled");
    let (mut now, mut probes) = (1_000, Vec::new());
    while d.is_open() && now < 600_000 {
        if d.wake(q.facts(), now) == Wake::Probe {
            let key = q.soonest();
            d.released(&key, true, now);
            let report = match throttled(&key) {
                true => d.report(
                    &key,
                    one(Some("429".into()), Some(4_000)),
                    q.facts(),
                    now + 50,
                ),
                false => d.report(&key, one(None, None), q.facts(), now + 50),
            };
            // The gate reports the time its effect became owed (long before now).
            let owed_ms = owed[&key];
            q.apply(&d, &key, owed_ms, &report, now + 50);
            probes.push(key);
        }
        now += 100;
    }
    assert!(
        !d.is_open(),
        "a good key was probed and closed it: {probes:?}"
    );
    assert_eq!(
        probes.len(),
        5,
        "each throttled key once, then a good one: {probes:?}"
    );
    for pair in probes.windows(2) {
        assert_ne!(pair[0], pair[1], "no key is probed twice in a row");
    }
    assert!(probes[..4].iter().all(|k| throttled(k)));
    assert!(!throttled(&probes[4]));
    // The drain then releases every other key, the good ones with them.
    assert_eq!(d.wake(q.facts(), now), Wake::Drain(13));
}

#[test]
fn a_throttled_key_goes_behind_every_key_that_waited_before_it() {
    let mut d = opened();
    let at = 2 + PROBE_FIRST_MS;
    assert_eq!(d.wake(facts(3, 0), at), Wake::Probe);
    d.released("a", true, at);
    let failed = d.report(
        "a",
        one(Some("429".into()), Some(4_000)),
        facts(2, 0),
        at + 10,
    );
    assert!(failed.enqueue);
    assert_eq!(
        failed.queue_at_ms,
        Some(at + 10),
        "due at the failure, not when owed"
    );
    // An attempt's failure that is not the probe (a lapsed probe's late report, an attempt in
    // flight when it opened) goes behind too.
    let other = fail(&mut d, "b", at + 20);
    assert!(other.enqueue);
    assert_eq!(other.queue_at_ms, Some(at + 20));
    // A probe whose chunk was mixed goes behind too, and the probe is over.
    assert_eq!(d.wake(facts(3, 0), d.next_probe_ms), Wake::Probe);
    d.released("c", true, d.next_probe_ms);
    let mixed = d.report(
        "c",
        chunk(4, 2, Some("429".into()), None),
        facts(2, 0),
        d.next_probe_ms,
    );
    assert!(mixed.enqueue);
    assert!(mixed.queue_at_ms.is_some());
    assert!(d.probe.is_none());
}

#[test]
fn a_key_that_cannot_send_leaves_the_queue_and_the_next_is_probed_at_once() {
    let mut d = opened();
    let at = 2 + PROBE_FIRST_MS;
    assert_eq!(d.wake(facts(3, 0), at), Wake::Probe);
    d.released("batch", true, at);
    let wait_before = d.probe_wait_ms;
    // Its release found nothing to send (its results file missing, a download refused).
    let none = d.report("batch", chunk(0, 0, None, None), facts(2, 0), at + 10);
    assert_eq!(
        none.reply,
        DeskReply::OwnSchedule,
        "its own schedule: it asks again when it can"
    );
    assert!(!none.enqueue, "it leaves the queue");
    assert_eq!(none.alarm_at_ms, Some(at + 10));
    assert!(d.probe.is_none());
    assert_eq!(
        d.probe_wait_ms, wait_before,
        "not a failed probe: no longer backoff"
    );
    assert_eq!(
        d.wake(facts(2, 0), at + 10),
        Wake::Probe,
        "the next key, at once"
    );
    // Keys that cannot send do not keep a recovered destination open: each leaves, and the
    // first key that can send closes it.
    d.released("batch-2", true, at + 10);
    d.report("batch-2", chunk(0, 0, None, None), facts(1, 0), at + 20);
    assert_eq!(d.wake(facts(1, 0), at + 20), Wake::Probe);
    d.released("effect", true, at + 20);
    d.report("effect", one(None, None), facts(0, 0), at + 30);
    assert!(!d.is_open());
    // Paused, a key that cannot send leaves the queue too (it asks again when it can).
    let mut d = desk(Pace::default());
    d.pause(by(), "x".into(), 0);
    assert!(
        !d.report("b", chunk(0, 0, None, None), facts(0, 0), 1)
            .enqueue
    );
}

#[test]
fn a_key_keeps_its_place_behind_when_its_gate_asks_again() {
    let mut d = opened();
    let failed = Decision {
        enqueue: true,
        queue_at_ms: Some(500),
        ..Decision::reply(DeskReply::Wait)
    };
    let ask = Decision {
        enqueue: true,
        ..Decision::reply(DeskReply::Wait)
    };
    // First queued when it became owed; a failure while open moves it behind.
    assert_eq!(d.queue_place("k", None, 10, &ask, 400), Some(10));
    assert_eq!(d.queue_place("k", Some(10), 10, &failed, 500), Some(500));
    // Its gate's next ask (the fallback, a pass's retry) says "owed at 10": it stays behind.
    assert_eq!(d.queue_place("k", Some(500), 10, &ask, 600), Some(500));
    // Released (out of the queue), it asks again: back in at when it became owed.
    assert_eq!(d.queue_place("k", None, 10, &ask, 700), Some(10));
    let go = Decision::reply(go());
    assert_eq!(d.queue_place("k", Some(10), 10, &go, 700), None);
    // Out as the probe, its ask (its release and its fallback crossed) goes behind: the
    // probe's report says how it went.
    d.released("k", true, 800);
    assert_eq!(d.queue_place("k", None, 10, &ask, 900), Some(900));
    assert_eq!(d.queue_place("other", None, 20, &ask, 900), Some(20));
}

#[test]
fn a_key_that_keeps_failing_is_not_probed_again_while_its_gate_asks_between_probes() {
    // The chaos run's strand: the soonest owed key times out at every probe, and between two
    // probes its gate asks again (its fallback, EFFECT_RETRY_MAX_SECONDS, shorter than the
    // probes' backoff), saying when it became owed. The keys behind it must still be probed,
    // and the first that succeeds closes the destination.
    let mut d = opened();
    let mut q = Queue {
        waiting: (0..5).map(|i| (format!("k-{i}"), i)).collect(),
    };
    let owed: std::collections::HashMap<String, i64> = q.waiting.iter().cloned().collect();
    let (mut now, mut probes) = (1_000, Vec::new());
    while d.is_open() && now < 600_000 {
        if d.wake(q.facts(), now) == Wake::Probe {
            let key = q.soonest();
            d.released(&key, true, now);
            let report = match key.as_str() {
                "k-0" => d.report(&key, one(Some("timeout".into()), None), q.facts(), now + 50),
                _ => d.report(&key, one(None, None), q.facts(), now + 50),
            };
            q.apply(&d, &key, owed[&key], &report, now + 50);
            probes.push(key.clone());
            // Its gate's fallback asks again before the next probe.
            let ask = d.ask(1, q.facts(), now + 100);
            if key == "k-0" {
                q.apply(&d, &key, owed[&key], &ask, now + 100);
            }
        }
        now += 100;
    }
    assert_eq!(
        probes,
        ["k-0", "k-1"],
        "the failing key once, then the next closed it"
    );
    assert!(!d.is_open());
}

#[test]
fn a_mixed_chunk_ends_a_probe_while_open_and_leaves_a_closed_desk_as_it_stands() {
    // Open: the probe's mixed chunk is over, and its key goes behind the rest.
    let mut d = opened();
    d.released("b", true, 10);
    d.report("b", chunk(3, 1, Some("503".into()), None), facts(2, 0), 20);
    assert!(d.probe.is_none());
    // Closed (a probe released while a success closed it): the report changes nothing of it.
    let mut d = desk(Pace::default());
    d.released("b", true, 10);
    let decision = d.report("b", chunk(3, 1, Some("503".into()), None), facts(2, 0), 20);
    assert_eq!(d.probe.as_ref().map(|p| p.key.as_str()), Some("b"));
    assert!(!decision.enqueue);
}
