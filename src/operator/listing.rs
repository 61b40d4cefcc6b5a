//! The admin API's pure parts: request bodies and listing filters (which the bulk actions
//! of [`crate::operator::bulk`] apply too). Who may call which route is [`crate::operator::access`].
//!
//! Guarantees: a registration body or a listing query is refused with a reason, never
//! half-accepted; a listing cursor is opaque to clients and a malformed one is refused.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::operation::key::{normalize, Collection, KeyError, OperationKey, MAX_NAME_BYTES};
use crate::operation::ledger::{LedgerMeta, MAX_META_ERROR_BYTES};
use crate::operation::ledger_walk::LedgerCursor;
use crate::operation::lifecycle::Status;
use crate::operation::ResultsMode;
use crate::timestamp::parse_rfc3339_ms;

/// Longest accepted `kind`.
pub const MAX_KIND_BYTES: usize = 100;

#[derive(Deserialize)]
struct RegisterBody {
    name: Option<String>,
    kind: Option<String>,
    user_metadata: Option<serde_json::Value>,
    results: Option<String>,
}

/// A valid registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub key: OperationKey,
    pub kind: Option<String>,
    /// The job's `user_metadata` (a JSON object), the side effect's verified metadata: it
    /// comes with an authenticated call, unlike a dynamic webhook's token.
    pub user_metadata: Option<serde_json::Value>,
    /// `"results"` as the body gave it (`None`: not given; the kind's default then applies,
    /// [`Registration::results_or_default`]).
    pub results: Option<ResultsMode>,
}

impl Registration {
    /// `results` as given, else `each` when the kind is one of `each_kinds`
    /// (`RESULTS_EACH_KINDS`) and the operation is a batch (only a batch has results).
    pub fn results_or_default(&self, each_kinds: &[String]) -> Option<ResultsMode> {
        let listed = each_kinds.iter().any(|e| self.kind.as_ref() == Some(e));
        let batch = Collection::of_key(&self.key.key) == Some(Collection::Batches);
        self.results
            .or((listed && batch).then_some(ResultsMode::Each))
    }
}

/// Why a registration was refused (answered 400 with this text).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RegistrationError {
    #[error("body must be a JSON object with a string field name")]
    BadBody,
    #[error("name is missing or empty")]
    MissingName,
    #[error("name is longer than {MAX_NAME_BYTES} bytes")]
    NameTooLong,
    #[error("name: {0}")]
    BadName(KeyError),
    #[error("kind is longer than {MAX_KIND_BYTES} bytes")]
    KindTooLong,
    #[error("user_metadata must be a JSON object")]
    MetadataNotObject,
    #[error("results must be \"none\" or \"each\"")]
    BadResults,
    #[error("results \"each\" needs a batch (batches/...): a {0} has no results of its own; register it without results")]
    ResultsNotBatch(&'static str),
}

/// Parses `{"name": "batches/abc", "kind": "nightly-review", "user_metadata": {...}}`
/// (`kind` and `user_metadata` optional; `null` is the same as absent).
pub fn parse_registration(body: &[u8]) -> Result<Registration, RegistrationError> {
    let parsed: RegisterBody =
        serde_json::from_slice(body).map_err(|_| RegistrationError::BadBody)?;
    let name = parsed.name.unwrap_or_default();
    if name.trim().is_empty() {
        return Err(RegistrationError::MissingName);
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(RegistrationError::NameTooLong);
    }
    let key = normalize(&name, None).map_err(RegistrationError::BadName)?;
    let kind = parsed
        .kind
        .map(|k| k.trim().to_string())
        .filter(|k| !k.is_empty());
    if kind.as_ref().is_some_and(|k| k.len() > MAX_KIND_BYTES) {
        return Err(RegistrationError::KindTooLong);
    }
    let user_metadata = match parsed.user_metadata {
        None | Some(serde_json::Value::Null) => None,
        Some(meta @ serde_json::Value::Object(_)) => Some(crate::operation::details::bound(meta)),
        Some(_) => return Err(RegistrationError::MetadataNotObject),
    };
    let results = parsed
        .results
        .map(|text| ResultsMode::parse(text.trim()).ok_or(RegistrationError::BadResults))
        .transpose()?;
    let collection = Collection::of_key(&key.key);
    if results == Some(ResultsMode::Each) && collection != Some(Collection::Batches) {
        let what = collection.map_or("operation", |c| c.as_str());
        return Err(RegistrationError::ResultsNotBatch(what));
    }
    Ok(Registration {
        key,
        kind,
        user_metadata,
        results,
    })
}

