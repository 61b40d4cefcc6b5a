//! The pass decision by decision: a scripted world answers its intents (the lease, KV, the
//! status API, the gates), and each test checks one row of what the pass decides.

use serde_json::{json, Value};

use super::fanout::{JobEntry, JOB_MAX_AGE_MS};
use super::stop::{Stop, UNANSWERED_BACKOFF_MS};
use super::*;
use crate::operation::alert::AlertKind;
use crate::operation::gate::protocol::{EffectReport, GateCommand, GateReply};
use crate::operation::ledger::{LedgerMeta, OpenCounts};
use crate::operation::lifecycle::{DropReason, Source, Status};
use crate::reconciliation::lease_protocol::{LeaseCommand, LeaseReply};
use crate::reconciliation::lease_state::{Audit, AuditProgress, MAX_INDEX_PAGES};
use crate::reconciliation::status::{StatusAnswer, READ};
use crate::retry::PeerAnswer;
use crate::skim::skim;

/// The clock at the start of each pass (ms); entries were submitted at 1,000 s.
const NOW: i64 = 10_000_000;

fn limits() -> Limits {
    Limits {
        budget: 100,
        deadline_ms: 60_000,
        lease_ttl_ms: 60_000,
        audit_interval_ms: 86_400_000,
        thresholds: Thresholds {
            grace_secs: 0,
            stuck_after_secs: 1_000_000,
            effect_alert_after_secs: 1_000_000,
        },
        webhook_name: None,
        webhook_auto_enable: true,
        api_base: "http://gemini".into(),
        unregistered_hold_ms: 0,
        fanout: None,
        poll_rate: 1_000,
    }
}

/// The audit's state when it is not due: one completed at the start of the pass.
fn audit_not_due() -> Audit {
    Audit {
        resume: None,
        last_completed_ms: NOW,
        completed: 1,
    }
}

fn granted(resume: LedgerCursor) -> LeaseReply {
    LeaseReply::Granted {
        resume,
        status_backoff_until_ms: 0,
        webhook_alerted_state: None,
        audit: audit_not_due(),
        fed_until_ms: 0,
    }
}

fn meta_for(key: &str, status: &str) -> LedgerMeta {
    let mut m = LedgerMeta::sample(status);
    m.name = key.to_string();
    m
}

fn entry(prefix: &str, key: &str, m: &LedgerMeta) -> ListedKey {
    ListedKey {
        name: format!("{prefix}{key}"),
        metadata: Some(serde_json::to_value(m).unwrap()),
    }
}

/// An `open:` entry of a pending operation (polled: the grace is zero).
fn open(key: &str) -> ListedKey {
    entry("open:", key, &meta_for(key, "pending"))
}

fn at(after: &str) -> LedgerCursor {
    LedgerCursor {
        cursor: None,
        after_key: Some(after.into()),
    }
}

/// A 200 from the status API saying the batch is in `state`.
fn batch(state: &str) -> StatusAnswer {
    let body = json!({"name": "batches/x", "metadata": {"state": state, "updateTime": "2026-11-22T10:00:00Z"}});
    StatusAnswer::Http {
        status: 200,
        retry_after: None,
        body: Some(skim(READ, body.to_string().as_bytes())),
    }
}

fn http(status: u16, retry_after: Option<&str>) -> StatusAnswer {
    StatusAnswer::Http {
        status,
        retry_after: retry_after.map(str::to_string),
        body: None,
    }
}

fn webhooks(state: &str) -> PeerAnswer {
    PeerAnswer::Http {
        status: 200,
        body: json!({"webhooks": [{"name": "webhooks/w", "state": state}]}).to_string(),
        retry_after: None,
    }
}

type Gate = Box<dyn FnMut(&str, &GateCommand) -> Result<GateReply, String>>;
/// The heartbeat's turn: the pass, how many intents came before, the clock.
type Beat = Box<dyn FnMut(&mut Pass, usize, i64)>;

/// The gates as they usually answer.
fn usual_gate(_: &str, command: &GateCommand) -> Result<GateReply, String> {
    Ok(match command {
        GateCommand::Deliver { event, .. } => GateReply::Applied {
            status: event.status.clone(),
            effect: EffectReport::Scheduled,
        },
        GateCommand::Alert { .. } | GateCommand::StatusUnusable { .. } => {
            GateReply::AlertSent { sent: true }
        }
        GateCommand::RetryEffect => GateReply::Effect {
            effect: EffectReport::Scheduled,
        },
        GateCommand::Reindex => GateReply::Reindexed { changed: true },
        _ => GateReply::NotFound,
    })
}

/// What answers the pass's intents.
struct World {
    now: i64,
    /// How far the clock moves for each intent answered.
    tick_ms: i64,
    grant: Result<LeaseReply, String>,
    index: Vec<ListedKey>,
    ledger: Vec<ListedKey>,
    page_size: usize,
    /// KV refuses an index list that starts from a saved cursor.
    refuse_cursor: bool,
    status: Box<dyn FnMut(&str) -> StatusAnswer>,
    gate: Gate,
    webhooks: Vec<PeerAnswer>,
    /// How the WebhookService answers the call enabling the webhook again.
    enable: PeerAnswer,
    alert_sent: bool,
    release: Result<LeaseReply, String>,
    /// Runs before each intent is answered, with how many came before: the heartbeat's turn.
    beat: Beat,
    /// How the fan-out queue answers a send.
    queue: Result<(), String>,
    /// How the lease answers a consumer's report of its wait.
    backoff: Result<LeaseReply, String>,
}

impl Default for World {
    fn default() -> World {
        World {
            now: NOW,
            tick_ms: 0,
            grant: Ok(granted(LedgerCursor::default())),
            index: Vec::new(),
            ledger: Vec::new(),
            page_size: 1_000,
            refuse_cursor: false,
            status: Box::new(|_| batch("BATCH_STATE_PENDING")),
            gate: Box::new(usual_gate),
            webhooks: Vec::new(),
            enable: PeerAnswer::Http {
                status: 200,
                body: json!({"id": "w", "state": "enabled"}).to_string(),
                retry_after: None,
            },
            alert_sent: true,
            release: Ok(LeaseReply::Released { accepted: true }),
            beat: Box::new(|_, _, _| {}),
            queue: Ok(()),
            backoff: Ok(LeaseReply::BackedOff),
        }
    }
}

impl World {
    fn list(&self, prefix: &str, cursor: Option<String>) -> Result<ListedPage, String> {
        let keys = if prefix == "open:" {
            &self.index
        } else {
            &self.ledger
        };
        if self.refuse_cursor && prefix == "open:" && cursor.is_some() {
            return Err("bad cursor".into());
        }
        let start: usize = cursor.map_or(0, |c| c.parse().unwrap());
        let end = (start + self.page_size).min(keys.len());
        Ok(ListedPage {
            keys: keys[start..end].to_vec(),
            cursor: (end < keys.len()).then(|| end.to_string()),
            list_complete: end >= keys.len(),
        })
    }
}

#[derive(Default)]
struct Outcome {
    intents: Vec<Intent>,
    logs: Vec<Value>,
    report: PassReport,
    /// A consumer left its message to the queue's retries.
    retry: bool,
}

impl Outcome {
    fn polls(&self) -> Vec<&str> {
        self.intents
            .iter()
            .filter_map(|i| match i {
                Intent::Poll { key, .. } => Some(key.as_str()),
                _ => None,
            })
            .collect()
    }

    fn gate_calls(&self) -> Vec<(&str, &GateCommand)> {
        self.intents
            .iter()
            .filter_map(|i| match i {
                Intent::CallGate { key, command } => Some((key.as_str(), command)),
                _ => None,
            })
            .collect()
    }

    fn lists(&self) -> Vec<(&str, Option<&str>)> {
        self.intents
            .iter()
            .filter_map(|i| match i {
                Intent::List { prefix, cursor } => Some((*prefix, cursor.as_deref())),
                _ => None,
            })
            .collect()
    }

    fn release(&self) -> Option<&LeaseCommand> {
        self.intents.iter().find_map(|i| match i {
            Intent::Lease(r @ LeaseCommand::Release { .. }) => Some(r),
            _ => None,
        })
    }

    /// Where the release says the next pass starts.
    fn resume(&self) -> LedgerCursor {
        match self.release() {
            Some(LeaseCommand::Release { resume, .. }) => resume.clone(),
            other => panic!("no release: {other:?}"),
        }
    }

    /// Where a consumer waited for its slots.
    fn sleeps(&self) -> Vec<i64> {
        self.intents
            .iter()
            .filter_map(|i| match i {
                Intent::Sleep { until_ms } => Some(*until_ms),
                _ => None,
            })
            .collect()
    }

    /// A consumer's report to the lease: the wait, and where the slots it sends back end.
    fn backoffs(&self) -> Vec<(i64, i64)> {
        self.intents
            .iter()
            .filter_map(|i| match i {
                Intent::Lease(LeaseCommand::Backoff {
                    until_ms,
                    fed_until_ms,
                }) => Some((*until_ms, *fed_until_ms)),
                _ => None,
            })
            .collect()
    }

