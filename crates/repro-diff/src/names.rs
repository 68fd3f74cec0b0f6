//! Pairing tensors whose names differ between two runs: a port to another framework, a model
//! wrapped in another module. A name map holds rules, applied to both runs' tensor names before
//! tensors are paired (`repro diff --map FILE`):
//!
//! ```text
//! # comments and blank lines are ignored
//! rename transformer.*   *          # the first rename rule whose pattern matches a name renames it
//! rename h.*.attn.qkv.*  h.*.attn.c_attn.*
//! ignore *#*                        # leave out captured graph nodes (named `scope#k`)
//! transpose b h.*.mlp.c_fc.weight*  # B stores these [in, out] (GPT-2's Conv1D), A [out, in]
//! ```
//!
//! A comment starts at a `#` that begins a line or follows a space.
//!
//! Patterns match whole names; `*` matches any run of characters, and the replacement's `*`s
//! take the matched runs in order. `ignore` leaves the tensors it matches out of the comparison
//! on both sides; rename and ignore rules apply in file order, and the first that matches a name
//! decides. `transpose a|b PATTERN` says that run A's (or B's) two-dimensional tensors of those
//! names, after renaming, hold the transpose of the other run's: they are compared transposed,
//! at the steps that store their values (`repro diff` reads them to transpose them), and left
//! out at the others.

use repro_trace::{StepRecord, TensorRecord};
use std::collections::BTreeSet;
use std::path::Path;

/// Rename and ignore rules for tensor names.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NameMap {
    rules: Vec<Rule>,
}

#[derive(Debug, Clone, PartialEq)]
enum Rule {
    Rename { from: String, to: String },
    Ignore(String),
    Transpose { run: Run, pattern: String },
}

/// One of the two runs compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Run {
    /// The first (`repro diff A B`).
    A,
    /// The second.
    B,
}

