//! Gemini's key set for dynamic webhooks, as an isolate caches it: its RS256 keys (which key
//! a token's `kid` names) and its Ed25519 keys (tried in turn for a `v1a,` entry), and when to
//! read the durable copy or fetch the set again.
//!
//! Guarantees: a cold isolate reads the durable copy (KV's `jwks:cache`) once before it fetches; a
//! miss (an unknown `kid`, or a `v1a` message no cached Ed25519 key verifies) fetches the set at
//! most once a [`REFETCH_MS`], whatever kind of miss it was (a `kid` absent from a set that fresh
//! is not Google's, nor a `v1a` signature none of its keys verifies: 401); after a failed fetch, a
//! miss is answered 503 with `Retry-After` for [`RETRY_FAILED_FETCH_MS`], so Gemini retries and the
//! endpoint is not hammered, while the cached keys keep serving; only a set that changed is written
//! back to the durable copy. No I/O and no clock: the edge (`edge/http/dynamic_webhook.rs`)
//! performs each step and passes the time in.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::Value;

use crate::inbound::classify::Rejection;
use crate::inbound::jwt::{parse_jwks, JwtError, RsaJwk};
use crate::signature::{Ed25519Key, SignatureError, V1aMessage};

/// After a successful fetch, an unknown `kid` refetches the key set at most this often.
pub const REFETCH_MS: i64 = 60_000;
/// After a failed fetch, the next may be tried this much later.
pub const RETRY_FAILED_FETCH_MS: i64 = 5_000;

/// The cached key set and when it was fetched.
#[derive(Debug, Default)]
pub struct KeySet {
    keys: Vec<RsaJwk>,
    ed25519: Vec<Ed25519Key>,
    /// When the key set was last fetched successfully, and when a fetch last failed.
    fetched_ms: Option<i64>,
    failed_ms: Option<i64>,
    durable_read: bool,
}

/// What finding a key needs next: a `kid`'s RS256 key for a token ([`KeySet::lookup`]), or
/// the Ed25519 key that verifies a `v1a` message ([`KeySet::check_v1a`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup<T> {
    /// Found (for `v1a`: a cached key verifies the message).
    Found(T),
    /// Read the durable copy once, give it to [`KeySet::durable_copy`], and look again.
    ReadDurableCopy,
    /// Fetch the set, give the answer to [`KeySet::fetched`], then look once more
    /// ([`KeySet::after_fetch`], [`KeySet::after_fetch_v1a`]).
    Fetch,
    /// Refuse: the key is not in a fresh set (401), or the set cannot be refreshed just now (503).
    Refuse(Rejection),
}

/// A key set document's usable keys: RS256 keys for tokens, Ed25519 keys for `v1a` entries.
/// `None` when it is not a key set (`{"keys": [...]}`).
fn parse_set(body: &str) -> Option<(Vec<RsaJwk>, Vec<Ed25519Key>)> {
    let rsa = parse_jwks(body).ok()?;
    let value: Value = serde_json::from_str(body).ok()?;
    let ed25519 = value["keys"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|k| k["kty"] == "OKP" && k["crv"] == "Ed25519")
        .filter(|k| k.get("use").is_none_or(|u| u == "sig"))
        .filter(|k| k.get("alg").is_none_or(|a| a == "EdDSA" || a == "Ed25519"))
        .filter_map(|k| {
            let x = URL_SAFE_NO_PAD.decode(k["x"].as_str()?).ok()?;
            Ed25519Key::from_bytes(k["kid"].as_str().map(str::to_string), &x)
        })
        .collect();
    Some((rsa, ed25519))
}

/// What a fetch of the set led to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetched {
    /// A usable set: `changed` when it differs from the cached one (then the edge writes the
    /// durable copy and forgets its imported keys).
    Keys { changed: bool, keys: usize },
    /// No usable set (the reason is logged); the cached keys keep serving.
    Failed(String),
}

impl KeySet {
    fn cached(&self, kid: &str) -> Option<RsaJwk> {
        self.keys.iter().find(|k| k.kid == kid).cloned()
    }

    /// What finding `kid`'s key needs at `now_ms`.
    pub fn lookup(&mut self, kid: &str, now_ms: i64) -> Lookup<RsaJwk> {
        match self.cached(kid) {
            Some(key) => Lookup::Found(key),
            None => self.miss(now_ms, Rejection::Token(JwtError::UnknownKid)),
        }
    }

    /// What checking a `v1a` message needs at `now_ms`.
    pub fn check_v1a(&mut self, message: &V1aMessage, now_ms: i64) -> Lookup<()> {
        if message.verify(&self.ed25519) {
            return Lookup::Found(());
        }
        self.miss(now_ms, Rejection::Signature(SignatureError::V1aInvalid))
    }

