//! Property tests of the pure core (reliability evidence), through the crate's public
//! API only: the reducer and the operation record, key normalization, and "no panic, bounded
//! output" over arbitrary input for signature verification, envelope parsing, status-API
//! interpretation and configuration parsing.
//!
//! Run: `cargo test --test properties`. Case counts are moderate so the whole file runs in a
//! few seconds; `PROPERTIES_SCALE=<n>` multiplies them when hunting. Seeds are random per
//! run (set `PROPTEST_RNG_SEED` to replay one); failing inputs are printed, not persisted.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use proptest::prelude::*;
use proptest::test_runner::Config as PtConfig;
use serde_json::{json, Map, Value};

use gemini_once::config::{Config, Fallback, Kind, Variable, VARIABLES};
use gemini_once::inbound::envelope::{self, EnvelopeError};
use gemini_once::operation::details::normalize_details;
use gemini_once::operation::key::{normalize, Collection, KeyError, MAX_NAME_BYTES};
use gemini_once::operation::lifecycle::{reduce, DropReason, Position, Source, Status, Verdict};
use gemini_once::operation::observation::{StatusError, DEFAULT_RETRY_AFTER_SECS};
use gemini_once::operation::{AttemptOutcome, Claim, Finished, OpEvent, Operation};
use gemini_once::operator::access::Scope;
use gemini_once::reconciliation::status;
use gemini_once::retry::{Backoff, Heard};
use gemini_once::signature::{self, Secret, SignatureError, SignedHeaders};

/// The row of [`VARIABLES`] called `name`, if the worker reads one.
fn variable(name: &str) -> Option<&'static Variable> {
    VARIABLES.iter().find(|v| v.name == name)
}

/// One delivery checked as the intake checks it: its headers, then its body.
fn verify(
    headers: SignedHeaders<'_>,
    body: &[u8],
    secrets: &[Secret],
    now_secs: i64,
    tolerance_secs: i64,
) -> Result<(), SignatureError> {
    signature::check_headers(headers, now_secs, tolerance_secs)?.verify(body, secrets)
}

/// `PROPERTIES_SCALE=10 cargo test --test properties` runs ten times as many cases.
fn cfg(cases: u32) -> PtConfig {
    let scale: u32 = std::env::var("PROPERTIES_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    PtConfig {
        cases: cases.saturating_mul(scale.max(1)),
        failure_persistence: None,
        ..PtConfig::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------------------------

fn status_strategy() -> impl Strategy<Value = Status> {
    prop_oneof![
        3 => Just(Status::Pending),
        3 => Just(Status::Running),
        3 => Just(Status::RequiresAction),
        2 => Just(Status::Succeeded),
        2 => Just(Status::Failed),
        2 => Just(Status::Cancelled),
        2 => Just(Status::Expired),
        // Unknown, including spellings that look like known ones in another case or form.
        2 => prop_oneof![
            Just("UNSPECIFIED".to_string()),
            Just("SUCCEEDED".to_string()),
            Just("".to_string()),
            "[a-z_]{1,12}",
        ]
        .prop_filter("must not be one of our own spellings", |s| {
            !matches!(Status::parse(s), Status::Pending
                | Status::Running
                | Status::RequiresAction
                | Status::Succeeded
                | Status::Failed
                | Status::Cancelled
                | Status::Expired)
        })
        .prop_map(Status::Unknown),
    ]
}

/// Update times with many ties and zeros (a missing server time), plus extremes.
fn time_strategy() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => Just(0i64),
        6 => 0i64..8,
        2 => 0i64..2_000_000_000_000,
        1 => Just(i64::MAX),
        1 => -5i64..0,
    ]
}

fn source_strategy() -> impl Strategy<Value = Source> {
    prop_oneof![
        Just(Source::Webhook),
        Just(Source::Reconcile),
        Just(Source::Registration),
        Just(Source::Operator),
    ]
}

fn event_strategy() -> impl Strategy<Value = OpEvent> {
    (
        status_strategy(),
        time_strategy(),
        source_strategy(),
        0u32..1_000_000,
    )
        .prop_map(|(status, update_time_ms, source, tag)| {
            let mut details = Map::new();
            // A unique tag per event lets the test tell which event's details were kept.
            details.insert("tag".into(), json!(tag));
            OpEvent {
                status,
                update_time_ms,
                source,
                // Normalized, as every path builds an event's details.
                details: normalize_details(&details),
                delivery_id: Some(format!("msg_{tag}")),
            }
        })
}

fn pos(status: &Status, t: i64) -> Position {
    Position {
        status: status.clone(),
        update_time_ms: t,
    }
}

// ---------------------------------------------------------------------------------------------
// Reducer
// ---------------------------------------------------------------------------------------------

/// The declarative expectation for a sequence that holds no terminal event: the highest-ranked
/// known state seen (the registration's PENDING at time 0 counts as seen first), and among
/// those the newest update time; on a tie of rank and time the earliest one stays.
fn expected_without_terminal(events: &[(Status, i64)]) -> (Status, i64) {
    let mut seen: Vec<(Status, i64)> = vec![(Status::Pending, 0)];
    seen.extend(events.iter().filter(|(s, _)| s.rank() >= 0).cloned());
    let top_rank = seen.iter().map(|(s, _)| s.rank()).max().unwrap();
    let top_time = seen
        .iter()
        .filter(|(s, _)| s.rank() == top_rank)
        .map(|(_, t)| *t)
        .max()
        .unwrap();
    seen.into_iter()
        .find(|(s, t)| s.rank() == top_rank && *t == top_time)
        .unwrap()
}

