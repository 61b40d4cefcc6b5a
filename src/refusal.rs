//! Why a request is refused, and with what status: the one answer every route gives when it
//! does not do what was asked, whoever decided so (the webhook's intake, the admin API, the
//! edge's own failures).
//!
//! Guarantees (axum's two faces): a [`Refusal`] has a client face ([`Refusal::status`],
//! [`Refusal::body`], [`Refusal::retry_after`]: never internal detail, never a secret) and a
//! log face (its `Display`, with the detail). It is a 5xx when a retry can help (the
//! configuration, storage, a peer), so Gemini retries a delivery, and a 4xx when the request
//! as it stands would be refused again. The edge answers it in one place (`edge/error.rs`).

use std::fmt;

use serde_json::{json, Value};

use crate::config::ConfigError;
use crate::operator::access::Scope;

/// Everything that can end a request early.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// Missing or malformed configuration: 503 naming the variable, so the sender retries
    /// while an operator fixes it.
    Config(ConfigError),
    Unauthorized,
    /// A known token whose scope (`scope`) may not make the request: it `needs` another.
    Forbidden {
        scope: Scope,
        needs: Scope,
    },
    TooLarge,
    /// Malformed input; the text says what is wrong (no internal detail).
    BadRequest(String),
    NotFound,
    MethodNotAllowed,
    /// The command does not apply to the resource as it stands; the text says why.
    Conflict(String),
    /// What the request means could not be made durable (storage, an object, KV): the text
    /// is logged, the sender sees only "retry".
    Unavailable(String),
    /// A check cannot be made right now (a key set that cannot be refreshed): retry after
    /// this many seconds.
    RetryLater(u32),
}

impl Refusal {
    /// The HTTP status it is answered with.
    pub fn status(&self) -> u16 {
        match self {
            Refusal::Config(_) | Refusal::Unavailable(_) | Refusal::RetryLater(_) => 503,
            Refusal::Unauthorized => 401,
            Refusal::Forbidden { .. } => 403,
            Refusal::TooLarge => 413,
            Refusal::BadRequest(_) => 400,
            Refusal::NotFound => 404,
            Refusal::MethodNotAllowed => 405,
            Refusal::Conflict(_) => 409,
        }
    }

    /// The body the client sees.
    pub fn body(&self) -> Value {
        match self {
            Refusal::Config(e) => {
                json!({"error": "not configured", "variable": e.var, "problem": e.to_string()})
            }
            Refusal::Unauthorized => json!({"error": "unauthorized"}),
            Refusal::Forbidden { scope, needs } => {
                json!({"error": forbidden(*scope, *needs), "scope": scope, "needs": needs})
            }
            Refusal::TooLarge => json!({"error": "body too large"}),
            Refusal::BadRequest(why) | Refusal::Conflict(why) => json!({"error": why}),
            Refusal::NotFound => json!({"error": "not found"}),
            Refusal::MethodNotAllowed => json!({"error": "method not allowed"}),
            Refusal::Unavailable(_) => json!({"error": "temporarily unavailable, retry"}),
            Refusal::RetryLater(secs) => {
                json!({"error": "temporarily unavailable, retry", "retry_after": secs})
            }
        }
    }

    /// A reply from an object (`peer`: a gate, a desk) that the route has no answer for:
    /// unavailable, the reply in the log face only.
    pub fn unexpected(peer: &str, reply: &impl fmt::Debug) -> Refusal {
        Refusal::Unavailable(format!("unexpected {peer} reply {reply:?}"))
    }

    /// The `Retry-After` seconds the answer carries, if any.
    pub fn retry_after(&self) -> Option<u32> {
        match self {
            Refusal::RetryLater(secs) => Some(*secs),
            _ => None,
        }
    }
}

/// What a 403 says: whose token it was and the scope the request needs.
fn forbidden(scope: Scope, needs: Scope) -> String {
    let needs = match needs {
        Scope::Admin => "an admin token".to_string(),
        other => format!("a {} token (or an admin token)", other.as_str()),
    };
    let scope = scope.as_str();
    format!("forbidden: a {scope} token may not do this; it needs {needs}")
}

/// The log face.
impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Config(e) => write!(f, "configuration: {e}"),
            Refusal::BadRequest(why) => write!(f, "bad request: {why}"),
            Refusal::Conflict(why) => write!(f, "conflict: {why}"),
            Refusal::Unavailable(detail) => f.write_str(detail),
            Refusal::RetryLater(secs) => write!(f, "retry after {secs} s"),
            // The rest carry no detail: their log face is their client face.
            other => f.write_str(other.body()["error"].as_str().unwrap_or_default()),
        }
    }
}

/// In a log line, a refusal is its log face.
impl serde::Serialize for Refusal {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

impl From<ConfigError> for Refusal {
    fn from(e: ConfigError) -> Self {
        Refusal::Config(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_has_one_status_and_a_retry_only_when_one_can_help() {
        let config = ConfigError {
            var: "GEMINI_WEBHOOK_SECRET",
            problem: "missing".into(),
        };
        let forbidden = Refusal::Forbidden {
            scope: Scope::Register,
            needs: Scope::Admin,
        };
        for (refusal, status) in [
            (Refusal::Config(config), 503),
            (Refusal::Unavailable("KV down".into()), 503),
            (Refusal::RetryLater(5), 503),
            (Refusal::Unauthorized, 401),
            (forbidden, 403),
            (Refusal::TooLarge, 413),
            (Refusal::BadRequest("x".into()), 400),
            (Refusal::NotFound, 404),
            (Refusal::MethodNotAllowed, 405),
            (Refusal::Conflict("x".into()), 409),
        ] {
            assert_eq!(refusal.status(), status, "{refusal}");
            assert_eq!(
                refusal.retry_after().is_some(),
                refusal == Refusal::RetryLater(5)
            );
        }
    }

    #[test]
    fn the_client_never_sees_the_detail_the_log_does() {
        let down = Refusal::Unavailable("KV: quota".into());
        assert_eq!(
            down.body(),
            json!({"error": "temporarily unavailable, retry"})
        );
        assert_eq!(serde_json::to_value(&down).unwrap(), json!("KV: quota"));
        assert_eq!(
            Refusal::RetryLater(5).body(),
            json!({"error": "temporarily unavailable, retry", "retry_after": 5})
        );
        let forbidden = Refusal::Forbidden {
            scope: Scope::Read,
            needs: Scope::Register,
        };
        let text = "forbidden: a read token may not do this; it needs a register token (or an admin token)";
        assert_eq!(
            forbidden.body(),
            json!({"error": text, "scope": "read", "needs": "register"})
        );
        assert_eq!(forbidden.to_string(), text);
        assert_eq!(
            super::forbidden(Scope::Register, Scope::Admin),
            "forbidden: a register token may not do this; it needs an admin token"
        );
        assert_eq!(
            Refusal::BadRequest("data.id: empty".into()).to_string(),
            "bad request: data.id: empty"
        );
    }
}
