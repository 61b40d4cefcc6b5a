//! The log event names are a contract: every `event` the worker writes is a value of
//! `gemini_once::telemetry::log_event::LogEvent` (each typed line's own tests check its
//! variants; this checks that no line is written by hand), and every name the chaos and bench
//! scripts and the integration tests look for is one too. Reads the files as text, so a
//! renamed event fails here rather than silently in a dashboard query or a chaos oracle.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use gemini_once::telemetry::log_event::LogEvent;

fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files(&path, ext, out);
        } else if path.extension().is_some_and(|e| e == ext) {
            out.push(path);
        }
    }
}

/// Every `"<prefix>name<suffix>"`-shaped literal name in `text` (name: lowercase and `_`).
fn quoted_after(text: &str, prefix: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(prefix) {
        rest = &rest[i + prefix.len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        if !name.is_empty() && rest[name.len()..].starts_with('"') {
            names.push(name);
        }
    }
    names
}

fn known() -> BTreeSet<&'static str> {
    LogEvent::ALL.iter().map(|e| e.as_str()).collect()
}

/// Every line the worker writes is a typed value (`GateLog`, `PassLog`, `RouteLog`,
/// `WorkerLog`, or `LogEvent::line` for the usage meter): each type's own tests check that
/// its events are declared. This keeps it so: no code outside those types spells an event by
/// hand, where a typo would escape every check.
#[test]
fn no_line_names_its_event_by_hand() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut rs = Vec::new();
    files(&root.join("src"), "rs", &mut rs);
    assert!(rs.len() > 20);
    let mut by_hand = BTreeSet::new();
    for path in rs {
        if path.ends_with("tests.rs") {
            continue;
        }
        let text = fs::read_to_string(&path).unwrap();
        // Test modules build lines of their own to compare; only the code the worker runs counts.
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for prefix in ["\"event\": \"", "\"event\":\""] {
            for name in quoted_after(code, prefix) {
                by_hand.insert(format!("{} in {}", name, path.display()));
            }
        }
    }
    assert!(
        by_hand.is_empty(),
        "log lines written as raw JSON (use the area's typed line): {by_hand:?}"
    );
}

#[test]
fn every_event_the_scripts_and_tests_read_is_declared() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut mjs = Vec::new();
    files(&root.join("scripts"), "mjs", &mut mjs);
    files(&root.join("tests"), "mjs", &mut mjs);
    assert!(!mjs.is_empty());
    let known = known();
    let mut read = 0;
    let mut unknown = BTreeSet::new();
    for path in mjs {
        let text = fs::read_to_string(&path).unwrap();
        for prefix in ["events(\"", ".count(\"", "waitFor(\"", "event === \""] {
            // `typeof e.event === "string"` checks a type, not a name.
            for name in quoted_after(&text, prefix)
                .into_iter()
                .filter(|n| !matches!(n.as_str(), "string" | "number" | "object" | "undefined"))
            {
                read += 1;
                if !known.contains(name.as_str()) {
                    unknown.insert(format!("{} in {}", name, path.display()));
                }
            }
        }
    }
    assert!(
        read > 10,
        "found only {read} event names read: the patterns drifted"
    );
    assert!(
        unknown.is_empty(),
        "events read but not in LogEvent: {unknown:?}"
    );
}
