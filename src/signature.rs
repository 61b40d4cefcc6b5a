//! Standard Webhooks HMAC-SHA256 signatures: verifying Gemini's, signing our side effects.
//!
//! Guarantees (docs/DESIGN.md, invariant 4): the signed bytes are
//! `{webhook-id}.{webhook-timestamp}.{raw body}` exactly as received (verify before parsing,
//! never re-serialize); every `v1,` entry is tried against every configured secret (rotation
//! keeps several valid at once); a decoded signature that is not 32 bytes never matches (an
//! empty `v1,` once bypassed a public verifier); comparison is constant time; a timestamp
//! outside `now ± tolerance` is refused. The clock is a parameter.

use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;
use thiserror::Error;

type HmacSha256 = Hmac<Sha256>;

/// Prefix of a Standard Webhooks secret.
pub const SECRET_PREFIX: &str = "whsec_";

/// A signing key, decoded from its `whsec_` form.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    // Never print key material, not even in a debug dump of the configuration.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Why a `whsec_` secret could not be used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SecretError {
    #[error("secret does not start with whsec_")]
    MissingPrefix,
    #[error("secret is not valid base64 after whsec_")]
    BadBase64,
    #[error("secret decodes to no bytes")]
    Empty,
}

impl Secret {
    /// Parses `whsec_<base64>` (padded or not).
    pub fn parse(text: &str) -> Result<Secret, SecretError> {
        let encoded = text
            .trim()
            .strip_prefix(SECRET_PREFIX)
            .ok_or(SecretError::MissingPrefix)?;
        let bytes = decode_base64(encoded).ok_or(SecretError::BadBase64)?;
        if bytes.is_empty() {
            return Err(SecretError::Empty);
        }
        Ok(Secret(bytes))
    }

    fn mac(&self, id: &str, timestamp: &str, body: &[u8]) -> [u8; 32] {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.as_bytes());
        mac.update(b".");
        mac.update(body);
        mac.finalize().into_bytes().into()
    }
}

fn decode_base64(text: &str) -> Option<Vec<u8>> {
    STANDARD
        .decode(text)
        .or_else(|_| STANDARD_NO_PAD.decode(text))
        .ok()
}

/// The three Standard Webhooks headers of one delivery, as received.
#[derive(Debug, Clone, Copy)]
pub struct SignedHeaders<'a> {
    pub id: Option<&'a str>,
    pub timestamp: Option<&'a str>,
    pub signature: Option<&'a str>,
}

/// Why a delivery's signature was refused. The label is logged and counted; the sender only
/// ever sees a bare 401.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum SignatureError {
    #[error("missing header {0}")]
    MissingHeader(&'static str),
    #[error("timestamp is not an integer")]
    BadTimestamp,
    #[error("timestamp too old")]
    TooOld,
    #[error("timestamp too new")]
    TooNew,
    #[error("no v1 signature entry")]
    NoV1Entry,
    #[error("signature invalid")]
    Invalid,
    #[error("signature header is a JWT, which this deployment does not verify")]
    JwtUnsupported,
}

impl SignatureError {
    /// Short label for logs and counters.
    pub fn label(self) -> &'static str {
        match self {
            SignatureError::MissingHeader("webhook-id") => "missing_webhook_id",
            SignatureError::MissingHeader("webhook-timestamp") => "missing_webhook_timestamp",
            SignatureError::MissingHeader(_) => "missing_webhook_signature",
            SignatureError::BadTimestamp => "bad_timestamp",
            SignatureError::TooOld => "timestamp_too_old",
            SignatureError::TooNew => "timestamp_too_new",
            SignatureError::NoV1Entry => "no_v1_signature",
            SignatureError::Invalid => "signature_invalid",
            SignatureError::JwtUnsupported => "jwt_unsupported",
        }
    }
}

/// True when a `webhook-signature` value has the shape of a compact JWT (dynamic webhooks).
pub fn looks_like_jwt(value: &str) -> bool {
    let value = value.trim();
    !value.starts_with("v1") && value.split('.').count() == 3 && !value.contains(' ')
}

