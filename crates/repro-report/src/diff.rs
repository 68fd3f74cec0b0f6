//! The human-readable `repro diff` report.

use crate::format::{column_width, missing_gradients, sci, shape};
use repro_diff::{
    CauseRule, Divergence, FieldDifference, RootCause, StructuralDifference, TensorMetrics, TraceDiff, TraceSide,
    Verdict,
};
use repro_trace::{Phase, TensorKind};
use std::fmt::{self, Write};

/// How much of a diff's text to show: the tables of a long run can run to hundreds of lines.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DiffText {
    /// The tables too (`repro diff --full`): the first divergent step by kind, every tensor, the
    /// error's growth, every structural difference. Without them (the default), the report is
    /// the verdict, the first divergence, its root cause and the command that goes further.
    pub tables: bool,
    /// At most this many rows in each table (`None`: every row).
    pub rows: Option<usize>,
    /// Only tensors of these kinds in the tables (empty: every kind).
    pub kinds: Vec<TensorKind>,
    /// Only tensors whose name contains one of these in the tables (empty: every tensor).
    pub tensors: Vec<String>,
    /// What to say of a divergence whose values were not stored (`None`: how to record them).
    pub missing_values: Option<String>,
}

impl DiffText {
    fn missing_values(&self) -> &str {
        self.missing_values.as_deref().unwrap_or(RECORD_VALUES)
    }

    fn shows(&self, name: &str, kind: TensorKind) -> bool {
        (self.kinds.is_empty() || self.kinds.contains(&kind))
            && (self.tensors.is_empty() || self.tensors.iter().any(|t| name.contains(t.as_str())))
    }

    /// Writes `rows` through `write`, at most `self.rows` of them, then how many were left out.
    fn table<T>(
        &self,
        out: &mut String,
        rows: impl IntoIterator<Item = T>,
        mut write: impl FnMut(&mut String, T) -> fmt::Result,
    ) -> fmt::Result {
        let mut left = 0usize;
        for (i, row) in rows.into_iter().enumerate() {
            if self.rows.is_some_and(|max| i >= max) {
                left += 1;
            } else {
                write(out, row)?;
            }
        }
        if left > 0 {
            writeln!(out, "  ... and {left} more row(s) (--rows sets how many)")?;
        }
        Ok(())
    }
}

/// Renders a diff for people.
pub fn render_diff(d: &TraceDiff) -> String {
    render_diff_with(d, &DiffText::default())
}

/// Renders a diff for people, showing what `text` asks for.
pub fn render_diff_with(d: &TraceDiff, text: &DiffText) -> String {
    render_diff_unless(d, None, text)
}

/// Renders a diff for people; where the traces agree, `disagreement` (a verdict line of the
/// caller's, who knows more: an unfinished rank of a data-parallel run) replaces the verdict.
pub(crate) fn render_diff_unless(d: &TraceDiff, disagreement: Option<&str>, text: &DiffText) -> String {
    let mut out = String::new();
    write_diff(&mut out, d, disagreement, text).expect("writing to a String cannot fail");
    out
}

/// The whole report: what was compared, the verdict, then (for runs that diverged) where, why,
/// and the tables `text` asks for.
fn write_diff(out: &mut String, d: &TraceDiff, disagreement: Option<&str>, text: &DiffText) -> fmt::Result {
    write_preamble(out, d)?;
    let Some(first) = &d.first_divergence else {
        return write_agreement(out, d, disagreement, text);
    };
    write_first_divergence(out, d, first, text)?;
    if text.tables {
        return write_tables(out, d, text);
    }
    if !d.structure.is_empty() {
        writeln!(out, "\nstructure differs:")?;
        write_structure(out, &d.structure, text)?;
    }
    writeln!(out, "\n{FULL_REPORT}")
}

/// The traces compared, the warnings, the settings that differ and what a tolerance allows.
fn write_preamble(out: &mut String, d: &TraceDiff) -> fmt::Result {
    write_side(out, "A", &d.a)?;
    write_side(out, "B", &d.b)?;
    for warning in &d.warnings {
        writeln!(out, "warning: {warning}")?;
    }
    write_fields(out, "config differs", &d.config_differences)?;
    write_fields(out, "environment differs", &d.environment_differences)?;
    write_missing_gradients(out, &d.a, &d.b)?;
    if let Some(t) = &d.tolerance {
        writeln!(out, "\ntolerance: {t} (tensors that differ by no more count as agreeing)")?;
    }
    writeln!(out)?;
    if d.hash_only_differences > 0 {
        writeln!(
            out,
            "{} tensor(s) differ where a trace stored only hashes: a tolerance needs values, so they count as \
             divergences (record both runs with `--capture all`)",
            d.hash_only_differences
        )?;
    }
    Ok(())
}

