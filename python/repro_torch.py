"""Recording PyTorch runs into repro traces, so `repro diff` compares them with candle runs and
with each other (docs/pytorch.md).

`ModelRecorder` records a `torch.nn.Module` with no per-op code: at every step the inputs by the
names given, the parameters by their `state_dict` names, every module's output by its module
path (forward hooks, in call order: a topological order of the module graph, recorded as the
graph's nodes), the loss, the gradients (`NAME.grad`) and the updated parameters
(`NAME.updated`), as repro's own capture names them.

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
after the run by the repro command, not while recording.

Values are copied to the host to be hashed (the canonical bytes of section 5.1 of
docs/trace-format.md, little-endian, row-major); `bool` tensors are recorded as `U8`.
"""

from __future__ import annotations

import inspect
import os
import sys
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


def canonical(t: torch.Tensor) -> tuple[str, list[int], bytes]:
    """A tensor's trace dtype, shape and canonical element bytes (row-major, little-endian)."""
    t = t.detach()
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    dtype = _DTYPES.get(t.dtype)
    if dtype is None:
        raise WriteError(f"cannot record tensors of dtype {t.dtype}")
    if sys.byteorder != "little":  # pragma: no cover
        raise WriteError("the canonical bytes are little-endian; this host is not")
    flat = t.contiguous().reshape(-1).cpu()
    data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return dtype, list(t.shape), data


def record_of(name: str, kind: str, t: torch.Tensor, **what) -> Record:
    dtype, shape, data = canonical(t)
    return Record(name, kind, dtype, shape, data, **what)


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
        """`t` with its element moved (floats only). The other elements, and the autograd graph
        through them, are `t`'s own."""
        if not t.is_floating_point():
            raise WriteError(f"REPRO_PERTURB: `{self.tensor}` is {t.dtype}, not a float tensor")
        if self.element >= t.numel():
            raise WriteError(f"REPRO_PERTURB: `{self.tensor}` has {t.numel()} elements, no element {self.element}")
        value = t.detach().reshape(-1)[self.element : self.element + 1].clone()
        width = value.element_size()
        bits = int(value.view(_INT_OF_WIDTH[width]).item()) & ((1 << (8 * width)) - 1)
        sign = 1 << (8 * width - 1)
        ordinal = (-(bits & (sign - 1)) if bits & sign else bits) + self.ulps
        bits = sign | -ordinal if ordinal < 0 else ordinal
        if bits >= sign:
            bits -= 1 << (8 * width)  # as the signed integer of that width
        value.view(_INT_OF_WIDTH[width]).fill_(bits)
        mask = torch.zeros(t.numel(), dtype=torch.bool, device=t.device)
        mask[self.element] = True
        return torch.where(mask.reshape(t.shape), value.reshape([]), t)


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
    ):
        self._writer = TraceWriter(path, run, capture, inline_max_bytes, replace, _environment(device))
        self.perturbation = perturbation
        self.path = path

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
        return self._writer.wants_full(step)

    @contextmanager
    def step(self, step: int) -> Iterator["StepRecorder"]:
        """One step: record its tensors on the value, and it is written when the block ends
        (unless an exception leaves it, which leaves the trace without that step)."""
        s = StepRecorder(self, step)
        yield s
        self._writer.write_step(step, s.records, s.no_gradient)

    def finish(self) -> int:
        """Finishes the trace; the number of steps written."""
        return self._writer.finish()


class StepRecorder:
    """The tensors of one step, in the order recorded."""

    def __init__(self, recorder: Recorder, step: int):
        self.recorder, self.step = recorder, step
        self.records: list[Record] = []
        self.no_gradient: list[str] = []
        self._nodes = 0

    def perturbed(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """`t`, or `t` moved as REPRO_PERTURB says when it names this tensor at this step."""
        p = self.recorder.perturbation
        if p is not None and p.step == self.step and p.tensor == name:
            return p.apply(t)
        return t

    def record(self, name: str, t: torch.Tensor, kind: str = "activation", phase: Optional[str] = None,
               inputs=(), node: bool = False, source: Optional[str] = None) -> None:
        """Records `t` under `name`; `node`: as the next node of the step's graph."""
        position = None
        if node:
            position, self._nodes = self._nodes, self._nodes + 1
        self.records.append(record_of(name, kind, t, phase=phase, inputs=tuple(inputs), node=position, source=source))


class ModelRecorder:
    """Records a module's training steps or forward passes with no per-op code (see the module's
    documentation)."""

    def __init__(self, recorder: Recorder, model: torch.nn.Module, modules: bool = True):
        """`modules`: record every module's output (off: inputs, parameters, loss, gradients and
        updates only, as when the other run's graph is named otherwise)."""
        self.recorder, self.model = recorder, model
        self._step: Optional[StepRecorder] = None
        self._calls: dict[str, int] = {}
        self._sources = {name: _source_of(m) for name, m in model.named_modules()}
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
            if isinstance(output, torch.Tensor):
                output = s.perturbed(path, output)
                s.record(path, output, "op_output", "forward", node=True, source=self._sources.get(name))
                return output
            for key, value in _tensors_of(output):
                s.record(f"{path}.{key}", value, "op_output", "forward", node=True, source=self._sources.get(name))
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
                s.record(name, t, "input")
            for name, p in self.model.named_parameters():
                s.record(name, p, "weight", "forward")
            self._step, self._calls = s, {}
            try:
                yield CapturedStep(self, s)
            finally:
                self._step = None
            if updates:
                for name, p in self.model.named_parameters():
                    s.record(f"{name}.updated", p, "weight", "update")

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
                self.step.record(f"{name}.grad", p.grad, "gradient", "backward")
            elif p.requires_grad:
                self.step.no_gradient.append(name)


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


def _source_of(module: torch.nn.Module) -> Optional[str]:
    """Where the module's `forward` is defined, `FILE:LINE`."""
    try:
        forward = type(module).forward
        return f"{os.path.relpath(inspect.getsourcefile(forward))}:{inspect.getsourcelines(forward)[1]}"
    except (TypeError, OSError, ValueError):
        return None


def _environment(device: Optional[torch.device]) -> Environment:
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        label, name = f"cuda:{index}", torch.cuda.get_device_name(index)
    else:
        label, name = "cpu", cpu_model()
    return Environment(
        candle_version=f"torch {torch.__version__}", device=label, device_name=name, cpu_model=cpu_model(),
        threads=torch.get_num_threads(),
    )
