//! `Recorder`: the library API a candle training loop uses to record itself.
//!
//! ```no_run
//! use candle_core::{Device, Tensor};
//! use repro::record::{RecordOptions, Recorder};
//! use repro::trace::{RunConfig, TensorKind};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let device = Device::Cpu;
//! let run = RunConfig { workload: "my-model".into(), steps: Some(10), ..Default::default() };
//! let mut recorder = Recorder::create("runs/mine", run, &device, RecordOptions::default())?;
//! for step in 0..10 {
//!     let loss = Tensor::new(1.0f32 / (step as f32 + 1.0), &device)?;
//!     let mut s = recorder.step(step);
//!     s.record("loss", TensorKind::Loss, &loss)?;
//!     s.finish()?;
//! }
//! recorder.finish()?;
//! # Ok(()) }
//! ```
//!
//! Recording writes the trace on a thread of its own, which frees what the training thread
//! allocated: with glibc's `malloc` that slows the training thread's own allocations (about 7%
//! of a small gpt's step on a GPU). The `repro` binary allocates with mimalloc; a program that
//! records itself can do the same (`#[global_allocator] static A: mimalloc::MiMalloc =
//! mimalloc::MiMalloc;`; docs/cuda.md, "The allocator").

use super::environment::environment;
use super::error::RecordError;
use super::fill::{fill_records, payload_bytes};
use super::online::OnlineComparison;
use super::options::RecordOptions;
use super::options::{StepCallback, StepProgress, StepSelector};
use super::payload_stream::{PayloadStream, DEFAULT_HEADER_ROOM};
use super::perturb::Perturbation;
use super::probe::{Probe, ProbedGradients};
use super::profile;
use super::step_records::{Described, StepRecords};
use super::tensor_bytes::{DeviceQueue, DeviceRead};
use super::worker::{BackgroundParts, Worker};
use super::writer_thread::{FilledStep, StepFill, WriterThread};
use crate::trace::{CapturePolicy, Header, Phase, RunConfig, StepTensor, TensorKind, TraceWriter, CURRENT_FORMAT};
use candle_core::{Device, Tensor, Var};
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::path::Path;
use std::sync::Arc;

/// Records a run into a trace directory.
pub struct Recorder {
    /// `None` for a recorder that discards everything (see `Recorder::discard`).
    writer: Option<WriterThread>,
    capture: CapturePolicy,
    total_steps: Option<u64>,
    first_step: Option<u64>,
    perturbation: Option<Perturbation>,
    perturbation_applied: bool,
    online: Option<OnlineComparison>,
    /// Per step not yet written: trainable parameters that received no gradient.
    no_gradient: BTreeMap<u64, Vec<String>>,
    /// Whether the parameters without a gradient were named on stderr (once per recording).
    warned_no_gradient: bool,
    /// Told about every finished step (a progress bar).
    on_step: Option<StepCallback>,
    /// How many steps of the run store full values (computed once, for `StepProgress`).
    full_steps: Option<Option<u64>>,
    /// Finished steps whose GPU results are still on their way to the host, oldest first. A
    /// step is completed once [`READ_BEHIND`] later steps have finished (or the recorder
    /// does), so that the host may queue that many steps ahead of the device, as it does
    /// unrecorded, instead of waiting for the device at every step. A step with nothing on a
    /// GPU is completed when it finishes.
    unread: VecDeque<UnreadStep>,
    /// Runs recording work off the training thread (`StepRecorder::record_in_background`);
    /// started by the first such job.
    worker: Option<Worker>,
    /// Which steps are recorded (`RecordOptions::recording_only`); every step when `None`.
    selected: Option<StepSelector>,
    /// Header room the payload file of a step like the last one recorded needs at most.
    header_room: Option<u64>,
}

/// How many finished steps may wait for their GPU results while training goes on. Each holds
/// only its results' buffers (hashes, and values the capture policy keeps), never the graph's
/// tensors, which are freed in stream order once the hashing kernels have read them.
const READ_BEHIND: usize = 2;

