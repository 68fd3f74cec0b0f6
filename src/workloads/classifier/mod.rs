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
use crate::workloads::settings::{self, Settings};
use crate::workloads::{Training, WorkloadError, WorkloadKind};
use candle_core::{Device, Tensor, D};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use layers::{cross_entropy, one_hot, Ctx, Node, ParamStore};
use models::Model;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// A classifier training run's settings. Each field is a setting of its trace header by name,
/// read back by `Workload::from_run_config` and given on the command line by the option of the
/// same name or the one `Settings::OPTIONS` names (`workloads::settings`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassifierConfig {
    /// Architecture: the header's workload.
    #[serde(skip)]
    pub model: ModelKind,
    /// Dataset.
    pub dataset: DatasetName,
    /// Seed that generates the synthetic datasets (ignored for digits).
    pub dataset_seed: u64,
    /// Use at most this many training and test examples (`all` in a header where not limited).
    #[serde(with = "all_or_count")]
    pub examples: Option<usize>,
    /// Passes over the training data.
    pub epochs: u64,
    /// Stop after this many steps (default: all epochs). The header's own `steps` are the steps
    /// the run trains, all epochs' or fewer.
    #[serde(skip)]
    pub max_steps: Option<u64>,
    /// Examples per batch (a last incomplete batch of an epoch is skipped).
    pub batch: usize,
    /// Adam learning rate.
    pub lr: f64,
    /// Seed of the initial weights.
    pub init_seed: u64,
    /// Seed of the order of the training examples (where not given: the initial weights').
    pub order_seed: u64,
    /// Seed of the random shifts of training images (where not given: the initial weights').
    pub augment_seed: u64,
    /// Seed of the dropout masks (where not given: the initial weights').
    pub dropout_seed: u64,
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

/// What a classifier's header holds beyond its fields (`workloads::settings`).
impl Settings for ClassifierConfig {
    // Where a seed is not given, its source of randomness takes the initial weights' seed.
    const FOLLOWS: &'static [(&'static str, &'static str)] =
        &[("order_seed", "init_seed"), ("augment_seed", "init_seed"), ("dropout_seed", "init_seed")];
    // Every workload's --seed seeds a classifier's initial weights, and --data-seed its dataset.
    const OPTIONS: &'static [(&'static str, &'static str)] = &[("seed", "init_seed"), ("data-seed", "dataset_seed")];
}

/// A limit on the examples as a header writes it: a count, or `all`.
mod all_or_count {
    use serde::{de, Deserialize, Deserializer, Serializer};

    /// The count, or `all`.
    pub fn serialize<S: Serializer>(examples: &Option<usize>, s: S) -> Result<S::Ok, S::Error> {
        match examples {
            Some(n) => s.collect_str(n),
            None => s.serialize_str("all"),
        }
    }

    /// No limit for `all`, else the count.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
        match String::deserialize(d)?.as_str() {
            "all" => Ok(None),
            n => n.parse().map(Some).map_err(de::Error::custom),
        }
    }
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
            self.model, self.dataset, self.reductions, self.batch, self.init_seed
        )
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
            init_seed: 0,
            order_seed: 0,
            augment_seed: 0,
            dropout_seed: 0,
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

    /// The run configuration written to a trace header: its steps are the ones the run trains.
    pub fn run_config(&self) -> RunConfig {
        let steps = self.total_steps(self.dataset.train_len(self.examples));
        settings::run_config(self, WorkloadKind::from_classifier(self.model), steps)
    }

    /// The seeds of the algorithmic randomness.
    pub fn seeds(&self) -> Seeds {
        Seeds { init: self.init_seed, order: self.order_seed, augment: self.augment_seed, dropout: self.dropout_seed }
    }

    /// These settings with other seeds: a study's run with other initial weights, data order,
    /// augmentation or dropout.
    pub fn with_seeds(self, seeds: Seeds) -> Self {
        let Seeds { init, order, augment, dropout } = seeds;
        ClassifierConfig { init_seed: init, order_seed: order, augment_seed: augment, dropout_seed: dropout, ..self }
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
    let mut params = ParamStore::new(config.init_seed, device);
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
            order.shuffle(&mut stream(config.order_seed, "order", epoch));
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
                stream(config.augment_seed, "augment", step),
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
            seeds: config.seeds(),
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
    let mut params = ParamStore::new(config.init_seed, device);
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
            seeds: config.seeds(),
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
                "init" => c.init_seed = 9,
                "order" => c.order_seed = 9,
                "augment" => c.augment_seed = 9,
                _ => c.dropout_seed = 9,
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
