//! Who may do what through the admin API: bearer tokens by scope, the scope each route
//! needs, and the fingerprint that names a token in logs and history.
//!
//! Three scopes, so that no caller holds more power than its job needs:
//!
//! | scope | may |
//! |---|---|
//! | `register` | `POST /v1/operations`, and `GET /v1/operations/{name}` (the job it submitted) |
//! | `read` | every `GET` (and `HEAD`) under `/v1/`: the listing, one operation, counters, configuration, `whoami`; and `GET /metrics` |
//! | `admin` | everything: the above and every action (retry, redeliver, settle, forget, repair, bulk) |
//!
//! Guarantees: a request's route is classified by its method and path alone ([`Route::of`]),
//! mirroring the admin router's own split, so a request that changes nothing is all a `read`
//! token can make; a `GET` never acts. A presented token is compared in constant time with
//! every configured token of every scope (no early exit; lengths are not secret, bytes are);
//! a token configured in two scopes, or a scope token equal to the admin token, is refused as
//! configuration ([`Overlap`]), never quietly given the wider power. A token is known in logs,
//! history rows and answers only by its [`fingerprint`]: the first 8 hex digits of a SHA-256,
//! from which the token cannot be recovered.

use serde::Serialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use thiserror::Error;

use crate::operation::Actor;

/// A token shorter than this is accepted but warned about (`/healthz`): a generated token is
/// 43 characters, and a list split on whitespace turns a passphrase into several short ones.
pub const MIN_TOKEN_CHARS: usize = 16;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Register operations as jobs are submitted, and read one back.
    Register,
    /// Read everything, change nothing.
    Read,
    /// Everything.
    Admin,
}

impl Scope {
    /// The scope's name in answers, logs and the OpenAPI document.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Register => "register",
            Scope::Read => "read",
            Scope::Admin => "admin",
        }
    }

    /// The variable that holds this scope's tokens.
    pub fn setting(self) -> &'static str {
        match self {
            Scope::Register => "REGISTER_TOKENS",
            Scope::Read => "READ_TOKENS",
            Scope::Admin => "ADMIN_TOKEN",
        }
    }

    /// Whether a token of this scope may make a request of `route`.
    pub fn may(self, route: Route) -> bool {
        match self {
            Scope::Admin => true,
            Scope::Read => matches!(route, Route::Inspect | Route::Read),
            Scope::Register => matches!(route, Route::Register | Route::Inspect),
        }
    }
}

/// What a request under `/v1/` (or to `/metrics`) does, as far as access is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `POST /v1/operations`: register an operation.
    Register,
    /// A read of one operation (`GET /v1/operations/{name}`).
    Inspect,
    /// Any other read: a `GET` or `HEAD` (the listing, counters, configuration, whoami).
    Read,
    /// Anything else: an operator's action, or a request no route takes (a `POST` to an
    /// unknown path is refused by scope before it is found missing).
    Act,
}

/// The collection route the admin router serves: `/v1/operations`, then nothing, or a `/`
/// and the rest (an operation's name and an action).
const OPERATIONS: &str = "/v1/operations";

impl Route {
    /// The route of a request under `/v1/`: `method` as the router reads it (`GET`, `POST`,
    /// ...), `path` the URL's path. The split is the router's: the path after
    /// `/v1/operations` with its leading slashes trimmed is the collection when empty and an
    /// operation otherwise.
    pub fn of(method: &str, path: &str) -> Route {
        let operation = path
            .strip_prefix(OPERATIONS)
            .filter(|rest| rest.is_empty() || rest.starts_with('/'))
            .map(|rest| rest.trim_start_matches('/'));
        match (method, operation) {
            ("POST", Some("")) => Route::Register,
            ("GET", Some(name)) if !name.is_empty() => Route::Inspect,
            ("GET" | "HEAD", _) => Route::Read,
            _ => Route::Act,
        }
    }

    /// The narrowest scope that may make this request (an admin token always may).
    pub fn needs(self) -> Scope {
        match self {
            Route::Register | Route::Inspect => Scope::Register,
            Route::Read => Scope::Read,
            Route::Act => Scope::Admin,
        }
    }
}

/// The short, non-secret name of a token: the first 8 hex digits of
/// SHA-256(`gemini-once:` + token). An operator computes it with
/// `printf 'gemini-once:%s' "$TOKEN" | sha256sum | cut -c1-8`.
pub fn fingerprint(token: &str) -> String {
    let digest = Sha256::new()
        .chain_update(b"gemini-once:")
        .chain_update(token.as_bytes())
        .finalize();
    digest[..4].iter().map(|b| format!("{b:02x}")).collect()
}

/// One configured token; `Debug` shows its fingerprint only.
#[derive(Clone)]
struct Token {
    secret: String,
    fingerprint: String,
}

