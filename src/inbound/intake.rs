//! The intake of one delivery to `POST /webhooks/gemini`, as a plan the edge carries out.
//!
//! Guarantees (docs/DESIGN.md, invariants 4, 5 and 7): the order of the work is decided here, as
//! pure functions host-tested step by step, not in the edge's awaits. Each step answers with the
//! next [`Need`]: the headers first ([`screen`]: nothing is read before they pass); a token's RS256
//! signature (the key set) before its claims ([`vouch`]); the body, read under its cap; what the
//! body is ([`classify`]), its `v1,` entries first (our HMAC: a v1 delivery never waits on a key
//! set) and, only when none matches, its `v1a,` entries against Google's Ed25519 keys; then at most
//! one gate call, none for a duplicate this isolate remembers ([`TerminalMemory`]: one that repeats
//! the very terminal status a gate answered this isolate with for a `Deliver` of the same key;
//! terminal absorbs, so it cannot change anything); a nudge the gate does not hold costs one tally
//! call and nothing outside the worker; a proven body that cannot be used is kept as a dead letter,
//! else answered 503 so Gemini retries. Every delivery ends in one [`DeliveryEnd`]: its [`Reply`]
//! (a 200 with its body, or a [`crate::refusal::Refusal`]), the counters it adds, its log line, and
//! what this isolate may remember. The edge (`src/edge/http/webhook/`) only performs the steps.
//! Time is a parameter.

use std::collections::HashMap;

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use crate::inbound::answer::Answer;
use crate::inbound::classify::{
    DeliveryKind, Oversize, Policy, Proof, Rejection, Reply, Screened, Unusable,
};
use crate::inbound::envelope::{meaning, parse, Envelope, Meaning};
use crate::inbound::jwt::{self, Token};
use crate::inbound::route_log::{Handled, RouteLog};
use crate::operation::details::{SIGNED_USER_METADATA, UNVERIFIED_USER_METADATA, USER_METADATA};
use crate::operation::gate::protocol::{GateCommand, GateReply};
use crate::operation::key::{normalize, Collection, OperationKey};
use crate::operation::ledger::dead_key;
use crate::operation::lifecycle::{DropReason, Source, Status};
use crate::operation::observation::{Observation, StatusError};
use crate::operation::OpEvent;
use crate::refusal::Refusal;
use crate::signature::{
    check_headers, check_timestamp, looks_like_jwt, SignatureError, SignedHeaders, V1aMessage, V1,
    V1A,
};
use crate::telemetry::counters;
use crate::timestamp::format_rfc3339;

/// How long Gemini is asked to wait before retrying a `v1a`-signed delivery whose operation
/// the status API could not be asked about (no key, no slot in the budget, a 5xx): a minute,
/// as a status question is asked at most once a `CONFIRM_INTERVAL_SECONDS` by default.
pub const STATUS_RETRY_AFTER_SECS: u32 = 60;

/// The headers a delivery is classified by, as received.
#[derive(Debug, Clone, Copy, Default)]
pub struct Headers<'a> {
    pub content_length: Option<&'a str>,
    pub id: Option<&'a str>,
    pub timestamp: Option<&'a str>,
    pub signature: Option<&'a str>,
}

impl Headers<'_> {
    /// The body's length as `content-length` declares it (`None`: absent or not a number).
    pub fn declared_length(&self) -> Option<usize> {
        self.content_length.and_then(|v| v.trim().parse().ok())
    }
}

/// What the gate commands of a delivery carry from the configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// `REQUIRE_REGISTRATION`.
    pub require_registration: bool,
    /// `UNREGISTERED_HOLD_SECONDS` in ms when routes are configured, else 0.
    pub hold_ms: i64,
    /// `CONFIRM_INTERVAL_SECONDS` in ms, carried by a nudge to its gate.
    pub confirm_interval_ms: i64,
    /// `GEMINI_API_KEY` is set: the status API can be asked.
    pub status_api: bool,
}

/// What the intake needs next. Each is answered through the [`Intake`] method it names.
#[derive(Debug, Clone, PartialEq)]
pub enum Need {
    /// Check the token's RS256 signature with the key set: [`Intake::signature_checked`].
    Signature(Token),
    /// Read the body, refused past `cap` while it streams (`declared`: a `content-length`
    /// within the cap): [`Intake::body_read`], with this isolate's [`TerminalMemory`].
    Body { cap: usize, declared: Option<usize> },
    /// Check the body's `v1a,` entries against the key set's Ed25519 keys: [`Intake::v1a_checked`].
    V1a(V1aMessage),
    /// Hand `command` to the gate of `key`: [`Intake::gate_answered`].
    Gate { key: String, command: GateCommand },
    /// Ask Gemini's status API, with our key and in a slot of the status budget, about an
    /// operation that only a `v1a`-signed body names and no gate holds:
    /// [`Intake::status_answered`]. The edge skips the call (answering `None`) for a name this
    /// isolate was told is not ours within [`crate::inbound::stranger::NotOurs`]'s interval.
    AskStatus {
        key: String,
        name: String,
        collection: Collection,
    },
    /// Count one nudge for an operation not held on the worker-wide tally: [`Intake::tallied`].
    Tally,
    /// Keep `value` in KV under `key` (a dead letter): [`Intake::dead_letter_kept`].
    DeadLetter { key: String, value: Value },
    /// The delivery is answered.
    Done(DeliveryEnd),
}

/// A delivery's end.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryEnd {
    pub reply: Reply,
    /// Counters to add one to in this isolate.
    pub counts: Vec<&'static str>,
    /// A refusal's reason: counted as `rejected_<reason>`, and its [`DeliveryEnd::line`] logged
    /// only for the first of its reason in a flush window (a flood costs a counter each).
    pub rejected: Option<&'static str>,
    /// The line to log.
    pub line: Option<RouteLog>,
    /// A terminal state a gate answered for this key, which this isolate may remember.
    pub remember: Option<(String, Status)>,
}

impl DeliveryEnd {
    fn reply(reply: Reply) -> DeliveryEnd {
        DeliveryEnd {
            reply,
            counts: Vec::new(),
            rejected: None,
            line: None,
            remember: None,
        }
    }

    fn refused(refusal: Rejection) -> DeliveryEnd {
        DeliveryEnd {
            rejected: Some(refusal.reason()),
            line: Some(refusal.log_line()),
            ..DeliveryEnd::reply(refusal.reply())
        }
    }

    fn answered(answer: Answer, line: Option<RouteLog>) -> DeliveryEnd {
        DeliveryEnd {
            line,
            ..DeliveryEnd::reply(Ok(answer))
        }
    }
}

