//! The shape of the source (issues 9 and 31). `src/` has four layers,
//! `util`, `job`, `core` and `api`, and the product code of each names,
//! through `crate::` paths, only modules of its own layer or of those
//! before it in that list; no module names a type through the crate
//! root's re-exports (`crate::Offloader`), which would hide where it
//! lives; and no module reaches, through `crate::` paths, a module that
//! reaches it back. Test code (loom models, unit-test files) is exempt: it
//! works through the public API. A file's length is no rule: one well past
//! ~600 lines is a prompt to look at it, not a failure. The locked state
//! (`src/core/state/`) names neither `tracing` nor `std::task`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, lowest first.
const LAYERS: [&str; 4] = ["util", "job", "core", "api"];

/// What one module's product code names through `crate::` paths.
#[derive(Default, Debug)]
struct Names {
    /// Modules (`layer/name`, or `layer` for a layer's `mod.rs`).
    modules: BTreeSet<String>,
    /// Names taken from the crate root (`crate::Offloader`).
    root: BTreeSet<String>,
}

/// Every `.rs` file under `dir`, nested ones too.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("a directory") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().and_then(|e| e.to_str()) == Some("rs") {
                files.push(path);
            }
        }
    }
    files
}

/// A file's module: `layer/name` for `src/layer/name.rs` and for every
/// file under `src/layer/name/`; `layer` for `src/layer/mod.rs`; `None`
/// for `lib.rs`.
fn module_of(relative: &Path) -> Option<String> {
    let parts: Vec<&str> = relative.iter().filter_map(|p| p.to_str()).collect();
    match parts.as_slice() {
        [_] => None,
        [layer, "mod.rs"] => Some((*layer).to_owned()),
        [layer, name, ..] => Some(format!("{layer}/{}", name.trim_end_matches(".rs"))),
        [] => None,
    }
}

/// Test code: loom models and unit-test files.
fn is_test_code(relative: &Path) -> bool {
    relative
        .iter()
        .filter_map(|p| p.to_str())
        .any(|p| p == "loom" || p == "loom.rs" || p == "tests.rs")
}

/// What the `crate::` paths of `text` name. `known` lists the modules, so
/// that `crate::core::pool::Inner` resolves to `core/pool` and
/// `crate::core::Thing` to `core`.
fn crate_names(text: &str, known: &BTreeSet<String>) -> Names {
    let tokens = tokens(text);
    let mut names = Names::default();
    let resolve = |path: &[&str], names: &mut Names| match path {
        [] => {}
        [first, ..] if first.starts_with(|c: char| c.is_ascii_uppercase()) => {
            names.root.insert((*first).to_owned());
        }
        [layer, second, ..] if known.contains(&format!("{layer}/{second}")) => {
            names.modules.insert(format!("{layer}/{second}"));
        }
        [first, ..] => {
            names.modules.insert((*first).to_owned());
        }
    };
    for (at, token) in tokens.iter().enumerate() {
        if token != "crate" || tokens.get(at + 1).map(String::as_str) != Some("::") {
            continue;
        }
        // The path's prefix, up to a group or its end.
        let mut prefix: Vec<&str> = Vec::new();
        let mut i = at + 2;
        while let Some(t) = tokens.get(i) {
            if t == "::" {
                i += 1;
            } else if t == "{" || t == "}" || t == "," {
                break;
            } else {
                prefix.push(t);
                i += 1;
                if tokens.get(i).map(String::as_str) != Some("::") {
                    break;
                }
            }
        }
        if tokens.get(i).map(String::as_str) != Some("{") {
            resolve(&prefix, &mut names);
            continue;
        }
        // A group: the first two names of each path at its top level.
        let mut depth = 0;
        let mut entry: Vec<&str> = Vec::new();
        for t in &tokens[i..] {
            match t.as_str() {
                "{" => depth += 1,
                "}" | "," if depth == 1 => {
                    let path: Vec<&str> = prefix.iter().chain(entry.iter()).copied().collect();
                    resolve(&path, &mut names);
                    entry.clear();
                    if t == "}" {
                        break;
                    }
                }
                "}" => depth -= 1,
                "::" => {}
                name if depth == 1 && entry.len() < 2 => entry.push(name),
                _ => {}
            }
        }
    }
    names
}

