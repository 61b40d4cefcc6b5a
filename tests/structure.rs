//! The shape of `src/`, held as tests: no glob re-export (an import says where a thing
//! lives), no loop between modules, at most eight floors of rooms, nothing imports the edge's
//! router, every file of the edge within 350 lines, and no production function over 80
//! lines. Reads the files as text.
//!
//! The module graph: a module is a file; an arrow is a path the file's production code names
//! (its `use` items, `crate::`/`super::`/`self::` paths, and paths through the modules it
//! declares), resolved to the deepest module file that exists, then followed through explicit
//! re-exports to the file that defines the name. Test code (`tests.rs`, `#[cfg(test)]` items)
//! and doc-only items (`#[cfg(doc)]`) are left out. An arrow from a file to one of its own
//! enclosing modules (a child using its parent's items, which Rust nests inside the parent)
//! is not a tie between modules and is left out too; a loop through anything else fails.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

#[path = "structure/delivery_path.rs"]
mod delivery_path;

/// Longest file under `src/edge/`.
const MAX_EDGE_FILE_LINES: usize = 350;
/// Longest production function anywhere in `src/`.
const MAX_FUNCTION_LINES: usize = 80;
/// Most floors of rooms: a room is a top-level module of `src/` (a folder, or a file beside
/// `lib.rs`), and a room's floor is one above the highest room it imports (a room that
/// imports none is on the first). A deeper house is a longer chain to read through.
const MAX_FLOORS: usize = 8;

