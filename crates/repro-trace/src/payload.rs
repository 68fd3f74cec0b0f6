//! Payload files (`tensors/step-N.safetensors`, docs/trace-format.md section 4): writing a
//! step's full values into one safetensors file.
//!
//! A [`PayloadFile`] is written under a temporary name: values are appended to its data region
//! as they come, behind room left for the safetensors header, and [`PayloadFile::finish`]
//! writes the header once every value's name is known, pads it with spaces to fill the room
//! (or moves the data up when the room is too small), syncs the file and renames it into
//! place. So values read back from a GPU can go to disk while the step's others are still on
//! their way, and the host never holds the whole step at once. A writer that has every value in
//! hand appends them in the order the `safetensors` library writes them, with the exact room,
//! which gives the same bytes as that library.

use crate::dtype::DType;
use crate::error::TraceError;
use crate::format;
use std::fs::{self, File, OpenOptions};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The safetensors limit on a header's size: larger ones are refused by its readers.
const MAX_HEADER_LEN: u64 = 100_000_000;

/// Bytes of the u64le header length that opens a safetensors file.
const LENGTH_LEN: u64 = 8;

/// Data bytes moved at a time when the header outgrows its room.
const MOVE_PIECE: u64 = 16 << 20;

/// One tensor of a payload file: its name, dtype, shape and where its bytes are in the data
/// region (offsets from the first data byte, as safetensors counts them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadEntry {
    /// The tensor record's name.
    pub name: String,
    /// Its dtype.
    pub dtype: DType,
    /// Its shape.
    pub shape: Vec<u64>,
    /// Its bytes in the data region.
    pub data: Range<u64>,
}

/// A step's payload file being written (see the module documentation).
pub struct PayloadFile {
    step: u64,
    tmp: PathBuf,
    file: File,
    /// Bytes before the data region: the header length and the header's room.
    data_start: u64,
    /// Data bytes appended so far.
    data_len: u64,
    /// Set once renamed into place; until then, dropping the file deletes it.
    finished: bool,
}

impl PayloadFile {
    /// Starts step `step`'s payload file in the trace directory `dir`, leaving `header_room`
    /// bytes for the header (rounded up to a multiple of 8, as safetensors aligns its data).
    pub fn create(dir: &Path, step: u64, header_room: u64) -> Result<Self, TraceError> {
        let path = dir.join(format::payload_name(step));
        let tmp = path.with_extension("safetensors.tmp");
        let parent = path.parent().expect("payload names have a directory");
        fs::create_dir_all(parent).map_err(TraceError::io(parent))?;
        // A link left in the temporary file's place is removed, never written through.
        remove_stale(&tmp)?;
        let file =
            OpenOptions::new().read(true).write(true).create_new(true).open(&tmp).map_err(TraceError::io(&tmp))?;
        let room = header_room.min(MAX_HEADER_LEN).next_multiple_of(8);
        Ok(PayloadFile { step, tmp, file, data_start: LENGTH_LEN + room, data_len: 0, finished: false })
    }

    /// The step whose values the file holds.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Data bytes appended so far.
    pub fn data_len(&self) -> u64 {
        self.data_len
    }

    /// Appends one tensor's bytes to the data region; returns where they are in it.
    pub fn append(&mut self, bytes: &[u8]) -> Result<Range<u64>, TraceError> {
        let data = self.data_len..self.data_len + bytes.len() as u64;
        self.file.write_all_at(bytes, self.data_start + data.start).map_err(TraceError::io(&self.tmp))?;
        start_writeback(&self.file, self.data_start + data.start, bytes.len() as u64);
        self.data_len = data.end;
        Ok(data)
    }

