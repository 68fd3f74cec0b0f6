"""Recording PyTorch runs into repro traces, so `repro diff` compares them with candle runs and
with each other (docs/pytorch.md).

`ModelRecorder` records a `torch.nn.Module` with no per-op code: at every step the inputs by the
names given, the parameters by their `state_dict` names, every module's output by its module
path (forward hooks, in call order: a topological order of the module graph, recorded as the
graph's nodes), the loss, the gradients (`NAME.grad`) and the updated parameters
(`NAME.updated`), as repro's own capture names them. A module's output records, as its
`source`, the line of the program's code that called the module (the first frame on the stack
outside torch and this module).

    rec = ModelRecorder.create_or_gated("runs/torch", {"workload": "mine", "steps": 10}, model)
    for step in range(10):
        with rec.training_step(step, inputs={"x": x, "y": y}) as s:
            loss = loss_fn(model(x), y)
            s.loss(loss)
            loss.backward()
            s.gradients()
            opt.step()
    rec.finish()

Run under `repro record -- python train.py` or `repro gate -- python train.py`, it records where
repro says, through the same environment contract as repro's library (docs/capture.md):
REPRO_TRACE_DIR, REPRO_CAPTURE, REPRO_REPLACE and REPRO_PERTURB. REPRO_AGAINST is compared
after the run by the repro command, not while recording. REPRO_PERTURB adds a constant to a
module's output in the autograd graph, so gradients flow through the moved element as through a
real fault.

The trace's header records the program's determinism switches as they are when the recorder is
created (`determinism_switches`), in its environment beside the numerics variables
(CUBLAS_WORKSPACE_CONFIG among them): `repro diff` lists those that differ between two runs, and a
failing gate against a baseline names them as likely causes. Set them before creating the
recorder; `finish` warns about any changed since.

CUDA tensors are hashed on their GPU by repro's own kernels (`librepro_cuda_hash.so`, built by
`make cuda`; found through REPRO_CUDA_HASH_LIB, which repro sets for the programs it runs, or
beside the `repro` on PATH): only 32 bytes a tensor reach the host, except at the steps that keep
full values and for tensors small enough to be stored inline. Without the library, and for CPU
tensors, values are copied to the host and hashed there. Either way the hash is the canonical one
of section 5 of docs/trace-format.md (little-endian, row-major bytes); `bool` tensors are
recorded as `U8`.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import sys
import weakref
from contextlib import contextmanager
from typing import Iterator, Optional

import numpy as np
import torch

from repro_writer import Environment, Record, TraceWriter, WriteError, cpu_model

_DTYPES = {
    torch.uint8: "U8", torch.int16: "I16", torch.int32: "I32", torch.int64: "I64",
    torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32", torch.float64: "F64",
}
if hasattr(torch, "uint32"):
    _DTYPES[torch.uint32] = "U32"
_INT_OF_WIDTH = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def canonical_on_device(t: torch.Tensor) -> tuple[str, list[int], torch.Tensor]:
    """A tensor's trace dtype, shape and canonical element bytes as a flat `uint8` tensor where
    the tensor lives (row-major; little-endian, as every device PyTorch runs on)."""
    t = t.detach()
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    dtype = _DTYPES.get(t.dtype)
    if dtype is None:
        raise WriteError(f"cannot record tensors of dtype {t.dtype}")
    if sys.byteorder != "little":  # pragma: no cover
        raise WriteError("the canonical bytes are little-endian; this host is not")
    flat = t.contiguous().reshape(-1)
    return dtype, list(t.shape), flat.view(torch.uint8) if flat.numel() else flat.new_empty(0, dtype=torch.uint8)


def canonical(t: torch.Tensor) -> tuple[str, list[int], bytes]:
    """A tensor's trace dtype, shape and canonical element bytes (row-major, little-endian)."""
    dtype, shape, flat = canonical_on_device(t)
    return dtype, shape, flat.cpu().numpy().tobytes() if flat.numel() else b""


def record_of(name: str, kind: str, t: torch.Tensor, **what) -> Record:
    dtype, shape, data = canonical(t)
    return Record(name, kind, dtype, shape, data, **what)


CUDA_HASH_LIB_ENV = "REPRO_CUDA_HASH_LIB"
_CUDA_HASH_LIB = "librepro_cuda_hash.so"


