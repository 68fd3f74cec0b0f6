//! The batch-invariance check on the built-in models: the gpt (seeded initial weights, sequences
//! from its corpus) and candle-transformers' Qwen2 from its unmodified source (seeded weights,
//! seeded byte prompts), their graph nodes named after the models' `tracing` spans.

use super::InvarianceCheck;
use crate::capture::{ModelCapture, SpanScopes};
use crate::diff::invariance::InvarianceReport;
use crate::record::RecordError;
use crate::workloads::seeded::stream;
use crate::workloads::{GptConfig, Qwen2Config};
use candle_core::Device;
use rand::Rng;

/// Sequences in the check besides the one checked: batches reuse them in turn.
const FILLERS: usize = 16;

/// Checks the gpt's forward pass. The sequence leaves room in the model's context for the
/// largest padding.
pub fn gpt(
    config: &GptConfig,
    batch_sizes: &[usize],
    paddings: &[usize],
    device: &Device,
    label: &str,
) -> Result<InvarianceReport, RecordError> {
    let room = paddings.iter().copied().max().unwrap_or(0);
    if room >= config.context {
        return Err(RecordError::Unsupported(format!(
            "a padding of {room} leaves no room for a sequence in the gpt's context of {} tokens",
            config.context
        )));
    }
    let _spans = span_scopes();
    let (model, varmap) = config.build(device)?;
    let capture = ModelCapture::new(&varmap);
    let tokens = config.context - room;
    let mut windows: Vec<Vec<u32>> =
        config.probe_windows(FILLERS + 1)?.into_iter().map(|w| w[..tokens].to_vec()).collect();
    let sequence = windows.remove(0);
    let check = InvarianceCheck {
        capture: &capture,
        sequence,
        fillers: windows,
        batch_sizes: batch_sizes.to_vec(),
        paddings: paddings.to_vec(),
        subject: format!("gpt ({} layers, width {}, seed {}, untrained)", config.layers, config.width, config.seed),
        device_label: label.into(),
    };
    check.run(device, &mut |tokens| Ok(model.forward(tokens)?))
}

/// Checks candle-transformers' Qwen2 (prefill from an empty KV cache; its logits are the last
/// position's).
pub fn qwen2(
    config: &Qwen2Config,
    batch_sizes: &[usize],
    device: &Device,
    label: &str,
) -> Result<InvarianceReport, RecordError> {
    let _spans = span_scopes();
    let (mut model, varmap) = config.build(device)?;
    let capture = ModelCapture::new(&varmap);
    let mut rng = stream(config.data_seed, "qwen2.invariance", 0);
    let mut prompt = || (0..config.tokens).map(|_| rng.random_range(0..256u32)).collect::<Vec<_>>();
    let sequence = prompt();
    let fillers = (0..FILLERS).map(|_| prompt()).collect();
    let check = InvarianceCheck {
        capture: &capture,
        sequence,
        fillers,
        batch_sizes: batch_sizes.to_vec(),
        // Its logits are the last position's: with padding that would be a pad token's.
        paddings: Vec::new(),
        subject: format!(
            "candle-transformers qwen2 ({} layers, width {}, {}, seed {})",
            config.layers,
            config.width,
            if config.dtype == candle_core::DType::BF16 { "bf16" } else { "f32" },
            config.seed
        ),
        device_label: label.into(),
    };
    check.run(device, &mut |tokens| {
        model.clear_kv_cache();
        Ok(model.forward(tokens, 0)?)
    })
}

/// Names graph nodes after the models' spans, on this thread, until dropped.
fn span_scopes() -> tracing::subscriber::DefaultGuard {
    use tracing_subscriber::layer::SubscriberExt;
    tracing::subscriber::set_default(tracing_subscriber::registry().with(SpanScopes))
}