/// Headers that passed [`check_headers`]: present, within the time window, with a `v1,`
/// entry. Only the body's MAC is left to check ([`CheckedHeaders::verify`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckedHeaders<'a> {
    id: &'a str,
    timestamp: &'a str,
    signature: &'a str,
}

/// How long Gemini retries a delivery after its first attempt (GEMINI_WEBHOOKS.md §1).
pub const SENDER_RETRY_WINDOW_MS: i64 = 24 * 3_600_000;

/// The longest a Gemini operation runs: a batch not finished within 48 hours expires
/// (GEMINI_WEBHOOKS.md §2). The envelope's `timestamp` is not documented as the event's own
/// time; should it be when the operation began, a genuine first delivery is still at most
/// this plus the retries old.
pub const LONGEST_RUN_MS: i64 = 48 * 3_600_000;

/// Slack for a gate's alarm firing late.
const ALARM_SLACK_MS: i64 = 10 * 60_000;

/// The shortest retention after which an operation's storage may be deleted without a
/// genuine delivery of it arriving later, and after which an event is too old to be a first
/// delivery: Gemini retries for at most [`SENDER_RETRY_WINDOW_MS`] after its first attempt,
/// which precedes the operation's close, an event's time is at most [`LONGEST_RUN_MS`]
/// before that attempt, and a delivery signed at the end of the window is accepted for
/// `tolerance` more (twice, for a clock ahead by as much), plus slack for a late alarm. A
/// captured delivery replayed later fails its `webhook-timestamp` window whatever the
/// retention.
pub fn replay_floor_ms(tolerance_secs: i64) -> i64 {
    LONGEST_RUN_MS + SENDER_RETRY_WINDOW_MS + 2 * tolerance_secs * 1_000 + ALARM_SLACK_MS
}

/// The one time window for a `webhook-timestamp` (whatever signs the delivery): an integer
/// number of seconds within `now ± tolerance`, saturating at the extremes.
pub fn check_timestamp(
    timestamp: &str,
    now_secs: i64,
    tolerance_secs: i64,
) -> Result<(), SignatureError> {
    let sent: i64 = timestamp
        .trim()
        .parse()
        .map_err(|_| SignatureError::BadTimestamp)?;
    if sent < now_secs.saturating_sub(tolerance_secs) {
        return Err(SignatureError::TooOld);
    }
    if sent > now_secs.saturating_add(tolerance_secs) {
        return Err(SignatureError::TooNew);
    }
    Ok(())
}

/// Checks what can be checked before the body is read: the three headers are present, the
/// timestamp is within `now ± tolerance`, and the signature header holds at least one `v1,`
/// entry. A delivery that fails here is refused without reading its body.
pub fn check_headers(
    headers: SignedHeaders<'_>,
    now_secs: i64,
    tolerance_secs: i64,
) -> Result<CheckedHeaders<'_>, SignatureError> {
    let id = headers
        .id
        .ok_or(SignatureError::MissingHeader("webhook-id"))?;
    let timestamp = headers
        .timestamp
        .ok_or(SignatureError::MissingHeader("webhook-timestamp"))?;
    let signature = headers
        .signature
        .ok_or(SignatureError::MissingHeader("webhook-signature"))?;
    check_timestamp(timestamp, now_secs, tolerance_secs)?;
    if looks_like_jwt(signature) {
        return Err(SignatureError::JwtUnsupported);
    }
    if !signature
        .split_whitespace()
        .any(|entry| entry.starts_with("v1,"))
    {
        return Err(SignatureError::NoV1Entry);
    }
    Ok(CheckedHeaders {
        id,
        timestamp,
        signature,
    })
}

impl CheckedHeaders<'_> {
    /// Verifies the body's MAC against every secret.
    pub fn verify(&self, body: &[u8], secrets: &[Secret]) -> Result<(), SignatureError> {
        let expected: Vec<[u8; 32]> = secrets
            .iter()
            .map(|s| s.mac(self.id, self.timestamp, body))
            .collect();
        for entry in self.signature.split_whitespace() {
            let Some(("v1", encoded)) = entry.split_once(',') else {
                continue;
            };
            // A header sent twice arrives joined by ", ": tolerate the stray comma.
            let Some(given) = decode_base64(encoded.trim_end_matches(',')) else {
                continue;
            };
            // Length first: a short or empty signature must never reach the fold.
            if given.len() != 32 {
                continue;
            }
            if expected.iter().any(|mac| bool::from(mac.ct_eq(&given[..]))) {
                return Ok(());
            }
        }
        Err(SignatureError::Invalid)
    }
}

