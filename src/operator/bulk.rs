//! Bulk actions over the operations listing: `POST /v1/bulk/retry` and `/v1/bulk/redeliver`.
//!
//! Guarantees: a bulk action selects operations with the listing's own filters
//! ([`ListQuery`], parsed by the same code) and acts on each one only through the operator's
//! single action, sent to its gate: retry-now (same generation, same `webhook-id`) for an
//! effect not done, a deliberate redelivery (a new generation) for a done one. An entry whose
//! metadata shows the action does not apply (done, in flight, forgotten, no outcome yet) is
//! skipped without a call; the gate still refuses what its record says does not apply. A dry
//! run calls no gate and changes nothing. One request acts on at most `limit` operations, one
//! every `1 / per_second` seconds (so a destination that just recovered sees a steady trickle,
//! never the whole backlog at once), and a run resumes from an opaque cursor bound to its
//! action, dry-run flag and filter, which carries the run's totals so far.
//!
//! A redelivery run has an identity, its cut-off `sent_before`, which the caller gives (a dry
//! run answers one: the time it counted), carried in the cursor and given in every answer, so
//! a run's first request sent again as it was sent is the same run (a redelivery without one
//! is refused, [`BulkError::SentBeforeRequired`]): the gate of an effect sent at or after it
//! (accepted by the destination, or redelivered) refuses, so the run, resumed or run again
//! with the same cut-off, never sends an effect a second time
//! ([`SkipReason::SentSinceCutoff`]); a run with a later cut-off sends again. A cut-off is
//! never after the clock of the request that sets it: the run's own redeliveries, recorded by
//! their gates later, are then at or after it.
//!
//! Pacing holds within a run, whose requests follow one another; runs started side by side
//! add up. A request costs at most 5 KV lists and `limit` gate calls: 25 subrequests by
//! default (inside the Free plan's 50), 105 at most.

use std::collections::BTreeMap;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::operation::gate::protocol::{GateCommand, GateReply, OperatorAction};
use crate::operation::ledger::{LedgerMeta, OP_PREFIX};
use crate::operation::ledger_walk::{LedgerCursor, LedgerWalk, ListedPage, WalkStep};
use crate::operation::OperatorRefusal;
use crate::operator::listing::{kept_reason, ListError, ListQuery};
use crate::timestamp::{format_rfc3339, parse_rfc3339_ms};

/// Operations one request acts on by default: with the listing's KV pages this stays inside
/// the Free plan's 50 subrequests.
pub const DEFAULT_BULK_LIMIT: usize = 20;
/// The most one request acts on (gate calls, each one subrequest).
pub const MAX_BULK_LIMIT: usize = 100;
/// Actions a second by default: a recovered destination gets a trickle, not a burst.
pub const DEFAULT_PER_SECOND: u32 = 5;
pub const MAX_PER_SECOND: u32 = 50;
/// The longest one request spends pacing; `limit` is cut to fit (`per_second` × this).
pub const MAX_PACED_SECONDS: usize = 30;
/// KV lists (1,000 entries each) one request may make looking for matches.
pub const MAX_BULK_PAGES: usize = 5;

/// Which operator action a bulk request applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BulkAction {
    /// Retry-now of effects not done (same generation and `webhook-id`).
    Retry,
    /// Deliberate redelivery of done effects (a new generation and `webhook-id`).
    Redeliver,
}

impl BulkAction {
    /// The action named by the route's last segment.
    pub fn from_path(segment: &str) -> Option<BulkAction> {
        [BulkAction::Retry, BulkAction::Redeliver]
            .into_iter()
            .find(|a| a.as_str() == segment)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            BulkAction::Retry => "retry",
            BulkAction::Redeliver => "redeliver",
        }
    }
}

/// Why an operation matched but was not acted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// Retry: the effect is done (redeliver it instead).
    Done,
    /// Redeliver: the effect is not done (retry it instead).
    NotDone,
    /// An attempt holds a live claim.
    InFlight,
    Forgotten,
    /// Not terminal: no side effect is owed yet.
    NoOutcome,
    /// Its gate has no record, or only a tombstone (retention ended).
    Gone,
    /// Redeliver: the effect was sent (accepted, or redelivered) at or after the run's
    /// cut-off: by this run, by an earlier part or run with the same cut-off, or since.
    SentSinceCutoff,
    /// The gate refused for another reason.
    Refused,
}

/// Decides from the ledger's metadata whether the action applies to an entry: why it is
/// skipped, or `None` to act. The metadata may lag the gate; the gate decides again on its
/// own record.
pub fn skip_reason(action: BulkAction, meta: &LedgerMeta, now_secs: i64) -> Option<SkipReason> {
    Some(match action {
        _ if meta.forgotten => SkipReason::Forgotten,
        _ if !meta.status.is_terminal() => SkipReason::NoOutcome,
        BulkAction::Retry if meta.effect_done => SkipReason::Done,
        BulkAction::Retry if meta.claim_expires.is_some_and(|e| e > now_secs) => {
            SkipReason::InFlight
        }
        BulkAction::Redeliver if !meta.effect_done => SkipReason::NotDone,
        _ => return None,
    })
}

/// What the gate did with one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandResult {
    Retried,
    Redelivered,
    Skipped(SkipReason),
    /// The call failed or the reply was unexpected; the text is for the log only.
    Failed(String),
}

