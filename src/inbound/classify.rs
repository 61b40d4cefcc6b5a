//! One inbound classification: what a delivery to `POST /webhooks/gemini` is, decided from
//! its headers, its body, the time and the configuration.
//!
//! Guarantees (docs/DESIGN.md, invariants 4, 5 and 7): every trust decision about a delivery is
//! made here, and every delivery turned away is a [`Rejection`]: its logged reason, and the
//! [`Reply`] it gets (a [`Refusal`], whose status is decided in one place). The decisions run in
//! [`crate::inbound::intake`], in the order its header states: the headers before a byte of the
//! body (a declared oversized body first; for a JWT, whether dynamic webhooks are on, the timestamp
//! window, then the token's shape), a token's signature (the edge's WebCrypto) before its claims,
//! our HMAC before any `v1a,` entry. An HMAC-proven body becomes a [`DeliveryKind::Event`]; a
//! JWT-signed body proves only its sender, so it becomes a [`DeliveryKind::Nudge`] whose metadata
//! is never verified; a `v1a`-signed body proves Google sent this very body, not that the job is
//! ours (Google's keys serve every project), so it too becomes a nudge, whose `user_metadata` is
//! trusted only once the status API, asked with our key, has confirmed the operation. Time is a
//! parameter.

use serde_json::{Map, Value};

use crate::inbound::answer::Answer;
use crate::inbound::envelope::EnvelopeError;
use crate::inbound::jwt::{JwtError, Token};
use crate::inbound::route_log::{Bytes, RouteLog};
use crate::operation::key::{KeyError, OperationKey};
use crate::operation::lifecycle::Status;
use crate::operation::OpEvent;
use crate::refusal::Refusal;
use crate::signature::{CheckedHeaders, Secret, SignatureError, V1aMessage};

/// The configuration the classification reads.
#[derive(Debug, Clone, Copy)]
pub struct Policy<'a> {
    pub max_body_bytes: usize,
    pub tolerance_secs: i64,
    pub dynamic_webhooks: bool,
    pub secrets: &'a [Secret],
    pub audience: Option<&'a str>,
}

/// Headers that passed [`screen`](crate::inbound::intake::screen): what is left to prove.
#[derive(Debug, Clone, PartialEq)]
pub enum Screened<'a> {
    /// Fit for an HMAC over the body with one of our secrets ([`classify`](crate::inbound::intake::classify) checks it).
    Hmac(CheckedHeaders<'a>),
    /// A parsed token: the edge checks its RS256 signature, then [`vouch`](crate::inbound::intake::vouch) its claims.
    /// `token_hash` is the delivery's id.
    Jwt { token: Token, token_hash: String },
}

/// Who vouched for a delivery, before its body is read.
#[derive(Debug, Clone, PartialEq)]
pub enum Proof<'a> {
    /// Headers fit for an HMAC over the body's bytes (checked by [`classify`](crate::inbound::intake::classify)).
    Hmac(CheckedHeaders<'a>),
    /// A Google-signed token with valid claims: it proves the sender, not the body.
    Jwt {
        claims: Map<String, Value>,
        token_hash: String,
    },
}

/// What a delivery is.
#[derive(Debug, Clone, PartialEq)]
pub enum DeliveryKind {
    /// An HMAC-proven event for the gate of `key`.
    Event {
        key: OperationKey,
        event_type: String,
        event: OpEvent,
    },
    /// A delivery only Google vouches for (a token, or a `v1a,` signature) naming an
    /// operation: the gate confirms with the status API.
    Nudge {
        key: OperationKey,
        event_type: String,
        claimed: Status,
        /// A token's `unverified_user_metadata`, or a `v1a`-signed body's `user_metadata`
        /// to be trusted once the status API confirms the operation is ours
        /// ([`crate::operation::details::SIGNED_USER_METADATA`]).
        metadata: Map<String, Value>,
        delivery_id: String,
    },
    /// The body's `v1,` entries match none of our secrets and it has `v1a,` entries: they
    /// are checked against Google's key set before anything else.
    CheckV1a(V1aMessage),
    /// An HMAC-proven test delivery: answered `pong`, nothing stored.
    Ping { event_type: String },
    /// A proven body that cannot be used: kept as a dead letter under `reason` (if it cannot
    /// be kept the answer is 503), then answered `reply`.
    DeadLetter { reason: &'static str, reply: Reply },
    /// Rejected: counted and logged as `rejected`, answered as [`Rejection::reply`] says.
    Rejected(Rejection),
}

/// How the route answers a delivery: 200 with this body, or a [`Refusal`].
pub type Reply = Result<Answer, Refusal>;

/// How large a refused body was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Oversize {
    /// `content-length` said so.
    Declared(usize),
    /// The stream passed the cap while being read.
    Streamed { cap: usize },
}

