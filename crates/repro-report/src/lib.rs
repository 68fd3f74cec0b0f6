//! repro-report: rendering comparisons. Every function here takes plain data from `repro-diff`
//! or `repro-trace` and returns text, Markdown, JUnit XML or SVG, or ([`json`]) the versioned
//! JSON document the command line prints; nothing here compares or reads traces. Kept apart
//! from the comparison, as a searcher is from its printer: a library user gets the same
//! reports as the command line, and comparing needs no plotting or JUnit code.
#![deny(missing_docs)]

mod diff;
mod format;
mod gate;
mod inspect;
mod invariance;
pub mod json;
mod loss;
mod matrix;
mod online;
mod plot;
mod ranks;
mod show;
mod study;

pub use diff::{metrics_sentence, render_diff, render_diff_with, write_root_cause, DiffText};
pub use format::{bytes, sci, shape};
pub use gate::{render_gate, render_gate_junit, render_gate_markdown};
pub use inspect::render_summary;
pub use invariance::{render_forward_cost, render_invariance};
pub use loss::{plot_loss, render_loss};
pub use matrix::render_matrix;
pub use online::render_online;
pub use plot::{plot_cost, plot_devices, plot_diff, plot_invariance, plot_matrix, plot_noise, plot_order};
pub use ranks::{render_run_diff, render_run_diff_with, replica_line};
pub use show::{render_step_tensors, render_tensor, render_tensor_pair};
pub use study::{render_cost, render_devices, render_noise, render_order};
