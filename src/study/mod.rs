//! Multi-run studies from the reproducibility literature as library calls: `noise` (algorithmic vs implementation
//! randomness over N runs), `devices` (one configuration on several devices, diffed), `cost`
//! (time per step of deterministic and non-deterministic modes) and `order` (the data order
//! alone, up to full batch). The runners here train a
//! [`Subject`]: a built-in classifier or the gpt; their statistics (`stats`) and results (`results`) need no model code
//! and live in `repro_diff::study`, re-exported here.

mod cost;
mod devices;
mod error;
mod noise;
mod order;
mod store;
mod subject;

pub use repro_diff::study::{results, stats, subgroups};

pub use cost::{run_cost, MODES};
pub use devices::{run_devices, sampled_steps};
pub use error::StudyError;
pub use noise::{run_noise, Variant, VARIANTS};
pub use order::run_order;
pub use results::{
    CostReport, CostRow, DeviceComparison, DeviceRun, DevicesReport, NoiseReport, OrderDivergence, OrderReport,
    OrderRow, StudyKind, StudyReport, VariantReport, WeightGap,
};
pub use store::{StudyDir, StudyOut, STUDY_FILE};
pub use subject::{Subject, Variation};

/// Progress of a study, for the command line's progress bar.
pub trait Progress {
    /// `done` of `total` units of work (runs, timings) are finished; `message` says which one
    /// comes next.
    fn update(&mut self, done: usize, total: usize, message: &str);
}
