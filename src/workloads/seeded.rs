//! Seeded random numbers drawn on the host, identical on every device and platform.
//!
//! candle's CPU generator cannot be seeded and its CUDA generator differs from it, so every
//! random value a workload needs (initial weights, data) comes from here and is then moved to
//! the device. Each stream is ChaCha8 keyed by `BLAKE3("repro.rng.v1" || u64le seed || purpose
//! || u64le index)`, so streams for different purposes (init, data, step) are independent and
//! one can be varied while the others stay fixed.

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// An independent random stream for `(seed, purpose, index)`.
pub fn stream(seed: u64, purpose: &str, index: u64) -> ChaCha8Rng {
    let mut h = blake3::Hasher::new();
    h.update(b"repro.rng.v1");
    h.update(&seed.to_le_bytes());
    h.update(purpose.as_bytes());
    h.update(&index.to_le_bytes());
    ChaCha8Rng::from_seed(*h.finalize().as_bytes())
}

/// A uniform f32 in [0, 1): the top 24 bits of a u32, scaled exactly.
pub fn unit_f32(rng: &mut impl RngCore) -> f32 {
    (rng.next_u32() >> 8) as f32 * (1.0 / (1u32 << 24) as f32)
}

/// `n` uniform f32 values in [lo, hi), each computed in f64 and rounded once.
pub fn uniform_vec(rng: &mut impl RngCore, n: usize, lo: f64, hi: f64) -> Vec<f32> {
    (0..n).map(|_| (lo + (hi - lo) * unit_f32(rng) as f64) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_repeat_and_differ_by_purpose_and_index() {
        let a: Vec<u32> = (0..4).map(|_| stream(7, "data", 3).next_u32()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        assert_ne!(stream(7, "data", 3).next_u32(), stream(7, "data", 4).next_u32());
        assert_ne!(stream(7, "data", 3).next_u32(), stream(7, "init", 3).next_u32());
        assert_ne!(stream(7, "data", 3).next_u32(), stream(8, "data", 3).next_u32());
    }

    #[test]
    fn unit_values_stay_in_range() {
        let mut rng = stream(0, "t", 0);
        for _ in 0..10_000 {
            let x = unit_f32(&mut rng);
            assert!((0.0..1.0).contains(&x));
        }
        let v = uniform_vec(&mut rng, 1000, -2.0, 2.0);
        assert!(v.iter().all(|x| (-2.0..2.0).contains(x)));
    }
}
