//! The recorder's worker thread: recording work that need not hold up training (walking,
//! naming and hashing a captured graph) runs there while the training thread goes on with the
//! step. Each job fills a part of the step's records of its own, which comes back through a
//! channel; the step waits for it (`StepRecorder::wait_for_background`, `read_now`, `finish`)
//! and puts its records where the job was asked for, so jobs never outlive their step.
//!
//! The worker makes no CUDA call. A job plans its device reads on the host
//! (`DeviceQueue::plan`) and the training thread launches them when it takes the job's records
//! over: the launches are ordered with training's own work on its stream, and do not contend
//! with training for the driver, whose calls from two threads at once cost the training
//! thread a wait each. Nor does a job drop the last reference to a tensor training made
//! (freeing device memory is a driver call): the training thread keeps the root of the graph a
//! job reads until the job is done.

use super::error::RecordError;
use super::profile;
use super::step_records::StepRecords;
use candle_core::Tensor;
use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender};
use std::thread::JoinHandle;

type Job = Box<dyn FnOnce() + Send>;

/// One thread running jobs in the order they were given.
pub(crate) struct Worker {
    queue: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

/// A job's result, on its way from the worker.
pub(crate) struct Pending<R>(Receiver<Result<R, RecordError>>);

impl Worker {
    pub(crate) fn spawn() -> Self {
        let (queue, jobs) = channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("repro-recorder".into())
            .spawn(move || {
                for job in jobs {
                    job();
                }
            })
            .expect("the OS starts a thread");
        Worker { queue: Some(queue), thread: Some(thread) }
    }

    /// Runs `job` on the worker thread, after the jobs given before it.
    pub(crate) fn run<R: Send + 'static>(
        &mut self,
        job: impl FnOnce() -> Result<R, RecordError> + Send + 'static,
    ) -> Pending<R> {
        let (result, pending) = sync_channel(1);
        let job: Job = Box::new(move || {
            // A job that panics fails its step; the thread goes on with the next.
            let outcome = catch_unwind(AssertUnwindSafe(job)).unwrap_or_else(|panic| {
                let why = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "no message".into());
                Err(RecordError::Unsupported(format!("a recording job panicked: {why}")))
            });
            let _ = result.send(outcome);
        });
        if let Some(queue) = &self.queue {
            // The thread only stops when the worker is dropped; a failed send drops the job,
            // and `Pending::wait` then reports it.
            let _ = queue.send(job);
        }
        Pending(pending)
    }
}

/// One part of a step on the worker thread.
struct Started {
    /// The index its records take among the step's (where it was asked for).
    at: usize,
    pending: Pending<StepRecords>,
    /// Tensors whose graphs the part's jobs read, held here until the jobs are done, so that a
    /// job never drops the last reference to one of its tensors.
    keep: Vec<Tensor>,
}

/// Parts of one step recorded on the worker thread, in the order they were asked for.
#[derive(Default)]
pub(crate) struct BackgroundParts(Vec<Started>);

impl BackgroundParts {
    /// Runs `job` on `worker` into a part of `records`' step, placed after what `records` holds
    /// now; the job's device reads are planned when it ends, and launched when the part is
    /// merged. `keep` (the root of a graph the job reads) stays alive here until then.
    ///
    /// A job whose records follow the last part's directly (this thread recorded nothing in
    /// between: a model's parameters, then its graph) continues that part, so that both are
    /// planned together and launched in one flush.
    pub(crate) fn start(
        &mut self,
        worker: &mut Worker,
        records: &StepRecords,
        keep: Option<Tensor>,
        job: impl FnOnce(&mut StepRecords) -> Result<(), RecordError> + Send + 'static,
    ) {
        let at = records.tensors.len();
        let (earlier, mut kept) = match self.0.pop() {
            Some(last) if last.at == at => (Some(last.pending), last.keep),
            other => {
                self.0.extend(other);
                (None, Vec::new())
            }
        };
        let fresh = records.part();
        let pending = worker.run(move || {
            // The part's earlier jobs ran before this one, on this thread: their result is there.
            let mut part = match earlier {
                Some(earlier) => earlier.wait()?,
                None => fresh,
            };
            job(&mut part)?;
            part.device.plan()?;
            Ok(part)
        });
        kept.extend(keep);
        self.0.push(Started { at, pending, keep: kept });
    }

