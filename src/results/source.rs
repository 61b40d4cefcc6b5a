//! Where a batch's results come from, and what the edge's answers mean for the progress: the
//! status answer's `responsesFile` or inline responses, the download's URL, an HTTP status as a
//! [`FileTrouble`], and the view of the progress the record and the listing show.
//!
//! Guarantees: pure; a results file is named by its `files/...` name only (never a URL a
//! status answer could point elsewhere), so the download always goes to `GEMINI_API_BASE` with
//! our key; a status answer with neither a usable file name nor inline responses is why the
//! results cannot be read (they are parked with an alert), never zero results.

use serde_json::{json, Map, Value};

use crate::operation::details::OUTPUT_FILE_URI;
use crate::operation::observation::{transient, StatusError};
use crate::results::progress::{FileTrouble, Limits, Phase, Progress};
use crate::timestamp::parse_rfc3339_ms;

/// What a status answer says about a batch's results.
#[derive(Debug, Clone, PartialEq)]
pub enum Found {
    /// A results file, by its `files/...` name.
    File(String),
    /// Inline responses: which list ([`INLINE_LISTS`]' index) and how many (the skimmed
    /// answer holds a list's count in its place, [`crate::results::inline`]).
    Inline { list: usize, count: u64 },
}

/// Where inline responses can be, in the order they are preferred.
pub const INLINE_LISTS: [&str; 4] = [
    "response.inlinedResponses.inlinedResponses",
    "response.inlinedEmbedContentResponses.inlinedResponses",
    "metadata.output.inlinedResponses.inlinedResponses",
    "metadata.output.inlinedEmbedContentResponses.inlinedResponses",
];

/// Longest part of a refused name quoted in the reason.
const QUOTED_CHARS: usize = 120;

/// A `files/...` name, the only form a results file is downloaded by.
fn file_name(value: Option<&Value>) -> Option<String> {
    let name = value?.as_str()?.trim();
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b"/-_.".contains(&b);
    let ok = name.starts_with("files/") && name.len() > 6 && !name.contains("..");
    (ok && name.bytes().all(allowed)).then(|| name.to_string())
}

/// The results file an outcome's details already name (the status API's `responsesFile`,
/// kept as `output_file_uri`), if they name one.
pub fn file_of_details(details: &Map<String, Value>) -> Option<String> {
    file_name(details.get(OUTPUT_FILE_URI))
}

/// What a batch's status answer says about its results (`response` first, then `metadata.output`):
/// a file, or the inline responses (a list, or its count where the skimmer counted it). Anything
/// else is why the results cannot be read, never zero results: a `responsesFile` that is not a
/// `files/...` name, inline responses that are not a list, or an answer that names neither.
pub fn found_in_status(answer: &Value) -> Result<Found, String> {
    for (at, output) in ["/response", "/metadata/output"].into_iter().enumerate() {
        if let Some(file) = answer.pointer(&format!("{output}/responsesFile")) {
            return match file_name(Some(file)) {
                Some(name) => Ok(Found::File(name)),
                None => {
                    let shown: String = match file.as_str() {
                        Some(text) => text.chars().take(QUOTED_CHARS).collect(),
                        None => format!("a JSON {}", json_kind(file)),
                    };
                    Err(format!(
                        "status answer: responsesFile {shown:?} is not a files/... name"
                    ))
                }
            };
        }
        // `INLINE_LISTS`' order: each output's two lists.
        let lists = ["inlinedResponses", "inlinedEmbedContentResponses"];
        for (list, inline) in lists.into_iter().enumerate().map(|(k, l)| (2 * at + k, l)) {
            let path = format!("{output}/{inline}/inlinedResponses");
            let count = match answer.pointer(&path) {
                None => continue,
                Some(Value::Array(items)) => items.len() as u64,
                Some(Value::Number(n)) if n.is_u64() => n.as_u64().unwrap_or_default(),
                Some(other) => {
                    return Err(format!(
                        "status answer: {inline}.inlinedResponses is a JSON {}, not a list",
                        json_kind(other)
                    ))
                }
            };
            return Ok(Found::Inline { list, count });
        }
    }
    Err("status answer names neither a results file nor inline responses".to_string())
}

/// The kind of a JSON value, to say what was found instead of what was expected.
fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "object",
    }
}

/// When the batch ended, by its status answer: `metadata.endTime`, else `metadata.updateTime`
/// (Unix ms); `None` when it says neither.
pub fn ended_in_status(answer: &Value) -> Option<i64> {
    ["/metadata/endTime", "/metadata/updateTime"]
        .iter()
        .find_map(|at| answer.pointer(at)?.as_str().and_then(parse_rfc3339_ms))
}

