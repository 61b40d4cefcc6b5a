//! Configuration: every variable the worker reads, in one table ([`VARIABLES`]), parsed from
//! the Worker's vars/secrets.
//!
//! Guarantees: the table is the one description of a variable (name, kind and range, default,
//! whether it is a secret, meaning); parsing, `/v1/config`, the fuzzing in
//! `tests/properties.rs` and the check of `docs/CONFIGURATION.md` and `.dev.vars.example`
//! (`tests/config_docs.rs`) all read it, so a variable cannot be known to one and missed by
//! another. Parsing is pure (a lookup function in, a [`Config`] or the first [`ConfigError`]
//! out, each variable checked in table order, then the rules that tie two together) and never
//! panics; an error always names the variable, so the edge can answer 503 with that name
//! while an operator fixes it (Gemini keeps retrying meanwhile); secrets never appear in an
//! error, a `Debug` dump or `/v1/config`. Durations are whole seconds (or ms where the name
//! says so); 0 is accepted where it means something, so tests need not wait.

use serde_json::{json, Value};
use thiserror::Error;

use crate::alert_format::{AlertFormat, FORMAT_NAMES, PAGERDUTY_EVENTS_URL};
use crate::destination::desk::PROBE_LAPSE_MS;
use crate::destination::protocol::{DeskSettings, Pace};
pub use crate::destination_label::Destination;
use crate::destination_label::DEFAULT_DESTINATION;
use crate::operator::access::{parse_list, Tokens, MIN_TOKEN_CHARS};
use crate::signature::{Secret, SecretError};

/// Standard Webhooks and Gemini's guidance on timestamp skew.
pub const DEFAULT_TOLERANCE_SECS: i64 = 300;
/// Gemini wants an answer within a few seconds; a slower destination is retried.
pub const DEFAULT_EFFECT_TIMEOUT_MS: i64 = 5_000;
/// Far longer than any attempt can still be in flight (timeout + the runtime's 30 s grace).
pub const DEFAULT_CLAIM_TTL_SECS: i64 = 600;
/// How long the runtime may let work run on after its deadline: a claim should outlast the
/// effect timeout by at least this.
pub const RUNTIME_GRACE_MS: i64 = 30_000;
/// Audit window, well past Gemini's 24 h of retries.
pub const DEFAULT_RETENTION_DAYS: i64 = 14;
/// 1 MiB: Gemini envelopes are a few hundred bytes; this bounds memory per request.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1 << 20;
/// First retry of a failed side effect; doubles per attempt.
pub const DEFAULT_RETRY_BASE_SECS: i64 = 30;
/// Backoff cap: a failing destination is still tried every hour.
pub const DEFAULT_RETRY_MAX_SECS: i64 = 3_600;
/// Absorbs nearly every webhook and its first retries before polling.
pub const DEFAULT_RECONCILE_GRACE_SECS: i64 = 90;
/// Longest healthy batch plus margin: alert, never auto-close.
pub const DEFAULT_STUCK_AFTER_SECS: i64 = 21_600;
/// A side effect still not done an hour after settling needs a person.
pub const DEFAULT_EFFECT_ALERT_AFTER_SECS: i64 = 3_600;
/// Inside KV's 1,000 operations per invocation on every plan (use 45 on the Free plan).
pub const DEFAULT_RECONCILE_BUDGET: u32 = 900;
/// Status calls a second from the fan-out queue's consumers, all together. Gemini publishes
/// no limit for its status API: 20 a second polls a day of lost webhooks at 1 M completions a
/// month (about 33,000 open) within 30 minutes, and a 429 pauses every consumer until its
/// Retry-After.
pub const DEFAULT_RECONCILE_POLL_RATE: u32 = 20;
/// Below this many open operations left to visit a pass polls them itself (no queue
/// operations); at or above it, with RECONCILE_QUEUE bound, it schedules them on the queue.
pub const DEFAULT_RECONCILE_FANOUT_ABOVE: usize = 200;
/// The reconciliation lease's TTL. A live pass renews it every quarter of this (a heartbeat),
/// so it may be short: a pass that dies (a deploy, a crash) blocks the next for at most this
/// long, about one minute, instead of a whole pass's length.
pub const DEFAULT_RECONCILE_LEASE_SECS: i64 = 60;
/// Shortest lease: below it the heartbeat (every quarter of the TTL) would spend subrequests
/// on renewals every second.
pub const MIN_RECONCILE_LEASE_SECS: i64 = 5;
/// Longest lease: ten minutes; a longer one only makes a dead pass block longer.
pub const MAX_RECONCILE_LEASE_SECS: i64 = 600;
/// A pass starts no new entry after this long and saves its cursor. A scheduled handler may
/// run for 15 minutes on Cloudflare, but a pass should be short: well inside that limit, far
/// from the next cron run (5 minutes), and long enough for a full budget of healthy status
/// calls (900 subrequests of ~50 ms each). The entry in hand finishes past it (at most one
/// status call and one gate call).
pub const DEFAULT_RECONCILE_DEADLINE_SECS: i64 = 60;
/// Longest deadline: ten minutes, still well inside the runtime's 15 minutes.
pub const MAX_RECONCILE_DEADLINE_SECS: i64 = 600;
/// The audit over the whole `op:` ledger starts this long after the last one finished: the
/// `open:` index is a hint (KV is eventually consistent), and a day bounds how long an
/// operation whose index entry was lost goes unpolled, at one ledger walk a day (O(ledger)
/// KV lists daily instead of every five minutes).
pub const DEFAULT_RECONCILE_AUDIT_SECS: i64 = 86_400;
/// Longest audit interval: a week.
pub const MAX_RECONCILE_AUDIT_SECS: i64 = 7 * 86_400;
/// The counters' window: each isolate sends its gates' counts to a stats shard at most once
/// per window (so at volume a completion costs no shard call of its own), and a gate holds
/// counts nothing else wakes it for this long; `/v1/stats` lags by up to twice as much.
pub const DEFAULT_STATS_FLUSH_SECS: i64 = 10;
/// Longest flush window: held counts wait in memory (a gate's, an isolate's), and an idle
/// object is evicted after about a minute, so a longer window would routinely lose them.
pub const MAX_STATS_FLUSH_SECS: i64 = 60;
/// How long a retired names' shard holds the first keep of a batch before storing it: the
/// keeps of one bucket's retirement moment that arrive meanwhile join it and are stored in one
/// row write (src/operation/retired_names.rs). Long enough for alarms set for one millisecond
/// to reach the shard from their gates, short since every gate waiting is billed duration.
pub const DEFAULT_RETIRED_KEEP_WAIT_MS: i64 = 50;
/// The official samples' key set for dynamic webhooks.
pub const DEFAULT_GEMINI_JWKS_URL: &str =
    "https://generativelanguage.googleapis.com/.well-known/jwks.json";
/// Gemini's public API.
pub const DEFAULT_GEMINI_API_BASE: &str = "https://generativelanguage.googleapis.com";

/// How long the first side-effect attempt of an unregistered operation waits when
/// `EFFECT_ROUTES` is set: a registration racing its completion (a short interaction often
/// finishes before the code that started it registers it) still picks the route, and the
/// first attempt's body, under its `webhook-id`, is the only one ever sent.
pub const DEFAULT_UNREGISTERED_HOLD_SECS: i64 = 15;
/// Strangers' nudges within [`DEFAULT_STRANGER_ALERT_WINDOW_SECS`] that raise the one
/// aggregated alert of that window.
pub const DEFAULT_STRANGER_ALERT_THRESHOLD: i64 = 20;
/// The window of the aggregated alert: at most one alert about strangers' nudges per window.
pub const DEFAULT_STRANGER_ALERT_WINDOW_SECS: i64 = 3_600;
/// Least time between two status questions a held operation's nudges cause: a stranger who
/// knows one held name (or, with a read token, every open one) makes at most one status call
/// a minute per name, and a genuine nudge still settles within a minute or by the next cron.
pub const DEFAULT_CONFIRM_INTERVAL_SECS: i64 = 60;
const DAY_SECS: i64 = 86_400;
/// Gemini can report `SUCCEEDED` shortly before the results file can be downloaded: half an
/// hour is far past the delays reported and far inside the file's 48 hours.
pub const DEFAULT_RESULTS_FILE_WAIT_SECS: i64 = crate::results::progress::FILE_WAIT_MS / 1_000;
/// Five failures in a row: one blip (a deploy, a restart) does not open a destination, a
/// real outage does within seconds of traffic.
pub const DEFAULT_DESTINATION_OPEN_AFTER: i64 = 5;
/// Probes every 15 s at most: a destination back from an outage is found within that (so
/// what waited is all delivered within 20 s of its recovery at the drain rate), at 240
/// requests an hour to one that stays down.
pub const DEFAULT_DESTINATION_PROBE_MAX_SECS: i64 = 15;
/// The largest pace accepted (releases a second, or attempts in flight).
const MAX_PACE: i64 = 10_000;

/// One variable the worker reads: one row of [`VARIABLES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variable {
    pub name: &'static str,
    pub kind: Kind,
    /// What an absent or blank value means.
    pub default: Fallback,
    /// Shown by `/v1/config` only as `set` or `not set`, never echoed.
    pub secret: bool,
    /// One line: what it does (`docs/CONFIGURATION.md` says more).
    pub meaning: &'static str,
}

/// The values a variable accepts, and so how it is parsed, shown and fuzzed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A whole number from `min` to `max`, both included.
    Whole { min: i64, max: i64 },
    /// `true` or `false`.
    Flag,
    /// An `http://` or `https://` URL (a trailing `/` is dropped). `/v1/config` shows its
    /// origin only: a destination or an alert sink often carries a credential in its path.
    Url,
    /// An `http://` or `https://` URL of a public endpoint, shown in full.
    PublicUrl,
    /// One `whsec_` secret.
    SigningSecret,
    /// One or more `whsec_` secrets, separated by spaces or commas.
    SigningSecrets,
    /// One or more bearer tokens, separated by whitespace, each of visible ASCII
    /// ([`crate::operator::access::parse_list`]).
    Tokens,
    /// A JSON object from an operation's `kind` to a destination: a URL, `queue:BINDING` or
    /// `service:BINDING`, or an object `{"url": ..., "per_second": n, "concurrency": n}` whose
    /// pace fields are optional whole numbers from 1 to 10,000.
    Routes,
    /// Free text, trimmed.
    FreeText,
    /// One of these words (trimmed, any case).
    Choice(&'static [&'static str]),
}

