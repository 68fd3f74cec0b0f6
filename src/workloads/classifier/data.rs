//! The classifiers' datasets, all held in memory on the host: seeded synthetic Gaussian data
//! (the poster's 2D and 5D sets), scikit-learn's copy of the UCI handwritten digits (shipped in
//! `data/digits/`, see its README for license and credit), and seeded synthetic CIFAR-shaped
//! images.
//!
//! The dataset itself is fixed by `dataset_seed`; the randomness a study varies (data order,
//! augmentation) is drawn elsewhere, so the same examples are used in every run.

use crate::workloads::seeded::stream;
use rand::Rng;
use rand_distr::StandardNormal;
use std::fmt;
use std::io::Read;
use std::str::FromStr;

/// The built-in datasets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatasetName {
    /// Two classes of 2-dimensional Gaussians with identity covariance, means ±(1, 1)
    /// (Bayes error 7.9%); 10,000 training and 2,000 test examples.
    Gauss2d,
    /// Two classes of 5-dimensional Gaussians with an AR(1) covariance (ρ = 0.7, neighbouring
    /// features correlated like EEG channels), means ±0.15 per feature; 100,000 training and
    /// 10,000 test examples.
    Gauss5d,
    /// 8×8 grey images of handwritten digits, pixels 0..16 scaled to [0, 1]; 10 classes; every
    /// fifth example is a test example (1,438 training, 359 test).
    Digits,
    /// 32×32×3 images, 10 classes: each example mixes its class's smooth template with another
    /// class's and adds noise, so some examples are ambiguous; 10,000 training, 2,000 test.
    CifarSynthetic,
}

impl DatasetName {
    /// Names accepted on the command line.
    pub const ALL: &'static [&'static str] = &["gauss2d", "gauss5d", "digits", "cifar-synthetic"];

    /// (training, test) examples of the full dataset.
    pub fn sizes(self) -> (usize, usize) {
        match self {
            DatasetName::Gauss2d => (10_000, 2_000),
            DatasetName::Gauss5d => (100_000, 10_000),
            DatasetName::Digits => (1_438, 359),
            DatasetName::CifarSynthetic => (10_000, 2_000),
        }
    }

    /// Training examples when at most `limit` are used.
    pub fn train_len(self, limit: Option<usize>) -> usize {
        let n = self.sizes().0;
        limit.map_or(n, |l| l.min(n))
    }

    /// Whether examples are images (`[channels, height, width]`).
    pub fn is_image(self) -> bool {
        matches!(self, DatasetName::Digits | DatasetName::CifarSynthetic)
    }
}

impl fmt::Display for DatasetName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DatasetName::Gauss2d => "gauss2d",
            DatasetName::Gauss5d => "gauss5d",
            DatasetName::Digits => "digits",
            DatasetName::CifarSynthetic => "cifar-synthetic",
        })
    }
}

impl FromStr for DatasetName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "gauss2d" => Ok(DatasetName::Gauss2d),
            "gauss5d" => Ok(DatasetName::Gauss5d),
            "digits" => Ok(DatasetName::Digits),
            "cifar-synthetic" => Ok(DatasetName::CifarSynthetic),
            _ => Err(format!("unknown dataset `{s}`: expected {}", DatasetName::ALL.join(", "))),
        }
    }
}

/// Examples and labels, row-major: example `i` is `x[i * example_len..(i + 1) * example_len]`.
#[derive(Debug, Clone)]
pub struct Split {
    /// Inputs.
    pub x: Vec<f32>,
    /// Class labels.
    pub y: Vec<u32>,
}

impl Split {
    /// Number of examples.
    pub fn len(&self) -> usize {
        self.y.len()
    }

    /// Whether the split holds no examples.
    pub fn is_empty(&self) -> bool {
        self.y.is_empty()
    }
}

/// A dataset in memory.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// Which dataset.
    pub name: DatasetName,
    /// Shape of one example: `[features]` or `[channels, height, width]`.
    pub example_shape: Vec<usize>,
    /// Number of classes.
    pub classes: usize,
    /// Training examples.
    pub train: Split,
    /// Test examples.
    pub test: Split,
}

