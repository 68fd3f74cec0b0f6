//! `gpt`: a small decoder-only transformer trained with AdamW on next-token prediction over a
//! generated English-like corpus (`data/gpt/corpus.txt`, made by `scripts/make-corpus.py`),
//! byte-level, with seeded batching and seeded host initialisation.
//!
//! The model ([`model`]) has no recording calls: `repro::capture` records its parameters, every
//! node of its forward graph (named after the model's `tracing` spans), its gradients and its
//! updated parameters from the training loop here.

pub mod model;

use crate::capture::{span_scopes_on_this_thread, ModelCapture};
use crate::distributed::DataParallel;
use crate::ops::{sum_all, Reductions};
use crate::record::{Perturbation, RecordError, Recorder};
use crate::trace::{RunConfig, TensorKind};
use crate::workloads::seeded::{stream, uniform_vec};
use crate::workloads::settings::{self, is_default, Settings};
use crate::workloads::{ModelState, TrainOutcome};
use crate::workloads::{Training, WorkloadError, WorkloadKind};
use candle_core::{DType, Device, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use model::{Gpt, GptShape, Norm};
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// The training text: generated, about 96 KiB of ASCII.
pub const CORPUS: &str = include_str!("../../../data/gpt/corpus.txt");

/// A `gpt` training run's settings (each a setting of its trace header by name,
/// `workloads::settings`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GptConfig {
    /// Seed of the initial weights.
    pub seed: u64,
    /// Seed of the batches (which windows of the corpus each step trains on; where not given:
    /// the seed).
    pub data_seed: u64,
    /// Training steps: the header's own `steps`.
    #[serde(skip)]
    pub steps: u64,
    /// Sequences per batch.
    pub batch: usize,
    /// Tokens per sequence (and the model's context).
    pub context: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Embedding width.
    pub width: usize,
    /// Attention heads.
    pub heads: usize,
    /// AdamW learning rate.
    pub lr: f64,
    /// How the blocks normalise.
    pub norm: Norm,
    /// How batch reductions accumulate: the loss over every token and the linear layers' bias
    /// gradients. `Candle` is candle's own kernels and candle-nn's layers unchanged. A header
    /// has it only where it is not (traces recorded before the setting existed keep theirs).
    #[serde(default, skip_serializing_if = "is_default")]
    pub reductions: Reductions,
    /// Batch-invariant matrix products and softmax sums (`ops::invariant`) instead of candle's;
    /// in a header only where set.
    #[serde(default, skip_serializing_if = "is_default")]
    pub batch_invariant: bool,
}

impl Settings for GptConfig {
    const FOLLOWS: &'static [(&'static str, &'static str)] = &[("data_seed", "seed")];
}

impl Default for GptConfig {
    fn default() -> Self {
        GptConfig {
            seed: 0,
            data_seed: 0,
            steps: 20,
            batch: 8,
            context: 64,
            layers: 2,
            width: 128,
            heads: 4,
            lr: 1e-3,
            norm: Norm::Ops,
            reductions: Reductions::Candle,
            batch_invariant: false,
        }
    }
}

impl GptConfig {
    /// One line saying what is trained, for progress messages.
    pub fn describe(&self) -> String {
        format!(
            "gpt ({} layers, width {}, context {}; seed {}, {} steps of batch {})",
            self.layers, self.width, self.context, self.seed, self.steps, self.batch
        )
    }

    /// The run configuration written to a trace header.
    pub fn run_config(&self) -> RunConfig {
        settings::run_config(self, WorkloadKind::Gpt, self.steps)
    }

    fn shape(&self) -> GptShape {
        GptShape {
            vocab: VOCAB,
            context: self.context,
            layers: self.layers,
            width: self.width,
            heads: self.heads,
            norm: self.norm,
            reductions: self.reductions,
            batch_invariant: self.batch_invariant,
        }
    }

