//! `TraceReader`: reads a trace directory record by record, trusting nothing in it.
//!
//! Every length is checked before it sizes an allocation, msgpack nesting is bounded, payload
//! references must have the one form the writer produces, and every tensor value handed out is
//! checked against its recorded canonical hash. A file that ends inside a record reads as an
//! *incomplete* trace (a crashed or running recorder), not as an error.

use crate::dtype::DType;
use crate::error::TraceError;
use crate::format::{self, FormatVersion, MAGIC, MAX_NESTING, PREAMBLE_LEN, RECORDS_FILE};
use crate::frame::{read_frame, read_full, Frame, FRAME_HEADER_LEN};
use crate::hash::combine;
use crate::paging::{self, Pages};
use crate::payload::safetensors_dtype;
use crate::printable;
use crate::schema::{Footer, Header, Record, StepRecord, TensorRecord};
use serde::Deserialize;
use std::fs::{self, File};
use std::io::BufReader;
use std::path::{Path, PathBuf};

/// A step's payload file, mapped, with its safetensors header parsed (or why it could not be).
struct MappedPayload {
    step: u64,
    map: memmap2::Mmap,
    /// The header's length and the tensors it indexes.
    index: Result<(usize, safetensors::tensor::Metadata), String>,
}

/// Whether a trace was finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completeness {
    /// The footer was read and agrees with the records.
    Complete,
    /// The trace stops early; the string says where and why.
    Incomplete(String),
}

/// A tensor's values, checked against its record. The bytes are borrowed from the record
/// (inline values) or from the mapped payload file, so reading them copies nothing.
///
/// Reading `bytes` directly pages a mapped tensor into memory, where it stays until the step's
/// payload is unmapped; [`TensorValues::zip_windows`] reads in bounded memory.
#[derive(Debug, Clone)]
pub struct TensorValues<'a> {
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: Vec<u64>,
    /// Contiguous little-endian element bytes (gathered into memory for a view, format 1.5).
    pub bytes: std::borrow::Cow<'a, [u8]>,
    /// Where `bytes` lie in a mapped payload; `None` for inline values.
    pages: Option<Pages<'a>>,
}

impl<'a> TensorValues<'a> {
    /// Values held in memory (not mapped from a payload file).
    pub fn in_memory(dtype: DType, shape: Vec<u64>, bytes: &'a [u8]) -> Self {
        TensorValues { dtype, shape, bytes: std::borrow::Cow::Borrowed(bytes), pages: None }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.bytes.len() / self.dtype.size_in_bytes()
    }

    /// Calls `visit(start, windows)` for consecutive byte ranges of these equal-length tensors,
    /// in order, `windows[i]` being the range's bytes of `tensors[i]` and `start` its first byte.
    /// Each window of a mapped tensor is paged in before the call and dropped from memory after
    /// it, so memory stays flat however large the tensors are. `window_bytes` must be a
    /// multiple of the element size.
    ///
    /// # Panics
    /// If the tensors' byte lengths differ.
    pub fn zip_windows(tensors: &[&TensorValues<'_>], window_bytes: usize, visit: impl FnMut(usize, &[&[u8]])) {
        let parts: Vec<_> = tensors.iter().map(|t| (t.bytes.as_ref(), t.pages)).collect();
        paging::for_each_window(&parts, window_bytes, visit);
    }
}

/// Reads one trace directory.
pub struct TraceReader {
    dir: PathBuf,
    records_path: PathBuf,
    input: BufReader<File>,
    offset: u64,
    version: FormatVersion,
    header: Header,
    last_step: Option<u64>,
    steps_read: u64,
    completeness: Option<Completeness>,
    /// The payload file of the step last read from, mapped, so tensors are read in place.
    payload_cache: Option<MappedPayload>,
    /// Opened from a lone record file: there are no payload files to read.
    records_only: bool,
}

impl TraceReader {
    /// Opens a trace and reads its header. `path` is a trace directory, or a lone record file
    /// (a baseline: hashes and small values, no payloads). A trace's own `records.rpr` opens
    /// the whole trace, payloads included.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, TraceError> {
        let mut path = path.as_ref().to_path_buf();
        if let (true, Some(parent)) = (path.file_name() == Some(RECORDS_FILE.as_ref()), path.parent()) {
            if path.is_file() && fs::symlink_metadata(parent.join(format::TENSORS_DIR)).is_ok_and(|m| m.is_dir()) {
                path = parent.to_path_buf();
            }
        }
        let meta = fs::metadata(&path).map_err(TraceError::io(&path))?;
        let (dir, records_path, records_only) = if meta.is_dir() {
            let records_path = path.join(RECORDS_FILE);
            if !records_path.exists() {
                let reason = if format::is_ranked_run(&path) {
                    "it is a data-parallel run, one trace per rank (rank-0, rank-1, ...): `repro diff`, `inspect` and `matrix` read the run; other commands take one rank's directory".into()
                } else {
                    format!("it has no {RECORDS_FILE}")
                };
                return Err(TraceError::NotATrace { path, reason });
            }
            (path, records_path, false)
        } else {
            (path.clone(), path, true)
        };
        // A FIFO or device in its place would block or read forever: refused unopened.
        let kind = fs::metadata(&records_path).map_err(TraceError::io(&records_path))?.file_type();
        if !kind.is_file() {
            return Err(TraceError::NotATrace {
                path: records_path,
                reason: "it is not a regular file (a FIFO, a device or a directory)".into(),
            });
        }
        let file = File::open(&records_path).map_err(TraceError::io(&records_path))?;
        let mut input = BufReader::with_capacity(1 << 16, file);
        let mut preamble = [0u8; PREAMBLE_LEN];
        let got = read_full(&mut input, &mut preamble).map_err(TraceError::io(&records_path))?;
        if got < MAGIC.len() || &preamble[..MAGIC.len()] != MAGIC {
            return Err(TraceError::NotATrace {
                path: records_path,
                reason: "it does not start with the trace magic bytes (a trace is a directory made by `repro record`, or a record file made by `repro baseline write`)".into(),
            });
        }
        if got < PREAMBLE_LEN {
            return Err(TraceError::Corrupt {
                path: records_path,
                location: "byte 8".into(),
                reason: "the file ends inside its preamble: the recorder died before writing the header".into(),
            });
        }
        let version = FormatVersion {
            major: u16::from_le_bytes([preamble[8], preamble[9]]),
            minor: u16::from_le_bytes([preamble[10], preamble[11]]),
        };
        if !version.is_readable() {
            return Err(TraceError::UnsupportedFormat {
                path: records_path,
                found: version,
                supported: format::XXH3_FORMAT,
            });
        }
        let mut reader = TraceReader {
            dir,
            records_path,
            input,
            offset: PREAMBLE_LEN as u64,
            version,
            header: Header {
                format: version,
                producer: String::new(),
                run: Default::default(),
                environment: Default::default(),
                capture: Default::default(),
                distributed: None,
                data_hash: Default::default(),
            },
            last_step: None,
            steps_read: 0,
            completeness: None,
            payload_cache: None,
            records_only,
        };
        match reader.next_record()? {
            Some(Record::Header(header)) => {
                if header.format != version {
                    return Err(reader.corrupt(
                        "the header record",
                        format!("header says format {} but the preamble says {version}", header.format),
                    ));
                }
                if let Some(why) =
                    printable::header_strings(&header).iter().find_map(|(what, v)| printable::unprintable(what, v))
                {
                    return Err(reader.corrupt("the header record", why));
                }
                if header.distributed.is_some() {
                    if let Err(why) = reader.needs_version(1, 3, "`distributed`") {
                        return Err(reader.corrupt("the header record", why));
                    }
                }
                let capture = &header.capture;
                if capture.modules.is_some() || capture.ops.is_some() {
                    if let Err(why) = reader.needs_version(1, 9, "`capture.modules` or `capture.ops`") {
                        return Err(reader.corrupt("the header record", why));
                    }
                }
                if capture.full == crate::FullCapture::First {
                    if let Err(why) = reader.needs_version(1, 9, "the capture policy `first`") {
                        return Err(reader.corrupt("the header record", why));
                    }
                }
                if !header.data_hash.is_blake3() {
                    if let Err(why) = reader.needs_version(2, 0, "`data_hash` other than blake3") {
                        return Err(reader.corrupt("the header record", why));
                    }
                }
                if let Some(d) = header.distributed.as_ref().filter(|d| d.world_size == 0 || d.rank >= d.world_size) {
                    return Err(reader.corrupt(
                        "the header record",
                        format!(
                            "it is rank {} of a world of {}: a rank must be below the world size, which is at least 1",
                            d.rank, d.world_size
                        ),
                    ));
                }
                reader.header = *header;
                Ok(reader)
            }
            Some(_) => Err(reader.corrupt("the first record", "expected the header record".into())),
            None => Err(TraceError::Corrupt {
                path: reader.records_path,
                location: "the first record".into(),
                reason: "the trace has no complete header: the recorder died before writing it".into(),
            }),
        }
    }

