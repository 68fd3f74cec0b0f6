//! Rendering results for people. Every function here takes plain data from `diff`, `trace` or
//! `study` and returns text (or SVG); machine output is the same data serialized as JSON by the CLI.

mod diff;
mod format;
mod gate;
mod inspect;
mod invariance;
mod matrix;
mod online;
mod plot;
mod ranks;
mod study;

pub use diff::{metrics_sentence, render_diff, write_root_cause};
pub use format::{bytes, sci, shape};
pub use gate::{render_gate, render_gate_junit, render_gate_markdown};
pub use inspect::render_summary;
pub use invariance::{render_forward_cost, render_invariance};
pub use matrix::render_matrix;
pub use online::render_online;
pub use plot::{plot_cost, plot_devices, plot_diff, plot_invariance, plot_matrix, plot_noise, plot_order};
pub use ranks::{render_run_diff, replica_line};
pub use study::{render_cost, render_devices, render_noise, render_order};
