//! A small decoder-only transformer (GPT-2 layout): token and position embeddings, pre-norm
//! blocks of causal self-attention and a GELU MLP, a final norm and an output projection.
//!
//! This is model code as a user writes it: candle-nn layers built from a `VarBuilder`, and
//! `tracing` spans (as candle-transformers' layers have) naming each part. It has no recording
//! calls; `repro::capture` records it from outside. Parameter names follow GPT-2's
//! (`h.3.attn.c_attn.weight`), span names the same parts (`h[3]/attn/c_attn`).

use crate::ops::{expand_rows, Reductions};
use candle_core::{DType, Device, Module, Result, Tensor, D};
use candle_nn::{Embedding, Linear, VarBuilder};
use tracing::Span;

/// How the blocks normalise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Norm {
    /// Layer norm written with tensor ops, which all have a backward pass.
    Ops,
    /// candle-nn's fused `layer_norm` kernel, which has none: every parameter upstream of the
    /// first norm silently receives no gradient (what `repro inspect` reports).
    Fused,
}

/// The model's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GptShape {
    /// Vocabulary size (256: bytes).
    pub vocab: usize,
    /// Longest sequence.
    pub context: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Embedding width.
    pub width: usize,
    /// Attention heads (divides `width`).
    pub heads: usize,
    /// How blocks normalise.
    pub norm: Norm,
    /// How the batch reductions of the linear layers' bias gradients accumulate: candle's own
    /// (candle-nn's `Linear`), or repro's atomic or ordered sums.
    pub reductions: Reductions,
}

/// A module that enters a `tracing` span named after it while it runs.
struct Traced<M> {
    inner: M,
    span: Span,
}

impl<M: Module> Traced<M> {
    fn new(inner: M, name: &'static str) -> Self {
        Traced { inner, span: span_named(name) }
    }
}

/// A span named `name`. `tracing` names spans at the callsite, so each part name the model
/// uses has its own.
fn span_named(name: &'static str) -> Span {
    macro_rules! spans {
        ($($n:literal),*) => {
            match name {
                $($n => tracing::trace_span!($n),)*
                _ => tracing::trace_span!("part"),
            }
        };
    }
    spans!("wte", "wpe", "h", "ln_1", "attn", "ln_2", "mlp", "c_attn", "c_fc", "c_proj", "ln_f", "lm_head")
}

impl<M: Module> Module for Traced<M> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _entered = self.span.enter();
        self.inner.forward(x)
    }
}

struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    norm: Norm,
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self.norm {
            Norm::Ops => candle_nn::ops::layer_norm_slow(x, &self.weight, &self.bias, 1e-5),
            Norm::Fused => candle_nn::ops::layer_norm(x, &self.weight, &self.bias, 1e-5),
        }
    }
}

fn layer_norm(width: usize, norm: Norm, vb: VarBuilder, name: &'static str) -> Result<Traced<LayerNorm>> {
    let vb = vb.pp(name);
    let weight = vb.get_with_hints(width, "weight", candle_nn::Init::Const(1.0))?;
    let bias = vb.get_with_hints(width, "bias", candle_nn::Init::Const(0.0))?;
    Ok(Traced::new(LayerNorm { weight, bias, norm }, name))
}

/// A linear layer. With candle's reductions it is candle-nn's `Linear`; otherwise its bias is
/// added through `expand_rows`, whose backward sums the bias gradient over every token of the
/// batch in the chosen order.
struct Dense {
    linear: Linear,
    reductions: Reductions,
}

impl Module for Dense {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match (self.reductions, self.linear.bias()) {
            (Reductions::Candle, _) | (_, None) => self.linear.forward(x),
            (mode, Some(bias)) => {
                let mut dims = x.dims().to_vec();
                let features = dims.pop().unwrap_or(1);
                let rows = dims.iter().product();
                let y = x.reshape((rows, features))?.matmul(&self.linear.weight().t()?)?;
                dims.push(bias.elem_count());
                (y + expand_rows(bias, rows, mode)?)?.reshape(dims)
            }
        }
    }
}

fn linear(i: usize, o: usize, reductions: Reductions, vb: VarBuilder, name: &'static str) -> Result<Traced<Dense>> {
    Ok(Traced::new(Dense { linear: candle_nn::linear(i, o, vb.pp(name))?, reductions }, name))
}

struct Attention {
    c_attn: Traced<Dense>,
    c_proj: Traced<Dense>,
    heads: usize,
    span: Span,
}

