//! Gemini's key set for dynamic-webhook tokens, as an isolate caches it: which key a `kid`
//! names, and when to read the durable copy or fetch the set again.
//!
//! Guarantees: a cold isolate reads the durable copy (KV's `jwks:cache`) once before it
//! fetches; an unknown `kid` fetches the set at most once a [`REFETCH_MS`] (a `kid` absent
//! from a set that fresh is not Google's: 401); after a failed fetch, an unknown `kid` is
//! answered 503 with `Retry-After` for [`RETRY_FAILED_FETCH_MS`], so Gemini retries and the
//! endpoint is not hammered, while the cached keys keep serving; only a set that changed is
//! written back to the durable copy. No I/O and no clock: the edge
//! (`edge/http/dynamic_webhook.rs`) performs each step and passes the time in.

use crate::inbound::classify::Rejection;
use crate::inbound::jwt::{parse_jwks, JwtError, RsaJwk};

/// After a successful fetch, an unknown `kid` refetches the key set at most this often.
pub const REFETCH_MS: i64 = 60_000;
/// After a failed fetch, the next may be tried this much later.
pub const RETRY_FAILED_FETCH_MS: i64 = 5_000;

/// The cached key set and when it was fetched.
#[derive(Debug, Default)]
pub struct KeySet {
    keys: Vec<RsaJwk>,
    /// When the key set was last fetched successfully, and when a fetch last failed.
    fetched_ms: Option<i64>,
    failed_ms: Option<i64>,
    durable_read: bool,
}

/// What finding a `kid`'s key needs next.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyLookup {
    Found(RsaJwk),
    /// Read the durable copy once, give it to [`KeySet::durable_copy`], and look again.
    ReadDurableCopy,
    /// Fetch the set and give the answer to [`KeySet::fetched`].
    Fetch,
    /// Refuse the token: its `kid` is not in a fresh set (401), or the set cannot be
    /// refreshed just now (503).
    Refuse(Rejection),
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
    pub fn lookup(&mut self, kid: &str, now_ms: i64) -> KeyLookup {
        if let Some(key) = self.cached(kid) {
            return KeyLookup::Found(key);
        }
        if !self.durable_read {
            self.durable_read = true;
            return KeyLookup::ReadDurableCopy;
        }
        if let Some(failed) = self
            .failed_ms
            .filter(|t| now_ms - t < RETRY_FAILED_FETCH_MS)
        {
            let secs = (failed + RETRY_FAILED_FETCH_MS - now_ms + 999) / 1_000;
            let retry_after = secs.clamp(1, 60) as u32;
            return KeyLookup::Refuse(Rejection::KeysUnavailable { retry_after });
        }
        match self.fetched_ms {
            Some(t) if now_ms - t < REFETCH_MS => {
                KeyLookup::Refuse(Rejection::Token(JwtError::UnknownKid))
            }
            _ => KeyLookup::Fetch,
        }
    }

    /// The durable copy's text, if there was one: taken when it parses.
    pub fn durable_copy(&mut self, body: Option<&str>) {
        if let Some(keys) = body.and_then(|b| parse_jwks(b).ok()) {
            self.keys = keys;
        }
    }

    /// The fetch's outcome at `now_ms`: the answer's body on success, else why it failed.
    pub fn fetched(&mut self, answer: Result<&str, String>, now_ms: i64) -> Fetched {
        let keys = match answer {
            Ok(body) => parse_jwks(body).map_err(|_| "unreadable key set".to_string()),
            Err(reason) => Err(reason),
        };
        match keys {
            Ok(keys) => {
                self.fetched_ms = Some(now_ms);
                self.failed_ms = None;
                let changed = self.keys != keys;
                self.keys = keys;
                Fetched::Keys {
                    changed,
                    keys: self.keys.len(),
                }
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
        Rejection::KeysUnavailable {
            retry_after: (RETRY_FAILED_FETCH_MS / 1_000) as u32,
        }
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
        matches!(set.lookup(kid, now), KeyLookup::Found(k) if k.kid == kid)
    }

    #[test]
    fn a_cold_isolate_reads_the_durable_copy_once_before_it_fetches() {
        let mut set = KeySet::default();
        assert_eq!(set.lookup("k1", 0), KeyLookup::ReadDurableCopy);
        set.durable_copy(Some(&jwks(&["k1"])));
        assert!(found(&mut set, "k1", 0));
        // The copy lacks k2: the set is fetched, the copy is not read again.
        assert_eq!(set.lookup("k2", 0), KeyLookup::Fetch);
    }

    #[test]
    fn an_unreadable_or_absent_durable_copy_leads_to_a_fetch() {
        for copy in [None, Some("not json")] {
            let mut set = KeySet::default();
            assert_eq!(set.lookup("k1", 0), KeyLookup::ReadDurableCopy);
            set.durable_copy(copy);
            assert_eq!(set.lookup("k1", 0), KeyLookup::Fetch);
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
            KeyLookup::Refuse(Rejection::Token(JwtError::UnknownKid))
        );
        assert_eq!(set.lookup("other", 1_000 + REFETCH_MS), KeyLookup::Fetch);
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
            KeyLookup::Refuse(Rejection::KeysUnavailable { retry_after: 4 })
        );
        assert!(found(&mut set, "k1", REFETCH_MS + 1_500));
        assert_eq!(
            set.lookup("k2", REFETCH_MS + RETRY_FAILED_FETCH_MS),
            KeyLookup::Fetch
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
}
