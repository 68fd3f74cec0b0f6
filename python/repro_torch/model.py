"""Recording a `torch.nn.Module` with no per-op code: `ModelRecorder` and the step it hands out,
`CapturedStep`. A model wrapped in DistributedDataParallel is recorded by its module's names, with
both sides of each gradient sum (`ddp`); an FSDP2 model by each rank's shards (`fsdp`)."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Iterator, Optional

import torch

from repro_writer import ALL_REDUCE_SUM, REDUCE_SCATTER_SUM

from . import fsdp
from .ddp import GradientSums, is_ddp
from .recorder import RecordGroup, Recorder, StepRecorder, record_fields

class ModelRecorder:
    """Records a module's training steps or forward passes with no per-op code (see the module's
    documentation)."""

    def __init__(self, recorder: Recorder, model: torch.nn.Module, modules: bool = True):
        """`modules`: record every module's output (off: inputs, parameters, loss, gradients and
        updates only, as when the other run's graph is named otherwise). A DDP model is recorded
        by its module's names, and its gradient sums through a communication hook; an FSDP2
        model's shards are checked to tile their parameters (with every rank, here). A model
        compiled by `torch.compile` is recorded by its original module's names, without module
        outputs (a note on stderr says so)."""
        self.recorder = recorder
        model, compiled = _uncompiled(model)
        self.model = model.module if is_ddp(model) else model
        self.model, inner = _uncompiled(self.model)
        if (compiled or inner) and modules:
            modules = False
            print("repro_torch: the model is compiled by torch.compile: its module outputs are not recorded (hooks "
                  "inside a compiled graph would break it or the graph); recording its inputs, parameters, loss, "
                  "gradients and updates, under the uncompiled model's names", file=sys.stderr)
        # A world of one records as one device: its "sums" are its own gradients.
        self._sums = GradientSums(model) if is_ddp(model) and recorder.place is not None else None
        # The parameters by name, looked up once (walking the module tree costs every step).
        self._named_parameters = list(self.model.named_parameters())
        sharded = any(fsdp.is_sharded(p) for _, p in self._named_parameters)
        self._shards = fsdp.check_tiling(self._named_parameters) if sharded else {}
        # The shares FSDP2 reduces and scatters (a world of one sums nothing).
        if self._shards and recorder.place is not None:
            self._sums = fsdp.GradientShares(self.model, self._named_parameters)
        # The parameters' records at a step's start, their gradients' and their updates': each
        # record's fields made once, the group queued at once (`StepRecorder.queue_group`). An
        # FSDP2 parameter (and its gradient) is recorded as this rank's block of it, in place.
        self._tensors = [p for _, p in self._named_parameters]
        self._places = [self._shard_place(name, p) for name, p in self._named_parameters]
        self._groups = {
            suffix: RecordGroup([record_fields(name + suffix, kind, phase, shard=place)
                                 for (name, _), place in zip(self._named_parameters, self._places)])
            for suffix, kind, phase in _PARAMETER_RECORDS
        }
        # The gradients' groups by which parameters have one and which are sums of shares.
        self._partial_gradients: dict[tuple, RecordGroup] = {}
        self._step: Optional[StepRecorder] = None
        self._calls: dict[str, int] = {}
        named = [(name, m) for name, m in self.model.named_modules() if name != ""] if modules else []
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
                s.module_output(path, output, source)
                return output
            for key, value in _tensors_of(output):
                s.module_output(f"{path}.{key}", value, source)
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
            self._queue_parameters(s, "")
            s.flush()
            self._step, self._calls = s, {}
            if self._sums is not None:
                self._sums.begin(s)
            try:
                yield CapturedStep(self, s)
            finally:
                self._step = None
                if self._sums is not None:
                    self._sums.begin(None)
            if updates:
                self._queue_parameters(s, ".updated")
                s.flush()

    def _shard_place(self, name: str, p: torch.Tensor) -> Optional[tuple]:
        """Where this rank's block of the FSDP2 parameter `name` sits in it (a record's `shard`),
        or None for a parameter that is not sharded."""
        return fsdp.shard_of(p, self._shards[name])[1] if name in self._shards else None

    def _gradient_group(self, present: tuple, summed: tuple) -> RecordGroup:
        """The group of the gradients of the parameters at indices `present` (those that have
        one: all of them, or, with frozen or unused parameters, the same few at every step);
        `summed[k]`, this rank's share of the `k`th's sum, when recorded (DDP, FSDP2), else None."""
        group = self._groups[".grad"]
        if len(present) == len(group.fields) and not any(summed):
            return group
        key = (present, summed)
        if key not in self._partial_gradients:
            if len(self._partial_gradients) >= 16:  # a program whose gradients keep changing
                self._partial_gradients.clear()
            fields = []
            for i, share in zip(present, summed):
                if share is None:
                    fields.append(group.fields[i])
                    continue
                place = self._places[i]
                fields.append(record_fields(f"{self._named_parameters[i][0]}.grad", "gradient", "backward",
                                            inputs=(share,), shard=place,
                                            collective=ALL_REDUCE_SUM if place is None else REDUCE_SCATTER_SUM))
            self._partial_gradients[key] = RecordGroup(fields)
        return self._partial_gradients[key]

    def _blocks(self, tensors: list) -> list:
        """`tensors` (the parameters, or their gradients) as this rank holds them: an FSDP2 one
        as its own block."""
        if not self._shards:
            return tensors
        return [fsdp.local(t) if place is not None and fsdp.is_sharded(t) else t
                for t, place in zip(tensors, self._places)]

    def _queue_parameters(self, s: StepRecorder, suffix: str) -> None:
        """Queues every parameter's record (`suffix` "": at the step's start; ".updated": at its
        end): an FSDP2 parameter as this rank's block of it."""
        s.queue_group(self._groups[suffix], self._blocks(self._tensors))

    def finish(self) -> int:
        for h in self._hooks:
            h.remove()
        if self._sums is not None:
            self._sums.remove()
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
        trainable parameters that got none. Under DDP a gradient is the sum over the ranks of the
        shares recorded as its bucket went out (a collective of `NAME.grad.local`); under FSDP2
        it is this rank's block of the sum over the ranks, which FSDP2 reduces and scatters (a
        reduce-scatter of the share recorded as the whole gradient accumulated)."""
        owner = self._owner
        grads = owner._blocks([p.grad for p in owner._tensors])
        present = tuple(i for i, g in enumerate(grads) if g is not None)
        self.step.no_gradient += [name for (name, p), g in zip(owner._named_parameters, grads)
                                  if g is None and p.requires_grad]
        sums, names = owner._sums, owner._named_parameters
        summed = tuple(sums.local_name(names[i][0]) for i in present) if sums is not None else (None,) * len(present)
        self.step.queue_group(owner._gradient_group(present, summed), [grads[i] for i in present])
        self.step.flush()


# A parameter's records in a training step: their names' suffix, kind and phase.
_PARAMETER_RECORDS = (("", "weight", "forward"), (".grad", "gradient", "backward"), (".updated", "weight", "update"))


def _uncompiled(model: torch.nn.Module) -> tuple[torch.nn.Module, bool]:
    """The module `torch.compile` wrapped (and True), or `model` itself (and False)."""
    original = getattr(model, "_orig_mod", None)
    if isinstance(original, torch.nn.Module) and type(model).__name__ == "OptimizedModule":
        return original, True
    return model, False


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
_PACKAGE_DIR = os.path.dirname(__file__) + os.sep


def _call_site() -> Optional[str]:
    """Where the program's code called the module whose hook runs, `FILE:LINE` (the file relative
    to the working directory): the innermost frame outside torch and this package, so a container's
    children (an `nn.Sequential`'s) name the line that called the container. None if every frame
    is torch's."""
    frame = sys._getframe(1)
    while frame is not None:
        file = frame.f_code.co_filename
        relative = _PROGRAM_FILES.get(file, "")
        if relative == "":
            relative = _PROGRAM_FILES[file] = _program_file(file)
        if relative is not None:
            return f"{relative}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def _program_file(file: str) -> Optional[str]:
    """`file` relative to the working directory, or None for torch's files and this package's."""
    if file.startswith(_PACKAGE_DIR) or file.startswith(_TORCH_DIR):
        return None
    return os.path.relpath(file)


# Each file seen in a call stack, as `_program_file` says (os.path.relpath costs as much as the
# rest of a hook): one dictionary lookup a frame.
_PROGRAM_FILES: dict[str, Optional[str]] = {}
