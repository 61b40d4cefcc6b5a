//! `/healthz`: whether the worker's configuration parses, and what it warns about.
//!
//! Guarantees: a configuration that does not parse answers 503 naming the variable (as every
//! route does); one that parses answers 200, with its warnings when it has any.

use serde_json::json;
use worker::{web_sys, Env};

use crate::edge::raw_response;
use crate::edge::runtime::load_config;
use crate::refusal::Refusal;

/// `GET` or `HEAD /healthz`.
pub fn answer(env: &Env) -> std::result::Result<web_sys::Response, Refusal> {
    let warnings = load_config(env).map_err(Refusal::Config)?.warnings();
    if warnings.is_empty() {
        return raw_response::json_text(200, r#"{"ok":true}"#, None).map_err(Refusal::from);
    }
    raw_response::json(200, &json!({"ok": true, "warnings": warnings})).map_err(Refusal::from)
}
