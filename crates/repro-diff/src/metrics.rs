//! Element-wise error metrics between two tensors of the same dtype and shape: how many
//! elements differ, the largest and summed absolute error, and the largest distance in units in
//! the last place (ULPs).
//!
//! Work is split into fixed-size chunks compared in parallel and combined in chunk order, so the
//! result (including the floating-point sum) does not depend on the thread count. Mapped values
//! are read a window of chunks at a time, so memory stays flat however large the tensors.

use rayon::prelude::*;
use repro_trace::dtype::{DType, Element};
use repro_trace::{TensorValues, WINDOW_BYTES};
use serde::Serialize;

/// Differing elements, all zero in one run, that make a difference look like a random mask: a
/// few such elements also come from rounding near zero (a ReLU's input one ULP either side).
const MASK_MIN_ELEMENTS: u64 = 8;

/// Elements per parallel chunk. Fixed, so sums are combined in the same order on every machine.
const CHUNK_ELEMENTS: usize = 1 << 16;

/// How two tensors differ.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TensorMetrics {
    /// Elements compared.
    pub elements: u64,
    /// Elements whose bits differ.
    pub mismatched: u64,
    /// Largest |a - b| (computed in f64).
    #[serde(serialize_with = "crate::json_float::serialize")]
    pub max_abs: f64,
    /// Sum of |a - b| over all elements (f64, summed chunk by chunk in a fixed order).
    #[serde(serialize_with = "crate::json_float::serialize")]
    pub sum_abs: f64,
    /// Largest distance in ULPs (for integers: the largest integer difference).
    pub max_ulp: u64,
    /// Largest relative error |a - b| / max(|a|, |b|) over the elements whose values differ
    /// (+0 against -0 differ in bits only); +inf where one side is infinite, NaN where one is
    /// NaN.
    #[serde(serialize_with = "crate::json_float::serialize")]
    pub max_rel: f64,
    /// Flat index of the first element that differs.
    pub first_mismatch: Option<u64>,
    /// The size of one ULP at the largest finite magnitude among the elements that differ (1
    /// for integers; 0 when nothing finite differs). `max_abs` over it is the largest distance
    /// in ULPs at the scale of the differing values, which does not explode around zero as
    /// `max_ulp` does (a gradient that should be 0 is billions of ULPs from a tiny value).
    #[serde(serialize_with = "crate::json_float::serialize")]
    pub scale_ulp: f64,
    /// Elements that differ with the value zero in one run and not in the other. When every
    /// differing element is such, the difference has the shape of a random mask drawn
    /// differently (dropout), not of rounding.
    pub zero_in_one: u64,
}

impl TensorMetrics {
    fn identical(elements: u64) -> Self {
        TensorMetrics {
            elements,
            mismatched: 0,
            max_abs: 0.0,
            sum_abs: 0.0,
            max_ulp: 0,
            max_rel: 0.0,
            first_mismatch: None,
            scale_ulp: 0.0,
            zero_in_one: 0,
        }
    }

    /// Whether every differing element is zero in exactly one run, and not one or two of them
    /// only: the shape of a random mask (dropout) drawn differently in the two runs.
    pub fn looks_like_a_mask(&self) -> bool {
        self.mismatched >= MASK_MIN_ELEMENTS && self.zero_in_one == self.mismatched
    }

    /// `max_abs` in ULPs at the scale of the differing values (see `scale_ulp`).
    pub fn ulps_at_scale(&self) -> Option<f64> {
        (self.scale_ulp > 0.0 && self.max_abs.is_finite()).then(|| self.max_abs / self.scale_ulp)
    }

    fn merge(mut self, other: TensorMetrics, offset: u64) -> Self {
        self.elements += other.elements;
        self.mismatched += other.mismatched;
        self.max_abs = max_nan(self.max_abs, other.max_abs);
        self.sum_abs += other.sum_abs;
        self.zero_in_one += other.zero_in_one;
        self.max_ulp = self.max_ulp.max(other.max_ulp);
        self.max_rel = max_nan(self.max_rel, other.max_rel);
        // Until `with_scale`, this holds the largest differing magnitude.
        self.scale_ulp = self.scale_ulp.max(other.scale_ulp);
        if self.first_mismatch.is_none() {
            self.first_mismatch = other.first_mismatch.map(|i| i + offset);
        }
        self
    }
}