/// Where the intake stands between two steps.
enum Stage<'a> {
    /// A token whose signature is being checked.
    Signature { token: Token, token_hash: String },
    /// Proven headers (or token): the body is being read.
    Body(Proof<'a>),
    /// The body's `v1a,` entries are being checked.
    V1a,
    /// The gate of `key` is answering a delivery (`nudge`: a nudge's; `unheld`: what a
    /// `v1a`-signed nudge's operation becomes should the gate not hold it).
    Gate {
        key: String,
        nudge: bool,
        event_type: String,
        unheld: Option<Unheld>,
    },
    /// The status API is being asked about a `v1a`-signed nudge's operation.
    Status { unheld: Unheld, event_type: String },
    /// A nudge the gate does not hold, being tallied.
    Tally { key: String, event_type: String },
    /// A dead letter being kept under `key`; then `reply`.
    DeadLetter {
        key: String,
        reason: &'static str,
        reply: Reply,
    },
    /// Answered (a step asked after the end changes nothing).
    Over,
}

/// A `v1a`-signed nudge's operation and its signed `user_metadata`: should no gate hold it,
/// the status API decides whether it is ours (Google signed the body, for whichever project).
#[derive(Debug, Clone, PartialEq)]
struct Unheld {
    key: OperationKey,
    metadata: Map<String, Value>,
}

/// One delivery's intake.
pub struct Intake<'a> {
    headers: Headers<'a>,
    policy: Policy<'a>,
    settings: Settings,
    /// When the delivery arrived (Unix ms).
    started_ms: i64,
    stage: Stage<'a>,
    body: Vec<u8>,
}

impl<'a> Intake<'a> {
    /// Starts the intake of a delivery with these headers, received at `now_ms`: the
    /// headers alone are judged first.
    pub fn start(
        headers: Headers<'a>,
        policy: Policy<'a>,
        settings: Settings,
        now_ms: i64,
    ) -> (Intake<'a>, Need) {
        let mut intake = Intake {
            headers,
            policy,
            settings,
            started_ms: now_ms,
            stage: Stage::Over,
            body: Vec::new(),
        };
        let need = match screen(&headers, now_ms, &policy) {
            Err(refusal) => intake.finish(DeliveryEnd::refused(refusal)),
            Ok(Screened::Hmac(checked)) => intake.read_body(Proof::Hmac(checked)),
            Ok(Screened::Jwt { token, token_hash }) => {
                let need = Need::Signature(token.clone());
                intake.stage = Stage::Signature { token, token_hash };
                need
            }
        };
        (intake, need)
    }

    /// The token's signature was checked (at `now_ms`): its claims decide next.
    pub fn signature_checked(&mut self, checked: Result<(), Rejection>, now_ms: i64) -> Need {
        let Stage::Signature { token, token_hash } = self.take() else {
            return self.out_of_order();
        };
        match checked.and_then(|()| vouch(token, token_hash, now_ms, &self.policy)) {
            Ok(proof) => self.read_body(proof),
            Err(refusal) => self.finish(DeliveryEnd::refused(refusal)),
        }
    }

    /// The body as read (`None` when it passed the cap while streaming), and what this
    /// isolate remembers of settled operations.
    pub fn body_read(&mut self, body: Option<Vec<u8>>, memory: &TerminalMemory) -> Need {
        let Stage::Body(proof) = self.take() else {
            return self.out_of_order();
        };
        let Some(body) = body else {
            let cap = self.policy.max_body_bytes;
            return self.finish(DeliveryEnd::refused(Rejection::BodyTooLarge(
                Oversize::Streamed { cap },
            )));
        };
        self.body = body;
        let delivery_id = self.delivery_id();
        match classify(proof, &self.body, &delivery_id, &self.policy) {
            DeliveryKind::Rejected(refusal) => self.finish(DeliveryEnd::refused(refusal)),
            DeliveryKind::CheckV1a(message) => {
                self.stage = Stage::V1a;
                Need::V1a(message)
            }
            DeliveryKind::Ping { event_type } => self.finish(DeliveryEnd {
                counts: vec![counters::PINGS],
                line: Some(RouteLog::Ping {
                    event_type: event_type.clone(),
                    webhook_id: delivery_id,
                }),
                ..DeliveryEnd::reply(Ok(Answer::Pong { event_type }))
            }),
            DeliveryKind::DeadLetter { reason, reply } => {
                let key = dead_key(&delivery_id);
                let value = json!({
                    "webhook_id": delivery_id,
                    "webhook_timestamp": self.headers.timestamp,
                    "received_at": format_rfc3339(self.started_ms),
                    "reason": reason,
                    "body": String::from_utf8_lossy(&self.body),
                    "body_is_utf8": std::str::from_utf8(&self.body).is_ok(),
                });
                self.stage = Stage::DeadLetter {
                    key: key.clone(),
                    reason,
                    reply,
                };
                Need::DeadLetter { key, value }
            }
            // A duplicate of the terminal status this isolate knows its key settled at is
            // answered without the gate.
            DeliveryKind::Event {
                key,
                event_type,
                event,
            } if memory.knows(&key.key, &event.status) => {
                let answer = TerminalMemory::duplicate_answer(&key.key, &event.status);
                let line = RouteLog::handled(Handled {
                    answer: answer.clone(),
                    event_type,
                    webhook_id: delivery_id,
                    ms: None,
                    answered_by: Some("edge"),
                    alert: None,
                });
                self.finish(DeliveryEnd {
                    counts: vec![counters::DELIVERIES, counters::DUPLICATES],
                    ..DeliveryEnd::answered(answer, line)
                })
            }
            DeliveryKind::Event {
                key,
                event_type,
                event,
            } => self.deliver(key, event, event_type),
            nudge @ DeliveryKind::Nudge { .. } => self.nudge(nudge, false),
        }
    }

    /// The body's `v1a,` entries were checked against the key set: verified, it is a nudge
    /// (Google signed this body, which does not make the job ours); else the refusal.
    pub fn v1a_checked(&mut self, checked: Result<(), Rejection>) -> Need {
        let Stage::V1a = self.take() else {
            return self.out_of_order();
        };
        match checked {
            Ok(()) => self.nudge(nudge(&self.body, None, self.delivery_id()), true),
            Err(refusal) => self.finish(DeliveryEnd::refused(refusal)),
        }
    }

    /// A nudge goes to its gate (`signed`: its body is `v1a`-signed); a refused one ends here.
    fn nudge(&mut self, kind: DeliveryKind, signed: bool) -> Need {
        match kind {
            DeliveryKind::Nudge {
                key,
                event_type,
                claimed,
                metadata,
                delivery_id,
            } => {
                let unheld = signed.then(|| Unheld {
                    key: key.clone(),
                    metadata: metadata.clone(),
                });
                let command = GateCommand::Nudge {
                    key: key.key.clone(),
                    name: key.name,
                    claimed: claimed.as_str().to_string(),
                    metadata,
                    delivery_id,
                    confirm_interval_ms: self.settings.confirm_interval_ms,
                };
                self.call_gate(key.key, command, event_type, unheld)
            }
            DeliveryKind::Rejected(refusal) => self.finish(DeliveryEnd::refused(refusal)),
            _ => self.out_of_order(),
        }
    }