impl Recorder {
    /// Starts recording run `run` on `device` into `dir`, as `options` say (see
    /// `RecordOptions`: capture policy, replacing an existing trace, rank, planted fault).
    pub fn create(
        dir: impl AsRef<Path>,
        run: RunConfig,
        device: &Device,
        options: RecordOptions,
    ) -> Result<Self, RecordError> {
        DeviceQueue::prepare(device)?;
        let total_steps = run.steps;
        let mut run = run;
        if let Some(p) = &options.perturbation {
            // The header says a fault was planted (as the built-in workloads' `perturb` setting
            // does), so that a diff names it as the cause rather than an op.
            run.params.entry("perturb".into()).or_insert_with(|| p.to_string());
        }
        let header = Header {
            format: CURRENT_FORMAT,
            producer: format!("repro {}", env!("CARGO_PKG_VERSION")),
            run,
            environment: environment(device),
            capture: options.capture.clone(),
            distributed: options.rank,
            // The candle recorder hashes with BLAKE3, on the host and on the GPU alike.
            data_hash: crate::trace::DataHash::Blake3,
        };
        let writer = TraceWriter::create(dir.as_ref(), &header, options.replace)?;
        let mut recorder = Self::discard_with(options.capture, total_steps);
        recorder.perturbation = options.perturbation;
        recorder.selected = options.select_steps;
        recorder.on_step = options.on_step;
        recorder.online = options.compare;
        recorder.writer = Some(WriterThread::spawn(writer));
        Ok(recorder)
    }

    /// A recorder that hashes nothing and writes nothing: the un-instrumented baseline that
    /// recording overhead is measured against.
    pub fn discard() -> Self {
        Self::discard_with(CapturePolicy::default(), None)
    }

    fn discard_with(capture: CapturePolicy, total_steps: Option<u64>) -> Self {
        Recorder {
            writer: None,
            capture,
            total_steps,
            first_step: None,
            perturbation: None,
            perturbation_applied: false,
            online: None,
            no_gradient: BTreeMap::new(),
            warned_no_gradient: false,
            on_step: None,
            full_steps: None,
            unread: VecDeque::new(),
            worker: None,
            selected: None,
            header_room: None,
        }
    }

    /// The fault planted through `RecordOptions::perturbation`: the named tensor is moved when
    /// `StepRecorder::op` or `StepRecorder::perturbed` sees it at the given step. Workloads
    /// read it to check it and to plant it where no op of theirs passes the tensor.
    pub fn perturbation(&self) -> Option<&Perturbation> {
        self.perturbation.as_ref()
    }

    /// Marks the planted perturbation applied by a caller that moves the tensor itself (a
    /// captured model's parameter, before the forward pass of its step), once every step
    /// before is written, so that no read of theirs sees the moved value.
    pub(crate) fn planting(&mut self) -> Result<(), RecordError> {
        self.complete_all_but(0)?;
        self.perturbation_applied = true;
        Ok(())
    }

    /// The trace directory (`None` for a discarding recorder).
    pub fn dir(&self) -> Option<&Path> {
        self.writer.as_ref().map(WriterThread::dir)
    }

