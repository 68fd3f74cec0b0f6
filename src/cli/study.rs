//! `repro study noise|devices|cost`: multi-run experiments from the reproducibility literature.

use super::error::CliError;
use super::exit::Exit;
use super::workload_args::WorkloadArgs;
use clap::{Args, Subcommand};
use repro::record::open_device;
use repro::report::{
    plot_cost, plot_devices, plot_noise, plot_order, render_cost, render_devices, render_noise, render_order,
};
use repro::study::{
    run_cost, run_devices, run_noise, run_order, Progress, StudyDir, StudyKind, StudyOut, StudyReport, Subject,
};
use repro::workloads::{ClassifierConfig, GptConfig, Workload, WorkloadKind};
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct StudyArgs {
    #[command(subcommand)]
    study: Study,
}

impl StudyArgs {
    /// What the study trains, for `cli::main` to note the options given; none for `study show`
    /// and `study cost`, which train workloads of their own.
    pub fn train_mut(&mut self) -> Option<&mut WorkloadArgs> {
        match &mut self.study {
            Study::Noise(a) => Some(&mut a.train),
            Study::Devices(a) => Some(&mut a.train),
            Study::Order(a) => Some(&mut a.train),
            Study::Cost(_) | Study::Show(_) => None,
        }
    }
}

#[derive(Debug, Subcommand)]
enum Study {
    /// Algorithmic vs implementation noise: N runs each of control (fixed seeds, ordered
    /// reductions), algo (seeds vary), impl (atomic reductions) and algo+impl; accuracy spread,
    /// predictive churn, distance of normalized weights, per-class spread.
    Noise(NoiseArgs),
    /// One configuration on several devices: test error side by side, where the runs first
    /// differ, and how the weights' ULP distance grows.
    Devices(DevicesArgs),
    /// Time per training step of each workload in each reduction mode, and the overhead of the
    /// deterministic modes over atomic.
    Cost(CostArgs),
    /// The data order alone: N runs per batch size that differ only in the order seed (ordered
    /// reductions), up to the whole training set per batch; churn, weight distance, and where
    /// two full-batch runs first differ.
    Order(OrderArgs),
    /// Print a finished study's report (its NAME.json) as a table again.
    Show(ShowArgs),
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// A study's JSON report (noise.json, devices.json, cost.json or order.json).
    file: PathBuf,
    /// Print a Markdown table instead.
    #[arg(long)]
    markdown: bool,
}

