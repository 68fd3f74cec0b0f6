//! What one tensor's stored values look like: counts of the special values, the range, mean and
//! spread of the finite ones, and its first few elements. Read window by window, so memory stays
//! flat for tensors of any size, and summed in element order, so the figures are the same on
//! every machine.

use repro_trace::dtype::Element;
use repro_trace::TensorValues;
use serde::Serialize;

/// Statistics of a tensor's values, each element taken as f64.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TensorStats {
    /// Elements.
    pub elements: u64,
    /// NaN elements.
    pub nan: u64,
    /// +inf and -inf elements.
    pub infinite: u64,
    /// Elements equal to zero (either sign).
    pub zeros: u64,
    /// Smallest and largest finite value (`None` when none is finite).
    #[serde(serialize_with = "crate::json_float::option")]
    pub min: Option<f64>,
    /// See `min`.
    #[serde(serialize_with = "crate::json_float::option")]
    pub max: Option<f64>,
    /// Mean of the finite values.
    #[serde(serialize_with = "crate::json_float::option")]
    pub mean: Option<f64>,
    /// Population standard deviation of the finite values.
    #[serde(serialize_with = "crate::json_float::option")]
    pub std: Option<f64>,
    /// The first elements, in row-major order.
    pub first: Vec<f64>,
}

/// The statistics of `values`, with its first `preview` elements.
pub fn tensor_stats(values: &TensorValues, preview: usize) -> TensorStats {
    repro_trace::for_element!(values.dtype, T => stats_of::<T>(values, preview))
}

fn stats_of<T: Element>(values: &TensorValues, preview: usize) -> TensorStats {
    let mut s = TensorStats {
        elements: 0,
        nan: 0,
        infinite: 0,
        zeros: 0,
        min: None,
        max: None,
        mean: None,
        std: None,
        first: Vec::new(),
    };
    // Welford's running mean and sum of squared deviations, element by element in order.
    let (mut finite, mut mean, mut m2) = (0u64, 0f64, 0f64);
    let window = (repro_trace::WINDOW_BYTES / T::SIZE).max(1) * T::SIZE;
    TensorValues::zip_windows(&[values], window, |_, windows| {
        for bytes in windows[0].chunks_exact(T::SIZE) {
            let x = T::load(bytes).value();
            s.elements += 1;
            if s.first.len() < preview {
                s.first.push(x);
            }
            if x.is_nan() {
                s.nan += 1;
                continue;
            }
            if x.is_infinite() {
                s.infinite += 1;
                continue;
            }
            if x == 0.0 {
                s.zeros += 1;
            }
            s.min = Some(s.min.map_or(x, |m| m.min(x)));
            s.max = Some(s.max.map_or(x, |m| m.max(x)));
            finite += 1;
            let delta = x - mean;
            mean += delta / finite as f64;
            m2 += delta * (x - mean);
        }
    });
    if finite > 0 {
        s.mean = Some(mean);
        s.std = Some((m2 / finite as f64).sqrt());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use repro_trace::dtype::DType;

    #[test]
    fn special_values_are_counted_apart_from_the_finite_ones() {
        let v = [1.0f32, f32::NAN, -2.0, f32::INFINITY, 0.0, 4.0];
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        let values = TensorValues::in_memory(DType::F32, vec![6], &bytes);
        let s = tensor_stats(&values, 3);
        assert_eq!((s.elements, s.nan, s.infinite, s.zeros), (6, 1, 1, 1));
        assert_eq!((s.min, s.max), (Some(-2.0), Some(4.0)));
        assert!((s.mean.unwrap() - 0.75).abs() < 1e-12, "{:?}", s.mean);
        let expected_std = ((0.0625 + 7.5625 + 0.5625 + 10.5625) / 4.0f64).sqrt();
        assert!((s.std.unwrap() - expected_std).abs() < 1e-12);
        assert_eq!(s.first.len(), 3);
        assert!(s.first[1].is_nan());
        let none = tensor_stats(&TensorValues::in_memory(DType::F32, vec![1], &f32::NAN.to_le_bytes()), 0);
        assert_eq!((none.min, none.mean, none.std), (None, None, None));
    }
}

/// One element of a tensor in two runs, side by side.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ElementPair {
    /// Its value in A.
    #[serde(serialize_with = "crate::json_float::serialize")]
    pub a: f64,
    /// Its value in B.
    #[serde(serialize_with = "crate::json_float::serialize")]
    pub b: f64,
    /// How many ULPs apart they are (for integers, the integer difference).
    pub ulps: u64,
}

/// The first `n` elements of `a` and `b` (one dtype and size), side by side.
pub fn side_by_side(a: &TensorValues, b: &TensorValues, n: usize) -> Vec<ElementPair> {
    assert_eq!(a.dtype, b.dtype, "side_by_side() needs tensors of one dtype");
    repro_trace::for_element!(a.dtype, T => pairs_of::<T>(a, b, n))
}

fn pairs_of<T: Element>(a: &TensorValues, b: &TensorValues, n: usize) -> Vec<ElementPair> {
    let mut pairs = Vec::with_capacity(n);
    let window = (repro_trace::WINDOW_BYTES / T::SIZE).max(1) * T::SIZE;
    TensorValues::zip_windows(&[a, b], window, |_, windows| {
        for (x, y) in windows[0].chunks_exact(T::SIZE).zip(windows[1].chunks_exact(T::SIZE)) {
            if pairs.len() == n {
                return;
            }
            let (x, y) = (T::load(x), T::load(y));
            pairs.push(ElementPair { a: x.value(), b: y.value(), ulps: x.ordinal().abs_diff(y.ordinal()) });
        }
    });
    pairs
}