    /// Where in the intents the first one `pick` matches came.
    fn position(&self, pick: fn(&Intent) -> bool) -> Option<usize> {
        self.intents.iter().position(pick)
    }

    /// Each `sendBatch` to the fan-out queue, as sent.
    fn sends(&self) -> Vec<&Vec<QueuedJob>> {
        self.intents
            .iter()
            .filter_map(|i| match i {
                Intent::Enqueue { jobs } => Some(jobs),
                _ => None,
            })
            .collect()
    }

    /// The messages sent to the fan-out queue, read back.
    fn queued(&self) -> Vec<(PollJob, u32)> {
        self.sends()
            .into_iter()
            .flatten()
            .map(|q| (PollJob::from_body(&q.body).unwrap(), q.delay_secs))
            .collect()
    }

    fn events(&self, name: &str) -> Vec<&Value> {
        self.logs.iter().filter(|l| l["event"] == name).collect()
    }
}

fn run(limits: Limits, w: World) -> Outcome {
    let pass = Pass::new(limits, "pass-1".into(), w.now);
    drive(pass, w)
}

/// A machine the tests drive: the line it ends with, what it reports, and the heartbeat's
/// turn (a pass's only).
trait Driven: Machine {
    const LINE: &'static str;
    fn ended(&self) -> (PassReport, bool);
    fn beat(&mut self, _beat: &mut Beat, _n: usize, _now: i64) {}
}

impl Driven for Pass {
    const LINE: &'static str = "reconcile_pass";
    fn ended(&self) -> (PassReport, bool) {
        (self.report().clone(), false)
    }
    fn beat(&mut self, beat: &mut Beat, n: usize, now: i64) {
        beat(self, n, now)
    }
}

impl Driven for Consumer {
    const LINE: &'static str = "reconcile_job";
    fn ended(&self) -> (PassReport, bool) {
        (self.report().clone(), self.retry())
    }
}

fn drive<M: Driven>(mut m: M, mut w: World) -> Outcome {
    let mut out = Outcome::default();
    for n in 0..100_000 {
        let intent = m.next(w.now);
        out.logs
            .extend(m.drain_logs().iter().map(PassLog::to_value));
        out.intents.push(intent.clone());
        m.beat(&mut w.beat, n, w.now);
        w.now += w.tick_ms;
        let performed = match intent {
            Intent::Done => break,
            Intent::Lease(LeaseCommand::Acquire { .. }) => Performed::Lease(w.grant.clone()),
            Intent::Lease(LeaseCommand::Backoff { .. }) => Performed::Lease(w.backoff.clone()),
            Intent::Lease(_) => Performed::Lease(w.release.clone()),
            Intent::ListWebhooks { .. } => Performed::WebhookPage(w.webhooks.remove(0)),
            Intent::EnableWebhook { .. } => Performed::WebhookEnabled(w.enable.clone()),
            Intent::PostAlert(_) => Performed::AlertPosted(w.alert_sent),
            Intent::List { prefix, cursor } => Performed::Listed(w.list(prefix, cursor)),
            Intent::Poll { key, .. } => Performed::Status((w.status)(&key)),
            Intent::CallGate { key, command } => Performed::Gate((w.gate)(&key, &command)),
            Intent::DeleteIndex { .. } => Performed::IndexDeleted(Ok(())),
            Intent::Enqueue { .. } => Performed::Enqueued(w.queue.clone()),
            Intent::Sleep { until_ms } => {
                w.now = w.now.max(until_ms);
                Performed::Slept
            }
        };
        m.answer(performed, w.now);
        out.logs
            .extend(m.drain_logs().iter().map(PassLog::to_value));
    }
    (out.report, out.retry) = m.ended();
    // Every intent but a sleep and the end is a call that leaves the Worker, as is each of
    // the heartbeat's renewals: each is counted against the budget.
    let calls = out
        .intents
        .iter()
        .filter(|i| !matches!(i, Intent::Sleep { .. } | Intent::Done));
    let calls = calls.count() as u64 + out.report.lease_renewals;
    assert_eq!(
        u64::from(out.report.subrequests),
        calls,
        "{:?}",
        out.intents
    );
    let line = out.logs.last().expect("the pass's line");
    assert_eq!(line["event"], M::LINE, "the line comes last");
    let mut report = out.report.to_value();
    report["event"] = M::LINE.into();
    assert_eq!(*line, report);
    out
}

fn keys(n: usize) -> Vec<ListedKey> {
    (0..n).map(|i| open(&format!("batches/k{i}"))).collect()
}

// --- The lease ---

#[test]
fn a_pass_takes_the_lease_first_and_an_empty_index_costs_three_subrequests() {
    let out = run(limits(), World::default());
    assert!(matches!(
        &out.intents[0],
        Intent::Lease(LeaseCommand::Acquire { holder, ttl_ms: 60_000 }) if holder == "pass-1"
    ));
    assert_eq!(out.lists(), vec![("open:", None)]);
    assert_eq!(
        out.report.subrequests, 3,
        "lease, one index list page, release"
    );
    assert_eq!(out.report.stopped, Some(Stop::Complete));
    assert!(out.report.complete);
    let Some(LeaseCommand::Release {
        complete, summary, ..
    }) = out.release()
    else {
        panic!("released")
    };
    assert!(complete);
    assert_eq!(summary["report"]["event"], "reconcile_pass");
    assert_eq!(summary["report"]["subrequests"], 3);
    assert_eq!(summary["at"], crate::timestamp::format_rfc3339(NOW));
}

#[test]
fn a_busy_lease_does_nothing_and_says_so() {
    let out = run(
        limits(),
        World {
            grant: Ok(LeaseReply::Busy),
            index: keys(3),
            ..World::default()
        },
    );
    assert_eq!(out.intents.len(), 2, "{:?}", out.intents);
    assert!(out.report.skipped_busy);
    assert_eq!(out.report.stopped, None);
    assert_eq!(out.report.subrequests, 1);
}

#[test]
fn a_lease_call_that_fails_is_an_error_and_the_end() {
    let out = run(
        limits(),
        World {
            grant: Err("object answered 500".into()),
            ..World::default()
        },
    );
    assert_eq!(out.report.errors, 1);
    assert_eq!(
        out.events("reconcile_error")[0]["error"],
        "lease: object answered 500"
    );
    assert!(out.release().is_none());
}

#[test]
fn a_refused_renewal_stops_the_pass_and_saves_nothing() {
    let out = run(
        limits(),
        World {
            index: keys(5),
            beat: Box::new(|pass, n, now| {
                // While the second entry's poll is out: a renewal, refused.
                if n == 3 {
                    assert!(pass.on_heartbeat().is_some());
                    assert!(!pass.on_renewed(Ok(LeaseReply::Renewed { accepted: false }), now));
                }
            }),
            ..World::default()
        },
    );
    assert_eq!(
        out.polls().len(),
        2,
        "the entry in hand finished, no other started"
    );
    assert!(
        out.release().is_none(),
        "no release: the cursor is the new holder's"
    );
    assert_eq!(out.report.stopped, Some(Stop::LeaseLost));
    assert_eq!(out.events("reconcile_lease_lost")[0]["holder"], "pass-1");
    assert_eq!(out.report.lease_renewals, 1);
}

#[test]
fn renewals_that_fail_for_a_whole_ttl_stop_the_walk_and_still_release() {
    let out = run(
        Limits {
            lease_ttl_ms: 1_000,
            ..limits()
        },
        World {
            index: keys(5),
            tick_ms: 300,
            beat: Box::new(|pass, n, now| {
                if n >= 2 && pass.on_heartbeat().is_some() {
                    pass.on_renewed(Err("timeout".into()), now);
                }
            }),
            ..World::default()
        },
    );
    assert_eq!(out.report.stopped, Some(Stop::LeaseLapsed));
    assert!(
        out.release().is_some(),
        "the release is fenced: it is still tried"
    );
    assert!(out.report.errors >= 3, "every failed renewal counts");
    assert!(out.polls().len() < 5);
}

#[test]
fn renewals_carry_where_the_walk_has_got() {
    let saved = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let sink = saved.clone();
    run(
        limits(),
        World {
            index: keys(3),
            beat: Box::new(move |pass, _, now| {
                if let Some(LeaseCommand::Renew { resume, .. }) = pass.on_heartbeat() {
                    sink.borrow_mut().push(resume);
                    pass.on_renewed(Ok(LeaseReply::Renewed { accepted: true }), now);
                }
            }),
            ..World::default()
        },
    );
    let renewals = saved.borrow();
    assert_eq!(renewals.first(), Some(&LedgerCursor::default()));
    assert!(renewals.contains(&at("open:batches/k0")));
    assert!(renewals.contains(&at("open:batches/k2")));
}

