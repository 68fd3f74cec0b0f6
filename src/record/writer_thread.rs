//! The trace writer on a thread of its own: while training computes the next step, the last
//! one's records are completed from its device results, validated, encoded and written (and its
//! payload file synced). Steps reach
//! the trace in order; at most [`QUEUED_STEPS`] wait, which bounds the memory their values hold.
//! A write that fails is reported by the next call (the next step, or `finish`), and nothing
//! after it is written, so the trace stays a readable prefix of the run.

use super::error::RecordError;
use crate::trace::{PayloadFile, StepTensor, TraceError, TraceWriter};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::thread::JoinHandle;

/// Steps that may wait for the writer thread before `write` blocks.
const QUEUED_STEPS: usize = 2;

/// Makes a step's records whole (waits for its device results and puts them in), on the writer
/// thread.
pub(crate) type StepFill = Box<dyn FnOnce() -> Result<FilledStep, RecordError> + Send>;

/// A step's records made whole, and its payload file if values were written to it as they came
/// (`payload_stream`).
pub(crate) struct FilledStep {
    pub(crate) tensors: Vec<StepTensor>,
    pub(crate) payload: Option<PayloadFile>,
}

impl FilledStep {
    /// Records whose values, if any, are all in memory.
    pub(crate) fn in_memory(tensors: Vec<StepTensor>) -> Self {
        FilledStep { tensors, payload: None }
    }
}

/// One step for the writer: its number, its records, and parameters that received no gradient.
type Job = (u64, StepFill, Vec<String>);

/// A `TraceWriter` fed through a bounded queue.
pub(crate) struct WriterThread {
    dir: PathBuf,
    queue: Option<SyncSender<Job>>,
    thread: Option<JoinHandle<Result<TraceWriter, RecordError>>>,
}

impl WriterThread {
    /// Moves `writer` onto its own thread.
    pub(crate) fn spawn(writer: TraceWriter) -> Self {
        let dir = writer.dir().to_path_buf();
        let (queue, jobs) = sync_channel::<Job>(QUEUED_STEPS);
        let thread = std::thread::Builder::new()
            .name("repro-trace-writer".into())
            .spawn(move || {
                let mut writer = writer;
                for (step, fill, no_gradient) in jobs {
                    let FilledStep { tensors, payload } = fill()?;
                    writer.write_step_streamed(step, tensors, no_gradient, payload)?;
                }
                Ok(writer)
            })
            .expect("the OS starts a thread");
        WriterThread { dir, queue: Some(queue), thread: Some(thread) }
    }

    /// The trace directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Queues a step whose records `fill` completes on the writer thread; returns the error of
    /// an earlier step, if one failed.
    pub(crate) fn fill_and_write(
        &mut self,
        step: u64,
        fill: StepFill,
        no_gradient: Vec<String>,
    ) -> Result<(), RecordError> {
        let sent = self.queue.as_ref().map(|q| q.send((step, fill, no_gradient)));
        match sent {
            Some(Ok(())) => Ok(()),
            // The thread stopped: a write failed.
            _ => self.join().map(|_| ()),
        }
    }

    /// Waits for every queued step to be written and hands the writer back (to write the
    /// footer).
    pub(crate) fn finish(mut self) -> Result<TraceWriter, RecordError> {
        self.join()
    }

    fn join(&mut self) -> Result<TraceWriter, RecordError> {
        self.queue = None;
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(panic)) => std::panic::resume_unwind(panic),
            None => Err(TraceError::InvalidRecord {
                path: self.dir.clone(),
                reason: "the trace writer already stopped after an earlier error".into(),
            }
            .into()),
        }
    }
}

/// Dropped without `finish` (an error elsewhere): the queued steps are still written, so the
/// trace holds every step handed over, without a footer.
impl Drop for WriterThread {
    fn drop(&mut self) {
        self.queue = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::dtype::DType;
    use crate::trace::{Header, TensorKind, TensorRecord, TraceReader};

    /// Queues a step whose records are whole already.
    fn write(w: &mut WriterThread, step: u64, tensors: Vec<StepTensor>) -> Result<(), RecordError> {
        w.fill_and_write(step, Box::new(move || Ok(FilledStep::in_memory(tensors))), Vec::new())
    }

    fn writer(dir: &Path) -> WriterThread {
        WriterThread::spawn(TraceWriter::create(dir, &Header::of_producer("test"), false).unwrap())
    }

    fn loss(value: f32) -> Vec<StepTensor> {
        let bytes = value.to_le_bytes().to_vec();
        let record = TensorRecord {
            inline: Some(bytes.clone()),
            ..TensorRecord::of_bytes("loss", TensorKind::Loss, DType::F32, vec![1], &bytes)
        };
        vec![StepTensor { record, payload: None }]
    }

    fn steps_in(dir: &Path) -> (Vec<u64>, bool) {
        let mut reader = TraceReader::open(dir).unwrap();
        let mut steps = Vec::new();
        while let Some(step) = reader.next_step().unwrap() {
            steps.push(step.step);
        }
        (steps, matches!(reader.completeness(), Some(crate::trace::Completeness::Complete)))
    }

    #[test]
    fn steps_are_written_in_order_and_a_failed_write_is_reported_by_the_next_call() {
        let tmp = tempfile::tempdir().unwrap();
        let mut w = writer(&tmp.path().join("ok"));
        for step in 0..5 {
            write(&mut w, step, loss(step as f32)).unwrap();
        }
        w.finish().unwrap().finish().unwrap();
        assert_eq!(steps_in(&tmp.path().join("ok")), (vec![0, 1, 2, 3, 4], true));

        // Step 1 after step 3 is refused by the writer thread; a later call says so.
        let bad = tmp.path().join("bad");
        let mut w = writer(&bad);
        write(&mut w, 3, loss(0.0)).unwrap();
        let _ = write(&mut w, 1, loss(0.0));
        let later = (0..10).find_map(|i| write(&mut w, 10 + i, loss(0.0)).err());
        let err = match later {
            Some(e) => e,
            None => w.finish().map(|_| ()).unwrap_err(),
        }
        .to_string();
        assert!(err.contains("step 1 recorded after step 3"), "{err}");
        assert_eq!(steps_in(&bad), (vec![3], false), "nothing after the failed step is written");
    }

    #[test]
    fn a_writer_dropped_without_finish_still_writes_what_it_was_given() {
        let tmp = tempfile::tempdir().unwrap();
        let mut w = writer(tmp.path());
        for step in 0..3 {
            write(&mut w, step, loss(1.0)).unwrap();
        }
        drop(w);
        assert_eq!(steps_in(tmp.path()), (vec![0, 1, 2], false));
    }
}
