"""The ways a study runs a network, and what to do when an op refuses deterministic mode:

- `default`: cuDNN picks its fastest algorithms by timing them (`cudnn.benchmark`), and may pick
  non-deterministic ones;
- `deterministic`: cuDNN's deterministic algorithms and `torch.use_deterministic_algorithms(True)`,
  which by default also fills every newly allocated tensor with NaN
  (`torch.utils.deterministic.fill_uninitialized_memory`), so that a kernel reading memory it
  never wrote shows;
- `deterministic-nofill`: the same without the filling, which separates what the deterministic
  kernels cost from what the fill costs.

cuBLAS reads CUBLAS_WORKSPACE_CONFIG once, when its first handle is made, so `prepare_process`
sets it (to `:4096:8`, unless the environment already has it) before any GPU work, for both
modes: the modes then differ only in the switches `apply` sets."""

from __future__ import annotations

import os
import re
from typing import Optional

import torch
from torch import nn

MODES = ("default", "deterministic", "deterministic-nofill")
_REFUSAL = re.compile(r"(\w+) does not have a deterministic implementation")


def prepare_process() -> None:
    """Sets CUBLAS_WORKSPACE_CONFIG for deterministic cuBLAS, if not set; call before any GPU work."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def apply(mode: str) -> None:
    """Switches this process into `mode` (one of MODES)."""
    if mode not in MODES:
        raise ValueError(f"no mode called {mode!r}; the modes are {', '.join(MODES)}")
    deterministic = mode != "default"
    torch.backends.cudnn.benchmark = not deterministic
    torch.backends.cudnn.deterministic = deterministic
    torch.use_deterministic_algorithms(deterministic)
    torch.utils.deterministic.fill_uninitialized_memory = mode != "deterministic-nofill"


def refused_op(error: BaseException) -> Optional[str]:
    """The op named by PyTorch's refusal to run it deterministically, or None if `error` is not one."""
    found = _REFUSAL.search(str(error))
    return found.group(1) if found else None


def identity_pools(model: nn.Module, example: torch.Tensor) -> list[str]:
    """Replaces each adaptive pool whose output is the size of its input (VGG's 7×7 → 7×7 average
    pool at 224×224) by `nn.Identity`: a pool over one element a window returns that element, so
    the values and gradients are bit for bit those of the pool, and the pool's backward pass, which
    has no deterministic CUDA implementation, is not run. Returns the replaced modules' names."""
    pools = {name: m for name, m in model.named_modules()
             if isinstance(m, (nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d))}
    same: list[str] = []

    def hook_of(name):
        def hook(module, args, output):
            if tuple(args[0].shape[-2:]) == tuple(output.shape[-2:]):
                same.append(name)
        return hook

    hooks = [m.register_forward_hook(hook_of(name)) for name, m in pools.items()]
    training = model.training
    model.eval()  # batch norm's running statistics stay as they were
    try:
        with torch.no_grad():
            model(example)
    finally:
        model.train(training)
        for h in hooks:
            h.remove()
    for name in same:
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, leaf, nn.Identity())
    return same


# The workarounds `cost` tries, in order, when an op refuses deterministic mode: each returns the
# modules it changed (none: it does not apply to this network).
WORKAROUNDS = {"identity_pools": identity_pools}
