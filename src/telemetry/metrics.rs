//! `GET /metrics`: what `/v1/stats` reads (the stats shards' totals, each destination's desk,
//! the reconciliation lease), as the Prometheus text exposition format 0.0.4 or, when the
//! scraper asks for it, OpenMetrics 1.0.
//!
//! Guarantees: every family has `# HELP` and `# TYPE`, a name prefixed [`PREFIX`], and a
//! counter's samples end in `_total`; label values are escaped (backslash, quote, newline);
//! labels are of bounded cardinality: a destination's short name (its route's kind, or
//! `default` for `EFFECT_URL`; its host is in `destination_info`), a state, a result, or a
//! reason or counter name the code defines, never an operation's name. `build_info` says which
//! version and commit serve the page. Counters are the shards' all-time totals (hour -1, the sum of every
//! pruned bucket, plus the buckets kept: see [`crate::telemetry::shard_store`]), never a
//! window, so pruning never moves one back; the lease's completed passes are stored with the
//! lease. Rendering is pure: the stats value in, the page out.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde_json::Value;

use crate::destination_label::{destination_host, destination_parts};
use crate::telemetry::counters::{
    status_call, AskedBy, StatusCallAnswer, ACCEPTANCE_BUCKETS_SECS, ACCEPTANCE_BUCKET_PREFIX,
    ACCEPTANCE_MS_SUM, ALERTS, ALERTS_BY_KIND_PREFIX, DELIVERIES, DROPPED_PREFIX, DUPLICATES,
    EFFECT_FAILURES, EFFECT_PARKS, EFFECT_RETRY_AFTER, EFFECT_SUCCESSES, EFFECT_TO_PREFIX, PINGS,
    REDELIVERIES, RESULT_TO_PREFIX, SETTLED_BY_RECONCILE, SETTLED_BY_WEBHOOK, STRANGER_NUDGES,
};
use crate::telemetry::log_event::name_of;

/// Every family's name starts with this.
pub const PREFIX: &str = "gemini_once_";
/// The version this worker was built as (Cargo.toml's).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The commit it was built from, as `scripts/build.sh` passes it (`GEMINI_ONCE_COMMIT`: the
/// commit's short hash, `+modified` when sources differed from it); `unknown` otherwise.
pub const COMMIT: &str = match option_env!("GEMINI_ONCE_COMMIT") {
    Some(commit) => commit,
    None => "unknown",
};
/// The prefix of a rejected request's counter (`rejected_<reason>`).
const REJECTED_PREFIX: &str = "rejected_";
/// The states a destination's desk reports (`DeskView::state`), and `unknown` for a desk that
/// could not be asked: each is a series of the state gauge, 1 for the current one.
pub const DESTINATION_STATES: [&str; 5] = ["healthy", "open", "draining", "paused", "unknown"];

/// Which exposition format to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The Prometheus text format, version 0.0.4.
    Text,
    /// OpenMetrics 1.0 text.
    OpenMetrics,
}

