//! Configuration: every tunable, its default and why, parsed from the Worker's vars/secrets.
//!
//! Guarantees: parsing is pure (a lookup function in, a [`Config`] or the first
//! [`ConfigError`] out) and never panics; an error always names the variable, so the edge
//! can answer 503 with that name while an operator fixes it (Gemini keeps retrying meanwhile);
//! secrets never appear in an error or a `Debug` dump. Durations are whole seconds (or ms where
//! the name says so); 0 is accepted where it means something, so tests need not wait.

use thiserror::Error;

use crate::signature::{Secret, SecretError};

/// Standard Webhooks and Gemini's guidance on timestamp skew.
pub const DEFAULT_TOLERANCE_SECS: i64 = 300;
/// Gemini wants an answer within a few seconds; a slower destination is retried.
pub const DEFAULT_EFFECT_TIMEOUT_MS: i64 = 5_000;
/// Far longer than any attempt can still be in flight (timeout + the runtime's 30 s grace).
pub const DEFAULT_CLAIM_TTL_SECS: i64 = 600;
/// How long the runtime may let work run on after its deadline: a claim should outlast the
/// effect timeout by at least this.
pub const RUNTIME_GRACE_MS: i64 = 30_000;
/// Audit window, well past Gemini's 24 h of retries.
pub const DEFAULT_RETENTION_DAYS: i64 = 14;
/// 1 MiB: Gemini envelopes are a few hundred bytes; this bounds memory per request.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1 << 20;
/// First retry of a failed side effect; doubles per attempt.
pub const DEFAULT_RETRY_BASE_SECS: i64 = 30;
/// Backoff cap: a failing destination is still tried every hour.
pub const DEFAULT_RETRY_MAX_SECS: i64 = 3_600;
/// Absorbs nearly every webhook and its first retries before polling.
pub const DEFAULT_RECONCILE_GRACE_SECS: i64 = 90;
/// Longest healthy batch plus margin: alert, never auto-close.
pub const DEFAULT_STUCK_AFTER_SECS: i64 = 21_600;
/// A side effect still not done an hour after settling needs a person.
pub const DEFAULT_EFFECT_ALERT_AFTER_SECS: i64 = 3_600;
/// Inside KV's 1,000 operations per invocation on every plan (use 45 on the Free plan).
pub const DEFAULT_RECONCILE_BUDGET: u32 = 900;
/// The reconciliation lease's TTL. A live pass renews it every quarter of this (a heartbeat),
/// so it may be short: a pass that dies (a deploy, a crash) blocks the next for at most this
/// long, about one minute, instead of a whole pass's length.
pub const DEFAULT_RECONCILE_LEASE_SECS: i64 = 60;
/// Shortest lease: below it the heartbeat (every quarter of the TTL) would spend subrequests
/// on renewals every second.
pub const MIN_RECONCILE_LEASE_SECS: i64 = 5;
/// Longest lease: the old fixed lease; a longer one only makes a dead pass block longer.
pub const MAX_RECONCILE_LEASE_SECS: i64 = 600;
/// A pass starts no new entry after this long and saves its cursor. A scheduled handler may
/// run for 15 minutes on Cloudflare, but a pass should be short: well inside that limit, far
/// from the next cron run (5 minutes), and long enough for a full budget of healthy status
/// calls (900 subrequests of ~50 ms each). The entry in hand finishes past it (at most one
/// status call and one gate call).
pub const DEFAULT_RECONCILE_DEADLINE_SECS: i64 = 60;
/// Longest deadline: ten minutes, still well inside the runtime's 15 minutes.
pub const MAX_RECONCILE_DEADLINE_SECS: i64 = 600;
/// Counters wait this long in the gate before going to a stats shard, so a burst of
/// deliveries for one operation costs one shard write; `/v1/stats` lags by as much.
pub const DEFAULT_STATS_FLUSH_SECS: i64 = 10;
/// Longest flush window: counts of settled duplicates wait in the gate's memory, and an idle
/// object is evicted after about a minute, so a longer window would routinely lose them.
pub const MAX_STATS_FLUSH_SECS: i64 = 60;
/// The official samples' key set for dynamic webhooks.
pub const DEFAULT_GEMINI_JWKS_URL: &str =
    "https://generativelanguage.googleapis.com/.well-known/jwks.json";