    /// Begins recording step `step`. Record its tensors on the returned value, then `finish` it.
    pub fn step(&mut self, step: u64) -> StepRecorder<'_> {
        let selected = self.selected.as_mut().is_none_or(|which| which(step));
        let recording = selected && self.writer.is_some();
        // A step left out neither counts as the first nor stores anything.
        let comparing = self.online.as_ref().is_some_and(OnlineComparison::comparing);
        let (policy_full, full) = if recording {
            let first = *self.first_step.get_or_insert(step);
            let policy_full = self.capture.wants_full(step, first, self.total_steps);
            // Online comparison keeps every step's values until the next step has been checked.
            (policy_full, policy_full || comparing)
        } else {
            (false, false)
        };
        let inline_max = self.capture.inline_max_bytes;
        // Values the trace stores stream to the payload file as they come back from a GPU
        // (when comparing online, the step is checked before it is written, from memory).
        let stream = match &self.writer {
            Some(writer) if policy_full && !comparing => Some(Arc::new(PayloadStream::new(
                writer.dir().to_path_buf(),
                step,
                self.header_room.unwrap_or(DEFAULT_HEADER_ROOM),
                inline_max,
            ))),
            _ => None,
        };
        StepRecorder {
            recorder: self,
            step,
            recording,
            policy_full,
            records: StepRecords::new(step, full, inline_max, stream),
            names: HashSet::new(),
            probes: ProbedGradients::default(),
            background: BackgroundParts::default(),
        }
    }

    /// Marks the trace complete and syncs it to disk; returns the number of steps recorded.
    pub fn finish(mut self) -> Result<u64, RecordError> {
        while let Some(unread) = self.unread.pop_front() {
            self.complete(unread)?;
        }
        self.flush_pending()?;
        let stopped_early = self.online.as_ref().is_some_and(OnlineComparison::stopped_the_run);
        if let (Some(p), false, false) = (&self.perturbation, self.perturbation_applied, stopped_early) {
            // The recorded steps stay readable, but without a footer: this is not the run
            // that was asked for.
            return Err(RecordError::Unsupported(format!(
                "the perturbation {p} never applied: no tensor `{}` passed through the recorder at step {}. A \
                 perturbation reaches a tensor recorded with `StepRecorder::op` or passed through \
                 `StepRecorder::perturbed`, and in a `ModelRecorder` program a parameter, by its VarMap name (moved \
                 for the forward pass of its step); the loss and graph nodes such a program computes before repro \
                 sees them are out of its reach",
                p.tensor, p.step
            )));
        }
        let writer = self.writer.take().map(WriterThread::finish).transpose()?;
        match writer {
            Some(writer) if stopped_early => Ok(writer.finish_stopped(STOPPED_AT_DIVERGENCE.into())?),
            Some(writer) => {
                let steps = writer.finish()?;
                profile::report(steps);
                Ok(steps)
            }
            None => Ok(0),
        }
    }

    /// Writes the step held back for online comparison, with the normal capture policy.
    fn flush_pending(&mut self) -> Result<(), RecordError> {
        match self.online.as_mut().and_then(OnlineComparison::take_held) {
            Some((step, tensors)) => self.write(step, tensors),
            None => Ok(()),
        }
    }

    fn write(&mut self, step: u64, tensors: Vec<StepTensor>) -> Result<(), RecordError> {
        self.fill_and_write(step, Box::new(move || Ok(FilledStep::in_memory(tensors))))
    }

    /// Hands a step to the trace writer, whose thread runs `fill` to make its records whole.
    fn fill_and_write(&mut self, step: u64, fill: StepFill) -> Result<(), RecordError> {
        let no_gradient = self.no_gradient.remove(&step).unwrap_or_default();
        match &mut self.writer {
            Some(writer) => profile::time(profile::Phase::Write, || writer.fill_and_write(step, fill, no_gradient)),
            None => Ok(()),
        }
    }
}

/// A recorder dropped without `finish` (an error elsewhere, a panic) still writes the step it
/// held back for online comparison, so every step whose `finish` succeeded is in the trace,
/// which then reads as incomplete.
/// Why a trace stopped by its online comparison ends early, as its footer says.
const STOPPED_AT_DIVERGENCE: &str =
    "at the first divergence from the reference run (`repro record --keep-going` records to the end)";

impl Drop for Recorder {
    /// Writes what is still pending. A run its online comparison stopped (the program returned
    /// the recorder's `Diverged` error, usually with `?`, without calling `finish`) ends as
    /// `finish` would end it: stopped at the divergence, on purpose, not cut short.
    fn drop(&mut self) {
        while let Some(unread) = self.unread.pop_front() {
            let _ = self.complete(unread);
        }
        let _ = self.flush_pending();
        if self.online.as_ref().is_some_and(OnlineComparison::stopped_the_run) {
            if let Some(Ok(writer)) = self.writer.take().map(WriterThread::finish) {
                let _ = writer.finish_stopped(STOPPED_AT_DIVERGENCE.into());
            }
        }
    }
}

/// A finished step waiting for its GPU results.
struct UnreadStep {
    step: u64,
    full: bool,
    policy_full: bool,
    tensors: Vec<StepTensor>,
    /// (index into `tensors`, ticket in `read`) of records still waiting for their results.
    deferred: Vec<(usize, usize)>,
    read: DeviceRead,
    /// Where its stored values went as they were read back, if they did.
    stream: Option<Arc<PayloadStream>>,
}