/// Reads the gate's reply to [`BulkRun::command`].
pub fn command_result(reply: &GateReply) -> CommandResult {
    match reply {
        GateReply::Redelivered {
            action: OperatorAction::RetryNow,
            ..
        } => CommandResult::Retried,
        GateReply::Redelivered {
            action: OperatorAction::Redeliver,
            ..
        } => CommandResult::Redelivered,
        GateReply::Refused { reason } => {
            use OperatorRefusal as R;
            let skip = [
                (R::AlreadyDone, SkipReason::Done),
                (R::NotDone, SkipReason::NotDone),
                (R::InFlight, SkipReason::InFlight),
                (R::Forgotten, SkipReason::Forgotten),
                (R::NotTerminal, SkipReason::NoOutcome),
                (R::Retired, SkipReason::Gone),
                (R::SentSinceCutoff, SkipReason::SentSinceCutoff),
            ]
            .into_iter()
            .find(|(refusal, _)| refusal.as_str() == reason.as_str());
            CommandResult::Skipped(skip.map_or(SkipReason::Refused, |(_, skip)| skip))
        }
        GateReply::NotFound => CommandResult::Skipped(SkipReason::Gone),
        other => CommandResult::Failed(format!("unexpected gate reply {other:?}")),
    }
}

/// A run's counts: of this request, or of the whole run so far (carried in the cursor).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Counts {
    pub matched: u64,
    /// Dry run: matched entries the action applies to, by their metadata.
    pub eligible: u64,
    pub retried: u64,
    pub redelivered: u64,
    pub skipped: BTreeMap<SkipReason, u64>,
    pub failed: u64,
}

impl Counts {
    fn add(&mut self, other: &Counts) {
        self.matched += other.matched;
        self.eligible += other.eligible;
        self.retried += other.retried;
        self.redelivered += other.redelivered;
        self.failed += other.failed;
        for (reason, n) in &other.skipped {
            *self.skipped.entry(*reason).or_default() += n;
        }
    }

    /// The counts as answered: a dry run says what would happen, a run what did.
    pub fn view(&self, dry_run: bool) -> Value {
        let skipped: u64 = self.skipped.values().sum();
        let by = json!(self.skipped);
        if dry_run {
            return json!({"matched": self.matched, "eligible": self.eligible, "skipped": skipped, "skipped_by": by});
        }
        json!({"matched": self.matched, "retried": self.retried, "redelivered": self.redelivered,
               "skipped": skipped, "skipped_by": by, "failed": self.failed})
    }
}

/// Why a bulk request was refused (answered 400 with this text).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BulkError {
    #[error("body must be {{\"filter\": {{...the listing's filters...}}, \"reason\": \"...\", \"dry_run\": true|false, \"limit\": 1-{MAX_BULK_LIMIT}, \"per_second\": 1-{MAX_PER_SECOND}, \"sent_before\": \"RFC 3339\", \"cursor\": \"...\"}}: {0}")]
    BadBody(String),
    #[error("filter.{0} must be a string or a boolean")]
    FilterValue(String),
    #[error("filter.{0} is not a filter; give it beside the filter")]
    FilterParam(String),
    #[error("filter: {0}")]
    Filter(ListError),
    #[error("reason is required for a redelivery")]
    MissingReason,
    #[error("limit must be a whole number from 1 to {MAX_BULK_LIMIT}")]
    Limit,
    #[error("per_second must be a whole number from 1 to {MAX_PER_SECOND}")]
    PerSecond,
    #[error(
        "cursor is not one this route issued for this action, dry_run, filter and sent_before"
    )]
    Cursor,
    #[error("sent_before must be an RFC 3339 time, such as an earlier answer's sent_before")]
    SentBefore,
    #[error("sent_before is for a redelivery only (a retry keeps each effect's webhook-id)")]
    SentBeforeRetry,
    #[error("sent_before is in the future: this run's redeliveries would come before it, so running it again would send them again")]
    SentBeforeFuture,
    #[error("a redelivery needs sent_before, its identity: run it with dry_run first and send the sent_before it answers (or a past time of your own), so that the same request sent again redelivers nothing twice")]
    SentBeforeRequired,
}

/// A valid bulk request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BulkRequest {
    pub action: BulkAction,
    pub filter: ListQuery,
    /// What the operator gave (trimmed, at most 500 characters); empty when none.
    pub reason: String,
    pub dry_run: bool,
    pub limit: usize,
    pub per_second: u32,
    /// Where this request starts, and the run's totals before it.
    pub resume: LedgerCursor,
    pub before: Counts,
    /// A redelivery run's cut-off (Unix ms) from the body or the cursor; `None` for a run's
    /// first request that gave none, which starts it at the clock ([`BulkRun::new`]).
    pub sent_before: Option<i64>,
    /// `sent_before` is the body's own, not yet checked against the clock (a cursor's was
    /// checked by the request that set it).
    sent_before_unchecked: bool,
    fingerprint: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    #[serde(default)]
    filter: Map<String, Value>,
    reason: Option<String>,
    #[serde(default)]
    dry_run: bool,
    limit: Option<usize>,
    per_second: Option<u32>,
    sent_before: Option<String>,
    cursor: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct BulkCursor {
    c: Option<String>,
    a: Option<String>,
    f: String,
    #[serde(default)]
    t: Counts,
    /// The run's cut-off (absent in cursors issued before runs had one, and for a retry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    b: Option<i64>,
}