proptest! {
    #![proptest_config(cfg(400))]

    /// Folding any event sequence through `reduce`: rank never decreases, the first terminal
    /// wins and absorbs everything after it (each later event dropped with the right reason),
    /// and before any terminal the state is the declarative maximum.
    #[test]
    fn reducer_is_monotonic_and_first_terminal_wins(
        events in prop::collection::vec((status_strategy(), time_strategy()), 0..40)
    ) {
        let mut current = pos(&Status::Pending, 0);
        let mut first_terminal: Option<(Status, i64)> = None;
        for (i, (status, t)) in events.iter().enumerate() {
            let incoming = pos(status, *t);
            let verdict = reduce(&current, &incoming);
            let before = current.clone();
            if verdict == Verdict::Apply {
                current = incoming.clone();
            }
            // Never backward on the lattice; never onto an unknown state.
            prop_assert!(current.status.rank() >= before.status.rank(), "rank fell at event {i}: {before:?} -> {current:?}");
            prop_assert!(current.status.rank() >= 0);
            if status.rank() < 0 {
                prop_assert_eq!(verdict, Verdict::Drop(DropReason::UnknownState));
            }
            match &first_terminal {
                None if status.is_terminal() => {
                    prop_assert_eq!(verdict, Verdict::Apply, "the first terminal must be applied");
                    first_terminal = Some((status.clone(), *t));
                }
                None => {
                    let seen: Vec<(Status, i64)> = events[..=i].to_vec();
                    let want = expected_without_terminal(&seen);
                    prop_assert_eq!((current.status.clone(), current.update_time_ms), want);
                }
                Some((won, won_t)) => {
                    // Absorbed: the state is the first terminal, whatever arrives.
                    prop_assert!(matches!(verdict, Verdict::Drop(_)), "event after terminal applied: {status:?}");
                    prop_assert_eq!(&current.status, won);
                    prop_assert_eq!(current.update_time_ms, *won_t);
                    let want = if status.rank() < 0 {
                        DropReason::UnknownState
                    } else if status == won {
                        DropReason::Duplicate
                    } else if status.is_terminal() {
                        DropReason::ConflictingTerminal
                    } else {
                        DropReason::RegressFromTerminal
                    };
                    prop_assert_eq!(verdict, Verdict::Drop(want));
                }
            }
        }
    }

    /// The reducer on arbitrary pairs: Apply exactly when the incoming state is known, the
    /// current one is not terminal, and the incoming one is higher, or equal with a strictly
    /// newer update time.
    #[test]
    fn reducer_verdict_on_any_pair(
        a in status_strategy(), ta in time_strategy(),
        b in status_strategy(), tb in time_strategy(),
    ) {
        let verdict = reduce(&pos(&a, ta), &pos(&b, tb));
        let applies = b.rank() >= 0
            && !a.is_terminal()
            && (b.rank() > a.rank() || (b.rank() == a.rank() && tb > ta));
        prop_assert_eq!(verdict == Verdict::Apply, applies, "{:?}@{} <- {:?}@{}: {:?}", a, ta, b, tb, verdict);
    }

    /// The same through `Operation::apply`: a dropped event changes nothing at all, an applied
    /// one bumps the version, and the first terminal's time, source and details are the ones
    /// kept.
    #[test]
    fn operation_apply_keeps_the_first_terminal(
        events in prop::collection::vec(event_strategy(), 0..40),
        registered in any::<bool>(),
    ) {
        let mut op = if registered {
            Operation::register("batches/p", "batches/p", Some("k".into()), 1_000)
        } else {
            Operation::unregistered("batches/p", "batches/p", 1_000)
        };
        let mut first_terminal: Option<(OpEvent, i64)> = None;
        let mut seen_before_terminal: Vec<(Status, i64)> = Vec::new();
        for (i, event) in events.iter().enumerate() {
            let now = 2_000 + i as i64;
            let before = op.clone();
            let verdict = op.apply(event, now);
            prop_assert!(op.status().rank() >= before.status().rank());
            match verdict {
                Verdict::Apply => {
                    prop_assert_eq!(op.version(), before.version() + 1);
                    prop_assert_eq!(op.status(), &event.status);
                    prop_assert_eq!(op.update_time_ms(), event.update_time_ms);
                }
                Verdict::Drop(_) => prop_assert_eq!(&op, &before, "a dropped event changed the record"),
            }
            if first_terminal.is_none() && event.status.is_terminal() {
                prop_assert_eq!(verdict, Verdict::Apply);
                first_terminal = Some((event.clone(), now));
            }
            if first_terminal.is_none() {
                seen_before_terminal.push((event.status.clone(), event.update_time_ms));
                let want = expected_without_terminal(&seen_before_terminal);
                prop_assert_eq!((op.status().clone(), op.update_time_ms()), want);
                prop_assert_eq!(op.settled_at_ms(), None);
                prop_assert!(!op.effect_owed());
            }
        }
        match first_terminal {
            Some((won, at)) => {
                prop_assert_eq!(op.status(), &won.status);
                prop_assert_eq!(op.update_time_ms(), won.update_time_ms);
                prop_assert_eq!(op.settled_at_ms(), Some(at));
                prop_assert_eq!(op.settled_by(), Some(won.source));
                // The record keeps the first terminal's details, as they came.
                prop_assert_eq!(op.details(), &won.details);
                prop_assert!(op.effect_owed());
                prop_assert!(!op.effect().done());
            }
            None => prop_assert!(!op.status().is_terminal()),
        }
        prop_assert_eq!(op.registered(), registered);
    }
}

// ---------------------------------------------------------------------------------------------
// Claims and fencing
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum TokenPick {
    /// The token of the live claim, if any (else a never-issued one).
    Current,
    /// Some token issued earlier (index into the issued list).
    Issued(usize),
    /// A token never issued yet.
    Future(u64),
    Arbitrary(u64),
}

#[derive(Debug, Clone)]
enum Step {
    Event(OpEvent),
    Claim {
        now: i64,
        ttl: i64,
    },
    Finish {
        pick: TokenPick,
        outcome: AttemptOutcome,
        now: i64,
        backoff: i64,
    },
}

fn outcome_strategy() -> impl Strategy<Value = AttemptOutcome> {
    prop_oneof![
        3 => Just(AttemptOutcome::Delivered),
        3 => "[a-z0-9 ]{0,10}".prop_map(AttemptOutcome::Retry),
        1 => "[a-z0-9 ]{0,10}".prop_map(AttemptOutcome::Park),
    ]
}

fn step_strategy() -> impl Strategy<Value = Step> {
    let now = prop_oneof![3 => 0i64..20_000, 1 => any::<i32>().prop_map(i64::from)];
    let token = prop_oneof![
        4 => Just(TokenPick::Current),
        2 => (0usize..16).prop_map(TokenPick::Issued),
        1 => (1u64..4).prop_map(TokenPick::Future),
        1 => any::<u64>().prop_map(TokenPick::Arbitrary),
    ];
    prop_oneof![
        2 => event_strategy().prop_map(Step::Event),
        4 => (now.clone(), 0i64..5_000).prop_map(|(now, ttl)| Step::Claim { now, ttl }),
        4 => (token, outcome_strategy(), now, 0i64..10_000)
            .prop_map(|(pick, outcome, now, backoff)| Step::Finish { pick, outcome, now, backoff }),
    ]
}

proptest! {
    #![proptest_config(cfg(400))]

    /// Any interleaving of events, claims and finishes with random tokens and times:
    /// `effect.done` is set only by a finish with the current token and a Delivered outcome,
    /// and never unset; tokens strictly increase; a fenced finish changes nothing; a claim is
    /// granted only when the effect is owed, due, and no live claim holds it.
    #[test]
    fn effect_done_only_by_current_token_and_delivered(
        steps in prop::collection::vec(step_strategy(), 0..60)
    ) {
        let mut op = Operation::register("batches/c", "batches/c", None, 0);
        let mut issued: Vec<u64> = Vec::new();
        let mut granted = 0u32;
        for step in &steps {
            let before = op.clone();
            match step {
                Step::Event(e) => {
                    op.apply(e, 0);
                    prop_assert_eq!(op.effect().done(), before.effect().done(), "an event changed effect.done");
                    prop_assert_eq!(op.effect().fence(), before.effect().fence());
                }
                Step::Claim { now, ttl } => {
                    let got = op.claim(*now, *ttl);
                    let live = matches!(before.effect().claim(), Some(c) if c.expires_ms > *now);
                    let may = before.effect_owed() && *now >= before.effect().next_attempt_ms() && !live;
                    prop_assert_eq!(got.is_some(), may, "claim granted={:?} but allowed={}", got, may);
                    match got {
                        Some(c) => {
                            granted += 1;
                            if let Some(last) = issued.last() {
                                prop_assert!(c.token > *last, "token {} not above {}", c.token, last);
                            }
                            prop_assert_eq!(c.expires_ms, now + ttl);
                            prop_assert_eq!(op.effect().claim(), Some(c));
                            issued.push(c.token);
                        }
                        None => prop_assert_eq!(&op, &before, "a refused claim changed the record"),
                    }
                    prop_assert!(!op.effect().done() || before.effect().done(), "a claim set done");
                }
                Step::Finish { pick, outcome, now, backoff } => {
                    let token = match pick {
                        TokenPick::Current => before.effect().claim().map(|c| c.token).unwrap_or(before.effect().fence() + 1),
                        TokenPick::Issued(i) if !issued.is_empty() => issued[i % issued.len()],
                        TokenPick::Issued(_) => 1,
                        TokenPick::Future(d) => before.effect().fence() + d,
                        TokenPick::Arbitrary(t) => *t,
                    };
                    let current = matches!(before.effect().claim(), Some(c) if c.token == token);
                    // A backoff of one step, `backoff`, whatever the failures (no jitter).
                    let heard = Heard::Answer(outcome, None);
                    let backoff = Backoff::new(*backoff, *backoff);
                    // Generation 0 (a claim stored before claims kept theirs) is never current, so
                    // an answer under a stale token is fenced whatever it says (no late 2xx).
                    let claim = Claim { token, expires_ms: 0, generation: 0 };
                    let result = op.finish_attempt(&claim, heard, backoff, *now, 1.0);
                    if !current {
                        prop_assert_eq!(result, Finished::Fenced);
                        prop_assert_eq!(&op, &before, "a fenced finish changed the record");
                    } else {
                        prop_assert_eq!(op.effect().claim(), None, "finish must release the claim");
                        match outcome {
                            AttemptOutcome::Delivered => {
                                prop_assert_eq!(result, Finished::Done);
                                prop_assert!(op.effect().done());
                                prop_assert_eq!(op.effect().done_at_ms(), Some(*now));
                            }
                            AttemptOutcome::Retry(_) => {
                                prop_assert_eq!(result, Finished::RetryAt(now + backoff.first_ms));
                                prop_assert_eq!(op.effect().done(), before.effect().done());
                                prop_assert_eq!(op.effect().next_attempt_ms(), now + backoff.first_ms);
                            }
                            AttemptOutcome::Park(_) => {
                                prop_assert_eq!(result, Finished::Parked);
                                prop_assert_eq!(op.effect().done(), before.effect().done());
                                prop_assert!(op.effect().parked().is_some());
                            }
                        }
                    }
                    // The one way done may become true.
                    if op.effect().done() && !before.effect().done() {
                        prop_assert!(current && *outcome == AttemptOutcome::Delivered);
                    }
                }
            }
            // Never unset; only ever for a terminal operation; the fence covers every token.
            prop_assert!(!before.effect().done() || op.effect().done(), "effect.done was unset");
            prop_assert!(!op.effect().done() || op.status().is_terminal());
            prop_assert!(op.effect().fence() >= issued.last().copied().unwrap_or(0));
            prop_assert!(op.effect().fence() >= before.effect().fence());
        }
        prop_assert_eq!(op.effect().attempts(), granted);
    }
}

