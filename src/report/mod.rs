//! Rendering results for people. Every function here takes plain data from `diff` or `trace`
//! and returns text; machine output is the same data serialized as JSON by the CLI.

mod diff;
mod format;
mod gate;
mod inspect;
mod matrix;
mod online;

pub use diff::{metrics_sentence, render_diff, write_root_cause};
pub use format::{bytes, sci, shape};
pub use gate::{render_gate, render_gate_junit, render_gate_markdown};
pub use inspect::render_summary;
pub use matrix::render_matrix;
pub use online::render_online;
