//! The README's performance figures come from a committed run: every line
//! of each text block that follows a `<!-- perf: docs/perf/<file> -->`
//! marker in `README.md` must be a line of that committed report. So no
//! figure reaches the README that the run does not show.

use std::path::Path;

#[test]
fn every_readme_performance_line_is_in_the_committed_run() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let mut blocks = 0;
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        let Some(file) = line
            .trim()
            .strip_prefix("<!-- perf: ")
            .and_then(|rest| rest.strip_suffix(" -->"))
        else {
            continue;
        };
        let report = std::fs::read_to_string(root.join(file))
            .unwrap_or_else(|e| panic!("README cites {file}, which cannot be read: {e}"));
        let report_lines: std::collections::HashSet<&str> =
            report.lines().map(str::trim_end).collect();
        // The fenced block right after the marker.
        let fence = lines.next().unwrap_or_default();
        assert!(
            fence.starts_with("```"),
            "a fenced block follows the marker for {file}"
        );
        for shown in lines.by_ref().take_while(|l| !l.starts_with("```")) {
            let shown = shown.trim_end();
            if shown.is_empty() {
                continue;
            }
            assert!(
                report_lines.contains(shown),
                "README shows a line that {file} does not have:\n{shown}"
            );
        }
        blocks += 1;
    }
    assert!(
        blocks > 0,
        "README has no performance block from a committed run"
    );
}
