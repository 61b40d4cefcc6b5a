//! Conversions between Unix milliseconds and RFC 3339 text, and the HTTP date a peer's
//! `Retry-After` may carry. Never reads a clock: callers pass time in (inside a Worker, std's
//! clock panics), so every function here is pure.

use time::format_description::well_known::{Rfc2822, Rfc3339};
use time::OffsetDateTime;

/// Parses an RFC 3339 timestamp (`2026-01-22T12:00:00Z`, fractions and offsets allowed) into
/// Unix milliseconds. `None` for anything else.
pub fn parse_rfc3339_ms(text: &str) -> Option<i64> {
    let parsed = OffsetDateTime::parse(text.trim(), &Rfc3339).ok()?;
    i64::try_from(parsed.unix_timestamp_nanos() / 1_000_000).ok()
}

/// Parses an HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`, RFC 9110's IMF-fixdate) into Unix
/// milliseconds. `None` for anything else.
pub fn parse_http_date_ms(text: &str) -> Option<i64> {
    let text = text.trim();
    // IMF-fixdate is RFC 2822 with the zone spelled GMT, which time's parser reads as +0000.
    let numeric = text.strip_suffix(" GMT").map(|t| format!("{t} +0000"))?;
    let parsed = OffsetDateTime::parse(&numeric, &Rfc2822).ok()?;
    i64::try_from(parsed.unix_timestamp_nanos() / 1_000_000).ok()
}

/// Formats Unix milliseconds as RFC 3339 in UTC (`2026-01-22T12:00:00.123Z`).
pub fn format_rfc3339(ms: i64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_zulu_fraction_and_offset() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:01Z"), Some(1000));
        assert_eq!(
            parse_rfc3339_ms("2026-01-22T12:00:00.123456Z"),
            Some(1_769_083_200_123)
        );
        assert_eq!(
            parse_rfc3339_ms("2026-01-22T13:00:00+01:00"),
            Some(1_769_083_200_000)
        );
    }

    #[test]
    fn refuses_junk() {
        assert_eq!(parse_rfc3339_ms("yesterday"), None);
        assert_eq!(parse_rfc3339_ms(""), None);
        assert_eq!(parse_rfc3339_ms("2026-13-01T00:00:00Z"), None);
    }

    #[test]
    fn parses_an_http_date() {
        assert_eq!(
            parse_http_date_ms("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784_111_777_000)
        );
        assert_eq!(parse_http_date_ms("Sun, 06 Nov 1994 08:49:37 +0100"), None);
        assert_eq!(parse_http_date_ms("4"), None);
        assert_eq!(parse_http_date_ms("Sunday, 06-Nov-94 08:49:37 GMT"), None);
    }

    #[test]
    fn formats_and_round_trips() {
        assert_eq!(format_rfc3339(1000), "1970-01-01T00:00:01Z");
        let ms = 1_769_083_200_123;
        assert_eq!(parse_rfc3339_ms(&format_rfc3339(ms)), Some(ms));
    }
}
