//! Number and size formatting shared by every human-readable report.

/// A float in short scientific notation (`3.81e-6`), `0` for zero, as numpy prints error sums.
pub fn sci(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else if x.is_nan() {
        "NaN".into()
    } else {
        format!("{x:.2e}")
    }
}

/// An element of dtype `dtype` with every digit it needs to be told from its neighbours: the
/// shortest decimal that reads back as the same value in that dtype (f16 and bf16 through f32,
/// which holds them exactly), so two values one ULP apart never print alike.
pub fn exact(x: f64, dtype: repro_trace::dtype::DType) -> String {
    use repro_trace::dtype::DType;
    match dtype {
        DType::F64 => format!("{x:e}"),
        DType::F32 | DType::F16 | DType::BF16 => format!("{:e}", x as f32),
        DType::U8 | DType::U32 | DType::I16 | DType::I32 | DType::I64 => format!("{x}"),
    }
}

/// A byte count with a binary unit (`1.5 MiB`): the trace crate's, which the recorder shares.
pub use repro_trace::bytes;

/// A shape as `[10000, 1]`, or `scalar`.
pub fn shape(dims: &[u64]) -> String {
    if dims.is_empty() {
        "scalar".into()
    } else {
        format!("{dims:?}")
    }
}

/// A list of step numbers, shortened to the first few and the last when long.
pub fn step_list(steps: &[u64]) -> String {
    const SHOWN: usize = 8;
    let text = |s: &[u64]| s.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
    if steps.len() <= SHOWN {
        text(steps)
    } else {
        format!("{}, ... ({} more), {}", text(&steps[..SHOWN - 1]), steps.len() - SHOWN, steps[steps.len() - 1])
    }
}

/// `` `a.weight` (steps 0 to 9), `b.bias` (step 3) ``: parameters that received no gradient.
pub fn missing_gradients(list: &[repro_trace::MissingGradient]) -> String {
    let described: Vec<String> = list
        .iter()
        .map(|m| {
            let steps = if m.first_step == m.last_step {
                format!("step {}", m.first_step)
            } else {
                format!("{} steps from {} to {}", m.steps, m.first_step, m.last_step)
            };
            format!("`{}` ({steps})", m.name)
        })
        .collect();
    described.join(", ")
}

/// The widest a padded column gets: a longer cell (a tensor name of 70,000 bytes in a crafted
/// trace) overflows its column instead of widening every row, and stays under the formatter's
/// limit on widths (65,535), past which it panics.
pub const MAX_COLUMN: usize = 96;

/// The width of a padded column for cells of these lengths: the longest, at least `min`, at
/// most `MAX_COLUMN`.
pub fn column_width(lengths: impl IntoIterator<Item = usize>, min: usize) -> usize {
    lengths.into_iter().max().unwrap_or(0).max(min).min(MAX_COLUMN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(sci(0.0), "0");
        assert_eq!(sci(3.814697265625e-6), "3.81e-6");
        // One ULP apart, told apart.
        let one = 0.1f32;
        let next = f32::from_bits(one.to_bits() + 1);
        let dtype = repro_trace::dtype::DType::F32;
        assert_ne!(exact(one as f64, dtype), exact(next as f64, dtype));
        assert_eq!(exact(one as f64, dtype), "1e-1");
        assert_eq!(exact(next as f64, dtype).parse::<f32>().unwrap(), next);
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(shape(&[]), "scalar");
        assert_eq!(step_list(&[0, 99]), "0, 99");
        assert_eq!(step_list(&(0..20).collect::<Vec<_>>()), "0, 1, 2, 3, 4, 5, 6, ... (12 more), 19");
    }
}