#[test]
fn the_heartbeat_stops_the_walk_when_no_budget_is_left_for_a_renewal_and_the_release() {
    let out = run(
        Limits {
            budget: 6,
            ..limits()
        },
        World {
            index: keys(5),
            beat: Box::new(|pass, _, now| {
                if pass.on_heartbeat().is_some() {
                    pass.on_renewed(Ok(LeaseReply::Renewed { accepted: true }), now);
                }
            }),
            ..World::default()
        },
    );
    assert_eq!(out.report.stopped, Some(Stop::Budget));
    assert!(out.report.subrequests <= 6, "{:?}", out.report);
    assert!(out.release().is_some());
}

// --- Where the walk starts and stops ---

#[test]
fn a_cursor_saved_before_the_index_existed_lists_the_index_from_its_start() {
    let out = run(
        limits(),
        World {
            grant: Ok(granted(LedgerCursor {
                cursor: Some("1".into()),
                after_key: Some("op:batches/k1".into()),
            })),
            index: keys(3),
            ..World::default()
        },
    );
    assert_eq!(out.lists(), vec![("open:", None)]);
    assert_eq!(out.polls().len(), 3, "every entry, none skipped as done");
}

#[test]
fn a_cursor_kv_refuses_lists_the_index_again_from_its_start() {
    let out = run(
        limits(),
        World {
            grant: Ok(granted(LedgerCursor {
                cursor: Some("1".into()),
                after_key: Some("open:batches/k0".into()),
            })),
            index: keys(3),
            refuse_cursor: true,
            ..World::default()
        },
    );
    assert_eq!(out.lists(), vec![("open:", Some("1")), ("open:", None)]);
    assert_eq!(
        out.events("reconcile_cursor_reset")[0]["error"],
        "bad cursor"
    );
    assert_eq!(out.report.errors, 0);
    assert_eq!(
        out.polls(),
        vec!["batches/k1", "batches/k2"],
        "still after the last done"
    );
}

#[test]
fn the_walk_resumes_after_the_last_entry_done() {
    let out = run(
        limits(),
        World {
            grant: Ok(granted(at("open:batches/k1"))),
            index: keys(4),
            ..World::default()
        },
    );
    assert_eq!(out.polls(), vec!["batches/k2", "batches/k3"]);
    assert_eq!(out.report.index_listed, 4, "the whole index is listed");
    assert_eq!(out.report.visited, 2);
    assert_eq!(
        out.resume(),
        LedgerCursor::default(),
        "complete: the next starts over"
    );
}

#[test]
fn the_walk_starts_no_entry_it_cannot_pay_for_and_keeps_one_for_the_release() {
    let out = run(
        Limits {
            budget: 7,
            ..limits()
        },
        World {
            index: keys(5),
            ..World::default()
        },
    );
    // Lease and list spend 2; each poll is paid for as 2 (the gate may follow) but spends 1
    // here: after three, 5 + 2 would leave nothing for the release.
    assert_eq!(out.polls(), vec!["batches/k0", "batches/k1", "batches/k2"]);
    assert_eq!(out.report.stopped, Some(Stop::Budget));
    assert_eq!(out.resume(), at("open:batches/k2"));
    assert_eq!(out.report.subrequests, 6);
}

#[test]
fn the_walk_starts_no_entry_past_its_deadline() {
    let out = run(
        Limits {
            deadline_ms: 2_000,
            ..limits()
        },
        World {
            index: keys(5),
            tick_ms: 500,
            ..World::default()
        },
    );
    // Acquire and list take 1 s; each poll half a second more.
    assert_eq!(out.polls(), vec!["batches/k0", "batches/k1"]);
    assert_eq!(out.report.stopped, Some(Stop::Deadline));
    assert!(!out.report.complete);
    assert_eq!(out.resume(), at("open:batches/k1"));
}

#[test]
fn an_index_larger_than_a_window_is_walked_one_window_per_pass() {
    let out = run(
        Limits {
            budget: 1_000,
            ..limits()
        },
        World {
            index: keys(MAX_INDEX_PAGES as usize + 2),
            page_size: 1,
            ..World::default()
        },
    );
    assert_eq!(out.report.index_kv_lists, u64::from(MAX_INDEX_PAGES));
    assert_eq!(out.report.stopped, Some(Stop::Window));
    assert_eq!(
        out.resume(),
        LedgerCursor {
            cursor: Some(MAX_INDEX_PAGES.to_string()),
            after_key: None
        }
    );
}

#[test]
fn unreadable_index_metadata_is_an_error_and_skipped() {
    let mut index = keys(2);
    index.insert(
        0,
        ListedKey {
            name: "open:batches/bad".into(),
            metadata: Some(json!({"nonsense": true})),
        },
    );
    let out = run(
        limits(),
        World {
            index,
            ..World::default()
        },
    );
    assert_eq!(out.report.errors, 1);
    assert_eq!(out.events("reconcile_error")[0]["key"], "batches/bad");
    assert_eq!(out.polls(), vec!["batches/k0", "batches/k1"]);
}

// --- What a status answer leads to ---

#[test]
fn an_answer_the_ledger_already_shows_costs_no_gate_call() {
    let out = run(
        limits(),
        World {
            index: keys(1),
            ..World::default()
        },
    );
    assert_eq!(out.polls().len(), 1);
    assert!(out.gate_calls().is_empty());
    assert_eq!(out.report.subrequests, 4, "lease, list, status, release");
}

#[test]
fn a_changed_status_goes_to_the_gate_and_a_terminal_one_counts_as_settled() {
    let out = run(
        limits(),
        World {
            index: keys(2),
            status: Box::new(|key| {
                batch(if key == "batches/k0" {
                    "BATCH_STATE_RUNNING"
                } else {
                    "BATCH_STATE_SUCCEEDED"
                })
            }),
            ..World::default()
        },
    );
    let calls = out.gate_calls();
    assert_eq!(calls.len(), 2);
    let GateCommand::Deliver {
        key,
        name,
        event,
        require_registration,
        ..
    } = calls[1].1
    else {
        panic!("{calls:?}")
    };
    assert_eq!((key.as_str(), name.as_str()), ("batches/k1", "batches/k1"));
    assert_eq!(event.status, Status::Succeeded);
    assert_eq!(event.source, Source::Reconcile);
    assert!(!require_registration);
    assert_eq!(out.report.settled, 1, "running is not settled");
    assert_eq!(out.events("settled_by_reconcile")[0]["status"], "succeeded");
}

#[test]
fn an_index_entry_whose_gate_holds_no_record_is_deleted_after_its_poll() {
    // A delete lost before the gate's storage ended: the gate creates nothing from the poll
    // (a video's answer carries no time), and the entry is deleted so it is not polled again.
    let out = run(
        limits(),
        World {
            index: keys(2),
            status: Box::new(|_| batch("BATCH_STATE_SUCCEEDED")),
            gate: Box::new(|key, _| {
                Ok(if key == "batches/k0" {
                    GateReply::Unregistered
                } else {
                    GateReply::Applied {
                        status: Status::Succeeded,
                        effect: EffectReport::Scheduled,
                    }
                })
            }),
            ..World::default()
        },
    );
    let deleted: Vec<&Intent> = out
        .intents
        .iter()
        .filter(|i| matches!(i, Intent::DeleteIndex { .. }))
        .collect();
    assert_eq!(
        deleted,
        vec![&Intent::DeleteIndex {
            key: "batches/k0".into()
        }]
    );
    assert_eq!(out.report.settled, 1);
    assert_eq!(out.report.reindexed, 1);
    assert_eq!(out.events("index_stale")[0]["key"], "batches/k0");
}

#[test]
fn a_404_asks_for_unknown_to_gemini_unless_the_ledger_shows_it_raised() {
    let mut raised = meta_for("batches/r", "pending");
    raised.alerts = vec![AlertKind::UnknownToGemini];
    let out = run(
        limits(),
        World {
            index: vec![open("batches/n"), entry("open:", "batches/r", &raised)],
            status: Box::new(|_| http(404, None)),
            ..World::default()
        },
    );
    assert_eq!(out.polls().len(), 2);
    assert_eq!(
        out.gate_calls(),
        vec![(
            "batches/n",
            &GateCommand::Alert {
                alert: AlertKind::UnknownToGemini,
                age_seconds: NOW / 1_000 - 1_000,
                effect_alert_after_ms: 0,
            }
        )]
    );
    assert_eq!(out.report.alerts, 1);
    assert_eq!(out.events("status_not_found").len(), 2);
}

#[test]
fn a_malformed_answer_asks_for_status_unusable_once() {
    let mut raised = meta_for("batches/r", "pending");
    raised.alerts = vec![AlertKind::StatusUnusable];
    let out = run(
        limits(),
        World {
            index: vec![open("batches/n"), entry("open:", "batches/r", &raised)],
            status: Box::new(|_| StatusAnswer::Http {
                status: 200,
                retry_after: None,
                body: Some(skim(READ, b"{\"name\": \"x\"}")),
            }),
            ..World::default()
        },
    );
    let calls = out.gate_calls();
    assert_eq!(calls.len(), 1);
    assert!(matches!(
        calls[0],
        ("batches/n", GateCommand::StatusUnusable { .. })
    ));
    assert_eq!(out.report.errors, 2);
    assert_eq!(out.events("status_unusable").len(), 2);
}

