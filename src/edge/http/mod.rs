//! The worker's HTTP routes: Gemini's webhooks (static and dynamic), the admin API (and its
//! JSON answers), `/metrics`, the dashboard page and `/healthz`. An error becomes an HTTP
//! answer in `edge/error.rs`, the one place.

pub mod admin_api;
pub mod admin_body;
pub mod bulk;
pub mod dashboard;
pub mod destinations;
pub mod dynamic_webhook;
pub mod health;
pub mod json_answer;
pub mod listing;
pub mod metrics;
pub mod one_operation;
pub mod results_routes;
pub mod webhook;
