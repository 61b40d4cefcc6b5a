//! An outcome's details: the one shape every path's details are normalized to, whatever
//! settled the outcome (docs/DESIGN.md, invariant 6; `docs/effect.schema.json`).
//!
//! Guarantees: every path (a webhook's `data`, a status-API answer, an operator's settle, a
//! confirmation's merge of a nudge's metadata, a record stored by an older version) goes through
//! [`normalize_details`] where it enters (the record takes an event's details as they come:
//! [`crate::operation::Operation::apply`]), so the details always have `output_file_uri`,
//! `output_file_uris`, `error_code`, `error_message` and `provider` (null or empty when the path
//! had nothing), and `user_metadata` / `unverified_user_metadata` only when given, passed through
//! untouched within the bounds below (past them, a marker that says so). Anything else the provider
//! said goes under `provider`, never loose at the top level. The side effect's body
//! ([`crate::operation::effect`]) is these details under its fixed fields.
//!
//! The bounds, here too (on what a record keeps from outside: user metadata, verified or not,
//! and whatever Gemini said: `provider` details, error texts, output locations): every value
//! that passes through [`bound`] is at most [`MAX_DEPTH`] containers deep and serializes to at most [`MAX_BYTES`] bytes; one that is not is replaced, whole, by
//! a marker object that says so (`{"truncated": true, "reason": "too_deep" | "too_large",
//! ...}`), and a string that is too long is cut and says so at its end. A `provider` map passed
//! through [`bound_provider`] serializes to at most [`PROVIDER_MAX_BYTES`]: members that do not
//! fit are left out and counted under `provider.truncated`. Output locations passed through
//! [`bound_uris`] fit in [`MAX_BYTES`] together. Every function is idempotent (a bounded value
//! is its own bound), so a record normalized again keeps its shape. With these bounds a record
//! nests its outside values a few levels below its top, far inside serde_json's limit of 128
//! levels on reading, so a record that was written always loads again, and so do the gate's
//! messages and answers that carry it.

use serde_json::{json, Map, Value};

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
/// Where a `v1a`-signed body's `user_metadata` waits in a confirmation's metadata: Google signed
/// that body, but its keys serve every project, so it is the job's own only once the status API,
/// asked with our key, has answered for the operation; then it travels as `user_metadata` (a
/// registration's still wins). A token's never does: nothing binds its claims to the operation.
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
                "code" => self.set_error(ERROR_CODE, v),
                "message" => self.set_error(ERROR_MESSAGE, v),
                other => {
                    self.provider
                        .entry(format!("error_{other}"))
                        .or_insert(v.clone());
                }
            }
        }
    }

    /// The error's `field` ([`ERROR_CODE`] or [`ERROR_MESSAGE`]) unless one is known: a
    /// string (or a code's number) is kept as given; anything else is provider detail.
    fn set_error(&mut self, field: &str, value: &Value) {
        let code = field == ERROR_CODE;
        match value {
            _ if code && self.error_code.is_some() => {}
            _ if !code && self.error_message.is_some() => {}
            Value::String(_) | Value::Number(_) if code => self.error_code = Some(value.clone()),
            Value::String(m) => self.error_message = Some(m.clone()),
            Value::Null => {}
            other => {
                self.provider.insert(field.into(), other.clone());
            }
        }
    }

    /// The normalized details: the five outcome fields, always present, each within the
    /// bounds below (this is where everything Gemini said enters a record).
    pub fn into_details(self) -> Map<String, Value> {
        let mut provider = self.provider;
        let (uris, omitted) = bound_uris(self.output_file_uris);
        if omitted > 0 {
            let earlier = provider.get(URIS_OMITTED).and_then(Value::as_u64);
            provider.insert(URIS_OMITTED.into(), json!(earlier.unwrap_or(0) + omitted));
        }
        let code = match self.error_code {
            Some(Value::String(s)) => Value::String(bound_string(s)),
            other => other.unwrap_or(Value::Null),
        };
        let message = json!(self.error_message.map(bound_string));
        Map::from_iter([
            (OUTPUT_FILE_URI.into(), json!(uris.first())),
            (OUTPUT_FILE_URIS.into(), json!(uris)),
            (ERROR_CODE.into(), code),
            (ERROR_MESSAGE.into(), message),
            (PROVIDER.into(), Value::Object(bound_provider(provider))),
        ])
    }
}