#[test]
fn a_refusal_is_logged_and_settles_nothing() {
    let out = run(
        limits(),
        World {
            index: keys(1),
            status: Box::new(|_| http(403, None)),
            ..World::default()
        },
    );
    assert!(out.gate_calls().is_empty());
    assert_eq!(out.events("status_unusable")[0]["error"], "Refused(403)");
}

#[test]
fn an_unknown_state_is_logged_and_not_offered_to_the_gate() {
    let out = run(
        limits(),
        World {
            index: keys(1),
            status: Box::new(|_| batch("BATCH_STATE_SOMETHING_NEW")),
            ..World::default()
        },
    );
    assert!(out.gate_calls().is_empty());
    assert_eq!(out.events("status_unknown_state").len(), 1);
}

// --- Backing off the status API ---

#[test]
fn a_429_stops_polling_until_its_retry_after_and_holds_the_next_pass_at_the_first_skipped() {
    let out = run(
        limits(),
        World {
            index: keys(5),
            status: Box::new(|key| {
                if key == "batches/k1" {
                    http(429, Some("1"))
                } else {
                    batch("BATCH_STATE_PENDING")
                }
            }),
            ..World::default()
        },
    );
    assert_eq!(out.polls(), vec!["batches/k0", "batches/k1"]);
    assert_eq!(
        out.report.visited, 5,
        "the walk went on: retries and alerts still happen"
    );
    assert_eq!(out.report.stopped, Some(Stop::HeldForBackoff));
    assert!(!out.report.complete);
    assert_eq!(
        out.resume(),
        at("open:batches/k1"),
        "the next pass starts at k2"
    );
    let Some(LeaseCommand::Release {
        status_backoff_until_ms,
        ..
    }) = out.release()
    else {
        panic!()
    };
    // The 429 came to the second call, which started 1 ms after the first (the test's poll
    // rate, 1,000 a second).
    assert_eq!(*status_backoff_until_ms, NOW + 1 + 1_000);
    let line = out.events("status_transient")[0];
    assert_eq!(
        (line["retry_after_secs"].clone(), line["answer"].clone()),
        (json!(1), json!(429))
    );
}

#[test]
fn a_backoff_longer_than_a_cron_interval_does_not_hold_the_next_pass() {
    let out = run(
        limits(),
        World {
            grant: Ok(LeaseReply::Granted {
                resume: LedgerCursor::default(),
                status_backoff_until_ms: NOW + HOLD_BACKOFF_UP_TO_MS + 1,
                fed_until_ms: 0,
                webhook_alerted_state: None,
                audit: audit_not_due(),
            }),
            index: keys(3),
            ..World::default()
        },
    );
    assert!(out.polls().is_empty());
    assert_eq!(out.report.stopped, Some(Stop::Complete));
    assert_eq!(out.resume(), LedgerCursor::default());
}

#[test]
fn an_unanswered_status_call_costs_only_its_entry() {
    let out = run(
        limits(),
        World {
            index: keys(3),
            status: Box::new(|key| {
                if key == "batches/k1" {
                    StatusAnswer::Timeout
                } else {
                    batch("BATCH_STATE_PENDING")
                }
            }),
            ..World::default()
        },
    );
    assert_eq!(out.polls().len(), 3);
    assert_eq!(out.report.status_unanswered, 1);
    assert_eq!(
        out.report.stopped,
        Some(Stop::Complete),
        "the cursor moved past it"
    );
    let line = out.events("status_unanswered")[0];
    assert_eq!(line["answer"], "timeout");
    assert_eq!(line["backoff_secs"], Value::Null);
}

#[test]
fn three_unanswered_status_calls_in_a_row_back_off_every_status_call() {
    let out = run(
        limits(),
        World {
            index: keys(5),
            status: Box::new(|key| {
                if key < "batches/k3" {
                    StatusAnswer::Network("connection refused".into())
                } else {
                    batch("BATCH_STATE_PENDING")
                }
            }),
            ..World::default()
        },
    );
    assert_eq!(out.polls(), vec!["batches/k0", "batches/k1", "batches/k2"]);
    assert_eq!(out.report.status_unanswered, 3);
    assert_eq!(out.report.stopped, Some(Stop::HeldForBackoff));
    assert_eq!(out.resume(), at("open:batches/k2"));
    let line = out.events("status_unanswered")[2];
    assert_eq!(line["answer"], "connection refused");
    assert_eq!(line["backoff_secs"], json!(UNANSWERED_BACKOFF_MS / 1_000));
}

// --- Effects, alerts and re-indexing ---

#[test]
fn an_owed_effect_is_retried_and_a_gate_that_says_done_is_asked_to_reindex() {
    let mut owed = meta_for("batches/e", "succeeded");
    owed.settled_at = Some(1_000);
    let out = run(
        limits(),
        World {
            index: vec![entry("open:", "batches/e", &owed)],
            gate: Box::new(|_, command| {
                Ok(match command {
                    GateCommand::RetryEffect => GateReply::Effect {
                        effect: EffectReport::Delivered,
                    },
                    _ => GateReply::Reindexed { changed: true },
                })
            }),
            ..World::default()
        },
    );
    let commands: Vec<&GateCommand> = out.gate_calls().into_iter().map(|(_, c)| c).collect();
    assert_eq!(
        commands,
        vec![&GateCommand::RetryEffect, &GateCommand::Reindex]
    );
    assert_eq!(out.report.effects_retried, 1);
    assert_eq!(out.report.reindexed, 1);
    assert_eq!(out.events("index_stale")[0]["key"], "batches/e");
}

#[test]
fn a_dropped_event_whose_effect_is_done_also_reindexes_but_only_with_budget_left() {
    let answer = |_: &str, command: &GateCommand| {
        Ok(match command {
            GateCommand::Deliver { .. } => GateReply::Dropped {
                reason: DropReason::RegressFromTerminal,
                status: Status::Succeeded,
                effect: EffectReport::Delivered,
            },
            _ => GateReply::Reindexed { changed: true },
        })
    };
    let world = || World {
        index: keys(1),
        status: Box::new(|_| batch("BATCH_STATE_RUNNING")),
        gate: Box::new(answer),
        ..World::default()
    };
    let out = run(limits(), world());
    assert_eq!(out.gate_calls().len(), 2);
    assert_eq!(out.report.reindexed, 1);
    assert_eq!(out.report.settled, 0, "dropped, not applied");
    // Lease, list, status, deliver: with a budget of 5 only the release is left.
    let out = run(
        Limits {
            budget: 5,
            ..limits()
        },
        world(),
    );
    assert_eq!(out.gate_calls().len(), 1);
    assert_eq!(out.report.reindexed, 0);
}

/// An entry running since the epoch, and limits that call it stuck after a second.
fn stuck_for_a_while() -> (LedgerMeta, Limits) {
    let mut stuck = meta_for("batches/s", "running");
    stuck.submitted_at = 0;
    let limits = Limits {
        thresholds: Thresholds {
            stuck_after_secs: 1,
            ..limits().thresholds
        },
        ..limits()
    };
    (stuck, limits)
}

#[test]
fn an_alert_counts_only_when_the_gate_raised_it_now() {
    let (stuck, limits) = stuck_for_a_while();
    for (sent, counted) in [(true, 1), (false, 0)] {
        let out = run(
            limits.clone(),
            World {
                index: vec![entry("open:", "batches/s", &stuck)],
                status: Box::new(|_| batch("BATCH_STATE_RUNNING")),
                gate: Box::new(move |_, _| Ok(GateReply::AlertSent { sent })),
                ..World::default()
            },
        );
        assert!(matches!(
            out.gate_calls()[0].1,
            GateCommand::Alert {
                alert: AlertKind::Stuck,
                ..
            }
        ));
        assert_eq!(out.report.alerts, counted);
    }
}

#[test]
fn a_pass_polling_by_itself_spaces_its_status_calls_at_the_poll_rate() {
    let index: Vec<ListedKey> = (0..5).map(|i| open(&format!("batches/p{i}"))).collect();
    let out = run(
        Limits {
            poll_rate: 4,
            ..limits()
        },
        World {
            index,
            ..World::default()
        },
    );
    assert_eq!(out.polls().len(), 5);
    // Four a second: each call 250 ms after the one before, slept for by the edge.
    assert_eq!(out.sleeps().len(), 4, "{:?}", out.sleeps());
    let mut at = out.sleeps();
    at.dedup();
    assert!(at.windows(2).all(|w| w[1] - w[0] == 250), "{at:?}");
}

#[test]
fn a_poll_that_settles_an_operation_past_the_stuck_threshold_alerts_no_stuck() {
    let (stuck, limits) = stuck_for_a_while();
    for (answer, alerted) in [
        ("BATCH_STATE_SUCCEEDED", false),
        ("BATCH_STATE_RUNNING", true),
    ] {
        let out = run(
            limits.clone(),
            World {
                index: vec![entry("open:", "batches/s", &stuck)],
                status: Box::new(move |_| batch(answer)),
                ..World::default()
            },
        );
        let stuck_asked = out.gate_calls().iter().any(|(_, c)| {
            matches!(
                c,
                GateCommand::Alert {
                    alert: AlertKind::Stuck,
                    ..
                }
            )
        });
        assert_eq!(stuck_asked, alerted, "{answer}");
    }
}

