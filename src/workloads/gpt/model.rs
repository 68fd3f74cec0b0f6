//! A small decoder-only transformer (GPT-2 layout): token and position embeddings, pre-norm
//! blocks of causal self-attention and a GELU MLP, a final norm and an output projection.
//!
//! This is model code as a user writes it: candle-nn layers built from a `VarBuilder`, and
//! `tracing` spans (as candle-transformers' layers have) naming each part. It has no recording
//! calls; `repro::capture` records it from outside. Parameter names follow GPT-2's
//! (`h.3.attn.c_attn.weight`), span names the same parts (`h[3]/attn/c_attn`).

use crate::ops::{expand_rows, invariant, Reductions};
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
    /// Matrix products and softmax row sums through `ops::invariant`, whose results for one
    /// sequence do not depend on the batch, the padding or the KV cache's length; otherwise
    /// candle's kernels.
    pub batch_invariant: bool,
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
/// With `batch_invariant`, the product is `ops::invariant::matmul` (and the bias is added by
/// broadcasting, or through `expand_rows` as above).
struct Dense {
    linear: Linear,
    reductions: Reductions,
    batch_invariant: bool,
}

impl Module for Dense {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let bias = self.linear.bias();
        if !self.batch_invariant && (self.reductions == Reductions::Candle || bias.is_none()) {
            return self.linear.forward(x);
        }
        let mut dims = x.dims().to_vec();
        let features = dims.pop().unwrap_or(1);
        let rows = dims.iter().product();
        let x = x.reshape((rows, features))?;
        let w = self.linear.weight().t()?;
        let y = if self.batch_invariant { invariant::matmul(&x, &w)? } else { x.matmul(&w)? };
        let y = match (self.reductions, bias) {
            (_, None) => y,
            (Reductions::Candle, Some(bias)) => y.broadcast_add(bias)?,
            (mode, Some(bias)) => (y + expand_rows(bias, rows, mode)?)?,
        };
        dims.push(self.linear.weight().dim(0)?);
        y.reshape(dims)
    }
}

fn linear(i: usize, o: usize, shape: &GptShape, vb: VarBuilder, name: &'static str) -> Result<Traced<Dense>> {
    let dense = Dense {
        linear: candle_nn::linear(i, o, vb.pp(name))?,
        reductions: shape.reductions,
        batch_invariant: shape.batch_invariant,
    };
    Ok(Traced::new(dense, name))
}

struct Attention {
    c_attn: Traced<Dense>,
    c_proj: Traced<Dense>,
    heads: usize,
    batch_invariant: bool,
    span: Span,
}

/// One block's keys and values `[batch, heads, positions, head width]` of the positions seen.
type KeysValues = Option<(Tensor, Tensor)>;

impl Attention {
    /// `cache`, when given, holds the earlier positions' keys and values (which `mask` lets
    /// every new position see) and receives the new ones.
    fn forward(&self, x: &Tensor, mask: &Tensor, cache: Option<&mut KeysValues>) -> Result<Tensor> {
        let _entered = self.span.enter();
        let (b, t, c) = x.dims3()?;
        let head = c / self.heads;
        let qkv = self.c_attn.forward(x)?;
        let split = |i: usize| -> Result<Tensor> {
            qkv.narrow(D::Minus1, i * c, c)?.reshape((b, t, self.heads, head))?.transpose(1, 2)?.contiguous()
        };
        let (q, mut k, mut v) = (split(0)?, split(1)?, split(2)?);
        if let Some(cache) = cache {
            if let Some((past_k, past_v)) = cache.as_ref() {
                k = Tensor::cat(&[past_k, &k], 2)?;
                v = Tensor::cat(&[past_v, &v], 2)?;
            }
            *cache = Some((k.clone(), v.clone()));
        }
        let matmul = |x: &Tensor, y: &Tensor| if self.batch_invariant { invariant::matmul(x, y) } else { x.matmul(y) };
        let scores = (matmul(&q, &k.t()?.contiguous()?)? / (head as f64).sqrt())?;
        let scores = scores.broadcast_add(mask)?;
        let weights = if self.batch_invariant {
            invariant::softmax_last_dim(&scores)?
        } else {
            candle_nn::ops::softmax(&scores, D::Minus1)?
        };
        let y = matmul(&weights, &v)?.transpose(1, 2)?.contiguous()?.reshape((b, t, c))?;
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
    fn forward(&self, x: &Tensor, mask: &Tensor, cache: Option<&mut KeysValues>) -> Result<Tensor> {
        let _entered = self.span.enter();
        let x = (x + self.attn.forward(&self.ln_1.forward(x)?, mask, cache)?)?;
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
                        c_attn: linear(w, 3 * w, &shape, attn.clone(), "c_attn")?,
                        c_proj: linear(w, w, &shape, attn, "c_proj")?,
                        heads: shape.heads,
                        batch_invariant: shape.batch_invariant,
                        span: span_named("attn"),
                    },
                    ln_2: layer_norm(w, shape.norm, vb.clone(), "ln_2")?,
                    mlp: Mlp {
                        c_fc: linear(w, 4 * w, &shape, mlp.clone(), "c_fc")?,
                        c_proj: linear(4 * w, w, &shape, mlp, "c_proj")?,
                        span: span_named("mlp"),
                    },
                    span: span_named("h"),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let ln_f = layer_norm(w, shape.norm, vb.clone(), "ln_f")?;
        let lm_head = linear(w, shape.vocab, &shape, vb, "lm_head")?;
        Ok(Gpt { wte, wpe, blocks, ln_f, lm_head, context: shape.context })
    }

