//! The operator's dashboard: one static HTML page (`dashboard.html`), no build step, no data
//! of its own; it calls the admin API with the operator's token.
//!
//! Guarantees: the page is answered with a content security policy that lets it run only its
//! own inline script and style and call only this worker, and is never cached.

use worker::{web_sys, Headers, Response};

use crate::refusal::Refusal;

/// The page.
const DASHBOARD: &str = include_str!("dashboard.html");

/// `GET /dashboard`.
pub fn page() -> std::result::Result<web_sys::Response, Refusal> {
    let headers = Headers::new();
    headers.set("content-type", "text/html; charset=utf-8")?;
    let csp = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; form-action 'none'; frame-ancestors 'none'";
    headers.set("content-security-policy", csp)?;
    headers.set("cache-control", "no-store")?;
    Ok(Response::ok(DASHBOARD)?.with_headers(headers).into())
}
