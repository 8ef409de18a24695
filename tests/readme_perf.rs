//! The README's performance figures come from a committed run: every row of
//! the table that follows a `<!-- perf: docs/perf/<file> -->` marker in
//! `README.md` must be a target line of that committed report, with the
//! same ratio, bound, verdict and rounds held. So no figure reaches the
//! README that the run does not show.
//!
//! This test reads `docs/perf/`, which is not in the published package (nor
//! is `tests/`): it runs from the repository only.

use std::path::Path;

/// A line with its runs of whitespace made single spaces.
fn words(line: &str) -> String {
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The cells of a Markdown table row, trimmed.
fn cells(row: &str) -> Vec<&str> {
    let row = row.trim();
    let inner = row
        .strip_prefix('|')
        .and_then(|r| r.strip_suffix('|'))
        .unwrap_or(row);
    inner.split('|').map(str::trim).collect()
}

#[test]
fn every_readme_performance_row_is_a_target_line_of_the_committed_run() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let mut rows_checked = 0;
    let mut lines = readme.lines().peekable();
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
        let report_lines: Vec<String> = report.lines().map(words).collect();

        // The table right after the marker: a header, a separator, rows.
        let header = lines.next().unwrap_or_default();
        assert!(
            header.starts_with('|'),
            "a table follows the marker for {file}"
        );
        let separator = lines.next().unwrap_or_default();
        assert!(
            separator.starts_with("| ---"),
            "the table after the marker for {file} has a separator row"
        );
        while let Some(row) = lines.next_if(|l| l.starts_with('|')) {
            let [label, measured, bound, verdict, held] = cells(row)[..] else {
                panic!("a row of five cells (target, measured, bound, verdict, held):\n{row}");
            };
            let label = label.trim_matches('`');
            let bound = bound.replace('≤', "<=").replace('≥', ">=");
            let expected = words(&format!("{label} {measured} {bound} {verdict} {held} held"));
            assert!(
                report_lines.iter().any(|l| l == &expected
                    || l.strip_prefix(expected.as_str())
                        .is_some_and(|rest| rest.starts_with(' '))),
                "README shows a row that {file} does not have:\n{row}\n(looked for a line starting `{expected}`)"
            );
            rows_checked += 1;
        }
    }
    assert!(
        rows_checked > 0,
        "README has no performance table from a committed run"
    );
}
