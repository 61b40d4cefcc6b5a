//! Alert formats: one alert body (the worker's own JSON, [`crate::operation::alert::body`])
//! turned into what the configured sink takes: that JSON itself, Slack's or Discord's
//! incoming-webhook message, or a PagerDuty Events API v2 event.
//!
//! Guarantees: every format says the same thing: the alert's kind, the operation (or the
//! destination, or the webhook), the reason, and, when a dashboard is configured, a link to
//! the page about it ([`page_link`]: the operation's `#op/<key>`, the destination's row). A condition and the alert that says it ended share one [`dedup_key`]
//! (`gemini-once:<condition>:<subject>`), so PagerDuty resolves the incident the trigger
//! opened. Each format stays inside its tool's documented limits: Slack's `text` is always
//! there, Discord's `content` is at most 2000 characters and pings nobody, PagerDuty's
//! `summary` at most 1024 characters with a documented `severity`. The `alert-id` header
//! ([`header_id`]) and every link are ASCII, as HTTP header values and URLs must be. Pure: the
//! edge sends what this returns.

use serde_json::{json, Value};

/// PagerDuty's Events API v2 endpoint: where `ALERT_FORMAT=pagerduty` sends when `ALERT_URL`
/// is unset.
pub const PAGERDUTY_EVENTS_URL: &str = "https://events.pagerduty.com/v2/enqueue";
/// Discord refuses a message whose `content` is longer.
pub const DISCORD_CONTENT_MAX_CHARS: usize = 2_000;
/// PagerDuty truncates (or refuses) a longer `payload.summary`.
pub const PAGERDUTY_SUMMARY_MAX_CHARS: usize = 1_024;

/// `ALERT_FORMAT`'s words, in [`AlertFormat::ALL`]'s order.
pub const FORMAT_NAMES: [&str; 4] = ["json", "slack", "discord", "pagerduty"];

/// The shape alerts are sent in (`ALERT_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlertFormat {
    /// The worker's own JSON (`docs/alert.schema.json`), as it always was.
    Json,
    /// A Slack incoming webhook: `{"text", "blocks"}`.
    Slack,
    /// A Discord webhook: `{"content", "allowed_mentions"}`.
    Discord,
    /// PagerDuty Events API v2: `trigger`, then `resolve` under the same `dedup_key`.
    PagerDuty,
}

impl AlertFormat {
    /// Every format, as `ALERT_FORMAT` spells it.
    pub const ALL: [AlertFormat; 4] = [
        AlertFormat::Json,
        AlertFormat::Slack,
        AlertFormat::Discord,
        AlertFormat::PagerDuty,
    ];

    pub fn as_str(self) -> &'static str {
        FORMAT_NAMES[self as usize]
    }

    /// The format `ALERT_FORMAT` names (case and spaces aside), if any.
    pub fn parse(text: &str) -> Option<AlertFormat> {
        let text = text.trim().to_ascii_lowercase();
        Self::ALL.into_iter().find(|f| f.as_str() == text)
    }

    /// The format when `ALERT_FORMAT` is unset: read from the sink's URL, since a Slack or
    /// Discord webhook refuses the worker's own JSON (it has no `text` or `content`).
    pub fn inferred(url: Option<&str>) -> AlertFormat {
        let Some(url) = url else {
            return AlertFormat::Json;
        };
        let host = url
            .split_once("://")
            .map_or(url, |(_, rest)| rest)
            .split(['/', '?', '#'])
            .next()
            .unwrap_or("")
            .to_ascii_lowercase();
        let path = url.to_ascii_lowercase();
        match host.as_str() {
            "hooks.slack.com" => AlertFormat::Slack,
            "discord.com" | "discordapp.com" | "ptb.discord.com" | "canary.discord.com"
                if path.contains("/api/webhooks/") =>
            {
                AlertFormat::Discord
            }
            _ => AlertFormat::Json,
        }
    }
}

/// Where and how alerts go: the format, PagerDuty's routing key, the dashboard's address.
#[derive(Debug, Clone, Copy)]
pub struct Sink<'a> {
    pub format: AlertFormat,
    /// `ALERT_ROUTING_KEY` (PagerDuty's integration key).
    pub routing_key: Option<&'a str>,
    /// `ALERT_DASHBOARD_URL`: linked from every message.
    pub dashboard: Option<&'a str>,
}

