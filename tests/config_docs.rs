//! The documentation of configuration agrees with the table the worker reads
//! (`gemini_once::config::VARIABLES`): the table of `docs/CONFIGURATION.md` and
//! `.dev.vars.example` each name every variable, in the table's order, with the table's
//! default (or, in the example, a value the local loop uses) and, in the docs, whether it is
//! a secret, and name nothing else. A
//! variable added to the table without its documentation, a default changed in one place
//! only, or a documented name the worker does not read fails here. And wrangler.toml's
//! fan-out queue is consumed in the batches the pass sizes its messages for.
//!
//! Run: `cargo test --test config_docs`.

use std::path::Path;

use gemini_once::config::{Fallback, Variable, VARIABLES};

/// The row of [`VARIABLES`] called `name`, if the worker reads one.
fn variable(name: &str) -> Option<&'static Variable> {
    VARIABLES.iter().find(|v| v.name == name)
}

fn read(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn table_names() -> Vec<&'static str> {
    VARIABLES.iter().map(|v| v.name).collect()
}

/// The rows of the table in `docs/CONFIGURATION.md`, the one before its first `##` section:
/// (name, default, secret column) with backticks removed.
fn documented_rows() -> Vec<(String, String, String)> {
    let doc = read("docs/CONFIGURATION.md");
    assert!(
        doc.starts_with("# Configuration\n"),
        "docs/CONFIGURATION.md is the configuration's page"
    );
    let table = doc.split("\n## ").next().unwrap_or(&doc);
    table
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.split(" | ").collect();
            assert!(
                cells.len() >= 4,
                "a row without name, default, secret and meaning: {l}"
            );
            let bare = |c: &str| {
                c.trim_matches(|c: char| c == '|' || c == '`' || c == ' ')
                    .to_string()
            };
            (bare(cells[0]), bare(cells[1]), bare(cells[2]))
        })
        .collect()
}

/// The lines of `.dev.vars.example` that give a variable a value, set (`NAME=value`) or shown
/// commented (`# NAME=value  # why`): (name, value without its comment or quotes, commented).
fn example_lines() -> Vec<(String, String, bool)> {
    read(".dev.vars.example")
        .lines()
        .filter_map(|line| {
            let commented = line.starts_with('#');
            let rest = line.trim_start_matches('#').trim_start();
            let (name, value) = rest.split_once('=')?;
            let is_name = name.starts_with(|c: char| c.is_ascii_uppercase())
                && name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            if !is_name {
                return None;
            }
            let value = value
                .split(" #")
                .next()
                .unwrap_or("")
                .trim()
                .trim_matches('"');
            Some((name.to_string(), value.to_string(), commented))
        })
        .collect()
}

#[test]
fn configuration_md_documents_every_variable_in_table_order_with_its_default() {
    let rows = documented_rows();
    for (name, default, secret) in &rows {
        let v = variable(name).unwrap_or_else(|| {
            panic!("docs/CONFIGURATION.md documents {name}, which the worker does not read")
        });
        assert_eq!(
            default,
            &v.default.documented(),
            "docs/CONFIGURATION.md's default of {name} differs from the table's"
        );
        let kept_as = if v.secret { "secret" } else { "var" };
        assert_eq!(
            secret, kept_as,
            "docs/CONFIGURATION.md's secret column of {name} differs from the table's"
        );
    }
    let names: Vec<&str> = rows.iter().map(|(n, _, _)| n.as_str()).collect();
    for v in VARIABLES {
        assert!(
            names.contains(&v.name),
            "docs/CONFIGURATION.md does not document {}",
            v.name
        );
    }
    assert_eq!(
        names,
        table_names(),
        "docs/CONFIGURATION.md's rows, once each, in the table's order"
    );
}

#[test]
fn dev_vars_example_sets_the_required_and_shows_every_other_default() {
    let lines = example_lines();
    for (name, _, _) in &lines {
        assert!(
            variable(name).is_some(),
            ".dev.vars.example names {name}, which the worker does not read"
        );
    }
    // Each variable's first line is its entry; later ones are examples of other values.
    let mut first: Vec<&(String, String, bool)> = Vec::new();
    for line in &lines {
        if !first.iter().any(|f| f.0 == line.0) {
            first.push(line);
        }
    }
    for v in VARIABLES {
        let (_, value, commented) = first
            .iter()
            .find(|f| f.0 == v.name)
            .unwrap_or_else(|| panic!(".dev.vars.example does not list {}", v.name));
        match v.default {
            Fallback::Required => {
                assert!(
                    !commented && !value.is_empty(),
                    "{} is required: set it",
                    v.name
                )
            }
            // Unset by default: shown `# NAME=`, or set for the local loop (the example's
            // register and read tokens show the split of scopes from the first start).
            Fallback::Nothing => assert!(
                *commented && value.is_empty() || !*commented && !value.is_empty(),
                "{} has no default: `# {}=`, or set it (got {value:?})",
                v.name,
                v.name
            ),
            default => assert!(
                *commented && *value == default.documented(),
                "{} shows {value:?}, not its default {}",
                v.name,
                default.documented()
            ),
        }
    }
    let names: Vec<&str> = first.iter().map(|f| f.0.as_str()).collect();
    assert_eq!(
        names,
        table_names(),
        ".dev.vars.example in the table's order"
    );
}

/// The fan-out queue's consumer settings in wrangler.toml are the ones the pass sizes its
/// messages for: a batch of `CONSUMER_BATCH_MESSAGES` messages of `JOB_ENTRIES` entries, at
/// most 2 subrequests each, stays under a Worker's 1,000.
#[test]
fn wrangler_toml_consumes_the_queue_the_pass_feeds_in_batches_it_is_sized_for() {
    use gemini_once::reconciliation::pass::{CONSUMER_BATCH_MESSAGES, JOB_ENTRIES};
    let toml = read("wrangler.toml");
    let value = |block: &str, key: &str| -> String {
        let start = toml.find(block).unwrap_or_else(|| panic!("no {block}"));
        let line = toml[start..]
            .lines()
            .find(|l| l.trim_start().starts_with(key))
            .unwrap_or_else(|| panic!("no {key} in {block}"));
        line.split('=')
            .nth(1)
            .unwrap()
            .trim()
            .trim_matches('"')
            .to_string()
    };
    assert_eq!(value("[[queues.producers]]", "binding"), "RECONCILE_QUEUE");
    let queue = value("[[queues.producers]]", "queue");
    assert_eq!(
        value("[[queues.consumers]]", "queue"),
        queue,
        "it consumes what it feeds"
    );
    let batch: usize = value("[[queues.consumers]]", "max_batch_size")
        .parse()
        .unwrap();
    assert_eq!(batch, CONSUMER_BATCH_MESSAGES);
    assert!(batch * JOB_ENTRIES * 2 < 1_000);
}
