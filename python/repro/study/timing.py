"""Timing a training step: its wall time (the device drained before and after), and the time the
GPU spends in kernels, summed from the torch profiler's kernel records as seed 004 summed nvprof's
(copies and memsets are not kernels), with the kernels that take most of it."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile


@dataclass
class StepTimes:
    """`step_ms`: median wall time of the timed steps; `kernel_ms`: GPU kernel time a step (None on
    a CPU); `top_kernels`: [(kernel name, ms a step, share of kernel time)] by time, largest first."""

    step_ms: float
    steps: list = field(default_factory=list)
    kernel_ms: float | None = None
    top_kernels: list = field(default_factory=list)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(step: Callable[[], None], device: torch.device, warmup: int, timed: int, profiled: int,
               top: int = 10) -> StepTimes:
    """Runs `step` `warmup` times untimed, `timed` times timed, then `profiled` times under the
    profiler (on a GPU only)."""
    for _ in range(warmup):
        step()
    _sync(device)
    times = []
    for _ in range(timed):
        started = time.perf_counter()
        step()
        _sync(device)
        times.append((time.perf_counter() - started) * 1e3)
    result = StepTimes(statistics.median(times), times)
    if device.type != "cuda" or profiled == 0:
        return result
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(profiled):
            step()
        _sync(device)
    per_kernel: dict[str, float] = {}
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = event.name
        if name.startswith(("Memcpy", "Memset")) or "memcpy" in name.lower():
            continue
        per_kernel[name] = per_kernel.get(name, 0.0) + event.time_range.elapsed_us() / 1e3
    total = sum(per_kernel.values())
    result.kernel_ms = total / profiled
    ranked = sorted(per_kernel.items(), key=lambda kv: (-kv[1], kv[0]))
    result.top_kernels = [(name, ms / profiled, ms / total if total else 0.0) for name, ms in ranked[:top]]
    return result