impl Attention {
    fn forward(&self, x: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let _entered = self.span.enter();
        let (b, t, c) = x.dims3()?;
        let head = c / self.heads;
        let qkv = self.c_attn.forward(x)?;
        let split = |i: usize| -> Result<Tensor> {
            qkv.narrow(D::Minus1, i * c, c)?.reshape((b, t, self.heads, head))?.transpose(1, 2)?.contiguous()
        };
        let (q, k, v) = (split(0)?, split(1)?, split(2)?);
        let scores = (q.matmul(&k.t()?.contiguous()?)? / (head as f64).sqrt())?;
        let scores = scores.broadcast_add(mask)?;
        let weights = candle_nn::ops::softmax(&scores, D::Minus1)?;
        let y = weights.matmul(&v)?.transpose(1, 2)?.contiguous()?.reshape((b, t, c))?;
        self.c_proj.forward(&y)
    }
}

struct Mlp {
    c_fc: Traced<Dense>,
    c_proj: Traced<Dense>,
    span: Span,
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _entered = self.span.enter();
        self.c_proj.forward(&self.c_fc.forward(x)?.gelu_erf()?)
    }
}

struct Block {
    ln_1: Traced<LayerNorm>,
    attn: Attention,
    ln_2: Traced<LayerNorm>,
    mlp: Mlp,
    span: Span,
}

impl Block {
    fn forward(&self, x: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let _entered = self.span.enter();
        let x = (x + self.attn.forward(&self.ln_1.forward(x)?, mask)?)?;
        &x + self.mlp.forward(&self.ln_2.forward(&x)?)?
    }
}

/// The transformer.
pub struct Gpt {
    wte: Traced<Embedding>,
    wpe: Traced<Embedding>,
    blocks: Vec<Block>,
    ln_f: Traced<LayerNorm>,
    lm_head: Traced<Dense>,
    context: usize,
}

impl Gpt {
    /// Builds the model's parameters through `vb` (names as in GPT-2).
    pub fn new(shape: GptShape, vb: VarBuilder) -> Result<Self> {
        let w = shape.width;
        let embedding = |n: usize, name: &'static str| -> Result<Traced<Embedding>> {
            Ok(Traced::new(candle_nn::embedding(n, w, vb.pp(name))?, name))
        };
        let (wte, wpe) = (embedding(shape.vocab, "wte")?, embedding(shape.context, "wpe")?);
        let blocks = (0..shape.layers)
            .map(|i| {
                let vb = vb.pp("h").pp(i);
                let attn = vb.pp("attn");
                let mlp = vb.pp("mlp");
                Ok(Block {
                    ln_1: layer_norm(w, shape.norm, vb.clone(), "ln_1")?,
                    attn: Attention {
                        c_attn: linear(w, 3 * w, shape.reductions, attn.clone(), "c_attn")?,
                        c_proj: linear(w, w, shape.reductions, attn, "c_proj")?,
                        heads: shape.heads,
                        span: span_named("attn"),
                    },
                    ln_2: layer_norm(w, shape.norm, vb.clone(), "ln_2")?,
                    mlp: Mlp {
                        c_fc: linear(w, 4 * w, shape.reductions, mlp.clone(), "c_fc")?,
                        c_proj: linear(4 * w, w, shape.reductions, mlp, "c_proj")?,
                        span: span_named("mlp"),
                    },
                    span: span_named("h"),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let ln_f = layer_norm(w, shape.norm, vb.clone(), "ln_f")?;
        let lm_head = linear(w, shape.vocab, shape.reductions, vb, "lm_head")?;
        Ok(Gpt { wte, wpe, blocks, ln_f, lm_head, context: shape.context })
    }

    /// Logits `[batch, time, vocab]` for token ids `[batch, time]` (u32).
    pub fn forward(&self, tokens: &Tensor) -> Result<Tensor> {
        let (_, t) = tokens.dims2()?;
        if t > self.context {
            candle_core::bail!("sequence of {t} tokens is longer than the model's context of {}", self.context);
        }
        let device = tokens.device();
        let positions = Tensor::arange(0u32, t as u32, device)?;
        let mut x = self.wte.forward(tokens)?.broadcast_add(&self.wpe.forward(&positions)?)?;
        let mask = causal_mask(t, device)?;
        for block in &self.blocks {
            x = block.forward(&x, &mask)?;
        }
        self.lm_head.forward(&self.ln_f.forward(&x)?)
    }
}

/// `[t, t]`: 0 where a position may attend (itself and earlier), -inf elsewhere.
fn causal_mask(t: usize, device: &Device) -> Result<Tensor> {
    let mask: Vec<f32> =
        (0..t).flat_map(|i| (0..t).map(move |j| if j <= i { 0.0 } else { f32::NEG_INFINITY })).collect();
    Tensor::from_vec(mask, (t, t), device)?.to_dtype(DType::F32)
}
