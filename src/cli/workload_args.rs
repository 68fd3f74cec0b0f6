//! The arguments that say what to train, shared by `record`, `gate` and `baseline`.

use clap::Args;
use repro::ops::Reductions;
use repro::record::Perturbation;
use repro::workloads::{AdderConfig, Formulation, WORKLOADS};

#[derive(Debug, Clone, Args)]
pub struct WorkloadArgs {
    /// Workload to train.
    #[arg(long, default_value = "adder", value_parser = clap::builder::PossibleValuesParser::new(WORKLOADS))]
    pub workload: String,
    /// Seed of the initial weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Seed of the training data (defaults to --seed).
    #[arg(long)]
    pub data_seed: Option<u64>,
    /// Training steps.
    #[arg(long, default_value_t = AdderConfig::default().steps)]
    pub steps: u64,
    /// Examples per batch.
    #[arg(long, default_value_t = AdderConfig::default().batch)]
    pub batch: usize,
    /// Input features.
    #[arg(long, default_value_t = AdderConfig::default().features)]
    pub features: usize,
    /// Learning rate.
    #[arg(long, default_value_t = AdderConfig::default().lr)]
    pub lr: f64,
    /// How the adder writes its reductions: reduce (sums, means) or matmul (matrix products).
    #[arg(long, default_value = "reduce")]
    pub formulation: Formulation,
    /// How the reduce formulation's sums accumulate: candle (built-in kernels), atomic (float
    /// atomics, order decided by timing) or ordered (fixed tree, bit-reproducible).
    #[arg(long, default_value = "candle")]
    pub reductions: Reductions,
    /// Device: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Fault injection: move element 0 of TENSOR by ULPS units in the last place at STEP.
    #[arg(long, value_name = "STEP:TENSOR:ULPS")]
    pub perturb: Option<Perturbation>,
}

impl WorkloadArgs {
    /// The adder configuration these arguments describe, checked (with the perturbation).
    pub fn adder(&self) -> Result<AdderConfig, String> {
        let config = AdderConfig {
            seed: self.seed,
            data_seed: self.data_seed.unwrap_or(self.seed),
            steps: self.steps,
            batch: self.batch,
            features: self.features,
            lr: self.lr,
            formulation: self.formulation,
            reductions: self.reductions,
        };
        config.validate(self.perturb.as_ref()).map_err(|e| e.to_string())?;
        Ok(config)
    }

    /// The run configuration written to the trace header, the perturbation included.
    pub fn run_config(&self, config: &AdderConfig) -> repro::trace::RunConfig {
        let mut run = config.run_config();
        if let Some(p) = &self.perturb {
            run.params.insert("perturb".into(), p.to_string());
        }
        run
    }
}
