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

from repro_trace import RECORDS_FILE
from repro_writer import TraceWriter, WriteError

from .cuda_hash import CUDA_HASH_LIB, CUDA_HASH_LIB_ENV, DeviceHasher, cuda_hash_library_path
from .flushes import MAX_QUEUED, MAX_QUEUED_BYTES, FlushPolicy
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


class Recorder:
    """Records steps of named tensors into a trace (see `StepRecorder`)."""

    def __init__(
        self,
        path: str,
        run: dict,
        capture: str = "first-and-last",
        inline_max_bytes: int = 256,
        replace: bool = False,
        device: Optional[torch.device] = None,
        perturbation: Optional[Perturbation] = None,
        device_hashing: Optional[bool] = None,
        place=AUTO,
    ):
        """`device_hashing`: hash CUDA tensors on their GPU (True: it is an error if repro's GPU
        hashing library is not found), on the host (False), or on the GPU where the library is
        found (None). `place`: this process's rank in a run of several (`ranks.RankPlace`), whose
        stream goes to `path/rank-N`; None for a lone process; by default, as torch.distributed
        says."""
        self.place: Optional[RankPlace] = current_place() if place == AUTO else place
        self.run_dir = path
        if self.place is not None:
            path = _rank_stream(path, self.place)
        self._switches = determinism_switches()
        self._writer = TraceWriter(path, run, capture, inline_max_bytes, replace, environment(device, self._switches),
                                   distributed=self.place.header() if self.place is not None else None)
        self.perturbation = perturbation
        self.path = path
        self.inline_max_bytes = inline_max_bytes
        self._library = cuda_hash_library_path() if device_hashing is not False else None
        if device_hashing and self._library is None:
            raise WriteError(
                f"device_hashing=True, but repro's GPU hashing library is not found: build it with `make cuda` "
                f"and set {CUDA_HASH_LIB_ENV} to target/cuda/release/{CUDA_HASH_LIB}"
            )
        self._hashers: dict[int, DeviceHasher] = {}
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
        self.flush_policy = FlushPolicy()
        # The last step recorded (see `StepRecorder`): a parameter recorded at a step's start,
        # unchanged since the last step recorded it updated, repeats that record.
        self._carried: Optional[StepRecorder] = None

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
                    f"repro_torch: hashing CUDA tensors on the host (a copy each): repro's GPU hashing library was not "
                    f"found; build it with `make cuda` and set {CUDA_HASH_LIB_ENV}",
                    file=sys.stderr,
                )
            return None
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self._hashers:
            self._hashers[index] = DeviceHasher(self._library, index)
        return self._hashers[index]

    @property
    def hashes_on_gpu(self) -> bool:
        """Whether CUDA tensors are hashed on the GPU."""
        return self._library is not None

    @classmethod
    def create_or_gated(cls, path: str, run: dict, device: Optional[torch.device] = None, **options) -> "Recorder":
        """Records as a repro command running this program asks (`repro record -- CMD`, `gate --
        CMD`: REPRO_TRACE_DIR, REPRO_CAPTURE, REPRO_REPLACE, REPRO_PERTURB, REPRO_PERTURB_RANK), and
        into `path` with `options` otherwise. A trace already there is an error unless replacing is
        asked for. A rank of several records into `path/rank-N`."""
        env = os.environ
        if env.get("REPRO_TRACE_DIR"):
            path = env["REPRO_TRACE_DIR"]
        if env.get("REPRO_CAPTURE"):
            options["capture"] = env["REPRO_CAPTURE"]
        if env.get("REPRO_REPLACE") not in (None, "", "0", "1"):
            raise WriteError(f"REPRO_REPLACE={env['REPRO_REPLACE']}: expected 1 or 0")
        if env.get("REPRO_REPLACE") == "1":
            options["replace"] = True
        place = options.pop("place", AUTO)
        place = current_place() if place == AUTO else place
        if env.get("REPRO_PERTURB") and perturbs_this_rank(place):
            options["perturbation"] = Perturbation(env["REPRO_PERTURB"])
        if env.get("REPRO_AGAINST"):
            print(
                "repro_torch: REPRO_AGAINST is compared after the run by the repro command, not while recording",
                file=sys.stderr,
            )
        return cls(path, run, device=device, place=place, **options)

    def wants_full(self, step: int) -> bool:
        return self._writer.wants_full(step, first=self._first)

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
            yield s
            s.end()
        except BaseException:
            for hasher in self._hashers.values():
                hasher.abandon()  # what the step queued, let go
            raise
        if self.place is not None:
            self._writer.mark_progress(step, "done")
        reads = [hasher.start_read() for hasher in self._hashers.values()]
        self._carried = s
        self._behind.append((s, reads))
        while len(self._behind) > (1 if reads else 0):
            self._write_oldest()

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

    def finish(self) -> int:
        """Writes what is still on its way and finishes the trace; the number of steps written.
        Warns about determinism switches changed since the header recorded them."""
        while self._behind:
            self._write_oldest()
        self._wait_for_writing()
        if self._full_writer is not None:
            self._full_writer.shutdown()
        for hasher in self._hashers.values():
            hasher.close()
        changed = changes(self._switches, determinism_switches())
        if changed:
            print(f"repro_torch: determinism switches changed while recording ({changed}); the header of {self.path} "
                  "holds them as they were when the recorder was created: set them before creating it", file=sys.stderr)
        return self._writer.finish()


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
        # Tensors hashed on the GPU this step: (address, version) -> the index of their record;
        # by that index, a weak reference that says the tensor's memory has not been reused, and
        # the dtype, shape and strides that, with the address and version, make its bytes the
        # same. A record that repeats one of them, here or in the step before (a container
        # module's output is its last child's), takes its hash when the hashes land: the
        # repeat's index, the step of the first, and the first's index there.
        self.hashed_on_gpu: dict = {}
        self._refs: dict = {}
        self._geometry: dict = {}
        self._previous: Optional[StepRecorder] = recorder._carried
        self._repeat_at: list[int] = []
        self._repeat_from: list = []
        self._repeat_of: list[int] = []
        self._policy = recorder.flush_policy
        self._watch = self._policy.watch()
        # Module outputs queued and not flushed yet, and their bytes (see `module_output`).
        self._outputs_queued = 0
        self._bytes_queued = 0

    def perturbed(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """`t`, or `t` moved as REPRO_PERTURB says when it names this tensor at this step."""
        p = self.recorder.perturbation
        if p is not None and p.step == self.step and p.tensor == name:
            return p.apply(t)
        return t

    def record(self, name: str, t: torch.Tensor, kind: str = "activation", phase: Optional[str] = None,
               inputs=(), node: bool = False, source: Optional[str] = None) -> None:
        """Records `t` under `name`; `node`: as the next node of the step's graph."""
        self.queue(name, t, kind, phase, inputs, node, source)
        self.flush()

    def module_output(self, name: str, t: torch.Tensor, source: Optional[str] = None) -> None:
        """Records a module's output as the step's next graph node, from the module's forward
        hook: read at once where the flush policy says the program may change it in place,
        otherwise queued with the outputs before it and read with them (`flushes`)."""
        hashed = self._queue(name, t, "op_output", "forward", (), True, source, None, None)
        if not hashed:
            return
        if self._watch is not None:
            self._watch.add(name, t)
        self._outputs_queued += 1
        self._bytes_queued += t.nbytes
        if self._policy.reads_at_hook(name):
            self.flush()
        elif self._outputs_queued >= MAX_QUEUED or self._bytes_queued >= MAX_QUEUED_BYTES:
            self._flush_outputs()

    def queue(self, name: str, t: torch.Tensor, kind: str = "activation", phase: Optional[str] = None,
              inputs=(), node: bool = False, source: Optional[str] = None, collective: Optional[str] = None,
              shard: Optional[tuple] = None) -> None:
        """`record`, except that a CUDA tensor hashed on its GPU is read only at the next `flush`:
        queue a group of tensors, then flush once, before anything changes them. `shard`: `t` is
        this rank's block of a tensor sharded across the ranks, (the whole's shape, the block's
        offset in it)."""
        if self._outputs_queued and self._policy.beside:
            self._flush_outputs()  # read beside, not with what follows
        self._queue(name, t, kind, phase, inputs, node, source, collective, shard)

    def _queue(self, name, t, kind, phase, inputs, node, source, collective, shard) -> bool:
        """Queues a record; whether its tensor waits to be read on the GPU. (Runs for every
        tensor of every step: each of the tensor's attributes is read once.)"""
        position = None
        if node:
            position, self._nodes = self._nodes, self._nodes + 1
        inputs = tuple(inputs)
        if shard is not None:
            shard = (tuple(int(d) for d in shard[0]), tuple(int(o) for o in shard[1]))
        hasher = None if self.keeps_values else self.recorder.hasher_for(t)
        if hasher is None:
            dtype, shape, data = canonical(t)
            self._append((name, kind, dtype, shape, phase, inputs, position, source, collective, None, shard), data)
            return False
        dtype, address = t.dtype, t.data_ptr()
        try:
            version = t._version
            key = (address, version)
        except RuntimeError:  # an inference-mode tensor has no version counter: never repeated
            version, key = None, None
        shape = tuple(t.shape)
        geometry = (dtype, shape, t.stride())
        if key is not None:
            owner = self
            first = self.hashed_on_gpu.get(key)
            if first is None and self._previous is not None:
                owner = self._previous
                first = owner.hashed_on_gpu.get(key)
            if first is not None and owner._refs[first]() is t and owner._geometry[first] == geometry:
                laid = owner.layouts[first]
                index = self._append((name, kind, laid[2], laid[3], phase, inputs, position, source, collective,
                                      None, shard), None)
                self._repeat_at.append(index)
                self._repeat_from.append(owner)
                self._repeat_of.append(first)
                if owner is not self:
                    self._hashed(key, index, owner._refs[first], geometry)
                return False
        trace_dtype = IN_PLACE_DTYPES.get(dtype)
        if trace_dtype is not None and t.is_contiguous():
            held, own = t, True
        else:
            trace_dtype, shape, held = canonical_on_device(t)
            own, address = False, held.data_ptr()
        index = self._append((name, kind, trace_dtype, shape, phase, inputs, position, source, collective, None,
                              shard), None)
        length = held.nbytes
        if length == 0:
            self.data[index] = b""
            return False
        # The program's own tensor is checked for changes when read; a copy cannot change.
        hasher.queue(self, index, address, length, length <= self.recorder.inline_max_bytes, held,
                     version if own else None)
        if key is not None:
            self._hashed(key, index, weakref.ref(t), geometry)
        return True

    def _append(self, layout: tuple, data) -> int:
        """Adds a record (its layout and bytes, its hash to come); its index."""
        self.layouts.append(layout)
        self.data.append(data)
        self.hashes.append(None)
        return len(self.layouts) - 1

    def _hashed(self, key: tuple, index: int, ref, geometry: tuple) -> None:
        self.hashed_on_gpu[key] = index
        self._refs[index] = ref
        self._geometry[index] = geometry

    def name_of(self, index: int) -> str:
        """The name of the record at `index`."""
        return self.layouts[index][0]

    def fill_repeats(self) -> None:
        """Gives each repeated tensor its first record's hash and bytes (once they have landed),
        and lets go of the step before."""
        for at, owner, first in zip(self._repeat_at, self._repeat_from, self._repeat_of):
            self.data[at], self.hashes[at] = owner.data[first], owner.hashes[first]
        self._repeat_from, self._previous = [], None

    def flush(self) -> None:
        """Launches the GPU hashing of the tensors queued, read in order with the program's
        stream (see `DeviceHasher`)."""
        self._outputs_queued = self._bytes_queued = 0
        for hasher in self.recorder._hashers.values():
            hasher.flush()

    def _flush_outputs(self) -> None:
        """Launches the GPU hashing of the module outputs queued, as the flush policy says."""
        self._outputs_queued = self._bytes_queued = 0
        for hasher in self.recorder._hashers.values():
            hasher.flush(beside=self._policy.beside)

    def end(self) -> None:
        """The step's block is over: reads everything queued and ends the flush policy's watch.
        What is still read beside the program is let go as it is done (see `DeviceHasher`)."""
        self._flush_outputs()
        if self._watch is not None:
            self._watch.finish()


def _rank_stream(run_dir: str, place: RankPlace) -> str:
    """Where rank `place` records in the run directory `run_dir` (`run_dir/rank-N`); a run
    directory that holds a single trace itself is refused (readers would see that trace alone)."""
    if os.path.exists(os.path.join(run_dir, RECORDS_FILE)):
        raise WriteError(f"{run_dir} holds a single process's trace: a run of {place.world_size} ranks records into "
                         "a directory of its own (one `rank-N` each)")
    return place.stream_dir(run_dir)
