//! Tolerances: when two runs that are not meant to be bit-exact (CPU against GPU, one GPU model
//! against another, a port against its reference) still count as agreeing. A tensor is within a
//! tolerance when every element is: at most N ULPs apart (`ulp:N`), at most X apart (`abs:X`),
//! apart by at most X of the larger magnitude (`rel:X`), or, as numpy's and torch's `allclose`
//! judge, at most `atol + rtol·|b|` apart (`allclose:ATOL:RTOL`). Rules may name the tensors
//! they judge, by kind or by name (`grad=rel:1e-3,weight=abs:1e-6,ulp:4`; see `Selector`); a
//! tensor no rule names is judged bit-exact. Bit-exact stays the default.

use crate::metrics::TensorMetrics;
use repro_trace::dtype::Element;
use repro_trace::{TensorKind, TensorValues};
use serde::Serialize;
use std::fmt;
use std::str::FromStr;

/// How far two tensors may differ and still agree.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "bound")]
pub enum Tolerance {
    /// At most this many units in the last place, element by element.
    Ulp(u64),
    /// At most this absolute difference, element by element.
    Abs(f64),
    /// At most this relative difference |a - b| / max(|a|, |b|), element by element.
    Rel(f64),
    /// |a - b| <= atol + rtol · |b|, element by element (`b`: the second run), as `allclose`.
    #[serde(rename = "allclose")]
    AllClose {
        /// The absolute part.
        atol: f64,
        /// The part relative to the second run's value.
        rtol: f64,
    },
    /// Rules in order, each for the tensors its selector names (the first that names a tensor
    /// judges it), and the tolerance for tensors none names (`None`: bit-exact).
    PerTensor {
        /// (which tensors, their tolerance).
        rules: Vec<(Selector, Tolerance)>,
        /// For the tensors no rule names.
        otherwise: Option<Box<Tolerance>>,
    },
}

/// The tensors a tolerance rule judges.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Selector {
    /// Every tensor of this kind (`weight`, `gradient` or `grad`, `loss`, ...).
    Kind(TensorKind),
    /// Tensors whose name matches: `*` stands for any run of characters, the rest is literal.
    Name(String),
}

impl Selector {
    fn parse(s: &str) -> Selector {
        match TensorKind::from_name(s) {
            Some(kind) => Selector::Kind(kind),
            None if s == "grad" => Selector::Kind(TensorKind::Gradient),
            None => Selector::Name(s.to_string()),
        }
    }

    /// Whether the tensor `name` of kind `kind` is one of these.
    pub fn names(&self, name: &str, kind: TensorKind) -> bool {
        match self {
            Selector::Kind(k) => *k == kind,
            Selector::Name(pattern) => glob(pattern, name),
        }
    }
}

/// `*`-only glob matching of a whole name.
fn glob(pattern: &str, text: &str) -> bool {
    crate::names::glob_captures(pattern, text).is_some()
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Selector::Kind(k) => f.write_str(k.name()),
            Selector::Name(p) => f.write_str(p),
        }
    }
}

impl Tolerance {
    /// The tolerance that judges the tensor `name` of kind `kind` (`None`: bit-exact).
    pub fn for_tensor(&self, name: &str, kind: TensorKind) -> Option<&Tolerance> {
        match self {
            Tolerance::PerTensor { rules, otherwise } => match rules.iter().find(|(s, _)| s.names(name, kind)) {
                Some((_, t)) => Some(t),
                None => otherwise.as_deref(),
            },
            simple => Some(simple),
        }
    }

    /// Tolerances given one after another (`--tolerance` repeated) as one: their rules in the
    /// order given, and the last plain tolerance for the tensors no rule names.
    pub fn combine(tolerances: Vec<Tolerance>) -> Option<Tolerance> {
        let mut all_rules = Vec::new();
        let mut default = None;
        for t in tolerances {
            match t {
                Tolerance::PerTensor { rules, otherwise } => {
                    all_rules.extend(rules);
                    default = otherwise.map(|o| *o).or(default);
                }
                plain => default = Some(plain),
            }
        }
        match (all_rules.is_empty(), default) {
            (true, default) => default,
            (false, default) => Some(Tolerance::PerTensor { rules: all_rules, otherwise: default.map(Box::new) }),
        }
    }