/// Where a results file is downloaded (../shared/GEMINI_WEBHOOKS.md §3c).
pub fn download_url(api_base: &str, file: &str) -> String {
    let base = api_base.trim_end_matches('/');
    format!("{base}/download/v1beta/{file}:download?alt=media")
}

/// What the download's HTTP status means: `None` for the file (200, or 206 for a `Range`).
pub fn trouble_of_status(status: u16) -> Option<FileTrouble> {
    let why = || format!("{status} from the download");
    match status {
        200 | 206 => None,
        404 => Some(FileTrouble::Missing),
        408 | 429 | 500..=599 => Some(FileTrouble::Unavailable(why())),
        _ => Some(FileTrouble::Unreadable(why())),
    }
}

/// Where a download's body starts, for a request from `asked`: byte 0 for a 200 (a server that
/// ignored the `Range`: the bytes before `asked` are skipped), `asked` for a 206 whose
/// `Content-Range` (`bytes START-END/SIZE`) starts there. A 206 from anywhere else, or without
/// a `Content-Range`, is not used: its lines would be read under other indexes, so other
/// `webhook-id`s. It is retried like a server's trouble.
pub fn body_start(
    status: u16,
    content_range: Option<&str>,
    asked: u64,
) -> Result<u64, FileTrouble> {
    if status != 206 {
        return Ok(0);
    }
    let start = content_range
        .and_then(|r| r.trim().strip_prefix("bytes "))
        .and_then(|r| r.split_once('-'))
        .and_then(|(start, _)| start.trim().parse::<u64>().ok());
    let why = match start {
        Some(start) if start == asked => return Ok(asked),
        Some(start) => format!("206 from byte {start}, asked from byte {asked}"),
        None => "206 without a usable Content-Range".to_string(),
    };
    Err(FileTrouble::Unavailable(why))
}

/// Whether a download's answer says the checkpoint is the file's end: a `Range` from a
/// positive offset answered 416 (Range Not Satisfiable). A chunk that ended on the file's
/// last line did not see the end, so the next one asks from the file's size.
pub fn past_the_end(status: u16, offset: u64) -> bool {
    status == 416 && offset > 0
}

/// Why the results' status call gave no answer: the trouble, and, for an HTTP answer, its
/// status and `Retry-After`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusTrouble {
    pub trouble: FileTrouble,
    pub http_status: Option<u16>,
    pub retry_after: Option<String>,
}

/// What the results do when their status call gave no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unlocated {
    /// Ask again then (a slot of the budget is taken again first).
    AskAt(i64),
    /// Gemini cannot say where the results are: parked with this reason (and alerted).
    Park(String),
}

/// What a results' status call that gave no answer means at `now`, for results owed since `since`:
/// when to ask again or why to park, and until when every status call of the project backs off (a
/// 429 or 5xx: its `Retry-After`, else the default, as the pass and a nudge's confirmation read
/// it). A 429 is the budget's business, never the results': it waits and never parks them. A 5xx, a
/// timeout or a network error is asked again within the file's wait, never sooner than the
/// `Retry-After`; past it, or on a 404 or another 4xx, the results are parked.
pub fn unlocated(
    answer: &StatusTrouble,
    now: i64,
    since: i64,
    limits: &Limits,
) -> (Unlocated, Option<i64>) {
    let busy = matches!(answer.http_status, Some(429 | 500..=599));
    let backoff_until = match transient(answer.retry_after.as_deref()) {
        StatusError::Transient { retry_after_secs } if busy => Some(now + retry_after_secs * 1_000),
        _ => None,
    };
    let ask_at = backoff_until.unwrap_or(0).max(now + limits.retry.first_ms);
    let next = match &answer.trouble {
        _ if answer.http_status == Some(429) => Unlocated::AskAt(ask_at),
        FileTrouble::Unavailable(_) if now - since < limits.file_wait_ms => {
            Unlocated::AskAt(ask_at)
        }
        FileTrouble::Missing => Unlocated::Park("status answer: 404".to_string()),
        FileTrouble::Unavailable(why) | FileTrouble::Unreadable(why) => {
            Unlocated::Park(why.clone())
        }
    };
    (next, backoff_until)
}

