"""The Python recorder's cost on a real model: plain training steps against steps recorded with
`repro_torch.ModelRecorder` (hashes only: every parameter, module output, gradient and update
hashed), on one device. Prints one table row per model.

    python python/bench/torch_overhead.py [cuda|cpu]

Models: transformers' GPT-2 (124M parameters) at batch 8 x 1024, and torchvision's ResNet-18 at
batch 128 when torchvision is installed.
"""

import sys
import tempfile
import time

import torch

from repro_torch import ModelRecorder


def timed(step, n: int, device: str) -> float:
    """Seconds per step over `n` steps, the device drained before and after."""
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for i in range(n):
        step(i)
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - started) / n


def measure(name: str, model, batch, loss_fn, device: str, n: int = 5) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def plain(_):
        opt.zero_grad()
        loss_fn(model, batch).backward()
        opt.step()

    plain(0)
    plain_s = timed(plain, n, device)
    with tempfile.TemporaryDirectory() as d:
        rec = ModelRecorder.create_or_gated(f"{d}/t", {"workload": name, "steps": n + 1}, model, capture="none")

        def recorded(i):
            opt.zero_grad()
            with rec.training_step(i, inputs={}) as s:
                loss = loss_fn(model, batch)
                s.loss(loss)
                loss.backward()
                s.gradients()
                opt.step()

        recorded(0)
        recorded_s = timed(lambda i: recorded(i + 1), n, device)
        rec.finish()
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"| {name} ({params:.0f}M parameters) | {device} | {plain_s * 1e3:.0f} ms | {recorded_s * 1e3:.0f} ms | "
          f"{recorded_s / plain_s:.2f}x |", flush=True)


def main() -> None:
    device = sys.argv[1] if len(sys.argv) > 1 else ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    print("| model | device | plain step | recorded step (hashes only) | ratio |")
    print("|---|---|---|---|---|")
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