/// The edge's router: it uses every room of the edge, so none may use it.
const ROUTER: &str = "edge/mod.rs";

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .expect("src/ is readable")
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `text` with comments, string and character literals blanked (newlines kept, so lines keep
/// their numbers and braces inside them do not count).
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r'
            && matches!(next, Some('#') | Some('"'))
            && (i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_'))
        {
            // A raw string: r"..." or r#"..."#, as many hashes closing as opening.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                match chars.get(j) {
                    None => break,
                    Some('"') if (0..hashes).all(|h| chars.get(j + 1 + h) == Some(&'#')) => {
                        j += 1 + hashes;
                        break;
                    }
                    _ => j += 1,
                }
            }
            for &k in &chars[i..j] {
                out.push(blank(k));
            }
            i = j;
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < chars.len() {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{..}'), or a lifetime ('a), kept.
            if next == Some('\\') {
                let mut j = i + 2;
                while j < chars.len() && chars[j] != '\'' {
                    j += 1;
                }
                for _ in i..=j.min(chars.len() - 1) {
                    out.push(' ');
                }
                i = j + 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                out.push_str("   ");
                i += 3;
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The end (exclusive, a char index into `code`) of the item starting at `start`: its first
/// `;` at depth 0 before any brace, or its matching closing brace.
fn item_end(code: &[char], start: usize) -> usize {
    let mut depth = 0i32;
    let mut opened = false;
    let mut i = start;
    while i < code.len() {
        match code[i] {
            ';' if !opened && depth == 0 => return i + 1,
            '{' => {
                depth += 1;
                opened = true;
            }
            '}' => {
                depth -= 1;
                if opened && depth == 0 {
                    return i + 1;
                }
            }
            // Brackets hold attributes and array types: a `;` inside them ends nothing.
            '[' | '(' if !opened => depth += 1,
            ']' | ')' if !opened => depth -= 1,
            _ => {}
        }
        i += 1;
    }
    code.len()
}

/// `code` with every item under `#[cfg(test)]` or `#[cfg(doc)]` blanked, and the names of
/// the out-of-line modules so gated (their files are test or doc code too).
fn production(code: &str) -> (String, Vec<String>) {
    let mut chars: Vec<char> = code.chars().collect();
    let mut gated_modules = Vec::new();
    for marker in ["#[cfg(test)]", "#[cfg(doc)]"] {
        let pattern: Vec<char> = marker.chars().collect();
        let mut i = 0;
        while i + pattern.len() <= chars.len() {
            if chars[i..i + pattern.len()] != pattern[..] {
                i += 1;
                continue;
            }
            let mut start = i + pattern.len();
            // Further attributes on the same item.
            loop {
                while start < chars.len() && chars[start].is_whitespace() {
                    start += 1;
                }
                if chars.get(start) == Some(&'#') {
                    start = item_end_of_attribute(&chars, start);
                } else {
                    break;
                }
            }
            let end = item_end(&chars, start);
            let item: String = chars[start..end].iter().collect();
            let words: Vec<&str> = item.split_whitespace().collect();
            if let Some(pos) = words.iter().position(|w| *w == "mod") {
                if let Some(name) = words.get(pos + 1) {
                    if item.trim_end().ends_with(';') {
                        gated_modules.push(name.trim_end_matches(';').to_string());
                    }
                }
            }
            for c in &mut chars[i..end] {
                if *c != '\n' {
                    *c = ' ';
                }
            }
            i = end;
        }
    }
    (chars.into_iter().collect(), gated_modules)
}

fn item_end_of_attribute(chars: &[char], start: usize) -> usize {
    let mut depth = 0;
    for (i, &c) in chars.iter().enumerate().skip(start) {
        match c {
            '[' => depth += 1,
            ']' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    chars.len()
}

/// One file of `src/`.
struct File {
    /// Its path under `src/`, with `/`.
    rel: String,
    /// Its module path (`lib.rs`: empty).
    module: Vec<String>,
    lines: usize,
    /// Production code: comments, literals, test and doc-only items blanked.
    code: String,
    /// The modules it declares (`mod x;`, `pub mod x;`, `mod x { .. }`).
    children: BTreeSet<String>,
}

struct Crate {
    files: Vec<File>,
    /// Test files (`tests.rs`, and the files of `#[cfg(test)] mod x;`), by path under `src/`.
    test_files: BTreeSet<String>,
    by_module: BTreeMap<Vec<String>, usize>,
}

fn module_of(rel: &str) -> Vec<String> {
    let no_ext = rel.trim_end_matches(".rs");
    let mut parts: Vec<String> = no_ext.split('/').map(str::to_string).collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

fn load() -> Crate {
    let root = src_dir();
    let mut paths = Vec::new();
    rust_files(&root, &mut paths);
    let sources = paths.iter().map(|path| {
        let rel = path
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        (rel, fs::read_to_string(path).unwrap())
    });
    crate_of(sources)
}

/// The crate made of `sources`: (path under `src/`, with `/`; its text).
fn crate_of(sources: impl IntoIterator<Item = (String, String)>) -> Crate {
    let mut files = Vec::new();
    let mut test_files = BTreeSet::new();
    for (rel, text) in sources {
        let (code, gated) = production(&code_only(&text));
        let module = module_of(&rel);
        let dir = if rel.ends_with("mod.rs") || rel == "lib.rs" {
            module.join("/")
        } else {
            rel.trim_end_matches(".rs").to_string()
        };
        for name in gated {
            let prefix = if dir.is_empty() {
                String::new()
            } else {
                format!("{dir}/")
            };
            test_files.insert(format!("{prefix}{name}.rs"));
            test_files.insert(format!("{prefix}{name}/mod.rs"));
        }
        if rel.ends_with("/tests.rs") || rel == "tests.rs" {
            test_files.insert(rel.clone());
        }
        let children = declared_modules(&code);
        files.push(File {
            rel,
            module,
            lines: text.lines().count(),
            code,
            children,
        });
    }
    let by_module = files
        .iter()
        .enumerate()
        .filter(|(_, f)| !test_files.contains(&f.rel))
        .map(|(i, f)| (f.module.clone(), i))
        .collect();
    Crate {
        files,
        test_files,
        by_module,
    }
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The identifiers of `code`, each with its char offset.
fn words(code: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut start = 0;
    for (i, c) in code.chars().enumerate() {
        if is_ident(c) {
            if current.is_empty() {
                start = i;
            }
            current.push(c);
        } else if !current.is_empty() {
            out.push((start, std::mem::take(&mut current)));
        }
    }
    if !current.is_empty() {
        out.push((start, current));
    }
    out
}

/// Whether `code` defines an item named `name`.
fn defines(code: &str, name: &str) -> bool {
    const KINDS: [&str; 8] = [
        "struct", "enum", "fn", "const", "static", "type", "trait", "mod",
    ];
    words(code)
        .windows(2)
        .any(|w| w[1].1 == name && KINDS.contains(&w[0].1.as_str()))
}

fn declared_modules(code: &str) -> BTreeSet<String> {
    let words = words(code);
    words
        .windows(2)
        .filter(|w| w[0].1 == "mod")
        .map(|w| w[1].1.clone())
        .collect()
}

/// A `use` item: whether it is public (a re-export), and each path it brings in with the name
/// it brings it under (`None` for a glob).
struct Use {
    public: bool,
    paths: Vec<(Vec<String>, Option<String>)>,
    /// Char range in the file's code.
    range: (usize, usize),
}

/// Expands a use tree (`a::b::{c, d::{e as f, self}, *}`) into full paths.
fn expand(tree: &str, prefix: &[String], out: &mut Vec<(Vec<String>, Option<String>)>) {
    let tree = tree.trim();
    if tree.is_empty() {
        return;
    }
    if let Some(open) = tree.find('{') {
        let head = tree[..open].trim().trim_end_matches("::");
        let mut base = prefix.to_vec();
        base.extend(
            head.split("::")
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string),
        );
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let mut depth = 0;
        let mut part = String::new();
        for c in inner.chars() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(&part, &base, out);
                    part.clear();
                    continue;
                }
                _ => {}
            }
            part.push(c);
        }
        expand(&part, &base, out);
        return;
    }
    let (path, alias) = match tree.split_once(" as ") {
        Some((p, a)) => (p.trim(), Some(a.trim().to_string())),
        None => (tree, None),
    };
    let mut full = prefix.to_vec();
    full.extend(
        path.split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string),
    );
    if full.last().is_some_and(|s| s == "*") {
        full.pop();
        out.push((full, None));
        return;
    }
    if full.last().is_some_and(|s| s == "self") {
        full.pop();
    }
    let name = alias.or_else(|| full.last().cloned());
    out.push((full, name));
}

fn uses(code: &str) -> Vec<Use> {
    let chars: Vec<char> = code.chars().collect();
    let words = words(code);
    let mut out = Vec::new();
    for (at, word) in &words {
        if word != "use" {
            continue;
        }
        // Only an item: `use` at the start of a statement, after an optional visibility.
        let before: String = chars[..*at]
            .iter()
            .rev()
            .take_while(|c| **c != '\n')
            .collect();
        let before: String = before.chars().rev().collect();
        let lead = before.trim();
        let public = lead.starts_with("pub");
        if !(lead.is_empty() || public) {
            continue;
        }
        let end = item_end(&chars, *at);
        let body: String = chars[at + 3..end].iter().collect();
        let body = body.trim().trim_end_matches(';');
        let mut paths = Vec::new();
        expand(body, &[], &mut paths);
        out.push(Use {
            public,
            paths,
            range: (*at, end),
        });
    }
    out
}

impl Crate {
    fn file_of(&self, module: &[String]) -> Option<usize> {
        self.by_module.get(module).copied()
    }

    /// `path` as written in file `from`, made absolute (from the crate root); `None` for a
    /// path outside the crate (std, a dependency, a local name).
    fn absolute(&self, from: usize, path: &[String]) -> Option<Vec<String>> {
        let file = &self.files[from];
        let first = path.first()?;
        match first.as_str() {
            "crate" => Some(path[1..].to_vec()),
            "self" => Some([file.module.clone(), path[1..].to_vec()].concat()),
            "super" => {
                let mut base = file.module.clone();
                let mut rest = path;
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop();
                    rest = &rest[1..];
                }
                Some([base, rest.to_vec()].concat())
            }
            name if file.children.contains(name) => {
                let mut module = file.module.clone();
                // A non-mod.rs file's children live in its own folder, still under its path.
                module.extend(path.iter().cloned());
                Some(module)
            }
            _ => None,
        }
    }

    /// The file that defines what `path` (absolute) names: the deepest module file on it,
    /// then through that file's explicit re-exports.
    fn resolve(&self, path: &[String], hops: usize) -> Option<usize> {
        let mut k = path.len();
        while k > 0 && self.file_of(&path[..k]).is_none() {
            k -= 1;
        }
        let file = self.file_of(&path[..k])?;
        if k == path.len() || hops > 16 {
            return Some(file);
        }
        let name = &path[k];
        let rest = &path[k + 1..];
        let reexports: Vec<Use> = uses(&self.files[file].code)
            .into_iter()
            .filter(|u| u.public)
            .collect();
        for u in &reexports {
            for (target, alias) in &u.paths {
                if alias.as_deref() == Some(name.as_str()) {
                    // A name re-exported from outside the crate is this file's to give.
                    let Some(target) = self.absolute(file, target) else {
                        return Some(file);
                    };
                    return self.resolve(&[target, rest.to_vec()].concat(), hops + 1);
                }
            }
        }
        // A glob re-export (refused by `no_glob_reexport`, but followed, so its loops show).
        if !defines(&self.files[file].code, name) {
            for u in &reexports {
                for (target, _) in u.paths.iter().filter(|(_, alias)| alias.is_none()) {
                    let Some(target) = self.absolute(file, target) else {
                        continue;
                    };
                    let named = [target, vec![name.clone()], rest.to_vec()].concat();
                    let found = self.resolve(&named, hops + 1);
                    if found.is_some_and(|f| f != file && defines(&self.files[f].code, name)) {
                        return found;
                    }
                }
            }
        }
        Some(file)
    }

    /// The production files: everything but test files.
    fn production_files(&self) -> impl Iterator<Item = (usize, &File)> {
        self.files
            .iter()
            .enumerate()
            .filter(|(_, f)| !self.test_files.contains(&f.rel))
    }

    /// Every path file `from` names in its production code, absolute.
    fn named_paths(&self, from: usize) -> Vec<Vec<String>> {
        let file = &self.files[from];
        let mut out = Vec::new();
        let items = uses(&file.code);
        for u in &items {
            for (path, _) in &u.paths {
                out.extend(self.absolute(from, path));
            }
        }
        // Paths in the code itself: `crate::a::b`, `super::a`, `child::a`.
        let chars: Vec<char> = file.code.chars().collect();
        let inside_use = |at: usize| items.iter().any(|u| u.range.0 <= at && at < u.range.1);
        let mut i = 0;
        while i < chars.len() {
            let starts_word = is_ident(chars[i]) && (i == 0 || !is_ident(chars[i - 1]));
            if !starts_word || (i > 0 && chars[i - 1] == '$') || inside_use(i) {
                i += 1;
                continue;
            }
            let mut segments = Vec::new();
            let mut j = i;
            loop {
                let s = j;
                while j < chars.len() && is_ident(chars[j]) {
                    j += 1;
                }
                segments.push(chars[s..j].iter().collect::<String>());
                if chars.get(j) == Some(&':')
                    && chars.get(j + 1) == Some(&':')
                    && chars.get(j + 2).is_some_and(|c| is_ident(*c))
                {
                    j += 2;
                } else {
                    break;
                }
            }
            if segments.len() > 1 {
                out.extend(self.absolute(from, &segments));
            }
            i = j.max(i + 1);
        }
        out
    }

    /// The module graph: file -> the files it names, arrows into its own enclosing modules
    /// left out.
    fn graph(&self) -> BTreeMap<usize, BTreeSet<usize>> {
        let mut graph = BTreeMap::new();
        for (from, file) in self.production_files() {
            let mut targets = BTreeSet::new();
            for path in self.named_paths(from) {
                let Some(to) = self.resolve(&path, 0) else {
                    continue;
                };
                let enclosing = file.module.starts_with(&self.files[to].module);
                if to != from && !enclosing {
                    targets.insert(to);
                }
            }
            graph.insert(from, targets);
        }
        graph
    }
}

