//! The log event names are a contract: operators' queries, the chaos and bench scripts and the
//! integration tests read them. A name is spelled once, as its variant in a typed line (the
//! serde tag). This serializes one line of every variant of every log type (a variant added
//! without a sample fails to compile here), checks that no two types write the same name
//! unless declared shared, that every name the scripts and tests read is written, and that no
//! production code in `src/` spells a name as a string literal (where a typo or a rename
//! would escape every check).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use gemini_once::inbound::answer::Answer;
use gemini_once::inbound::route_log::{Handled, RouteLog};
use gemini_once::operation::gate::log::{AttemptLine, GateLog};
use gemini_once::operation::lifecycle::Status;
use gemini_once::reconciliation::pass::{JobDrop, PassLog, PassReport};
use gemini_once::telemetry::counters::Tally;
use gemini_once::telemetry::usage::{Invocation, Usage};
use gemini_once::telemetry::worker_log::{StatusRead, WorkerLog};
use serde_json::{json, Value};

/// One printed line of each variant of a log type, with each variant named once: the match
/// does not compile when the type gains a variant missing here.
macro_rules! one_of_each {
    ($ty:ident { $($variant:ident $fields:tt),* $(,)? }) => {{
        #[allow(dead_code)]
        fn whole(line: &$ty) {
            match line {
                $($ty::$variant { .. } => {})*
            }
        }
        vec![$(($ty::$variant $fields).to_value()),*]
    }};
}

fn key() -> String {
    "batches/a".into()
}

fn route_lines() -> Vec<Value> {
    let h = || Handled {
        answer: Answer::IgnoredUnregistered { key: key() },
        event_type: "batch.succeeded".into(),
        webhook_id: "msg_1".into(),
        ms: Some(3),
        answered_by: None,
        alert: None,
    };
    let e = || "e".to_string();
    one_of_each!(RouteLog {
        Delivered(h()),
        Duplicate(h()),
        Dropped(h()),
        Nudged(h()),
        IgnoredUnregistered(h()),
        IgnoredForgotten(h()),
        IgnoredTooOld(h()),
        StrangerNudge(h()),
        Ping { event_type: "webhook.ping".into(), webhook_id: "msg_1".into() },
        Rejected {
            reason: "signature_invalid",
            bytes: None,
            retry_after: None,
            problem: None,
            delivery_id: None,
            event_type: None,
        },
        DeadLetter { reason: "not_json", webhook_id: "m".into(), kv_key: "dead:m".into() },
        JwksFetched { changed: true, keys: 2 },
        JwksFetchFailed { error: e() },
        JwksCacheWriteFailed { error: e() },
        JwksImportFailed { kid: "k".into(), error: e() },
    })
}

fn gate_lines() -> Vec<Value> {
    let a = || AttemptLine {
        key: key(),
        status: "succeeded".into(),
        attempt: 1,
        generation: 1,
        answer: "2xx".into(),
        ms: 5,
        after_settled_ms: Some(3),
        next_attempt_ms: None,
    };
    let r = || "r".to_string();
    one_of_each!(GateLog {
        ResultsFileUnread { key: key(), reason: r() },
        ResultsRetried { key: key(), taken: 3, reason: r(), by: None },
        ResultSendersSilent { key: key(), waiting: 40, silent_ms: 9 },
        ResultsRecounted { key: key(), generation: 2 },
        ForgottenByOperator { key: key(), reason: r(), by: None },
        Reindexed { key: key(), status: "pending".into() },
        SettledByOperator { key: key(), status: "failed".into(), reason: r(), by: None },
        RetryNow { key: key(), generation: 1, reason: r(), by: None },
        Redeliver { key: key(), generation: 2, reason: r(), by: None },
        RetentionExpired { key: key() },
        RetiredNameRefused { key: key() },
        Confirmed { key: key(), status: "succeeded".into(), verdict: "applied", still_confirming: false },
        StatusUnknownState { key: key(), state: "odd".into() },
        StatusNotFound { key: key(), path: "confirmation" },
        StatusUnusable { key: key(), path: "confirmation", error: r(), still_confirming: true },
        ConfirmWaiting { key: key(), error: r(), retry_in_ms: 1_000 },
        EffectDelivered(a()),
        EffectFailed(a()),
        EffectParked(a()),
        EffectFenced(a()),
        StatsFlushFailed { key: key(), error: r() },
        LedgerWriteFailed { key: key(), error: r(), failures: 2 },
        AlarmRecovered { key: None },
        AlarmFailed {
            key: Some(key()),
            error: r(),
            failures: 3,
            failing_since: "2026-01-01T00:00:00Z".into(),
            retry_in_ms: 4_000,
        },
        GateSchemaError { error: r() },
        RecordRecovered { key: key(), how: "pruned", error: r(), raw_bytes: 9 },
        RecordUnreadable { error: r(), raw_bytes: 9 },
    })
}