/// The verdict of traces with no value that differs: the caller's `disagreement`, INCOMPLETE,
/// WITHIN TOLERANCE, IDENTICAL, or DIVERGED in structure (with what differs).
fn write_agreement(out: &mut String, d: &TraceDiff, disagreement: Option<&str>, text: &DiffText) -> fmt::Result {
    if let (Some(line), true) = (disagreement, d.agrees_so_far()) {
        return writeln!(out, "{line}");
    }
    match d.verdict() {
        Verdict::Incomplete => {
            let unfinished: Vec<&str> = [("A", &d.a), ("B", &d.b)]
                .into_iter()
                .filter(|(_, side)| !side.complete)
                .map(|(label, _)| label)
                .collect();
            writeln!(
                out,
                "INCOMPLETE  {} steps, {} tensors compared bit-exact, but {} did not finish (see above): later steps \
                 were never compared",
                d.steps_compared,
                d.tensors_compared,
                unfinished.join(" and ")
            )
        }
        Verdict::WithinTolerance => {
            let t = d.tolerance.as_ref().expect("a verdict within a tolerance has one");
            let largest = match &d.largest_within_tolerance {
                Some(l) => format!(
                    "; largest: `{}` at step {}, {}",
                    l.tensor,
                    l.step,
                    divergence_metrics(l, text.missing_values())
                ),
                None => String::new(),
            };
            writeln!(
                out,
                "WITHIN TOLERANCE  {t}: {} steps, {} tensors compared, {} differ within it{largest}",
                d.steps_compared, d.tensors_compared, d.tensors_within_tolerance
            )
        }
        Verdict::Identical => {
            writeln!(out, "IDENTICAL  {} steps, {} tensors compared, bit-exact", d.steps_compared, d.tensors_compared)
        }
        Verdict::Unverified => {
            let mut unseen = Vec::new();
            if d.not_compared > 0 {
                unseen.push(format!(
                    "{} tensor record(s) both runs hold could not be compared (see the warning above)",
                    d.not_compared
                ));
            }
            let once = d.nodes_recorded_once();
            if once > 0 {
                unseen.push(format!(
                    "{once} module output(s) were recorded by one run only (below): the runs watched different modules \
                     (a compiled model runs its modules inside its graph, where their hooks are not called; or the \
                     runs were recorded at other levels), and no value says they differ"));
            }
            writeln!(
                out,
                "UNVERIFIED  {} steps, {} tensors compared bit-exact, but {}: the runs are not shown identical",
                d.steps_compared,
                d.tensors_compared,
                unseen.join("; ")
            )?;
            write_structure(out, &d.structure, text)
        }
        // No value differs (the caller says so), and so the structure does.
        Verdict::Diverged => {
            writeln!(
                out,
                "DIVERGED  in structure: {} steps and {} tensors compared bit-exact, but the traces recorded different things",
                d.steps_compared, d.tensors_compared
            )?;
            write_structure(out, &d.structure, text)
        }
    }
}

