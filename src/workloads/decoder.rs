//! `qwen2` and `gemma`: the forward pass of a candle-transformers decoder, from its unmodified
//! source, at inference. A small config (byte vocabulary, 2 layers, width 64, grouped-query
//! attention) with seeded random weights drawn on the host (nothing is downloaded), so every
//! device starts from the same model. Each step runs one batch of seeded prompts from an empty
//! KV cache and records it through `repro::capture`: the prompt, the parameters by their Hugging
//! Face names (`model.layers.1.self_attn.q_proj.weight`) and every graph node behind the logits.
//!
//! candle's fused kernels have no backward pass, so the graph candle exposes from the logits
//! stops at them: Qwen2's RMS norm is one, so its graph reaches only the output head; Gemma
//! writes its RMS norm with tensor ops, so its graph reaches every layer (only its softmax and
//! rotary embedding cut the queries' and keys' side of attention). The recording says how much
//! of the model the captured graph reaches.

use crate::capture::{scope, span_scopes_on_this_thread, ModelCapture};
use crate::record::RecordError;
use crate::trace::{RunConfig, TensorKind};
use crate::workloads::seeded::{stream, uniform_vec};
use crate::workloads::settings::{self, is_default, Settings};
use crate::workloads::{Training, WorkloadError, WorkloadKind};
use candle_core::{DType, Device, Module, Tensor, D};
use candle_nn::{Activation, Linear, VarBuilder, VarMap};
use candle_transformers::models::{gemma, qwen2};
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Which candle-transformers decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Family {
    /// `candle_transformers::models::qwen2` (fused RMS norm).
    #[default]
    Qwen2,
    /// `candle_transformers::models::gemma` (RMS norm from tensor ops).
    Gemma,
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::Qwen2 => "qwen2",
            Family::Gemma => "gemma",
        })
    }
}

/// The model a decoder run records: candle-transformers' own forward pass, logits of the last
/// position.
pub enum CausalLm {
    /// Qwen2's `ModelForCausalLM`.
    Qwen2(qwen2::ModelForCausalLM),
    /// Gemma's `Model`.
    Gemma(gemma::Model),
}

impl CausalLm {
    /// Logits of the last position for token ids `[batch, tokens]` following `offset` cached
    /// positions.
    pub fn forward(&mut self, tokens: &Tensor, offset: usize) -> candle_core::Result<Tensor> {
        match self {
            CausalLm::Qwen2(m) => m.forward(tokens, offset),
            CausalLm::Gemma(m) => m.forward(tokens, offset),
        }
    }

    /// Empties the KV cache.
    pub fn clear_kv_cache(&mut self) {
        match self {
            CausalLm::Qwen2(m) => m.clear_kv_cache(),
            CausalLm::Gemma(m) => m.clear_kv_cache(),
        }
    }
}

/// The decoder with its output head applied at every position, for comparisons position by
/// position: the decoder layers are candle-transformers' unchanged; what follows them (Qwen2:
/// its norm is inside the model; Gemma: its final norm, written out as Gemma's `RmsNorm` does,
/// because the model applies it only to the last position) and the head tied to the token
/// embeddings run in scopes `norm` and `lm_head`.
pub enum EveryPosition {
    /// Qwen2's `Model` (hidden states after its final norm) and the tied head.
    Qwen2 {
        /// The decoder.
        model: qwen2::Model,
        /// The output head.
        head: Linear,
    },
    /// Gemma's layers and its final norm's weight, the tied head.
    Gemma {
        /// The decoder.
        model: gemma::Model,
        /// `model.norm.weight`.
        norm: Tensor,
        /// The output head.
        head: Linear,
    },
}

impl EveryPosition {
    /// Logits `[batch, tokens, vocab]` for token ids following `offset` cached positions.
    pub fn forward(&mut self, tokens: &Tensor, offset: usize) -> candle_core::Result<Tensor> {
        match self {
            EveryPosition::Qwen2 { model, head } => {
                let hidden = model.forward(tokens, offset, None)?;
                scope("lm_head", || head.forward(&hidden))
            }
            EveryPosition::Gemma { model, norm, head } => {
                let xs = model.embed_tokens().forward(tokens)?;
                let (batch, len) = tokens.dims2()?;
                let mask =
                    (len > 1).then(|| causal_mask(batch, len, offset, xs.dtype(), tokens.device())).transpose()?;
                let hidden = model.forward_embeds_without_projection(&xs, mask.as_ref(), offset)?;
                let normed = scope("norm", || gemma_rms_norm(&hidden, norm))?;
                scope("lm_head", || head.forward(&normed))
            }
        }
    }