    /// Writes the header for `entries`, which must tile the data region (each tensor's bytes
    /// right after the one before, from the first data byte to the last, sized as its dtype
    /// and shape say), syncs the file and renames it into place. Returns its payload name.
    pub fn finish(mut self, mut entries: Vec<PayloadEntry>) -> Result<String, TraceError> {
        entries.sort_by_key(|e| e.data.start);
        let mut end = 0;
        for e in &entries {
            if e.data.start != end || e.data.end.checked_sub(e.data.start) != byte_len(e.dtype, &e.shape) {
                return Err(self.invalid(format!(
                    "tensor `{}` is not where its file says: bytes {:?} of the data, after byte {end}, for a {} tensor of shape {:?}",
                    e.name, e.data, e.dtype, e.shape
                )));
            }
            end = e.data.end;
        }
        if end != self.data_len {
            return Err(self.invalid(format!("{} bytes of data belong to no tensor", self.data_len - end)));
        }
        let mut header = header_bytes(&entries).map_err(|why| self.invalid(why))?;
        let room = self.data_start - LENGTH_LEN;
        if header.len() as u64 > room {
            let needed = LENGTH_LEN + header.len() as u64;
            self.move_data_to(needed)?;
        }
        header.resize((self.data_start - LENGTH_LEN) as usize, b' ');
        let mut front = (header.len() as u64).to_le_bytes().to_vec();
        front.extend_from_slice(&header);
        self.file.write_all_at(&front, 0).map_err(TraceError::io(&self.tmp))?;
        // Traces are meant to be shared: readable by all, whatever the process's umask.
        {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&self.tmp, fs::Permissions::from_mode(0o644)).map_err(TraceError::io(&self.tmp))?;
        }
        self.file.sync_all().map_err(TraceError::io(&self.tmp))?;
        let name = format::payload_name(self.step);
        let path = self.tmp.with_extension("");
        fs::rename(&self.tmp, &path).map_err(TraceError::io(&path))?;
        self.finished = true;
        Ok(name)
    }

    /// Moves the data region up so that it starts at `start` (later than now), from its last
    /// piece to its first, so that no piece overwrites data not yet moved.
    fn move_data_to(&mut self, start: u64) -> Result<(), TraceError> {
        let by = start - self.data_start;
        let mut piece = vec![0u8; MOVE_PIECE.min(self.data_len) as usize];
        let mut end = self.data_len;
        while end > 0 {
            let from = end.saturating_sub(MOVE_PIECE);
            let bytes = &mut piece[..(end - from) as usize];
            self.file.read_exact_at(bytes, self.data_start + from).map_err(TraceError::io(&self.tmp))?;
            self.file.write_all_at(bytes, self.data_start + from + by).map_err(TraceError::io(&self.tmp))?;
            end = from;
        }
        self.data_start = start;
        Ok(())
    }

    fn invalid(&self, why: String) -> TraceError {
        TraceError::InvalidRecord { path: self.tmp.clone(), reason: format!("payload of step {}: {why}", self.step) }
    }
}

/// Starts writing `len` bytes of `file` from `offset` to disk without waiting for them: the
/// disk then works while later values arrive, rather than all at once when the file is synced
/// (the kernel otherwise holds a step's gigabytes in its cache until then). A hint only: the
/// sync in `finish` is what reports a failed write.
#[cfg(target_os = "linux")]
fn start_writeback(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else { return };
    // SAFETY: a system call on a descriptor `file` keeps open; it touches none of our memory.
    unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE) };
}

#[cfg(not(target_os = "linux"))]
fn start_writeback(_: &File, _: u64, _: u64) {}