    /// Waits for every part and merges it into `records` at its place, launching its planned
    /// device reads on this thread; a name that another record of step `step` (in `names`)
    /// has already is refused.
    pub(crate) fn merge_into(
        &mut self,
        records: &mut StepRecords,
        names: &mut HashSet<String>,
        step: u64,
    ) -> Result<(), RecordError> {
        // Every part's job is waited for, even after an error, before its root is let go.
        let parts: Vec<(usize, Result<StepRecords, RecordError>)> = std::mem::take(&mut self.0)
            .into_iter()
            .map(|Started { at, pending, keep }| {
                let waited = profile::time(profile::Phase::Join, || pending.wait());
                drop(keep);
                (at, waited)
            })
            .collect();
        // Each part goes where it was asked for, shifted by the parts merged before it.
        let mut inserted = 0;
        for (at, part) in parts {
            let part = part?;
            if let Some(t) = part.tensors.iter().find(|t| !names.insert(t.record.name.clone())) {
                return Err(RecordError::Unsupported(format!(
                    "tensor `{}` recorded twice in step {step}",
                    t.record.name
                )));
            }
            let added = part.tensors.len();
            records.merge(at + inserted, part)?;
            inserted += added;
        }
        Ok(())
    }
}

impl<R> Pending<R> {
    /// Waits for the job's result.
    pub(crate) fn wait(self) -> Result<R, RecordError> {
        self.0.recv().unwrap_or_else(|_| Err(RecordError::Unsupported("the recorder's worker thread stopped".into())))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::step_records::Described;
    use crate::trace::TensorKind;

    fn record(records: &mut StepRecords, name: &str) -> Result<(), RecordError> {
        let tensor = Tensor::new(&[1f32, 2.0], &candle_core::Device::Cpu)?;
        let what = Described {
            name: name.into(),
            kind: TensorKind::Input,
            phase: None,
            inputs: &[],
            node: None,
            collective: None,
            source: None,
        };
        records.push(what, &tensor, false)
    }

    /// Jobs with nothing recorded between them on this thread continue one part (planned and
    /// launched together); a record in between starts a new one. Every record takes its place.
    #[test]
    fn contiguous_jobs_share_a_part_and_every_record_takes_its_place() {
        let mut worker = Worker::spawn();
        let mut records = StepRecords::new(0, false, 256, None);
        let mut parts = BackgroundParts::default();
        record(&mut records, "first").unwrap();
        parts.start(&mut worker, &records, None, |part| record(part, "job.a"));
        parts.start(&mut worker, &records, None, |part| record(part, "job.b"));
        assert_eq!(parts.0.len(), 1, "contiguous jobs continue one part");
        record(&mut records, "between").unwrap();
        parts.start(&mut worker, &records, None, |part| record(part, "job.c"));
        assert_eq!(parts.0.len(), 2, "a record in between starts a new part");
        record(&mut records, "last").unwrap();
        let mut names = ["first", "between", "last"].map(String::from).into_iter().collect();
        parts.merge_into(&mut records, &mut names, 0).unwrap();
        let order: Vec<&str> = records.tensors.iter().map(|t| t.record.name.as_str()).collect();
        assert_eq!(order, ["first", "job.a", "job.b", "between", "job.c", "last"]);
    }

    /// A failed job fails the jobs that continue its part, and the merge reports it.
    #[test]
    fn a_failed_job_fails_the_part_it_began() {
        let mut worker = Worker::spawn();
        let mut records = StepRecords::new(0, false, 256, None);
        let mut parts = BackgroundParts::default();
        parts.start(&mut worker, &records, None, |_| Err(RecordError::Unsupported("the first job failed".into())));
        parts.start(&mut worker, &records, None, |part| record(part, "after"));
        let err = parts.merge_into(&mut records, &mut HashSet::new(), 0).unwrap_err().to_string();
        assert!(err.contains("the first job failed"), "{err}");
        assert!(records.tensors.is_empty());
    }

    #[test]
    fn jobs_run_in_order_and_a_panic_fails_only_its_own_job() {
        let mut worker = Worker::spawn();
        let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let pending: Vec<_> = (0..5)
            .map(|i| {
                let order = order.clone();
                worker.run(move || {
                    order.lock().unwrap().push(i);
                    if i == 2 {
                        panic!("job two fails");
                    }
                    Ok(i * 10)
                })
            })
            .collect();
        let results: Vec<_> = pending.into_iter().map(Pending::wait).collect();
        assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4]);
        assert_eq!(results.iter().filter_map(|r| r.as_ref().ok().copied()).collect::<Vec<_>>(), [0, 10, 30, 40]);
        let error = results[2].as_ref().unwrap_err().to_string();
        assert!(error.contains("job two fails"), "{error}");
    }
}