/// Turns any details into the one documented shape: a webhook's `data` (without its `id`),
/// a status-API observation's details (already normalized: unchanged), or a record stored by
/// an older version (`output_file`, `gemini_state`, `gemini_status` at the top level).
/// Idempotent. `user_metadata` and `unverified_user_metadata` pass through untouched, unless
/// over the bounds below (then a marker says so); so does everything else.
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
    for field in [ERROR_CODE, ERROR_MESSAGE] {
        if let Some(value) = raw.get(field) {
            outcome.set_error(field, value);
        }
    }
    for (k, v) in raw {
        match k.as_str() {
            OUTPUT_FILE_URIS | ERROR_CODE | ERROR_MESSAGE => {}
            OUTPUT_FILE_URI | VIDEO_URI | "output_file" if v.is_string() || v.is_null() => {}
            USER_METADATA | UNVERIFIED_USER_METADATA => {
                passthrough.insert(k.clone(), bound(v.clone()));
            }
            PROVIDER if v.is_object() => {
                let members = v.as_object().cloned().unwrap_or_default();
                outcome.provider.extend(members);
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

/// Deepest nesting of containers (objects and arrays) kept in one outside value.
pub const MAX_DEPTH: usize = 32;
/// Largest serialized size (bytes) of one outside value.
pub const MAX_BYTES: usize = 16 * 1024;
/// Largest serialized size (bytes) of the whole `provider` map.
pub const PROVIDER_MAX_BYTES: usize = 64 * 1024;
/// Characters of the original JSON a marker shows, so an operator can tell what it was.
const PREVIEW_CHARS: usize = 200;
/// Room kept for the marker of omitted `provider` members.
const PROVIDER_MARKER_ROOM: usize = 512;
/// The `provider` member naming the members left out.
pub const PROVIDER_TRUNCATED: &str = "truncated";
/// The `provider` member counting output locations left out.
pub const URIS_OMITTED: &str = "output_file_uris_omitted";

/// Containers nested in `value`: 0 for a scalar, 1 for `{}` or `[1]`, ... (iterative, so a
/// deep value cannot exhaust the stack).
pub fn depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 0usize)];
    while let Some((v, d)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Object(m) => Box::new(m.values()),
            Value::Array(a) => Box::new(a.iter()),
            _ => {
                deepest = deepest.max(d);
                continue;
            }
        };
        deepest = deepest.max(d + 1);
        stack.extend(children.map(|c| (c, d + 1)));
    }
    deepest
}

/// True for a marker the bounds wrote.
pub fn is_marker(value: &Value) -> bool {
    value.get("truncated") == Some(&Value::Bool(true))
        && value.get("reason").is_some_and(Value::is_string)
}

/// The marker that replaces a value over a bound: why, how deep (when measured) and large it
/// was, the bounds, and the start of its JSON.
pub fn marker(reason: &str, found_depth: Option<usize>, bytes: usize, text: &str) -> Value {
    let mut marker = json!({
        "truncated": true,
        "reason": reason,
        "bytes": bytes,
        "max_depth": MAX_DEPTH,
        "max_bytes": MAX_BYTES,
        "preview": text.chars().take(PREVIEW_CHARS).collect::<String>(),
    });
    if let Some(found) = found_depth {
        marker["depth"] = json!(found);
    }
    marker
}

/// A string of at most [`MAX_BYTES`]: a longer one is cut and ends with a note of its length.
pub fn bound_string(s: String) -> String {
    if s.len() <= MAX_BYTES {
        return s;
    }
    let note = format!("\u{2026} [truncated: {} bytes]", s.len());
    // Cut on a character boundary.
    let end = s.floor_char_boundary(MAX_BYTES - note.len());
    format!("{}{note}", &s[..end])
}

