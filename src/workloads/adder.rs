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
use crate::record::{Perturbation, RecordError, Recorder};
use crate::trace::{RunConfig, TensorKind};
use candle_core::{DType, Device, Tensor, Var};
use std::collections::BTreeMap;
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
            _ => Err(RecordError::Unsupported(format!(
                "unknown formulation `{s}`: expected reduce or matmul"
            ))),
        }
    }
}

/// The adder's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct AdderConfig {
    /// Seed of the initial weights.
    pub seed: u64,
    /// Seed of the training data.
    pub data_seed: u64,
    /// Training steps (one batch each).
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

/// Names of the tensors the adder records each step, in recording order.
pub const ADDER_TENSORS: &[&str] = &["weight", "bias", "predictions", "loss", "weight.grad", "bias.grad"];

impl AdderConfig {
    /// The run configuration written to the trace header.
    pub fn run_config(&self) -> RunConfig {
        let params = BTreeMap::from([
            ("batch".to_string(), self.batch.to_string()),
            ("data_seed".to_string(), self.data_seed.to_string()),
            ("dtype".to_string(), "F32".to_string()),
            ("features".to_string(), self.features.to_string()),
            ("formulation".to_string(), self.formulation.to_string()),
            ("lr".to_string(), self.lr.to_string()),
            ("reductions".to_string(), self.reductions.to_string()),
            ("seed".to_string(), self.seed.to_string()),
        ]);
        RunConfig {
            workload: "adder".into(),
            steps: Some(self.steps),
            params,
        }
    }

    /// One batch: features uniform in [0, 1), labels their sum (computed in f64, rounded once).
    fn batch_data(&self, step: u64, device: &Device) -> Result<(Tensor, Tensor), RecordError> {
        let mut rng = stream(self.data_seed, "adder.data", step);
        let x = uniform_vec(&mut rng, self.batch * self.features, 0.0, 1.0);
        let y: Vec<f32> = x
            .chunks(self.features)
            .map(|row| row.iter().map(|&v| v as f64).sum::<f64>() as f32)
            .collect();
        let x = Tensor::from_vec(x, (self.batch, self.features), &Device::Cpu)?.to_device(device)?;
        let y = Tensor::from_vec(y, self.batch, &Device::Cpu)?.to_device(device)?;
        Ok((x, y))
    }

    fn predictions(&self, x: &Tensor, w: &Tensor, b: &Tensor) -> candle_core::Result<Tensor> {
        let xw = x.matmul(w)?; // [batch, 1]
        match self.formulation {
            Formulation::Reduce => xw.squeeze(1)? + expand(b, self.batch, self.reductions)?,
            Formulation::Matmul => {
                let ones = xw.ones_like()?;
                let lhs = Tensor::cat(&[&xw, &ones], 1)?; // [batch, 2]
                let rhs = Tensor::cat(&[&b.ones_like()?, b], 0)?.reshape((2, 1))?; // [1; b]
                lhs.matmul(&rhs)?.squeeze(1)
            }
        }
    }

    fn loss(&self, pred: &Tensor, y: &Tensor) -> candle_core::Result<Tensor> {
        let sq = (y - pred)?.sqr()?;
        match self.formulation {
            Formulation::Reduce => sum_all(&sq, self.reductions)?.affine(1.0 / self.batch as f64, 0.0),
            Formulation::Matmul => {
                let ones = Tensor::ones((self.batch, 1), sq.dtype(), sq.device())?;
                let total = sq.unsqueeze(0)?.matmul(&ones)?.reshape(())?;
                total.affine(1.0 / self.batch as f64, 0.0)
            }
        }
    }

    /// Checks the settings and the perturbation before anything is recorded.
    pub fn validate(&self, perturb: Option<&Perturbation>) -> Result<(), RecordError> {
        if self.batch == 0 || self.features == 0 || self.steps == 0 {
            return Err(RecordError::Unsupported(
                "the adder needs --steps, --batch and --features above 0".into(),
            ));
        }
        if let Some(p) = perturb {
            if !ADDER_TENSORS.contains(&p.tensor.as_str()) {
                return Err(RecordError::Unsupported(format!(
                    "the adder records no tensor `{}`; it records {}",
                    p.tensor,
                    ADDER_TENSORS.join(", ")
                )));
            }
            if p.step >= self.steps {
                return Err(RecordError::Unsupported(format!(
                    "cannot perturb step {}: the run has steps 0 to {}",
                    p.step,
                    self.steps - 1
                )));
            }
        }
        Ok(())
    }

    /// Trains and records every step into `recorder`, planting `perturb` if given.
    pub fn run(
        &self,
        device: &Device,
        recorder: &mut Recorder,
        perturb: Option<&Perturbation>,
    ) -> Result<(), RecordError> {
        self.validate(perturb)?;
        let mut init = stream(self.seed, "adder.init", 0);
        let bound = (6.0 / (self.features + 1) as f64).sqrt();
        let w0 = uniform_vec(&mut init, self.features, -bound, bound);
        let w = Var::from_tensor(&Tensor::from_vec(w0, (self.features, 1), &Device::Cpu)?.to_device(device)?)?;
        let b = Var::from_tensor(&Tensor::zeros(1, DType::F32, device)?)?;
        let nudge = |step: u64, name: &str, t: &Tensor| match perturb {
            Some(p) => p.apply(step, name, t),
            None => Ok(t.clone()),
        };

        for step in 0..self.steps {
            let (x, y) = self.batch_data(step, device)?;
            for (name, var) in [("weight", &w), ("bias", &b)] {
                if perturb.is_some_and(|p| p.step == step && p.tensor == name) {
                    var.set(&nudge(step, name, var.as_tensor())?.detach())?;
                }
            }
            let pred = nudge(
                step,
                "predictions",
                &self.predictions(&x, w.as_tensor(), b.as_tensor())?,
            )?;
            let loss = nudge(step, "loss", &self.loss(&pred, &y)?)?;
            let grads = loss.backward()?;
            let missing = || RecordError::Unsupported("the loss does not depend on the parameters".into());
            let gw = nudge(step, "weight.grad", grads.get(&w).ok_or_else(missing)?)?;
            let gb = nudge(step, "bias.grad", grads.get(&b).ok_or_else(missing)?)?;

            let mut s = recorder.step(step);
            s.record("weight", TensorKind::Weight, w.as_tensor())?;
            s.record("bias", TensorKind::Weight, b.as_tensor())?;
            s.record("predictions", TensorKind::Prediction, &pred)?;
            s.record("loss", TensorKind::Loss, &loss)?;
            s.record("weight.grad", TensorKind::Gradient, &gw)?;
            s.record("bias.grad", TensorKind::Gradient, &gb)?;
            s.finish()?;

            w.set(&(w.as_tensor() - gw.affine(self.lr, 0.0)?)?)?;
            b.set(&(b.as_tensor() - gb.affine(self.lr, 0.0)?)?)?;
        }
        Ok(())
    }
}
