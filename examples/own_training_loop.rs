//! Recording your own candle training loop with repro's library API.
//!
//! A two-layer MLP regresses y = sin(x0) + x1 * x2 on seeded data. Every step records its
//! input, parameters, every forward op with the ops it was computed from, the gradient at the
//! hidden activations (through a probe) and the parameter gradients; then `repro diff` compares
//! two runs of it like any built-in workload, down to the first diverging op:
//!
//! ```text
//! cargo run --release --example own_training_loop -- runs/mlp-a
//! cargo run --release --example own_training_loop -- runs/mlp-b
//! repro diff runs/mlp-a runs/mlp-b
//! repro gate -- target/release/examples/own_training_loop   # records it twice, compares
//! ```

use candle_core::{DType, Device, Tensor};
use candle_nn::{linear, Module, Optimizer, VarBuilder, VarMap, SGD};
use repro::record::{RecordOptions, Recorder};
use repro::trace::{CapturePolicy, Phase, RunConfig, TensorKind};
use repro::workloads::seeded::{stream, uniform_vec};
use std::collections::BTreeMap;

const STEPS: u64 = 50;
const BATCH: usize = 256;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::env::args().nth(1).unwrap_or_else(|| "runs/own-loop".into());
    let device = Device::Cpu;

    // Build the model, then overwrite candle's (unseedable on CPU) initial values with values
    // drawn from a seeded host stream of each parameter's own name: renaming or adding a layer
    // leaves the others' initial values as they were.
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
    let hidden = linear(3, 16, vb.pp("hidden"))?;
    let output = linear(16, 1, vb.pp("output"))?;
    // Sorted by name, so that the recording order never depends on HashMap iteration.
    let params: BTreeMap<String, candle_core::Var> = varmap.data().lock().unwrap().clone().into_iter().collect();
    for (name, var) in &params {
        let values = uniform_vec(&mut stream(42, name, 0), var.elem_count(), -0.5, 0.5);
        var.set(&Tensor::from_vec(values, var.shape(), &device)?)?;
    }

    let run = RunConfig {
        workload: "own-mlp".into(),
        steps: Some(STEPS),
        params: BTreeMap::from([("batch".into(), BATCH.to_string()), ("lr".into(), "0.05".into())]),
    };
    // Under `repro gate -- CMD`, record where the gate says.
    let mut recorder = if std::env::var_os(repro::record::TRACE_DIR_ENV).is_some() {
        Recorder::from_env(run, &device, CapturePolicy::default())?
    } else {
        Recorder::create(&out, run, &device, RecordOptions::default().replacing(true))?
    };
    let mut sgd = SGD::new(varmap.all_vars(), 0.05)?;

    for step in 0..STEPS {
        let x = Tensor::from_vec(uniform_vec(&mut stream(7, "data", step), BATCH * 3, -1.0, 1.0), (BATCH, 3), &device)?;
        let y = (x.narrow(1, 0, 1)?.sin()? + (x.narrow(1, 1, 1)? * x.narrow(1, 2, 1)?)?)?;

        // One line per op: `s.op(name, inputs, output)` records the output and passes it on.
        let mut s = recorder.step(step);
        s.record_as("x", TensorKind::Input, Some(Phase::Forward), &[], &x)?;
        for (name, var) in &params {
            s.record_as(name, TensorKind::Weight, Some(Phase::Forward), &[], var.as_tensor())?;
        }
        let h = s.op("hidden", &["x", "hidden.weight", "hidden.bias"], hidden.forward(&x)?)?;
        let h = s.op("hidden.relu", &["hidden"], h.relu()?)?;
        let h = s.probe("hidden.relu", &h)?; // its gradient is recorded after backward
        let pred = s.op_as(
            "predictions",
            TensorKind::Prediction,
            &["hidden.relu", "output.weight", "output.bias"],
            output.forward(&h)?,
        )?;
        let loss = s.op_as("loss", TensorKind::Loss, &["predictions"], (&pred - &y)?.sqr()?.mean_all()?)?;
        let grads = loss.backward()?;
        s.record_probed_gradients(&[("hidden.relu", &["predictions", "loss"])])?;
        for (name, var) in &params {
            if let Some(g) = grads.get(var) {
                s.record_as(&format!("{name}.grad"), TensorKind::Gradient, Some(Phase::Backward), &["loss"], g)?;
            }
        }
        s.finish()?;

        sgd.step(&grads)?;
    }
    let steps = recorder.finish()?;
    eprintln!("recorded {steps} steps");
    Ok(())
}