/// Each module of `src/` (product code only) and what it names.
fn modules() -> BTreeMap<String, Names> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files: Vec<(PathBuf, String)> = rust_files(&src)
        .into_iter()
        .filter_map(|file| {
            let relative = file.strip_prefix(&src).expect("under src/").to_owned();
            let module = module_of(&relative)?;
            (!is_test_code(&relative)).then_some((file, module))
        })
        .collect();
    let known: BTreeSet<String> = files.iter().map(|(_, m)| m.clone()).collect();
    let mut graph: BTreeMap<String, Names> = BTreeMap::new();
    for (file, module) in &files {
        let text = std::fs::read_to_string(file).expect("a source file");
        let found = crate_names(&text, &known);
        let names = graph.entry(module.clone()).or_default();
        names
            .modules
            .extend(found.modules.into_iter().filter(|m| m != module));
        names.root.extend(found.root);
    }
    graph
}

fn reaches(graph: &BTreeMap<String, Names>, from: &str, to: &str) -> bool {
    let mut seen = BTreeSet::new();
    let mut stack = vec![from.to_owned()];
    while let Some(m) = stack.pop() {
        if m == to {
            return true;
        }
        if seen.insert(m.clone()) {
            stack.extend(
                graph
                    .get(&m)
                    .into_iter()
                    .flat_map(|n| n.modules.iter().cloned()),
            );
        }
    }
    false
}

fn layer(module: &str) -> usize {
    let name = module.split('/').next().unwrap_or(module);
    LAYERS
        .iter()
        .position(|l| *l == name)
        .unwrap_or_else(|| panic!("{module} is in no layer of {LAYERS:?}"))
}

