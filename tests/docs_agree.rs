//! The docs name what the code has: every Rust file `docs/DESIGN.md` names exists under `src/`
//! or `tests/` (a file renamed without its docs fails here), and `docs/OPERATIONS.md` names
//! every Durable Object migration of `wrangler.toml` with the classes it adds (a new object
//! class whose migration the deploy docs do not mention fails here).
//!
//! Run: `cargo test --test docs_agree`.

use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(file: &str) -> String {
    let path = root().join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every file below `dir`, as a path relative to the root with `/` separators.
fn files(dir: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo: Vec<PathBuf> = vec![root().join(dir)];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                todo.push(path);
            } else if let Ok(rel) = path.strip_prefix(root()) {
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out
}

/// The code spans of `text` (between single backticks).
fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

#[test]
fn every_rust_file_design_md_names_exists() {
    let known: Vec<String> = [files("src"), files("tests")].concat();
    let mut missing = Vec::new();
    for span in code_spans(&read("docs/DESIGN.md")) {
        let name = span.trim_end_matches(':');
        let is_rust_file =
            name.ends_with(".rs") && !name.contains([' ', '*']) && !name.contains("::");
        if !is_rust_file {
            continue;
        }
        // A path from the root, or a name relative to the room the text is in.
        let found = known
            .iter()
            .any(|f| f == name || f.ends_with(&format!("/{name}")));
        if !found {
            missing.push(name.to_string());
        }
    }
    missing.sort();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "docs/DESIGN.md names Rust files that do not exist: {missing:?}"
    );
}

#[test]
fn operations_md_names_every_migration_and_its_classes() {
    let toml = read("wrangler.toml");
    let ops = read("docs/OPERATIONS.md");
    let mut migrations = 0;
    for block in toml.split("[[migrations]]").skip(1) {
        let block = block.split("\n[").next().unwrap_or(block);
        let tag = block
            .lines()
            .find_map(|l| l.trim().strip_prefix("tag = "))
            .expect("a migration's tag")
            .trim_matches('"');
        assert!(
            ops.contains(&format!("`{tag}`")),
            "docs/OPERATIONS.md does not name the migration {tag}"
        );
        for class in block
            .lines()
            .filter(|l| l.contains("classes"))
            .flat_map(|l| l.split('"').skip(1).step_by(2))
        {
            assert!(
                ops.contains(&format!("`{class}`")),
                "docs/OPERATIONS.md does not name {class}, which migration {tag} adds"
            );
        }
        migrations += 1;
    }
    assert!(migrations >= 2, "wrangler.toml's migrations were read");
}
