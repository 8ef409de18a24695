//! The shape of the source (issue 9): the modules of `src/` read top-down,
//! with no import circles (a module never reaches, through `crate::` paths,
//! a module that reaches it back). A file's length is no rule: one well
//! past ~600 lines is a prompt to look at it, not a failure (issue 31).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Each module of `src/` and the crate modules its code names.
fn modules() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&src).expect("src/") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            for inner in std::fs::read_dir(&path).expect("a module directory") {
                files.push((path.clone(), inner.expect("entry").path()));
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