/// The warning naming the parameters that got no gradient at `step`, the first where any did:
/// the optimizer never moves them, which is rarely what a training loop means (an op without a
/// backward pass, such as a fused norm, cuts them off; docs/capture.md).
fn no_gradient_warning(step: u64, names: &[String]) -> String {
    const SHOWN: usize = 8;
    let mut listed: Vec<String> = names.iter().take(SHOWN).map(|n| format!("`{n}`")).collect();
    if names.len() > SHOWN {
        listed.push(format!("and {} more", names.len() - SHOWN));
    }
    format!(
        "{} parameter(s) got no gradient at step {step}: {} (the optimizer never moves them; an op without a backward \
         pass, such as a fused norm, cuts them off; the trace notes them at every step)",
        names.len(),
        listed.join(", ")
    )
}

/// Collects one step's tensors; nothing reaches the trace until `finish`.
pub struct StepRecorder<'a> {
    recorder: &'a mut Recorder,
    step: u64,
    /// Whether this step's records go anywhere (see `is_recording`).
    recording: bool,
    policy_full: bool,
    records: StepRecords,
    /// Names recorded so far in the step (a graph can hold 100,000 nodes: no linear search;
    /// only asked, never listed, so its order never reaches the output).
    names: HashSet<String>,
    probes: ProbedGradients,
    /// Parts of the step recorded on the worker thread.
    background: BackgroundParts,
}