impl NameMap {
    /// Parses the rules of a map file (see the module's documentation).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut rules = Vec::new();
        for (i, line) in text.lines().enumerate() {
            // A comment starts at a `#` that begins the line or follows a space (`*#*` is a pattern).
            let comment =
                line.char_indices().find(|&(i, c)| c == '#' && (i == 0 || line[..i].ends_with(char::is_whitespace)));
            let line = comment.map_or(line, |(i, _)| &line[..i]).trim();
            let words: Vec<&str> = line.split_whitespace().collect();
            let bad = |why: &str| Err(format!("line {}: {why}", i + 1));
            match words.as_slice() {
                [] => {}
                ["ignore", pattern] => rules.push(Rule::Ignore(pattern.to_string())),
                ["transpose", run, pattern] => {
                    let run = match *run {
                        "a" => Run::A,
                        "b" => Run::B,
                        other => {
                            return bad(&format!(
                                "`transpose` takes the run, `a` or `b`, before the pattern, not `{other}`"
                            ))
                        }
                    };
                    rules.push(Rule::Transpose { run, pattern: pattern.to_string() });
                }
                ["rename", from, to] => {
                    let (stars_from, stars_to) = (from.matches('*').count(), to.matches('*').count());
                    if stars_to > stars_from {
                        return bad(&format!(
                            "`{to}` uses {stars_to} `*` but `{from}` matches only {stars_from}: each `*` of the new \
                             name takes one matched run"
                        ));
                    }
                    rules.push(Rule::Rename { from: from.to_string(), to: to.to_string() });
                }
                _ => {
                    return bad(&format!(
                        "expected `rename PATTERN NEW`, `ignore PATTERN` or `transpose a|b PATTERN`, found `{line}`"
                    ))
                }
            }
        }
        Ok(NameMap { rules })
    }

    /// Reads and parses a map file; the error names the file (and the line).
    pub fn read(path: &Path) -> Result<Self, String> {
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("cannot read the name map {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("name map {}: {e}", path.display()))
    }

    /// The name `name` is compared under, or `None` when it is left out.
    pub fn map(&self, name: &str) -> Option<String> {
        for rule in &self.rules {
            match rule {
                Rule::Ignore(pattern) if glob_captures(pattern, name).is_some() => return None,
                Rule::Rename { from, to } => {
                    if let Some(runs) = glob_captures(from, name) {
                        let mut runs = runs.into_iter();
                        let mut renamed = String::new();
                        for (k, part) in to.split('*').enumerate() {
                            if k > 0 {
                                renamed.push_str(runs.next().unwrap_or_default());
                            }
                            renamed.push_str(part);
                        }
                        return Some(renamed);
                    }
                }
                Rule::Ignore(_) | Rule::Transpose { .. } => {}
            }
        }
        Some(name.to_string())
    }

    /// Whether run `run`'s tensor of (renamed) name `name` is compared transposed.
    pub fn transposes(&self, run: Run, name: &str) -> bool {
        self.rules.iter().any(|rule| match rule {
            Rule::Transpose { run: r, pattern } => *r == run && glob_captures(pattern, name).is_some(),
            _ => false,
        })
    }

    /// Whether any rule transposes tensors.
    pub fn has_transposes(&self) -> bool {
        self.rules.iter().any(|rule| matches!(rule, Rule::Transpose { .. }))
    }

    /// `step`'s tensors renamed and the ignored ones left out, each with its index in `step`'s
    /// tensors (where the trace stores it under its own name). A tensor's recorded inputs are
    /// renamed alike; an input left out keeps its name, and so cannot be compared (its
    /// consumer's inputs are then not established as identical). A name that would collide
    /// with another tensor's keeps its own.
    pub fn apply(&self, step: &StepRecord) -> Vec<(TensorRecord, usize)> {
        let mut taken = BTreeSet::new();
        let mut kept = Vec::with_capacity(step.tensors.len());
        for (index, t) in step.tensors.iter().enumerate() {
            let Some(name) = self.map(&t.name) else { continue };
            let mut t = t.clone();
            if taken.insert(name.clone()) {
                t.name = name;
            } else {
                taken.insert(t.name.clone());
            }
            t.inputs = t.inputs.iter().map(|i| self.map(i).unwrap_or_else(|| i.clone())).collect();
            if let Some(view) = &mut t.view {
                view.of = self.map(&view.of).unwrap_or_else(|| view.of.clone());
            }
            kept.push((t, index));
        }
        kept
    }

    /// Whether the map has any rule (an empty map leaves steps as they are).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

/// `*`-only glob matching of a whole `text`: the runs the `*`s matched, in order (each `*` but
/// the last takes the shortest run that lets the rest match from there), or `None`.
pub(crate) fn glob_captures<'t>(pattern: &str, text: &'t str) -> Option<Vec<&'t str>> {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let mut rest = text.strip_prefix(first)?;
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else { return rest.is_empty().then(Vec::new) };
    let mut runs = Vec::with_capacity(parts.len());
    for part in middle {
        let i = rest.find(part)?;
        runs.push(&rest[..i]);
        rest = &rest[i + part.len()..];
    }
    let run = rest.strip_suffix(last)?;
    runs.push(run);
    Some(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_rename_and_ignore_in_file_order() {
        let map = NameMap::parse(
            "# a port's names\nrename transformer.* *\n\nrename h.*.attn.qkv.* h.*.attn.c_attn.*  # fused\nignore *#* # nodes\n",
        )
        .unwrap();
        assert_eq!(map.map("transformer.wte.weight").as_deref(), Some("wte.weight"));
        assert_eq!(map.map("h.3.attn.qkv.bias").as_deref(), Some("h.3.attn.c_attn.bias"));
        assert_eq!(map.map("h[0]/attn#4"), None);
        assert_eq!(map.map("loss").as_deref(), Some("loss"));
    }

    #[test]
    fn transpose_rules_name_one_run_and_leave_names_alone() {
        let map = NameMap::parse("rename t.* *\ntranspose b h.*.c_fc.weight*\n").unwrap();
        assert!(map.transposes(Run::B, "h.0.c_fc.weight.grad"));
        assert!(!map.transposes(Run::A, "h.0.c_fc.weight"));
        assert!(!map.transposes(Run::B, "h.0.c_fc.bias"));
        assert_eq!(map.map("h.0.c_fc.weight").as_deref(), Some("h.0.c_fc.weight"));
        assert!(map.has_transposes() && !NameMap::parse("ignore x").unwrap().has_transposes());
    }

    #[test]
    fn a_bad_line_is_named() {
        let e = NameMap::parse("rename a b\nremap x y\n").unwrap_err();
        assert!(e.starts_with("line 2: expected `rename PATTERN NEW`"), "{e}");
        let e = NameMap::parse("transpose c w\n").unwrap_err();
        assert!(e.contains("the run, `a` or `b`"), "{e}");
        let e = NameMap::parse("rename a.* *.*.*\n").unwrap_err();
        assert!(e.contains("uses 3 `*` but `a.*` matches only 1"), "{e}");
    }

    #[test]
    fn globs_capture_the_runs_their_stars_match() {
        assert_eq!(glob_captures("a*c", "abbc"), Some(vec!["bb"]));
        assert_eq!(glob_captures("h.*.w.*", "h.12.w.x"), Some(vec!["12", "x"]));
        assert_eq!(glob_captures("*", ""), Some(vec![""]));
        assert_eq!(glob_captures("abc", "abc"), Some(vec![]));
        assert_eq!(glob_captures("a*c", "ab"), None);
    }
}