// ---------------------------------------------------------------------------------------------
// Key normalization
// ---------------------------------------------------------------------------------------------

fn collection_strategy() -> impl Strategy<Value = Collection> {
    prop_oneof![
        Just(Collection::Batches),
        Just(Collection::Operations),
        Just(Collection::Interactions),
    ]
}

/// An id Gemini could issue: accepted characters, not a `.`/`..` segment.
fn id_strategy() -> impl Strategy<Value = String> {
    "[A-Za-z0-9._~:@+=-]{1,40}".prop_filter("dot segment", |s| s != "." && s != "..")
}

/// A path segment for a prefix (project, location, model).
fn segment_strategy() -> impl Strategy<Value = String> {
    "[A-Za-z0-9_~:@+=-][A-Za-z0-9._~:@+=-]{0,15}"
}

fn whitespace_strategy() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just(' '),
            Just('\t'),
            Just('\n'),
            Just('\r'),
            Just('\u{0b}'),
            Just('\u{0c}'),
            Just('\u{a0}'),
            Just('\u{2003}'),
            Just('\u{3000}'),
        ],
        0..4,
    )
    .prop_map(|v| v.into_iter().collect())
}

/// How one accepted form of `c/id` is written.
#[derive(Debug, Clone)]
struct Form {
    /// Any segments before the rest, collection names included: the last pair decides.
    prefix: Vec<String>,
    project: Option<(String, String)>,
    model: Option<String>,
    bare: bool,
    /// The collection an event type implies, which a full name must ignore.
    implied: Option<Collection>,
    leading: usize,
    trailing: usize,
    doubled: Vec<usize>,
    before: String,
    after: String,
}

fn form_strategy() -> impl Strategy<Value = Form> {
    let prefix_segment = prop_oneof![
        Just("batches".to_string()),
        Just("operations".to_string()),
        Just("interactions".to_string()),
        Just("models".to_string()),
        segment_strategy(),
    ];
    (
        prop_oneof![
            2 => Just(Vec::new()),
            1 => prop::collection::vec(prefix_segment, 1..5),
        ],
        prop::option::of((segment_strategy(), segment_strategy())),
        prop::option::of(segment_strategy()),
        any::<bool>(),
        prop::option::of(collection_strategy()),
        0usize..4,
        0usize..4,
        prop::collection::vec(0usize..4, 0..12),
        whitespace_strategy(),
        whitespace_strategy(),
    )
        .prop_map(
            |(prefix, project, model, bare, implied, leading, trailing, doubled, before, after)| {
                Form {
                    prefix,
                    project,
                    model,
                    bare,
                    implied,
                    leading,
                    trailing,
                    doubled,
                    before,
                    after,
                }
            },
        )
}

/// Writes `c/id` in `form`. Returns the text and the implied collection to pass (a bare id
/// takes its collection from the event type).
fn write(c: Collection, id: &str, form: &Form) -> (String, Option<Collection>) {
    // A bare id that is itself a collection name is not an accepted form.
    let bare = form.bare && !matches!(id, "batches" | "operations" | "interactions");
    let mut segments: Vec<String> = Vec::new();
    if !bare {
        segments.extend(form.prefix.iter().cloned());
        if let Some((p, l)) = &form.project {
            segments.extend(["projects".into(), p.clone(), "locations".into(), l.clone()]);
        }
        if let (Collection::Operations, Some(m)) = (c, &form.model) {
            segments.extend(["models".into(), m.clone()]);
        }
        segments.push(c.as_str().to_string());
    }
    segments.push(id.to_string());
    // Join with one or more slashes, per gap.
    let mut text = "/".repeat(form.leading);
    for (i, s) in segments.iter().enumerate() {
        if i > 0 {
            let extra = form.doubled.get(i - 1).copied().unwrap_or(0);
            text.push_str(&"/".repeat(1 + extra));
        }
        text.push_str(s);
    }
    text.push_str(&"/".repeat(form.trailing));
    let text = format!("{}{}{}", form.before, text, form.after);
    // A bare id takes its collection from the event type; a full name ignores it.
    let implied = if bare { Some(c) } else { form.implied };
    (text, implied)
}

proptest! {
    #![proptest_config(cfg(600))]

    /// Every accepted form of a name gives the same key, the same collection, and a name that
    /// normalizes to that key again.
    #[test]
    fn every_form_gives_the_same_key(
        c in collection_strategy(),
        id in id_strategy(),
        forms in prop::collection::vec(form_strategy(), 1..5),
    ) {
        let want = format!("{}/{}", c.as_str(), id);
        for form in &forms {
            let (text, implied) = write(c, &id, form);
            let k = normalize(&text, implied);
            prop_assert!(k.is_ok(), "{:?} ({:?}) refused: {:?}", text, form, k);
            let k = k.unwrap();
            prop_assert_eq!(&k.key, &want, "form {:?}", text);
            prop_assert_eq!(k.collection, c);
            // The kept name is canonical: no empty segments, no surrounding white space, and
            // it gives the same key on its own, without any implied collection.
            prop_assert!(!k.name.split('/').any(str::is_empty), "{:?}", k.name);
            prop_assert_eq!(k.name.trim(), k.name.as_str());
            prop_assert_eq!(normalize(&k.name, None).map(|n| n.key), Ok(want.clone()));
            prop_assert_eq!(normalize(&k.key, None).map(|n| n.key), Ok(want.clone()));
        }
    }

    /// Different operations (collection or id differ) never share a key, whatever their forms.
    #[test]
    fn different_operations_never_share_a_key(
        a in (collection_strategy(), id_strategy()),
        b in (collection_strategy(), id_strategy()),
        fa in form_strategy(),
        fb in form_strategy(),
    ) {
        prop_assume!(a != b);
        let (ta, ia) = write(a.0, &a.1, &fa);
        let (tb, ib) = write(b.0, &b.1, &fb);
        let ka = normalize(&ta, ia).unwrap();
        let kb = normalize(&tb, ib).unwrap();
        prop_assert_ne!(&ka.key, &kb.key, "{:?} and {:?}", ta, tb);
    }

    /// Case is kept: ids that differ only in case are different operations.
    #[test]
    fn case_is_significant(c in collection_strategy(), id in "[a-z]{1,10}[A-Z][A-Za-z]{0,10}") {
        let upper = normalize(&format!("{}/{}", c.as_str(), id), None).unwrap().key;
        let lower = normalize(&format!("{}/{}", c.as_str(), id.to_lowercase()), None).unwrap().key;
        prop_assert_ne!(upper, lower);
    }

    /// A `.` or `..` segment anywhere in an otherwise good name is refused, never resolved.
    #[test]
    fn dot_segments_are_refused(
        c in collection_strategy(),
        id in id_strategy(),
        dot in prop_oneof![Just("."), Just("..")],
        at in 0usize..3,
    ) {
        let mut segments = vec![c.as_str().to_string(), id];
        segments.insert(at.min(segments.len()), dot.to_string());
        let text = segments.join("/");
        prop_assert!(normalize(&text, None).is_err(), "{:?} accepted", text);
        prop_assert!(normalize(&text, Some(c)).is_err(), "{:?} accepted", text);
    }
}