#[test]
fn a_gate_call_that_fails_is_an_error_and_the_walk_goes_on() {
    let out = run(
        limits(),
        World {
            index: keys(2),
            status: Box::new(|_| batch("BATCH_STATE_RUNNING")),
            gate: Box::new(|_, _| Err("object answered 503".into())),
            ..World::default()
        },
    );
    assert_eq!(out.report.errors, 2);
    assert_eq!(out.report.gate_calls, 2);
    let line = out.events("reconcile_error")[0];
    assert_eq!(
        (line["key"].clone(), line["error"].clone()),
        (json!("batches/k0"), json!("object answered 503"))
    );
    assert_eq!(out.report.stopped, Some(Stop::Complete));
}

// --- The audit ---

fn audit_due(resume: LedgerCursor) -> LeaseReply {
    LeaseReply::Granted {
        resume,
        status_backoff_until_ms: 0,
        fed_until_ms: 0,
        webhook_alerted_state: None,
        audit: Audit::default(),
    }
}

#[test]
fn an_audit_due_keeps_a_third_of_the_budget_for_itself() {
    let world = |grant| World {
        grant: Ok(grant),
        index: keys(5),
        ..World::default()
    };
    let budget = Limits {
        budget: 12,
        ..limits()
    };
    let routine = run(budget.clone(), world(granted(LedgerCursor::default())));
    assert_eq!(routine.polls().len(), 5, "12 pays for the whole index");
    let out = run(budget, world(audit_due(LedgerCursor::default())));
    // The routine walk has 8: lease, list and four polls spend 6, and a fifth would reach 8.
    assert_eq!(out.polls().len(), 4, "{:?}", out.polls());
    assert_eq!(out.report.visited, 4);
    assert!(out.report.audit, "the audit ran on what was kept for it");
    assert_eq!(out.lists().last(), Some(&("op:", None)));
    assert_eq!(out.report.stopped, Some(Stop::Budget));
}

#[test]
fn an_audit_due_keeps_a_third_of_the_deadline_for_itself() {
    let out = run(
        Limits {
            deadline_ms: 6_000,
            ..limits()
        },
        World {
            grant: Ok(audit_due(LedgerCursor::default())),
            index: keys(10),
            tick_ms: 1_000,
            ..World::default()
        },
    );
    assert_eq!(out.report.stopped, Some(Stop::Deadline));
    assert!(out.polls().len() < 4, "the routine walk stops at 4 s");
    assert!(out.report.audit);
    assert_eq!(out.report.audit_kv_lists, 1, "the audit lists before 6 s");
}

#[test]
fn no_audit_after_a_lost_lease_or_a_kv_error() {
    let out = run(
        limits(),
        World {
            grant: Ok(audit_due(LedgerCursor::default())),
            index: keys(3),
            beat: Box::new(|pass, n, now| {
                if n == 2 && pass.on_heartbeat().is_some() {
                    pass.on_renewed(Ok(LeaseReply::Renewed { accepted: false }), now);
                }
            }),
            ..World::default()
        },
    );
    assert!(!out.report.audit);
    let mut pass = Pass::new(limits(), "pass-1".into(), NOW);
    pass.on_kv_unbound("not bound".into());
    assert!(matches!(pass.next(NOW), Intent::Lease(_)));
    pass.answer(
        Performed::Lease(Ok(audit_due(LedgerCursor::default()))),
        NOW,
    );
    assert!(matches!(
        pass.next(NOW),
        Intent::Lease(LeaseCommand::Release { audit: None, .. })
    ));
    assert_eq!(pass.report().stopped, Some(Stop::Error));
}

#[test]
fn the_audit_acts_on_what_the_index_missed_and_reindexes_it() {
    let missed = meta_for("batches/m", "pending");
    let fine = meta_for("batches/f", "pending");
    let mut closed = meta_for("batches/c", "succeeded");
    closed.effect_done = true;
    closed.version = 5;
    // As an older projection wrote it: a live claim, so the routine walk leaves it alone.
    let mut stale = meta_for("batches/c", "succeeded");
    stale.version = 4;
    stale.claim_expires = Some(NOW / 1_000 + 3_600);
    let out = run(
        limits(),
        World {
            grant: Ok(audit_due(LedgerCursor::default())),
            index: vec![entry("open:", "batches/c", &stale), open("batches/f")],
            ledger: vec![
                entry("op:", "batches/c", &closed),
                entry("op:", "batches/f", &fine),
                entry("op:", "batches/m", &missed),
            ],
            ..World::default()
        },
    );
    assert_eq!(out.report.audit_found, 1);
    assert_eq!(out.report.reindexed, 2, "the missed one and the stale one");
    assert!(out.report.audit_complete);
    assert_eq!(out.events("index_missed")[0]["key"], "batches/m");
    assert_eq!(out.events("index_stale")[0]["key"], "batches/c");
    assert_eq!(
        out.polls(),
        vec!["batches/f", "batches/m"],
        "the routine walk polled f; the audit polled only m"
    );
    let Some(LeaseCommand::Release { audit, .. }) = out.release() else {
        panic!()
    };
    assert_eq!(
        audit,
        &Some(AuditProgress {
            resume: LedgerCursor::default(),
            complete: true
        })
    );
}

#[test]
fn without_the_whole_index_the_audit_acts_on_every_open_entry_and_reindexes_nothing() {
    let out = run(
        limits(),
        World {
            grant: Ok(audit_due(LedgerCursor {
                cursor: Some("1".into()),
                after_key: None,
            })),
            index: keys(2),
            ledger: vec![entry(
                "op:",
                "batches/k0",
                &meta_for("batches/k0", "pending"),
            )],
            ..World::default()
        },
    );
    assert_eq!(out.polls(), vec!["batches/k1", "batches/k0"]);
    assert_eq!(out.report.audit_found, 1);
    assert_eq!(out.report.reindexed, 0);
    assert!(out.events("index_missed").is_empty());
}

#[test]
fn the_audit_does_not_judge_an_entry_the_routine_walk_acted_on() {
    let out = run(
        limits(),
        World {
            grant: Ok(audit_due(LedgerCursor::default())),
            index: keys(1),
            ledger: vec![entry(
                "op:",
                "batches/k0",
                &meta_for("batches/k0", "running"),
            )],
            ..World::default()
        },
    );
    assert_eq!(
        out.polls(),
        vec!["batches/k0"],
        "polled once, by the routine walk"
    );
    assert_eq!(out.report.audit_found, 0);
}

#[test]
fn the_audit_resumes_its_own_cursor_and_saves_how_far_it_got() {
    let ledger: Vec<ListedKey> = (0..4)
        .map(|i| {
            let key = format!("batches/a{i}");
            entry("op:", &key, &meta_for(&key, "pending"))
        })
        .collect();
    let out = run(
        Limits {
            budget: 9,
            ..limits()
        },
        World {
            grant: Ok(audit_due(LedgerCursor {
                cursor: None,
                after_key: Some("open:x".into()),
            })),
            ledger,
            page_size: 2,
            ..World::default()
        },
    );
    // Lease, index list, audit list, one missed entry (2), the next page's list: 6 of 9.
    let Some(LeaseCommand::Release { audit, .. }) = out.release() else {
        panic!()
    };
    let progress = audit.clone().expect("audited");
    assert!(!progress.complete);
    assert!(progress.resume.after_key.is_some() || progress.resume.cursor.is_some());
    assert!(!out.report.audit_complete);
    let out = run(
        limits(),
        World {
            grant: Ok(LeaseReply::Granted {
                resume: LedgerCursor::default(),
                status_backoff_until_ms: 0,
                fed_until_ms: 0,
                webhook_alerted_state: None,
                audit: Audit {
                    resume: Some(progress.resume.clone()),
                    ..audit_not_due()
                },
            }),
            ledger: (0..4)
                .map(|i| {
                    let key = format!("batches/a{i}");
                    entry("op:", &key, &meta_for(&key, "pending"))
                })
                .collect(),
            page_size: 2,
            ..World::default()
        },
    );
    assert_eq!(out.lists()[1], ("op:", progress.resume.cursor.as_deref()));
    assert!(out.report.audit_complete);
}

#[test]
fn an_audit_list_kv_refuses_starts_the_audit_over() {
    let mut pass = Pass::new(limits(), "pass-1".into(), NOW);
    pass.next(NOW);
    pass.answer(
        Performed::Lease(Ok(audit_due(LedgerCursor::default()))),
        NOW,
    );
    assert!(matches!(
        pass.next(NOW),
        Intent::List {
            prefix: "open:",
            ..
        }
    ));
    pass.answer(Performed::Listed(Ok(ListedPage::default())), NOW);
    assert!(matches!(pass.next(NOW), Intent::List { prefix: "op:", .. }));
    pass.answer(Performed::Listed(Err("cursor expired".into())), NOW);
    let Intent::Lease(LeaseCommand::Release { audit, .. }) = pass.next(NOW) else {
        panic!()
    };
    assert_eq!(
        audit,
        Some(AuditProgress {
            resume: LedgerCursor::default(),
            complete: false
        })
    );
    assert_eq!(pass.report().errors, 1);
}