/// Why a delivery was refused. [`Rejection::reason`] is the `rejected` line's reason and the
/// `rejected_<reason>` counter's suffix; a contract read by tests and operators.
#[derive(Debug, Clone, PartialEq)]
pub enum Rejection {
    /// 413 `body_too_large`.
    BodyTooLarge(Oversize),
    /// 401: the Standard Webhooks headers or HMAC (`missing_webhook_id`, `timestamp_too_old`,
    /// `signature_invalid`...), or a token's unparseable `webhook-timestamp` (`bad_timestamp`).
    Signature(SignatureError),
    /// 401 `dynamic_webhooks_disabled`: a token arrived and `DYNAMIC_WEBHOOKS` is off.
    DynamicWebhooksDisabled,
    /// 401 `timestamp_out_of_tolerance`: a token's `webhook-timestamp` is outside the window.
    TokenTimestampOutOfTolerance,
    /// 401: the token itself (`jwt_shape`, `jwt_expired`, `jwt_signature_invalid`...).
    Token(JwtError),
    /// 503 `jwt_keys_unavailable`: the token's key is unknown and the key set cannot be
    /// refreshed now.
    KeysUnavailable { retry_after: u32 },
    /// 503 `v1a_status_unavailable`: a `v1a`-signed body names an operation no gate holds,
    /// and the status API cannot be asked now whether it is ours (no `GEMINI_API_KEY`, no
    /// slot in the status budget, a 429 or 5xx): Gemini retries.
    StatusUnavailable { retry_after: u32 },
    /// A nudge's body that names no operation (unproven, so only counted and logged): 400
    /// `jwt_body_not_envelope`, 200 `jwt_unknown_event_type`, 400 `jwt_bad_operation_id`.
    Nudge {
        unusable: Unusable,
        delivery_id: String,
    },
}

/// Why a proven body names no operation: kept as a dead letter when our HMAC proved it,
/// refused when only Google vouches for it.
#[derive(Debug, Clone, PartialEq)]
pub enum Unusable {
    NotEnvelope(EnvelopeError),
    UnknownType(String),
    BadId(KeyError),
}

