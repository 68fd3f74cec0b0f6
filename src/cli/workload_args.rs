//! The arguments that say what to train, shared by `record`, `gate`, `baseline` and `study`:
//! clap's options, and which of them the command line gave. A workload's settings are its
//! config's (`repro::workloads::settings`): the options given are read as the settings of the
//! same names, over the workload's defaults or a baseline's settings.

use super::error::CliError;
use candle_core::DType;
use clap::builder::TypedValueParser;
use clap::Args;
use repro::ops::Reductions;
use repro::record::Perturbation;
use repro::trace::RunConfig;
use repro::workloads::decoder::dtype_name;
use repro::workloads::gpt::model::Norm;
use repro::workloads::{
    to_params, AdderConfig, DatasetName, DecoderShape, Formulation, GptConfig, Workload, WorkloadKind, WorkloadRun,
};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// The options of the built-in workloads. Each serializes, by its field's name, to the text of
/// the setting it gives (`WorkloadKind::options` says which setting of which workload).
#[derive(Debug, Clone, Args, Serialize)]
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
    #[serde(skip)]
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
    #[serde(skip)]
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
    #[serde(skip)]
    pub device: String,
    /// Fault injection: move element ELEMENT (default 0, row-major) of TENSOR by ULPS units in
    /// the last place at STEP.
    #[arg(long, value_name = "STEP:TENSOR:ULPS[@ELEMENT]")]
    #[serde(skip)]
    pub perturb: Option<Perturbation>,
    #[command(flatten)]
    #[serde(skip)]
    pub classifier: ClassifierArgs,
    #[command(flatten)]
    #[serde(skip)]
    pub gpt: GptArgs,
    /// The workload options given on the command line, by their long names (`note_given`):
    /// clap fills defaults in, so only the matches' value sources say what a user asked for.
    #[arg(skip)]
    #[serde(skip)]
    given: Vec<String>,
}