/// What an absent (or blank) variable means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// No default: the worker answers 503 naming the variable until it is set.
    Required,
    /// Unset: the feature it configures is off (documented as `none`).
    Nothing,
    /// This number, read as if it had been written.
    Number(i64),
    /// This flag.
    Bool(bool),
    /// This text (a URL), read as if it had been written.
    Text(&'static str),
}

impl Fallback {
    /// The default as `docs/CONFIGURATION.md` and `.dev.vars.example` write it: `required`,
    /// `none`, or the value itself.
    pub fn documented(&self) -> String {
        match self {
            Fallback::Required => "required".into(),
            Fallback::Nothing => "none".into(),
            Fallback::Number(n) => n.to_string(),
            Fallback::Bool(b) => b.to_string(),
            Fallback::Text(t) => (*t).into(),
        }
    }
}

/// Every variable the worker reads, in the order of `docs/CONFIGURATION.md`'s table,
/// `.dev.vars.example` and `/v1/config`. A new variable is one row here (and, when it has a
/// reasoned default, a constant above); parsing, the fuzzing and the documentation check
/// follow from the row.
#[rustfmt::skip]
pub const VARIABLES: &[Variable] = {
    use Fallback::*;
    use Kind::*;
    use Variable as V;
    &[
        // Required.
        V::new("GEMINI_WEBHOOK_SECRETS", SigningSecrets, Required, "Gemini's webhook signing secrets; all are accepted (rotation)").secret(),
        V::new("EFFECT_URL", Url, Required, "where side effects are POSTed"),
        V::new("EFFECT_SIGNING_SECRET", SigningSecret, Required, "signs side effects the Standard Webhooks way").secret(),
        V::new("ADMIN_TOKEN", Tokens, Required, "bearer tokens (space-separated) that may do everything: the admin API's actions and the dashboard's").secret(),
        // Narrower tokens (crate::operator::access): a token has one scope.
        V::new("REGISTER_TOKENS", Tokens, Nothing, "bearer tokens (space-separated) that may only register operations and read one back: for the code that submits jobs").secret(),
        V::new("READ_TOKENS", Tokens, Nothing, "bearer tokens (space-separated) that may read everything and change nothing: the dashboard without its actions").secret(),
        // The fast path.
        V::new("EFFECT_ROUTES", Routes, Nothing, "per-kind destinations overriding EFFECT_URL: a URL, queue:BINDING or service:BINDING, or {\"url\": ..., \"per_second\": n, \"concurrency\": n} for a paced one"),
        V::new("EFFECT_PER_SECOND", Whole { min: 1, max: MAX_PACE }, Nothing, "EFFECT_URL's pace: side effects released a second at most (unset: unlimited)"),
        V::new("EFFECT_CONCURRENCY", Whole { min: 1, max: MAX_PACE }, Nothing, "EFFECT_URL's pace: side-effect attempts in flight at most (unset: unlimited)"),
        V::new("DESTINATION_OPEN_AFTER", Whole { min: 1, max: 1_000 }, Number(DEFAULT_DESTINATION_OPEN_AFTER), "health failures in a row (timeouts, network errors, 5xx, 429) after which a destination is open: its side effects wait and one probe at a time tries it"),
        V::new("DESTINATION_PROBE_MAX_SECONDS", Whole { min: 1, max: 3_600 }, Number(DEFAULT_DESTINATION_PROBE_MAX_SECS), "longest wait between probes of an open destination (from 2 s, doubling)"),
        V::new("SIGNATURE_TOLERANCE_SECONDS", Whole { min: 0, max: DAY_SECS }, Number(DEFAULT_TOLERANCE_SECS), "accepted skew of webhook-timestamp, either way"),
        V::new("EFFECT_TIMEOUT_MS", Whole { min: 1, max: 600_000 }, Number(DEFAULT_EFFECT_TIMEOUT_MS), "a side-effect attempt slower than this is retried"),
        V::new("CLAIM_TTL_SECONDS", Whole { min: 1, max: DAY_SECS }, Number(DEFAULT_CLAIM_TTL_SECS), "a claim not committed by then may be taken over"),
        V::new("EFFECT_RETRY_BASE_SECONDS", Whole { min: 1, max: DAY_SECS }, Number(DEFAULT_RETRY_BASE_SECS), "first retry of a failed side effect; doubles per attempt"),
        V::new("EFFECT_RETRY_MAX_SECONDS", Whole { min: 1, max: DAY_SECS }, Number(DEFAULT_RETRY_MAX_SECS), "backoff cap"),
        V::new("LEDGER_RETENTION_DAYS", Whole { min: 1, max: 3_650 }, Number(DEFAULT_RETENTION_DAYS), "closed operations and dead letters are kept this long, then the gate's storage is deleted but its tombstone (never less than 48 h of a run + 24 h of Gemini's retries + 2 x the signature tolerance + 10 min)"),
        V::new("LEDGER_RETENTION_SECONDS", Whole { min: 1, max: 3_650 * DAY_SECS }, Nothing, "overrides the days (to try retention: a first delivery older than it is refused); KV keeps entries at least 60 s, its minimum TTL"),
        V::new("RETIRED_KEEP_WAIT_MS", Whole { min: 0, max: 10_000 }, Number(DEFAULT_RETIRED_KEEP_WAIT_MS), "a retired names' shard stores the keeps that arrive within this of a batch's first in one row write, answering each once it is stored"),
        V::new("REQUIRE_REGISTRATION", Flag, Bool(false), "true: completions of unregistered operations are ignored"),
        V::new("MAX_BODY_BYTES", Whole { min: 1_024, max: 100 * 1024 * 1024 }, Number(DEFAULT_MAX_BODY_BYTES as i64), "larger deliveries are answered 413"),
        V::new("USAGE_LOG", Flag, Bool(false), "true: each Durable Object invocation logs a usage line (SQLite rows, alarm and KV writes, calls, wall time)"),
        V::new("STATS_FLUSH_SECONDS", Whole { min: 0, max: MAX_STATS_FLUSH_SECS }, Number(DEFAULT_STATS_FLUSH_SECS), "the counters' window: each isolate sends its gates' counts to a stats shard at most once per window"),
        // Reconciliation.
        V::new("RECONCILE_GRACE_SECONDS", Whole { min: 0, max: 30 * DAY_SECS }, Number(DEFAULT_RECONCILE_GRACE_SECS), "poll Gemini only for operations registered longer ago"),
        V::new("STUCK_AFTER_SECONDS", Whole { min: 0, max: 365 * DAY_SECS }, Number(DEFAULT_STUCK_AFTER_SECS), "alert (once) when not terminal after this long"),
        V::new("EFFECT_ALERT_AFTER_SECONDS", Whole { min: 0, max: 365 * DAY_SECS }, Number(DEFAULT_EFFECT_ALERT_AFTER_SECS), "alert (once) when a side effect is still not done"),
        V::new("RECONCILE_BUDGET", Whole { min: 5, max: 10_000 }, Number(DEFAULT_RECONCILE_BUDGET as i64), "subrequests per cron pass"),
        V::new("RECONCILE_POLL_RATE", Whole { min: 1, max: 1_000 }, Number(DEFAULT_RECONCILE_POLL_RATE as i64), "status calls a second from the fan-out queue's consumers and nudges' confirmations, all together; a 429 or 5xx pauses them until its Retry-After"),
        V::new("RECONCILE_FANOUT_ABOVE", Whole { min: 1, max: 10_000_000 }, Number(DEFAULT_RECONCILE_FANOUT_ABOVE as i64), "with the RECONCILE_QUEUE binding, a pass with at least this many open operations left to visit schedules their polls on the queue instead of polling them itself"),
        V::new("RECONCILE_LEASE_SECONDS", Whole { min: MIN_RECONCILE_LEASE_SECS, max: MAX_RECONCILE_LEASE_SECS }, Number(DEFAULT_RECONCILE_LEASE_SECS), "TTL of the reconciliation lease, renewed every quarter of it"),
        V::new("RECONCILE_DEADLINE_SECONDS", Whole { min: 1, max: MAX_RECONCILE_DEADLINE_SECS }, Number(DEFAULT_RECONCILE_DEADLINE_SECS), "a pass starts no entry after this long and saves its cursor"),
        V::new("RECONCILE_AUDIT_SECONDS", Whole { min: 0, max: MAX_RECONCILE_AUDIT_SECS }, Number(DEFAULT_RECONCILE_AUDIT_SECS), "a pass also walks the whole op: ledger this long after the last audit (0: every pass)"),
        V::new("GEMINI_API_BASE", PublicUrl, Text(DEFAULT_GEMINI_API_BASE), "Gemini's status API"),
        V::new("GEMINI_API_KEY", FreeText, Nothing, "sent as x-goog-api-key to the status API").secret(),
        V::new("ALERT_URL", Url, Nothing, "alerts are POSTed here (as ALERT_FORMAT says); without it, log lines only (with ALERT_FORMAT=pagerduty: PagerDuty's Events API v2)"),
        V::new("ALERT_FORMAT", Choice(&FORMAT_NAMES), Nothing, "the alerts' shape: json, slack, discord or pagerduty (unset: slack or discord for such a webhook URL, else json)"),
        V::new("ALERT_ROUTING_KEY", FreeText, Nothing, "PagerDuty's integration (routing) key; required with ALERT_FORMAT=pagerduty").secret(),
        V::new("ALERT_DASHBOARD_URL", PublicUrl, Nothing, "the dashboard's address, linked from every alert"),
        V::new("GEMINI_WEBHOOK_NAME", FreeText, Nothing, "the Gemini webhook whose own state each cron pass checks"),
        V::new("GEMINI_WEBHOOK_AUTO_ENABLE", Flag, Bool(true), "true: a cron pass that finds that webhook disabled_due_to_failed_deliveries re-enables it, alerts, and sweeps every open operation on the fan-out queue; false: it only alerts"),
        // Dynamic (per-job) webhooks.
        V::new("DYNAMIC_WEBHOOKS", Flag, Bool(true), "false: every JWT-signed delivery is answered 401"),
        V::new("GEMINI_JWKS_URL", PublicUrl, Text(DEFAULT_GEMINI_JWKS_URL), "key set for dynamic webhooks: its Ed25519 keys verify `v1a,` signatures, its RS256 keys tokens"),
        V::new("GEMINI_JWT_AUDIENCE", FreeText, Nothing, "when set, a dynamic webhook's token must carry it in aud"),
        V::new("STRANGER_ALERT_THRESHOLD", Whole { min: 1, max: 1_000_000 }, Number(DEFAULT_STRANGER_ALERT_THRESHOLD), "dynamic-webhook nudges for operations the worker does not hold (not registered), within the window, that raise one aggregated alert"),
        V::new("STRANGER_ALERT_WINDOW_SECONDS", Whole { min: 60, max: 7 * DAY_SECS }, Number(DEFAULT_STRANGER_ALERT_WINDOW_SECS), "at most one alert about such nudges per window"),
        V::new("CONFIRM_INTERVAL_SECONDS", Whole { min: 1, max: DAY_SECS }, Number(DEFAULT_CONFIRM_INTERVAL_SECS), "least time between two status questions a held operation's nudges cause (its confirmation's questions included): bounds the status calls anyone with a token can cause per held name"),
        V::new("UNREGISTERED_HOLD_SECONDS", Whole { min: 0, max: 3_600 }, Number(DEFAULT_UNREGISTERED_HOLD_SECS), "with EFFECT_ROUTES set, an unregistered operation's first side-effect attempt waits this long for a late registration's kind"),
        // A batch's results, each its own side effect.
        V::new("RESULTS_EACH_KINDS", FreeText, Nothing, "kinds (comma-separated) whose batches default to \"results\": \"each\" when registered without results: each result becomes its own side effect"),
        V::new("RESULTS_FILE_WAIT_SECONDS", Whole { min: 0, max: 2 * DAY_SECS }, Number(DEFAULT_RESULTS_FILE_WAIT_SECS), "a results file that answers 404 (or cannot be reached) after SUCCEEDED is asked for again with backoff this long, then its results are parked and alerted"),
        V::new("RESULTS_SENDER_TIMEOUT_MS", Whole { min: 1, max: 600_000 }, Nothing, "the longest a gate waits for a result sender's answer before it sends that group again later under the same ids (unset: as long as its sends can take, their rounds of EFFECT_TIMEOUT_MS and their pacing, plus 5 s); it only shortens that wait"),
    ]
};

