//! A study directory: the study's settings (`study.json`) and one result file per finished
//! run, so an interrupted study resumes without redoing finished runs.
//!
//! ```text
//! DIR/study.json                       kind and settings; a resumed study must match them
//! DIR/runs/VARIANT-NNN.json            one finished run's RunResult (written last)
//! DIR/runs/VARIANT-NNN.safetensors     its final weights (tensor `weights`, F32)
//! ```
//! Both run files are written to a temporary name and renamed, weights first: a run whose
//! JSON exists is complete.

use super::error::StudyError;
use super::stats::RunResult;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};

/// The settings file of a study directory.
pub const STUDY_FILE: &str = "study.json";

/// Where a study keeps its files, and whether it may delete the runs of a different study
/// found there.
#[derive(Debug, Clone)]
pub struct StudyOut {
    /// The study directory.
    pub dir: PathBuf,
    /// Start over when the directory holds a study with other settings.
    pub restart: bool,
}

/// An open study directory.
pub struct StudyDir {
    dir: PathBuf,
}

impl StudyDir {
    /// Opens `dir` for a study of `kind` with `settings`: creates it, resumes it when it holds
    /// the same study, and refuses a different one unless `restart` (then its runs are deleted).
    pub fn open(dir: &Path, kind: &str, settings: &Value, restart: bool) -> Result<StudyDir, StudyError> {
        let study_file = dir.join(STUDY_FILE);
        let wanted = serde_json::json!({ "kind": kind, "settings": settings });
        if study_file.exists() {
            let text = fs::read_to_string(&study_file).map_err(StudyError::io(&study_file))?;
            let found: Value = serde_json::from_str(&text)
                .map_err(|e| StudyError::Corrupt { path: study_file.clone(), reason: e.to_string() })?;
            if found != wanted && !restart {
                return Err(StudyError::OtherStudy {
                    dir: dir.to_path_buf(),
                    differences: differences(&found, &wanted),
                });
            }
            if found != wanted {
                let runs = dir.join("runs");
                if runs.exists() {
                    fs::remove_dir_all(&runs).map_err(StudyError::io(&runs))?;
                }
            }
        } else if dir.exists() && fs::read_dir(dir).map_err(StudyError::io(dir))?.next().is_some() {
            return Err(StudyError::NotAStudy { dir: dir.to_path_buf() });
        }
        let runs = dir.join("runs");
        fs::create_dir_all(&runs).map_err(StudyError::io(&runs))?;
        let text = serde_json::to_string_pretty(&wanted).expect("settings serialize");
        write_atomically(&study_file, text.as_bytes())?;
        Ok(StudyDir { dir: dir.to_path_buf() })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    fn run_file(&self, variant: &str, run: usize, ext: &str) -> PathBuf {
        self.dir.join("runs").join(format!("{variant}-{run:03}.{ext}"))
    }

    /// A finished run's result, if it was saved.
    pub fn load_run(&self, variant: &str, run: usize) -> Result<Option<RunResult>, StudyError> {
        let path = self.run_file(variant, run, "json");
        if !path.exists() {
            return Ok(None);
        }
        let text = fs::read_to_string(&path).map_err(StudyError::io(&path))?;
        let result = serde_json::from_str(&text).map_err(|e| StudyError::Corrupt {
            path: path.clone(),
            reason: format!("{e} (delete the file to redo this run)"),
        })?;
        Ok(Some(result))
    }

    /// Saves a finished run: its weights, then its result.
    pub fn save_run(&self, variant: &str, run: usize, result: &RunResult, weights: &[f32]) -> Result<(), StudyError> {
        let path = self.run_file(variant, run, "safetensors");
        let bytes: &[u8] = bytemuck::cast_slice(weights);
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![weights.len()], bytes)
            .expect("shape matches the data");
        let data = safetensors::serialize([("weights", view)], None)
            .map_err(|e| StudyError::Corrupt { path: path.clone(), reason: e.to_string() })?;
        write_atomically(&path, &data)?;
        let json = serde_json::to_vec(result).expect("results serialize");
        write_atomically(&self.run_file(variant, run, "json"), &json)
    }