/// Strongly connected components of more than one file (Tarjan's algorithm).
fn loops(graph: &BTreeMap<usize, BTreeSet<usize>>) -> Vec<BTreeSet<usize>> {
    struct State<'a> {
        graph: &'a BTreeMap<usize, BTreeSet<usize>>,
        index: BTreeMap<usize, usize>,
        low: BTreeMap<usize, usize>,
        stack: Vec<usize>,
        on_stack: BTreeSet<usize>,
        next: usize,
        out: Vec<BTreeSet<usize>>,
    }
    fn visit(s: &mut State, v: usize) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        let targets: Vec<usize> = s.graph.get(&v).into_iter().flatten().copied().collect();
        for w in targets {
            if !s.index.contains_key(&w) {
                visit(s, w);
                let low = s.low[&v].min(s.low[&w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(&w) {
                let low = s.low[&v].min(s.index[&w]);
                s.low.insert(v, low);
            }
        }
        if s.low[&v] == s.index[&v] {
            let mut component = BTreeSet::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(&w);
                component.insert(w);
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                s.out.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for &v in graph.keys() {
        if !state.index.contains_key(&v) {
            visit(&mut state, v);
        }
    }
    state.out
}

/// Every production function of a file: (name, first line, length in lines).
fn functions(code: &str) -> Vec<(String, usize, usize)> {
    let chars: Vec<char> = code.chars().collect();
    let line_of = |at: usize| chars[..at].iter().filter(|c| **c == '\n').count() + 1;
    let words = words(code);
    let mut out = Vec::new();
    for w in words.windows(2) {
        if w[0].1 != "fn" || !w[1].1.chars().all(is_ident) {
            continue;
        }
        // Not `fn(..)` types or `Fn` bounds: `fn` followed by its name.
        let after_name = w[1].0 + w[1].1.chars().count();
        if !chars[after_name..]
            .iter()
            .find(|c| !c.is_whitespace())
            .is_some_and(|c| *c == '(' || *c == '<')
        {
            continue;
        }
        let end = item_end(&chars, w[1].0);
        if chars[..end].last() != Some(&'}') {
            continue; // a declaration without a body
        }
        let first = line_of(w[0].0);
        let last = line_of(end - 1);
        out.push((w[1].1.clone(), first, last - first + 1));
    }
    out
}

#[test]
fn no_glob_reexport() {
    let krate = load();
    let mut globs = Vec::new();
    for (_, file) in krate.production_files() {
        for u in uses(&file.code) {
            for (path, name) in &u.paths {
                if u.public && name.is_none() {
                    globs.push(format!("{}: pub use {}::*", file.rel, path.join("::")));
                }
            }
        }
    }
    assert!(
        globs.is_empty(),
        "re-export each name explicitly, so an import says where a thing lives: {globs:#?}"
    );
}

#[test]
fn no_loop_between_modules() {
    let krate = load();
    let graph = krate.graph();
    let mut ties = Vec::new();
    for component in loops(&graph) {
        ties.push(
            component
                .iter()
                .flat_map(|&from| {
                    graph[&from]
                        .iter()
                        .filter(|to| component.contains(to))
                        .map(move |&to| (from, to))
                })
                .map(|(from, to)| format!("{} -> {}", krate.files[from].rel, krate.files[to].rel))
                .collect::<Vec<_>>(),
        );
    }
    assert!(
        ties.is_empty(),
        "modules that import each other in a loop (move what one side needs to the module \
         that owns it): {ties:#?}"
    );
}

/// The room of a file under `src/`: its first path segment, without `.rs`.
fn room_of(rel: &str) -> String {
    rel.split('/')
        .next()
        .unwrap_or(rel)
        .trim_end_matches(".rs")
        .to_string()
}

#[test]
fn at_most_eight_floors_of_rooms() {
    let krate = load();
    let mut rooms: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, targets) in krate.graph() {
        let room = room_of(&krate.files[from].rel);
        if room == "lib" {
            continue;
        }
        let entry = rooms.entry(room.clone()).or_default();
        for to in targets {
            let other = room_of(&krate.files[to].rel);
            if other != room && other != "lib" {
                entry.insert(other);
            }
        }
    }
    // Floors by relaxation: a loop between rooms never settles, and fails.
    let mut floor: BTreeMap<&str, usize> = rooms.keys().map(|r| (r.as_str(), 1)).collect();
    for _ in 0..=rooms.len() {
        let mut moved = false;
        for (room, imports) in &rooms {
            let above = imports
                .iter()
                .map(|i| floor.get(i.as_str()).copied().unwrap_or(1) + 1)
                .max()
                .unwrap_or(1);
            if above > floor[room.as_str()] {
                floor.insert(room.as_str(), above);
                moved = true;
            }
        }
        if !moved {
            break;
        }
        assert!(
            floor.values().all(|f| *f <= rooms.len()),
            "rooms that import each other in a loop: {rooms:#?}"
        );
    }
    let top = floor.values().copied().max().unwrap_or(0);
    let mut by_floor: Vec<(usize, &str)> = floor.iter().map(|(r, f)| (*f, *r)).collect();
    by_floor.sort();
    assert!(
        top <= MAX_FLOORS,
        "{top} floors of rooms, more than {MAX_FLOORS}: move what a high room needs down to the \
         room that owns it. Floors: {by_floor:?}"
    );
    assert!(top >= 3, "the rooms were read: {by_floor:?}");
}

#[test]
fn the_router_is_imported_by_nothing() {
    let krate = load();
    let router = krate
        .files
        .iter()
        .position(|f| f.rel == ROUTER)
        .expect("the router exists");
    let users: Vec<&str> = krate
        .production_files()
        .filter(|(i, _)| *i != router)
        .filter(|(i, _)| {
            krate
                .named_paths(*i)
                .iter()
                .any(|p| krate.resolve(p, 0) == Some(router))
        })
        .map(|(_, f)| f.rel.as_str())
        .collect();
    assert!(
        users.is_empty(),
        "{ROUTER} routes; what rooms share lives in modules named for it: {users:?}"
    );
}

#[test]
fn every_edge_file_fits_in_350_lines() {
    let krate = load();
    let long: Vec<String> = krate
        .files
        .iter()
        .filter(|f| f.rel.starts_with("edge/") && f.lines > MAX_EDGE_FILE_LINES)
        .map(|f| format!("{}: {} lines", f.rel, f.lines))
        .collect();
    assert!(
        long.is_empty(),
        "over {MAX_EDGE_FILE_LINES} lines: {long:?}"
    );
}

#[test]
fn no_production_function_over_80_lines() {
    let krate = load();
    let mut long = Vec::new();
    for (_, file) in krate.production_files() {
        for (name, line, length) in functions(&file.code) {
            if length > MAX_FUNCTION_LINES {
                long.push(format!("{}:{line} {name}: {length} lines", file.rel));
            }
        }
    }
    assert!(
        long.is_empty(),
        "over {MAX_FUNCTION_LINES} lines; split along its decisions: {long:#?}"
    );
}

/// The checks see what they must: a loop through a re-export, a function's length, a test
/// module left out.
#[test]
fn the_parser_reads_what_the_checks_rely_on() {
    let code = code_only(
        "use crate::a::{b::{self, C}, d as e};\nfn f() {\n    let s = \"}\";\n    let c = '{';\n}\n#[cfg(test)]\nmod tests {\n    fn g() {}\n}\n",
    );
    let (code, _) = production(&code);
    let paths: Vec<String> = uses(&code)
        .iter()
        .flat_map(|u| u.paths.iter().map(|(p, _)| p.join("::")))
        .collect();
    assert_eq!(paths, ["crate::a::b", "crate::a::b::C", "crate::a::d"]);
    assert_eq!(functions(&code), [("f".to_string(), 2, 4)]);
    let krate = load();
    let graph = krate.graph();
    let file = |rel: &str| krate.files.iter().position(|f| f.rel == rel).unwrap();
    // `crate::operation::Operation`, re-exported by operation/mod.rs, is record/mod.rs's.
    assert!(graph[&file("operation/effect.rs")].contains(&file("operation/record/mod.rs")));
    assert!(!krate.test_files.contains("operation/record/mod.rs"));
    assert!(krate.test_files.contains("operation/record/tests.rs"));
}

/// The path a signed completion crosses from the Worker's fetch handler to the destination's
/// POST (docs/DESIGN.md, "From the webhook to the destination's POST"), one row per crossing
/// from one file into another, counted once per pair of files in each of the three
/// invocations: (caller's file, caller, callee's file, callee). Each row holds while the
/// caller's body calls the callee by name and the callee's file defines it, so a layer put
/// back between two of them (a wrapper, a step that only forwards) breaks its row.
pub const DELIVERY_PATH: &[(&str, &str, &str, &str)] = &[
    // The Worker's fetch.
    (
        "edge/mod.rs",
        "route",
        "edge/http/webhook/mod.rs",
        "receive",
    ),
    (
        "edge/http/webhook/mod.rs",
        "receive",
        "inbound/intake.rs",
        "body_read",
    ),
    (
        "edge/http/webhook/mod.rs",
        "receive",
        "edge/capped_read.rs",
        "read_capped",
    ),
    ("inbound/intake.rs", "classify", "signature.rs", "verify"),
    ("inbound/intake.rs", "read", "inbound/envelope.rs", "parse"),
    ("inbound/intake.rs", "read", "operation/key.rs", "normalize"),
    (
        "edge/http/webhook/mod.rs",
        "receive",
        "edge/objects/call.rs",
        "call_gate",
    ),
    // The gate's fetch.
    (
        "edge/objects/gate/mod.rs",
        "fetch",
        "operation/gate/mod.rs",
        "step",
    ),
    (
        "operation/gate/mod.rs",
        "deliver",
        "operation/record/mod.rs",
        "apply",
    ),
    (
        "operation/record/mod.rs",
        "apply",
        "operation/lifecycle.rs",
        "reduce",
    ),
    (
        "edge/objects/gate/mod.rs",
        "fetch",
        "edge/objects/gate/storage.rs",
        "commit",
    ),
    (
        "edge/objects/gate/storage.rs",
        "sync_alarm",
        "operation/record/mod.rs",
        "wake_at_ms",
    ),
    // The gate's alarm.
    (
        "edge/objects/gate/mod.rs",
        "alarm",
        "edge/objects/gate/alarm.rs",
        "perform",
    ),
    (
        "edge/objects/gate/alarm.rs",
        "perform",
        "edge/objects/gate/results.rs",
        "effect",
    ),
    (
        "edge/objects/gate/results.rs",
        "perform",
        "results/plan.rs",
        "next",
    ),
    (
        "edge/objects/gate/results.rs",
        "commit",
        "results/marks.rs",
        "decide",
    ),
    (
        "edge/objects/gate/results.rs",
        "send_effect",
        "operation/effect.rs",
        "build_request",
    ),
    (
        "operation/effect.rs",
        "signed_request",
        "signature.rs",
        "sign",
    ),
    (
        "edge/objects/gate/results.rs",
        "send_effect",
        "edge/objects/gate/desk_turn.rs",
        "send",
    ),
    (
        "edge/objects/gate/desk_turn.rs",
        "send",
        "edge/outbound/fetch.rs",
        "deliver",
    ),
];

/// At most this many crossings over at most this many files (issue 37).
pub const MAX_PATH_CALLS: usize = 20;
pub const MAX_PATH_FILES: usize = 20;

/// The bodies of every production function named `name` in `code` (several `impl`s may
/// each define one).
fn body_of_all(code: &str, name: &str) -> Vec<String> {
    let chars: Vec<char> = code.chars().collect();
    let words = words(code);
    words
        .windows(2)
        .filter(|w| w[0].1 == "fn" && w[1].1 == name)
        .map(|w| {
            let end = item_end(&chars, w[1].0);
            chars[w[1].0..end].iter().collect::<String>()
        })
        .filter(|body| body.trim_end().ends_with('}'))
        .collect()
}

/// The body of the production function `name` in `code`, if it defines one.
fn body_of(code: &str, name: &str) -> Option<String> {
    let chars: Vec<char> = code.chars().collect();
    let words = words(code);
    words.windows(2).find_map(|w| {
        (w[0].1 == "fn" && w[1].1 == name).then(|| {
            let end = item_end(&chars, w[1].0);
            chars[w[1].0..end].iter().collect()
        })
    })
}

#[test]
fn the_delivery_path_is_what_design_md_draws_and_no_longer() {
    let krate = load();
    let code = |rel: &str| {
        let file = krate.files.iter().find(|f| f.rel == rel);
        file.unwrap_or_else(|| panic!("{rel}: no such file"))
            .code
            .clone()
    };
    let mut broken = Vec::new();
    for (from, caller, to, callee) in DELIVERY_PATH {
        let calls = body_of(&code(from), caller)
            .is_some_and(|body| words(&body).iter().skip(1).any(|(_, w)| w == callee));
        if !calls || body_of(&code(to), callee).is_none() {
            broken.push(format!("{from}::{caller} → {to}::{callee}"));
        }
    }
    assert!(
        broken.is_empty(),
        "the path moved; redraw it in DESIGN.md and here: {broken:#?}"
    );
    let files: BTreeSet<&str> = DELIVERY_PATH
        .iter()
        .flat_map(|(from, _, to, _)| [*from, *to])
        .collect();
    assert!(
        DELIVERY_PATH.len() <= MAX_PATH_CALLS,
        "{} calls",
        DELIVERY_PATH.len()
    );
    assert!(files.len() <= MAX_PATH_FILES, "{} files", files.len());
    let design = fs::read_to_string(src_dir().join("../docs/DESIGN.md")).unwrap();
    let stated = format!("{} calls over {} files", DELIVERY_PATH.len(), files.len());
    assert!(
        design.contains(&stated),
        "DESIGN.md should say \"{stated}\""
    );
}