/// Whether an alert opens a condition or says it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Trigger,
    Resolve,
}

impl Action {
    /// A body with `resolves` (the kind of the condition that ended) is a resolution.
    pub fn of(body: &Value) -> Action {
        match body["resolves"].as_str() {
            Some(_) => Action::Resolve,
            None => Action::Trigger,
        }
    }
}

/// The condition an alert is about: its own kind for a trigger, `resolves` for a resolution.
fn condition(body: &Value) -> &str {
    body["resolves"]
        .as_str()
        .or_else(|| body["alert"].as_str())
        .unwrap_or("alert")
}

/// What the alert names: the operation's key (a destination's alerts carry its label there),
/// else the name (a webhook).
fn subject(body: &Value) -> &str {
    ["key", "name"]
        .iter()
        .find_map(|field| body[*field].as_str().filter(|s| !s.is_empty()))
        .unwrap_or("gemini-once")
}

/// One key per condition, the same for its trigger and its resolution:
/// `gemini-once:<condition>:<subject>`.
pub fn dedup_key(body: &Value) -> String {
    format!("gemini-once:{}:{}", condition(body), subject(body))
}

/// How loud a condition is in PagerDuty: work that cannot go on by itself is `error` (an
/// alarm that keeps failing, `critical`), what only may need a person is `warning`.
pub fn severity(body: &Value) -> &'static str {
    match condition(body) {
        "alarm_failing" => "critical",
        "effect_failing"
        | "destination_open"
        | "webhook_disabled"
        | "record_unreadable"
        | "results_file_parked"
        | "results_failing"
        | "results_sender_failing" => "error",
        "stuck" | "unknown_to_gemini" | "status_unusable" | "stranger_nudges" => "warning",
        _ => "info",
    }
}

/// The dashboard's page about the alert's subject: the operation's (`#op/<key>`), the
/// destination's row on the issues page (`#issues?destination=<name>`), else the dashboard.
/// Whatever was configured after a `#` is replaced; the subject is percent-encoded, so the
/// link is ASCII.
pub fn page_link(body: &Value, dashboard: &str) -> String {
    let base = dashboard.split('#').next().unwrap_or(dashboard);
    // About a destination (a desk's `destination_open` or `destination_recovered`: its key is
    // the destination's label), not about an operation.
    if body["destination"].is_string() && body["key"] == body["destination"] {
        let label = body["destination"].as_str().unwrap_or_default();
        let (name, _) = crate::destination_label::destination_parts(label);
        return format!("{base}#issues?destination={}", uri_component(name));
    }
    match body["key"].as_str().filter(|k| !k.is_empty()) {
        Some(key) => format!("{base}#op/{}", uri_component(key)),
        None => base.to_string(),
    }
}

/// `text` as JavaScript's `encodeURIComponent` writes it (what the dashboard decodes).
fn uri_component(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' => out.push(byte as char),
            b'-' | b'_' | b'.' | b'!' | b'~' | b'*' | b'\'' | b'(' | b')' => out.push(byte as char),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

/// The `alert-id` header's value: the alert's id when it is printable ASCII (every id the
/// worker makes is), else a digest of it, since a header value must be ASCII.
pub fn header_id(body: &Value) -> Option<String> {
    let id = body["alert_id"].as_str()?;
    Some(match id.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        true => id.to_string(),
        false => crate::alert_line::hashed_id(id),
    })
}

/// The readable line every chat format sends: what happened, to what, why, and where to look
/// (`dashboard`: the page about it, from [`page_link`]).
pub fn line(body: &Value, dashboard: Option<&str>) -> String {
    let head = match Action::of(body) {
        Action::Trigger => "ALERT",
        Action::Resolve => "RESOLVED",
    };
    let what = body["text"].as_str().unwrap_or("gemini-once alert");
    let mut text = format!("[{head}] {what}");
    if let Some(destination) = body["destination"]
        .as_str()
        .filter(|_| body["key"] != body["destination"])
    {
        text.push_str(&format!(" (destination: {destination})"));
    }
    if let Some(url) = dashboard {
        text.push_str(&format!(" | dashboard: {url}"));
    }
    text
}

