"""Two runs of one setting, recorded by `repro.torch` and compared by `repro diff`: whether they
are bit-identical and, where not, the first tensor that differs, said as a module, a pass and an
op a reader knows (`layer2.1.conv2`, Conv2d, backward: its weight gradient)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from typing import Callable, Optional

from torch import nn

from repro.torch import ModelRecorder, Recorder

# The aten op behind a module type's forward pass, and its backward's, where one op does the work.
_OPS = {
    "Conv2d": ("aten.convolution", "aten.convolution_backward"),
    "Linear": ("aten.addmm", "aten.mm"),
    "BatchNorm2d": ("aten.native_batch_norm", "aten.native_batch_norm_backward"),
    "AdaptiveAvgPool2d": ("aten.adaptive_avg_pool2d", "aten.adaptive_avg_pool2d_backward"),
    "MaxPool2d": ("aten.max_pool2d_with_indices", "aten.max_pool2d_with_indices_backward"),
}


@dataclass
class Divergence:
    """Where two runs first differ: `tensor` as recorded, at `step`; `module` and its type, `phase`
    (forward, backward or update), `op` (an aten op, where the module type names one) and `cause`
    (repro's rule: which records its inputs were identical in)."""

    step: int
    tensor: str
    module: Optional[str]
    module_type: Optional[str]
    phase: str
    op: Optional[str]
    cause: str
    tensors_diverged: int
    tensors_compared: int


def repro_binary() -> str:
    """The repro command the study calls: REPRO_BIN, or `repro` on PATH."""
    found = os.environ.get("REPRO_BIN") or shutil.which("repro")
    if not found:
        raise RuntimeError("no repro binary: set REPRO_BIN or put repro on PATH (cargo build --release)")
    return found


def record(out: str, run: dict, model: nn.Module, steps: int, step: Callable[[object, int], None],
           inputs: Callable[[int], dict]) -> None:
    """Records `steps` calls of `step(captured_step, index)`, with `inputs(index)` as the step's
    inputs, into the trace `out` (replaced if
    there), hashes only: the parameters, every module's output, the loss, the gradients and the
    updates. The study's own paths, whatever REPRO_TRACE_DIR says: it records several runs."""
    device = next(model.parameters()).device
    rec = ModelRecorder(Recorder(out, run, capture="none", modules="all", replace=True, device=device), model)
    try:
        for i in range(steps):
            with rec.training_step(i, inputs=inputs(i)) as s:
                step(s, i)
    finally:
        rec.finish()


def compare(a: str, b: str, model: nn.Module) -> Optional[Divergence]:
    """`repro diff a b`: None if identical, else where they first differ (a diff that fails is an
    error naming both traces)."""
    done = subprocess.run([repro_binary(), "diff", a, b, "--json"], capture_output=True, text=True)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"repro diff {a} {b} failed ({done.returncode}): {done.stderr.strip()}")
    report = json.loads(done.stdout)
    if report["verdict"] == "identical":
        return None
    root = report.get("root_cause") or {}
    first = root.get("cause") or report["first_divergence"]
    return describe(first, root.get("rule", "first"), model, report["tensors_diverged"], report["tensors_compared"])


def describe(first: dict, rule: str, model: nn.Module, diverged: int, compared: int) -> Divergence:
    """A diff's first divergence (`first`: its JSON) in terms of `model`'s modules."""
    tensor, phase = first["tensor"], first.get("phase") or "forward"
    modules = dict(model.named_modules())
    module = _module_of(tensor, modules)
    module_type = type(modules[module]).__name__ if module is not None else None
    op = None
    if module_type in _OPS:
        forward, backward = _OPS[module_type]
        op = forward if phase == "forward" else backward if phase == "backward" else None
    return Divergence(first["step"], tensor, module, module_type, phase, op, rule, diverged, compared)


def _module_of(tensor: str, modules: dict) -> Optional[str]:
    """The module a recorded tensor belongs to: a module output by its path (`layer1.0.conv1`,
    `features.3#1`, `head.0` of a tuple), a parameter, gradient or update by its owner."""
    name = tensor.split("#")[0]
    while name:
        if name in modules and name != "":
            return name
        name = name.rpartition(".")[0]
    return None


def as_dict(d: Optional[Divergence]) -> Optional[dict]:
    return asdict(d) if d is not None else None
