//! A data-parallel training loop of your own, recorded per rank: each rank trains on its share of
//! every batch, the ranks average their gradients, and each writes `OUT/rank-N`, which
//! `repro inspect` and `repro diff` read as one run (and check that the ranks stayed replicas).
//!
//! Two ranks run here as two threads on the CPU, meeting in a scratch directory through repro's
//! file stand-in for NCCL. Started by a cluster's launcher instead (torchrun, srun, mpirun), each
//! process is one rank: `join_from_env` reads its place from the launcher's variables and meets
//! the others at MASTER_ADDR:MASTER_PORT (NCCL on GPUs); the loop is the same.
//!
//! ```text
//! torchrun --nproc_per_node 2 --no-python target/release/examples/data_parallel runs/dp-launched
//! ```
//!
//! ```text
//! cargo run --release --example data_parallel -- runs/dp-a
//! cargo run --release --example data_parallel -- runs/dp-b
//! repro inspect runs/dp-a --verify     # every rank, then whether the ranks stayed replicas
//! repro diff runs/dp-a runs/dp-b       # rank by rank
//! ```

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{linear, AdamW, Optimizer, VarBuilder, VarMap};
use repro::capture::ModelCapture;
use repro::distributed::{join, join_from_env, DataParallel};
use repro::record::{RecordOptions, Recorder};
use repro::trace::{RunConfig, TensorKind};
use repro::workloads::seeded::{stream, uniform_vec};
use std::path::Path;

const RANKS: usize = 2;
const STEPS: u64 = 10;
const BATCH: usize = 16;

/// The run's settings, the same on every rank.
fn run_config() -> RunConfig {
    RunConfig { workload: "dp-example".into(), steps: Some(STEPS), ..Default::default() }
}

/// One rank's training loop.
fn train(mut dp: DataParallel, out: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let (device, rank) = (Device::Cpu, dp.rank());
    let mut varmap = VarMap::new();
    let model = linear(8, 4, VarBuilder::from_varmap(&varmap, DType::F32, &device).pp("head"))?;
    // Replicas must start equal: seeded weights, the same on every rank.
    for (name, i) in [("head.weight", 0), ("head.bias", 1)] {
        let dims = varmap.data().lock().unwrap()[name].dims().to_vec();
        let values = uniform_vec(&mut stream(0, "example.init", i), dims.iter().product(), -0.3, 0.3);
        varmap.set_one(name, Tensor::from_vec(values, dims, &device)?)?;
    }
    let capture = ModelCapture::new(&varmap);
    let mut opt = AdamW::new_lr(varmap.all_vars(), 1e-2)?;
    let run = run_config();
    let dir = out.join(format!("rank-{rank}"));
    let options = RecordOptions { replace: true, rank: Some(dp.describe()), ..RecordOptions::default() };
    let mut rec = Recorder::create(&dir, run, &device, options)?;
    for step in 0..STEPS {
        // The global batch, the same on every rank; each trains on its rows of it.
        let mut rng = stream(1, "example.data", step);
        let x = Tensor::from_vec(uniform_vec(&mut rng, BATCH * 8, -1.0, 1.0), (BATCH, 8), &device)?;
        let y = Tensor::from_vec((0..BATCH as u32).map(|i| (i + step as u32) % 4).collect(), BATCH, &device)?;
        let (x, y) = (dp.shard(&x)?, dp.shard(&y)?);
        let mut s = rec.step(step);
        s.record("x", TensorKind::Input, &x)?;
        capture.record_parameters(&mut s);
        let loss = candle_nn::loss::cross_entropy(&model.forward(&x)?, &y)?;
        // Recorded on the recorder's worker thread while the backward pass runs.
        capture.record_graph(&mut s, &loss, "loss", TensorKind::Loss);
        let mut grads = loss.backward()?;
        dp.average_gradients(&mut s, capture.parameters(), &mut grads)?;
        opt.step(&grads)?;
        capture.record_updated(&mut s)?;
        s.finish()?;
    }
    rec.finish()?;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::path::PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "runs/dp-example".into()));
    // Started by a launcher: this process is one rank.
    if let Some(dp) = join_from_env(&Device::Cpu, &run_config())? {
        return train(dp, &out);
    }
    let rendezvous = tempfile::tempdir()?;
    let ranks: Vec<_> = (0..RANKS)
        .map(|rank| {
            let (rendezvous, out) = (rendezvous.path().to_path_buf(), out.clone());
            std::thread::spawn(move || {
                let dp = DataParallel::new(
                    join(&Device::Cpu, &rendezvous, rank, RANKS, repro::distributed::RENDEZVOUS_TIMEOUT)
                        .map_err(|e| e.to_string())?,
                );
                train(dp, &out).map_err(|e| format!("rank {rank}: {e}"))
            })
        })
        .collect();
    for rank in ranks {
        rank.join().expect("rank thread")?;
    }
    eprintln!("recorded {RANKS} ranks into {}", out.display());
    Ok(())
}