/// Unfinished (an error, a failed step), the temporary file is deleted: no record names it.
impl Drop for PayloadFile {
    fn drop(&mut self) {
        if !self.finished {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// The safetensors header of `entries` (in data order): compact JSON, as the `safetensors`
/// library writes it, padded with spaces to a multiple of 8 bytes.
pub fn header_bytes(entries: &[PayloadEntry]) -> Result<Vec<u8>, String> {
    let mut names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    names.sort_unstable();
    if let Some(twice) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("tensor `{}` is in it twice", twice[0]));
    }
    let infos = entries
        .iter()
        .map(|e| {
            let info = safetensors::tensor::TensorInfo {
                dtype: safetensors_dtype(e.dtype),
                shape: e.shape.iter().map(|&d| d as usize).collect(),
                data_offsets: (e.data.start as usize, e.data.end as usize),
            };
            (e.name.clone(), info)
        })
        .collect();
    let metadata = safetensors::tensor::Metadata::new(None, infos).map_err(|e| format!("no valid header: {e}"))?;
    let mut header = serde_json::to_string(&metadata).map_err(|e| format!("no valid header: {e}"))?.into_bytes();
    header.resize(header.len().next_multiple_of(8), b' ');
    if header.len() as u64 > MAX_HEADER_LEN {
        return Err(format!(
            "its header would take {} bytes, above safetensors' limit of {MAX_HEADER_LEN}",
            header.len()
        ));
    }
    Ok(header)
}

/// At least the header room that tensors of these names, dtypes and shapes need, in any order
/// and at any offsets (a bound, from the longest each part of an entry can be).
pub fn header_room_bound<'a>(tensors: impl IntoIterator<Item = (&'a str, &'a [u64])>) -> u64 {
    // `{"`, `":{"dtype":"BF16","shape":[`, `],"data_offsets":[`, `,`, `]},` and `}`, plus two
    // offsets of up to 20 digits each.
    const FIXED: u64 = 2 + 27 + 19 + 1 + 3 + 1 + 40;
    tensors
        .into_iter()
        // A name's characters take at most 6 bytes each in JSON (`\u001f`); a dimension up to
        // 20 digits and a comma.
        .map(|(name, shape)| FIXED + 6 * name.len() as u64 + 21 * shape.len() as u64)
        .sum::<u64>()
        .next_multiple_of(8)
}

