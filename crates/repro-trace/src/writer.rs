//! `TraceWriter`: appends records to a trace directory as they are produced.
//!
//! Crash safety comes from ordering: a step's payload file is written to a temporary name,
//! synced and renamed into place *before* the step record that references it is appended, and
//! each record goes out in a single `write`. A process killed at any moment therefore leaves a
//! record file whose complete frames are all valid and all reference existing payloads. Memory
//! use is one step's tensors, whatever the number of steps.

use crate::dtype::DType;
use crate::error::TraceError;
use crate::format::{self, CURRENT_FORMAT, MAGIC, RECORDS_FILE, RUN_META_FILE, TENSORS_DIR};
use crate::frame::{write_frame, FRAME_HEADER_LEN};
use crate::printable;
use crate::schema::{Footer, FullCapture, Header, Record, StepRecord, TensorRecord};
use serde::Serialize;
use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// A tensor handed to the writer: its record, and its element bytes if the step stores it in
/// full (the writer then puts it in the step's payload file and sets `in_payload`).
pub struct StepTensor {
    /// The tensor's record (hash, shape, ...).
    pub record: TensorRecord,
    /// Full element bytes for the payload file, if this step stores them.
    pub payload: Option<Vec<u8>>,
}

/// Writes one trace directory.
pub struct TraceWriter {
    dir: PathBuf,
    records_path: PathBuf,
    records: File,
    /// Held (an OS file lock) while the trace is written; released when the writer goes away,
    /// also when the process is killed.
    _lock: File,
    /// Bytes of the record file that hold complete records.
    good_len: u64,
    /// Set after a failed append: nothing more is written.
    failed: bool,
    last_step: Option<u64>,
    steps_written: u64,
    meta: RunMeta,
}

/// Run metadata: the part of a trace that legitimately differs between identical runs. Kept
/// out of the record file so that file is byte-identical for identical runs.
#[derive(Serialize)]
struct RunMeta {
    started_unix_s: u64,
    finished_unix_s: Option<u64>,
    host: String,
    pid: u32,
    command: Vec<String>,
}

impl TraceWriter {
    /// Starts a trace in `dir` (created if needed) and writes its header. Refuses a directory
    /// that already holds a trace unless `replace` is set.
    pub fn create(dir: &Path, header: &Header, replace: bool) -> Result<Self, TraceError> {
        if header.capture.full == FullCapture::Every(0) {
            return Err(TraceError::InvalidRecord {
                path: dir.to_path_buf(),
                reason: "capture every:0 is not a policy".into(),
            });
        }
        if let Some(why) =
            printable::header_strings(header).iter().find_map(|(what, v)| printable::unprintable(what, v))
        {
            return Err(TraceError::InvalidRecord { path: dir.to_path_buf(), reason: why });
        }
        if fs::metadata(dir).is_ok_and(|m| !m.is_dir()) {
            return Err(TraceError::InvalidRecord {
                path: dir.to_path_buf(),
                reason: "it is a file, not a directory: a trace is a directory; choose a new or empty one".into(),
            });
        }
        let records_path = dir.join(RECORDS_FILE);
        // A record file too short to hold even the preamble (a recorder that failed before
        // writing anything, on a full disk say) holds no data: it is replaced, not guarded.
        let replace = replace || holds_nothing(&records_path);
        // Refused before the lock is taken, so a refused call changes nothing on disk.
        if records_path.exists() && !replace {
            return Err(TraceError::AlreadyExists { path: dir.to_path_buf() });
        }
        if !records_path.exists() && holds_foreign_files(dir)? {
            return Err(TraceError::NotEmpty { path: dir.to_path_buf() });
        }
        fs::create_dir_all(dir).map_err(TraceError::io(dir))?;
        refuse_links(dir)?;
        let lock = lock_dir(dir)?;
        if records_path.exists() {
            if !replace {
                return Err(TraceError::AlreadyExists { path: dir.to_path_buf() });
            }
            remove_trace_files(dir)?;
        }
        fs::create_dir_all(dir).map_err(TraceError::io(dir))?;
        let mut records = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&records_path)
            .map_err(TraceError::io(&records_path))?;
        let mut preamble = MAGIC.to_vec();
        preamble.extend_from_slice(&CURRENT_FORMAT.major.to_le_bytes());
        preamble.extend_from_slice(&CURRENT_FORMAT.minor.to_le_bytes());
        records.write_all(&preamble).map_err(TraceError::io(&records_path))?;

