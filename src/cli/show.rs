//! `repro show TRACE`: a step's tensors, or one tensor's values (statistics, first elements),
//! and its export to a safetensors or .npy file.

use super::error::CliError;
use super::exit::Exit;
use super::output::print_json;
use super::report_args::JsonOutput;
use clap::Args;
use repro::diff::tensor_stats;
use repro::report::{render_step_tensors, render_tensor, render_tensor_pair};
use repro::trace::{StepRecord, TraceReader};
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The trace.
    trace: PathBuf,
    /// The step [default: the trace's last].
    #[arg(long, value_name = "N")]
    step: Option<u64>,
    /// The tensor to show; without it, the step's tensors are listed.
    #[arg(long, value_name = "NAME")]
    tensor: Option<String>,
    /// How many of its first values to print.
    #[arg(long, value_name = "N", default_value_t = 8)]
    values: usize,
    /// Show the tensor beside the same tensor of this trace at the same step: how they differ,
    /// and the first values of both with the ULPs between them.
    #[arg(long, value_name = "TRACE", requires = "tensor")]
    against: Option<PathBuf>,
    /// Also write the tensor's values to this new safetensors file (under its own name).
    #[arg(long, value_name = "FILE.safetensors")]
    safetensors: Option<PathBuf>,
    /// Also write the tensor's values to this new .npy file, for numpy (`np.load`); bf16,
    /// which numpy lacks, is written as f32 (exactly).
    #[arg(long, value_name = "FILE.npy")]
    npy: Option<PathBuf>,
    #[command(flatten)]
    output: JsonOutput,
}

impl ShowArgs {
    /// Whether the result is asked for as JSON (errors then come as JSON too).
    pub fn json(&self) -> bool {
        self.output.json
    }
}

pub fn run(args: ShowArgs) -> Result<Exit, CliError> {
    let mut reader = TraceReader::open(&args.trace)?;
    let trace = args.trace.display().to_string();
    let step = find_step(&mut reader, args.step)?
        .ok_or_else(|| format!("{trace} holds no step{}", args.step.map_or(String::new(), |s| format!(" {s}"))))?;
    let Some(name) = &args.tensor else {
        let listed: Vec<_> = step.tensors.iter().map(|t| (t.clone(), reader.has_values(&step, t))).collect();
        if args.output.json {
            #[derive(serde::Serialize)]
            struct Listed<'a> {
                name: &'a str,
                kind: &'a str,
                dtype: String,
                shape: &'a [u64],
                stored: bool,
            }
            #[derive(serde::Serialize)]
            struct Listing<'a> {
                trace: &'a str,
                step: u64,
                tensors: Vec<Listed<'a>>,
            }
            let tensors = listed
                .iter()
                .map(|(t, stored)| Listed {
                    name: &t.name,
                    kind: t.kind.name(),
                    dtype: t.dtype.to_string(),
                    shape: &t.shape,
                    stored: *stored,
                })
                .collect();
            print_json("repro.show.v1", None, &Listing { trace: &trace, step: step.step, tensors })?;
        } else {
            super::output::emit(&render_step_tensors(&trace, step.step, &listed));
        }
        return Ok(Exit::Same);
    };
    let tensor = step.tensors.iter().find(|t| &t.name == name).ok_or_else(|| {
        format!(
            "step {} of {trace} has no tensor `{name}` (`repro show {trace} --step {}` lists them)",
            step.step, step.step
        )
    })?;
    let values = reader.values(&step, tensor)?.ok_or_else(|| {
        format!(
            "step {} of {trace} stores only the hash of `{name}`; record with `--capture steps:{}` (or `--capture all`) to keep its values",
            step.step, step.step
        )
    })?;
    if let Some(other) = &args.against {
        return show_against(&args, other, &step, tensor, &values);
    }
    let stats = tensor_stats(&values, args.values);
    if let Some(path) = &args.safetensors {
        write_safetensors(path, name, &values)?;
    }
    if let Some(path) = &args.npy {
        write_npy(path, name, &values)?;
    }
    if args.output.json {
        #[derive(serde::Serialize)]
        struct Shown<'a> {
            trace: &'a str,
            step: u64,
            tensor: &'a str,
            kind: &'a str,
            dtype: String,
            shape: &'a [u64],
            stats: &'a repro::diff::TensorStats,
        }
        let shown = Shown {
            trace: &trace,
            step: step.step,
            tensor: name,
            kind: tensor.kind.name(),
            dtype: tensor.dtype.to_string(),
            shape: &tensor.shape,
            stats: &stats,
        };
        print_json("repro.show.v1", None, &shown)?;
    } else {
        super::output::emit(&render_tensor(&trace, step.step, tensor, &stats));
    }
    Ok(Exit::Same)
}