impl Rejection {
    /// The logged and counted reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Rejection::BodyTooLarge(_) => "body_too_large",
            Rejection::Signature(e) => e.label(),
            Rejection::DynamicWebhooksDisabled => "dynamic_webhooks_disabled",
            Rejection::TokenTimestampOutOfTolerance => "timestamp_out_of_tolerance",
            Rejection::Token(e) => e.label(),
            Rejection::KeysUnavailable { .. } => JwtError::KeysUnavailable.label(),
            Rejection::StatusUnavailable { .. } => "v1a_status_unavailable",
            Rejection::Nudge { unusable, .. } => match unusable {
                Unusable::NotEnvelope(_) => "jwt_body_not_envelope",
                Unusable::UnknownType(_) => "jwt_unknown_event_type",
                Unusable::BadId(_) => "jwt_bad_operation_id",
            },
        }
    }

    /// How the sender is answered.
    pub fn reply(&self) -> Reply {
        match self {
            Rejection::BodyTooLarge(_) => Err(Refusal::TooLarge),
            Rejection::Signature(_)
            | Rejection::DynamicWebhooksDisabled
            | Rejection::TokenTimestampOutOfTolerance
            | Rejection::Token(_) => Err(Refusal::Unauthorized),
            Rejection::KeysUnavailable { retry_after }
            | Rejection::StatusUnavailable { retry_after } => {
                Err(Refusal::RetryLater(*retry_after))
            }
            Rejection::Nudge { unusable, .. } => unusable.reply(),
        }
    }

    /// The `rejected` log line.
    pub fn log_line(&self) -> RouteLog {
        let (mut bytes, mut retry_after, mut problem) = (None, None, None);
        let (mut delivery_id, mut event_type) = (None, None);
        match self {
            Rejection::BodyTooLarge(Oversize::Declared(n)) => bytes = Some(Bytes::Count(*n)),
            Rejection::BodyTooLarge(Oversize::Streamed { cap }) => {
                bytes = Some(Bytes::Over(format!("> {cap}")))
            }
            Rejection::KeysUnavailable { retry_after: secs }
            | Rejection::StatusUnavailable { retry_after: secs } => {
                retry_after = Some(i64::from(*secs))
            }
            Rejection::Nudge {
                unusable,
                delivery_id: d,
            } => {
                delivery_id = Some(d.clone());
                match unusable {
                    Unusable::NotEnvelope(p) => problem = Some(p.label()),
                    Unusable::UnknownType(t) => event_type = Some(t.clone()),
                    Unusable::BadId(_) => {}
                }
            }
            _ => {}
        }
        RouteLog::Rejected {
            reason: self.reason(),
            bytes,
            retry_after,
            problem,
            delivery_id,
            event_type,
        }
    }
}

impl Unusable {
    /// How the body is answered, whether it is kept as a dead letter or refused.
    pub(super) fn reply(&self) -> Reply {
        match self {
            Unusable::NotEnvelope(e) => {
                Err(Refusal::BadRequest(format!("not a Gemini envelope: {e}")))
            }
            Unusable::UnknownType(event_type) => Ok(Answer::IgnoredUnknownType {
                event_type: event_type.clone(),
            }),
            Unusable::BadId(e) => Err(Refusal::BadRequest(format!("data.id: {e}"))),
        }
    }
}

/// What the classification's tests and the intake's share: a secret, a time, a body, and
/// a token with any claims (its signature is not checked here: the edge checks it).
#[cfg(test)]
pub(crate) mod fixtures {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    use serde_json::Value;

    use super::Reply;
    use crate::refusal::Refusal;
    use crate::signature::Secret;

    pub(crate) const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    pub(crate) const NOW_MS: i64 = 1_700_000_000_000;
    pub(crate) const NOW: i64 = NOW_MS / 1_000;
    pub(crate) const BODY: &[u8] = br#"{"type":"batch.succeeded","data":{"id":"batches/b1"}}"#;

    /// The HTTP status of a reply.
    pub(crate) fn status(reply: &Reply) -> u16 {
        reply.as_ref().map_or_else(Refusal::status, |_| 200)
    }

    pub(crate) fn secrets() -> Vec<Secret> {
        vec![Secret::parse(SECRET).unwrap()]
    }

