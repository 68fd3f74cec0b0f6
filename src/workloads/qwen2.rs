//! `qwen2`: the forward pass of candle-transformers' Qwen2 decoder, from its unmodified source,
//! at inference. A small config (byte vocabulary, 2 layers, width 64, grouped-query attention)
//! with seeded random weights drawn on the host (nothing is downloaded), so every device starts
//! from the same model. Each step runs one batch of seeded prompts from an empty KV cache and
//! records it through `repro::capture`: the prompt, the parameters by their Hugging Face names
//! (`model.layers.1.self_attn.q_proj.weight`) and every graph node behind the logits.
//!
//! candle's fused RMS norm, softmax and rotary kernels have no backward pass, so the graph
//! candle exposes from the logits stops at the last of them; the recording says how much of the
//! model the captured graph reaches.

use crate::capture::{ModelCapture, SpanScopes};
use crate::record::{RecordError, Recorder};
use crate::trace::{RunConfig, TensorKind};
use crate::workloads::seeded::{stream, uniform_vec};
use candle_core::{DType, Device, Tensor};
use candle_nn::{Activation, Linear, VarBuilder, VarMap};
use candle_transformers::models::qwen2::{Config, Model, ModelForCausalLM};
use rand::Rng;
use std::collections::BTreeMap;

/// A `qwen2` inference run's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen2Config {
    /// Seed of the random weights.
    pub seed: u64,
    /// Seed of the prompts.
    pub data_seed: u64,
    /// Forward passes (each one batch of prompts).
    pub steps: u64,
    /// Prompts per batch.
    pub batch: usize,
    /// Tokens per prompt.
    pub tokens: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Hidden width.
    pub width: usize,
    /// Element type of the weights and activations (F32 or BF16).
    pub dtype: DType,
}

impl Default for Qwen2Config {
    fn default() -> Self {
        Qwen2Config { seed: 0, data_seed: 0, steps: 4, batch: 4, tokens: 64, layers: 2, width: 64, dtype: DType::F32 }
    }
}

impl Qwen2Config {
    /// candle-transformers' configuration for these settings.
    pub fn model_config(&self) -> Config {
        Config {
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
            rms_norm_eps: 1e-6,
            use_sliding_window: false,
            hidden_act: Activation::Silu,
        }
    }

    /// The run configuration written to a trace header.
    pub fn run_config(&self) -> RunConfig {
        let mut params = BTreeMap::from([
            ("batch".to_string(), self.batch.to_string()),
            ("data_seed".to_string(), self.data_seed.to_string()),
            ("layers".to_string(), self.layers.to_string()),
            ("seed".to_string(), self.seed.to_string()),
            ("tokens".to_string(), self.tokens.to_string()),
            ("width".to_string(), self.width.to_string()),
        ]);
        // Absent means f32: traces recorded before the setting existed keep their header.
        if self.dtype != DType::F32 {
            params.insert("dtype".to_string(), "bf16".to_string());
        }
        RunConfig { workload: "qwen2".into(), steps: Some(self.steps), params }
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), RecordError> {
        if self.steps == 0 || self.batch == 0 || self.tokens == 0 || self.layers == 0 {
            return Err(RecordError::Unsupported(
                "qwen2 needs --steps, --batch, --tokens and --layers of at least 1".into(),
            ));
        }
        if !matches!(self.dtype, DType::F32 | DType::BF16) {
            return Err(RecordError::Unsupported(format!("qwen2 runs in f32 or bf16, not {:?}", self.dtype)));
        }
        if self.width == 0 || !self.width.is_multiple_of(8) || self.tokens > 512 {
            return Err(RecordError::Unsupported(format!(
                "qwen2 needs a --width that is a positive multiple of 8 (4 heads of even size), not {}, and at most 512 --tokens",
                self.width
            )));
        }
        Ok(())
    }

    /// Builds the model with seeded weights: uniform in ±0.05 for matrices and embeddings, ones
    /// for norms, zeros for biases; keyed by parameter name, so identical on every device.
    pub fn build(&self, device: &Device) -> Result<(ModelForCausalLM, VarMap), RecordError> {
        self.seeded(device, ModelForCausalLM::new)
    }

    /// The decoder without its head (hidden states at every position, not only the last) and
    /// the head it ties to the token embeddings, as `ModelForCausalLM` does: logits at every
    /// position, for comparisons position by position. The same seeded weights as `build`.
    pub fn build_with_head(&self, device: &Device) -> Result<(Model, Linear, VarMap), RecordError> {
        let (model, varmap) = self.seeded(device, Model::new)?;
        let embeddings = varmap
            .data()
            .lock()
            .expect("VarMap lock")
            .get("model.embed_tokens.weight")
            .map(|v| v.as_tensor().clone())
            .ok_or_else(|| RecordError::Unsupported("qwen2 has no model.embed_tokens.weight".into()))?;
        Ok((model, Linear::new(embeddings, None), varmap))
    }

    /// Builds a model with `new`, then sets every parameter it created to its seeded values.
    fn seeded<M>(
        &self,
        device: &Device,
        new: impl FnOnce(&Config, VarBuilder) -> candle_core::Result<M>,
    ) -> Result<(M, VarMap), RecordError> {
        let mut varmap = VarMap::new();
        let model = new(&self.model_config(), VarBuilder::from_varmap(&varmap, self.dtype, device))?;
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
                uniform_vec(&mut stream(self.seed, &format!("qwen2.init.{name}"), 0), n, -0.05, 0.05)
            };
            // Drawn in f32 and rounded once: the same weights in either dtype.
            let values = Tensor::from_vec(values, dims, &Device::Cpu)?.to_dtype(self.dtype)?;
            varmap.set_one(&name, values.to_device(device)?)?;
        }
        Ok((model, varmap))
    }

    /// Seeded prompts `[batch, tokens]` for one step.
    fn prompts(&self, step: u64, device: &Device) -> Result<Tensor, RecordError> {
        let mut rng = stream(self.data_seed, "qwen2.prompts", step);
        let ids: Vec<u32> = (0..self.batch * self.tokens).map(|_| rng.random_range(0..256)).collect();
        Ok(Tensor::from_vec(ids, (self.batch, self.tokens), &Device::Cpu)?.to_device(device)?)
    }

    /// Runs and records every forward pass. Prints to stderr how much of the model the captured
    /// graph reaches.
    pub fn run(&self, device: &Device, recorder: &mut Recorder) -> Result<(), RecordError> {
        use tracing_subscriber::layer::SubscriberExt;
        let _spans = tracing::subscriber::set_default(tracing_subscriber::registry().with(SpanScopes));
        let (mut model, varmap) = self.build(device)?;
        let capture = ModelCapture::new(&varmap);
        for step in 0..self.steps {
            let prompts = self.prompts(step, device)?;
            model.clear_kv_cache();
            let logits = model.forward(&prompts, 0)?;
            let mut s = recorder.step(step);
            s.record("prompts", TensorKind::Input, &prompts)?;
            capture.record_parameters(&mut s)?;
            let nodes = capture.record_graph(&mut s, &logits, "logits", TensorKind::Prediction)?;
            s.finish()?;
            if step == 0 {
                let reached = capture.reached(&logits);
                eprintln!(
                    "qwen2: the graph candle exposes behind the logits has {nodes} nodes and reaches {} of {} \
                     parameters; ops without a backward pass (fused RMS norm, softmax, rotary) cut it above that",
                    reached.len(),
                    capture.parameters().len()
                );
            }
        }
        Ok(())
    }
}
