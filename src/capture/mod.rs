//! Automatic capture: record any candle model, op by op, with a few lines around the training
//! step and none inside the model.
//!
//! - Parameters come from a `VarMap`, sorted by name (the VarBuilder paths, which
//!   candle-transformers models share with the PyTorch modules they port); their gradients from
//!   the `GradStore`; the updated parameters after the optimizer step.
//! - The forward graph is every tensor on a path from a parameter to the root (the loss, or the
//!   logits at inference), in a topological order that is the same on every device and in every
//!   run of the same code ([`graph`]). Nodes are named after the scope they were created in:
//!   [`scope`] in the user's code, or the `tracing` spans the model already enters ([`SpanScopes`]).
//! - Trainable parameters that receive no gradient (an op without a backward pass cut them off)
//!   are listed in the trace at every step.
//!
//! ```no_run
//! # use candle_core::{DType, Device, Module, Tensor};
//! # use candle_nn::{Optimizer, VarBuilder, VarMap};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let device = Device::Cpu;
//! # let varmap = VarMap::new();
//! # let model = candle_nn::linear(4, 1, VarBuilder::from_varmap(&varmap, DType::F32, &device).pp("fc"))?;
//! # let mut opt = candle_nn::SGD::new(varmap.all_vars(), 0.1)?;
//! # let x = Tensor::ones((8, 4), DType::F32, &device)?;
//! use repro::capture::ModelRecorder;
//! let run = repro::trace::RunConfig { workload: "mine".into(), ..Default::default() };
//! let mut rec = ModelRecorder::create("runs/mine", run, &device, &varmap)?;
//! for step in 0..10 {
//!     let loss = model.forward(&x)?.sqr()?.mean_all()?;
//!     let grads = loss.backward()?;
//!     let recorded = rec.training_step(step, &[("x", &x)], &loss, &grads)?;
//!     opt.step(&grads)?;
//!     recorded.finish()?;
//! }
//! rec.finish()?;
//! # Ok(()) }
//! ```

mod graph;
mod model;
mod scope;

pub use graph::GraphNode;
pub use model::{CapturedStep, ModelCapture, ModelRecorder};
pub(crate) use scope::tensor_number;
pub use scope::{install_span_scopes, scope, span_scopes_on_this_thread, SpanScopes};