    /// After a fetch: whether a key of the set verifies `message`, or the refusal.
    pub fn after_fetch_v1a(&self, message: &V1aMessage) -> Result<(), Rejection> {
        let verified = message.verify(&self.ed25519).then_some(());
        verified.ok_or(Rejection::Signature(SignatureError::V1aInvalid))
    }

    /// A key the cache lacks: one read of the durable copy per isolate, then one fetch a
    /// [`REFETCH_MS`] at most (`unknown` refuses meanwhile), none for a while after one failed.
    fn miss<T>(&mut self, now_ms: i64, unknown: Rejection) -> Lookup<T> {
        if !self.durable_read {
            self.durable_read = true;
            return Lookup::ReadDurableCopy;
        }
        if let Some(failed) = self
            .failed_ms
            .filter(|t| now_ms - t < RETRY_FAILED_FETCH_MS)
        {
            let secs = (failed + RETRY_FAILED_FETCH_MS - now_ms + 999) / 1_000;
            let retry_after = secs.clamp(1, 60) as u32;
            return Lookup::Refuse(Rejection::KeysUnavailable { retry_after });
        }
        match self.fetched_ms {
            Some(t) if now_ms - t < REFETCH_MS => Lookup::Refuse(unknown),
            _ => Lookup::Fetch,
        }
    }

    /// The durable copy's text, if there was one: taken when it parses.
    pub fn durable_copy(&mut self, body: Option<&str>) {
        if let Some((keys, ed25519)) = body.and_then(parse_set) {
            self.keys = keys;
            self.ed25519 = ed25519;
        }
    }

    /// The fetch's outcome at `now_ms`: the answer's body on success, else why it failed.
    pub fn fetched(&mut self, answer: Result<&str, String>, now_ms: i64) -> Fetched {
        match answer.and_then(|body| parse_set(body).ok_or_else(|| "unreadable key set".into())) {
            Ok((keys, ed25519)) => {
                self.fetched_ms = Some(now_ms);
                self.failed_ms = None;
                let changed = self.keys != keys || self.ed25519 != ed25519;
                self.keys = keys;
                self.ed25519 = ed25519;
                let keys = self.keys.len() + self.ed25519.len();
                Fetched::Keys { changed, keys }
            }
            Err(reason) => {
                self.failed_ms = Some(now_ms);
                Fetched::Failed(reason)
            }
        }
    }

    /// After a fetch: `kid`'s key, or the refusal.
    pub fn after_fetch(&self, kid: &str) -> Result<RsaJwk, Rejection> {
        self.cached(kid)
            .ok_or(Rejection::Token(JwtError::UnknownKid))
    }

