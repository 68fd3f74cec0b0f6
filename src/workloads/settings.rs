//! Reading a built-in workload back from the settings its trace header holds (`RunConfig`):
//! what a rank process trains, what `repro gate --baseline` runs, what a child of
//! `repro overhead` times. The inverse of each config's `run_config`, and the one way settings
//! travel between processes (no round trip through command-line options).
//!
//! A header is input: every setting must be the workload's own and parse as its type, or the
//! error names it; a setting absent takes the workload's default (headers written before the
//! setting existed leave it out).

use super::{AdderConfig, ClassifierConfig, DecoderConfig, Family, GptConfig, Workload, WorkloadError, WorkloadKind};
use crate::record::Perturbation;
use crate::trace::RunConfig;
use std::collections::BTreeMap;
use std::fmt::Display;
use std::str::FromStr;

/// A built-in workload with the fault planted in it, if any: everything a recording of it
/// needs besides the device and the capture policy.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadRun {
    /// What trains.
    pub workload: Workload,
    /// The fault planted (`--perturb`), recorded in the header as the `perturb` setting.
    pub perturbation: Option<Perturbation>,
}

impl WorkloadRun {
    /// Reads the workload a trace header describes (see the module's documentation), checked
    /// as the command line's settings are.
    pub fn from_run_config(run: &RunConfig) -> Result<WorkloadRun, WorkloadError> {
        let kind: WorkloadKind =
            run.workload.parse().map_err(|_| WorkloadError::UnknownWorkload(run.workload.clone()))?;
        let mut settings = Settings { workload: kind, params: run.params.clone() };
        let perturbation = settings.take::<Perturbation>("perturb")?;
        let workload = match kind {
            WorkloadKind::Adder => Workload::Adder(AdderConfig::from_settings(&mut settings, run.steps)?),
            WorkloadKind::Gpt => Workload::Gpt(GptConfig::from_settings(&mut settings, run.steps)?),
            WorkloadKind::Qwen2 => {
                Workload::Decoder(DecoderConfig::from_settings(&mut settings, run.steps, Family::Qwen2)?)
            }
            WorkloadKind::Gemma => {
                Workload::Decoder(DecoderConfig::from_settings(&mut settings, run.steps, Family::Gemma)?)
            }
            WorkloadKind::Mlp | WorkloadKind::Cnn | WorkloadKind::ResNet18 => {
                let model = kind.classifier_model().expect("a classifier workload");
                Workload::Classifier(ClassifierConfig::from_settings(&mut settings, run.steps, model)?)
            }
        };
        settings.finish()?;
        let checked = WorkloadRun { workload, perturbation };
        checked.validate()?;
        Ok(checked)
    }

    /// Checks the settings and the perturbation before anything is recorded.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        self.workload.validate(self.perturbation.as_ref())
    }

    /// The header of a recording of this run: the workload's settings and the planted fault.
    pub fn run_config(&self) -> RunConfig {
        let mut run = self.workload.run_config();
        if let Some(p) = &self.perturbation {
            run.params.insert("perturb".into(), p.to_string());
        }
        run
    }
}

/// A header's settings, each taken once by its workload (each config's `from_settings`); what
/// is left over is refused.
pub struct Settings {
    workload: WorkloadKind,
    params: BTreeMap<String, String>,
}

impl Settings {
    /// The setting `key` parsed, if the header has it.
    pub fn take<T: FromStr>(&mut self, key: &str) -> Result<Option<T>, WorkloadError>
    where
        T::Err: Display,
    {
        let Some(value) = self.params.remove(key) else { return Ok(None) };
        value.parse().map(Some).map_err(|e: T::Err| WorkloadError::BadSetting {
            workload: self.workload.to_string(),
            key: key.to_string(),
            value,
            reason: e.to_string(),
        })
    }

    /// The setting `key`, or `default` when the header has none.
    pub fn take_or<T: FromStr>(&mut self, key: &str, default: T) -> Result<T, WorkloadError>
    where
        T::Err: Display,
    {
        Ok(self.take(key)?.unwrap_or(default))
    }

    /// The setting `key`, which must be one of `values` (written as `(text, value)`).
    pub fn take_one_of<T: Copy>(&mut self, key: &str, values: &[(&str, T)], default: T) -> Result<T, WorkloadError> {
        let Some(text) = self.take::<String>(key)? else { return Ok(default) };
        values.iter().find(|(name, _)| *name == text).map(|&(_, v)| v).ok_or_else(|| {
            let names: Vec<&str> = values.iter().map(|(name, _)| *name).collect();
            WorkloadError::BadSetting {
                workload: self.workload.to_string(),
                key: key.to_string(),
                value: text,
                reason: format!("expected {}", names.join(" or ")),
            }
        })
    }

