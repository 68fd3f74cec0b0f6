"""Where the PyTorch recorder's time goes on torchvision's ResNet-18 (batch 128, one GPU): a
plain step; parameters, gradients and updates only; every module's output too (with how many
tensors, bytes and flushes a step hashes); hooks that make each output's canonical view but hash
nothing (Python's share); and the GPU hashing throughput of one 411 MiB tensor.

    REPRO_CUDA_HASH_LIB=target/cuda/release/examples/librepro_cuda_hash.so \\
        python python/bench/torch_breakdown.py
"""

import tempfile
import time

import torch
import torchvision

import repro_torch
from repro_torch import DeviceHasher, ModelRecorder, Recorder, cuda_hash_library_path
from repro_writer import Record


def timed(step, n: int = 8) -> float:
    """Milliseconds per step over `n` steps after one untimed, the device drained around them."""
    step(0)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for i in range(n):
        step(i + 1)
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / n * 1e3


def main() -> None:
    library = cuda_hash_library_path()
    if library is None:
        raise SystemExit("no GPU hashing library: build it with `make cuda` and set REPRO_CUDA_HASH_LIB")
    torch.manual_seed(0)
    model = torchvision.models.resnet18().cuda()
    images = torch.randn(128, 3, 224, 224, device="cuda")
    labels = torch.randint(0, 1000, (128,), device="cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def plain(_):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        opt.step()

    def recorded(modules: bool) -> float:
        with tempfile.TemporaryDirectory() as d:
            recorder = Recorder(f"{d}/t", {"workload": "resnet18", "steps": 100}, capture="none",
                                device=torch.device("cuda"), device_hashing=True)
            rec = ModelRecorder(recorder, model, modules=modules)

            def step(i):
                opt.zero_grad()
                with rec.training_step(i) as s:
                    loss = torch.nn.functional.cross_entropy(model(images), labels)
                    s.loss(loss)
                    loss.backward()
                    s.gradients()
                    opt.step()

            ms = timed(step)
            rec.finish()
            return ms

    print(f"plain step: {timed(plain):.1f} ms")
    print(f"parameters, gradients and updates hashed: {recorded(False):.1f} ms")
    counts = {"bytes": 0, "tensors": 0, "flushes": 0}
    queue, flush = DeviceHasher.queue, DeviceHasher.flush

    def counting_queue(self, record, flat, keep_bytes):
        counts["bytes"] += flat.numel()
        counts["tensors"] += 1
        return queue(self, record, flat, keep_bytes)

    def counting_flush(self):
        counts["flushes"] += bool(self._queued)
        return flush(self)

    DeviceHasher.queue, DeviceHasher.flush = counting_queue, counting_flush
    print(f"every module's output hashed too: {recorded(True):.1f} ms")
    DeviceHasher.queue, DeviceHasher.flush = queue, flush
    steps = 9
    print(f"  a step: {counts['tensors'] / steps:.0f} tensors, {counts['bytes'] / steps / 1e9:.2f} GB, "
          f"{counts['flushes'] / steps:.0f} flushes")
    record_queue = repro_torch.StepRecorder.queue

    def views_only(self, name, t, kind="activation", *args, **kwargs):
        if kind == "op_output":
            repro_torch.canonical_on_device(t)
            return None
        return record_queue(self, name, t, kind, *args, **kwargs)

    repro_torch.StepRecorder.queue = views_only
    print(f"every module hooked, its output not hashed (Python's share): {recorded(True):.1f} ms")
    repro_torch.StepRecorder.queue = record_queue
    big = torch.empty(411 << 20, dtype=torch.uint8, device="cuda")
    hasher = DeviceHasher(library, torch.cuda.current_device())

    def hash_big(_):
        hasher.queue(Record("x", "weight", "U8", [big.numel()], None), big, False)
        hasher.start_read().finish()

    ms = timed(hash_big, 10)
    print(f"one 411 MiB tensor: {ms:.2f} ms, {big.numel() / ms / 1e9:.2f} TB/s")


if __name__ == "__main__":
    main()