/// Settings of the transformer workload.
#[derive(Debug, Clone, Args, Serialize)]
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
        value_parser = clap::builder::PossibleValuesParser::new(dtype_name::NAMED.map(|(name, _)| name))
            .map(|name| dtype_name::NAMED.into_iter().find(|(n, _)| *n == name).expect("a possible value").1)
    )]
    #[serde(with = "dtype_name")]
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
#[derive(Debug, Clone, Args, Serialize)]
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
    /// than ignoring it silently (`--features` with mlp, `--epochs` with the adder), `also` taken
    /// too (options a command adds to a workload's own).
    fn check_options_apply(&self, workload: WorkloadKind, also: &[&str]) -> Result<(), CliError> {
        // Options of every workload's command line that are not settings of each: the workloads
        // check those they have no setting for themselves (`refuse_misplaced`); the decoders,
        // which run inference, leave --lr unused.
        const EVERY_WORKLOAD: [&str; 7] = ["workload", "steps", "device", "perturb", "reductions", "formulation", "lr"];
        let refused = self
            .given
            .iter()
            .find(|o| !EVERY_WORKLOAD.contains(&o.as_str()) && !takes(workload, o) && !also.contains(&o.as_str()));
        match refused {
            Some(option) => {
                let takers: Vec<&str> =
                    WorkloadKind::ALL.into_iter().filter(|&w| takes(w, option)).map(WorkloadKind::name).collect();
                Err(format!("--{option} is a setting of {}, not of {workload}", takers.join(", ")).into())
            }
            None => Ok(()),
        }
    }

    /// Refuses, with a message of its own, an option every workload's command line takes but
    /// `workload` has no setting for, given a value other than its default (`--formulation` with
    /// the gpt), or one that contradicts another (`--width` with a shape that sets it); `also`:
    /// options a command adds to the workload's own (`--dtype` for the gpt's forward pass).
    fn refuse_misplaced(&self, workload: WorkloadKind, also: &[&str]) -> Result<(), CliError> {
        let matmul = self.formulation != Formulation::Reduce;
        match workload {
            WorkloadKind::Adder => Ok(()),
            WorkloadKind::Gpt if matmul => Err("--formulation is a setting of the adder, not of gpt".into()),
            WorkloadKind::Gpt if self.gpt.shape != DecoderShape::Small => {
                Err(format!("--shape {} is a shape of qwen2's config, not of gpt", self.gpt.shape.name()).into())
            }
            WorkloadKind::Gpt if self.gpt.dtype != DType::F32 && !also.contains(&"dtype") => {
                Err("gpt trains in f32: --dtype bf16 applies to qwen2 and gemma, and to gpt in `repro invariance`"
                    .into())
            }
            WorkloadKind::Gpt => Ok(()),
            WorkloadKind::Qwen2 | WorkloadKind::Gemma => {
                if self.gpt.shape != DecoderShape::Small && self.width.is_some() {
                    return Err(format!("--shape {} sets the width: leave --width out", self.gpt.shape.name()).into());
                }
                if self.perturb.is_some() || self.reductions != Reductions::Candle || matmul {
                    return Err(format!(
                        "{workload} records inference: --perturb, --reductions and --formulation do not apply"
                    )
                    .into());
                }
                if self.gpt.batch_invariant {
                    return Err(format!(
                        "--batch-invariant is a mode of the gpt; {workload} runs candle-transformers' code unchanged"
                    )
                    .into());
                }
                Ok(())
            }
            WorkloadKind::Mlp | WorkloadKind::Cnn | WorkloadKind::ResNet18 if matmul => {
                Err(format!("--formulation is a setting of the adder, not of {workload}").into())
            }
            WorkloadKind::Mlp | WorkloadKind::Cnn | WorkloadKind::ResNet18 => Ok(()),
        }
    }

    /// The settings the command line gives `workload`, by key: the text of each option given
    /// that it takes.
    fn given_settings(&self, workload: WorkloadKind) -> BTreeMap<String, String> {
        let mut values = to_params(self);
        values.extend(to_params(&self.gpt));
        values.extend(to_params(&self.classifier));
        workload
            .options()
            .into_iter()
            .filter(|(option, _)| self.given.contains(option))
            .filter_map(|(option, key)| Some((key.to_string(), values.get(&option.replace('-', "_"))?.clone())))
            .collect()
    }

    /// The workload these arguments describe, checked (with the perturbation).
    pub fn workload(&self) -> Result<Workload, CliError> {
        Ok(self.workload_run()?.workload)
    }

    /// The workload these arguments describe with the fault they plant, checked.
    pub fn workload_run(&self) -> Result<WorkloadRun, CliError> {
        self.workload_run_taking(&[])
    }

    /// `workload_run`, with `also` taken too (options a command adds to the workload's own).
    fn workload_run_taking(&self, also: &[&str]) -> Result<WorkloadRun, CliError> {
        // The workload's own checks first (their messages say more), then the general one.
        self.refuse_misplaced(self.workload, also)?;
        let run = RunConfig {
            workload: self.workload.name().into(),
            steps: self.steps,
            params: self.given_settings(self.workload),
        };
        let planned = WorkloadRun::new(Workload::from_run_config(&run)?, self.perturb.clone())?;
        self.check_options_apply(self.workload, also)?;
        Ok(planned)
    }

    /// The run a gate against a baseline records: the baseline's settings (`base`, its
    /// header's), with the workload options given on the command line in place of theirs, and
    /// the fault planted here (a gate's run may differ from its baseline's there). A baseline
    /// of another workload than `--workload` names, or of a user's program, gives the command
    /// line's run: the baseline check then says what differs.
    pub fn workload_run_over(&self, base: &RunConfig, file: &Path) -> Result<WorkloadRun, CliError> {
        let Ok(kind) = base.workload.parse::<WorkloadKind>() else { return self.workload_run() };
        if self.given.iter().any(|o| o == "workload") && kind != self.workload {
            return self.workload_run();
        }
        self.check_options_apply(kind, &[])?;
        self.refuse_misplaced(kind, &[])?;
        let mut run = base.clone();
        run.params.remove("perturb");
        run.params.extend(self.given_settings(kind));
        if self.steps.is_some() {
            run.steps = self.steps;
        }
        Workload::from_run_config(&run)
            .and_then(|workload| WorkloadRun::new(workload, self.perturb.clone()))
            .map_err(|e| format!("baseline {}: {e}; it cannot set the gate's run", file.display()).into())
    }

    /// The workload for a forward pass only (`repro invariance`), and the gpt's element type:
    /// the gpt trains in f32, but its forward pass also runs in bf16.
    pub fn inference_workload(&self) -> Result<(Workload, candle_core::DType), CliError> {
        let dtype = self.gpt.dtype;
        let also: &[&str] = if self.workload == WorkloadKind::Gpt && dtype == DType::BF16 { &["dtype"] } else { &[] };
        Ok((self.workload_run_taking(also)?.workload, dtype))
    }
}

