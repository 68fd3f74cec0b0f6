//! Built-in training workloads. Each trains with candle and records itself through the same
//! `Recorder` API that users' own training loops use.

mod adder;
pub mod classifier;
pub mod decoder;
pub mod gpt;
pub mod host_memory;
mod kind;
mod outcome;
pub mod seeded;

pub use adder::{AdderConfig, Formulation};
pub use classifier::{ClassifierConfig, Dataset, DatasetName, ModelKind};
pub use decoder::{DecoderConfig, DecoderShape, Family};
pub use gpt::GptConfig;
pub use kind::WorkloadKind;
pub use outcome::{ModelState, Seeds, TrainOutcome};

use crate::distributed::DataParallel;
use crate::record::{RecordError, Recorder};
use crate::trace::RunConfig;
use candle_core::Device;

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
            Workload::Adder(c) => format!(
                "adder (seed {}, {} steps, batch {}, {} formulation, {} reductions)",
                c.seed, c.steps, c.batch, c.formulation, c.reductions
            ),
            Workload::Classifier(c) => {
                let length = match c.max_steps {
                    Some(steps) => format!("{steps} step(s)"),
                    None => format!("{} epoch(s)", c.epochs),
                };
                format!(
                    "{} on {} ({} reductions, {length} of batch {}, init seed {})",
                    c.model, c.dataset, c.reductions, c.batch, c.seeds.init
                )
            }
            Workload::Gpt(c) => format!(
                "gpt ({} layers, width {}, context {}; seed {}, {} steps of batch {})",
                c.layers, c.width, c.context, c.seed, c.steps, c.batch
            ),
            Workload::Decoder(c) => format!(
                "{} inference ({} layers, {}{}; seed {}, {} forward passes of {} prompts x {} tokens)",
                c.family,
                c.layers,
                match c.shape {
                    DecoderShape::Small => format!("width {}", c.width),
                    shape => format!("{} shape", shape.name()),
                },
                if c.dtype == candle_core::DType::BF16 { ", bf16" } else { "" },
                c.seed,
                c.steps,
                c.batch,
                c.tokens
            ),
        }
    }

    /// Whether this workload trains data-parallel (gpt, mlp, cnn and resnet18 do); asked before
    /// any rank process starts, so that a refusal leaves nothing behind.
    pub fn check_data_parallel(&self) -> Result<(), RecordError> {
        match self {
            Workload::Classifier(_) | Workload::Gpt(_) => Ok(()),
            Workload::Adder(_) | Workload::Decoder(_) => Err(RecordError::Unsupported(format!(
                "{} does not train data-parallel: --devices with several devices takes gpt, mlp, cnn or resnet18",
                self.run_config().workload
            ))),
        }
    }

    /// Trains and records every step into `recorder`, planting its perturbation if it has one
    /// (`RecordOptions::perturbation`).
    pub fn run(&self, device: &Device, recorder: &mut Recorder) -> Result<(), RecordError> {
        self.run_ranked(device, recorder, None)
    }

    /// `run` as one rank of data-parallel training when `dp` is given: this rank trains on its
    /// share of every batch and averages gradients with the other ranks (gpt, mlp, cnn and
    /// resnet18).
    pub fn run_ranked(
        &self,
        device: &Device,
        recorder: &mut Recorder,
        dp: Option<&mut DataParallel>,
    ) -> Result<(), RecordError> {
        if dp.is_some() {
            self.check_data_parallel()?;
        }
        match self {
            Workload::Adder(c) => c.run(device, recorder),
            Workload::Classifier(c) => {
                let data = Dataset::load(c.dataset, c.dataset_seed, c.examples).map_err(RecordError::Unsupported)?;
                classifier::train_ranked(c, &data, device, recorder, dp).map(|_| ())
            }
            Workload::Gpt(c) => c.run(device, recorder, dp),
            Workload::Decoder(c) => match recorder.perturbation() {
                Some(_) => {
                    Err(RecordError::Unsupported(format!("{} records inference: --perturb is not supported", c.family)))
                }
                None => c.run(device, recorder),
            },
        }
    }
}