impl StepRecorder<'_> {
    /// The step being recorded.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Records `tensor` under `name`: its canonical hash always, its values when the capture
    /// policy asks for this step or when it is small enough to store inline.
    pub fn record(&mut self, name: &str, kind: TensorKind, tensor: &Tensor) -> Result<(), RecordError> {
        self.record_as(name, kind, None, &[], tensor)
    }

    /// Records `tensor` with the phase that produced it and the names of the tensors of this
    /// step it was computed from (each recorded earlier in the step). These let `repro diff`
    /// find the root cause of a divergence.
    pub fn record_as(
        &mut self,
        name: &str,
        kind: TensorKind,
        phase: Option<Phase>,
        inputs: &[&str],
        tensor: &Tensor,
    ) -> Result<(), RecordError> {
        self.push(name, kind, phase, inputs, None, None, None, tensor, tensor.is_variable())
    }

    /// Records variables (a model's parameters) under their names, each `NAME{suffix}`, and
    /// reads them on the device before returning, so an optimizer may update them in place
    /// right after. Cheaper on a GPU than `record` for each, which must copy a variable there
    /// in case it changes before the step ends.
    pub fn record_variables<'v>(
        &mut self,
        vars: impl IntoIterator<Item = (&'v str, &'v Var)>,
        suffix: &str,
        kind: TensorKind,
        phase: Option<Phase>,
    ) -> Result<(), RecordError> {
        self.record_variables_later(vars, suffix, kind, phase)?;
        self.read_now()
    }

    /// `record_variables` on the recorder's worker thread, while this thread goes on: the
    /// variables must not change before the step's next `wait_for_background`, `read_now` or
    /// `finish` (`ModelCapture::record_gradients` waits, before the optimizer's step).
    pub(crate) fn record_variables_in_background(
        &mut self,
        vars: Arc<[(String, Var)]>,
        kind: TensorKind,
        phase: Option<Phase>,
    ) {
        self.record_in_background(None, move |records| {
            for (name, var) in vars.iter() {
                let what = Described {
                    name: name.clone(),
                    kind,
                    phase,
                    inputs: &[],
                    node: None,
                    collective: None,
                    source: None,
                };
                records.push(what, var.as_tensor(), false)?;
            }
            Ok(())
        })
    }

    /// Records variables, each as `NAME{suffix}`, read with the step's next read (on a GPU,
    /// when the step finishes): they must not change before a later step's first
    /// `wait_for_background` or `read_now`. For parameters after the optimizer's step, which
    /// nothing changes before the next step's.
    pub(crate) fn record_variables_later<'v>(
        &mut self,
        vars: impl IntoIterator<Item = (&'v str, &'v Var)>,
        suffix: &str,
        kind: TensorKind,
        phase: Option<Phase>,
    ) -> Result<(), RecordError> {
        for (name, var) in vars {
            // An update is computed from the parameter and its gradient: with these edges a
            // diff can tell an optimizer that amplified its inputs' difference from a new cause.
            let grad = format!("{name}.grad");
            let inputs: Vec<&str> = match phase {
                Some(Phase::Update) if self.names.contains(&grad) => vec![name, &grad],
                Some(Phase::Update) if self.names.contains(name) => vec![name],
                _ => Vec::new(),
            };
            self.push(&format!("{name}{suffix}"), kind, phase, &inputs, None, None, None, var.as_tensor(), false)?;
        }
        Ok(())
    }

    /// Starts reading, on the device, every tensor recorded so far in this step that has not
    /// been read yet, so that its memory may change right after this returns: waits for the
    /// step's work on the worker thread (a captured graph), then launches the reads still
    /// queued. On a GPU a recorded tensor is otherwise read when the step's next read starts,
    /// and an optimizer overwrites parameters in place: call this before changing a recorded
    /// tensor, or a view of one, in place. `record_variables` calls it itself.
    pub fn read_now(&mut self) -> Result<(), RecordError> {
        profile::time(profile::Phase::Calls, || {
            self.join_background()?;
            self.records.read_now()
        })
    }

    /// Waits for this step's work on the recorder's worker thread (a captured graph, see
    /// `ModelCapture::record_graph`), launches the device reads it planned, and reports its error:
    /// once this returns, those reads are queued, so the tensors it recorded (views of parameters
    /// among them) may change. Cheaper than `read_now`, which also launches the reads of what this
    /// thread has queued since the last one. `ModelCapture::record_gradients` and
    /// `DataParallel::average_gradients` call it, before the optimizer's step.
    pub fn wait_for_background(&mut self) -> Result<(), RecordError> {
        profile::time(profile::Phase::Calls, || self.join_background())
    }

    /// Whether this step's records go anywhere (`false` for `Recorder::discard`, and for a
    /// step `RecordOptions::recording_only` leaves out).
    pub fn is_recording(&self) -> bool {
        self.recording
    }

    /// Runs `job` on the recorder's worker thread while this thread goes on (training's next
    /// ops); what it records takes its place in the step here, before anything recorded after
    /// this call. The job's tensors must not change before the step's next
    /// `wait_for_background`, `read_now` or `finish`, which wait for the job and report its
    /// error. The job plans its device reads (no driver call); this thread launches them when
    /// it takes the job's records over, and the tensors it recorded stay alive until then.
    pub(crate) fn record_in_background(
        &mut self,
        keep: Option<Tensor>,
        job: impl FnOnce(&mut StepRecords) -> Result<(), RecordError> + Send + 'static,
    ) {
        if !self.is_recording() {
            return;
        }
        profile::time(profile::Phase::Calls, || {
            let worker = self.recorder.worker.get_or_insert_with(Worker::spawn);
            self.background.start(worker, &self.records, keep, job);
        })
    }

    /// Waits for the step's jobs on the worker thread and puts their records in their places,
    /// launching the device reads they planned.
    fn join_background(&mut self) -> Result<(), RecordError> {
        self.background.merge_into(&mut self.records, &mut self.names, self.step)
    }

    /// Records the result of a collective across the ranks of a data-parallel run (`collective`,
    /// e.g. `all_reduce_sum`) as a gradient, with `input`, this rank's contribution recorded
    /// earlier in the step.
    pub fn record_collective(
        &mut self,
        name: &str,
        collective: &str,
        input: &str,
        tensor: &Tensor,
    ) -> Result<(), RecordError> {
        let snapshot = tensor.is_variable();
        self.push(
            name,
            TensorKind::Gradient,
            Some(Phase::Backward),
            &[input],
            None,
            Some(collective),
            None,
            tensor,
            snapshot,
        )
    }

    /// Notes trainable parameters that received no gradient at this step; the trace lists them.
    pub fn note_no_gradient(&mut self, names: impl IntoIterator<Item = String>) {
        if !self.is_recording() {
            return;
        }
        let names: Vec<String> = names.into_iter().collect();
        if !names.is_empty() && !self.recorder.warned_no_gradient {
            self.recorder.warned_no_gradient = true;
            eprintln!("warning: {}", no_gradient_warning(self.step, &names));
        }
        self.recorder.no_gradient.entry(self.step).or_default().extend(names);
    }

    // One private entry point behind every public recording call, which each fix some of these.
    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        name: &str,
        kind: TensorKind,
        phase: Option<Phase>,
        inputs: &[&str],
        node: Option<u64>,
        collective: Option<&str>,
        source: Option<String>,
        tensor: &Tensor,
        snapshot: bool,
    ) -> Result<(), RecordError> {
        if !self.is_recording() {
            return Ok(());
        }
        profile::time(profile::Phase::Calls, || {
            if !self.names.insert(name.to_string()) {
                return Err(RecordError::Unsupported(format!("tensor `{name}` recorded twice in step {}", self.step)));
            }
            let what = Described { name: name.to_string(), kind, phase, inputs, node, collective, source };
            self.records.push(what, tensor, snapshot)
        })
    }

    /// Applies the run's planted perturbation if it targets `name` at this step; otherwise
    /// returns `tensor` unchanged. Workloads call this for tensors they update themselves
    /// (parameters); `op` calls it for every op.
    pub fn perturbed(&mut self, name: &str, tensor: &Tensor) -> Result<Tensor, RecordError> {
        match &self.recorder.perturbation {
            Some(p) if p.step == self.step && p.tensor == name => {
                self.recorder.perturbation_applied = true;
                p.apply(self.step, name, tensor)
            }
            _ => Ok(tensor.clone()),
        }
    }

    /// Records the output of one forward op under `name` (perturbing it first if the run plants
    /// a fault there) and returns it, so ops can be recorded inline:
    /// `let h = s.op("fc1.matmul", &["x", "fc1.weight"], x.matmul(&w)?)?;`
    /// The record's `source` is the caller's line, where the op is (format 1.6).
    #[track_caller]
    pub fn op(&mut self, name: &str, inputs: &[&str], output: Tensor) -> Result<Tensor, RecordError> {
        self.op_as(name, TensorKind::OpOutput, inputs, output)
    }

    /// `op` for an output of another kind (the predictions, the loss).
    #[track_caller]
    pub fn op_as(
        &mut self,
        name: &str,
        kind: TensorKind,
        inputs: &[&str],
        output: Tensor,
    ) -> Result<Tensor, RecordError> {
        let caller = std::panic::Location::caller();
        let source = format!("{}:{}", caller.file(), caller.line());
        let output = self.perturbed(name, &output)?;
        self.push(name, kind, Some(Phase::Forward), inputs, None, None, Some(source), &output, output.is_variable())?;
        Ok(output)
    }

    /// Returns `tensor` behind a probe: an identity op whose backward pass hands the gradient
    /// with respect to `tensor` to this recorder. After `backward()`, `record_probed_gradients`
    /// records it as `NAME.grad`.
    pub fn probe(&mut self, name: &str, tensor: &Tensor) -> Result<Tensor, RecordError> {
        Ok(tensor.apply_op1(Probe::new(name, self.probes.clone()))?)
    }

    /// Records the gradients the probes saw during `backward()`, in the order backpropagation
    /// reached them, as `NAME.grad` (phase backward). `inputs` gives, per probe name, the
    /// recorded tensors each gradient was computed from.
    pub fn record_probed_gradients(&mut self, inputs: &[(&str, &[&str])]) -> Result<(), RecordError> {
        for (name, grad) in self.probes.take() {
            let deps = inputs.iter().find(|(n, _)| *n == name).map_or(&[][..], |(_, d)| *d);
            let grad = self.perturbed(&format!("{name}.grad"), &grad)?;
            self.record_as(&format!("{name}.grad"), TensorKind::Gradient, Some(Phase::Backward), deps, &grad)?;
        }
        Ok(())
    }

    /// Ends the step. Its GPU results start their way to the host; the step reaches the trace
    /// (or, when comparing online, is checked first) once they have arrived, which for a GPU
    /// run is when `READ_BEHIND` more steps have finished.
    pub fn finish(self) -> Result<(), RecordError> {
        profile::time(profile::Phase::Calls, || self.finish_step().map(|_| ()))
    }
}