/// Whether `workload` takes `option` (a long name), as the option of one of its settings.
fn takes(workload: WorkloadKind, option: &str) -> bool {
    // Gemma has the small shape only (a shape other than small is refused by its check).
    workload.options().iter().any(|(o, _)| o == option) && !(workload == WorkloadKind::Gemma && option == "shape")
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

    #[test]
    fn an_option_given_takes_the_place_of_the_baseline_s_setting_and_one_not_given_does_not() {
        let base =
            given(&["repro", "--seed", "3", "--batch", "200", "--lr", "0.25", "--steps", "7"]).workload_run().unwrap();
        let file = Path::new("base.rpr");
        let over = |argv: &[&str]| given(argv).workload_run_over(&base.run_config(), file).unwrap().run_config();
        let run = over(&["repro", "--batch", "100", "--steps", "9", "--perturb", "2:loss:1"]);
        let mut expected = base.run_config();
        expected.params.insert("batch".into(), "100".into());
        expected.params.insert("perturb".into(), "2:loss:1".into());
        expected.steps = Some(9);
        assert_eq!(run, expected);
        // The seed given: the data's seed stays the baseline's (it follows the seed only where none is given).
        let run = over(&["repro", "--seed", "5"]);
        assert_eq!((run.params["seed"].as_str(), run.params["data_seed"].as_str()), ("5", "3"));
        // A classifier's options by their own names: --seed sets its init_seed.
        let base = given(&["repro", "--workload", "mlp", "--seed", "3", "--dropout", "0.5"]).workload_run().unwrap();
        let run =
            given(&["repro", "--seed", "4", "--epochs", "2"]).workload_run_over(&base.run_config(), file).unwrap();
        let params = run.run_config().params;
        assert_eq!((params["init_seed"].as_str(), params["order_seed"].as_str()), ("4", "3"));
        assert_eq!((params["epochs"].as_str(), params["dropout"].as_str()), ("2", "0.5"));
        // An option the baseline's workload does not take is refused, naming it.
        let e = given(&["repro", "--heads", "2"]).workload_run_over(&base.run_config(), file).unwrap_err();
        assert!(e.to_string().contains("--heads is a setting of gpt, not of mlp"), "{e}");
    }

    #[test]
    fn every_workload_reads_the_options_it_takes_and_an_option_given_its_default_changes_nothing() {
        let command = WorkloadArgs::augment_args(clap::Command::new("workload"));
        let mut checked = 0;
        for kind in WorkloadKind::ALL {
            let plain = given(&["repro", "--workload", kind.name()]).workload_run().unwrap().run_config();
            for (option, _) in kind.options().into_iter().filter(|(option, _)| takes(kind, option)) {
                let arg = command.get_arguments().find(|a| a.get_long() == Some(option.as_str()));
                let arg = arg.unwrap_or_else(|| panic!("{kind}'s setting has no option --{option}"));
                // Its default as the help shows it, which must be the workload's own.
                let Some(default) = arg.get_default_values().first().and_then(|d| d.to_str()) else { continue };
                if !arg.get_action().takes_values() {
                    continue;
                }
                let run = given(&["repro", "--workload", kind.name(), &format!("--{option}"), default]);
                assert_eq!(run.workload_run().unwrap().run_config(), plain, "{kind} --{option} {default}");
                checked += 1;
            }
        }
        assert!(checked >= 20, "{checked} options with defaults checked");
    }

    #[test]
    fn options_given_are_the_workload_s_settings() {
        let run = given(&["repro", "--workload", "qwen2", "--context", "16", "--dtype", "bf16", "--seed", "2"]);
        let params = run.workload_run().unwrap().run_config().params;
        assert_eq!(
            params.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
            ["batch=4", "data_seed=2", "dtype=bf16", "layers=2", "seed=2", "tokens=16", "width=64"]
        );
        let run =
            given(&["repro", "--workload", "gpt", "--lr", "1e-3", "--reductions", "ordered", "--batch-invariant"]);
        let params = run.workload_run().unwrap().run_config().params;
        assert_eq!((params["lr"].as_str(), params["reductions"].as_str()), ("0.001", "ordered"));
        assert_eq!(params["batch_invariant"], "true");
    }
}
