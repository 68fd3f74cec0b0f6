//! Tolerances: when two runs that are not meant to be bit-exact (CPU against GPU, one GPU model
//! against another, a port against its reference) still count as agreeing. A tensor is within a
//! tolerance when every element is: at most N ULPs apart (`ulp:N`), at most X apart (`abs:X`), or
//! apart by at most X of the larger magnitude (`rel:X`). Bit-exact stays the default.

use crate::metrics::TensorMetrics;
use serde::Serialize;
use std::fmt;
use std::str::FromStr;

/// How far two tensors may differ and still agree.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "bound")]
pub enum Tolerance {
    /// At most this many units in the last place, element by element.
    Ulp(u64),
    /// At most this absolute difference, element by element.
    Abs(f64),
    /// At most this relative difference |a - b| / max(|a|, |b|), element by element.
    Rel(f64),
}

impl Tolerance {
    /// Whether tensors that differ as `m` says are within the tolerance (a NaN never is).
    pub fn allows(&self, m: &TensorMetrics) -> bool {
        match *self {
            // Counted in ULPs, f32::MAX is one step from +inf: an infinity or a NaN against
            // another value is never within a tolerance.
            Tolerance::Ulp(n) => m.max_ulp <= n && m.max_abs.is_finite(),
            Tolerance::Abs(x) => m.max_abs <= x,
            Tolerance::Rel(x) => m.max_rel <= x,
        }
    }
}

impl fmt::Display for Tolerance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tolerance::Ulp(n) => write!(f, "ulp:{n}"),
            Tolerance::Abs(x) => write!(f, "abs:{x:e}"),
            Tolerance::Rel(x) => write!(f, "rel:{x:e}"),
        }
    }
}

impl FromStr for Tolerance {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("`{s}` is not a tolerance: use ulp:N (e.g. ulp:4), abs:X (abs:1e-6) or rel:X (rel:1e-5)");
        let (kind, bound) = s.split_once(':').ok_or_else(bad)?;
        let float = || bound.parse::<f64>().ok().filter(|x| x.is_finite() && *x >= 0.0).ok_or_else(bad);
        match kind {
            "ulp" => bound.parse().map(Tolerance::Ulp).map_err(|_| bad()),
            "abs" => float().map(Tolerance::Abs),
            "rel" => float().map(Tolerance::Rel),
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(max_ulp: u64, max_abs: f64, max_rel: f64) -> TensorMetrics {
        TensorMetrics {
            elements: 4,
            mismatched: 1,
            max_abs,
            sum_abs: max_abs,
            max_ulp,
            max_rel,
            first_mismatch: Some(0),
            scale_ulp: 0.0,
        }
    }

    #[test]
    fn each_kind_bounds_its_own_measure() {
        let m = metrics(3, 2e-7, 1e-6);
        assert!("ulp:3".parse::<Tolerance>().unwrap().allows(&m));
        assert!(!"ulp:2".parse::<Tolerance>().unwrap().allows(&m));
        assert!("abs:2e-7".parse::<Tolerance>().unwrap().allows(&m));
        assert!(!"abs:1e-7".parse::<Tolerance>().unwrap().allows(&m));
        assert!("rel:1e-6".parse::<Tolerance>().unwrap().allows(&m));
        assert!(!"rel:1e-7".parse::<Tolerance>().unwrap().allows(&m));
        let nan = metrics(0, f64::NAN, f64::NAN);
        for t in ["ulp:100", "abs:1", "rel:1"] {
            assert!(!t.parse::<Tolerance>().unwrap().allows(&nan), "{t} lets a NaN through");
        }
    }

    #[test]
    fn bad_tolerances_say_what_is_expected() {
        for bad in ["ulp", "ulp:-1", "abs:x", "rel:-1e-3", "abs:inf", "max:3"] {
            let e = bad.parse::<Tolerance>().unwrap_err();
            assert!(e.contains("use ulp:N"), "{bad}: {e}");
        }
        assert_eq!("abs:1e-6".parse::<Tolerance>().unwrap().to_string(), "abs:1e-6");
    }
}
