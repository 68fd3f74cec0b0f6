"""Where a recorded PyTorch step's time goes: torch profiler over plain and recorded training
steps of one torchvision model (CPU and GPU time per op and kernel, hashing kernels included),
and each step's host time (the CPU's work to queue it) beside its wall time.

    python python/bench/torch_profile.py [MODEL] [BATCH] [FLUSH ...]

REPRO_PROFILE_ROWS: how many ops and kernels the GPU table lists (12). REPRO_PROFILE_MODULES: the
steps that record module outputs (a step policy, default `all`; `none` profiles the `steps`
level alone). With
REPRO_PROFILE_PYTHON=1, the recorded steps' host side under cProfile instead (the Python
functions, and the GPU hashing library's calls, by their own time); with `timers`, the time spent
inside the recorder's calls that may wait or work on the host.
"""

import os
import sys
import tempfile
import time

import torch
import torchvision
from torch.profiler import ProfilerActivity, profile

from repro.torch import ModelRecorder, Recorder
from repro.torch.options import FlushOptions
from steps import training_step  # beside this file


_SPENT = None


def timers() -> dict:
    """Wraps the recorder's calls that may wait or work on the host with timers (seconds, by
    what was called), from now on."""
    import repro.torch.cuda_hash as cuda_hash
    import repro.torch.model as model
    import repro.torch.recorder as recorder

    if _SPENT is not None:
        return _SPENT
    spent = globals()["_SPENT"] = {}

    def timed(owner, name, label):
        inner = getattr(owner, name)

        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - t0

        setattr(owner, name, wrapper)

    timed(cuda_hash.DeviceHasher, "flush", "flush")
    timed(cuda_hash.DeviceHasher, "start_read", "start_read")
    timed(cuda_hash.DeviceRead, "finish", "read.finish")
    timed(recorder.StepRecorder, "_queue_each", "queue")
    timed(recorder.StepRecorder, "queue_group", "queue groups")
    timed(recorder.StepRecorder, "module_output", "hook outputs")
    timed(recorder.TraceWriter, "write_laid_out", "write_laid_out")
    timed(model.CapturedStep, "gradients", "gradients")
    timed(torch.Tensor, "backward", "backward")
    return spent


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "resnet50"
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    flushes = sys.argv[3:] or ["batched"]
    torch.backends.cudnn.benchmark = True
    model = torchvision.models.get_model(name).cuda()
    images = torch.randn(batch, 3, 224, 224, device="cuda")
    labels = torch.randint(0, 1000, (batch,), device="cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def loss_of(m):
        return torch.nn.functional.cross_entropy(m(images), labels)

    def plain(_):
        training_step(model, opt, loss_of)

    def run(label, step):
        for i in range(3):
            step(i)
        torch.cuda.synchronize()
        host, wall = [], []
        for i in range(3, 9):
            t0 = time.perf_counter()
            step(i)
            host.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
            wall.append(time.perf_counter() - t0)
        print(f"== {label}: host {sorted(host)[3] * 1e3:.1f} ms, wall {sorted(wall)[3] * 1e3:.1f} ms (medians, synchronized each step)")
        if os.environ.get("REPRO_PROFILE_PYTHON") == "timers":
            spent = timers()
            spent.clear()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for i in range(9, 19):
                step(i)
            torch.cuda.synchronize()
            total = (time.perf_counter() - t0) / 10
            parts = ", ".join(f"{k} {v / 10 * 1e3:.1f} ms" for k, v in sorted(spent.items()))
            print(f"   unsynchronized: {total * 1e3:.1f} ms a step; inside: {parts}")
            return
        if os.environ.get("REPRO_PROFILE_PYTHON") == "1":
            import cProfile
            import pstats

            profiler = cProfile.Profile()
            profiler.enable()
            for i in range(9, 13):
                step(i)
            torch.cuda.synchronize()
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(22)
            return
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(9, 11):
                step(i)
            torch.cuda.synchronize()
        rows = int(os.environ.get("REPRO_PROFILE_ROWS", "12"))
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=rows, max_name_column_width=50))
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=50))

    run("plain", plain)
    for flush in flushes:
        with tempfile.TemporaryDirectory() as d:
            rec = ModelRecorder(Recorder(f"{d}/t", {"workload": name, "steps": 14}, capture="none",
                                         modules=os.environ.get("REPRO_PROFILE_MODULES", "all"),
                                         device=torch.device("cuda"), device_hashing=True,
                                         flush=FlushOptions(mode=flush)), model)

            def recorded(i):
                training_step(model, opt, loss_of, rec, i)

            run(f"recorded, flush mode {flush}", recorded)
            rec.finish()


if __name__ == "__main__":
    main()
