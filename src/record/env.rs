//! The environment contract between repro's commands and a program that records itself
//! (`repro record -- CMD`, `repro gate -- CMD`, `repro bisect -- CMD`, `repro baseline write --
//! CMD`). The command sets these variables for the program; the program's recorder
//! (`Recorder::from_env`, `ModelRecorder::create_or_gated`) reads them. Both sides use
//! [`RecordEnv`], so the contract is written once (docs/capture.md lists it for other
//! languages):
//!
//! | variable | meaning |
//! |---|---|
//! | `REPRO_TRACE_DIR` | record into this directory |
//! | `REPRO_CAPTURE` | steps whose full values are stored (`none`, `all`, `first-and-last`, `every:N`, `steps:A,B`) |
//! | `REPRO_REPLACE` | `1`: replace a trace already in the directory (else that is an error) |
//! | `REPRO_AGAINST` | compare each step with this trace as it is recorded, keeping the diverging step and the one before it in full |
//! | `REPRO_KEEP_GOING` | `1`: with `REPRO_AGAINST`, record to the end after a divergence instead of stopping there |
//! | `REPRO_MODULES` | steps at which every module's output is recorded, the capture ladder's `modules` level (same grammar as `REPRO_CAPTURE`, plus `first`; PyTorch programs) |
//! | `REPRO_OPS` | steps at which every op's output inside the step is recorded, the `ops` level (PyTorch programs; a candle program's captured graph records its ops at every step) |
//! | `REPRO_CAPTURE_NAMES` | the tensors, by name, comma-separated, whose full values the `REPRO_CAPTURE` steps keep, every other tensor's hash alone (PyTorch programs; `repro bisect` keeping the values of the tensors two runs first differ in) |
//! | `REPRO_STOP_AFTER` | the last step to record: the trace is finished there, marked as stopped on purpose, and the program ends (PyTorch programs; candle programs record on) |
//! | `REPRO_PERTURB` | plant a fault, `STEP:TENSOR:ULPS[@ELEMENT]` (`Perturbation`), in the tensor of that name as `StepRecorder::op` or `perturbed` passes it: does the gate catch a 1-ULP change in my program? |

use super::error::RecordError;
use super::options::RecordOptions;
use super::perturb::Perturbation;
use crate::trace::{DataHash, FullCapture, StepCheck};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Where to record (`REPRO_TRACE_DIR`).
pub const TRACE_DIR_ENV: &str = "REPRO_TRACE_DIR";
/// Which steps store full values (`REPRO_CAPTURE`).
pub const CAPTURE_ENV: &str = "REPRO_CAPTURE";
/// Whether an existing trace is replaced (`REPRO_REPLACE=1`).
pub const REPLACE_ENV: &str = "REPRO_REPLACE";
/// The reference trace to compare with while recording (`REPRO_AGAINST`).
pub const AGAINST_ENV: &str = "REPRO_AGAINST";
/// Whether recording goes on after a divergence from the reference (`REPRO_KEEP_GOING=1`).
pub const KEEP_GOING_ENV: &str = "REPRO_KEEP_GOING";
/// Steps at which every module's output is recorded (`REPRO_MODULES`, the `modules` level).
pub const MODULES_ENV: &str = "REPRO_MODULES";
/// Steps at which every op's output is recorded (`REPRO_OPS`, the `ops` level).
pub const OPS_ENV: &str = "REPRO_OPS";
/// The tensors whose values the capture steps keep (`REPRO_CAPTURE_NAMES=A,B`; PyTorch programs).
pub const CAPTURE_NAMES_ENV: &str = "REPRO_CAPTURE_NAMES";
/// The last step to record (`REPRO_STOP_AFTER=STEP`; PyTorch programs).
pub const STOP_AFTER_ENV: &str = "REPRO_STOP_AFTER";
/// A fault to plant (`REPRO_PERTURB=STEP:TENSOR:ULPS[@ELEMENT]`).
pub const PERTURB_ENV: &str = "REPRO_PERTURB";
/// How the program hashes its tensors' data (`REPRO_DATA_HASH=blake3|xxh3-1k`, format 2.0).
pub const DATA_HASH_ENV: &str = "REPRO_DATA_HASH";

/// What a repro command asks of a self-recording program, read from or written to its
/// environment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordEnv {
    /// Where to record.
    pub dir: Option<PathBuf>,
    /// Which steps store full values, in place of the program's own policy.
    pub capture: Option<FullCapture>,
    /// Replace a trace already in `dir`.
    pub replace: bool,
    /// Compare each step with this trace while recording.
    pub against: Option<PathBuf>,
    /// With `against`: record to the end after a divergence.
    pub keep_going: bool,
    /// A fault to plant.
    pub perturbation: Option<Perturbation>,
    /// The data hash to record with, in place of the program's own (`blake3` by default).
    pub data_hash: Option<DataHash>,
    /// The steps of the `modules` level, in place of the program's own.
    pub modules: Option<FullCapture>,
    /// The steps of the `ops` level, in place of the program's own.
    pub ops: Option<FullCapture>,
    /// The last step to record: a PyTorch program's recorder finishes the trace there and ends
    /// the program (repro's candle recorder does not read it).
    pub stop_after: Option<u64>,
    /// The tensors whose full values the capture steps keep, every other one's hash alone (a
    /// PyTorch program's recorder; repro's candle recorder refuses it).
    pub capture_names: Option<Vec<String>>,
}