    /// A proven event goes to the gate of `key`.
    fn deliver(&mut self, key: OperationKey, event: OpEvent, event_type: String) -> Need {
        let command = GateCommand::Deliver {
            key: key.key.clone(),
            name: key.name,
            event,
            require_registration: self.settings.require_registration,
            hold_ms: self.settings.hold_ms,
            new_not_before_ms: 0,
        };
        self.call_gate(key.key, command, event_type, None)
    }

    /// The gate's reply (`Err`: the call failed, with why), at `now_ms`.
    pub fn gate_answered(&mut self, reply: Result<GateReply, String>, now_ms: i64) -> Need {
        let Stage::Gate {
            key,
            nudge,
            event_type,
            unheld,
        } = self.take()
        else {
            return self.out_of_order();
        };
        let reply = match reply {
            Ok(reply) => reply,
            Err(why) => return self.finish(DeliveryEnd::reply(Err(Refusal::Unavailable(why)))),
        };
        if nudge && reply == GateReply::Unregistered {
            match unheld {
                // A `v1a`-signed body for a name no gate holds: only the status API, asked
                // with our key, can say the job is ours; until it can be asked, Gemini retries.
                Some(unheld) if !self.settings.require_registration => {
                    if !self.settings.status_api {
                        return self.finish(DeliveryEnd::refused(Rejection::StatusUnavailable {
                            retry_after: STATUS_RETRY_AFTER_SECS,
                        }));
                    }
                    let need = Need::AskStatus {
                        key: unheld.key.key.clone(),
                        name: unheld.key.name.clone(),
                        collection: unheld.key.collection,
                    };
                    self.stage = Stage::Status { unheld, event_type };
                    return need;
                }
                // Not held: nothing was stored and nothing is asked; the tally may raise the
                // window's one alert.
                _ => return self.tally(key, event_type),
            }
        }
        let Some(answer) = Answer::from_gate(&key, &reply) else {
            return self.finish(DeliveryEnd::reply(Err(Refusal::Unavailable(format!(
                "unexpected gate reply {reply:?}"
            )))));
        };
        let line = RouteLog::handled(Handled {
            answer: answer.clone(),
            event_type,
            webhook_id: self.delivery_id(),
            ms: Some(now_ms - self.started_ms),
            answered_by: None,
            alert: None,
        });
        // Only a delivery's answer is a fact about the record; a nudge's is not remembered.
        let remember = (!nudge)
            .then(|| TerminalMemory::settled_at(&reply))
            .flatten()
            .map(|s| (key, s));
        self.finish(DeliveryEnd {
            remember,
            ..DeliveryEnd::answered(answer, line)
        })
    }

    /// What the status API said about a `v1a`-signed nudge's unheld operation (`None`: not asked,
    /// this isolate was told a moment ago that it is not ours). Answered for it with our key, the
    /// job is ours: the answer is delivered to its gate as a proven event, with the signed body's
    /// `user_metadata` as the job's own, and creates the record as an unregistered operation's
    /// would be. Not known to our project (404, or 403: another project's): a stranger's, tallied,
    /// nothing stored. No usable answer now, or another refusal (a 401 says our key is wrong, not
    /// that the job is someone else's): 503, so Gemini retries.
    pub fn status_answered(&mut self, answer: Option<Result<Observation, StatusError>>) -> Need {
        let Stage::Status { unheld, event_type } = self.take() else {
            return self.out_of_order();
        };
        let observation = match answer {
            Some(Ok(observation)) if !matches!(observation.status, Status::Unknown(_)) => {
                observation
            }
            None | Some(Err(StatusError::NotFound | StatusError::Refused(403))) => {
                return self.tally(unheld.key.key, event_type)
            }
            Some(other) => {
                let retry_after = match other {
                    Err(StatusError::Transient { retry_after_secs }) => {
                        retry_after_secs.clamp(1, i64::from(STATUS_RETRY_AFTER_SECS)) as u32
                    }
                    _ => STATUS_RETRY_AFTER_SECS,
                };
                return self.finish(DeliveryEnd::refused(Rejection::StatusUnavailable {
                    retry_after,
                }));
            }
        };
        let mut details = observation.details;
        if let Some(signed) = unheld.metadata.get(SIGNED_USER_METADATA) {
            details.insert(USER_METADATA.into(), signed.clone());
        }
        let event = OpEvent {
            status: observation.status,
            update_time_ms: observation.update_time_ms,
            source: Source::Webhook,
            details,
            delivery_id: Some(self.delivery_id()),
        };
        self.deliver(unheld.key, event, event_type)
    }

    /// The tally counted a nudge for an operation not held: `Some(true)` when it raised the
    /// window's alert, `None` when the call failed (a count is lost, never a delivery).
    pub fn tallied(&mut self, alert: Option<bool>) -> Need {
        let Stage::Tally { key, event_type } = self.take() else {
            return self.out_of_order();
        };
        let answer = Answer::NotHeld { key };
        let line = RouteLog::handled(Handled {
            answer: answer.clone(),
            event_type,
            webhook_id: self.delivery_id(),
            ms: None,
            answered_by: None,
            alert: Some(alert == Some(true)),
        });
        self.finish(DeliveryEnd {
            counts: vec![counters::STRANGER_NUDGES],
            ..DeliveryEnd::answered(answer, line)
        })
    }

    /// The dead letter was kept (`Err`: it could not be, with why: 503, so Gemini retries
    /// and the delivery is never dropped unseen).
    pub fn dead_letter_kept(&mut self, kept: Result<(), String>) -> Need {
        let Stage::DeadLetter { key, reason, reply } = self.take() else {
            return self.out_of_order();
        };
        match kept {
            Ok(()) => self.finish(DeliveryEnd {
                line: Some(RouteLog::DeadLetter {
                    reason,
                    webhook_id: self.delivery_id(),
                    kv_key: key,
                }),
                ..DeliveryEnd::reply(reply)
            }),
            Err(why) => self.finish(DeliveryEnd::reply(Err(Refusal::Unavailable(why)))),
        }
    }

    /// The delivery's id: the `webhook-id` header (a token's delivery is named by its hash
    /// in what classification builds).
    fn delivery_id(&self) -> String {
        self.headers.id.unwrap_or_default().to_string()
    }