impl Dataset {
    /// Elements per example.
    pub fn example_len(&self) -> usize {
        self.example_shape.iter().product()
    }

    /// Loads (or generates) `name`. `limit` caps the number of training and test examples
    /// (the first ones are kept), for quick runs.
    pub fn load(name: DatasetName, dataset_seed: u64, limit: Option<usize>) -> Result<Dataset, String> {
        let (train, test) = name.sizes();
        let mut data = match name {
            DatasetName::Gauss2d => gaussian(name, dataset_seed, 2, 0.0, 1.0, train, test),
            DatasetName::Gauss5d => gaussian(name, dataset_seed, 5, 0.7, 0.15, train, test),
            DatasetName::Digits => digits()?,
            DatasetName::CifarSynthetic => cifar_synthetic(dataset_seed, train, test),
        };
        if let Some(n) = limit {
            let len = data.example_len();
            for split in [&mut data.train, &mut data.test] {
                let keep = n.min(split.len());
                split.y.truncate(keep);
                split.x.truncate(keep * len);
            }
        }
        Ok(data)
    }
}

/// Two Gaussian classes, labels alternating, with an AR(1) covariance of correlation `rho`
/// (0: identity) and means ±`mean` in every feature.
fn gaussian(name: DatasetName, seed: u64, dims: usize, rho: f64, mean: f64, train: usize, test: usize) -> Dataset {
    let split = |purpose: &str, n: usize| {
        let mut rng = stream(seed, purpose, 0);
        let mut x = Vec::with_capacity(n * dims);
        let y: Vec<u32> = (0..n).map(|i| (i % 2) as u32).collect();
        for &label in &y {
            let sign = if label == 0 { -1.0 } else { 1.0 };
            let mut prev = 0.0f64;
            for d in 0..dims {
                let z: f64 = rng.sample(StandardNormal);
                let noise = if d == 0 { z } else { rho * prev + (1.0 - rho * rho).sqrt() * z };
                prev = noise;
                x.push((sign * mean + noise) as f32);
            }
        }
        Split { x, y }
    };
    Dataset {
        name,
        example_shape: vec![dims],
        classes: 2,
        train: split("dataset.gaussian.train", train),
        test: split("dataset.gaussian.test", test),
    }
}

/// scikit-learn's `digits.csv.gz`: 1,797 rows of 64 pixel values and a label.
const DIGITS_CSV_GZ: &[u8] = include_bytes!("../../../data/digits/digits.csv.gz");

fn digits() -> Result<Dataset, String> {
    let mut text = String::new();
    flate2::read::GzDecoder::new(DIGITS_CSV_GZ)
        .read_to_string(&mut text)
        .map_err(|e| format!("data/digits/digits.csv.gz (built in): cannot decompress: {e}"))?;
    let (mut train, mut test) = (Split { x: vec![], y: vec![] }, Split { x: vec![], y: vec![] });
    for (i, line) in text.lines().enumerate() {
        let values: Vec<f32> = line
            .split(',')
            .map(|v| v.trim().parse::<f32>())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("data/digits/digits.csv.gz (built in), line {}: {e}", i + 1))?;
        let [pixels @ .., label] = values.as_slice() else { unreachable!("split yields at least one field") };
        if pixels.len() != 64 {
            return Err(format!("data/digits/digits.csv.gz (built in), line {}: expected 65 values", i + 1));
        }
        let split = if i % 5 == 4 { &mut test } else { &mut train };
        split.x.extend(pixels.iter().map(|p| p / 16.0));
        split.y.push(*label as u32);
    }
    Ok(Dataset { name: DatasetName::Digits, example_shape: vec![1, 8, 8], classes: 10, train, test })
}