    /// The trace directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The record file.
    pub fn records_path(&self) -> &Path {
        &self.records_path
    }

    /// The format version the trace was written in.
    pub fn version(&self) -> FormatVersion {
        self.version
    }

    /// The header record.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Refuses to compare this trace's hashes with `other`'s when their data hashes differ
    /// (section 5.5 of the format): such hashes never agree.
    pub fn comparable_with(&self, other: &TraceReader) -> Result<(), TraceError> {
        let (a_kind, b_kind) = (self.header.data_hash, other.header.data_hash);
        if a_kind == b_kind {
            return Ok(());
        }
        let shown = |r: &TraceReader| if r.records_only { r.records_path.clone() } else { r.dir.clone() };
        Err(TraceError::DataHashesDiffer { a: shown(self), a_kind, b: shown(other), b_kind })
    }

    /// Whether the trace is complete; known once `next_step` has returned `None`.
    pub fn completeness(&self) -> Option<&Completeness> {
        self.completeness.as_ref()
    }

    /// Reads the next step record, or `None` at the end of the trace (complete or not).
    pub fn next_step(&mut self) -> Result<Option<StepRecord>, TraceError> {
        if self.completeness.is_some() {
            return Ok(None);
        }
        match self.next_record()? {
            Some(Record::Step(step)) => {
                self.check_step(&step)?;
                self.last_step = Some(step.step);
                self.steps_read += 1;
                Ok(Some(step))
            }
            Some(Record::Footer(footer)) => {
                self.check_footer(&footer)?;
                self.completeness = Some(match footer.stopped {
                    None => Completeness::Complete,
                    Some(why) => Completeness::Incomplete(format!("stopped early: {why}")),
                });
                Ok(None)
            }
            Some(Record::Header(_)) => Err(self.corrupt(&self.here(), "a second header record".into())),
            None => Ok(None),
        }
    }

    /// Whether the trace holds `tensor`'s values at `step` (what `values` would read), without
    /// reading them: inline in the record, or in a payload file this reader can follow.
    pub fn has_values(&self, step: &StepRecord, tensor: &TensorRecord) -> bool {
        if let Some(view) = &tensor.view {
            return owner(step, tensor, view).is_some_and(|owner| self.has_values(step, owner));
        }
        tensor.inline.is_some() || (!self.records_only && tensor.in_payload && step.payload.is_some())
    }

