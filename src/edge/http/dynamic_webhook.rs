//! Verifying dynamic-webhook deliveries against Gemini's published key set: RS256 JWTs checked
//! with the runtime's WebCrypto, `v1a,` entries with its Ed25519 keys (pure Rust,
//! [`crate::signature::V1aMessage::verify`]).
//!
//! The key set is cached in this isolate's memory and durably in KV (`jwks:cache`); when to
//! read that copy, fetch the set again or refuse is [`KeySet`]'s decision (pure, host-tested),
//! which this file performs: a miss of either kind fetches at most once a minute.
//! Guarantees: it is given a token [`crate::inbound::intake::screen`] already parsed (alg,
//! kid, shape), so a hostile token never reaches WebCrypto; its claims are checked after the
//! signature, by [`crate::inbound::intake::vouch`]. An invalid signature is
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
use crate::inbound::jwt::{JwtError, RsaJwk, Token};
use crate::inbound::key_set::{Fetched, KeySet, Lookup};
use crate::inbound::route_log::RouteLog;
use crate::retry::{Class, PeerAnswer};
use crate::signature::V1aMessage;

use crate::edge::outbound::fetch::{send, Keep};
use crate::edge::outbound::ledger_kv::KV_BINDING;
use crate::edge::runtime::log;

/// KV key of the durable copy of the key set.
const KV_CACHE_KEY: &str = "jwks:cache";
/// The key-set endpoint gets this long.
const FETCH_TIMEOUT_MS: i64 = 5_000;
/// Largest key set read (Google's is a few KB): a longer answer is refused as it streams, the
/// fetch fails (`jwks_fetch_failed`, saying so) and the cached keys keep serving.
const MAX_JWKS_BYTES: usize = 256 * 1024;

thread_local! {
    /// The isolate's key set (its policy is [`KeySet`]'s), and the keys WebCrypto imported.
    static KEYS: RefCell<KeySet> = RefCell::new(KeySet::default());
    static IMPORTED: RefCell<HashMap<String, JsValue>> = RefCell::new(HashMap::new());
}

/// Verifies a parsed token's RS256 signature with the key its `kid` names.
pub async fn verify(
    env: &Env,
    config: &Config,
    token: &Token,
    now_ms: i64,
) -> Result<(), Rejection> {
    let look = |k: &mut KeySet| k.lookup(&token.kid, now_ms);
    let jwk = resolve(env, config, now_ms, look, |k| k.after_fetch(&token.kid)).await?;
    let key = import(&jwk).await.map_err(|e| {
        let (kid, error) = (jwk.kid.clone(), format!("{e:?}"));
        log(RouteLog::JwksImportFailed { kid, error }.to_value());
        Rejection::Token(JwtError::KeysUnavailable)
    })?;
    match webcrypto_verify(&key, &token.signature, token.signing_input.as_bytes()).await {
        Ok(true) => Ok(()),
        Ok(false) | Err(_) => Err(Rejection::Token(JwtError::Signature)),
    }
}

/// Verifies a delivery's `v1a,` entries with the key set's Ed25519 keys: the cached ones,
/// then the durable copy, then a fetch, as [`KeySet::check_v1a`] says.
pub async fn verify_v1a(
    env: &Env,
    config: &Config,
    message: &V1aMessage,
    now_ms: i64,
) -> Result<(), Rejection> {
    let look = |k: &mut KeySet| k.check_v1a(message, now_ms);
    resolve(env, config, now_ms, look, |k| k.after_fetch_v1a(message)).await
}

/// Performs a key set's [`Lookup`] (`look`) until it is found or refused: the durable copy
/// when it says so, then a fetch, after which `after_fetch` looks once more.
async fn resolve<T>(
    env: &Env,
    config: &Config,
    now_ms: i64,
    look: impl Fn(&mut KeySet) -> Lookup<T>,
    after_fetch: impl Fn(&KeySet) -> Result<T, Rejection>,
) -> Result<T, Rejection> {
    loop {
        match KEYS.with(|k| look(&mut k.borrow_mut())) {
            Lookup::Found(found) => return Ok(found),
            Lookup::Refuse(rejection) => return Err(rejection),
            Lookup::Fetch => break,
            // The durable copy (none when KV cannot be read).
            Lookup::ReadDurableCopy => {
                let body = match env.kv(KV_BINDING) {
                    Ok(kv) => kv.get(KV_CACHE_KEY).text().await.ok().flatten(),
                    Err(_) => None,
                };
                KEYS.with(|k| k.borrow_mut().durable_copy(body.as_deref()));
            }
        }
    }
    if !fetch_set(env, config, now_ms).await {
        return Err(KeySet::unavailable());
    }
    KEYS.with(|k| after_fetch(&k.borrow()))
}

