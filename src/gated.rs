//! Recording as a repro command asks: `Recorder::from_env` and `ModelRecorder::create_or_gated`,
//! where the recorder (`record`, `capture`) meets the online comparison with a reference run
//! (`diff`). They live above both, so that `record` and `capture` name neither `diff` nor
//! `report`: the recorder defines what it needs of a reference (`trace::StepCheck`), and
//! `diff::ReferenceCheck` is the implementation handed to it here.

use crate::capture::ModelRecorder;
use crate::diff::ReferenceCheck;
use crate::record::{RecordEnv, RecordError, RecordOptions, Recorder, TRACE_DIR_ENV};
use crate::trace::{CapturePolicy, RunConfig, StepCheck};
use candle_core::Device;
use candle_nn::VarMap;
use std::path::Path;

impl Recorder {
    /// Starts recording as a repro command running this program asks (`repro record -- CMD`,
    /// `gate -- CMD`, `bisect -- CMD`; see `record::env`): into the directory `REPRO_TRACE_DIR`
    /// names, storing full values where `REPRO_CAPTURE` says (else where `capture` does),
    /// replacing a trace there only under `REPRO_REPLACE=1`, and comparing with `REPRO_AGAINST`
    /// while recording.
    pub fn from_env(run: RunConfig, device: &Device, capture: CapturePolicy) -> Result<Self, RecordError> {
        let env = RecordEnv::read()?;
        let dir = env.dir.clone().ok_or_else(|| {
            RecordError::Unsupported(format!(
                "{TRACE_DIR_ENV} is not set: run this under `repro record -- CMD` or `repro gate -- CMD`"
            ))
        })?;
        Self::create(dir, run, device, env.apply(RecordOptions::capture(capture), open_reference)?)
    }
}

impl ModelRecorder {
    /// Records as a repro command running this program asks (`repro record -- CMD`, `gate --
    /// CMD`, `bisect -- CMD`: `record::env`), and into `dir` otherwise: one constructor for
    /// both uses. Either way `REPRO_CAPTURE` and `REPRO_AGAINST`, when set, choose the steps
    /// stored in full and the reference compared with; a trace already in the directory is an
    /// error unless `REPRO_REPLACE=1` (never replaced silently).
    pub fn create_or_gated(
        dir: impl AsRef<Path>,
        run: RunConfig,
        device: &Device,
        varmap: &VarMap,
    ) -> Result<Self, RecordError> {
        let env = RecordEnv::read()?;
        let dir = env.dir.clone().unwrap_or_else(|| dir.as_ref().to_path_buf());
        Self::create_with(dir, run, device, varmap, env.apply(RecordOptions::default(), open_reference)?)
    }
}

/// `diff`'s online comparison with the reference trace at `reference`.
fn open_reference(reference: &Path) -> Result<Box<dyn StepCheck>, String> {
    Ok(Box::new(ReferenceCheck::open(reference, crate::trace::DataHash::Blake3).map_err(|e| e.to_string())?))
}

#[cfg(test)]
mod tests {
    /// The layering the guide asks for, which one crate's modules cannot make the compiler
    /// check: the recorder and the graph capture name neither `diff` nor `report`.
    #[test]
    fn the_recorder_and_the_capture_name_neither_diff_nor_report() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        for folder in ["record", "capture"] {
            let mut stack = vec![root.join(folder)];
            while let Some(dir) = stack.pop() {
                for entry in std::fs::read_dir(&dir).unwrap() {
                    let path = entry.unwrap().path();
                    if path.is_dir() {
                        stack.push(path);
                    } else if path.extension().is_some_and(|e| e == "rs") {
                        files.push(path);
                    }
                }
            }
        }
        assert!(files.len() > 10, "found only {files:?}");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for name in ["crate::diff", "crate::report", "repro_diff", "repro_report", "repro::diff", "repro::report"] {
                assert!(!text.contains(name), "{} names `{name}`", file.display());
            }
        }
    }
}