    /// Whether tensors that differ as `m` says are within the tolerance (a NaN never is).
    /// `allclose` needs the values themselves (see `allows_values`): judged from the metrics
    /// alone, it allows only tensors that do not differ.
    pub fn allows(&self, m: &TensorMetrics) -> bool {
        match *self {
            // Counted in ULPs, f32::MAX is one step from +inf: an infinity or a NaN against
            // another value is never within a tolerance.
            Tolerance::Ulp(n) => m.max_ulp <= n && m.max_abs.is_finite(),
            Tolerance::Abs(x) => m.max_abs <= x,
            Tolerance::Rel(x) => m.max_rel <= x,
            Tolerance::AllClose { .. } | Tolerance::PerTensor { .. } => m.mismatched == 0,
        }
    }

    /// Whether `a` and `b`, which differ as `m` says, are within the tolerance: the metrics
    /// where they suffice, the elements themselves for `allclose` (read window by window).
    pub fn allows_values(&self, a: &TensorValues, b: &TensorValues, m: &TensorMetrics) -> bool {
        let Tolerance::AllClose { atol, rtol } = *self else { return self.allows(m) };
        if m.mismatched == 0 {
            return true;
        }
        if !m.max_abs.is_finite() {
            return false;
        }
        repro_trace::for_element!(a.dtype, T => all_close::<T>(a, b, atol, rtol))
    }
}

/// Every element pair either bit-identical or finite with |x - y| <= atol + rtol·|y|.
fn all_close<T: Element>(a: &TensorValues, b: &TensorValues, atol: f64, rtol: f64) -> bool {
    let mut close = true;
    let window = (repro_trace::WINDOW_BYTES / T::SIZE).max(1) * T::SIZE;
    TensorValues::zip_windows(&[a, b], window, |_, w| {
        if !close {
            return;
        }
        close = w[0].chunks_exact(T::SIZE).zip(w[1].chunks_exact(T::SIZE)).all(|(x, y)| {
            let (x, y) = (T::load(x), T::load(y));
            if x.bits() == y.bits() {
                return true;
            }
            let (x, y) = (x.value(), y.value());
            x.is_finite() && y.is_finite() && (x - y).abs() <= atol + rtol * y.abs()
        });
    });
    close
}

impl fmt::Display for Tolerance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tolerance::Ulp(n) => write!(f, "ulp:{n}"),
            Tolerance::Abs(x) => write!(f, "abs:{x:e}"),
            Tolerance::Rel(x) => write!(f, "rel:{x:e}"),
            Tolerance::AllClose { atol, rtol } => write!(f, "allclose:{atol:e}:{rtol:e}"),
            Tolerance::PerTensor { rules, otherwise } => {
                let mut items: Vec<String> = rules.iter().map(|(s, t)| format!("{s}={t}")).collect();
                items.extend(otherwise.iter().map(|t| t.to_string()));
                f.write_str(&items.join(","))
            }
        }
    }
}

impl FromStr for Tolerance {
    type Err = String;
    /// One tolerance (`rel:1e-5`), or comma-separated items of which each is one, optionally
    /// for named tensors (`grad=rel:1e-3,lm_head*=abs:1e-6,ulp:4`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if !s.contains(',') && !s.contains('=') {
            return one_tolerance(s);
        }
        let mut parsed = Vec::new();
        for item in s.split(',') {
            parsed.push(match item.split_once('=') {
                Some((selector, t)) if !selector.is_empty() => Tolerance::PerTensor {
                    rules: vec![(Selector::parse(selector), one_tolerance(t)?)],
                    otherwise: None,
                },
                _ => one_tolerance(item)?,
            });
        }
        Tolerance::combine(parsed).ok_or_else(|| format!("`{s}` is not a tolerance"))
    }
}