#[test]
fn no_import_circles() {
    let graph = modules();
    assert!(graph.len() > 30, "read the modules: {graph:?}");
    let mut circles = Vec::new();
    for (module, names) in &graph {
        for dep in &names.modules {
            if reaches(&graph, dep, module) {
                circles.push(format!("{module} -> {dep} -> ... -> {module}"));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

#[test]
fn each_layer_names_only_itself_and_the_layers_below() {
    let graph = modules();
    let mut up = Vec::new();
    for (module, names) in &graph {
        for dep in &names.modules {
            if layer(dep) > layer(module) {
                up.push(format!("{module} -> {dep}"));
            }
        }
        for root in &names.root {
            up.push(format!("{module} -> crate::{root}"));
        }
    }
    assert!(up.is_empty(), "arrows running back up:\n{}", up.join("\n"));
}

/// The path reader above finds each form of `crate::` path.
#[test]
fn the_layer_check_reads_each_form() {
    let known: BTreeSet<String> = ["core/pool", "core/state", "util/sync", "job/id"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    for (text, modules, root) in [
        ("use crate::core::pool::Inner;", &["core/pool"][..], &[][..]),
        ("let x = crate::util::sync::lock(&m);", &["util/sync"], &[]),
        (
            "use crate::{util::sync::Mutex, job::id::JobId};",
            &["job/id", "util/sync"],
            &[],
        ),
        (
            "use crate::core::{pool::Inner, state::{State, After}};",
            &["core/pool", "core/state"],
            &[],
        ),
        (
            "use crate::{Error, Offloader};",
            &[],
            &["Error", "Offloader"],
        ),
        ("fn f(p: &crate::Offloader) {}", &[], &["Offloader"]),
        ("use crate::core::Thing;", &["core"], &[]),
        (
            "// crate::core::pool::Inner\nconst S: &str = \"crate::Error\";",
            &[],
            &[],
        ),
    ] {
        let names = crate_names(text, &known);
        let want: BTreeSet<String> = modules.iter().map(|s| (*s).to_owned()).collect();
        assert_eq!(names.modules, want, "modules of {text:?}");
        let want: BTreeSet<String> = root.iter().map(|s| (*s).to_owned()).collect();
        assert_eq!(names.root, want, "root names of {text:?}");
    }
}

/// The identifiers and the path punctuation (`::`, `{`, `}`, `,`) of Rust
/// source, without its comments (doc comments too), string and character
/// literals.
fn tokens(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c == '\'' && (next == Some('\\') || chars.get(i + 2) == Some(&'\'')) {
            // A character literal ('x', '\n', '\''); a lifetime has no
            // closing quote and is read as punctuation and a name.
            i += if next == Some('\\') { 3 } else { 2 };
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            i += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
        } else if c == ':' && next == Some(':') {
            out.push("::".to_owned());
            i += 2;
        } else {
            if matches!(c, '{' | '}' | ',') {
                out.push(c.to_string());
            }
            i += 1;
        }
    }
    out
}

/// Where `text` names `tracing` (any path or import of it) or
/// `std::task` (also as `core::task` or `alloc::task`, and inside a
/// grouped import such as `std::{sync::Arc, task::Waker}`).
fn forbidden_names(text: &str) -> Vec<String> {
    let tokens = tokens(text);
    let mut found = Vec::new();
    for (at, token) in tokens.iter().enumerate() {
        if token.starts_with("tracing") {
            found.push(token.clone());
        }
        let root = matches!(token.as_str(), "std" | "core" | "alloc");
        if !root || tokens.get(at + 1).map(String::as_str) != Some("::") {
            continue;
        }
        match tokens.get(at + 2).map(String::as_str) {
            Some("task") => found.push(format!("{token}::task")),
            Some("{") => {
                // The first name of each path at the group's top level.
                let mut depth = 0;
                let mut first = true;
                for t in &tokens[at + 2..] {
                    match t.as_str() {
                        "{" => {
                            depth += 1;
                            first = depth == 1;
                        }
                        "}" => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        "," => first = depth == 1,
                        "task" if first => found.push(format!("{token}::{{task}}")),
                        _ => first = false,
                    }
                }
            }
            _ => {}
        }
    }
    found
}

/// S4 of `src/core/state/mod.rs` (nothing foreign under the lock): the
/// locked state neither emits tracing events nor touches wakers, so no file
/// of `src/core/state/` names `tracing` or `std::task`. What would needs
/// doing is handed out in an `After`.
#[test]
fn the_locked_state_names_neither_tracing_nor_std_task() {
    let files = rust_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src/core/state"));
    assert!(files.len() >= 10, "read src/core/state/: {files:?}");
    let mut named = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("a source file");
        for name in forbidden_names(&text) {
            named.push(format!("{}: {name}", file.display()));
        }
    }
    assert!(
        named.is_empty(),
        "the locked state names tracing or std::task:\n{}",
        named.join("\n")
    );
}

/// The check above finds each way of naming them, and nothing in comments,
/// strings or a variable called `task`.
#[test]
fn the_locked_state_check_finds_each_form() {
    for bad in [
        "use tracing::debug;",
        "fn f() { tracing::warn!(\"x\"); }",
        "fn f() { ::tracing::trace!(\"x\"); }",
        "use tracing;",
        "use std::task::Waker;",
        "fn f(w: &std::task::Waker) {}",
        "fn f(w: &core::task::Waker) {}",
        "use std::{sync::Arc, task::Waker};",
        "use std::{\n    sync::{Arc, Mutex},\n    task::{Context, Poll},\n};",
        "use std::{task};",
        "use tracing_core::Event;",
    ] {
        assert!(!forbidden_names(bad).is_empty(), "not found in {bad:?}");
    }
    for fine in [
        "// tracing::debug! is not called here; nor std::task::Waker",
        "/// A [`std::task::Waker`] is woken after unlocking.",
        "/* use tracing; /* nested */ use std::task; */",
        "const S: &str = \"tracing std::task\";",
        "let task = self.jobs.get(key)?; task.core();",
        "use crate::job::Task; use std::sync::task;",
        "use std::{sync::{task, Arc}, time::Duration};",
        "let c = '\"'; let d = '\\''; fn f<'a>(x: &'a str) {}",
    ] {
        assert!(forbidden_names(fine).is_empty(), "found in {fine:?}");
    }
}
