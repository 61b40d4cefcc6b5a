//! A destination paused by hand, as the admin API takes it and answers it
//! (`POST /v1/destinations/{name}/pause` and `…/resume`; the desk keeps the pause,
//! [`crate::destination::desk::Desk::pause`]).
//!
//! Guarantees: a pause names who asked (the admin API's caller) and needs a reason, so the
//! dashboard can say who paused and why; a body other than `{"reason": "...", "dry_run": bool}`
//! is refused with what it must be; a dry run changes nothing and answers how many effects wait
//! at the desk now. The answer says from when a pause holds every first attempt
//! ([`CLEAR_MEMORY_MS`] after it: an isolate that heard from the desk just before may let one go
//! until then).

use serde::Deserialize;
use serde_json::{json, Value};

use crate::destination::protocol::{DeskView, CLEAR_MEMORY_MS};
use crate::operator::listing::kept_reason;
use crate::timestamp::format_rfc3339;

/// A pause or a resume, as asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PauseRequest {
    pub reason: String,
    pub dry_run: bool,
}

/// Reads the body of a pause (`pausing`) or a resume. A pause needs a reason; a resume's is
/// optional (`operator` when none is given).
pub fn parse(body: &[u8], pausing: bool) -> Result<PauseRequest, String> {
    #[derive(Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct Body {
        reason: Option<String>,
        #[serde(default)]
        dry_run: bool,
    }
    let shape = "body must be {\"reason\": \"...\", \"dry_run\": true|false}";
    let parsed: Body = match body.iter().all(u8::is_ascii_whitespace) {
        true => Body::default(),
        false => serde_json::from_slice(body).map_err(|_| shape.to_string())?,
    };
    let reason = kept_reason(parsed.reason);
    if reason.is_empty() && pausing {
        return Err(format!(
            "a pause needs a reason, shown with it on the dashboard: {shape}"
        ));
    }
    let reason = Some(reason).filter(|r| !r.is_empty());
    Ok(PauseRequest {
        reason: reason.unwrap_or_else(|| "operator".to_string()),
        dry_run: parsed.dry_run,
    })
}

/// The answer to a pause or a resume of the destination `name`: the desk as it now stands,
/// whether this request changed it, and what waits (what the pause holds, or the resume
/// releases, soonest first).
pub fn answer(name: &str, dry_run: bool, changed: bool, view: &DeskView) -> Value {
    let pause = view.paused.as_ref().map(|p| {
        json!({
            "by": p.by,
            "reason": p.reason,
            "at": format_rfc3339(p.at_ms),
            "holds_every_attempt_from": format_rfc3339(p.at_ms + CLEAR_MEMORY_MS),
        })
    });
    json!({
        "destination": name,
        "label": view.label,
        "dry_run": dry_run,
        "changed": changed,
        "state": view.state,
        "paused": pause,
        "waiting": view.waiting,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::destination::protocol::{Pace, PauseNote};

    fn view(paused: bool) -> DeskView {
        DeskView {
            label: "EFFECT_URL: https://x".into(),
            state: if paused { "paused" } else { "healthy" }.into(),
            waiting: 7,
            in_flight: 0,
            failures_in_row: 0,
            last_error: None,
            opened_at_ms: None,
            pace: Pace::default(),
            calls: 0,
            paused: paused.then(|| PauseNote {
                by: json!({"scope": "admin", "fingerprint": "1a2b3c4d"}),
                reason: "planned maintenance".into(),
                at_ms: 1_700_000_000_000,
            }),
        }
    }

    #[test]
    fn a_pause_needs_a_reason_and_a_resume_does_not() {
        assert!(parse(b"", true).unwrap_err().contains("needs a reason"));
        assert!(parse(br#"{"reason": "  "}"#, true).is_err());
        assert_eq!(
            parse(br#"{"reason": "db migration", "dry_run": true}"#, true).unwrap(),
            PauseRequest {
                reason: "db migration".into(),
                dry_run: true
            }
        );
        assert_eq!(parse(b"", false).unwrap().reason, "operator");
        assert!(!parse(b"", false).unwrap().dry_run);
    }

    #[test]
    fn a_body_of_another_shape_is_refused_with_the_shape() {
        for bad in [
            &b"[1]"[..],
            b"{\"reason\": 3}",
            b"{\"dryrun\": true}",
            b"nope",
        ] {
            assert!(parse(bad, false).unwrap_err().contains("body must be"));
        }
    }

    #[test]
    fn the_answer_names_who_paused_why_and_from_when_it_holds_every_attempt() {
        let a = answer("default", false, true, &view(true));
        assert_eq!(a["state"], "paused");
        assert_eq!(a["changed"], true);
        assert_eq!(a["waiting"], 7);
        assert_eq!(a["paused"]["reason"], "planned maintenance");
        assert_eq!(a["paused"]["by"]["fingerprint"], "1a2b3c4d");
        assert_eq!(a["paused"]["at"], "2023-11-14T22:13:20Z");
        assert_eq!(
            a["paused"]["holds_every_attempt_from"],
            "2023-11-14T22:13:30Z"
        );
        let resumed = answer("default", true, false, &view(false));
        assert_eq!(resumed["paused"], Value::Null);
        assert_eq!(resumed["dry_run"], true);
    }
}
