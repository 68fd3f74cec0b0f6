//! Built-in training workloads. Each trains with candle and records itself through the same
//! `Recorder` API that users' own training loops use.

mod adder;
mod capabilities;
pub mod classifier;
pub mod decoder;
mod error;
pub mod gpt;
pub mod host_memory;
mod kind;
mod outcome;
pub mod seeded;
mod settings;
mod training;

pub use adder::{AdderConfig, Formulation};
pub use capabilities::{ForwardModel, StudyModel};
pub use classifier::{ClassifierConfig, Dataset, DatasetName, ModelKind};
pub use decoder::{DecoderConfig, DecoderShape, Family};
pub use error::WorkloadError;
pub use gpt::GptConfig;
pub use kind::WorkloadKind;
pub use outcome::{ModelState, Seeds, TrainOutcome};
pub use settings::{to_params, WorkloadRun};
pub use training::Training;

use crate::ops::Reductions;
use crate::record::{Perturbation, RecordError};
use crate::trace::RunConfig;
use gpt::model::Norm;
use settings::{keys, read, settings_as_text, Settings};

/// A built-in workload with its settings.
#[derive(Debug, Clone, PartialEq)]
pub enum Workload {
    /// The linear adder.
    Adder(AdderConfig),
    /// A classifier (mlp, cnn, resnet18).
    Classifier(ClassifierConfig),
    /// The transformer, recorded by automatic capture.
    Gpt(GptConfig),
    /// A candle-transformers decoder (Qwen2, Gemma) at inference, recorded by automatic capture.
    Decoder(DecoderConfig),
}

impl Workload {
    /// The run configuration written to the trace header.
    pub fn run_config(&self) -> RunConfig {
        match self {
            Workload::Adder(c) => c.run_config(),
            Workload::Classifier(c) => c.run_config(),
            Workload::Gpt(c) => c.run_config(),
            Workload::Decoder(c) => c.run_config(),
        }
    }

    /// One line saying what is trained, for progress messages.
    pub fn describe(&self) -> String {
        match self {
            Workload::Adder(c) => c.describe(),
            Workload::Classifier(c) => c.describe(),
            Workload::Gpt(c) => c.describe(),
            Workload::Decoder(c) => c.describe(),
        }
    }

    /// Which built-in workload this is.
    pub fn kind(&self) -> WorkloadKind {
        match self {
            Workload::Adder(_) => WorkloadKind::Adder,
            Workload::Classifier(c) => WorkloadKind::from_classifier(c.model),
            Workload::Gpt(_) => WorkloadKind::Gpt,
            Workload::Decoder(c) => match c.family {
                Family::Qwen2 => WorkloadKind::Qwen2,
                Family::Gemma => WorkloadKind::Gemma,
            },
        }
    }

    /// Checks the settings, and that `perturbation` names a tensor and a step of this run,
    /// before anything is recorded.
    pub fn validate(&self, perturbation: Option<&Perturbation>) -> Result<(), WorkloadError> {
        match (self, perturbation) {
            (_, Some(_)) if !self.is_trained() => Err(WorkloadError::Invalid(format!(
                "{} records inference: --perturb is not supported (it plants faults in {})",
                self.kind(),
                WorkloadKind::listed(Workload::is_trained)
            ))),
            (Workload::Adder(c), p) => c.validate(p),
            (Workload::Gpt(c), p) => c.validate(p),
            (Workload::Decoder(c), _) => c.validate(),
            (Workload::Classifier(c), p) => {
                c.validate()?;
                match p {
                    Some(p) => classifier::check_perturbation(c, p),
                    None => Ok(()),
                }
            }
        }
    }

    /// Whether this workload trains data-parallel; asked before any rank process starts, so
    /// that a refusal leaves nothing behind.
    pub fn check_data_parallel(&self) -> Result<(), WorkloadError> {
        match self.trains_data_parallel() {
            true => Ok(()),
            false => Err(WorkloadError::Invalid(format!(
                "{} does not train data-parallel: --devices with several devices takes {}",
                self.kind(),
                WorkloadKind::listed(Workload::trains_data_parallel)
            ))),
        }
    }

    /// Trains and records every step into `training.recorder`, planting its perturbation if
    /// it has one (`RecordOptions::perturbation`); with `training.data_parallel`, as one rank of
    /// data-parallel training, on this rank's share of every batch.
    pub fn run(&self, training: Training<'_>) -> Result<(), RecordError> {
        if training.data_parallel.is_some() {
            self.check_data_parallel()?;
        }
        match self {
            Workload::Adder(c) => c.run(training),
            Workload::Classifier(c) => c.run(training),
            Workload::Gpt(c) => c.run(training),
            Workload::Decoder(c) => c.run(training),
        }
    }

    /// The workload a header's `run` describes (its name, its steps and its settings), every
    /// setting absent taking its default; not yet checked (`WorkloadRun::new` checks).
    pub fn from_run_config(run: &RunConfig) -> Result<Workload, WorkloadError> {
        let kind: WorkloadKind =
            run.workload.parse().map_err(|_| WorkloadError::UnknownWorkload(run.workload.clone()))?;
        let params = &run.params;
        Ok(match kind {
            WorkloadKind::Adder => {
                let d = AdderConfig::default();
                Workload::Adder(AdderConfig { steps: run.steps.unwrap_or(d.steps), ..read(kind, &d, params)? })
            }
            WorkloadKind::Gpt => {
                let d = GptConfig::default();
                Workload::Gpt(GptConfig { steps: run.steps.unwrap_or(d.steps), ..read(kind, &d, params)? })
            }
            WorkloadKind::Qwen2 | WorkloadKind::Gemma => {
                let family = if kind == WorkloadKind::Qwen2 { Family::Qwen2 } else { Family::Gemma };
                let d = DecoderConfig { family, ..DecoderConfig::default() };
                let steps = run.steps.unwrap_or(d.steps);
                Workload::Decoder(DecoderConfig { family, steps, ..read(kind, &d, params)? })
            }
            WorkloadKind::Mlp | WorkloadKind::Cnn | WorkloadKind::ResNet18 => {
                let model = kind.classifier_model().expect("a classifier workload");
                // The header holds the steps the run trains, all epochs' or fewer.
                let config = read(kind, &ClassifierConfig::defaults(model), params)?;
                Workload::Classifier(ClassifierConfig { model, max_steps: run.steps, ..config })
            }
        })
    }
}

impl WorkloadKind {
    /// The command-line options that give this workload's settings, each as `(option, setting)`:
    /// the option's long name and the header's key.
    pub fn options(self) -> Vec<(String, &'static str)> {
        fn of<T: Settings>() -> Vec<(String, &'static str)> {
            let option = |key: &str| match T::OPTIONS.iter().find(|(_, setting)| *setting == key) {
                Some((option, _)) => option.to_string(),
                None => key.replace('_', "-"),
            };
            keys::<T>().iter().map(|&key| (option(key), key)).collect()
        }
        match self {
            WorkloadKind::Adder => of::<AdderConfig>(),
            WorkloadKind::Gpt => of::<GptConfig>(),
            WorkloadKind::Qwen2 | WorkloadKind::Gemma => of::<DecoderConfig>(),
            WorkloadKind::Mlp | WorkloadKind::Cnn | WorkloadKind::ResNet18 => of::<ClassifierConfig>(),
        }
    }
}

// The settings that are enums, as the header writes them: their text.
settings_as_text!(Reductions, Formulation, Norm, DatasetName, DecoderShape);