/// Gemini's public API.
pub const DEFAULT_GEMINI_API_BASE: &str = "https://generativelanguage.googleapis.com";

/// The worker's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub webhook_secrets: Vec<Secret>,
    pub effect_url: String,
    /// `kind` → destination overrides of `effect_url` (EFFECT_ROUTES).
    pub effect_routes: Vec<(String, Destination)>,
    pub effect_signing_secret: Secret,
    pub admin_token: AdminToken,
    pub tolerance_secs: i64,
    pub effect_timeout_ms: i64,
    pub claim_ttl_secs: i64,
    pub retention_days: i64,
    /// `LEDGER_RETENTION_SECONDS`, when set: overrides the days (for trying retention and
    /// tombstones without waiting days).
    pub retention_secs_override: Option<i64>,
    /// `DYNAMIC_WEBHOOKS`: false refuses every JWT-signed delivery (static webhook only).
    pub dynamic_webhooks: bool,
    pub require_registration: bool,
    pub max_body_bytes: usize,
    pub retry_base_secs: i64,
    pub retry_max_secs: i64,
    pub reconcile_grace_secs: i64,
    pub stuck_after_secs: i64,
    pub effect_alert_after_secs: i64,
    pub reconcile_budget: u32,
    pub reconcile_lease_secs: i64,
    pub reconcile_deadline_secs: i64,
    pub stats_flush_secs: i64,
    pub gemini_api_base: String,
    pub gemini_api_key: Option<ApiKey>,
    pub alert_url: Option<String>,
    /// The Gemini webhook whose state each cron pass checks (id or name), if any.
    pub gemini_webhook_name: Option<String>,
    /// Where dynamic webhooks' signing keys are published.
    pub gemini_jwks_url: String,
    /// Required `aud` of dynamic-webhook tokens, when set.
    pub gemini_jwt_audience: Option<String>,
}

/// The admin bearer token; `Debug` hides it.
#[derive(Clone)]
pub struct AdminToken(pub String);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(..)")
    }
}

/// The Gemini API key; `Debug` hides it.
#[derive(Clone)]
pub struct ApiKey(pub String);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(..)")
    }
}

/// A variable that is missing or malformed. Names the variable, never its value.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{var}: {problem}")]
pub struct ConfigError {
    pub var: &'static str,
    pub problem: String,
}

/// Where a side effect goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// POSTed over HTTPS (or HTTP locally), signed the Standard Webhooks way.
    Url(String),
    /// Sent to a Cloudflare Queue through this producer binding: a successful send is done
    /// (the queue is durable; its consumer dedupes by the idempotency key the message carries).
    Queue(String),
    /// POSTed to another Worker through this service binding, signed like an HTTPS one.
    Service(String),
}

fn is_binding_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn err(var: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        var,
        problem: problem.into(),
    }
}

impl Config {
    /// Retention in milliseconds.
    pub fn retention_ms(&self) -> i64 {
        match self.retention_secs_override {
            Some(secs) => secs * 1_000,
            None => self.retention_days * 86_400_000,
        }
    }