fn pass_lines() -> Vec<Value> {
    let e = || "e".to_string();
    let w = || "webhooks/w".to_string();
    one_of_each!(PassLog {
        ReconcilePass(PassReport::default()),
        ReconcileJob(PassReport::default()),
        ReconcileError { key: Some(key()), error: e() },
        ReconcileJobDropped { reason: JobDrop::Expired, entries: 1, hops: 3, age_ms: 9, keys: vec![key()] },
        ReconcileLeaseLost { holder: "pass-1".into() },
        ReconcileCursorReset { error: e() },
        IndexMissed { key: key() },
        IndexStale { key: key() },
        WebhookState { webhook: w(), state: "enabled".into() },
        WebhookCheckFailed { webhook: w(), error: e() },
        WebhookEnabled { webhook: w(), was: "disabled".into(), swept: true },
        WebhookEnableFailed { webhook: w(), error: e() },
        StatusUnanswered { key: key(), answer: "timeout".into(), backoff_secs: None },
        StatusNotFound { key: key() },
        StatusTransient { key: key(), retry_after_secs: 1, answer: 429 },
        StatusUnusable { key: key(), error: e() },
        StatusUnknownState { key: key(), state: "weird".into() },
        SettledByReconcile { key: key(), status: Status::Succeeded },
    })
}

fn worker_lines() -> Vec<Value> {
    let e = || "e".to_string();
    let refused = StatusRead::Refused { refused: e() };
    one_of_each!(WorkerLog {
        ConfigWarning { warning: e() },
        ReconcileError { error: e() },
        Rejected { reason: "admin_unauthorized", scope: None },
        Registered { key: key(), by: json!({}) },
        AdminAction { method: "POST".into(), path: "/v1".into(), status: 200, by: json!({}) },
        Alert { alert: json!("stuck"), key: json!(key()), age_seconds: json!(60), text: json!("t") },
        AlertFailed { alert: json!("stuck"), key: None, answer: "500".into() },
        AlertDropped { owner: "destination d".into(), dropped: 1 },
        Unavailable { error: e(), key: None, bulk: None },
        StatusRead { key: key(), read: refused, read_ms: 3 },
        RejectedSummary { counts: Tally::new() },
        StatsFlushFailed { error: e() },
        StatsSchemaError { error: e() },
        LeaseSchemaError { error: e() },
        DeskSchemaError { error: e() },
        WatchSchemaError { error: e() },
        RetiredSchemaError { error: e() },
        RetiredNamesKept { names: 3, rows: 1 },
    })
}

/// Names two types write on purpose: the same event from two places (the webhook route's and
/// the admin API's refusals; the cron's failures before and during a pass; the gate's and the
/// stats shard's failed flushes; a status answer met by a nudge's confirmation and by a pass).
const SHARED: &[&str] = &[
    "rejected",
    "reconcile_error",
    "stats_flush_failed",
    "status_not_found",
    "status_unusable",
    "status_unknown_state",
];

/// Every event name, with the log types that write it.
fn writers() -> BTreeMap<String, BTreeSet<&'static str>> {
    let usage = vec![Usage::default().line("gate", Invocation::Fetch, 1, 0)];
    let types = [
        ("RouteLog", route_lines()),
        ("GateLog", gate_lines()),
        ("PassLog", pass_lines()),
        ("WorkerLog", worker_lines()),
        ("usage", usage),
    ];
    let mut writers: BTreeMap<String, BTreeSet<&'static str>> = BTreeMap::new();
    for (ty, lines) in types {
        let names: BTreeSet<String> = lines
            .iter()
            .map(|l| {
                l["event"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{l}"))
                    .to_string()
            })
            .collect();
        // Two variants of one type never share a name: each is its own line.
        assert_eq!(
            names.len(),
            lines.len(),
            "{ty}: a name written by two variants"
        );
        for name in names {
            writers.entry(name).or_default().insert(ty);
        }
    }
    writers
}