/// The worker's configuration: each field is the variable of [`VARIABLES`] its name says
/// (the table says what it means), or the few read together.
#[derive(Debug, Clone)]
pub struct Config {
    pub webhook_secrets: Vec<Secret>,
    pub effect_url: String,
    /// `EFFECT_ROUTES`: each `kind`'s destination overriding `effect_url`, and its pace.
    routes: Vec<Route>,
    /// `EFFECT_URL`'s pace (`EFFECT_PER_SECOND`, `EFFECT_CONCURRENCY`).
    pub effect_pace: Pace,
    pub destination_open_after: u32,
    pub destination_probe_max_secs: i64,
    pub effect_signing_secret: Secret,
    /// `ADMIN_TOKEN`, `REGISTER_TOKENS` and `READ_TOKENS`: who may call the admin API, and
    /// for what.
    pub tokens: Tokens,
    pub tolerance_secs: i64,
    pub effect_timeout_ms: i64,
    pub claim_ttl_secs: i64,
    pub retention_days: i64,
    /// `LEDGER_RETENTION_SECONDS`, when set: overrides the days (for trying retention and
    /// tombstones without waiting days).
    pub retention_secs_override: Option<i64>,
    pub retired_keep_wait_ms: i64,
    pub dynamic_webhooks: bool,
    pub usage_log: bool,
    pub require_registration: bool,
    pub max_body_bytes: usize,
    pub retry_base_secs: i64,
    pub retry_max_secs: i64,
    pub reconcile_grace_secs: i64,
    pub stuck_after_secs: i64,
    pub effect_alert_after_secs: i64,
    pub reconcile_budget: u32,
    pub reconcile_poll_rate: u32,
    pub reconcile_fanout_above: usize,
    pub reconcile_lease_secs: i64,
    pub reconcile_deadline_secs: i64,
    pub reconcile_audit_secs: i64,
    pub stats_flush_secs: i64,
    pub gemini_api_base: String,
    pub gemini_api_key: Option<ApiKey>,
    pub alert_url: Option<String>,
    /// `ALERT_FORMAT`, or the format `ALERT_URL` implies.
    pub alert_format: AlertFormat,
    /// `ALERT_ROUTING_KEY`: always set with the pagerduty format.
    pub alert_routing_key: Option<ApiKey>,
    pub alert_dashboard_url: Option<String>,
    pub gemini_webhook_name: Option<String>,
    pub gemini_webhook_auto_enable: bool,
    pub gemini_jwks_url: String,
    pub gemini_jwt_audience: Option<String>,
    pub stranger_alert_threshold: u32,
    pub stranger_alert_window_secs: i64,
    pub confirm_interval_secs: i64,
    pub unregistered_hold_secs: i64,
    /// A batch's results, each its own side effect.
    pub results: ResultsSettings,
    /// Each variable of [`VARIABLES`] as `/v1/config` shows it, in table order: taken when it
    /// was read, so the view is of exactly what was parsed and never holds a secret.
    shown: Vec<Value>,
}

/// The settings of a batch's results (`RESULTS_*`).
#[derive(Debug, Clone, Default)]
pub struct ResultsSettings {
    /// `RESULTS_EACH_KINDS`: kinds whose batches default to `"results": "each"`.
    pub each_kinds: Vec<String>,
    /// `RESULTS_FILE_WAIT_SECONDS`: how long a missing results file is asked for again.
    pub file_wait_secs: i64,
    /// `RESULTS_SENDER_TIMEOUT_MS`, when set: the most a gate waits for a result sender
    /// (`results::fanout::call_bound_ms`).
    pub sender_timeout_ms: Option<i64>,
}

/// A key sent to a service (Gemini's API key, PagerDuty's routing key); `Debug` hides it.
#[derive(Clone)]
pub struct ApiKey(pub String);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(..)")
    }
}

/// A variable that is missing or malformed. Names the variable, never its value.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{var}: {problem}")]
pub struct ConfigError {
    pub var: &'static str,
    pub problem: String,
}

impl Destination {
    /// As the operator sees it: a URL's origin only (it may carry a credential), or the
    /// binding.
    fn shown(&self) -> String {
        match self {
            Destination::Url(url) => origin_only(url),
            Destination::Queue(binding) => format!("queue:{binding}"),
            Destination::Service(binding) => format!("service:{binding}"),
        }
    }
}

fn is_binding_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn err(var: &'static str, problem: impl Into<String>) -> ConfigError {
    let problem = problem.into();
    ConfigError { var, problem }
}

/// One variable's value as read.
enum Setting {
    Unset,
    Whole(i64),
    Flag(bool),
    Url(String),
    Secret(Secret),
    Secrets(Vec<Secret>),
    Tokens(Vec<String>),
    Routes(Vec<Route>),
    Text(String),
}

/// One entry of `EFFECT_ROUTES`: its kind, destination and pace (unlimited unless its object
/// form sets one).
#[derive(Debug, Clone)]
struct Route {
    kind: String,
    destination: Destination,
    pace: Pace,
}

impl Variable {
    const fn new(name: &'static str, kind: Kind, default: Fallback, meaning: &'static str) -> Self {
        Variable {
            name,
            kind,
            default,
            secret: false,
            meaning,
        }
    }

    /// The same variable, shown by `/v1/config` only as `set` or `not set`.
    const fn secret(self) -> Self {
        Variable {
            secret: true,
            ..self
        }
    }

    /// Reads this variable through `lookup`; absent and blank are the same, and mean the
    /// default, read as if it had been written (so a default is held to its own range).
    fn read(&self, lookup: &impl Fn(&str) -> Option<String>) -> Result<Setting, ConfigError> {
        match lookup(self.name).filter(|v| !v.trim().is_empty()) {
            Some(text) => self.parse(&text),
            None => match self.default {
                Fallback::Required => Err(err(self.name, "is not set")),
                Fallback::Nothing => Ok(Setting::Unset),
                written => self.parse(&written.documented()),
            },
        }
    }

    fn parse(&self, text: &str) -> Result<Setting, ConfigError> {
        let name = self.name;
        let problem = |e: &dyn std::fmt::Display| err(name, e.to_string());
        Ok(match self.kind {
            Kind::Whole { min, max } => {
                let n = text.trim().parse::<i64>().ok();
                let range = || err(name, format!("must be a whole number from {min} to {max}"));
                Setting::Whole(n.filter(|n| (min..=max).contains(n)).ok_or_else(range)?)
            }
            Kind::Flag => match text.trim() {
                "true" => Setting::Flag(true),
                "false" => Setting::Flag(false),
                _ => return Err(err(name, "must be true or false")),
            },
            Kind::Url | Kind::PublicUrl => Setting::Url(parse_url(name, text)?),
            Kind::SigningSecret => Setting::Secret(Secret::parse(text).map_err(|e| problem(&e))?),
            Kind::SigningSecrets => Setting::Secrets(
                text.split(|c: char| c == ',' || c.is_whitespace())
                    .filter(|s| !s.is_empty())
                    .map(Secret::parse)
                    .collect::<Result<Vec<_>, SecretError>>()
                    .map_err(|e| problem(&e))?,
            ),
            Kind::Tokens => Setting::Tokens(parse_list(text).map_err(|e| problem(&e))?),
            Kind::Routes => Setting::Routes(parse_routes(name, text)?),
            Kind::FreeText => Setting::Text(text.trim().to_string()),
            Kind::Choice(words) => {
                let word = text.trim().to_ascii_lowercase();
                if !words.contains(&word.as_str()) {
                    return Err(err(name, format!("must be one of {}", words.join(", "))));
                }
                Setting::Text(word)
            }
        })
    }

    /// The value `/v1/config` shows for `setting`: a secret only as `set` or `not set` (a list
    /// with its count), a URL that may carry a credential by its origin only.
    fn shown(&self, setting: &Setting) -> Value {
        if self.secret {
            return json!(match setting {
                Setting::Unset => "not set".to_string(),
                Setting::Secrets(secrets) => format!("set ({})", secrets.len()),
                Setting::Tokens(tokens) => format!("set ({})", tokens.len()),
                _ => "set".to_string(),
            });
        }
        match setting {
            Setting::Unset if self.kind == Kind::Routes => json!({}),
            Setting::Unset => Value::Null,
            Setting::Whole(n) => json!(n),
            Setting::Flag(b) => json!(b),
            Setting::Url(url) if self.kind == Kind::Url => json!(origin_only(url)),
            Setting::Url(url) | Setting::Text(url) => json!(url),
            Setting::Routes(routes) => routes
                .iter()
                .map(|route| {
                    let shown = route.destination.shown();
                    let shown = match route.pace.limits() {
                        false => json!(shown),
                        true => json!({
                            "url": shown,
                            "per_second": route.pace.per_second,
                            "concurrency": route.pace.concurrency,
                        }),
                    };
                    (route.kind.clone(), shown)
                })
                .collect::<serde_json::Map<_, _>>()
                .into(),
            // A secret of a variable not marked secret: still never shown.
            Setting::Secret(_) | Setting::Secrets(_) | Setting::Tokens(_) => json!("set"),
        }
    }
}

