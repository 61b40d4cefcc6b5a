//! The two parts of an alert every sender shares, whoever raises it (an operation's gate, a
//! destination's desk): its readable line and its ASCII id. A room of its own, below both, so
//! the desk can word its alerts as the gate does without depending on the operation's room.

use sha2::{Digest, Sha256};

/// An alert's readable line: `gemini-once <alert>: <name> (<kind>) <what>` (for a
/// destination, its short name and `destination`).
pub fn text(alert: &str, name: &str, kind: &str, what: &str) -> String {
    format!("gemini-once {alert}: {name} ({kind}) {what}")
}

/// `alert_<24 hex digits>` for what tells one alert from every other: ASCII whatever the
/// text (an `alert-id` header must be; a destination's label holds a `…`).
pub fn hashed_id(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    format!("alert_{}", crate::hex(&digest, 12))
}
