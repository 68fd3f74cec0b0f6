"""The header's environment for a PyTorch run: torch's version, the device, and the program's
determinism switches beside the numerics variables."""

from __future__ import annotations

from typing import Optional

import torch

from repro.writer import Environment, cpu_model

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


def changes(before: dict[str, str], after: dict[str, str]) -> str:
    """The switches that differ, `NAME: BEFORE -> AFTER`, comma-separated (empty if none)."""
    names = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    return ", ".join(f"{k}: {before.get(k)} -> {after.get(k)}" for k in names)


def environment(device: Optional[torch.device], switches: dict[str, str]) -> Environment:
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
