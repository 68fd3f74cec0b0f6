//! Element types a trace can hold, and how their little-endian bytes decode.
//!
//! This module is the one place that knows the bit layout of each dtype (`Element`). Everything
//! above it (hashing, diff metrics, the trace reader) works on `(DType, &[u8])` pairs, so reading
//! and comparing traces never needs candle.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// An element type, named as safetensors names it (`F32`, `BF16`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum DType {
    /// Unsigned 8-bit integer.
    U8,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 16-bit integer.
    I16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// IEEE 754 half precision.
    F16,
    /// bfloat16: the upper half of an f32.
    BF16,
    /// IEEE 754 single precision.
    F32,
    /// IEEE 754 double precision.
    F64,
}

impl DType {
    /// Every dtype, in tag order.
    pub const ALL: [DType; 9] =
        [DType::U8, DType::U32, DType::I16, DType::I32, DType::I64, DType::F16, DType::BF16, DType::F32, DType::F64];

    /// The dtype's name as written in traces and safetensors headers.
    pub fn name(self) -> &'static str {
        match self {
            DType::U8 => "U8",
            DType::U32 => "U32",
            DType::I16 => "I16",
            DType::I32 => "I32",
            DType::I64 => "I64",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::F32 => "F32",
            DType::F64 => "F64",
        }
    }

    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::U32 | DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }
}

/// A Rust type that stores one element of a trace dtype.
// The impls' methods are `#[inline]`: they run once per element in other crates' loops (the
// diff's metrics, `show`'s statistics), where a call each cost several times the work.
pub trait Element: Copy {
    /// Bytes per element.
    const SIZE: usize;
    /// The element as `f64` (exact for every type but i64 values beyond 2^53).
    fn value(self) -> f64;
    /// The element's position on a line where neighbouring representable values are one
    /// apart, so the ULP distance of two elements is the difference of their positions. For
    /// floats: the sign-magnitude to two's-complement mapping of the raw bits (`+0` and `-0`
    /// both map to 0; NaNs land beyond the infinities). Integers map to themselves.
    fn ordinal(self) -> i64;
    /// Reads one element from exactly `SIZE` little-endian bytes.
    fn load(bytes: &[u8]) -> Self;
    /// The element's raw bits, for bit-exact comparison.
    fn bits(self) -> u64;
}

/// Two's-complement position of a sign-magnitude float's bits.
#[inline]
fn float_ordinal(bits: u64, sign_bit: u64) -> i64 {
    let magnitude = (bits & (sign_bit - 1)) as i64;
    if bits & sign_bit != 0 {
        -magnitude
    } else {
        magnitude
    }
}

/// Evaluates `$body` with `$t` bound to the [`Element`] type of `$dtype`: one generic
/// function over every dtype a trace holds, without a match at each caller.
///
/// ```
/// use repro_trace::dtype::{DType, Element};
/// let bytes = 1.5f32.to_le_bytes();
/// let first = repro_trace::for_element!(DType::F32, T => T::load(&bytes[..T::SIZE]).value());
/// assert_eq!(first, 1.5);
/// ```
#[macro_export]
macro_rules! for_element {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            $crate::dtype::DType::U8 => {
                type $t = u8;
                $body
            }
            $crate::dtype::DType::U32 => {
                type $t = u32;
                $body
            }
            $crate::dtype::DType::I16 => {
                type $t = i16;
                $body
            }
            $crate::dtype::DType::I32 => {
                type $t = i32;
                $body
            }
            $crate::dtype::DType::I64 => {
                type $t = i64;
                $body
            }
            $crate::dtype::DType::F16 => {
                type $t = $crate::dtype::half::f16;
                $body
            }
            $crate::dtype::DType::BF16 => {
                type $t = $crate::dtype::half::bf16;
                $body
            }
            $crate::dtype::DType::F32 => {
                type $t = f32;
                $body
            }
            $crate::dtype::DType::F64 => {
                type $t = f64;
                $body
            }
        }
    };
}

/// The half-precision types, for `for_element!`'s expansion in other crates.
#[doc(hidden)]
pub use half;

macro_rules! int_element {
    ($($t:ty),*) => {$(
        impl Element for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            #[inline]
            fn value(self) -> f64 { self as f64 }
            #[inline]
            fn ordinal(self) -> i64 { self as i64 }
            #[inline]
            fn load(bytes: &[u8]) -> Self { <$t>::from_le_bytes(bytes.try_into().expect("element size")) }
            #[inline]
            fn bits(self) -> u64 { self as u64 }
        }
    )*};
}
int_element!(u8, u32, i16, i32, i64);

macro_rules! float_element {
    ($($t:ty, $bits:ty, $to_f64:expr);*) => {$(
        impl Element for $t {
            const SIZE: usize = std::mem::size_of::<$bits>();
            #[inline]
            fn value(self) -> f64 { $to_f64(self) }
            #[inline]
            fn ordinal(self) -> i64 {
                float_ordinal(self.to_bits() as u64, 1 << (8 * std::mem::size_of::<$bits>() - 1))
            }
            #[inline]
            fn load(bytes: &[u8]) -> Self { <$t>::from_bits(<$bits>::from_le_bytes(bytes.try_into().expect("element size"))) }
            #[inline]
            fn bits(self) -> u64 { self.to_bits() as u64 }
        }
    )*};
}
float_element!(
    half::f16, u16, |x: half::f16| x.to_f64();
    half::bf16, u16, |x: half::bf16| x.to_f64();
    f32, u32, |x: f32| x as f64;
    f64, u64, |x: f64| x
);

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The error for a dtype name repro does not know.
#[derive(Debug, thiserror::Error)]
#[error("unknown dtype `{0}` (expected one of U8, U32, I16, I32, I64, F16, BF16, F32, F64)")]
pub struct UnknownDType(pub String);

impl FromStr for DType {
    type Err = UnknownDType;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DType::ALL.into_iter().find(|d| d.name().eq_ignore_ascii_case(s)).ok_or_else(|| UnknownDType(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adjacent_f32_values_are_one_ordinal_apart() {
        for x in [1.0f32, -1.0, 1e-30, -3.5e20, f32::MIN_POSITIVE] {
            let next = f32::from_bits(x.to_bits() + 1);
            let (a, b) = (x.to_le_bytes(), next.to_le_bytes());
            let d = f32::load(&b).ordinal() - f32::load(&a).ordinal();
            assert_eq!(d.abs(), 1, "{x}");
        }
    }

    #[test]
    fn zero_crossing_counts_denormals() {
        let tiny = f32::from_bits(1);
        let a = tiny.to_le_bytes();
        let b = (-tiny).to_le_bytes();
        assert_eq!(f32::load(&a).ordinal() - f32::load(&b).ordinal(), 2);
        let pz = 0.0f32.to_le_bytes();
        let nz = (-0.0f32).to_le_bytes();
        assert_eq!(f32::load(&pz).ordinal(), f32::load(&nz).ordinal());
    }

    #[test]
    fn bf16_and_f16_decode() {
        let b = half::bf16::from_f32(1.5).to_bits().to_le_bytes();
        assert_eq!(half::bf16::load(&b).value(), 1.5);
        let h = half::f16::from_f32(-2.25).to_bits().to_le_bytes();
        assert_eq!(half::f16::load(&h).value(), -2.25);
    }

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
        }
        assert!("F8".parse::<DType>().is_err());
    }
}
