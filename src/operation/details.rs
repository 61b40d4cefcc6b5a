//! An outcome's details: the one shape every path's details are normalized to, whatever
//! settled the outcome (docs/DESIGN.md, invariant 6; `docs/effect.schema.json`).
//!
//! Guarantees: every path (a webhook's `data`, a status-API answer, a record stored by an
//! older version) goes through [`normalize_details`], so the details always have
//! `output_file_uri`, `output_file_uris`, `error_code`, `error_message` and `provider` (null
//! or empty when the path had nothing), and `user_metadata` / `unverified_user_metadata` only
//! when given, passed through untouched within the bounds of [`crate::bounds`] (past them, a
//! marker that says so). Anything else the provider said goes under `provider`, never loose at
//! the top level. The side effect's body ([`crate::operation::effect`]) is these details under
//! its fixed fields.

use serde_json::{json, Map, Value};

use crate::bounds;

/// First output location (a `gs://` URI or a `files/...` name), or null.
pub const OUTPUT_FILE_URI: &str = "output_file_uri";
/// Every output location, first one first (a video with several samples has several).
pub const OUTPUT_FILE_URIS: &str = "output_file_uris";
/// The provider's error code as given: a number (google.rpc.Code) or a string.
pub const ERROR_CODE: &str = "error_code";
/// The provider's error message, or null.
pub const ERROR_MESSAGE: &str = "error_message";
/// A `video.generated` webhook's location as Google's Cloud Run sample reads it: an output
/// location like `output_file_uri`.
pub const VIDEO_URI: &str = "video_uri";
/// Everything else the provider said, informational; what it holds depends on the path.
pub const PROVIDER: &str = "provider";
/// A dynamic webhook's user metadata, verified (passed through untouched).
pub const USER_METADATA: &str = "user_metadata";
/// Metadata that came only in an unverified body: a destination must not authorize on it.
pub const UNVERIFIED_USER_METADATA: &str = "unverified_user_metadata";
/// Where a `v1a`-signed body's `user_metadata` waits in a confirmation's metadata: Google
/// signed that body, but its keys serve every project, so it is the job's own only once the
/// status API, asked with our key, has answered for the operation; then it travels as
/// `user_metadata` (a registration's still wins). A token's never does: nothing binds its
/// claims to the operation.
pub const SIGNED_USER_METADATA: &str = "signed_user_metadata";

/// What one path learned about an outcome, before it becomes details.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// Output locations, first one first; duplicates are dropped.
    pub output_file_uris: Vec<String>,
    /// String or number, as the provider gave it.
    pub error_code: Option<Value>,
    pub error_message: Option<String>,
    pub provider: Map<String, Value>,
}

impl Outcome {
    /// Adds an output location unless it is empty or already known.
    pub fn add_output(&mut self, uri: &str) {
        let uri = uri.trim();
        if !uri.is_empty() && !self.output_file_uris.iter().any(|u| u == uri) {
            self.output_file_uris.push(uri.to_string());
        }
    }

    /// Takes `code` and `message` of an error object (google.rpc.Status, or an interaction's
    /// `errors[]` entry) unless an error is already known; other members go to `provider`.
    pub fn take_error(&mut self, error: &Value) {
        let Value::Object(error) = error else { return };
        for (k, v) in error {
            match k.as_str() {
                "code" => self.set_error_code(v),
                "message" => self.set_error_message(v),
                "details" => {
                    self.provider.entry("error_details").or_insert(v.clone());
                }
                other => {
                    self.provider
                        .entry(format!("error_{other}"))
                        .or_insert(v.clone());
                }
            }
        }
    }

    /// A string or number code is kept as given; anything else is provider detail.
    fn set_error_code(&mut self, code: &Value) {
        if self.error_code.is_some() {
            return;
        }
        match code {
            Value::String(_) | Value::Number(_) => self.error_code = Some(code.clone()),
            Value::Null => {}
            other => {
                self.provider.insert(ERROR_CODE.into(), other.clone());
            }
        }
    }

    fn set_error_message(&mut self, message: &Value) {
        if self.error_message.is_some() {
            return;
        }
        match message {
            Value::String(m) => self.error_message = Some(m.clone()),
            Value::Null => {}
            other => {
                self.provider.insert(ERROR_MESSAGE.into(), other.clone());
            }
        }
    }