/// The order the `safetensors` library writes tensors in: by descending dtype, then by name.
pub fn safetensors_order(a: (&str, DType), b: (&str, DType)) -> std::cmp::Ordering {
    safetensors_dtype(b.1).cmp(&safetensors_dtype(a.1)).then(a.0.cmp(b.0))
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

/// Bytes of a tensor of `dtype` and `shape`; `None` when that overflows.
fn byte_len(dtype: DType, shape: &[u64]) -> Option<u64> {
    shape.iter().try_fold(dtype.size_in_bytes() as u64, |acc, &d| acc.checked_mul(d))
}

/// Removes `path` if something is there (a link itself, not what it points to).
pub(crate) fn remove_stale(path: &Path) -> Result<(), TraceError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(TraceError::Io { path: path.to_path_buf(), source: e })
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, dtype: DType, shape: &[u64], start: u64) -> PayloadEntry {
        let len = byte_len(dtype, shape).unwrap();
        PayloadEntry { name: name.into(), dtype, shape: shape.to_vec(), data: start..start + len }
    }

    fn values(e: &PayloadEntry) -> Vec<u8> {
        (e.data.start..e.data.end).map(|i| (i * 7 + e.name.len() as u64) as u8).collect()
    }

    /// Tensors of several dtypes and names, in the order the `safetensors` library writes
    /// them, with offsets to match.
    fn in_library_order() -> Vec<PayloadEntry> {
        let mut tensors = vec![
            ("b", DType::F32, vec![3, 5]),
            ("a", DType::BF16, vec![7]),
            ("c\"quoted\\", DType::U8, vec![9]),
            ("d", DType::F32, vec![2, 2]),
            ("z", DType::I64, vec![4]),
            ("ü-name", DType::F16, vec![1, 3]),
        ];
        tensors.sort_by(|a, b| safetensors_order((a.0, a.1), (b.0, b.1)));
        let mut start = 0;
        tensors
            .into_iter()
            .map(|(name, dtype, shape)| {
                let e = entry(name, dtype, &shape, start);
                start = e.data.end;
                e
            })
            .collect()
    }

    #[test]
    fn values_appended_in_library_order_with_the_exact_room_are_the_librarys_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let entries = in_library_order();
        let room = header_bytes(&entries).unwrap().len() as u64;
        let mut file = PayloadFile::create(dir.path(), 3, room).unwrap();
        for e in &entries {
            assert_eq!(file.append(&values(e)).unwrap(), e.data);
        }
        let name = file.finish(entries.clone()).unwrap();
        assert_eq!(name, format::payload_name(3));
        let written = fs::read(dir.path().join(&name)).unwrap();
        let data: Vec<Vec<u8>> = entries.iter().map(values).collect();
        let views = entries.iter().zip(&data).map(|(e, bytes)| {
            let shape = e.shape.iter().map(|&d| d as usize).collect();
            (e.name.clone(), safetensors::tensor::TensorView::new(safetensors_dtype(e.dtype), shape, bytes).unwrap())
        });
        assert_eq!(written, safetensors::serialize(views, None).unwrap());
        assert!(!dir.path().join(format::payload_name(3)).with_extension("safetensors.tmp").exists());
    }

    #[test]
    fn a_header_larger_than_its_room_moves_the_data_up_and_one_smaller_is_padded() {
        let entries = in_library_order();
        let exact = header_bytes(&entries).unwrap().len() as u64;
        // Values arrive in another order than the library's: reversed.
        let mut arrived = entries.clone();
        arrived.reverse();
        for room in [0, 8, exact - 8, exact, exact + 800] {
            let dir = tempfile::tempdir().unwrap();
            let mut file = PayloadFile::create(dir.path(), 0, room).unwrap();
            let placed: Vec<PayloadEntry> =
                arrived.iter().map(|e| PayloadEntry { data: file.append(&values(e)).unwrap(), ..e.clone() }).collect();
            let name = file.finish(placed.clone()).unwrap();
            let written = fs::read(dir.path().join(name)).unwrap();
            let read = safetensors::SafeTensors::deserialize(&written).unwrap();
            for e in &entries {
                let original = arrived.iter().find(|a| a.name == e.name).unwrap();
                assert_eq!(read.tensor(&e.name).unwrap().data(), &values(original)[..], "room {room}");
            }
            let header_len = u64::from_le_bytes(written[..8].try_into().unwrap());
            assert_eq!(header_len, room.max(exact).next_multiple_of(8), "room {room}");
        }
    }

    #[test]
    fn entries_that_do_not_tile_the_data_are_refused_and_leave_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let tmp = dir.path().join(format::payload_name(1)).with_extension("safetensors.tmp");
        type Spoil = Box<dyn Fn(&mut Vec<PayloadEntry>)>;
        let cases: [(&str, Spoil); 5] = [
            ("gap", Box::new(|e| e[1].data = e[1].data.start + 1..e[1].data.end + 1)),
            ("wrong size", Box::new(|e| e[0].shape = vec![1])),
            ("unclaimed", Box::new(|e| drop(e.pop()))),
            ("overlap", Box::new(|e| e[1].data = e[0].data.clone())),
            ("twice", Box::new(|e| e[1].name = e[0].name.clone())),
        ];
        for (what, spoil) in cases {
            let mut file = PayloadFile::create(dir.path(), 1, 0).unwrap();
            let mut entries = in_library_order();
            for e in &entries {
                file.append(&values(e)).unwrap();
            }
            spoil(&mut entries);
            let err = file.finish(entries).unwrap_err().to_string();
            assert!(err.contains("payload of step 1"), "{what}: {err}");
            assert!(!tmp.exists(), "{what}");
            assert!(!dir.path().join(format::payload_name(1)).exists(), "{what}");
        }
    }

    #[test]
    fn the_room_bound_holds_for_any_offsets() {
        let entries = in_library_order();
        let bound = header_room_bound(entries.iter().map(|e| (e.name.as_str(), e.shape.as_slice())));
        let far: Vec<PayloadEntry> = entries
            .iter()
            .map(|e| PayloadEntry { data: e.data.start + (1 << 60)..e.data.end + (1 << 60), ..e.clone() })
            .collect();
        // Offsets that large do not tile from 0, so the header is made by hand from the library's
        // form, as long as it can be.
        let longest: usize = far
            .iter()
            .map(|e| {
                format!(
                    "\"{}\":{{\"dtype\":\"BF16\",\"shape\":{:?},\"data_offsets\":[{},{}]}},",
                    e.name.escape_default(),
                    e.shape,
                    e.data.start,
                    e.data.end
                )
                .len()
            })
            .sum::<usize>()
            + 2;
        assert!(bound >= longest as u64, "{bound} < {longest}");
        assert!(bound >= header_bytes(&entries).unwrap().len() as u64);
    }
}