    /// Logits `[batch, time, vocab]` for token ids `[batch, time]` (u32).
    pub fn forward(&self, tokens: &Tensor) -> Result<Tensor> {
        self.forward_at(tokens, 0, None)
    }

    /// Logits for token ids `[batch, time]` that follow the positions held in `cache` (none
    /// at first), whose keys and values are reused; the new positions' are added to it. Run
    /// on a sequence in pieces (one token at a time: decoding; several: chunked prefill), this
    /// computes what `forward` computes on the whole, in another order.
    pub fn forward_cached(&self, tokens: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
        cache.blocks.resize(self.blocks.len(), None);
        let offset = cache.len();
        self.forward_at(tokens, offset, Some(&mut cache.blocks))
    }

    fn forward_at(&self, tokens: &Tensor, offset: usize, mut cache: Option<&mut Vec<KeysValues>>) -> Result<Tensor> {
        let (_, t) = tokens.dims2()?;
        if offset + t > self.context {
            candle_core::bail!(
                "sequence of {} tokens is longer than the model's context of {}",
                offset + t,
                self.context
            );
        }
        let device = tokens.device();
        let positions = Tensor::arange(offset as u32, (offset + t) as u32, device)?;
        let mut x = self.wte.forward(tokens)?.broadcast_add(&self.wpe.forward(&positions)?)?;
        let mask = causal_mask(t, offset, device)?.to_dtype(x.dtype())?;
        for (i, block) in self.blocks.iter().enumerate() {
            x = block.forward(&x, &mask, cache.as_mut().map(|c| &mut c[i]))?;
        }
        self.lm_head.forward(&self.ln_f.forward(&x)?)
    }
}

/// The keys and values of the positions a `Gpt` has seen, per block, for `forward_cached`.
#[derive(Default)]
pub struct KvCache {
    blocks: Vec<KeysValues>,
}

impl KvCache {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.blocks.first().and_then(|kv| kv.as_ref()).map_or(0, |(k, _)| k.dims().get(2).copied().unwrap_or(0))
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `[t, offset + t]`: 0 where new position i (at offset + i) may attend (itself and every
/// earlier position), -inf elsewhere.
fn causal_mask(t: usize, offset: usize, device: &Device) -> Result<Tensor> {
    let mask: Vec<f32> = (0..t)
        .flat_map(|i| (0..offset + t).map(move |j| if j <= offset + i { 0.0 } else { f32::NEG_INFINITY }))
        .collect();
    Tensor::from_vec(mask, (t, offset + t), device)?.to_dtype(DType::F32)
}

impl Norm {
    /// Every norm, by the name `--norm` and a trace header give it.
    pub const NAMED: [(&'static str, Norm); 2] = [("ops", Norm::Ops), ("fused", Norm::Fused)];

    /// Its name (`--norm`, the header's `norm`).
    pub fn name(self) -> &'static str {
        match self {
            Norm::Ops => "ops",
            Norm::Fused => "fused",
        }
    }

    /// The norm named `name`.
    pub fn named(name: &str) -> Option<Norm> {
        Self::NAMED.into_iter().find(|(n, _)| *n == name).map(|(_, norm)| norm)
    }
}

impl std::fmt::Display for Norm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Norm {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        let names = Self::NAMED.map(|(name, _)| name).join(" or ");
        Norm::named(s).ok_or_else(|| format!("unknown norm `{s}`: expected {names}"))
    }
}
