//! A recorder's progress marks: `progress.json` in a rank's stream, which says where its recorder
//! was (computing a step, waiting in a collective, done with a step) while it ran, so that a run
//! whose ranks were stopped mid-step says which ranks never reached the collective the others
//! waited in (docs/trace-format.md, section 10.1). Read distrustfully: a mark is at most
//! [`MAX_PROGRESS_BYTES`], its strings printable, and a collective mark names its collective.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::TraceError;
use crate::format::PROGRESS_FILE;
use crate::printable::unprintable;

/// Largest `progress.json` a reader accepts, in bytes.
pub const MAX_PROGRESS_BYTES: u64 = 1024 * 1024;

/// Where a recorder was in its step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgressPoint {
    /// In the step, outside any collective it marked.
    Computing,
    /// Waiting in a collective.
    Collective,
    /// Done with the step.
    Done,
}

/// The last mark a recorder left.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// The step.
    pub step: u64,
    /// Where in it.
    pub at: ProgressPoint,
    /// The collective waited in (`at` = collective only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective: Option<String>,
    /// The tensors it sums (`at` = collective only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tensors: Vec<String>,
}

impl Progress {
    /// Whether this mark is further into the run than `other`.
    pub fn is_past(&self, other: &Progress) -> bool {
        (self.step, self.at) > (other.step, other.at)
    }

    /// The mark in words: `after step 1`, `in step 2, computing`, `waiting in step 2's
    /// all_reduce_sum of 4 tensors (h.0.attn.c_attn.weight.grad, ...)`.
    pub fn describe(&self) -> String {
        match self.at {
            ProgressPoint::Computing => format!("in step {}, computing", self.step),
            ProgressPoint::Done => format!("after step {}", self.step),
            ProgressPoint::Collective => {
                let what = self.collective.as_deref().unwrap_or("collective");
                let tensors = match self.tensors.as_slice() {
                    [] => String::new(),
                    [one] => format!(" of {one}"),
                    [first, rest @ ..] => format!(" of {} tensors ({first}, ...)", rest.len() + 1),
                };
                format!("waiting in step {}'s {what}{tensors}", self.step)
            }
        }
    }
}

/// The progress mark in the stream `dir`, or `None` where it has none (a finished trace, a
/// recorder that writes no marks).
pub fn read_progress(dir: &Path) -> Result<Option<Progress>, TraceError> {
    let path = dir.join(PROGRESS_FILE);
    let corrupt = |reason: String| TraceError::Corrupt { path: path.clone(), location: "its mark".into(), reason };
    let meta = match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(TraceError::io(&path)(e)),
        Ok(meta) => meta,
    };
    if !meta.is_file() {
        return Err(corrupt("not a regular file".into()));
    }
    if meta.len() > MAX_PROGRESS_BYTES {
        return Err(corrupt(format!("{} bytes, over the {MAX_PROGRESS_BYTES} a mark may take", meta.len())));
    }
    let text = std::fs::read_to_string(&path).map_err(TraceError::io(&path))?;
    let progress: Progress = serde_json::from_str(&text).map_err(|e| corrupt(format!("not a progress mark: {e}")))?;
    let is_collective = progress.at == ProgressPoint::Collective;
    if is_collective != progress.collective.is_some() || (!is_collective && !progress.tensors.is_empty()) {
        return Err(corrupt("a collective and its tensors belong to a mark at a collective, and only there".into()));
    }
    let strings = progress.collective.iter().chain(&progress.tensors);
    if let Some(why) = strings.filter_map(|s| unprintable("a name in the mark", s)).next() {
        return Err(corrupt(why));
    }
    Ok(Some(progress))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(dir: &Path, text: &str) -> Result<Option<Progress>, TraceError> {
        std::fs::write(dir.join(PROGRESS_FILE), text).unwrap();
        read_progress(dir)
    }

    #[test]
    fn marks_are_read_described_and_ordered() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_progress(dir.path()).unwrap(), None);
        let waiting = mark(dir.path(), r#"{"step": 2, "at": "collective", "collective": "all_reduce_sum", "tensors": ["a.grad", "b.grad"], "new": 1}"#)
            .unwrap()
            .unwrap();
        assert_eq!(waiting.describe(), "waiting in step 2's all_reduce_sum of 2 tensors (a.grad, ...)");
        let done = mark(dir.path(), r#"{"step": 1, "at": "done"}"#).unwrap().unwrap();
        assert_eq!(done.describe(), "after step 1");
        assert!(waiting.is_past(&done) && !done.is_past(&waiting));
        let computing = Progress { step: 2, at: ProgressPoint::Computing, collective: None, tensors: vec![] };
        assert!(waiting.is_past(&computing) && computing.is_past(&done));
    }

    #[test]
    fn a_mark_that_is_not_one_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        for (text, said) in [
            ("{\"step\": 1}", "not a progress mark"),
            ("{\"step\": 1, \"at\": \"sleeping\"}", "not a progress mark"),
            ("{\"step\": 1, \"at\": \"collective\"}", "belong to a mark at a collective"),
            ("{\"step\": 1, \"at\": \"done\", \"tensors\": [\"x\"]}", "belong to a mark at a collective"),
            ("{\"step\": 1, \"at\": \"collective\", \"collective\": \"sum\\u001b[2J\"}", "control character"),
        ] {
            let error = mark(dir.path(), text).unwrap_err().to_string();
            assert!(error.contains(said) && error.contains(PROGRESS_FILE), "{text}: {error}");
        }
        std::fs::write(dir.path().join(PROGRESS_FILE), vec![b' '; MAX_PROGRESS_BYTES as usize + 1]).unwrap();
        assert!(read_progress(dir.path()).unwrap_err().to_string().contains("over the"));
    }
}