    /// Reads the values of `tensor` (a tensor of `step`), from the record itself or from the
    /// step's payload file, and checks them against the recorded dtype, shape and hash.
    /// Returns `None` when the trace holds only the tensor's hash.
    pub fn values<'a>(
        &'a mut self,
        step: &'a StepRecord,
        tensor: &'a TensorRecord,
    ) -> Result<Option<TensorValues<'a>>, TraceError> {
        let where_ = || format!("step {}, tensor `{}`", step.step, tensor.name);
        if let Some(view) = &tensor.view {
            // Its owner's values (checked against the owner's hash), read through its layout.
            let Some(owner) = owner(step, tensor, view) else {
                return Err(self.corrupt(&where_(), format!("a view of `{}`, which the step lacks", view.of)));
            };
            let Some(values) = self.values(step, owner)? else { return Ok(None) };
            let size = values.dtype.size_in_bytes();
            let bytes = crate::view::gather(&values.bytes, size, &tensor.shape, view.offset, &view.strides);
            let bytes = std::borrow::Cow::Owned(bytes);
            return Ok(Some(TensorValues { dtype: tensor.dtype, shape: tensor.shape.clone(), bytes, pages: None }));
        }
        if tensor.inline.is_none() && self.records_only {
            // A lone record file keeps hashes; the values of large tensors stayed behind.
            return Ok(None);
        }
        if tensor.inline.is_none() && tensor.in_payload {
            let Some(name) = &step.payload else {
                return Err(self.corrupt(&where_(), "marked as stored in a payload, but the step has none".into()));
            };
            self.map_payload(step.step, name)?;
        }
        let this: &'a TraceReader = self;
        let (bytes, pages) = if let Some(inline) = &tensor.inline {
            (inline.as_slice(), None)
        } else if let (true, Some(name)) = (tensor.in_payload, &step.payload) {
            let (bytes, pages) = this.payload_tensor(step.step, name, tensor)?;
            (bytes, Some(pages))
        } else {
            return Ok(None);
        };
        let data_hash = paging::data_hash_windowed(this.header.data_hash, bytes, pages);
        if combine(tensor.dtype, &tensor.shape, &data_hash) != tensor.hash {
            let path = match (&tensor.inline, &step.payload) {
                (None, Some(name)) => this.dir.join(name),
                _ => this.records_path.clone(),
            };
            return Err(TraceError::Corrupt {
                path,
                location: where_(),
                reason: "the stored values do not match the recorded hash".into(),
            });
        }
        let bytes = std::borrow::Cow::Borrowed(bytes);
        Ok(Some(TensorValues { dtype: tensor.dtype, shape: tensor.shape.clone(), bytes, pages }))
    }

    /// Whether this is a lone record file (a baseline): its payload references, if any, cannot
    /// be followed.
    pub fn records_only(&self) -> bool {
        self.records_only
    }

    /// Maps the payload file of `step` (named `name`), unless it is already mapped.
    fn map_payload(&mut self, step: u64, name: &str) -> Result<(), TraceError> {
        if self.payload_cache.as_ref().map(|p| p.step) == Some(step) {
            return Ok(());
        }
        self.payload_cache = None;
        let path = self.dir.join(name);
        for p in [self.dir.join(format::TENSORS_DIR), path.clone()] {
            let link = fs::symlink_metadata(&p).map_err(TraceError::io(&p))?;
            if link.file_type().is_symlink() {
                return Err(TraceError::Corrupt {
                    path: p,
                    location: format!("step {step}"),
                    reason: "payloads must not be symbolic links (they could point outside the trace)".into(),
                });
            }
        }
        // A FIFO or device file in its place would block or read forever.
        if !fs::symlink_metadata(&path).map_err(TraceError::io(&path))?.file_type().is_file() {
            return Err(TraceError::Corrupt {
                path,
                location: format!("step {step}"),
                reason: "the payload is not a regular file".into(),
            });
        }
        let file = File::open(&path).map_err(TraceError::io(&path))?;
        // SAFETY: the map is only read. A file truncated by another process while mapped can
        // fault; traces are written once and renamed into place, never rewritten.
        // Not populated: tensors are paged in window by window as they are read (see `paging`),
        // so memory does not grow with the payload's size.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(TraceError::io(&path))?;
        // The header is parsed once per file, not once per tensor read from it (which made
        // reading a step of thousands of stored tensors quadratic).
        let index = safetensors::SafeTensors::read_metadata(&map).map_err(|e| e.to_string());
        self.payload_cache = Some(MappedPayload { step, map, index });
        Ok(())
    }

    /// Finds `tensor` in the mapped payload of `step` and checks its dtype and shape.
    fn payload_tensor(&self, step: u64, name: &str, tensor: &TensorRecord) -> Result<(&[u8], Pages<'_>), TraceError> {
        let path = self.dir.join(name);
        let bad = |reason: String| TraceError::Corrupt {
            path: path.clone(),
            location: format!("step {step}, tensor `{}`", tensor.name),
            reason,
        };
        let payload = match &self.payload_cache {
            Some(p) if p.step == step => p,
            _ => return Err(bad("payload not mapped".into())),
        };
        let (header_len, index) =
            payload.index.as_ref().map_err(|e| bad(format!("not a valid safetensors file: {e}")))?;
        let info = index.info(&tensor.name).ok_or_else(|| bad("the payload file does not hold this tensor".into()))?;
        let shape: Vec<u64> = info.shape.iter().map(|&d| d as u64).collect();
        if info.dtype != safetensors_dtype(tensor.dtype) || shape != tensor.shape {
            return Err(bad(format!(
                "payload holds {:?} {:?}, the record says {} {:?}",
                info.dtype, shape, tensor.dtype, tensor.shape
            )));
        }
        // `read_metadata` checked that the offsets tile the data, which ends where the file does.
        let start = 8 + header_len + info.data_offsets.0;
        Ok((&payload.map[start..8 + header_len + info.data_offsets.1], Pages::new(&payload.map, start)))
    }

    fn next_record(&mut self) -> Result<Option<Record>, TraceError> {
        let start = self.offset;
        let frame = read_frame(&mut self.input).map_err(TraceError::io(&self.records_path))?;
        match frame {
            Frame::End => {
                self.completeness = Some(Completeness::Incomplete(format!(
                    "the trace ends after {} step(s) without a footer: the recorder stopped early",
                    self.steps_read
                )));
                Ok(None)
            }
            Frame::Truncated => {
                self.completeness = Some(Completeness::Incomplete(format!(
                    "the last record (at byte {start}) is cut short after {} complete step(s): the recorder stopped mid-write",
                    self.steps_read
                )));
                Ok(None)
            }
            Frame::Corrupt(reason) => Err(self.corrupt(&format!("byte {start} ({})", self.here()), reason)),
            Frame::Record(payload) => {
                self.offset += (FRAME_HEADER_LEN + payload.len()) as u64;
                decode_record(&payload).map(Some).map_err(|e| {
                    self.corrupt(&format!("byte {start} ({})", self.here()), format!("undecodable record: {e}"))
                })
            }
        }
    }

    fn check_step(&self, step: &StepRecord) -> Result<(), TraceError> {
        let where_ = format!("step {}", step.step);
        if let Some(last) = self.last_step.filter(|&l| step.step <= l) {
            return Err(self.corrupt(&where_, format!("steps out of order (step {} follows step {last})", step.step)));
        }
        if let Some(name) = &step.payload {
            if format::parse_payload_name(name) != Some(step.step) {
                return Err(
                    self.corrupt(&where_, format!("payload reference `{name}` is not this step's payload file"))
                );
            }
        }
        if let Some(why) = step.tensors.iter().find_map(printable::unprintable_in_tensor) {
            return Err(self.corrupt(&where_, why));
        }
        if let Some(why) =
            step.no_gradient.iter().find_map(|n| printable::unprintable("a parameter without gradient", n))
        {
            return Err(self.corrupt(&where_, why));
        }
        if !step.no_gradient.is_empty() {
            self.needs_version(1, 2, "`no_gradient`").map_err(|why| self.corrupt(&where_, why))?;
        }
        let mut names = std::collections::BTreeMap::new();
        for t in &step.tensors {
            if names.insert(t.name.as_str(), t).is_some() {
                return Err(self.corrupt(&where_, format!("tensor `{}` appears twice", t.name)));
            }
            self.check_tensor_keys(t, &names)
                .map_err(|why| self.corrupt(&where_, format!("tensor `{}`: {why}", t.name)))?;
            if t.shape.len() > format::MAX_RANK {
                return Err(self.corrupt(
                    &where_,
                    format!("tensor `{}` has rank {} (limit {})", t.name, t.shape.len(), format::MAX_RANK),
                ));
            }
            let bytes = t.shape.iter().try_fold(t.dtype.size_in_bytes() as u64, |acc, &d| acc.checked_mul(d));
            match (bytes, &t.inline) {
                (None, _) => {
                    return Err(
                        self.corrupt(&where_, format!("tensor `{}` has an impossible shape {:?}", t.name, t.shape))
                    )
                }
                (Some(n), Some(inline)) if inline.len() as u64 != n => {
                    return Err(self.corrupt(
                        &where_,
                        format!("tensor `{}` stores {} inline bytes for {n} expected", t.name, inline.len()),
                    ));
                }
                _ => {}
            }
            if t.in_payload && step.payload.is_none() {
                return Err(
                    self.corrupt(&where_, format!("tensor `{}` refers to a payload the step does not have", t.name))
                );
            }
        }
        Ok(())
    }

    /// Refuses a key that the file's declared version predates: read by the older version's
    /// rules it would be ignored, and ignoring `stopped` or `collective` would change a verdict.
    fn needs_version(&self, major: u16, minor: u16, key: &str) -> Result<(), String> {
        if (self.version.major, self.version.minor) < (major, minor) {
            return Err(format!("{key} is a key of format {major}.{minor}, but the file declares {}", self.version));
        }
        Ok(())
    }

    /// The version rule for a tensor's optional keys, and the collective rule: `all_reduce_sum`
    /// of exactly one contribution, recorded earlier in the step with the same dtype and shape.
    fn check_tensor_keys(
        &self,
        t: &TensorRecord,
        earlier: &std::collections::BTreeMap<&str, &TensorRecord>,
    ) -> Result<(), String> {
        if t.phase.is_some() || !t.inputs.is_empty() {
            self.needs_version(1, 1, "`phase` or `inputs`")?;
        }
        if t.kind == crate::TensorKind::Buffer && (self.version.major, self.version.minor) < (1, 9) {
            return Err(format!("the kind `buffer` is of format 1.9, but the file declares {}", self.version));
        }
        if matches!(t.kind, crate::TensorKind::OptimizerState | crate::TensorKind::RngState) {
            // Of 1.10 in the 1.x line and of 2.1 in the 2.x line (2.0 came before them).
            let since = if self.version.major == 1 { 10 } else { 1 };
            if self.version.minor < since {
                return Err(format!(
                    "the kind `{}` is of format 1.10 (2.1 under xxh3-1k), but the file declares {}",
                    t.kind, self.version
                ));
            }
        }
        if t.node.is_some() {
            self.needs_version(1, 2, "`node`")?;
        }
        if let Some(source) = &t.source {
            self.needs_version(1, 4, "`source`")?;
            if t.node.is_none() && (self.version.major, self.version.minor) < (1, 6) {
                return Err("`source` is a captured node's before format 1.6: the record has no `node`".into());
            }
            if source.len() > format::MAX_SOURCE_BYTES {
                return Err(format!("`source` is {} bytes (at most {})", source.len(), format::MAX_SOURCE_BYTES));
            }
        }
        if let Some(view) = &t.view {
            self.needs_version(1, 5, "`view`")?;
            if t.node.is_none() {
                return Err("`view` is a captured node's: the record has no `node`".into());
            }
            crate::view::check(t, view, earlier.get(view.of.as_str()).copied().filter(|o| !std::ptr::eq(*o, t)))?;
        }
        if let Some(shard) = &t.shard {
            self.needs_version(1, 7, "`shard`")?;
            crate::shard::check_in_world(t, shard, self.header.world_size())?;
        }
        if let Some(reduction) = &t.reduce_scatter {
            self.needs_version(1, 8, "`reduce_scatter`")?;
            if reduction != format::REDUCE_SCATTER_SUM {
                return Err(format!(
                    "unknown reduce-scatter `{reduction}` (format 1.8 knows only `{}`)",
                    format::REDUCE_SCATTER_SUM
                ));
            }
            if t.collective.is_some() {
                return Err(
                    "a record is the result of one collective: it carries `collective` and `reduce_scatter`".into()
                );
            }
            let Some(shard) = &t.shard else {
                return Err(
                    "a reduce-scatter's result is this rank's block of the sum: the record has no `shard`".into()
                );
            };
            return check_contribution(t, earlier, &shard.whole);
        }
        let Some(collective) = &t.collective else { return Ok(()) };
        self.needs_version(1, 3, "`collective`")?;
        if collective != format::ALL_REDUCE_SUM {
            return Err(format!(
                "unknown collective `{collective}` (format 1.3 knows only `{}`)",
                format::ALL_REDUCE_SUM
            ));
        }
        check_contribution(t, earlier, &t.shape)
    }

    fn check_footer(&mut self, footer: &Footer) -> Result<(), TraceError> {
        if footer.stopped.is_some() {
            self.needs_version(1, 2, "`stopped`").map_err(|why| self.corrupt("the footer", why))?;
        }
        if let Some(why) = footer.stopped.as_deref().and_then(|s| printable::unprintable("the reason it stopped", s)) {
            return Err(self.corrupt("the footer", why));
        }
        if footer.steps != self.steps_read {
            return Err(self.corrupt(
                "the footer",
                format!("footer counts {} steps, the trace holds {}", footer.steps, self.steps_read),
            ));
        }
        let mut extra = [0u8; 1];
        if read_full(&mut self.input, &mut extra).map_err(TraceError::io(&self.records_path))? > 0 {
            return Err(self.corrupt(&format!("byte {}", self.offset), "data after the footer".into()));
        }
        Ok(())
    }

    fn here(&self) -> String {
        match self.last_step {
            Some(s) => format!("after step {s}"),
            None => "before the first step".into(),
        }
    }

    fn corrupt(&self, location: &str, reason: String) -> TraceError {
        TraceError::Corrupt { path: self.records_path.clone(), location: location.to_string(), reason }
    }
}