def cuda_hash_library_path() -> Optional[str]:
    """Where repro's GPU hashing library is: REPRO_CUDA_HASH_LIB, else beside the `repro` on
    PATH (in its folder or its `examples/`, where `make cuda` builds it); None if nowhere."""
    path = os.environ.get(CUDA_HASH_LIB_ENV)
    if path:
        if not os.path.isfile(path):
            raise WriteError(f"{CUDA_HASH_LIB_ENV}={path}: no such file (build it with `make cuda`)")
        return path
    repro = shutil.which("repro")
    if repro:
        folder = os.path.dirname(os.path.realpath(repro))
        for candidate in (os.path.join(folder, _CUDA_HASH_LIB), os.path.join(folder, "examples", _CUDA_HASH_LIB)):
            if os.path.isfile(candidate):
                return candidate
    return None


_LOADED: dict = {}


def _cuda_hash_library(path: str) -> ctypes.CDLL:
    if path not in _LOADED:
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise WriteError(f"cannot load repro's GPU hashing library {path}: {e}") from None
        lib.repro_cuda_hasher_new.restype = ctypes.c_void_p
        lib.repro_cuda_hasher_new.argtypes = [ctypes.c_int32]
        lib.repro_cuda_hasher_push.restype = ctypes.c_int64
        lib.repro_cuda_hasher_push.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int32]
        lib.repro_cuda_hasher_flush.restype = ctypes.c_int32
        lib.repro_cuda_hasher_flush.argtypes = [ctypes.c_void_p]
        lib.repro_cuda_hasher_start_read.restype = ctypes.c_void_p
        lib.repro_cuda_hasher_start_read.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]
        lib.repro_cuda_read_finish.restype = ctypes.c_int32
        lib.repro_cuda_read_finish.argtypes = [
            ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_uint64,
        ]
        lib.repro_cuda_hasher_free.restype = None
        lib.repro_cuda_hasher_free.argtypes = [ctypes.c_void_p]
        lib.repro_cuda_last_error.restype = ctypes.c_char_p
        _LOADED[path] = lib
    return _LOADED[path]


class DeviceHasher:
    """repro's batched BLAKE3 kernels over one GPU's tensors, in place (librepro_cuda_hash.so).

    `queue` takes a record and its canonical bytes on the GPU; `flush` launches the kernels over
    what is queued without waiting; `start_read` queues the copy of a step's hashes to the host,
    and the `DeviceRead` it returns fills each record's `data_hash` (and `data`, for those queued
    with `keep_bytes`) when finished, a step later, so the GPU never waits for the host. The
    kernels run on CUDA's per-thread default stream, which CUDA orders both ways with the legacy
    default stream that PyTorch uses unless told otherwise: once flushed, a tensor may be freed
    or changed in place by what the program does next. On another stream, `flush` synchronizes
    it first and finishes the read at once."""

    def __init__(self, path: str, index: int):
        self._lib = _cuda_hash_library(path)
        self.index = index
        self._handle = self._lib.repro_cuda_hasher_new(index)
        if not self._handle:
            raise WriteError(_last_error(self._lib))
        self._queued: list = []  # (record, bytes on the GPU, keep_bytes) until flushed
        self._flushed: list = []  # (record, length kept or None) until read

    def queue(self, record: Record, flat: torch.Tensor, keep_bytes: bool) -> None:
        if self._lib.repro_cuda_hasher_push(self._handle, flat.data_ptr(), flat.numel(), int(keep_bytes)) < 0:
            raise WriteError(_last_error(self._lib))
        self._queued.append((record, flat, keep_bytes))

    def flush(self) -> None:
        if not self._queued:
            return
        stream = torch.cuda.current_stream(self.index)
        legacy = stream.cuda_stream == 0
        if not legacy:
            stream.synchronize()
        if self._lib.repro_cuda_hasher_flush(self._handle) != 0:
            raise WriteError(_last_error(self._lib))
        self._flushed.extend((record, flat.numel() if keep else None) for record, flat, keep in self._queued)
        self._queued = []  # the tensors may go: what reuses their memory waits for the kernels
        if not legacy:
            self.start_read().finish()

    def start_read(self) -> "DeviceRead":
        """Flushes, and starts copying the hashes of everything flushed to the host."""
        self.flush()
        n = ctypes.c_uint64(0)
        handle = self._lib.repro_cuda_hasher_start_read(self._handle, ctypes.byref(n))
        records, self._flushed = self._flushed, []
        if not handle:
            raise WriteError(_last_error(self._lib))
        if n.value != len(records):
            raise WriteError(f"the GPU hasher holds {n.value} tensors, {len(records)} were queued")
        return DeviceRead(self._lib, handle, records)

    def close(self) -> None:
        if self._handle:
            self._lib.repro_cuda_hasher_free(self._handle)
            self._handle = None

    def __del__(self):
        self.close()