    /// A compact RS256-shaped token with these claims.
    pub(crate) fn token(claims: Value) -> String {
        let b64 = |v: &str| URL_SAFE_NO_PAD.encode(v);
        format!(
            "{}.{}.{}",
            b64(r#"{"alg":"RS256","kid":"k1"}"#),
            b64(&claims.to_string()),
            b64("sig")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{secrets, status, token, BODY, NOW, NOW_MS, SECRET};
    use super::*;
    use crate::inbound::intake::{classify, screen, vouch, Headers};
    use crate::operation::details::{UNVERIFIED_USER_METADATA, USER_METADATA};
    use crate::operation::lifecycle::Source;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    use serde_json::json;
    use sha2::{Digest, Sha256};

    fn policy(secrets: &[Secret]) -> Policy<'_> {
        Policy {
            max_body_bytes: 1_000,
            tolerance_secs: 300,
            dynamic_webhooks: true,
            secrets,
            audience: Some("https://hooks.example"),
        }
    }

    fn sign(body: &[u8], ts: i64) -> String {
        crate::signature::sign(&Secret::parse(SECRET).unwrap(), "msg_1", ts, body)
    }

    fn good_claims() -> Value {
        json!({"exp": NOW + 600, "iat": NOW - 5, "aud": "https://hooks.example"})
    }

    fn refusal<T: std::fmt::Debug>(r: Result<T, Rejection>) -> (&'static str, u16) {
        let e = r.unwrap_err();
        (e.reason(), status(&e.reply()))
    }

    /// Screens HMAC headers (with `msg_1` as id) sent at `ts` with `signature`.
    fn screen_hmac(ts: &str, signature: &str) -> Result<Screened<'static>, Rejection> {
        let (ts, signature): (&'static str, &'static str) = (
            Box::leak(ts.to_string().into_boxed_str()),
            Box::leak(signature.to_string().into_boxed_str()),
        );
        let headers = Headers {
            content_length: None,
            id: Some("msg_1"),
            timestamp: Some(ts),
            signature: Some(signature),
        };
        screen(&headers, NOW_MS, &policy(&[]))
    }

    /// Screens a token (with an optional `webhook-timestamp`) and vouches for its claims as
    /// if its RS256 signature had been found valid.
    fn screen_token(
        token: &str,
        ts: Option<&str>,
        p: &Policy<'_>,
    ) -> Result<Proof<'static>, Rejection> {
        let headers = Headers {
            timestamp: ts,
            signature: Some(token),
            ..Headers::default()
        };
        match screen(&headers, NOW_MS, p)? {
            Screened::Jwt { token, token_hash } => vouch(token, token_hash, NOW_MS, p),
            other => panic!("not a token: {other:?}"),
        }
    }

    fn hmac_outcome(body: &[u8]) -> DeliveryKind {
        let s = secrets();
        let sig = sign(body, NOW);
        let ts = NOW.to_string();
        let headers = Headers {
            content_length: Some("52"),
            id: Some("msg_1"),
            timestamp: Some(&ts),
            signature: Some(&sig),
        };
        let Screened::Hmac(checked) = screen(&headers, NOW_MS, &policy(&s)).unwrap() else {
            panic!("not HMAC")
        };
        classify(Proof::Hmac(checked), body, "msg_1", &policy(&s))
    }

    fn nudge_outcome(claims: Value, body: &[u8]) -> DeliveryKind {
        let s = secrets();
        let proof = screen_token(&token(claims), None, &policy(&s)).unwrap();
        classify(proof, body, "", &policy(&s))
    }

