"""A training program with one nondeterministic op, for `repro bisect -- CMD` end to end on a GPU
(issue 67): torchvision's resnet50 on seeded synthetic 224 x 224 images, SGD with momentum, whose
head pools the last feature map with `index_add_` (on CUDA, float atomics: the order of the 49
additions into each pooled value is decided by timing) instead of a mean.

    python python/bench/bisect_resnet.py OUT [--batch N] [--steps N] [--plain]

Records itself into OUT with `ModelRecorder.create_or_gated` (what `repro record/gate/bisect --
CMD` ask for wins); `--plain` trains the same steps unrecorded, for the time they take plain.
Prints the wall time of its steps (from the first step's start, the GPU drained at the end).
"""

import argparse
import sys
import time

import torch
import torchvision

from repro.torch import ModelRecorder


class AtomicPool(torch.nn.Module):
    """Global average pooling by `index_add_`: every spatial position's features added into its
    image's row (float atomics on CUDA), then scaled."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, channels, height, width = x.shape
        positions = x.permute(0, 2, 3, 1).reshape(batch * height * width, channels)
        rows = torch.arange(batch, device=x.device).repeat_interleave(height * width)
        pooled = torch.zeros(batch, channels, device=x.device, dtype=x.dtype).index_add_(0, rows, positions)
        return (pooled / (height * width)).reshape(batch, channels, 1, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--plain", action="store_true")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = torchvision.models.resnet50()
    model.avgpool = AtomicPool()
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = torch.Generator().manual_seed(1)
    batches = [(torch.randn(args.batch, 3, 224, 224, generator=data), torch.randint(0, 1000, (args.batch,), generator=data))
               for _ in range(args.steps)]
    rec = None
    if not args.plain:
        rec = ModelRecorder.create_or_gated(args.out, {"workload": "resnet50-atomic-pool", "steps": args.steps,
                                                       "batch": args.batch}, model)
    started = time.perf_counter()
    for step, (images, labels) in enumerate(batches):
        images, labels = images.to(device), labels.to(device)
        opt.zero_grad()
        if rec is None:
            torch.nn.functional.cross_entropy(model(images), labels).backward()
            opt.step()
            continue
        with rec.training_step(step, inputs={"images": images, "labels": labels}) as s:
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            s.loss(loss)
            loss.backward()
            s.gradients()
            opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    if rec is not None:
        rec.finish()
    print(f"{'plain' if rec is None else 'recorded'}: {args.steps} steps in {seconds:.2f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
