//! The batch-invariance check on the built-in models: the gpt (seeded initial weights, sequences
//! from its corpus, decoding through its KV cache) and candle-transformers' Qwen2 and Gemma from
//! their unmodified source (seeded weights, seeded byte prompts, their own KV caches), their
//! graph nodes named after the models' `tracing` spans and parameters.

use super::InvarianceCheck;
use crate::capture::{span_scopes_on_this_thread, ModelCapture};
use crate::diff::invariance::InvarianceReport;
use crate::record::RecordError;
use crate::workloads::gpt::model::KvCache;
use crate::workloads::seeded::stream;
use crate::workloads::{DecoderConfig, GptConfig};
use candle_core::Device;
use rand::Rng;
use std::cell::RefCell;

/// Sequences in the check besides the one checked: batches reuse them in turn.
const FILLERS: usize = 16;

/// How each model is run besides alone: batch sizes, paddings and chunk sizes.
#[derive(Debug, Clone, Default)]
pub struct Batchings {
    /// Batch sizes.
    pub batch_sizes: Vec<usize>,
    /// Tokens appended after the sequence.
    pub paddings: Vec<usize>,
    /// Tokens per pass against the KV cache (1: decoding).
    pub chunks: Vec<usize>,
}

/// Checks the gpt's forward pass. The sequence leaves room in the model's context for the
/// largest padding.
pub fn gpt(
    config: &GptConfig,
    runs: &Batchings,
    dtype: candle_core::DType,
    device: &Device,
    label: &str,
) -> Result<InvarianceReport, RecordError> {
    let paddings = &runs.paddings;
    let room = paddings.iter().copied().max().unwrap_or(0);
    if room >= config.context {
        return Err(RecordError::Unsupported(format!(
            "a padding of {room} leaves no room for a sequence in the gpt's context of {} tokens",
            config.context
        )));
    }
    let _spans = span_scopes_on_this_thread();
    let (model, varmap) = config.build_in(device, dtype)?;
    let capture = ModelCapture::new(&varmap);
    let tokens = config.context - room;
    let mut windows: Vec<Vec<u32>> =
        config.probe_windows(FILLERS + 1)?.into_iter().map(|w| w[..tokens].to_vec()).collect();
    let sequence = windows.remove(0);
    let check = InvarianceCheck {
        capture: &capture,
        sequence,
        fillers: windows,
        batch_sizes: runs.batch_sizes.clone(),
        paddings: paddings.clone(),
        chunks: runs.chunks.clone(),
        subject: format!(
            "gpt ({} layers, width {}, seed {}, untrained{}{})",
            config.layers,
            config.width,
            config.seed,
            if dtype == candle_core::DType::BF16 { ", bf16" } else { "" },
            if config.batch_invariant { ", batch-invariant kernels" } else { "" }
        ),
        device_label: label.into(),
    };
    // The same weights as plain tensors: passes that keep no graph give every batching's
    // logits, however large the batch.
    // Each batching starts both caches afresh: the graph model's holds its pass's whole graph
    // (keys and values computed from the variables), which must not outlive the batching.
    let plain = config.build_for_inference(device, dtype)?;
    let caches = RefCell::new((KvCache::default(), KvCache::default()));
    let fresh = || *caches.borrow_mut() = (KvCache::default(), KvCache::default());
    check.run_with_plain(
        device,
        &mut |tokens, offset| {
            if offset == 0 {
                fresh();
            }
            Ok(model.forward_cached(tokens, &mut caches.borrow_mut().0)?)
        },
        &mut |tokens, offset| {
            if offset == 0 {
                fresh();
            }
            Ok(plain.forward_cached(tokens, &mut caches.borrow_mut().1)?)
        },
    )
}

/// Checks a candle-transformers decoder: its layers unchanged, with the head it ties to the
/// token embeddings applied at every position (its own forward keeps only the last).
pub fn decoder(
    config: &DecoderConfig,
    runs: &Batchings,
    device: &Device,
    label: &str,
) -> Result<InvarianceReport, RecordError> {
    let room = runs.paddings.iter().copied().max().unwrap_or(0);
    if config.tokens + room > 512 {
        return Err(RecordError::Unsupported(format!(
            "{}'s {} tokens and a padding of {room} exceed its 512 positions",
            config.family, config.tokens
        )));
    }
    let _spans = span_scopes_on_this_thread();
    let (model, varmap) = config.build_every_position(device)?;
    let capture = ModelCapture::new(&varmap);
    let mut rng = stream(config.data_seed, &format!("{}.invariance", config.family), 0);
    let mut prompt = || (0..config.tokens).map(|_| rng.random_range(0..256u32)).collect::<Vec<_>>();
    let sequence = prompt();
    let fillers = (0..FILLERS).map(|_| prompt()).collect();
    let check = InvarianceCheck {
        capture: &capture,
        sequence,
        fillers,
        batch_sizes: runs.batch_sizes.clone(),
        paddings: runs.paddings.clone(),
        chunks: runs.chunks.clone(),
        subject: format!(
            "candle-transformers {} ({} layers, width {}, {}, seed {})",
            config.family,
            config.layers,
            config.vocab_and_width().1,
            if config.dtype == candle_core::DType::BF16 { "bf16" } else { "f32" },
            config.seed
        ),
        device_label: label.into(),
    };
    // As for the gpt: each batching starts both models' caches afresh.
    let models = RefCell::new((model, config.build_every_position_plain(device)?));
    let fresh = || {
        let mut models = models.borrow_mut();
        models.0.clear_kv_cache();
        models.1.clear_kv_cache();
    };
    check.run_with_plain(
        device,
        &mut |tokens, offset| {
            if offset == 0 {
                fresh();
            }
            Ok(models.borrow_mut().0.forward(tokens, offset)?)
        },
        &mut |tokens, offset| {
            if offset == 0 {
                fresh();
            }
            Ok(models.borrow_mut().1.forward(tokens, offset)?)
        },
    )
}
