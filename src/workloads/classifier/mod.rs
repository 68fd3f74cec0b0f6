//! Image and vector classifiers trained with Adam and cross-entropy: the workloads of the published reproducibility
//! studies (`mlp`, `cnn`, `resnet18`).
//!
//! Every source of algorithmic randomness has its own seed (`Seeds`): initial weights, the
//! order of the training data, augmentation (random shifts of images) and dropout masks, so a
//! study can vary one while the others stay fixed. Implementation randomness comes from
//! `Reductions`: `atomic` makes every batch reduction (loss, bias and batch-norm parameter
//! gradients, batch-norm statistics, weight-gradient accumulation) depend on timing.

mod data;
mod layers;
mod models;

pub use data::{Dataset, DatasetName, Split};
pub use models::{ModelKind, MLP_HIDDEN};

pub use super::outcome::{ModelState, Seeds, TrainOutcome};
use crate::distributed::{DataParallel, Gradient};
use crate::ops::Reductions;
use crate::record::{Perturbation, RecordError, RecordOptions, Recorder};
use crate::trace::{Phase, RunConfig, TensorKind};
use crate::workloads::seeded::stream;
use crate::workloads::settings::Settings;
use crate::workloads::{Training, WorkloadError};
use candle_core::{Device, Tensor, D};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use layers::{cross_entropy, one_hot, Ctx, Node, ParamStore};
use models::Model;
use rand::seq::SliceRandom;
use std::collections::BTreeMap;
use std::time::Instant;

/// A classifier training run's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassifierConfig {
    /// Architecture.
    pub model: ModelKind,
    /// Dataset.
    pub dataset: DatasetName,
    /// Seed that generates the synthetic datasets (ignored for digits).
    pub dataset_seed: u64,
    /// Use at most this many training and test examples.
    pub examples: Option<usize>,
    /// Passes over the training data.
    pub epochs: u64,
    /// Stop after this many steps (default: all epochs).
    pub max_steps: Option<u64>,
    /// Examples per batch (a last incomplete batch of an epoch is skipped).
    pub batch: usize,
    /// Adam learning rate.
    pub lr: f64,
    /// Algorithmic seeds.
    pub seeds: Seeds,
    /// How batch reductions accumulate.
    pub reductions: Reductions,
    /// Batch norm after each convolution (cnn; resnet18 always has it).
    pub batch_norm: bool,
    /// Dropout probability after the hidden dense layer (mlp, cnn).
    pub dropout: f64,
    /// Random shifts of up to this many pixels (image datasets; 0: none).
    pub augment_shift: usize,
    /// Channels of ResNet-18's first stage.
    pub width: usize,
}

impl ClassifierConfig {
    /// One line saying what is trained, for progress messages.
    pub fn describe(&self) -> String {
        let length = match self.max_steps {
            Some(steps) => format!("{steps} step(s)"),
            None => format!("{} epoch(s)", self.epochs),
        };
        format!(
            "{} on {} ({} reductions, {length} of batch {}, init seed {})",
            self.model, self.dataset, self.reductions, self.batch, self.seeds.init
        )
    }

    /// The classifier of `model` a trace header's settings describe (`WorkloadRun::from_run_config`).
    pub(in crate::workloads) fn from_settings(
        s: &mut Settings,
        steps: Option<u64>,
        model: ModelKind,
    ) -> Result<Self, WorkloadError> {
        let d = ClassifierConfig::defaults(model);
        let init = s.take_or("init_seed", d.seeds.init)?;
        Ok(ClassifierConfig {
            model: d.model,
            dataset: s.take_or("dataset", d.dataset)?,
            dataset_seed: s.take_or("dataset_seed", d.dataset_seed)?,
            examples: match s.take::<String>("examples")?.as_deref() {
                None | Some("all") => None,
                Some(n) => Some(n.parse().map_err(|e| WorkloadError::BadSetting {
                    workload: d.model.to_string(),
                    key: "examples".into(),
                    value: n.into(),
                    reason: format!("{e}"),
                })?),
            },
            epochs: s.take_or("epochs", d.epochs)?,
            // The header holds the steps the run trains, all epochs' or fewer.
            max_steps: steps,
            batch: s.take_or("batch", d.batch)?,
            lr: s.take_or("lr", d.lr)?,
            seeds: Seeds {
                init,
                order: s.take_or("order_seed", init)?,
                augment: s.take_or("augment_seed", init)?,
                dropout: s.take_or("dropout_seed", init)?,
            },
            reductions: s.take_or("reductions", d.reductions)?,
            batch_norm: s.take_or("batch_norm", d.batch_norm)?,
            dropout: s.take_or("dropout", d.dropout)?,
            augment_shift: s.take_or("augment_shift", d.augment_shift)?,
            width: s.take_or("width", d.width)?,
        })
    }

