//! Dynamic-webhook signatures: compact RS256 JWTs in `webhook-signature`, keys from a JWKS.
//!
//! Guarantees (docs/DESIGN.md, invariant 4): everything but the RSA arithmetic is decided here,
//! purely: the token must be three strict base64url parts; its header must say `alg: RS256` exactly
//! (so `none`, HS256 with the public key as secret, and every other algorithm are refused before
//! any key is touched) and carry a `kid`; `exp` is required and must be in the future, `nbf` and
//! `iat` (when present) in the past, within [`LEEWAY_SECS`]; `aud` must contain the configured
//! audience when one is configured. The edge verifies the signature over [`Token::signing_input`]
//! with the key this module selected, through the runtime's WebCrypto.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::{Map, Value};
use thiserror::Error;

/// Clock skew allowed on `exp` and `nbf`.
pub const LEEWAY_SECS: i64 = 30;

/// A parsed, not yet verified token.
#[derive(Debug, Clone, PartialEq)]
pub struct Token {
    pub kid: String,
    pub claims: Map<String, Value>,
    /// `base64url(header) "." base64url(claims)`: the bytes the signature covers.
    pub signing_input: String,
    pub signature: Vec<u8>,
}

/// Why a token was refused (always a 401; the label is logged and counted).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum JwtError {
    #[error("not a compact JWT")]
    Shape,
    #[error("bad base64url")]
    Base64,
    #[error("header or claims are not JSON objects")]
    Json,
    #[error("alg must be RS256")]
    Alg,
    #[error("missing kid")]
    Kid,
    #[error("no key with that kid")]
    UnknownKid,
    #[error("token expired")]
    Expired,
    #[error("token not yet valid")]
    NotYetValid,
    #[error("audience mismatch")]
    Audience,
    #[error("signature invalid")]
    Signature,
    #[error("key set unavailable")]
    KeysUnavailable,
}

impl JwtError {
    /// Short label for logs and counters.
    pub fn label(&self) -> &'static str {
        match self {
            JwtError::Shape => "jwt_shape",
            JwtError::Base64 => "jwt_base64",
            JwtError::Json => "jwt_json",
            JwtError::Alg => "jwt_alg",
            JwtError::Kid => "jwt_missing_kid",
            JwtError::UnknownKid => "jwt_unknown_kid",
            JwtError::Expired => "jwt_expired",
            JwtError::NotYetValid => "jwt_not_yet_valid",
            JwtError::Audience => "jwt_audience",
            JwtError::Signature => "jwt_signature_invalid",
            JwtError::KeysUnavailable => "jwt_keys_unavailable",
        }
    }
}

fn part(text: &str) -> Result<Vec<u8>, JwtError> {
    // Strict: unpadded URL-safe alphabet only, as RFC 7515 requires.
    URL_SAFE_NO_PAD.decode(text).map_err(|_| JwtError::Base64)
}

fn object(bytes: &[u8]) -> Result<Map<String, Value>, JwtError> {
    match serde_json::from_slice(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(JwtError::Json),
    }
}

/// Parses a compact token and checks its header.
pub fn parse(compact: &str) -> Result<Token, JwtError> {
    let parts: Vec<&str> = compact.trim().split('.').collect();
    let [header, claims, signature] = parts.as_slice() else {
        return Err(JwtError::Shape);
    };
    if header.is_empty() || claims.is_empty() || signature.is_empty() {
        return Err(JwtError::Shape);
    }
    let head = object(&part(header)?)?;
    let claims_map = object(&part(claims)?)?;
    let signature_bytes = part(signature)?;
    if head.get("alg").and_then(Value::as_str) != Some("RS256") {
        return Err(JwtError::Alg);
    }
    let kid = match head.get("kid") {
        Some(Value::String(k)) if !k.is_empty() => k.clone(),
        _ => return Err(JwtError::Kid),
    };
    Ok(Token {
        kid,
        claims: claims_map,
        signing_input: format!("{header}.{claims}"),
        signature: signature_bytes,
    })
}

