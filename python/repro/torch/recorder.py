"""Recording steps of named tensors into a trace: `Recorder` (one process's stream, or one
rank's `OUT/rank-N` in a run of several) and `StepRecorder` (one step's tensors, hashed where
they live)."""

from __future__ import annotations

import os
import sys
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Iterator, Optional

import torch

from repro.trace import RECORDS_FILE
from repro.writer import Layout, NativeRecords, TraceWriter, WriteError, policy_selects, step_policy

from .cuda_hash import CUDA_HASH_LIB, CUDA_HASH_LIB_ENV, DeviceHasher, cuda_hash_library_path, library_hashes_on_gpu
from .flushes import COPY, QUEUE, READ, FlushPolicy
from .ops import OpOutputs
from .options import STOP_AFTER_ENV, RecordOptions, from_environment
from .perturb import Perturbation
from .ranks import RankPlace, current_place, perturbs_this_rank
from .switches import changes, determinism_switches, environment
from .tensors import IN_PLACE_DTYPES, canonical, canonical_on_device

# `Recorder(place=AUTO)`: this process's place as torch.distributed says (`ranks.current_place`).
AUTO = "auto"

# A step keeping at least this many bytes of values is written beside the program (see
# `Recorder`); a smaller one is written where it ends, as a step of hashes is: on the CPU, it is
# then on disk before the program goes on, and its writing takes little time anyway.
WRITE_BESIDE_MIN_BYTES = 64 << 20

# Tensors whose layout a recorder remembers (`Recorder.lay_out`): many steps' worth of a model's.
LAID_OUT_MAX = 1 << 16

# What `StepRecorder._queue_one` says of a record besides 0 (nothing to read): it waits to be
# read on the GPU, or was read there at once.
WAITS, READ_AT_ONCE = 1, 2


