//! The classifiers' layers, written so that every reduction over the batch goes through
//! `Reductions`: bias and batch-norm parameter gradients, batch-norm statistics, the loss, and
//! the accumulation of weight gradients over the batch.
//!
//! Weight gradients: in the `atomic` and `ordered` modes a training batch is split into
//! `CHUNKS` chunks and every weight is replicated per chunk (`expand_rows`); each chunk's
//! partial weight gradient is then summed over the chunks by `sum_rows`, with float atomics or a
//! fixed order. This is how split-K matrix products and cuDNN's non-deterministic
//! backward-filter algorithms accumulate partial products. In `candle` mode layers are plain
//! candle ops.
//!
//! Each layer output is recorded as an op with the names of its inputs, so `repro diff` can
//! name the first layer whose output changed.

use super::{ModelState, Seeds};
use crate::ops::{expand_rows, sum_all, sum_rows, Reductions};
use crate::record::{RecordError, StepRecorder};
use crate::trace::TensorKind;
use crate::workloads::seeded::{stream, uniform_vec, unit_f32};
use candle_core::{Device, Tensor, Var, D};

/// Chunks a training batch is split into for weight-gradient accumulation (atomic and ordered).
pub const CHUNKS: usize = 4;

/// A recorded tensor and the name it was recorded under.
#[derive(Clone)]
pub struct Node {
    /// The value.
    pub t: Tensor,
    /// Its name in the trace.
    pub name: String,
}

/// What a forward pass needs besides the parameters.
pub struct Ctx<'r, 'a> {
    /// Where op outputs are recorded (a discarding recorder when nothing is recorded).
    pub rec: &'r mut StepRecorder<'a>,
    /// How batch reductions accumulate.
    pub reductions: Reductions,
    /// Training (batch statistics, dropout, chunked weights) or evaluation.
    pub training: bool,
    /// Seeds of the stochastic layers.
    pub seeds: Seeds,
    /// Training step, for the dropout masks.
    pub step: u64,
    /// Dropout probability.
    pub dropout: f64,
}

impl Ctx<'_, '_> {
    /// Records `t` as the output of op `name` computed from `inputs`.
    pub fn op(&mut self, name: &str, inputs: &[&str], t: Tensor) -> Result<Node, RecordError> {
        let t = self.rec.op(name, inputs, t)?;
        Ok(Node { t, name: name.to_string() })
    }

    /// Chunks the batch is split into for weight gradients.
    fn chunks(&self) -> usize {
        if self.training && self.reductions != Reductions::Candle {
            CHUNKS
        } else {
            1
        }
    }

    /// `w` once per batch chunk, replicated so that the chunks' gradients meet in `sum_rows`.
    fn per_chunk(&self, w: &Tensor, chunks: usize) -> Result<Vec<Tensor>, RecordError> {
        if chunks == 1 {
            return Ok(vec![w.clone()]);
        }
        let stack = expand_rows(&w.flatten_all()?, chunks, self.reductions)?;
        Ok((0..chunks).map(|k| stack.get(k)?.reshape(w.shape())).collect::<candle_core::Result<_>>()?)
    }

    /// `f(chunk, weight)` over the batch chunks, concatenated back into one batch.
    fn chunked(
        &self,
        x: &Tensor,
        w: &Tensor,
        f: impl Fn(&Tensor, &Tensor) -> candle_core::Result<Tensor>,
    ) -> Result<Tensor, RecordError> {
        let xs = x.chunk(self.chunks().min(x.dim(0)?), 0)?;
        let ws = self.per_chunk(w, xs.len())?;
        let ys = xs.iter().zip(&ws).map(|(x, w)| f(x, w)).collect::<candle_core::Result<Vec<_>>>()?;
        Ok(if ys.len() == 1 { ys.into_iter().next().expect("one chunk") } else { Tensor::cat(&ys, 0)? })
    }

    /// `rows` (a `[m, c]` matrix) plus `v` (a `[c]` vector) on every row.
    fn add_rows(&self, rows: &Tensor, v: &Tensor) -> Result<Tensor, RecordError> {
        Ok(rows.broadcast_add(&expand_rows(v, rows.dim(0)?, self.reductions)?)?)
    }
}

/// Creates parameters with seeded values, in a fixed order, and keeps the list.
pub struct ParamStore {
    seed: u64,
    device: Device,
    /// Trainable parameters in creation order.
    pub trainable: Vec<(String, Var)>,
    /// State that is not trained but needed for evaluation (batch-norm running statistics), in
    /// creation order.
    pub buffers: Vec<Var>,
}