    /// The normalized details: the five outcome fields, always present, each within the
    /// bounds of [`crate::bounds`] (this is where everything Gemini said enters a record).
    pub fn into_details(self) -> Map<String, Value> {
        let mut provider = self.provider;
        let (uris, omitted) = bounds::bound_uris(self.output_file_uris);
        if omitted > 0 {
            let earlier = provider.get(bounds::URIS_OMITTED).and_then(Value::as_u64);
            provider.insert(
                bounds::URIS_OMITTED.into(),
                json!(earlier.unwrap_or(0) + omitted),
            );
        }
        let mut details = Map::new();
        details.insert(
            OUTPUT_FILE_URI.into(),
            uris.first()
                .map_or(Value::Null, |u| Value::String(u.clone())),
        );
        details.insert(
            OUTPUT_FILE_URIS.into(),
            Value::Array(uris.into_iter().map(Value::String).collect()),
        );
        let code = match self.error_code {
            Some(Value::String(s)) => Value::String(bounds::bound_string(s)),
            other => other.unwrap_or(Value::Null),
        };
        details.insert(ERROR_CODE.into(), code);
        details.insert(
            ERROR_MESSAGE.into(),
            self.error_message
                .map_or(Value::Null, |m| Value::String(bounds::bound_string(m))),
        );
        details.insert(
            PROVIDER.into(),
            Value::Object(bounds::bound_provider(provider)),
        );
        details
    }
}

/// Turns any details into the one documented shape: a webhook's `data` (without its `id`),
/// a status-API observation's details (already normalized: unchanged), or a record stored by
/// an older version (`output_file`, `gemini_state`, `gemini_status` at the top level).
/// Idempotent. `user_metadata` and `unverified_user_metadata` pass through untouched, unless
/// over the bounds of [`crate::bounds`] (then a marker says so); so does everything else.
pub fn normalize_details(raw: &Map<String, Value>) -> Map<String, Value> {
    let mut outcome = Outcome::default();
    let mut passthrough = Map::new();
    // Locations first, in a fixed order, so the first location does not depend on key order.
    for field in [OUTPUT_FILE_URI, VIDEO_URI, "output_file"] {
        if let Some(Value::String(uri)) = raw.get(field) {
            outcome.add_output(uri);
        }
    }
    if let Some(Value::Array(uris)) = raw.get(OUTPUT_FILE_URIS) {
        for uri in uris.iter().filter_map(Value::as_str) {
            outcome.add_output(uri);
        }
    }
    if let Some(code) = raw.get(ERROR_CODE) {
        outcome.set_error_code(code);
    }
    if let Some(message) = raw.get(ERROR_MESSAGE) {
        outcome.set_error_message(message);
    }
    for (k, v) in raw {
        match k.as_str() {
            OUTPUT_FILE_URIS | ERROR_CODE | ERROR_MESSAGE => {}
            OUTPUT_FILE_URI | VIDEO_URI | "output_file" if v.is_string() || v.is_null() => {}
            USER_METADATA | UNVERIFIED_USER_METADATA => {
                passthrough.insert(k.clone(), bounds::bound(v.clone()));
            }
            PROVIDER if v.is_object() => {
                if let Value::Object(p) = v {
                    for (pk, pv) in p {
                        outcome.provider.insert(pk.clone(), pv.clone());
                    }
                }
            }
            "error" => outcome.take_error(v),
            "errors" => {
                if let Some(first) = v.as_array().and_then(|a| a.first()) {
                    outcome.take_error(first);
                }
                if v.as_array().is_none_or(|a| a.len() > 1) {
                    outcome.provider.insert("errors".into(), v.clone());
                }
            }
            "gemini_state" | "gemini_status" => {
                outcome.provider.entry("state").or_insert(v.clone());
            }
            other => {
                outcome.provider.insert(other.to_string(), v.clone());
            }
        }
    }
    let mut details = outcome.into_details();
    details.extend(passthrough);
    details
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizing_is_idempotent() {
        for data in [
            json!({"output_file_uri": "gs://a", "file_name": "f", "user_metadata": {"j": 1}}),
            json!({"error_code": "X", "error_message": "m", "errors": [{"code": "X"}, {"code": "Y"}]}),
            json!({"output_file_uris": ["files/a", "files/b"], "provider": {"state": "S"}}),
            json!({"error": {"code": 5, "message": "gone", "details": [{"@type": "t"}]}}),
            json!({"error_code": {"weird": true}, "output_file_uri": 7}),
        ] {
            let once = normalize_details(data.as_object().unwrap());
            assert_eq!(normalize_details(&once), once, "{data}");
        }
    }
}