/// Checks `exp` (required: a token without an end would vouch forever), `nbf` and `iat`
/// (neither may lie in the future) and, when configured, `aud`, at `now_secs`.
pub fn check_claims(
    claims: &Map<String, Value>,
    now_secs: i64,
    audience: Option<&str>,
) -> Result<(), JwtError> {
    let exp = claims
        .get("exp")
        .and_then(Value::as_f64)
        .ok_or(JwtError::Expired)?;
    if exp <= now_secs.saturating_sub(LEEWAY_SECS) as f64 {
        return Err(JwtError::Expired);
    }
    for name in ["nbf", "iat"] {
        if let Some(at) = claims.get(name) {
            let at = at.as_f64().ok_or(JwtError::NotYetValid)?;
            if at > now_secs.saturating_add(LEEWAY_SECS) as f64 {
                return Err(JwtError::NotYetValid);
            }
        }
    }
    if let Some(wanted) = audience {
        let ok = match claims.get("aud") {
            Some(Value::String(a)) => a == wanted,
            Some(Value::Array(list)) => list.iter().any(|a| a.as_str() == Some(wanted)),
            _ => false,
        };
        if !ok {
            return Err(JwtError::Audience);
        }
    }
    Ok(())
}

/// An RSA public key from a JWKS, as WebCrypto's `importKey("jwk", ...)` takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RsaJwk {
    pub kid: String,
    pub n: String,
    pub e: String,
}

