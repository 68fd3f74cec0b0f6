//! What a study trains: a built-in classifier on its dataset, or the gpt on its corpus, behind
//! the few things a study asks of a workload: train it with other seeds, reductions or length,
//! score its held-out predictions, and evaluate another run's weights.

use super::error::StudyError;
use super::stats::RunResult;
use super::store::StudyDir;
use super::subgroups::Subgroup;
use crate::ops::Reductions;
use crate::record::{RecordError, Recorder};
use crate::trace::RunConfig;
use crate::workloads::classifier::{evaluate, train};
use crate::workloads::{
    ClassifierConfig, Dataset, GptConfig, ModelState, Seeds, StudyModel, TrainOutcome, Workload, WorkloadKind,
};
use candle_core::Device;
use std::time::Instant;

/// A workload a study can train, with its data.
pub enum Subject {
    /// A classifier and its dataset, generated once for every run of the study.
    Classifier {
        /// The base settings.
        config: ClassifierConfig,
        /// The dataset.
        data: Box<Dataset>,
    },
    /// The gpt (its corpus is built in).
    Gpt(GptConfig),
}

/// What a study changes in a run, relative to the subject's base settings.
#[derive(Debug, Clone, Copy, Default)]
pub struct Variation {
    /// Other seeds of the algorithmic randomness (the gpt has two: `init` for the weights,
    /// `order` for the batches).
    pub seeds: Option<Seeds>,
    /// Other reductions.
    pub reductions: Option<Reductions>,
    /// Train this many steps instead.
    pub steps: Option<u64>,
    /// Another batch size.
    pub batch: Option<usize>,
    /// Turn off the random shifts of images and dropout. Their randomness is drawn per position
    /// in the batch, so a run with another data order also gives examples other shifts and masks.
    pub without_augmentation_and_dropout: bool,
}

impl Subject {
    /// The subject of a built-in workload; the adder and qwen2 (inference) have no held-out
    /// predictions to study.
    pub fn new(workload: Workload) -> Result<Self, StudyError> {
        match workload.study_model() {
            Some(StudyModel::Classifier(config)) => {
                config.validate()?;
                let data =
                    Dataset::load(config.dataset, config.dataset_seed, config.examples).map_err(StudyError::Invalid)?;
                Ok(Subject::Classifier { config: config.clone(), data: Box::new(data) })
            }
            Some(StudyModel::Gpt(config)) => {
                config.validate(None)?;
                Ok(Subject::Gpt(config.clone()))
            }
            None => Err(StudyError::Invalid(format!(
                "studies train {}, not {}",
                WorkloadKind::listed(|w| w.study_model().is_some()),
                workload.kind()
            ))),
        }
    }

    /// The workload's name (`cnn`, `gpt`).
    pub fn workload_name(&self) -> String {
        self.run_config().workload
    }

    /// The base settings, as a trace header writes them.
    pub fn run_config(&self) -> RunConfig {
        match self {
            Subject::Classifier { config, .. } => config.run_config(),
            Subject::Gpt(config) => config.run_config(),
        }
    }

    /// One line for a report's title.
    pub fn describe(&self) -> String {
        match self {
            Subject::Classifier { config: c, .. } => format!(
                "{} on {} ({} epoch(s), batch {}, lr {}{})",
                c.model,
                c.dataset,
                c.epochs,
                c.batch,
                c.lr,
                if c.batch_norm { ", batch norm" } else { "" }
            ),
            Subject::Gpt(c) => format!(
                "gpt ({} layers, width {}, context {}; {} steps of batch {}, lr {})",
                c.layers, c.width, c.context, c.steps, c.batch, c.lr
            ),
        }
    }

    /// The test labels and the sub-groups of a binary classifier's dataset with protected
    /// attributes: for each attribute, those with it and those without. `None` for others.
    pub fn subgroups(&self) -> Option<(Vec<u32>, Vec<Subgroup>)> {
        let Subject::Classifier { data, .. } = self else { return None };
        if data.protected.is_empty() || data.classes != 2 {
            return None;
        }
        let groups = data
            .protected
            .iter()
            .flat_map(|a| {
                [
                    Subgroup { name: a.name.clone(), members: a.values.clone() },
                    Subgroup { name: a.complement.clone(), members: a.values.iter().map(|v| !v).collect() },
                ]
            })
            .collect();
        Some((data.test.y.clone(), groups))
    }