// --- The Gemini webhook's state ---

fn webhook_limits() -> Limits {
    Limits {
        webhook_name: Some("webhooks/w".into()),
        ..limits()
    }
}

fn webhook_release(out: &Outcome) -> (bool, Option<String>) {
    match out.release() {
        Some(LeaseCommand::Release {
            webhook_checked,
            webhook_alerted_state,
            ..
        }) => (*webhook_checked, webhook_alerted_state.clone()),
        other => panic!("{other:?}"),
    }
}

fn granted_alerted(state: Option<&str>) -> LeaseReply {
    LeaseReply::Granted {
        resume: LedgerCursor::default(),
        status_backoff_until_ms: 0,
        fed_until_ms: 0,
        webhook_alerted_state: state.map(str::to_string),
        audit: audit_not_due(),
    }
}

#[test]
fn a_disabled_webhook_alerts_once_per_state() {
    // Re-enabling is off here, so every state not `enabled` is only alerted (the restore:
    // `restore.rs`).
    for (alerted, state, alerts, mark) in [
        (None, "enabled", 0, None),
        (None, "disabled", 1, Some("disabled")),
        (Some("disabled"), "disabled", 0, Some("disabled")),
        (
            Some("disabled"),
            "disabled_due_to_failed_deliveries",
            1,
            Some("disabled_due_to_failed_deliveries"),
        ),
        (Some("disabled"), "enabled", 0, None),
    ] {
        let out = run(
            Limits {
                webhook_auto_enable: false,
                ..webhook_limits()
            },
            World {
                grant: Ok(granted_alerted(alerted)),
                webhooks: vec![webhooks(state)],
                ..World::default()
            },
        );
        let posted = out
            .intents
            .iter()
            .filter(|i| matches!(i, Intent::PostAlert(_)))
            .count();
        assert_eq!(posted, alerts, "{alerted:?} -> {state}");
        assert_eq!(out.report.alerts, alerts as u64);
        assert_eq!(webhook_release(&out), (true, mark.map(str::to_string)));
        assert_eq!(out.events("webhook_state")[0]["state"], state);
    }
}

#[test]
fn an_alert_not_sent_keeps_the_old_mark_so_the_next_pass_tries_again() {
    let out = run(
        webhook_limits(),
        World {
            webhooks: vec![webhooks("disabled")],
            alert_sent: false,
            ..World::default()
        },
    );
    assert_eq!(webhook_release(&out), (true, None));
    assert_eq!(out.report.alerts, 0);
}

#[test]
fn a_webhook_missing_from_the_listing_is_not_found() {
    let out = run(
        webhook_limits(),
        World {
            webhooks: vec![PeerAnswer::Http {
                status: 200,
                body: json!({"webhooks": []}).to_string(),
                retry_after: None,
            }],
            ..World::default()
        },
    );
    assert_eq!(out.events("webhook_state")[0]["state"], "not_found");
    assert_eq!(webhook_release(&out), (true, Some("not_found".into())));
}

#[test]
fn a_webhook_check_that_fails_leaves_the_mark_as_it_was() {
    for (answer, error) in [
        (
            PeerAnswer::Http {
                status: 503,
                body: String::new(),
                retry_after: Some("7".into()),
            },
            "Transient { retry_after_secs: 7 }",
        ),
        (
            PeerAnswer::Http {
                status: 403,
                body: String::new(),
                retry_after: None,
            },
            "Refused(403)",
        ),
        (PeerAnswer::Timeout, "Transient { retry_after_secs: 0 }"),
        (
            PeerAnswer::TooLarge {
                status: 200,
                cap: 262_144,
            },
            "Malformed(\"a listing page over 262144 bytes\")",
        ),
    ] {
        let out = run(
            webhook_limits(),
            World {
                grant: Ok(granted_alerted(Some("disabled"))),
                webhooks: vec![answer],
                index: keys(1),
                ..World::default()
            },
        );
        assert_eq!(
            webhook_release(&out),
            (false, None),
            "unchecked: the lease keeps its mark"
        );
        assert_eq!(out.events("webhook_check_failed")[0]["error"], error);
        assert_eq!(out.polls().len(), 1, "the walk still runs");
    }
}