        let mut writer = TraceWriter {
            dir: dir.to_path_buf(),
            records_path,
            records,
            _lock: lock,
            good_len: preamble.len() as u64,
            failed: false,
            last_step: None,
            steps_written: 0,
            meta: RunMeta {
                started_unix_s: unix_now(),
                finished_unix_s: None,
                host: host_name(),
                pid: std::process::id(),
                command: std::env::args().collect(),
            },
        };
        writer.append(&Record::Header(Box::new(header.clone())))?;
        writer.write_meta()?;
        Ok(writer)
    }

    /// The trace directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Appends one step. Steps must be strictly increasing and tensor names unique.
    pub fn write_step(&mut self, step: u64, tensors: Vec<StepTensor>) -> Result<(), TraceError> {
        self.write_step_with(step, tensors, Vec::new())
    }

    /// `write_step`, also naming the trainable parameters that received no gradient.
    pub fn write_step_with(
        &mut self,
        step: u64,
        tensors: Vec<StepTensor>,
        mut no_gradient: Vec<String>,
    ) -> Result<(), TraceError> {
        if let Some(last) = self.last_step.filter(|&last| step <= last) {
            return Err(self.invalid(format!("step {step} recorded after step {last}; steps must increase")));
        }
        let mut names = BTreeSet::new();
        let mut earlier = std::collections::BTreeMap::new();
        for t in &tensors {
            let r = &t.record;
            if let Some(view) = &r.view {
                let owner = earlier.get(view.of.as_str()).copied();
                crate::view::check(r, view, owner)
                    .map_err(|why| self.invalid(format!("tensor `{}` at step {step}: {why}", r.name)))?;
                if t.payload.is_some() {
                    return Err(self.invalid(format!("tensor `{}` at step {step}: a view stores no values", r.name)));
                }
            }
            earlier.insert(r.name.as_str(), r);
            if let Some(why) = printable::unprintable_in_tensor(r) {
                return Err(self.invalid(format!("step {step}: {why}")));
            }
            if let Some(input) = r.inputs.iter().find(|i| !names.contains(i.as_str())) {
                return Err(self.invalid(format!(
                    "input `{input}` of `{}` at step {step} is not a tensor recorded before it in the step",
                    r.name
                )));
            }
            if r.name == "__metadata__" {
                return Err(
                    self.invalid("`__metadata__` is reserved by safetensors; choose another tensor name".into())
                );
            }
            if !names.insert(r.name.as_str()) {
                return Err(self.invalid(format!("tensor `{}` recorded twice in step {step}", r.name)));
            }
            if r.shape.len() > format::MAX_RANK {
                return Err(self.invalid(format!("tensor `{}` has rank above {}", r.name, format::MAX_RANK)));
            }
            let expected = r.shape.iter().try_fold(r.dtype.size_in_bytes() as u64, |acc, &d| acc.checked_mul(d));
            let Some(expected) = expected else {
                return Err(self.invalid(format!("tensor `{}` has an impossible shape {:?}", r.name, r.shape)));
            };
            for (what, len) in
                [("inline", r.inline.as_ref().map(Vec::len)), ("payload", t.payload.as_ref().map(Vec::len))]
            {
                if let Some(len) = len.filter(|&len| len as u64 != expected) {
                    return Err(self.invalid(format!(
                        "tensor `{}` at step {step}: {what} holds {len} bytes, its shape needs {expected}",
                        r.name
                    )));
                }
            }
        }
        let payload = self.write_payload(step, &tensors)?;
        let record = StepRecord {
            step,
            payload,
            tensors: tensors
                .into_iter()
                .map(|t| TensorRecord { in_payload: t.payload.is_some(), ..t.record })
                .collect(),
            no_gradient: {
                no_gradient.sort();
                no_gradient.dedup();
                no_gradient
            },
        };
        self.append(&Record::Step(record))?;
        self.last_step = Some(step);
        self.steps_written += 1;
        Ok(())
    }

    /// Writes the footer, syncs everything to disk and returns the number of steps written.
    pub fn finish(self) -> Result<u64, TraceError> {
        self.finish_with(None)
    }

    /// `finish` for a run that stopped on purpose before its announced steps: readers then see
    /// the trace as finished but incomplete, saying `stopped`.
    pub fn finish_stopped(self, stopped: String) -> Result<u64, TraceError> {
        self.finish_with(Some(stopped))
    }

    fn finish_with(mut self, stopped: Option<String>) -> Result<u64, TraceError> {
        // The reason is repro's own message, which may quote a user's string: written printable.
        let stopped = stopped.map(|s| s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect());
        let steps = self.steps_written;
        self.append(&Record::Footer(Footer { steps, stopped }))?;
        self.records.sync_all().map_err(TraceError::io(&self.records_path))?;
        self.meta.finished_unix_s = Some(unix_now());
        // The trace is whole once its footer is on disk; the run metadata (times, host, command)
        // is informational, read by nothing: a full disk here leaves the one from the start.
        if self.write_meta().is_err() {
            let _ = fs::remove_file(self.dir.join(RUN_META_FILE).with_extension("json.tmp"));
        }
        Ok(steps)
    }

    fn invalid(&self, reason: String) -> TraceError {
        TraceError::InvalidRecord { path: self.dir.clone(), reason }
    }

    fn append(&mut self, record: &Record) -> Result<(), TraceError> {
        if self.failed {
            return Err(self.invalid("an earlier write failed; the trace ends at its last complete record".into()));
        }
        let bytes = rmp_serde::to_vec_named(record).map_err(|e| self.invalid(format!("cannot encode record: {e}")))?;
        match write_frame(&mut self.records, &bytes) {
            Ok(()) => {
                self.good_len += (FRAME_HEADER_LEN + bytes.len()) as u64;
                Ok(())
            }
            Err(e) => {
                // A partial frame followed by later ones would read as corruption: cut it off
                // (best effort; if even that fails, readers see a truncated last record) and
                // refuse further writes, so the trace stays readable up to its last record.
                self.failed = true;
                let _ = self.records.set_len(self.good_len);
                Err(TraceError::Io { path: self.records_path.clone(), source: e })
            }
        }
    }

    fn write_payload(&self, step: u64, tensors: &[StepTensor]) -> Result<Option<String>, TraceError> {
        let mut views = Vec::new();
        for t in tensors {
            if let Some(bytes) = &t.payload {
                let shape: Vec<usize> = t.record.shape.iter().map(|&d| d as usize).collect();
                let view = safetensors::tensor::TensorView::new(safetensors_dtype(t.record.dtype), shape, bytes)
                    .map_err(|e| self.invalid(format!("tensor `{}` at step {step}: {e}", t.record.name)))?;
                views.push((t.record.name.clone(), view));
            }
        }
        if views.is_empty() {
            return Ok(None);
        }
        let name = format::payload_name(step);
        let final_path = self.dir.join(&name);
        let tmp_path = final_path.with_extension("safetensors.tmp");
        let parent = final_path.parent().expect("payload names have a directory");
        fs::create_dir_all(parent).map_err(TraceError::io(parent))?;
        remove_stale(&tmp_path)?;
        safetensors::serialize_to_file(views, None, &tmp_path).map_err(|e| match e {
            safetensors::SafeTensorError::IoError(source) => TraceError::Io { path: tmp_path.clone(), source },
            other => self.invalid(format!("cannot write payload of step {step}: {other}")),
        })?;
        // safetensors creates files readable by their owner only; traces are meant to be shared.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&tmp_path, fs::Permissions::from_mode(0o644)).map_err(TraceError::io(&tmp_path))?;
        }
        File::open(&tmp_path).and_then(|f| f.sync_all()).map_err(TraceError::io(&tmp_path))?;
        fs::rename(&tmp_path, &final_path).map_err(TraceError::io(&final_path))?;
        Ok(Some(name))
    }

    fn write_meta(&self) -> Result<(), TraceError> {
        let path = self.dir.join(RUN_META_FILE);
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_string_pretty(&self.meta).expect("run metadata serializes");
        // A link left in the temporary file's place is removed, never written through.
        remove_stale(&tmp)?;
        let mut file = OpenOptions::new().write(true).create_new(true).open(&tmp).map_err(TraceError::io(&tmp))?;
        file.write_all((text + "\n").as_bytes()).map_err(TraceError::io(&tmp))?;
        fs::rename(&tmp, &path).map_err(TraceError::io(&path))
    }
}

