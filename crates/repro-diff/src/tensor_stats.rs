//! What one tensor's stored values look like: counts of the special values, the range, mean and
//! spread of the finite ones, and its first few elements. Read window by window, so memory stays
//! flat for tensors of any size, in fixed-size chunks summed in parallel and merged in chunk
//! order, so the figures are the same on every machine and thread count.

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

/// Elements per parallel chunk. Fixed, so that the chunks' sums are merged in the same order,
/// and give the same figures, on every machine and thread count.
const CHUNK_ELEMENTS: usize = 1 << 16;

/// Accumulators of a chunk's sums (see `Partial::of`).
const LANES: usize = 4;

/// The figures of one run of elements, merged with the next run's in element order.
#[derive(Clone, Copy, Default)]
struct Partial {
    elements: u64,
    nan: u64,
    infinite: u64,
    zeros: u64,
    min: Option<f64>,
    max: Option<f64>,
    /// Finite elements, their mean and their sum of squared deviations from it.
    finite: u64,
    mean: f64,
    m2: f64,
}

impl Partial {
    fn of<T: Element>(bytes: &[u8]) -> Partial {
        let mut p = Partial { elements: (bytes.len() / T::SIZE) as u64, ..Partial::default() };
        // Two passes over a chunk that sits in cache, without a division or a branch per
        // element: the sum (and the counts and extremes), then the squared deviations from the
        // chunk's mean. A non-finite element adds 0 and moves neither extreme. The sums run in
        // `LANES` interleaved accumulators, added up in lane order: one chain of dependent
        // additions would leave the CPU waiting on each.
        let (mut sum, mut min, mut max) = ([0f64; LANES], f64::INFINITY, f64::NEG_INFINITY);
        let (mut nan, mut finite_count, mut zeros) = (0u64, 0u64, 0u64);
        by_lane::<T>(bytes, |lane, x| {
            let finite = x.is_finite();
            nan += u64::from(x.is_nan());
            finite_count += u64::from(finite);
            zeros += u64::from(x == 0.0);
            let x = if finite { x } else { 0.0 };
            sum[lane] += x;
            min = if finite && x < min { x } else { min };
            max = if finite && x > max { x } else { max };
        });
        (p.nan, p.finite, p.zeros) = (nan, finite_count, zeros);
        p.infinite = p.elements - p.nan - p.finite;
        if p.finite == 0 {
            return p;
        }
        (p.min, p.max) = (Some(min), Some(max));
        let mean = sum.iter().sum::<f64>() / p.finite as f64;
        let mut m2 = [0f64; LANES];
        by_lane::<T>(bytes, |lane, x| {
            let deviation = if x.is_finite() { x - mean } else { 0.0 };
            m2[lane] += deviation * deviation;
        });
        (p.mean, p.m2) = (mean, m2.iter().sum());
        p
    }

    /// This run followed by `next` (Chan et al.'s merge of means and squared deviations).
    fn then(self, next: Partial) -> Partial {
        let finite = self.finite + next.finite;
        let (mean, m2) = match (self.finite, next.finite) {
            (0, _) => (next.mean, next.m2),
            (_, 0) => (self.mean, self.m2),
            (a, b) => {
                let delta = next.mean - self.mean;
                let (a, b, n) = (a as f64, b as f64, finite as f64);
                (self.mean + delta * b / n, self.m2 + next.m2 + delta * delta * a * b / n)
            }
        };
        let pick = |x: Option<f64>, y: Option<f64>, f: fn(f64, f64) -> f64| match (x, y) {
            (Some(x), Some(y)) => Some(f(x, y)),
            (x, y) => x.or(y),
        };
        Partial {
            elements: self.elements + next.elements,
            nan: self.nan + next.nan,
            infinite: self.infinite + next.infinite,
            zeros: self.zeros + next.zeros,
            min: pick(self.min, next.min, f64::min),
            max: pick(self.max, next.max, f64::max),
            finite,
            mean,
            m2,
        }
    }
}

/// Calls `pass` with each element of `bytes` in order, as `f64`, and its lane (its index modulo
/// `LANES`).
#[inline]
fn by_lane<T: Element>(bytes: &[u8], mut pass: impl FnMut(usize, f64)) {
    let mut groups = bytes.chunks_exact(T::SIZE * LANES);
    for group in &mut groups {
        for (lane, e) in group.chunks_exact(T::SIZE).enumerate() {
            pass(lane, T::load(e).value());
        }
    }
    for (lane, e) in groups.remainder().chunks_exact(T::SIZE).enumerate() {
        pass(lane, T::load(e).value());
    }
}

fn stats_of<T: Element>(values: &TensorValues, preview: usize) -> TensorStats {
    use rayon::prelude::*;
    let mut first = Vec::with_capacity(preview);
    let mut all = Partial::default();
    let chunk = CHUNK_ELEMENTS * T::SIZE;
    let window = (repro_trace::WINDOW_BYTES / chunk).max(1) * chunk;
    TensorValues::zip_windows(&[values], window, |_, windows| {
        let bytes = windows[0];
        for element in bytes.chunks_exact(T::SIZE).take(preview.saturating_sub(first.len())) {
            first.push(T::load(element).value());
        }
        // Chunks in parallel, merged in chunk order: the same figures on any thread count.
        let parts: Vec<Partial> = bytes.par_chunks(chunk).map(Partial::of::<T>).collect();
        all = parts.into_iter().fold(all, Partial::then);
    });
    TensorStats {
        elements: all.elements,
        nan: all.nan,
        infinite: all.infinite,
        zeros: all.zeros,
        min: all.min,
        max: all.max,
        mean: (all.finite > 0).then_some(all.mean),
        std: (all.finite > 0).then(|| (all.m2 / all.finite as f64).sqrt()),
        first,
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

    #[test]
    fn chunks_merged_in_order_give_the_one_pass_figures() {
        let n = CHUNK_ELEMENTS * 3 + 17;
        let v: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 * 0.001 - 0.3).collect();
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        let s = tensor_stats(&TensorValues::in_memory(DType::F32, vec![n as u64], &bytes), 4);
        let one = Partial::of::<f32>(&bytes);
        assert_eq!((s.elements, s.zeros), (one.elements, one.zeros));
        assert_eq!((s.min, s.max), (one.min, one.max));
        assert!((s.mean.unwrap() - one.mean).abs() < 1e-12, "{:?} vs {}", s.mean, one.mean);
        assert!((s.std.unwrap() - (one.m2 / one.finite as f64).sqrt()).abs() < 1e-9);
        assert_eq!(s.first, v[..4].iter().map(|&x| x as f64).collect::<Vec<_>>());
    }
}
