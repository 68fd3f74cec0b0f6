//! The arguments that say what to train, shared by `record`, `gate`, `baseline` and `study`.

use super::error::CliError;
use candle_core::DType;
use clap::builder::TypedValueParser;
use clap::Args;
use repro::ops::Reductions;
use repro::record::Perturbation;
use repro::trace::RunConfig;
use repro::workloads::gpt::model::Norm;
use repro::workloads::{
    AdderConfig, ClassifierConfig, DatasetName, DecoderConfig, DecoderShape, Family, Formulation, GptConfig, ModelKind,
    Workload, WorkloadKind, WorkloadRun,
};
use std::path::Path;

#[derive(Debug, Clone, Args)]
pub struct WorkloadArgs {
    /// Workload to train: adder (linear, MSE, SGD); a classifier trained with Adam and
    /// cross-entropy: mlp (26 hidden units), cnn (three conv layers), resnet18; or gpt (a small
    /// transformer trained with AdamW, recorded by automatic graph capture).
    #[arg(
        long,
        default_value = "adder",
        value_parser = clap::builder::PossibleValuesParser::new(WorkloadKind::names())
            .map(|name| name.parse::<WorkloadKind>().expect("a possible value"))
    )]
    pub workload: WorkloadKind,
    /// Seed of the initial weights (classifiers: and of every other seed not given).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Seed of the training data: the adder's batches, a classifier's synthetic dataset
    /// (defaults to --seed for the adder, 0 for classifiers).
    #[arg(long)]
    pub data_seed: Option<u64>,
    /// Training steps [adder default: 1000; classifiers: all epochs; gpt: 20].
    #[arg(long, allow_negative_numbers = true, value_parser = parse_steps)]
    pub steps: Option<u64>,
    /// Examples per batch [adder: 10000, mlp and cnn: 32, resnet18: 128, gpt: 8 sequences].
    #[arg(long)]
    pub batch: Option<usize>,
    /// Width: channels of ResNet-18's first stage [64], gpt's embedding width [128].
    #[arg(long)]
    pub width: Option<usize>,
    /// Input features (adder).
    #[arg(long, default_value_t = AdderConfig::default().features)]
    pub features: usize,
    /// Learning rate [adder: 0.01 (SGD); Adam: mlp 0.0005, cnn 0.002, resnet18 0.001; gpt: 0.001].
    #[arg(long, allow_negative_numbers = true)]
    pub lr: Option<f64>,
    /// How the adder writes its reductions: reduce (sums, means) or matmul (matrix products).
    #[arg(long, default_value = "reduce")]
    pub formulation: Formulation,
    /// How batch reductions accumulate: candle (built-in kernels), atomic (float atomics, order
    /// decided by timing) or ordered (fixed order, bit-reproducible).
    #[arg(long, default_value = "candle")]
    pub reductions: Reductions,
    /// Device: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Fault injection: move element ELEMENT (default 0, row-major) of TENSOR by ULPS units in
    /// the last place at STEP.
    #[arg(long, value_name = "STEP:TENSOR:ULPS[@ELEMENT]")]
    pub perturb: Option<Perturbation>,
    #[command(flatten)]
    pub classifier: ClassifierArgs,
    #[command(flatten)]
    pub gpt: GptArgs,
    /// The workload options given on the command line, by their long names (`note_given`):
    /// clap fills defaults in, so only the matches' value sources say what a user asked for.
    #[arg(skip)]
    given: Vec<String>,
}