    fn take(&mut self) -> Stage<'a> {
        std::mem::replace(&mut self.stage, Stage::Over)
    }

    fn read_body(&mut self, proof: Proof<'a>) -> Need {
        self.stage = Stage::Body(proof);
        let (cap, declared) = (self.policy.max_body_bytes, self.headers.declared_length());
        Need::Body { cap, declared }
    }

    fn call_gate(
        &mut self,
        key: String,
        command: GateCommand,
        event_type: String,
        unheld: Option<Unheld>,
    ) -> Need {
        self.stage = Stage::Gate {
            key: key.clone(),
            nudge: matches!(command, GateCommand::Nudge { .. }),
            event_type,
            unheld,
        };
        Need::Gate { key, command }
    }

    fn tally(&mut self, key: String, event_type: String) -> Need {
        self.stage = Stage::Tally { key, event_type };
        Need::Tally
    }

    fn finish(&mut self, finished: DeliveryEnd) -> Need {
        self.stage = Stage::Over;
        Need::Done(finished)
    }

    /// An answer to a step that was not asked for: a bug in the edge's loop, answered 503 so
    /// the sender retries rather than a delivery being half-handled.
    fn out_of_order(&mut self) -> Need {
        self.finish(DeliveryEnd::reply(Err(Refusal::Unavailable(
            "intake: an answer to a step not asked for".into(),
        ))))
    }
}

impl Answer {
    /// The answer for what the gate of `key` replied to a delivery or a nudge; `None` for a
    /// reply no delivery can get (answered 503).
    pub fn from_gate(key: &str, reply: &GateReply) -> Option<Answer> {
        let key = key.to_string();
        Some(match reply.clone() {
            GateReply::Applied { status, effect } => Answer::Applied {
                key,
                status,
                effect,
            },
            GateReply::Dropped {
                reason,
                status,
                effect,
            } => Answer::Dropped {
                reason,
                key,
                status,
                effect: Some(effect),
            },
            GateReply::Confirming { status } => Answer::Confirming { key, status },
            GateReply::IgnoredUnregistered => Answer::IgnoredUnregistered { key },
            GateReply::IgnoredTooOld => Answer::IgnoredTooOld { key },
            GateReply::Forgotten { .. } => Answer::IgnoredForgotten { key },
            _ => return None,
        })
    }
}

/// What the headers alone decide, at `now_ms`: a declared body over the cap (413), then the
/// signature headers. A `webhook-signature` shaped like a JWT is a dynamic webhook's token;
/// anything else is a Standard Webhooks HMAC header.
pub fn screen<'a>(
    headers: &Headers<'a>,
    now_ms: i64,
    policy: &Policy<'_>,
) -> Result<Screened<'a>, Rejection> {
    if let Some(n) = headers
        .declared_length()
        .filter(|n| *n > policy.max_body_bytes)
    {
        return Err(Rejection::BodyTooLarge(Oversize::Declared(n)));
    }
    let now_secs = now_ms.div_euclid(1_000);
    if let Some(token) = headers.signature.filter(|s| looks_like_jwt(s)) {
        if !policy.dynamic_webhooks {
            return Err(Rejection::DynamicWebhooksDisabled);
        }
        // The timestamp is optional for a token (its claims carry time); when sent, the
        // same window as for an HMAC applies.
        if let Some(t) = headers.timestamp {
            check_timestamp(t, now_secs, policy.tolerance_secs).map_err(|e| match e {
                SignatureError::BadTimestamp => Rejection::Signature(e),
                _ => Rejection::TokenTimestampOutOfTolerance,
            })?;
        }
        let parsed = jwt::parse(token).map_err(Rejection::Token)?;
        let (token, token_hash) = (parsed, token_hash(token));
        return Ok(Screened::Jwt { token, token_hash });
    }
    let signed = SignedHeaders {
        id: headers.id,
        timestamp: headers.timestamp,
        signature: headers.signature,
    };
    let checked =
        check_headers(signed, now_secs, policy.tolerance_secs).map_err(Rejection::Signature)?;
    // `v1a,` entries alone are a dynamic webhook's signature.
    if !checked.has(V1) && !policy.dynamic_webhooks {
        return Err(Rejection::DynamicWebhooksDisabled);
    }
    Ok(Screened::Hmac(checked))
}

/// A token whose RS256 signature the edge found valid: its claims decide, at `now_ms`.
pub fn vouch(
    token: Token,
    token_hash: String,
    now_ms: i64,
    policy: &Policy<'_>,
) -> Result<Proof<'static>, Rejection> {
    jwt::check_claims(&token.claims, now_ms.div_euclid(1_000), policy.audience)
        .map_err(Rejection::Token)?;
    let claims = token.claims;
    Ok(Proof::Jwt { claims, token_hash })
}

/// A JWT delivery's id: a hash of the token, which is signed (the `webhook-id` header is not,
/// and may be empty).
fn token_hash(token: &str) -> String {
    let hex: String = Sha256::digest(token.trim().as_bytes())
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("jwt_{hex}")
}

/// What a proven delivery's body is. `delivery_id` is the `webhook-id` of an HMAC delivery.
/// A body no `v1,` entry proves, with `v1a,` entries while dynamic webhooks are on, is
/// [`DeliveryKind::CheckV1a`]; with none well formed (empty, not base64, not 64 bytes) it is
/// refused without a key set.
pub fn classify(
    proof: Proof<'_>,
    body: &[u8],
    delivery_id: &str,
    policy: &Policy<'_>,
) -> DeliveryKind {
    match proof {
        Proof::Hmac(checked) => match checked.verify(body, policy.secrets) {
            Ok(()) => signed(body, delivery_id),
            Err(e) if policy.dynamic_webhooks && checked.has(V1A) => {
                match checked.v1a_message(body) {
                    Some(message) => DeliveryKind::CheckV1a(message),
                    None if checked.has(V1) => DeliveryKind::Rejected(Rejection::Signature(e)),
                    None => {
                        DeliveryKind::Rejected(Rejection::Signature(SignatureError::V1aInvalid))
                    }
                }
            }
            Err(e) => DeliveryKind::Rejected(Rejection::Signature(e)),
        },
        Proof::Jwt { claims, token_hash } => nudge(body, Some(claims), token_hash),
    }
}

/// The envelope of a proven body, what its type says its operation reached, and its key.
/// A ping's type (it names no operation) is an unknown type here: a token-signed test
/// delivery proves nothing and needs no answer but 2xx.
fn read(body: &[u8]) -> Result<(Envelope, Status, OperationKey), Unusable> {
    let envelope = parse(body).map_err(Unusable::NotEnvelope)?;
    let Meaning::Status { status, collection } = meaning(&envelope.event_type) else {
        return Err(Unusable::UnknownType(envelope.event_type));
    };
    let key = normalize(&envelope.id, Some(collection)).map_err(Unusable::BadId)?;
    Ok((envelope, status, key))
}

