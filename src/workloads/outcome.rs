//! What studies need from a training run, whatever the workload: the seeds of its algorithmic
//! randomness, and what a finished run produced (held-out predictions, trained values, step
//! times).

use std::time::Duration;

/// The seeds of each algorithmic source of randomness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seeds {
    /// Initial weights.
    pub init: u64,
    /// Order of the training examples (reshuffled every epoch).
    pub order: u64,
    /// Random shifts of training images.
    pub augment: u64,
    /// Dropout masks.
    pub dropout: u64,
}

impl Seeds {
    /// All four seeds equal to `seed`.
    pub fn all(seed: u64) -> Self {
        Seeds { init: seed, order: seed, augment: seed, dropout: seed }
    }
}

/// A trained model's values, independent of the device it was trained on.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelState {
    /// Trainable parameters, flattened in creation order.
    pub weights: Vec<f32>,
    /// Buffers (batch-norm running statistics), flattened in creation order.
    pub buffers: Vec<f32>,
}

/// What a finished training run produced.
#[derive(Debug, Clone)]
pub struct TrainOutcome {
    /// Steps trained.
    pub steps: u64,
    /// Predicted class of every held-out example (a classifier's test split; the gpt's next byte
    /// at every position of its evaluation windows).
    pub predictions: Vec<u32>,
    /// The held-out labels.
    pub labels: Vec<u32>,
    /// Number of classes.
    pub classes: usize,
    /// The trained values: every trainable parameter (`state.weights`, flattened and
    /// concatenated in creation order, or the gpt's in name order) and the batch-norm statistics.
    pub state: ModelState,
    /// Loss of the last training step.
    pub final_loss: f32,
    /// Wall time of the training steps after the first (which pays for warm-up), synchronized
    /// with the device.
    pub step_times: Vec<Duration>,
}