/// Settings of the transformer workload.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Transformers (gpt; qwen2 and gemma take --layers and --context as their prompt length)")]
pub struct GptArgs {
    /// Transformer blocks.
    #[arg(long, default_value_t = GptConfig::default().layers)]
    pub layers: usize,
    /// Tokens per sequence (bytes of the corpus).
    #[arg(long, default_value_t = GptConfig::default().context)]
    pub context: usize,
    /// Attention heads.
    #[arg(long, default_value_t = GptConfig::default().heads)]
    pub heads: usize,
    /// Normalisation: ops (layer norm from tensor ops) or fused (candle's kernel, which has no
    /// backward pass: the parameters before it get no gradient).
    #[arg(
        long,
        default_value = "ops",
        value_parser = clap::builder::PossibleValuesParser::new(Norm::NAMED.map(|(name, _)| name))
            .map(|name| Norm::named(&name).expect("a possible value"))
    )]
    pub norm: Norm,
    /// Batch-invariant matrix products and softmax sums: a sequence's results do not depend on
    /// its batch, padding or KV cache (slower; see docs/invariance.md).
    #[arg(long)]
    pub batch_invariant: bool,
    /// Element type of qwen2's and gemma's weights and activations: f32 or bf16 (gpt trains in
    /// f32; its forward pass in `repro invariance` also runs in bf16).
    #[arg(
        long,
        default_value = "f32",
        value_parser = clap::builder::PossibleValuesParser::new(["f32", "bf16"])
            .map(|name| if name == "bf16" { DType::BF16 } else { DType::F32 })
    )]
    pub dtype: DType,
    /// qwen2's config shape: small (width and layers as given) or qwen2-0.5b (Qwen2-0.5B's
    /// widths, heads and vocabulary; --layers sets the depth, 24 in the real model).
    #[arg(
        long,
        default_value = "small",
        value_parser = clap::builder::PossibleValuesParser::new(DecoderShape::NAMES)
            .map(|name| DecoderShape::named(&name).expect("a possible value"))
    )]
    pub shape: DecoderShape,
}

/// Settings of the classifier workloads.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Classifiers (mlp, cnn, resnet18)")]
pub struct ClassifierArgs {
    /// Dataset [mlp: gauss2d; cnn: digits; resnet18: cifar-synthetic]; mlp also takes gauss5d and
    /// subgroups (protected attributes: the noise study reports sub-group spreads).
    #[arg(
        long,
        value_parser = clap::builder::PossibleValuesParser::new(DatasetName::ALL)
            .map(|name| name.parse::<DatasetName>().expect("a possible value"))
    )]
    pub dataset: Option<DatasetName>,
    /// Use only the first N training and test examples.
    #[arg(long, value_name = "N")]
    pub examples: Option<usize>,
    /// Passes over the training data [mlp: 5, cnn: 10, resnet18: 2].
    #[arg(long)]
    pub epochs: Option<u64>,
    /// Seed of the data order (default: --seed).
    #[arg(long)]
    pub order_seed: Option<u64>,
    /// Seed of the augmentation shifts (default: --seed).
    #[arg(long)]
    pub augment_seed: Option<u64>,
    /// Seed of the dropout masks (default: --seed).
    #[arg(long)]
    pub dropout_seed: Option<u64>,
    /// Batch norm after each convolution (cnn; resnet18 always has it).
    #[arg(long)]
    pub batch_norm: bool,
    /// Dropout probability after the hidden dense layer (mlp, cnn).
    #[arg(long, default_value_t = 0.0)]
    pub dropout: f64,
    /// Random image shifts of up to N pixels [cnn: 1, resnet18: 2; 0 turns augmentation off].
    #[arg(long, value_name = "N")]
    pub augment_shift: Option<usize>,
}

/// The workload options each workload takes beyond the ones all take (`--workload`, `--seed`,
/// `--data-seed`, `--steps`, `--batch`, `--lr`, `--device`, `--perturb`, `--reductions`,
/// `--formulation`, which the workloads check themselves).
fn own_options(workload: WorkloadKind) -> &'static [&'static str] {
    match workload {
        WorkloadKind::Adder => &["features"],
        WorkloadKind::Gpt => &["width", "layers", "context", "heads", "norm", "batch-invariant"],
        WorkloadKind::Qwen2 => &["width", "layers", "context", "dtype", "shape"],
        WorkloadKind::Gemma => &["width", "layers", "context", "dtype"],
        WorkloadKind::Mlp | WorkloadKind::Cnn | WorkloadKind::ResNet18 => &[
            "width",
            "dataset",
            "examples",
            "epochs",
            "order-seed",
            "augment-seed",
            "dropout-seed",
            "batch-norm",
            "dropout",
            "augment-shift",
        ],
    }
}

