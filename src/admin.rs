//! The admin API's pure parts: bearer-token check and request bodies.
//!
//! Guarantees: the token is compared in constant time (its length is not secret, its bytes
//! are); a registration body is refused with a reason, never half-accepted.

use serde::Deserialize;
use subtle::ConstantTimeEq;
use thiserror::Error;

use crate::key::{normalize, KeyError, OperationKey, MAX_NAME_BYTES};

/// Longest accepted `kind`.
pub const MAX_KIND_BYTES: usize = 100;

/// True when `authorization` is `Bearer <token>` for the configured token.
pub fn authorized(authorization: Option<&str>, token: &str) -> bool {
    let Some(given) = authorization.and_then(|h| h.strip_prefix("Bearer ")) else {
        return false;
    };
    given.len() == token.len() && bool::from(given.as_bytes().ct_eq(token.as_bytes()))
}

#[derive(Deserialize)]
struct RegisterBody {
    name: Option<String>,
    kind: Option<String>,
}

/// A valid registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub key: OperationKey,
    pub kind: Option<String>,
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
}

/// Parses `{"name": "batches/abc", "kind": "nightly-review"}`.
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
    Ok(Registration { key, kind })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_token_must_match_exactly() {
        assert!(authorized(Some("Bearer s3cret"), "s3cret"));
        assert!(!authorized(Some("Bearer s3creT"), "s3cret"));
        assert!(!authorized(Some("Bearer s3cret2"), "s3cret"));
        assert!(!authorized(Some("Bearer "), "s3cret"));
        assert!(!authorized(Some("s3cret"), "s3cret"));
        assert!(!authorized(Some("Basic s3cret"), "s3cret"));
        assert!(!authorized(None, "s3cret"));
    }

    #[test]
    fn registration_normalizes_the_name() {
        let r = parse_registration(br#"{"name":" batches/abc/","kind":"nightly-review"}"#).unwrap();
        assert_eq!(r.key.key, "batches/abc");
        assert_eq!(r.kind.as_deref(), Some("nightly-review"));
        let r = parse_registration(br#"{"name":"batches/abc"}"#).unwrap();
        assert_eq!(r.kind, None);
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
        ];
        for (body, want) in cases {
            assert_eq!(parse_registration(&body).unwrap_err(), want);
        }
    }
}