impl Token {
    fn new(secret: String) -> Token {
        let fingerprint = fingerprint(&secret);
        Token {
            secret,
            fingerprint,
        }
    }

    fn matches(&self, given: &str) -> bool {
        given.len() == self.secret.len()
            && bool::from(given.as_bytes().ct_eq(self.secret.as_bytes()))
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token({})", self.fingerprint)
    }
}

/// Why a token list was refused; names no token.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TokenError {
    #[error("holds a character a bearer token cannot carry (tokens are visible ASCII, separated by whitespace)")]
    Unprintable,
}

/// Splits a token list (`ADMIN_TOKEN`, `REGISTER_TOKENS`, `READ_TOKENS`): tokens separated
/// by whitespace, each made of visible ASCII (what an `Authorization` header carries). A
/// token repeated in one list counts once.
pub fn parse_list(text: &str) -> Result<Vec<String>, TokenError> {
    let mut tokens: Vec<String> = Vec::new();
    for token in text.split_whitespace() {
        if !token.chars().all(|c| c.is_ascii_graphic()) {
            return Err(TokenError::Unprintable);
        }
        if !tokens.iter().any(|t| t == token) {
            tokens.push(token.to_string());
        }
    }
    Ok(tokens)
}

/// A token configured in two scopes: `setting` (the later of the two in the table of
/// variables) also holds a token of `other`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("a token is also in {}: a token has one scope (generate another one)", .other.setting())]
pub struct Overlap {
    pub setting: Scope,
    pub other: Scope,
}

/// Every configured token, by scope; `Debug` shows fingerprints only.
#[derive(Debug, Clone)]
pub struct Tokens {
    entries: Vec<(Scope, Token)>,
}

/// Who made a request: the scope of the token presented and its fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Caller {
    pub scope: Scope,
    pub fingerprint: String,
}

impl Caller {
    /// The caller as the gate records it in a history row.
    pub fn actor(&self) -> Actor {
        let (scope, fingerprint) = (self.scope.as_str().to_string(), self.fingerprint.clone());
        Actor { scope, fingerprint }
    }
}

/// What the admin API does with a request, before routing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// A known token whose scope may make this request.
    Admitted(Caller),
    /// No token, not a bearer token, or one that is not configured: 401.
    Unknown,
    /// A known token whose scope may not make this request: 403, naming the scope it needs.
    Forbidden { caller: Caller, needs: Scope },
}

impl Tokens {
    /// The tokens of each scope. Refused when one token is in two scopes: the narrower
    /// scope's setting is named (`REGISTER_TOKENS` or `READ_TOKENS`), since the admin token
    /// is the one that was there before.
    pub fn new(
        admin: Vec<String>,
        register: Vec<String>,
        read: Vec<String>,
    ) -> Result<Tokens, Overlap> {
        let mut entries: Vec<(Scope, Token)> = Vec::new();
        for (scope, list) in [
            (Scope::Admin, admin),
            (Scope::Register, register),
            (Scope::Read, read),
        ] {
            for secret in list {
                if let Some((other, _)) = entries.iter().find(|(_, t)| t.secret == secret) {
                    let (setting, other) = (scope, *other);
                    return Err(Overlap { setting, other });
                }
                entries.push((scope, Token::new(secret)));
            }
        }
        Ok(Tokens { entries })
    }

    /// The scopes holding a token shorter than [`MIN_TOKEN_CHARS`], each once.
    pub fn short(&self) -> Vec<Scope> {
        let mut scopes: Vec<Scope> = self
            .entries
            .iter()
            .filter(|(_, t)| t.secret.chars().count() < MIN_TOKEN_CHARS)
            .map(|(s, _)| *s)
            .collect();
        scopes.sort();
        scopes.dedup();
        scopes
    }

    /// The caller whose token `authorization` (`Bearer <token>`) presents, if it is one of
    /// them. Every configured token is compared, whichever matches.
    pub fn identify(&self, authorization: Option<&str>) -> Option<Caller> {
        let given = authorization?.strip_prefix("Bearer ")?;
        let matching = self.entries.iter().filter(|(_, t)| t.matches(given));
        // Every entry is compared (no early exit); the last match is the caller.
        let (scope, token) = matching.fold(None, |_, m| Some(m))?;
        let (scope, fingerprint) = (*scope, token.fingerprint.clone());
        Some(Caller { scope, fingerprint })
    }

