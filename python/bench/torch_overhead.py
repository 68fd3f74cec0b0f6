"""The Python recorder's cost on a real model: plain training steps against steps recorded with
`repro_torch.ModelRecorder` (hashes only: every parameter, module output, gradient and update
hashed), on one device, with CUDA tensors hashed on the GPU (repro's kernels, through
librepro_cuda_hash.so) and on the host (a copy each); and, beside them, PyTorch's own DebugMode
logging a `hash_tensor` of every op's output. Prints one table row per model.

    python python/bench/torch_overhead.py [cuda|cpu]

Models: transformers' GPT-2 (124M parameters) at batch 8 x 1024, and torchvision's ResNet-18 at
batch 128 when torchvision is installed.
"""

import contextlib
import sys
import tempfile
import time

import torch

from repro_torch import ModelRecorder, Recorder, cuda_hash_library_path


def timed(step, n: int, device: str) -> float:
    """Seconds per step over `n` steps (after one untimed), the device drained before and after."""
    step(0)
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for i in range(n):
        step(i + 1)
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - started) / n


def debug_mode_hashes():
    """PyTorch's DebugMode logging `hash_tensor` of every op's output (a new log each step), or
    None where this torch has no DebugMode."""
    try:
        from torch.utils._debug_mode import DebugMode
    except ImportError:
        return None

    @contextlib.contextmanager
    def logging_hashes():
        with DebugMode(), DebugMode.log_tensor_hashes(hash_fn="hash_tensor"):
            yield

    return logging_hashes


def measure(name: str, model, batch, loss_fn, device: str, n: int = 5) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def plain(_):
        opt.zero_grad()
        loss_fn(model, batch).backward()
        opt.step()

    def recorded_by(on_gpu: bool, steps: int) -> float:
        with tempfile.TemporaryDirectory() as d:
            recorder = Recorder(f"{d}/t", {"workload": name, "steps": steps + 1}, capture="none",
                                device=torch.device(device), device_hashing=on_gpu)
            rec = ModelRecorder(recorder, model)

            def recorded(i):
                opt.zero_grad()
                with rec.training_step(i, inputs={}) as s:
                    loss = loss_fn(model, batch)
                    s.loss(loss)
                    loss.backward()
                    s.gradients()
                    opt.step()

            seconds = timed(recorded, steps, device)
            rec.finish()
            return seconds

    plain_s = timed(plain, n, device)
    cells = [f"{plain_s * 1e3:.0f} ms"]
    if device == "cuda" and cuda_hash_library_path():
        gpu_s = recorded_by(True, n)
        cells.append(f"{gpu_s * 1e3:.0f} ms ({gpu_s / plain_s:.2f}x)")
    else:
        cells.append("no GPU hashing library")
    host_s = recorded_by(False, 2)
    cells.append(f"{host_s * 1e3:.0f} ms ({host_s / plain_s:.1f}x)")
    logging_hashes = debug_mode_hashes()
    if logging_hashes is None:
        cells.append("no DebugMode in this torch")
    else:
        def debug_mode(_):
            with logging_hashes():
                plain(0)

        try:
            dm_s = timed(debug_mode, 2, device)
            cells.append(f"{dm_s * 1e3:.0f} ms ({dm_s / plain_s:.1f}x)")
        except Exception as e:  # an API that moved between torch versions
            cells.append(f"DebugMode failed: {type(e).__name__}: {e}"[:80])
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"| {name} ({params:.0f}M parameters) | {device} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    device = sys.argv[1] if len(sys.argv) > 1 else ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    print("| model | device | plain step | repro_torch, GPU hashing | repro_torch, host hashing | DebugMode, hash_tensor |")
    print("|---|---|---|---|---|---|")
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config()).to(device)
    ids = torch.randint(0, 50257, (8, 1024), device=device)
    measure("GPT-2, batch 8 x 1024", gpt2, ids, lambda m, x: m(x, labels=x).loss, device)
    del gpt2
    try:
        import torchvision
    except ImportError:
        print("| ResNet-18 | - | torchvision is not installed | | |")
        return
    resnet = torchvision.models.resnet18().to(device)
    images = torch.randn(128, 3, 224, 224, device=device)
    labels = torch.randint(0, 1000, (128,), device=device)
    measure("ResNet-18, batch 128", resnet, (images, labels),
            lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]), device)


if __name__ == "__main__":
    main()