/// Parses a bulk request's body for `action`.
pub fn parse_bulk(action: BulkAction, body: &[u8]) -> Result<BulkRequest, BulkError> {
    let text = if body.iter().all(u8::is_ascii_whitespace) {
        &b"{}"[..]
    } else {
        body
    };
    let parsed: Body =
        serde_json::from_slice(text).map_err(|e| BulkError::BadBody(e.to_string()))?;
    let mut pairs: Vec<(String, String)> = Vec::new();
    for (name, value) in &parsed.filter {
        if name == "limit" || name == "cursor" {
            return Err(BulkError::FilterParam(name.clone()));
        }
        let text = match value {
            Value::String(s) => s.clone(),
            Value::Bool(b) => b.to_string(),
            _ => return Err(BulkError::FilterValue(name.clone())),
        };
        pairs.push((name.clone(), text));
    }
    let filter = ListQuery::parse(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .map_err(BulkError::Filter)?;
    let reason = kept_reason(parsed.reason);
    if action == BulkAction::Redeliver && reason.is_empty() {
        return Err(BulkError::MissingReason);
    }
    let limit = parsed.limit.unwrap_or(DEFAULT_BULK_LIMIT);
    if !(1..=MAX_BULK_LIMIT).contains(&limit) {
        return Err(BulkError::Limit);
    }
    let per_second = parsed.per_second.unwrap_or(DEFAULT_PER_SECOND);
    if !(1..=MAX_PER_SECOND).contains(&per_second) {
        return Err(BulkError::PerSecond);
    }
    let given = match parsed.sent_before.as_deref() {
        None => None,
        Some(_) if action == BulkAction::Retry => return Err(BulkError::SentBeforeRetry),
        Some(text) => Some(parse_rfc3339_ms(text).ok_or(BulkError::SentBefore)?),
    };
    pairs.sort();
    let fingerprint = fingerprint(action, parsed.dry_run, &pairs);
    let (resume, before, carried) = match parsed.cursor.as_deref() {
        None => (LedgerCursor::default(), Counts::default(), None),
        Some(text) => {
            let cursor = decode(text).ok_or(BulkError::Cursor)?;
            // A body may repeat the cut-off the cursor carries, never change it mid-run.
            let other_cutoff = given.is_some() && cursor.b.is_some() && given != cursor.b;
            if cursor.f != fingerprint || other_cutoff {
                return Err(BulkError::Cursor);
            }
            (
                LedgerCursor {
                    cursor: cursor.c,
                    after_key: cursor.a,
                },
                cursor.t,
                cursor.b,
            )
        }
    };
    // Without a cut-off a request sent again (its answer lost) would take a new one and send
    // everything again: the run's identity must come from the caller.
    let acts = action == BulkAction::Redeliver && !parsed.dry_run;
    if acts && carried.is_none() && given.is_none() {
        return Err(BulkError::SentBeforeRequired);
    }
    Ok(BulkRequest {
        action,
        filter,
        reason,
        dry_run: parsed.dry_run,
        limit,
        per_second,
        resume,
        before,
        sent_before: carried.or(given),
        sent_before_unchecked: carried.is_none() && given.is_some(),
        fingerprint,
    })
}

/// Binds a cursor to what it resumes: the action, the dry-run flag and the filter.
fn fingerprint(action: BulkAction, dry_run: bool, sorted_pairs: &[(String, String)]) -> String {
    let mut hash = Sha256::new();
    hash.update(action.as_str());
    hash.update([u8::from(dry_run)]);
    for (k, v) in sorted_pairs {
        hash.update((k.len() as u64).to_le_bytes());
        hash.update(k);
        hash.update((v.len() as u64).to_le_bytes());
        hash.update(v);
    }
    URL_SAFE_NO_PAD.encode(&hash.finalize()[..12])
}

fn decode(text: &str) -> Option<BulkCursor> {
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(text).ok()?).ok()
}

impl BulkRequest {
    /// The most operations this request acts on: `limit`, cut so that pacing fits in
    /// [`MAX_PACED_SECONDS`]. A dry run calls no gate and is bounded by the pages it lists.
    pub fn page_limit(&self) -> usize {
        self.limit
            .min(self.per_second as usize * MAX_PACED_SECONDS)
            .max(1)
    }

    pub fn pause_ms(&self) -> u64 {
        1_000 / u64::from(self.per_second)
    }

    /// Whether an entry (key without `op:`) passes the filter: the listing's own rules.
    pub fn matches(&self, key: &str, meta: &LedgerMeta, now_secs: i64, stuck_after: i64) -> bool {
        self.filter.matches(meta, now_secs, stuck_after) && self.filter.matches_key(key, meta)
    }
}

/// One request's walk: what it counted, and whether it may act on another operation.
#[derive(Debug, Clone)]
pub struct BulkRun {
    pub request: BulkRequest,
    pub counts: Counts,
    /// A redelivery run's cut-off (Unix ms); `None` for a retry.
    pub sent_before: Option<i64>,
}

impl BulkRun {
    /// Starts one request of a run at `now_ms` (the edge's clock): a redelivery run with no
    /// cut-off yet takes `now_ms`; one the body gives may not be after it, or the run's own
    /// redeliveries (recorded by their gates after this) would come before it, and running
    /// it again would send them again.
    pub fn new(request: BulkRequest, now_ms: i64) -> Result<BulkRun, BulkError> {
        let sent_before = match request.action {
            BulkAction::Retry => None,
            BulkAction::Redeliver => {
                let cutoff = request.sent_before.unwrap_or(now_ms);
                if request.sent_before_unchecked && cutoff > now_ms {
                    return Err(BulkError::SentBeforeFuture);
                }
                Some(cutoff)
            }
        };
        Ok(BulkRun {
            request,
            counts: Counts::default(),
            sent_before,
        })
    }

    /// The command sent to the gate of each operation acted on; the reason recorded in its
    /// history says it came from a bulk action (the edge adds who asked,
    /// [`GateCommand::by`]).
    pub fn command(&self) -> GateCommand {
        let request = &self.request;
        let reason = if request.reason.is_empty() {
            format!("bulk {}", request.action.as_str())
        } else {
            format!("bulk {}: {}", request.action.as_str(), request.reason)
        };
        match request.action {
            BulkAction::Retry => GateCommand::RetryNow { reason, by: None },
            BulkAction::Redeliver => GateCommand::Redeliver {
                reason,
                sent_before_ms: self.sent_before,
                by: None,
            },
        }
    }

