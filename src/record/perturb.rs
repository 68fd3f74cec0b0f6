//! Fault injection: `--perturb STEP:TENSOR:ULPS[@ELEMENT]` moves one element (the first unless
//! `@ELEMENT` says which, in row-major order) of one named tensor by a number of units in the
//! last place at one step, so users and tests can check that a change of known size, place and
//! time is found. A workload that knows which elements a step reads refuses one that it does
//! not (the gpt: the embedding of a byte its corpus never holds), since moving it would change
//! nothing.
//!
//! The element is multiplied by a factor one ULP away from 1 and then shifted so that it lands
//! exactly `ULPS` steps away. The factor also scales the gradient flowing back through that
//! element, so a perturbed loss changes the gradients too, the way a slightly different loss
//! computation would; the rest of the tensor keeps its exact bits.

use super::error::RecordError;
use candle_core::{DType, Tensor};
use std::fmt;
use std::str::FromStr;

/// A planted change: at `step`, move element `element` of tensor `tensor` by `ulps` ULPs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Perturbation {
    /// The step at which to perturb.
    pub step: u64,
    /// The recorded name of the tensor to perturb.
    pub tensor: String,
    /// How many ULPs to move (negative moves down).
    pub ulps: i64,
    /// Which element, in row-major order (0 unless given).
    pub element: u64,
}

impl FromStr for Perturbation {
    type Err = RecordError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            RecordError::Unsupported(format!(
                "invalid perturbation `{s}`: expected STEP:TENSOR:ULPS[@ELEMENT], e.g. 5:loss:1 or 2:wte.weight:3@4096"
            ))
        };
        let mut parts = s.splitn(3, ':');
        let step = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let tensor = parts.next().filter(|t| !t.is_empty()).ok_or_else(bad)?.to_string();
        let rest = parts.next().ok_or_else(bad)?;
        let (ulps, element) = match rest.split_once('@') {
            Some((ulps, element)) => (ulps, element.parse::<u64>().map_err(|_| bad())?),
            None => (rest, 0),
        };
        let ulps: i64 = ulps.parse().ok().filter(|&u| u != 0).ok_or_else(bad)?;
        Ok(Perturbation { step, tensor, ulps, element })
    }
}

impl fmt::Display for Perturbation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.step, self.tensor, self.ulps)?;
        // Element 0 is written as before the element could be chosen: traces keep their header.
        if self.element != 0 {
            write!(f, "@{}", self.element)?;
        }
        Ok(())
    }
}

impl Perturbation {
    /// The error for a move past the largest finite float.
    fn out_of_range(&self, name: &str, x: f64) -> RecordError {
        RecordError::Unsupported(format!(
            "--perturb {self}: moving element {} of `{name}` ({x:e}) by {} ULPs leaves the finite floats; choose fewer",
            self.element, self.ulps
        ))
    }

    /// Returns `tensor` perturbed if this perturbation targets `name` at `step`, otherwise
    /// `tensor` itself.
    pub fn apply(&self, step: u64, name: &str, tensor: &Tensor) -> Result<Tensor, RecordError> {
        if step != self.step || name != self.tensor {
            return Ok(tensor.clone());
        }
        let flat = tensor.flatten_all()?;
        let n = flat.elem_count();
        let at = self.element as usize;
        if self.element >= n as u64 {
            return Err(RecordError::Unsupported(format!(
                "--perturb {self}: `{name}` has {n} elements, so there is no element {}",
                self.element
            )));
        }
        // The element becomes `x * m - s`: `m` is one ULP away from 1 (so the gradient through
        // the element is scaled too), and `s` corrects the product to land exactly on the
        // target. Every other element is `x * 1 - (+0)`, which leaves its bits unchanged.
        let (factor, shift) = match tensor.dtype() {
            DType::F32 => {
                let x = flat.get(at)?.to_scalar::<f32>()?;
                let target = nudge_f32(x, self.ulps).ok_or_else(|| self.out_of_range(name, x as f64))?;
                let m = nudge_f32(1.0, self.ulps.signum()).expect("1 ULP from 1 is finite");
                (m as f64, ((x * m) as f64 - target as f64))
            }
            DType::F64 => {
                let x = flat.get(at)?.to_scalar::<f64>()?;
                let target = nudge_f64(x, self.ulps).ok_or_else(|| self.out_of_range(name, x))?;
                let m = nudge_f64(1.0, self.ulps.signum()).expect("1 ULP from 1 is finite");
                (m, x * m - target)
            }
            other => {
                return Err(RecordError::Unsupported(format!(
                    "cannot perturb `{name}` of dtype {other:?}: perturbation supports F32 and F64"
                )))
            }
        };
        let mut factors = vec![1.0f64; n];
        factors[at] = factor;
        let mut shifts = vec![0.0f64; n];
        shifts[at] = shift;
        let dev = tensor.device();
        let factors = Tensor::from_vec(factors, tensor.shape(), dev)?.to_dtype(tensor.dtype())?;
        let shifts = Tensor::from_vec(shifts, tensor.shape(), dev)?.to_dtype(tensor.dtype())?;
        Ok(tensor.mul(&factors)?.sub(&shifts)?)
    }
}

/// The float `ulps` representable values away from `x`, or `None` past the finite floats
/// (no silent wrap-around).
fn nudge_f32(x: f32, ulps: i64) -> Option<f32> {
    let ord = ordinal_f32(x).checked_add(ulps)?;
    if ord.unsigned_abs() > 0x7f7f_ffff {
        return None;
    }
    let bits = if ord >= 0 { ord as u32 } else { (-ord) as u32 | 0x8000_0000 };
    Some(f32::from_bits(bits))
}

