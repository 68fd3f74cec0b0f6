//! Recording an existing candle-nn model with no change to it: `repro::capture` records the
//! parameters, every node of the forward graph, the gradients and the updated parameters.
//!
//! The model below is ordinary candle-nn code (a small convolutional classifier on random
//! seeded images) with no repro in it. The training loop adds four lines, marked `// repro` (and the `use`).
//! Nodes are named after `repro::capture::scope` blocks where the loop opens them, and after the
//! model's `tracing` spans where it has some (candle-transformers' layers do).
//!
//! ```text
//! cargo run --release --example any_model -- runs/any-a
//! cargo run --release --example any_model -- runs/any-b
//! repro diff runs/any-a runs/any-b          # IDENTICAL, or the first node that differs
//! repro gate -- target/release/examples/any_model
//! ```

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{conv2d, linear, AdamW, Conv2d, Conv2dConfig, Linear, Optimizer, VarBuilder, VarMap};
use repro::capture::{scope, ModelRecorder};
use repro::workloads::seeded::{stream, uniform_vec};

/// A model as found in any candle project.
struct Net {
    conv1: Conv2d,
    conv2: Conv2d,
    head: Linear,
}

impl Net {
    fn new(vb: VarBuilder) -> candle_core::Result<Self> {
        let cfg = Conv2dConfig { padding: 1, ..Default::default() };
        Ok(Net {
            conv1: conv2d(1, 8, 3, cfg, vb.pp("conv1"))?,
            conv2: conv2d(8, 8, 3, cfg, vb.pp("conv2"))?,
            head: linear(8 * 8 * 8, 10, vb.pp("head"))?,
        })
    }
}

impl Module for Net {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let x = self.conv1.forward(x)?.relu()?;
        let x = self.conv2.forward(&x)?.relu()?;
        self.head.forward(&x.flatten_from(1)?)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::env::args().nth(1).unwrap_or_else(|| "runs/any-model".into());
    let device = Device::Cpu;
    let varmap = VarMap::new();
    let model = Net::new(VarBuilder::from_varmap(&varmap, DType::F32, &device))?;
    // candle's CPU initialisation cannot be seeded: overwrite it from a seeded host stream, in
    // sorted name order, so that two runs start from the same weights.
    let mut names: Vec<(String, Vec<usize>)> =
        varmap.data().lock().unwrap().iter().map(|(n, v)| (n.clone(), v.dims().to_vec())).collect();
    names.sort();
    let mut varmap = varmap;
    for (i, (name, dims)) in names.iter().enumerate() {
        let n = dims.iter().product();
        let values = uniform_vec(&mut stream(0, "example.init", i as u64), n, -0.1, 0.1);
        varmap.set_one(name, Tensor::from_vec(values, dims.as_slice(), &device)?)?;
    }
    let mut opt = AdamW::new_lr(varmap.all_vars(), 1e-3)?;

    let run = repro::trace::RunConfig { workload: "any-model".into(), steps: Some(20), ..Default::default() };
    let mut rec = ModelRecorder::create_or_gated(&out, run, &device, &varmap)?; // repro
    for step in 0..20 {
        let mut rng = stream(1, "example.data", step);
        let x = Tensor::from_vec(uniform_vec(&mut rng, 16 * 64, 0.0, 1.0), (16, 1, 8, 8), &device)?;
        let labels: Vec<u32> = (0..16).map(|i| (i * 7 + step as u32) % 10).collect();
        let y = Tensor::from_vec(labels, 16, &device)?;
        let logits = scope("net", || model.forward(&x))?;
        let loss = scope("loss", || candle_nn::loss::cross_entropy(&logits, &y))?;
        let grads = loss.backward()?;
        let recorded = rec.training_step(step, &[("x", &x), ("y", &y)], &loss, &grads)?; // repro
        opt.step(&grads)?;
        recorded.finish()?; // repro
    }
    let steps = rec.finish()?; // repro
    eprintln!("recorded {steps} steps");
    Ok(())
}