    /// Whether a request (`method`, `path` under `/v1/`) with this `authorization` may go on.
    pub fn admit(&self, authorization: Option<&str>, method: &str, path: &str) -> Admission {
        let Some(caller) = self.identify(authorization) else {
            return Admission::Unknown;
        };
        let route = Route::of(method, path);
        let needs = route.needs();
        if !caller.scope.may(route) {
            return Admission::Forbidden { caller, needs };
        }
        Admission::Admitted(caller)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADMIN: &str = "admin-token-0123456789";
    const REGISTER: &str = "register-token-0123456789";
    const READ: &str = "read-token-0123456789";

    fn tokens() -> Tokens {
        Tokens::new(
            vec![ADMIN.into()],
            vec![REGISTER.into(), "register-token-next-0123".into()],
            vec![READ.into()],
        )
        .unwrap()
    }

    fn bearer(token: &str) -> String {
        format!("Bearer {token}")
    }

    #[test]
    fn each_route_is_classified_as_the_router_splits_it() {
        let cases = [
            ("POST", "/v1/operations", Route::Register),
            ("POST", "/v1/operations/", Route::Register),
            ("GET", "/v1/operations", Route::Read),
            ("GET", "/v1/operations/", Route::Read),
            ("GET", "/v1/operations/batches/x", Route::Inspect),
            ("GET", "/v1/operations/batches%2Fx", Route::Inspect),
            ("GET", "/v1/operations/batches/x/retry", Route::Inspect),
            ("HEAD", "/v1/operations/batches/x", Route::Read),
            ("GET", "/v1/stats", Route::Read),
            ("GET", "/metrics", Route::Read),
            ("GET", "/v1/config", Route::Read),
            ("GET", "/v1/whoami", Route::Read),
            ("GET", "/v1/bulk/retry", Route::Read),
            ("GET", "/v1/nowhere", Route::Read),
            ("GET", "/v1/operationsx", Route::Read),
            ("POST", "/v1/operations/batches/x/retry", Route::Act),
            ("POST", "/v1/operations/batches/x/redeliver", Route::Act),
            ("POST", "/v1/operations/batches/x/forget", Route::Act),
            ("POST", "/v1/operations/batches/x/repair", Route::Act),
            ("POST", "/v1/operations/batches/x/settle", Route::Act),
            ("POST", "/v1/operations/batches/x", Route::Act),
            ("POST", "/v1/operationsx", Route::Act),
            ("POST", "/v1/bulk/retry", Route::Act),
            ("POST", "/v1/bulk/redeliver", Route::Act),
            ("POST", "/v1/stats", Route::Act),
            ("POST", "/metrics", Route::Act),
            ("PUT", "/v1/operations", Route::Act),
            ("DELETE", "/v1/operations/batches/x", Route::Act),
        ];
        for (method, path, route) in cases {
            assert_eq!(Route::of(method, path), route, "{method} {path}");
        }
    }

    #[test]
    fn a_register_token_registers_and_reads_one_operation_only() {
        let may = |route| Scope::Register.may(route);
        assert!(may(Route::Register) && may(Route::Inspect));
        assert!(!may(Route::Read) && !may(Route::Act));
    }

    #[test]
    fn a_read_token_reads_everything_and_acts_on_nothing() {
        let may = |route| Scope::Read.may(route);
        assert!(may(Route::Read) && may(Route::Inspect));
        assert!(!may(Route::Register) && !may(Route::Act));
    }

    #[test]
    fn an_admin_token_does_everything() {
        for route in [Route::Register, Route::Inspect, Route::Read, Route::Act] {
            assert!(Scope::Admin.may(route));
        }
    }

    #[test]
    fn the_scope_a_route_needs_may_make_it() {
        for route in [Route::Register, Route::Inspect, Route::Read, Route::Act] {
            assert!(route.needs().may(route), "{route:?}");
        }
        assert_eq!(Route::Act.needs(), Scope::Admin);
        assert_eq!(Route::Read.needs(), Scope::Read);
        assert_eq!(Route::Register.needs(), Scope::Register);
    }

    #[test]
    fn each_token_is_known_by_its_scope() {
        let t = tokens();
        let scope = |token: &str| t.identify(Some(&bearer(token))).map(|c| c.scope);
        assert_eq!(scope(ADMIN), Some(Scope::Admin));
        assert_eq!(scope(REGISTER), Some(Scope::Register));
        assert_eq!(scope("register-token-next-0123"), Some(Scope::Register));
        assert_eq!(scope(READ), Some(Scope::Read));
    }

    #[test]
    fn a_token_must_match_exactly() {
        let t = tokens();
        for given in [
            "Bearer admin-token-012345678",
            "Bearer admin-token-01234567890",
            "Bearer Admin-token-0123456789",
            "Bearer  admin-token-0123456789",
            "Bearer ",
            "Bearer",
            "admin-token-0123456789",
            "bearer admin-token-0123456789",
            "Basic admin-token-0123456789",
        ] {
            assert_eq!(t.identify(Some(given)), None, "{given}");
        }
        assert_eq!(t.identify(None), None);
    }

    #[test]
    fn admission_is_401_for_an_unknown_token_and_403_for_the_wrong_scope() {
        let t = tokens();
        assert_eq!(
            t.admit(Some("Bearer nope"), "GET", "/v1/stats"),
            Admission::Unknown
        );
        assert_eq!(t.admit(None, "POST", "/v1/operations"), Admission::Unknown);
        let read = t.admit(Some(&bearer(READ)), "POST", "/v1/bulk/redeliver");
        assert!(
            matches!(&read, Admission::Forbidden { caller, needs: Scope::Admin } if caller.scope == Scope::Read),
            "{read:?}"
        );
        let register = t.admit(Some(&bearer(REGISTER)), "GET", "/v1/operations");
        assert!(
            matches!(&register, Admission::Forbidden { caller, needs: Scope::Read } if caller.scope == Scope::Register),
            "{register:?}"
        );
        let read = t.admit(Some(&bearer(READ)), "POST", "/v1/operations");
        assert!(matches!(
            read,
            Admission::Forbidden {
                needs: Scope::Register,
                ..
            }
        ));
        for (token, method, path) in [
            (REGISTER, "POST", "/v1/operations"),
            (REGISTER, "GET", "/v1/operations/batches/x"),
            (READ, "GET", "/v1/operations/batches/x"),
            (READ, "GET", "/v1/config"),
            (ADMIN, "POST", "/v1/operations/batches/x/forget"),
        ] {
            assert!(
                matches!(
                    t.admit(Some(&bearer(token)), method, path),
                    Admission::Admitted(_)
                ),
                "{token} {method} {path}"
            );
        }
    }

    #[test]
    fn a_token_in_two_scopes_names_the_narrower_setting() {
        let overlap = |admin: &str, register: &str, read: &str| {
            Tokens::new(vec![admin.into()], vec![register.into()], vec![read.into()]).unwrap_err()
        };
        assert_eq!(
            overlap(ADMIN, ADMIN, READ),
            Overlap {
                setting: Scope::Register,
                other: Scope::Admin
            }
        );
        assert_eq!(
            overlap(ADMIN, REGISTER, ADMIN),
            Overlap {
                setting: Scope::Read,
                other: Scope::Admin
            }
        );
        let both = overlap(ADMIN, REGISTER, REGISTER);
        assert_eq!(both.setting.setting(), "READ_TOKENS");
        assert!(both.to_string().contains("REGISTER_TOKENS"), "{both}");
        assert!(!both.to_string().contains(REGISTER), "never the token");
    }

    #[test]
    fn lists_split_on_whitespace_and_hold_visible_ascii_only() {
        assert_eq!(
            parse_list(" a-1\tb_2\n a-1 c.3 ").unwrap(),
            vec!["a-1", "b_2", "c.3"]
        );
        assert_eq!(parse_list("ok tök"), Err(TokenError::Unprintable));
        assert_eq!(parse_list("ok \u{7}bell"), Err(TokenError::Unprintable));
        assert!(parse_list("   ").unwrap().is_empty());
    }

    #[test]
    fn short_tokens_are_found_by_scope() {
        let t = Tokens::new(
            vec!["short".into()],
            vec![REGISTER.into()],
            vec!["tiny".into(), READ.into()],
        )
        .unwrap();
        assert_eq!(t.short(), vec![Scope::Read, Scope::Admin]);
        assert!(tokens().short().is_empty());
        let read = |t: &Tokens, token: &str| t.identify(Some(&format!("Bearer {token}")));
        assert_eq!(read(&t, "tiny").map(|c| c.scope), Some(Scope::Read));
        assert_eq!(read(&t, READ).map(|c| c.scope), Some(Scope::Read));
    }

    #[test]
    fn the_fingerprint_is_the_documented_hash_and_debug_shows_only_it() {
        // printf 'gemini-once:%s' admin-token-0123456789 | sha256sum | cut -c1-8
        assert_eq!(fingerprint(ADMIN), "892b052f");
        assert_eq!(fingerprint(ADMIN).len(), 8);
        assert_ne!(fingerprint(ADMIN), fingerprint(READ));
        let dump = format!("{:?}", tokens());
        for secret in [ADMIN, REGISTER, READ] {
            assert!(!dump.contains(secret), "{dump}");
        }
        assert!(dump.contains(&fingerprint(ADMIN)));
        let caller = tokens().identify(Some(&bearer(READ))).unwrap();
        assert_eq!(caller.fingerprint, fingerprint(READ));
        assert_eq!(
            serde_json::to_value(caller.actor()).unwrap(),
            serde_json::json!({"scope": "read", "fingerprint": fingerprint(READ)})
        );
    }
}
