//! `repro invariance`: does a sequence's output depend on the batch it is run in?

use super::error::CliError;
use super::exit::Exit;
use super::output::print_json;
use super::report_args::{JsonOutput, PlotOutput};
use super::workload_args::WorkloadArgs;
use clap::Args;
use repro::invariance::{cost, workloads, DEFAULT_BATCH_SIZES};
use repro::record::open_device;
use repro::report::{render_forward_cost, render_invariance};
use repro::workloads::{ForwardModel, WorkloadKind};

#[derive(Debug, Args)]
#[command(mut_arg("plot", |a| a.help(
    "Draw a heat map (batching × op, largest ULP distance of the sequence's slice) into this SVG file"
)))]
pub struct InvarianceArgs {
    /// Batch sizes to run the sequence in, each 1 to 65536 [default: 1,2,3,4,8,16,32,64,128].
    #[arg(long, value_delimiter = ',', value_name = "N,N,...", value_parser = parse_batch_size)]
    batch_sizes: Vec<usize>,
    /// Paddings: the sequence alone followed by this many tokens, its own positions compared
    /// (for the gpt the sequence is shortened to leave room in its context) [default: 1 and a
    /// quarter of --context; 0: none].
    #[arg(long, value_delimiter = ',', value_name = "N,N,...")]
    paddings: Option<Vec<usize>>,
    /// Runs in pieces against the model's KV cache: this many tokens per forward pass, 1
    /// decoding token by token, more prefilling in chunks; every position's logits compared
    /// with the whole prefill's [default: 1 and a quarter of --context; 0: none].
    #[arg(long, value_delimiter = ',', value_name = "N,N,...")]
    chunks: Option<Vec<usize>>,
    /// Instead of the check, time the gpt's forward pass at each of --batch-sizes [default:
    /// 1,8,64] with candle's kernels and with --batch-invariant's, this many passes each.
    #[arg(long, value_name = "PASSES")]
    cost: Option<usize>,
    #[command(flatten)]
    output: JsonOutput,
    #[command(flatten)]
    plot: PlotOutput,
    // What to check: last, so that its help headings come after this command's own options.
    #[command(flatten)]
    train: WorkloadArgs,
}

impl InvarianceArgs {
    /// What it trains, for `cli::main` to note the options given.
    pub fn train_mut(&mut self) -> &mut WorkloadArgs {
        &mut self.train
    }
}

/// The largest batch `--batch-sizes` takes: the batch is built whole in memory, so a size that
/// cannot fit is refused up front rather than grown until the machine gives out.
const MAX_BATCH: usize = 1 << 16;

fn parse_batch_size(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_BATCH).contains(&n) => Ok(n),
        _ => Err(format!("`{s}` is not a batch size: give a whole number, at least 1 and at most {MAX_BATCH}")),
    }
}

impl InvarianceArgs {
    /// Whether the report is asked for as JSON (errors then come as JSON too).
    pub fn json(&self) -> bool {
        self.output.json
    }
}

pub fn run(args: InvarianceArgs) -> Result<Exit, CliError> {
    let default_sizes = if args.cost.is_some() { vec![1, 8, 64] } else { DEFAULT_BATCH_SIZES.to_vec() };
    let sizes = if args.batch_sizes.is_empty() { default_sizes } else { args.batch_sizes.clone() };
    if sizes.contains(&0) {
        return Err("--batch-sizes must be at least 1".into());
    }
    let (workload, dtype) = args.train.inference_workload()?;
    // Every batching's token ids are built on the host (and its forward pass's activations grow
    // with it): a size the host cannot even hold the ids of is refused before any model runs.
    let largest = sizes.iter().copied().max().unwrap_or(1) as u128;
    let tokens = args.train.gpt.context as u128;
    repro::workloads::host_memory::check_fits("the largest batch's token ids", largest * tokens, 4, "--batch-sizes")?;
    if args.cost.is_some_and(|passes| passes > 1_000_000) {
        return Err("--cost takes at most 1000000 passes".into());
    }
    let device = open_device(&args.train.device)?;
    let label = &args.train.device;
    if let Some(passes) = args.cost {
        let Some(ForwardModel::Gpt(config)) = workload.forward_model() else {
            return Err("--cost times the gpt's batch-invariant mode: pass --workload gpt".into());
        };
        let report = cost::gpt_forward_cost(config, &sizes, passes, dtype, &device, label)?;
        if args.output.json {
            print_json("repro.invariance-cost.v1", None, &report)?;
        } else {
            super::output::emit(&render_forward_cost(&report));
        }
        return Ok(Exit::Same);
    }
    // Paddings and chunks default to one token and a quarter of the context (16 at 64).
    let runs = |tokens: usize| {
        let one_and_a_quarter = vec![1, (tokens / 4).max(1)];
        workloads::Batchings {
            batch_sizes: sizes.clone(),
            paddings: args.paddings.clone().unwrap_or_else(|| one_and_a_quarter.clone()),
            chunks: args.chunks.clone().unwrap_or(one_and_a_quarter),
        }
    };
    let report = match workload.forward_model() {
        Some(ForwardModel::Gpt(c)) => workloads::gpt(c, &runs(c.context), dtype, &device, label),
        Some(ForwardModel::Decoder(c)) => workloads::decoder(c, &runs(c.tokens), &device, label),
        None => {
            let choices = WorkloadKind::listed(|w| w.forward_model().is_some()).replace(", ", ", --workload ");
            let choices = choices.replace(" or ", " or --workload ");
            return Err(format!("invariance checks a model's forward pass: pass --workload {choices}").into());
        }
    }?;
    args.plot.write(|| repro::report::plot_invariance(&report))?;
    if args.output.json {
        let verdict = match (report.failed(), report.invariant()) {
            (0, true) => "invariant",
            (0, false) => "not_invariant",
            _ => "incomplete",
        };
        print_json("repro.invariance.v1", Some(verdict), &report)?;
    } else {
        super::output::emit(&render_invariance(&report));
    }
    Ok(match (report.failed(), report.invariant()) {
        (0, true) => Exit::Same,
        (0, false) => Exit::Diverged,
        // Batchings the model could not run: the check is not complete.
        _ => Exit::Error,
    })
}
