//! A step's full values on their way to its payload file while the step is still being read:
//! each value read back from a GPU goes to a thread of its own that appends it to the file
//! (`trace::PayloadFile`) and hashes it, so the disk works while the training thread reads the
//! step's next values, and the host lets go of each value once it is written. The trace writer
//! finishes the file (its header, from the step's records) when it writes the step.
//!
//! Values wait for the disk in host memory, at most [`MAX_IN_FLIGHT`] bytes of them (or one
//! value, when it alone is larger): a training thread that reads a step back faster than the
//! disk writes it waits there rather than holding the whole step.
//!
//! A failed write is not reported where the value was handed over (a device read, deep in a
//! flush) but when the step is written: `finish` returns it, and the step fails there.

use super::error::RecordError;
use crate::trace::payload::PayloadFile;
use crate::trace::TraceError;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Header room for a step when no step before it says how much it needs: enough for about
/// 4,000 tensors of typical names; a larger header moves the data up once it is written.
pub(crate) const DEFAULT_HEADER_ROOM: u64 = 1 << 20;

/// Bytes of values that may wait for the disk in host memory, per step.
pub(crate) const MAX_IN_FLIGHT: u64 = 4 << 30;

/// A value handed to the stream: where it went, or, if the step does not store it in its
/// payload file (small enough to be kept inline), its bytes back.
#[derive(Debug)]
// Only CUDA builds read values back from a device.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub enum Kept {
    /// The bytes, kept in memory.
    Bytes(Vec<u8>),
    /// Written (or being written) to these bytes of the payload file's data.
    InFile(Range<u64>),
}

/// What a stream wrote: its file, and the BLAKE3 hash of each value's bytes by where the
/// value starts in the data.
pub(crate) struct Written {
    pub(crate) file: PayloadFile,
    pub(crate) hashes: BTreeMap<u64, [u8; 32]>,
}

/// One step's payload stream, shared by the step's device reads (see the module documentation).
pub struct PayloadStream {
    dir: PathBuf,
    step: u64,
    header_room: u64,
    /// Values this small or smaller are stored inline, not in the file: they are given back.
    inline_max: u64,
    state: Mutex<State>,
    in_flight: Arc<InFlight>,
}

/// Bytes handed over and not written yet, and the bound on them.
struct InFlight {
    bytes: Mutex<u64>,
    written: Condvar,
    limit: u64,
}

impl InFlight {
    /// Waits until `len` more bytes fit the bound (or nothing waits), then counts them.
    fn admit(&self, len: u64) {
        let mut bytes = self.bytes.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        while *bytes > 0 && *bytes + len > self.limit {
            bytes = self.written.wait(bytes).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        *bytes += len;
    }

    /// `len` bytes are written (or dropped): no longer waiting.
    fn release(&self, len: u64) {
        let mut bytes = self.bytes.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        *bytes -= len;
        self.written.notify_all();
    }
}

enum State {
    /// Nothing handed over yet: no file, no thread.
    Idle,
    Sending {
        /// Data bytes handed over so far: where the next value goes.
        next: u64,
        queue: Sender<(Range<u64>, Vec<u8>)>,
        thread: JoinHandle<Result<Written, TraceError>>,
    },
    /// Creating the file failed: every value handed over is dropped, and `finish` says why.
    Failed(TraceError),
    Finished,
}

impl PayloadStream {
    /// A stream for step `step` of the trace in `dir`; the file is created when the first value
    /// comes, with `header_room` bytes before its data.
    pub(crate) fn new(dir: PathBuf, step: u64, header_room: u64, inline_max: u64) -> Self {
        let in_flight = InFlight { bytes: Mutex::new(0), written: Condvar::new(), limit: MAX_IN_FLIGHT };
        PayloadStream {
            dir,
            step,
            header_room,
            inline_max,
            state: Mutex::new(State::Idle),
            in_flight: Arc::new(in_flight),
        }
    }