impl ParamStore {
    /// An empty store; values come from `stream(seed, "init", index)`.
    pub fn new(seed: u64, device: &Device) -> Self {
        ParamStore { seed, device: device.clone(), trainable: Vec::new(), buffers: Vec::new() }
    }

    fn add(&mut self, name: String, values: Vec<f32>, shape: &[usize]) -> Result<Var, RecordError> {
        let t = Tensor::from_vec(values, shape, &Device::Cpu)?.to_device(&self.device)?;
        let var = Var::from_tensor(&t)?;
        self.trainable.push((name, var.clone()));
        Ok(var)
    }

    /// A weight with He-uniform values for `fan_in` inputs.
    fn weight(&mut self, name: String, shape: &[usize], fan_in: usize) -> Result<Var, RecordError> {
        let mut rng = stream(self.seed, "init", self.trainable.len() as u64);
        let bound = (6.0 / fan_in as f64).sqrt();
        let values = uniform_vec(&mut rng, shape.iter().product(), -bound, bound);
        self.add(name, values, shape)
    }

    fn constant(&mut self, name: String, len: usize, value: f32) -> Result<Var, RecordError> {
        self.add(name, vec![value; len], &[len])
    }

    fn buffer(&mut self, len: usize, value: f32) -> Result<Var, RecordError> {
        let var = Var::from_tensor(&Tensor::full(value, len, &self.device)?)?;
        self.buffers.push(var.clone());
        Ok(var)
    }

    /// Every trainable parameter, then every buffer, flattened and concatenated.
    pub fn state(&self) -> Result<ModelState, RecordError> {
        let flat = |vars: &mut dyn Iterator<Item = &Var>| -> Result<Vec<f32>, RecordError> {
            let mut out = Vec::new();
            for v in vars {
                out.extend(v.as_tensor().flatten_all()?.to_vec1::<f32>()?);
            }
            Ok(out)
        };
        Ok(ModelState {
            weights: flat(&mut self.trainable.iter().map(|(_, v)| v))?,
            buffers: flat(&mut self.buffers.iter())?,
        })
    }

    /// Sets every parameter and buffer from `state` (as `state()` returns it).
    pub fn load(&self, state: &ModelState) -> Result<(), RecordError> {
        let load = |vars: &mut dyn Iterator<Item = &Var>, values: &[f32], what: &str| -> Result<(), RecordError> {
            let mut at = 0;
            for v in vars {
                let n = v.as_tensor().elem_count();
                let part = values.get(at..at + n).ok_or_else(|| {
                    RecordError::Unsupported(format!("the saved {what} are too short for this model"))
                })?;
                v.set(&Tensor::from_slice(part, v.as_tensor().shape(), &Device::Cpu)?.to_device(&self.device)?)?;
                at += n;
            }
            if at != values.len() {
                return Err(RecordError::Unsupported(format!("the saved {what} are too long for this model")));
            }
            Ok(())
        };
        load(&mut self.trainable.iter().map(|(_, v)| v), &state.weights, "weights")?;
        load(&mut self.buffers.iter(), &state.buffers, "buffers")
    }
}

/// A fully connected layer.
pub struct Linear {
    name: String,
    w: Var,
    b: Var,
}

impl Linear {
    /// `inputs → outputs`, parameters `NAME.weight` `[outputs, inputs]` and `NAME.bias`.
    pub fn new(p: &mut ParamStore, name: &str, inputs: usize, outputs: usize) -> Result<Self, RecordError> {
        let w = p.weight(format!("{name}.weight"), &[outputs, inputs], inputs)?;
        let b = p.constant(format!("{name}.bias"), outputs, 0.0)?;
        Ok(Linear { name: name.into(), w, b })
    }

    /// `x·wᵀ + b` for `x` of shape `[batch, inputs]`.
    pub fn forward(&self, ctx: &mut Ctx, x: &Node) -> Result<Node, RecordError> {
        let y = ctx.chunked(&x.t, self.w.as_tensor(), |x, w| x.matmul(&w.t()?))?;
        let y = match ctx.reductions {
            Reductions::Candle => y.broadcast_add(self.b.as_tensor())?,
            _ => ctx.add_rows(&y, self.b.as_tensor())?,
        };
        let (w, b) = (format!("{}.weight", self.name), format!("{}.bias", self.name));
        ctx.op(&self.name, &[&x.name, &w, &b], y)
    }
}