class DeviceRead:
    """A step's hashes on their way from the GPU (see `DeviceHasher.start_read`)."""

    def __init__(self, lib, handle, records: list):
        self._lib, self._handle, self._records = lib, handle, records

    def finish(self) -> None:
        """Waits for the copy (this step's work only) and fills the records."""
        if self._handle is None:
            return
        handle, self._handle = self._handle, None
        n = len(self._records)
        kept = sum(length or 0 for _, length in self._records)
        hashes, values = ctypes.create_string_buffer(max(32 * n, 1)), ctypes.create_string_buffer(max(kept, 1))
        if self._lib.repro_cuda_read_finish(handle, hashes, n, values, kept) != 0:
            raise WriteError(_last_error(self._lib))
        at, raw, kept_raw = 0, hashes.raw, values.raw
        for i, (record, length) in enumerate(self._records):
            record.data_hash = raw[32 * i : 32 * i + 32]
            if length is not None:
                record.data = kept_raw[at : at + length]
                at += length

    def __del__(self):
        try:
            self.finish()
        except WriteError:
            pass


def _last_error(lib) -> str:
    message = lib.repro_cuda_last_error()
    return message.decode(errors="replace") if message else "unknown error"


class Perturbation:
    """A planted fault, `STEP:TENSOR:ULPS[@ELEMENT]` (REPRO_PERTURB): element ELEMENT of the
    tensor of that name moves by ULPS representable values at step STEP."""

    def __init__(self, text: str):
        try:
            step, rest = text.split(":", 1)
            tensor, ulps = rest.rsplit(":", 1)
            ulps, _, element = ulps.partition("@")
            self.step, self.tensor, self.ulps = int(step), tensor, int(ulps)
            self.element = int(element) if element else 0
        except ValueError:
            raise WriteError(f"REPRO_PERTURB={text}: expected STEP:TENSOR:ULPS[@ELEMENT]") from None
        if self.ulps == 0 or not tensor:
            raise WriteError(f"REPRO_PERTURB={text}: expected STEP:TENSOR:ULPS[@ELEMENT]")

    def apply(self, t: torch.Tensor) -> torch.Tensor:
        """`t` plus a constant that moves its element (floats only) and leaves every other element
        bit for bit: a fault in the autograd graph, so gradients flow through the moved element as
        through a real one (replacing the element would cut them)."""
        if not t.is_floating_point():
            raise WriteError(f"REPRO_PERTURB: `{self.tensor}` is {t.dtype}, not a float tensor")
        if self.element >= t.numel():
            raise WriteError(f"REPRO_PERTURB: `{self.tensor}` has {t.numel()} elements, no element {self.element}")
        original = t.detach().reshape(-1)[self.element : self.element + 1]
        moved = self._moved(original)
        # x + -0.0 is x for every x, -0.0 included (x + 0.0 would turn -0.0 into +0.0).
        delta = torch.full((t.numel(),), -0.0, dtype=t.dtype, device=t.device)
        delta[self.element : self.element + 1] = moved - original
        out = t + delta.reshape(t.shape)
        if not _same_bits(out.detach().reshape(-1)[self.element : self.element + 1], moved):
            raise WriteError(f"REPRO_PERTURB: element {self.element} of `{self.tensor}` ({original.item()}) cannot be "
                             f"moved by {self.ulps} ULPs: the difference is no {t.dtype} value to add")
        return out

    def _moved(self, value: torch.Tensor) -> torch.Tensor:
        """A copy of the one-element float tensor `value` moved by ULPS representable values
        (-0.0 and +0.0 counting as one)."""
        value = value.clone()
        width = value.element_size()
        ints = value.view(_INT_OF_WIDTH[width])
        bits = int(ints.item()) & ((1 << (8 * width)) - 1)
        sign = 1 << (8 * width - 1)
        ordinal = (-(bits & (sign - 1)) if bits & sign else bits) + self.ulps
        bits = sign | -ordinal if ordinal < 0 else ordinal
        if bits >= sign:
            bits -= 1 << (8 * width)  # as the signed integer of that width
        ints.fill_(bits)
        return value


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two float tensors of one dtype hold the same bits (NaN payloads and zeros' signs
    included)."""
    ints = _INT_OF_WIDTH[a.element_size()]
    return torch.equal(a.view(ints), b.view(ints))


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
    ):
        """`device_hashing`: hash CUDA tensors on their GPU (True: it is an error if repro's GPU
        hashing library is not found), on the host (False), or on the GPU where the library is
        found (None)."""
        self._switches = determinism_switches()
        self._writer = TraceWriter(path, run, capture, inline_max_bytes, replace, _environment(device, self._switches))
        self.perturbation = perturbation
        self.path = path
        self.inline_max_bytes = inline_max_bytes
        self._library = cuda_hash_library_path() if device_hashing is not False else None
        if device_hashing and self._library is None:
            raise WriteError(
                f"device_hashing=True, but repro's GPU hashing library is not found: build it with `make cuda` "
                f"and set {CUDA_HASH_LIB_ENV} to target/cuda/release/examples/{_CUDA_HASH_LIB}"
            )
        self._hashers: dict[int, DeviceHasher] = {}
        self._warned = device_hashing is False
        self._first: Optional[int] = None
        self._last: Optional[int] = None
        # Steps recorded whose GPU hashes are still on their way: written a step later.
        self._behind: list = []

    def hasher_for(self, t: torch.Tensor) -> Optional[DeviceHasher]:
        """The GPU hasher of a CUDA tensor's device, or None (a CPU tensor, or no library)."""
        if t.device.type != "cuda":
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
        index = t.device.index if t.device.index is not None else torch.cuda.current_device()
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
        CMD`: REPRO_TRACE_DIR, REPRO_CAPTURE, REPRO_REPLACE, REPRO_PERTURB), and into `path` with
        `options` otherwise. A trace already there is an error unless replacing is asked for."""
        env = os.environ
        if env.get("REPRO_TRACE_DIR"):
            path = env["REPRO_TRACE_DIR"]
        if env.get("REPRO_CAPTURE"):
            options["capture"] = env["REPRO_CAPTURE"]
        if env.get("REPRO_REPLACE") not in (None, "", "0", "1"):
            raise WriteError(f"REPRO_REPLACE={env['REPRO_REPLACE']}: expected 1 or 0")
        if env.get("REPRO_REPLACE") == "1":
            options["replace"] = True
        if env.get("REPRO_PERTURB"):
            options["perturbation"] = Perturbation(env["REPRO_PERTURB"])
        if env.get("REPRO_AGAINST"):
            print(
                "repro_torch: REPRO_AGAINST is compared after the run by the repro command, not while recording",
                file=sys.stderr,
            )
        return cls(path, run, device=device, **options)

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
        try:
            yield s
        except BaseException:
            for hasher in self._hashers.values():
                hasher.start_read().finish()  # what the step queued, let go
            raise
        reads = [hasher.start_read() for hasher in self._hashers.values()]
        self._behind.append((s, reads))
        while len(self._behind) > (1 if reads else 0):
            self._write_oldest()

    def _write_oldest(self) -> None:
        s, reads = self._behind.pop(0)
        for read in reads:
            read.finish()
        s.fill_repeats()
        self._writer.write_step(s.step, s.records, s.no_gradient)

    def finish(self) -> int:
        """Writes what is still on its way and finishes the trace; the number of steps written.
        Warns about determinism switches changed since the header recorded them."""
        while self._behind:
            self._write_oldest()
        for hasher in self._hashers.values():
            hasher.close()
        changed = _changes(self._switches, determinism_switches())
        if changed:
            print(f"repro_torch: determinism switches changed while recording ({changed}); the header of {self.path} "
                  "holds them as they were when the recorder was created: set them before creating it", file=sys.stderr)
        return self._writer.finish()


class StepRecorder:
    """The tensors of one step, in the order recorded."""

    def __init__(self, recorder: Recorder, step: int):
        self.recorder, self.step = recorder, step
        self.records: list[Record] = []
        self.no_gradient: list[str] = []
        self._nodes = 0
        self._full = recorder.wants_full(step)
        # Tensors hashed on the GPU this step, by what makes their bytes the same (storage,
        # layout, version), with a weak reference that says their memory has not been reused;
        # and the records that repeat one of them (a container module's output is its last
        # child's), filled from it when the hashes land.
        self._hashed: dict = {}
        self._repeats: list = []

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

    def queue(self, name: str, t: torch.Tensor, kind: str = "activation", phase: Optional[str] = None,
              inputs=(), node: bool = False, source: Optional[str] = None) -> None:
        """`record`, except that a CUDA tensor hashed on its GPU is read only at the next `flush`:
        queue a group of tensors, then flush once, before anything changes them."""
        position = None
        if node:
            position, self._nodes = self._nodes, self._nodes + 1
        what = dict(phase=phase, inputs=tuple(inputs), node=position, source=source)
        hasher = None if self._full else self.recorder.hasher_for(t)
        if hasher is None:
            self.records.append(record_of(name, kind, t, **what))
            return
        try:
            key = (t.data_ptr(), t.dtype, tuple(t.shape), t.stride(), t._version)
        except RuntimeError:  # an inference-mode tensor has no version counter: never repeated
            key = None
        seen = self._hashed.get(key) if key is not None else None
        if seen is not None and seen[0]() is t:
            record = Record(name, kind, seen[1].dtype, seen[1].shape, None, **what)
            self._repeats.append((record, seen[1]))
            self.records.append(record)
            return
        dtype, shape, flat = canonical_on_device(t)
        record = Record(name, kind, dtype, shape, None, **what)
        if flat.numel() == 0:
            record.data = b""
        else:
            hasher.queue(record, flat, keep_bytes=flat.numel() <= self.recorder.inline_max_bytes)
            if key is not None:
                self._hashed[key] = (weakref.ref(t), record)
        self.records.append(record)

    def fill_repeats(self) -> None:
        """Gives each repeated tensor its first record's hash and bytes (once they have landed)."""
        for record, first in self._repeats:
            record.data, record.data_hash = first.data, first.data_hash

    def flush(self) -> None:
        """Launches the GPU hashing of the tensors queued (see `DeviceHasher`)."""
        for hasher in self.recorder._hashers.values():
            hasher.flush()


class ModelRecorder:
    """Records a module's training steps or forward passes with no per-op code (see the module's
    documentation)."""

    def __init__(self, recorder: Recorder, model: torch.nn.Module, modules: bool = True):
        """`modules`: record every module's output (off: inputs, parameters, loss, gradients and
        updates only, as when the other run's graph is named otherwise)."""
        self.recorder, self.model = recorder, model
        self._step: Optional[StepRecorder] = None
        self._calls: dict[str, int] = {}
        named = [(name, m) for name, m in model.named_modules() if name != ""] if modules else []
        self._hooks = [m.register_forward_hook(self._hook(name)) for name, m in named]

    @classmethod
    def create_or_gated(
        cls, path: str, run: dict, model: torch.nn.Module, modules: bool = True, **options
    ) -> "ModelRecorder":
        """`Recorder.create_or_gated` for `model`, on the device of its first parameter."""
        device = next((p.device for p in model.parameters()), None)
        return cls(Recorder.create_or_gated(path, run, device=device, **options), model, modules)

    def _hook(self, name: str):
        def hook(module, args, output):
            s = self._step
            if s is None:
                return None
            calls = self._calls.get(name, 0)
            self._calls[name] = calls + 1
            path = name if calls == 0 else f"{name}#{calls}"
            source = _call_site()
            if isinstance(output, torch.Tensor):
                output = s.perturbed(path, output)
                s.record(path, output, "op_output", "forward", node=True, source=source)
                return output
            for key, value in _tensors_of(output):
                s.queue(f"{path}.{key}", value, "op_output", "forward", node=True, source=source)
            s.flush()
            return None

        return hook

    def training_step(self, step: int, inputs: Optional[dict] = None):
        """A training step: the inputs and parameters at entry, every module's output while the
        block runs, `loss` and `gradients` when called, the updated parameters at exit."""
        return self._captured(step, inputs, updates=True)

    def forward_pass(self, step: int, inputs: Optional[dict] = None):
        """A forward pass (inference): the inputs and parameters, and every module's output."""
        return self._captured(step, inputs, updates=False)

    @contextmanager
    def _captured(self, step: int, inputs: Optional[dict], updates: bool) -> Iterator["CapturedStep"]:
        with self.recorder.step(step) as s:
            for name, t in (inputs or {}).items():
                s.queue(name, t, "input")
            for name, p in self.model.named_parameters():
                s.queue(name, p, "weight", "forward")
            s.flush()
            self._step, self._calls = s, {}
            try:
                yield CapturedStep(self, s)
            finally:
                self._step = None
            if updates:
                for name, p in self.model.named_parameters():
                    s.queue(f"{name}.updated", p, "weight", "update")
                s.flush()

    def finish(self) -> int:
        for h in self._hooks:
            h.remove()
        return self.recorder.finish()


class CapturedStep:
    """What a training step records besides what the hooks see."""

    def __init__(self, owner: ModelRecorder, s: StepRecorder):
        self._owner, self.step = owner, s

    def output(self, name: str, t: torch.Tensor, kind: str = "prediction") -> None:
        """Records a model output (logits) under `name`."""
        self.step.record(name, t, kind, "forward", node=True)

    def loss(self, loss: torch.Tensor, name: str = "loss") -> None:
        """Records the loss."""
        self.step.record(name, loss, "loss", "forward", node=True)

    def gradients(self) -> None:
        """Records every parameter's gradient (`NAME.grad`) after `backward`, and notes the
        trainable parameters that got none."""
        for name, p in self._owner.model.named_parameters():
            if p.grad is not None:
                self.step.queue(f"{name}.grad", p.grad, "gradient", "backward")
            elif p.requires_grad:
                self.step.no_gradient.append(name)
        self.step.flush()


def _tensors_of(output, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors in a module's output: a tuple's or list's by index, a dict's (a transformers
    ModelOutput) by key, nested; anything else is skipped."""
    if isinstance(output, torch.Tensor):
        yield prefix.rstrip("."), output
    elif isinstance(output, dict):
        for k, v in output.items():
            yield from _tensors_of(v, f"{prefix}{k}.")
    elif isinstance(output, (tuple, list)):
        for i, v in enumerate(output):
            yield from _tensors_of(v, f"{prefix}{i}.")


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _call_site() -> Optional[str]:
    """Where the program's code called the module whose hook runs, `FILE:LINE` (the file relative
    to the working directory): the innermost frame outside torch and this module, so a container's
    children (an `nn.Sequential`'s) name the line that called the container. None if every frame
    is torch's."""
    frame = sys._getframe(1)
    while frame is not None:
        file = frame.f_code.co_filename
        if file != __file__ and not file.startswith(_TORCH_DIR):
            return f"{os.path.relpath(file)}:{frame.f_lineno}"
        frame = frame.f_back
    return None


# The program's determinism switches: which kernels run, and whether matrix products and
# convolutions round their float32 inputs to TF32. torch 2.9 added `fp32_precision` beside
# `allow_tf32`, and will not read `allow_tf32` back once a program set the new one.
_SWITCHES = (
    "backends.cudnn.deterministic",
    "backends.cudnn.benchmark",
    "backends.cuda.matmul.allow_tf32",
    "backends.cudnn.allow_tf32",
    "backends.cuda.matmul.fp32_precision",
    "backends.cudnn.conv.fp32_precision",
    "backends.cudnn.rnn.fp32_precision",
)


def determinism_switches() -> dict[str, str]:
    """The program's determinism switches as the header records them: `torch.PATH` (the
    attribute's path) to its value as text, and `torch.use_deterministic_algorithms` (`True`,
    `False`, or `warn_only`). A switch this torch does not have or will not read back is left out."""
    if not torch.are_deterministic_algorithms_enabled():
        algorithms = "False"
    else:
        algorithms = "warn_only" if torch.is_deterministic_algorithms_warn_only_enabled() else "True"
    switches = {"torch.use_deterministic_algorithms": algorithms}
    for path in _SWITCHES:
        value = torch
        try:
            for part in path.split("."):
                value = getattr(value, part)
        except (AttributeError, RuntimeError):
            continue
        switches[f"torch.{path}"] = str(value)
    return switches


def _changes(before: dict[str, str], after: dict[str, str]) -> str:
    """The switches that differ, `NAME: BEFORE -> AFTER`, comma-separated (empty if none)."""
    names = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    return ", ".join(f"{k}: {before.get(k)} -> {after.get(k)}" for k in names)


def _environment(device: Optional[torch.device], switches: dict[str, str]) -> Environment:
    """The header's environment: torch's version where repro puts candle's, the device, and the
    numerics variables with the determinism `switches`."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        label, name = f"cuda:{index}", torch.cuda.get_device_name(index)
    else:
        label, name = "cpu", cpu_model()
    environment = Environment(
        candle_version=f"torch {torch.__version__}", device=label, device_name=name, cpu_model=cpu_model(),
        threads=torch.get_num_threads(),
    )
    environment.env.update(switches)
    return environment