    /// Hands `bytes` (one tensor's canonical values) over to be written, unless they are stored
    /// inline; waits for the disk only while [`MAX_IN_FLIGHT`] bytes wait for it already.
    // Only device reads hand values over, and only CUDA builds read any.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub fn take(&self, bytes: Vec<u8>) -> Kept {
        if bytes.len() as u64 <= self.inline_max {
            return Kept::Bytes(bytes);
        }
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if matches!(*state, State::Idle) {
            *state = match PayloadFile::create(&self.dir, self.step, self.header_room) {
                Ok(file) => {
                    let (queue, values) = channel();
                    let in_flight = self.in_flight.clone();
                    let thread = std::thread::Builder::new()
                        .name("repro-payload".into())
                        .spawn(move || write_values(file, values, &in_flight))
                        .expect("the OS starts a thread");
                    State::Sending { next: 0, queue, thread }
                }
                Err(e) => State::Failed(e),
            };
        }
        let len = bytes.len() as u64;
        match &mut *state {
            State::Sending { next, queue, .. } => {
                let data = *next..*next + len;
                *next = data.end;
                self.in_flight.admit(len);
                // A thread that stopped has failed; `finish` reports it.
                if queue.send((data.clone(), bytes)).is_err() {
                    self.in_flight.release(len);
                }
                Kept::InFile(data)
            }
            // The step fails when it is written; the value's place is still given.
            State::Failed(_) | State::Finished | State::Idle => Kept::InFile(0..len),
        }
    }