    /// The defaults for `model`: the sources' settings where they give them, sized so a run
    /// takes seconds on a CPU (mlp, cnn) or on a GPU (resnet18).
    pub fn defaults(model: ModelKind) -> Self {
        let base = ClassifierConfig {
            model,
            dataset: DatasetName::Gauss2d,
            dataset_seed: 0,
            examples: None,
            epochs: 5,
            max_steps: None,
            batch: 32,
            lr: 0.0005,
            seeds: Seeds::all(0),
            reductions: Reductions::Candle,
            batch_norm: false,
            dropout: 0.0,
            augment_shift: 0,
            width: 64,
        };
        match model {
            ModelKind::Mlp => base,
            ModelKind::Cnn => {
                ClassifierConfig { dataset: DatasetName::Digits, epochs: 10, lr: 0.002, augment_shift: 1, ..base }
            }
            ModelKind::ResNet18 => ClassifierConfig {
                dataset: DatasetName::CifarSynthetic,
                epochs: 2,
                batch: 128,
                lr: 0.001,
                augment_shift: 2,
                batch_norm: true,
                ..base
            },
        }
    }

    /// The run configuration written to a trace header.
    pub fn run_config(&self) -> RunConfig {
        let params = BTreeMap::from([
            ("augment_seed".to_string(), self.seeds.augment.to_string()),
            ("augment_shift".to_string(), self.augment_shift.to_string()),
            ("batch".to_string(), self.batch.to_string()),
            ("batch_norm".to_string(), self.batch_norm.to_string()),
            ("dataset".to_string(), self.dataset.to_string()),
            ("dataset_seed".to_string(), self.dataset_seed.to_string()),
            ("dropout".to_string(), self.dropout.to_string()),
            ("dropout_seed".to_string(), self.seeds.dropout.to_string()),
            ("epochs".to_string(), self.epochs.to_string()),
            ("examples".to_string(), self.examples.map_or("all".into(), |n| n.to_string())),
            ("init_seed".to_string(), self.seeds.init.to_string()),
            ("lr".to_string(), self.lr.to_string()),
            ("order_seed".to_string(), self.seeds.order.to_string()),
            ("reductions".to_string(), self.reductions.to_string()),
            ("width".to_string(), self.width.to_string()),
        ]);
        let steps = Some(self.total_steps(self.dataset.train_len(self.examples)));
        RunConfig { workload: self.model.workload_name().into(), steps, params }
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        let bad = |m: String| Err(WorkloadError::Invalid(m));
        if self.batch == 0 || self.epochs == 0 || self.max_steps == Some(0) {
            return bad(format!("{} needs --batch, --epochs and --steps above 0", self.model));
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad(format!("--lr must be a positive number, not {}", self.lr));
        }
        if self.model != ModelKind::Mlp && !self.dataset.is_image() {
            return bad(format!("{} trains on images: use --dataset digits or cifar-synthetic", self.model));
        }
        if self.model == ModelKind::Mlp && self.dataset.is_image() {
            return bad(format!(
                "mlp trains on vectors: use --dataset gauss2d, gauss5d or subgroups, not {}",
                self.dataset
            ));
        }
        let train = self.dataset.train_len(self.examples);
        if train < self.batch {
            return bad(format!(
                "{} has {train} training example(s) (--examples {}), fewer than one batch of {}: lower --batch or raise --examples",
                self.dataset,
                self.examples.map_or("all".into(), |n| n.to_string()),
                self.batch
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return bad(format!("--dropout must be in [0, 1), got {}", self.dropout));
        }
        if self.model == ModelKind::ResNet18 && self.width == 0 {
            return bad("--width must be above 0".into());
        }
        Ok(())
    }

    /// Training steps per epoch for a training split of `n` examples.
    fn steps_per_epoch(&self, n: usize) -> u64 {
        (n / self.batch) as u64
    }

    /// Training steps of a run on a training split of `n` examples.
    pub fn total_steps(&self, n: usize) -> u64 {
        self.steps_per_epoch(n).saturating_mul(self.epochs).min(self.max_steps.unwrap_or(u64::MAX))
    }
}

/// Checks, before anything is recorded, that `perturb` names a tensor this model records and a
/// step the run has: one step of a two-example copy of the run, on the CPU, into a scratch trace
/// whose tensor names the error lists. The names do not depend on the batch or the data.
pub fn check_perturbation(config: &ClassifierConfig, perturb: &Perturbation) -> Result<(), WorkloadError> {
    let total = config.total_steps(config.dataset.train_len(config.examples));
    if perturb.step >= total {
        return Err(WorkloadError::Invalid(format!(
            "cannot perturb step {}: the run has steps 0 to {}",
            perturb.step,
            total.saturating_sub(1)
        )));
    }
    let probe = ClassifierConfig { examples: Some(2), batch: 2, epochs: 1, max_steps: Some(1), ..config.clone() };
    let data = Dataset::load(probe.dataset, probe.dataset_seed, probe.examples).map_err(WorkloadError::Invalid)?;
    let scratch = tempfile::tempdir()
        .map_err(|e| WorkloadError::Invalid(format!("cannot create a scratch directory to check --perturb: {e}")))?;
    let dir = scratch.path().join("probe");
    let capture = crate::trace::CapturePolicy { full: crate::trace::FullCapture::None, ..Default::default() };
    // At step 0 and by one ULP: only the name is in question here.
    let at_step_zero = Perturbation { step: 0, tensor: perturb.tensor.clone(), ulps: 1, element: perturb.element };
    let options = RecordOptions { perturbation: Some(at_step_zero), ..RecordOptions::capture(capture).replacing(true) };
    let mut recorder = Recorder::create(&dir, probe.run_config(), &Device::Cpu, options)?;
    train(&probe, &data, &Device::Cpu, &mut recorder)?;
    if recorder.finish().is_ok() {
        return Ok(());
    }
    let names: Vec<String> =
        crate::trace::summarize(&dir).map_err(RecordError::from)?.tensors.into_iter().map(|t| t.name).collect();
    Err(WorkloadError::Invalid(format!(
        "{} records no tensor `{}`; it records {}",
        config.model,
        perturb.tensor,
        names.join(", ")
    )))
}

impl ClassifierConfig {
    /// Trains and records every step into `training.recorder`, on its dataset (see
    /// [`train_ranked`]).
    pub fn run(&self, training: Training<'_>) -> Result<(), RecordError> {
        let data = Dataset::load(self.dataset, self.dataset_seed, self.examples).map_err(RecordError::Unsupported)?;
        train_ranked(self, &data, training.device, training.recorder, training.data_parallel).map(|_| ())
    }
}

/// Trains `config` on `device`, recording every step into `recorder` (which may discard), and
/// evaluates on the test split. Each step waits for the device, so that the outcome's step
/// times are the steps' own.
pub fn train(
    config: &ClassifierConfig,
    data: &Dataset,
    device: &Device,
    recorder: &mut Recorder,
) -> Result<TrainOutcome, RecordError> {
    train_loop(config, data, device, recorder, None, true)
}

/// [`train`] as one rank of data-parallel training when `dp` is given: the global batch is
/// drawn (and augmented) as on one device, this rank trains on its share of it, and gradients
/// are averaged over the ranks. Batch-norm statistics stay per rank, as each rank's own. Steps
/// are not waited for (the host prepares the next batch while the device runs), so the
/// outcome has no step times.
pub fn train_ranked(
    config: &ClassifierConfig,
    data: &Dataset,
    device: &Device,
    recorder: &mut Recorder,
    dp: Option<&mut DataParallel>,
) -> Result<TrainOutcome, RecordError> {
    train_loop(config, data, device, recorder, dp, false)
}

fn train_loop(
    config: &ClassifierConfig,
    data: &Dataset,
    device: &Device,
    recorder: &mut Recorder,
    mut dp: Option<&mut DataParallel>,
    time_steps: bool,
) -> Result<TrainOutcome, RecordError> {
    config.validate()?;
    if let Some(dp) = &dp {
        dp.check_batch(config.batch)?;
    }
    let mut params = ParamStore::new(config.seeds.init, device);
    let model =
        Model::new(config.model, &mut params, &data.example_shape, data.classes, config.batch_norm, config.width)?;
    let vars: Vec<_> = params.trainable.iter().map(|(_, v)| v.clone()).collect();
    let mut opt = AdamW::new(vars, ParamsAdamW { lr: config.lr, weight_decay: 0.0, ..Default::default() })?;

    let per_epoch = config.steps_per_epoch(data.train.len());
    if per_epoch == 0 {
        return Err(RecordError::Unsupported(format!(
            "the batch ({}) is larger than the training split ({} examples)",
            config.batch,
            data.train.len()
        )));
    }
    let total = config.total_steps(data.train.len());
    let len = data.example_len();
    let mut step_times = Vec::new();
    let mut final_loss = f32::NAN;
    let mut order: Vec<usize> = Vec::new();
    for step in 0..total {
        let epoch = step / per_epoch;
        if step % per_epoch == 0 {
            order = (0..data.train.len()).collect();
            order.shuffle(&mut stream(config.seeds.order, "order", epoch));
        }
        let started = Instant::now();
        let at = (step % per_epoch) as usize * config.batch;
        let indices = &order[at..at + config.batch];
        let mut x = Vec::with_capacity(indices.len() * len);
        indices.iter().for_each(|&i| x.extend_from_slice(&data.train.x[i * len..(i + 1) * len]));
        let labels: Vec<u32> = indices.iter().map(|&i| data.train.y[i]).collect();
        if config.augment_shift > 0 && data.name.is_image() {
            shift_images(
                &mut x,
                &data.example_shape,
                config.augment_shift,
                stream(config.seeds.augment, "augment", step),
            );
        }
        // A rank takes its share on the host: only that much crosses to its device.
        let rows = match &dp {
            Some(dp) => dp.share(config.batch)?,
            None => 0..config.batch,
        };
        x.truncate(rows.end * len);
        x.drain(..rows.start * len);
        let mut shape = vec![rows.len()];
        shape.extend(&data.example_shape);
        let x = Tensor::from_vec(x, shape, &Device::Cpu)?.to_device(device)?;
        let targets = one_hot(&labels[rows], data.classes, device)?;

        let mut s = recorder.step(step);
        // A planted fault in the data: training sees, and the trace records, the moved value.
        let (x, targets) = (s.perturbed("x", &x)?, s.perturbed("targets", &targets)?);
        s.record_as("x", TensorKind::Input, Some(Phase::Forward), &[], &x)?;
        s.record_as("targets", TensorKind::Input, Some(Phase::Forward), &[], &targets)?;
        for (name, var) in &params.trainable {
            let value = s.perturbed(name, var.as_tensor())?;
            if value.id() != var.as_tensor().id() {
                var.set(&value.detach())?;
            }
        }
        // Read on the device before the optimizer updates them in place: no copy of each.
        let weights = params.trainable.iter().map(|(name, var)| (name.as_str(), var));
        s.record_variables(weights, "", TensorKind::Weight, Some(Phase::Forward))?;
        let mut ctx = Ctx {
            rec: &mut s,
            reductions: config.reductions,
            training: true,
            seeds: config.seeds,
            step,
            dropout: config.dropout,
        };
        let logits = model.forward(&mut ctx, &Node { t: x, name: "x".into() })?;
        let logits = ctx.rec.op_as("predictions", TensorKind::Prediction, &[&logits.name], logits.t)?;
        let logits = ctx.rec.probe("predictions", &logits)?;
        let targets = Node { t: targets, name: "targets".into() };
        let loss = cross_entropy(&mut ctx, &Node { t: logits, name: "predictions".into() }, &targets)?;
        let mut grads = loss.t.backward()?;
        s.record_probed_gradients(&[("predictions", &["loss.log_likelihood", "loss.sum", "loss"])])?;
        // Computed from the gradient at the predictions, back through the forward pass that
        // produced them.
        let inputs = ["predictions.grad", "predictions"];
        let mut parameter_grads = Vec::with_capacity(params.trainable.len());
        for (name, var) in &params.trainable {
            let grad = grads
                .get(var)
                .ok_or_else(|| RecordError::Unsupported(format!("parameter `{name}` does not affect the loss")))?;
            let grad_name = format!("{name}.grad");
            let grad = s.perturbed(&grad_name, grad)?;
            if dp.is_none() {
                s.record_as(&grad_name, TensorKind::Gradient, Some(Phase::Backward), &inputs, &grad)?;
            }
            parameter_grads.push((grad_name, grad));
        }
        if let Some(dp) = dp.as_deref_mut() {
            let gradients: Vec<Gradient> =
                parameter_grads.iter().map(|(name, value)| Gradient { name, inputs: &inputs, value }).collect();
            for ((_, var), sum) in params.trainable.iter().zip(dp.average(&mut s, &gradients)?) {
                grads.insert(var.as_tensor(), sum);
            }
        }
        opt.step(&grads)?;
        s.finish()?;
        if time_steps || step + 1 == total {
            final_loss = loss.t.to_scalar::<f32>()?;
        }
        if time_steps {
            device.synchronize()?;
            if step > 0 {
                step_times.push(started.elapsed());
            }
        }
    }

    let predictions = predict(&model, config, &data.test, &data.example_shape, device)?;
    let state = params.state()?;
    Ok(TrainOutcome {
        steps: total,
        predictions,
        labels: data.test.y.clone(),
        classes: data.classes,
        state,
        final_loss,
        step_times,
    })
}

/// Predicted classes of the test split by a model of `config` holding `state` (trained
/// anywhere), evaluated on `device`.
pub fn evaluate(
    config: &ClassifierConfig,
    data: &Dataset,
    device: &Device,
    state: &ModelState,
) -> Result<Vec<u32>, RecordError> {
    let mut params = ParamStore::new(config.seeds.init, device);
    let model =
        Model::new(config.model, &mut params, &data.example_shape, data.classes, config.batch_norm, config.width)?;
    params.load(state)?;
    predict(&model, config, &data.test, &data.example_shape, device)
}

/// Evaluation batch size.
const EVAL_BATCH: usize = 500;

/// Predicted classes of `split`, in evaluation mode.
fn predict(
    model: &Model,
    config: &ClassifierConfig,
    split: &Split,
    example_shape: &[usize],
    device: &Device,
) -> Result<Vec<u32>, RecordError> {
    let len: usize = example_shape.iter().product();
    let mut discard = Recorder::discard();
    let mut predictions = Vec::with_capacity(split.len());
    for (i, chunk) in split.x.chunks(EVAL_BATCH * len).enumerate() {
        let mut shape = vec![chunk.len() / len];
        shape.extend(example_shape);
        let x = Tensor::from_vec(chunk.to_vec(), shape, &Device::Cpu)?.to_device(device)?;
        let mut s = discard.step(i as u64);
        let mut ctx = Ctx {
            rec: &mut s,
            reductions: config.reductions,
            training: false,
            seeds: config.seeds,
            step: 0,
            dropout: 0.0,
        };
        let logits = model.forward(&mut ctx, &Node { t: x, name: "x".into() })?;
        predictions.extend(logits.t.argmax(D::Minus1)?.to_vec1::<u32>()?);
        s.finish()?;
    }
    Ok(predictions)
}

/// Shifts each image of `x` (row-major examples of `shape` `[c, h, w]`) by a random offset of
/// up to `max` pixels in each direction, filling with zeros.
fn shift_images(x: &mut [f32], shape: &[usize], max: usize, mut rng: impl rand::Rng) {
    let &[c, h, w] = shape else { return };
    let span = 2 * max as i64 + 1;
    let mut out = vec![0.0f32; c * h * w];
    for image in x.chunks_mut(c * h * w) {
        let dy = rng.random_range(0..span) - max as i64;
        let dx = rng.random_range(0..span) - max as i64;
        out.iter_mut().for_each(|v| *v = 0.0);
        for ch in 0..c {
            for i in 0..h as i64 {
                for j in 0..w as i64 {
                    let (si, sj) = (i - dy, j - dx);
                    if (0..h as i64).contains(&si) && (0..w as i64).contains(&sj) {
                        out[ch * h * w + (i as usize) * w + j as usize] =
                            image[ch * h * w + si as usize * w + sj as usize];
                    }
                }
            }
        }
        image.copy_from_slice(&out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quick(model: ModelKind) -> (ClassifierConfig, Dataset) {
        let mut config = ClassifierConfig::defaults(model);
        config.examples = Some(64);
        config.epochs = 1;
        config.batch = 16;
        config.width = 4;
        let data = Dataset::load(config.dataset, 0, config.examples).unwrap();
        (config, data)
    }

    fn run(config: &ClassifierConfig, data: &Dataset) -> TrainOutcome {
        train(config, data, &Device::Cpu, &mut Recorder::discard()).unwrap()
    }

    #[test]
    fn every_model_trains_in_every_mode_and_ordered_runs_repeat() {
        for model in [ModelKind::Mlp, ModelKind::Cnn, ModelKind::ResNet18] {
            for reductions in [Reductions::Candle, Reductions::Ordered, Reductions::Atomic] {
                let (mut config, data) = quick(model);
                config.reductions = reductions;
                config.batch_norm = true;
                let a = run(&config, &data);
                assert_eq!(a.steps, 4, "{model} {reductions}");
                assert_eq!(a.predictions.len(), 64);
                assert!(a.final_loss.is_finite(), "{model} {reductions}: loss {}", a.final_loss);
                if reductions != Reductions::Atomic {
                    let b = run(&config, &data);
                    assert_eq!(a.state.weights, b.state.weights, "{model} {reductions}: same seeds, different weights");
                }
            }
        }
    }

    #[test]
    fn each_source_of_randomness_has_a_seed_that_changes_the_run() {
        let (mut config, data) = quick(ModelKind::Cnn);
        config.dropout = 0.3;
        let base = run(&config, &data);
        for vary in ["init", "order", "augment", "dropout"] {
            let mut c = config.clone();
            match vary {
                "init" => c.seeds.init = 9,
                "order" => c.seeds.order = 9,
                "augment" => c.seeds.augment = 9,
                _ => c.seeds.dropout = 9,
            }
            assert_ne!(run(&c, &data).state.weights, base.state.weights, "changing the {vary} seed changed nothing");
        }
    }

    #[test]
    fn chunked_ordered_training_matches_plain_training_closely() {
        let (mut config, data) = quick(ModelKind::Cnn);
        config.batch_norm = true;
        let plain = run(&config, &data);
        config.reductions = Reductions::Ordered;
        let chunked = run(&config, &data);
        let max_diff =
            plain.state.weights.iter().zip(&chunked.state.weights).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(max_diff < 1e-3, "ordered chunked training drifted from plain training by {max_diff}");
    }

    #[test]
    fn a_trained_state_evaluates_the_same_in_a_fresh_model() {
        let (mut config, data) = quick(ModelKind::Cnn);
        config.batch_norm = true;
        let trained = run(&config, &data);
        assert!(!trained.state.buffers.is_empty(), "batch norm keeps running statistics");
        let again = evaluate(&config, &data, &Device::Cpu, &trained.state).unwrap();
        assert_eq!(again, trained.predictions);
        let mut short = trained.state.clone();
        short.weights.pop();
        let err = evaluate(&config, &data, &Device::Cpu, &short).unwrap_err().to_string();
        assert!(err.contains("too short"), "{err}");
    }

    #[test]
    fn shifts_move_pixels_and_fill_with_zeros() {
        let mut x: Vec<f32> = (1..=9).map(|v| v as f32).collect();
        shift_images(&mut x, &[1, 3, 3], 1, stream(0, "augment", 0));
        let nonzero: Vec<f32> = x.iter().copied().filter(|&v| v != 0.0).collect();
        assert!(nonzero.windows(2).all(|w| w[0] < w[1]), "pixels keep their order: {x:?}");
        assert!(nonzero.len() >= 4, "at most one row and one column fall off: {x:?}");
    }
}
