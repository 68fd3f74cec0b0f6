//! The seeds' multi-run studies as library calls: `noise` (algorithmic vs implementation
//! randomness over N runs), `devices` (one configuration on several devices, diffed) and `cost`
//! (time per step of deterministic and non-deterministic modes). Their statistics (`stats`)
//! and reports need no model code; the runners train the built-in classifiers.

mod cost;
mod devices;
mod error;
mod noise;
pub mod stats;
mod store;

pub use cost::{run_cost, CostReport, CostRow, MODES};
pub use devices::{run_devices, sampled_steps, DeviceComparison, DeviceRun, DevicesReport, WeightGap};
pub use error::StudyError;
pub use noise::{run_noise, NoiseReport, Progress, Variant, VariantReport, VARIANTS};
pub use store::{StudyDir, STUDY_FILE};