    /// Empties the KV cache.
    pub fn clear_kv_cache(&mut self) {
        match self {
            EveryPosition::Qwen2 { model, .. } => model.clear_kv_cache(),
            EveryPosition::Gemma { model, .. } => model.clear_kv_cache(),
        }
    }
}

/// `[batch, 1, len, offset + len]`: 0 where new position i may attend (every cached position
/// and itself and earlier), -inf elsewhere; in `dtype`.
fn causal_mask(batch: usize, len: usize, offset: usize, dtype: DType, device: &Device) -> candle_core::Result<Tensor> {
    let mask: Vec<f32> = (0..len)
        .flat_map(|i| (0..offset + len).map(move |j| if j <= offset + i { 0.0 } else { f32::NEG_INFINITY }))
        .collect();
    Tensor::from_vec(mask, (len, offset + len), device)?.expand((batch, 1, len, offset + len))?.to_dtype(dtype)
}

/// Gemma's RMS norm (`candle_transformers::models::gemma`, private there): in f32 for half
/// types, scaled by 1 + weight.
fn gemma_rms_norm(x: &Tensor, weight: &Tensor) -> candle_core::Result<Tensor> {
    let dtype = x.dtype();
    let internal = if matches!(dtype, DType::F16 | DType::BF16) { DType::F32 } else { dtype };
    let width = x.dim(D::Minus1)?;
    let x = x.to_dtype(internal)?;
    let mean_square = (x.sqr()?.sum_keepdim(D::Minus1)? / width as f64)?;
    let normed = x.broadcast_div(&(mean_square + RMS_EPS)?.sqrt()?)?;
    normed.to_dtype(dtype)?.broadcast_mul(&(weight + 1.0)?)
}

/// The RMS norms' epsilon, both models.
const RMS_EPS: f64 = 1e-6;

/// The shape of a decoder's config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DecoderShape {
    /// The small test shape: byte vocabulary, 4 heads (2 for keys and values), an MLP twice the
    /// width, `width` and `layers` as given, prompts of up to 512 tokens.
    #[default]
    Small,
    /// Qwen2-0.5B's shape (hidden 896, MLP 4864, 14 heads and 2 for keys and values, a vocabulary
    /// of 151,936 tied to the embeddings, 32,768 positions); `layers` as given (24 in the real
    /// model: about 494M parameters).
    Qwen2_0_5B,
}

impl DecoderShape {
    /// The shapes by name, as `--shape` takes them.
    pub const NAMES: &'static [&'static str] = &["small", "qwen2-0.5b"];

    /// The shape named `name`.
    pub fn named(name: &str) -> Option<Self> {
        match name {
            "small" => Some(DecoderShape::Small),
            "qwen2-0.5b" => Some(DecoderShape::Qwen2_0_5B),
            _ => None,
        }
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            DecoderShape::Small => "small",
            DecoderShape::Qwen2_0_5B => "qwen2-0.5b",
        }
    }

    /// Positions the model takes: the longest prompt.
    fn max_positions(self) -> usize {
        match self {
            DecoderShape::Small => 512,
            DecoderShape::Qwen2_0_5B => 32_768,
        }
    }
}

impl fmt::Display for DecoderShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DecoderShape {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DecoderShape::named(s)
            .ok_or_else(|| format!("unknown shape `{s}`: expected {}", DecoderShape::NAMES.join(" or ")))
    }
}

/// A decoder inference run's settings (each a setting of its trace header by name,
/// `workloads::settings`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecoderConfig {
    /// Which decoder: the header's workload.
    #[serde(skip)]
    pub family: Family,
    /// Seed of the random weights.
    pub seed: u64,
    /// Seed of the prompts (where not given: the seed).
    pub data_seed: u64,
    /// Forward passes (each one batch of prompts): the header's own `steps`.
    #[serde(skip)]
    pub steps: u64,
    /// Prompts per batch.
    pub batch: usize,
    /// Tokens per prompt.
    pub tokens: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Hidden width (the small shape's; a header of another shape leaves it out).
    pub width: usize,
    /// The config's shape (in a header where not the small one).
    #[serde(default, skip_serializing_if = "is_default")]
    pub shape: DecoderShape,
    /// Element type of the weights and activations (F32 or BF16; in a header where not F32).
    #[serde(with = "dtype_name", default = "dtype_name::f32", skip_serializing_if = "dtype_name::is_f32")]
    pub dtype: DType,
}