/// At most `max` characters of `text`, ending in `…` when cut.
fn clipped(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// The body the sink receives for the worker's alert `body`.
pub fn render(sink: Sink<'_>, body: &Value) -> Value {
    let link = sink.dashboard.map(|d| page_link(body, d));
    let link = link.as_deref();
    match sink.format {
        // The worker's own JSON, with the link to its dashboard page when one is configured.
        AlertFormat::Json => {
            let mut out = body.clone();
            if let (Some(url), Some(map)) = (link, out.as_object_mut()) {
                map.insert("dashboard".into(), json!(url));
            }
            out
        }
        AlertFormat::Slack => slack(body, link),
        AlertFormat::Discord => json!({
            "content": clipped(&line(body, link), DISCORD_CONTENT_MAX_CHARS),
            // Text from outside (an operation's name, a destination's answer) pings nobody.
            "allowed_mentions": {"parse": []},
        }),
        AlertFormat::PagerDuty => pagerduty(body, sink.routing_key, link),
    }
}

/// Slack: `text` (required, and what notifications show; escaped, since Slack reads it as
/// markup) and a plain-text section block, with the dashboard's link in a context block.
fn slack(body: &Value, dashboard: Option<&str>) -> Value {
    let text = line(body, None);
    let mut blocks = vec![
        json!({"type": "section", "text": {"type": "plain_text", "text": clipped(&text, 3_000)}}),
    ];
    if let Some(url) = dashboard {
        blocks.push(json!({"type": "context", "elements": [
            {"type": "mrkdwn", "text": format!("<{url}|Open it in the dashboard>")}
        ]}));
    }
    // Escaped (`&`, `<`, `>`): text from outside (a name, a destination's answer) can then
    // neither mention `<!channel>` nor forge a link.
    let text = line(body, dashboard)
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    json!({"text": text, "blocks": blocks})
}

/// PagerDuty Events API v2: a trigger with its payload, or a resolve naming the same key.
fn pagerduty(body: &Value, routing_key: Option<&str>, link: Option<&str>) -> Value {
    let resolve = Action::of(body) == Action::Resolve;
    let mut event = json!({
        "routing_key": routing_key.unwrap_or(""),
        "event_action": if resolve { "resolve" } else { "trigger" },
        "dedup_key": dedup_key(body),
    });
    if resolve {
        return event;
    }
    event["payload"] = json!({
        "summary": clipped(&line(body, None), PAGERDUTY_SUMMARY_MAX_CHARS),
        "source": subject(body),
        "severity": severity(body),
        "component": "gemini-once",
        "class": condition(body),
        "custom_details": body,
    });
    if let Some(url) = link {
        event["links"] = json!([{"href": url, "text": "gemini-once dashboard"}]);
    }
    event
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stuck() -> Value {
        json!({"alert": "stuck", "alert_id": "alert_1", "key": "batches/a", "name": "batches/a",
               "kind": "report", "age_seconds": 21_600,
               "text": "gemini-once stuck: batches/a (report) still running after 6h 0m"})
    }

    fn settled() -> Value {
        json!({"alert": "stuck_settled", "resolves": "stuck", "alert_id": "alert_2",
               "key": "batches/a", "name": "batches/a", "kind": "report", "age_seconds": 22_000,
               "text": "gemini-once stuck_settled: batches/a (report) has an outcome: succeeded"})
    }

    fn open() -> Value {
        json!({"alert": "destination_open", "alert_id": "alert_d1",
               "key": "EFFECT_URL: https://d", "destination": "EFFECT_URL: https://d",
               "age_seconds": 0, "text": "Destination EFFECT_URL: https://d is failing"})
    }

    fn recovered() -> Value {
        json!({"alert": "destination_recovered", "resolves": "destination_open",
               "key": "EFFECT_URL: https://d", "destination": "EFFECT_URL: https://d",
               "age_seconds": 30, "text": "Destination EFFECT_URL: https://d recovered after 30 s"})
    }

    const PD: Sink<'static> = Sink {
        format: AlertFormat::PagerDuty,
        routing_key: Some("R0UT1NG"),
        dashboard: Some("https://once.example/dashboard"),
    };

    #[test]
    fn formats_are_read_from_the_setting_or_the_sink_url() {
        assert_eq!(
            AlertFormat::parse(" PagerDuty "),
            Some(AlertFormat::PagerDuty)
        );
        assert_eq!(AlertFormat::parse("teams"), None);
        let inferred = |u| AlertFormat::inferred(Some(u));
        assert_eq!(
            inferred("https://hooks.slack.com/services/T/B/x"),
            AlertFormat::Slack
        );
        assert_eq!(
            inferred("https://discord.com/api/webhooks/1/x"),
            AlertFormat::Discord
        );
        assert_eq!(
            inferred("https://discordapp.com/api/webhooks/1/x"),
            AlertFormat::Discord
        );
        assert_eq!(
            inferred("https://discord.com/channels/1"),
            AlertFormat::Json
        );
        assert_eq!(
            inferred("https://alerts.example/hooks.slack.com"),
            AlertFormat::Json
        );
        assert_eq!(AlertFormat::inferred(None), AlertFormat::Json);
    }

    #[test]
    fn the_setting_lists_every_format() {
        assert_eq!(AlertFormat::ALL.map(AlertFormat::as_str), FORMAT_NAMES);
    }

    #[test]
    fn json_is_the_alert_itself() {
        let sink = Sink {
            format: AlertFormat::Json,
            routing_key: None,
            dashboard: None,
        };
        assert_eq!(render(sink, &stuck()), stuck());
        let linked = Sink {
            dashboard: Some("https://d/dashboard"),
            ..sink
        };
        assert_eq!(
            render(linked, &stuck())["dashboard"],
            "https://d/dashboard#op/batches%2Fa"
        );
    }

    #[test]
    fn slack_has_text_naming_the_operation_and_the_dashboard() {
        let sink = Sink {
            format: AlertFormat::Slack,
            ..PD
        };
        let out = render(sink, &stuck());
        let text = out["text"].as_str().unwrap();
        assert!(
            text.starts_with("[ALERT] gemini-once stuck: batches/a"),
            "{text}"
        );
        assert!(
            text.ends_with("dashboard: https://once.example/dashboard#op/batches%2Fa"),
            "{text}"
        );
        assert_eq!(out["blocks"][0]["type"], "section");
        let mut loud = stuck();
        loud["text"] = json!("<!channel> <https://evil.example|click> & more");
        let text = render(sink, &loud)["text"].as_str().unwrap().to_string();
        assert!(
            text.contains("&lt;!channel&gt; &lt;https://evil.example|click&gt; &amp; more"),
            "{text}"
        );
        assert!(render(sink, &settled())["text"]
            .as_str()
            .unwrap()
            .starts_with("[RESOLVED]"));
    }

    #[test]
    fn discord_content_stays_under_its_limit_and_pings_nobody() {
        let sink = Sink {
            format: AlertFormat::Discord,
            ..PD
        };
        let mut long = stuck();
        long["text"] = json!("@everyone ".repeat(500));
        let out = render(sink, &long);
        let content = out["content"].as_str().unwrap();
        assert_eq!(content.chars().count(), DISCORD_CONTENT_MAX_CHARS);
        assert!(content.ends_with('…'));
        assert_eq!(out["allowed_mentions"]["parse"], json!([]));
    }

    #[test]
    fn pagerduty_trigger_carries_the_documented_fields() {
        let out = render(PD, &stuck());
        assert_eq!(out["routing_key"], "R0UT1NG");
        assert_eq!(out["event_action"], "trigger");
        assert_eq!(out["dedup_key"], "gemini-once:stuck:batches/a");
        assert_eq!(out["payload"]["severity"], "warning");
        assert_eq!(out["payload"]["source"], "batches/a");
        assert!(out["payload"]["summary"]
            .as_str()
            .unwrap()
            .contains("batches/a"));
        assert_eq!(
            out["links"][0]["href"],
            "https://once.example/dashboard#op/batches%2Fa"
        );
        let mut long = stuck();
        long["text"] = json!("x".repeat(5_000));
        let summary = render(PD, &long)["payload"]["summary"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(summary.chars().count(), PAGERDUTY_SUMMARY_MAX_CHARS);
    }

    #[test]
    fn a_resolution_resolves_the_key_its_trigger_opened() {
        assert_eq!(
            render(PD, &settled()),
            json!({
            "routing_key": "R0UT1NG", "event_action": "resolve",
            "dedup_key": "gemini-once:stuck:batches/a"})
        );
        let trigger = render(PD, &open());
        let resolve = render(PD, &recovered());
        assert_eq!(trigger["dedup_key"], resolve["dedup_key"]);
        assert_eq!(
            trigger["dedup_key"],
            "gemini-once:destination_open:EFFECT_URL: https://d"
        );
        assert_eq!(trigger["payload"]["severity"], "error");
        assert_eq!(resolve["event_action"], "resolve");
    }

    #[test]
    fn each_alert_links_to_the_page_about_it() {
        let d = "https://once.example/dashboard#overview";
        assert_eq!(
            page_link(&stuck(), d),
            "https://once.example/dashboard#op/batches%2Fa"
        );
        let mut odd = stuck();
        odd["key"] = json!("batches/caf\u{e9} x&y");
        assert_eq!(
            page_link(&odd, d),
            "https://once.example/dashboard#op/batches%2Fcaf%C3%A9%20x%26y"
        );
        for body in [open(), recovered()] {
            assert_eq!(
                page_link(&body, d),
                "https://once.example/dashboard#issues?destination=default"
            );
        }
        let mut routed = open();
        routed["key"] = json!("route py: http://127.0.0.1:9/\u{2026}");
        routed["destination"] = routed["key"].clone();
        assert_eq!(
            page_link(&routed, d),
            "https://once.example/dashboard#issues?destination=py"
        );
        let webhook = json!({"alert": "webhook_disabled", "key": null, "name": "webhooks/w"});
        assert_eq!(page_link(&webhook, d), "https://once.example/dashboard");
        // An operation's alert names its destination too: it still links to the operation.
        let mut with_destination = stuck();
        with_destination["destination"] = json!("EFFECT_URL: https://d");
        assert!(page_link(&with_destination, d).ends_with("#op/batches%2Fa"));
    }

    #[test]
    fn the_alert_id_header_is_printable_ascii() {
        assert_eq!(header_id(&stuck()).as_deref(), Some("alert_1"));
        let mut odd = open();
        odd["alert_id"] = json!("destination-open:EFFECT_URL: https://d/\u{2026}:1");
        let id = header_id(&odd).unwrap();
        assert!(id.starts_with("alert_"), "{id}");
        assert!(id.bytes().all(|b| (0x20..0x7f).contains(&b)), "{id}");
        assert_eq!(header_id(&odd), Some(id), "the same on every retry");
        assert_eq!(header_id(&json!({"alert": "webhook_disabled"})), None);
    }

    #[test]
    fn the_results_alerts_are_errors_that_their_resolutions_close() {
        for (condition, resolution) in [
            ("results_file_parked", "results_file_read"),
            ("results_failing", "results_recovered"),
            ("results_sender_failing", "results_sender_recovered"),
        ] {
            let trigger = render(PD, &json!({"alert": condition, "key": "batches/a"}));
            assert_eq!(trigger["payload"]["severity"], "error");
            let resolve = render(
                PD,
                &json!({"alert": resolution, "resolves": condition, "key": "batches/a"}),
            );
            assert_eq!(resolve["event_action"], "resolve");
            assert_eq!(resolve["dedup_key"], trigger["dedup_key"]);
        }
    }

    #[test]
    fn every_condition_has_a_documented_severity() {
        for kind in [
            "alarm_failing",
            "effect_failing",
            "stuck",
            "webhook_reenabled",
            "results_file_parked",
            "other",
        ] {
            let s = severity(&json!({"alert": kind}));
            assert!(
                ["critical", "error", "warning", "info"].contains(&s),
                "{kind}: {s}"
            );
        }
    }
}