    /// A saved run's final weights.
    pub fn load_weights(&self, variant: &str, run: usize) -> Result<Vec<f32>, StudyError> {
        let path = self.run_file(variant, run, "safetensors");
        let data = fs::read(&path).map_err(StudyError::io(&path))?;
        let bad = |reason: String| StudyError::Corrupt { path: path.clone(), reason };
        let file = safetensors::SafeTensors::deserialize(&data).map_err(|e| bad(e.to_string()))?;
        let view = file.tensor("weights").map_err(|e| bad(e.to_string()))?;
        if view.dtype() != safetensors::Dtype::F32 {
            return Err(bad(format!("weights are {:?}, expected F32", view.dtype())));
        }
        Ok(view.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
    }

    /// Writes `name` in the study directory (a report or a plot).
    pub fn write(&self, name: &str, data: &[u8]) -> Result<PathBuf, StudyError> {
        let path = self.dir.join(name);
        write_atomically(&path, data)?;
        Ok(path)
    }
}

fn write_atomically(path: &Path, data: &[u8]) -> Result<(), StudyError> {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, data).map_err(StudyError::io(&tmp))?;
    fs::rename(&tmp, path).map_err(StudyError::io(path))
}

/// The settings that differ between two study descriptions, as `key: found → wanted`.
fn differences(found: &Value, wanted: &Value) -> String {
    let flat = |v: &Value| -> Vec<(String, String)> {
        let mut out = vec![("kind".to_string(), v["kind"].to_string())];
        if let Some(map) = v["settings"].as_object() {
            out.extend(map.iter().map(|(k, v)| (k.clone(), v.to_string())));
        }
        out
    };
    let (a, b) = (flat(found), flat(wanted));
    let mut diffs: Vec<String> = b
        .iter()
        .filter_map(|(k, v)| {
            let old = a.iter().find(|(ka, _)| ka == k).map_or("(unset)".to_string(), |(_, v)| v.clone());
            (old != *v).then(|| format!("{k}: {old} → {v}"))
        })
        .collect();
    diffs.sort();
    diffs.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result() -> RunResult {
        RunResult {
            accuracy: 0.5,
            per_class_accuracy: vec![0.5],
            predictions: vec![1, 0],
            final_loss: 0.1,
            steps: 3,
            seconds: 0.2,
        }
    }

    #[test]
    fn runs_round_trip_and_a_study_resumes_only_with_its_settings() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("s");
        let settings = serde_json::json!({ "runs": 3 });
        let study = StudyDir::open(&dir, "noise", &settings, false).unwrap();
        assert_eq!(study.load_run("algo", 0).unwrap(), None);
        study.save_run("algo", 0, &result(), &[1.0, -2.5]).unwrap();
        let again = StudyDir::open(&dir, "noise", &settings, false).unwrap();
        assert_eq!(again.load_run("algo", 0).unwrap(), Some(result()));
        assert_eq!(again.load_weights("algo", 0).unwrap(), vec![1.0, -2.5]);

        let other = serde_json::json!({ "runs": 4 });
        let err = StudyDir::open(&dir, "noise", &other, false).err().unwrap().to_string();
        assert!(err.contains("runs: 3 → 4") && err.contains("--restart"), "{err}");
        let restarted = StudyDir::open(&dir, "noise", &other, true).unwrap();
        assert_eq!(restarted.load_run("algo", 0).unwrap(), None, "a restart deletes the old runs");
    }

    #[test]
    fn a_directory_with_other_files_is_not_taken_over() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("notes.txt"), "mine").unwrap();
        let err = StudyDir::open(tmp.path(), "noise", &Value::Null, true).err().unwrap().to_string();
        assert!(err.contains("not a study directory"), "{err}");
        assert!(tmp.path().join("notes.txt").exists());
    }

    #[test]
    fn a_damaged_run_file_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let study = StudyDir::open(tmp.path(), "noise", &Value::Null, false).unwrap();
        fs::write(tmp.path().join("runs/impl-002.json"), "{ not json").unwrap();
        let err = study.load_run("impl", 2).err().unwrap().to_string();
        assert!(err.contains("impl-002.json") && err.contains("delete the file"), "{err}");
    }
}