/// NaN-propagating max: a NaN error (one side NaN) must not vanish from the summary.
fn max_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// Compares the element bytes of two tensors of dtype `dtype`. Both slices must hold the same
/// whole number of elements.
pub fn compare(dtype: DType, a: &[u8], b: &[u8]) -> TensorMetrics {
    assert_eq!(a.len(), b.len(), "compare() needs equal-sized tensors");
    with_scale(fold_chunks(TensorMetrics::identical(0), dtype, a, b, 0), dtype)
}

/// Turns the largest differing magnitude the chunks found into the size of one ULP there.
fn with_scale(mut m: TensorMetrics, dtype: DType) -> TensorMetrics {
    let magnitude = m.scale_ulp;
    let mantissa_bits = match dtype {
        DType::F16 => 10,
        DType::BF16 => 7,
        DType::F32 => 23,
        DType::F64 => 52,
        DType::U8 | DType::U32 | DType::I16 | DType::I32 | DType::I64 => {
            m.scale_ulp = if m.mismatched > 0 { 1.0 } else { 0.0 };
            return m;
        }
    };
    m.scale_ulp = if magnitude > 0.0 { 2f64.powi(magnitude.log2().floor() as i32 - mantissa_bits) } else { 0.0 };
    m
}

/// Compares two tensors' values (of equal dtype and size) in bounded memory. The result is
/// [`compare`]'s, bit for bit.
pub fn compare_values(a: &TensorValues, b: &TensorValues) -> TensorMetrics {
    compare_pairs(&[a, b])[0]
}

/// Compares every pair of `tensors` (all of one dtype and size), reading each window of them
/// once: returns the metrics of pairs (0, 1), (0, 2), …, (1, 2), … in that order, each equal
/// to [`compare`]'s.
pub fn compare_pairs(tensors: &[&TensorValues]) -> Vec<TensorMetrics> {
    let Some(first) = tensors.first() else { return Vec::new() };
    let dtype = first.dtype;
    assert!(tensors.iter().all(|t| t.dtype == dtype), "compare_pairs() needs tensors of one dtype");
    let pairs: Vec<(usize, usize)> =
        (0..tensors.len()).flat_map(|i| (i + 1..tensors.len()).map(move |j| (i, j))).collect();
    let mut metrics = vec![TensorMetrics::identical(0); pairs.len()];
    let chunk_bytes = CHUNK_ELEMENTS * dtype.size_in_bytes();
    let window = (WINDOW_BYTES / chunk_bytes).max(1) * chunk_bytes;
    TensorValues::zip_windows(tensors, window, |start, windows| {
        let first_element = (start / dtype.size_in_bytes()) as u64;
        for (m, &(i, j)) in metrics.iter_mut().zip(&pairs) {
            *m = fold_chunks(*m, dtype, windows[i], windows[j], first_element);
        }
    });
    metrics.into_iter().map(|m| with_scale(m, dtype)).collect()
}

/// Compares `a` and `b` chunk by chunk in parallel and folds the chunks' metrics into `acc` in
/// chunk order. `a` starts at element `first_element` of its tensor and, unless it ends the
/// tensor, holds whole chunks; so folding a tensor's windows in order equals one pass.
fn fold_chunks(acc: TensorMetrics, dtype: DType, a: &[u8], b: &[u8], first_element: u64) -> TensorMetrics {
    let chunk_bytes = CHUNK_ELEMENTS * dtype.size_in_bytes();
    let partials: Vec<TensorMetrics> =
        a.par_chunks(chunk_bytes).zip(b.par_chunks(chunk_bytes)).map(|(ca, cb)| compare_chunk(dtype, ca, cb)).collect();
    partials.into_iter().enumerate().fold(acc, |acc, (i, p)| acc.merge(p, first_element + (i * CHUNK_ELEMENTS) as u64))
}

fn compare_chunk(dtype: DType, a: &[u8], b: &[u8]) -> TensorMetrics {
    repro_trace::for_element!(dtype, T => compare_typed::<T>(a, b))
}