    /// Checks the settings, and that `perturb` names a parameter of this model.
    pub fn validate(&self, perturb: Option<&Perturbation>) -> Result<(), WorkloadError> {
        let bad = |m: String| Err(WorkloadError::Invalid(m));
        if self.steps == 0 || self.batch == 0 || self.layers == 0 {
            return bad("gpt needs --steps, --batch and --layers of at least 1".into());
        }
        if self.context < 2 || self.context + 1 > CORPUS.len() {
            return bad(format!("--context must be between 2 and {} tokens", CORPUS.len() - 1));
        }
        if self.width == 0 || self.heads == 0 || !self.width.is_multiple_of(self.heads) {
            return bad(format!("--width ({}) must be a positive multiple of --heads ({})", self.width, self.heads));
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad(format!("--lr must be a positive number, not {}", self.lr));
        }
        if let Some(p) = perturb {
            let names = self.parameter_names()?;
            if !names.contains(&p.tensor) {
                return bad(format!(
                    "--perturb: `{}` is not a parameter of this gpt; its parameters are {}",
                    p.tensor,
                    names.join(", ")
                ));
            }
            if p.step >= self.steps {
                return bad(format!("--perturb: step {} is past the last step {}", p.step, self.steps - 1));
            }
            self.check_element_is_read(p)?;
        }
        Ok(())
    }

    /// Refuses a perturbation of an embedding row that its step does not read: the token
    /// embedding of a byte the step's batch does not hold (byte 0, which the corpus never
    /// holds, among them), or the position embedding past the context. Moving it would change
    /// nothing, and a gate meant to catch the planted fault would pass.
    fn check_element_is_read(&self, p: &Perturbation) -> Result<(), WorkloadError> {
        let row = p.element / self.width as u64;
        let unread = match p.tensor.as_str() {
            "wte.weight" => {
                let (inputs, _) = self.batch_data(p.step, &Device::Cpu)?;
                let tokens: Vec<u32> = inputs.flatten_all()?.to_vec1()?;
                (!tokens.contains(&(row as u32)) || row > u32::MAX as u64).then(|| {
                    format!(
                        "the embedding of byte {row}, which the batch of step {} does not hold; its first byte, {}, \
                         starts at element {}",
                        p.step,
                        tokens[0],
                        tokens[0] as usize * self.width
                    )
                })
            }
            "wpe.weight" => (row >= self.context as u64)
                .then(|| format!("the embedding of position {row}, past the context of {}", self.context)),
            _ => None,
        };
        match unread {
            Some(why) => Err(WorkloadError::Invalid(format!(
                "--perturb {p}: element {} of `{}` is {why}: the step does not read it, so moving it would change \
                 nothing; choose another with @ELEMENT",
                p.element, p.tensor
            ))),
            None => Ok(()),
        }
    }