impl Settings for DecoderConfig {
    const FOLLOWS: &'static [(&'static str, &'static str)] = &[("data_seed", "seed")];
    const OPTIONS: &'static [(&'static str, &'static str)] = &[("context", "tokens")];

    fn moot(&self) -> &'static [&'static str] {
        match self.shape {
            DecoderShape::Small => &[],
            // The shape sets the width.
            DecoderShape::Qwen2_0_5B => &["width"],
        }
    }
}

/// A decoder's element type as a header and `--dtype` name it: `f32` or `bf16`.
pub mod dtype_name {
    use candle_core::DType;
    use serde::{de, ser, Deserialize, Deserializer, Serializer};

    /// The element types by name.
    pub const NAMED: [(&str, DType); 2] = [("f32", DType::F32), ("bf16", DType::BF16)];

    /// `dtype`'s name.
    pub fn serialize<S: Serializer>(dtype: &DType, s: S) -> Result<S::Ok, S::Error> {
        match NAMED.iter().find(|(_, d)| d == dtype) {
            Some((name, _)) => s.serialize_str(name),
            None => Err(ser::Error::custom(format!("{dtype:?} is neither f32 nor bf16"))),
        }
    }

    /// The element type a name names.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DType, D::Error> {
        let name = String::deserialize(d)?;
        match NAMED.iter().find(|(n, _)| *n == name) {
            Some(&(_, dtype)) => Ok(dtype),
            None => Err(de::Error::custom(format!("expected {}", NAMED.map(|(n, _)| n).join(" or ")))),
        }
    }

    /// F32, the element type where none is named.
    pub fn f32() -> DType {
        DType::F32
    }

    /// Whether `dtype` is F32 (a header leaves it out then).
    pub fn is_f32(dtype: &DType) -> bool {
        *dtype == DType::F32
    }
}

impl Default for DecoderConfig {
    fn default() -> Self {
        DecoderConfig {
            family: Family::Qwen2,
            seed: 0,
            data_seed: 0,
            steps: 4,
            batch: 4,
            tokens: 64,
            layers: 2,
            width: 64,
            shape: DecoderShape::Small,
            dtype: DType::F32,
        }
    }
}

impl DecoderConfig {
    /// One line saying what is run, for progress messages.
    pub fn describe(&self) -> String {
        format!(
            "{} inference ({} layers, {}{}; seed {}, {} forward passes of {} prompts x {} tokens)",
            self.family,
            self.layers,
            match self.shape {
                DecoderShape::Small => format!("width {}", self.width),
                shape => format!("{} shape", shape.name()),
            },
            if self.dtype == DType::BF16 { ", bf16" } else { "" },
            self.seed,
            self.steps,
            self.batch,
            self.tokens
        )
    }

    /// candle-transformers' Gemma configuration for these settings.
    fn gemma_config(&self) -> gemma::Config {
        gemma::Config {
            attention_bias: false,
            head_dim: self.width / 4,
            hidden_act: Some(Activation::GeluPytorchTanh),
            hidden_activation: None,
            hidden_size: self.width,
            intermediate_size: 2 * self.width,
            num_attention_heads: 4,
            num_hidden_layers: self.layers,
            num_key_value_heads: 2,
            rms_norm_eps: RMS_EPS,
            rope_theta: 10_000.0,
            vocab_size: 256,
            max_position_embeddings: 512,
        }
    }