/// Output options shared by the studies.
#[derive(Debug, Args)]
struct Output {
    /// Study directory: settings, finished runs (a rerun resumes), report and plots.
    #[arg(long)]
    out: PathBuf,
    /// Delete the runs of a different study found in --out and start over.
    #[arg(long)]
    restart: bool,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct NoiseArgs {
    /// Runs per variant.
    #[arg(long, default_value_t = 10)]
    runs: usize,
    #[command(flatten)]
    output: Output,
    // What to train: last, so that its help headings come after this command's own options.
    #[command(flatten)]
    train: WorkloadArgs,
}

#[derive(Debug, Args)]
pub struct OrderArgs {
    /// Runs per batch size.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Batch sizes; `full` is the whole training set [default: the workload's batch, 4 times
    /// it, and full].
    #[arg(long, value_delimiter = ',', value_name = "N,N,...,full")]
    batch_sizes: Vec<String>,
    #[command(flatten)]
    output: Output,
    // What to train: last, so that its help headings come after this command's own options.
    #[command(flatten)]
    train: WorkloadArgs,
}

#[derive(Debug, Args)]
pub struct DevicesArgs {
    /// Devices to train on, compared with the first [default: cpu,cuda:0 in CUDA builds,
    /// cpu,cpu otherwise].
    #[arg(long, value_delimiter = ',')]
    devices: Vec<String>,
    #[command(flatten)]
    output: Output,
    // What to train: last, so that its help headings come after this command's own options.
    #[command(flatten)]
    train: WorkloadArgs,
}

#[derive(Debug, Args)]
pub struct CostArgs {
    /// Workloads to time: mlp, cnn, resnet18, gpt.
    #[arg(long, value_delimiter = ',', default_value = "mlp,cnn,resnet18")]
    workloads: Vec<String>,
    /// Device.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Steps timed per mode and round, after one warm-up step [default: 20 on a GPU, 5 on
    /// the CPU].
    #[arg(long)]
    steps: Option<u64>,
    /// Rounds: the modes are timed in turn this many times [default: 3 on a GPU, 1 on the CPU].
    #[arg(long)]
    rounds: Option<usize>,
    /// ResNet-18 width [default: 64 on a GPU, 8 on the CPU].
    #[arg(long)]
    width: Option<usize>,
    /// Batch size for every workload [default: each workload's].
    #[arg(long)]
    batch: Option<usize>,
    #[command(flatten)]
    output: Output,
}

impl StudyArgs {
    /// Whether the report is asked for as JSON (errors then come as JSON too).
    pub fn json(&self) -> bool {
        match &self.study {
            Study::Noise(a) => a.output.json,
            Study::Devices(a) => a.output.json,
            Study::Cost(a) => a.output.json,
            Study::Order(a) => a.output.json,
            Study::Show(_) => false,
        }
    }
}

pub fn run(args: StudyArgs) -> Result<Exit, CliError> {
    match args.study {
        Study::Noise(a) => noise(a),
        Study::Devices(a) => devices(a),
        Study::Cost(a) => cost(a),
        Study::Order(a) => order(a),
        Study::Show(a) => show(a),
    }
}

fn show(a: ShowArgs) -> Result<Exit, CliError> {
    let path = a.file.display();
    let text = std::fs::read_to_string(&a.file).map_err(|e| format!("{path}: {e}"))?;
    let report: StudyReport = serde_json::from_str(&text).map_err(|_| {
        // The kinds of report are told apart by their fields; a file named like one of them
        // gets that kind's exact problem.
        let name = a.file.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let kind = StudyKind::of_report_file(name);
        match kind.and_then(|k| Some((k, k.read_error(&text)?))) {
            Some((kind, e)) => format!("{path}: not a readable {} report: {e}", kind.name()),
            None => {
                let files: Vec<String> = StudyKind::ALL.iter().map(|k| format!("{}.json", k.name())).collect();
                let (last, rest) = files.split_last().expect("studies");
                format!("{path}: not a study report (the {} or {last} of `repro study`)", rest.join(", "))
            }
        }
    })?;
    super::output::emit(&match &report {
        StudyReport::Noise(r) => render_noise(r, a.markdown),
        StudyReport::Devices(r) => render_devices(r, a.markdown),
        StudyReport::Cost(r) => render_cost(r, a.markdown),
        StudyReport::Order(r) => render_order(r, a.markdown),
    });
    Ok(Exit::Same)
}

fn subject(train: &WorkloadArgs) -> Result<Subject, CliError> {
    Ok(Subject::new(train.workload()?)?)
}

/// The progress bar behind a study's `Progress`, counting its `unit` (runs, timings).
struct Bar(super::progress::Progress);

impl Bar {
    fn new(unit: &str) -> Self {
        Bar(super::progress::Progress::new(unit, None))
    }
}

impl Progress for Bar {
    fn update(&mut self, done: usize, total: usize, message: &str) {
        self.0.done(done as u64, total as u64);
        self.0.message(message);
    }
}

impl Output {
    fn study_out(&self) -> StudyOut {
        StudyOut { dir: self.out.clone(), restart: self.restart }
    }
}

fn finish(
    dir: &StudyDir,
    kind: StudyKind,
    json: bool,
    report: &impl serde::Serialize,
    text: String,
    markdown: String,
    svg: Result<String, String>,
) -> Result<(), CliError> {
    let name = kind.name();
    let encoded = serde_json::to_string_pretty(report)?;
    dir.write(&format!("{name}.json"), encoded.as_bytes())?;
    dir.write(&format!("{name}.md"), markdown.as_bytes())?;
    let plot = dir.write(&format!("{name}.svg"), svg?.as_bytes())?;
    if json {
        super::output::line(&encoded);
    } else {
        super::output::emit(&text);
        super::output::line(&format!(
            "\nreport: {0}/{name}.md, {0}/{name}.json; plot: {1}",
            dir.path().display(),
            plot.display()
        ));
    }
    Ok(())
}

fn noise(a: NoiseArgs) -> Result<Exit, CliError> {
    let subject = subject(&a.train)?;
    let device = open_device(&a.train.device)?;
    let (report, dir) = {
        let mut bar = Bar::new("runs");
        run_noise(&subject, a.runs, &device, &a.train.device, &a.output.study_out(), &mut bar)?
    };
    let svg = plot_noise(&report);
    finish(
        &dir,
        StudyKind::Noise,
        a.output.json,
        &report,
        render_noise(&report, false),
        render_noise(&report, true),
        svg,
    )?;
    Ok(Exit::Same)
}

fn devices(a: DevicesArgs) -> Result<Exit, CliError> {
    let subject = subject(&a.train)?;
    let devices = if a.devices.is_empty() {
        if cfg!(feature = "cuda") {
            vec!["cpu".to_string(), "cuda:0".to_string()]
        } else {
            eprintln!("note: a CPU-only build compares the CPU with itself; pass --devices to choose");
            vec!["cpu".to_string(), "cpu".to_string()]
        }
    } else {
        a.devices.clone()
    };
    let (report, dir) = run_devices(&subject, &devices, &a.output.study_out())?;
    let svg = plot_devices(&report);
    finish(
        &dir,
        StudyKind::Devices,
        a.output.json,
        &report,
        render_devices(&report, false),
        render_devices(&report, true),
        svg,
    )?;
    Ok(if report.comparisons.iter().all(|c| c.identical) { Exit::Same } else { Exit::Diverged })
}

fn cost(a: CostArgs) -> Result<Exit, CliError> {
    let device = open_device(&a.device)?;
    // The CPU defaults keep the study to a couple of minutes there.
    let cpu = a.device == "cpu";
    let width = a.width.unwrap_or(if cpu { 8 } else { 64 });
    let steps = a.steps.unwrap_or(if cpu { 5 } else { 20 });
    let rounds = a.rounds.unwrap_or(if cpu { 1 } else { 3 });
    let subjects = a
        .workloads
        .iter()
        .map(|w| {
            let kind = w.parse::<WorkloadKind>().ok();
            let workload = if kind == Some(WorkloadKind::Gpt) {
                let d = GptConfig::default();
                Workload::Gpt(GptConfig { batch: a.batch.unwrap_or(d.batch), ..d })
            } else {
                let model = kind.and_then(WorkloadKind::classifier_model).ok_or_else(|| {
                    format!("unknown model `{w}`: expected {}", WorkloadKind::listed(|w| w.study_model().is_some()))
                })?;
                let mut c = ClassifierConfig::defaults(model);
                c.width = width;
                if let Some(b) = a.batch {
                    c.batch = b;
                }
                Workload::Classifier(c)
            };
            Ok(Subject::new(workload)?)
        })
        .collect::<Result<Vec<_>, CliError>>()?;
    let (report, dir) = {
        let mut bar = Bar::new("timings");
        run_cost(&subjects, steps, rounds, &device, &a.device, &a.output.study_out(), &mut bar)?
    };
    let svg = plot_cost(&report);
    finish(
        &dir,
        StudyKind::Cost,
        a.output.json,
        &report,
        render_cost(&report, false),
        render_cost(&report, true),
        svg,
    )?;
    Ok(Exit::Same)
}

fn order(a: OrderArgs) -> Result<Exit, CliError> {
    let subject = subject(&a.train)?;
    let full = subject
        .train_examples()
        .ok_or("the data-order study trains a classifier: pass --workload mlp, cnn or resnet18")?;
    let batch = match &subject {
        Subject::Classifier { config, .. } => config.batch,
        Subject::Gpt(config) => config.batch,
    };
    let sizes = if a.batch_sizes.is_empty() {
        vec![batch.min(full), (4 * batch).min(full), full]
    } else {
        a.batch_sizes
            .iter()
            .map(|s| match s.as_str() {
                "full" => Ok(full),
                n => n.parse::<usize>().map_err(|_| format!("--batch-sizes: `{n}` is not a number or `full`")),
            })
            .collect::<Result<Vec<_>, String>>()?
    };
    let device = open_device(&a.train.device)?;
    let (report, dir) = {
        let mut bar = Bar::new("runs");
        run_order(&subject, &sizes, a.runs, &device, &a.train.device, &a.output.study_out(), &mut bar)?
    };
    let svg = plot_order(&report);
    finish(
        &dir,
        StudyKind::Order,
        a.output.json,
        &report,
        render_order(&report, false),
        render_order(&report, true),
        svg,
    )?;
    Ok(Exit::Same)
}