/// Longest kept `reason` of an operator's action.
pub const MAX_REASON_CHARS: usize = 500;

/// An operator's `reason` as it is kept: trimmed, cut to [`MAX_REASON_CHARS`]; empty when
/// there is none.
pub fn kept_reason(reason: Option<String>) -> String {
    reason
        .unwrap_or_default()
        .trim()
        .chars()
        .take(MAX_REASON_CHARS)
        .collect()
}

/// A valid `POST /v1/operations/{name}/settle`: a terminal status and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settle {
    pub status: Status,
    pub reason: String,
}

/// Why a settle body was refused (answered 400 with this text).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SettleError {
    #[error(
        "body must be {{\"status\": \"succeeded|failed|cancelled|expired\", \"reason\": \"...\"}}"
    )]
    BadBody,
    #[error("status must be one of succeeded, failed, cancelled, expired")]
    NotTerminal,
    #[error("reason is missing or empty")]
    MissingReason,
}

/// Parses `{"status": "succeeded", "reason": "checked in AI Studio"}`: a terminal status
/// and a non-empty reason (kept to its first 500 characters).
pub fn parse_settle(body: &[u8]) -> Result<Settle, SettleError> {
    #[derive(Deserialize)]
    struct Body {
        status: Option<String>,
        reason: Option<String>,
    }
    let parsed: Body = serde_json::from_slice(body).map_err(|_| SettleError::BadBody)?;
    let status = Status::parse(parsed.status.as_deref().unwrap_or("").trim());
    if !status.is_terminal() {
        return Err(SettleError::NotTerminal);
    }
    let reason = kept_reason(parsed.reason);
    if reason.is_empty() {
        return Err(SettleError::MissingReason);
    }
    Ok(Settle { status, reason })
}

/// Default and largest page of `GET /v1/operations`.
pub const DEFAULT_LIST_LIMIT: usize = 50;
pub const MAX_LIST_LIMIT: usize = 500;

/// Longest accepted `prefix` or `q` of a listing.
pub const MAX_SEARCH_BYTES: usize = MAX_NAME_BYTES;

/// Who settled an operation, as a listing filter.
pub const SETTLED_BY: [&str; 3] = ["webhook", "reconcile", "operator"];

/// `GET /v1/operations?status=&effect_done=&stuck=&kind=&parked=&settled_by=&error=&forgotten=&prefix=&q=&submitted_after=&submitted_before=&settled_after=&settled_before=&limit=&cursor=`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListQuery {
    pub status: Option<Status>,
    pub effect_done: Option<bool>,
    pub stuck: Option<bool>,
    /// The registered kind, exactly.
    pub kind: Option<String>,
    pub parked: Option<bool>,
    /// `webhook`, `reconcile` or `operator`.
    pub settled_by: Option<String>,
    /// The side effect's kept error, exactly (the listing's `error`): an issues group.
    pub error: Option<String>,
    pub forgotten: Option<bool>,
    /// A key prefix (`batches/nightly-`): the ledger is listed from it, so it costs no scan.
    pub prefix: Option<String>,
    /// Text anywhere in the key or the full name, ignoring case (lowercased here): a scan of
    /// the ledger's metadata, paged like any other filter.
    pub q: Option<String>,
    /// Registered at or after / before this time (Unix ms; RFC 3339 in the query).
    pub submitted_after: Option<i64>,
    pub submitted_before: Option<i64>,
    /// Settled at or after / before this time: an entry not settled never matches these.
    pub settled_after: Option<i64>,
    pub settled_before: Option<i64>,
    pub limit: usize,
    pub resume: LedgerCursor,
}