/// Decodes one record. A step whose `type` key comes first, as writers put it (docs/trace-format.md,
/// 3.1), is read as a `StepRecord` straight away: the step's own decoder skips the `type` key as
/// one it does not know. Any other record goes through `Record`'s internally tagged decoding,
/// which first copies the whole map into serde's generic value tree to find the tag: most of a
/// diff's time on hash-only traces of thousands of tensors a step.
fn decode_record(payload: &[u8]) -> Result<Record, rmp_serde::decode::Error> {
    let deserializer = || {
        let mut de = rmp_serde::Deserializer::from_read_ref(payload);
        de.set_max_depth(MAX_NESTING);
        de
    };
    if leading_type(payload) == Some("step") {
        return StepRecord::deserialize(&mut deserializer()).map(Record::Step);
    }
    Record::deserialize(&mut deserializer())
}

/// The value of a record map's first key when that key is `type` and its value a string.
fn leading_type(payload: &[u8]) -> Option<&str> {
    let mut rest = payload;
    if rmp::decode::read_map_len(&mut rest).ok()? == 0 {
        return None;
    }
    let (key, rest) = rmp::decode::read_str_from_slice(rest).ok()?;
    if key != "type" {
        return None;
    }
    rmp::decode::read_str_from_slice(rest).ok().map(|(value, _)| value)
}

/// The collective rule for a sum across the ranks (`t`, a `collective` or a `reduce_scatter`):
/// exactly one input, this rank's contribution, recorded earlier in the step with `t`'s dtype
/// and the shape of the whole sum (`whole`: `t`'s own shape unless `t` is a block of it).
fn check_contribution(
    t: &TensorRecord,
    earlier: &std::collections::BTreeMap<&str, &TensorRecord>,
    whole: &[u64],
) -> Result<(), String> {
    let [input] = t.inputs.as_slice() else {
        return Err(format!("a collective sums exactly one contribution per rank; it names {}", t.inputs.len()));
    };
    match earlier.get(input.as_str()) {
        Some(share) if !std::ptr::eq(*share, t) && share.dtype == t.dtype && share.shape == whole => Ok(()),
        Some(share) if !std::ptr::eq(*share, t) => Err(format!(
            "its contribution `{input}` is {} {:?}, the sum {} {:?}",
            share.dtype, share.shape, t.dtype, whole
        )),
        _ => Err(format!("its contribution `{input}` is not recorded earlier in the step")),
    }
}