/// Verifies one delivery against every secret. `now_secs` is the receiver's clock.
pub fn verify(
    headers: SignedHeaders<'_>,
    body: &[u8],
    secrets: &[Secret],
    now_secs: i64,
    tolerance_secs: i64,
) -> Result<(), SignatureError> {
    check_headers(headers, now_secs, tolerance_secs)?.verify(body, secrets)
}

/// Signs `body` the way Standard Webhooks senders do: returns the `webhook-signature` value.
pub fn sign(secret: &Secret, id: &str, timestamp_secs: i64, body: &[u8]) -> String {
    let mac = secret.mac(id, &timestamp_secs.to_string(), body);
    format!("v1,{}", STANDARD.encode(mac))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const TS: &str = "1614265330";
    const BODY: &[u8] = br#"{"test": 2432232314}"#;
    const SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
    const NOW: i64 = 1614265330;

    #[test]
    fn the_replay_floor_outlasts_the_sender_s_retries_and_the_window() {
        assert_eq!(
            replay_floor_ms(300),
            2 * 86_400_000 + 86_400_000 + 600_000 + 600_000,
            "48 h of a run, 24 h of retries, twice the tolerance, the alarm's slack"
        );
        assert!(replay_floor_ms(0) > SENDER_RETRY_WINDOW_MS);
    }

    fn headers<'a>(sig: &'a str) -> SignedHeaders<'a> {
        SignedHeaders {
            id: Some(ID),
            timestamp: Some(TS),
            signature: Some(sig),
        }
    }

    fn secrets() -> Vec<Secret> {
        vec![Secret::parse(SECRET).unwrap()]
    }

    #[test]
    fn headers_are_checked_without_the_body() {
        let ok = SignedHeaders {
            id: Some("msg_1"),
            timestamp: Some("1000"),
            signature: Some("v1,AAAA"),
        };
        assert!(check_headers(ok, 1_000, 300).is_ok());
        let no_v1 = SignedHeaders {
            signature: Some("v2,AAAA"),
            ..ok
        };
        assert_eq!(
            check_headers(no_v1, 1_000, 300),
            Err(SignatureError::NoV1Entry)
        );
        let stale = SignedHeaders {
            timestamp: Some("100"),
            ..ok
        };
        assert_eq!(
            check_headers(stale, 1_000, 300),
            Err(SignatureError::TooOld)
        );
        let missing = SignedHeaders { id: None, ..ok };
        assert_eq!(
            check_headers(missing, 1_000, 300),
            Err(SignatureError::MissingHeader("webhook-id"))
        );
    }

    #[test]
    fn extreme_timestamps_do_not_overflow() {
        let far = SignedHeaders {
            id: Some("msg_1"),
            timestamp: Some("-9223372036854775808"),
            signature: Some("v1,AAAA"),
        };
        assert_eq!(
            check_headers(far, i64::MAX, i64::MAX),
            Err(SignatureError::TooOld)
        );
        assert_eq!(check_headers(far, 0, 300), Err(SignatureError::TooOld));
        let future = SignedHeaders {
            timestamp: Some("9223372036854775807"),
            ..far
        };
        assert_eq!(
            check_headers(future, i64::MIN, 300),
            Err(SignatureError::TooNew)
        );
    }

    #[test]
    fn published_vector_verifies() {
        assert_eq!(verify(headers(SIG), BODY, &secrets(), NOW, 300), Ok(()));
    }

    #[test]
    fn published_negative_fails() {
        let bad = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OA=";
        assert_eq!(
            verify(headers(bad), BODY, &secrets(), NOW, 300),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn sign_reproduces_published_vector() {
        assert_eq!(sign(&secrets()[0], ID, NOW, BODY), SIG);
    }

    #[test]
    fn changed_body_fails() {
        assert_eq!(
            verify(
                headers(SIG),
                br#"{"test": 2432232315}"#,
                &secrets(),
                NOW,
                300
            ),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn each_missing_header_fails() {
        let mut h = headers(SIG);
        h.id = None;
        assert_eq!(
            verify(h, BODY, &secrets(), NOW, 300),
            Err(SignatureError::MissingHeader("webhook-id"))
        );
        let mut h = headers(SIG);
        h.timestamp = None;
        assert_eq!(
            verify(h, BODY, &secrets(), NOW, 300),
            Err(SignatureError::MissingHeader("webhook-timestamp"))
        );
        let mut h = headers(SIG);
        h.signature = None;
        assert_eq!(
            verify(h, BODY, &secrets(), NOW, 300),
            Err(SignatureError::MissingHeader("webhook-signature"))
        );
    }

    #[test]
    fn too_old_and_too_new_fail_at_the_boundary() {
        assert_eq!(
            verify(headers(SIG), BODY, &secrets(), NOW + 300, 300),
            Ok(())
        );
        assert_eq!(
            verify(headers(SIG), BODY, &secrets(), NOW + 301, 300),
            Err(SignatureError::TooOld)
        );
        assert_eq!(
            verify(headers(SIG), BODY, &secrets(), NOW - 300, 300),
            Ok(())
        );
        assert_eq!(
            verify(headers(SIG), BODY, &secrets(), NOW - 301, 300),
            Err(SignatureError::TooNew)
        );
    }

    #[test]
    fn non_integer_timestamp_fails() {
        let mut h = headers(SIG);
        h.timestamp = Some("16142653.30");
        assert_eq!(
            verify(h, BODY, &secrets(), NOW, 300),
            Err(SignatureError::BadTimestamp)
        );
    }

    #[test]
    fn empty_and_short_signatures_never_match() {
        for sig in [
            "v1,",
            "v1,AA==",
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1O",
            "v1,not base64!",
        ] {
            assert_eq!(
                verify(headers(sig), BODY, &secrets(), NOW, 300),
                Err(SignatureError::Invalid),
                "{sig}"
            );
        }
    }

    #[test]
    fn other_versions_are_skipped() {
        let sig = "v1a,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
        assert_eq!(
            verify(headers(sig), BODY, &secrets(), NOW, 300),
            Err(SignatureError::NoV1Entry)
        );
    }

    #[test]
    fn one_matching_entry_among_several_is_enough() {
        let sig = format!("v1a,xyz v1,AAAA {SIG} v1,bm9wZQ==");
        assert_eq!(verify(headers(&sig), BODY, &secrets(), NOW, 300), Ok(()));
    }

    #[test]
    fn any_of_several_secrets_matches() {
        let mut all = vec![Secret::parse("whsec_b3RoZXJzZWNyZXQ=").unwrap()];
        all.extend(secrets());
        assert_eq!(verify(headers(SIG), BODY, &all, NOW, 300), Ok(()));
        assert_eq!(
            verify(headers(SIG), BODY, &all[..1], NOW, 300),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn unpadded_signature_and_secret_are_accepted() {
        let sig = SIG.trim_end_matches('=');
        assert_eq!(verify(headers(sig), BODY, &secrets(), NOW, 300), Ok(()));
        assert!(Secret::parse("whsec_b3RoZXJzZWNyZXQ").is_ok());
    }

    #[test]
    fn jwt_shaped_header_is_told_apart() {
        assert!(looks_like_jwt("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"));
        assert!(!looks_like_jwt(SIG));
        assert_eq!(
            verify(
                headers("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"),
                BODY,
                &secrets(),
                NOW,
                300
            ),
            Err(SignatureError::JwtUnsupported)
        );
    }

    #[test]
    fn bad_secrets_are_refused() {
        assert_eq!(
            Secret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap_err(),
            SecretError::MissingPrefix
        );
        assert_eq!(
            Secret::parse("whsec_!!!").unwrap_err(),
            SecretError::BadBase64
        );
        assert_eq!(Secret::parse("whsec_").unwrap_err(), SecretError::Empty);
    }

    #[test]
    fn debug_never_shows_key_material() {
        assert_eq!(format!("{:?}", secrets()[0]), "Secret(..)");
    }
}
