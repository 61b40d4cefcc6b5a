//! Verifying dynamic-webhook deliveries: RS256 JWTs checked with the runtime's WebCrypto
//! against Gemini's published key set.
//!
//! The key set is cached in this isolate's memory and durably in KV (`jwks:cache`, written
//! only when the set changed), so a cold isolate reads it once from KV instead of fetching
//! it; an unknown `kid` triggers a refetch at most once a minute; when the key-set endpoint
//! is down, the cached keys keep serving.
//! Guarantees: it is given a token [`crate::inbound::classify::screen`] already parsed (alg,
//! kid, shape), so a hostile token never reaches WebCrypto; its claims are checked after the
//! signature, by [`crate::inbound::classify::vouch`]. An invalid signature is
//! [`Rejection::Token`] (401), including a `kid` absent from a freshly fetched set; a `kid` the
//! cache lacks while the set cannot be refreshed (the last fetch just failed) is
//! [`Rejection::KeysUnavailable`] (503), so Gemini retries.

use std::cell::RefCell;
use std::collections::HashMap;

use js_sys::{Array, Function, Object, Promise, Reflect, Uint8Array};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use worker::{Env, Method};

use crate::config::Config;
use crate::inbound::classify::Rejection;
use crate::inbound::jwt::{parse_jwks, JwtError, RsaJwk, Token};
use crate::inbound::route_log::RouteLog;
use crate::retry::{Answer, Class};

use crate::edge::outbound::fetch::{send, Keep};
use crate::edge::outbound::ledger_kv::KV_BINDING;
use crate::edge::runtime::log;

/// KV key of the durable copy of the key set.
const KV_CACHE_KEY: &str = "jwks:cache";
/// After a successful fetch, an unknown `kid` refetches the key set at most this often (a
/// `kid` absent from a set this fresh is refused with 401).
const REFETCH_MS: i64 = 60_000;
/// After a failed fetch, the next may be tried this much later; meanwhile an unknown `kid`
/// is answered 503 with `Retry-After`, so Gemini retries.
const RETRY_FAILED_FETCH_MS: i64 = 5_000;
/// The key-set endpoint gets this long.
const FETCH_TIMEOUT_MS: i64 = 5_000;
/// Largest key set read (Google's is a few KB): a longer answer is refused as it streams, the
/// fetch fails (`jwks_fetch_failed`, saying so) and the cached keys keep serving.
const MAX_JWKS_BYTES: usize = 256 * 1024;

#[derive(Default)]
struct KeyCache {
    keys: Vec<RsaJwk>,
    /// When the key set was last fetched successfully, and when a fetch last failed.
    fetched_ms: Option<i64>,
    failed_ms: Option<i64>,
    kv_consulted: bool,
    imported: HashMap<String, JsValue>,
}

thread_local! {
    static CACHE: RefCell<KeyCache> = RefCell::new(KeyCache::default());
}

/// Verifies a parsed token's RS256 signature with the key its `kid` names.
pub async fn verify(
    env: &Env,
    config: &Config,
    token: &Token,
    now_ms: i64,
) -> Result<(), Rejection> {
    let jwk = find_key(env, config, &token.kid, now_ms).await?;
    let key = import(&jwk).await.map_err(|e| {
        log_line(RouteLog::JwksImportFailed {
            kid: jwk.kid.clone(),
            error: format!("{e:?}"),
        });
        Rejection::Token(JwtError::KeysUnavailable)
    })?;
    let valid = webcrypto_verify(&key, &token.signature, token.signing_input.as_bytes())
        .await
        .map_err(|_| Rejection::Token(JwtError::Signature))?;
    if !valid {
        return Err(Rejection::Token(JwtError::Signature));
    }
    Ok(())
}

fn log_line(line: RouteLog) {
    log(line.to_value());
}

fn cached(kid: &str) -> Option<RsaJwk> {
    CACHE.with(|c| c.borrow().keys.iter().find(|k| k.kid == kid).cloned())
}

/// What to do about a `kid` the cached set lacks, at `now_ms`.
enum Refresh {
    Fetch,
    /// The set is fresh: the kid is not Google's.
    Unknown,
    /// A fetch failed a moment ago: ask the sender to come back.
    Wait(u32),
}

fn refresh_decision(now_ms: i64) -> Refresh {
    CACHE.with(|c| {
        let c = c.borrow();
        if let Some(failed) = c.failed_ms.filter(|t| now_ms - t < RETRY_FAILED_FETCH_MS) {
            let secs = (failed + RETRY_FAILED_FETCH_MS - now_ms + 999) / 1_000;
            return Refresh::Wait(secs.clamp(1, 60) as u32);
        }
        match c.fetched_ms {
            Some(t) if now_ms - t < REFETCH_MS => Refresh::Unknown,
            _ => Refresh::Fetch,
        }
    })
}

