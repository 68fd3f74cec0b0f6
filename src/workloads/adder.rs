//! The adder: a linear model with `features` inputs learning to output their sum (weights 1,
//! bias 0), trained with MSE and plain SGD. The smallest workload that shows how reduction order
//! makes training diverge.
//!
//! Two formulations compute the same function:
//! - `reduce`: predictions `x·w + b` with the bias broadcast, loss `mean((pred - y)^2)`; the
//!   loss and the bias gradient are reductions over the batch.
//! - `matmul`: every reduction written as a matrix product (`[x·w, 1]·[1; b]`, and the loss as
//!   `(pred - y)^2 · 1 / batch`), the formulation that stays deterministic where reductions
//!   are not.

use super::seeded::{stream, uniform_vec};
use crate::ops::{expand, sum_all, Reductions};
use crate::record::{Perturbation, RecordError, StepRecorder};
use crate::trace::{Phase, RunConfig, TensorKind};
use crate::workloads::settings::{self, Settings};
use crate::workloads::{Training, WorkloadError, WorkloadKind};
use candle_core::{DType, Device, Tensor, Var};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// How the adder writes its reductions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Formulation {
    /// Sums and means (candle reductions).
    Reduce,
    /// Matrix products only.
    Matmul,
}

impl fmt::Display for Formulation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Formulation::Reduce => "reduce",
            Formulation::Matmul => "matmul",
        })
    }
}

impl FromStr for Formulation {
    type Err = RecordError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "reduce" => Ok(Formulation::Reduce),
            "matmul" => Ok(Formulation::Matmul),
            _ => Err(RecordError::Unsupported(format!("unknown formulation `{s}`: expected reduce or matmul"))),
        }
    }
}

/// The adder's settings. Each field is a setting of its trace header by name, read back by
/// `Workload::from_run_config` and given on the command line by the option of the same name
/// (`workloads::settings`): a setting is its field, its default here, and its option.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdderConfig {
    /// Seed of the initial weights.
    pub seed: u64,
    /// Seed of the training data; where a command line or a header gives none, the seed's
    /// value (`Settings::FOLLOWS`).
    pub data_seed: u64,
    /// Training steps (one batch each): the header's own `steps`.
    #[serde(skip)]
    pub steps: u64,
    /// Examples per batch.
    pub batch: usize,
    /// Input features.
    pub features: usize,
    /// SGD learning rate.
    pub lr: f64,
    /// How reductions are written.
    pub formulation: Formulation,
    /// How the `reduce` formulation's sums accumulate (the loss over the batch, and the bias
    /// gradient). The `matmul` formulation has no reductions to change.
    pub reductions: Reductions,
}

impl Default for AdderConfig {
    fn default() -> Self {
        AdderConfig {
            seed: 0,
            data_seed: 0,
            steps: 1000,
            batch: 10_000,
            features: 10,
            lr: 0.01,
            formulation: Formulation::Reduce,
            reductions: Reductions::Candle,
        }
    }
}

/// What the adder's header holds beyond its fields (`workloads::settings`).
impl Settings for AdderConfig {
    // Where no data seed is given, the data takes the weights' seed.
    const FOLLOWS: &'static [(&'static str, &'static str)] = &[("data_seed", "seed")];
    // The adder records its only element type: its header says so, and one of another type is
    // refused.
    const FIXED: &'static [(&'static str, &'static str)] = &[("dtype", "F32")];
}

impl AdderConfig {
    /// One line saying what is trained, for progress messages.
    pub fn describe(&self) -> String {
        format!(
            "adder (seed {}, {} steps, batch {}, {} formulation, {} reductions)",
            self.seed, self.steps, self.batch, self.formulation, self.reductions
        )
    }

    /// The run configuration written to the trace header: every setting by its field's name,
    /// its text as `{}` writes it, the element type besides, and the steps as the header's own.
    ///
    /// ```
    /// let run = repro::workloads::AdderConfig { lr: 1e-7, ..Default::default() }.run_config();
    /// let params: Vec<String> = run.params.iter().map(|(key, value)| format!("{key}={value}")).collect();
    /// assert_eq!(
    ///     params,
    ///     [
    ///         "batch=10000", "data_seed=0", "dtype=F32", "features=10", "formulation=reduce",
    ///         "lr=0.0000001", "reductions=candle", "seed=0",
    ///     ]
    /// );
    /// assert_eq!((run.workload.as_str(), run.steps), ("adder", Some(1000)));
    /// ```
    pub fn run_config(&self) -> RunConfig {
        settings::run_config(self, WorkloadKind::Adder, self.steps)
    }

