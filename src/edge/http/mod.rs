//! The worker's HTTP routes: Gemini's webhooks (static and dynamic), the admin API, the
//! dashboard page and `/healthz`, their answers, and the one place an error becomes an HTTP
//! answer.

pub mod admin_api;
pub mod bulk;
pub mod dashboard;
pub mod dynamic_webhook;
pub mod error;
pub mod health;
pub mod json_answer;
pub mod raw_response;
pub mod webhook;