fn cifar_synthetic(seed: u64, train: usize, test: usize) -> Dataset {
    const CLASSES: usize = 10;
    const SIDE: usize = 32;
    const PIXELS: usize = 3 * SIDE * SIDE;
    // A template per class: a sum of three random low-frequency waves per channel.
    let mut rng = stream(seed, "dataset.cifar.templates", 0);
    let templates: Vec<Vec<f32>> = (0..CLASSES)
        .map(|_| {
            // (frequency across, frequency down, phase) of each wave.
            let waves: Vec<[f64; 3]> = (0..9)
                .map(|_| {
                    let fx = 0.5 + 2.5 * rng_unit(&mut rng);
                    let fy = 0.5 + 2.5 * rng_unit(&mut rng);
                    [fx, fy, std::f64::consts::TAU * rng_unit(&mut rng)]
                })
                .collect();
            let mut t = vec![0.0f32; PIXELS];
            for c in 0..3 {
                for (i, j) in (0..SIDE).flat_map(|i| (0..SIDE).map(move |j| (i, j))) {
                    let (u, v) = (i as f64 / SIDE as f64, j as f64 / SIDE as f64);
                    let value: f64 = waves[c * 3..c * 3 + 3]
                        .iter()
                        .map(|w| (std::f64::consts::TAU * (w[0] * u + w[1] * v) + w[2]).sin())
                        .sum();
                    t[c * SIDE * SIDE + i * SIDE + j] = (value / 3.0) as f32;
                }
            }
            t
        })
        .collect();
    let split = |purpose: &str, n: usize| {
        let mut rng = stream(seed, purpose, 0);
        let mut x = Vec::with_capacity(n * PIXELS);
        let y: Vec<u32> = (0..n).map(|i| (i % CLASSES) as u32).collect();
        for &label in &y {
            let other = (label as usize + 1 + rng.random_range(0..CLASSES - 1)) % CLASSES;
            let weight = 0.35 + 0.5 * rng_unit(&mut rng);
            let (a, b) = (&templates[label as usize], &templates[other]);
            for p in 0..PIXELS {
                let z: f64 = rng.sample(StandardNormal);
                x.push((weight * a[p] as f64 + (1.0 - weight) * b[p] as f64 + 0.8 * z) as f32);
            }
        }
        Split { x, y }
    };
    Dataset {
        name: DatasetName::CifarSynthetic,
        example_shape: vec![3, SIDE, SIDE],
        classes: CLASSES,
        train: split("dataset.cifar.train", train),
        test: split("dataset.cifar.test", test),
    }
}

fn rng_unit(rng: &mut impl rand::RngCore) -> f64 {
    crate::workloads::seeded::unit_f32(rng) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_load_with_the_documented_split_and_ranges() {
        let d = Dataset::load(DatasetName::Digits, 0, None).unwrap();
        assert_eq!((d.train.len(), d.test.len()), (1438, 359));
        assert_eq!(d.train.x.len(), 1438 * 64);
        assert!(d.train.x.iter().all(|p| (0.0..=1.0).contains(p)));
        let mut counts = [0usize; 10];
        d.train.y.iter().for_each(|&y| counts[y as usize] += 1);
        assert!(counts.iter().all(|&c| c > 120), "every digit is represented: {counts:?}");
    }

    #[test]
    fn synthetic_datasets_repeat_for_a_seed_and_change_with_it() {
        for name in [DatasetName::Gauss2d, DatasetName::Gauss5d, DatasetName::CifarSynthetic] {
            let a = Dataset::load(name, 3, Some(50)).unwrap();
            let b = Dataset::load(name, 3, Some(50)).unwrap();
            let c = Dataset::load(name, 4, Some(50)).unwrap();
            assert_eq!(a.train.x, b.train.x, "{name}");
            assert_ne!(a.train.x, c.train.x, "{name}");
            assert_eq!((a.train.len(), a.test.len()), (50, 50));
            assert_eq!(a.train.x.len(), 50 * a.example_len());
        }
    }

    #[test]
    fn gauss2d_classes_sit_around_their_means() {
        let d = Dataset::load(DatasetName::Gauss2d, 0, None).unwrap();
        for class in 0..2u32 {
            let rows: Vec<&[f32]> =
                d.train.x.chunks(2).zip(&d.train.y).filter(|(_, &y)| y == class).map(|(r, _)| r).collect();
            let mean = rows.iter().map(|r| r[0] as f64).sum::<f64>() / rows.len() as f64;
            let expected = if class == 0 { -1.0 } else { 1.0 };
            assert!((mean - expected).abs() < 0.05, "class {class}: mean {mean}");
        }
    }
}