    /// True once this request has taken as many matching operations as it may: the walk
    /// stops before the next matching entry and answers a cursor.
    pub fn full(&self) -> bool {
        !self.request.dry_run && self.counts.matched >= self.request.page_limit() as u64
    }

    /// Counts a matching entry; true when its gate is to be called now (never in a dry run).
    pub fn take(&mut self, meta: &LedgerMeta, now_secs: i64) -> bool {
        self.counts.matched += 1;
        match skip_reason(self.request.action, meta, now_secs) {
            Some(reason) => *self.counts.skipped.entry(reason).or_default() += 1,
            None if self.request.dry_run => self.counts.eligible += 1,
            None => return true,
        }
        false
    }

    /// Records what the gate did with an operation this run acted on.
    pub fn record(&mut self, outcome: &CommandResult) {
        match outcome {
            CommandResult::Retried => self.counts.retried += 1,
            CommandResult::Redelivered => self.counts.redelivered += 1,
            CommandResult::Skipped(reason) => *self.counts.skipped.entry(*reason).or_default() += 1,
            CommandResult::Failed(_) => self.counts.failed += 1,
        }
    }

    /// The answer: this request's counts at the top, the run's so far under `total`, and the
    /// cursor to pass back (with the same body) while `complete` is false.
    pub fn answer(&self, resume: Option<&LedgerCursor>) -> Value {
        let mut total = self.request.before.clone();
        total.add(&self.counts);
        let dry_run = self.request.dry_run;
        let mut answer = self.counts.view(dry_run);
        let cursor = resume.map(|r| {
            let token = BulkCursor {
                c: r.cursor.clone(),
                a: r.after_key.clone(),
                f: self.request.fingerprint.clone(),
                t: total.clone(),
                b: self.sent_before,
            };
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&token).unwrap_or_default())
        });
        answer["action"] = json!(self.request.action.as_str());
        answer["dry_run"] = json!(dry_run);
        answer["complete"] = json!(cursor.is_none());
        answer["cursor"] = json!(cursor);
        answer["total"] = total.view(dry_run);
        if let Some(cutoff) = self.sent_before {
            answer["sent_before"] = json!(format_rfc3339(cutoff));
        }
        if !dry_run {
            answer["pace"] =
                json!({"per_second": self.request.per_second, "limit": self.request.page_limit()});
        }
        answer
    }
}

/// What a bulk request does next; the edge performs it and hands back what came of it.
#[derive(Debug, Clone, PartialEq)]
pub enum BulkStep {
    /// List the `op:` page under `prefix` after this KV cursor, for [`BulkWalk::on_page`].
    List {
        prefix: String,
        cursor: Option<String>,
    },
    /// Send [`BulkRun::command`] to `key`'s gate, first waiting [`BulkRequest::pause_ms`]
    /// unless it is the request's first call; then [`BulkRun::record`] of `run`.
    CallGate { key: String, pause_first: bool },
    /// Answer with this body.
    Answer(Value),
}

/// One bulk request as a walk over the `op:` ledger: which pages to list (at most
/// [`MAX_BULK_PAGES`]; a key prefix narrows the listing itself, every other filter reads
/// metadata), which gates to call, and the answer with the cursor to resume from.
#[derive(Debug, Clone)]
pub struct BulkWalk {
    pub run: BulkRun,
    walk: LedgerWalk,
    prefix: String,
    called: bool,
}

impl BulkWalk {
    /// Starts a request at `now_ms` (the edge's clock; see [`BulkRun::new`]).
    pub fn new(request: BulkRequest, now_ms: i64) -> Result<BulkWalk, BulkError> {
        let prefix = request.filter.prefix.as_deref().unwrap_or("");
        let prefix = format!("{OP_PREFIX}{prefix}");
        let walk = LedgerWalk::new(request.resume.clone(), MAX_BULK_PAGES);
        Ok(BulkWalk {
            run: BulkRun::new(request, now_ms)?,
            walk,
            prefix,
            called: false,
        })
    }

    /// The next step at `now_secs`; `stuck_after` is the configuration's stuck threshold (the
    /// listing's `stuck` filter).
    pub fn step(&mut self, now_secs: i64, stuck_after: i64) -> BulkStep {
        loop {
            let entry = match self.walk.step() {
                WalkStep::List { cursor } => {
                    let prefix = self.prefix.clone();
                    return BulkStep::List { prefix, cursor };
                }
                WalkStep::End(end) => return BulkStep::Answer(self.run.answer(end.as_ref())),
                WalkStep::Entry(entry) => entry,
            };
            let meta = entry
                .metadata
                .and_then(|m| serde_json::from_value::<LedgerMeta>(m).ok());
            let key = entry.name.strip_prefix(OP_PREFIX).unwrap_or(&entry.name);
            let matches = meta
                .as_ref()
                .is_some_and(|m| self.run.request.matches(key, m, now_secs, stuck_after));
            // A full request stops before its next match, so the last part of a run that has
            // no more matches ends complete.
            if matches && self.run.full() {
                return BulkStep::Answer(self.run.answer(Some(&self.walk.cursor())));
            }
            self.walk.pass();
            let Some(meta) = meta.filter(|_| matches) else {
                continue;
            };
            if self.run.take(&meta, now_secs) {
                // Spaced so a destination that just recovered gets a trickle, not the backlog.
                let pause_first = std::mem::replace(&mut self.called, true);
                let key = key.to_string();
                return BulkStep::CallGate { key, pause_first };
            }
        }
    }

