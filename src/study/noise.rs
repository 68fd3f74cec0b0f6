//! `repro study noise`: how much of the run-to-run variation comes from algorithmic randomness
//! (seeds) and how much from the implementation (reduction order), in four variants of N runs:
//!
//! | variant     | seeds              | reductions |
//! |-------------|--------------------|------------|
//! | `control`   | fixed              | ordered    |
//! | `algo`      | run i uses seed+i  | ordered    |
//! | `impl`      | fixed              | atomic     |
//! | `algo+impl` | run i uses seed+i  | atomic     |
//!
//! On a dataset with protected attributes (`subgroups`), each variant also reports the spread of
//! the error, false-positive and false-negative rates within every sub-group, against the whole.

use super::error::StudyError;
use super::results::{NoiseReport, VariantReport};
use super::stats::variant_stats;
use super::store::{StudyDir, StudyOut};
use super::subgroups::{subgroup_spreads, VariantSubgroups};
use super::subject::{Subject, Variation};
use super::Progress;
use crate::ops::Reductions;
use crate::workloads::Seeds;
use candle_core::Device;

/// The four variants, in report order.
pub const VARIANTS: [Variant; 4] = [Variant::Control, Variant::Algo, Variant::Impl, Variant::AlgoImpl];

/// A combination of noise sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// Fixed seeds, ordered reductions: every run should be bit-identical.
    Control,
    /// Seeds vary, ordered reductions.
    Algo,
    /// Fixed seeds, atomic reductions.
    Impl,
    /// Seeds vary, atomic reductions.
    AlgoImpl,
}

impl Variant {
    /// The variant's name in reports and file names.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Control => "control",
            Variant::Algo => "algo",
            Variant::Impl => "impl",
            Variant::AlgoImpl => "algo+impl",
        }
    }

    /// The seeds of run `run` given the study's base seed.
    pub fn seeds(self, base: u64, run: usize) -> Seeds {
        match self {
            Variant::Control | Variant::Impl => Seeds::all(base),
            Variant::Algo | Variant::AlgoImpl => Seeds::all(base + run as u64),
        }
    }

    /// The variant's reductions.
    pub fn reductions(self) -> Reductions {
        match self {
            Variant::Control | Variant::Algo => Reductions::Ordered,
            Variant::Impl | Variant::AlgoImpl => Reductions::Atomic,
        }
    }
}

/// Runs (or resumes) the noise study: `runs` runs of `subject` per variant, kept in the study
/// directory `out` (see `StudyDir`), which is returned with the report.
pub fn run_noise(
    subject: &Subject,
    runs: usize,
    device: &Device,
    device_label: &str,
    out: &StudyOut,
    progress: &mut dyn Progress,
) -> Result<(NoiseReport, StudyDir), StudyError> {
    if runs < 2 {
        return Err(StudyError::Invalid("a noise study needs --runs 2 or more".into()));
    }
    let settings = serde_json::json!({
        "run": subject.run_config().params,
        "workload": subject.workload_name(),
        "runs": runs,
        "device": device_label,
        "variants": VARIANTS.iter().map(|v| v.name()).collect::<Vec<_>>(),
    });
    let dir = StudyDir::open(&out.dir, "noise", &settings, out.restart)?;
    let total = runs * VARIANTS.len();
    let mut variants = Vec::new();
    let mut subgroups = Vec::new();
    let protected = subject.subgroups();
    let mut test_examples = 0;
    for (v, variant) in VARIANTS.into_iter().enumerate() {
        let mut results = Vec::with_capacity(runs);
        for run in 0..runs {
            let done = v * runs + run;
            if let Some(saved) = dir.load_run(variant.name(), run)? {
                results.push(saved);
                continue;
            }
            progress.update(done, total, &format!("{} run {}", variant.name(), run + 1));
            let variation = Variation {
                seeds: Some(variant.seeds(subject.base_seed(), run)),
                reductions: Some(variant.reductions()),
                ..Variation::default()
            };
            results.push(subject.train_and_save(variation, device, &dir, variant.name(), run)?);
        }
        test_examples = results.first().map_or(0, |r| r.predictions.len());
        let stats = variant_stats(&results, |i| dir.load_weights(variant.name(), i))?;
        if let Some((labels, groups)) = &protected {
            let groups = subgroup_spreads(&results, labels, 1, groups);
            subgroups.push(VariantSubgroups { variant: variant.name().to_string(), groups });
        }
        variants.push(VariantReport {
            variant: variant.name().to_string(),
            reductions: variant.reductions().to_string(),
            seeds_vary: matches!(variant, Variant::Algo | Variant::AlgoImpl),
            run_accuracies: results.iter().map(|r| r.accuracy).collect(),
            stats,
        });
    }
    progress.update(total, total, "done");
    let stdev = |name: &str| variants.iter().find(|v| v.variant == name).map(|v| v.stats.accuracy_stdev);
    let impl_share = match (stdev("impl"), stdev("algo+impl")) {
        (Some(i), Some(t)) if t > 0.0 => Some(i / t),
        _ => None,
    };
    let report = NoiseReport {
        subject: subject.describe(),
        device: device_label.to_string(),
        runs,
        test_examples,
        variants,
        impl_share_of_accuracy_stdev: impl_share,
        subgroups,
    };
    Ok((report, dir))
}