/// Fetches the key set and gives the answer to [`KeySet::fetched`]; a set that changed is
/// written to the durable copy. False when no usable set came back.
async fn fetch_set(env: &Env, config: &Config, now_ms: i64) -> bool {
    let kv = env.kv(KV_BINDING).ok();
    let headers = [("accept", "application/json".to_string())];
    let (url, keep) = (&config.gemini_jwks_url, Keep::Whole(MAX_JWKS_BYTES));
    let answer = send(Method::Get, url, &headers, None, FETCH_TIMEOUT_MS, keep).await;
    let body = match (&answer, answer.class()) {
        (PeerAnswer::Http { body, .. }, Class::Success) => Ok(body.as_str()),
        _ => Err(answer.summary()),
    };
    match KEYS.with(|k| k.borrow_mut().fetched(body.clone(), now_ms)) {
        Fetched::Keys { changed, keys } => {
            if changed {
                IMPORTED.with(|i| i.borrow_mut().clear());
            }
            // KV allows one write a second per key and bills each: only a new set is kept.
            if let (true, Some(kv), Ok(body)) = (changed, &kv, body) {
                if let Err(e) = async { kv.put(KV_CACHE_KEY, body)?.execute().await }.await {
                    let error = format!("{e:?}");
                    log(RouteLog::JwksCacheWriteFailed { error }.to_value());
                }
            }
            log(RouteLog::JwksFetched { changed, keys }.to_value());
            true
        }
        Fetched::Failed(error) => {
            log(RouteLog::JwksFetchFailed { error }.to_value());
            false
        }
    }
}

fn algorithm() -> Result<JsValue, JsValue> {
    let algo = Object::new();
    Reflect::set(&algo, &"name".into(), &"RSASSA-PKCS1-v1_5".into())?;
    Reflect::set(&algo, &"hash".into(), &"SHA-256".into())?;
    Ok(algo.into())
}

async fn call(method: &str, args: &Array) -> Result<JsValue, JsValue> {
    let crypto = Reflect::get(&js_sys::global(), &"crypto".into())?;
    let subtle = Reflect::get(&crypto, &"subtle".into())?;
    let function: Function = Reflect::get(&subtle, &method.into())?.dyn_into()?;
    let promise: Promise = function.apply(&subtle, args)?.dyn_into()?;
    JsFuture::from(promise).await
}

async fn import(jwk: &RsaJwk) -> Result<JsValue, JsValue> {
    if let Some(key) = IMPORTED.with(|i| i.borrow().get(&jwk.kid).cloned()) {
        return Ok(key);
    }
    let data = Object::new();
    Reflect::set(&data, &"kty".into(), &"RSA".into())?;
    Reflect::set(&data, &"n".into(), &jwk.n.as_str().into())?;
    Reflect::set(&data, &"e".into(), &jwk.e.as_str().into())?;
    Reflect::set(&data, &"alg".into(), &"RS256".into())?;
    Reflect::set(&data, &"ext".into(), &JsValue::TRUE)?;
    let (format, usages) = (JsValue::from("jwk"), Array::of1(&"verify".into()));
    let args = Array::of5(&format, &data, &algorithm()?, &JsValue::FALSE, &usages);
    let key = call("importKey", &args).await?;
    IMPORTED.with(|i| i.borrow_mut().insert(jwk.kid.clone(), key.clone()));
    Ok(key)
}

async fn webcrypto_verify(key: &JsValue, signature: &[u8], data: &[u8]) -> Result<bool, JsValue> {
    let (signature, data) = (Uint8Array::from(signature), Uint8Array::from(data));
    let args = Array::of4(&algorithm()?, key, &signature, &data);
    Ok(call("verify", &args).await?.as_bool().unwrap_or(false))
}