/// `tensor` (whose values are `values`) beside the same tensor of trace `other` at the same step.
fn show_against(
    args: &ShowArgs,
    other: &std::path::Path,
    step: &StepRecord,
    tensor: &repro::trace::TensorRecord,
    values: &repro::trace::TensorValues,
) -> Result<Exit, CliError> {
    let (trace, theirs) = (args.trace.display().to_string(), other.display().to_string());
    let mut reader = TraceReader::open(other)?;
    let step_b =
        find_step(&mut reader, Some(step.step))?.ok_or_else(|| format!("{theirs} holds no step {}", step.step))?;
    let name = &tensor.name;
    let tensor_b = step_b
        .tensors
        .iter()
        .find(|t| &t.name == name)
        .ok_or_else(|| format!("step {} of {theirs} has no tensor `{name}`", step.step))?;
    if (tensor_b.dtype, &tensor_b.shape) != (tensor.dtype, &tensor.shape) {
        return Err(format!(
            "`{name}` is {} {:?} in {trace} and {} {:?} in {theirs}: not comparable element by element",
            tensor.dtype, tensor.shape, tensor_b.dtype, tensor_b.shape
        )
        .into());
    }
    let values_b = reader.values(&step_b, tensor_b)?.ok_or_else(|| {
        format!(
            "step {} of {theirs} stores only the hash of `{name}`; record with `--capture steps:{}`",
            step.step, step.step
        )
    })?;
    let metrics = repro::diff::compare_values(values, &values_b);
    let pairs = repro::diff::side_by_side(values, &values_b, args.values);
    if args.output.json {
        #[derive(serde::Serialize)]
        struct Pair<'a> {
            a: &'a str,
            b: &'a str,
            step: u64,
            tensor: &'a str,
            metrics: &'a repro::diff::TensorMetrics,
            first: &'a [repro::diff::ElementPair],
        }
        let pair = Pair { a: &trace, b: &theirs, step: step.step, tensor: name, metrics: &metrics, first: &pairs };
        let verdict = if metrics.mismatched == 0 { "identical" } else { "diverged" };
        print_json("repro.show-pair.v1", Some(verdict), &pair)?;
    } else {
        super::output::emit(&render_tensor_pair((&trace, &theirs), step.step, tensor, &metrics, &pairs));
    }
    Ok(if metrics.mismatched == 0 { Exit::Same } else { Exit::Diverged })
}

/// Step `wanted` of the trace, or its last step.
fn find_step(reader: &mut TraceReader, wanted: Option<u64>) -> Result<Option<StepRecord>, CliError> {
    let mut last = None;
    while let Some(step) = reader.next_step()? {
        match wanted {
            Some(w) if step.step == w => return Ok(Some(step)),
            Some(w) if step.step > w => return Ok(None),
            Some(_) => {}
            None => last = Some(step),
        }
    }
    Ok(last)
}

/// Writes one tensor to a new safetensors file; refuses to replace an existing file.
fn write_safetensors(path: &std::path::Path, name: &str, values: &repro::trace::TensorValues) -> Result<(), CliError> {
    use safetensors::tensor::TensorView;
    let shape: Vec<usize> = values.shape.iter().map(|&d| d as usize).collect();
    let view = TensorView::new(repro::trace::safetensors_dtype(values.dtype), shape, &values.bytes)
        .map_err(|e| format!("cannot export `{name}`: {e}"))?;
    let bytes = safetensors::serialize([(name, view)], None).map_err(|e| format!("cannot export `{name}`: {e}"))?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| format!("cannot create {}: {e} (choose a new file)", path.display()))?;
    std::io::Write::write_all(&mut file, &bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(())
}

/// Writes one tensor to a new .npy file; refuses to replace an existing file. bf16 becomes f32,
/// which holds every bf16 value exactly.
fn write_npy(path: &std::path::Path, name: &str, values: &repro::trace::TensorValues) -> Result<(), CliError> {
    use candle_core::{DType as C, Device, Tensor};
    use repro::dtype::DType;
    if std::fs::symlink_metadata(path).is_ok() {
        return Err(format!("{} exists: choose a new file for --npy", path.display()).into());
    }
    let dtype = match values.dtype {
        DType::U8 => C::U8,
        DType::U32 => C::U32,
        DType::I16 => C::I16,
        DType::I32 => C::I32,
        DType::I64 => C::I64,
        DType::F16 => C::F16,
        DType::BF16 => C::BF16,
        DType::F32 => C::F32,
        DType::F64 => C::F64,
    };
    let shape: Vec<usize> = values.shape.iter().map(|&d| d as usize).collect();
    // Canonical bytes are little-endian, as candle's buffers are on the hosts it runs on.
    let export = || -> candle_core::Result<()> {
        let tensor = Tensor::from_raw_buffer(&values.bytes, dtype, &shape, &Device::Cpu)?;
        let tensor = if dtype == C::BF16 { tensor.to_dtype(C::F32)? } else { tensor };
        tensor.write_npy(path)
    };
    export().map_err(|e| format!("cannot export `{name}` to {}: {e}", path.display()))?;
    if dtype == C::BF16 {
        eprintln!("`{name}` is bf16, which numpy lacks: written as f32 (every bf16 value exactly)");
    }
    Ok(())
}