    /// Waits for every value handed over to be written; returns the file and the values'
    /// hashes, or `None` when no value was handed over.
    pub(crate) fn finish(&self) -> Result<Option<Written>, RecordError> {
        let state = std::mem::replace(
            &mut *self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()),
            State::Finished,
        );
        match state {
            State::Idle => Ok(None),
            State::Sending { queue, thread, .. } => {
                drop(queue);
                match thread.join() {
                    Ok(written) => Ok(Some(written?)),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            State::Failed(e) => Err(e.into()),
            State::Finished => {
                Err(RecordError::Unsupported(format!("the payload stream of step {} was finished twice", self.step)))
            }
        }
    }
}

/// The stream's thread: appends each value to `file` in the order handed over, hashing it on a
/// second thread meanwhile. After a failed write it drops the values still coming (they must
/// leave `in_flight`, or the training thread would wait for them) and returns the error.
fn write_values(
    mut file: PayloadFile,
    values: Receiver<(Range<u64>, Vec<u8>)>,
    in_flight: &InFlight,
) -> Result<Written, TraceError> {
    let mut hashes = BTreeMap::new();
    let mut failed = None;
    for (data, bytes) in values {
        if failed.is_none() {
            let (hash, appended) = std::thread::scope(|s| {
                let hash = s.spawn(|| *blake3::hash(&bytes).as_bytes());
                let appended = file.append(&bytes);
                (hash.join().expect("hashing does not panic"), appended)
            });
            match appended {
                Ok(appended) => {
                    debug_assert_eq!(appended, data, "values are appended in the order their places were given");
                    hashes.insert(data.start, hash);
                }
                Err(e) => failed = Some(e),
            }
        }
        in_flight.release(bytes.len() as u64);
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(Written { file, hashes }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::fill::fill_records;
    use crate::record::tensor_bytes::DeviceResult;
    use crate::trace::dtype::DType;
    use crate::trace::{Header, StepTensor, TensorKind, TensorRecord, TraceReader, TraceWriter};

    fn values(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    /// A step whose large values stream to the file as they come and whose others come as
    /// bytes: read back, every value is the one handed over, and every hash is its own.
    #[test]
    fn streamed_values_read_back_with_their_hashes() {
        let dir = tempfile::tempdir().unwrap();
        let trace = dir.path().join("t");
        let mut writer = TraceWriter::create(&trace, &Header::of_producer("test"), false).unwrap();
        let inline_max = 64;
        // Sizes in f32 elements: inline, streamed, streamed, inline.
        let sizes = [4usize, 300, 1000, 16];
        let record = |i: usize| StepTensor {
            record: TensorRecord::of_bytes(
                format!("t{i}"),
                TensorKind::OpOutput,
                DType::F32,
                vec![sizes[i] as u64],
                &[],
            ),
            payload: None,
        };
        for room in [0, DEFAULT_HEADER_ROOM] {
            let step = room / DEFAULT_HEADER_ROOM;
            let stream = PayloadStream::new(trace.clone(), step, room, inline_max);
            let tensors: Vec<StepTensor> = (0..sizes.len()).map(record).collect();
            // Handed over in another order than recorded: tickets 0..4 are tensors 3, 2, 1, 0.
            let results: Vec<DeviceResult> = (0..sizes.len())
                .rev()
                .map(|i| match stream.take(values(4 * sizes[i], i as u8)) {
                    Kept::Bytes(b) => DeviceResult::Bytes(b),
                    Kept::InFile(data) => DeviceResult::InFile(data),
                })
                .collect();
            let deferred: Vec<(usize, usize)> = (0..sizes.len()).map(|i| (i, sizes.len() - 1 - i)).collect();
            let written = stream.finish().unwrap().expect("two values were streamed");
            let filled = fill_records(tensors, deferred, results, true, inline_max, Some(&written.hashes)).unwrap();
            writer.write_step_streamed(step, filled, Vec::new(), Some(written.file)).unwrap();
        }
        writer.finish().unwrap();
        let mut reader = TraceReader::open(&trace).unwrap();
        let mut steps = 0;
        while let Some(step) = reader.next_step().unwrap() {
            steps += 1;
            for (i, t) in step.tensors.iter().enumerate() {
                let read = reader.values(&step, t).unwrap().expect("every value is kept");
                assert_eq!(read.bytes.as_ref(), values(4 * sizes[i], i as u8), "step {} t{i}", step.step);
                assert_eq!(t.hash, crate::hash::tensor_hash(t.dtype, &t.shape, &read.bytes), "step {} t{i}", step.step);
                assert_eq!(t.in_payload, 4 * sizes[i] as u64 > inline_max);
            }
        }
        assert_eq!(steps, 2);
    }

    /// With room for one value at a time, every value still goes through (a value larger than
    /// the bound waits only for the ones before it), and in order.
    #[test]
    fn a_stream_bounded_to_one_value_at_a_time_writes_them_all() {
        let dir = tempfile::tempdir().unwrap();
        let mut stream = PayloadStream::new(dir.path().to_path_buf(), 0, 0, 16);
        stream.in_flight = Arc::new(InFlight { bytes: Mutex::new(0), written: Condvar::new(), limit: 1 });
        let placed: Vec<Range<u64>> = (0..64)
            .map(|i| match stream.take(values(1000 + i, i as u8)) {
                Kept::InFile(data) => data,
                Kept::Bytes(_) => panic!("value {i} is not inline"),
            })
            .collect();
        let written = stream.finish().unwrap().unwrap();
        assert_eq!(*stream.in_flight.bytes.lock().unwrap(), 0);
        for (i, data) in placed.iter().enumerate() {
            assert_eq!(written.hashes[&data.start], *blake3::hash(&values(1000 + i, i as u8)).as_bytes());
        }
    }

    #[test]
    fn a_stream_given_nothing_makes_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let stream = PayloadStream::new(dir.path().to_path_buf(), 0, 64, 16);
        assert!(matches!(stream.take(vec![1; 16]), Kept::Bytes(_)));
        assert!(stream.finish().unwrap().is_none());
        assert!(!dir.path().join("tensors").exists());
    }

    #[test]
    fn a_file_that_cannot_be_created_fails_the_step_when_it_is_written() {
        let dir = tempfile::tempdir().unwrap();
        // `tensors` is a file: the payload folder cannot be made.
        std::fs::write(dir.path().join("tensors"), b"").unwrap();
        let stream = PayloadStream::new(dir.path().to_path_buf(), 0, 64, 16);
        assert!(matches!(stream.take(vec![1; 100]), Kept::InFile(_)));
        let err = stream.finish().err().expect("the step fails").to_string();
        assert!(err.contains("tensors"), "{err}");
    }
}
