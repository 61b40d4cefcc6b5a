//! Standard Webhooks signatures: verifying Gemini's (`v1,` HMAC-SHA256 with our secrets, `v1a,`
//! Ed25519 with Google's published keys), signing our side effects (`v1,`).
//!
//! Guarantees (docs/DESIGN.md, invariant 4): the signed bytes are
//! `{webhook-id}.{webhook-timestamp}.{raw body}` exactly as received (verify before parsing,
//! never re-serialize); a header holds space-separated entries of either kind and one valid
//! entry is enough; every `v1,` entry is tried against every configured secret (rotation
//! keeps several valid at once) and every `v1a,` entry against every Ed25519 key given; a
//! decoded signature of the wrong length (32 bytes for `v1`, 64 for `v1a`) never matches and
//! never reaches a key (an empty `v1,` once bypassed a public verifier); HMAC comparison is
//! constant time; Ed25519 is verified strictly (RFC 8032 with canonical `S`, no small-order
//! keys) by `ed25519-compact`, pure Rust, so every case is host-tested; a timestamp outside
//! `now ± tolerance` is refused. The clock is a parameter.

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
        // In pieces, with no copy: this runs for each secret on every signed delivery.
        for piece in [id.as_bytes(), b".", timestamp.as_bytes(), b".", body] {
            mac.update(piece);
        }
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
    #[error("no v1 or v1a signature entry")]
    NoV1Entry,
    #[error("signature invalid")]
    Invalid,
    #[error("v1a signature matches no key of the key set")]
    V1aInvalid,
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
            SignatureError::V1aInvalid => "v1a_signature_invalid",
            SignatureError::JwtUnsupported => "jwt_unsupported",
        }
    }
}

/// True when a `webhook-signature` value has the shape of a compact JWT (dynamic webhooks).
pub fn looks_like_jwt(value: &str) -> bool {
    let value = value.trim();
    !value.starts_with("v1") && value.split('.').count() == 3 && !value.contains(' ')
}

/// Headers that passed [`check_headers`]: present, within the time window, with a `v1,` or
/// `v1a,` entry. Only the body's signature is left to check ([`CheckedHeaders::verify`] for
/// `v1`, [`CheckedHeaders::v1a_message`] then [`V1aMessage::verify`] for `v1a`).
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

/// The shortest retention after which an operation's storage may be deleted without a genuine
/// delivery of it arriving later, and after which an event is too old to be a first delivery:
/// Gemini retries for at most [`SENDER_RETRY_WINDOW_MS`] after its first attempt, which precedes
/// the operation's close, an event's time is at most [`LONGEST_RUN_MS`] before that attempt, and a
/// delivery signed at the end of the window is accepted for `tolerance` more (twice, for a clock
/// ahead by as much), plus slack for a late alarm. A captured delivery replayed later fails its
/// `webhook-timestamp` window whatever the retention.
pub fn replay_floor_ms(tolerance_secs: i64) -> i64 {
    LONGEST_RUN_MS + SENDER_RETRY_WINDOW_MS + 2 * tolerance_secs * 1_000 + ALARM_SLACK_MS
}

/// The one time window for a `webhook-timestamp` (whatever signs the delivery): an integer
/// number of seconds within `now ± tolerance`, saturating at the extremes.
pub fn check_timestamp(text: &str, now_secs: i64, tolerance: i64) -> Result<(), SignatureError> {
    let sent: i64 = text
        .trim()
        .parse()
        .map_err(|_| SignatureError::BadTimestamp)?;
    if sent < now_secs.saturating_sub(tolerance) {
        return Err(SignatureError::TooOld);
    }
    if sent > now_secs.saturating_add(tolerance) {
        return Err(SignatureError::TooNew);
    }
    Ok(())
}

/// Checks what can be checked before the body is read: the three headers are present, the
/// timestamp is within `now ± tolerance`, and the signature header holds at least one `v1,`
/// or `v1a,` entry. A delivery that fails here is refused without reading its body.
pub fn check_headers<'a>(
    headers: SignedHeaders<'a>,
    now_secs: i64,
    tolerance_secs: i64,
) -> Result<CheckedHeaders<'a>, SignatureError> {
    let present = |value: Option<&'a str>, name| value.ok_or(SignatureError::MissingHeader(name));
    let id = present(headers.id, "webhook-id")?;
    let timestamp = present(headers.timestamp, "webhook-timestamp")?;
    let signature = present(headers.signature, "webhook-signature")?;
    check_timestamp(timestamp, now_secs, tolerance_secs)?;
    if looks_like_jwt(signature) {
        return Err(SignatureError::JwtUnsupported);
    }
    let checked = CheckedHeaders {
        id,
        timestamp,
        signature,
    };
    if !checked.has(V1) && !checked.has(V1A) {
        return Err(SignatureError::NoV1Entry);
    }
    Ok(checked)
}