fn parse_url(name: &'static str, text: &str) -> Result<String, ConfigError> {
    let v = text.trim();
    if !v.starts_with("https://") && !v.starts_with("http://") {
        return Err(err(name, "must be an http:// or https:// URL"));
    }
    Ok(v.trim_end_matches('/').to_string())
}

fn parse_routes(name: &'static str, text: &str) -> Result<Vec<Route>, ConfigError> {
    let parsed: serde_json::Map<String, Value> = serde_json::from_str(text)
        .map_err(|_| err(name, "must be a JSON object from kind to URL"))?;
    let mut routes = Vec::new();
    for (kind, target) in parsed {
        if kind == DEFAULT_DESTINATION {
            // `default` names EFFECT_URL's destination (in /metrics, alerts and the pause
            // routes): a route of that name could be neither paused nor counted apart.
            let why = "a route may not be named default: that name is EFFECT_URL's destination";
            return Err(err(name, why));
        }
        let (target, pace) = match target {
            Value::String(target) => (target, Pace::default()),
            Value::Object(fields) => parse_paced_route(name, &kind, fields)?,
            _ => {
                let why = "every value must be a URL, queue:BINDING, service:BINDING or {\"url\": ..., \"per_second\": n, \"concurrency\": n}";
                return Err(err(name, why));
            }
        };
        let destination = match target.trim().split_once(':') {
            Some(("queue", b)) if is_binding_name(b) => Destination::Queue(b.into()),
            Some(("service", b)) if is_binding_name(b) => Destination::Service(b.into()),
            Some(("queue" | "service", _)) => {
                let why = "a queue: or service: route must name a binding (letters, digits, _)";
                return Err(err(name, why));
            }
            _ => Destination::Url(parse_url(name, &target)?),
        };
        routes.push(Route {
            kind,
            destination,
            pace,
        });
    }
    Ok(routes)
}

/// A route's object form: `url` (required), `per_second` and `concurrency` (whole numbers
/// from 1 to [`MAX_PACE`]), nothing else: a misspelt field would otherwise quietly leave a
/// destination unpaced.
fn parse_paced_route(
    name: &'static str,
    kind: &str,
    fields: serde_json::Map<String, Value>,
) -> Result<(String, Pace), ConfigError> {
    let mut url = None;
    let mut pace = Pace::default();
    for (field, value) in fields {
        let whole = || match value.as_u64() {
            Some(n) if (1..=MAX_PACE as u64).contains(&n) => Ok(n as u32),
            _ => Err(err(
                name,
                format!("route {kind}: {field} must be a whole number from 1 to {MAX_PACE}"),
            )),
        };
        match field.as_str() {
            "url" => url = value.as_str().map(str::to_string),
            "per_second" => pace.per_second = Some(whole()?),
            "concurrency" => pace.concurrency = Some(whole()?),
            other => {
                return Err(err(
                    name,
                    format!("route {kind}: unknown field {other} (url, per_second, concurrency)"),
                ))
            }
        }
    }
    let url = url.ok_or_else(|| err(name, format!("route {kind}: url must be a string")))?;
    Ok((url, pace))
}