    /// One batch: features uniform in [0, 1), labels their sum (computed in f64, rounded once).
    fn batch_data(&self, step: u64, device: &Device) -> Result<(Tensor, Tensor), RecordError> {
        let mut rng = stream(self.data_seed, "adder.data", step);
        let x = uniform_vec(&mut rng, self.batch * self.features, 0.0, 1.0);
        let y: Vec<f32> =
            x.chunks(self.features).map(|row| row.iter().map(|&v| v as f64).sum::<f64>() as f32).collect();
        let x = Tensor::from_vec(x, (self.batch, self.features), &Device::Cpu)?.to_device(device)?;
        let y = Tensor::from_vec(y, self.batch, &Device::Cpu)?.to_device(device)?;
        Ok((x, y))
    }

    /// Names of the tensors recorded each step, in recording (execution) order.
    pub fn tensor_names(&self) -> Vec<&'static str> {
        let forward: &[&str] = match self.formulation {
            Formulation::Reduce => {
                &["linear.matmul", "linear.bias", "predictions", "loss.diff", "loss.square", "loss.sum"]
            }
            Formulation::Matmul => &[
                "linear.matmul",
                "linear.concat",
                "linear.bias_column",
                "predictions",
                "loss.diff",
                "loss.square",
                "loss.sum",
            ],
        };
        let mut names = vec!["x", "y", "weight", "bias"];
        names.extend_from_slice(forward);
        names.extend(["loss", "predictions.grad", "weight.grad", "bias.grad", "weight.updated", "bias.updated"]);
        names
    }

    /// The forward pass, every op recorded with its inputs; returns the predictions and the loss.
    fn forward(
        &self,
        s: &mut StepRecorder,
        x: &Tensor,
        y: &Tensor,
        w: &Tensor,
        b: &Tensor,
    ) -> Result<(Tensor, Tensor), RecordError> {
        let xw = s.op("linear.matmul", &["x", "weight"], x.matmul(w)?)?; // [batch, 1]
        let pred = match self.formulation {
            Formulation::Reduce => {
                let bias = s.op("linear.bias", &["bias"], expand(b, self.batch, self.reductions)?)?;
                s.op_as(
                    "predictions",
                    TensorKind::Prediction,
                    &["linear.matmul", "linear.bias"],
                    (xw.squeeze(1)? + bias)?,
                )?
            }
            Formulation::Matmul => {
                let lhs = s.op("linear.concat", &["linear.matmul"], Tensor::cat(&[&xw, &xw.ones_like()?], 1)?)?; // [x·w, 1]
                let rhs =
                    s.op("linear.bias_column", &["bias"], Tensor::cat(&[&b.ones_like()?, b], 0)?.reshape((2, 1))?)?; // [1; b]
                s.op_as(
                    "predictions",
                    TensorKind::Prediction,
                    &["linear.concat", "linear.bias_column"],
                    lhs.matmul(&rhs)?.squeeze(1)?,
                )?
            }
        };
        // The probe hands backpropagation's gradient at the predictions to the recorder.
        let pred = s.probe("predictions", &pred)?;
        let diff = s.op("loss.diff", &["y", "predictions"], (y - &pred)?)?;
        let sq = s.op("loss.square", &["loss.diff"], diff.sqr()?)?;
        let total = match self.formulation {
            Formulation::Reduce => sum_all(&sq, self.reductions)?,
            Formulation::Matmul => {
                let ones = Tensor::ones((self.batch, 1), sq.dtype(), sq.device())?;
                sq.unsqueeze(0)?.matmul(&ones)?.reshape(())?
            }
        };
        let total = s.op("loss.sum", &["loss.square"], total)?;
        let loss = s.op_as("loss", TensorKind::Loss, &["loss.sum"], total.affine(1.0 / self.batch as f64, 0.0)?)?;
        Ok((pred, loss))
    }

    /// Checks the settings and the perturbation before anything is recorded.
    pub fn validate(&self, perturb: Option<&Perturbation>) -> Result<(), WorkloadError> {
        if self.batch == 0 || self.features == 0 || self.steps == 0 {
            return Err(WorkloadError::Invalid("the adder needs --steps, --batch and --features above 0".into()));
        }
        // A batch of inputs and a copy on its way to the device, in f32.
        let elements = (self.batch as u128).saturating_mul(self.features as u128);
        super::host_memory::check_fits("the adder's batch", elements, 8, "--batch or --features")?;
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(WorkloadError::Invalid(format!("--lr must be a positive number, not {}", self.lr)));
        }
        if self.formulation == Formulation::Matmul && self.reductions != Reductions::Candle {
            return Err(WorkloadError::Invalid(format!(
                "--reductions {} has no effect with --formulation matmul, which has no reductions; use --formulation reduce",
                self.reductions
            )));
        }
        if let Some(p) = perturb {
            let names = self.tensor_names();
            if !names.contains(&p.tensor.as_str()) {
                return Err(WorkloadError::Invalid(format!(
                    "the adder records no tensor `{}`; it records {}",
                    p.tensor,
                    names.join(", ")
                )));
            }
            if p.step >= self.steps {
                return Err(WorkloadError::Invalid(format!(
                    "cannot perturb step {}: the run has steps 0 to {}",
                    p.step,
                    self.steps - 1
                )));
            }
        }
        Ok(())
    }

    /// Trains and records every step into `recorder`, planting its perturbation if it has one.
    pub fn run(&self, training: Training<'_>) -> Result<(), RecordError> {
        let Training { device, recorder, .. } = training;
        self.validate(recorder.perturbation())?;
        let mut init = stream(self.seed, "adder.init", 0);
        let bound = (6.0 / (self.features + 1) as f64).sqrt();
        let w0 = uniform_vec(&mut init, self.features, -bound, bound);
        let w = Var::from_tensor(&Tensor::from_vec(w0, (self.features, 1), &Device::Cpu)?.to_device(device)?)?;
        let b = Var::from_tensor(&Tensor::zeros(1, DType::F32, device)?)?;

        for step in 0..self.steps {
            let (x, y) = self.batch_data(step, device)?;
            let mut s = recorder.step(step);
            // A planted fault in the data: training sees, and the trace records, the moved value.
            let (x, y) = (s.perturbed("x", &x)?, s.perturbed("y", &y)?);
            s.record_as("x", TensorKind::Input, Some(Phase::Forward), &[], &x)?;
            s.record_as("y", TensorKind::Input, Some(Phase::Forward), &[], &y)?;
            for (name, var) in [("weight", &w), ("bias", &b)] {
                let value = s.perturbed(name, var.as_tensor())?;
                if value.id() != var.as_tensor().id() {
                    var.set(&value.detach())?;
                }
                s.record_as(name, TensorKind::Weight, Some(Phase::Forward), &[], var.as_tensor())?;
            }
            let (_, loss) = self.forward(&mut s, &x, &y, w.as_tensor(), b.as_tensor())?;
            let grads = loss.backward()?;
            // The gradient at the predictions is computed from everything between them and the loss.
            s.record_probed_gradients(&[("predictions", &["loss.diff", "loss.square", "loss.sum", "loss"])])?;
            let missing = || RecordError::Unsupported("the loss does not depend on the parameters".into());
            let mut updates = Vec::new();
            for (name, var, inputs) in
                [("weight", &w, &["predictions.grad", "x"][..]), ("bias", &b, &["predictions.grad"][..])]
            {
                let grad_name = format!("{name}.grad");
                let grad = s.perturbed(&grad_name, grads.get(var).ok_or_else(missing)?)?;
                s.record_as(&grad_name, TensorKind::Gradient, Some(Phase::Backward), inputs, &grad)?;
                updates.push((name, var, grad));
            }
            for (name, var, grad) in updates {
                let updated_name = format!("{name}.updated");
                let updated = s.perturbed(&updated_name, &(var.as_tensor() - grad.affine(self.lr, 0.0)?)?)?;
                let grad_name = format!("{name}.grad");
                s.record_as(
                    &updated_name,
                    TensorKind::Weight,
                    Some(Phase::Update),
                    &[name, grad_name.as_str()],
                    &updated,
                )?;
                var.set(&updated.detach())?;
            }
            s.finish()?;
        }
        Ok(())
    }
}