/// Arbitrary text for the no-panic properties: any Unicode, plus strings built from the
/// characters that matter to the parser.
fn hostile_name() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[ /.a-z%\\\\\t\n\u{0}\u{a0}é😀]{0,60}",
        prop::collection::vec(
            prop_oneof![
                Just("batches".to_string()),
                Just("operations".to_string()),
                Just("interactions".to_string()),
                Just("models".to_string()),
                Just(".".to_string()),
                Just("..".to_string()),
                Just("".to_string()),
                Just(" ".to_string()),
                Just("%2e%2e".to_string()),
                "[A-Za-z0-9._~:@+=-]{1,8}",
            ],
            0..8
        )
        .prop_map(|v| v.join("/")),
        (0usize..2000).prop_map(|n| format!("batches/{}", "a".repeat(n))),
    ]
}

fn implied_strategy() -> impl Strategy<Value = Option<Collection>> {
    prop::option::of(collection_strategy())
}

proptest! {
    #![proptest_config(cfg(1500))]

    /// Arbitrary text never panics; an accepted name yields a bounded, well-formed key that is
    /// a fixed point of normalization.
    #[test]
    fn normalize_never_panics_and_output_is_well_formed(raw in hostile_name(), implied in implied_strategy()) {
        match normalize(&raw, implied) {
            Ok(k) => {
                // A bare id gains its collection prefix; anything else is at most the limit.
                prop_assert!(k.name.len() <= MAX_NAME_BYTES + "interactions/".len());
                prop_assert!(k.key.len() <= k.name.len() || k.name == k.key);
                let (coll, id) = k.key.split_once('/').expect("key is collection/id");
                prop_assert_eq!(coll, k.collection.as_str());
                prop_assert_eq!(Collection::of_key(&k.key), Some(k.collection));
                prop_assert!(!id.is_empty() && !id.contains('/'));
                prop_assert!(id != "." && id != "..");
                prop_assert!(id.chars().all(|c| c.is_ascii_alphanumeric() || "-_.~:@+=".contains(c)), "{:?}", id);
                prop_assert!(k.key.len() <= MAX_NAME_BYTES + "interactions/".len());
                prop_assert_eq!(normalize(&k.name, None).map(|n| n.key), Ok(k.key.clone()));
            }
            Err(e) => {
                let text = e.to_string();
                prop_assert!(!text.is_empty() && text.len() < 120, "{}", text);
                if raw.trim().len() > MAX_NAME_BYTES {
                    prop_assert_eq!(e, KeyError::TooLong);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Signature verification
// ---------------------------------------------------------------------------------------------

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const OTHER_SECRET: &str = "whsec_b3RoZXJzZWNyZXQ=";

fn secrets() -> Vec<Secret> {
    vec![
        Secret::parse(OTHER_SECRET).unwrap(),
        Secret::parse(SECRET).unwrap(),
    ]
}

const SIGNATURE_LABELS: [&str; 9] = [
    "missing_webhook_id",
    "missing_webhook_timestamp",
    "missing_webhook_signature",
    "bad_timestamp",
    "timestamp_too_old",
    "timestamp_too_new",
    "no_v1_signature",
    "signature_invalid",
    "jwt_unsupported",
];

/// Header values, including huge ones (16-64 KB) and ones shaped like real headers.
fn header_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => any::<String>(),
        2 => "[ -~]{0,80}",
        2 => "(v1,[A-Za-z0-9+/=]{0,60}[ ,]{0,2}){0,4}",
        1 => "v1,[A-Za-z0-9+/]{43}=",
        1 => "[A-Za-z0-9_-]{1,20}\\.[A-Za-z0-9_-]{1,20}\\.[A-Za-z0-9_-]{1,20}",
        1 => (16usize..64, "[ -~]{1,8}").prop_map(|(kb, unit)| unit.repeat(kb * 1024 / unit.len() + 1)),
        1 => (16usize..64).prop_map(|kb| format!("v1,{}", "A".repeat(kb * 1024))),
        1 => (16usize..64).prop_map(|kb| "v1, ".repeat(kb * 256)),
    ]
}

fn timestamp_header_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => header_strategy(),
        2 => any::<i64>().prop_map(|n| n.to_string()),
        1 => (1_700_000_000i64..1_800_000_000).prop_map(|n| format!(" {n} ")),
        1 => "[0-9]{19,40}",
        1 => "[+-]?[0-9]{1,12}(\\.[0-9]{0,3})?",
    ]
}

fn body_strategy() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => prop::collection::vec(any::<u8>(), 0..2048),
        1 => any::<String>().prop_map(String::into_bytes),
        1 => (1usize..200_000).prop_map(|n| vec![b'x'; n]),
    ]
}

proptest! {
    #![proptest_config(cfg(300))]

    /// Arbitrary headers and bodies: never a panic, never a match (none of these carries the
    /// right MAC), and the refusal is one of the known labels with a short message.
    #[test]
    fn verify_never_panics_and_never_accepts_junk(
        id in prop::option::of(header_strategy()),
        ts in prop::option::of(timestamp_header_strategy()),
        sig in prop::option::of(header_strategy()),
        body in body_strategy(),
        now in prop_oneof![any::<i64>(), 1_700_000_000i64..1_800_000_000, Just(i64::MIN), Just(i64::MAX)],
        tolerance in prop_oneof![0i64..86_400, any::<i64>()],
        with_secrets in any::<bool>(),
    ) {
        let all = if with_secrets { secrets() } else { Vec::new() };
        let headers = SignedHeaders { id: id.as_deref(), timestamp: ts.as_deref(), signature: sig.as_deref() };
        let result = verify(headers, &body, &all, now, tolerance);
        let e = match result {
            Ok(()) => return Err(TestCaseError::fail(format!("junk accepted: id={:?} ts={:?} sig={:?}", id.map(|s| s.chars().take(50).collect::<String>()), ts, sig.map(|s| s.chars().take(50).collect::<String>())))),
            Err(e) => e,
        };
        prop_assert!(SIGNATURE_LABELS.contains(&e.label()), "{}", e.label());
        prop_assert!(e.to_string().len() < 100, "{}", e);
        // The order of checks: a missing header is reported before anything else.
        if id.is_none() {
            prop_assert_eq!(e, SignatureError::MissingHeader("webhook-id"));
        }
    }

    /// A correctly signed delivery verifies with either configured secret, however much junk
    /// surrounds its entry; any change to the body, id or timestamp, or a signature of any other
    /// length than 32 bytes (prefixes of the right MAC, the right MAC with bytes appended)
    /// is refused.
    #[test]
    fn signed_deliveries_verify_and_every_tampering_is_refused(
        id in "[ -~]{1,64}",
        body in prop::collection::vec(any::<u8>(), 0..512),
        now in 1_700_000_000i64..1_800_000_000,
        skew in -300i64..=300,
        which in 0usize..2,
        junk_before in prop::collection::vec("v1a?,[A-Za-z0-9+/=]{0,50}", 0..3),
        junk_after in prop::collection::vec("v[0-9],[A-Za-z0-9+/=]{0,50}", 0..3),
        flip in any::<prop::sample::Index>(),
        bit in 0u8..8,
        len in (0usize..=64).prop_filter("the right length", |n| *n != 32),
        extra in prop::collection::vec(any::<u8>(), 64),
    ) {
        let all = secrets();
        let ts = now + skew;
        let good = signature::sign(&all[which], &id, ts, &body);
        let ts_text = ts.to_string();
        fn signed<'a>(id: &'a str, ts: &'a str, sig: &'a str) -> SignedHeaders<'a> {
            SignedHeaders { id: Some(id), timestamp: Some(ts), signature: Some(sig) }
        }
        let headers = |sig| signed(&id, &ts_text, sig);
        let header = [junk_before.clone(), vec![good.clone()], junk_after.clone()].concat().join(" ");
        prop_assert_eq!(verify(headers(&header), &body, &all, now, 300), Ok(()));
        // Outside the tolerance by one second either way.
        prop_assert_eq!(verify(headers(&good), &body, &all, ts + 301, 300), Err(SignatureError::TooOld));
        prop_assert_eq!(verify(headers(&good), &body, &all, ts - 301, 300), Err(SignatureError::TooNew));
        // Not with a secret that did not sign it.
        prop_assert!(verify(headers(&good), &body, &all[1 - which..2 - which], now, 300).is_err());
        // Tampered body.
        if !body.is_empty() {
            let mut tampered = body.clone();
            let i = flip.index(tampered.len());
            tampered[i] ^= 1 << bit;
            prop_assert_eq!(verify(headers(&good), &tampered, &all, now, 300), Err(SignatureError::Invalid));
        }
        let mut longer = body.clone();
        longer.push(b' ');
        prop_assert_eq!(verify(headers(&good), &longer, &all, now, 300), Err(SignatureError::Invalid));
        // Tampered id.
        let other_id = format!("{id}x");
        let h = SignedHeaders { id: Some(&other_id), timestamp: Some(&ts_text), signature: Some(&good) };
        prop_assert_eq!(verify(h, &body, &all, now, 300), Err(SignatureError::Invalid));
        // A signature of any other length: a prefix of the right MAC, or the MAC plus bytes.
        let mac = STANDARD.decode(good.strip_prefix("v1,").unwrap()).unwrap();
        let wrong: Vec<u8> = if len < 32 { mac[..len].to_vec() } else { [mac.clone(), extra[..len - 32].to_vec()].concat() };
        let wrong_header = format!("v1,{}", STANDARD.encode(&wrong));
        prop_assert_eq!(verify(headers(&wrong_header), &body, &all, now, 300), Err(SignatureError::Invalid), "{} bytes", len);
        let unpadded = wrong_header.trim_end_matches('=').to_string();
        prop_assert_eq!(verify(headers(&unpadded), &body, &all, now, 300), Err(SignatureError::Invalid), "{} bytes, unpadded", len);
    }
}