impl RecordEnv {
    /// The contract as this process's environment gives it.
    pub fn read() -> Result<Self, RecordError> {
        Self::from_vars(|name| std::env::var_os(name))
    }

    /// The contract as `var` gives the variables; a value that does not parse is an error
    /// naming the variable.
    pub fn from_vars(var: impl Fn(&str) -> Option<OsString>) -> Result<Self, RecordError> {
        let text = |name: &str| var(name).map(|v| v.to_string_lossy().into_owned()).filter(|v| !v.is_empty());
        let flag = |name: &str| match text(name).as_deref() {
            None | Some("0") => Ok(false),
            Some("1") => Ok(true),
            Some(other) => Err(RecordError::Unsupported(format!("{name}={other}: expected 1 or 0"))),
        };
        let policy = |name: &str| -> Result<Option<FullCapture>, RecordError> {
            match text(name) {
                Some(policy) => {
                    Ok(Some(policy.parse().map_err(|e| RecordError::Unsupported(format!("{name}={policy}: {e}")))?))
                }
                None => Ok(None),
            }
        };
        let capture = policy(CAPTURE_ENV)?;
        let perturbation = match text(PERTURB_ENV) {
            Some(p) => Some(p.parse().map_err(|e| RecordError::Unsupported(format!("{PERTURB_ENV}={p}: {e}")))?),
            None => None,
        };
        let data_hash = match text(DATA_HASH_ENV) {
            Some(name) => {
                Some(name.parse().map_err(|e| RecordError::Unsupported(format!("{DATA_HASH_ENV}={name}: {e}")))?)
            }
            None => None,
        };
        let stop_after = match text(STOP_AFTER_ENV) {
            Some(step) => Some(step.parse().map_err(|_| {
                RecordError::Unsupported(format!("{STOP_AFTER_ENV}={step}: expected a step number (0 or more)"))
            })?),
            None => None,
        };
        let capture_names = text(CAPTURE_NAMES_ENV)
            .map(|names| names.split(',').filter(|n| !n.is_empty()).map(str::to_string).collect());
        Ok(RecordEnv {
            capture_names,
            stop_after,
            perturbation,
            data_hash,
            modules: policy(MODULES_ENV)?,
            ops: policy(OPS_ENV)?,
            dir: var(TRACE_DIR_ENV).filter(|v| !v.is_empty()).map(PathBuf::from),
            capture,
            replace: flag(REPLACE_ENV)?,
            against: var(AGAINST_ENV).filter(|v| !v.is_empty()).map(PathBuf::from),
            keep_going: flag(KEEP_GOING_ENV)?,
        })
    }

    /// The variables that pass this contract to a program: each one set, or removed (so that
    /// nothing of the caller's own environment leaks into the run). A fault is the exception:
    /// without one here, the caller's `REPRO_PERTURB` reaches the program (`REPRO_PERTURB=3:fc:1
    /// repro record -- CMD` plants one in a program's run).
    pub fn vars(&self) -> Vec<(&'static str, Option<OsString>)> {
        let flag = |on: bool| on.then(|| OsString::from("1"));
        let mut vars = vec![
            (TRACE_DIR_ENV, self.dir.clone().map(OsString::from)),
            (CAPTURE_ENV, self.capture.as_ref().map(|c| OsString::from(c.to_string()))),
            (REPLACE_ENV, flag(self.replace)),
            (AGAINST_ENV, self.against.clone().map(OsString::from)),
            (KEEP_GOING_ENV, flag(self.keep_going)),
            (DATA_HASH_ENV, self.data_hash.map(|k| OsString::from(k.name()))),
            (MODULES_ENV, self.modules.as_ref().map(|c| OsString::from(c.to_string()))),
            (OPS_ENV, self.ops.as_ref().map(|c| OsString::from(c.to_string()))),
            (STOP_AFTER_ENV, self.stop_after.map(|s| OsString::from(s.to_string()))),
            (CAPTURE_NAMES_ENV, self.capture_names.as_ref().map(|names| OsString::from(names.join(",")))),
        ];
        if let Some(p) = &self.perturbation {
            vars.push((PERTURB_ENV, Some(OsString::from(p.to_string()))));
        }
        vars
    }