async fn find_key(env: &Env, config: &Config, kid: &str, now_ms: i64) -> Result<RsaJwk, Rejection> {
    if let Some(k) = cached(kid) {
        return Ok(k);
    }
    let kv = env.kv(KV_BINDING).ok();
    if !CACHE.with(|c| c.borrow().kv_consulted) {
        CACHE.with(|c| c.borrow_mut().kv_consulted = true);
        if let Some(kv) = &kv {
            if let Ok(Some(body)) = kv.get(KV_CACHE_KEY).text().await {
                if let Ok(keys) = parse_jwks(&body) {
                    CACHE.with(|c| c.borrow_mut().keys = keys);
                }
            }
        }
        if let Some(k) = cached(kid) {
            return Ok(k);
        }
    }
    match refresh_decision(now_ms) {
        Refresh::Unknown => return Err(Rejection::Token(JwtError::UnknownKid)),
        Refresh::Wait(secs) => return Err(Rejection::KeysUnavailable { retry_after: secs }),
        Refresh::Fetch => {}
    }
    let headers = [("accept", "application/json".to_string())];
    let answer = send(
        Method::Get,
        &config.gemini_jwks_url,
        &headers,
        None,
        FETCH_TIMEOUT_MS,
        Keep::Whole(MAX_JWKS_BYTES),
    )
    .await;
    let failure = match (&answer, answer.class()) {
        (Answer::Http { body, .. }, Class::Success) => match parse_jwks(body) {
            Ok(keys) => {
                let changed = CACHE.with(|c| {
                    let mut c = c.borrow_mut();
                    c.fetched_ms = Some(now_ms);
                    c.failed_ms = None;
                    let changed = c.keys != keys;
                    if changed {
                        c.keys = keys;
                        c.imported.clear();
                    }
                    changed
                });
                // KV allows one write a second per key and bills each: only a new set is kept.
                if let (true, Some(kv)) = (changed, &kv) {
                    let stored = match kv.put(KV_CACHE_KEY, body.as_str()) {
                        Ok(put) => put.execute().await.map_err(|e| format!("{e:?}")),
                        Err(e) => Err(format!("{e:?}")),
                    };
                    if let Err(e) = stored {
                        log_line(RouteLog::JwksCacheWriteFailed { error: e });
                    }
                }
                log_line(RouteLog::JwksFetched {
                    changed,
                    keys: CACHE.with(|c| c.borrow().keys.len()),
                });
                return cached(kid).ok_or(Rejection::Token(JwtError::UnknownKid));
            }
            Err(_) => "unreadable key set".to_string(),
        },
        _ => answer.summary(),
    };
    log_line(RouteLog::JwksFetchFailed { error: failure });
    CACHE.with(|c| c.borrow_mut().failed_ms = Some(now_ms));
    Err(Rejection::KeysUnavailable {
        retry_after: (RETRY_FAILED_FETCH_MS / 1_000) as u32,
    })
}

fn subtle() -> Result<JsValue, JsValue> {
    let crypto = Reflect::get(&js_sys::global(), &"crypto".into())?;
    Reflect::get(&crypto, &"subtle".into())
}

fn algorithm() -> Result<Object, JsValue> {
    let algo = Object::new();
    Reflect::set(&algo, &"name".into(), &"RSASSA-PKCS1-v1_5".into())?;
    Reflect::set(&algo, &"hash".into(), &"SHA-256".into())?;
    Ok(algo)
}

async fn call(method: &str, args: &Array) -> Result<JsValue, JsValue> {
    let subtle = subtle()?;
    let function: Function = Reflect::get(&subtle, &method.into())?.dyn_into()?;
    let promise: Promise = function.apply(&subtle, args)?.dyn_into()?;
    JsFuture::from(promise).await
}

async fn import(jwk: &RsaJwk) -> Result<JsValue, JsValue> {
    if let Some(key) = CACHE.with(|c| c.borrow().imported.get(&jwk.kid).cloned()) {
        return Ok(key);
    }
    let data = Object::new();
    Reflect::set(&data, &"kty".into(), &"RSA".into())?;
    Reflect::set(&data, &"n".into(), &jwk.n.as_str().into())?;
    Reflect::set(&data, &"e".into(), &jwk.e.as_str().into())?;
    Reflect::set(&data, &"alg".into(), &"RS256".into())?;
    Reflect::set(&data, &"ext".into(), &JsValue::TRUE)?;
    let args = Array::new();
    args.push(&"jwk".into());
    args.push(&data);
    args.push(&algorithm()?.into());
    args.push(&JsValue::FALSE);
    args.push(&Array::of1(&"verify".into()));
    let key = call("importKey", &args).await?;
    CACHE.with(|c| c.borrow_mut().imported.insert(jwk.kid.clone(), key.clone()));
    Ok(key)
}

async fn webcrypto_verify(key: &JsValue, signature: &[u8], data: &[u8]) -> Result<bool, JsValue> {
    let args = Array::new();
    args.push(&algorithm()?.into());
    args.push(key);
    args.push(&Uint8Array::from(signature));
    args.push(&Uint8Array::from(data));
    Ok(call("verify", &args).await?.as_bool().unwrap_or(false))
}