/// The usable RS256 signing keys of a JWKS document (`{"keys": [...]}`); others are skipped.
pub fn parse_jwks(body: &str) -> Result<Vec<RsaJwk>, JwtError> {
    let value: Value = serde_json::from_str(body).map_err(|_| JwtError::KeysUnavailable)?;
    let keys = value
        .get("keys")
        .and_then(Value::as_array)
        .ok_or(JwtError::KeysUnavailable)?;
    Ok(keys
        .iter()
        .filter(|k| {
            let absent_or = |name: &str, wanted: &str| {
                k.get(name)
                    .and_then(Value::as_str)
                    .is_none_or(|v| v == wanted)
            };
            k["kty"] == "RSA" && absent_or("alg", "RS256") && absent_or("use", "sig")
        })
        .filter_map(|k| {
            let field = |name: &str| k.get(name).and_then(Value::as_str).map(str::to_string);
            Some(RsaJwk {
                kid: field("kid")?,
                n: field("n").filter(|n| part(n).is_ok())?,
                e: field("e").filter(|e| part(e).is_ok())?,
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(v: &str) -> String {
        URL_SAFE_NO_PAD.encode(v)
    }

    fn token(header: &str, claims: &str) -> String {
        format!("{}.{}.{}", b64(header), b64(claims), b64("sig"))
    }

    #[test]
    fn parses_an_rs256_token_with_kid() {
        let t = parse(&token(
            r#"{"alg":"RS256","kid":"k1","typ":"JWT"}"#,
            r#"{"exp":100}"#,
        ))
        .unwrap();
        assert_eq!(t.kid, "k1");
        assert_eq!(t.claims["exp"], 100);
        assert_eq!(t.signature, b"sig");
        assert_eq!(t.signing_input.matches('.').count(), 1);
    }

    #[test]
    fn refuses_every_other_algorithm() {
        for alg in [
            r#""none""#,
            r#""HS256""#,
            r#""RS512""#,
            r#""rs256""#,
            "null",
            "256",
        ] {
            let header = format!(r#"{{"alg":{alg},"kid":"k1"}}"#);
            assert_eq!(parse(&token(&header, "{}")), Err(JwtError::Alg), "{alg}");
        }
        assert_eq!(parse(&token(r#"{"kid":"k1"}"#, "{}")), Err(JwtError::Alg));
    }

    #[test]
    fn refuses_missing_kid() {
        assert_eq!(
            parse(&token(r#"{"alg":"RS256"}"#, "{}")),
            Err(JwtError::Kid)
        );
        assert_eq!(
            parse(&token(r#"{"alg":"RS256","kid":""}"#, "{}")),
            Err(JwtError::Kid)
        );
        assert_eq!(
            parse(&token(r#"{"alg":"RS256","kid":7}"#, "{}")),
            Err(JwtError::Kid)
        );
    }

    #[test]
    fn refuses_bad_shapes_and_base64() {
        assert_eq!(parse("a.b"), Err(JwtError::Shape));
        assert_eq!(parse("a.b.c.d"), Err(JwtError::Shape));
        assert_eq!(parse(".."), Err(JwtError::Shape));
        let good = token(r#"{"alg":"RS256","kid":"k"}"#, "{}");
        let padded = format!("{good}==");
        assert_eq!(parse(&padded), Err(JwtError::Base64));
        let plus = good.replacen('.', "+.", 1);
        assert_eq!(parse(&plus), Err(JwtError::Base64));
        assert_eq!(
            parse(&format!("{}.{}.c2ln", b64("[1]"), b64("{}"))),
            Err(JwtError::Json)
        );
    }

    #[test]
    fn expiry_and_not_before() {
        let claims = |json: &str| object(json.as_bytes()).unwrap();
        assert_eq!(check_claims(&claims(r#"{"exp":1000}"#), 900, None), Ok(()));
        assert_eq!(
            check_claims(&claims(r#"{"exp":1000}"#), 1030, None),
            Err(JwtError::Expired)
        );
        assert_eq!(
            check_claims(&claims(r#"{"exp":"soon"}"#), 0, None),
            Err(JwtError::Expired)
        );
        assert_eq!(
            check_claims(&claims(r#"{"exp":5000,"nbf":1000}"#), 969, None),
            Err(JwtError::NotYetValid)
        );
        assert_eq!(
            check_claims(&claims(r#"{"exp":5000,"nbf":1000}"#), 1000, None),
            Ok(())
        );
        assert_eq!(
            check_claims(&claims("{}"), 0, None),
            Err(JwtError::Expired),
            "exp is required: a token without an end would vouch forever"
        );
    }

    #[test]
    fn issued_in_the_future_is_not_yet_valid() {
        let claims = |json: &str| object(json.as_bytes()).unwrap();
        assert_eq!(
            check_claims(&claims(r#"{"exp":5000,"iat":1100}"#), 1000, None),
            Err(JwtError::NotYetValid)
        );
        assert_eq!(
            check_claims(&claims(r#"{"exp":5000,"iat":1020}"#), 1000, None),
            Ok(()),
            "within the leeway"
        );
        assert_eq!(
            check_claims(&claims(r#"{"exp":5000,"iat":"x"}"#), 1000, None),
            Err(JwtError::NotYetValid)
        );
    }

    #[test]
    fn extreme_times_do_not_overflow() {
        let claims = |json: &str| object(json.as_bytes()).unwrap();
        assert_eq!(
            check_claims(&claims(r#"{"exp":1e300}"#), i64::MIN, None),
            Ok(())
        );
        assert_eq!(
            check_claims(&claims(r#"{"exp":1e300,"iat":1}"#), i64::MAX, None),
            Ok(())
        );
    }

    #[test]
    fn audience_when_configured() {
        let claims = |json: &str| object(json.as_bytes()).unwrap();
        assert_eq!(
            check_claims(&claims(r#"{"exp":9,"aud":"me"}"#), 0, Some("me")),
            Ok(())
        );
        assert_eq!(
            check_claims(&claims(r#"{"exp":9,"aud":["x","me"]}"#), 0, Some("me")),
            Ok(())
        );
        assert_eq!(
            check_claims(&claims(r#"{"exp":9,"aud":"you"}"#), 0, Some("me")),
            Err(JwtError::Audience)
        );
        assert_eq!(
            check_claims(&claims(r#"{"exp":9}"#), 0, Some("me")),
            Err(JwtError::Audience)
        );
        assert_eq!(
            check_claims(&claims(r#"{"exp":9,"aud":"you"}"#), 0, None),
            Ok(())
        );
    }

    #[test]
    fn jwks_keeps_usable_rsa_signing_keys() {
        let body = r#"{"keys":[
            {"kty":"RSA","kid":"a","n":"AQAB","e":"AQAB","alg":"RS256","use":"sig"},
            {"kty":"RSA","kid":"b","n":"AQAB","e":"AQAB"},
            {"kty":"EC","kid":"c","x":"..","y":".."},
            {"kty":"RSA","kid":"d","n":"AQAB","e":"AQAB","alg":"RS512"},
            {"kty":"RSA","kid":"e","n":"AQAB","e":"AQAB","use":"enc"},
            {"kty":"RSA","n":"AQAB","e":"AQAB"},
            {"kty":"RSA","kid":"f","n":"not base64!","e":"AQAB"}]}"#;
        let kids: Vec<String> = parse_jwks(body)
            .unwrap()
            .into_iter()
            .map(|k| k.kid)
            .collect();
        assert_eq!(kids, vec!["a", "b"]);
        assert_eq!(parse_jwks("{}"), Err(JwtError::KeysUnavailable));
        assert_eq!(parse_jwks("<html>"), Err(JwtError::KeysUnavailable));
    }
}
