//! `TraceWriter`: appends records to a trace directory as they are produced.
//!
//! Crash safety comes from ordering: a step's payload file is written to a temporary name,
//! synced and renamed into place *before* the step record that references it is appended, and
//! each record goes out in a single `write`. A process killed at any moment therefore leaves a
//! record file whose complete frames are all valid and all reference existing payloads. Memory
//! use is one step's tensors, whatever the number of steps.

use crate::error::TraceError;
use crate::format::{self, FormatVersion, MAGIC, RECORDS_FILE, RUN_META_FILE, TENSORS_DIR};
use crate::frame::{write_frame, FRAME_HEADER_LEN};
use crate::payload::{header_bytes, remove_stale, safetensors_order, PayloadEntry, PayloadFile};
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
    /// Its full values, if this step stores them in its payload file.
    pub payload: Option<Payload>,
}

/// A tensor's full values for the step's payload file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// The bytes, which the writer puts in the file.
    Bytes(Vec<u8>),
    /// Already in the step's [`PayloadFile`] (handed to [`TraceWriter::write_step_streamed`]),
    /// at these bytes of its data.
    InFile(std::ops::Range<u64>),
}

impl Payload {
    /// Its size in bytes.
    pub fn len(&self) -> u64 {
        match self {
            Payload::Bytes(bytes) => bytes.len() as u64,
            Payload::InFile(data) => data.end.saturating_sub(data.start),
        }
    }

    /// The bytes, when they are in memory.
    pub fn bytes(&self) -> Option<&[u8]> {
        match self {
            Payload::Bytes(bytes) => Some(bytes),
            Payload::InFile(_) => None,
        }
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
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
    /// The run's number of ranks (a shard of a world of one is its whole).
    world_size: u64,
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
        // The version the data hash needs (1.9, or 2.0 for `xxh3-1k`), in the preamble and the
        // header alike.
        let header = Header { format: FormatVersion::written_for(header.data_hash), ..header.clone() };
        let mut preamble = MAGIC.to_vec();
        preamble.extend_from_slice(&header.format.major.to_le_bytes());
        preamble.extend_from_slice(&header.format.minor.to_le_bytes());
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
            world_size: header.world_size(),
            meta: RunMeta {
                started_unix_s: unix_now(),
                finished_unix_s: None,
                host: host_name(),
                pid: std::process::id(),
                // Arguments as given, bytes that are not UTF-8 replaced (a path may hold any).
                command: std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect(),
            },
        };
        writer.append(&Record::Header(Box::new(header)))?;
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
        no_gradient: Vec<String>,
    ) -> Result<(), TraceError> {
        self.write_step_streamed(step, tensors, no_gradient, None)
    }

    /// `write_step_with` for a step some of whose values are already in `file`, its payload
    /// file (their payloads are [`Payload::InFile`]): the writer adds the values it is given
    /// as bytes, writes the file's header and puts it in place before the step's record.
    pub fn write_step_streamed(
        &mut self,
        step: u64,
        tensors: Vec<StepTensor>,
        mut no_gradient: Vec<String>,
        file: Option<PayloadFile>,
    ) -> Result<(), TraceError> {
        if let Some(file) = file.as_ref().filter(|f| f.step() != step) {
            return Err(self.invalid(format!("the payload file of step {} handed over with step {step}", file.step())));
        }
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
            if let Some(shard) = &r.shard {
                crate::shard::check_in_world(r, shard, self.world_size)
                    .map_err(|why| self.invalid(format!("tensor `{}` at step {step}: {why}", r.name)))?;
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
            for (what, len) in [
                ("inline", r.inline.as_ref().map(|i| i.len() as u64)),
                ("payload", t.payload.as_ref().map(Payload::len)),
            ] {
                if let Some(len) = len.filter(|&len| len != expected) {
                    return Err(self.invalid(format!(
                        "tensor `{}` at step {step}: {what} holds {len} bytes, its shape needs {expected}",
                        r.name
                    )));
                }
            }
        }
        let payload = self.write_payload(step, &tensors, file)?;
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

    /// Puts the step's full values in its payload file: `file`, holding those already
    /// written, or a new one. Values given as bytes are written in the order the `safetensors`
    /// library writes them (so a step whose values all come as bytes makes that library's
    /// file, byte for byte), after those already in `file`.
    fn write_payload(
        &self,
        step: u64,
        tensors: &[StepTensor],
        file: Option<PayloadFile>,
    ) -> Result<Option<String>, TraceError> {
        let mut bytes: Vec<(&TensorRecord, &[u8])> = Vec::new();
        let mut entries = Vec::new();
        for t in tensors {
            let r = &t.record;
            match &t.payload {
                Some(Payload::Bytes(b)) => bytes.push((r, b)),
                Some(Payload::InFile(data)) if file.is_some() => entries.push(entry(r, data.clone())),
                Some(Payload::InFile(_)) => {
                    return Err(self.invalid(format!(
                    "tensor `{}` at step {step}: its values are said to be in a payload file the step was not given",
                    r.name
                )))
                }
                None => {}
            }
        }
        if bytes.is_empty() && entries.is_empty() && file.as_ref().is_none_or(|f| f.data_len() == 0) {
            return Ok(None);
        }
        bytes.sort_by(|(a, _), (b, _)| safetensors_order((&a.name, a.dtype), (&b.name, b.dtype)));
        let mut file = match file {
            Some(file) => file,
            None => {
                // Every value is in hand: the header's exact room.
                let mut start = 0;
                let layout: Vec<PayloadEntry> = bytes
                    .iter()
                    .map(|(r, b)| {
                        start += b.len() as u64;
                        entry(r, start - b.len() as u64..start)
                    })
                    .collect();
                let header = header_bytes(&layout)
                    .map_err(|why| self.invalid(format!("cannot write payload of step {step}: {why}")))?;
                PayloadFile::create(&self.dir, step, header.len() as u64)?
            }
        };
        for (r, b) in bytes {
            entries.push(entry(r, file.append(b)?));
        }
        file.finish(entries).map(Some)
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

fn remove_trace_files(dir: &Path) -> Result<(), TraceError> {
    for stale in [RECORDS_FILE, RUN_META_FILE, format::PROGRESS_FILE] {
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

/// The payload entry of record `r`, whose bytes are `data` of the file's data.
fn entry(r: &TensorRecord, data: std::ops::Range<u64>) -> PayloadEntry {
    PayloadEntry { name: r.name.clone(), dtype: r.dtype, shape: r.shape.clone(), data }
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
