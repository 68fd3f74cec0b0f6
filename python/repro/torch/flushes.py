"""When the module outputs a step queues for hashing on the GPU are read: `FlushPolicy`, as the
recorder's `FlushOptions` say (`options.py`: the mode and the caps), and the watch that learns
which outputs the program changes in place.

A module's output must be read before the program changes it in place (a `ReLU(inplace=True)`
after a batch norm, a residual `out += identity`). Reading each output at its own hook, on the
program's stream, is always safe, but costs a flush per module call on the program's critical
path. So the first step recorded on the GPU does exactly that (`module`), and watches every
output's version counter while the step runs: an output whose counter moves after its hook is
changed in place. From the next step on, each of those outputs is copied on the GPU at its hook
(one copy, on the program's stream, which the program cannot change; an output over
`copy_at_hook_max_bytes` is read at its hook instead, with a flush; under the data hash
`xxh3-1k`, neither copy nor flush: the library's leaf pass reads the output where it is, at its
hook, and its leaves wait for the next flush; so does every output of the first step, and of
every step under `module`), and the outputs and the copies are queued and read together, a few
flushes a step:

- `batched` (the default): in order with the program's stream, at the next flush.
- `module`: every output at its hook, every step (the first step's way, kept).

(A third mode, `beside`, read the queued outputs on the library's own stream while the program
ran on; on an H100 it was slower than `batched` on every model measured, and it is gone:
docs/results/pytorch-recorder-cost-h100.md.)

Outputs wait for their flush held by the recorder, so that their memory is not reused before
they are read. Most of a training step's outputs are kept by autograd for the backward pass
anyway, and holding them costs nothing; an output the program drops at once (in inference, say)
stays allocated until the flush. So the flushes in order with the program measure what they let
go of (PyTorch's allocated bytes on the hashers' GPUs, before and after), and the policy keeps
the share of the outputs held that only the recorder still held: a flush comes when the
recorder's copies plus that share of the outputs held (the whole of them until a flush has
measured) reach 3% of PyTorch's peak memory so far (`extra_share`, at most `max_queued_bytes`),
and in any case at `max_held_bytes` of outputs held. The share is the largest measured in the
last step that measured any, or in this step where that is larger.

Nothing is taken on trust: when an output is read, the recorder checks that its version counter
has not moved since its hook, and stops with an error naming it if it has (a program that
changes in place, at a later step, an output it left alone at the first).
"""

from __future__ import annotations

import weakref
from typing import Optional

import torch

from .options import FlushOptions

# What an output gets at its hook (`FlushPolicy.at_hook`).
READ, COPY, QUEUE = "read", "copy", "queue"