#[test]
fn the_webhook_listing_is_followed_page_by_page() {
    let page = |token: &str| {
        PeerAnswer::Http {
        status: 200,
        body: json!({"webhooks": [{"name": "webhooks/other", "state": "enabled"}], "nextPageToken": token}).to_string(),
        retry_after: None,
    }
    };
    let out = run(
        webhook_limits(),
        World {
            webhooks: vec![page("a b"), page("c"), webhooks("disabled")],
            ..World::default()
        },
    );
    let urls: Vec<&str> = out
        .intents
        .iter()
        .filter_map(|i| match i {
            Intent::ListWebhooks { url } => Some(url.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        urls,
        vec![
            "http://gemini/v1beta/webhooks?page_size=1000",
            "http://gemini/v1beta/webhooks?page_size=1000&page_token=a%20b",
            "http://gemini/v1beta/webhooks?page_size=1000&page_token=c",
        ]
    );
    assert_eq!(webhook_release(&out), (true, Some("disabled".into())));
}

#[test]
fn no_webhook_check_without_budget_for_it() {
    let out = run(
        Limits {
            budget: 2,
            ..webhook_limits()
        },
        World::default(),
    );
    assert!(!out
        .intents
        .iter()
        .any(|i| matches!(i, Intent::ListWebhooks { .. })));
    assert_eq!(webhook_release(&out), (false, None));
}

#[test]
fn a_5xx_without_retry_after_backs_off_the_default_wait() {
    let out = run(
        limits(),
        World {
            index: keys(3),
            status: Box::new(|_| http(500, None)),
            ..World::default()
        },
    );
    assert_eq!(out.polls(), vec!["batches/k0"]);
    let Some(LeaseCommand::Release {
        status_backoff_until_ms,
        ..
    }) = out.release()
    else {
        panic!()
    };
    let wait = crate::operation::observation::DEFAULT_RETRY_AFTER_SECS * 1_000;
    assert_eq!(*status_backoff_until_ms, NOW + wait);
    assert_eq!(
        out.report.stopped,
        Some(Stop::HeldForBackoff),
        "shorter than a cron interval"
    );
    assert!(out.gate_calls().is_empty(), "settles nothing");
}

#[test]
fn a_refused_release_is_logged_and_a_failed_one_counted() {
    let out = run(
        limits(),
        World {
            release: Ok(LeaseReply::Released { accepted: false }),
            ..World::default()
        },
    );
    assert_eq!(
        out.events("reconcile_error")[0]["error"],
        "lease release refused: Released { accepted: false }"
    );
    assert_eq!(out.report.errors, 0);
    let out = run(
        limits(),
        World {
            release: Err("object answered 500".into()),
            ..World::default()
        },
    );
    assert_eq!(
        out.events("reconcile_error")[0]["error"],
        "lease release: object answered 500"
    );
    assert_eq!(out.report.errors, 1);
}

// --- The fan-out queue ---

fn fanout(rate_per_s: u32, above: usize) -> Limits {
    Limits {
        fanout: Some(Fanout { rate_per_s, above }),
        ..limits()
    }
}

fn fed_until(out: &Outcome) -> i64 {
    match out.release() {
        Some(LeaseCommand::Release { fed_until_ms, .. }) => *fed_until_ms,
        other => panic!("no release: {other:?}"),
    }
}

#[test]
fn a_large_backlog_is_scheduled_on_the_queue_at_the_rate_and_polled_by_nobody_here() {
    let out = run(
        fanout(20, 100),
        World {
            index: keys(500),
            ..World::default()
        },
    );
    assert!(out.polls().is_empty(), "the pass polls nothing itself");
    assert!(out.gate_calls().is_empty());
    let queued = out.queued();
    assert_eq!(queued.len(), 10, "500 entries, 50 a message");
    let names: Vec<String> = queued
        .iter()
        .flat_map(|(j, _)| j.entries.iter().map(|e| e.name.clone()))
        .collect();
    let want: Vec<String> = (0..500).map(|i| format!("open:batches/k{i}")).collect();
    let (mut sorted, mut want_sorted) = (names.clone(), want);
    sorted.sort();
    want_sorted.sort();
    assert_eq!(sorted, want_sorted, "every entry once, none twice");
    for (k, (job, delay)) in queued.iter().enumerate() {
        // 20 a second: each message of 50 takes 2.5 s of slots, the next starts after it.
        assert_eq!(job.not_before_ms, NOW + k as i64 * 2_500);
        assert_eq!(*delay as i64, (k as i64 * 2_500) / 1_000);
        assert_eq!(job.rate_per_s, 20);
        assert_eq!(job.slot_ms(1) - job.slot_ms(0), 50);
    }
    assert_eq!(out.report.fed, 500);
    assert_eq!(out.report.queue_sends, 1, "one sendBatch for 10 messages");
    assert_eq!(
        out.report.subrequests, 4,
        "lease, one list, one send, release"
    );
    assert_eq!(out.report.stopped, Some(Stop::Complete));
    assert_eq!(
        fed_until(&out),
        NOW + 25_000,
        "the lease learns where the slots end"
    );
}

#[test]
fn every_send_stays_under_the_queues_size_limits_whatever_the_metadata() {
    // Long names make near-1 KB metadata, as large as KV lets metadata be.
    let long = "x".repeat(400);
    let index: Vec<ListedKey> = (0..3_000)
        .map(|i| open(&format!("batches/{long}{i:05}")))
        .collect();
    let out = run(
        Limits {
            budget: 900,
            ..fanout(1_000, 10)
        },
        World {
            index,
            page_size: 1_000,
            ..World::default()
        },
    );
    let sends = out.sends();
    assert!(sends.len() > 1, "split over several sends");
    for jobs in &sends {
        assert!(jobs.len() <= 100, "at most 100 messages a send");
        let total: usize = jobs.iter().map(|j| j.body.len()).sum();
        assert!(total <= 256_000, "{total} bytes in one send");
        assert!(jobs.iter().all(|j| j.body.len() <= 128_000));
    }
    assert_eq!(out.report.fed, 3_000);
}

#[test]
fn a_backlog_under_the_threshold_is_polled_by_the_pass_itself() {
    let out = run(
        fanout(20, 41),
        World {
            index: keys(40),
            ..World::default()
        },
    );
    assert_eq!(out.polls().len(), 40);
    assert!(out.queued().is_empty());
    assert_eq!(fed_until(&out), 0, "nothing scheduled, nothing to say");
}

#[test]
fn a_pass_schedules_one_cron_interval_after_the_slots_already_taken_and_resumes_after() {
    // Mid-coverage (a new one waits for the slots taken: see below).
    let mut grant = granted(at("open:batches/k0"));
    if let LeaseReply::Granted { fed_until_ms, .. } = &mut grant {
        *fed_until_ms = NOW + 100_000; // an earlier pass's slots run 100 s more
    }
    // 1 a second: 300 s of horizon, of which 200 s are free.
    let out = run(
        fanout(1, 10),
        World {
            index: keys(1_000),
            grant: Ok(grant),
            ..World::default()
        },
    );
    let queued = out.queued();
    assert_eq!(
        queued.iter().map(|(j, _)| j.entries.len()).sum::<usize>(),
        200
    );
    assert_eq!(
        queued[0].0.not_before_ms,
        NOW + 100_000,
        "no overlap with earlier slots"
    );
    assert_eq!(queued[0].1, 100);
    assert_eq!(out.report.stopped, Some(Stop::Scheduled));
    let last = &queued.last().unwrap().0.entries.last().unwrap().name;
    assert_eq!(out.resume().after_key.as_deref(), Some(last.as_str()));
    assert_eq!(fed_until(&out), NOW + 300_000);
}

#[test]
fn a_backoff_longer_than_the_interval_schedules_nothing_and_keeps_the_cursor() {
    let mut grant = granted(at("open:batches/k3"));
    if let LeaseReply::Granted {
        status_backoff_until_ms,
        ..
    } = &mut grant
    {
        *status_backoff_until_ms = NOW + 600_000;
    }
    let out = run(
        fanout(20, 10),
        World {
            index: keys(500),
            grant: Ok(grant),
            ..World::default()
        },
    );
    assert!(out.queued().is_empty() && out.polls().is_empty());
    assert_eq!(out.report.stopped, Some(Stop::Scheduled));
    assert_eq!(out.resume(), at("open:batches/k3"));
}

#[test]
fn a_send_the_queue_refuses_moves_no_cursor() {
    let out = run(
        fanout(20, 10),
        World {
            index: keys(500),
            queue: Err("queue unavailable".into()),
            ..World::default()
        },
    );
    assert_eq!(out.report.fed, 0);
    assert_eq!(out.report.stopped, Some(Stop::Error));
    assert_eq!(
        out.resume(),
        LedgerCursor::default(),
        "the next pass schedules them"
    );
    assert_eq!(fed_until(&out), 0);
    assert_eq!(out.events("reconcile_error").len(), 1);
}

fn job(n: usize, rate_per_s: u32) -> PollJob {
    PollJob::new(
        keys(n)
            .into_iter()
            .map(|k| JobEntry {
                name: k.name,
                metadata: k.metadata.unwrap(),
            })
            .collect(),
        NOW + 1_000,
        rate_per_s,
    )
}

#[test]
fn a_consumer_polls_each_entry_at_its_slot_and_settles_what_gemini_says_is_done() {
    let job = job(3, 10);
    let pass = Consumer::new(limits(), job.clone(), NOW);
    let out = drive(
        pass,
        World {
            status: Box::new(|_| batch("BATCH_STATE_SUCCEEDED")),
            ..World::default()
        },
    );
    let sleeps = out.sleeps();
    assert_eq!(sleeps, vec![NOW + 1_000, NOW + 1_100, NOW + 1_200]);
    assert_eq!(out.polls(), vec!["batches/k0", "batches/k1", "batches/k2"]);
    assert_eq!(out.gate_calls().len(), 3, "each settled through its gate");
    assert_eq!(out.report.settled, 3);
    assert!(
        out.intents.iter().all(|i| !matches!(i, Intent::Lease(_))),
        "no lease"
    );
    assert!(!out.retry, "nothing to send back");
}

#[test]
fn a_consumer_told_to_wait_polls_nothing_more_records_the_rest_in_the_lease_then_sends_it_back() {
    let mut calls = 0;
    // A message sent back twice already, first scheduled two minutes ago.
    let mut twice = job(5, 1_000);
    twice.first_slot_ms = Some(NOW - 120_000);
    twice.hops = 2;
    let pass = Consumer::new(limits(), twice, NOW);
    let out = drive(
        pass,
        World {
            status: Box::new(move |_| {
                calls += 1;
                if calls == 2 {
                    http(429, Some("30"))
                } else {
                    batch("BATCH_STATE_RUNNING")
                }
            }),
            ..World::default()
        },
    );
    assert_eq!(out.polls(), vec!["batches/k0", "batches/k1"]);
    let queued = out.queued();
    assert_eq!(queued.len(), 1, "one message goes back");
    let (requeue, delay) = &queued[0];
    let names: Vec<&str> = requeue.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "open:batches/k1",
            "open:batches/k2",
            "open:batches/k3",
            "open:batches/k4"
        ],
        "the throttled entry and those after it"
    );
    let [(until, fed_until)] = out.backoffs()[..] else {
        panic!("one report to the lease: {:?}", out.intents)
    };
    assert!(until >= NOW + 30_000, "{until}");
    assert_eq!(requeue.not_before_ms, until);
    assert_eq!(*delay, 30, "held by the queue for the wait");
    assert_eq!(
        requeue.first_slot_ms,
        Some(NOW - 120_000),
        "its age goes along"
    );
    assert_eq!(requeue.hops, 3);
    assert_eq!(
        fed_until,
        requeue.slots_end_ms(),
        "the lease learns where the slots sent back end"
    );
    assert!(
        out.position(|i| matches!(i, Intent::Lease(_)))
            < out.position(|i| matches!(i, Intent::Enqueue { .. })),
        "recorded before it is sent"
    );
    assert_eq!(out.report.queue_sends, 1);
    assert_eq!(out.report.dropped, 0);
    assert!(!out.retry, "acknowledged");
}

#[test]
fn a_message_older_than_a_cron_interval_is_dropped_unpolled_counted_and_logged() {
    let mut old = job(3, 10);
    old.first_slot_ms = Some(NOW - JOB_MAX_AGE_MS);
    old.hops = 4;
    let out = drive(Consumer::new(limits(), old, NOW), World::default());
    assert!(out.polls().is_empty() && out.sends().is_empty());
    assert!(out.backoffs().is_empty(), "no wait to report");
    assert_eq!(out.report.dropped, 3);
    let dropped = out.events("reconcile_job_dropped");
    assert_eq!(
        *dropped[0],
        json!({"event": "reconcile_job_dropped", "reason": "expired", "entries": 3, "hops": 4,
               "age_ms": JOB_MAX_AGE_MS, "keys": ["batches/k0", "batches/k1", "batches/k2"]})
    );
    assert!(!out.retry, "acknowledged: the index keeps them");
    // One millisecond younger, it is polled.
    let mut young = job(3, 10);
    young.first_slot_ms = Some(NOW - JOB_MAX_AGE_MS + 1);
    young.not_before_ms = NOW;
    let out = drive(Consumer::new(limits(), young, NOW), World::default());
    assert_eq!(
        out.polls().len(),
        1,
        "the first at once; the rest are past its life"
    );
    assert_eq!(out.report.dropped, 2);
}