    /// The base seed the noise study's variants start from.
    pub fn base_seed(&self) -> u64 {
        match self {
            Subject::Classifier { config, .. } => config.init_seed,
            Subject::Gpt(config) => config.seed,
        }
    }

    /// The workload and the settings a timing depends on, for a table row.
    pub fn describe_briefly(&self) -> String {
        match self {
            Subject::Classifier { config: c, .. } => format!("{} ({}, batch {})", c.model, c.dataset, c.batch),
            Subject::Gpt(c) => format!("gpt ({} layers, width {}, batch {})", c.layers, c.width, c.batch),
        }
    }

    /// Training examples of a classifier (its full batch); `None` for the gpt.
    pub fn train_examples(&self) -> Option<usize> {
        match self {
            Subject::Classifier { data, .. } => Some(data.train.len()),
            Subject::Gpt(_) => None,
        }
    }

    /// Training steps of a run with the base settings.
    pub fn steps(&self) -> u64 {
        match self {
            Subject::Classifier { config, data } => config.total_steps(data.train.len()),
            Subject::Gpt(config) => config.steps,
        }
    }

    /// Trains a run with `variation` on `device`, recording into `recorder` (which may
    /// discard), and predicts the held-out examples.
    pub fn train(
        &self,
        variation: Variation,
        device: &Device,
        recorder: &mut Recorder,
    ) -> Result<TrainOutcome, RecordError> {
        match self {
            Subject::Classifier { config, data } => {
                train(&classifier_variant(config, variation), data, device, recorder)
            }
            Subject::Gpt(config) => gpt_variant(config, variation).train(device, recorder),
        }
    }

    /// Trains a run with `variation` without recording it, scores it, and saves its result and
    /// final weights as run `run` of `series` in the study directory.
    pub(crate) fn train_and_save(
        &self,
        variation: Variation,
        device: &Device,
        dir: &StudyDir,
        series: &str,
        run: usize,
    ) -> Result<RunResult, StudyError> {
        let started = Instant::now();
        let outcome = self.train(variation, device, &mut Recorder::discard())?;
        let (accuracy, per_class_accuracy) = RunResult::score(&outcome.predictions, &outcome.labels, outcome.classes);
        let result = RunResult {
            accuracy,
            per_class_accuracy,
            predictions: outcome.predictions,
            final_loss: outcome.final_loss as f64,
            steps: outcome.steps,
            seconds: started.elapsed().as_secs_f64(),
        };
        dir.save_run(series, run, &result, &outcome.state.weights)?;
        Ok(result)
    }

    /// Held-out predictions of the base model holding `state` (trained anywhere), on `device`.
    pub fn evaluate(&self, device: &Device, state: &ModelState) -> Result<Vec<u32>, RecordError> {
        match self {
            Subject::Classifier { config, data } => evaluate(config, data, device, state),
            Subject::Gpt(config) => config.evaluate(device, state),
        }
    }
}

fn classifier_variant(base: &ClassifierConfig, v: Variation) -> ClassifierConfig {
    let mut c = base.clone();
    if let Some(seeds) = v.seeds {
        c = c.with_seeds(seeds);
    }
    if let Some(reductions) = v.reductions {
        c.reductions = reductions;
    }
    if let Some(batch) = v.batch {
        c.batch = batch;
    }
    if v.without_augmentation_and_dropout {
        c.augment_shift = 0;
        c.dropout = 0.0;
    }
    if let Some(steps) = v.steps {
        // Enough epochs to reach the steps whatever the dataset's size.
        c.max_steps = Some(steps);
        c.epochs = steps;
    }
    c
}

fn gpt_variant(base: &GptConfig, v: Variation) -> GptConfig {
    let mut c = base.clone();
    if let Some(seeds) = v.seeds {
        c.seed = seeds.init;
        c.data_seed = seeds.order;
    }
    if let Some(reductions) = v.reductions {
        c.reductions = reductions;
    }
    if let Some(batch) = v.batch {
        c.batch = batch;
    }
    if let Some(steps) = v.steps {
        c.steps = steps;
    }
    c
}