    /// Settings that work but are unsafe in production, each naming its variables: logged and
    /// shown by `/healthz`.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.claim_ttl_secs * 1_000 < self.effect_timeout_ms + RUNTIME_GRACE_MS {
            warnings.push(format!(
                "CLAIM_TTL_SECONDS ({}) is shorter than EFFECT_TIMEOUT_MS plus the runtime's 30 s grace ({} ms): an attempt the runtime lets run past its deadline could overlap the next",
                self.claim_ttl_secs,
                self.effect_timeout_ms + RUNTIME_GRACE_MS
            ));
        }
        warnings
    }

    /// Where the side effect of an operation of `kind` goes.
    pub fn destination_for(&self, kind: Option<&str>) -> Destination {
        kind.and_then(|k| self.effect_routes.iter().find(|(route, _)| route == k))
            .map_or(Destination::Url(self.effect_url.clone()), |(_, d)| {
                d.clone()
            })
    }

    /// Reads every variable through `lookup` (absent and empty are the same).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let required = |name: &'static str| get(name).ok_or_else(|| err(name, "is not set"));
        let int =
            |name: &'static str, default: i64, min: i64, max: i64| -> Result<i64, ConfigError> {
                match get(name) {
                    None => Ok(default),
                    Some(v) => match v.trim().parse::<i64>() {
                        Ok(n) if (min..=max).contains(&n) => Ok(n),
                        _ => Err(err(
                            name,
                            format!("must be a whole number from {min} to {max}"),
                        )),
                    },
                }
            };
        let url = |name: &'static str, value: String| -> Result<String, ConfigError> {
            let v = value.trim();
            if v.starts_with("https://") || v.starts_with("http://") {
                Ok(v.trim_end_matches('/').to_string())
            } else {
                Err(err(name, "must be an http:// or https:// URL"))
            }
        };

        let webhook_secrets = required("GEMINI_WEBHOOK_SECRETS")?
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
            .map(Secret::parse)
            .collect::<Result<Vec<_>, SecretError>>()
            .map_err(|e| err("GEMINI_WEBHOOK_SECRETS", e.to_string()))?;
        let effect_url = url("EFFECT_URL", required("EFFECT_URL")?)?;
        let effect_routes = match get("EFFECT_ROUTES") {
            None => Vec::new(),
            Some(text) => {
                let parsed: serde_json::Map<String, serde_json::Value> =
                    serde_json::from_str(&text).map_err(|_| {
                        err("EFFECT_ROUTES", "must be a JSON object from kind to URL")
                    })?;
                let mut routes = Vec::new();
                for (kind, target) in parsed {
                    let serde_json::Value::String(target) = target else {
                        return Err(err(
                            "EFFECT_ROUTES",
                            "every value must be a URL, queue:BINDING or service:BINDING",
                        ));
                    };
                    let destination = match target.trim().split_once(':') {
                        Some(("queue", b)) if is_binding_name(b) => Destination::Queue(b.into()),
                        Some(("service", b)) if is_binding_name(b) => {
                            Destination::Service(b.into())
                        }
                        Some(("queue" | "service", _)) => return Err(err(
                            "EFFECT_ROUTES",
                            "a queue: or service: route must name a binding (letters, digits, _)",
                        )),
                        _ => Destination::Url(url("EFFECT_ROUTES", target)?),
                    };
                    routes.push((kind, destination));
                }
                routes
            }
        };
        let effect_signing_secret = Secret::parse(&required("EFFECT_SIGNING_SECRET")?)
            .map_err(|e| err("EFFECT_SIGNING_SECRET", e.to_string()))?;
        let admin_token = AdminToken(required("ADMIN_TOKEN")?.trim().to_string());
        let flag = |name: &'static str, default: bool| -> Result<bool, ConfigError> {
            match get(name).as_deref().map(str::trim) {
                None => Ok(default),
                Some("true") => Ok(true),
                Some("false") => Ok(false),
                Some(_) => Err(err(name, "must be true or false")),
            }
        };
        let require_registration = flag("REQUIRE_REGISTRATION", false)?;
        let dynamic_webhooks = flag("DYNAMIC_WEBHOOKS", true)?;
        let retention_secs_override = match get("LEDGER_RETENTION_SECONDS") {
            None => None,
            Some(_) => Some(int("LEDGER_RETENTION_SECONDS", 0, 1, 3_650 * 86_400)?),
        };
        let effect_timeout_ms = int("EFFECT_TIMEOUT_MS", DEFAULT_EFFECT_TIMEOUT_MS, 1, 600_000)?;
        let claim_ttl_secs = int("CLAIM_TTL_SECONDS", DEFAULT_CLAIM_TTL_SECS, 1, 86_400)?;
        // A claim that lapses mid-attempt lets a second attempt start beside the first.
        if claim_ttl_secs * 1_000 <= effect_timeout_ms {
            return Err(err(
                "CLAIM_TTL_SECONDS",
                "must outlast EFFECT_TIMEOUT_MS (a claim that lapses mid-attempt lets a second attempt start beside it)",
            ));
        }
        let retry_base_secs = int(
            "EFFECT_RETRY_BASE_SECONDS",
            DEFAULT_RETRY_BASE_SECS,
            1,
            86_400,
        )?;
        let retry_max_secs = int(
            "EFFECT_RETRY_MAX_SECONDS",
            DEFAULT_RETRY_MAX_SECS,
            1,
            86_400,
        )?;
        if retry_max_secs < retry_base_secs {
            return Err(err(
                "EFFECT_RETRY_MAX_SECONDS",
                "must not be less than EFFECT_RETRY_BASE_SECONDS",
            ));
        }
        Ok(Config {
            webhook_secrets,
            effect_url,
            effect_routes,
            effect_signing_secret,
            admin_token,
            tolerance_secs: int(
                "SIGNATURE_TOLERANCE_SECONDS",
                DEFAULT_TOLERANCE_SECS,
                0,
                86_400,
            )?,
            effect_timeout_ms,
            claim_ttl_secs,
            retention_days: int("LEDGER_RETENTION_DAYS", DEFAULT_RETENTION_DAYS, 1, 3_650)?,
            retention_secs_override,
            dynamic_webhooks,
            require_registration,
            max_body_bytes: int(
                "MAX_BODY_BYTES",
                DEFAULT_MAX_BODY_BYTES as i64,
                1_024,
                100 * 1024 * 1024,
            )? as usize,
            retry_base_secs,
            retry_max_secs,
            reconcile_grace_secs: int(
                "RECONCILE_GRACE_SECONDS",
                DEFAULT_RECONCILE_GRACE_SECS,
                0,
                86_400 * 30,
            )?,
            stuck_after_secs: int(
                "STUCK_AFTER_SECONDS",
                DEFAULT_STUCK_AFTER_SECS,
                0,
                86_400 * 365,
            )?,
            effect_alert_after_secs: int(
                "EFFECT_ALERT_AFTER_SECONDS",
                DEFAULT_EFFECT_ALERT_AFTER_SECS,
                0,
                86_400 * 365,
            )?,
            reconcile_budget: int(
                "RECONCILE_BUDGET",
                i64::from(DEFAULT_RECONCILE_BUDGET),
                5,
                10_000,
            )? as u32,
            reconcile_lease_secs: int(
                "RECONCILE_LEASE_SECONDS",
                DEFAULT_RECONCILE_LEASE_SECS,
                MIN_RECONCILE_LEASE_SECS,
                MAX_RECONCILE_LEASE_SECS,
            )?,
            reconcile_deadline_secs: int(
                "RECONCILE_DEADLINE_SECONDS",
                DEFAULT_RECONCILE_DEADLINE_SECS,
                1,
                MAX_RECONCILE_DEADLINE_SECS,
            )?,
            stats_flush_secs: int(
                "STATS_FLUSH_SECONDS",
                DEFAULT_STATS_FLUSH_SECS,
                0,
                MAX_STATS_FLUSH_SECS,
            )?,
            gemini_api_base: match get("GEMINI_API_BASE") {
                None => DEFAULT_GEMINI_API_BASE.to_string(),
                Some(v) => url("GEMINI_API_BASE", v)?,
            },
            gemini_api_key: get("GEMINI_API_KEY").map(|k| ApiKey(k.trim().to_string())),
            alert_url: get("ALERT_URL").map(|v| url("ALERT_URL", v)).transpose()?,
            gemini_webhook_name: get("GEMINI_WEBHOOK_NAME").map(|v| v.trim().to_string()),
            gemini_jwks_url: match get("GEMINI_JWKS_URL") {
                None => DEFAULT_GEMINI_JWKS_URL.to_string(),
                Some(v) => url("GEMINI_JWKS_URL", v)?,
            },
            gemini_jwt_audience: get("GEMINI_JWT_AUDIENCE").map(|v| v.trim().to_string()),
        })
    }
}