#[test]
fn entries_whose_slots_come_past_the_messages_life_are_dropped_from_there() {
    // 1 a second from NOW + 1 s; its life ends at NOW + 2.5 s.
    let mut job = job(5, 1);
    job.first_slot_ms = Some(NOW + 2_500 - JOB_MAX_AGE_MS);
    let out = drive(Consumer::new(limits(), job, NOW), World::default());
    assert_eq!(out.polls(), vec!["batches/k0", "batches/k1"]);
    assert_eq!(out.report.dropped, 3);
    assert_eq!(
        out.events("reconcile_job_dropped")[0]["keys"],
        json!(["batches/k2", "batches/k3", "batches/k4"])
    );
}

#[test]
fn a_message_whose_wait_ends_past_its_life_is_not_sent_back() {
    // Ten seconds of life left; Gemini asks for thirty.
    let mut job = job(4, 10);
    job.first_slot_ms = Some(NOW + 10_000 - JOB_MAX_AGE_MS);
    let out = drive(
        Consumer::new(limits(), job, NOW),
        World {
            status: Box::new(|_| http(429, Some("30"))),
            ..World::default()
        },
    );
    assert_eq!(out.polls().len(), 1);
    assert!(out.sends().is_empty(), "nothing sent back");
    let [(until, fed_until)] = out.backoffs()[..] else {
        panic!("the wait still goes to the lease")
    };
    assert!(until >= NOW + 31_000, "{until}");
    assert_eq!(fed_until, 0, "no slot sent back");
    assert_eq!(out.report.dropped, 4);
    let dropped = out.events("reconcile_job_dropped");
    assert_eq!(
        (&dropped[0]["reason"], &dropped[0]["hops"]),
        (&json!("expired"), &json!(0)),
        "never sent back"
    );
    assert!(!out.retry);
}

#[test]
fn entries_the_lease_cannot_record_are_dropped_rather_than_sent_back() {
    for reply in [Err("object answered 500".to_string()), Ok(LeaseReply::Busy)] {
        let out = drive(
            Consumer::new(limits(), job(4, 10), NOW),
            World {
                status: Box::new(|_| http(429, Some("30"))),
                backoff: reply,
                ..World::default()
            },
        );
        assert_eq!(out.backoffs().len(), 1);
        assert!(
            out.sends().is_empty(),
            "unrecorded, a copy could wait beside the next coverage's"
        );
        assert_eq!(out.report.dropped, 4);
        assert!(
            out.events("reconcile_error")[0]["error"]
                .as_str()
                .unwrap()
                .starts_with("lease backoff"),
            "{:?}",
            out.logs
        );
        let dropped = out.events("reconcile_job_dropped");
        assert_eq!(dropped[0]["reason"], "lease_unreachable");
        assert_eq!(dropped[0]["hops"], 0);
        assert_eq!(dropped[0]["entries"], 4);
        assert!(!out.retry, "acknowledged");
    }
}

#[test]
fn a_send_back_the_queue_refuses_leaves_the_message_to_its_retries() {
    let out = drive(
        Consumer::new(limits(), job(4, 10), NOW),
        World {
            status: Box::new(|_| http(503, Some("5"))),
            queue: Err("queue unavailable".into()),
            ..World::default()
        },
    );
    assert_eq!(out.sends().len(), 1);
    assert_eq!(
        out.events("reconcile_error")[0]["error"],
        "queue send: queue unavailable"
    );
    assert!(out.retry);
}

#[test]
fn a_new_coverage_waits_while_polls_on_the_queue_may_still_be_waiting() {
    // A consumer sent polls back after a 429; their slots end ten seconds from now.
    let grant = |fed_until: i64, resume: LedgerCursor| {
        let mut grant = granted(resume);
        if let LeaseReply::Granted { fed_until_ms, .. } = &mut grant {
            *fed_until_ms = fed_until;
        }
        Ok(grant)
    };
    for (limits, index) in [(fanout(20, 10), keys(500)), (fanout(20, 100), keys(20))] {
        let out = run(
            limits.clone(),
            World {
                index: index.clone(),
                grant: grant(NOW + 10_000, LedgerCursor::default()),
                ..World::default()
            },
        );
        assert!(
            out.queued().is_empty() && out.polls().is_empty(),
            "no second copy, fed or polled here"
        );
        assert_eq!(out.report.stopped, Some(Stop::StillQueued));
        assert_eq!(
            out.report.index_listed,
            index.len() as u64,
            "listed all the same"
        );
        assert_eq!(
            out.resume(),
            LedgerCursor::default(),
            "the coverage starts later"
        );
        assert_eq!(fed_until(&out), 0);
        // Once their slots have passed, it starts.
        let out = run(
            limits,
            World {
                index: index.clone(),
                grant: grant(NOW, LedgerCursor::default()),
                ..World::default()
            },
        );
        assert_eq!(
            out.queued().len() * 50 + out.polls().len(),
            index.len(),
            "every entry, once"
        );
    }
    // Mid-coverage, the walk goes on after the slots taken: other entries.
    let out = run(
        fanout(20, 10),
        World {
            index: keys(500),
            grant: grant(NOW + 10_000, at("open:batches/k0")),
            ..World::default()
        },
    );
    assert_eq!(out.report.fed, 499);
    assert_eq!(out.queued()[0].0.not_before_ms, NOW + 10_000);
}

#[test]
fn a_consumer_whose_slots_have_passed_still_keeps_the_rate_between_its_polls() {
    let mut late = job(3, 10);
    late.not_before_ms = NOW - 60_000; // the message waited a minute in the queue
    let out = drive(Consumer::new(limits(), late, NOW), World::default());
    let sleeps = out.sleeps();
    assert_eq!(
        sleeps,
        vec![NOW + 100, NOW + 200],
        "the first at once, then 100 ms apart"
    );
    assert_eq!(out.polls().len(), 3);
}

#[test]
fn a_poll_job_survives_the_queue_and_a_foreign_message_is_refused() {
    let j = job(2, 7);
    assert_eq!(PollJob::from_body(&QueuedJob::of(&j, 0).body).unwrap(), j);
    assert!(PollJob::from_body("{\"hello\":1}").is_err());
    // A message sent before messages carried their age: its slot stands for its first.
    let before = PollJob::from_body(r#"{"entries":[],"not_before_ms":5,"rate_per_s":1}"#).unwrap();
    assert_eq!((before.first_slot(), before.hops), (5, 0));
    assert_eq!(before.expires_ms(), 5 + JOB_MAX_AGE_MS);
    assert_eq!(
        j.slots_end_ms(),
        NOW + 1_000 + 286,
        "2 entries at 7 a second, rounded up"
    );
    let far = PollJob {
        not_before_ms: NOW + 100 * 86_400_000,
        ..j.clone()
    };
    assert_eq!(
        QueuedJob::of(&far, NOW).delay_secs,
        43_200,
        "the queue's longest delay"
    );
    let past = PollJob {
        not_before_ms: NOW - 5_000,
        ..j
    };
    assert_eq!(QueuedJob::of(&past, NOW).delay_secs, 0);
}

mod restore;

// --- What the index holds ---

#[test]
fn a_pass_that_lists_the_whole_index_counts_what_it_holds_and_a_window_counts_nothing() {
    let mut stuck = meta_for("batches/s", "running");
    stuck.alerts = vec![AlertKind::Stuck];
    let mut parked = meta_for("batches/p", "succeeded");
    parked.parked = true;
    let index = vec![
        open("batches/a"),
        entry("open:", "batches/p", &parked),
        entry("open:", "batches/s", &stuck),
    ];
    let out = run(
        limits(),
        World {
            index,
            page_size: 2,
            grant: Ok(granted(at("open:batches/a"))),
            ..World::default()
        },
    );
    let counts = OpenCounts {
        operations: 2,
        stuck: 1,
        effects_not_done: 1,
    };
    assert_eq!(
        out.report.open,
        Some(counts),
        "listed whole over two pages, walked from past its first entry"
    );
    let Some(LeaseCommand::Release { summary, .. }) = out.release() else {
        panic!("released");
    };
    assert_eq!(
        summary["report"]["open"],
        json!({"operations": 2, "stuck": 1, "effects_not_done": 1}),
        "the lease keeps them for /metrics"
    );
    let big = || World {
        index: keys(MAX_INDEX_PAGES as usize + 2),
        page_size: 1,
        ..World::default()
    };
    let budget = Limits {
        budget: 1_000,
        ..limits()
    };
    let first = run(budget.clone(), big());
    assert_eq!(first.report.stopped, Some(Stop::Window));
    assert_eq!(first.report.open, None, "the first window is not the index");
    let rest = run(
        budget,
        World {
            grant: Ok(granted(first.resume())),
            ..big()
        },
    );
    assert_eq!(rest.report.stopped, Some(Stop::Complete));
    assert_eq!(rest.report.open, None, "nor is the last");
    assert_eq!(rest.report.to_value()["open"], Value::Null);
}