fn compare_typed<T: Element>(a: &[u8], b: &[u8]) -> TensorMetrics {
    let n = a.len() / T::SIZE;
    let mut m = TensorMetrics::identical(n as u64);
    if a == b {
        return m;
    }
    // Local accumulators keep the loop free of branches on the metrics struct; a NaN error
    // (one side NaN) is tracked on the side because `f64::max` would drop it.
    let (mut mismatched, mut max_abs, mut sum_abs, mut max_ulp, mut any_nan) = (0u64, 0f64, 0f64, 0u64, false);
    let mut max_rel = 0f64;
    let mut magnitude = 0f64;
    let mut zero_in_one = 0u64;
    let mut first = None;
    for (i, (ea, eb)) in a.chunks_exact(T::SIZE).zip(b.chunks_exact(T::SIZE)).enumerate() {
        let (x, y) = (T::load(ea), T::load(eb));
        if x.bits() == y.bits() {
            continue;
        }
        mismatched += 1;
        first.get_or_insert(i as u64);
        zero_in_one += u64::from((x.value() == 0.0) != (y.value() == 0.0));
        let abs = (x.value() - y.value()).abs();
        any_nan |= abs.is_nan();
        max_abs = max_abs.max(abs);
        sum_abs += abs;
        max_ulp = max_ulp.max(x.ordinal().abs_diff(y.ordinal()));
        // +0 and -0 differ in bits but not in value: no relative error. Against an infinity
        // the relative error is infinite (the quotient would be inf / inf, NaN, which `max`
        // drops: `rel:X` once accepted 1.0 against +inf).
        let larger = x.value().abs().max(y.value().abs());
        if larger.is_finite() {
            magnitude = magnitude.max(larger);
        }
        if abs > 0.0 {
            let scale = larger;
            max_rel = max_rel.max(if scale.is_infinite() { f64::INFINITY } else { abs / scale });
        }
    }
    m.mismatched = mismatched;
    m.max_abs = if any_nan { f64::NAN } else { max_abs };
    m.sum_abs = sum_abs;
    m.max_ulp = max_ulp;
    m.max_rel = if any_nan { f64::NAN } else { max_rel };
    m.first_mismatch = first;
    m.scale_ulp = magnitude;
    m.zero_in_one = zero_in_one;
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// A straightforward reference: one loop, no chunks.
    fn reference(a: &[f32], b: &[f32]) -> (u64, f64, f64, u64) {
        let mut out = (0u64, 0f64, 0f64, 0u64);
        for (x, y) in a.iter().zip(b) {
            if x.to_bits() != y.to_bits() {
                out.0 += 1;
                let d = (*x as f64 - *y as f64).abs();
                out.1 = out.1.max(d);
                out.2 += d;
                let ord = |v: f32| {
                    let bits = v.to_bits();
                    let m = (bits & 0x7fff_ffff) as i64;
                    if bits >> 31 == 1 {
                        -m
                    } else {
                        m
                    }
                };
                out.3 = out.3.max(ord(*x).abs_diff(ord(*y)));
            }
        }
        out
    }

    #[test]
    fn a_mask_drawn_otherwise_is_told_from_rounding() {
        let x: Vec<f32> = (1..=64).map(|i| i as f32 * 0.25).collect();
        let mask = |keep: fn(usize) -> bool| -> Vec<f32> {
            x.iter().enumerate().map(|(i, v)| if keep(i) { v * 2.0 } else { 0.0 }).collect()
        };
        let (a, b) = (mask(|i| i % 2 == 0), mask(|i| i % 3 == 0));
        let m = compare(DType::F32, &bytes(&a), &bytes(&b));
        assert!(m.mismatched > 8 && m.zero_in_one == m.mismatched && m.looks_like_a_mask(), "{m:?}");
        // Rounding moves values by ULPs, zeros stay zeros.
        let nudged: Vec<f32> =
            a.iter().map(|v| if *v == 0.0 { 0.0 } else { f32::from_bits(v.to_bits() + 1) }).collect();
        let m = compare(DType::F32, &bytes(&a), &bytes(&nudged));
        assert!(m.mismatched > 8 && m.zero_in_one == 0 && !m.looks_like_a_mask(), "{m:?}");
        // One zero against a tiny value is no mask.
        let mut one = a.clone();
        one[1] = 1e-30;
        assert!(!compare(DType::F32, &bytes(&a), &bytes(&one)).looks_like_a_mask());
    }

    #[test]
    fn matches_reference_across_chunks() {
        let n = CHUNK_ELEMENTS * 2 + 123;
        let a: Vec<f32> = (0..n).map(|i| (i as f32).sin()).collect();
        let mut b = a.clone();
        for i in (0..n).step_by(997) {
            b[i] = f32::from_bits(b[i].to_bits() + (i % 5) as u32);
        }
        let m = compare(DType::F32, &bytes(&a), &bytes(&b));
        let (mismatched, max_abs, _, max_ulp) = reference(&a, &b);
        assert_eq!(m.elements, n as u64);
        assert_eq!(m.mismatched, mismatched);
        assert_eq!(m.max_abs, max_abs);
        assert_eq!(m.max_ulp, max_ulp);
        assert_eq!(m.first_mismatch, Some(997));
    }

    #[test]
    fn windowed_comparison_is_the_one_pass_comparison_bit_for_bit() {
        // Several windows of f64 with a short last one; differences spread so that the summed
        // error depends on the order of addition.
        let n = 3 * WINDOW_BYTES / 8 / 2 + 4321;
        let a: Vec<f64> = (0..n).map(|i| (i as f64 * 0.37).sin() * 1e3).collect();
        let b: Vec<f64> =
            a.iter().enumerate().map(|(i, x)| if i % 3 == 0 { x + (i as f64).sqrt() } else { *x }).collect();
        let c: Vec<f64> = a.iter().map(|x| x * (1.0 + 1e-9)).collect();
        let bytes64 = |v: &[f64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let (ba, bb, bc) = (bytes64(&a), bytes64(&b), bytes64(&c));
        let values = [&ba, &bb, &bc].map(|bytes| TensorValues::in_memory(DType::F64, vec![n as u64], bytes));
        let pairs = compare_pairs(&[&values[0], &values[1], &values[2]]);
        let expected = [compare(DType::F64, &ba, &bb), compare(DType::F64, &ba, &bc), compare(DType::F64, &bb, &bc)];
        assert_eq!(pairs, expected);
        assert_eq!(pairs[0].sum_abs.to_bits(), expected[0].sum_abs.to_bits());
        assert_eq!(compare_values(&values[0], &values[1]), expected[0]);
        assert!(pairs.iter().all(|m| m.mismatched > 0), "every pair differs");
    }

    #[test]
    fn one_ulp_is_one_ulp() {
        let a = [1.0f32, 2.0];
        let b = [1.0f32, f32::from_bits(2.0f32.to_bits() + 1)];
        let m = compare(DType::F32, &bytes(&a), &bytes(&b));
        assert_eq!((m.mismatched, m.max_ulp, m.first_mismatch), (1, 1, Some(1)));
        assert_eq!(m.max_abs, 2.0f64.powi(-22));
    }

    #[test]
    fn an_infinity_against_a_finite_value_has_infinite_relative_error() {
        let m = compare(DType::F32, &bytes(&[1.0, f32::INFINITY]), &bytes(&[1.0, 1.0]));
        assert_eq!((m.max_abs, m.max_rel), (f64::INFINITY, f64::INFINITY));
        let m = compare(DType::F32, &bytes(&[f32::INFINITY]), &bytes(&[f32::NEG_INFINITY]));
        assert_eq!((m.max_abs, m.max_rel), (f64::INFINITY, f64::INFINITY));
        for tolerance in ["rel:0.5", "abs:1e30", "ulp:1"] {
            let tolerance: crate::Tolerance = tolerance.parse().unwrap();
            let next_to_max = compare(DType::F32, &bytes(&[f32::MAX]), &bytes(&[f32::INFINITY]));
            assert_eq!(next_to_max.max_ulp, 1);
            assert!(!tolerance.allows(&m) && !tolerance.allows(&next_to_max), "{tolerance}");
        }
    }

    #[test]
    fn ulps_at_the_differing_values_scale_do_not_explode_around_zero() {
        // A gradient that should be 0 against 5.8e-11, beside a 1-ULP difference at 1.0.
        let a = bytes(&[1.0, 0.0]);
        let b = bytes(&[f32::from_bits(1.0f32.to_bits() + 1), 5.8e-11]);
        let m = compare(DType::F32, &a, &b);
        assert!(m.max_ulp > 700_000_000, "{}", m.max_ulp);
        assert_eq!(m.scale_ulp, 2f64.powi(-23), "one ULP at 1.0");
        assert!(m.ulps_at_scale().unwrap() <= 1.0, "{:?}", m.ulps_at_scale());
        // Where the difference is at the largest value, both figures agree.
        let m = compare(DType::F32, &bytes(&[3.0]), &bytes(&[f32::from_bits(3.0f32.to_bits() + 2)]));
        assert_eq!((m.max_ulp, m.ulps_at_scale()), (2, Some(2.0)));
        let m = compare(DType::I32, &7i32.to_le_bytes(), &9i32.to_le_bytes());
        assert_eq!(m.ulps_at_scale(), Some(2.0), "integers: one unit");
        assert_eq!(compare(DType::F32, &a, &a).ulps_at_scale(), None);
    }

    #[test]
    fn identical_and_nan() {
        let a = bytes(&[1.0, f32::NAN]);
        assert_eq!(compare(DType::F32, &a, &a).mismatched, 0);
        let b = bytes(&[1.0, 0.0]);
        assert!(compare(DType::F32, &a, &b).max_abs.is_nan());
    }
}