impl<'a> StepRecorder<'a> {
    /// `finish`, handing the recorder back for what comes before the next step.
    pub(crate) fn finish_step(mut self) -> Result<&'a mut Recorder, RecordError> {
        if !self.is_recording() {
            return Ok(self.recorder);
        }
        let online = self.recorder.online.as_ref().is_some_and(OnlineComparison::comparing);
        self.join_background()?;
        let StepRecorder { recorder, step, policy_full, records, .. } = self;
        recorder.header_room = Some(records.header_room());
        let unread = UnreadStep::start(step, policy_full, records)?;
        if online {
            // Comparing online needs this step's hashes before the next step runs.
            recorder.complete_all_but(0)?;
            recorder.complete(unread)?;
            return Ok(recorder);
        }
        // Only GPU results are worth waiting for; a step recorded on the host is written now.
        let behind = if unread.read.is_pending() { READ_BEHIND } else { 0 };
        recorder.unread.push_back(unread);
        recorder.complete_all_but(behind)?;
        Ok(recorder)
    }
}

impl UnreadStep {
    /// Launches what `records` still queues on the device and starts reading its results.
    fn start(step: u64, policy_full: bool, records: StepRecords) -> Result<UnreadStep, RecordError> {
        let StepRecords { full, tensors, device, deferred, stream, .. } = records;
        let read = device.start_read()?;
        Ok(UnreadStep { step, full, policy_full, tensors, deferred, read, stream })
    }
}