    /// The model's parameter names, sorted.
    pub fn parameter_names(&self) -> Result<Vec<String>, RecordError> {
        let varmap = VarMap::new();
        Gpt::new(self.shape(), VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
        Ok(sorted_vars(&varmap).into_iter().map(|(name, _)| name).collect())
    }

    /// One batch: `batch` windows of `context + 1` bytes at seeded offsets; inputs are the
    /// first `context` bytes, targets the last `context`.
    fn batch_data(&self, step: u64, device: &Device) -> Result<(Tensor, Tensor), RecordError> {
        self.windows(&mut stream(self.data_seed, "gpt.batch", step), self.batch, device)
    }

    /// `count` windows of the corpus, `context` bytes each, at offsets drawn from a seed of its
    /// own (not the training batches'): sequences for checks of the trained or untrained model.
    pub fn probe_windows(&self, count: usize) -> Result<Vec<Vec<u32>>, RecordError> {
        let (inputs, _) = self.windows(&mut stream(0, "gpt.probe", 0), count, &Device::Cpu)?;
        Ok(inputs.to_vec2()?)
    }

    /// `count` windows of `context + 1` bytes at offsets drawn from `rng`, as `[count, context]`
    /// inputs and targets (the same windows shifted by one byte).
    fn windows(&self, rng: &mut impl Rng, count: usize, device: &Device) -> Result<(Tensor, Tensor), RecordError> {
        let bytes = CORPUS.as_bytes();
        let (mut inputs, mut targets) = (Vec::new(), Vec::new());
        for _ in 0..count {
            let start = rng.random_range(0..bytes.len() - self.context);
            let window = &bytes[start..start + self.context + 1];
            inputs.extend(window[..self.context].iter().map(|&b| b as u32));
            targets.extend(window[1..].iter().map(|&b| b as u32));
        }
        let shape = (count, self.context);
        let inputs = Tensor::from_vec(inputs, shape, &Device::Cpu)?.to_device(device)?;
        let targets = Tensor::from_vec(targets, shape, &Device::Cpu)?.to_device(device)?;
        Ok((inputs, targets))
    }

    /// Builds the model on `device` with seeded initial weights drawn on the host: N(0, 0.02)
    /// approximated by a uniform of the same spread for matrices and embeddings, ones and zeros
    /// for norms and biases; keyed by parameter name, so identical on every device.
    pub fn build(&self, device: &Device) -> Result<(Gpt, VarMap), RecordError> {
        self.build_in(device, DType::F32)
    }

    /// The model for forward passes only: `build_in`'s weights as plain tensors, not
    /// variables, so a pass records no graph and frees each activation once the next op has
    /// read it (with variables every activation stays alive until the output is dropped).
    pub fn build_for_inference(&self, device: &Device, dtype: DType) -> Result<Gpt, RecordError> {
        let (_, varmap) = self.build_in(device, dtype)?;
        let weights: std::collections::HashMap<String, Tensor> =
            sorted_vars(&varmap).into_iter().map(|(name, var)| (name, var.as_detached_tensor())).collect();
        Ok(Gpt::new(self.shape(), VarBuilder::from_tensors(weights, dtype, device))?)
    }

    /// `build`, with the parameters (and so the activations) in `dtype`: the f32 initial
    /// values rounded to it. For forward passes; training is in f32.
    pub fn build_in(&self, device: &Device, dtype: DType) -> Result<(Gpt, VarMap), RecordError> {
        let mut varmap = VarMap::new();
        let model = Gpt::new(self.shape(), VarBuilder::from_varmap(&varmap, dtype, device))?;
        let params: Vec<(String, Vec<usize>)> =
            sorted_vars(&varmap).into_iter().map(|(name, var)| (name, var.dims().to_vec())).collect();
        let spread = 0.02 * 3f64.sqrt();
        for (name, dims) in params {
            let n: usize = dims.iter().product();
            let values = if name.ends_with(".bias") {
                vec![0.0; n]
            } else if name.contains("ln_") {
                vec![1.0; n]
            } else {
                uniform_vec(&mut stream(self.seed, &format!("gpt.init.{name}"), 0), n, -spread, spread)
            };
            varmap.set_one(&name, Tensor::from_vec(values, dims, &Device::Cpu)?.to_dtype(dtype)?.to_device(device)?)?;
        }
        Ok((model, varmap))
    }

    /// Trains and records every step into `recorder` through `repro::capture`: the batch, the
    /// parameters, every graph node, the gradients and the updated parameters. `perturb` moves a
    /// parameter for the forward pass of one step (the recorded parameter keeps its true value),
    /// which stands for a kernel that computed one op differently. With `dp`, as one rank of
    /// data-parallel training.
    pub fn run(&self, training: Training<'_>) -> Result<(), RecordError> {
        self.train_steps(training.device, training.recorder, false, training.data_parallel).map(|_| ())
    }

    /// Trains as [`GptConfig::run`] does, timing each step (synchronized with the device), then
    /// predicts the next byte at every position of the evaluation windows: what the studies
    /// compare between runs.
    pub fn train(&self, device: &Device, recorder: &mut Recorder) -> Result<TrainOutcome, RecordError> {
        let trained = self.train_steps(device, recorder, true, None)?;
        let (inputs, labels) = self.evaluation_windows(device)?;
        let predictions = predict(&trained.model, &inputs)?;
        Ok(TrainOutcome {
            steps: self.steps,
            predictions,
            labels: labels.flatten_all()?.to_vec1()?,
            classes: VOCAB,
            state: ModelState { weights: flatten(&trained.varmap)?, buffers: Vec::new() },
            final_loss: trained.final_loss,
            step_times: trained.step_times,
        })
    }

    /// Next-byte predictions, at every position of the evaluation windows, of a model holding
    /// `state` (trained anywhere), run on `device`.
    pub fn evaluate(&self, device: &Device, state: &ModelState) -> Result<Vec<u32>, RecordError> {
        let (model, varmap) = self.build(device)?;
        let mut at = 0;
        for (name, var) in sorted_vars(&varmap) {
            let n = var.elem_count();
            let values = state.weights.get(at..at + n).ok_or_else(|| {
                RecordError::Unsupported(format!("the weights end before `{name}`: not a state of this gpt"))
            })?;
            var.set(&Tensor::from_slice(values, var.dims(), &Device::Cpu)?.to_device(device)?)?;
            at += n;
        }
        if at != state.weights.len() {
            return Err(RecordError::Unsupported("more weights than this gpt has: not a state of it".into()));
        }
        let (inputs, _) = self.evaluation_windows(device)?;
        predict(&model, &inputs)
    }

    /// The held-out probe of the studies: [`EVAL_WINDOWS`] windows of the corpus at offsets
    /// drawn from a fixed seed (the same whatever the run's seeds), as inputs and next bytes.
    fn evaluation_windows(&self, device: &Device) -> Result<(Tensor, Tensor), RecordError> {
        self.windows(&mut stream(0, "gpt.eval", 0), EVAL_WINDOWS, device)
    }

    fn train_steps(
        &self,
        device: &Device,
        recorder: &mut Recorder,
        time_steps: bool,
        mut dp: Option<&mut DataParallel>,
    ) -> Result<Trained, RecordError> {
        if let Some(dp) = &dp {
            dp.check_batch(self.batch)?;
        }
        // Name graph nodes after the model's spans, for this thread.
        let _spans = span_scopes_on_this_thread();
        let (model, varmap) = self.build(device)?;
        let capture = ModelCapture::new(&varmap);
        let params = ParamsAdamW { lr: self.lr, ..ParamsAdamW::default() };
        let vars: Vec<_> = capture.parameters().iter().map(|(_, v)| v.clone()).collect();
        let mut opt = AdamW::new(vars, params)?;
        let perturb = recorder.perturbation().cloned();
        let (mut final_loss, mut step_times) = (f32::NAN, Vec::new());
        for step in 0..self.steps {
            let started = Instant::now();
            let (mut inputs, mut targets) = self.batch_data(step, device)?;
            if let Some(dp) = &dp {
                (inputs, targets) = (dp.shard(&inputs)?, dp.shard(&targets)?);
            }
            let mut s = recorder.step(step);
            s.record("tokens", TensorKind::Input, &inputs)?;
            s.record("targets", TensorKind::Input, &targets)?;
            capture.record_parameters(&mut s);
            // A planted fault: the forward pass sees the parameter moved, the trace its true value.
            let planted = match perturb.as_ref().filter(|p| p.step == step) {
                Some(p) => {
                    // The parameters are read on the recorder's worker thread: before changing
                    // one, wait for that read.
                    s.wait_for_background()?;
                    let (_, var) = capture.parameters().iter().find(|(n, _)| *n == p.tensor).expect("validated");
                    let original = var.as_tensor().copy()?;
                    var.set(&s.perturbed(&p.tensor, &original)?)?;
                    Some((var.clone(), original))
                }
                None => None,
            };
            let logits = model.forward(&inputs)?;
            let (b, t, v) = logits.dims3()?;
            let loss = next_token_loss(&logits.reshape((b * t, v))?, &targets.reshape(b * t)?, self.reductions)?;
            // The graph is walked and read on the recorder's worker thread during the backward
            // pass; recording the gradients waits for it, before the optimizer's step.
            capture.record_graph(&mut s, &loss, "loss", TensorKind::Loss);
            let mut grads = loss.backward()?;
            match dp.as_deref_mut() {
                Some(dp) => dp.average_gradients(&mut s, capture.parameters(), &mut grads)?,
                None => capture.record_gradients(&mut s, &grads)?,
            };
            if let Some((var, original)) = planted {
                var.set(&original)?;
            }
            opt.step(&grads)?;
            capture.record_updated(&mut s)?;
            s.finish()?;
            if time_steps {
                final_loss = loss.to_scalar::<f32>()?;
                device.synchronize()?;
                if step > 0 {
                    step_times.push(started.elapsed());
                }
            }
        }
        Ok(Trained { model, varmap, final_loss, step_times })
    }
}

/// Windows the studies predict on.
const EVAL_WINDOWS: usize = 32;

/// Byte-level vocabulary.
const VOCAB: usize = 256;

/// A trained model, its parameters, and what training measured.
struct Trained {
    model: Gpt,
    varmap: VarMap,
    final_loss: f32,
    step_times: Vec<Duration>,
}

/// The parameters in name order.
fn sorted_vars(varmap: &VarMap) -> Vec<(String, candle_core::Var)> {
    let mut vars: Vec<_> =
        varmap.data().lock().expect("VarMap lock").iter().map(|(n, v)| (n.clone(), v.clone())).collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    vars
}

/// Every parameter's values, in name order, concatenated.
fn flatten(varmap: &VarMap) -> Result<Vec<f32>, RecordError> {
    let mut out = Vec::new();
    for (_, var) in sorted_vars(varmap) {
        out.extend(var.as_tensor().flatten_all()?.to_vec1::<f32>()?);
    }
    Ok(out)
}

/// The most likely next byte at every position of `inputs` `[windows, context]`.
fn predict(model: &Gpt, inputs: &Tensor) -> Result<Vec<u32>, RecordError> {
    Ok(model.forward(inputs)?.argmax(candle_core::D::Minus1)?.flatten_all()?.to_vec1()?)
}

/// The mean cross-entropy of `logits` `[n, vocab]` against `targets` `[n]`: candle-nn's
/// `cross_entropy` with candle's reductions, else the same formula with the sum over tokens
/// accumulated as `reductions` says.
fn next_token_loss(logits: &Tensor, targets: &Tensor, reductions: Reductions) -> candle_core::Result<Tensor> {
    if reductions == Reductions::Candle {
        return candle_nn::loss::cross_entropy(logits, targets);
    }
    let n = targets.elem_count();
    let log_p = candle_nn::ops::log_softmax(logits, candle_core::D::Minus1)?;
    let picked = log_p.gather(&targets.unsqueeze(1)?, 1)?;
    sum_all(&picked, reductions)?.affine(-1.0 / n as f64, 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> GptConfig {
        GptConfig { steps: 2, batch: 2, context: 8, layers: 1, width: 16, heads: 2, ..GptConfig::default() }
    }

    #[test]
    fn a_trained_state_evaluates_to_the_same_predictions_and_a_foreign_one_is_refused() {
        let config = small();
        let trained = config.train(&Device::Cpu, &mut Recorder::discard()).unwrap();
        assert_eq!(trained.predictions.len(), EVAL_WINDOWS * config.context);
        assert_eq!(trained.labels.len(), trained.predictions.len());
        assert_eq!(trained.step_times.len(), 1, "the first step is warm-up");
        assert_eq!(config.evaluate(&Device::Cpu, &trained.state).unwrap(), trained.predictions);
        let mut short = trained.state.clone();
        short.weights.pop();
        assert!(config.evaluate(&Device::Cpu, &short).unwrap_err().to_string().contains("not a state of this gpt"));
    }

    #[test]
    fn ordered_reductions_reproduce_and_change_only_the_summation_order() {
        let ordered = GptConfig { reductions: Reductions::Ordered, ..small() };
        let a = ordered.train(&Device::Cpu, &mut Recorder::discard()).unwrap();
        let b = ordered.train(&Device::Cpu, &mut Recorder::discard()).unwrap();
        assert_eq!(a.state, b.state);
        let candle = small().train(&Device::Cpu, &mut Recorder::discard()).unwrap();
        let gap = a.state.weights.iter().zip(&candle.state.weights).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(gap < 1e-3, "the same training up to rounding: {gap}");
        assert!(ordered.run_config().params["reductions"] == "ordered");
        assert!(!small().run_config().params.contains_key("reductions"), "absent means candle's");
    }
}
