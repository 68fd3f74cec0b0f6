//! `repro invariance`: does a sequence's output depend on the batch it is run in?

use super::workload_args::WorkloadArgs;
use super::{print_json, Exit};
use clap::Args;
use repro::invariance::{workloads, DEFAULT_BATCH_SIZES};
use repro::record::open_device;
use repro::report::render_invariance;
use repro::workloads::Workload;

#[derive(Debug, Args)]
pub struct InvarianceArgs {
    /// Batch sizes to run the sequence in [default: 1,2,3,4,8,16,32,64,128].
    #[arg(long, value_delimiter = ',', value_name = "N,N,...")]
    batch_sizes: Vec<usize>,
    /// Paddings: the sequence alone followed by this many tokens, its own positions compared
    /// (gpt only; the sequence is shortened to leave room) [default: 1 and a quarter of
    /// --context].
    #[arg(long, value_delimiter = ',', value_name = "N,N,...")]
    paddings: Option<Vec<usize>>,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
    /// Draw a heat map (batching × op, largest ULP distance of the sequence's slice) into
    /// this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<std::path::PathBuf>,
    // What to check: last, so that its help headings come after this command's own options.
    #[command(flatten)]
    train: WorkloadArgs,
}

impl InvarianceArgs {
    /// Whether the report is asked for as JSON (errors then come as JSON too).
    pub fn json(&self) -> bool {
        self.json
    }
}

pub fn run(args: InvarianceArgs) -> Result<Exit, String> {
    let sizes = if args.batch_sizes.is_empty() { DEFAULT_BATCH_SIZES.to_vec() } else { args.batch_sizes.clone() };
    if sizes.contains(&0) {
        return Err("--batch-sizes must be at least 1".into());
    }
    let workload = args.train.workload()?;
    let device = open_device(&args.train.device).map_err(|e| e.to_string())?;
    let label = &args.train.device;
    let report = match &workload {
        Workload::Gpt(c) => {
            // One token, and a quarter of the context (16 tokens at the default 64).
            let paddings = args.paddings.clone().unwrap_or_else(|| vec![1, (c.context / 4).max(1)]);
            workloads::gpt(c, &sizes, &paddings, &device, label)
        }
        Workload::Qwen2(_) if args.paddings.as_ref().is_some_and(|p| p.iter().any(|&n| n > 0)) => {
            return Err("qwen2's logits are its last position's, which padding would make a pad token's: \
                 --paddings applies to gpt"
                .into())
        }
        Workload::Qwen2(c) => workloads::qwen2(c, &sizes, &device, label),
        _ => return Err("invariance checks a model's forward pass: pass --workload gpt or --workload qwen2".into()),
    }
    .map_err(|e| e.to_string())?;
    if let Some(path) = &args.plot {
        super::output::write_plot(path, repro::report::plot_invariance(&report))?;
    }
    if args.json {
        let verdict = if report.invariant() { "invariant" } else { "not_invariant" };
        print_json("repro.invariance.v1", Some(verdict), &report)?;
    } else {
        super::output::emit(&render_invariance(&report));
    }
    Ok(if report.invariant() { Exit::Same } else { Exit::Diverged })
}