/// One tolerance, without selectors.
fn one_tolerance(s: &str) -> Result<Tolerance, String> {
    {
        let bad = || {
            format!(
                "`{s}` is not a tolerance: use ulp:N (e.g. ulp:4), abs:X (abs:1e-6), rel:X (rel:1e-5) or \
                 allclose:ATOL:RTOL (allclose:1e-8:1e-5, numpy's defaults)"
            )
        };
        let (kind, bound) = s.split_once(':').ok_or_else(bad)?;
        let float = || bound.parse::<f64>().ok().filter(|x| x.is_finite() && *x >= 0.0).ok_or_else(bad);
        match kind {
            "ulp" => bound.parse().map(Tolerance::Ulp).map_err(|_| bad()),
            "abs" => float().map(Tolerance::Abs),
            "rel" => float().map(Tolerance::Rel),
            "allclose" => {
                let (atol, rtol) = bound.split_once(':').ok_or_else(bad)?;
                let part = |x: &str| x.parse::<f64>().ok().filter(|x| x.is_finite() && *x >= 0.0).ok_or_else(bad);
                Ok(Tolerance::AllClose { atol: part(atol)?, rtol: part(rtol)? })
            }
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use repro_trace::dtype::DType;

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
            zero_in_one: 0,
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
    fn allclose_bounds_each_element_by_atol_plus_rtol_times_b() {
        let f64s = |v: &[f64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let (a, b) = (f64s(&[1.0, 100.0, 0.0]), f64s(&[1.0 + 5e-6, 100.0 + 1e-3, 1e-9]));
        let (va, vb) =
            (TensorValues::in_memory(DType::F64, vec![3], &a), TensorValues::in_memory(DType::F64, vec![3], &b));
        let m = crate::compare_values(&va, &vb);
        let close = |t: &str| t.parse::<Tolerance>().unwrap().allows_values(&va, &vb, &m);
        // 1e-3 at 100 is within 1e-5 of it, 1e-9 at 0 within atol: as numpy.allclose(a, b).
        assert!(close("allclose:1e-8:1e-5"));
        assert!(!close("allclose:1e-8:1e-6"), "1e-3 > 1e-8 + 1e-6 * 100");
        assert!(!close("allclose:1e-10:1e-5"), "1e-9 at 0 needs atol");
        // Neither bound alone would do: rel:1e-5 refuses 0 against 1e-9, abs:1e-8 refuses 1e-3.
        assert!(!"rel:1e-5".parse::<Tolerance>().unwrap().allows_values(&va, &vb, &m));
        assert!(!"abs:1e-8".parse::<Tolerance>().unwrap().allows_values(&va, &vb, &m));
        // A NaN or an infinity against another value never is close.
        let nan = f64s(&[1.0, f64::NAN, 0.0]);
        let vn = TensorValues::in_memory(DType::F64, vec![3], &nan);
        assert!(!"allclose:1:1".parse::<Tolerance>().unwrap().allows_values(
            &va,
            &vn,
            &crate::compare_values(&va, &vn)
        ));
        assert_eq!("allclose:1e-8:1e-5".parse::<Tolerance>().unwrap().to_string(), "allclose:1e-8:1e-5");
    }

    #[test]
    fn rules_name_tensors_by_kind_or_name_and_the_rest_stay_bit_exact_unless_told() {
        let t: Tolerance = "grad=rel:1e-3,lm_head*=abs:1e-6,h.*.weight=ulp:2".parse().unwrap();
        assert_eq!(t.to_string(), "gradient=rel:1e-3,lm_head*=abs:1e-6,h.*.weight=ulp:2");
        let judged = |name: &str, kind: TensorKind| t.for_tensor(name, kind).cloned();
        assert_eq!(judged("w.grad", TensorKind::Gradient), Some(Tolerance::Rel(1e-3)));
        assert_eq!(judged("lm_head.weight", TensorKind::Weight), Some(Tolerance::Abs(1e-6)));
        assert_eq!(judged("h.3.weight", TensorKind::Weight), Some(Tolerance::Ulp(2)));
        assert_eq!(judged("h.3.bias", TensorKind::Weight), None, "no rule: bit-exact");
        // The first rule that names a tensor judges it; a plain tolerance covers the rest, and
        // --tolerance given twice adds up.
        let combined = Tolerance::combine(vec!["ulp:4".parse().unwrap(), "loss=abs:0".parse().unwrap()]).unwrap();
        assert_eq!(combined.to_string(), "loss=abs:0e0,ulp:4");
        assert_eq!(combined.for_tensor("loss", TensorKind::Loss), Some(&Tolerance::Abs(0.0)));
        assert_eq!(combined.for_tensor("x", TensorKind::Input), Some(&Tolerance::Ulp(4)));
        assert_eq!(Tolerance::combine(vec!["rel:1".parse().unwrap()]), Some(Tolerance::Rel(1.0)));
        assert_eq!(Tolerance::combine(Vec::new()), None);
        assert!(glob("a*c", "abc") && glob("*", "") && glob("a*", "a") && !glob("a*c", "ab") && glob("a*b*c", "axbyc"));
        assert!("grad=nope".parse::<Tolerance>().is_err());
    }

    #[test]
    fn bad_tolerances_say_what_is_expected() {
        for bad in ["ulp", "ulp:-1", "abs:x", "rel:-1e-3", "abs:inf", "max:3", "allclose:1e-8", "allclose:x:1"] {
            let e = bad.parse::<Tolerance>().unwrap_err();
            assert!(e.contains("use ulp:N"), "{bad}: {e}");
        }
        assert_eq!("abs:1e-6".parse::<Tolerance>().unwrap().to_string(), "abs:1e-6");
    }
}