    /// `options` with what the contract asks: its capture policy in place of theirs, replacing,
    /// and the online comparison with `against`, through the check `open_reference` opens on
    /// it (the recorder defines what it needs, `StepCheck`; `diff` implements it).
    pub fn apply(
        &self,
        mut options: RecordOptions,
        open_reference: impl FnOnce(&Path) -> Result<Box<dyn StepCheck>, String>,
    ) -> Result<RecordOptions, RecordError> {
        if let Some(kind) = self.data_hash.filter(|k| !k.is_blake3()) {
            return Err(RecordError::Unsupported(format!(
                "{DATA_HASH_ENV}={kind}: repro's candle recorder hashes with blake3 only; {kind} is for PyTorch \
                 programs (repro.torch)"
            )));
        }
        if let Some(names) = &self.capture_names {
            return Err(RecordError::Unsupported(format!(
                "{CAPTURE_NAMES_ENV}={}: repro's candle recorder keeps the values of every tensor at a capture step; \
                 naming some is for PyTorch programs (repro.torch)",
                names.join(",")
            )));
        }
        if let Some(capture) = &self.capture {
            options.capture.full = capture.clone();
        }
        options.replace |= self.replace;
        if let Some(p) = &self.perturbation {
            options.perturbation = Some(p.clone());
        }
        if let Some(reference) = &self.against {
            let check = open_reference(reference)
                .map_err(|e| RecordError::Unsupported(format!("{AGAINST_ENV}={}: {e}", reference.display())))?;
            options = options.comparing_with(check, !self.keep_going);
        }
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_contract_round_trips_through_the_variables_it_sets() {
        let env = RecordEnv {
            dir: Some("run".into()),
            capture: Some("steps:3,7".parse().unwrap()),
            replace: true,
            against: Some("reference".into()),
            keep_going: true,
            perturbation: Some("5:hidden:3@2".parse().unwrap()),
            data_hash: Some(DataHash::Xxh3Chunks),
            modules: Some(FullCapture::First),
            ops: Some("steps:7".parse().unwrap()),
            stop_after: Some(7),
            capture_names: Some(vec!["avgpool/aten.index_add_#9".into(), "fc".into()]),
        };
        let vars = env.vars();
        let read = RecordEnv::from_vars(|name| vars.iter().find(|(n, _)| *n == name).and_then(|(_, v)| v.clone()));
        assert_eq!(read.unwrap(), env);
        // Unset (and removed) variables read as the defaults.
        let vars = RecordEnv::default().vars();
        assert!(vars.iter().all(|(_, v)| v.is_none()));
    }

    #[test]
    fn a_bad_value_names_its_variable() {
        let e = RecordEnv::from_vars(|n| (n == REPLACE_ENV).then(|| "yes".into())).unwrap_err().to_string();
        assert!(e.contains("REPRO_REPLACE=yes"), "{e}");
        let e = RecordEnv::from_vars(|n| (n == CAPTURE_ENV).then(|| "sometimes".into())).unwrap_err().to_string();
        assert!(e.contains("REPRO_CAPTURE=sometimes"), "{e}");
        let e = RecordEnv::from_vars(|n| (n == OPS_ENV).then(|| "steps:x".into())).unwrap_err().to_string();
        assert!(e.contains("REPRO_OPS=steps:x"), "{e}");
        let e = RecordEnv::from_vars(|n| (n == STOP_AFTER_ENV).then(|| "-1".into())).unwrap_err().to_string();
        assert!(e.contains("REPRO_STOP_AFTER=-1: expected a step number"), "{e}");
        let e = RecordEnv::from_vars(|n| (n == DATA_HASH_ENV).then(|| "sha1".into())).unwrap_err().to_string();
        assert!(e.contains("REPRO_DATA_HASH=sha1: `sha1` is not a data hash"), "{e}");
    }

    #[test]
    fn the_candle_recorder_refuses_a_data_hash_it_does_not_compute() {
        let never = |_: &Path| -> Result<Box<dyn StepCheck>, String> { panic!("no reference to open") };
        let xxh3 = RecordEnv { data_hash: Some(DataHash::Xxh3Chunks), ..RecordEnv::default() };
        let e = xxh3.apply(RecordOptions::default(), never).unwrap_err().to_string();
        assert!(e.contains("REPRO_DATA_HASH=xxh3-1k: repro's candle recorder hashes with blake3 only"), "{e}");
        let blake3 = RecordEnv { data_hash: Some(DataHash::Blake3), ..RecordEnv::default() };
        assert!(blake3.apply(RecordOptions::default(), never).is_ok());
    }

    #[test]
    fn apply_puts_the_contract_over_the_programs_options() {
        let env = RecordEnv { capture: Some(FullCapture::All), replace: true, ..RecordEnv::default() };
        let never = |_: &Path| -> Result<Box<dyn StepCheck>, String> { panic!("no reference to open") };
        let options = env.apply(RecordOptions::default(), never).unwrap();
        assert_eq!(options.capture.full, FullCapture::All);
        assert!(options.replace);
        let missing = RecordEnv { against: Some("/nonexistent/reference".into()), ..RecordEnv::default() };
        let unreadable =
            |p: &Path| -> Result<Box<dyn StepCheck>, String> { Err(format!("{} is not there", p.display())) };
        let e = missing.apply(RecordOptions::default(), unreadable).unwrap_err().to_string();
        assert!(e.contains("REPRO_AGAINST=/nonexistent/reference: /nonexistent/reference is not there"), "{e}");
    }
}
