//! What the gpt's batch-invariant mode costs: forward passes at given batch sizes with candle's
//! kernels and with `ops::invariant`'s, timed on the device (warm-up first, then the median of
//! several passes, each waited for).

use crate::diff::invariance::{ForwardCost, ForwardCostReport};
use crate::record::RecordError;
use crate::workloads::GptConfig;
use candle_core::{DType, Device, Tensor};
use std::time::Instant;

/// Passes run before timing (kernel compilation, allocator warm-up).
const WARM_UP: usize = 3;

/// Times the gpt's forward pass (logits for every position of `config.context` tokens) at each
/// batch size, default kernels against batch-invariant ones, with weights and activations in
/// `dtype` (bf16: candle's cuBLAS products against the tensor-core kernel); `passes` timed
/// passes each.
pub fn gpt_forward_cost(
    config: &GptConfig,
    batch_sizes: &[usize],
    passes: usize,
    dtype: DType,
    device: &Device,
    label: &str,
) -> Result<ForwardCostReport, RecordError> {
    let passes = passes.max(1);
    let modes = [false, true].map(|batch_invariant| GptConfig { batch_invariant, ..config.clone() });
    let models = modes.iter().map(|c| c.build_for_inference(device, dtype)).collect::<Result<Vec<_>, RecordError>>()?;
    let windows = config.probe_windows(batch_sizes.iter().copied().max().unwrap_or(1))?;
    let mut costs = Vec::new();
    for &batch in batch_sizes {
        let ids: Vec<u32> = windows.iter().take(batch).flat_map(|w| w[..config.context].iter().copied()).collect();
        let tokens = Tensor::from_vec(ids, (batch, config.context), &Device::Cpu)?.to_device(device)?;
        let mut median_ms = [0.0; 2];
        let mut logits = Vec::new();
        for (mode, model) in models.iter().enumerate() {
            let mut times = Vec::with_capacity(passes);
            for pass in 0..WARM_UP + passes {
                let start = Instant::now();
                let out = model.forward(&tokens)?;
                device.synchronize()?;
                if pass >= WARM_UP {
                    times.push(start.elapsed().as_secs_f64() * 1e3);
                }
                if pass == 0 {
                    // The weights are plain tensors, so the logits hold no graph: the passes
                    // keep no activation alive (with variables, a 100M-parameter gpt at batch
                    // 32 ran out of an 80 GB GPU).
                    logits.push(out);
                }
            }
            times.sort_by(f64::total_cmp);
            median_ms[mode] = times[times.len() / 2];
        }
        // Both compute the same function: only the rounding may differ.
        let max_abs_diff =
            (logits[0].to_dtype(DType::F32)? - logits[1].to_dtype(DType::F32)?)?.abs()?.max_all()?.to_scalar::<f32>()?
                as f64;
        costs.push(ForwardCost {
            batch,
            tokens: config.context,
            default_ms: median_ms[0],
            invariant_ms: median_ms[1],
            max_abs_diff,
        });
    }
    Ok(ForwardCostReport {
        subject: format!(
            "gpt ({} layers, width {}{})",
            config.layers,
            config.width,
            if dtype == DType::BF16 { ", bf16" } else { "" }
        ),
        device: label.into(),
        passes,
        costs,
    })
}