class FlushPolicy:
    """A recorder's flush policy over its steps (see the module's documentation)."""

    def __init__(self, options: Optional[FlushOptions] = None, memory_in_use=None):
        """`options`: the mode and the caps (`options.FlushOptions`; by default, its defaults).
        `memory_in_use`: a function of GPU indices giving PyTorch's bytes allocated on them,
        now and at their peak so far, or None where it cannot tell (by default, PyTorch's CUDA
        allocator's)."""
        self.options = options = options or FlushOptions()
        self.mode = options.mode
        # Names of the outputs a watched step saw changed in place after their hooks; None
        # until a step with module outputs hashed on the GPU has been watched.
        self.in_place: Optional[set[str]] = None
        self.memory_in_use = memory_in_use or cuda_memory_in_use
        # The largest share of the outputs held that a flush found the recorder alone held: in
        # the last step that measured one, and in this step so far (None: none measured).
        self._last_share: Optional[float] = None
        self._step_share: Optional[float] = None
        self.unshared = 1.0  # the share the caps count (see the module's documentation)
        self.extra_cap = options.max_queued_bytes  # the memory the recorder may keep (`step_started`)

    def step_started(self, devices: list) -> None:
        """A step starts on the hashers' GPUs `devices`: the memory the recorder may keep is
        `extra_share` of PyTorch's peak on them so far (one reading, about 20 us)."""
        reading = self.memory_in_use(devices) if devices else None
        if reading is not None:
            o = self.options
            self.extra_cap = min(o.max_queued_bytes, max(o.extra_min_bytes, int(o.extra_share * reading[1])))

    def holds_too_much(self, shared: int, own: int) -> bool:
        """Whether `shared` bytes of the program's outputs and `own` of the recorder's, held
        until the next flush, are more than the caps allow."""
        return shared >= self.options.max_held_bytes or own + self.unshared * shared >= self.extra_cap

    def measure(self, shared: int, devices: list) -> Optional["MemoryMeasure"]:
        """The measure of a flush about to let go of `shared` bytes of outputs on `devices`, or
        None where it measures nothing (fewer bytes than the cap, which they are under whatever
        the measure; no way to tell the memory in use)."""
        if shared < self.extra_cap or not devices:
            return None
        reading = self.memory_in_use(devices)
        return None if reading is None else MemoryMeasure(self, shared, devices, reading[0])

    def learned(self, share: float) -> None:
        """A flush found the recorder alone held `share` of the outputs it let go of."""
        self._step_share = share if self._step_share is None else max(self._step_share, share)
        self.unshared = max(self._step_share, self._last_share or 0.0)

    def step_ended(self) -> None:
        """A step is over: what it measured, if anything, is what the next one starts from."""
        if self._step_share is not None:
            self._last_share, self._step_share = self._step_share, None
            self.unshared = self._last_share

    def watch(self) -> Optional["InPlaceWatch"]:
        """The watch for a step about to run: one until a step has been watched."""
        return InPlaceWatch(self) if self.in_place is None and self.mode != "module" else None

    def at_hook(self, name: str, nbytes: int) -> str:
        """What the output `name`, of `nbytes`, gets at its hook: `READ` (read there, in order
        with the program), `COPY` (copied there, the copy queued) or `QUEUE` (queued as it is)."""
        if self.mode == "module" or self.in_place is None:
            return READ
        if name in self.in_place:
            return COPY if nbytes <= self.options.copy_at_hook_max_bytes else READ
        return QUEUE


class MemoryMeasure:
    """PyTorch's memory in use around one flush (`FlushPolicy.measure`)."""

    def __init__(self, policy: FlushPolicy, shared: int, devices: list, before: int):
        self._policy, self._shared, self._devices, self._before = policy, shared, devices, before

    def done(self, own: int) -> None:
        """The flush has let go of what it held, `own` bytes of it the recorder's own: the rest
        of what it freed was outputs that the recorder alone held."""
        reading = self._policy.memory_in_use(self._devices)
        if reading is None:
            return
        freed = self._before - reading[0] - own
        self._policy.learned(min(1.0, max(0.0, freed / self._shared)))


# PyTorch's CUDA allocator's statistics of a GPU, where this PyTorch has CUDA.
_MEMORY_STATS = getattr(torch._C, "_cuda_memoryStats", None)


def cuda_memory_in_use(devices: list) -> Optional[tuple[int, int]]:
    """PyTorch's bytes allocated on the GPUs `devices` (indices), now and at their peak so far,
    or None without CUDA."""
    if _MEMORY_STATS is None or not torch.cuda.is_available():
        return None
    allocated = [_MEMORY_STATS(d)["allocated_bytes"]["all"] for d in devices]
    return sum(a["current"] for a in allocated), sum(a["peak"] for a in allocated)


class InPlaceWatch:
    """One step's outputs, watched for changes in place after their hooks: each output's weak
    reference and version counter at its hook, checked at every later hook and at the end."""

    def __init__(self, policy: FlushPolicy):
        self._policy = policy
        self._watched: list = []  # (name, weak reference, version at the hook)
        self.changed: set[str] = set()
        self.outputs = 0

    def add(self, name: str, t: torch.Tensor) -> None:
        """Checks the outputs so far, then watches `t`, the output `name`, from now on."""
        self.check()
        self.outputs += 1
        try:
            self._watched.append((name, weakref.ref(t), t._version))
        except (RuntimeError, TypeError):  # no version counter (inference mode): read at hooks
            self.changed.add(name)

    def check(self) -> None:
        """Notes every watched output whose version moved, and forgets those that are gone."""
        kept = []
        for name, ref, version in self._watched:
            t = ref()
            if t is None:
                continue
            if t._version != version:
                self.changed.add(name)
            else:
                kept.append((name, ref, version))
        self._watched = kept

    def finish(self) -> None:
        """The step is over: what it saw becomes the policy's, if it had outputs to watch."""
        self.check()
        if self.outputs:
            self._policy.in_place = set(self.changed)