impl Recorder {
    /// Completes the oldest finished steps until at most `behind` wait.
    fn complete_all_but(&mut self, behind: usize) -> Result<(), RecordError> {
        while self.unread.len() > behind {
            let oldest = self.unread.pop_front().expect("the queue is longer than `behind`");
            self.complete(oldest)?;
        }
        Ok(())
    }

    /// Waits for a finished step's GPU results, fills in its records, reports it, and writes
    /// it (or, when comparing online, checks it first).
    fn complete(&mut self, unread: UnreadStep) -> Result<(), RecordError> {
        let UnreadStep { step, full, policy_full, tensors, deferred, read, stream } = unread;
        // Waiting for the results is a driver call, so it is made here, on the thread that
        // trains (see `record::device::DeviceBatch`); `READ_BEHIND` steps later they have landed.
        let results = profile::time(profile::Phase::Resolve, || read.wait())?;
        let inline_max = self.capture.inline_max_bytes;
        if let Some(report) = self.on_step.as_mut() {
            let first = self.first_step.unwrap_or(step);
            let total = self.total_steps;
            let payload_bytes = if policy_full { payload_bytes(&tensors, &deferred, full, inline_max) } else { 0 };
            let capture = &self.capture;
            let full_steps = *self.full_steps.get_or_insert_with(|| {
                total.map(|n| (first..first + n).filter(|&s| capture.wants_full(s, first, total)).count() as u64)
            });
            report(&StepProgress { step, total_steps: total, payload_bytes, full_steps });
        }
        let fill = move || -> Result<FilledStep, RecordError> {
            let results = results.into_results();
            // The values written as they came must all be on disk before the step is.
            let written = stream.map(|s| s.finish()).transpose()?.flatten();
            let hashes = written.as_ref().map(|w| &w.hashes);
            let tensors = profile::time(profile::Phase::Fill, || {
                fill_records(tensors, deferred, results, full, inline_max, hashes)
            })?;
            Ok(FilledStep { tensors, payload: written.map(|w| w.file) })
        };
        match self.online.as_mut().filter(|o| o.comparing()) {
            // The writer thread waits for the results and fills the records in.
            None => self.fill_and_write(step, Box::new(fill)),
            // Comparing online needs the step's records here.
            Some(online) => {
                // No step streams its values while comparing online (`Recorder::step`).
                let checked = online.check(step, fill()?.tensors, policy_full);
                for (step, tensors) in checked.write {
                    self.write(step, tensors)?;
                }
                checked.result
            }
        }
    }
}

#[cfg(test)]
mod tests;
