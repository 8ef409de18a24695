//! The shape of the source (issue 9): the modules of `src/` read top-down,
//! with no import circles (a module never reaches, through `crate::` paths,
//! a module that reaches it back). A file's length is no rule: one well
//! past ~600 lines is a prompt to look at it, not a failure (issue 31). The
//! locked state (`src/state/`) names neither `tracing` nor `std::task`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Each module of `src/` and the crate modules its code names.
fn modules() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&src).expect("src/") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            // Every file under a module's folder, nested ones too, is
            // that module's.
            let mut stack = vec![path.clone()];
            while let Some(dir) = stack.pop() {
                for inner in std::fs::read_dir(&dir).expect("a module directory") {
                    let inner = inner.expect("entry").path();
                    if inner.is_dir() {
                        stack.push(inner);
                    } else {
                        files.push((path.clone(), inner));
                    }
                }
            }
        } else {
            files.push((path.clone(), path));
        }
    }
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module_path, file) in files {
        if file.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
        let name = module_path
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("a module name")
            .to_owned();
        if name == "lib" || name == "loom_tests" {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("a source file");
        let deps = graph.entry(name.clone()).or_default();
        for line in text.lines() {
            let code = line.split("//").next().unwrap_or("");
            let mut rest = code;
            while let Some(at) = rest.find("crate::") {
                rest = &rest[at + "crate::".len()..];
                let mut names = Vec::new();
                if let Some(group) = rest.strip_prefix('{') {
                    let group = group.split('}').next().unwrap_or("");
                    names.extend(group.split(',').filter_map(|p| p.trim().split("::").next()));
                } else {
                    names.push(
                        rest.split(|c: char| !c.is_alphanumeric() && c != '_')
                            .next()
                            .unwrap_or(""),
                    );
                }
                for n in names {
                    if !n.is_empty()
                        && n != name
                        && n.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                    {
                        deps.insert(n.to_owned());
                    }
                }
            }
        }
    }
    let known: BTreeSet<String> = graph.keys().cloned().collect();
    for deps in graph.values_mut() {
        deps.retain(|d| known.contains(d));
    }
    graph
}

fn reaches(graph: &BTreeMap<String, BTreeSet<String>>, from: &str, to: &str) -> bool {
    let mut seen = BTreeSet::new();
    let mut stack = vec![from.to_owned()];
    while let Some(m) = stack.pop() {
        if m == to {
            return true;
        }
        if seen.insert(m.clone()) {
            stack.extend(graph.get(&m).into_iter().flatten().cloned());
        }
    }
    false
}

#[test]
fn no_import_circles() {
    let graph = modules();
    assert!(graph.len() > 10, "read the modules: {graph:?}");
    let mut circles = Vec::new();
    for (module, deps) in &graph {
        for dep in deps {
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

/// S4 of `src/state/mod.rs` (nothing foreign under the lock): the locked
/// state neither emits tracing events nor touches wakers, so no file of
/// `src/state/` names `tracing` or `std::task`. What would needs doing is
/// handed out in an `After`.
#[test]
fn the_locked_state_names_neither_tracing_nor_std_task() {
    let mut files = Vec::new();
    let mut stack = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("src/state")];
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
    assert!(files.len() >= 10, "read src/state/: {files:?}");
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