class Recorder:
    """Records steps of named tensors into a trace (see `StepRecorder`)."""

    def __init__(
        self,
        path: str,
        run: dict,
        options: Optional[RecordOptions] = None,
        *,
        device: Optional[torch.device] = None,
        perturbation: Optional[Perturbation] = None,
        place=AUTO,
        **changes,
    ):
        """Records into `path` the run `run` (its settings, for the header) as `options` say
        (`RecordOptions`: the capture policy, the levels, the data hash, GPU hashing, the flush
        policy, ...), with `changes` over them by option name (`capture="all"`, `modules="every:10"`;
        a None leaves an option as it is). No environment variable is read here: what a repro
        command asks is read by `create_or_gated`. `place`: this process's rank in a run of
        several (`ranks.RankPlace`), whose stream goes to `path/rank-N`; None for a lone
        process; by default, as torch.distributed says. `perturbation`: a fault to plant."""
        if options is not None and not isinstance(options, RecordOptions):
            raise TypeError(f"Recorder's third argument is a RecordOptions, not {type(options).__name__} "
                            "(pass capture= and the other options by name)")
        options = (options or RecordOptions()).but(**changes)
        self.options = options
        capture, data_hash, device_hashing = options.capture, options.data_hash, options.device_hashing
        self.place: Optional[RankPlace] = current_place() if place == AUTO else place
        self.run_dir = path
        if self.place is not None:
            path = _rank_stream(path, self.place)
        self._switches = determinism_switches()
        if perturbation is not None:
            run = _with_perturbation(run, perturbation)
        # The levels' step policies, parsed (refused before anything is written where not one).
        self.levels = {"modules": step_policy("modules policy", options.modules),
                       "ops": step_policy("ops policy", options.ops)}
        self._total = run.get("steps")
        # A GPU hashing library asked for and missing is refused before anything is written (a
        # trace begun here would stand in the way of the next try).
        library = cuda_hash_library_path() if device_hashing is not False else None
        # The workspace's CPU build of the library packs records but hashes nothing on a GPU.
        self._library = library if library is not None and library_hashes_on_gpu(library) else None
        if device_hashing and self._library is None:
            found = f" ({library} was built without its GPU half)" if library is not None else ""
            raise WriteError(
                f"device_hashing=True, but repro's GPU hashing library is not found{found}: build it with `make cuda` "
                f"and set {CUDA_HASH_LIB_ENV} to target/cuda/release/{CUDA_HASH_LIB}"
            )
        self._writer = TraceWriter(path, run, capture, options.inline_max_bytes, options.replace,
                                   environment(device, self._switches),
                                   distributed=self.place.header() if self.place is not None else None,
                                   data_hash=data_hash, modules=options.modules, ops=options.ops,
                                   capture_names=options.capture_names)
        self.data_hash = data_hash
        self.perturbation = perturbation
        # Whether the fault was planted; until it is, the names it could have reached (those
        # passed through `StepRecorder.perturbed`) and the steps recorded, which the error for a
        # fault that reached nothing names (`Perturbation.unplanted`).
        self.perturbation_planted = False
        self.reachable: set = set()
        self._steps_recorded: list = []
        self.path = path
        self.inline_max_bytes = options.inline_max_bytes
        if library is not None:
            try:  # the same library packs each step's records in one call
                self._writer.use_native_records(NativeRecords(library))
            except WriteError:
                pass  # one built before it could: the writer packs them in Python
        self.hashers: dict[int, DeviceHasher] = {}
        self._hasher_by_device: dict = {}  # torch.device -> its hasher, or None
        self._warned = device_hashing is False
        self._first: Optional[int] = None
        self._last: Optional[int] = None
        # Steps recorded whose GPU hashes are still on their way: written a step later. (Not on
        # a thread of their own: the writer's Python work then competes with the training
        # thread for Python's lock, and on an H100 every CPU-bound model recorded slower.)
        self._behind: list = []
        # A step that keeps full values (`WRITE_BESIDE_MIN_BYTES` or more) is written on a
        # thread of its own while the program goes on: the writing (hashing on every core, the
        # payload, its sync) runs outside Python's lock, and takes longer than a step. One at a
        # time, in order: the write of a step waits for the one before.
        self._full_writer: Optional[ThreadPoolExecutor] = None
        self._writing: Optional[tuple[int, Future]] = None  # (its step, its write)
        self.flush_policy = FlushPolicy(options.flush)
        self._finished = False
        # The last step recorded (see `StepRecorder`): a parameter recorded at a step's start,
        # unchanged since the last step recorded it updated, repeats that record.
        self._carried: Optional[StepRecorder] = None
        # What a tensor hashed on the GPU is, by (address, dtype, contiguous): its device's
        # hasher's index in `hashers`, its trace dtype (None: it is copied to be read, whatever
        # its contiguity), its shape (which must be the tensor's too) and its length in bytes.
        # (Ints, strings and tuples of them, which Python's garbage collector stops tracking;
        # a torch.Size it never does.)
        self.laid_out: dict = {}

    def lay_out(self, key: tuple, hasher: "DeviceHasher", trace_dtype: Optional[str], size, length: int) -> tuple:
        """Remembers what a tensor hashed on the GPU is (`laid_out`), by what is read of it for
        every record anyway: its address, dtype and contiguity (and its shape, compared). Two
        tensors that agree on these are on the same device: CUDA gives every device's memory and
        the host's addresses of their own. Forgets everything past `LAID_OUT_MAX` (the shapes of
        a program whose shapes keep changing); returns what it remembered."""
        if len(self.laid_out) >= LAID_OUT_MAX:
            self.laid_out.clear()
        known = self.laid_out[key] = (hasher.index, trace_dtype, tuple(size), length)
        return known

    def hasher_for(self, t: torch.Tensor) -> Optional[DeviceHasher]:
        """The GPU hasher of a CUDA tensor's device, or None (a CPU tensor, or no library)."""
        device = t.device
        hasher = self._hasher_by_device.get(device, False)
        if hasher is not False:
            return hasher
        hasher = self._hasher_on(device)
        self._hasher_by_device[device] = hasher
        return hasher

    def _hasher_on(self, device: torch.device) -> Optional[DeviceHasher]:
        if device.type != "cuda":
            return None
        if self._library is None:
            if not self._warned:
                self._warned = True
                print(
                    f"repro.torch: hashing CUDA tensors on the host (a copy each): repro's GPU hashing library was not "
                    f"found; build it with `make cuda` and set {CUDA_HASH_LIB_ENV}",
                    file=sys.stderr,
                )
            return None
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self.hashers:
            self.hashers[index] = DeviceHasher(self._library, index, data_hash=self.data_hash)
        return self.hashers[index]

    @property
    def hashes_on_gpu(self) -> bool:
        """Whether CUDA tensors are hashed on the GPU."""
        return self._library is not None

    @classmethod
    def create_or_gated(cls, path: str, run: dict, device: Optional[torch.device] = None,
                        options: Optional[RecordOptions] = None, **changes) -> "Recorder":
        """Records as a repro command running this program asks (`repro record -- CMD`, `gate --
        CMD`: REPRO_TRACE_DIR, the options' variables of `options.from_environment`,
        REPRO_PERTURB, REPRO_PERTURB_RANK), and into `path` with `options` and `changes`
        otherwise. A trace already there is an error unless replacing is asked for. A rank of
        several records into `path/rank-N`."""
        env = os.environ
        if env.get("REPRO_TRACE_DIR"):
            path = env["REPRO_TRACE_DIR"]
        place = changes.pop("place", AUTO)
        perturbation = changes.pop("perturbation", None)
        options = from_environment((options or RecordOptions()).but(**changes), env)
        place = current_place() if place == AUTO else place
        if env.get("REPRO_PERTURB"):
            # Every rank's header keeps the run's fault (ranks of one run have the same settings);
            # the rank that plants it checks that it was planted.
            planted = Perturbation(env["REPRO_PERTURB"])
            if perturbs_this_rank(place):
                perturbation = planted
            else:
                perturbation, run = None, _with_perturbation(run, planted)
        # REPRO_AGAINST needs nothing here: the repro command compares the run when it ends.
        return cls(path, run, options, device=device, place=place, perturbation=perturbation)

    def wants_full(self, step: int) -> bool:
        return self._writer.wants_full(step, first=self._first)

    def wants(self, level: str, step: int) -> bool:
        """Whether step `step` records the level `level` (`modules` or `ops`)."""
        first = self._first if self._first is not None else step
        return policy_selects(self.levels[level], step, first, self._total)

    def set_levels(self, modules: Optional[str] = None, ops: Optional[str] = None) -> None:
        """Makes the levels' step policies these (None: as they are), the header's too; only
        before the first step."""
        if self._first is not None:
            raise WriteError(f"{self.path}: the levels cannot change once a step is recorded (step {self._first} was)")
        levels = {level: step_policy(f"{level} policy", policy) if policy is not None else self.levels[level]
                  for level, policy in (("modules", modules), ("ops", ops))}
        self._writer.set_levels(levels["modules"], levels["ops"])
        self.levels = levels

    @contextmanager
    def step(self, step: int) -> Iterator["StepRecorder"]:
        """One step: record its tensors on the value, and it is written when the block ends, or
        with tensors hashed on the GPU, when the next one does (so the GPU never waits for the
        host); an exception that leaves the block leaves the trace without that step."""
        if self._last is not None and step <= self._last:
            raise WriteError(f"step {step} follows step {self._last}: steps must increase")
        self._first = step if self._first is None else self._first
        self._last = step
        s = StepRecorder(self, step)
        if self.place is not None:
            self._writer.mark_progress(step, "computing")
        try:
            if s.ops is None:
                yield s
            else:
                with s.ops:
                    yield s
            s.end()
            self._check_planted(step)
        except BaseException:
            for hasher in self.hashers.values():
                hasher.abandon()  # what the step queued, let go
            raise
        if self.place is not None:
            self._writer.mark_progress(step, "done")
        reads = [hasher.start_read() for hasher in self.hashers.values()]
        self._carried = s
        self._behind.append((s, reads))
        while len(self._behind) > (1 if reads else 0):
            self._write_oldest()
        stop_after = self.options.stop_after
        if stop_after is not None and step >= stop_after:
            self.finish(stopped=f"after step {step}, as asked ({STOP_AFTER_ENV}={stop_after})")
            raise SystemExit(0)

    def _check_planted(self, step: int) -> None:
        """Notes that `step` was recorded; raises `Perturbation.unplanted` where the fault to plant
        is still unplanted once its step has passed."""
        p = self.perturbation
        if p is None or self.perturbation_planted:
            return
        self._steps_recorded.append(step)
        if step >= p.step:
            raise p.unplanted(self.reachable, self._steps_recorded)

    def _write_oldest(self) -> None:
        s, reads = self._behind.pop(0)
        for read in reads:
            read.finish()
        s.fill_repeats()
        self._wait_for_writing()
        args = (s.step, s.layouts, s.data, s.hashes, s.no_gradient)
        if not s.keeps_values or sum(len(d) for d in s.data if d is not None) < WRITE_BESIDE_MIN_BYTES:
            self._writer.write_laid_out(*args)
            return
        if self._full_writer is None:
            self._full_writer = ThreadPoolExecutor(1, thread_name_prefix="repro-writer")
        self._writing = (s.step, self._full_writer.submit(self._writer.write_laid_out, *args))

    def _wait_for_writing(self) -> None:
        """Waits for the step being written on the writer's thread; a failure there is raised
        here, naming the step (which the trace then lacks) and the trace."""
        writing, self._writing = self._writing, None
        if writing is None:
            return
        step, write = writing
        try:
            write.result()
        except (WriteError, OSError) as e:
            raise WriteError(f"{self.path}: step {step}, written beside the program, was not written: {e}") from e

    def entering_collective(self, step: int, collective: str, tensors) -> None:
        """Notes, for a rank of several, that it waits in `collective` over `tensors` at `step`:
        if the run hangs there, `repro` names the ranks that never arrived (section 10.1)."""
        if self.place is not None:
            self._writer.mark_progress(step, "collective", collective, tensors)

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        """Finishes the trace when the block ends (unless it is finished already); when the block
        raised, as stopped by that exception, so that no reader takes the run for whole (its
        steps written so far stay readable). The exception goes on."""
        if not self.finished:
            if kind is None:
                self.finish()
            else:
                self.finish(stopped=f"the program raised {kind.__name__}", raised=True)
        return False

    @property
    def finished(self) -> bool:
        """Whether the trace is finished (`finish`)."""
        return self._finished

    def finish(self, stopped: Optional[str] = None, raised: bool = False) -> int:
        """Writes what is still on its way and finishes the trace; the number of steps written.
        `stopped`: the run ends early on purpose, for this reason (the footer's `stopped`);
        `raised`: because the program raised (a fault still unplanted is then no error of its
        own). Warns about determinism switches changed since the header recorded them."""
        if self._finished:
            raise WriteError(f"{self.path}: the trace is finished already")
        self._finished = True
        while self._behind:
            self._write_oldest()
        self._wait_for_writing()
        if self._full_writer is not None:
            self._full_writer.shutdown()
        for hasher in self.hashers.values():
            hasher.close()
        if self.perturbation is not None and not self.perturbation_planted and not raised:
            # The steps recorded stay readable, without a footer: this is not the run asked for.
            raise self.perturbation.unplanted(self.reachable, self._steps_recorded)
        changed = changes(self._switches, determinism_switches())
        if changed:
            print(f"repro.torch: determinism switches changed while recording ({changed}); the header of {self.path} "
                  "holds them as they were when the recorder was created: set them before creating it", file=sys.stderr)
        return self._writer.finish(stopped=stopped)