/// Every variable as read, in table order.
struct Settings(Vec<(&'static Variable, Setting)>);

impl Settings {
    /// `EFFECT_TIMEOUT_MS` and `CLAIM_TTL_SECONDS`: a claim that lapses mid-attempt lets a
    /// second attempt start beside the first, so the claim must outlast the attempt.
    fn attempt_timing(&self) -> Result<(i64, i64), ConfigError> {
        let effect_timeout_ms = self.value("EFFECT_TIMEOUT_MS", Setting::whole)?;
        let claim_ttl_secs = self.value("CLAIM_TTL_SECONDS", Setting::whole)?;
        if claim_ttl_secs * 1_000 <= effect_timeout_ms {
            let why = "must outlast EFFECT_TIMEOUT_MS (a claim that lapses mid-attempt lets a second attempt start beside it)";
            return Err(err("CLAIM_TTL_SECONDS", why));
        }
        Ok((effect_timeout_ms, claim_ttl_secs))
    }

    /// `EFFECT_RETRY_BASE_SECONDS` and `EFFECT_RETRY_MAX_SECONDS`, the one not below the other.
    fn retry_range(&self) -> Result<(i64, i64), ConfigError> {
        let base = self.value("EFFECT_RETRY_BASE_SECONDS", Setting::whole)?;
        let max = self.value("EFFECT_RETRY_MAX_SECONDS", Setting::whole)?;
        if max < base {
            let why = "must not be less than EFFECT_RETRY_BASE_SECONDS";
            return Err(err("EFFECT_RETRY_MAX_SECONDS", why));
        }
        Ok((base, max))
    }

    /// `ALERT_URL`, `ALERT_FORMAT` and `ALERT_ROUTING_KEY` together: the format a Slack or
    /// Discord webhook URL implies when none is set (they refuse any other shape), PagerDuty's
    /// own endpoint when its format has no URL, and its routing key required with it (every
    /// event would be refused without one, so no page would ever come).
    fn alert_sink(&self) -> Result<(Option<String>, AlertFormat, Option<ApiKey>), ConfigError> {
        let url = self.optional("ALERT_URL", Setting::text)?;
        let format = match self.optional("ALERT_FORMAT", Setting::text)? {
            Some(word) => AlertFormat::parse(&word)
                .ok_or_else(|| err("ALERT_FORMAT", "must be json, slack, discord or pagerduty"))?,
            None => AlertFormat::inferred(url.as_deref()),
        };
        let routing_key = self.optional("ALERT_ROUTING_KEY", Setting::text)?;
        let pagerduty = format == AlertFormat::PagerDuty;
        if pagerduty && routing_key.is_none() {
            let why = "is required when ALERT_FORMAT is pagerduty (the integration key of a PagerDuty Events API v2 service)";
            return Err(err("ALERT_ROUTING_KEY", why));
        }
        let url = url.or_else(|| pagerduty.then(|| PAGERDUTY_EVENTS_URL.to_string()));
        Ok((url, format, routing_key.map(ApiKey)))
    }

    /// The three scopes' tokens: a token in two scopes would quietly get the wider power, so
    /// it is refused, naming the narrower scope's setting.
    fn tokens(&self) -> Result<Tokens, ConfigError> {
        Tokens::new(
            self.value("ADMIN_TOKEN", Setting::tokens)?,
            self.optional("REGISTER_TOKENS", Setting::tokens)?
                .unwrap_or_default(),
            self.optional("READ_TOKENS", Setting::tokens)?
                .unwrap_or_default(),
        )
        .map_err(|overlap| err(overlap.setting.setting(), overlap.to_string()))
    }

    /// `name`'s value as `pick` takes it, `None` when unset. A name not in the table, or a
    /// value of another kind than `pick` takes, is an error naming it (a slip in this file,
    /// which `cargo test` finds at once), never a panic.
    fn optional<T>(
        &self,
        name: &'static str,
        pick: fn(&Setting) -> Option<T>,
    ) -> Result<Option<T>, ConfigError> {
        match self.0.iter().find(|(v, _)| v.name == name) {
            Some((_, Setting::Unset)) => Ok(None),
            Some((_, setting)) => pick(setting)
                .map(Some)
                .ok_or_else(|| err(name, "is read as another kind than its row in VARIABLES")),
            None => Err(err(name, "is not in VARIABLES")),
        }
    }

    /// `name`'s value, which its default (or its being required) guarantees.
    fn value<T>(
        &self,
        name: &'static str,
        pick: fn(&Setting) -> Option<T>,
    ) -> Result<T, ConfigError> {
        self.optional(name, pick)?
            .ok_or_else(|| err(name, "is not set"))
    }
}

/// `Setting`'s readers, one a variant: the value when the setting is of that kind.
macro_rules! readers {
    ($($reader:ident: $variant:ident -> $value:ty),*) => {
        impl Setting {
            $(fn $reader(&self) -> Option<$value> {
                match self {
                    Setting::$variant(v) => Some(v.clone()),
                    _ => None,
                }
            })*
        }
    };
}

readers!(whole: Whole -> i64, flag: Flag -> bool, secret: Secret -> Secret,
    secrets: Secrets -> Vec<Secret>, tokens: Tokens -> Vec<String>, routes: Routes -> Vec<Route>);

impl Setting {
    fn text(&self) -> Option<String> {
        match self {
            Setting::Url(s) | Setting::Text(s) => Some(s.clone()),
            _ => None,
        }
    }
    /// A comma-separated list of words (kinds), blanks dropped.
    fn list(&self) -> Option<Vec<String>> {
        let text = self.text()?;
        let words = text.split(',').map(str::trim).filter(|w| !w.is_empty());
        Some(words.map(str::to_string).collect())
    }
}

impl Config {
    /// Retention in milliseconds: `LEDGER_RETENTION_DAYS`, never shorter than the window in
    /// which a genuine delivery can still arrive ([`crate::signature::replay_floor_ms`]), since
    /// an operation's storage ends with it; `LEDGER_RETENTION_SECONDS` (for trying retention)
    /// as given.
    pub fn retention_ms(&self) -> i64 {
        match self.retention_secs_override {
            Some(secs) => secs * 1_000,
            None => (self.retention_days * 86_400_000)
                .max(crate::signature::replay_floor_ms(self.tolerance_secs)),
        }
    }

    /// How long KV keeps what the worker writes with a TTL (closed ledger entries, dead
    /// letters): the retention, but never below KV's minimum TTL of 60 s, which KV refuses
    /// (a shorter `LEDGER_RETENTION_SECONDS` still retires gates on time).
    pub fn kv_ttl_secs(&self) -> u64 {
        ((self.retention_ms() / 1_000).max(0) as u64).max(crate::operation::ledger::MIN_TTL_SECS)
    }

    /// Settings that work but are unsafe in production, each naming its variables: logged and
    /// shown by `/healthz`.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.claim_ttl_secs * 1_000 < self.effect_timeout_ms + RUNTIME_GRACE_MS {
            warnings.push(format!(
                "CLAIM_TTL_SECONDS ({}) is shorter than EFFECT_TIMEOUT_MS plus the runtime's 30 s grace ({} ms): an attempt the runtime lets run past its deadline could overlap the next",
                self.claim_ttl_secs,
                self.effect_timeout_ms + RUNTIME_GRACE_MS
            ));
        }
        if self.require_registration && self.gemini_api_key.is_none() {
            warnings.push("REQUIRE_REGISTRATION is true but GEMINI_API_KEY is not set: a completion that arrives before its registration is ignored, and nothing can ask Gemini about it afterwards (set GEMINI_API_KEY so the cron finds it once registered)".to_string());
        }
        if self.dynamic_webhooks && self.gemini_api_key.is_none() {
            warnings.push("DYNAMIC_WEBHOOKS is true but GEMINI_API_KEY is not set: a dynamic-webhook delivery is only a nudge the status API must confirm, so nudges for registered operations wait and those for unregistered ones are answered 503 (Gemini retries them for 24 hours) until the key is set".to_string());
        }
        for scope in self.tokens.short() {
            warnings.push(format!(
                "{} holds a token shorter than {MIN_TOKEN_CHARS} characters: easy to guess (a list is split on whitespace, so a passphrase with spaces becomes several short tokens); generate one with `openssl rand -base64 32`",
                scope.setting()
            ));
        }
        if self.alert_url.is_none() {
            warnings.push("ALERT_URL is not set: alerts (a stuck operation, a side effect failing or parked, a Gemini webhook disabled) go only to the logs, where nobody is paged (set ALERT_URL to a Slack or Discord incoming webhook or any endpoint that takes a JSON POST, or ALERT_FORMAT=pagerduty with ALERT_ROUTING_KEY)".to_string());
        }
        warnings
    }

    /// How long an unregistered operation's first side-effect attempt waits for a late
    /// registration: only when routes could change its destination.
    pub fn unregistered_hold_ms(&self) -> i64 {
        if self.routes.is_empty() {
            return 0;
        }
        self.unregistered_hold_secs * 1_000
    }

    /// The route operations of `kind` take, if one is configured.
    fn route(&self, kind: Option<&str>) -> Option<&Route> {
        kind.and_then(|k| self.routes.iter().find(|r| r.kind == k))
    }

    /// Where the side effect of an operation of `kind` goes.
    pub fn destination_for(&self, kind: Option<&str>) -> Destination {
        self.route(kind)
            .map_or(Destination::Url(self.effect_url.clone()), |r| {
                r.destination.clone()
            })
    }

    /// Where the side effect of an operation of `kind` goes, as the operator's history shows
    /// it: the route's name (or `EFFECT_URL`) and the URL's origin or the binding, never a
    /// credential a URL may carry.
    pub fn destination_label(&self, kind: Option<&str>) -> String {
        let shown = self.destination_for(kind).shown();
        match self.route(kind) {
            Some(r) => format!("route {}: {shown}", r.kind),
            None => format!("EFFECT_URL: {shown}"),
        }
    }

    /// The pace of the destination an operation of `kind` goes to (unlimited unless set).
    pub fn pace_for(&self, kind: Option<&str>) -> Pace {
        self.route(kind).map_or(self.effect_pace, |r| r.pace)
    }

    /// What the desk of the destination an operation of `kind` goes to runs by.
    pub fn desk_settings(&self, kind: Option<&str>) -> DeskSettings {
        DeskSettings {
            label: self.destination_label(kind),
            open_after: self.destination_open_after,
            probe_max_ms: self.destination_probe_max_secs * 1_000,
            slot_ttl_ms: self.claim_ttl_secs * 1_000,
            pace: self.pace_for(kind),
            asked_max_ms: self.retry_max_secs.saturating_mul(1_000),
        }
    }

    /// How long an effect (or a batch's results) its destination's desk queued waits before
    /// its gate asks again, should the desk be lost: `EFFECT_RETRY_MAX_SECONDS`, never less
    /// than the desk's probe lapse ([`PROBE_LAPSE_MS`], a minute). Every release comes from
    /// the desk's alarm, which re-arms itself, and an ask again is only told to wait in the
    /// same place ([`crate::destination::desk::Desk::queue_place`]), so a shorter fallback
    /// buys nothing but a desk call and a record write per waiting key each time: with every
    /// waiting key asking every 2 s, the one desk's calls crowd out its own releases.
    pub fn desk_fallback_ms(&self) -> i64 {
        self.retry_max_secs
            .saturating_mul(1_000)
            .max(PROBE_LAPSE_MS)
    }

    /// The desk settings of the destination an operator names: a route by its kind, else
    /// `default` for `EFFECT_URL` (no route may take that name); `None` for a name no
    /// destination has.
    pub fn destination_named(&self, name: &str) -> Option<DeskSettings> {
        let known = name == DEFAULT_DESTINATION || self.route(Some(name)).is_some();
        known.then(|| self.desk_settings(Some(name)))
    }

    /// The names [`Config::destination_named`] knows: `default`, then each route's kind.
    pub fn destination_names(&self) -> Vec<String> {
        std::iter::once(DEFAULT_DESTINATION.to_string())
            .chain(self.routes.iter().map(|r| r.kind.clone()))
            .collect()
    }

    /// Every configured destination's desk settings: `EFFECT_URL`'s, then each route's, in
    /// order (what `/v1/stats` asks about).
    pub fn destinations(&self) -> Vec<DeskSettings> {
        std::iter::once(None)
            .chain(self.routes.iter().map(|r| Some(r.kind.as_str())))
            .map(|kind| self.desk_settings(kind))
            .collect()
    }

    /// Reads every variable of [`VARIABLES`] through `lookup` (absent and empty are the
    /// same), in table order, then checks the rules that tie two variables together.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let read = |variable| Ok((variable, Variable::read(variable, &lookup)?));
        let s = Settings(VARIABLES.iter().map(read).collect::<Result<_, _>>()?);
        let (effect_timeout_ms, claim_ttl_secs) = s.attempt_timing()?;
        let (retry_base_secs, retry_max_secs) = s.retry_range()?;
        let tokens = s.tokens()?;
        let (alert_url, alert_format, alert_routing_key) = s.alert_sink()?;
        // The table's ranges keep the numbers below inside their types.
        let pace_of = |name| {
            s.optional(name, Setting::whole)
                .map(|n| n.map(|n| n as u32))
        };
        Ok(Config {
            webhook_secrets: s.value("GEMINI_WEBHOOK_SECRETS", Setting::secrets)?,
            effect_url: s.value("EFFECT_URL", Setting::text)?,
            routes: s
                .optional("EFFECT_ROUTES", Setting::routes)?
                .unwrap_or_default(),
            effect_pace: Pace {
                per_second: pace_of("EFFECT_PER_SECOND")?,
                concurrency: pace_of("EFFECT_CONCURRENCY")?,
            },
            destination_open_after: s.value("DESTINATION_OPEN_AFTER", Setting::whole)? as u32,
            destination_probe_max_secs: s.value("DESTINATION_PROBE_MAX_SECONDS", Setting::whole)?,
            effect_signing_secret: s.value("EFFECT_SIGNING_SECRET", Setting::secret)?,
            tokens,
            tolerance_secs: s.value("SIGNATURE_TOLERANCE_SECONDS", Setting::whole)?,
            effect_timeout_ms,
            claim_ttl_secs,
            retention_days: s.value("LEDGER_RETENTION_DAYS", Setting::whole)?,
            retention_secs_override: s.optional("LEDGER_RETENTION_SECONDS", Setting::whole)?,
            retired_keep_wait_ms: s.value("RETIRED_KEEP_WAIT_MS", Setting::whole)?,
            dynamic_webhooks: s.value("DYNAMIC_WEBHOOKS", Setting::flag)?,
            usage_log: s.value("USAGE_LOG", Setting::flag)?,
            require_registration: s.value("REQUIRE_REGISTRATION", Setting::flag)?,
            max_body_bytes: s.value("MAX_BODY_BYTES", Setting::whole)? as usize,
            retry_base_secs,
            retry_max_secs,
            reconcile_grace_secs: s.value("RECONCILE_GRACE_SECONDS", Setting::whole)?,
            stuck_after_secs: s.value("STUCK_AFTER_SECONDS", Setting::whole)?,
            effect_alert_after_secs: s.value("EFFECT_ALERT_AFTER_SECONDS", Setting::whole)?,
            reconcile_budget: s.value("RECONCILE_BUDGET", Setting::whole)? as u32,
            reconcile_poll_rate: s.value("RECONCILE_POLL_RATE", Setting::whole)? as u32,
            reconcile_fanout_above: s.value("RECONCILE_FANOUT_ABOVE", Setting::whole)? as usize,
            reconcile_lease_secs: s.value("RECONCILE_LEASE_SECONDS", Setting::whole)?,
            reconcile_deadline_secs: s.value("RECONCILE_DEADLINE_SECONDS", Setting::whole)?,
            reconcile_audit_secs: s.value("RECONCILE_AUDIT_SECONDS", Setting::whole)?,
            stats_flush_secs: s.value("STATS_FLUSH_SECONDS", Setting::whole)?,
            gemini_api_base: s.value("GEMINI_API_BASE", Setting::text)?,
            gemini_api_key: s.optional("GEMINI_API_KEY", Setting::text)?.map(ApiKey),
            alert_url,
            alert_format,
            alert_routing_key,
            alert_dashboard_url: s.optional("ALERT_DASHBOARD_URL", Setting::text)?,
            gemini_webhook_name: s.optional("GEMINI_WEBHOOK_NAME", Setting::text)?,
            gemini_webhook_auto_enable: s.value("GEMINI_WEBHOOK_AUTO_ENABLE", Setting::flag)?,
            gemini_jwks_url: s.value("GEMINI_JWKS_URL", Setting::text)?,
            gemini_jwt_audience: s.optional("GEMINI_JWT_AUDIENCE", Setting::text)?,
            stranger_alert_threshold: s.value("STRANGER_ALERT_THRESHOLD", Setting::whole)? as u32,
            stranger_alert_window_secs: s.value("STRANGER_ALERT_WINDOW_SECONDS", Setting::whole)?,
            confirm_interval_secs: s.value("CONFIRM_INTERVAL_SECONDS", Setting::whole)?,
            unregistered_hold_secs: s.value("UNREGISTERED_HOLD_SECONDS", Setting::whole)?,
            results: ResultsSettings {
                each_kinds: s
                    .optional("RESULTS_EACH_KINDS", Setting::list)?
                    .unwrap_or_default(),
                file_wait_secs: s.value("RESULTS_FILE_WAIT_SECONDS", Setting::whole)?,
                sender_timeout_ms: s.optional("RESULTS_SENDER_TIMEOUT_MS", Setting::whole)?,
            },
            shown: s.0.iter().map(|(v, setting)| v.shown(setting)).collect(),
        })
    }

    /// The configuration in force as the operator's page shows it (`GET /v1/config`): every
    /// variable of [`VARIABLES`], in table order, with its value, except that secrets are only
    /// `set` or `not set` and URLs that may carry a credential show their origin only. Never a
    /// secret's bytes.
    pub fn public_view(&self) -> Value {
        json!({
            "settings": VARIABLES
                .iter()
                .zip(&self.shown)
                .map(|(v, value)| json!({"name": v.name, "value": value, "secret": v.secret}))
                .collect::<Vec<_>>(),
            "warnings": self.warnings(),
        })
    }
}