    /// The page asked for by [`BulkStep::List`].
    pub fn on_page(&mut self, page: ListedPage) {
        self.walk.on_page(page);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operation::gate::protocol::EffectReport;
    use crate::operation::ledger_walk::ListedKey;

    fn meta(status: &str, done: bool) -> LedgerMeta {
        LedgerMeta {
            effect_done: done,
            ..LedgerMeta::sample(status)
        }
    }

    fn parse(action: BulkAction, body: &str) -> Result<BulkRequest, BulkError> {
        parse_bulk(action, body.as_bytes())
    }

    /// The clock of a test's requests: 2026-11-22T10:00:00.250Z.
    const NOW: i64 = 1_795_341_600_250;

    /// KV's pages of `op:` entries: (name, status, effect done), `per_page` to a page.
    fn ledger(entries: &[(&str, &str, bool)], per_page: usize) -> Vec<ListedPage> {
        let chunks: Vec<_> = entries.chunks(per_page).collect();
        chunks
            .iter()
            .enumerate()
            .map(|(i, chunk)| ListedPage {
                keys: chunk
                    .iter()
                    .map(|(name, status, done)| ListedKey {
                        name: format!("op:{name}"),
                        metadata: Some(serde_json::to_value(meta(status, *done)).unwrap()),
                    })
                    .collect(),
                cursor: (i + 1 < chunks.len()).then(|| (i + 1).to_string()),
                list_complete: i + 1 == chunks.len(),
            })
            .collect()
    }

    /// Performs a walk as the edge does, every gate answering `reply`: the lists made, the
    /// gates called (key, paused first) and the answer.
    fn perform(
        body: &str,
        pages: &[ListedPage],
        reply: &CommandResult,
    ) -> (Vec<Option<String>>, Vec<(String, bool)>, Value) {
        let request = parse(BulkAction::Retry, body).unwrap();
        let mut walk = BulkWalk::new(request, NOW).unwrap();
        let (mut lists, mut calls) = (Vec::new(), Vec::new());
        loop {
            match walk.step(NOW / 1_000, 86_400) {
                BulkStep::List { prefix, cursor } => {
                    assert_eq!(prefix, "op:batches/");
                    let at = cursor.as_deref().map_or(0, |c| c.parse().unwrap());
                    lists.push(cursor);
                    walk.on_page(pages[at].clone());
                }
                BulkStep::CallGate { key, pause_first } => {
                    calls.push((key, pause_first));
                    walk.run.record(reply);
                }
                BulkStep::Answer(answer) => return (lists, calls, answer),
            }
        }
    }

    #[test]
    fn a_bulk_walk_calls_each_matching_gate_spaced_after_the_first_and_ends_complete() {
        let pages = ledger(
            &[
                ("batches/a", "succeeded", false),
                ("batches/b", "running", false),
                ("batches/c", "failed", false),
            ],
            2,
        );
        let body = r#"{"filter": {"prefix": "batches/"}}"#;
        let (lists, calls, answer) = perform(body, &pages, &CommandResult::Retried);
        assert_eq!(lists, [None, Some("1".to_string())]);
        assert_eq!(
            calls,
            [
                ("batches/a".to_string(), false),
                ("batches/c".to_string(), true)
            ]
        );
        assert_eq!(answer["retried"], 2);
        assert_eq!(answer["skipped_by"]["no_outcome"], 1);
        assert_eq!(answer["complete"], true);
    }

    #[test]
    fn a_full_bulk_request_stops_before_its_next_match_and_its_cursor_resumes_there() {
        let pages = ledger(
            &[
                ("batches/a", "succeeded", false),
                ("batches/b", "succeeded", false),
                ("batches/c", "succeeded", false),
            ],
            3,
        );
        let (_, calls, first) = perform(
            r#"{"filter": {"prefix": "batches/"}, "limit": 2}"#,
            &pages,
            &CommandResult::Retried,
        );
        assert_eq!(calls.len(), 2);
        assert_eq!(first["complete"], false);
        let cursor = first["cursor"].as_str().unwrap();
        let next =
            format!(r#"{{"filter": {{"prefix": "batches/"}}, "limit": 2, "cursor": "{cursor}"}}"#);
        let (_, calls, rest) = perform(&next, &pages, &CommandResult::Retried);
        assert_eq!(calls, [("batches/c".to_string(), false)]);
        assert_eq!(
            (rest["complete"].clone(), rest["total"]["retried"].clone()),
            (json!(true), json!(3))
        );
    }

    #[test]
    fn a_bulk_walk_lists_at_most_its_pages_and_a_dry_run_calls_no_gate() {
        let names: Vec<String> = (0..MAX_BULK_PAGES + 2)
            .map(|i| format!("batches/{i:02}"))
            .collect();
        let entries: Vec<(&str, &str, bool)> = names
            .iter()
            .map(|n| (n.as_str(), "succeeded", false))
            .collect();
        let pages = ledger(&entries, 1);
        let (lists, calls, answer) = perform(
            r#"{"filter": {"prefix": "batches/"}, "dry_run": true}"#,
            &pages,
            &CommandResult::Retried,
        );
        assert_eq!((lists.len(), calls.len()), (MAX_BULK_PAGES, 0));
        assert_eq!(answer["eligible"], MAX_BULK_PAGES);
        assert_eq!(
            answer["complete"], false,
            "the rest is for the next request"
        );
    }

    #[test]
    fn retry_acts_on_terminal_effects_not_done() {
        let r = BulkAction::Retry;
        assert_eq!(skip_reason(r, &meta("succeeded", false), 10), None);
        assert_eq!(skip_reason(r, &meta("failed", false), 10), None);
        assert_eq!(
            skip_reason(r, &meta("succeeded", true), 10),
            Some(SkipReason::Done)
        );
        assert_eq!(
            skip_reason(r, &meta("running", false), 10),
            Some(SkipReason::NoOutcome)
        );
        let mut claimed = meta("succeeded", false);
        claimed.claim_expires = Some(11);
        assert_eq!(skip_reason(r, &claimed, 10), Some(SkipReason::InFlight));
        assert_eq!(skip_reason(r, &claimed, 11), None, "a lapsed claim");
        let mut forgotten = meta("succeeded", false);
        forgotten.forgotten = true;
        assert_eq!(skip_reason(r, &forgotten, 10), Some(SkipReason::Forgotten));
        let mut parked = meta("expired", false);
        parked.parked = true;
        assert_eq!(skip_reason(r, &parked, 10), None, "parked is retried");
    }

    #[test]
    fn redeliver_acts_on_done_effects_only() {
        let r = BulkAction::Redeliver;
        assert_eq!(skip_reason(r, &meta("succeeded", true), 10), None);
        assert_eq!(
            skip_reason(r, &meta("succeeded", false), 10),
            Some(SkipReason::NotDone)
        );
        assert_eq!(
            skip_reason(r, &meta("pending", false), 10),
            Some(SkipReason::NoOutcome)
        );
    }

    #[test]
    fn gate_replies_are_counted_by_what_they_mean() {
        let redelivered = |action| GateReply::Redelivered {
            generation: 1,
            action,
            effect: EffectReport::Scheduled,
        };
        assert_eq!(
            command_result(&redelivered(OperatorAction::RetryNow)),
            CommandResult::Retried
        );
        assert_eq!(
            command_result(&redelivered(OperatorAction::Redeliver)),
            CommandResult::Redelivered
        );
        let refused = |r: OperatorRefusal| GateReply::Refused {
            reason: r.as_str().to_string(),
        };
        for (refusal, reason) in [
            (OperatorRefusal::AlreadyDone, SkipReason::Done),
            (OperatorRefusal::NotDone, SkipReason::NotDone),
            (OperatorRefusal::InFlight, SkipReason::InFlight),
            (OperatorRefusal::Forgotten, SkipReason::Forgotten),
            (OperatorRefusal::NotTerminal, SkipReason::NoOutcome),
            (OperatorRefusal::Retired, SkipReason::Gone),
            (OperatorRefusal::AlreadySettled, SkipReason::Refused),
            (
                OperatorRefusal::SentSinceCutoff,
                SkipReason::SentSinceCutoff,
            ),
        ] {
            assert_eq!(
                command_result(&refused(refusal)),
                CommandResult::Skipped(reason)
            );
        }
        assert_eq!(
            command_result(&GateReply::NotFound),
            CommandResult::Skipped(SkipReason::Gone)
        );
        assert!(matches!(
            command_result(&GateReply::IgnoredUnregistered),
            CommandResult::Failed(_)
        ));
    }

    #[test]
    fn a_body_takes_the_listing_filters() {
        let req = parse(
            BulkAction::Retry,
            r#"{"filter": {"kind": "billing", "parked": true, "settled_after": "2026-11-22T10:00:00Z"}, "dry_run": true}"#,
        )
        .unwrap();
        assert_eq!(req.filter.kind.as_deref(), Some("billing"));
        assert_eq!(req.filter.parked, Some(true));
        assert!(req.filter.settled_after.is_some());
        assert!(req.dry_run);
        assert_eq!(
            (req.limit, req.per_second),
            (DEFAULT_BULK_LIMIT, DEFAULT_PER_SECOND)
        );
        let mut m = meta("succeeded", false);
        m.kind = Some("billing".into());
        m.parked = true;
        m.settled_at = Some(1_900_000_000);
        assert!(req.matches("batches/a", &m, 0, 1));
        m.kind = Some("nightly".into());
        assert!(!req.matches("batches/a", &m, 0, 1));
        let empty = parse(BulkAction::Retry, "").unwrap();
        assert_eq!(
            empty.filter.limit,
            crate::operator::listing::DEFAULT_LIST_LIMIT
        );
        assert!(!empty.dry_run);
    }

    #[test]
    fn a_body_is_refused_with_a_reason() {
        let retry = BulkAction::Retry;
        assert!(matches!(parse(retry, "nope"), Err(BulkError::BadBody(_))));
        assert!(matches!(
            parse(retry, r#"{"filters": {}}"#),
            Err(BulkError::BadBody(_))
        ));
        assert_eq!(
            parse(retry, r#"{"filter": {"parked": 1}}"#),
            Err(BulkError::FilterValue("parked".into()))
        );
        assert_eq!(
            parse(retry, r#"{"filter": {"limit": "5"}}"#),
            Err(BulkError::FilterParam("limit".into()))
        );
        assert_eq!(
            parse(retry, r#"{"filter": {"status": "done"}}"#),
            Err(BulkError::Filter(ListError::Status("done".into())))
        );
        assert_eq!(
            parse(retry, r#"{"filter": {"colour": "red"}}"#),
            Err(BulkError::Filter(ListError::Unknown("colour".into())))
        );
        assert_eq!(parse(retry, r#"{"limit": 0}"#), Err(BulkError::Limit));
        assert_eq!(parse(retry, r#"{"limit": 101}"#), Err(BulkError::Limit));
        assert_eq!(
            parse(retry, r#"{"per_second": 51}"#),
            Err(BulkError::PerSecond)
        );
        assert_eq!(parse(retry, r#"{"cursor": "!!"}"#), Err(BulkError::Cursor));
    }

    #[test]
    fn redelivery_needs_a_reason_retry_does_not() {
        let redeliver = BulkAction::Redeliver;
        assert_eq!(parse(redeliver, "{}"), Err(BulkError::MissingReason));
        assert_eq!(
            parse(redeliver, r#"{"reason": "  "}"#),
            Err(BulkError::MissingReason)
        );
        let body =
            r#"{"reason": " receiver lost a day ", "sent_before": "2026-11-22T10:00:00.25Z"}"#;
        let r = parse(redeliver, body).unwrap();
        assert_eq!(
            BulkRun::new(r, NOW).unwrap().command(),
            GateCommand::Redeliver {
                reason: "bulk redeliver: receiver lost a day".into(),
                sent_before_ms: Some(NOW),
                by: None,
            }
        );
        let r = parse(BulkAction::Retry, "{}").unwrap();
        assert_eq!(
            BulkRun::new(r, NOW).unwrap().command(),
            GateCommand::RetryNow {
                reason: "bulk retry".into(),
                by: None,
            }
        );
    }

    #[test]
    fn pacing_bounds_each_request() {
        let r = parse(BulkAction::Retry, r#"{"limit": 100, "per_second": 2}"#).unwrap();
        assert_eq!(r.page_limit(), 60, "30 s of pacing at most");
        assert_eq!(r.pause_ms(), 500);
        let r = parse(BulkAction::Retry, r#"{"limit": 3}"#).unwrap();
        assert_eq!((r.page_limit(), r.pause_ms()), (3, 200));
    }

    fn run_over(req: BulkRequest, entries: &[LedgerMeta]) -> BulkRun {
        let mut run = BulkRun::new(req, NOW).unwrap();
        for m in entries {
            if run.full() {
                break;
            }
            if run.take(m, 0) {
                run.record(&CommandResult::Retried);
            }
        }
        run
    }

    #[test]
    fn a_run_stops_at_its_limit_and_resumes_with_its_totals() {
        let entries = [
            meta("succeeded", false),
            meta("succeeded", true),
            meta("failed", false),
        ];
        let body = r#"{"filter": {"kind": "billing"}, "limit": 2}"#;
        let first = run_over(parse(BulkAction::Retry, body).unwrap(), &entries);
        assert!(first.full());
        let resume = LedgerCursor {
            cursor: Some("kv".into()),
            after_key: Some("op:batches/b".into()),
        };
        let answer = first.answer(Some(&resume));
        assert_eq!(answer["matched"], 2);
        assert_eq!(answer["retried"], 1);
        assert_eq!(answer["skipped"], 1);
        assert_eq!(answer["skipped_by"]["done"], 1);
        assert_eq!(answer["complete"], false);
        let cursor = answer["cursor"].as_str().unwrap();

        let next =
            format!(r#"{{"filter": {{"kind": "billing"}}, "limit": 2, "cursor": "{cursor}"}}"#);
        let req = parse(BulkAction::Retry, &next).unwrap();
        assert_eq!(req.resume, resume);
        let second = run_over(req, &entries[2..]);
        let answer = second.answer(None);
        assert_eq!(answer["complete"], true);
        assert_eq!(answer["cursor"], Value::Null);
        assert_eq!(answer["matched"], 1);
        assert_eq!(answer["total"]["matched"], 3);
        assert_eq!(answer["total"]["retried"], 2);
        assert_eq!(answer["total"]["skipped"], 1);

        // The cursor resumes only the same action, dry-run flag and filter.
        for other in [
            format!(r#"{{"filter": {{"kind": "nightly"}}, "cursor": "{cursor}"}}"#),
            format!(
                r#"{{"filter": {{"kind": "billing"}}, "dry_run": true, "cursor": "{cursor}"}}"#
            ),
        ] {
            assert_eq!(
                parse(BulkAction::Retry, &other),
                Err(BulkError::Cursor),
                "{other}"
            );
        }
        let redeliver =
            format!(r#"{{"filter": {{"kind": "billing"}}, "reason": "r", "cursor": "{cursor}"}}"#);
        assert_eq!(
            parse(BulkAction::Redeliver, &redeliver),
            Err(BulkError::Cursor)
        );
    }

    #[test]
    fn a_dry_run_counts_and_never_acts() {
        let req = parse(BulkAction::Retry, r#"{"dry_run": true, "limit": 1}"#).unwrap();
        let mut run = BulkRun::new(req, NOW).unwrap();
        let entries = [
            meta("succeeded", false),
            meta("succeeded", true),
            meta("running", false),
        ];
        for m in &entries {
            assert!(!run.full(), "a dry run is bounded by pages, not by limit");
            assert!(!run.take(m, 0));
        }
        let answer = run.answer(None);
        assert_eq!(answer["matched"], 3);
        assert_eq!(answer["eligible"], 1);
        assert_eq!(answer["skipped_by"]["done"], 1);
        assert_eq!(answer["skipped_by"]["no_outcome"], 1);
        assert!(answer.get("retried").is_none());
        assert!(answer.get("pace").is_none());
    }
    /// A redelivery run's first request over `entries`, then the rest with its cursor at
    /// `later`; every entry's gate answers `reply`. Returns both answers.
    const LOST_AT_NOW: &str = r#"{"reason": "lost", "sent_before": "2026-11-22T10:00:00.25Z"}"#;

    #[test]
    fn a_redelivery_takes_its_cut_off_from_the_caller_and_a_dry_run_answers_one() {
        let redeliver = BulkAction::Redeliver;
        assert_eq!(
            parse(redeliver, r#"{"reason": "lost"}"#),
            Err(BulkError::SentBeforeRequired)
        );
        let dry = parse(redeliver, r#"{"reason": "lost", "dry_run": true}"#).unwrap();
        let counted = BulkRun::new(dry, NOW).unwrap().answer(None);
        assert_eq!(counted["sent_before"], "2026-11-22T10:00:00.25Z");
        // The run its answer starts, sent twice as it was sent, is one run: one cut-off.
        let body = format!(
            r#"{{"reason": "lost", "sent_before": {}}}"#,
            counted["sent_before"]
        );
        let twice = [NOW + 1_000, NOW + 9_000].map(|now| {
            BulkRun::new(parse(redeliver, &body).unwrap(), now)
                .unwrap()
                .sent_before
        });
        assert_eq!(twice, [Some(NOW), Some(NOW)]);
    }

    fn redeliver_in_two(body: &str, later: i64, reply: &CommandResult) -> (Value, Value) {
        let entries = [meta("succeeded", true), meta("succeeded", true)];
        let mut first = BulkRun::new(parse(BulkAction::Redeliver, body).unwrap(), NOW).unwrap();
        assert!(first.take(&entries[0], 0));
        first.record(reply);
        let resume = LedgerCursor {
            cursor: None,
            after_key: Some("op:batches/a".into()),
        };
        let one = first.answer(Some(&resume));
        let next = format!(
            r#"{{"reason": "lost", "cursor": "{}"}}"#,
            one["cursor"].as_str().unwrap()
        );
        let mut second = BulkRun::new(parse(BulkAction::Redeliver, &next).unwrap(), later).unwrap();
        assert_eq!(
            second.command(),
            first.command(),
            "the cursor keeps the cut-off"
        );
        assert!(second.take(&entries[1], 0));
        second.record(reply);
        (one, second.answer(None))
    }

    #[test]
    fn a_redelivery_run_is_cut_off_at_its_first_request_and_keeps_it() {
        let (one, two) = redeliver_in_two(LOST_AT_NOW, NOW + 60_000, &CommandResult::Redelivered);
        assert_eq!(one["sent_before"], "2026-11-22T10:00:00.25Z");
        assert_eq!(two["sent_before"], one["sent_before"]);
        assert_eq!(two["total"]["redelivered"], 2);
        // The same run again: the answered cut-off in the body; its gates refuse what it sent.
        let again = format!(
            r#"{{"reason": "lost", "sent_before": {}}}"#,
            one["sent_before"]
        );
        let refused = CommandResult::Skipped(SkipReason::SentSinceCutoff);
        let (one, two) = redeliver_in_two(&again, NOW + 120_000, &refused);
        assert_eq!(one["sent_before"], "2026-11-22T10:00:00.25Z");
        assert_eq!(two["total"]["redelivered"], 0);
        assert_eq!(two["total"]["skipped_by"]["sent_since_cutoff"], 2);
        let run = BulkRun::new(parse(BulkAction::Redeliver, &again).unwrap(), NOW).unwrap();
        assert_eq!(
            run.command(),
            GateCommand::Redeliver {
                reason: "bulk redeliver: lost".into(),
                sent_before_ms: Some(NOW),
                by: None,
            }
        );
        // A retry has no cut-off, on the wire or in its answer.
        let retry = BulkRun::new(parse(BulkAction::Retry, "{}").unwrap(), NOW).unwrap();
        assert_eq!(retry.sent_before, None);
        assert!(retry.answer(None).get("sent_before").is_none());
    }

    #[test]
    fn a_cut_off_is_a_past_time_given_to_a_redelivery_and_never_changed_mid_run() {
        let redeliver = BulkAction::Redeliver;
        for bad in [r#""yesterday""#, "12", r#""2026-11-22""#] {
            let body = format!(r#"{{"reason": "r", "sent_before": {bad}}}"#);
            let refused = parse(redeliver, &body).err();
            assert!(
                matches!(refused, Some(BulkError::SentBefore | BulkError::BadBody(_))),
                "{bad}: {refused:?}"
            );
        }
        assert_eq!(
            parse(
                BulkAction::Retry,
                r#"{"sent_before": "2026-11-22T10:00:00Z"}"#
            ),
            Err(BulkError::SentBeforeRetry)
        );
        // Not after the clock of the request that sets it: the run's own redeliveries would
        // come before it.
        let future = parse(
            redeliver,
            r#"{"reason": "r", "sent_before": "2026-11-22T10:00:01Z"}"#,
        );
        assert_eq!(
            BulkRun::new(future.unwrap(), NOW).err(),
            Some(BulkError::SentBeforeFuture)
        );
        let at_now = parse(
            redeliver,
            r#"{"reason": "r", "sent_before": "2026-11-22T10:00:00.250Z"}"#,
        );
        assert_eq!(
            BulkRun::new(at_now.unwrap(), NOW).unwrap().sent_before,
            Some(NOW)
        );

        // A cursor carries the cut-off: the body may repeat it, not change it.
        let first = BulkRun::new(parse(redeliver, LOST_AT_NOW).unwrap(), NOW).unwrap();
        let answer = first.answer(Some(&LedgerCursor::default()));
        let cursor = answer["cursor"].as_str().unwrap();
        let same = format!(
            r#"{{"reason": "r", "sent_before": {}, "cursor": "{cursor}"}}"#,
            answer["sent_before"]
        );
        assert_eq!(parse(redeliver, &same).unwrap().sent_before, Some(NOW));
        let other = format!(
            r#"{{"reason": "r", "sent_before": "2026-11-22T09:00:00Z", "cursor": "{cursor}"}}"#
        );
        assert_eq!(parse(redeliver, &other), Err(BulkError::Cursor));
        // A cursor's cut-off is not checked against a later request's clock (which may lag).
        let resumed = parse(
            redeliver,
            &format!(r#"{{"reason": "r", "cursor": "{cursor}"}}"#),
        );
        assert_eq!(
            BulkRun::new(resumed.unwrap(), NOW - 5).unwrap().sent_before,
            Some(NOW)
        );
    }
}
