//! Where a side effect goes ([`Destination`], as configured and as a result sender is told),
//! and a destination's label, as the configuration writes it (`EFFECT_URL: <origin>`, `route
//! <kind>: <origin>`; see `Config::destination_label`), read back into the short name that
//! `/metrics` labels and the dashboard's links use, and the host it shows.
//!
//! Guarantees: the short name is the route's kind, or [`DEFAULT_DESTINATION`] for
//! `EFFECT_URL`; neither it nor the host holds a path, a query or a credential (the label never
//! held one). Pure.

/// Where a side effect goes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Destination {
    /// POSTed over HTTPS (or HTTP locally), signed the Standard Webhooks way.
    Url(String),
    /// Sent to a Cloudflare Queue through this producer binding: a successful send is done
    /// (the queue is durable; its consumer dedupes by the idempotency key the message carries).
    Queue(String),
    /// POSTed to another Worker through this service binding, signed like an HTTPS one.
    Service(String),
}

/// The name `EFFECT_URL`'s destination goes by in `/metrics` and the dashboard's links.
pub const DEFAULT_DESTINATION: &str = "default";

/// A destination's label (`Config::destination_label`) split into its short name (the
/// route's kind, or [`DEFAULT_DESTINATION`] for `EFFECT_URL`) and what it shows of the target
/// (a URL's origin, `queue:<binding>`, `service:<binding>`). A label of another shape is its
/// own name, with nothing shown.
pub fn destination_parts(label: &str) -> (&str, &str) {
    if let Some(shown) = label.strip_prefix("EFFECT_URL: ") {
        return (DEFAULT_DESTINATION, shown);
    }
    // A shown target never holds ": " (an origin, or a binding's name), a route's kind may.
    label
        .strip_prefix("route ")
        .and_then(|rest| rest.rsplit_once(": "))
        .unwrap_or((label, ""))
}

/// The host a shown target names (`https://user@h:8443/…` gives `h:8443`); a binding as it
/// is shown (`queue:<binding>`, `service:<binding>`).
pub fn destination_host(shown: &str) -> &str {
    match shown.split_once("://") {
        Some((_, rest)) => rest.split(['/', '?', '#']).next().unwrap_or(rest),
        None => shown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_of_every_shape_split() {
        assert_eq!(
            destination_parts("EFFECT_URL: http://127.0.0.1:9/\u{2026}"),
            ("default", "http://127.0.0.1:9/\u{2026}")
        );
        assert_eq!(
            destination_parts("route py: https://h:1/\u{2026}"),
            ("py", "https://h:1/\u{2026}")
        );
        assert_eq!(
            destination_parts("route a: b: queue:Q"),
            ("a: b", "queue:Q")
        );
        assert_eq!(destination_parts("odd"), ("odd", ""));
        assert_eq!(destination_host("https://h:1/\u{2026}"), "h:1");
        assert_eq!(destination_host("http://h"), "h");
        assert_eq!(destination_host("service:P"), "service:P");
    }
}