    #[test]
    fn every_refusal_keeps_its_reason_and_status() {
        let id = || "jwt_1".to_string();
        let table = [
            (
                Rejection::BodyTooLarge(Oversize::Declared(2)),
                "body_too_large",
                413,
            ),
            (
                Rejection::Signature(SignatureError::MissingHeader("webhook-id")),
                "missing_webhook_id",
                401,
            ),
            (
                Rejection::Signature(SignatureError::MissingHeader("webhook-timestamp")),
                "missing_webhook_timestamp",
                401,
            ),
            (
                Rejection::Signature(SignatureError::MissingHeader("webhook-signature")),
                "missing_webhook_signature",
                401,
            ),
            (
                Rejection::Signature(SignatureError::BadTimestamp),
                "bad_timestamp",
                401,
            ),
            (
                Rejection::Signature(SignatureError::TooOld),
                "timestamp_too_old",
                401,
            ),
            (
                Rejection::Signature(SignatureError::TooNew),
                "timestamp_too_new",
                401,
            ),
            (
                Rejection::Signature(SignatureError::NoV1Entry),
                "no_v1_signature",
                401,
            ),
            (
                Rejection::Signature(SignatureError::Invalid),
                "signature_invalid",
                401,
            ),
            (
                Rejection::Signature(SignatureError::JwtUnsupported),
                "jwt_unsupported",
                401,
            ),
            (
                Rejection::DynamicWebhooksDisabled,
                "dynamic_webhooks_disabled",
                401,
            ),
            (
                Rejection::TokenTimestampOutOfTolerance,
                "timestamp_out_of_tolerance",
                401,
            ),
            (Rejection::Token(JwtError::Shape), "jwt_shape", 401),
            (Rejection::Token(JwtError::Base64), "jwt_base64", 401),
            (Rejection::Token(JwtError::Json), "jwt_json", 401),
            (Rejection::Token(JwtError::Alg), "jwt_alg", 401),
            (Rejection::Token(JwtError::Kid), "jwt_missing_kid", 401),
            (
                Rejection::Token(JwtError::UnknownKid),
                "jwt_unknown_kid",
                401,
            ),
            (Rejection::Token(JwtError::Expired), "jwt_expired", 401),
            (
                Rejection::Token(JwtError::NotYetValid),
                "jwt_not_yet_valid",
                401,
            ),
            (Rejection::Token(JwtError::Audience), "jwt_audience", 401),
            (
                Rejection::Token(JwtError::Signature),
                "jwt_signature_invalid",
                401,
            ),
            (
                Rejection::Token(JwtError::KeysUnavailable),
                "jwt_keys_unavailable",
                401,
            ),
            (
                Rejection::KeysUnavailable { retry_after: 5 },
                "jwt_keys_unavailable",
                503,
            ),
            (
                Rejection::StatusUnavailable { retry_after: 60 },
                "v1a_status_unavailable",
                503,
            ),
            (
                Rejection::Signature(SignatureError::V1aInvalid),
                "v1a_signature_invalid",
                401,
            ),
            (
                Rejection::Nudge {
                    unusable: Unusable::NotEnvelope(EnvelopeError::NotJson),
                    delivery_id: id(),
                },
                "jwt_body_not_envelope",
                400,
            ),
            (
                Rejection::Nudge {
                    unusable: Unusable::UnknownType("x".into()),
                    delivery_id: id(),
                },
                "jwt_unknown_event_type",
                200,
            ),
            (
                Rejection::Nudge {
                    unusable: Unusable::BadId(KeyError::Empty),
                    delivery_id: id(),
                },
                "jwt_bad_operation_id",
                400,
            ),
        ];
        for (refusal, reason, code) in table {
            assert_eq!((refusal.reason(), status(&refusal.reply())), (reason, code));
            let line = refusal.log_line().to_value();
            assert_eq!(
                (line["event"].as_str(), line["reason"].as_str()),
                (Some("rejected"), Some(reason))
            );
        }
    }

    // Headers alone.

    #[test]
    fn a_declared_oversized_body_is_refused_first() {
        let headers = Headers {
            content_length: Some(" 1001 "),
            ..Headers::default()
        };
        let e = screen(&headers, NOW_MS, &policy(&[])).unwrap_err();
        assert_eq!((e.reason(), status(&e.reply())), ("body_too_large", 413));
        assert_eq!(
            e.log_line().to_value(),
            json!({"event": "rejected", "reason": "body_too_large", "bytes": 1001})
        );
        // At the cap, or unreadable, the headers decide next.
        let at_cap = Headers {
            content_length: Some("1000"),
            ..Headers::default()
        };
        assert_eq!(
            refusal(screen(&at_cap, NOW_MS, &policy(&[]))),
            ("missing_webhook_id", 401)
        );
    }

    #[test]
    fn a_body_that_streams_past_the_cap_is_413() {
        let e = Rejection::BodyTooLarge(Oversize::Streamed { cap: 1_000 });
        assert_eq!((e.reason(), status(&e.reply())), ("body_too_large", 413));
        assert_eq!(
            e.log_line().to_value(),
            json!({"event": "rejected", "reason": "body_too_large", "bytes": "> 1000"})
        );
    }