/// The lock file that keeps two recorders out of one trace directory.
pub const LOCK_FILE: &str = ".repro-lock";

/// Whether `dir` holds anything but what a trace writer leaves (a lock file).
fn holds_foreign_files(dir: &Path) -> Result<bool, TraceError> {
    match fs::read_dir(dir) {
        Ok(entries) => {
            for entry in entries {
                let entry = entry.map_err(TraceError::io(dir))?;
                if entry.file_name() != LOCK_FILE {
                    return Ok(true);
                }
            }
            Ok(false)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(TraceError::io(dir)(e)),
    }
}

/// Deletes the files of the trace in `dir`: the record file, run metadata and the payload
/// files the writer names `tensors/step-*.safetensors` (and their `.tmp` leftovers). Anything
/// else stays, and `tensors/` goes only if it is left empty.
/// Refuses a trace directory in which a file repro writes (the lock, the records, the run
/// metadata and its temporary file, the payload folder) is a symbolic link: writing through it
/// would change files outside the trace, and replacing a trace would delete them.
fn refuse_links(dir: &Path) -> Result<(), TraceError> {
    let run_meta_tmp = Path::new(RUN_META_FILE).with_extension("json.tmp");
    for name in
        [Path::new(LOCK_FILE), Path::new(RECORDS_FILE), Path::new(RUN_META_FILE), &run_meta_tmp, Path::new(TENSORS_DIR)]
    {
        let path = dir.join(name);
        if fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(TraceError::InvalidRecord {
                path: dir.to_path_buf(),
                reason: format!(
                    "{} is a symbolic link: repro writes only its own files in a trace directory and never follows links \
                     there; remove it or choose another directory",
                    path.display()
                ),
            });
        }
    }
    Ok(())
}