/// A body the HMAC proved: an event, a ping, or a dead letter.
fn signed(body: &[u8], delivery_id: &str) -> DeliveryKind {
    let (reason, reply) = match read(body) {
        Ok((envelope, status, key)) => {
            return DeliveryKind::Event {
                key,
                event: OpEvent {
                    status,
                    update_time_ms: envelope.timestamp_ms,
                    source: Source::Webhook,
                    details: envelope.details,
                    delivery_id: Some(delivery_id.to_string()),
                },
                event_type: envelope.event_type,
            }
        }
        Err(Unusable::UnknownType(event_type)) if meaning(&event_type) == Meaning::Ping => {
            return DeliveryKind::Ping { event_type }
        }
        Err(ref e @ Unusable::NotEnvelope(ref problem)) => (problem.label(), e.reply()),
        Err(e @ Unusable::UnknownType(_)) => ("unknown_event_type", e.reply()),
        Err(e @ Unusable::BadId(_)) => ("bad_operation_id", e.reply()),
    };
    DeliveryKind::DeadLetter { reason, reply }
}

/// A body only Google vouches for (a token's `claims`, or `None`: a `v1a` signature over the
/// body): a nudge, or a refusal (never stored: it is not proven ours).
fn nudge(body: &[u8], claims: Option<Map<String, Value>>, delivery_id: String) -> DeliveryKind {
    match read(body) {
        Ok((envelope, claimed, key)) => DeliveryKind::Nudge {
            key,
            claimed,
            metadata: match claims {
                Some(claims) => nudge_metadata(claims, &envelope.details),
                None => signed_metadata(&envelope.details),
            },
            event_type: envelope.event_type,
            delivery_id,
        },
        Err(unusable) => DeliveryKind::Rejected(Rejection::Nudge {
            unusable,
            delivery_id,
        }),
    }
}

/// Nothing binds a token's claims to the operation its body names (Gemini documents no such
/// claim, and anyone can obtain a valid token), so a nudge's metadata is never verified: the
/// token's `user_metadata` claim, else the body's, travels as `unverified_user_metadata`.
/// The verified `user_metadata` comes from a registration or the status API.
fn nudge_metadata(
    mut claims: Map<String, Value>,
    details: &Map<String, Value>,
) -> Map<String, Value> {
    // Bounded before it travels to the gate (the command nests it deeper than the token
    // did); the body's was bounded when the envelope was parsed.
    let claimed = claims
        .remove(USER_METADATA)
        .map(crate::operation::details::bound)
        .or_else(|| details.get(USER_METADATA).cloned());
    let unverified = claimed.map(|claimed| (UNVERIFIED_USER_METADATA.to_string(), claimed));
    unverified.into_iter().collect()
}

/// A `v1a`-signed body's `user_metadata`: Google signed it, for whichever project ran the
/// job, so it waits as [`SIGNED_USER_METADATA`] and becomes the job's `user_metadata` only
/// once the status API, asked with our key, answered for the operation
/// ([`crate::operation::Operation::confirm_with`]).
fn signed_metadata(details: &Map<String, Value>) -> Map<String, Value> {
    let signed = details.get(USER_METADATA);
    let signed = signed.map(|signed| (SIGNED_USER_METADATA.to_string(), signed.clone()));
    signed.into_iter().collect()
}

/// Keys remembered per isolate by default; past this the memory starts over (a miss costs
/// one round trip).
pub const TERMINAL_KEYS_MAX: usize = 100_000;

/// Terminal states an isolate has seen a gate answer with, by key: a copy of a fact that
/// never changes (terminal absorbs), used only to answer a duplicate of it.
#[derive(Debug)]
pub struct TerminalMemory {
    known: HashMap<String, Status>,
    cap: usize,
}

impl Default for TerminalMemory {
    fn default() -> Self {
        TerminalMemory::with_capacity(TERMINAL_KEYS_MAX)
    }
}

impl TerminalMemory {
    pub fn with_capacity(cap: usize) -> TerminalMemory {
        let known = HashMap::new();
        TerminalMemory { known, cap }
    }

    /// The terminal status a gate's reply to a delivery states (applied or dropped): a fact
    /// about the record this isolate may remember. The caller asks only for a delivery's
    /// reply (a nudge's is not a fact about the record: [`Intake::gate_answered`]).
    pub fn settled_at(reply: &GateReply) -> Option<Status> {
        let (GateReply::Applied { status, .. } | GateReply::Dropped { status, .. }) = reply else {
            return None;
        };
        status.is_terminal().then(|| status.clone())
    }

    /// Remembers that `key` is settled at the terminal `status` (see [`Self::settled_at`]).
    pub fn remember(&mut self, key: &str, status: Status) {
        if !status.is_terminal() {
            return;
        }
        if self.known.len() >= self.cap {
            self.known.clear();
        }
        self.known.insert(key.to_string(), status);
    }

    /// Whether a delivery of `status` for `key` repeats the terminal status known for it.
    pub fn knows(&self, key: &str, status: &Status) -> bool {
        self.known.get(key) == Some(status)
    }

    /// The answer to a duplicate this isolate answers without the gate (the effect's state
    /// was not asked).
    pub fn duplicate_answer(key: &str, status: &Status) -> Answer {
        Answer::Dropped {
            reason: DropReason::Duplicate,
            key: key.to_string(),
            status: status.clone(),
            effect: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inbound::classify::fixtures::{secrets, status, token, BODY, NOW, NOW_MS};
    use crate::inbound::classify::Oversize;
    use crate::operation::gate::protocol::EffectReport;
    use crate::operation::lifecycle::DropReason;
    use crate::signature::{sign, Secret};
    const SETTINGS: Settings = Settings {
        require_registration: false,
        hold_ms: 0,
        confirm_interval_ms: 60_000,
        status_api: true,
    };

    fn policy(secrets: &[Secret]) -> Policy<'_> {
        Policy {
            max_body_bytes: 1_000,
            tolerance_secs: 300,
            dynamic_webhooks: true,
            secrets,
            audience: None,
        }
    }

    fn leak(s: String) -> &'static str {
        Box::leak(s.into_boxed_str())
    }

