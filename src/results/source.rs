//! Where a batch's results come from, and what the edge's answers mean for the progress: the
//! status answer's `responsesFile` or inline responses, the download's URL, an HTTP status as a
//! [`FileTrouble`], and the view of the progress the record and the listing show.
//!
//! Guarantees: pure; a results file is named by its `files/...` name only (never a URL a
//! status answer could point elsewhere), so the download always goes to `GEMINI_API_BASE` with
//! our key; a status answer with neither a file nor inline responses is no results (zero of
//! them), never a stop.

use serde_json::{json, Map, Value};

use crate::operation::details::OUTPUT_FILE_URI;
use crate::results::progress::{FileTrouble, Limits, Phase, Progress};

/// What a status answer says about a batch's results.
#[derive(Debug, Clone, PartialEq)]
pub enum Found {
    /// A results file, by its `files/...` name.
    File(String),
    /// The inline responses, as Gemini returned them.
    Inline(Vec<Value>),
}

/// A `files/...` name, the only form a results file is downloaded by.
fn file_name(value: Option<&Value>) -> Option<String> {
    let name = value?.as_str()?.trim();
    let ok = name.starts_with("files/")
        && name.len() > 6
        && !name.contains("..")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/-_.".contains(&b));
    ok.then(|| name.to_string())
}

/// The results file an outcome's details already name (the status API's `responsesFile`,
/// kept as `output_file_uri`), if they name one.
pub fn file_of_details(details: &Map<String, Value>) -> Option<String> {
    file_name(details.get(OUTPUT_FILE_URI))
}

/// What a batch's status answer says about its results (`response` first, then
/// `metadata.output`); `None` when it names neither a file nor inline responses.
pub fn found_in_status(answer: &Value) -> Option<Found> {
    for output in ["/response", "/metadata/output"] {
        if let Some(name) = file_name(answer.pointer(&format!("{output}/responsesFile"))) {
            return Some(Found::File(name));
        }
        for inline in ["inlinedResponses", "inlinedEmbedContentResponses"] {
            let items = answer.pointer(&format!("{output}/{inline}/inlinedResponses"));
            if let Some(Value::Array(items)) = items {
                return Some(Found::Inline(items.clone()));
            }
        }
    }
    None
}

/// Where a results file is downloaded (../shared/GEMINI_WEBHOOKS.md §3c).
pub fn download_url(api_base: &str, file: &str) -> String {
    format!(
        "{}/download/v1beta/{file}:download?alt=media",
        api_base.trim_end_matches('/')
    )
}

/// What the download's HTTP status means: `None` for the file (200, or 206 for a `Range`).
pub fn trouble_of_status(status: u16) -> Option<FileTrouble> {
    match status {
        200 | 206 => None,
        404 => Some(FileTrouble::Missing),
        408 | 429 | 500..=599 => Some(FileTrouble::Unavailable(format!(
            "{status} from the download"
        ))),
        _ => Some(FileTrouble::Unreadable(format!(
            "{status} from the download"
        ))),
    }
}

/// Whether a download's answer says the checkpoint is the file's end: a `Range` from a
/// positive offset answered 416 (Range Not Satisfiable). A chunk that ended on the file's
/// last line did not see the end, so the next one asks from the file's size.
pub fn past_the_end(status: u16, offset: u64) -> bool {
    status == 416 && offset > 0
}

/// The progress's tunables from the configuration's seconds.
pub fn limits(
    file_wait_secs: i64,
    retry_base_secs: i64,
    retry_max_secs: i64,
    alert_after_secs: i64,
) -> Limits {
    Limits {
        file_wait_ms: file_wait_secs * 1_000,
        retry_base_secs,
        retry_max_secs,
        alert_after_ms: alert_after_secs * 1_000,
    }
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
    use crate::results::item::Source;

    #[test]
    fn a_status_answer_names_a_file_or_inline_items() {
        let file = json!({"response": {"responsesFile": "files/out-1"}});
        assert_eq!(
            found_in_status(&file),
            Some(Found::File("files/out-1".into()))
        );
        let meta = json!({"metadata": {"output": {"responsesFile": "files/x"}}});
        assert_eq!(found_in_status(&meta), Some(Found::File("files/x".into())));
        let inline =
            json!({"response": {"inlinedResponses": {"inlinedResponses": [{"response": {}}]}}});
        assert_eq!(
            found_in_status(&inline),
            Some(Found::Inline(vec![json!({"response": {}})]))
        );
        assert_eq!(found_in_status(&json!({"response": {}})), None);
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