fn ordinal_f32(x: f32) -> i64 {
    let b = x.to_bits();
    let m = (b & 0x7fff_ffff) as i64;
    if b & 0x8000_0000 != 0 {
        -m
    } else {
        m
    }
}

fn nudge_f64(x: f64, ulps: i64) -> Option<f64> {
    let b = x.to_bits();
    let m = (b & 0x7fff_ffff_ffff_ffff) as i128;
    let ord = if b >> 63 == 1 { -m } else { m } + ulps as i128;
    if ord.unsigned_abs() > 0x7fef_ffff_ffff_ffff {
        return None;
    }
    let bits = if ord >= 0 { ord as u64 } else { (-ord) as u64 | 1 << 63 };
    Some(f64::from_bits(bits))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn parses_and_rejects() {
        let p: Perturbation = "5:loss:1".parse().unwrap();
        assert_eq!(p, Perturbation { step: 5, tensor: "loss".into(), ulps: 1, element: 0 });
        assert_eq!(p.to_string(), "5:loss:1");
        assert_eq!("3:a.b:-2".parse::<Perturbation>().unwrap().ulps, -2);
        for bad in ["5:loss", "x:loss:1", "5::1", "5:loss:0", "5:loss:1.5", "5:loss:1@", "5:loss:1@-1", "5:loss:@3"] {
            assert!(bad.parse::<Perturbation>().is_err(), "{bad}");
        }
        let p: Perturbation = "2:wte.weight:-3@4096".parse().unwrap();
        assert_eq!((p.ulps, p.element), (-3, 4096));
        assert_eq!(p.to_string(), "2:wte.weight:-3@4096");
    }

    #[test]
    fn a_chosen_element_moves_and_one_past_the_end_is_refused() {
        let values = [0.1f32, -3.7, 0.25];
        let t = Tensor::new(&values, &Device::Cpu).unwrap();
        let p = Perturbation { step: 0, tensor: "x".into(), ulps: 2, element: 2 };
        let out: Vec<f32> = p.apply(0, "x", &t).unwrap().to_vec1().unwrap();
        assert_eq!(ordinal_f32(out[2]) - ordinal_f32(values[2]), 2);
        assert_eq!((out[0].to_bits(), out[1].to_bits()), (values[0].to_bits(), values[1].to_bits()));
        let past = Perturbation { element: 3, ..p };
        let err = past.apply(0, "x", &t).unwrap_err().to_string();
        assert!(err.contains("has 3 elements, so there is no element 3"), "{err}");
    }

    #[test]
    fn moves_first_element_by_exactly_n_ulps_and_nothing_else() {
        let values = [0.1f32, -3.7, 0.0, -0.0, 1e-30];
        let t = Tensor::new(&values, &Device::Cpu).unwrap();
        for ulps in [1i64, -1, 3] {
            let p = Perturbation { step: 2, tensor: "x".into(), ulps, element: 0 };
            let out: Vec<f32> = p.apply(2, "x", &t).unwrap().to_vec1().unwrap();
            assert_eq!(ordinal_f32(out[0]) - ordinal_f32(values[0]), ulps);
            for i in 1..values.len() {
                assert_eq!(out[i].to_bits(), values[i].to_bits(), "element {i}");
            }
            let untouched: Vec<f32> = p.apply(3, "x", &t).unwrap().to_vec1().unwrap();
            assert_eq!(untouched, values);
        }
    }

    #[test]
    fn zero_and_scalar_targets_move_too() {
        let zero = Tensor::new(&[0.0f32, -0.0], &Device::Cpu).unwrap();
        let p = Perturbation { step: 0, tensor: "z".into(), ulps: 1, element: 0 };
        let out: Vec<f32> = p.apply(0, "z", &zero).unwrap().to_vec1().unwrap();
        assert_eq!(out[0].to_bits(), 1);
        assert_eq!(out[1].to_bits(), (-0.0f32).to_bits());
        let scalar = Tensor::new(2.5f64, &Device::Cpu).unwrap();
        let out = p.apply(0, "z", &scalar).unwrap().to_scalar::<f64>().unwrap();
        assert_eq!(out.to_bits(), 2.5f64.to_bits() + 1);
    }
}

#[cfg(test)]
mod gradient_tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn perturbed_loss_changes_the_gradient() {
        let x = Var::new(&[0.3f32, -1.7, 2.9], &Device::Cpu).unwrap();
        let loss = x.as_tensor().sqr().unwrap().sum_all().unwrap();
        let p = Perturbation { step: 0, tensor: "loss".into(), ulps: 1, element: 0 };
        let perturbed = p.apply(0, "loss", &loss).unwrap();
        let g0: Vec<f32> = loss.backward().unwrap().get(&x).unwrap().to_vec1().unwrap();
        let g1: Vec<f32> = perturbed.backward().unwrap().get(&x).unwrap().to_vec1().unwrap();
        assert_ne!(g0, g1);
    }

    #[test]
    fn a_move_past_the_finite_floats_is_refused_not_wrapped() {
        assert_eq!(nudge_f32(1.0, 1), Some(f32::from_bits(1.0f32.to_bits() + 1)));
        assert_eq!(nudge_f32(f32::MAX, 1), None);
        assert_eq!(nudge_f32(23.3, 99_999_999_999), None);
        assert_eq!(nudge_f32(-f32::MAX, -1), None);
        assert_eq!(nudge_f64(f64::MAX, 1), None);
        assert_eq!(nudge_f64(0.0, -1), Some(-f64::from_bits(1)));
    }
}