/// The version tag of an HMAC entry (`v1,<base64 of 32 bytes>`).
pub const V1: &str = "v1";
/// The version tag of an Ed25519 entry (`v1a,<base64 of 64 bytes>`).
pub const V1A: &str = "v1a";
/// Length of an HMAC-SHA256 signature.
const V1_LEN: usize = 32;
/// Length of an Ed25519 signature.
const V1A_LEN: usize = 64;
/// The most `v1a,` entries of one header that are checked. Each check hashes the whole body
/// once per key (SHA-512 inside Ed25519), so an unbounded header would let anyone with a fresh
/// timestamp buy hundreds of full-body hashes with one request; a sender signs with one key
/// per entry and rotates through two or three, so four is room to spare.
pub const MAX_V1A_ENTRIES: usize = 4;

impl CheckedHeaders<'_> {
    /// True when the header holds an entry tagged `version`.
    pub fn has(&self, version: &str) -> bool {
        self.signature
            .split_whitespace()
            .any(|entry| entry.split_once(',').is_some_and(|(v, _)| v == version))
    }

    /// The decoded signatures of the entries tagged `version` that have its length; the
    /// others never match, so they never reach a key.
    fn entries(&self, version: &str, len: usize) -> Vec<Vec<u8>> {
        self.signature
            .split_whitespace()
            .filter_map(|entry| match entry.split_once(',') {
                // A header sent twice arrives joined by ", ": tolerate the stray comma.
                Some((v, encoded)) if v == version => decode_base64(encoded.trim_end_matches(',')),
                _ => None,
            })
            // Length first: a short or empty signature must never reach the fold.
            .filter(|given| given.len() == len)
            .collect()
    }

    /// Verifies the body's MAC (`v1,` entries) against every secret.
    pub fn verify(&self, body: &[u8], secrets: &[Secret]) -> Result<(), SignatureError> {
        let expected: Vec<[u8; 32]> = secrets
            .iter()
            .map(|s| s.mac(self.id, self.timestamp, body))
            .collect();
        for given in self.entries(V1, V1_LEN) {
            if expected.iter().any(|mac| bool::from(mac.ct_eq(&given[..]))) {
                return Ok(());
            }
        }
        Err(SignatureError::Invalid)
    }

    /// What a `v1a,` check needs: the signed bytes and the first [`MAX_V1A_ENTRIES`] well-formed
    /// Ed25519 entries. `None` when there is no such entry (none, or each empty, undecodable or not
    /// 64 bytes): that delivery is refused without looking at a key set.
    pub fn v1a_message(&self, body: &[u8]) -> Option<V1aMessage> {
        let signatures: Vec<ed25519_compact::Signature> = self
            .entries(V1A, V1A_LEN)
            .iter()
            .filter_map(|s| ed25519_compact::Signature::from_slice(s).ok())
            .take(MAX_V1A_ENTRIES)
            .collect();
        if signatures.is_empty() {
            return None;
        }
        let pieces = [
            self.id.as_bytes(),
            b".",
            self.timestamp.as_bytes(),
            b".",
            body,
        ];
        let message = pieces.concat();
        Some(V1aMessage {
            message,
            signatures,
        })
    }
}

/// One of Google's Ed25519 public keys (a JWK with `kty: OKP`, `crv: Ed25519`, the 32 key
/// bytes in `x`), for `v1a,` entries.
#[derive(Clone, PartialEq, Eq)]
pub struct Ed25519Key {
    /// The JWK's `kid`, when it has one (logs only: every key is tried).
    pub kid: Option<String>,
    key: ed25519_compact::PublicKey,
}

impl std::fmt::Debug for Ed25519Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ed25519Key({:?})", self.kid)
    }
}

impl Ed25519Key {
    /// The key whose 32 bytes are `x`; `None` for any other length.
    pub fn from_bytes(kid: Option<String>, x: &[u8]) -> Option<Ed25519Key> {
        let key = ed25519_compact::PublicKey::from_slice(x).ok()?;
        Some(Ed25519Key { kid, key })
    }
}