/// Why a listing query was refused (answered 400).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ListError {
    #[error("unknown status {0:?}")]
    Status(String),
    #[error("{0} must be true or false")]
    Bool(&'static str),
    #[error("limit must be a whole number from 1 to {MAX_LIST_LIMIT}")]
    Limit,
    #[error("cursor is not one this API issued")]
    Cursor,
    #[error("settled_by must be one of webhook, reconcile, operator")]
    SettledBy,
    #[error("{0} is empty or too long")]
    Search(&'static str),
    #[error("{0} must be an RFC 3339 time, like 2026-11-22T10:00:00Z")]
    Time(&'static str),
    #[error("unknown parameter {0:?}")]
    Unknown(String),
}

#[derive(Serialize, Deserialize)]
struct CursorToken {
    c: Option<String>,
    a: Option<String>,
}

/// Encodes where the next page starts as an opaque cursor.
pub fn encode_cursor(resume: &LedgerCursor) -> String {
    let (c, a) = (resume.cursor.clone(), resume.after_key.clone());
    let token = CursorToken { c, a };
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(&token).unwrap_or_default())
}

fn decode_cursor(text: &str) -> Option<LedgerCursor> {
    let bytes = URL_SAFE_NO_PAD.decode(text).ok()?;
    let token: CursorToken = serde_json::from_slice(&bytes).ok()?;
    let (cursor, after_key) = (token.c, token.a);
    Some(LedgerCursor { cursor, after_key })
}

impl ListQuery {
    /// Parses already percent-decoded query pairs.
    pub fn parse<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<ListQuery, ListError> {
        let boolean = |name: &'static str, v: &str| match v {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(ListError::Bool(name)),
        };
        let time = |name: &'static str, v: &str| parse_rfc3339_ms(v).ok_or(ListError::Time(name));
        // A text filter: not empty, at most `max` bytes.
        let text = |name: &'static str, v: &str, max: usize| {
            let fits = !v.is_empty() && v.len() <= max;
            fits.then(|| v.to_string()).ok_or(ListError::Search(name))
        };
        let mut q = ListQuery {
            limit: DEFAULT_LIST_LIMIT,
            ..ListQuery::default()
        };
        for (name, value) in pairs {
            match name {
                "status" => match Status::parse(value) {
                    Status::Unknown(s) => return Err(ListError::Status(s)),
                    known => q.status = Some(known),
                },
                "effect_done" => q.effect_done = Some(boolean("effect_done", value)?),
                "stuck" => q.stuck = Some(boolean("stuck", value)?),
                "parked" => q.parked = Some(boolean("parked", value)?),
                "forgotten" => q.forgotten = Some(boolean("forgotten", value)?),
                "kind" => q.kind = Some(text("kind", value, MAX_KIND_BYTES)?),
                "error" => q.error = Some(text("error", value, MAX_META_ERROR_BYTES)?),
                "settled_by" => {
                    if !SETTLED_BY.contains(&value) {
                        return Err(ListError::SettledBy);
                    }
                    q.settled_by = Some(value.to_string());
                }
                "prefix" => q.prefix = Some(text("prefix", value.trim(), MAX_SEARCH_BYTES)?),
                "q" => q.q = Some(text("q", value.trim(), MAX_SEARCH_BYTES)?.to_lowercase()),
                "submitted_after" => q.submitted_after = Some(time("submitted_after", value)?),
                "submitted_before" => q.submitted_before = Some(time("submitted_before", value)?),
                "settled_after" => q.settled_after = Some(time("settled_after", value)?),
                "settled_before" => q.settled_before = Some(time("settled_before", value)?),
                "limit" => {
                    q.limit = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=MAX_LIST_LIMIT).contains(n))
                        .ok_or(ListError::Limit)?
                }
                "cursor" => q.resume = decode_cursor(value).ok_or(ListError::Cursor)?,
                other => return Err(ListError::Unknown(other.to_string())),
            }
        }
        Ok(q)
    }

    /// Whether a ledger entry passes the filters. Stuck means not terminal and older than
    /// `stuck_after_secs` since registration, as reconciliation judges it.
    pub fn matches(&self, meta: &LedgerMeta, now_secs: i64, stuck_after_secs: i64) -> bool {
        let stuck = !meta.status.is_terminal()
            && !meta.forgotten
            && now_secs - meta.submitted_at >= stuck_after_secs;
        let submitted = Some(meta.submitted_at);
        self.status.as_ref().is_none_or(|s| *s == meta.status)
            && self.effect_done.is_none_or(|d| d == meta.effect_done)
            && self.stuck.is_none_or(|want| want == stuck)
            && self.parked.is_none_or(|p| p == meta.parked)
            && self.forgotten.is_none_or(|f| f == meta.forgotten)
            && (self.kind.is_none() || self.kind == meta.kind)
            && (self.settled_by.is_none() || self.settled_by == meta.settled_by)
            && (self.error.is_none() || self.error == meta.error)
            && within(submitted, self.submitted_after, self.submitted_before)
            && within(meta.settled_at, self.settled_after, self.settled_before)
    }

    /// Whether an entry's key (without `op:`) and metadata pass the key filters: `prefix`
    /// (already applied by the listing, checked again so the rule lives in one place) and
    /// `q`, text anywhere in the key or the full name, ignoring case.
    pub fn matches_key(&self, key: &str, meta: &LedgerMeta) -> bool {
        self.prefix
            .as_ref()
            .is_none_or(|p| key.starts_with(p.as_str()))
            && self.q.as_ref().is_none_or(|q| {
                key.to_lowercase().contains(q.as_str())
                    || meta.name.to_lowercase().contains(q.as_str())
            })
    }
}