    /// candle-transformers' Qwen2 configuration for these settings.
    fn qwen2_config(&self) -> qwen2::Config {
        if self.shape == DecoderShape::Qwen2_0_5B {
            return qwen2::Config {
                vocab_size: 151_936,
                hidden_size: 896,
                intermediate_size: 4864,
                num_hidden_layers: self.layers,
                num_attention_heads: 14,
                num_key_value_heads: 2,
                max_position_embeddings: 32_768,
                sliding_window: 32_768,
                max_window_layers: self.layers,
                tie_word_embeddings: true,
                rope_theta: 1_000_000.0,
                rms_norm_eps: RMS_EPS,
                use_sliding_window: false,
                hidden_act: Activation::Silu,
            };
        }
        qwen2::Config {
            vocab_size: 256,
            hidden_size: self.width,
            intermediate_size: 2 * self.width,
            num_hidden_layers: self.layers,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            max_position_embeddings: 512,
            sliding_window: 512,
            max_window_layers: self.layers,
            tie_word_embeddings: true,
            rope_theta: 10_000.0,
            rms_norm_eps: RMS_EPS,
            use_sliding_window: false,
            hidden_act: Activation::Silu,
        }
    }

    /// The run configuration written to a trace header.
    pub fn run_config(&self) -> RunConfig {
        let kind = match self.family {
            Family::Qwen2 => WorkloadKind::Qwen2,
            Family::Gemma => WorkloadKind::Gemma,
        };
        settings::run_config(self, kind, self.steps)
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        if self.steps == 0 || self.batch == 0 || self.tokens == 0 || self.layers == 0 {
            return Err(WorkloadError::Invalid(format!(
                "{} needs --steps, --batch, --tokens and --layers of at least 1",
                self.family
            )));
        }
        if !matches!(self.dtype, DType::F32 | DType::BF16) {
            return Err(WorkloadError::Invalid(format!("{} runs in f32 or bf16, not {:?}", self.family, self.dtype)));
        }
        if self.shape != DecoderShape::Small && self.family != Family::Qwen2 {
            return Err(WorkloadError::Invalid(format!(
                "--shape {} is qwen2's; {} has the small shape only",
                self.shape.name(),
                self.family
            )));
        }
        if self.tokens > self.shape.max_positions() {
            return Err(WorkloadError::Invalid(format!(
                "{} of shape {} takes prompts of at most {} tokens (--context), not {}",
                self.family,
                self.shape.name(),
                self.shape.max_positions(),
                self.tokens
            )));
        }
        if self.shape == DecoderShape::Small && (self.width == 0 || !self.width.is_multiple_of(8)) {
            return Err(WorkloadError::Invalid(format!(
                "{} needs a --width that is a positive multiple of 8 (4 heads of even size), not {}",
                self.family, self.width
            )));
        }
        Ok(())
    }

    /// Builds the model with seeded weights: uniform in ±0.05 for matrices and embeddings, ones
    /// for norms, zeros for biases; keyed by parameter name, so identical on every device.
    pub fn build(&self, device: &Device) -> Result<(CausalLm, VarMap), RecordError> {
        match self.family {
            Family::Qwen2 => {
                let (m, varmap) = self.seeded(device, |vb| qwen2::ModelForCausalLM::new(&self.qwen2_config(), vb))?;
                Ok((CausalLm::Qwen2(m), varmap))
            }
            Family::Gemma => {
                let (m, varmap) = self.seeded(device, |vb| gemma::Model::new(false, &self.gemma_config(), vb))?;
                Ok((CausalLm::Gemma(m), varmap))
            }
        }
    }

    /// The decoder with its head at every position (see `EveryPosition`); the same seeded
    /// weights as `build`.
    pub fn build_every_position(&self, device: &Device) -> Result<(EveryPosition, VarMap), RecordError> {
        self.seeded(device, |vb| self.every_position(vb))
    }

    /// `build_every_position`'s model with its weights as plain tensors, not variables: a
    /// forward pass records no graph and frees each activation once read, so far larger
    /// batches fit (for comparing logits only).
    pub fn build_every_position_plain(&self, device: &Device) -> Result<EveryPosition, RecordError> {
        let (_, varmap) = self.build_every_position(device)?;
        let weights: std::collections::HashMap<String, Tensor> = varmap
            .data()
            .lock()
            .expect("VarMap lock")
            .iter()
            .map(|(name, var)| (name.clone(), var.as_detached_tensor()))
            .collect();
        Ok(self.every_position(VarBuilder::from_tensors(weights, self.dtype, device))?)
    }

    /// The model's vocabulary and hidden width (the shape's, where it sets them).
    pub fn vocab_and_width(&self) -> (usize, usize) {
        match self.family {
            Family::Qwen2 => (self.qwen2_config().vocab_size, self.qwen2_config().hidden_size),
            Family::Gemma => (self.gemma_config().vocab_size, self.gemma_config().hidden_size),
        }
    }