/// A URL as the operator's page may show it: its origin only, because a destination or an
/// alert sink often carries a credential in its path or query (a Slack webhook URL is one).
fn origin_only(url: &str) -> String {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    let end = url[after_scheme..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| after_scheme + i);
    // userinfo (user:password@) is a credential too.
    let authority = &url[after_scheme..end];
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let rest = if end < url.len() { "/\u{2026}" } else { "" };
    format!("{}{host}{rest}", &url[..after_scheme])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::destination_label::destination_parts;

    /// The value `/v1/config` shows for the setting `name`.
    fn setting_value(view: &Value, name: &str) -> Value {
        view["settings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("{name} missing"))["value"]
            .clone()
    }
    use std::collections::HashMap;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn base() -> HashMap<&'static str, String> {
        HashMap::from([
            ("GEMINI_WEBHOOK_SECRETS", SECRET.to_string()),
            ("EFFECT_URL", "http://127.0.0.1:9/effects".to_string()),
            ("EFFECT_SIGNING_SECRET", SECRET.to_string()),
            ("ADMIN_TOKEN", "t0ken-for-the-admin-api".to_string()),
        ])
    }

    fn parse(vars: &HashMap<&'static str, String>) -> Result<Config, ConfigError> {
        Config::from_lookup(|name| vars.get(name).cloned())
    }

    #[test]
    fn every_name_is_an_env_name_and_appears_once() {
        let mut seen = std::collections::BTreeSet::new();
        for v in VARIABLES {
            assert!(
                v.name.starts_with(|c: char| c.is_ascii_uppercase())
                    && v.name
                        .chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'),
                "{}",
                v.name
            );
            assert!(seen.insert(v.name), "{} twice", v.name);
            if matches!(v.kind, Kind::SigningSecret | Kind::SigningSecrets) {
                assert!(v.secret, "{} holds key material: mark it secret", v.name);
            }
            assert!(
                !v.meaning.is_empty() && !v.meaning.contains('\n'),
                "{}",
                v.name
            );
        }
    }

    #[test]
    fn every_default_is_one_its_own_kind_accepts() {
        for v in VARIABLES {
            let fits = match (v.kind, v.default) {
                (_, Fallback::Required | Fallback::Nothing) => true,
                (Kind::Whole { min, max }, Fallback::Number(n)) => (min..=max).contains(&n),
                (Kind::Flag, Fallback::Bool(_)) => true,
                (Kind::Url | Kind::PublicUrl, Fallback::Text(t)) => {
                    parse_url(v.name, t).is_ok_and(|u| u == t)
                }
                _ => false,
            };
            assert!(fits, "{}: {:?} is no {:?}", v.name, v.default, v.kind);
            if let Fallback::Required = v.default {
                assert!(v.read(&|_: &str| None).is_err(), "{}", v.name);
            } else {
                assert!(v.read(&|_: &str| None).is_ok(), "{}", v.name);
            }
        }
    }

    #[test]
    fn parsing_reads_exactly_the_table_in_its_order() {
        let asked = std::cell::RefCell::new(Vec::new());
        let vars = base();
        Config::from_lookup(|name| {
            asked.borrow_mut().push(name.to_string());
            vars.get(name).cloned()
        })
        .unwrap();
        let names: Vec<&str> = VARIABLES.iter().map(|v| v.name).collect();
        assert_eq!(asked.into_inner(), names);
    }

    #[test]
    fn public_view_lists_the_table_in_its_order() {
        let view = parse(&base()).unwrap().public_view();
        let settings = view["settings"].as_array().unwrap();
        assert_eq!(settings.len(), VARIABLES.len());
        for (shown, v) in settings.iter().zip(VARIABLES) {
            assert_eq!(shown["name"], v.name);
            assert_eq!(shown["secret"], v.secret);
            if let (Kind::Whole { .. }, Fallback::Number(n)) = (v.kind, v.default) {
                assert_eq!(shown["value"], n, "{} shows its default", v.name);
            }
        }
    }

    /// Every whole number, from its row: each end accepted, one past each end refused naming
    /// it. The partners in a cross-variable rule are set wide so that only the range decides.
    #[test]
    fn every_range_is_the_one_in_the_table() {
        let mut wide = base();
        wide.insert("EFFECT_TIMEOUT_MS", "1".into());
        wide.insert("CLAIM_TTL_SECONDS", "86400".into());
        wide.insert("EFFECT_RETRY_BASE_SECONDS", "1".into());
        wide.insert("EFFECT_RETRY_MAX_SECONDS", "86400".into());
        parse(&wide).unwrap();
        for v in VARIABLES {
            let Kind::Whole { min, max } = v.kind else {
                continue;
            };
            for (n, ok) in [(min - 1, false), (min, true), (max, true), (max + 1, false)] {
                let mut vars = wide.clone();
                vars.insert(v.name, n.to_string());
                match parse(&vars) {
                    Ok(_) => assert!(ok, "{}={n} accepted", v.name),
                    Err(e) => {
                        assert!(!ok, "{}={n} refused: {e}", v.name);
                        assert_eq!(e.var, v.name);
                        assert!(
                            e.to_string().contains(&format!("from {min} to {max}")),
                            "{e}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn defaults_apply_when_only_required_vars_are_set() {
        let c = parse(&base()).unwrap();
        assert_eq!(c.tolerance_secs, 300);
        assert_eq!(c.effect_timeout_ms, 5_000);
        assert_eq!(c.claim_ttl_secs, 600);
        assert_eq!(c.retention_days, 14);
        assert!(!c.require_registration);
        assert_eq!(c.max_body_bytes, 1 << 20);
        assert_eq!(c.reconcile_grace_secs, 90);
        assert_eq!(c.stuck_after_secs, 21_600);
        assert_eq!(c.effect_alert_after_secs, 3_600);
        assert_eq!(c.reconcile_budget, 900);
        assert_eq!(c.reconcile_lease_secs, 60);
        assert_eq!(c.reconcile_deadline_secs, 60);
        assert_eq!(c.reconcile_audit_secs, 86_400);
        assert_eq!(c.stats_flush_secs, 10);
        assert_eq!(c.gemini_api_base, DEFAULT_GEMINI_API_BASE);
        assert!(c.gemini_api_key.is_none());
        assert!(c.alert_url.is_none());
    }

    #[test]
    fn each_missing_required_var_is_named() {
        for var in [
            "GEMINI_WEBHOOK_SECRETS",
            "EFFECT_URL",
            "EFFECT_SIGNING_SECRET",
            "ADMIN_TOKEN",
        ] {
            let mut vars = base();
            vars.remove(var);
            assert_eq!(parse(&vars).unwrap_err().var, var);
            vars.insert(var, "  ".to_string());
            assert_eq!(parse(&vars).unwrap_err().var, var);
        }
    }

    #[test]
    fn several_secrets_by_space_or_comma() {
        let mut vars = base();
        vars.insert(
            "GEMINI_WEBHOOK_SECRETS",
            format!("{SECRET}, whsec_b3RoZXI= {SECRET}"),
        );
        assert_eq!(parse(&vars).unwrap().webhook_secrets.len(), 3);
    }

    #[test]
    fn tokens_are_lists_by_scope_shown_by_their_count() {
        let mut vars = base();
        vars.insert(
            "ADMIN_TOKEN",
            "t0ken-for-the-admin-api  t0ken-for-the-admin-api-next".into(),
        );
        vars.insert(
            "REGISTER_TOKENS",
            "t0ken-for-registering-jobs\nt0ken-for-registering-next".into(),
        );
        let c = parse(&vars).unwrap();
        use crate::operator::access::Scope;
        let scope = |token: &str| c.tokens.identify(Some(&format!("Bearer {token}")));
        assert_eq!(
            scope("t0ken-for-the-admin-api-next").map(|c| c.scope),
            Some(Scope::Admin)
        );
        assert_eq!(
            scope("t0ken-for-registering-next").map(|c| c.scope),
            Some(Scope::Register)
        );
        let view = c.public_view();
        let value = |name: &str| setting_value(&view, name);
        assert_eq!(value("ADMIN_TOKEN"), "set (2)");
        assert_eq!(value("REGISTER_TOKENS"), "set (2)");
        assert_eq!(value("READ_TOKENS"), "not set");
        assert!(!view.to_string().contains("t0ken"), "{view}");
        assert!(c.warnings().iter().all(|w| !w.contains("TOKEN")));
    }

    #[test]
    fn a_token_in_two_scopes_is_refused_naming_the_narrower_setting() {
        let mut vars = base();
        vars.insert(
            "REGISTER_TOKENS",
            "t0ken-for-registering-jobs t0ken-for-the-admin-api".into(),
        );
        let e = parse(&vars).unwrap_err();
        assert_eq!(e.var, "REGISTER_TOKENS");
        assert!(e.to_string().contains("ADMIN_TOKEN"), "{e}");
        assert!(!e.to_string().contains("t0ken"), "{e} leaks a token");
        vars.insert("REGISTER_TOKENS", "t0ken-for-registering-jobs".into());
        vars.insert("READ_TOKENS", "t0ken-for-registering-jobs".into());
        let e = parse(&vars).unwrap_err();
        assert_eq!(e.var, "READ_TOKENS");
        assert!(e.to_string().contains("REGISTER_TOKENS"), "{e}");
        vars.insert("READ_TOKENS", "t0ken-for-the-admin-api".into());
        assert_eq!(parse(&vars).unwrap_err().var, "READ_TOKENS");
        vars.insert("READ_TOKENS", "t0ken-for-reading-only".into());
        assert!(parse(&vars).is_ok());
    }

    #[test]
    fn a_short_token_is_warned_about_by_its_setting() {
        let mut vars = base();
        vars.insert("GEMINI_API_KEY", "AIzaKEY".into());
        vars.insert("ALERT_URL", "https://hooks.example/alerts".into());
        vars.insert("READ_TOKENS", "t0ken-for-reading-only sh0rtie".into());
        let warnings = parse(&vars).unwrap().warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].starts_with("READ_TOKENS holds a token shorter than 16"));
        assert!(!warnings[0].contains("sh0rtie"), "never the token");
    }

    #[test]
    fn malformed_values_are_named_without_their_value() {
        let cases = [
            ("GEMINI_WEBHOOK_SECRETS", "whsec_ok= not-a-secret"),
            ("EFFECT_URL", "ftp://x"),
            ("EFFECT_SIGNING_SECRET", "plain"),
            ("SIGNATURE_TOLERANCE_SECONDS", "-1"),
            ("EFFECT_TIMEOUT_MS", "fast"),
            ("CLAIM_TTL_SECONDS", "0"),
            ("LEDGER_RETENTION_DAYS", "0"),
            ("REQUIRE_REGISTRATION", "yes"),
            ("MAX_BODY_BYTES", "10"),
            ("RECONCILE_BUDGET", "1"),
            ("RECONCILE_LEASE_SECONDS", "4"),
            ("RECONCILE_LEASE_SECONDS", "601"),
            ("RECONCILE_DEADLINE_SECONDS", "0"),
            ("RECONCILE_DEADLINE_SECONDS", "601"),
            ("RECONCILE_AUDIT_SECONDS", "-1"),
            ("RECONCILE_AUDIT_SECONDS", "604801"),
            ("STATS_FLUSH_SECONDS", "61"),
            ("GEMINI_API_BASE", "generativelanguage"),
            ("ALERT_URL", "slack"),
            ("GEMINI_JWKS_URL", "jwks.json"),
            ("EFFECT_RETRY_BASE_SECONDS", "0"),
            ("EFFECT_ROUTES", "[1,2]"),
            ("EFFECT_ROUTES", r#"{"nightly":"gopher://x"}"#),
            ("EFFECT_ROUTES", r#"{"nightly":7}"#),
            ("ADMIN_TOKEN", "t\u{f6}ken-with-an-umlaut"),
            ("REGISTER_TOKENS", "fine-token-0123456789 t\u{7}bell"),
        ];
        for (var, value) in cases {
            let mut vars = base();
            vars.insert(var, value.to_string());
            let e = parse(&vars).unwrap_err();
            assert_eq!(e.var, var, "{var}={value}");
            // Short numbers appear in the stated range; longer values must never be echoed.
            if value.len() > 2 {
                assert!(!e.to_string().contains(value), "{e} leaks {value}");
            }
        }
    }

    #[test]
    fn a_route_may_carry_a_pace_and_effect_url_its_own() {
        let mut vars = base();
        vars.insert(
            "EFFECT_ROUTES",
            r#"{"billing":{"url":"https://billing.example/hooks","per_second":50,"concurrency":10},"plain":"https://plain.example/x","slow":{"url":"queue:SLOW","per_second":5}}"#.into(),
        );
        vars.insert("EFFECT_CONCURRENCY", "3".into());
        let c = parse(&vars).unwrap();
        let billing = c.pace_for(Some("billing"));
        assert_eq!(
            (billing.per_second, billing.concurrency),
            (Some(50), Some(10))
        );
        assert_eq!(
            c.destination_for(Some("billing")),
            Destination::Url("https://billing.example/hooks".into())
        );
        assert_eq!(
            c.destination_for(Some("slow")),
            Destination::Queue("SLOW".into())
        );
        assert!(
            !c.pace_for(Some("plain")).limits(),
            "the string form stays unlimited"
        );
        let own = c.pace_for(None);
        assert_eq!((own.per_second, own.concurrency), (None, Some(3)));
        assert_eq!(
            c.pace_for(Some("unknown")),
            own,
            "an unrouted kind goes to EFFECT_URL"
        );
        let desks = c.destinations();
        assert_eq!(desks.len(), 4);
        assert_eq!(desks[0].label, "EFFECT_URL: http://127.0.0.1:9/\u{2026}");
        assert_eq!(desks[0].open_after, 5);
        assert_eq!(desks[0].probe_max_ms, 15_000);
        let shown = c.public_view();
        assert_eq!(
            setting_value(&shown, "EFFECT_ROUTES")["billing"],
            json!({"url": "https://billing.example/\u{2026}", "per_second": 50, "concurrency": 10})
        );
        assert_eq!(
            setting_value(&shown, "EFFECT_ROUTES")["plain"],
            json!("https://plain.example/\u{2026}")
        );
    }

    #[test]
    fn a_malformed_pace_is_a_configuration_error_naming_its_setting() {
        for bad in [
            r#"{"b":{"url":"https://b.example","per_second":0}}"#,
            r#"{"b":{"url":"https://b.example","per_second":-5}}"#,
            r#"{"b":{"url":"https://b.example","per_second":"fast"}}"#,
            r#"{"b":{"url":"https://b.example","per_second":2.5}}"#,
            r#"{"b":{"url":"https://b.example","concurrency":0}}"#,
            r#"{"b":{"url":"https://b.example","per_minute":5}}"#,
            r#"{"b":{"per_second":5}}"#,
            r#"{"b":{"url":"https://b.example","per_second":10001}}"#,
        ] {
            let mut vars = base();
            vars.insert("EFFECT_ROUTES", bad.into());
            assert_eq!(parse(&vars).unwrap_err().var, "EFFECT_ROUTES", "{bad}");
        }
        for (var, bad) in [
            ("EFFECT_PER_SECOND", "0"),
            ("EFFECT_PER_SECOND", "-1"),
            ("EFFECT_PER_SECOND", "lots"),
            ("EFFECT_CONCURRENCY", "0"),
            ("DESTINATION_OPEN_AFTER", "0"),
            ("DESTINATION_PROBE_MAX_SECONDS", "0"),
        ] {
            let mut vars = base();
            vars.insert(var, bad.into());
            assert_eq!(parse(&vars).unwrap_err().var, var, "{var}={bad}");
        }
    }

    #[test]
    fn zero_is_allowed_where_it_means_something() {
        let mut vars = base();
        vars.insert("RECONCILE_GRACE_SECONDS", "0".into());
        vars.insert("STUCK_AFTER_SECONDS", "0".into());
        vars.insert("EFFECT_ALERT_AFTER_SECONDS", "0".into());
        vars.insert("SIGNATURE_TOLERANCE_SECONDS", "0".into());
        let c = parse(&vars).unwrap();
        assert_eq!(c.reconcile_grace_secs, 0);
        assert_eq!(c.stuck_after_secs, 0);
    }

    #[test]
    fn effect_routes_override_the_url_per_kind() {
        let mut vars = base();
        vars.insert(
            "EFFECT_ROUTES",
            r#"{"nightly":"https://billing.example/hook","video":"http://127.0.0.1:1/v"}"#.into(),
        );
        let c = parse(&vars).unwrap();
        let url = |u: &str| Destination::Url(u.to_string());
        assert_eq!(
            c.destination_for(Some("nightly")),
            url("https://billing.example/hook")
        );
        assert_eq!(
            c.destination_for(Some("video")),
            url("http://127.0.0.1:1/v")
        );
        assert_eq!(
            c.destination_for(Some("other")),
            url("http://127.0.0.1:9/effects")
        );
        assert_eq!(c.destination_for(None), url("http://127.0.0.1:9/effects"));
    }

    #[test]
    fn a_destination_label_names_the_route_and_never_a_credential() {
        let mut vars = base();
        vars.insert(
            "EFFECT_ROUTES",
            r#"{"billing":"https://user:pw@billing.example/hook?key=s"}"#.into(),
        );
        let c = parse(&vars).unwrap();
        assert_eq!(
            c.destination_label(Some("billing")),
            "route billing: https://billing.example/\u{2026}"
        );
        let other = c.destination_label(Some("other"));
        assert_eq!(other, "EFFECT_URL: http://127.0.0.1:9/\u{2026}");
        assert_eq!(c.destination_label(None), other);
    }

    #[test]
    fn a_destination_label_splits_into_a_short_name_and_a_host() {
        use crate::destination_label::destination_host;
        let mut vars = base();
        vars.insert(
            "EFFECT_ROUTES",
            r#"{"billing":"https://user:pw@billing.example:8443/hook","a: b":"queue:Q"}"#.into(),
        );
        let c = parse(&vars).unwrap();
        let split = |kind: Option<&str>| {
            let label = c.destination_label(kind);
            let (name, shown) = destination_parts(&label);
            (name.to_string(), destination_host(shown).to_string())
        };
        assert_eq!(split(None), ("default".into(), "127.0.0.1:9".into()));
        assert_eq!(
            split(Some("other")),
            ("default".into(), "127.0.0.1:9".into())
        );
        assert_eq!(
            split(Some("billing")),
            ("billing".into(), "billing.example:8443".into())
        );
        assert_eq!(split(Some("a: b")), ("a: b".into(), "queue:Q".into()));
        assert_eq!(destination_parts("something else"), ("something else", ""));
    }

    #[test]
    fn an_operator_names_a_destination_by_its_route_or_default() {
        let mut vars = base();
        vars.insert(
            "EFFECT_ROUTES",
            r#"{"billing":"queue:BILLING_EFFECTS","video":"https://v.example/e"}"#.into(),
        );
        let c = parse(&vars).unwrap();
        assert_eq!(c.destination_names(), ["default", "billing", "video"]);
        assert_eq!(
            c.destination_named("default").unwrap().label,
            c.destination_label(None)
        );
        assert_eq!(
            c.destination_named("video").unwrap().label,
            c.destination_label(Some("video"))
        );
        assert_eq!(c.destination_named("nope"), None);
        vars.insert(
            "EFFECT_ROUTES",
            r#"{"default":"https://d.example/e"}"#.into(),
        );
        let refused = parse(&vars).unwrap_err().to_string();
        assert!(refused.contains("may not be named default"), "{refused}");
    }

    #[test]
    fn routes_can_name_a_queue_or_a_service_binding() {
        let mut vars = base();
        vars.insert(
            "EFFECT_ROUTES",
            r#"{"billing":"queue:BILLING_EFFECTS","publish":"service:PUBLISHER"}"#.into(),
        );
        let c = parse(&vars).unwrap();
        assert_eq!(
            c.destination_for(Some("billing")),
            Destination::Queue("BILLING_EFFECTS".into())
        );
        assert_eq!(
            c.destination_for(Some("publish")),
            Destination::Service("PUBLISHER".into())
        );
        for bad in [
            r#"{"b":"queue:"}"#,
            r#"{"b":"service:has-dash"}"#,
            r#"{"b":"ftp://x"}"#,
        ] {
            vars.insert("EFFECT_ROUTES", bad.into());
            assert_eq!(parse(&vars).unwrap_err().var, "EFFECT_ROUTES", "{bad}");
        }
    }

    #[test]
    fn retry_cap_below_base_is_refused() {
        let mut vars = base();
        vars.insert("EFFECT_RETRY_BASE_SECONDS", "60".into());
        vars.insert("EFFECT_RETRY_MAX_SECONDS", "30".into());
        assert_eq!(parse(&vars).unwrap_err().var, "EFFECT_RETRY_MAX_SECONDS");
    }

    #[test]
    fn a_key_waiting_at_its_desk_asks_again_after_the_retry_cap_a_minute_at_least() {
        let mut vars = base();
        vars.insert("EFFECT_RETRY_BASE_SECONDS", "1".into());
        vars.insert("EFFECT_RETRY_MAX_SECONDS", "2".into());
        assert_eq!(parse(&vars).unwrap().desk_fallback_ms(), PROBE_LAPSE_MS);
        vars.insert("EFFECT_RETRY_MAX_SECONDS", "3600".into());
        assert_eq!(parse(&vars).unwrap().desk_fallback_ms(), 3_600_000);
    }

    #[test]
    fn dynamic_webhooks_default_on_and_can_be_turned_off() {
        assert!(parse(&base()).unwrap().dynamic_webhooks);
        let mut vars = base();
        vars.insert("DYNAMIC_WEBHOOKS", "false".into());
        assert!(!parse(&vars).unwrap().dynamic_webhooks);
        vars.insert("DYNAMIC_WEBHOOKS", "no".into());
        assert_eq!(parse(&vars).unwrap_err().var, "DYNAMIC_WEBHOOKS");
    }

    #[test]
    fn retention_in_days_never_ends_before_a_genuine_delivery_can_still_arrive() {
        let mut vars = base();
        vars.insert("LEDGER_RETENTION_DAYS", "1".into());
        let c = parse(&vars).unwrap();
        assert_eq!(c.retention_ms(), crate::signature::replay_floor_ms(300));
        assert!(c.retention_ms() > 86_400_000);
        vars.insert("LEDGER_RETENTION_DAYS", "4".into());
        assert_eq!(parse(&vars).unwrap().retention_ms(), 4 * 86_400_000);
        vars.insert("LEDGER_RETENTION_DAYS", "1".into());
        vars.insert("SIGNATURE_TOLERANCE_SECONDS", "43200".into());
        assert_eq!(
            parse(&vars).unwrap().retention_ms(),
            4 * 86_400_000 + 10 * 60_000,
            "two days of a run, a day of retries, twice half a day of tolerance, the slack"
        );
    }

    #[test]
    fn retention_seconds_override_the_days() {
        assert_eq!(parse(&base()).unwrap().retention_ms(), 14 * 86_400_000);
        let mut vars = base();
        vars.insert("LEDGER_RETENTION_SECONDS", "5".into());
        assert_eq!(parse(&vars).unwrap().retention_ms(), 5_000);
        vars.insert("LEDGER_RETENTION_SECONDS", "0".into());
        assert_eq!(parse(&vars).unwrap_err().var, "LEDGER_RETENTION_SECONDS");
    }

    #[test]
    fn kv_ttls_are_clamped_to_kv_s_minimum() {
        let mut vars = base();
        assert_eq!(parse(&vars).unwrap().kv_ttl_secs(), 14 * 86_400);
        for (secs, ttl) in [
            ("1", 60),
            ("59", 60),
            ("60", 60),
            ("61", 61),
            ("3600", 3_600),
        ] {
            vars.insert("LEDGER_RETENTION_SECONDS", secs.into());
            let c = parse(&vars).unwrap();
            assert_eq!(c.kv_ttl_secs(), ttl, "{secs}");
            assert_eq!(
                c.retention_ms(),
                secs.parse::<i64>().unwrap() * 1_000,
                "gates keep theirs"
            );
        }
    }

    #[test]
    fn a_claim_that_cannot_outlast_an_attempt_is_refused() {
        let mut vars = base();
        vars.insert("GEMINI_API_KEY", "AIzaKEY".into());
        vars.insert("ALERT_URL", "https://hooks.example/alerts".into());
        vars.insert("EFFECT_TIMEOUT_MS", "5000".into());
        vars.insert("CLAIM_TTL_SECONDS", "5".into());
        let e = parse(&vars).unwrap_err();
        assert_eq!(e.var, "CLAIM_TTL_SECONDS");
        assert!(e.to_string().contains("EFFECT_TIMEOUT_MS"), "{e}");
        vars.insert("CLAIM_TTL_SECONDS", "6".into());
        let c = parse(&vars).unwrap();
        assert_eq!(
            c.warnings().len(),
            1,
            "allowed, but warned: no room for the runtime's grace"
        );
        assert!(c.warnings()[0].contains("CLAIM_TTL_SECONDS"));
        vars.insert("CLAIM_TTL_SECONDS", "35".into());
        assert!(parse(&vars).unwrap().warnings().is_empty());
        let mut keyed = base();
        keyed.insert("GEMINI_API_KEY", "AIzaKEY".into());
        keyed.insert("ALERT_URL", "https://hooks.example/alerts".into());
        assert!(
            parse(&keyed).unwrap().warnings().is_empty(),
            "the defaults are safe"
        );
    }

    #[test]
    fn the_alert_format_is_set_or_read_from_the_sink_url() {
        let mut vars = base();
        assert_eq!(parse(&vars).unwrap().alert_format, AlertFormat::Json);
        vars.insert("ALERT_URL", "https://hooks.slack.com/services/T/B/x".into());
        assert_eq!(parse(&vars).unwrap().alert_format, AlertFormat::Slack);
        vars.insert("ALERT_URL", "https://discord.com/api/webhooks/1/x".into());
        assert_eq!(parse(&vars).unwrap().alert_format, AlertFormat::Discord);
        vars.insert("ALERT_FORMAT", "JSON".into());
        assert_eq!(parse(&vars).unwrap().alert_format, AlertFormat::Json);
        vars.insert("ALERT_FORMAT", "teams".into());
        let e = parse(&vars).unwrap_err();
        assert_eq!(e.var, "ALERT_FORMAT");
        assert!(e.to_string().contains("pagerduty"), "{e}");
    }

    #[test]
    fn pagerduty_needs_its_routing_key_and_has_a_default_url() {
        let mut vars = base();
        vars.insert("ALERT_FORMAT", "pagerduty".into());
        let e = parse(&vars).unwrap_err();
        assert_eq!(e.var, "ALERT_ROUTING_KEY");
        assert!(e.to_string().contains("required"), "{e}");
        vars.insert("ALERT_ROUTING_KEY", "R0UT1NGKEYR0UT1NGKEY".into());
        let c = parse(&vars).unwrap();
        assert_eq!(c.alert_url.as_deref(), Some(PAGERDUTY_EVENTS_URL));
        assert!(
            !format!("{c:?}").contains("R0UT1NGKEY"),
            "Debug hides the key"
        );
        vars.insert("ALERT_URL", "http://127.0.0.1:9/enqueue".into());
        assert_eq!(
            parse(&vars).unwrap().alert_url.as_deref(),
            Some("http://127.0.0.1:9/enqueue")
        );
    }

    #[test]
    fn dynamic_webhooks_without_an_api_key_are_warned_about() {
        let warned = |c: &Config| {
            c.warnings()
                .iter()
                .any(|w| w.starts_with("DYNAMIC_WEBHOOKS"))
        };
        let mut vars = base();
        assert!(warned(&parse(&vars).unwrap()), "nudges cannot be confirmed");
        vars.insert("DYNAMIC_WEBHOOKS", "false".into());
        assert!(!warned(&parse(&vars).unwrap()));
        vars.insert("DYNAMIC_WEBHOOKS", "true".into());
        vars.insert("GEMINI_API_KEY", "AIzaKEY".into());
        assert!(!warned(&parse(&vars).unwrap()));
    }

    #[test]
    fn alerts_that_go_nowhere_are_warned_about() {
        let warned = |c: &Config| c.warnings().iter().any(|w| w.starts_with("ALERT_URL"));
        let mut vars = base();
        assert!(warned(&parse(&vars).unwrap()), "alerts only in the logs");
        vars.insert("ALERT_URL", "https://hooks.example/alerts".into());
        assert!(!warned(&parse(&vars).unwrap()));
    }

    #[test]
    fn debug_hides_secrets() {
        let mut vars = base();
        vars.insert("GEMINI_API_KEY", "AIzaSECRET".into());
        let dump = format!("{:?}", parse(&vars).unwrap());
        assert!(!dump.contains("t0ken"));
        assert!(!dump.contains("AIzaSECRET"));
        assert!(!dump.contains("MfKQ9r8"));
    }

    #[test]
    fn public_view_names_every_setting_and_shows_no_secret() {
        let mut vars = base();
        vars.insert("GEMINI_API_KEY", "AIza-very-secret-key".to_string());
        vars.insert(
            "ALERT_URL",
            "https://hooks.slack.com/services/T0/B0/s3cr3tpath".to_string(),
        );
        vars.insert(
            "EFFECT_URL",
            "https://user:pw@dest.example:8443/hooks?token=abc".to_string(),
        );
        vars.insert(
            "EFFECT_ROUTES",
            r#"{"billing":"https://bill.example/in/tok"}"#.to_string(),
        );
        vars.insert("CLAIM_TTL_SECONDS", "10".to_string());
        let view = parse(&vars).unwrap().public_view();
        let text = view.to_string();
        for secret in [
            SECRET,
            "t0ken",
            "AIza-very-secret-key",
            "s3cr3tpath",
            "pw@",
            "token=abc",
            "/in/tok",
        ] {
            assert!(!text.contains(secret), "{secret} leaked: {text}");
        }
        let value = |name: &str| setting_value(&view, name);
        assert_eq!(value("GEMINI_API_KEY"), "set");
        assert_eq!(value("GEMINI_WEBHOOK_SECRETS"), "set (1)");
        assert_eq!(value("EFFECT_URL"), "https://dest.example:8443/\u{2026}");
        assert_eq!(value("ALERT_URL"), "https://hooks.slack.com/\u{2026}");
        assert_eq!(
            value("EFFECT_ROUTES")["billing"],
            "https://bill.example/\u{2026}"
        );
        assert_eq!(value("CLAIM_TTL_SECONDS"), 10);
        assert_eq!(value("GEMINI_JWT_AUDIENCE"), serde_json::Value::Null);
        assert_eq!(
            view["warnings"].as_array().unwrap().len(),
            1,
            "the short claim TTL"
        );
        vars.remove("GEMINI_API_KEY");
        let view = parse(&vars).unwrap().public_view();
        assert!(view
            .to_string()
            .contains(r#""name":"GEMINI_API_KEY","secret":true,"value":"not set""#));
        assert_eq!(origin_only("http://127.0.0.1:9"), "http://127.0.0.1:9");
    }
}