/// A URL as the operator's page may show it: its origin only, because a destination or an
/// alert sink often carries a credential in its path or query (a Slack webhook URL is one).
fn origin_only(url: &str) -> String {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    let end = url[after_scheme..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| after_scheme + i);
    // userinfo (user:password@) is a credential too.
    let authority = &url[after_scheme..end];
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let rest = if end < url.len() { "/\u{2026}" } else { "" };
    format!("{}{host}{rest}", &url[..after_scheme])
}

impl Config {
    /// The configuration in force as the operator's page shows it (`GET /v1/config`): every
    /// variable by name with its value, except that secrets are only `set` or `not set` and
    /// URLs that may carry a credential show their origin only. Never a secret's bytes.
    pub fn public_view(&self) -> serde_json::Value {
        use serde_json::json;
        let set = |b: bool| if b { "set" } else { "not set" };
        let routes: serde_json::Map<String, serde_json::Value> = self
            .effect_routes
            .iter()
            .map(|(kind, destination)| {
                let shown = match destination {
                    Destination::Url(url) => origin_only(url),
                    Destination::Queue(binding) => format!("queue:{binding}"),
                    Destination::Service(binding) => format!("service:{binding}"),
                };
                (kind.clone(), json!(shown))
            })
            .collect();
        // One row per variable, in the README's order: kept as a table.
        #[rustfmt::skip]
        let settings = [
            ("GEMINI_WEBHOOK_SECRETS", json!(format!("set ({})", self.webhook_secrets.len())), true),
            ("EFFECT_URL", json!(origin_only(&self.effect_url)), false),
            ("EFFECT_ROUTES", json!(routes), false),
            ("EFFECT_SIGNING_SECRET", json!("set"), true),
            ("ADMIN_TOKEN", json!("set"), true),
            ("GEMINI_API_KEY", json!(set(self.gemini_api_key.is_some())), true),
            ("SIGNATURE_TOLERANCE_SECONDS", json!(self.tolerance_secs), false),
            ("EFFECT_TIMEOUT_MS", json!(self.effect_timeout_ms), false),
            ("CLAIM_TTL_SECONDS", json!(self.claim_ttl_secs), false),
            ("LEDGER_RETENTION_DAYS", json!(self.retention_days), false),
            ("LEDGER_RETENTION_SECONDS", json!(self.retention_secs_override), false),
            ("REQUIRE_REGISTRATION", json!(self.require_registration), false),
            ("MAX_BODY_BYTES", json!(self.max_body_bytes), false),
            ("EFFECT_RETRY_BASE_SECONDS", json!(self.retry_base_secs), false),
            ("EFFECT_RETRY_MAX_SECONDS", json!(self.retry_max_secs), false),
            ("RECONCILE_GRACE_SECONDS", json!(self.reconcile_grace_secs), false),
            ("STUCK_AFTER_SECONDS", json!(self.stuck_after_secs), false),
            ("EFFECT_ALERT_AFTER_SECONDS", json!(self.effect_alert_after_secs), false),
            ("RECONCILE_BUDGET", json!(self.reconcile_budget), false),
            ("RECONCILE_LEASE_SECONDS", json!(self.reconcile_lease_secs), false),
            ("RECONCILE_DEADLINE_SECONDS", json!(self.reconcile_deadline_secs), false),
            ("STATS_FLUSH_SECONDS", json!(self.stats_flush_secs), false),
            ("GEMINI_API_BASE", json!(self.gemini_api_base), false),
            ("ALERT_URL", json!(self.alert_url.as_deref().map(origin_only)), false),
            ("GEMINI_WEBHOOK_NAME", json!(self.gemini_webhook_name), false),
            ("DYNAMIC_WEBHOOKS", json!(self.dynamic_webhooks), false),
            ("GEMINI_JWKS_URL", json!(self.gemini_jwks_url), false),
            ("GEMINI_JWT_AUDIENCE", json!(self.gemini_jwt_audience), false),
        ];
        json!({
            "settings": settings
                .iter()
                .map(|(name, value, secret)| json!({"name": name, "value": value, "secret": secret}))
                .collect::<Vec<_>>(),
            "warnings": self.warnings(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn base() -> HashMap<&'static str, String> {
        HashMap::from([
            ("GEMINI_WEBHOOK_SECRETS", SECRET.to_string()),
            ("EFFECT_URL", "http://127.0.0.1:9/effects".to_string()),
            ("EFFECT_SIGNING_SECRET", SECRET.to_string()),
            ("ADMIN_TOKEN", "t0ken".to_string()),
        ])
    }

    fn parse(vars: &HashMap<&'static str, String>) -> Result<Config, ConfigError> {
        Config::from_lookup(|name| vars.get(name).cloned())
    }

    #[test]
    fn defaults_apply_when_only_required_vars_are_set() {
        let c = parse(&base()).unwrap();
        assert_eq!(c.tolerance_secs, 300);
        assert_eq!(c.effect_timeout_ms, 5_000);
        assert_eq!(c.claim_ttl_secs, 600);
        assert_eq!(c.retention_days, 14);
        assert!(!c.require_registration);
        assert_eq!(c.max_body_bytes, 1 << 20);
        assert_eq!(c.reconcile_grace_secs, 90);
        assert_eq!(c.stuck_after_secs, 21_600);
        assert_eq!(c.effect_alert_after_secs, 3_600);
        assert_eq!(c.reconcile_budget, 900);
        assert_eq!(c.reconcile_lease_secs, 60);
        assert_eq!(c.reconcile_deadline_secs, 60);
        assert_eq!(c.stats_flush_secs, 10);
        assert_eq!(c.gemini_api_base, DEFAULT_GEMINI_API_BASE);
        assert!(c.gemini_api_key.is_none());
        assert!(c.alert_url.is_none());
    }

    #[test]
    fn each_missing_required_var_is_named() {
        for var in [
            "GEMINI_WEBHOOK_SECRETS",
            "EFFECT_URL",
            "EFFECT_SIGNING_SECRET",
            "ADMIN_TOKEN",
        ] {
            let mut vars = base();
            vars.remove(var);
            assert_eq!(parse(&vars).unwrap_err().var, var);
            vars.insert(var, "  ".to_string());
            assert_eq!(parse(&vars).unwrap_err().var, var);
        }
    }

    #[test]
    fn several_secrets_by_space_or_comma() {
        let mut vars = base();
        vars.insert(
            "GEMINI_WEBHOOK_SECRETS",
            format!("{SECRET}, whsec_b3RoZXI= {SECRET}"),
        );
        assert_eq!(parse(&vars).unwrap().webhook_secrets.len(), 3);
    }

    #[test]
    fn malformed_values_are_named_without_their_value() {
        let cases = [
            ("GEMINI_WEBHOOK_SECRETS", "whsec_ok= not-a-secret"),
            ("EFFECT_URL", "ftp://x"),
            ("EFFECT_SIGNING_SECRET", "plain"),
            ("SIGNATURE_TOLERANCE_SECONDS", "-1"),
            ("EFFECT_TIMEOUT_MS", "fast"),
            ("CLAIM_TTL_SECONDS", "0"),
            ("LEDGER_RETENTION_DAYS", "0"),
            ("REQUIRE_REGISTRATION", "yes"),
            ("MAX_BODY_BYTES", "10"),
            ("RECONCILE_BUDGET", "1"),
            ("RECONCILE_LEASE_SECONDS", "4"),
            ("RECONCILE_LEASE_SECONDS", "601"),
            ("RECONCILE_DEADLINE_SECONDS", "0"),
            ("RECONCILE_DEADLINE_SECONDS", "601"),
            ("STATS_FLUSH_SECONDS", "61"),
            ("GEMINI_API_BASE", "generativelanguage"),
            ("ALERT_URL", "slack"),
            ("GEMINI_JWKS_URL", "jwks.json"),
            ("EFFECT_RETRY_BASE_SECONDS", "0"),
            ("EFFECT_ROUTES", "[1,2]"),
            ("EFFECT_ROUTES", r#"{"nightly":"gopher://x"}"#),
            ("EFFECT_ROUTES", r#"{"nightly":7}"#),
        ];
        for (var, value) in cases {
            let mut vars = base();
            vars.insert(var, value.to_string());
            let e = parse(&vars).unwrap_err();
            assert_eq!(e.var, var, "{var}={value}");
            // Short numbers appear in the stated range; longer values must never be echoed.
            if value.len() > 2 {
                assert!(!e.to_string().contains(value), "{e} leaks {value}");
            }
        }
    }

    #[test]
    fn zero_is_allowed_where_it_means_something() {
        let mut vars = base();
        vars.insert("RECONCILE_GRACE_SECONDS", "0".into());
        vars.insert("STUCK_AFTER_SECONDS", "0".into());
        vars.insert("EFFECT_ALERT_AFTER_SECONDS", "0".into());
        vars.insert("SIGNATURE_TOLERANCE_SECONDS", "0".into());
        let c = parse(&vars).unwrap();
        assert_eq!(c.reconcile_grace_secs, 0);
        assert_eq!(c.stuck_after_secs, 0);
    }

    #[test]
    fn effect_routes_override_the_url_per_kind() {
        let mut vars = base();
        vars.insert(
            "EFFECT_ROUTES",
            r#"{"nightly":"https://billing.example/hook","video":"http://127.0.0.1:1/v"}"#.into(),
        );
        let c = parse(&vars).unwrap();
        let url = |u: &str| Destination::Url(u.to_string());
        assert_eq!(
            c.destination_for(Some("nightly")),
            url("https://billing.example/hook")
        );
        assert_eq!(
            c.destination_for(Some("video")),
            url("http://127.0.0.1:1/v")
        );
        assert_eq!(
            c.destination_for(Some("other")),
            url("http://127.0.0.1:9/effects")
        );
        assert_eq!(c.destination_for(None), url("http://127.0.0.1:9/effects"));
    }

    #[test]
    fn routes_can_name_a_queue_or_a_service_binding() {
        let mut vars = base();
        vars.insert(
            "EFFECT_ROUTES",
            r#"{"billing":"queue:BILLING_EFFECTS","publish":"service:PUBLISHER"}"#.into(),
        );
        let c = parse(&vars).unwrap();
        assert_eq!(
            c.destination_for(Some("billing")),
            Destination::Queue("BILLING_EFFECTS".into())
        );
        assert_eq!(
            c.destination_for(Some("publish")),
            Destination::Service("PUBLISHER".into())
        );
        for bad in [
            r#"{"b":"queue:"}"#,
            r#"{"b":"service:has-dash"}"#,
            r#"{"b":"ftp://x"}"#,
        ] {
            vars.insert("EFFECT_ROUTES", bad.into());
            assert_eq!(parse(&vars).unwrap_err().var, "EFFECT_ROUTES", "{bad}");
        }
    }

    #[test]
    fn retry_cap_below_base_is_refused() {
        let mut vars = base();
        vars.insert("EFFECT_RETRY_BASE_SECONDS", "60".into());
        vars.insert("EFFECT_RETRY_MAX_SECONDS", "30".into());
        assert_eq!(parse(&vars).unwrap_err().var, "EFFECT_RETRY_MAX_SECONDS");
    }

    #[test]
    fn dynamic_webhooks_default_on_and_can_be_turned_off() {
        assert!(parse(&base()).unwrap().dynamic_webhooks);
        let mut vars = base();
        vars.insert("DYNAMIC_WEBHOOKS", "false".into());
        assert!(!parse(&vars).unwrap().dynamic_webhooks);
        vars.insert("DYNAMIC_WEBHOOKS", "no".into());
        assert_eq!(parse(&vars).unwrap_err().var, "DYNAMIC_WEBHOOKS");
    }

    #[test]
    fn retention_seconds_override_the_days() {
        assert_eq!(parse(&base()).unwrap().retention_ms(), 14 * 86_400_000);
        let mut vars = base();
        vars.insert("LEDGER_RETENTION_SECONDS", "5".into());
        assert_eq!(parse(&vars).unwrap().retention_ms(), 5_000);
        vars.insert("LEDGER_RETENTION_SECONDS", "0".into());
        assert_eq!(parse(&vars).unwrap_err().var, "LEDGER_RETENTION_SECONDS");
    }

    #[test]
    fn a_claim_that_cannot_outlast_an_attempt_is_refused() {
        let mut vars = base();
        vars.insert("EFFECT_TIMEOUT_MS", "5000".into());
        vars.insert("CLAIM_TTL_SECONDS", "5".into());
        let e = parse(&vars).unwrap_err();
        assert_eq!(e.var, "CLAIM_TTL_SECONDS");
        assert!(e.to_string().contains("EFFECT_TIMEOUT_MS"), "{e}");
        vars.insert("CLAIM_TTL_SECONDS", "6".into());
        let c = parse(&vars).unwrap();
        assert_eq!(
            c.warnings().len(),
            1,
            "allowed, but warned: no room for the runtime's grace"
        );
        assert!(c.warnings()[0].contains("CLAIM_TTL_SECONDS"));
        vars.insert("CLAIM_TTL_SECONDS", "35".into());
        assert!(parse(&vars).unwrap().warnings().is_empty());
        assert!(
            parse(&base()).unwrap().warnings().is_empty(),
            "the defaults are safe"
        );
    }

    #[test]
    fn debug_hides_secrets() {
        let mut vars = base();
        vars.insert("GEMINI_API_KEY", "AIzaSECRET".into());
        let dump = format!("{:?}", parse(&vars).unwrap());
        assert!(!dump.contains("t0ken"));
        assert!(!dump.contains("AIzaSECRET"));
        assert!(!dump.contains("MfKQ9r8"));
    }

    #[test]
    fn public_view_names_every_setting_and_shows_no_secret() {
        let mut vars = base();
        vars.insert("GEMINI_API_KEY", "AIza-very-secret-key".to_string());
        vars.insert(
            "ALERT_URL",
            "https://hooks.slack.com/services/T0/B0/s3cr3tpath".to_string(),
        );
        vars.insert(
            "EFFECT_URL",
            "https://user:pw@dest.example:8443/hooks?token=abc".to_string(),
        );
        vars.insert(
            "EFFECT_ROUTES",
            r#"{"billing":"https://bill.example/in/tok"}"#.to_string(),
        );
        vars.insert("CLAIM_TTL_SECONDS", "10".to_string());
        let view = parse(&vars).unwrap().public_view();
        let text = view.to_string();
        for secret in [
            SECRET,
            "t0ken",
            "AIza-very-secret-key",
            "s3cr3tpath",
            "pw@",
            "token=abc",
            "/in/tok",
        ] {
            assert!(!text.contains(secret), "{secret} leaked: {text}");
        }
        let value = |name: &str| {
            view["settings"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["name"] == name)
                .unwrap_or_else(|| panic!("{name} missing"))["value"]
                .clone()
        };
        assert_eq!(value("GEMINI_API_KEY"), "set");
        assert_eq!(value("GEMINI_WEBHOOK_SECRETS"), "set (1)");
        assert_eq!(value("EFFECT_URL"), "https://dest.example:8443/\u{2026}");
        assert_eq!(value("ALERT_URL"), "https://hooks.slack.com/\u{2026}");
        assert_eq!(
            value("EFFECT_ROUTES")["billing"],
            "https://bill.example/\u{2026}"
        );
        assert_eq!(value("CLAIM_TTL_SECONDS"), 10);
        assert_eq!(value("GEMINI_JWT_AUDIENCE"), serde_json::Value::Null);
        assert_eq!(
            view["warnings"].as_array().unwrap().len(),
            1,
            "the short claim TTL"
        );
        vars.remove("GEMINI_API_KEY");
        let view = parse(&vars).unwrap().public_view();
        assert!(view
            .to_string()
            .contains(r#""name":"GEMINI_API_KEY","secret":true,"value":"not set""#));
        assert_eq!(origin_only("http://127.0.0.1:9"), "http://127.0.0.1:9");
    }
}
