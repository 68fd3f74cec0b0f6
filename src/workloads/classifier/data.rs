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
    /// 8 features, a rare positive class (about 14% of examples) and two protected binary
    /// attributes, `male` (40%) and `old` (25%), shaped like CelebA's: the positive class is
    /// rare among men and among the old (about 0.8% and 2.5% of the positives), and men's
    /// positives are told apart along other features than women's. 20,000 training, 10,000
    /// test examples.
    Subgroups,
}

impl DatasetName {
    /// Names accepted on the command line.
    pub const ALL: &'static [&'static str] = &["gauss2d", "gauss5d", "digits", "cifar-synthetic", "subgroups"];

    /// (training, test) examples of the full dataset.
    pub fn sizes(self) -> (usize, usize) {
        match self {
            DatasetName::Gauss2d => (10_000, 2_000),
            DatasetName::Gauss5d => (100_000, 10_000),
            DatasetName::Digits => (1_438, 359),
            DatasetName::CifarSynthetic => (10_000, 2_000),
            DatasetName::Subgroups => (20_000, 10_000),
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
            DatasetName::Subgroups => "subgroups",
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
            "subgroups" => Ok(DatasetName::Subgroups),
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
    /// Protected attributes of the test examples (empty for datasets without any).
    pub protected: Vec<Attribute>,
}

/// A protected binary attribute of the test examples, which splits them into two sub-groups.
#[derive(Debug, Clone, PartialEq)]
pub struct Attribute {
    /// The sub-group of examples that have it (`male`).
    pub name: String,
    /// The sub-group of those that do not (`female`).
    pub complement: String,
    /// Whether each test example has it.
    pub values: Vec<bool>,
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
            DatasetName::Subgroups => subgroups(dataset_seed, train, test),
        };
        if let Some(n) = limit {
            let len = data.example_len();
            for split in [&mut data.train, &mut data.test] {
                let keep = n.min(split.len());
                split.y.truncate(keep);
                split.x.truncate(keep * len);
            }
            let kept = data.test.len();
            data.protected.iter_mut().for_each(|a| a.values.truncate(kept));
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
        protected: Vec::new(),
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
    Ok(Dataset {
        name: DatasetName::Digits,
        example_shape: vec![1, 8, 8],
        classes: 10,
        train,
        test,
        protected: Vec::new(),
    })
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
        protected: Vec::new(),
    }
}

/// The `subgroups` dataset (see [`DatasetName::Subgroups`]). Per example: `male` and `old` are
/// drawn first, then the label with a probability that depends on them, then 8 features: the
/// label's signal on features 0-1 for women and 2-3 for men, the attributes on 4-5 (`male`)
/// and 6-7 (`old`), and unit Gaussian noise on all.
fn subgroups(seed: u64, train: usize, test: usize) -> Dataset {
    const DIMS: usize = 8;
    /// P(positive) for (male, old).
    fn positive_rate(male: bool, old: bool) -> f64 {
        match (male, old) {
            (false, false) => 0.30,
            (false, true) => 0.023,
            (true, false) => 0.0035,
            (true, true) => 0.001,
        }
    }
    let split = |purpose: &str, n: usize| {
        let mut rng = stream(seed, purpose, 0);
        let (mut x, mut y) = (Vec::with_capacity(n * DIMS), Vec::with_capacity(n));
        let (mut male, mut old) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for _ in 0..n {
            let (m, o) = (rng_unit(&mut rng) < 0.4, rng_unit(&mut rng) < 0.25);
            let positive = rng_unit(&mut rng) < positive_rate(m, o);
            let signal = if positive { 1.2 } else { -0.4 };
            let side = |on: bool| if on { 1.0 } else { -1.0 };
            let mut features = [0.0f64; DIMS];
            let label_dims = if m { 2..4 } else { 0..2 };
            features[label_dims].iter_mut().for_each(|f| *f += signal);
            features[4..6].iter_mut().for_each(|f| *f += side(m));
            features[6..8].iter_mut().for_each(|f| *f += side(o));
            for f in features {
                let z: f64 = rng.sample(StandardNormal);
                x.push((f + z) as f32);
            }
            y.push(u32::from(positive));
            male.push(m);
            old.push(o);
        }
        (Split { x, y }, male, old)
    };
    let (train, _, _) = split("dataset.subgroups.train", train);
    let (test, male, old) = split("dataset.subgroups.test", test);
    let attribute =
        |name: &str, complement: &str, values| Attribute { name: name.into(), complement: complement.into(), values };
    Dataset {
        name: DatasetName::Subgroups,
        example_shape: vec![DIMS],
        classes: 2,
        train,
        test,
        protected: vec![attribute("male", "female", male), attribute("old", "young", old)],
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
        for name in [DatasetName::Gauss2d, DatasetName::Gauss5d, DatasetName::CifarSynthetic, DatasetName::Subgroups] {
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
    fn subgroups_make_positives_rare_among_men_and_the_old() {
        let d = Dataset::load(DatasetName::Subgroups, 0, None).unwrap();
        let positives: Vec<bool> = d.test.y.iter().map(|&y| y == 1).collect();
        let total = positives.iter().filter(|&&p| p).count() as f64;
        assert!((total / d.test.len() as f64 - 0.14).abs() < 0.01, "positive rate {}", total / d.test.len() as f64);
        let share = |name: &str| {
            let a = d.protected.iter().find(|a| a.name == name).unwrap();
            assert_eq!(a.values.len(), d.test.len());
            a.values.iter().zip(&positives).filter(|(&member, &p)| member && p).count() as f64 / total
        };
        let (male, old) = (share("male"), share("old"));
        assert!((0.003..0.02).contains(&male), "male share of positives {male}");
        assert!((0.015..0.04).contains(&old), "old share of positives {old}");
        // A limit keeps attributes and examples aligned.
        let small = Dataset::load(DatasetName::Subgroups, 0, Some(30)).unwrap();
        assert!(small.protected.iter().all(|a| a.values.len() == 30));
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