/// Where the results stand, as the operation's record shows it: the counts, the phase, the
/// reading's checkpoint and chunks, how many wait for a retry, and the source.
pub fn view(p: &Progress) -> Value {
    let phase = match &p.phase {
        Phase::WaitingForFile { failures, .. } => {
            json!({"phase": "waiting_for_file", "failures": failures})
        }
        Phase::Reading => json!({"phase": "reading"}),
        Phase::Read => json!({"phase": "read"}),
        Phase::FileParked { reason } => json!({"phase": "file_parked", "reason": reason}),
    };
    json!({
        "counts": p.job_results(),
        "reading": phase,
        "source": p.source,
        "read_through": {"byte_offset": p.done_through.offset, "index": p.done_through.index},
        "chunks_done": p.chunks_done,
        "chunk_in_doubt": p.claim.is_some(),
        "waiting": p.rows.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operation::observation::DEFAULT_RETRY_AFTER_SECS;
    use crate::results::item::Source;

    #[test]
    fn a_status_answer_names_a_file_or_inline_items() {
        let file = json!({"response": {"responsesFile": "files/out-1"}});
        assert_eq!(
            found_in_status(&file),
            Ok(Found::File("files/out-1".into()))
        );
        let meta = json!({"metadata": {"output": {"responsesFile": "files/x"}}});
        assert_eq!(found_in_status(&meta), Ok(Found::File("files/x".into())));
        let inline =
            json!({"response": {"inlinedResponses": {"inlinedResponses": [{"response": {}}]}}});
        assert_eq!(
            found_in_status(&inline),
            Ok(Found::Inline { list: 0, count: 1 })
        );
        let none = json!({"response": {"inlinedResponses": {"inlinedResponses": []}}});
        assert_eq!(
            found_in_status(&none),
            Ok(Found::Inline { list: 0, count: 0 }),
            "an empty list is none"
        );
    }

    #[test]
    fn a_name_that_fails_the_filter_or_another_shape_is_a_reason_never_zero_results() {
        let gs = json!({"response": {"responsesFile": "gs://bucket/out"}});
        assert_eq!(
            found_in_status(&gs),
            Err(r#"status answer: responsesFile "gs://bucket/out" is not a files/... name"#.into())
        );
        let number = json!({"metadata": {"output": {"responsesFile": 7}}});
        assert!(found_in_status(&number)
            .unwrap_err()
            .contains("a JSON number"));
        let counted = json!({"metadata": {"output": {"inlinedEmbedContentResponses":
            {"inlinedResponses": 3}}}});
        assert_eq!(
            found_in_status(&counted),
            Ok(Found::Inline { list: 3, count: 3 }),
            "a skimmed answer holds a list's count"
        );
        let object = json!({"response": {"inlinedResponses": {"inlinedResponses": {"a": 1}}}});
        assert!(found_in_status(&object).unwrap_err().contains("not a list"));
        for neither in [json!({"response": {}}), json!({"done": true}), json!([])] {
            assert_eq!(
                found_in_status(&neither),
                Err("status answer names neither a results file nor inline responses".into())
            );
        }
        let long = json!({"response": {"responsesFile": "x".repeat(10_000)}});
        assert!(
            found_in_status(&long).unwrap_err().len() < 200,
            "a long name is cut"
        );
    }

    #[test]
    fn the_batchs_end_is_its_end_time_else_its_update_time() {
        let both = json!({"metadata": {"endTime": "2026-01-02T00:00:00Z",
            "updateTime": "2026-01-03T00:00:00Z"}});
        assert_eq!(ended_in_status(&both), Some(1_767_312_000_000));
        let update = json!({"metadata": {"updateTime": "2026-01-03T00:00:00Z"}});
        assert_eq!(ended_in_status(&update), Some(1_767_398_400_000));
        assert_eq!(
            ended_in_status(&json!({"metadata": {"endTime": "soon"}})),
            None
        );
    }

    #[test]
    fn only_a_files_name_is_downloaded() {
        let name = |v: Value| file_name(Some(&v));
        assert_eq!(name(json!("files/abc-1")), Some("files/abc-1".into()));
        assert_eq!(name(json!("gs://bucket/o")), None);
        assert_eq!(name(json!("files/../../x?y")), None);
        assert_eq!(name(json!("files/../x")), None);
        assert_eq!(name(json!("https://evil/files/a")), None);
        assert_eq!(
            download_url("http://h/", "files/a"),
            "http://h/download/v1beta/files/a:download?alt=media"
        );
    }

    fn trouble(status: Option<u16>, retry_after: Option<&str>) -> StatusTrouble {
        let trouble = match status {
            Some(404) => FileTrouble::Missing,
            Some(403) => FileTrouble::Unreadable("403 from the download".into()),
            _ => FileTrouble::Unavailable("from the status API".into()),
        };
        StatusTrouble {
            trouble,
            http_status: status,
            retry_after: retry_after.map(str::to_string),
        }
    }

    const WAIT: Limits = Limits {
        file_wait_ms: 60_000,
        retry: crate::retry::Backoff::new(1_000, 2_000),
        alert_after_ms: 3_600_000,
    };

    #[test]
    fn a_throttled_status_call_waits_its_retry_after_and_backs_off_the_budget() {
        let (next, backoff) = unlocated(&trouble(Some(429), Some("30")), 1_000, 0, &WAIT);
        assert_eq!(next, Unlocated::AskAt(31_000));
        assert_eq!(
            backoff,
            Some(31_000),
            "every status call of the project waits"
        );
        // Past the file's wait, a 429 still never parks the results.
        let (next, _) = unlocated(&trouble(Some(429), None), 600_000, 0, &WAIT);
        assert_eq!(
            next,
            Unlocated::AskAt(600_000 + DEFAULT_RETRY_AFTER_SECS * 1_000)
        );
    }

    #[test]
    fn a_server_error_is_asked_again_within_the_wait_then_parks() {
        let (next, backoff) = unlocated(&trouble(Some(503), Some("5")), 1_000, 0, &WAIT);
        assert_eq!((next, backoff), (Unlocated::AskAt(6_000), Some(6_000)));
        let (next, backoff) = unlocated(&trouble(None, None), 1_000, 0, &WAIT);
        assert_eq!(
            (next, backoff),
            (Unlocated::AskAt(2_000), None),
            "a timeout"
        );
        let (next, _) = unlocated(&trouble(Some(503), None), 60_000, 0, &WAIT);
        assert_eq!(next, Unlocated::Park("from the status API".into()));
    }

    #[test]
    fn a_404_or_another_4xx_parks_at_once() {
        let (next, backoff) = unlocated(&trouble(Some(404), None), 1_000, 0, &WAIT);
        assert_eq!(
            (next, backoff),
            (Unlocated::Park("status answer: 404".into()), None)
        );
        let (next, _) = unlocated(&trouble(Some(403), None), 1_000, 0, &WAIT);
        assert_eq!(next, Unlocated::Park("403 from the download".into()));
    }

    #[test]
    fn a_206_is_used_only_from_where_it_was_asked() {
        assert_eq!(
            body_start(206, Some("bytes 4096-8191/8192"), 4096),
            Ok(4096)
        );
        assert_eq!(body_start(206, Some("bytes 0-99/*"), 0), Ok(0));
        assert_eq!(
            body_start(200, None, 4096),
            Ok(0),
            "a 200 is read from byte 0"
        );
        assert!(matches!(
            body_start(206, Some("bytes 0-8191/8192"), 4096),
            Err(FileTrouble::Unavailable(why)) if why == "206 from byte 0, asked from byte 4096"
        ));
        assert!(matches!(
            body_start(206, None, 4096),
            Err(FileTrouble::Unavailable(_))
        ));
        assert!(matches!(
            body_start(206, Some("bytes */8192"), 4096),
            Err(FileTrouble::Unavailable(_))
        ));
    }

    #[test]
    fn a_range_from_the_files_size_is_its_end_not_a_trouble() {
        assert!(past_the_end(416, 40_960));
        assert!(
            !past_the_end(416, 0),
            "a 416 for the whole file is the server's trouble"
        );
        assert!(!past_the_end(206, 40_960));
    }

    #[test]
    fn statuses_read_as_troubles() {
        assert_eq!(trouble_of_status(206), None);
        assert_eq!(trouble_of_status(404), Some(FileTrouble::Missing));
        assert!(matches!(
            trouble_of_status(503),
            Some(FileTrouble::Unavailable(_))
        ));
        assert!(matches!(
            trouble_of_status(403),
            Some(FileTrouble::Unreadable(_))
        ));
    }

    #[test]
    fn the_view_shows_counts_and_where_reading_stands() {
        let p = Progress::begin(
            Source::File {
                name: "files/a".into(),
            },
            0,
        );
        let v = view(&p);
        assert_eq!(v["counts"]["total"], 0);
        assert_eq!(v["reading"]["phase"], "reading");
        assert_eq!(v["source"]["name"], "files/a");
    }
}