// ---------------------------------------------------------------------------------------------
// Envelope parsing
// ---------------------------------------------------------------------------------------------

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        any::<String>().prop_map(Value::String),
        "[a-z._]{0,20}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{0,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn event_type_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "batch.succeeded", "batch.completed", "batch.failed", "batch.cancelled",
            "batch.expired", "interaction.completed", "interaction.failed",
            "interaction.cancelled", "interaction.requires_action", "video.generated",
            "batch.exploded", " batch.failed ", "", "   ",
        ]).prop_map(|s| json!(s)),
        1 => json_value(),
    ]
}

/// Envelope-shaped JSON: real field names, values anything.
fn envelope_value() -> impl Strategy<Value = Value> {
    (
        prop::option::of(event_type_value()),
        prop::option::of(prop_oneof![
            any::<String>().prop_map(Value::String),
            Just(json!("2026-01-22T12:00:00Z")),
            Just(json!("9999-12-31T23:59:59.999999999Z")),
            Just(json!("0000-01-01T00:00:00Z")),
            Just(json!("2026-01-22T12:00:00+23:59")),
            json_value(),
        ]),
        prop::option::of(prop_oneof![
            3 => prop::collection::btree_map(
                prop_oneof![Just("id".to_string()), "[a-z_]{1,8}"],
                json_value(),
                0..6,
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
            1 => json_value(),
        ]),
        prop::option::of(json_value()),
    )
        .prop_map(|(t, ts, data, extra)| {
            let mut top = Map::new();
            if let Some(t) = t {
                top.insert("type".into(), t);
            }
            if let Some(ts) = ts {
                top.insert("timestamp".into(), ts);
            }
            if let Some(d) = data {
                top.insert("data".into(), d);
            }
            if let Some(x) = extra {
                top.insert("version".into(), x);
            }
            Value::Object(top)
        })
}

fn check_envelope(body: &[u8]) -> Result<(), TestCaseError> {
    match envelope::parse(body) {
        Ok(e) => {
            prop_assert!(!e.event_type.is_empty());
            prop_assert_eq!(e.event_type.trim(), e.event_type.as_str());
            prop_assert!(!e.id.trim().is_empty());
            prop_assert!(!e.details.contains_key("id"));
            prop_assert!(e.event_type.len() <= body.len() && e.id.len() <= body.len());
            // The meaning of any type is a value, never a panic.
            let _ = envelope::meaning(&e.event_type);
        }
        Err(e) => {
            prop_assert!(!e.label().is_empty());
            prop_assert!(e.to_string().len() < 100);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(cfg(600))]

    #[test]
    fn envelope_parse_never_panics_on_bytes(body in body_strategy()) {
        check_envelope(&body)?;
    }

    #[test]
    fn envelope_parse_never_panics_on_envelope_shaped_json(v in envelope_value()) {
        let text = v.to_string();
        check_envelope(text.as_bytes())?;
        // Whatever parses keeps data (minus id) as the details, normalized into the one shape.
        if let Ok(e) = envelope::parse(text.as_bytes()) {
            // Compared with the text read back (serde_json's float parsing is not exact).
            let reread: Value = serde_json::from_str(&text).unwrap();
            let mut data = reread["data"].as_object().cloned().unwrap();
            prop_assert_eq!(data.remove("id"), Some(Value::String(e.id.clone())));
            prop_assert_eq!(&e.details, &normalize_details(&data));
            prop_assert_eq!(&normalize_details(&e.details), &e.details);
            for field in ["output_file_uri", "output_file_uris", "error_code", "error_message", "provider"] {
                prop_assert!(e.details.contains_key(field), "{} missing", field);
            }
        }
    }

    /// Deep nesting (up to 20,000 levels, as a signed body could carry) is refused as not
    /// JSON without exhausting the stack; huge numbers never panic.
    #[test]
    fn envelope_parse_survives_deep_nesting_and_huge_numbers(
        depth in 0usize..20_000,
        open in prop_oneof![Just(("[", "]")), Just(("{\"a\":", "}"))],
        digits in 1usize..2_000,
        exp in prop_oneof![Just(String::new()), "[eE][+-]?[0-9]{1,6}"],
    ) {
        let nested = format!("{}1{}", open.0.repeat(depth), open.1.repeat(depth));
        let body = format!(r#"{{"type":"batch.succeeded","data":{{"id":"batches/deep","x":{nested}}}}}"#);
        check_envelope(body.as_bytes())?;
        if depth > 200 {
            prop_assert_eq!(envelope::parse(body.as_bytes()).unwrap_err(), EnvelopeError::NotJson);
        }
        let number = format!("{}{}", "9".repeat(digits), exp);
        let body = format!(r#"{{"type":"batch.failed","timestamp":{number},"data":{{"id":"b","error_code":{number}}}}}"#);
        check_envelope(body.as_bytes())?;
    }
}

// ---------------------------------------------------------------------------------------------
// Status-API interpretation
// ---------------------------------------------------------------------------------------------

/// Status-API-shaped answers: real field names and state spellings, values anything.
fn status_body() -> impl Strategy<Value = String> {
    let state = prop_oneof![
        prop::sample::select(vec![
            "BATCH_STATE_PENDING",
            "BATCH_STATE_RUNNING",
            "BATCH_STATE_SUCCEEDED",
            "BATCH_STATE_FAILED",
            "BATCH_STATE_CANCELLED",
            "BATCH_STATE_EXPIRED",
            "JOB_STATE_FAILED",
            "BATCH_STATE_UNSPECIFIED",
            "queued",
            "in_progress",
            "requires_action",
            "completed",
            "failed",
            "incomplete",
            "budget_exceeded",
            "cancelled",
            "",
            "BATCH_STATE_",
        ])
        .prop_map(|s| json!(s)),
        json_value(),
    ];
    let time = prop_oneof![
        Just(json!("2026-01-22T12:00:00Z")),
        any::<String>().prop_map(Value::String),
        json_value(),
    ];
    let structured = (
        prop::option::of(state.clone()),
        prop::option::of(time.clone()),
        prop::option::of(any::<bool>().prop_map(Value::Bool)),
        prop::option::of(prop_oneof![
            (
                prop::option::of(json_value()),
                prop::option::of(json_value())
            )
                .prop_map(|(c, m)| {
                    let mut e = Map::new();
                    if let Some(c) = c {
                        e.insert("code".into(), c);
                    }
                    if let Some(m) = m {
                        e.insert("message".into(), m);
                    }
                    Value::Object(e)
                }),
            (0i64..20).prop_map(|c| json!({"code": c, "message": "m"})),
            json_value(),
        ]),
        prop::option::of(json_value()),
        prop::option::of(state),
        prop::option::of(time),
    )
        .prop_map(|(st, ut, done, error, response, istatus, updated)| {
            let mut metadata = Map::new();
            if let Some(s) = st {
                metadata.insert("state".into(), s);
            }
            if let Some(t) = ut {
                metadata.insert("updateTime".into(), t);
            }
            let mut top = Map::new();
            top.insert("metadata".into(), Value::Object(metadata));
            if let Some(d) = done {
                top.insert("done".into(), d);
            }
            if let Some(e) = error {
                top.insert("error".into(), e);
            }
            if let Some(r) = response {
                top.insert("response".into(), r);
            }
            if let Some(s) = istatus {
                top.insert("status".into(), s);
            }
            if let Some(u) = updated {
                top.insert("updated".into(), u);
            }
            Value::Object(top).to_string()
        });
    prop_oneof![
        3 => structured,
        1 => any::<String>(),
        1 => json_value().prop_map(|v| v.to_string()),
        1 => (0usize..5_000).prop_map(|d| format!("{}{}", "[".repeat(d), "]".repeat(d))),
    ]
}

fn http_status_strategy() -> impl Strategy<Value = u16> {
    prop_oneof![
        4 => Just(200u16),
        1 => 200u16..300,
        1 => prop::sample::select(vec![404u16, 408, 409, 429, 500, 502, 503, 504, 599, 400, 401, 403, 301, 100]),
        1 => any::<u16>(),
    ]
}

fn retry_after_strategy() -> impl Strategy<Value = Option<String>> {
    prop::option::of(prop_oneof![
        any::<String>(),
        any::<i64>().prop_map(|n| n.to_string()),
        (0i64..200_000).prop_map(|n| format!(" {n} ")),
        "[0-9]{19,30}",
        Just("Wed, 21 Oct 2026 07:28:00 GMT".to_string()),
    ])
}

proptest! {
    #![proptest_config(cfg(800))]

    /// Every collection, any HTTP status, any body and Retry-After: never a panic; 404, 429/5xx
    /// and other refusals are the right values with a bounded back-off; a 2xx is an
    /// observation or a short Malformed message.
    #[test]
    fn status_interpret_never_panics_and_is_bounded(
        c in collection_strategy(),
        http in http_status_strategy(),
        retry_after in retry_after_strategy(),
        body in status_body(),
    ) {
        let result = status::interpret(c, http, retry_after.as_deref(), &body);
        match http {
            200..=299 => match &result {
                Ok(o) => {
                    prop_assert!((-1..=2).contains(&o.status.rank()));
                    if let Status::Unknown(s) = &o.status {
                        prop_assert!(s.len() <= body.len());
                    }
                    // Exactly the normalized outcome fields, whatever the answer held.
                    prop_assert_eq!(o.details.len(), 5);
                    prop_assert_eq!(&normalize_details(&o.details), &o.details);
                }
                Err(StatusError::Malformed(why)) => prop_assert!(why.len() < 200, "{}", why),
                Err(other) => return Err(TestCaseError::fail(format!("2xx gave {other:?}"))),
            },
            404 => prop_assert_eq!(result, Err(StatusError::NotFound)),
            // As `retry::class_of_status` classes them: worth asking again.
            408 | 409 | 429 | 500..=599 => {
                let Err(StatusError::Transient { retry_after_secs }) = result else {
                    return Err(TestCaseError::fail(format!("{http} gave {result:?}")));
                };
                prop_assert!((0..=86_400).contains(&retry_after_secs));
                let asked = retry_after.as_deref().and_then(|v| v.trim().parse::<i64>().ok()).filter(|n| *n >= 0);
                let want = asked.map(|n| n.min(86_400)).unwrap_or(DEFAULT_RETRY_AFTER_SECS);
                prop_assert_eq!(retry_after_secs, want);
            }
            other => prop_assert_eq!(result, Err(StatusError::Refused(other))),
        }
    }

    /// A batch answer whose error code is 1 is CANCELLED whatever its state says (unless the
    /// answer is unusable); an unknown state is never a known status.
    #[test]
    fn status_batch_error_code_one_is_cancelled(state in "[A-Z_]{0,30}", done in any::<bool>()) {
        let body = json!({"done": done, "metadata": {"state": state}, "error": {"code": 1}}).to_string();
        let o = status::interpret(Collection::Batches, 200, None, &body).unwrap();
        prop_assert_eq!(o.status, Status::Cancelled);
    }
}

// ---------------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------------

/// A token that may turn up in more than one scope's list.
const SHARED_TOKEN: &str = "shared-token-0123456789";

/// The tokens a token-list variable holds as the worker splits them.
fn tokens_in(value: Option<&str>) -> Vec<&str> {
    value
        .map(|v| v.split_whitespace().collect())
        .unwrap_or_default()
}

fn is_secret(name: &str) -> bool {
    variable(name).is_some_and(|v| v.secret)
}

fn is_required(v: &Variable) -> bool {
    v.default == Fallback::Required
}

/// A value for one variable, from its row: absent, blank, plausible for its kind, numeric, or
/// anything at all.
fn var_value(v: &'static Variable) -> BoxedStrategy<Option<String>> {
    let plausible: BoxedStrategy<String> = match v.kind {
        Kind::SigningSecrets => prop::collection::vec(
            prop_oneof![
                3 => "whsec_[A-Za-z0-9+/]{8,40}={0,2}",
                1 => "whsec_[ -~]{0,20}",
                1 => "[A-Za-z0-9]{1,20}",
            ],
            1..4,
        )
        .prop_flat_map(|v| {
            prop::sample::select(vec![" ", ",", ", ", "\n", ",,"]).prop_map(move |sep| v.join(sep))
        })
        .boxed(),
        Kind::SigningSecret => "whsec_[A-Za-z0-9+/]{0,40}={0,2}".boxed(),
        // A token shared between lists now and then: a token in two scopes is refused.
        Kind::Tokens => prop::collection::vec(
            prop_oneof![
                4 => "[A-Za-z0-9_.-]{1,30}",
                1 => Just(SHARED_TOKEN.to_string()),
                1 => "[ -~]{1,12}",
            ],
            1..4,
        )
        .prop_flat_map(|v| {
            prop::sample::select(vec![" ", "\n", "  ", "\t"]).prop_map(move |sep| v.join(sep))
        })
        .boxed(),
        Kind::Url | Kind::PublicUrl => "(https?://|ftp://|)[a-z0-9.:/-]{0,40}".boxed(),
        Kind::Flag => prop::sample::select(vec!["true", "false", " true ", "TRUE", "yes", "1", ""])
            .prop_map(String::from)
            .boxed(),
        Kind::FreeText => "[A-Za-z0-9-]{1,60}".boxed(),
        Kind::Choice(words) => prop_oneof![
            prop::sample::select(words.to_vec()).prop_map(|w| format!(" {} ", w.to_uppercase())),
            "[a-z]{0,10}",
        ]
        .boxed(),
        Kind::Routes => prop_oneof![
            3 => prop::collection::btree_map(
                "[a-z-]{0,8}",
                "(https?://|gopher://|queue:|service:|)[A-Za-z0-9_.:/-]{0,20}",
                0..4,
            )
            .prop_map(|m| json!(m).to_string()),
            1 => json_value().prop_map(|v| v.to_string()),
        ]
        .boxed(),
        Kind::Whole { .. } => prop_oneof![0i64..100_000, -10i64..10, any::<i64>(),]
            .prop_map(|n| n.to_string())
            .boxed(),
    };
    prop_oneof![
        2 => Just(None),
        1 => "[ \t\n]{0,3}".prop_map(Some),
        4 => plausible.clone().prop_map(Some),
        1 => plausible.prop_map(|v| Some(format!(" {v}\t"))),
        1 => any::<String>().prop_map(Some),
        1 => "[0-9]{19,30}".prop_map(Some),
        1 => (1usize..5_000).prop_map(|n| Some("9".repeat(n))),
    ]
    .boxed()
}

/// The default of a whole-number variable, from its row.
fn default_number(name: &str) -> i64 {
    match variable(name).map(|v| v.default) {
        Some(Fallback::Number(n)) => n,
        other => panic!("{name} has no numeric default: {other:?}"),
    }
}

/// Whether `value` is acceptable for the variable `v`, judged from its row alone (absent and
/// blank mean the default; required variables must be present).
fn documented_ok(v: &Variable, value: Option<&str>) -> bool {
    let value = value.map(str::trim).filter(|v| !v.is_empty());
    let is_url = |v: &str| v.starts_with("http://") || v.starts_with("https://");
    let Some(value) = value else {
        return !is_required(v);
    };
    match v.kind {
        Kind::SigningSecrets => value
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
            .all(|s| Secret::parse(s).is_ok()),
        Kind::SigningSecret => Secret::parse(value).is_ok(),
        Kind::Tokens => value
            .split_whitespace()
            .all(|t| t.chars().all(|c| c.is_ascii_graphic())),
        Kind::Url | Kind::PublicUrl => is_url(value),
        Kind::Flag => value == "true" || value == "false",
        Kind::FreeText => true,
        Kind::Choice(words) => words.contains(&value.trim().to_ascii_lowercase().as_str()),
        Kind::Whole { min, max } => value.parse::<i64>().is_ok_and(|x| (min..=max).contains(&x)),
        // A JSON object whose every value is a URL, queue:BINDING or service:BINDING.
        Kind::Routes => serde_json::from_str::<Map<String, Value>>(value).is_ok_and(|m| {
            m.values().all(|target| {
                target.as_str().map(str::trim).is_some_and(|t| {
                    match t
                        .strip_prefix("queue:")
                        .or_else(|| t.strip_prefix("service:"))
                    {
                        Some(binding) => {
                            binding.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                                && binding
                                    .chars()
                                    .all(|c| c.is_ascii_alphanumeric() || c == '_')
                        }
                        None => is_url(t),
                    }
                })
            })
        }),
    }
}

/// A value the parser should accept for `v` (or its absence, where a default applies), with
/// near misses: for whole numbers, the values just past each end of its range; for routes, a
/// few targets that are neither a URL nor a binding.
fn valid_value(v: &'static Variable) -> BoxedStrategy<Option<String>> {
    let secret = || {
        prop::collection::vec(any::<u8>(), 1..40)
            .prop_map(|b| format!("whsec_{}", STANDARD.encode(b)))
    };
    let url = "https?://[a-z0-9.-]{1,20}(:[0-9]{1,5})?(/[a-z0-9]{0,10}){0,3}";
    let value: BoxedStrategy<String> = match v.kind {
        Kind::SigningSecrets => prop::collection::vec(secret(), 1..4)
            .prop_map(|v| v.join(", "))
            .boxed(),
        Kind::SigningSecret => secret().boxed(),
        Kind::Tokens => prop::collection::vec("[A-Za-z0-9_-]{16,40}", 1..4)
            .prop_map(|v| v.join(" "))
            .boxed(),
        Kind::Url | Kind::PublicUrl => url.boxed(),
        Kind::FreeText => "[A-Za-z0-9-]{12,60}".boxed(),
        Kind::Choice(words) => prop::sample::select(words.to_vec())
            .prop_map(String::from)
            .boxed(),
        Kind::Flag => prop::sample::select(vec!["true", "false"])
            .prop_map(String::from)
            .boxed(),
        Kind::Routes => prop::collection::btree_map(
            "[a-z]{1,8}",
            prop_oneof![
                4 => url.boxed(),
                4 => "(queue|service):[A-Z_][A-Z0-9_]{0,10}".boxed(),
                // Near misses: a binding that is no name, a scheme that is no URL's.
                1 => "(queue|service|Queue): ?[A-Za-z0-9_.:-]{0,12}".boxed(),
                1 => "(gopher://|ftp://|)[a-z.]{1,10}".boxed(),
            ],
            0..4,
        )
        .prop_map(|m| json!(m).to_string())
        .boxed(),
        Kind::Whole { min, max } => prop_oneof![
            // Inside the range, and exactly on and just past each end.
            4 => min..=max.min(min + 3_600),
            1 => prop::sample::select(vec![min - 1, min, max, max + 1]),
        ]
        .prop_map(|n| n.to_string())
        .boxed(),
    };
    if is_required(v) {
        value.prop_map(Some).boxed()
    } else {
        prop::option::of(value).boxed()
    }
}

/// A value no parser should choke on, for any variable.
fn hostile_value() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        Just(None),
        "[ \t\n]{0,3}".prop_map(Some),
        any::<String>().prop_map(Some),
        "[ -~]{13,40}".prop_map(Some),
        "-?[0-9]{19,30}".prop_map(Some),
        "-[0-9]{1,10}".prop_map(Some),
        (1usize..5_000).prop_map(|n| Some("9".repeat(n))),
        json_value().prop_map(|v| Some(v.to_string())),
    ]
}

/// Values for every variable of the table. Half the environments are arbitrary throughout;
/// the other half are valid but for a few hostile values, so that the parser gets past the
/// required variables and every later check is reached. A variable added to the table is
/// fuzzed from its row; one the parser reads without a row fails the property below.
fn env_strategy() -> impl Strategy<Value = HashMap<&'static str, Option<String>>> {
    let arbitrary: Vec<BoxedStrategy<(&'static str, Option<String>)>> = VARIABLES
        .iter()
        .map(|v| var_value(v).prop_map(move |value| (v.name, value)).boxed())
        .collect();
    let valid: Vec<BoxedStrategy<(&'static str, Option<String>)>> = VARIABLES
        .iter()
        .map(|v| {
            valid_value(v)
                .prop_map(move |value| (v.name, value))
                .boxed()
        })
        .collect();
    let perturbed = (
        valid,
        prop::collection::vec((0..VARIABLES.len(), hostile_value()), 0..3),
        prop::option::of(-2i64..=2),
    )
        .prop_map(|(pairs, changes, cap_minus_base)| {
            let mut env: HashMap<&'static str, Option<String>> = pairs.into_iter().collect();
            // The retry cap on either side of its base.
            if let Some(d) = cap_minus_base {
                let base = env["EFFECT_RETRY_BASE_SECONDS"]
                    .as_deref()
                    .and_then(|v| v.parse::<i64>().ok())
                    .unwrap_or(default_number("EFFECT_RETRY_BASE_SECONDS"));
                env.insert("EFFECT_RETRY_MAX_SECONDS", Some((base + d).to_string()));
            }
            for (i, v) in changes {
                env.insert(VARIABLES[i].name, v);
            }
            env
        });
    prop_oneof![
        arbitrary.prop_map(|pairs| pairs.into_iter().collect::<HashMap<_, _>>()),
        perturbed,
    ]
}

proptest! {
    #![proptest_config(cfg(500))]

    /// Arbitrary values for every variable: never a panic; the parser reads exactly the
    /// table's variables; an error names a variable that was read and never echoes a value
    /// (secret or not); an accepted configuration respects every row and neither its Debug dump
    /// nor `/v1/config` shows a secret; parsing is deterministic.
    #[test]
    fn config_never_panics_and_never_leaks(env in env_strategy()) {
        let asked: RefCell<BTreeSet<String>> = RefCell::new(BTreeSet::new());
        let value_of = |name: &str| env.get(name).cloned().flatten();
        let lookup = |name: &str| {
            asked.borrow_mut().insert(name.to_string());
            value_of(name)
        };
        let result = Config::from_lookup(lookup);
        let asked = asked.into_inner();
        for name in &asked {
            prop_assert!(variable(name).is_some(), "{} is read but has no row in VARIABLES", name);
        }
        if result.is_ok() {
            for v in VARIABLES {
                prop_assert!(asked.contains(v.name), "{} has a row but is never read", v.name);
            }
        }
        // Secret values that are long enough to be recognisable and not also some other
        // variable's (non-secret) value.
        let secret_values: Vec<String> = VARIABLES
            .iter()
            .filter(|v| v.secret)
            .filter_map(|v| env[v.name].clone())
            .flat_map(|v| {
                let mut parts: Vec<String> = v.split(|c: char| c == ',' || c.is_whitespace()).map(str::to_string).collect();
                parts.push(v.trim().to_string());
                parts
            })
            .map(|v| v.strip_prefix("whsec_").map(str::to_string).unwrap_or(v))
            .filter(|v| v.len() >= 12)
            .filter(|v| {
                !env
                    .iter()
                    .filter(|(n, _)| !is_secret(n))
                    .any(|(_, o)| o.as_deref().is_some_and(|o| o.contains(v.as_str())))
            })
            .collect();
        // Against the table: a variable named in an error holds a value its row refuses (or is
        // the retry cap below its base, or a claim that cannot outlast an attempt); an accepted
        // configuration had only values the rows accept.
        let number = |name: &str| {
            value_of(name)
                .and_then(|v| v.trim().parse::<i64>().ok())
                .unwrap_or_else(|| default_number(name))
        };
        let (base_secs, max_secs) = (
            number("EFFECT_RETRY_BASE_SECONDS"),
            number("EFFECT_RETRY_MAX_SECONDS"),
        );
        let (timeout_ms, claim_secs) = (
            number("EFFECT_TIMEOUT_MS"),
            number("CLAIM_TTL_SECONDS"),
        );
        match &result {
            Err(e) => {
                let row = variable(e.var);
                prop_assert!(row.is_some(), "{} named but has no row", e.var);
                let cap_below_base = e.var == "EFFECT_RETRY_MAX_SECONDS" && max_secs < base_secs;
                let claim_too_short =
                    e.var == "CLAIM_TTL_SECONDS" && claim_secs.saturating_mul(1_000) <= timeout_ms;
                // A token in two scopes names the later of the two lists in the table.
                let earlier: &[&str] = match e.var {
                    "REGISTER_TOKENS" => &["ADMIN_TOKEN"],
                    "READ_TOKENS" => &["ADMIN_TOKEN", "REGISTER_TOKENS"],
                    _ => &[],
                };
                let mine = value_of(e.var);
                let token_in_two_scopes = earlier.iter().any(|other| {
                    let theirs = value_of(other);
                    tokens_in(theirs.as_deref()).iter().any(|t| tokens_in(mine.as_deref()).contains(t))
                });
                // PagerDuty's format without its routing key names the key.
                let pagerduty = value_of("ALERT_FORMAT").is_some_and(|f| f.trim().eq_ignore_ascii_case("pagerduty"));
                let no_routing_key = e.var == "ALERT_ROUTING_KEY" && pagerduty && value_of("ALERT_ROUTING_KEY").is_none_or(|k| k.trim().is_empty());
                prop_assert!(
                    row.is_some_and(|v| !documented_ok(v, value_of(e.var).as_deref())) || cap_below_base || claim_too_short || token_in_two_scopes || no_routing_key,
                    "{} refused though its row accepts {:?}: {}",
                    e.var,
                    value_of(e.var),
                    e
                );
            }
            Ok(_) => {
                for v in VARIABLES {
                    prop_assert!(
                        documented_ok(v, value_of(v.name).as_deref()),
                        "{} accepted though its row refuses {:?}",
                        v.name,
                        value_of(v.name)
                    );
                }
                prop_assert!(max_secs >= base_secs);
                prop_assert!(claim_secs * 1_000 > timeout_ms, "a claim must outlast an attempt");
            }
        }
        match &result {
            Err(e) => {
                prop_assert!(asked.contains(e.var), "{} named but never read", e.var);
                let text = e.to_string();
                prop_assert!(text.starts_with(e.var));
                prop_assert!(text.len() < 200, "{}", text);
                for v in &secret_values {
                    prop_assert!(!text.contains(v.as_str()), "error {:?} leaks a secret", text);
                }
                // Only values over a few characters could be echoed by accident; none is.
                for n in &asked {
                    if let Some(v) = value_of(n).as_deref().map(str::trim).filter(|v| v.len() > 12) {
                        prop_assert!(!text.contains(v), "error {:?} echoes {}'s value", text, n);
                    }
                }
            }
            Ok(c) => {
                prop_assert!(!c.webhook_secrets.is_empty());
                prop_assert!((0..=86_400).contains(&c.tolerance_secs));
                prop_assert!((1..=600_000).contains(&c.effect_timeout_ms));
                prop_assert!((1..=86_400).contains(&c.claim_ttl_secs));
                prop_assert!((1..=3_650).contains(&c.retention_days));
                prop_assert!((1_024..=100 * 1024 * 1024).contains(&c.max_body_bytes));
                prop_assert!(1 <= c.retry_base_secs && c.retry_base_secs <= c.retry_max_secs && c.retry_max_secs <= 86_400);
                prop_assert!((5..=10_000).contains(&c.reconcile_budget));
                prop_assert!((5..=600).contains(&c.reconcile_lease_secs));
                prop_assert!((1..=600).contains(&c.reconcile_deadline_secs));
                prop_assert!((0..=2_592_000).contains(&c.reconcile_grace_secs));
                prop_assert!((0..=31_536_000).contains(&c.stuck_after_secs));
                prop_assert!((0..=31_536_000).contains(&c.effect_alert_after_secs));
                for url in [Some(&c.effect_url), Some(&c.gemini_api_base), c.alert_url.as_ref()].into_iter().flatten() {
                    prop_assert!(url.starts_with("http://") || url.starts_with("https://"), "{}", url);
                    prop_assert!(!url.ends_with('/'));
                }
                // Every token ADMIN_TOKEN lists (at least one) is an admin's.
                let admins = tokens_in(value_of("ADMIN_TOKEN").as_deref()).len();
                prop_assert!(admins >= 1);
                for t in tokens_in(value_of("ADMIN_TOKEN").as_deref()) {
                    let caller = c.tokens.identify(Some(&format!("Bearer {t}")));
                    prop_assert_eq!(caller.map(|c| c.scope), Some(Scope::Admin));
                }
                // A token has one scope: an accepted configuration holds none in two lists.
                let lists = ["ADMIN_TOKEN", "REGISTER_TOKENS", "READ_TOKENS"].map(value_of);
                for (i, a) in lists.iter().enumerate() {
                    for b in &lists[i + 1..] {
                        let (a, b) = (tokens_in(a.as_deref()), tokens_in(b.as_deref()));
                        prop_assert!(!a.iter().any(|t| b.contains(t)), "a token in two scopes was accepted");
                    }
                }
                let dump = format!("{c:?}");
                for v in &secret_values {
                    prop_assert!(!dump.contains(v.as_str()), "Debug leaks a secret");
                }
                // /v1/config: every row once, in order; a secret only as set or not set; a
                // whole number inside its row's range; no secret's value anywhere.
                let view = c.public_view();
                let shown = view["settings"].as_array().unwrap();
                prop_assert_eq!(shown.len(), VARIABLES.len());
                for (s, v) in shown.iter().zip(VARIABLES) {
                    prop_assert_eq!(&s["name"], v.name);
                    if v.secret {
                        let text = s["value"].as_str().unwrap_or_default();
                        prop_assert!(text == "not set" || text == "set" || text.starts_with("set ("), "{}: {}", v.name, text);
                    }
                    if let (Kind::Whole { min, max }, Some(n)) = (v.kind, s["value"].as_i64()) {
                        prop_assert!((min..=max).contains(&n), "{} shows {}", v.name, n);
                    }
                }
                let text = view.to_string();
                for v in &secret_values {
                    prop_assert!(!text.contains(v.as_str()), "/v1/config leaks a secret");
                }
            }
        }
        let again = Config::from_lookup(value_of);
        prop_assert_eq!(result.err(), again.err());
    }
}