    /// The decoder and its head at every position, built through `vb`.
    fn every_position(&self, vb: VarBuilder) -> candle_core::Result<EveryPosition> {
        let (vocab, width) = self.vocab_and_width();
        let embeddings = || vb.get((vocab, width), "model.embed_tokens.weight");
        Ok(match self.family {
            Family::Qwen2 => {
                let model = qwen2::Model::new(&self.qwen2_config(), vb.clone())?;
                EveryPosition::Qwen2 { model, head: Linear::new(embeddings()?, None) }
            }
            Family::Gemma => {
                let model = gemma::Model::new(false, &self.gemma_config(), vb.clone())?;
                let norm = vb.get(width, "model.norm.weight")?;
                EveryPosition::Gemma { model, norm, head: Linear::new(embeddings()?, None) }
            }
        })
    }

    /// Builds a model with `new`, then sets every parameter it created to its seeded values.
    fn seeded<M>(
        &self,
        device: &Device,
        new: impl FnOnce(VarBuilder) -> candle_core::Result<M>,
    ) -> Result<(M, VarMap), RecordError> {
        let mut varmap = VarMap::new();
        let model = new(VarBuilder::from_varmap(&varmap, self.dtype, device))?;
        let mut params: Vec<(String, Vec<usize>)> =
            varmap.data().lock().expect("VarMap lock").iter().map(|(n, v)| (n.clone(), v.dims().to_vec())).collect();
        params.sort();
        for (name, dims) in params {
            let n = dims.iter().product();
            let values = if name.ends_with(".bias") {
                vec![0.0; n]
            } else if name.contains("norm") {
                vec![1.0; n]
            } else {
                uniform_vec(&mut stream(self.seed, &format!("{}.init.{name}", self.family), 0), n, -0.05, 0.05)
            };
            // Drawn in f32 and rounded once: the same weights in either dtype.
            let values = Tensor::from_vec(values, dims, &Device::Cpu)?.to_dtype(self.dtype)?;
            varmap.set_one(&name, values.to_device(device)?)?;
        }
        Ok((model, varmap))
    }

    /// Seeded prompts `[batch, tokens]` for one step.
    fn prompts(&self, step: u64, device: &Device) -> Result<Tensor, RecordError> {
        let mut rng = stream(self.data_seed, &format!("{}.prompts", self.family), step);
        // Token ids over the whole vocabulary (the small shape's is the 256 bytes).
        let vocab = self.qwen2_config().vocab_size as u32;
        let ids: Vec<u32> = (0..self.batch * self.tokens).map(|_| rng.random_range(0..vocab)).collect();
        Ok(Tensor::from_vec(ids, (self.batch, self.tokens), &Device::Cpu)?.to_device(device)?)
    }

    /// Runs and records every forward pass. Prints to stderr how much of the model the captured
    /// graph reaches.
    pub fn run(&self, training: Training<'_>) -> Result<(), RecordError> {
        let Training { device, recorder, .. } = training;
        if recorder.perturbation().is_some() {
            return Err(RecordError::Unsupported(format!(
                "{} records inference: --perturb is not supported",
                self.family
            )));
        }
        let _spans = span_scopes_on_this_thread();
        let (mut model, varmap) = self.build(device)?;
        let capture = ModelCapture::new(&varmap);
        for step in 0..self.steps {
            let prompts = self.prompts(step, device)?;
            model.clear_kv_cache();
            let logits = model.forward(&prompts, 0)?;
            let mut s = recorder.step(step);
            s.record("prompts", TensorKind::Input, &prompts)?;
            capture.record_parameters(&mut s);
            capture.record_graph(&mut s, &logits, "logits", TensorKind::Prediction);
            s.finish()?;
            if step == 0 {
                let nodes = capture.graph_len(&logits);
                let reached = capture.reached(&logits);
                eprintln!(
                    "{}: the graph candle exposes behind the logits has {nodes} nodes and reaches {} of {} \
                     parameters; ops without a backward pass (fused RMS norm, softmax, rotary) cut it above that",
                    self.family,
                    reached.len(),
                    capture.parameters().len()
                );
            }
        }
        Ok(())
    }
}