/// One outside value within the bounds: itself if it fits, a cut string, or a marker.
pub fn bound(value: Value) -> Value {
    match value {
        Value::String(s) => Value::String(bound_string(s)),
        Value::Object(_) | Value::Array(_) => {
            let found = depth(&value);
            let text = value.to_string();
            let reason = match (found > MAX_DEPTH, text.len() > MAX_BYTES) {
                (true, _) => "too_deep",
                (false, true) => "too_large",
                (false, false) => return value,
            };
            marker(reason, Some(found), text.len(), &text)
        }
        scalar => scalar,
    }
}

/// Every member of `map` bounded (user metadata, a nudge's metadata).
pub fn bound_members(map: Map<String, Value>) -> Map<String, Value> {
    map.into_iter().map(|(k, v)| (k, bound(v))).collect()
}

/// The `provider` map within its bounds: each member bounded, then members kept in order while
/// they fit in [`PROVIDER_MAX_BYTES`]; the rest are left out and counted in a marker under
/// [`PROVIDER_TRUNCATED`] (whose count adds to one already there).
pub fn bound_provider(map: Map<String, Value>) -> Map<String, Value> {
    let budget = PROVIDER_MAX_BYTES - PROVIDER_MARKER_ROOM;
    let (mut kept, mut used) = (Map::new(), 2);
    let (mut omitted, mut earlier) = (0u64, 0u64);
    for (k, v) in map {
        if k == PROVIDER_TRUNCATED && is_marker(&v) {
            earlier = v["omitted_fields"].as_u64().unwrap_or(0);
            continue;
        }
        let v = bound(v);
        let size = k.len() + v.to_string().len() + 4;
        if used + size > budget {
            omitted += 1;
            continue;
        }
        used += size;
        kept.insert(k, v);
    }
    if omitted + earlier > 0 {
        let marker = json!({"truncated": true, "reason": "too_large",
            "omitted_fields": omitted + earlier, "max_bytes": PROVIDER_MAX_BYTES});
        kept.insert(PROVIDER_TRUNCATED.into(), marker);
    }
    kept
}