#[test]
fn every_variant_writes_its_own_snake_case_name() {
    let writers = writers();
    assert!(writers.len() > 60, "{}", writers.len());
    for (name, types) in &writers {
        assert!(
            !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
            "{name:?}"
        );
        assert_eq!(
            types.len() > 1,
            SHARED.contains(&name.as_str()),
            "{name} is written by {types:?}: unique to one type unless declared shared"
        );
    }
}

fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files(&path, ext, out);
        } else if path.extension().is_some_and(|e| e == ext) {
            out.push(path);
        }
    }
}

/// Every `"<prefix>name<suffix>"`-shaped literal name in `text` (name: lowercase and `_`).
fn quoted_after(text: &str, prefix: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(prefix) {
        rest = &rest[i + prefix.len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        if !name.is_empty() && rest[name.len()..].starts_with('"') {
            names.push(name);
        }
    }
    names
}

/// Other contracts that share a compound name with an event, by file: a counter, a report
/// field and an alert kind named for what the event reports, and the listing's column.
const OTHER_MEANINGS: &[(&str, &str)] = &[
    ("settled_by_reconcile", "telemetry/counters.rs"),
    ("status_unanswered", "telemetry/metrics.rs"),
    ("record_unreadable", "operation/alert.rs"),
    ("status_unusable", "operation/alert.rs"),
    ("record_unreadable", "alert_format.rs"),
    ("status_unusable", "alert_format.rs"),
    ("effect_parked", "edge/http/listing.rs"),
];

/// A string literal in the code the worker runs that is an event's name, or a line written
/// as raw JSON: the name's one spelling is its variant, so either would be a second one.
/// One-word names (`alert`, `delivered`, `redeliver`, ...) are also ordinary field names,
/// labels and actions, so only compound names are looked for.
#[test]
fn no_event_name_is_spelled_in_src() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let known = writers();
    let mut rs = Vec::new();
    files(&root.join("src"), "rs", &mut rs);
    assert!(rs.len() > 20);
    let mut spelled = BTreeSet::new();
    for path in rs {
        let rel = path
            .strip_prefix(root.join("src"))
            .unwrap()
            .to_string_lossy();
        if rel
            .split('/')
            .any(|p| p == "tests" || p == "tests.rs" || p.ends_with("_tests.rs"))
        {
            continue;
        }
        let text = fs::read_to_string(&path).unwrap();
        // Test modules build lines of their own to compare; only the code the worker runs counts.
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for found in quoted_after(code, "\"") {
            let other = OTHER_MEANINGS.contains(&(found.as_str(), &*rel));
            if found.contains('_') && known.contains_key(&found) && !other {
                spelled.insert(format!("{found} in {rel}"));
            }
        }
        for prefix in ["\"event\": \"", "\"event\":\""] {
            for found in quoted_after(code, prefix) {
                spelled.insert(format!("raw line {found} in {rel}"));
            }
        }
    }
    assert!(
        spelled.is_empty(),
        "event names spelled outside their variant (use the area's typed line): {spelled:?}"
    );
}

/// The check above finds what it looks for.
#[test]
fn a_spelled_name_is_found() {
    let code = "let a = \"effect_parked\"; let b = json!({\"event\": \"x\"});";
    assert_eq!(quoted_after(code, "\""), ["effect_parked", "event", "x"]);
    assert_eq!(quoted_after(code, "\"event\": \""), ["x"]);
}

#[test]
fn every_event_the_scripts_and_tests_read_is_declared() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut mjs = Vec::new();
    files(&root.join("scripts"), "mjs", &mut mjs);
    files(&root.join("tests"), "mjs", &mut mjs);
    assert!(!mjs.is_empty());
    let known = writers();
    let mut read = 0;
    let mut unknown = BTreeSet::new();
    for path in mjs {
        let text = fs::read_to_string(&path).unwrap();
        for prefix in ["events(\"", ".count(\"", "waitFor(\"", "event === \""] {
            // `typeof e.event === "string"` checks a type, not a name.
            for name in quoted_after(&text, prefix)
                .into_iter()
                .filter(|n| !matches!(n.as_str(), "string" | "number" | "object" | "undefined"))
            {
                read += 1;
                if !known.contains_key(&name) {
                    unknown.insert(format!("{} in {}", name, path.display()));
                }
            }
        }
    }
    assert!(
        read > 10,
        "found only {read} event names read: the patterns drifted"
    );
    assert!(
        unknown.is_empty(),
        "events read but written by no log line: {unknown:?}"
    );
}
