//! A line diff (longest common subsequence) printed as unified-diff hunks, for
//! `allot policy diff`. Policy files are small; the table is bounded all the same.

use std::fmt::Write as _;

/// Lines of context around each change.
const CONTEXT_LINES: usize = 3;
/// Largest LCS table (lines × lines, after the common head and tail are set aside).
const TABLE_CELLS_MAX: usize = 16 * 1024 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Edit {
    Same,
    Removed,
    Added,
}

/// `old` and `new` compared line by line: "no differences" or `---`/`+++` headers and hunks.
pub(crate) fn unified(
    old: &str,
    new: &str,
    old_name: &str,
    new_name: &str,
) -> Result<String, String> {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    let script = edits(&a, &b)?;
    if script.iter().all(|(edit, _, _)| *edit == Edit::Same) {
        return Ok("no differences\n".to_string());
    }
    let mut out = format!("--- {old_name}\n+++ {new_name}\n");
    // Hunks: runs of changes joined when fewer than 2×CONTEXT unchanged lines separate them.
    let changed: Vec<usize> = (0..script.len()).filter(|&i| script[i].0 != Edit::Same).collect();
    let mut groups: Vec<(usize, usize)> = Vec::new();
    for &i in &changed {
        match groups.last_mut() {
            Some((_, end)) if i <= *end + 2 * CONTEXT_LINES + 1 => *end = i,
            _ => groups.push((i, i)),
        }
    }
    for (first, last) in groups {
        let start = first.saturating_sub(CONTEXT_LINES);
        let end = (last + CONTEXT_LINES + 1).min(script.len());
        let hunk = &script[start..end];
        let old_count = hunk.iter().filter(|(e, _, _)| *e != Edit::Added).count();
        let new_count = hunk.iter().filter(|(e, _, _)| *e != Edit::Removed).count();
        let (_, old_at, new_at) = script[start];
        let _ = writeln!(out, "@@ -{} +{} @@", range(old_at, old_count), range(new_at, new_count));
        for &(edit, i, j) in hunk {
            match edit {
                Edit::Same => writeln!(out, " {}", a[i]),
                Edit::Removed => writeln!(out, "-{}", a[i]),
                Edit::Added => writeln!(out, "+{}", b[j]),
            }
            .map_err(|e| e.to_string())?;
        }
    }
    Ok(out)
}

/// Lines added and removed going from `old` to `new` (`allot policy history`).
pub(crate) fn counts(old: &str, new: &str) -> Result<(usize, usize), String> {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    let script = edits(&a, &b)?;
    let count = |kind: Edit| script.iter().filter(|(e, _, _)| *e == kind).count();
    Ok((count(Edit::Added), count(Edit::Removed)))
}

/// Unified-diff range: 1-based start, and the count when it is not 1 (an empty range starts
/// at the line before).
fn range(at: usize, count: usize) -> String {
    match count {
        0 => format!("{at},0"),
        1 => format!("{}", at + 1),
        _ => format!("{},{count}", at + 1),
    }
}

/// The edit script: (edit, index into `a`, index into `b`); for an edit that consumes no line
/// of a side, the index is where that side stands.
fn edits(a: &[&str], b: &[&str]) -> Result<Vec<(Edit, usize, usize)>, String> {
    let head = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let tail =
        a[head..].iter().rev().zip(b[head..].iter().rev()).take_while(|(x, y)| x == y).count();
    let (mid_a, mid_b) = (&a[head..a.len() - tail], &b[head..b.len() - tail]);
    let (n, m) = (mid_a.len(), mid_b.len());
    if (n + 1).saturating_mul(m + 1) > TABLE_CELLS_MAX {
        return Err(format!(
            "too many differing lines to diff ({n} × {m}) — fix: `allot policy show > active.yaml` and use diff(1)"
        ));
    }
    // lcs[i][j]: the LCS length of mid_a[i..] and mid_b[j..].
    let width = m + 1;
    let mut lcs = vec![0u32; (n + 1) * width];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i * width + j] = if mid_a[i] == mid_b[j] {
                lcs[(i + 1) * width + j + 1] + 1
            } else {
                lcs[(i + 1) * width + j].max(lcs[i * width + j + 1])
            };
        }
    }
    let mut script: Vec<(Edit, usize, usize)> = (0..head).map(|k| (Edit::Same, k, k)).collect();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && mid_a[i] == mid_b[j] {
            script.push((Edit::Same, head + i, head + j));
            i += 1;
            j += 1;
        } else if j < m && (i == n || lcs[i * width + j + 1] >= lcs[(i + 1) * width + j]) {
            script.push((Edit::Added, head + i, head + j));
            j += 1;
        } else {
            script.push((Edit::Removed, head + i, head + j));
            i += 1;
        }
    }
    script.extend((0..tail).map(|k| (Edit::Same, a.len() - tail + k, b.len() - tail + k)));
    // Removals before additions within a change reads better; the LCS walk above prefers
    // additions, so reorder each run of changes stably.
    let mut k = 0;
    while k < script.len() {
        if script[k].0 == Edit::Same {
            k += 1;
            continue;
        }
        let end =
            script[k..].iter().position(|e| e.0 == Edit::Same).map_or(script.len(), |p| k + p);
        script[k..end].sort_by_key(|e| e.0 == Edit::Added);
        k = end;
    }
    Ok(script)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_texts_have_no_differences() {
        assert_eq!(unified("a\nb\n", "a\nb\n", "x", "y").as_deref(), Ok("no differences\n"));
    }

    #[test]
    fn a_changed_line_is_one_hunk_with_context() {
        let old = "1\n2\n3\n4\n5\n6\n7\n8\n9\n";
        let new = "1\n2\n3\n4\nfive\n6\n7\n8\n9\n";
        assert_eq!(
            unified(old, new, "active", "new.yaml").as_deref(),
            Ok("--- active\n+++ new.yaml\n@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n")
        );
    }

    #[test]
    fn distant_changes_are_separate_hunks_and_additions_at_the_end_count() {
        let old: String = (1..=20).map(|i| format!("{i}\n")).collect();
        let new: String =
            (1..=21).map(|i| if i == 2 { "two\n".to_string() } else { format!("{i}\n") }).collect();
        let diff = unified(&old, &new, "a", "b").expect("small");
        assert_eq!(diff.matches("@@ -").count(), 2, "{diff}");
        assert!(diff.contains("-2\n+two\n"), "{diff}");
        assert!(diff.contains("@@ -18,3 +18,4 @@\n 18\n 19\n 20\n+21\n"), "{diff}");
    }

    #[test]
    fn insertion_into_an_empty_file() {
        assert_eq!(
            unified("", "a\n", "a", "b").as_deref(),
            Ok("--- a\n+++ b\n@@ -0,0 +1 @@\n+a\n")
        );
    }
}