/// Whether a time in Unix seconds lies in `[after, before)` (bounds in Unix ms); with a bound
/// given, an absent time never does.
fn within(secs: Option<i64>, after_ms: Option<i64>, before_ms: Option<i64>) -> bool {
    let Some(ms) = secs.map(|s| s.saturating_mul(1_000)) else {
        return after_ms.is_none() && before_ms.is_none();
    };
    after_ms.is_none_or(|a| ms >= a) && before_ms.is_none_or(|b| ms < b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settle_needs_a_terminal_status_and_a_reason() {
        let ok = parse_settle(br#"{"status":"succeeded","reason":" checked by hand "}"#).unwrap();
        assert_eq!(ok.status, Status::Succeeded);
        assert_eq!(ok.reason, "checked by hand");
        for s in ["failed", "cancelled", "expired"] {
            let body = format!(r#"{{"status":"{s}","reason":"r"}}"#);
            assert!(parse_settle(body.as_bytes()).is_ok(), "{s}");
        }
        for s in ["running", "pending", "requires_action", "done", ""] {
            let body = format!(r#"{{"status":"{s}","reason":"r"}}"#);
            assert_eq!(
                parse_settle(body.as_bytes()),
                Err(SettleError::NotTerminal),
                "{s}"
            );
        }
        assert_eq!(
            parse_settle(br#"{"status":"failed"}"#),
            Err(SettleError::MissingReason)
        );
        assert_eq!(parse_settle(b"nope"), Err(SettleError::BadBody));
        let long = format!(r#"{{"status":"failed","reason":"{}"}}"#, "x".repeat(900));
        assert_eq!(
            parse_settle(long.as_bytes()).unwrap().reason.len(),
            MAX_REASON_CHARS
        );
    }

    #[test]
    fn registration_normalizes_the_name() {
        let r = parse_registration(br#"{"name":" batches/abc/","kind":"nightly-review"}"#).unwrap();
        assert_eq!(r.key.key, "batches/abc");
        assert_eq!(r.kind.as_deref(), Some("nightly-review"));
        let r = parse_registration(br#"{"name":"batches/abc"}"#).unwrap();
        assert_eq!(r.kind, None);
        assert_eq!(r.user_metadata, None);
        let r = parse_registration(br#"{"name":"batches/abc","user_metadata":{"tenant":"t1"}}"#)
            .unwrap();
        assert_eq!(r.user_metadata, Some(serde_json::json!({"tenant": "t1"})));
    }

    #[test]
    fn registration_takes_results_or_the_kinds_default() {
        let each = ["pages".to_string()];
        let r = parse_registration(br#"{"name":"batches/a","results":"each"}"#).unwrap();
        assert_eq!(r.results_or_default(&[]), Some(ResultsMode::Each));
        let r = parse_registration(br#"{"name":"batches/a","kind":"pages"}"#).unwrap();
        assert_eq!(r.results, None);
        assert_eq!(r.results_or_default(&each), Some(ResultsMode::Each));
        let r =
            parse_registration(br#"{"name":"batches/a","kind":"pages","results":"none"}"#).unwrap();
        assert_eq!(r.results_or_default(&each), Some(ResultsMode::None));
        let r = parse_registration(br#"{"name":"interactions/a","kind":"pages"}"#).unwrap();
        assert_eq!(r.results_or_default(&each), None, "not a batch: no default");
    }

    fn meta(status: &str, submitted_at: i64, done: bool) -> LedgerMeta {
        LedgerMeta {
            submitted_at,
            effect_done: done,
            ..LedgerMeta::sample(status)
        }
    }

    #[test]
    fn the_error_filter_selects_one_issues_group_exactly() {
        let q = ListQuery::parse([("error", "400: invalid payload")]).unwrap();
        let with = |e: Option<&str>| LedgerMeta {
            error: e.map(str::to_string),
            ..meta("succeeded", 0, false)
        };
        assert!(q.matches(&with(Some("400: invalid payload")), 1, 100));
        assert!(!q.matches(&with(Some("400: invalid payload, again")), 1, 100));
        assert!(!q.matches(&with(None), 1, 100), "an old entry has none");
        assert!(ListQuery::parse([("error", "")]).is_err());
        assert!(ListQuery::parse([("error", "x".repeat(81).as_str())]).is_err());
    }

    #[test]
    fn list_query_filters() {
        let q = ListQuery::parse([("status", "running"), ("stuck", "true")]).unwrap();
        assert!(q.matches(&meta("running", 0, false), 100, 100));
        assert!(
            !q.matches(&meta("running", 1, false), 100, 100),
            "not stuck yet"
        );
        assert!(!q.matches(&meta("pending", 0, false), 100, 100));
        let q = ListQuery::parse([("effect_done", "false")]).unwrap();
        assert!(q.matches(&meta("succeeded", 0, false), 1, 1));
        assert!(!q.matches(&meta("succeeded", 0, true), 1, 1));
        let all = ListQuery::parse([]).unwrap();
        assert_eq!(all.limit, DEFAULT_LIST_LIMIT);
        assert!(all.matches(&meta("expired", 0, true), 1, 1));
    }

    #[test]
    fn list_query_filters_kind_parked_settled_by_and_forgotten() {
        let mut m = meta("succeeded", 0, false);
        m.kind = Some("nightly".into());
        m.parked = true;
        m.settled_by = Some("reconcile".into());
        let q = ListQuery::parse([("kind", "nightly"), ("parked", "true")]).unwrap();
        assert!(q.matches(&m, 1, 1));
        let q = ListQuery::parse([("kind", "billing")]).unwrap();
        assert!(!q.matches(&m, 1, 1), "another kind");
        assert!(!q.matches(&meta("succeeded", 0, false), 1, 1), "no kind");
        let q = ListQuery::parse([("settled_by", "reconcile")]).unwrap();
        assert!(q.matches(&m, 1, 1));
        let q = ListQuery::parse([("settled_by", "webhook")]).unwrap();
        assert!(!q.matches(&m, 1, 1));
        assert!(!q.matches(&meta("running", 0, false), 1, 1), "not settled");
        let q = ListQuery::parse([("parked", "false")]).unwrap();
        assert!(!q.matches(&m, 1, 1));
        let q = ListQuery::parse([("forgotten", "true")]).unwrap();
        assert!(!q.matches(&m, 1, 1));
        m.forgotten = true;
        assert!(q.matches(&m, 1, 1));
    }

    #[test]
    fn list_query_searches_key_and_name() {
        let mut m = meta("running", 0, false);
        m.name = "projects/p/locations/us/batches/Nightly-42".into();
        let q = ListQuery::parse([("q", " NIGHTLY ")]).unwrap();
        assert_eq!(q.q.as_deref(), Some("nightly"), "trimmed, lowercased");
        assert!(q.matches_key("batches/Nightly-42", &m));
        let q = ListQuery::parse([("q", "locations/us")]).unwrap();
        assert!(
            q.matches_key("batches/Nightly-42", &m),
            "found in the full name"
        );
        let q = ListQuery::parse([("q", "weekly")]).unwrap();
        assert!(!q.matches_key("batches/Nightly-42", &m));
        let q = ListQuery::parse([("prefix", "batches/Night")]).unwrap();
        assert!(q.matches_key("batches/Nightly-42", &m));
        assert!(
            !q.matches_key("batches/night-1", &m),
            "a prefix keeps case, like keys"
        );
    }

    #[test]
    fn list_query_filters_time_ranges() {
        let mut m = meta("succeeded", 1_000, true);
        m.settled_at = Some(2_000);
        let at = |secs: i64| crate::timestamp::format_rfc3339(secs * 1_000);
        let q = |pairs: &[(&str, String)]| {
            ListQuery::parse(pairs.iter().map(|(k, v)| (*k, v.as_str()))).unwrap()
        };
        assert!(
            q(&[("submitted_after", at(1_000))]).matches(&m, 1, 1),
            "inclusive"
        );
        assert!(!q(&[("submitted_after", at(1_001))]).matches(&m, 1, 1));
        assert!(
            !q(&[("submitted_before", at(1_000))]).matches(&m, 1, 1),
            "exclusive"
        );
        assert!(q(&[("submitted_before", at(1_001))]).matches(&m, 1, 1));
        let settled = q(&[("settled_after", at(1_500)), ("settled_before", at(2_500))]);
        assert!(settled.matches(&m, 1, 1));
        assert!(!q(&[("settled_after", at(2_001))]).matches(&m, 1, 1));
        assert!(
            !settled.matches(&meta("running", 1_000, false), 1, 1),
            "not settled: outside any settled range"
        );
        assert!(
            q(&[("submitted_after", "2026-11-22T10:00:00+01:00".to_string())])
                .submitted_after
                .is_some(),
            "offsets accepted"
        );
        assert_eq!(
            ListQuery::parse([("settled_before", "yesterday")]),
            Err(ListError::Time("settled_before"))
        );
    }

    #[test]
    fn list_query_refusals() {
        assert_eq!(
            ListQuery::parse([("status", "done")]),
            Err(ListError::Status("done".into()))
        );
        assert_eq!(
            ListQuery::parse([("stuck", "yes")]),
            Err(ListError::Bool("stuck"))
        );
        assert_eq!(ListQuery::parse([("limit", "0")]), Err(ListError::Limit));
        assert_eq!(ListQuery::parse([("limit", "501")]), Err(ListError::Limit));
        assert_eq!(ListQuery::parse([("cursor", "!!")]), Err(ListError::Cursor));
        assert_eq!(
            ListQuery::parse([("settled_by", "registration")]),
            Err(ListError::SettledBy)
        );
        assert_eq!(
            ListQuery::parse([("parked", "1")]),
            Err(ListError::Bool("parked"))
        );
        assert_eq!(ListQuery::parse([("q", "  ")]), Err(ListError::Search("q")));
        let long = "b".repeat(MAX_SEARCH_BYTES + 1);
        assert_eq!(
            ListQuery::parse([("prefix", long.as_str())]),
            Err(ListError::Search("prefix"))
        );
        assert_eq!(
            ListQuery::parse([("kind", "")]),
            Err(ListError::Search("kind"))
        );
        assert_eq!(
            ListQuery::parse([("sort", "x")]),
            Err(ListError::Unknown("sort".into()))
        );
    }

    #[test]
    fn cursor_round_trips() {
        let resume = LedgerCursor {
            cursor: Some("kv-cursor".into()),
            after_key: Some("op:batches/a".into()),
        };
        let q = ListQuery::parse([("cursor", encode_cursor(&resume).as_str())]).unwrap();
        assert_eq!(q.resume, resume);
    }

    #[test]
    fn registration_refusals() {
        let long = format!(r#"{{"name":"batches/{}"}}"#, "a".repeat(400));
        let long_kind = format!(r#"{{"name":"batches/a","kind":"{}"}}"#, "k".repeat(101));
        let cases: Vec<(Vec<u8>, RegistrationError)> = vec![
            (b"not json".to_vec(), RegistrationError::BadBody),
            (b"[]".to_vec(), RegistrationError::BadBody),
            (br#"{"name":7}"#.to_vec(), RegistrationError::BadBody),
            (b"{}".to_vec(), RegistrationError::MissingName),
            (br#"{"name":"  "}"#.to_vec(), RegistrationError::MissingName),
            (long.into_bytes(), RegistrationError::NameTooLong),
            (
                br#"{"name":"abc"}"#.to_vec(),
                RegistrationError::BadName(KeyError::NoCollection),
            ),
            (long_kind.into_bytes(), RegistrationError::KindTooLong),
            (
                br#"{"name":"batches/a","user_metadata":"t1"}"#.to_vec(),
                RegistrationError::MetadataNotObject,
            ),
            (
                br#"{"name":"batches/a","results":"all"}"#.to_vec(),
                RegistrationError::BadResults,
            ),
            (
                br#"{"name":"interactions/a","results":"each"}"#.to_vec(),
                RegistrationError::ResultsNotBatch("interactions"),
            ),
        ];
        for (body, want) in cases {
            assert_eq!(parse_registration(&body).unwrap_err(), want);
        }
    }
}