/// A 2-D convolution (square kernel), with a bias unless batch norm follows.
pub struct Conv {
    name: String,
    w: Var,
    b: Option<Var>,
    stride: usize,
    padding: usize,
}

impl Conv {
    /// `cin → cout` channels, `k×k` kernel.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        p: &mut ParamStore,
        name: &str,
        cin: usize,
        cout: usize,
        k: usize,
        stride: usize,
        padding: usize,
        bias: bool,
    ) -> Result<Self, RecordError> {
        let w = p.weight(format!("{name}.weight"), &[cout, cin, k, k], cin * k * k)?;
        let b = if bias { Some(p.constant(format!("{name}.bias"), cout, 0.0)?) } else { None };
        Ok(Conv { name: name.into(), w, b, stride, padding })
    }

    /// The convolution of `x` (`[batch, cin, h, w]`).
    pub fn forward(&self, ctx: &mut Ctx, x: &Node) -> Result<Node, RecordError> {
        let (stride, padding) = (self.stride, self.padding);
        let mut y = ctx.chunked(&x.t, self.w.as_tensor(), |x, w| x.conv2d(w, padding, stride, 1, 1))?;
        let w = format!("{}.weight", self.name);
        let mut inputs = vec![x.name.as_str(), w.as_str()];
        let b_name = format!("{}.bias", self.name);
        if let Some(b) = &self.b {
            y = per_channel(
                ctx,
                &y,
                |ctx, rows| ctx.add_rows(rows, b.as_tensor()),
                |y| Ok(y.broadcast_add(&b.as_tensor().reshape((1, (), 1, 1))?)?),
            )?;
            inputs.push(&b_name);
        }
        ctx.op(&self.name, &inputs, y)
    }
}

/// Applies a per-channel operation to `x` (`[n, c, h, w]`): in `candle` mode `plain` on the
/// tensor as it is; otherwise `rows` on its `[n·h·w, c]` channels-last matrix, so the
/// operation's batch reductions go through `Reductions`.
fn per_channel(
    ctx: &mut Ctx,
    x: &Tensor,
    rows: impl FnOnce(&mut Ctx, &Tensor) -> Result<Tensor, RecordError>,
    plain: impl FnOnce(&Tensor) -> Result<Tensor, RecordError>,
) -> Result<Tensor, RecordError> {
    if ctx.reductions == Reductions::Candle {
        return plain(x);
    }
    let (n, c, h, w) = x.dims4()?;
    let m = x.permute((0, 2, 3, 1))?.contiguous()?.reshape((n * h * w, c))?;
    Ok(rows(ctx, &m)?.reshape((n, h, w, c))?.permute((0, 3, 1, 2))?.contiguous()?)
}

/// Batch normalization over the channels of `[n, c, h, w]` activations (momentum 0.1, ε 1e-5).
pub struct BatchNorm {
    name: String,
    gamma: Var,
    beta: Var,
    running_mean: Var,
    running_var: Var,
}

const BN_EPS: f64 = 1e-5;
const BN_MOMENTUM: f64 = 0.1;

impl BatchNorm {
    /// `channels` channels: parameters `NAME.gamma` and `NAME.beta`.
    pub fn new(p: &mut ParamStore, name: &str, channels: usize) -> Result<Self, RecordError> {
        Ok(BatchNorm {
            name: name.into(),
            gamma: p.constant(format!("{name}.gamma"), channels, 1.0)?,
            beta: p.constant(format!("{name}.beta"), channels, 0.0)?,
            running_mean: p.buffer(channels, 0.0)?,
            running_var: p.buffer(channels, 1.0)?,
        })
    }

    /// Normalizes with the batch's statistics (training) or the running ones (evaluation).
    pub fn forward(&self, ctx: &mut Ctx, x: &Node) -> Result<Node, RecordError> {
        let y = if ctx.training { self.train(ctx, &x.t)? } else { self.eval(&x.t)? };
        let (g, b) = (format!("{}.gamma", self.name), format!("{}.beta", self.name));
        ctx.op(&self.name, &[&x.name, &g, &b], y)
    }