    #[test]
    fn missing_hmac_headers_are_401_each_by_name() {
        let full = Headers {
            content_length: None,
            id: Some("msg_1"),
            timestamp: Some("1700000000"),
            signature: Some("v1,AAAA"),
        };
        let p = policy(&[]);
        for (headers, reason) in [
            (Headers { id: None, ..full }, "missing_webhook_id"),
            (
                Headers {
                    timestamp: None,
                    ..full
                },
                "missing_webhook_timestamp",
            ),
            (
                Headers {
                    signature: None,
                    ..full
                },
                "missing_webhook_signature",
            ),
        ] {
            assert_eq!(refusal(screen(&headers, NOW_MS, &p)), (reason, 401));
        }
        assert!(matches!(screen(&full, NOW_MS, &p), Ok(Screened::Hmac(_))));
    }

    #[test]
    fn hmac_timestamps_outside_the_window_are_401() {
        let sig = "v1,AAAA";
        assert_eq!(
            refusal(screen_hmac(&(NOW - 301).to_string(), sig)),
            ("timestamp_too_old", 401)
        );
        assert_eq!(
            refusal(screen_hmac(&(NOW + 301).to_string(), sig)),
            ("timestamp_too_new", 401)
        );
        assert_eq!(refusal(screen_hmac("soon", sig)), ("bad_timestamp", 401));
        assert!(screen_hmac(&(NOW - 300).to_string(), sig).is_ok());
        assert!(screen_hmac(&(NOW + 300).to_string(), sig).is_ok());
    }

    #[test]
    fn a_signature_header_without_v1_is_401() {
        assert_eq!(
            refusal(screen_hmac(&NOW.to_string(), "v2,AAAA")),
            ("no_v1_signature", 401)
        );
    }

    // HMAC over the body.

    #[test]
    fn a_valid_hmac_delivery_is_an_event() {
        let DeliveryKind::Event {
            key,
            event_type,
            event,
        } = hmac_outcome(BODY)
        else {
            panic!("not an event")
        };
        assert_eq!(key.key, "batches/b1");
        assert_eq!(event_type, "batch.succeeded");
        assert_eq!(event.status, Status::Succeeded);
        assert_eq!(event.source, Source::Webhook);
        assert_eq!(event.delivery_id.as_deref(), Some("msg_1"));
    }

    #[test]
    fn a_bad_hmac_is_401_and_nothing_is_kept() {
        let s = secrets();
        let ts = NOW.to_string();
        let sig = sign(b"another body", NOW);
        let headers = Headers {
            id: Some("msg_1"),
            timestamp: Some(&ts),
            signature: Some(&sig),
            ..Headers::default()
        };
        let Ok(Screened::Hmac(checked)) = screen(&headers, NOW_MS, &policy(&s)) else {
            panic!()
        };
        let DeliveryKind::Rejected(e) = classify(Proof::Hmac(checked), BODY, "msg_1", &policy(&s))
        else {
            panic!("not refused")
        };
        assert_eq!((e.reason(), status(&e.reply())), ("signature_invalid", 401));
    }

    #[test]
    fn a_proven_test_delivery_is_a_ping() {
        let ping = br#"{"type":"webhook.ping","data":{}}"#;
        let DeliveryKind::Ping { event_type } = hmac_outcome(ping) else {
            panic!("not a ping: {:?}", hmac_outcome(ping))
        };
        assert_eq!(event_type, "webhook.ping");
        // Signed only by a token, it proves nothing: an unknown type, refused and not kept.
        let DeliveryKind::Rejected(e) = nudge_outcome(good_claims(), ping) else {
            panic!()
        };
        assert_eq!(
            (e.reason(), status(&e.reply())),
            ("jwt_unknown_event_type", 200)
        );
    }