impl WorkloadArgs {
    /// Notes which workload options `matches` (the innermost subcommand's, these arguments'
    /// own) got from the command line rather than from a default.
    pub fn note_given(&mut self, matches: &clap::ArgMatches) {
        use clap::Args as _;
        let command = WorkloadArgs::augment_args(clap::Command::new("workload"));
        self.given = command
            .get_arguments()
            .filter(|a| matches.ids().any(|id| id == a.get_id()))
            .filter(|a| matches.value_source(a.get_id().as_str()) == Some(clap::parser::ValueSource::CommandLine))
            .filter_map(|a| a.get_long().map(str::to_string))
            .collect();
    }

    /// Refuses built-in workload options given with `-- CMD` (`--steps`, `--seed`, `--workload`,
    /// ...): the program trains what its own arguments say, so they would be silently ignored.
    pub fn refuse_with_command(&self) -> Result<(), CliError> {
        match self.given.first() {
            Some(option) => Err(format!(
                "--{option} is a setting of the built-in workloads; with `-- CMD` the program trains as its own \
                 arguments say: give the setting to the program instead"
            )
            .into()),
            None => Ok(()),
        }
    }

    /// Refuses a workload option given on the command line that `workload` does not take, rather
    /// than ignoring it silently (`--features` with mlp, `--epochs` with the adder).
    fn check_options_apply(&self, workload: WorkloadKind) -> Result<(), CliError> {
        self.check_options_apply_besides(workload, &[])
    }

    /// `check_options_apply`, with `also` taken too (options a command adds to a workload's own).
    fn check_options_apply_besides(&self, workload: WorkloadKind, also: &[&str]) -> Result<(), CliError> {
        const EVERY_WORKLOAD: [&str; 10] =
            ["workload", "seed", "data-seed", "steps", "batch", "lr", "device", "perturb", "reductions", "formulation"];
        let own = own_options(workload);
        match self.given.iter().find(|o| {
            !EVERY_WORKLOAD.contains(&o.as_str()) && !own.contains(&o.as_str()) && !also.contains(&o.as_str())
        }) {
            Some(option) => {
                let takers: Vec<&str> = WorkloadKind::ALL
                    .iter()
                    .filter(|&&w| own_options(w).contains(&option.as_str()))
                    .map(|w| w.name())
                    .collect();
                Err(format!("--{option} is a setting of {}, not of {workload}", takers.join(", ")).into())
            }
            None => Ok(()),
        }
    }

    /// The workload these arguments describe, checked (with the perturbation).
    pub fn workload(&self) -> Result<Workload, CliError> {
        // The workload's own checks first (their messages say more), then the general one.
        let workload = self.workload_unchecked()?;
        workload.validate(self.perturb.as_ref())?;
        self.check_options_apply(self.workload)?;
        Ok(workload)
    }

    /// The workload these arguments describe with the fault they plant, checked.
    pub fn workload_run(&self) -> Result<WorkloadRun, CliError> {
        Ok(WorkloadRun { workload: self.workload()?, perturbation: self.perturb.clone() })
    }

    /// The run a gate against a baseline records: the baseline's settings (`base`, its
    /// header's), with the workload options given on the command line in place of theirs, and
    /// the fault planted here (a gate's run may differ from its baseline's there). A baseline
    /// of another workload than `--workload` names, or of a user's program, gives the command
    /// line's run: the baseline check then says what differs.
    pub fn workload_run_over(&self, base: &RunConfig, file: &Path) -> Result<WorkloadRun, CliError> {
        let Ok(kind) = base.workload.parse::<WorkloadKind>() else { return self.workload_run() };
        let given = &self.given;
        if given.iter().any(|o| o == "workload") && kind != self.workload {
            return self.workload_run();
        }
        self.check_options_apply(kind)?;
        let mine = WorkloadArgs { workload: kind, ..self.clone() }.workload_unchecked()?;
        let mut mine = WorkloadRun { workload: mine, perturbation: self.perturb.clone() }.run_config();
        let mut run = base.clone();
        run.params.remove("perturb");
        for option in given {
            if option == "steps" {
                run.steps = mine.steps;
                continue;
            }
            // The header keys an option sets (a classifier's seed is its `init_seed`).
            let key = option.replace('-', "_");
            let keys: &[&str] = match key.as_str() {
                "seed" => &["seed", "init_seed"],
                "data_seed" => &["data_seed", "dataset_seed"],
                "context" => &["context", "tokens"],
                // A decoder's shape sets its width.
                "shape" => &["shape", "width"],
                key => &[key],
            };
            for key in keys {
                match mine.params.remove(*key) {
                    Some(value) => run.params.insert(key.to_string(), value),
                    None => run.params.remove(*key),
                };
            }
        }
        WorkloadRun::from_run_config(&run)
            .map_err(|e| format!("baseline {}: {e}; it cannot set the gate's run", file.display()).into())
    }