/// Output locations kept in order while they fit in [`MAX_BYTES`] together; returns them and
/// how many were left out.
pub fn bound_uris(uris: Vec<String>) -> (Vec<String>, u64) {
    let (mut kept, mut used, mut omitted) = (Vec::new(), 2, 0);
    for uri in uris {
        let size = uri.len() + 3;
        if used + size > MAX_BYTES {
            omitted += 1;
            continue;
        }
        used += size;
        kept.push(uri);
    }
    (kept, omitted)
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

#[cfg(test)]
mod bounds_tests {
    use super::*;

    /// `{"a": {"a": ... 1}}` with `levels` objects.
    fn nested(levels: usize) -> Value {
        let mut v = json!(1);
        for _ in 0..levels {
            v = json!({ "a": v });
        }
        v
    }

    /// The JSON text of `levels` nested objects, built as text (serde_json's own writer and
    /// reader recurse; this does not).
    fn nested_text(levels: usize) -> String {
        format!("{}1{}", "{\"a\":".repeat(levels), "}".repeat(levels))
    }

    #[test]
    fn depth_counts_containers() {
        assert_eq!(depth(&json!(1)), 0);
        assert_eq!(depth(&json!({})), 1);
        assert_eq!(depth(&json!([[], {"a": [1]}])), 3);
        assert_eq!(depth(&nested(MAX_DEPTH)), MAX_DEPTH);
    }

    #[test]
    fn a_value_at_the_bounds_is_kept_untouched() {
        let at = nested(MAX_DEPTH);
        assert_eq!(bound(at.clone()), at);
        let big = json!({"s": "x".repeat(MAX_BYTES - 8)});
        assert_eq!(big.to_string().len(), MAX_BYTES);
        assert_eq!(bound(big.clone()), big);
        let s = "é".repeat(MAX_BYTES / 2);
        assert_eq!(bound(json!(s.clone())), json!(s));
        for scalar in [json!(null), json!(true), json!(-3.5)] {
            assert_eq!(bound(scalar.clone()), scalar);
        }
    }

    #[test]
    fn a_value_past_the_depth_becomes_a_marker_that_says_so() {
        let m = bound(nested(MAX_DEPTH + 1));
        assert!(is_marker(&m), "{m}");
        assert_eq!(m["reason"], "too_deep");
        assert_eq!(m["depth"], MAX_DEPTH + 1);
        assert_eq!(m["max_depth"], MAX_DEPTH);
        assert!(m["preview"].as_str().unwrap().starts_with("{\"a\":{\"a\":"));
        assert_eq!(depth(&m), 1);
    }

    #[test]
    fn a_value_near_serde_json_s_limit_is_bounded_and_its_record_reads_again() {
        // The deepest text serde_json reads at all, as it would arrive in a body.
        let text = nested_text(127);
        let v: Value = serde_json::from_str(&text).unwrap();
        assert!(serde_json::from_str::<Value>(&nested_text(128)).is_err());
        let m = bound(v);
        assert_eq!(m["reason"], "too_deep");
        // Stored several levels deeper, it still reads back.
        let record = json!({"confirmation": {"metadata": {"unverified_user_metadata": m}}});
        let back: Value = serde_json::from_str(&record.to_string()).unwrap();
        assert_eq!(back, record);
    }

    #[test]
    fn a_value_past_the_size_becomes_a_marker_and_a_long_string_is_cut() {
        let m = bound(json!({"s": "x".repeat(MAX_BYTES)}));
        assert_eq!(m["reason"], "too_large");
        assert_eq!(m["bytes"], MAX_BYTES + 8);
        assert!(m.to_string().len() < 1_024);
        let s = bound_string("é".repeat(MAX_BYTES));
        assert!(s.len() <= MAX_BYTES, "{}", s.len());
        assert!(s.ends_with(&format!("[truncated: {} bytes]", 2 * MAX_BYTES)));
    }

    #[test]
    fn bounding_is_idempotent() {
        for v in [
            nested(MAX_DEPTH + 5),
            json!({"s": "x".repeat(3 * MAX_BYTES)}),
            json!("y".repeat(MAX_BYTES + 1)),
            json!([1, {"b": null}]),
        ] {
            let once = bound(v);
            assert_eq!(bound(once.clone()), once);
        }
        let mut p = Map::new();
        for i in 0..40 {
            p.insert(format!("f{i:02}"), json!("z".repeat(4_000)));
        }
        p.insert("deep".into(), nested(60));
        let once = bound_provider(p);
        assert_eq!(bound_provider(once.clone()), once);
        let (uris, omitted) = bound_uris(
            (0..10)
                .map(|i| format!("gs://{i}/{}", "u".repeat(3_000)))
                .collect(),
        );
        assert_eq!(bound_uris(uris.clone()), (uris, 0));
        assert!(omitted > 0);
    }

    #[test]
    fn provider_keeps_what_fits_and_counts_the_rest() {
        let mut p = Map::new();
        p.insert("state".into(), json!("BATCH_STATE_SUCCEEDED"));
        for i in 0..40 {
            p.insert(format!("f{i:02}"), json!("z".repeat(4_000)));
        }
        let b = bound_provider(p);
        assert!(Value::Object(b.clone()).to_string().len() <= PROVIDER_MAX_BYTES);
        assert_eq!(b["state"], "BATCH_STATE_SUCCEEDED");
        let kept = b.keys().filter(|k| k.starts_with('f')).count() as u64;
        assert_eq!(b[PROVIDER_TRUNCATED]["omitted_fields"], 40 - kept);
        assert!(is_marker(&b[PROVIDER_TRUNCATED]));
        let small: Map<String, Value> = json!({"a": 1, "b": nested(40)})
            .as_object()
            .unwrap()
            .clone();
        let b = bound_provider(small);
        assert_eq!(b["a"], 1);
        assert_eq!(b["b"]["reason"], "too_deep");
        assert!(!b.contains_key(PROVIDER_TRUNCATED));
    }

    #[test]
    fn uris_fit_together() {
        let (kept, omitted) = bound_uris(vec![
            "gs://a".into(),
            "x".repeat(MAX_BYTES),
            "gs://b".into(),
        ]);
        assert_eq!(kept, ["gs://a", "gs://b"]);
        assert_eq!(omitted, 1);
    }
}