    /// Headers of an HMAC delivery of `body`, signed now as `msg_1`.
    fn hmac_headers(body: &[u8]) -> Headers<'static> {
        Headers {
            content_length: Some(leak(body.len().to_string())),
            id: Some("msg_1"),
            timestamp: Some(leak(NOW.to_string())),
            signature: Some(leak(sign(&secrets()[0], "msg_1", NOW, body))),
        }
    }

    fn token_headers(claims: Value) -> Headers<'static> {
        Headers {
            id: Some("msg_jwt"),
            timestamp: Some(leak(NOW.to_string())),
            signature: Some(leak(token(claims))),
            ..Headers::default()
        }
    }

    /// A memory that knows nothing.
    fn forgets() -> TerminalMemory {
        TerminalMemory::default()
    }

    fn done(need: Need) -> DeliveryEnd {
        match need {
            Need::Done(f) => f,
            other => panic!("not done: {other:?}"),
        }
    }

    fn done_status(need: &Need) -> Option<u16> {
        match need {
            Need::Done(f) => Some(status(&f.reply)),
            _ => None,
        }
    }

    fn applied(status: Status) -> GateReply {
        GateReply::Applied {
            status,
            effect: EffectReport::Scheduled,
        }
    }

    #[test]
    fn a_signed_event_reads_its_body_asks_this_isolate_then_the_gate_once() {
        let s = secrets();
        let (mut intake, need) = Intake::start(hmac_headers(BODY), policy(&s), SETTINGS, NOW_MS);
        assert_eq!(
            need,
            Need::Body {
                cap: 1_000,
                declared: Some(BODY.len())
            }
        );
        let Need::Gate { key, command } = intake.body_read(Some(BODY.to_vec()), &forgets()) else {
            panic!("the gate is asked")
        };
        assert_eq!(key, "batches/b1");
        let GateCommand::Deliver { event, .. } = &command else {
            panic!("a delivery: {command:?}")
        };
        assert_eq!(event.delivery_id.as_deref(), Some("msg_1"));
        let f = done(intake.gate_answered(Ok(applied(Status::Succeeded)), NOW_MS + 7));
        assert_eq!(status(&f.reply), 200);
        assert_eq!(f.remember, Some(("batches/b1".into(), Status::Succeeded)));
        assert_eq!(f.rejected, None);
        let line = f.line.unwrap().to_value();
        assert_eq!(
            (line["event"].as_str(), line["ms"].as_i64()),
            (Some("delivered"), Some(7))
        );
    }

    #[test]
    fn a_duplicate_this_isolate_remembers_is_answered_without_the_gate() {
        let s = secrets();
        let (mut intake, _) = Intake::start(hmac_headers(BODY), policy(&s), SETTINGS, NOW_MS);
        let mut memory = forgets();
        memory.remember("batches/b1", Status::Succeeded);
        let f = done(intake.body_read(Some(BODY.to_vec()), &memory));
        let Ok(Answer::Dropped { reason, effect, .. }) = &f.reply else {
            panic!("{:?}", f.reply)
        };
        assert_eq!((*reason, *effect), (DropReason::Duplicate, None));
        assert_eq!(f.counts, [counters::DELIVERIES, counters::DUPLICATES]);
        assert_eq!(f.line.unwrap().to_value()["answered_by"], "edge");
    }

    #[test]
    fn headers_alone_refuse_before_the_body_is_read() {
        let s = secrets();
        // A declared length over the cap: 413 first, whatever the signature.
        let mut big = hmac_headers(BODY);
        big.content_length = Some("1001");
        let (_, need) = Intake::start(big, policy(&s), SETTINGS, NOW_MS);
        let f = done(need);
        assert_eq!(
            (status(&f.reply), f.rejected),
            (413, Some("body_too_large"))
        );
        // A stale timestamp: 401, no body read.
        let mut stale = hmac_headers(BODY);
        stale.timestamp = Some("1");
        assert_eq!(
            done_status(&Intake::start(stale, policy(&s), SETTINGS, NOW_MS).1),
            Some(401)
        );
        // A token while dynamic webhooks are off.
        let off = Policy {
            dynamic_webhooks: false,
            ..policy(&s)
        };
        let f = done(
            Intake::start(
                token_headers(json!({"exp": NOW + 60})),
                off,
                SETTINGS,
                NOW_MS,
            )
            .1,
        );
        assert_eq!(f.rejected, Some("dynamic_webhooks_disabled"));
    }

    #[test]
    fn a_body_past_the_cap_or_over_other_bytes_is_refused_after_reading() {
        let s = secrets();
        let (mut intake, _) = Intake::start(hmac_headers(BODY), policy(&s), SETTINGS, NOW_MS);
        let f = done(intake.body_read(None, &forgets()));
        assert_eq!(
            (status(&f.reply), f.rejected),
            (413, Some("body_too_large"))
        );
        assert_eq!(
            f.line.unwrap(),
            Rejection::BodyTooLarge(Oversize::Streamed { cap: 1_000 }).log_line()
        );
        let (mut intake, _) = Intake::start(hmac_headers(BODY), policy(&s), SETTINGS, NOW_MS);
        let forged = br#"{"type":"batch.failed","data":{"id":"batches/b1"}}"#;
        let f = done(intake.body_read(Some(forged.to_vec()), &forgets()));
        assert_eq!(
            (status(&f.reply), f.rejected),
            (401, Some("signature_invalid"))
        );
    }

    #[test]
    fn a_nudge_checks_the_signature_then_the_claims_then_asks_only_the_gate() {
        let s = secrets();
        let headers = token_headers(json!({"exp": NOW + 60, "user_metadata": {"t": "claimed"}}));
        let (mut intake, need) = Intake::start(headers, policy(&s), SETTINGS, NOW_MS);
        assert!(matches!(need, Need::Signature(_)), "{need:?}");
        assert!(matches!(
            intake.signature_checked(Ok(()), NOW_MS),
            Need::Body { .. }
        ));
        let Need::Gate { key, command } = intake.body_read(Some(BODY.to_vec()), &forgets()) else {
            panic!("the gate is asked first")
        };
        assert_eq!(key, "batches/b1");
        let GateCommand::Nudge {
            metadata,
            delivery_id,
            ..
        } = &command
        else {
            panic!("a nudge: {command:?}")
        };
        assert!(delivery_id.starts_with("jwt_"));
        assert!(metadata.get("user_metadata").is_none(), "never verified");
        // Not held: the tally, and nothing else (no status call exists on this path).
        assert_eq!(
            intake.gate_answered(Ok(GateReply::Unregistered), NOW_MS),
            Need::Tally
        );
        let f = done(intake.tallied(Some(true)));
        assert_eq!(
            f.reply,
            Ok(Answer::NotHeld {
                key: "batches/b1".into()
            })
        );
        assert_eq!(f.counts, [counters::STRANGER_NUDGES]);
        assert_eq!(f.remember, None);
        let line = f.line.unwrap().to_value();
        assert_eq!(
            (line["event"].as_str(), line["alert"].as_bool()),
            (Some("stranger_nudge"), Some(true))
        );
        // Held: the gate's answer is the answer, and nothing is remembered from a nudge.
        let headers = token_headers(json!({"exp": NOW + 60}));
        let (mut intake, _) = Intake::start(headers, policy(&s), SETTINGS, NOW_MS);
        intake.signature_checked(Ok(()), NOW_MS);
        intake.body_read(Some(BODY.to_vec()), &forgets());
        let f = done(intake.gate_answered(Ok(applied(Status::Succeeded)), NOW_MS));
        assert_eq!((status(&f.reply), f.remember), (200, None));
    }

    #[test]
    fn a_token_is_refused_by_its_signature_or_claims_before_the_body() {
        let s = secrets();
        let (mut intake, _) = Intake::start(
            token_headers(json!({"exp": NOW + 60})),
            policy(&s),
            SETTINGS,
            NOW_MS,
        );
        let f = done(intake.signature_checked(
            Err(Rejection::Token(crate::inbound::jwt::JwtError::Signature)),
            NOW_MS,
        ));
        assert_eq!(
            (status(&f.reply), f.rejected),
            (401, Some("jwt_signature_invalid"))
        );
        let (mut intake, _) = Intake::start(
            token_headers(json!({"exp": NOW - 60})),
            policy(&s),
            SETTINGS,
            NOW_MS,
        );
        let f = done(intake.signature_checked(Ok(()), NOW_MS));
        assert_eq!((status(&f.reply), f.rejected), (401, Some("jwt_expired")));
        let (mut intake, _) = Intake::start(
            token_headers(json!({"exp": NOW + 60})),
            policy(&s),
            SETTINGS,
            NOW_MS,
        );
        let f = done(
            intake.signature_checked(Err(Rejection::KeysUnavailable { retry_after: 5 }), NOW_MS),
        );
        assert_eq!(f.reply, Err(Refusal::RetryLater(5)));
    }

    #[test]
    fn a_proven_body_that_cannot_be_used_is_kept_or_answered_503() {
        let s = secrets();
        let junk = b"not json";
        let (mut intake, _) = Intake::start(hmac_headers(junk), policy(&s), SETTINGS, NOW_MS);
        let Need::DeadLetter { key, value } = intake.body_read(Some(junk.to_vec()), &forgets())
        else {
            panic!("kept")
        };
        assert_eq!(key, "dead:msg_1");
        assert_eq!(
            (value["body"].as_str(), value["reason"].as_str()),
            (Some("not json"), Some("not_json"))
        );
        let f = done(intake.dead_letter_kept(Ok(())));
        assert_eq!(status(&f.reply), 400);
        assert_eq!(f.line.unwrap().to_value()["event"], "dead_letter");
        let (mut intake, _) = Intake::start(hmac_headers(junk), policy(&s), SETTINGS, NOW_MS);
        intake.body_read(Some(junk.to_vec()), &forgets());
        let f = done(intake.dead_letter_kept(Err("KV down".into())));
        assert_eq!(f.reply, Err(Refusal::Unavailable("KV down".into())));
    }

    #[test]
    fn a_failed_gate_call_or_a_reply_no_delivery_gets_is_503() {
        let s = secrets();
        for reply in [Err("object reset".to_string()), Ok(GateReply::NotFound)] {
            let (mut intake, _) = Intake::start(hmac_headers(BODY), policy(&s), SETTINGS, NOW_MS);
            intake.body_read(Some(BODY.to_vec()), &forgets());
            let f = done(intake.gate_answered(reply, NOW_MS));
            assert_eq!((status(&f.reply), f.remember), (503, None));
        }
    }

    #[test]
    fn a_ping_is_answered_pong_and_counted() {
        let s = secrets();
        let ping = br#"{"type":"webhook.ping","data":{}}"#;
        let (mut intake, _) = Intake::start(hmac_headers(ping), policy(&s), SETTINGS, NOW_MS);
        let f = done(intake.body_read(Some(ping.to_vec()), &forgets()));
        assert_eq!(f.counts, [counters::PINGS]);
        assert!(matches!(f.reply, Ok(Answer::Pong { .. })));
    }

    #[test]
    fn an_answer_to_a_step_not_asked_for_is_503() {
        let s = secrets();
        let (mut intake, _) = Intake::start(hmac_headers(BODY), policy(&s), SETTINGS, NOW_MS);
        assert_eq!(done_status(&intake.dead_letter_kept(Ok(()))), Some(503));
        assert_eq!(done_status(&intake.tallied(None)), Some(503));
    }

    // v1a: Ed25519-signed bodies.

    const SIGNED: &[u8] =
        br#"{"type":"batch.succeeded","user_metadata":{"team":"reviews"},"data":{"id":"batches/b1"}}"#;

    fn ed25519() -> ed25519_compact::KeyPair {
        ed25519_compact::KeyPair::from_seed(ed25519_compact::Seed::new([7; 32]))
    }

    /// Headers of `body` signed `v1a` as `msg_1` now, after `extra` entries.
    fn v1a_headers(body: &[u8], extra: &str) -> Headers<'static> {
        use base64::engine::general_purpose::STANDARD;
        use base64::Engine;
        let message = [format!("msg_1.{NOW}.").as_bytes(), body].concat();
        let entry = format!("v1a,{}", STANDARD.encode(*ed25519().sk.sign(message, None)));
        Headers {
            content_length: Some(leak(body.len().to_string())),
            id: Some("msg_1"),
            timestamp: Some(leak(NOW.to_string())),
            signature: Some(leak(format!("{extra} {entry}").trim().to_string())),
        }
    }

    /// A v1a delivery of [`SIGNED`] taken to its gate call, with `settings`.
    fn v1a_at_the_gate(settings: Settings) -> Intake<'static> {
        let s: &'static [Secret] = Box::leak(secrets().into_boxed_slice());
        let (mut intake, need) =
            Intake::start(v1a_headers(SIGNED, ""), policy(s), settings, NOW_MS);
        assert!(matches!(need, Need::Body { .. }), "{need:?}");
        let Need::V1a(message) = intake.body_read(Some(SIGNED.to_vec()), &forgets()) else {
            panic!("the v1a entries are checked")
        };
        let key = crate::signature::Ed25519Key::from_bytes(None, &*ed25519().pk).unwrap();
        assert!(message.verify(&[key]), "the message is id.timestamp.body");
        let Need::Gate { key, command } = intake.v1a_checked(Ok(())) else {
            panic!("the gate is asked")
        };
        assert_eq!(key, "batches/b1");
        let GateCommand::Nudge {
            metadata,
            delivery_id,
            ..
        } = &command
        else {
            panic!("a nudge: {command:?}")
        };
        assert_eq!(delivery_id, "msg_1", "the webhook-id is signed");
        assert_eq!(metadata[SIGNED_USER_METADATA], json!({"team": "reviews"}));
        assert!(
            metadata.get(USER_METADATA).is_none(),
            "not the job's own yet"
        );
        intake
    }

    fn observation(status: Status) -> Observation {
        let mut details = Map::new();
        details.insert("output_file_uri".into(), json!("files/out"));
        Observation {
            status,
            update_time_ms: NOW_MS - 5,
            details,
        }
    }

    #[test]
    fn a_held_operations_v1a_nudge_is_confirmed_by_its_gate() {
        let mut intake = v1a_at_the_gate(SETTINGS);
        let confirming = GateReply::Confirming {
            status: Status::Running,
        };
        let f = done(intake.gate_answered(Ok(confirming), NOW_MS));
        assert_eq!((status(&f.reply), f.remember), (200, None));
    }

    #[test]
    fn an_unheld_v1a_operation_the_status_api_answers_for_is_delivered_as_ours() {
        let mut intake = v1a_at_the_gate(SETTINGS);
        let need = intake.gate_answered(Ok(GateReply::Unregistered), NOW_MS);
        assert_eq!(
            need,
            Need::AskStatus {
                key: "batches/b1".into(),
                name: "batches/b1".into(),
                collection: Collection::Batches,
            }
        );
        let Need::Gate { key, command } =
            intake.status_answered(Some(Ok(observation(Status::Succeeded))))
        else {
            panic!("the gate is given the answer")
        };
        assert_eq!(key, "batches/b1");
        let GateCommand::Deliver { event, .. } = &command else {
            panic!("a delivery: {command:?}")
        };
        assert_eq!(event.status, Status::Succeeded);
        assert_eq!(event.source, Source::Webhook);
        assert_eq!(event.update_time_ms, NOW_MS - 5);
        assert_eq!(event.delivery_id.as_deref(), Some("msg_1"));
        assert_eq!(event.details["output_file_uri"], "files/out");
        assert_eq!(event.details[USER_METADATA], json!({"team": "reviews"}));
        let f = done(intake.gate_answered(Ok(applied(Status::Succeeded)), NOW_MS));
        assert_eq!(status(&f.reply), 200);
        assert_eq!(f.remember, Some(("batches/b1".into(), Status::Succeeded)));
    }

    #[test]
    fn an_unheld_v1a_operation_not_known_to_our_key_is_a_strangers_and_stores_nothing() {
        for answer in [
            None,
            Some(Err(StatusError::NotFound)),
            Some(Err(StatusError::Refused(403))),
        ] {
            let mut intake = v1a_at_the_gate(SETTINGS);
            intake.gate_answered(Ok(GateReply::Unregistered), NOW_MS);
            assert_eq!(
                intake.status_answered(answer.clone()),
                Need::Tally,
                "{answer:?}"
            );
            let f = done(intake.tallied(Some(false)));
            assert_eq!(
                f.reply,
                Ok(Answer::NotHeld {
                    key: "batches/b1".into()
                })
            );
            assert_eq!(f.counts, [counters::STRANGER_NUDGES]);
        }
    }

    #[test]
    fn an_unheld_v1a_operation_the_status_api_cannot_answer_for_now_is_retried_by_gemini() {
        for (answer, retry_after) in [
            (
                Err(StatusError::Transient {
                    retry_after_secs: 7,
                }),
                7,
            ),
            (
                Err(StatusError::Transient {
                    retry_after_secs: 86_400,
                }),
                STATUS_RETRY_AFTER_SECS,
            ),
            (Err(StatusError::Malformed("x".into())), 60),
            // Our key refused (rotated, revoked): the job may well be ours.
            (Err(StatusError::Refused(401)), 60),
            (Err(StatusError::Refused(400)), 60),
            (Ok(observation(Status::Unknown("NEW".into()))), 60),
        ] {
            let mut intake = v1a_at_the_gate(SETTINGS);
            intake.gate_answered(Ok(GateReply::Unregistered), NOW_MS);
            let f = done(intake.status_answered(Some(answer)));
            assert_eq!(f.reply, Err(Refusal::RetryLater(retry_after)));
            assert_eq!(f.rejected, Some("v1a_status_unavailable"));
        }
        // No API key: nothing is asked, Gemini retries.
        let no_key = Settings {
            status_api: false,
            ..SETTINGS
        };
        let mut intake = v1a_at_the_gate(no_key);
        let f = done(intake.gate_answered(Ok(GateReply::Unregistered), NOW_MS));
        assert_eq!(f.reply, Err(Refusal::RetryLater(STATUS_RETRY_AFTER_SECS)));
        // REQUIRE_REGISTRATION: a stranger's, whoever's it is; nothing asked.
        let required = Settings {
            require_registration: true,
            ..SETTINGS
        };
        let mut intake = v1a_at_the_gate(required);
        assert_eq!(
            intake.gate_answered(Ok(GateReply::Unregistered), NOW_MS),
            Need::Tally
        );
    }

    #[test]
    fn a_v1a_signature_no_key_verifies_is_401_and_nothing_else_happens() {
        let s = secrets();
        let (mut intake, _) = Intake::start(v1a_headers(SIGNED, ""), policy(&s), SETTINGS, NOW_MS);
        assert!(matches!(
            intake.body_read(Some(SIGNED.to_vec()), &forgets()),
            Need::V1a(_)
        ));
        let f = done(intake.v1a_checked(Err(Rejection::Signature(SignatureError::V1aInvalid))));
        assert_eq!(
            (status(&f.reply), f.rejected),
            (401, Some("v1a_signature_invalid"))
        );
    }

    #[test]
    fn malformed_v1a_entries_are_refused_without_the_key_set() {
        let s = secrets();
        for signature in ["v1a,", "v1a,AAAA", "v1a,not base64!"] {
            let headers = Headers {
                signature: Some(signature),
                ..v1a_headers(SIGNED, "")
            };
            let (mut intake, _) = Intake::start(headers, policy(&s), SETTINGS, NOW_MS);
            let f = done(intake.body_read(Some(SIGNED.to_vec()), &forgets()));
            assert_eq!(f.rejected, Some("v1a_signature_invalid"), "{signature}");
        }
        // Beside a v1 entry that does not match either: the HMAC's refusal.
        let headers = Headers {
            signature: Some("v1,AAAA v1a,"),
            ..v1a_headers(SIGNED, "")
        };
        let (mut intake, _) = Intake::start(headers, policy(&s), SETTINGS, NOW_MS);
        let f = done(intake.body_read(Some(SIGNED.to_vec()), &forgets()));
        assert_eq!(f.rejected, Some("signature_invalid"));
    }

    #[test]
    fn a_matching_v1_entry_beside_v1a_entries_is_an_event_with_no_key_set() {
        let s = secrets();
        let v1 = sign(&s[0], "msg_1", NOW, SIGNED);
        let (mut intake, _) = Intake::start(v1a_headers(SIGNED, &v1), policy(&s), SETTINGS, NOW_MS);
        let Need::Gate { command, .. } = intake.body_read(Some(SIGNED.to_vec()), &forgets()) else {
            panic!("straight to the gate")
        };
        assert!(
            matches!(command, GateCommand::Deliver { .. }),
            "{command:?}"
        );
    }

    #[test]
    fn v1a_entries_alone_are_refused_while_dynamic_webhooks_are_off() {
        let s = secrets();
        let off = Policy {
            dynamic_webhooks: false,
            ..policy(&s)
        };
        let f = done(Intake::start(v1a_headers(SIGNED, ""), off, SETTINGS, NOW_MS).1);
        assert_eq!(f.rejected, Some("dynamic_webhooks_disabled"));
        // With a v1 entry beside them, the HMAC decides (here: it matches).
        let v1 = sign(&s[0], "msg_1", NOW, SIGNED);
        let (mut intake, _) = Intake::start(v1a_headers(SIGNED, &v1), off, SETTINGS, NOW_MS);
        assert!(matches!(
            intake.body_read(Some(SIGNED.to_vec()), &forgets()),
            Need::Gate { .. }
        ));
    }
}