/// The bytes a delivery's `v1a,` entries sign, and those entries: what the key set is asked
/// to vouch for ([`V1aMessage::verify`]).
#[derive(Debug, Clone, PartialEq)]
pub struct V1aMessage {
    /// `{webhook-id}.{webhook-timestamp}.{raw body}`.
    message: Vec<u8>,
    signatures: Vec<ed25519_compact::Signature>,
}

impl V1aMessage {
    /// True when some entry is a valid Ed25519 signature of the message by one of `keys`.
    pub fn verify(&self, keys: &[Ed25519Key]) -> bool {
        self.signatures.iter().any(|signature| {
            keys.iter()
                .any(|k| k.key.verify(&self.message, signature).is_ok())
        })
    }
}

/// Verifies one delivery against every secret. `now_secs` is the receiver's clock. For tests:
/// the intake checks the headers before it reads the body ([`check_headers`]).
#[cfg(test)]
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
        // A `v1a` entry is not HMAC, whatever its bytes.
        let sig = "v1a,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE= v2,AAAA";
        assert_eq!(
            verify(headers(sig), BODY, &secrets(), NOW, 300),
            Err(SignatureError::Invalid)
        );
        assert_eq!(
            verify(headers("v2,AAAA v1x,AAAA"), BODY, &secrets(), NOW, 300),
            Err(SignatureError::NoV1Entry)
        );
    }

    // v1a: Ed25519.

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
            .collect()
    }

    /// RFC 8032, section 7.1, TEST 1, 2 and 3: (public key, message, signature).
    const RFC8032: [(&str, &str, &str); 3] = [
        (
            "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
            "",
            "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
        ),
        (
            "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
            "72",
            "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00",
        ),
        (
            "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025",
            "af82",
            "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a",
        ),
    ];

    /// RFC 8032 TEST 1's secret key: the key `v1a` deliveries are signed with below.
    const SEED: &str = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";

    fn rfc_key(i: usize) -> Ed25519Key {
        Ed25519Key::from_bytes(Some(format!("k{i}")), &hex(RFC8032[i].0)).unwrap()
    }

    fn rfc_message(i: usize) -> V1aMessage {
        let (_, message, signature) = RFC8032[i];
        V1aMessage {
            message: hex(message),
            signatures: vec![ed25519_compact::Signature::from_slice(&hex(signature)).unwrap()],
        }
    }

    /// A `v1a,` entry for `body`, as Gemini signs it (with TEST 1's key).
    fn v1a(id: &str, ts: &str, body: &[u8]) -> String {
        let seed = ed25519_compact::Seed::from_slice(&hex(SEED)).unwrap();
        let pair = ed25519_compact::KeyPair::from_seed(seed);
        let message = [id.as_bytes(), b".", ts.as_bytes(), b".", body].concat();
        format!("v1a,{}", STANDARD.encode(pair.sk.sign(message, None)))
    }

    fn checked(signature: &str) -> CheckedHeaders<'_> {
        check_headers(headers(signature), NOW, 300).unwrap()
    }

    #[test]
    fn only_the_first_v1a_entries_reach_a_key() {
        // Well-formed but wrong entries (signed over another body) fill the cap ...
        let wrong = v1a(ID, TS, b"another body");
        let valid = v1a(ID, TS, BODY);
        let padded = |n: usize| {
            let mut entries = vec![wrong.clone(); n];
            entries.push(valid.clone());
            entries.join(" ")
        };
        let h = padded(MAX_V1A_ENTRIES - 1);
        let message = checked(&h).v1a_message(BODY).unwrap();
        assert!(
            message.verify(&[rfc_key(0)]),
            "within the cap, the valid entry counts"
        );
        // ... and more push the valid entry past it: 200 entries cost four checks a key.
        let h = padded(200);
        let message = checked(&h).v1a_message(BODY).unwrap();
        assert_eq!(message.signatures.len(), MAX_V1A_ENTRIES);
        assert!(!message.verify(&[rfc_key(0)]));
    }

    #[test]
    fn rfc8032_vectors_verify() {
        for i in 0..RFC8032.len() {
            assert!(rfc_message(i).verify(&[rfc_key(i)]), "TEST {}", i + 1);
        }
    }

    #[test]
    fn rfc8032_vectors_fail_with_another_key_or_message() {
        for i in 0..RFC8032.len() {
            let other = rfc_key((i + 1) % RFC8032.len());
            assert!(
                !rfc_message(i).verify(&[other]),
                "TEST {} with another key",
                i + 1
            );
            let mut changed = rfc_message(i);
            changed.message.push(0);
            assert!(
                !changed.verify(&[rfc_key(i)]),
                "TEST {} with another message",
                i + 1
            );
        }
        assert!(!rfc_message(0).verify(&[]), "no key, no match");
    }

    #[test]
    fn a_v1a_entry_verifies_over_id_timestamp_and_body() {
        let sig = v1a(ID, TS, BODY);
        let message = checked(&sig).v1a_message(BODY).unwrap();
        assert!(message.verify(&[rfc_key(0)]));
        // Unpadded base64 is accepted, as for v1.
        let sig = sig.trim_end_matches('=').to_string();
        assert!(checked(&sig)
            .v1a_message(BODY)
            .unwrap()
            .verify(&[rfc_key(0)]));
    }

    #[test]
    fn a_v1a_entry_with_a_wrong_key_or_body_fails() {
        let sig = v1a(ID, TS, BODY);
        let message = checked(&sig).v1a_message(BODY).unwrap();
        assert!(!message.verify(&[rfc_key(1), rfc_key(2)]), "wrong key");
        let other_body = checked(&sig)
            .v1a_message(br#"{"test": 2432232315}"#)
            .unwrap();
        assert!(!other_body.verify(&[rfc_key(0)]), "wrong body");
        // The id and timestamp are signed too.
        let other_ts = v1a(ID, "1614265331", BODY);
        assert!(!checked(&other_ts)
            .v1a_message(BODY)
            .unwrap()
            .verify(&[rfc_key(0)]));
    }

    #[test]
    fn empty_short_and_undecodable_v1a_entries_never_reach_a_key() {
        let good = v1a(ID, TS, BODY);
        let bytes = STANDARD.decode(&good[4..]).unwrap();
        let short = format!("v1a,{}", STANDARD.encode(&bytes[..63]));
        let long = format!("v1a,{}", STANDARD.encode([&bytes[..], &[0]].concat()));
        for sig in ["v1a,", "v1a,AA==", "v1a,not base64!", &short, &long] {
            assert_eq!(checked(sig).v1a_message(BODY), None, "{sig}");
        }
        // And not as HMAC either.
        assert_eq!(
            checked("v1a,").verify(BODY, &secrets()),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn mixed_headers_match_on_either_kind() {
        let ed = v1a(ID, TS, BODY);
        let bad_v1 = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OA=";
        // A good v1 among bad v1a entries: the HMAC matches.
        let header = format!("v1a,AAAA v1a,{} {SIG}", &ed[4..ed.len() - 4]);
        assert_eq!(checked(&header).verify(BODY, &secrets()), Ok(()));
        // A good v1a among bad v1 and short v1a entries: the Ed25519 check matches.
        let header = format!("{bad_v1} v1a, {ed} v1,AA==");
        assert_eq!(
            checked(&header).verify(BODY, &secrets()),
            Err(SignatureError::Invalid)
        );
        let message = checked(&header).v1a_message(BODY).unwrap();
        assert_eq!(message.signatures.len(), 1, "only the well-formed entry");
        assert!(message.verify(&[rfc_key(2), rfc_key(0)]));
        // Several v1a entries, one of them valid; a header sent twice (", ").
        let forged = v1a(ID, TS, b"another body");
        let header = format!("{forged}, {ed}");
        assert!(checked(&header)
            .v1a_message(BODY)
            .unwrap()
            .verify(&[rfc_key(0)]));
    }

    #[test]
    fn a_v1a_only_header_passes_the_header_check() {
        let h = checked("v1a,AAAA");
        assert!(h.has(V1A) && !h.has(V1));
        assert!(!checked(SIG).has(V1A));
    }

    #[test]
    fn an_ed25519_key_is_32_bytes() {
        assert!(Ed25519Key::from_bytes(None, &[7; 32]).is_some());
        assert!(Ed25519Key::from_bytes(None, &[7; 31]).is_none());
        assert!(Ed25519Key::from_bytes(None, &[]).is_none());
        assert_eq!(format!("{:?}", rfc_key(0)), "Ed25519Key(Some(\"k0\"))");
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