/// The first divergence: the verdict line, a graph that changed before it, its metrics, what the
/// settings say of it, its root cause, and how many tensors differ.
fn write_first_divergence(out: &mut String, d: &TraceDiff, first: &Divergence, text: &DiffText) -> fmt::Result {
    match &d.tolerance {
        Some(t) => {
            writeln!(
                out,
                "DIVERGED  beyond {t} first at step {}, tensor `{}` ({})",
                first.step, first.tensor, first.kind
            )?;
            writeln!(
                out,
                "  the runs stay within {t} for {} step(s) before it ({} tensor differences within it)",
                first.step, d.tensors_within_tolerance
            )?;
        }
        None => {
            let in_b = first.tensor_b.as_ref().map_or(String::new(), |b| format!(", `{b}` in B"));
            writeln!(out, "DIVERGED  first at step {}, tensor `{}` ({}{in_b})", first.step, first.tensor, first.kind)?
        }
    }
    // A graph that changed explains a divergence before any value does: say so first.
    let changed: Vec<&str> = d
        .structure
        .iter()
        .filter_map(|s| match s {
            StructuralDifference::GraphChanged { scope, first_step, .. } if *first_step <= first.step => {
                Some(scope.as_str())
            }
            _ => None,
        })
        .collect();
    if let Some(first_changed) = changed.first() {
        let more = match changed.len() {
            1 => String::new(),
            n => format!(" and {} more scope(s), listed under \"structure differs\"", n - 1),
        };
        writeln!(
            out,
            "  the graph changed in scope `{first_changed}`{more}: nodes are paired by dtype and shape at their place \
             in the graph, not by their numbers"
        )?;
    }
    // Without recorded op inputs or a captured graph the analysis says no more than the first
    // difference does.
    let root = d.root_cause.as_ref().filter(|r| r.inputs_recorded || r.rule != CauseRule::FirstDifference);
    // The root-cause block repeats the metrics when the cause is the first divergence.
    if root.is_none_or(|r| r.cause.tensor != first.tensor) {
        writeln!(out, "  {}", layout_and_metrics(first, text.missing_values()))?;
    }
    // A planted fault (REPRO_PERTURB, --perturb) in one run is the cause of what follows it.
    let fault = d.config_differences.iter().find(|f| f.field == "perturb");
    if let Some(f) = fault {
        let (a, b) = f.values();
        writeln!(
            out,
            "  the runs differ in a planted fault (perturb: {a} in A, {b} in B): a divergence from its step on is \
             the fault's"
        )?;
    }
    if let Some(root) = root {
        if root.rule == CauseRule::Leaf && !d.config_differences.is_empty() && fault.is_none() {
            let settings: Vec<String> = d
                .config_differences
                .iter()
                .map(|f| {
                    let (a, b) = f.values();
                    format!("{} {a} vs {b}", f.field)
                })
                .collect();
            writeln!(out, "  the runs were recorded with other settings, which explains it: {}", settings.join(", "))?;
        } else if root.rule == CauseRule::Leaf
            && root.cause.kind == TensorKind::Weight
            && root.cause.step == 0
            && root.nodes_are_modules
        {
            // Same settings, other starting parameters: most often an unseeded initialisation.
            writeln!(
                out,
                "  the runs start from other parameters with the same settings: is the initialisation seeded? \
                 seed PyTorch's generator (torch.manual_seed) before the model is built, or load the same weights"
            )?;
        } else if root.rule == CauseRule::Leaf && root.cause.kind == TensorKind::Weight && root.cause.step == 0 {
            writeln!(
                out,
                "  the runs start from other parameters with the same settings: is the initialisation seeded? \
                 candle's random initialisation (candle-nn's VarBuilder, Tensor::rand) on the CPU cannot be seeded: \
                 draw the initial values from a seeded stream (repro::workloads::seeded) and set them"
            )?;
        }
        writeln!(out)?;
        write_root_cause_with(out, root, text.missing_values())?;
    }
    if let Some(e) = &d.escalate {
        let recorded = if e.modules_recorded {
            "every module's output but not every op's"
        } else {
            "neither every module's output nor every op's"
        };
        writeln!(
            out,
            "\nstep {} was recorded with {recorded}: `repro bisect -- CMD` (your program) records both runs again \
             down to the op at the step where they first diverge, and names the first op that differs",
            e.step
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "{} of {} tensors differ over {} common steps",
        d.tensors_diverged, d.tensors_compared, d.steps_compared
    )
}

/// The tables of a diverged comparison: the first divergent step by kind, every tensor, the
/// error's growth, and what differs in structure.
fn write_tables(out: &mut String, d: &TraceDiff, text: &DiffText) -> fmt::Result {
    if !d.first_divergence_by_kind.is_empty() {
        writeln!(out, "\nfirst divergent step by kind:")?;
        let mut kinds: Vec<_> = d.first_divergence_by_kind.iter().collect();
        kinds.sort_by_key(|(_, step)| **step);
        for (kind, step) in kinds {
            writeln!(out, "  {:<12} step {step}", kind.name())?;
        }
    }
    writeln!(out, "\nper tensor:")?;
    let width = column_width(d.tensors.iter().map(|t| t.name.len()), 6);
    writeln!(out, "  {:<width$}  {:<10}  {:>11}  {:>9}", "tensor", "kind", "first step", "diverged")?;
    text.table(out, d.tensors.iter().filter(|t| text.shows(&t.name, t.kind)), |out, t| {
        let first = t.first_divergent_step.map_or("-".to_string(), |s| s.to_string());
        writeln!(
            out,
            "  {:<width$}  {:<10}  {:>11}  {:>9}",
            t.name,
            t.kind.name(),
            first,
            format!("{}/{}", t.steps_diverged, t.steps_compared)
        )
    })?;
    // Op outputs and inputs would swamp the table; `--json` has their growth too.
    let growth: Vec<_> = d
        .tensors
        .iter()
        .filter(|t| !matches!(t.kind, TensorKind::OpOutput | TensorKind::Input) && text.shows(&t.name, t.kind))
        .flat_map(|t| t.growth.iter().map(move |g| (t, g)))
        .collect();
    if !growth.is_empty() {
        writeln!(out, "\nerror growth (steps with stored values; op outputs in --json):")?;
        writeln!(
            out,
            "  {:<width$}  {:>8}  {:>17}  {:>10}  {:>10}  {:>10}",
            "tensor", "step", "elements differ", "max|a-b|", "sum|a-b|", "max ULP"
        )?;
        text.table(out, growth, |out, (t, g)| {
            let m = &g.metrics;
            writeln!(
                out,
                "  {:<width$}  {:>8}  {:>17}  {:>10}  {:>10}  {:>10}",
                t.name,
                g.step,
                format!("{}/{}", m.mismatched, m.elements),
                sci(m.max_abs),
                sci(m.sum_abs),
                m.max_ulp
            )
        })?;
    }
    if !d.structure.is_empty() {
        writeln!(out, "\nstructure differs:")?;
        write_structure(out, &d.structure, text)?;
    }
    Ok(())
}

fn describe(d: &Divergence) -> String {
    let phase = d.phase.map_or(String::new(), |p| format!(", {p}"));
    let in_b = d.tensor_b.as_ref().map_or(String::new(), |b| format!(", `{b}` in B"));
    format!("`{}` ({}{phase}{in_b})", d.tensor, d.kind)
}

/// `F32 [4]: 1 of 4 elements differ, ...`, or `F32 [100, 10] in A, F32 [200, 10] in B`.
fn layout_and_metrics(d: &Divergence, missing: &str) -> String {
    match &d.b_layout {
        Some((dtype, shape_b)) => format!("{} {} in A, {dtype} {} in B", d.dtype, shape(&d.shape), shape(shape_b)),
        None => format!("{} {}: {}", d.dtype, shape(&d.shape), divergence_metrics(d, missing)),
    }
}

/// What a divergence without stored values says by default: how to get them.
const RECORD_VALUES: &str = "hashes differ; values not stored at this step (re-record both runs with `--capture \
                             steps:N` at this step, or let `repro bisect` do it, for exact metrics)";

fn divergence_metrics(d: &Divergence, missing: &str) -> String {
    if let Some((dtype, shape_b)) = &d.b_layout {
        return format!("{dtype} {} in B", shape(shape_b));
    }
    match &d.metrics {
        Some(m) => metrics_sentence(m),
        None => missing.replace("steps:N", &format!("steps:{}", d.step)),
    }
}

/// The root-cause block: the cause, divergences of their own, and what follows from them.
pub fn write_root_cause(out: &mut String, r: &RootCause) -> fmt::Result {
    write_root_cause_with(out, r, RECORD_VALUES)
}

/// The root-cause block, saying `missing` of a divergence whose values were not stored.
pub(crate) fn write_root_cause_with(out: &mut String, r: &RootCause, missing: &str) -> fmt::Result {
    let source = match r.cause.source.as_deref() {
        Some(s) if r.cause.source_opens_scope => format!(", in the scope opened at {s}"),
        Some(s) => format!(", recorded at {s}"),
        None => String::new(),
    };
    writeln!(out, "root cause: {} at step {}{source}", describe(&r.cause), r.cause.step)?;
    let drift = || {
        let from = r.drift_from.as_deref().map_or(String::new(), |n| format!(", first at `{n}` in this step"));
        let since =
            r.drift_since.map_or(String::new(), |s| format!("; the runs have differed within it since step {s}"));
        format!("{from}{since}")
    };
    let drift_why;
    let random_op_why;
    let why = match r.rule {
        CauseRule::Drift if r.cause.phase == Some(Phase::Update) => {
            let by: Vec<String> = r.upstream.iter().map(|u| format!("`{}` by {}", u.tensor, sci(u.max_abs))).collect();
            let from = match by.is_empty() {
                true => String::new(),
                false => format!(" ({})", by.join(", ")),
            };
            let into = r.cause.metrics.map_or(String::new(), |m| format!(" into {}", sci(m.max_abs)));
            drift_why = format!(
                "its inputs, the parameter and its gradient, differ only within the tolerance{from}{}: the \
                 optimizer's update amplified their difference{into} (drift, not a new cause; Adam-style \
                 optimizers divide by the gradient's running scale, so a tiny gradient's noise can move a weight \
                 by up to the learning rate)",
                drift()
            );
            drift_why.as_str()
        }
        CauseRule::Drift => {
            let by = r.upstream_max_abs().map_or(String::new(), |e| format!(" (by at most {})", sci(e)));
            drift_why = format!(
                "what it is computed from differs only within the tolerance{by}{}: the difference grew past the \
                 tolerance here (drift, not a new cause)",
                drift()
            );
            drift_why.as_str()
        }
        CauseRule::BeyondDrift => {
            let upstream = r.upstream_max_abs().map_or("within it".to_string(), |e| format!("by at most {}", sci(e)));
            let own = r.cause.metrics.map_or(String::new(), |m| format!(" by {}", sci(m.max_abs)));
            drift_why = format!(
                "what it is computed from differs only within the tolerance ({upstream}{}), and it differs{own}, \
                 over {amplification:.0} times more than that explains: a new cause (a wrong constant, a missing \
                 term, a transposed weight), not drift",
                drift(),
                amplification = repro_diff::AMPLIFICATION
            );
            drift_why.as_str()
        }
        CauseRule::DriftedLeaves => {
            drift_why = format!(
                "the leaves of the graph (data, parameters) are not identical but within the tolerance{}; this is \
                 the first node whose difference grew past it (drift, not a new cause)",
                drift()
            );
            drift_why.as_str()
        }
        _ if r.random_op.is_some() => {
            random_op_why = format!(
                "this op, `{}`, draws random numbers, and what it is computed from is identical in both runs as far \
                 as the trace records it: the generator it drew from was in another state. Seed it \
                 (torch.manual_seed, or a torch.Generator of your own seeded the same in both runs)",
                r.random_op.as_deref().unwrap_or_default()
            );
            random_op_why.as_str()
        }
        _ if r.random_mask => {
            "what it is computed from is identical in both runs as far as the trace records it, and every element \
             that differs is zero in exactly one run: the shape of a random mask (dropout) drawn differently, not \
             of an op that rounds differently. The mask is not in the trace; seed it (torch.manual_seed; in candle, \
             draw it from a seeded stream: README, \"What any reproducible run needs\") or record it as an input"
        }
        CauseRule::RecordedInputs => {
            "its recorded inputs are identical in both runs and its output is not: the op computed it differently, \
             or it also reads something not recorded as its input (a random draw such as a dropout mask)"
        }
        CauseRule::IdenticalLeaves if r.forward_unwatched => {
            "every recorded leaf (data, parameters, buffers, generators' states) is identical in both runs, and this \
             is the first value after them that differs: what computed it from them (the model's forward pass, the \
             loss function) computed it differently, or read something the trace does not record (a random draw \
             such as a dropout mask); the module and op outputs recorded at this step, if any, say where"
        }
        CauseRule::IdenticalLeaves if r.nodes_are_modules => {
            "every recorded leaf (data, parameters) and every module output recorded before it are identical in \
             both runs, and this is the first module output that differs. The module computed it differently, or \
             what it was fed did differ: code between recorded modules runs unseen (its parent's own forward, \
             functional calls such as F.dropout, which draws a random mask, or an in-place op), so an identical \
             output before it does not make this module's input identical"
        }
        CauseRule::IdenticalLeaves => {
            "every recorded leaf of the graph (data, parameters) is identical in both runs, and this is the first \
             node, in topological order, that differs: its op computed it differently, or it reads a tensor the \
             trace does not record (a random draw such as a dropout mask, a tensor made outside the graph)"
        }
        CauseRule::Leaf => {
            "it is state the step starts from (its data, a parameter, a buffer, or a random generator's state): \
             the runs started this step from different values"
        }
        CauseRule::Backward => {
            "the data, the parameters and every node of the forward graph (the loss included) are identical in \
             both runs: the backward pass computed this gradient differently"
        }
        CauseRule::Collective => {
            "the data, the parameters, the forward graph and this rank's share of the sum are identical in both \
             runs, and the sum across the ranks is not: the collective added the shares in another order"
        }
        CauseRule::FirstDifference => {
            "the first difference in the step (its inputs were not recorded or not comparable)"
        }
    };
    writeln!(out, "  {why}:")?;
    writeln!(out, "  {}", layout_and_metrics(&r.cause, missing))?;
    if !r.independent.is_empty() && r.rule == CauseRule::Collective {
        writeln!(out, "other sums the collective added in another order:")?;
        for d in &r.independent {
            writeln!(out, "  {}: {}", describe(d), divergence_metrics(d, missing))?;
        }
    } else if !r.independent.is_empty() && r.rule == CauseRule::Backward {
        writeln!(out, "other gradients the backward pass computed differently:")?;
        for d in &r.independent {
            writeln!(out, "  {}: {}", describe(d), divergence_metrics(d, missing))?;
        }
    } else if !r.independent.is_empty() {
        writeln!(out, "also diverging with identical inputs (separate causes):")?;
        for d in &r.independent {
            writeln!(out, "  {}: {}", describe(d), divergence_metrics(d, missing))?;
        }
    }
    if !r.consequences.is_empty() {
        let traced = r.inputs_recorded || r.rule == CauseRule::RecordedInputs;
        if traced {
            writeln!(out, "consequences in the same step:")?;
        } else {
            // A captured graph has no edges: later differences cannot be traced to a cause.
            writeln!(out, "later differences in the same step (downstream of it, or of separate causes):")?;
        }
        for c in r.consequences.iter().take(SHOWN_CONSEQUENCES) {
            let phase = c.phase.map_or(String::new(), |p| format!(", {p}"));
            let from = match (traced, c.from.is_empty()) {
                (false, _) => String::new(),
                (true, true) => ": no recorded path".to_string(),
                (true, false) => format!(": from {}{}", c.from.join(", "), if c.more_roots { " and more" } else { "" }),
            };
            writeln!(out, "  `{}` ({}{phase}){from}", c.tensor, c.kind)?;
        }
        if let Some(more) = r.consequences.len().checked_sub(SHOWN_CONSEQUENCES).filter(|&n| n > 0) {
            writeln!(out, "  ... and {more} more (all of them with --json)")?;
        }
    }
    Ok(())
}

/// The last line of a report without its tables: how to see them.
const FULL_REPORT: &str = "every tensor's first divergence and the error's growth over the steps: `repro diff --full` \
                           (or --json)";

/// Consequences listed in text reports; a large model has hundreds, all in the JSON report.
const SHOWN_CONSEQUENCES: usize = 12;

/// One sentence summarizing tensor metrics.
pub fn metrics_sentence(m: &TensorMetrics) -> String {
    // Near zero, floats are dense: a value that should be 0 can be a billion ULPs from a tiny
    // one. Where that is what makes max ULP large, say how far apart the values are at their
    // own scale.
    let at_scale = match m.ulps_at_scale() {
        Some(s) if m.max_ulp as f64 > 16.0 * s.max(1.0) => {
            format!(" (near zero, where floats are dense; at the scale of the values that differ, {} ULP)", sci(s))
        }
        _ => String::new(),
    };
    format!(
        "{} of {} elements differ, max |a-b| {}, sum |a-b| {}, max {} ULP{at_scale}{}",
        m.mismatched,
        m.elements,
        sci(m.max_abs),
        sci(m.sum_abs),
        m.max_ulp,
        m.first_mismatch.map_or(String::new(), |i| format!(" (first at element {i})"))
    )
}

fn write_side(out: &mut String, label: &str, s: &TraceSide) -> fmt::Result {
    let status = match &s.incomplete_reason {
        None => "complete".to_string(),
        Some(why) => format!("INCOMPLETE: {why}"),
    };
    writeln!(out, "{label}  {}  ({}, {} steps, {status})", s.path, s.workload, s.steps)
}

fn write_fields(out: &mut String, title: &str, fields: &[FieldDifference]) -> fmt::Result {
    if fields.is_empty() {
        return Ok(());
    }
    writeln!(out, "\n{title}:")?;
    for f in fields {
        let (a, b) = f.values();
        writeln!(out, "  {}: {a} | {b}", f.field)?;
    }
    Ok(())
}

/// Trainable parameters that backpropagation never reached: a silent bug worth the top of the
/// report (an op without a backward pass, or a parameter the loss does not use).
fn write_missing_gradients(out: &mut String, a: &TraceSide, b: &TraceSide) -> fmt::Result {
    const WHAT: &str = "trainable parameters that received no gradient";
    let names = |s: &TraceSide| s.no_gradient.iter().map(|m| m.name.clone()).collect::<Vec<_>>();
    if a.no_gradient.is_empty() && b.no_gradient.is_empty() {
        return Ok(());
    }
    writeln!(out)?;
    if names(a) == names(b) {
        writeln!(out, "{WHAT}, in both runs: {}", missing_gradients(&a.no_gradient))?;
    } else {
        for (label, side) in [("A", a), ("B", b)] {
            if !side.no_gradient.is_empty() {
                writeln!(out, "{WHAT} in {label}: {}", missing_gradients(&side.no_gradient))?;
            }
        }
    }
    Ok(())
}

/// `the graph changed in scope `h[0]/ln_1` (15 node(s) only in A), ...`, for a `GraphChanged`
/// difference.
fn graph_changed(item: &StructuralDifference) -> String {
    let StructuralDifference::GraphChanged { scope, first_step, steps, only_in_a, only_in_b } = item else {
        return String::new();
    };
    let count = |n: &u64, side: &str| match n {
        0 => None,
        n => Some(format!("{n} node(s) only in {side}")),
    };
    let counts: Vec<String> = [count(only_in_a, "A"), count(only_in_b, "B")].into_iter().flatten().collect();
    let counts = if counts.is_empty() { "its nodes are numbered differently".to_string() } else { counts.join(", ") };
    format!("the graph changed in scope `{scope}` ({counts}), at {steps} step(s) from step {first_step}")
}

fn write_structure(out: &mut String, items: &[StructuralDifference], text: &DiffText) -> fmt::Result {
    // Without the tables, the list is cut at ten lines unless --rows says otherwise.
    let text = DiffText { rows: text.rows.or((!text.tables).then_some(10)), ..text.clone() };
    text.table(out, items, |out, item| writeln!(out, "  {}", structure_line(item)))
}

/// One structural difference, in a line.
pub fn structure_line(item: &StructuralDifference) -> String {
    match item {
        StructuralDifference::MissingSteps { missing_in, first_step, steps } => {
            let (has, lacks) = if missing_in == "a" { ("B", "A") } else { ("A", "B") };
            format!("{steps} step(s) from step {first_step} recorded only in {has} ({lacks} lacks them)")
        }
        StructuralDifference::Renamed { a, b, first_step, steps } => {
            format!("`{a}` in A is `{b}` in B (same place, dtype and shape), at {steps} step(s) from step {first_step}")
        }
        StructuralDifference::ScopeRenamed { a, b, nodes, first_step, steps } => format!(
            "scope `{a}` in A is `{b}` in B: {nodes} captured node(s) at the same places, dtypes and shapes, at \
             {steps} step(s) from step {first_step} (a map line `rename {b}#* {a}#*` pairs them by name)"
        ),
        StructuralDifference::MissingTensor { tensor, missing_in, first_step, steps } => {
            let has = if missing_in == "a" { "B" } else { "A" };
            format!("`{tensor}` recorded only in {has}, at {steps} step(s) from step {first_step}")
        }
        StructuralDifference::Mismatch { tensor, first_step, steps, a, b } => {
            format!("`{tensor}` is {a} in A but {b} in B, at {steps} step(s) from step {first_step}")
        }
        StructuralDifference::GraphChanged { .. } => graph_changed(item),
        StructuralDifference::NotRecorded { scope, recorded_in, nodes, first_step, steps } => {
            let has = if recorded_in == "a" { "A" } else { "B" };
            format!(
                "`{scope}`: {nodes} module output(s) recorded only in {has}, not compared, at {steps} step(s) from step \
                 {first_step}"
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A diff of two complete traces that agree on `tensors` tensors over 3 steps.
    fn agreeing(tensors: u64) -> TraceDiff {
        let side = |path: &str| TraceSide {
            path: path.into(),
            workload: "adder".into(),
            steps: 3,
            complete: true,
            incomplete_reason: None,
            no_gradient: Vec::new(),
        };
        TraceDiff {
            a: side("runs/a"),
            b: side("runs/b"),
            config_differences: Vec::new(),
            environment_differences: Vec::new(),
            steps_compared: 3,
            tensors_compared: tensors,
            tensors_diverged: 0,
            first_divergence: None,
            root_cause: None,
            tensors: Vec::new(),
            first_divergence_by_kind: Default::default(),
            structure: Vec::new(),
            warnings: Vec::new(),
            tolerance: None,
            tensors_within_tolerance: 0,
            largest_within_tolerance: None,
            hash_only_differences: 0,
            not_compared: 0,
            gaps: Vec::new(),
            escalate: None,
        }
    }

    fn agreement(d: &TraceDiff, disagreement: Option<&str>) -> String {
        let mut out = String::new();
        write_agreement(&mut out, d, disagreement, &DiffText::default()).unwrap();
        out
    }

    #[test]
    fn traces_that_agree_get_one_verdict_line_saying_how_sure_it_is() {
        let d = agreeing(12);
        assert_eq!(agreement(&d, None), "IDENTICAL  3 steps, 12 tensors compared, bit-exact\n");
        let left_out = TraceDiff { not_compared: 2, ..agreeing(12) };
        let text = agreement(&left_out, None);
        assert!(
            text.starts_with("UNVERIFIED  3 steps, 12 tensors compared bit-exact, but 2 tensor record(s)"),
            "{text}"
        );
        assert_eq!(left_out.verdict(), Verdict::Unverified);
        // A trace that did not finish is never IDENTICAL, and the caller's line wins over both.
        let mut cut = agreeing(12);
        cut.b.complete = false;
        assert!(agreement(&cut, None)
            .starts_with("INCOMPLETE  3 steps, 12 tensors compared bit-exact, but B did not finish"));
        assert_eq!(agreement(&cut, Some("INCOMPLETE  rank 1")), "INCOMPLETE  rank 1\n");
        let within =
            TraceDiff { tolerance: Some("ulp:2".parse().unwrap()), tensors_within_tolerance: 4, ..agreeing(12) };
        assert!(agreement(&within, None).starts_with("WITHIN TOLERANCE  ulp:2: 3 steps, 12 tensors compared, 4 differ"));
        // Structure that differs is a divergence, whatever the values say, and is listed.
        let missing = StructuralDifference::MissingTensor {
            tensor: "w.grad".into(),
            missing_in: "b".into(),
            first_step: 1,
            steps: 2,
        };
        let structure = TraceDiff { structure: vec![missing], ..agreeing(12) };
        let text = agreement(&structure, Some("never shown"));
        assert!(text.starts_with("DIVERGED  in structure") && text.contains("`w.grad` recorded only in A"), "{text}");
    }

    #[test]
    fn the_preamble_names_both_traces_and_what_keeps_the_verdict_from_being_sure() {
        let d =
            TraceDiff { warnings: vec!["A and B are the same trace".into()], hash_only_differences: 1, ..agreeing(3) };
        let mut out = String::new();
        write_preamble(&mut out, &d).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("A  runs/a") && lines[1].starts_with("B  runs/b"), "{out}");
        assert_eq!(lines[2], "warning: A and B are the same trace");
        assert!(out.contains("1 tensor(s) differ where a trace stored only hashes"), "{out}");
    }

    #[test]
    fn the_scale_s_ulps_are_shown_only_where_zero_inflates_max_ulp() {
        let f = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let near_zero = repro_diff::compare(repro_trace::dtype::DType::F32, &f(&[1.0, 0.0]), &f(&[1.0, 5.8e-11]));
        assert!(
            metrics_sentence(&near_zero).contains("at the scale of the values that differ"),
            "{}",
            metrics_sentence(&near_zero)
        );
        let plain = repro_diff::compare(
            repro_trace::dtype::DType::F32,
            &f(&[3.0]),
            &f(&[f32::from_bits(3.0f32.to_bits() + 2)]),
        );
        assert!(!metrics_sentence(&plain).contains("scale"), "{}", metrics_sentence(&plain));
    }
}