/// Whether `records` is a regular file too short to hold a preamble: nothing was recorded in it.
fn holds_nothing(records: &Path) -> bool {
    fs::symlink_metadata(records).is_ok_and(|m| m.file_type().is_file() && m.len() < format::PREAMBLE_LEN as u64)
}

/// Removes `path` if something is there (a link itself, not what it points to).
fn remove_stale(path: &Path) -> Result<(), TraceError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(TraceError::Io { path: path.to_path_buf(), source: e })
        }
        _ => Ok(()),
    }
}

fn remove_trace_files(dir: &Path) -> Result<(), TraceError> {
    for stale in [RECORDS_FILE, RUN_META_FILE] {
        let p = dir.join(stale);
        if p.exists() {
            fs::remove_file(&p).map_err(TraceError::io(&p))?;
        }
    }
    let tensors = dir.join(TENSORS_DIR);
    let Ok(entries) = fs::read_dir(&tensors) else { return Ok(()) };
    for entry in entries {
        let entry = entry.map_err(TraceError::io(&tensors))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let ours = name.starts_with("step-") && (name.ends_with(".safetensors") || name.ends_with(".safetensors.tmp"));
        if ours && entry.file_type().map_err(TraceError::io(&tensors))?.is_file() {
            fs::remove_file(entry.path()).map_err(TraceError::io(&entry.path()))?;
        }
    }
    let _ = fs::remove_dir(&tensors);
    Ok(())
}

/// Takes the directory's recording lock, or explains who holds it.
fn lock_dir(dir: &Path) -> Result<File, TraceError> {
    let path = dir.join(LOCK_FILE);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(TraceError::io(&path))?;
    match file.try_lock() {
        Ok(()) => {
            let _ = file.set_len(0);
            let _ = write!(file, "{}", std::process::id());
            Ok(file)
        }
        Err(std::fs::TryLockError::WouldBlock) => {
            let holder = fs::read_to_string(&path).unwrap_or_default();
            Err(TraceError::InvalidRecord {
                path: dir.to_path_buf(),
                reason: format!(
                    "another recorder (process {}) is writing this trace; wait for it or choose another directory",
                    holder.trim()
                ),
            })
        }
        Err(std::fs::TryLockError::Error(e)) => Err(TraceError::Io { path, source: e }),
    }
}

/// The safetensors dtype for one of ours.
pub fn safetensors_dtype(dtype: DType) -> safetensors::Dtype {
    match dtype {
        DType::U8 => safetensors::Dtype::U8,
        DType::U32 => safetensors::Dtype::U32,
        DType::I16 => safetensors::Dtype::I16,
        DType::I32 => safetensors::Dtype::I32,
        DType::I64 => safetensors::Dtype::I64,
        DType::F16 => safetensors::Dtype::F16,
        DType::BF16 => safetensors::Dtype::BF16,
        DType::F32 => safetensors::Dtype::F32,
        DType::F64 => safetensors::Dtype::F64,
    }
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn host_name() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_default()
}