/// The tensor of `step` that `view` (of `tensor`) reads, recorded before it (the reader checked
/// that when it read the step).
fn owner<'s>(step: &'s StepRecord, tensor: &TensorRecord, view: &crate::schema::ViewOf) -> Option<&'s TensorRecord> {
    step.tensors.iter().take_while(|t| !std::ptr::eq(*t, tensor)).find(|t| t.name == view.of && t.view.is_none())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::ALL_REDUCE_SUM;
    use crate::format::CURRENT_FORMAT;
    use crate::frame::write_frame;
    use crate::hash::tensor_hash;
    use crate::schema::TensorRecord;

    /// A record file with the valid preamble and the given record payloads, each framed with a
    /// correct checksum: what reaches the msgpack decoder when the damage is not random.
    fn trace_with(records: &[Vec<u8>]) -> tempfile::TempDir {
        trace_in_version(CURRENT_FORMAT, records)
    }

    fn trace_in_version(version: FormatVersion, records: &[Vec<u8>]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&version.major.to_le_bytes());
        bytes.extend_from_slice(&version.minor.to_le_bytes());
        for r in records {
            write_frame(&mut bytes, r).unwrap();
        }
        fs::write(dir.path().join(RECORDS_FILE), bytes).unwrap();
        dir
    }

    #[test]
    fn a_rank_outside_its_world_is_refused_when_the_header_is_read() {
        for (rank, world_size) in [(0, 0), (2, 2), (5, 1)] {
            let distributed =
                crate::schema::Distributed { rank, world_size, backend: "file".into(), backend_version: String::new() };
            let dir = trace_with(&[header_of(Some(distributed))]);
            let err = TraceReader::open(dir.path()).err().expect("refused").to_string();
            assert!(err.contains(&format!("rank {rank} of a world of {world_size}")), "{err}");
        }
    }

    fn read_all(dir: &Path) -> Result<u64, TraceError> {
        let mut reader = TraceReader::open(dir)?;
        let mut n = 0;
        while let Some(step) = reader.next_step()? {
            for t in &step.tensors {
                reader.values(&step, t)?;
            }
            n += 1;
        }
        Ok(n)
    }

    fn header() -> Vec<u8> {
        header_of(None)
    }

    /// A header record, of a rank's stream when `distributed` says so.
    fn header_of(distributed: Option<crate::schema::Distributed>) -> Vec<u8> {
        let h = Header { distributed, ..plain_header() };
        rmp_serde::to_vec_named(&Record::Header(Box::new(h))).unwrap()
    }

    /// The header of a single-device test trace.
    fn plain_header() -> Header {
        Header::of_producer("test")
    }

    #[test]
    fn a_step_reads_the_same_whether_its_type_key_comes_first_or_last() {
        let bytes = vec![1u8, 0, 128, 63];
        let step = StepRecord {
            step: 7,
            payload: None,
            tensors: vec![TensorRecord {
                inline: Some(bytes.clone()),
                ..TensorRecord::of_bytes("loss", crate::TensorKind::Loss, DType::F32, vec![1], &bytes)
            }],
            no_gradient: vec!["w".into()],
        };
        let first = rmp_serde::to_vec_named(&Record::Step(step.clone())).unwrap();
        assert_eq!(leading_type(&first), Some("step"), "writers put the type first");
        // The same map with `type` as its last key: the step's own fields, then the tag.
        let fields = rmp_serde::to_vec_named(&step).unwrap();
        let mut rest = &fields[..];
        let n = rmp::decode::read_map_len(&mut rest).unwrap();
        let mut last = Vec::new();
        rmp::encode::write_map_len(&mut last, n + 1).unwrap();
        last.extend_from_slice(rest);
        rmp::encode::write_str(&mut last, "type").unwrap();
        rmp::encode::write_str(&mut last, "step").unwrap();
        assert_eq!(leading_type(&last), None);
        for payload in [&first, &last] {
            assert_eq!(decode_record(payload).unwrap(), Record::Step(step.clone()));
        }
        // Other records, and a step whose tag names another kind, take the tagged decoding.
        let footer = Record::Footer(Footer { steps: 3, stopped: None });
        assert_eq!(decode_record(&rmp_serde::to_vec_named(&footer).unwrap()).unwrap(), footer);
        let mut mislabelled = first.clone();
        let at = mislabelled.windows(4).position(|w| w == b"step").unwrap();
        mislabelled[at..at + 4].copy_from_slice(b"stap");
        assert!(decode_record(&mislabelled).is_err(), "an unknown record type is corrupt");
    }

    fn step_with(tensor: TensorRecord, payload: Option<&str>) -> Vec<u8> {
        let step = StepRecord {
            step: 0,
            payload: payload.map(str::to_string),
            tensors: vec![tensor],
            no_gradient: Vec::new(),
        };
        rmp_serde::to_vec_named(&Record::Step(step)).unwrap()
    }

    fn tensor(shape: Vec<u64>, inline: Option<Vec<u8>>, in_payload: bool) -> TensorRecord {
        TensorRecord {
            name: "t".into(),
            kind: crate::TensorKind::Weight,
            dtype: DType::F32,
            hash: tensor_hash(DType::F32, &shape, inline.as_deref().unwrap_or(&[])),
            shape,
            inline,
            in_payload,
            phase: None,
            inputs: vec![],
            node: None,
            collective: None,
            source: None,
            view: None,
            shard: None,
            reduce_scatter: None,
        }
    }

    #[test]
    fn control_characters_in_a_traces_strings_are_corruption_named_escaped() {
        let forged = "t\n\nIDENTICAL  3 steps, 9 tensors compared, bit-exact\x1b[2K";
        let named = TensorRecord { name: forged.into(), ..tensor(vec![1], Some(vec![0; 4]), false) };
        let err = error_reading(&[header(), step_with(named, None)]);
        assert!(err.contains("corrupt") && err.contains("U+000A"), "{err}");
        assert!(!err.chars().any(char::is_control), "the message itself stays printable: {err:?}");
        let input =
            TensorRecord { inputs: vec!["\x1b]0;title\x07".into()], ..tensor(vec![1], Some(vec![0; 4]), false) };
        assert!(error_reading(&[header(), step_with(input, None)]).contains("U+001B"));
        let mut h = plain_header();
        h.run.workload = "mlp\rIDENTICAL".into();
        let dir = trace_with(&[rmp_serde::to_vec_named(&Record::Header(Box::new(h))).unwrap()]);
        let err = TraceReader::open(dir.path()).err().expect("refused").to_string();
        assert!(err.contains("the workload") && err.contains("U+000D"), "{err}");
        // A parameter named without gradient, and a rank's backend: printed by reports too.
        let mut step = StepRecord {
            step: 0,
            payload: None,
            tensors: vec![tensor(vec![1], Some(vec![0; 4]), false)],
            no_gradient: vec!["w\x1b[2J".into()],
        };
        let err = error_reading(&[header(), rmp_serde::to_vec_named(&Record::Step(step.clone())).unwrap()]);
        assert!(err.contains("a parameter without gradient") && err.contains("U+001B"), "{err}");
        step.no_gradient.clear();
        let distributed = crate::schema::Distributed {
            rank: 0,
            world_size: 1,
            backend: "nccl\rIDENTICAL".into(),
            backend_version: String::new(),
        };
        let dir = trace_with(&[header_of(Some(distributed))]);
        let err = TraceReader::open(dir.path()).err().expect("refused").to_string();
        assert!(err.contains("the collective backend") && err.contains("U+000D"), "{err}");
    }

    #[test]
    fn writers_refuse_what_readers_would_call_corrupt() {
        use crate::writer::{StepTensor, TraceWriter};
        let dir = tempfile::tempdir().unwrap();
        let mut h = plain_header();
        h.run.params.insert("lr".into(), "1e-3\u{9b}".into());
        let err = TraceWriter::create(&dir.path().join("a"), &h, false).err().expect("refused").to_string();
        assert!(err.contains("setting `lr`") && err.contains("U+009B"), "{err}");
        h.run.params.clear();
        let mut w = TraceWriter::create(&dir.path().join("b"), &h, false).unwrap();
        let record = TensorRecord { name: "w\x1b[31m".into(), ..tensor(vec![1], Some(vec![0; 4]), false) };
        let err = w.write_step(0, vec![StepTensor { record, payload: None }]).unwrap_err().to_string();
        assert!(err.contains("U+001B") && !err.chars().any(char::is_control), "{err:?}");
        // Half a tensor as a shard, in a trace of one device.
        let half = TensorRecord {
            shard: Some(crate::ShardOf { whole: vec![2], offset: vec![0] }),
            ..tensor(vec![1], Some(vec![0; 4]), false)
        };
        let err = w.write_step(1, vec![StepTensor { record: half, payload: None }]).unwrap_err().to_string();
        assert!(err.contains("a trace of one device"), "{err}");
    }

    fn error_reading(records: &[Vec<u8>]) -> String {
        let dir = trace_with(records);
        read_all(dir.path()).unwrap_err().to_string()
    }

    #[test]
    fn each_record_limit_is_enforced() {
        let cases = [
            (step_with(tensor(vec![1; 17], None, false), None), "rank 17"),
            (step_with(tensor(vec![u64::MAX, 2], None, false), None), "impossible shape"),
            (step_with(tensor(vec![2], Some(vec![0; 4]), false), None), "4 inline bytes for 8 expected"),
            (
                step_with(tensor(vec![2], None, false), Some("tensors/step-00000001.safetensors")),
                "not this step's payload",
            ),
            (step_with(tensor(vec![2], None, false), Some("../../etc/passwd")), "not this step's payload"),
            (step_with(tensor(vec![2], None, true), None), "refers to a payload the step does not have"),
        ];
        for (record, expected) in cases {
            let err = error_reading(&[header(), record]);
            assert!(err.contains("corrupt") && err.contains(expected), "expected `{expected}`: {err}");
        }
    }

    #[test]
    fn a_collective_sums_one_earlier_contribution_of_its_own_layout() {
        let named = |name: &str, shape: Vec<u64>, collective: Option<&str>, inputs: &[&str]| TensorRecord {
            name: name.into(),
            collective: collective.map(str::to_string),
            source: None,
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            ..tensor(shape.clone(), Some(vec![0; 4 * shape.iter().product::<u64>() as usize]), false)
        };
        let step = |tensors: Vec<TensorRecord>| {
            let record = StepRecord { step: 0, payload: None, tensors, no_gradient: Vec::new() };
            rmp_serde::to_vec_named(&Record::Step(record)).unwrap()
        };
        let share = named("g.local", vec![2], None, &[]);
        let good = step(vec![share.clone(), named("g", vec![2], Some(ALL_REDUCE_SUM), &["g.local"])]);
        assert_eq!(read_all(trace_with(&[header(), good]).path()).unwrap(), 1);
        let cases = [
            (
                vec![share.clone(), named("g", vec![2], Some("all_gather"), &["g.local"])],
                "unknown collective `all_gather`",
            ),
            (vec![share.clone(), named("g", vec![2], Some(ALL_REDUCE_SUM), &[])], "names 0"),
            (vec![share.clone(), named("g", vec![2], Some(ALL_REDUCE_SUM), &["g.local", "g.local"])], "names 2"),
            (vec![named("g", vec![2], Some(ALL_REDUCE_SUM), &["g.local"]), share.clone()], "not recorded earlier"),
            (vec![named("g", vec![2], Some(ALL_REDUCE_SUM), &["g"])], "not recorded earlier"),
            (vec![share, named("g", vec![3], Some(ALL_REDUCE_SUM), &["g.local"])], "is F32 [2], the sum F32 [3]"),
        ];
        for (tensors, expected) in cases {
            let err = error_reading(&[header(), step(tensors)]);
            assert!(err.contains("corrupt") && err.contains(expected), "expected `{expected}`: {err}");
        }
    }

    /// A trace of one device (no `distributed`, or a world of one) has no other rank to hold the
    /// rest of a tensor: a shard there is its whole, and half a tensor is corrupt.
    #[test]
    fn a_trace_of_one_device_holds_each_shard_whole() {
        let shard = |shape: Vec<u64>, offset: u64| TensorRecord {
            shard: Some(crate::ShardOf { whole: vec![4], offset: vec![offset] }),
            ..tensor(shape.clone(), Some(vec![0; 4 * shape[0] as usize]), false)
        };
        let half = error_reading(&[header(), step_with(shard(vec![2], 0), None)]);
        assert!(half.contains("corrupt") && half.contains("a trace of one device"), "{half}");
        assert_eq!(read_all(trace_with(&[header(), step_with(shard(vec![4], 0), None)]).path()).unwrap(), 1);
        let world = |world_size| crate::schema::Distributed {
            rank: 0,
            world_size,
            backend: "file".into(),
            backend_version: String::new(),
        };
        let of_one = error_reading(&[header_of(Some(world(1))), step_with(shard(vec![2], 2), None)]);
        assert!(of_one.contains("a trace of one device"), "{of_one}");
        let of_two = trace_with(&[header_of(Some(world(2))), step_with(shard(vec![2], 2), None)]);
        assert_eq!(read_all(of_two.path()).unwrap(), 1, "a rank of two holds half");
    }

    /// A reduce-scatter's result (format 1.8) is this rank's block of a sum: it carries a shard,
    /// no `collective`, and one input of the whole's shape recorded before it; a 1.7 file has none.
    #[test]
    fn a_reduce_scatter_is_a_block_of_the_sum_of_an_earlier_whole_contribution() {
        let values = |shape: &[u64]| Some(vec![0; 4 * shape.iter().product::<u64>() as usize]);
        let share = TensorRecord { name: "g.local".into(), ..tensor(vec![4, 2], values(&[4, 2]), false) };
        let block =
            |whole: Vec<u64>, reduce_scatter: Option<&str>, collective: Option<&str>, inputs: &[&str]| TensorRecord {
                name: "g".into(),
                inputs: inputs.iter().map(|s| s.to_string()).collect(),
                collective: collective.map(str::to_string),
                reduce_scatter: reduce_scatter.map(str::to_string),
                shard: Some(crate::ShardOf { offset: vec![2, 0], whole }),
                ..tensor(vec![2, 2], values(&[2, 2]), false)
            };
        // The block of a rank of two.
        let rank = crate::schema::Distributed {
            rank: 0,
            world_size: 2,
            backend: "file".into(),
            backend_version: String::new(),
        };
        let header = || header_of(Some(rank.clone()));
        let step = |tensors: Vec<TensorRecord>| {
            let record = StepRecord { step: 0, payload: None, tensors, no_gradient: Vec::new() };
            rmp_serde::to_vec_named(&Record::Step(record)).unwrap()
        };
        let good = block(vec![4, 2], Some(format::REDUCE_SCATTER_SUM), None, &["g.local"]);
        assert_eq!(read_all(trace_with(&[header(), step(vec![share.clone(), good.clone()])]).path()).unwrap(), 1);
        assert_eq!(good.summed_from(), Some("g.local"));
        let unsharded = TensorRecord { shard: None, ..good.clone() };
        let cases = [
            (vec![share.clone(), block(vec![4, 2], Some("max"), None, &["g.local"])], "unknown reduce-scatter `max`"),
            (vec![share.clone(), unsharded], "has no `shard`"),
            (
                vec![share.clone(), block(vec![4, 2], Some("sum"), Some(ALL_REDUCE_SUM), &["g.local"])],
                "carries `collective` and `reduce_scatter`",
            ),
            (
                vec![share.clone(), block(vec![6, 2], Some("sum"), None, &["g.local"])],
                "is F32 [4, 2], the sum F32 [6, 2]",
            ),
            (vec![good.clone(), share.clone()], "not recorded earlier"),
            (vec![share.clone(), block(vec![4, 2], Some("sum"), None, &[])], "names 0"),
        ];
        for (tensors, expected) in cases {
            let err = read_all(trace_with(&[header(), step(tensors)]).path()).unwrap_err().to_string();
            assert!(err.contains("corrupt") && err.contains(expected), "expected `{expected}`: {err}");
        }
        let v1_7 = FormatVersion { major: 1, minor: 7 };
        let old = rmp_serde::to_vec_named(&Record::Header(Box::new(Header {
            format: v1_7,
            distributed: Some(rank.clone()),
            ..plain_header()
        })))
        .unwrap();
        let err = read_all(trace_in_version(v1_7, &[old, step(vec![share, good])]).path()).unwrap_err().to_string();
        assert!(err.contains("`reduce_scatter` is a key of format 1.8"), "{err}");
    }

    /// A buffer (format 1.9) reads as one in a file that declares 1.9 or later, and is refused
    /// in an older one, whose readers would take it for a kind they do not know.
    #[test]
    fn a_buffer_is_a_kind_of_format_1_9() {
        let buffer = TensorRecord {
            name: "bn.running_mean".into(),
            kind: crate::TensorKind::Buffer,
            ..tensor(vec![2], Some(vec![0; 8]), false)
        };
        let record = |version: FormatVersion| {
            let header = Header { format: version, ..plain_header() };
            let header = rmp_serde::to_vec_named(&Record::Header(Box::new(header))).unwrap();
            trace_in_version(version, &[header, step_with(buffer.clone(), None)])
        };
        for version in [CURRENT_FORMAT, format::XXH3_FORMAT] {
            let mut reader = TraceReader::open(record(version).path()).unwrap();
            let step = reader.next_step().unwrap().expect("a step");
            assert_eq!(step.tensors[0].kind, crate::TensorKind::Buffer, "in {version}");
        }
        let v1_8 = FormatVersion { major: 1, minor: 8 };
        let err = read_all(record(v1_8).path()).unwrap_err().to_string();
        assert!(
            err.contains("corrupt") && err.contains("the kind `buffer` is of format 1.9, but the file declares 1.8"),
            "{err}"
        );
    }

    /// Optimizer state and RNG fingerprints (format 1.10, and 2.1 in the 2.x line) read as
    /// such in a file that declares those versions, and are refused in 1.9 and 2.0 files.
    #[test]
    fn optimizer_and_rng_state_are_kinds_of_format_1_10_and_2_1() {
        for kind in [crate::TensorKind::OptimizerState, crate::TensorKind::RngState] {
            let state = TensorRecord { name: "state".into(), kind, ..tensor(vec![2], Some(vec![0; 8]), false) };
            let record = |version: FormatVersion| {
                let header = Header { format: version, ..plain_header() };
                let header = rmp_serde::to_vec_named(&Record::Header(Box::new(header))).unwrap();
                trace_in_version(version, &[header, step_with(state.clone(), None)])
            };
            for version in [CURRENT_FORMAT, format::XXH3_FORMAT] {
                let mut reader = TraceReader::open(record(version).path()).unwrap();
                let step = reader.next_step().unwrap().expect("a step");
                assert_eq!(step.tensors[0].kind, kind, "in {version}");
            }
            for (major, minor) in [(1, 9), (2, 0)] {
                let err = read_all(record(FormatVersion { major, minor }).path()).unwrap_err().to_string();
                let expected = format!(
                    "the kind `{kind}` is of format 1.10 (2.1 under xxh3-1k), but the file declares {major}.{minor}"
                );
                assert!(err.contains("corrupt") && err.contains(&expected), "{err}");
            }
        }
    }

    /// A view (format 1.5) is read only as what it claims: a node's view of an earlier tensor
    /// of its step, within it, with the hash derived from it; its values are gathered from the
    /// owner's through its layout.
    #[test]
    fn a_view_reads_as_its_owners_values_through_its_layout_and_nothing_else() {
        use crate::schema::ViewOf;
        use crate::view::view_hash;
        let owner = TensorRecord {
            inline: Some((0..6u32).flat_map(|v| (v as f32).to_le_bytes()).collect()),
            ..TensorRecord::of_bytes(
                "w",
                crate::TensorKind::Weight,
                DType::F32,
                vec![2, 3],
                &(0..6u32).flat_map(|v| (v as f32).to_le_bytes()).collect::<Vec<u8>>(),
            )
        };
        let view_of = |of: &str, offset: u64, strides: Vec<u64>, shape: Vec<u64>, owner_hash| {
            let hash = view_hash(DType::F32, &shape, &owner_hash, offset, &strides);
            let view = Some(ViewOf { of: of.into(), offset, strides });
            TensorRecord { name: "w.t".into(), node: Some(3), hash, view, ..tensor(shape, None, false) }
        };
        let transposed = view_of("w", 0, vec![1, 3], vec![3, 2], owner.hash);
        let step = |tensors: Vec<TensorRecord>| {
            let record = StepRecord { step: 0, payload: None, tensors, no_gradient: Vec::new() };
            rmp_serde::to_vec_named(&Record::Step(record)).unwrap()
        };
        let dir = trace_with(&[header(), step(vec![owner.clone(), transposed.clone()])]);
        let mut reader = TraceReader::open(dir.path()).unwrap();
        let read = reader.next_step().unwrap().unwrap();
        assert!(reader.has_values(&read, &read.tensors[1]));
        let values = reader.values(&read, &read.tensors[1]).unwrap().unwrap();
        let floats: Vec<f32> = values.bytes.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(floats, [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        let cases = [
            (vec![transposed.clone(), owner.clone()], "not recorded earlier"),
            (vec![owner.clone(), view_of("w", 1, vec![1, 3], vec![3, 2], owner.hash)], "reads past the 6 elements"),
            (vec![owner.clone(), TensorRecord { hash: owner.hash, ..transposed.clone() }], "hash is not the hash"),
            (vec![owner.clone(), TensorRecord { node: None, ..transposed.clone() }], "has no `node`"),
            (vec![owner.clone(), TensorRecord { inline: Some(vec![0; 24]), ..transposed.clone() }], "no values"),
        ];
        for (tensors, expected) in cases {
            let err = error_reading(&[header(), step(tensors)]);
            assert!(err.contains("corrupt") && err.contains(expected), "expected `{expected}`: {err}");
        }
        // A file that declares 1.4 has no views.
        let v1_4 = FormatVersion { major: 1, minor: 4 };
        let old = Header { format: v1_4, ..plain_header() };
        let old = rmp_serde::to_vec_named(&Record::Header(Box::new(old))).unwrap();
        let records = [old, step(vec![owner, transposed])];
        let err = read_all(trace_in_version(v1_4, &records).path()).unwrap_err().to_string();
        assert!(err.contains("`view` is a key of format 1.5"), "{err}");
    }

    #[test]
    fn an_xxh3_1k_trace_is_written_as_2_0_and_its_values_checked_with_its_data_hash() {
        use crate::hash::DataHash;
        use crate::writer::{Payload, StepTensor, TraceWriter};
        let values: Vec<u8> = (0..3000u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let shape = vec![3000u64];
        let record = |kind: DataHash, name: &str| StepTensor {
            record: TensorRecord {
                name: name.into(),
                hash: kind.tensor_hash(DType::F32, &shape, &values),
                in_payload: true,
                ..tensor(shape.clone(), None, false)
            },
            payload: Some(Payload::Bytes(values.clone())),
        };
        let write = |header_kind: DataHash, record_kind: DataHash| {
            let dir = tempfile::tempdir().unwrap();
            let header = Header { data_hash: header_kind, ..plain_header() };
            let mut w = TraceWriter::create(dir.path(), &header, false).unwrap();
            w.write_step(0, vec![record(record_kind, "w")]).unwrap();
            w.finish().unwrap();
            dir
        };
        let xx = write(DataHash::Xxh3Chunks, DataHash::Xxh3Chunks);
        let reader = TraceReader::open(xx.path()).unwrap();
        assert_eq!(reader.version(), format::XXH3_FORMAT);
        assert_eq!(reader.header().format, reader.version(), "the header says what the preamble says");
        assert_eq!(reader.header().data_hash, DataHash::Xxh3Chunks);
        assert_eq!(read_all(xx.path()).unwrap(), 1, "values verified with xxh3-1k");
        // A BLAKE3 hash in an xxh3-1k trace does not match its values, nor the reverse.
        for (header_kind, record_kind) in
            [(DataHash::Xxh3Chunks, DataHash::Blake3), (DataHash::Blake3, DataHash::Xxh3Chunks)]
        {
            let err = read_all(write(header_kind, record_kind).path()).unwrap_err().to_string();
            assert!(err.contains("do not match the recorded hash"), "{header_kind} trace, {record_kind} hash: {err}");
        }
        let b3 = write(DataHash::Blake3, DataHash::Blake3);
        let plain = TraceReader::open(b3.path()).unwrap();
        assert_eq!(plain.version(), CURRENT_FORMAT, "blake3 traces stay 1.x");
        let refused = reader.comparable_with(&plain).unwrap_err().to_string();
        assert!(
            refused.contains(&format!(
                "{} hashes its tensors with xxh3-1k and {} with blake3",
                xx.path().display(),
                b3.path().display()
            )),
            "{refused}"
        );
        assert!(reader.comparable_with(&TraceReader::open(xx.path()).unwrap()).is_ok());
    }

    #[test]
    fn a_data_hash_in_a_1_x_trace_or_of_an_unknown_name_is_corrupt() {
        let h = Header { data_hash: crate::hash::DataHash::Xxh3Chunks, ..plain_header() };
        let in_1_x = rmp_serde::to_vec_named(&Record::Header(Box::new(h))).unwrap();
        let err = TraceReader::open(trace_with(&[in_1_x]).path()).err().expect("refused").to_string();
        assert!(
            err.contains(&format!(
                "`data_hash` other than blake3 is a key of format 2.0, but the file declares {CURRENT_FORMAT}"
            )),
            "{err}"
        );
        let v2 = FormatVersion { major: 2, minor: 0 };
        let h = Header { format: v2, data_hash: crate::hash::DataHash::Xxh3Chunks, ..plain_header() };
        let renamed = rmp_serde::to_vec_named(&Record::Header(Box::new(h))).unwrap();
        let at = renamed.windows(7).position(|w| w == b"xxh3-1k").unwrap();
        let mut unknown = renamed.clone();
        unknown[at..at + 7].copy_from_slice(b"xxh3-2k");
        let err = TraceReader::open(trace_in_version(v2, &[unknown]).path()).err().expect("refused").to_string();
        assert!(err.contains("corrupt") && err.contains("xxh3-2k"), "{err}");
        assert!(TraceReader::open(trace_in_version(v2, &[renamed]).path()).is_ok());
        let v3 = FormatVersion { major: 3, minor: 0 };
        let err = TraceReader::open(trace_in_version(v3, &[]).path()).err().expect("refused").to_string();
        assert!(
            err.contains("uses trace format 3.0") && err.contains("reads only 1.x and 2.x; upgrade repro"),
            "{err}"
        );
    }

    #[test]
    fn a_key_newer_than_the_declared_version_is_corrupt_not_ignored() {
        // Read by 1.1's rules, a `stopped` footer would be ignored and the trace read as
        // finished: a verdict changed by a key the file had no right to carry.
        let v = |minor| FormatVersion { major: 1, minor };
        let header_in = |version: FormatVersion, distributed| {
            let h = Header { format: version, distributed, ..plain_header() };
            rmp_serde::to_vec_named(&Record::Header(Box::new(h))).unwrap()
        };
        let footer = |stopped: Option<&str>| {
            rmp_serde::to_vec_named(&Record::Footer(Footer { steps: 0, stopped: stopped.map(str::to_string) })).unwrap()
        };
        let err = |version, records: &[Vec<u8>]| {
            read_all(trace_in_version(version, records).path()).err().map(|e| e.to_string()).unwrap_or_default()
        };
        let stopped = err(v(1), &[header_in(v(1), None), footer(Some("budget"))]);
        assert!(stopped.contains("`stopped` is a key of format 1.2, but the file declares 1.1"), "{stopped}");
        let rank = crate::schema::Distributed {
            rank: 0,
            world_size: 1,
            backend: "file".into(),
            backend_version: String::new(),
        };
        let distributed = err(v(2), &[header_in(v(2), Some(rank.clone()))]);
        assert!(distributed.contains("`distributed` is a key of format 1.3"), "{distributed}");
        // The capture ladder's levels and the policy `first` (1.9).
        let with_capture = |version: FormatVersion, capture: crate::CapturePolicy| {
            let h = Header { format: version, capture, ..plain_header() };
            rmp_serde::to_vec_named(&Record::Header(Box::new(h))).unwrap()
        };
        let levels = crate::CapturePolicy { ops: Some(crate::FullCapture::Steps(vec![3])), ..Default::default() };
        let early = err(v(8), &[with_capture(v(8), levels.clone())]);
        assert!(early.contains("`capture.modules` or `capture.ops` is a key of format 1.9"), "{early}");
        assert_eq!(err(v(9), &[with_capture(v(9), levels)]), "");
        let first = crate::CapturePolicy { full: crate::FullCapture::First, ..Default::default() };
        let early = err(v(8), &[with_capture(v(8), first.clone())]);
        assert!(early.contains("the capture policy `first` is a key of format 1.9"), "{early}");
        assert_eq!(err(v(9), &[with_capture(v(9), first)]), "");
        let node = TensorRecord { node: Some(0), ..tensor(vec![1], Some(vec![0; 4]), false) };
        let node = err(v(1), &[header_in(v(1), None), step_with(node, None)]);
        assert!(node.contains("`node` is a key of format 1.2"), "{node}");
        let phase = TensorRecord { phase: Some(crate::Phase::Forward), ..tensor(vec![1], Some(vec![0; 4]), false) };
        let phase = err(v(0), &[header_in(v(0), None), step_with(phase, None)]);
        assert!(phase.contains("is a key of format 1.1"), "{phase}");
        let sourced = |node| TensorRecord {
            node,
            source: Some("src/model.rs:42".into()),
            ..tensor(vec![1], Some(vec![0; 4]), false)
        };
        let source = err(v(3), &[header_in(v(3), None), step_with(sourced(Some(0)), None)]);
        assert!(source.contains("`source` is a key of format 1.4"), "{source}");
        // Before 1.6 a source is a captured node's; from 1.6 any record's; always of bounded
        // length.
        let stray = err(v(5), &[header_in(v(5), None), step_with(sourced(None), None)]);
        assert!(stray.contains("`source` is a captured node's before format 1.6"), "{stray}");
        assert_eq!(err(v(6), &[header_in(v(6), None), step_with(sourced(None), None)]), "");
        // A shard (1.7) must lie in its whole, and a file before 1.7 has none; it is a block of a
        // rank of several (a trace of one device holds each whole, below).
        let sharded = |offset| TensorRecord {
            shard: Some(crate::ShardOf { whole: vec![3], offset: vec![offset] }),
            ..tensor(vec![1], Some(vec![0; 4]), false)
        };
        let rank_of_3 = || Some(crate::schema::Distributed { world_size: 3, ..rank.clone() });
        let early = err(v(6), &[header_in(v(6), rank_of_3()), step_with(sharded(2), None)]);
        assert!(early.contains("`shard` is a key of format 1.7"), "{early}");
        assert_eq!(err(v(7), &[header_in(v(7), rank_of_3()), step_with(sharded(2), None)]), "");
        let past = err(v(7), &[header_in(v(7), rank_of_3()), step_with(sharded(3), None)]);
        assert!(past.contains("corrupt") && past.contains("past the whole"), "{past}");
        let long = TensorRecord { source: Some("x".repeat(5000)), ..sourced(Some(0)) };
        let long = err(v(4), &[header_in(v(4), None), step_with(long, None)]);
        assert!(long.contains("`source` is 5000 bytes"), "{long}");
        // The same keys in files that declare their version are read.
        assert_eq!(err(v(2), &[header_in(v(2), None), footer(Some("budget"))]), "");
        assert_eq!(err(v(4), &[header_in(v(4), None), step_with(sourced(Some(0)), None)]), "");
    }

    #[test]
    fn payloads_must_be_regular_files_inside_the_trace() {
        let dir =
            trace_with(&[header(), step_with(tensor(vec![2], None, true), Some("tensors/step-00000000.safetensors"))]);
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("step-00000000.safetensors"), b"whatever").unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("tensors")).unwrap();
        let err = read_all(dir.path()).unwrap_err().to_string();
        assert!(err.contains("must not be symbolic links"), "{err}");

        // A FIFO where the payload should be is refused, not opened (which would block forever).
        let dir =
            trace_with(&[header(), step_with(tensor(vec![2], None, true), Some("tensors/step-00000000.safetensors"))]);
        fs::create_dir_all(dir.path().join("tensors")).unwrap();
        let fifo =
            std::ffi::CString::new(dir.path().join("tensors/step-00000000.safetensors").to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let err = read_all(dir.path()).unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
    }

    #[test]
    fn a_lone_record_file_keeps_hashes_of_payload_tensors_and_no_values() {
        let dir =
            trace_with(&[header(), step_with(tensor(vec![2], None, true), Some("tensors/step-00000000.safetensors"))]);
        let mut reader = TraceReader::open(dir.path().join(RECORDS_FILE)).unwrap();
        assert!(reader.records_only(), "no tensors/ beside it: a lone record file");
        let step = reader.next_step().unwrap().unwrap();
        assert!(reader.values(&step, &step.tensors[0]).unwrap().is_none(), "its payload stayed behind");
        // Beside a tensors/ directory, the same file opens its whole trace, which must then
        // hold the payload.
        std::fs::create_dir(dir.path().join(format::TENSORS_DIR)).unwrap();
        let reader = TraceReader::open(dir.path().join(RECORDS_FILE)).unwrap();
        assert!(!reader.records_only());
        let err = read_all(&dir.path().join(RECORDS_FILE)).unwrap_err().to_string();
        assert!(err.contains("step-00000000.safetensors"), "{err}");
    }

    #[test]
    fn deeply_nested_msgpack_is_refused_not_overflowing_the_stack() {
        // 100,000 nested one-element arrays.
        let mut payload = vec![0x91u8; 100_000];
        payload.push(0xc0);
        let dir = trace_with(&[payload]);
        let err = read_all(dir.path()).unwrap_err().to_string();
        assert!(err.contains("corrupt"), "{err}");
    }

    #[test]
    fn random_well_framed_records_never_panic() {
        let mut state = 0x2545F4914F6CDD1Du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        // Fragments of real msgpack records, recombined at random with random bytes.
        let header = rmp_serde::to_vec_named(&Record::Footer(Footer { steps: 0, stopped: None })).unwrap();
        for _ in 0..2000 {
            let mut records = Vec::new();
            for _ in 0..(next() % 4) {
                let len = (next() % 64) as usize;
                let mut r: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                if next() % 2 == 0 {
                    let cut = (next() as usize) % (header.len() + 1);
                    r.splice(0..0, header[..cut].iter().copied());
                }
                records.push(r);
            }
            let dir = trace_with(&records);
            // Any outcome but a panic (or an unbounded allocation) is acceptable here.
            let _ = read_all(dir.path());
        }
    }
}