    #[test]
    fn proven_unusable_bodies_are_dead_letters() {
        assert_eq!(
            hmac_outcome(b"not json"),
            DeliveryKind::DeadLetter {
                reason: "not_json",
                reply: Err(Refusal::BadRequest(
                    "not a Gemini envelope: body is not JSON".into()
                ))
            }
        );
        assert_eq!(
            hmac_outcome(br#"{"type":"batch.paused","data":{"id":"batches/b1"}}"#),
            DeliveryKind::DeadLetter {
                reason: "unknown_event_type",
                reply: Ok(Answer::IgnoredUnknownType {
                    event_type: "batch.paused".into()
                })
            }
        );
        let DeliveryKind::DeadLetter { reason, reply } =
            hmac_outcome(br#"{"type":"batch.succeeded","data":{"id":"batches/../x"}}"#)
        else {
            panic!()
        };
        assert_eq!(reason, "bad_operation_id");
        assert_eq!(status(&reply), 400);
        assert!(matches!(reply, Err(Refusal::BadRequest(t)) if t.starts_with("data.id: ")));
    }

    // Tokens.

    #[test]
    fn a_valid_token_vouches_with_its_hash_as_the_id() {
        let s = secrets();
        let t = token(good_claims());
        let Proof::Jwt { claims, token_hash } =
            screen_token(&format!(" {t} "), Some(&NOW.to_string()), &policy(&s)).unwrap()
        else {
            panic!()
        };
        assert_eq!(claims["aud"], "https://hooks.example");
        let digest = Sha256::digest(t.as_bytes());
        let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
        assert_eq!(token_hash, format!("jwt_{hex}"));
    }

    #[test]
    fn tokens_are_refused_when_dynamic_webhooks_are_off() {
        let s = secrets();
        let off = Policy {
            dynamic_webhooks: false,
            ..policy(&s)
        };
        assert_eq!(
            refusal(screen_token(&token(good_claims()), None, &off)),
            ("dynamic_webhooks_disabled", 401)
        );
    }

    #[test]
    fn a_token_webhook_timestamp_shares_the_window() {
        let s = secrets();
        let t = token(good_claims());
        for ts in [NOW - 301, NOW + 301] {
            assert_eq!(
                refusal(screen_token(&t, Some(&ts.to_string()), &policy(&s))),
                ("timestamp_out_of_tolerance", 401)
            );
        }
        assert_eq!(
            refusal(screen_token(&t, Some("x"), &policy(&s))),
            ("bad_timestamp", 401)
        );
        assert!(screen_token(&t, Some(&(NOW + 300).to_string()), &policy(&s)).is_ok());
    }

    #[test]
    fn a_malformed_token_is_refused_before_any_key() {
        let s = secrets();
        let b64 = |v: &str| URL_SAFE_NO_PAD.encode(v);
        let hs256 = format!(
            "{}.{}.{}",
            b64(r#"{"alg":"HS256","kid":"k1"}"#),
            b64("{}"),
            b64("s")
        );
        assert_eq!(
            refusal(screen_token(&hs256, None, &policy(&s))),
            ("jwt_alg", 401)
        );
        assert_eq!(
            refusal(screen_token("a.b!.c", None, &policy(&s))),
            ("jwt_base64", 401)
        );
    }

    #[test]
    fn expired_or_not_yet_valid_tokens_are_401() {
        let s = secrets();
        let p = policy(&s);
        let expired = json!({"exp": NOW - 31, "aud": "https://hooks.example"});
        assert_eq!(
            refusal(screen_token(&token(expired), None, &p)),
            ("jwt_expired", 401)
        );
        let no_exp = json!({"aud": "https://hooks.example"});
        assert_eq!(
            refusal(screen_token(&token(no_exp), None, &p)),
            ("jwt_expired", 401)
        );
        let early = json!({"exp": NOW + 600, "nbf": NOW + 31, "aud": "https://hooks.example"});
        assert_eq!(
            refusal(screen_token(&token(early), None, &p)),
            ("jwt_not_yet_valid", 401)
        );
        let issued_later =
            json!({"exp": NOW + 600, "iat": NOW + 31, "aud": "https://hooks.example"});
        assert_eq!(
            refusal(screen_token(&token(issued_later), None, &p)),
            ("jwt_not_yet_valid", 401)
        );
    }

    #[test]
    fn a_token_for_another_audience_is_401() {
        let s = secrets();
        let other = json!({"exp": NOW + 600, "aud": "https://elsewhere.example"});
        assert_eq!(
            refusal(screen_token(&token(other.clone()), None, &policy(&s))),
            ("jwt_audience", 401)
        );
        // With no audience configured, any audience is accepted.
        let any = Policy {
            audience: None,
            ..policy(&s)
        };
        assert!(screen_token(&token(other), None, &any).is_ok());
    }

    #[test]
    fn keys_that_cannot_be_refreshed_are_503_with_retry_after() {
        let e = Rejection::KeysUnavailable { retry_after: 5 };
        assert_eq!(e.reason(), "jwt_keys_unavailable");
        assert_eq!(e.reply(), Err(Refusal::RetryLater(5)));
        assert_eq!(
            e.log_line().to_value(),
            json!({"event": "rejected", "reason": "jwt_keys_unavailable", "retry_after": 5})
        );
        assert_eq!(
            Rejection::Token(JwtError::Signature).reason(),
            "jwt_signature_invalid"
        );
        assert_eq!(
            Rejection::Token(JwtError::UnknownKid).reply(),
            Err(Refusal::Unauthorized)
        );
    }

    // What a token-signed body is.

    #[test]
    fn a_nudge_forwards_no_metadata_as_verified() {
        let body = br#"{"type":"batch.failed","user_metadata":{"job":"body"},"data":{"id":"b9"}}"#;
        let mut claims = good_claims();
        claims["user_metadata"] = json!({"job": "token"});
        let DeliveryKind::Nudge {
            key,
            claimed,
            metadata,
            event_type,
            delivery_id,
        } = nudge_outcome(claims, body)
        else {
            panic!("not a nudge")
        };
        assert_eq!((key.key.as_str(), claimed), ("batches/b9", Status::Failed));
        assert_eq!(event_type, "batch.failed");
        assert!(delivery_id.starts_with("jwt_"));
        // The token's claim is preferred to the body's, and still unverified: nothing binds
        // it to the operation the body names.
        assert!(metadata.get(USER_METADATA).is_none());
        assert_eq!(metadata[UNVERIFIED_USER_METADATA], json!({"job": "token"}));

        let DeliveryKind::Nudge { metadata, .. } = nudge_outcome(good_claims(), body) else {
            panic!("not a nudge")
        };
        assert!(metadata.get(USER_METADATA).is_none());
        assert_eq!(metadata[UNVERIFIED_USER_METADATA], json!({"job": "body"}));

        let DeliveryKind::Nudge { metadata, .. } = nudge_outcome(good_claims(), BODY) else {
            panic!("not a nudge")
        };
        assert!(metadata.is_empty());
    }

    #[test]
    fn unusable_nudge_bodies_are_refused_never_kept() {
        let DeliveryKind::Rejected(e) = nudge_outcome(good_claims(), b"[1]") else {
            panic!()
        };
        assert_eq!(
            (e.reason(), status(&e.reply())),
            ("jwt_body_not_envelope", 400)
        );
        let line = e.log_line().to_value();
        assert_eq!(line["problem"], "not_object");
        assert!(line["delivery_id"].as_str().unwrap().starts_with("jwt_"));

        let unknown = br#"{"type":"batch.paused","data":{"id":"b1"}}"#;
        let DeliveryKind::Rejected(e) = nudge_outcome(good_claims(), unknown) else {
            panic!()
        };
        assert_eq!(
            (e.reason(), status(&e.reply())),
            ("jwt_unknown_event_type", 200)
        );
        assert_eq!(e.log_line().to_value()["type"], "batch.paused");

        let bad_id = br#"{"type":"batch.succeeded","data":{"id":"batches/a b"}}"#;
        let DeliveryKind::Rejected(e) = nudge_outcome(good_claims(), bad_id) else {
            panic!()
        };
        assert_eq!(
            (e.reason(), status(&e.reply())),
            ("jwt_bad_operation_id", 400)
        );
    }
}