    /// The workload for a forward pass only (`repro invariance`), and the gpt's element type:
    /// the gpt trains in f32, but its forward pass also runs in bf16.
    pub fn inference_workload(&self) -> Result<(Workload, candle_core::DType), CliError> {
        let dtype = self.gpt.dtype;
        let bf16 = dtype == DType::BF16;
        if self.workload != WorkloadKind::Gpt || !bf16 {
            return Ok((self.workload()?, dtype));
        }
        let workload = self.gpt_in(true).map(Workload::Gpt)?;
        workload.validate(self.perturb.as_ref())?;
        self.check_options_apply_besides(self.workload, &["dtype"])?;
        Ok((workload, dtype))
    }

    /// The workload the arguments describe, its options' own checks aside.
    fn workload_unchecked(&self) -> Result<Workload, CliError> {
        match self.workload {
            WorkloadKind::Adder => self.adder().map(Workload::Adder),
            WorkloadKind::Gpt => self.gpt_in(false).map(Workload::Gpt),
            WorkloadKind::Qwen2 => self.decoder(Family::Qwen2).map(Workload::Decoder),
            WorkloadKind::Gemma => self.decoder(Family::Gemma).map(Workload::Decoder),
            WorkloadKind::Mlp | WorkloadKind::Cnn | WorkloadKind::ResNet18 => {
                let model = self.workload.classifier_model().expect("a classifier workload");
                self.classifier(model).map(Workload::Classifier)
            }
        }
    }

    fn adder(&self) -> Result<AdderConfig, CliError> {
        let defaults = AdderConfig::default();
        let config = AdderConfig {
            seed: self.seed,
            data_seed: self.data_seed.unwrap_or(self.seed),
            steps: self.steps.unwrap_or(defaults.steps),
            batch: self.batch.unwrap_or(defaults.batch),
            features: self.features,
            lr: self.lr.unwrap_or(defaults.lr),
            formulation: self.formulation,
            reductions: self.reductions,
        };
        Ok(config)
    }

    /// The gpt's settings; `inference`: for a forward pass only, where bf16 is allowed.
    fn gpt_in(&self, inference: bool) -> Result<GptConfig, CliError> {
        let d = GptConfig::default();
        let g = &self.gpt;
        let config = GptConfig {
            seed: self.seed,
            data_seed: self.data_seed.unwrap_or(self.seed),
            steps: self.steps.unwrap_or(d.steps),
            batch: self.batch.unwrap_or(d.batch),
            context: g.context,
            layers: g.layers,
            width: self.width.unwrap_or(d.width),
            heads: g.heads,
            lr: self.lr.unwrap_or(d.lr),
            norm: g.norm,
            reductions: self.reductions,
            batch_invariant: g.batch_invariant,
        };
        if self.formulation != Formulation::Reduce {
            return Err("--formulation is a setting of the adder, not of gpt".into());
        }
        if self.gpt.shape != DecoderShape::Small {
            return Err(format!("--shape {} is a shape of qwen2's config, not of gpt", self.gpt.shape.name()).into());
        }
        if self.gpt.dtype != DType::F32 && !inference {
            return Err(
                "gpt trains in f32: --dtype bf16 applies to qwen2 and gemma, and to gpt in `repro invariance`".into()
            );
        }
        Ok(config)
    }