class StepRecorder:
    """The tensors of one step, in the order recorded."""

    def __init__(self, recorder: Recorder, step: int):
        self.recorder, self.step = recorder, step
        # The step's records as the writer takes them (`TraceWriter.write_laid_out`): each one's
        # layout, its bytes or None, and its data hash, None until its GPU hash lands. Flat lists
        # of plain values, not an object per record: what lives until a step is written (a step
        # later) is what Python's garbage collector walks, at a cost in every full collection.
        self.layouts: list[tuple] = []
        self.data: list = []
        self.hashes: list = []
        self.no_gradient: list[str] = []
        self._nodes = 0
        self.keeps_values = recorder.wants_full(step)
        # The capture ladder's levels at this step: whether it records every module's output, and
        # the dispatch mode that records every op's while the step runs (None: it does not).
        self.records_modules = recorder.wants("modules", step)
        self.ops: Optional[OpOutputs] = OpOutputs(self) if recorder.wants("ops", step) else None
        # Tensors hashed on the GPU this step: (address, version) -> the index of their record;
        # by that index, a weak reference that says the tensor's memory has not been reused, and
        # the strides of a record whose tensor was not contiguous (with the record's dtype and
        # shape, what makes the bytes the same). A record that repeats one of them, here or in
        # the step before (a container module's output is its last child's), takes its hash when
        # the hashes land: the repeat's index, the step of the first, and the first's index there.
        self.hashed_on_gpu: dict = {}
        self._refs: dict = {}
        self._strides: dict = {}
        self._previous: Optional[StepRecorder] = recorder._carried
        self._repeat_at: list[int] = []
        self._repeat_from: list = []
        self._repeat_of: list[int] = []
        self._policy = recorder.flush_policy
        self._policy.step_started(list(recorder.hashers))
        self._watch = self._policy.watch()
        # Module outputs queued and not flushed yet (see `module_output`); the bytes queued
        # since the last flush that the recorder holds as the program's own tensors, and those it
        # holds of its own (copies, tensors it made): what a flush lets go of (`flushes`).
        self._outputs_queued = 0
        self._shared_queued = 0
        self._own_queued = 0

    def perturbed(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """`t`, or `t` moved as REPRO_PERTURB says when it names this tensor at this step. Until
        the fault is planted, `name` is noted among those it could reach (`Recorder.reachable`)."""
        recorder = self.recorder
        p = recorder.perturbation
        if p is None or recorder.perturbation_planted:
            return t
        if p.step == self.step and p.tensor == name:
            moved = p.apply(t)
            recorder.perturbation_planted = True
            recorder.reachable.clear()  # named only by the error for a fault planted nowhere
            return moved
        recorder.reachable.add(name)
        return t

    def record(self, name: str, t: torch.Tensor, kind: str = "activation", phase: Optional[str] = None,
               inputs=(), node: bool = False, source: Optional[str] = None) -> None:
        """Records `t` under `name`; `node`: as the next node of the step's graph."""
        self.queue(name, t, kind, phase, inputs, node, source)
        self.flush()

    def module_output(self, name: str, t: torch.Tensor, source: Optional[str] = None) -> None:
        """Records a module's output as the step's next graph node, from the module's forward
        hook: where the flush policy says the program changes it in place, copied or read at
        once; otherwise queued with the outputs before it and read with them (`flushes`)."""
        nbytes = t.nbytes
        at_hook = self._policy.at_hook(name, nbytes)
        queued = self._queue_one(name, "op_output", "forward", (), True, source, None, None, t, at_hook)
        if not queued:
            return
        if self._watch is not None:
            self._watch.add(name, t)
        if at_hook == READ and queued != READ_AT_ONCE:
            self.flush()  # read at its hook with everything queued before it
        else:
            self._wait_with_outputs()

    def op_output(self, name: str, t: torch.Tensor, phase: str, source: Optional[str], written: bool) -> None:
        """Records an op's output as the step's next graph node, from inside the dispatch mode
        (`ops.OpOutputs`): the program's next op may change it in place, so it is read at once
        or copied (on its GPU), and the copy queued with the module outputs. `written`: the op
        wrote it in place, and its version counter moves only once the op returns, so it is no
        repeat of a record of the same memory and version."""
        at_hook = COPY if t.nbytes <= self.recorder.flush_policy.options.copy_at_hook_max_bytes else READ
        queued = self._queue_one(name, "op_output", phase, (), True, source, None, None, t, at_hook,
                                 repeats=not written)
        if queued == WAITS and at_hook == READ:
            self.flush()  # read now, with everything queued before it
        elif queued:
            self._wait_with_outputs()

    def queue_held(self, name: str, t: torch.Tensor, kind: str, phase: Optional[str]) -> None:
        """`queue` for a tensor the recorder made and alone holds (a rank's share of a gradient
        sum, computed from it): nothing changes it, so it waits with the module outputs, read
        when they are (or when the queue's count or bytes reach its cap)."""
        if self._queue_each([record_fields(name, kind, phase)], [t], own=True):
            self._wait_with_outputs()

    def _wait_with_outputs(self) -> None:
        """Counts a tensor just queued among the outputs waiting to be read, and reads them
        when their count, or the memory they may keep, reaches the flush policy's cap."""
        self._outputs_queued += 1
        if self._outputs_queued >= self._policy.options.max_queued or self._policy.holds_too_much(self._shared_queued, self._own_queued):
            self._flush_outputs()

    def queue(self, name: str, t: torch.Tensor, kind: str = "activation", phase: Optional[str] = None,
              inputs=(), node: bool = False, source: Optional[str] = None, collective: Optional[str] = None,
              shard: Optional[tuple] = None) -> None:
        """`record`, except that a CUDA tensor hashed on its GPU is read only at the next `flush`:
        queue a group of tensors, then flush once, before anything changes them. `shard`: `t` is
        this rank's block of a tensor sharded across the ranks, (the whole's shape, the block's
        offset in it)."""
        self.queue_each([record_fields(name, kind, phase, inputs, node, source, collective, shard)], [t])

    def queue_each(self, fields: list, tensors: list, repeats: bool = True) -> None:
        """`queue` for many tensors at once: `fields[i]`, as `record_fields` makes it, says what
        `tensors[i]`'s record is besides its values. (A model's parameters, gradients and updates
        are queued so, their fields made once for every step.) `repeats=False`: the tensors may
        change in place without moving their version counters (BatchNorm's running statistics),
        so none repeats an earlier record of the same memory and version, nor is repeated."""
        self._queue_each(fields, tensors, repeats=repeats)

    def _queue_each(self, fields: list, tensors: list, own: bool = False, repeats: bool = True) -> int:
        """Queues a record for each tensor (`_queue_one`); how many wait to be read on the GPU."""
        queued = 0
        for (name, kind, phase, inputs, node, source, collective, shard), t in zip(fields, tensors):
            queued += self._queue_one(name, kind, phase, inputs, node, source, collective, shard, t, own=own,
                                      repeats=repeats) != 0
        return queued

    def _queue_one(self, name: str, kind: str, phase, inputs, node: bool, source, collective, shard, t: torch.Tensor,
                   at_hook: str = QUEUE, own: bool = False, repeats: bool = True) -> int:
        """Queues a record of `t` (its fields as `record_fields` names them); `WAITS` where it
        waits to be read on the GPU, `READ_AT_ONCE` where it was read there already, else 0.
        This runs for every tensor of every step (every module output), so
        each tensor's attributes are read once, and what its address, dtype, shape and
        contiguity imply (its device's hasher, its trace dtype, its length) is looked up rather
        than derived again (`Recorder.laid_out`). `at_hook`, the flush policy's word for it
        (`FlushPolicy.at_hook`): `COPY` or `READ`, the program may change the tensor next: one
        read on the GPU is read at once where the hasher can (`DeviceHasher.queue_now`, under
        `xxh3-1k`), and otherwise, for `COPY`, copied there now, the copy read, and for `READ`
        queued as it is (the caller flushes). `own`: the tensor is the
        recorder's, which nothing else holds. `repeats`: the record may repeat an earlier one of
        the same memory and version, and be repeated. The bytes held until the flush are counted,
        the program's and the recorder's own apart (see `_wait_with_outputs`)."""
        position = None
        if node:
            position = self._nodes
            self._nodes = position + 1
        if self.keeps_values and self.recorder._writer.stores_values(name):
            self._append_copied(t, name, kind, phase, inputs, position, source, collective, shard)
            return 0
        recorder = self.recorder
        address, dtype, size, contiguous = t.data_ptr(), t.dtype, t.shape, t.is_contiguous()
        known = recorder.laid_out.get((address, dtype, contiguous))
        if known is None or known[2] != size:
            hasher = recorder.hasher_for(t)
            if hasher is None:
                self._append_copied(t, name, kind, phase, inputs, position, source, collective, shard)
                return 0
            known = recorder.lay_out((address, dtype, contiguous), hasher, IN_PLACE_DTYPES.get(dtype), size, t.nbytes)
        device, trace_dtype, shape, length = known
        try:
            version = t._version
            key = (address, version) if repeats else None
        except RuntimeError:  # an inference-mode tensor has no version counter: never repeated
            version = key = None
        strides = None if contiguous else t.stride()
        if key is not None:
            owner, first = self, self.hashed_on_gpu.get(key)
            if first is None and self._previous is not None:
                owner = self._previous
                first = owner.hashed_on_gpu.get(key)
            if first is not None and owner._refs[first]() is t:
                laid = owner.layouts[first]
                if laid.dtype == trace_dtype and laid.shape == shape and owner._strides.get(first) == strides:
                    index = self._append(Layout(name, kind, trace_dtype, shape, phase, inputs, position, source,
                                                collective, None, shard), None)
                    self._repeat_at.append(index)
                    self._repeat_from.append(owner)
                    self._repeat_of.append(first)
                    if owner is not self:
                        self._hashed(key, index, owner._refs[first], strides)
                    return 0
        in_place = contiguous and trace_dtype is not None  # its memory holds its canonical bytes
        hasher = recorder.hashers[device]
        index = len(self.layouts)
        # The program changes it next: read where it is, at once, where the hasher can (its
        # record is the next one appended), else read from a copy, which nothing else changes
        # (or, to be read with a flush now, as it is).
        read_now = (in_place and at_hook != QUEUE and length > recorder.inline_max_bytes
                    and hasher.queue_now(self, index, address, length))
        if in_place and at_hook != COPY:
            held = t
        elif not read_now:
            if in_place:
                held = t.detach().clone()
            else:
                trace_dtype, shape, held = canonical_on_device(t)
            address, length = held.data_ptr(), held.nbytes
            try:
                version = held._version
            except RuntimeError:  # a copy made in inference mode
                version = None
        self._append(Layout(name, kind, trace_dtype, shape, phase, inputs, position, source, collective, None, shard),
                     b"" if length == 0 else None)
        if length == 0:
            return 0
        if not read_now:
            # The tensor is checked for changes when read (a copy cannot have changed).
            hasher.queue(self, index, address, length, length <= recorder.inline_max_bytes, held, version)
            if held is t and not own:
                self._shared_queued += length
            else:
                self._own_queued += length
        if key is not None:
            self._hashed(key, index, weakref.ref(t), strides)
        return READ_AT_ONCE if read_now else WAITS

    def queue_group(self, group: "RecordGroup", tensors: list) -> None:
        """`queue_each(group.fields, tensors)`, for tensors that were the group's the last time
        (a model's parameters, its gradients): where they still have the dtypes and shapes they
        had then, are contiguous and on the same devices, their records are added together,
        each new one queued for hashing and each repeat (the parameters at a step's start, as
        last updated, or a frozen parameter's update) taking its first record's hash, without
        the per-tensor work."""
        known = group.known
        addresses = [t.data_ptr() for t in tensors]
        if (known is None or self.keeps_values or [t.dtype for t in tensors] != known.dtypes
                or [t.shape for t in tensors] != known.shapes or not all([t.is_contiguous() for t in tensors])
                or addresses != known.addresses and [t.device for t in tensors] != known.devices):
            self._queue_each(group.fields, tensors, repeats=group.repeats)
            group.known = _GroupLayout.of(self, group, tensors, addresses)
            return
        known.addresses = addresses  # on the same devices (a group's gradients move)
        try:
            versions = [t._version for t in tensors]
        except RuntimeError:  # inference-mode tensors: no version counters
            self._queue_each(group.fields, tensors, repeats=group.repeats)
            return
        if not group.repeats:  # every one new, none registered to be repeated
            start = len(self.layouts)
            self._extend(known.layouts)
            known.hasher.queue_many(self, list(range(start, start + len(tensors))), addresses, known.lengths,
                                    known.keeps, tensors, versions)
            return
        keys = list(zip(addresses, versions))
        current, previous, start, n = self.hashed_on_gpu, self._previous, len(self.layouts), len(tensors)
        # What each tensor repeats, as `_queue_each` finds it: a record of this step of the same
        # key, if of this very tensor (a key seen may be another's, since freed: its address
        # reused); else, where this step has none of the key, one of the step before; else
        # nothing (it is new). A frozen parameter's update repeats its record at the step's start.
        here = list(map(current.get, keys))
        mine = _repeats(self, here, tensors)
        if previous is not None:
            before = list(map(previous.hashed_on_gpu.get, keys))
            theirs = [h is None and r for h, r in zip(here, _repeats(previous, before, tensors))]
        else:
            before, theirs = here, [False] * n
        firsts = [h if m else (b if t else None) for h, b, m, t in zip(here, before, mine, theirs)]
        repeated = [i for i, f in enumerate(firsts) if f is not None]
        owners = {i: self if mine[i] else previous for i in repeated}
        # A repeat's record must be of the tensor's dtype and shape, and contiguous.
        laid = [owners[i].layouts[firsts[i]] for i in repeated]
        if [(l.dtype, l.shape) for l in laid] != [known.dtypes_and_shapes[i] for i in repeated] or any(
                firsts[i] in owners[i]._strides for i in repeated):
            self._queue_each(group.fields, tensors)
            return
        self._extend(known.layouts)
        self._repeat_at += [start + i for i in repeated]
        self._repeat_from += [owners[i] for i in repeated]
        self._repeat_of += [firsts[i] for i in repeated]
        new = [i for i, f in enumerate(firsts) if f is None]
        if new:
            known.hasher.queue_many(self, [start + i for i in new], [addresses[i] for i in new],
                                    [known.lengths[i] for i in new], bytes(known.keeps[i] for i in new),
                                    [tensors[i] for i in new], [versions[i] for i in new])
        # Registered as `_queue_each` registers them: the new, and the repeats of the step before.
        registered = [i for i in range(n) if not mine[i]]
        current.update((keys[i], start + i) for i in registered)
        self._refs.update((start + i, previous._refs[firsts[i]] if theirs[i] else weakref.ref(tensors[i]))
                          for i in registered)

    def _extend(self, layouts: list) -> None:
        """Adds records of these layouts, their bytes and hashes to come."""
        self.layouts += layouts
        self.data += [None] * len(layouts)
        self.hashes += [None] * len(layouts)

    def _append_copied(self, t, name, kind, phase, inputs, position, source, collective, shard) -> None:
        """Adds a record of `t` with its canonical bytes copied to the host."""
        dtype, shape, data = canonical(t)
        self._append(Layout(name, kind, dtype, shape, phase, inputs, position, source, collective, None, shard), data)

    def _append(self, layout: tuple, data) -> int:
        """Adds a record (its layout and bytes, its hash to come); its index."""
        self.layouts.append(layout)
        self.data.append(data)
        self.hashes.append(None)
        return len(self.layouts) - 1

    def _hashed(self, key: tuple, index: int, ref, strides) -> None:
        self.hashed_on_gpu[key] = index
        self._refs[index] = ref
        if strides is not None:
            self._strides[index] = strides

    def name_of(self, index: int) -> str:
        """The name of the record at `index`."""
        return self.layouts[index].name

    def fill_repeats(self) -> None:
        """Gives each repeated tensor its first record's hash and bytes (once they have landed),
        and lets go of the step before."""
        for at, owner, first in zip(self._repeat_at, self._repeat_from, self._repeat_of):
            self.data[at], self.hashes[at] = owner.data[first], owner.hashes[first]
        self._repeat_from, self._previous = [], None

    def flush(self) -> None:
        """Launches the GPU hashing of the tensors queued, read in order with the program's
        stream (see `DeviceHasher`)."""
        self._outputs_queued = self._shared_queued = self._own_queued = 0
        for hasher in self.recorder.hashers.values():
            hasher.flush()

    def _flush_outputs(self) -> None:
        """Launches the GPU hashing of the module outputs queued, as the flush policy says; one
        read in order with the program's stream measures how much of the program's memory the
        recorder alone kept (`FlushPolicy.measure`)."""
        shared, own = self._shared_queued, self._own_queued
        self._outputs_queued = self._shared_queued = self._own_queued = 0
        hashers = self.recorder.hashers
        measure = self._policy.measure(shared, list(hashers))
        for hasher in hashers.values():
            hasher.flush()
        if measure is not None:
            measure.done(own)

    def end(self) -> None:
        """The step's block is over: reads everything queued and ends the flush policy's watch.
        What is still read beside the program is let go as it is done (see `DeviceHasher`)."""
        self._flush_outputs()
        if self._watch is not None:
            self._watch.finish()
        self._policy.step_ended()


def _repeats(owner: Optional["StepRecorder"], firsts: list, tensors: list) -> list:
    """For each tensor, whether `owner`'s record at its index in `firsts` (None: none) is of it."""
    if owner is None:
        return [False] * len(tensors)
    refs = owner._refs
    return [first is not None and refs[first]() is t for first, t in zip(firsts, tensors)]


class RecordGroup:
    """Records made of the same tensors at every step (`StepRecorder.queue_group`): their fields
    (`record_fields`, none a graph node), whether they may repeat earlier records (see
    `StepRecorder.queue_each`), and how the tensors were laid out when last queued."""

    def __init__(self, fields: list, repeats: bool = True):
        if any(node for _, _, _, _, node, _, _, _ in fields):
            raise ValueError("a record group's records are not graph nodes")
        self.fields = fields
        self.repeats = repeats
        self.known: Optional[_GroupLayout] = None


class _GroupLayout:
    """A group's tensors as last queued, all contiguous and hashed in place on one GPU: their
    addresses, devices, dtypes and shapes, each record's layout, its trace dtype and shape, and
    what the hasher takes for each. Tensors of the same dtypes and shapes at the same addresses
    are on the same devices (see `Recorder.lay_out`); elsewhere, their devices are compared."""

    def __init__(self, hasher, addresses, devices, dtypes, shapes, layouts, lengths, keeps):
        self.hasher, self.addresses, self.devices, self.dtypes, self.shapes = hasher, addresses, devices, dtypes, shapes
        self.layouts, self.lengths, self.keeps = layouts, lengths, keeps
        self.dtypes_and_shapes = [(layout.dtype, layout.shape) for layout in layouts]

    @staticmethod
    def of(step: "StepRecorder", group: RecordGroup, tensors: list, addresses: list) -> Optional["_GroupLayout"]:
        """The layout of `tensors`, just queued by `step` as `group`'s records; None unless every
        one is contiguous, not empty and hashed in place on the same GPU."""
        if step.keeps_values or not tensors:
            return None
        laid_out, found = step.recorder.laid_out, []
        for t, address in zip(tensors, addresses):
            known = laid_out.get((address, t.dtype, True)) if t.is_contiguous() else None
            # Hashed in place (a trace dtype, bytes to read), and by the first one's hasher.
            if known is None or known[2] != t.shape or known[1] is None or known[3] == 0:
                return None
            if found and known[0] != found[0][0]:
                return None
            found.append(known)
        inline_max = step.recorder.inline_max_bytes
        return _GroupLayout(
            step.recorder.hashers[found[0][0]], addresses, [t.device for t in tensors], [t.dtype for t in tensors],
            [t.shape for t in tensors],
            [Layout(name, kind, trace_dtype, shape, phase, inputs, None, source, collective, None, shard)
             for (name, kind, phase, inputs, _, source, collective, shard), (_, trace_dtype, shape, _)
             in zip(group.fields, found)],
            [length for _, _, _, length in found], bytes(length <= inline_max for _, _, _, length in found),
        )


def record_fields(name: str, kind: str = "activation", phase: Optional[str] = None, inputs=(), node: bool = False,
                  source: Optional[str] = None, collective: Optional[str] = None, shard: Optional[tuple] = None) -> tuple:
    """What a record is besides its tensor's values, as `StepRecorder.queue_each` takes it (see
    `StepRecorder.queue` for the fields)."""
    if shard is not None:
        shard = (tuple(int(d) for d in shard[0]), tuple(int(o) for o in shard[1]))
    return (name, kind, phase, tuple(inputs), node, source, collective, shard)


def _with_perturbation(run: dict, perturbation: Perturbation) -> dict:
    """The run settings `run` with the planted fault as `perturb` (as repro's built-in workloads
    keep `--perturb`), so that `repro diff` says a faulted run's config differs from a clean
    one's; a `perturb` setting of the program's own is refused."""
    if "perturb" in run or "perturb" in (run.get("params") or {}):
        raise WriteError(f"the run setting `perturb` is the planted fault's (REPRO_PERTURB={perturbation}): name the "
                         "program's own setting otherwise")
    return {**run, "perturb": str(perturbation)}


def _rank_stream(run_dir: str, place: RankPlace) -> str:
    """Where rank `place` records in the run directory `run_dir` (`run_dir/rank-N`); a run
    directory that holds a single trace itself is refused (readers would see that trace alone)."""
    if os.path.exists(os.path.join(run_dir, RECORDS_FILE)):
        raise WriteError(f"{run_dir} holds a single process's trace: a run of {place.world_size} ranks records into "
                         "a directory of its own (one `rank-N` each)")
    return place.stream_dir(run_dir)