    /// Refuses any setting no workload code took.
    fn finish(self) -> Result<(), WorkloadError> {
        match self.params.into_iter().next() {
            Some((key, value)) => {
                Err(WorkloadError::UnknownSetting { workload: self.workload.to_string(), key, value })
            }
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::Reductions;
    use crate::workloads::gpt::model::Norm;
    use crate::workloads::{DatasetName, DecoderShape, Formulation, ModelKind, Seeds};
    use candle_core::DType;

    fn every_workload() -> Vec<WorkloadRun> {
        let run = |workload, perturbation: Option<&str>| WorkloadRun {
            workload,
            perturbation: perturbation.map(|p| p.parse().unwrap()),
        };
        vec![
            run(Workload::Adder(AdderConfig::default()), None),
            run(
                Workload::Adder(AdderConfig {
                    seed: 3,
                    data_seed: 9,
                    steps: 7,
                    batch: 200,
                    features: 5,
                    lr: 0.25,
                    formulation: Formulation::Matmul,
                    reductions: Reductions::Candle,
                }),
                Some("2:loss.sum:3@1"),
            ),
            run(Workload::Gpt(GptConfig::default()), None),
            run(
                Workload::Gpt(GptConfig {
                    seed: 5,
                    steps: 3,
                    width: 64,
                    heads: 2,
                    norm: Norm::Fused,
                    reductions: Reductions::Ordered,
                    batch_invariant: true,
                    ..GptConfig::default()
                }),
                Some("1:wpe.weight:1"),
            ),
            run(Workload::Decoder(DecoderConfig::default()), None),
            run(
                Workload::Decoder(DecoderConfig {
                    family: Family::Qwen2,
                    shape: DecoderShape::Qwen2_0_5B,
                    dtype: DType::BF16,
                    layers: 1,
                    tokens: 16,
                    ..DecoderConfig::default()
                }),
                None,
            ),
            run(Workload::Decoder(DecoderConfig { family: Family::Gemma, ..DecoderConfig::default() }), None),
            run(Workload::Classifier(ClassifierConfig::defaults(ModelKind::Mlp)), None),
            run(
                Workload::Classifier(ClassifierConfig {
                    dataset: DatasetName::Gauss5d,
                    examples: Some(64),
                    max_steps: Some(3),
                    seeds: Seeds { init: 1, order: 2, augment: 3, dropout: 4 },
                    dropout: 0.5,
                    ..ClassifierConfig::defaults(ModelKind::Mlp)
                }),
                None,
            ),
            run(Workload::Classifier(ClassifierConfig::defaults(ModelKind::Cnn)), None),
            run(Workload::Classifier(ClassifierConfig::defaults(ModelKind::ResNet18)), None),
        ]
    }

    #[test]
    fn every_workload_reads_back_from_its_header_as_the_same_run() {
        for run in every_workload() {
            let header = run.run_config();
            let read = WorkloadRun::from_run_config(&header).unwrap_or_else(|e| panic!("{header:?}: {e}"));
            // The header is what a recording trains from: it must come back unchanged.
            assert_eq!(read.run_config(), header);
            assert_eq!(read.perturbation, run.perturbation);
            if !matches!(run.workload, Workload::Classifier(_)) {
                assert_eq!(read.workload, run.workload);
            }
        }
    }

    #[test]
    fn a_header_that_is_not_a_built_in_workloads_is_refused_naming_the_setting() {
        let mut header = WorkloadRun { workload: Workload::Gpt(GptConfig::default()), perturbation: None }.run_config();
        header.params.insert("help".into(), "true".into());
        let e = WorkloadRun::from_run_config(&header).unwrap_err().to_string();
        assert!(e.contains("setting `help` = `true` is not a setting of gpt"), "{e}");

        header.params.remove("help");
        header.params.insert("width".into(), "wide".into());
        let e = WorkloadRun::from_run_config(&header).unwrap_err().to_string();
        assert!(e.contains("setting `width` = `wide` of gpt is not valid"), "{e}");

        header.params.insert("width".into(), "130".into());
        let e = WorkloadRun::from_run_config(&header).unwrap_err().to_string();
        assert!(e.contains("must be a positive multiple of --heads"), "{e}");

        header.params.insert("norm".into(), "rms".into());
        let e = WorkloadRun::from_run_config(&header).unwrap_err().to_string();
        assert!(e.contains("expected ops or fused"), "{e}");

        let other = RunConfig { workload: "bert".into(), steps: None, params: BTreeMap::new() };
        let e = WorkloadRun::from_run_config(&other).unwrap_err().to_string();
        assert!(e.contains("`bert` is not a built-in workload"), "{e}");
    }
}
