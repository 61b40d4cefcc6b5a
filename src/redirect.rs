//! Following a redirect from a call that carries our Gemini API key, by hand: where the next
//! hop goes and whether the key may go with it.
//!
//! Guarantees: pure; a request with `x-goog-api-key` is sent with `redirect: "manual"`, and each
//! 3xx is followed only through [`next_hop`]: at most [`MAX_REDIRECTS`] hops, only to `http` or
//! `https`, for a `GET` only (a redirected `PATCH` is answered as its 3xx). The key goes only to
//! the origin (scheme, host and port) the call was first made to: a hop to another origin is
//! sent without it (a results file served from a signed storage URL needs none), so a status
//! answer or a download that redirects elsewhere never receives our key.

/// The header that carries our Gemini API key: never sent to another origin.
pub const KEY_HEADER: &str = "x-goog-api-key";

/// Redirects followed at most before the last 3xx is the answer.
pub const MAX_REDIRECTS: u32 = 5;

/// Where a redirect leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    /// The absolute URL of the next request.
    pub url: String,
    /// Whether it is on the first call's origin (the key may go with it).
    pub same_origin: bool,
}

/// The next request after an answer with `status` and `location` to a call to `current`
/// (first made to `first`); `None` when the answer is not a redirect to follow.
pub fn next_hop(first: &str, current: &str, status: u16, location: Option<&str>) -> Option<Hop> {
    if !matches!(status, 301 | 302 | 303 | 307 | 308) {
        return None;
    }
    let url = resolve(current, location?.trim())?;
    let same_origin = origin(&url)? == origin(first)?;
    Some(Hop { url, same_origin })
}

/// `location` as an absolute `http(s)` URL, read against `base`.
fn resolve(base: &str, location: &str) -> Option<String> {
    if location.is_empty() || location.chars().any(|c| c.is_control()) {
        return None;
    }
    let (scheme, rest) = base.split_once("://")?;
    let url = if has_scheme(location) {
        location.to_string()
    } else if let Some(authority) = location.strip_prefix("//") {
        format!("{scheme}://{authority}")
    } else {
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(authority_end);
        if location.starts_with('/') {
            format!("{scheme}://{authority}{location}")
        } else {
            let path = path.split(['?', '#']).next().unwrap_or("");
            let dir = &path[..path.rfind('/').map_or(0, |i| i + 1)];
            let dir = if dir.is_empty() { "/" } else { dir };
            format!("{scheme}://{authority}{dir}{location}")
        }
    };
    origin(&url).map(|_| url)
}

/// Whether `location` starts with a scheme (`name:`), so is absolute whatever follows.
fn has_scheme(location: &str) -> bool {
    location.split_once(':').is_some_and(|(scheme, _)| {
        scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    })
}

/// An URL's origin: its scheme and its host with its port (the scheme's default when none),
/// lowercased; `None` for anything but `http` and `https`.
fn origin(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => "80",
        "https" => "443",
        _ => return None,
    };
    let authority = rest.split(['/', '?', '#']).next()?;
    // Credentials in the authority never count toward the origin.
    let host_port = authority.rsplit('@').next()?.to_ascii_lowercase();
    if host_port.is_empty() {
        return None;
    }
    let has_port = host_port
        .rfind(':')
        .is_some_and(|i| !host_port[i..].contains(']'));
    Some(match has_port {
        true => format!("{scheme}://{host_port}"),
        false => format!("{scheme}://{host_port}:{default_port}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIRST: &str = "http://127.0.0.1:8000/download/v1beta/files/a:download?alt=media";

    #[test]
    fn a_redirect_to_another_port_is_another_origin() {
        let hop = next_hop(FIRST, FIRST, 302, Some("http://127.0.0.1:9000/f")).unwrap();
        assert_eq!(hop.url, "http://127.0.0.1:9000/f");
        assert!(!hop.same_origin);
    }

    #[test]
    fn a_redirect_on_the_same_origin_keeps_it() {
        let hop = next_hop(FIRST, FIRST, 307, Some("/other/path?x=1")).unwrap();
        assert_eq!(hop.url, "http://127.0.0.1:8000/other/path?x=1");
        assert!(hop.same_origin);
        let hop = next_hop(FIRST, FIRST, 301, Some("HTTP://127.0.0.1:8000/x")).unwrap();
        assert!(hop.same_origin, "the scheme's case does not matter");
        let hop = next_hop(FIRST, FIRST, 308, Some("next")).unwrap();
        assert_eq!(hop.url, "http://127.0.0.1:8000/download/v1beta/files/next");
    }

    #[test]
    fn the_default_port_is_the_same_origin_written_out() {
        let first = "https://generativelanguage.googleapis.com/v1beta/batches/a";
        let hop = next_hop(
            first,
            first,
            302,
            Some("https://generativelanguage.googleapis.com:443/b"),
        );
        assert!(hop.unwrap().same_origin);
        let hop = next_hop(
            first,
            first,
            302,
            Some("http://generativelanguage.googleapis.com/b"),
        );
        assert!(
            !hop.unwrap().same_origin,
            "another scheme is another origin"
        );
    }

    #[test]
    fn userinfo_or_a_scheme_relative_location_cannot_pass_for_our_origin() {
        let hop = next_hop(FIRST, FIRST, 302, Some("http://127.0.0.1:8000@evil:9000/")).unwrap();
        assert!(!hop.same_origin);
        let hop = next_hop(FIRST, FIRST, 302, Some("//evil.example/x")).unwrap();
        assert_eq!(hop.url, "http://evil.example/x");
        assert!(!hop.same_origin);
    }

    #[test]
    fn a_hop_is_judged_against_the_first_origin_not_the_last() {
        let elsewhere = "http://127.0.0.1:9000/f";
        let back = next_hop(FIRST, elsewhere, 302, Some("/g")).unwrap();
        assert_eq!(back.url, "http://127.0.0.1:9000/g");
        assert!(!back.same_origin);
    }

    #[test]
    fn what_is_not_a_redirect_to_follow() {
        assert_eq!(next_hop(FIRST, FIRST, 200, Some("/x")), None);
        assert_eq!(next_hop(FIRST, FIRST, 304, Some("/x")), None);
        assert_eq!(next_hop(FIRST, FIRST, 302, None), None);
        assert_eq!(next_hop(FIRST, FIRST, 302, Some("")), None);
        assert_eq!(
            next_hop(FIRST, FIRST, 302, Some("file:///etc/passwd")),
            None
        );
        assert_eq!(
            next_hop(FIRST, FIRST, 302, Some("javascript:alert(1)")),
            None
        );
    }
}
