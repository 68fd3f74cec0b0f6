"""The Python recorder's cost on a real model: plain training steps against steps recorded with
`repro_torch.ModelRecorder` (hashes only: every parameter, module output, gradient and update
hashed), on one device, with CUDA tensors hashed on the GPU (repro's kernels, through
librepro_cuda_hash.so) and on the host (a copy each); and, beside them, PyTorch's own DebugMode
logging a `hash_tensor` of every op's output. Prints one table row per model.

    python python/bench/torch_overhead.py [cuda|cpu] [MODEL ...]

Models: `gpt2`, transformers' GPT-2 (124M parameters) at batch 8 x 1024; `resnet18`,
torchvision's ResNet-18 at batch 128 (when torchvision is installed); both by default. And
`gpt2-medium`, GPT-2's 355M-parameter shape at batch 8 x 1024 in bf16 autocast (without the
host-hashing column, which takes minutes a step there).
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


def measure(name: str, model, batch, loss_fn, device: str, n: int = 5, host: bool = True) -> None:
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
    if host:
        host_s = recorded_by(False, 2)
        cells.append(f"{host_s * 1e3:.0f} ms ({host_s / plain_s:.1f}x)")
    else:
        cells.append("not run")
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


def gpt2(device: str, name: str, medium: bool) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_embd=1024, n_layer=24, n_head=16) if medium else GPT2Config()
    model = GPT2LMHeadModel(config).to(device)
    ids = torch.randint(0, config.vocab_size, (8, 1024), device=device)

    def loss(m, x):
        if not medium:
            return m(x, labels=x).loss
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            return m(x, labels=x).loss

    measure(name, model, ids, loss, device, host=not medium)


def resnet18(device: str) -> None:
    try:
        import torchvision
    except ImportError:
        print("| ResNet-18 | - | torchvision is not installed | | | |")
        return
    model = torchvision.models.resnet18().to(device)
    images = torch.randn(128, 3, 224, 224, device=device)
    labels = torch.randint(0, 1000, (128,), device=device)
    measure("ResNet-18, batch 128", model, (images, labels),
            lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]), device)


def main() -> None:
    args = sys.argv[1:]
    device = args.pop(0) if args and args[0] in ("cuda", "cpu") else ("cuda" if torch.cuda.is_available() else "cpu")
    models = args or ["gpt2", "resnet18"]
    torch.manual_seed(0)
    print("| model | device | plain step | repro_torch, GPU hashing | repro_torch, host hashing | DebugMode, hash_tensor |")
    print("|---|---|---|---|---|---|")
    for model in models:
        if model == "gpt2":
            gpt2(device, "GPT-2, batch 8 x 1024", medium=False)
        elif model == "gpt2-medium":
            gpt2(device, "GPT-2-medium shape, batch 8 x 1024, bf16 autocast", medium=True)
        elif model == "resnet18":
            resnet18(device)
        else:
            raise SystemExit(f"unknown model {model}: expected gpt2, gpt2-medium or resnet18")
        if device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