    fn train(&self, ctx: &mut Ctx, x: &Tensor) -> Result<Tensor, RecordError> {
        let (n, c, h, w) = x.dims4()?;
        let m = n * h * w;
        // Channels-last rows in every mode, so the statistics are column sums.
        let rows = x.permute((0, 2, 3, 1))?.contiguous()?.reshape((m, c))?;
        let mode = ctx.reductions;
        let expand = |v: &Tensor| expand_rows(v, m, mode);
        let mean = (sum_rows(&rows, mode)? / m as f64)?;
        let centered = rows.broadcast_sub(&expand(&mean)?)?;
        let var = (sum_rows(&centered.sqr()?, mode)? / m as f64)?;
        let inv_std = (var.clone() + BN_EPS)?.sqrt()?.recip()?;
        let normalized = centered.broadcast_mul(&expand(&inv_std)?)?;
        let y = normalized
            .broadcast_mul(&expand(self.gamma.as_tensor())?)?
            .broadcast_add(&expand(self.beta.as_tensor())?)?;
        let unbiased = (var.detach() * (m as f64 / (m.max(2) - 1) as f64))?;
        let update = |running: &Var, batch: &Tensor| -> Result<(), RecordError> {
            let next = ((running.as_tensor() * (1.0 - BN_MOMENTUM))? + (batch * BN_MOMENTUM)?)?;
            Ok(running.set(&next)?)
        };
        update(&self.running_mean, &mean.detach())?;
        update(&self.running_var, &unbiased)?;
        Ok(y.reshape((n, h, w, c))?.permute((0, 3, 1, 2))?.contiguous()?)
    }

    fn eval(&self, x: &Tensor) -> Result<Tensor, RecordError> {
        let channel = |v: &Tensor| v.reshape((1, (), 1, 1));
        let inv_std = (self.running_var.as_tensor() + BN_EPS)?.sqrt()?.recip()?;
        let scale = (inv_std * self.gamma.as_tensor())?;
        let shift = (self.beta.as_tensor() - (self.running_mean.as_tensor() * &scale)?)?;
        Ok(x.broadcast_mul(&channel(&scale)?)?.broadcast_add(&channel(&shift)?)?)
    }
}

/// ReLU.
pub fn relu(ctx: &mut Ctx, name: &str, x: &Node) -> Result<Node, RecordError> {
    ctx.op(name, &[&x.name], x.t.relu()?)
}

/// 2×2 max pooling.
pub fn max_pool(ctx: &mut Ctx, name: &str, x: &Node) -> Result<Node, RecordError> {
    ctx.op(name, &[&x.name], x.t.max_pool2d(2)?)
}

/// Inverted dropout with probability `ctx.dropout` in training; identity otherwise. The mask
/// is drawn on the host from the dropout seed, the step and `layer`.
pub fn dropout(ctx: &mut Ctx, name: &str, layer: u64, x: &Node) -> Result<Node, RecordError> {
    if !ctx.training || ctx.dropout <= 0.0 {
        return Ok(x.clone());
    }
    let mut rng = stream(ctx.seeds.dropout, "dropout", ctx.step * 64 + layer);
    let keep = 1.0 / (1.0 - ctx.dropout) as f32;
    let p = ctx.dropout as f32;
    let mask: Vec<f32> = (0..x.t.elem_count()).map(|_| if unit_f32(&mut rng) < p { 0.0 } else { keep }).collect();
    let mask = Tensor::from_vec(mask, x.t.shape(), &Device::Cpu)?.to_device(x.t.device())?;
    ctx.op(name, &[&x.name], (&x.t * mask)?)
}

/// Mean cross-entropy of `logits` (`[batch, classes]`) against one-hot `targets`; the sum
/// over the batch accumulates as `ctx.reductions` says.
pub fn cross_entropy(ctx: &mut Ctx, logits: &Node, targets: &Node) -> Result<Node, RecordError> {
    let batch = logits.t.dim(0)?;
    let log_p = candle_nn::ops::log_softmax(&logits.t, D::Minus1)?;
    let picked = ctx.op("loss.log_likelihood", &[&logits.name, &targets.name], (log_p * &targets.t)?.sum(1)?)?;
    let total = ctx.op("loss.sum", &[&picked.name], sum_all(&picked.t, ctx.reductions)?)?;
    let loss = ctx.rec.op_as("loss", TensorKind::Loss, &["loss.sum"], (total.t * (-1.0 / batch as f64))?)?;
    Ok(Node { t: loss, name: "loss".into() })
}

/// One-hot rows for `labels`.
pub fn one_hot(labels: &[u32], classes: usize, device: &Device) -> Result<Tensor, RecordError> {
    let mut v = vec![0.0f32; labels.len() * classes];
    for (i, &l) in labels.iter().enumerate() {
        v[i * classes + l as usize] = 1.0;
    }
    Ok(Tensor::from_vec(v, (labels.len(), classes), &Device::Cpu)?.to_device(device)?)
}