impl Format {
    /// OpenMetrics when `Accept` names `application/openmetrics-text` (as Prometheus itself
    /// asks first), the text format otherwise.
    pub fn from_accept(accept: Option<&str>) -> Format {
        match accept.map(str::to_ascii_lowercase) {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Text,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// A family's type, serialized as its `# TYPE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
enum Kind {
    Counter,
    Gauge,
    /// Samples named by their suffix (`_bucket`, `_sum`, `_count`).
    Histogram,
}

/// One metric family: its name without [`PREFIX`] (and, for a counter, without `_total`).
struct Family {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    samples: Vec<Sample>,
}

/// A sample: its labels, its value, and a histogram sample's suffix (empty otherwise).
struct Sample(Vec<(&'static str, String)>, f64, &'static str);

impl Family {
    fn new(name: &'static str, kind: Kind, help: &'static str) -> Family {
        Family {
            name,
            help,
            kind,
            samples: Vec::new(),
        }
    }

    fn gauge(name: &'static str, help: &'static str) -> Family {
        Family::new(name, Kind::Gauge, help)
    }

    /// A counter family, described by [`counter_help`].
    fn counter(name: &'static str) -> Family {
        Family::new(name, Kind::Counter, counter_help(name))
    }

    fn with(mut self, labels: Vec<(&'static str, String)>, value: f64) -> Family {
        self.push(labels, value);
        self
    }

    fn push(&mut self, labels: Vec<(&'static str, String)>, value: f64) {
        self.samples.push(Sample(labels, value, ""));
    }
}

/// A label's name and value.
type Label = (&'static str, &'static str);

/// The shards' fixed counters: the name they keep, the family, and the label that tells
/// the family's series apart. Each is served, 0 until counted.
const FIXED: [(&str, &str, Option<Label>); 12] = [
    (DELIVERIES, "deliveries", None),
    (SETTLED_BY_WEBHOOK, "settled", Some(("path", "webhook"))),
    (SETTLED_BY_RECONCILE, "settled", Some(("path", "reconcile"))),
    (DUPLICATES, "duplicates", None),
    (STRANGER_NUDGES, "stranger_nudges", None),
    (PINGS, "pings", None),
    (EFFECT_SUCCESSES, "effects", Some(("result", "delivered"))),
    (EFFECT_FAILURES, "effects", Some(("result", "failed"))),
    (EFFECT_PARKS, "effects", Some(("result", "parked"))),
    (REDELIVERIES, "redeliveries", None),
    (ALERTS, "alerts", None),
    (EFFECT_RETRY_AFTER, "effects_retried_after_asked", None),
];

/// What each counter family counts.
fn counter_help(family: &str) -> &'static str {
    match family {
        "deliveries" => "Deliveries that reached an operation's gate: signed webhook events and nudges for operations the worker holds.",
        "settled" => "Terminal outcomes applied, by the path that brought them (webhook or reconcile).",
        "duplicates" => "Deliveries and status answers that repeated what the operation already held.",
        "stranger_nudges" => "Nudges naming operations the worker does not hold, which Gemini's status API did not know.",
        "pings" => "Signed test deliveries (Gemini's ping).",
        "effects" => "Side-effect attempts by result: delivered (accepted), failed (retried later), parked.",
        "redeliveries" => "Side effects sent again as a new generation by an operator.",
        "alerts" => "Alerts the gates sent to ALERT_URL.",
        "alerts_by_kind" => "Alerts the gates sent to ALERT_URL, by kind.",
        "effects_by_destination" => "Side-effect attempts by result (delivered, failed, parked) and destination.",
        "results_by_destination" => "A batch's results (results \"each\") by how they ended (delivered: accepted; failed: an attempt to retry; parked; unanswered: its result sender answered nothing, sent again later) and destination.",
        "effects_retried_after_asked" => "Failed side-effect attempts retried no sooner than the destination's Retry-After asked.",
        "dropped" => "Deliveries and status answers not applied, by the reducer's reason.",
        "rejected" => "Requests refused before reaching a gate, by reason.",
        "status_calls" => "Status-API calls about operations, by who asked (pass, queue, nudge) and how they ended (answered: a 2xx; not_found: a 404; refused: any other status, 429 and 5xx among them; unanswered: a timeout or a network error).",
        _ => "Events counted under a name this version does not describe.",
    }
}

/// The page for `stats`, the value `/v1/stats` answers (its `total`, `destinations`,
/// `reconcile` and `gemini_webhook`; anything missing is served as nothing counted).
pub fn render(stats: &Value, format: Format) -> String {
    let mut families = vec![build_info()];
    families.extend(counter_families(&stats["total"]));
    families.extend(destination_families(&stats["destinations"]));
    families.extend(reconcile_families(&stats["reconcile"]));
    families.extend(webhook_family(&stats["gemini_webhook"]));
    let mut page = String::new();
    for family in &families {
        write_family(&mut page, family, format);
    }
    if format == Format::OpenMetrics {
        page.push_str("# EOF\n");
    }
    page
}

/// Which build serves the page: always 1, labelled by version and commit (join on it to see
/// what a change of behaviour came with).
fn build_info() -> Family {
    let (version, commit) = (VERSION.to_string(), COMMIT.to_string());
    let help = "The worker's version and the commit it was built from (always 1).";
    Family::gauge("build_info", help).with(vec![("version", version), ("commit", commit)], 1.0)
}

/// The shards' totals: the fixed counters, then drops and rejections by reason, then any
/// other name as `events_total{name}` (so a counter added later is served before it is
/// described here).
fn counter_families(total: &Value) -> Vec<Family> {
    let count = |name: &str| total.get(name).and_then(Value::as_u64).unwrap_or(0) as f64;
    let mut families: Vec<Family> = Vec::new();
    for (name, family, label) in FIXED {
        let labels = Vec::from_iter(label.map(|(k, v)| (k, v.to_string())));
        match families.iter_mut().find(|f| f.name == family) {
            Some(f) => f.push(labels, count(name)),
            None => families.push(Family::counter(family).with(labels, count(name))),
        }
    }
    let mut dropped = Family::counter("dropped");
    let mut rejected = Family::counter("rejected");
    // Effects (0) and results (1) by result and short name: two labels of one name (its URL
    // changed) are one series.
    let mut by_destination: BTreeMap<(usize, String, String), f64> = BTreeMap::new();
    let mut by_kind = Family::counter("alerts_by_kind");
    // Any name this version does not describe.
    let mut other = Family::counter("events");
    let names: BTreeMap<&str, f64> = total
        .as_object()
        .map(|m| m.keys().map(|k| (k.as_str(), count(k))).collect())
        .unwrap_or_default();
    for (name, n) in names {
        if FIXED.iter().any(|(fixed, _, _)| *fixed == name)
            || name == ACCEPTANCE_MS_SUM
            || name.starts_with(ACCEPTANCE_BUCKET_PREFIX)
            || status_calls().any(|(_, _, counter)| counter == name)
        {
            continue;
        }
        let prefixed = [EFFECT_TO_PREFIX, RESULT_TO_PREFIX]
            .iter()
            .enumerate()
            .find_map(|(i, prefix)| Some((i, name.strip_prefix(prefix)?.split_once(':')?)));
        if let Some((i, (result, destination))) = prefixed {
            // A destination's short name (the route's kind, or `default`), which a query can
            // name (`{destination="default"}`).
            let short = destination_parts(destination).0.to_string();
            let key = (i, result.to_string(), short);
            *by_destination.entry(key).or_default() += n;
            continue;
        }
        let (family, label, value) = if let Some(kind) = name.strip_prefix(ALERTS_BY_KIND_PREFIX) {
            (&mut by_kind, "kind", kind)
        } else if let Some(reason) = name.strip_prefix(DROPPED_PREFIX) {
            (&mut dropped, "reason", reason)
        } else if let Some(reason) = name.strip_prefix(REJECTED_PREFIX) {
            (&mut rejected, "reason", reason)
        } else {
            (&mut other, "name", name)
        };
        family.push(vec![(label, value.to_string())], n);
    }
    let mut per_destination =
        ["effects_by_destination", "results_by_destination"].map(Family::counter);
    for ((i, result, destination), n) in by_destination {
        per_destination[i].push(vec![("result", result), ("destination", destination)], n);
    }
    families.extend(per_destination);
    families.extend([by_kind, acceptance_histogram(total)]);
    families.push(status_call_family(total));
    families.extend([dropped, rejected, other]);
    families
}

/// Every status-call counter: who asked, how it ended, and its name.
fn status_calls() -> impl Iterator<Item = (AskedBy, StatusCallAnswer, String)> {
    AskedBy::ALL.into_iter().flat_map(|asked| {
        StatusCallAnswer::ALL.map(|answer| (asked, answer, status_call(asked, answer)))
    })
}

/// Status calls by who asked and how they ended: every pair served, 0 until counted.
fn status_call_family(total: &Value) -> Family {
    let mut family = Family::counter("status_calls");
    for (asked, answer, name) in status_calls() {
        let n = total.get(&name).and_then(Value::as_u64).unwrap_or(0) as f64;
        let labels = vec![("asked_by", name_of(&asked)), ("answer", name_of(&answer))];
        family.push(labels, n);
    }
    family
}

/// The time from settlement to the destination's acceptance: the shards keep each bucket's
/// own count (`acceptance_le:<bound>`), made cumulative here as Prometheus reads a histogram;
/// every bound is served, 0 until counted.
fn acceptance_histogram(total: &Value) -> Family {
    let count = |name: &str| total.get(name).and_then(Value::as_u64).unwrap_or(0) as f64;
    let help =
        "Time from an operation's settlement to its side effect's acceptance by the destination.";
    let mut family = Family::new("effect_acceptance_seconds", Kind::Histogram, help);
    let bounds = ACCEPTANCE_BUCKETS_SECS.iter().map(|b| b.to_string());
    let mut cumulative = 0.0;
    for le in bounds.chain(["+Inf".to_string()]) {
        cumulative += count(&format!("{ACCEPTANCE_BUCKET_PREFIX}{le}"));
        family
            .samples
            .push(Sample(vec![("le", le)], cumulative, "_bucket"));
    }
    let sum = count(ACCEPTANCE_MS_SUM) / 1_000.0;
    family.samples.push(Sample(vec![], sum, "_sum"));
    family.samples.push(Sample(vec![], cumulative, "_count"));
    family
}

/// Each configured destination's host (`destination_info`), state (one series per state, 1
/// for the current), waiting effects, paced attempts in flight and failures in a row,
/// labelled by its short name.
fn destination_families(destinations: &Value) -> Vec<Family> {
    let help = "A destination's state: 1 for the current one (healthy, open, draining, paused by hand; unknown when its desk could not be asked).";
    let mut state = Family::gauge("destination_state", help);
    let help =
        "Side effects waiting for a destination's release (while it is open or over its pace).";
    let mut waiting = Family::gauge("destination_waiting_effects", help);
    let help = "A paced destination's attempts holding a slot.";
    let mut in_flight = Family::gauge("destination_in_flight_effects", help);
    let help = "A destination's failed attempts since its last success.";
    let mut failures = Family::gauge("destination_failures_in_row", help);
    let help = "A destination's short name (the route's kind, or default for EFFECT_URL) and the host it sends to (queue:<binding> or service:<binding> for a binding): always 1.";
    let mut info = Family::gauge("destination_info", help);
    for d in destinations.as_array().into_iter().flatten() {
        let (name, shown) = destination_parts(d["label"].as_str().unwrap_or_default());
        let label = name.to_string();
        let host = destination_host(shown).to_string();
        info.push(vec![("destination", label.clone()), ("host", host)], 1.0);
        let now = d["state"].as_str().unwrap_or("unknown");
        for s in DESTINATION_STATES {
            let labels = vec![("destination", label.clone()), ("state", s.to_string())];
            state = state.with(labels, f64::from(u8::from(s == now)));
        }
        let gauge = |field: &str| d[field].as_u64().unwrap_or(0) as f64;
        let by = || vec![("destination", label.clone())];
        waiting = waiting.with(by(), gauge("waiting"));
        in_flight = in_flight.with(by(), gauge("in_flight"));
        failures = failures.with(by(), gauge("failures_in_row"));
    }
    vec![info, state, waiting, in_flight, failures]
}

/// The reconciliation passes: completed passes (a counter the lease stores), when the last
/// pass and the last complete one started, and the last pass's status calls and errors.
fn reconcile_families(reconcile: &Value) -> Vec<Family> {
    let completed = reconcile["completed_passes"].as_u64().unwrap_or(0) as f64;
    let help = "Reconcile passes that reached the end of the open index.";
    let passes = Family::new("reconcile_passes_completed", Kind::Counter, help);
    let mut families = vec![passes.with(vec![], completed)];
    let seconds = |v: &Value| {
        v.as_str()
            .and_then(crate::timestamp::parse_rfc3339_ms)
            .map(|ms| ms as f64 / 1000.0)
    };
    if let Some(at) = seconds(&reconcile["last_complete"]) {
        let help =
            "When the newest pass that reached the end of the open index started (Unix seconds).";
        let gauge = Family::gauge("reconcile_last_complete_pass_timestamp_seconds", help);
        families.push(gauge.with(vec![], at));
    }
    let last = &reconcile["last"];
    if let Some(at) = seconds(&last["at"]) {
        let report = &last["report"];
        let n = |field: &str| report[field].as_u64().unwrap_or(0) as f64;
        let help = "When the newest pass that released the lease started (Unix seconds).";
        let started = Family::gauge("reconcile_last_pass_timestamp_seconds", help);
        let help = "Status-API calls the newest pass made, by answer (answered, unanswered: timed out or unreachable).";
        let calls = Family::gauge("reconcile_last_pass_status_calls", help);
        let answered = (n("status_calls") - n("status_unanswered")).max(0.0);
        let errors = Family::gauge("reconcile_last_pass_errors", "Errors in the newest pass.");
        families.extend([
            started.with(vec![], at),
            calls
                .with(vec![("answer", "answered".into())], answered)
                .with(
                    vec![("answer", "unanswered".into())],
                    n("status_unanswered"),
                ),
            errors.with(vec![], n("errors")),
        ]);
        let open = &report["open"];
        if open.is_object() {
            families.extend(OPEN.iter().map(|(name, field, help)| {
                let n = open[field].as_u64().unwrap_or(0) as f64;
                Family::gauge(name, help).with(vec![], n)
            }));
        }
    }
    families
}

/// What the open index held when the newest pass listed it whole (`open` in its report):
/// nothing when that pass listed only a window of it, or none. Each gauge's name, its field,
/// and what it says.
const OPEN: [(&str, &str, &str); 3] = [
    ("open_operations", "operations", "Operations not terminal, in the open index as the newest pass listed it whole."),
    ("stuck_operations", "stuck", "Operations not terminal and alerted stuck, in the open index as the newest pass listed it whole."),
    ("effects_not_done", "effects_not_done", "Terminal operations whose side effect is not done, in the open index as the newest pass listed it whole (a parked effect leaves the index as it parks)."),
];

/// With `GEMINI_WEBHOOK_NAME` set: 1 while no bad state of the Gemini webhook is alerted on.
fn webhook_family(webhook: &Value) -> Option<Family> {
    let name = webhook["name"].as_str()?;
    let ok = f64::from(u8::from(webhook["alerted_state"].is_null()));
    let help =
        "1 unless the reconcile passes found the Gemini webhook disabled or missing (and alerted).";
    let gauge = Family::gauge("gemini_webhook_ok", help);
    Some(gauge.with(vec![("webhook", name.to_string())], ok))
}

fn write_family(page: &mut String, family: &Family, format: Format) {
    let full = format!("{PREFIX}{}", family.name);
    let sample_name = match family.kind {
        Kind::Counter => format!("{full}_total"),
        Kind::Gauge | Kind::Histogram => full.clone(),
    };
    // The text format names a counter's family with its `_total`; OpenMetrics without.
    let family_name = match format {
        Format::Text => &sample_name,
        Format::OpenMetrics => &full,
    };
    let kind = name_of(&family.kind);
    let help = escape(family.help, format == Format::OpenMetrics);
    let _ = writeln!(page, "# HELP {family_name} {help}");
    let _ = writeln!(page, "# TYPE {family_name} {kind}");
    for Sample(labels, value, suffix) in &family.samples {
        page.push_str(&sample_name);
        page.push_str(suffix);
        if !labels.is_empty() {
            let labels: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape(v, true)))
                .collect();
            let _ = write!(page, "{{{}}}", labels.join(","));
        }
        let _ = writeln!(page, " {value}");
    }
}

/// Escapes a label value (`quotes`) or a help text: backslash and newline, and the double
/// quote where the format asks (label values; OpenMetrics' help too).
fn escape(text: &str, quotes: bool) -> String {
    // Backslashes first, so the ones added after are not doubled.
    let out = text.replace('\\', "\\\\").replace('\n', "\\n");
    if !quotes {
        return out;
    }
    out.replace('"', "\\\"")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stats() -> Value {
        json!({
            "total": {
                "deliveries": 4, "duplicates_skipped": 1, "settled_by_webhook": 3,
                "effect_successes": 2, "effect_parks": 1, "dropped_stale_update_time": 2,
                "rejected_signature_invalid": 5, "stranger_nudges": 1, "new_counter": 7,
                "effect_to:delivered:EFFECT_URL: http://127.0.0.1:9/…": 2,
                "effect_to:delivered:EFFECT_URL: http://old.example/…": 1,
                "effect_to:parked:route billing: https://b.example/…": 1,
                "result_to:failed:EFFECT_URL: http://127.0.0.1:9/…": 4,
                "acceptance_le:0.5": 1, "acceptance_le:60": 1, "acceptance_le:+Inf": 1,
                "acceptance_ms_sum": 90_000_250u64, "alerts_by_kind:effect_failing": 1,
                "effect_retry_after": 3, "status_calls:pass:answered": 4,
                "status_calls:nudge:unanswered": 2
            },
            "destinations": [
                {"label": "EFFECT_URL: http://127.0.0.1:9/…", "state": "open", "waiting": 3,
                 "in_flight": 0, "failures_in_row": 4, "last_error": "503"},
                {"label": "route py: queue:PY", "state": "healthy"},
                {"label": "odd \"name\"\\x\ny", "state": "unknown", "last_error": "no desk"}
            ],
            "reconcile": {
                "completed_passes": 12,
                "last_complete": "2026-11-18T11:00:00Z",
                "last": {"at": "2026-11-18T11:05:00.500Z",
                         "report": {"status_calls": 3, "status_unanswered": 1, "errors": 0,
                                    "open": {"operations": 5, "stuck": 2,
                                             "effects_not_done": 3}}}
            },
            "gemini_webhook": {"name": "webhooks/w", "alerted_state": "disabled"}
        })
    }

    fn lines(page: &str) -> Vec<&str> {
        page.lines().collect()
    }

    #[test]
    fn counters_are_the_totals_with_total_suffix_and_zero_until_counted() {
        let page = render(&stats(), Format::Text);
        let l = lines(&page);
        for want in [
            "gemini_once_deliveries_total 4",
            "gemini_once_settled_total{path=\"webhook\"} 3",
            "gemini_once_settled_total{path=\"reconcile\"} 0",
            "gemini_once_duplicates_total 1",
            "gemini_once_effects_total{result=\"delivered\"} 2",
            "gemini_once_effects_total{result=\"failed\"} 0",
            "gemini_once_effects_total{result=\"parked\"} 1",
            "gemini_once_dropped_total{reason=\"stale_update_time\"} 2",
            "gemini_once_rejected_total{reason=\"signature_invalid\"} 5",
            "gemini_once_stranger_nudges_total 1",
            "gemini_once_events_total{name=\"new_counter\"} 7",
            "gemini_once_alerts_total 0",
            "gemini_once_reconcile_passes_completed_total 12",
        ] {
            assert!(l.contains(&want), "{want} missing from\n{page}");
        }
    }

    #[test]
    fn labelled_counters_are_families_of_their_own() {
        let page = render(&stats(), Format::Text);
        let l = lines(&page);
        for want in [
            "gemini_once_effects_by_destination_total{result=\"delivered\",destination=\"default\"} 3",
            "gemini_once_effects_by_destination_total{result=\"parked\",destination=\"billing\"} 1",
            "gemini_once_alerts_by_kind_total{kind=\"effect_failing\"} 1",
            "gemini_once_effects_retried_after_asked_total 3",
            "gemini_once_results_by_destination_total{result=\"failed\",destination=\"default\"} 4",
        ] {
            assert!(l.contains(&want), "{want} missing from\n{page}");
        }
        assert!(
            !page.contains("name=\"effect_to:"),
            "not also served as an unnamed event"
        );
        assert!(!page.contains("name=\"acceptance_"), "{page}");
    }

    #[test]
    fn the_acceptance_histogram_is_cumulative_with_sum_and_count() {
        let page = render(&stats(), Format::Text);
        let l = lines(&page);
        assert!(page.contains("# TYPE gemini_once_effect_acceptance_seconds histogram\n"));
        for want in [
            "gemini_once_effect_acceptance_seconds_bucket{le=\"0.5\"} 1",
            "gemini_once_effect_acceptance_seconds_bucket{le=\"30\"} 1",
            "gemini_once_effect_acceptance_seconds_bucket{le=\"60\"} 2",
            "gemini_once_effect_acceptance_seconds_bucket{le=\"86400\"} 2",
            "gemini_once_effect_acceptance_seconds_bucket{le=\"+Inf\"} 3",
            "gemini_once_effect_acceptance_seconds_sum 90000.25",
            "gemini_once_effect_acceptance_seconds_count 3",
        ] {
            assert!(l.contains(&want), "{want} missing from\n{page}");
        }
    }

    #[test]
    fn every_family_has_help_and_type_before_its_samples_and_the_prefix() {
        for format in [Format::Text, Format::OpenMetrics] {
            let page = render(&stats(), format);
            let mut typed: Vec<String> = Vec::new();
            let mut helped: Vec<String> = Vec::new();
            for line in page.lines() {
                if let Some(rest) = line.strip_prefix("# HELP ") {
                    helped.push(rest.split(' ').next().unwrap().to_string());
                } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                    typed.push(rest.split(' ').next().unwrap().to_string());
                } else if line != "# EOF" {
                    let name = line.split(['{', ' ']).next().unwrap();
                    assert!(name.starts_with(PREFIX), "{line}");
                    let family = typed.last().expect("a TYPE before a sample");
                    assert!(name.starts_with(family.as_str()), "{line} under {family}");
                }
            }
            assert_eq!(typed, helped, "{format:?}");
            let unique: std::collections::BTreeSet<_> = typed.iter().collect();
            assert_eq!(unique.len(), typed.len(), "each family once: {typed:?}");
        }
    }

    #[test]
    fn openmetrics_names_counter_families_without_total_and_ends_with_eof() {
        let page = render(&stats(), Format::OpenMetrics);
        assert!(page.contains("# TYPE gemini_once_deliveries counter\n"));
        assert!(page.contains("\ngemini_once_deliveries_total 4\n"));
        assert!(page.ends_with("# EOF\n"));
        let text = render(&stats(), Format::Text);
        assert!(text.contains("# TYPE gemini_once_deliveries_total counter\n"));
        assert!(!text.contains("# EOF"));
    }

    #[test]
    fn destinations_are_labelled_by_short_name_with_one_series_per_state() {
        let page = render(&stats(), Format::Text);
        let l = lines(&page);
        let d = "default";
        for s in DESTINATION_STATES {
            let want = format!(
                "gemini_once_destination_state{{destination=\"{d}\",state=\"{s}\"}} {}",
                u8::from(s == "open")
            );
            assert!(l.contains(&want.as_str()), "{want}");
        }
        assert!(l.contains(&"gemini_once_destination_waiting_effects{destination=\"default\"} 3"));
        assert!(l.contains(&"gemini_once_destination_failures_in_row{destination=\"default\"} 4"));
        for want in [
            "gemini_once_destination_info{destination=\"default\",host=\"127.0.0.1:9\"} 1",
            "gemini_once_destination_info{destination=\"py\",host=\"queue:PY\"} 1",
        ] {
            assert!(l.contains(&want), "{want} missing from\n{page}");
        }
        // Every configured label but the odd one becomes a name a query can write.
        for line in l.iter().filter(|line| line.contains("destination=\"")) {
            let value = line
                .split("destination=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next();
            let value = value.unwrap();
            assert!(
                value.starts_with("odd") || !value.contains(['…', ':', ' ', '/']),
                "{line}"
            );
        }
    }

    #[test]
    fn the_build_is_a_series_of_its_own() {
        let page = render(&json!({}), Format::OpenMetrics);
        let want =
            format!("gemini_once_build_info{{version=\"{VERSION}\",commit=\"{COMMIT}\"}} 1\n");
        assert!(
            page.contains("# TYPE gemini_once_build_info gauge\n"),
            "{page}"
        );
        assert!(page.contains(&want), "{page}");
        assert_eq!(VERSION, env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn label_values_are_escaped() {
        let page = render(&stats(), Format::Text);
        assert!(
            page.contains(r#"destination="odd \"name\"\\x\ny",state="unknown"} 1"#),
            "{page}"
        );
        assert_eq!(escape("a\"b", false), "a\"b", "a help text keeps quotes");
        assert_eq!(escape("a\\b\nc", false), "a\\\\b\\nc");
    }

    #[test]
    fn reconcile_times_are_unix_seconds_and_status_calls_split_by_answer() {
        let page = render(&stats(), Format::Text);
        let l = lines(&page);
        assert!(
            l.contains(&"gemini_once_reconcile_last_complete_pass_timestamp_seconds 1794999600")
        );
        assert!(l.contains(&"gemini_once_reconcile_last_pass_timestamp_seconds 1794999900.5"));
        assert!(l.contains(&"gemini_once_reconcile_last_pass_status_calls{answer=\"answered\"} 2"));
        assert!(
            l.contains(&"gemini_once_reconcile_last_pass_status_calls{answer=\"unanswered\"} 1")
        );
        assert!(l.contains(&"gemini_once_gemini_webhook_ok{webhook=\"webhooks/w\"} 0"));
    }

    #[test]
    fn status_calls_are_served_for_every_asker_and_answer() {
        let page = render(&stats(), Format::Text);
        let l = lines(&page);
        let calls: Vec<&str> = l
            .iter()
            .copied()
            .filter(|line| line.starts_with("gemini_once_status_calls_total{"))
            .collect();
        assert_eq!(calls.len(), 12, "3 askers by 4 answers:\n{page}");
        for want in [
            "gemini_once_status_calls_total{asked_by=\"pass\",answer=\"answered\"} 4",
            "gemini_once_status_calls_total{asked_by=\"nudge\",answer=\"unanswered\"} 2",
            "gemini_once_status_calls_total{asked_by=\"queue\",answer=\"not_found\"} 0",
            "gemini_once_status_calls_total{asked_by=\"pass\",answer=\"refused\"} 0",
        ] {
            assert!(l.contains(&want), "{want} missing from\n{page}");
        }
        assert!(
            !page.contains("name=\"status_calls:"),
            "not also an unnamed event"
        );
    }

    #[test]
    fn the_open_index_gauges_come_from_a_pass_that_listed_it_whole() {
        let page = render(&stats(), Format::Text);
        let l = lines(&page);
        for want in [
            "gemini_once_open_operations 5",
            "gemini_once_stuck_operations 2",
            "gemini_once_effects_not_done 3",
        ] {
            assert!(l.contains(&want), "{want} missing from\n{page}");
        }
        let mut windowed = stats();
        windowed["reconcile"]["last"]["report"]["open"] = Value::Null;
        let page = render(&windowed, Format::Text);
        assert!(page.contains("gemini_once_reconcile_last_pass_errors 0\n"));
        for absent in ["open_operations", "stuck_operations", "effects_not_done"] {
            assert!(
                !page.contains(absent),
                "{absent} served from a window:\n{page}"
            );
        }
        let mut older = stats();
        older["reconcile"]["last"]["report"]
            .as_object_mut()
            .unwrap()
            .remove("open");
        assert!(!render(&older, Format::Text).contains("open_operations"));
    }

    #[test]
    fn nothing_yet_is_a_page_of_zeros_without_times() {
        let page = render(&json!({}), Format::Text);
        assert!(page.contains("gemini_once_deliveries_total 0\n"));
        assert!(!page.contains("timestamp_seconds"));
        assert!(!page.contains("gemini_webhook_ok"), "no webhook configured");
        assert!(page.contains(
            "gemini_once_status_calls_total{asked_by=\"queue\",answer=\"answered\"} 0\n"
        ));
        assert!(!page.contains("open_operations"), "no pass yet");
    }

    #[test]
    fn the_scraper_s_accept_chooses_the_format() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::from_accept(Some(prometheus)), Format::OpenMetrics);
        assert_eq!(Format::from_accept(Some("text/plain")), Format::Text);
        assert_eq!(Format::from_accept(None), Format::Text);
        assert!(Format::Text.content_type().contains("version=0.0.4"));
    }
}