    /// The refusal after a failed fetch: come back once the next fetch may be tried.
    pub fn unavailable() -> Rejection {
        let retry_after = (RETRY_FAILED_FETCH_MS / 1_000) as u32;
        Rejection::KeysUnavailable { retry_after }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwks(kids: &[&str]) -> String {
        let keys: Vec<String> = kids
            .iter()
            .map(|k| {
                format!(
                    r#"{{"kty":"RSA","alg":"RS256","use":"sig","kid":"{k}","n":"AQAB","e":"AQAB"}}"#
                )
            })
            .collect();
        format!(r#"{{"keys":[{}]}}"#, keys.join(","))
    }

    fn found(set: &mut KeySet, kid: &str, now: i64) -> bool {
        matches!(set.lookup(kid, now), Lookup::Found(k) if k.kid == kid)
    }

    #[test]
    fn a_cold_isolate_reads_the_durable_copy_once_before_it_fetches() {
        let mut set = KeySet::default();
        assert_eq!(set.lookup("k1", 0), Lookup::ReadDurableCopy);
        set.durable_copy(Some(&jwks(&["k1"])));
        assert!(found(&mut set, "k1", 0));
        // The copy lacks k2: the set is fetched, the copy is not read again.
        assert_eq!(set.lookup("k2", 0), Lookup::Fetch);
    }

    #[test]
    fn an_unreadable_or_absent_durable_copy_leads_to_a_fetch() {
        for copy in [None, Some("not json")] {
            let mut set = KeySet::default();
            assert_eq!(set.lookup("k1", 0), Lookup::ReadDurableCopy);
            set.durable_copy(copy);
            assert_eq!(set.lookup("k1", 0), Lookup::Fetch);
        }
    }

    #[test]
    fn a_kid_absent_from_a_fresh_set_is_refused_until_the_set_may_be_fetched_again() {
        let mut set = KeySet::default();
        set.lookup("k1", 0);
        assert_eq!(
            set.fetched(Ok(&jwks(&["k1"])), 1_000),
            Fetched::Keys {
                changed: true,
                keys: 1
            }
        );
        assert_eq!(
            set.after_fetch("other"),
            Err(Rejection::Token(JwtError::UnknownKid))
        );
        assert_eq!(
            set.lookup("other", 1_000 + REFETCH_MS - 1),
            Lookup::Refuse(Rejection::Token(JwtError::UnknownKid))
        );
        assert_eq!(set.lookup("other", 1_000 + REFETCH_MS), Lookup::Fetch);
    }

    #[test]
    fn after_a_failed_fetch_an_unknown_kid_waits_and_the_cached_keys_keep_serving() {
        let mut set = KeySet::default();
        set.lookup("k1", 0);
        set.fetched(Ok(&jwks(&["k1"])), 0);
        assert_eq!(
            set.fetched(Err("503".into()), REFETCH_MS),
            Fetched::Failed("503".into())
        );
        assert_eq!(
            set.lookup("k2", REFETCH_MS + 1_500),
            Lookup::Refuse(Rejection::KeysUnavailable { retry_after: 4 })
        );
        assert!(found(&mut set, "k1", REFETCH_MS + 1_500));
        assert_eq!(
            set.lookup("k2", REFETCH_MS + RETRY_FAILED_FETCH_MS),
            Lookup::Fetch
        );
        assert_eq!(
            set.fetched(Ok("{}"), REFETCH_MS + RETRY_FAILED_FETCH_MS),
            Fetched::Failed("unreadable key set".into())
        );
        assert!(
            found(&mut set, "k1", 0),
            "an unreadable set replaces nothing"
        );
    }

    #[test]
    fn the_same_set_fetched_again_is_not_a_change() {
        let mut set = KeySet::default();
        set.fetched(Ok(&jwks(&["k1"])), 0);
        assert_eq!(
            set.fetched(Ok(&jwks(&["k1"])), REFETCH_MS),
            Fetched::Keys {
                changed: false,
                keys: 1
            }
        );
        assert_eq!(
            set.fetched(Ok(&jwks(&["k1", "k2"])), 2 * REFETCH_MS),
            Fetched::Keys {
                changed: true,
                keys: 2
            }
        );
    }

    // v1a: Ed25519 keys, tried in turn.

    use crate::signature::{check_headers, SignedHeaders};
    use base64::engine::general_purpose::STANDARD;
    use ed25519_compact::{KeyPair, Seed};

    fn pair(n: u8) -> KeyPair {
        KeyPair::from_seed(Seed::new([n; 32]))
    }

    /// A key set with RS256 key `k1` and the Ed25519 keys of `pairs`.
    fn okp_set(pairs: &[u8]) -> String {
        let mut keys = vec![
            r#"{"kty":"RSA","alg":"RS256","use":"sig","kid":"k1","n":"AQAB","e":"AQAB"}"#
                .to_string(),
        ];
        for n in pairs {
            let x = URL_SAFE_NO_PAD.encode(*pair(*n).pk);
            keys.push(format!(
                r#"{{"kty":"OKP","crv":"Ed25519","alg":"EdDSA","use":"sig","kid":"ed{n}","x":"{x}"}}"#
            ));
        }
        format!(r#"{{"keys":[{}]}}"#, keys.join(","))
    }

    /// A delivery's `v1a` message, signed by `pair(n)`.
    fn signed_by(n: u8) -> V1aMessage {
        let body = br#"{"type":"batch.succeeded","data":{"id":"batches/b1"}}"#;
        let message = [&b"msg_1.1000."[..], body].concat();
        let header = format!("v1a,{}", STANDARD.encode(*pair(n).sk.sign(message, None)));
        let headers = SignedHeaders {
            id: Some("msg_1"),
            timestamp: Some("1000"),
            signature: Some(&header),
        };
        check_headers(headers, 1_000, 300)
            .unwrap()
            .v1a_message(body)
            .unwrap()
    }

    const INVALID: Rejection = Rejection::Signature(SignatureError::V1aInvalid);

    #[test]
    fn a_v1a_message_is_verified_by_any_cached_ed25519_key() {
        let mut set = KeySet::default();
        set.fetched(Ok(&okp_set(&[1, 2, 3])), 0);
        for n in [1, 2, 3] {
            assert_eq!(set.check_v1a(&signed_by(n), 0), Lookup::Found(()));
        }
        // The set's RS256 key still serves tokens.
        assert!(found(&mut set, "k1", 0));
    }

    #[test]
    fn a_key_added_to_the_set_is_picked_up_on_a_miss_at_most_once_a_minute() {
        let mut set = KeySet::default();
        assert_eq!(set.check_v1a(&signed_by(2), 0), Lookup::ReadDurableCopy);
        set.durable_copy(Some(&okp_set(&[1])));
        assert_eq!(set.check_v1a(&signed_by(2), 0), Lookup::Fetch);
        assert_eq!(
            set.fetched(Ok(&okp_set(&[1])), 0),
            Fetched::Keys {
                changed: false,
                keys: 2
            }
        );
        assert_eq!(set.after_fetch_v1a(&signed_by(2)), Err(INVALID));
        // Google adds key 2: within a minute of the last fetch a miss is refused unfetched.
        assert_eq!(
            set.check_v1a(&signed_by(2), REFETCH_MS - 1),
            Lookup::Refuse(INVALID)
        );
        assert_eq!(set.check_v1a(&signed_by(2), REFETCH_MS), Lookup::Fetch);
        assert_eq!(
            set.fetched(Ok(&okp_set(&[1, 2])), REFETCH_MS),
            Fetched::Keys {
                changed: true,
                keys: 3
            }
        );
        assert_eq!(set.after_fetch_v1a(&signed_by(2)), Ok(()));
        assert_eq!(
            set.check_v1a(&signed_by(2), REFETCH_MS + 1),
            Lookup::Found(())
        );
    }

    #[test]
    fn forged_v1a_and_unknown_kids_share_one_refetch_a_minute() {
        let mut set = KeySet::default();
        set.lookup("k1", 0);
        set.fetched(Ok(&okp_set(&[1])), 0);
        // A forgery (key 9 is not in the set) right after the fetch: refused, nothing fetched.
        assert_eq!(
            set.check_v1a(&signed_by(9), 10_000),
            Lookup::Refuse(INVALID)
        );
        assert_eq!(set.check_v1a(&signed_by(9), REFETCH_MS), Lookup::Fetch);
        set.fetched(Ok(&okp_set(&[1])), REFETCH_MS);
        // That fetch also counts for an unknown kid.
        assert_eq!(
            set.lookup("kX", REFETCH_MS + 1),
            Lookup::Refuse(Rejection::Token(JwtError::UnknownKid))
        );
        assert_eq!(
            set.check_v1a(&signed_by(9), 2 * REFETCH_MS - 1),
            Lookup::Refuse(INVALID)
        );
    }

    #[test]
    fn after_a_failed_fetch_a_v1a_miss_waits_and_cached_ed25519_keys_keep_serving() {
        let mut set = KeySet::default();
        set.lookup("k1", 0);
        set.fetched(Ok(&okp_set(&[1])), 0);
        set.fetched(Err("503".into()), REFETCH_MS);
        assert_eq!(
            set.check_v1a(&signed_by(2), REFETCH_MS + 1_000),
            Lookup::Refuse(Rejection::KeysUnavailable { retry_after: 4 })
        );
        assert_eq!(
            set.check_v1a(&signed_by(1), REFETCH_MS + 1_000),
            Lookup::Found(())
        );
    }

    #[test]
    fn unusable_ed25519_keys_are_skipped() {
        let x = URL_SAFE_NO_PAD.encode(*pair(1).pk);
        let short = URL_SAFE_NO_PAD.encode([1u8; 31]);
        let body = format!(
            r#"{{"keys":[
            {{"kty":"OKP","crv":"X25519","x":"{x}"}},
            {{"kty":"OKP","crv":"Ed25519","use":"enc","x":"{x}"}},
            {{"kty":"OKP","crv":"Ed25519","alg":"RS256","x":"{x}"}},
            {{"kty":"OKP","crv":"Ed25519","x":"{short}"}},
            {{"kty":"OKP","crv":"Ed25519","x":"{x}="}},
            {{"kty":"OKP","crv":"Ed25519"}}]}}"#
        );
        let mut set = KeySet::default();
        assert_eq!(
            set.fetched(Ok(&body), 0),
            Fetched::Keys {
                changed: false,
                keys: 0
            }
        );
        // Without kid or alg, a well-formed key serves.
        let plain = format!(r#"{{"keys":[{{"kty":"OKP","crv":"Ed25519","x":"{x}"}}]}}"#);
        set.fetched(Ok(&plain), REFETCH_MS);
        assert_eq!(set.check_v1a(&signed_by(1), REFETCH_MS), Lookup::Found(()));
    }
}