    fn decoder(&self, family: Family) -> Result<DecoderConfig, CliError> {
        let d = DecoderConfig::default();
        let config = DecoderConfig {
            family,
            seed: self.seed,
            data_seed: self.data_seed.unwrap_or(self.seed),
            steps: self.steps.unwrap_or(d.steps),
            batch: self.batch.unwrap_or(d.batch),
            tokens: self.gpt.context,
            layers: self.gpt.layers,
            width: self.width.unwrap_or(d.width),
            shape: self.gpt.shape,
            dtype: self.gpt.dtype,
        };
        if config.shape != DecoderShape::Small && self.width.is_some() {
            return Err(format!("--shape {} sets the width: leave --width out", self.gpt.shape.name()).into());
        }
        if self.perturb.is_some() || self.reductions != Reductions::Candle || self.formulation != Formulation::Reduce {
            return Err(
                format!("{family} records inference: --perturb, --reductions and --formulation do not apply").into()
            );
        }
        if self.gpt.batch_invariant {
            return Err(format!(
                "--batch-invariant is a mode of the gpt; {family} runs candle-transformers' code unchanged"
            )
            .into());
        }
        Ok(config)
    }

    fn classifier(&self, model: ModelKind) -> Result<ClassifierConfig, CliError> {
        let c = &self.classifier;
        let d = ClassifierConfig::defaults(model);
        let config = ClassifierConfig {
            model,
            dataset: c.dataset.unwrap_or(d.dataset),
            dataset_seed: self.data_seed.unwrap_or(d.dataset_seed),
            examples: c.examples,
            epochs: c.epochs.unwrap_or(d.epochs),
            max_steps: self.steps,
            batch: self.batch.unwrap_or(d.batch),
            lr: self.lr.unwrap_or(d.lr),
            seeds: repro::workloads::Seeds {
                init: self.seed,
                order: c.order_seed.unwrap_or(self.seed),
                augment: c.augment_seed.unwrap_or(self.seed),
                dropout: c.dropout_seed.unwrap_or(self.seed),
            },
            reductions: self.reductions,
            batch_norm: c.batch_norm || d.batch_norm,
            dropout: c.dropout,
            augment_shift: c.augment_shift.unwrap_or(d.augment_shift),
            width: self.width.unwrap_or(d.width),
        };
        if self.formulation != Formulation::Reduce {
            return Err(format!("--formulation is a setting of the adder, not of {model}").into());
        }
        Ok(config)
    }
}

/// A step count as `--steps` takes it; a negative or fractional one is named, not taken for an
/// option (0 is refused later, by the workload, with what it needs).
fn parse_steps(s: &str) -> Result<u64, String> {
    s.trim().parse().map_err(|_| format!("`{s}` is not a number of steps: give a whole number, at least 1"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches, Parser};

    #[derive(Debug, Parser)]
    struct Line {
        #[arg(last = true)]
        command: Vec<String>,
        #[command(flatten)]
        train: WorkloadArgs,
    }

    fn given(argv: &[&str]) -> WorkloadArgs {
        let matches = Line::command().try_get_matches_from(argv).unwrap();
        let mut line = Line::from_arg_matches(&matches).unwrap();
        line.train.note_given(&matches);
        line.train
    }

    #[test]
    fn only_options_on_the_command_line_count_as_given_not_defaults_nor_the_program_s() {
        let train =
            given(&["repro", "--steps=3", "--width", "16", "--batch-invariant", "--", "train.py", "--seed", "4"]);
        assert_eq!(train.given, ["steps", "width", "batch-invariant"]);
        assert!(train.refuse_with_command().unwrap_err().to_string().contains("--steps is a setting"));
        let train = given(&["repro", "--", "train.py", "--epochs", "2"]);
        assert!(train.given.is_empty() && train.refuse_with_command().is_ok());
        // Given, an option the workload does not take is refused; its default never is.
        let train = given(&["repro", "--workload", "mlp", "--features", "3"]);
        let e = train.workload().unwrap_err().to_string();
        assert!(e.contains("--features is a setting of adder, not of mlp"), "{e}");
        assert!(given(&["repro", "--workload", "mlp"]).workload().is_ok());
    }
}
