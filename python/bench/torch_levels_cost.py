"""What the capture ladder's levels cost the host per training step, on the CPU: a small
ResNet-like network (a stem and four basic blocks of 16 to 64 channels, 37 modules) at batch 8
on 32x32 images, trained plain and recorded at each level: `steps` alone (`modules="none"`), the
default (module outputs at the first step alone: from the second step on, the same as `steps`),
every module's output at every step (`modules="all"`), and every aten op's output at every step
(`ops="all"`: what one step of the `ops` level costs).

Every tensor goes the GPU path through a stand-in for the GPU hashing library that hashes nothing
(`torch_host_cost.py`'s), so that what a recorded step adds to the plain one is the recorder's
own host work, as on a GPU; with --host, tensors are copied and hashed on the host, as a CPU run
records them.

    python python/bench/torch_levels_cost.py [--host] [--rounds N]

The variants take turns, 5 steps each a round, each round starting from the next variant, after
5 steps each to warm up (and record the default's first step). A step's time is the CPU time of
the one thread that runs it (PyTorch's intra-op threads set to 1), which the machine's other load
moves less than its wall time. Prints one markdown row per variant: the median step time, and its
excess over the plain step's median.
"""

import os
import statistics
import sys
import tempfile
import time

import torch

from repro.torch import ModelRecorder, Recorder
from steps import training_step  # beside this file
from torch_host_cost import HostHasher, NullLibrary  # beside this file

nn = torch.nn


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with batch norms, an in-place ReLU after the sum
    with the shortcut (a 1x1 convolution where the shape changes)."""

    def __init__(self, inputs: int, outputs: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.shortcut = nn.Sequential()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += self.shortcut(x)
        return self.relu(out)


def small_resnet() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
        BasicBlock(16, 16, 1), BasicBlock(16, 32, 2), BasicBlock(32, 64, 2), BasicBlock(64, 64, 1),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    )


# The variants: their names and the recorder's levels (None: plain, not recorded).
VARIANTS = (("plain", None), ("steps (`modules=\"none\"`)", {"modules": "none"}), ("default (`modules=\"first\"`)", {}),
            ("`modules=\"all\"`", {"modules": "all"}), ("`ops=\"all\"`", {"modules": "none", "ops": "all"}))


def main() -> None:
    host = "--host" in sys.argv[1:]
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 20
    torch.set_num_threads(1)
    images = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    labels = torch.randint(0, 10, (8,), generator=torch.Generator().manual_seed(2))
    with tempfile.TemporaryDirectory() as d:
        runs = []
        for name, levels in VARIANTS:
            torch.manual_seed(0)
            model = small_resnet()
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            rec = None
            if levels is not None:
                recorder = Recorder(os.path.join(d, str(len(runs))), {"workload": "small-resnet"}, capture="none",
                                    place=None, **levels)
                if not host:
                    hasher = HostHasher("", 0, lib=NullLibrary())
                    recorder.hashers[0] = hasher
                    recorder.hasher_for = lambda t, hasher=hasher: hasher
                rec = ModelRecorder(recorder, model)
            runs.append({"name": name, "model": model, "opt": opt, "rec": rec, "step": 0, "times": []})

        def loss_of(model):
            return nn.functional.cross_entropy(model(images), labels)

        def steps(run, n, timed):
            for _ in range(n):
                started = time.thread_time()
                training_step(run["model"], run["opt"], loss_of, run["rec"], run["step"], {"x": images, "y": labels})
                if timed:
                    run["times"].append(time.thread_time() - started)
                run["step"] += 1

        for run in runs:
            steps(run, 5, timed=False)
        for r in range(rounds):  # each round in another order: none is always first or last
            for run in runs[r % len(runs):] + runs[:r % len(runs)]:
                steps(run, 5, timed=True)
        for run in runs:
            if run["rec"] is not None:
                run["rec"].finish()
    plain = statistics.median(runs[0]["times"])
    print(f"| level ({'hashed on the host' if host else 'GPU path, null library'}) | step, CPU time (ms) | over plain "
          "(ms) |")
    print("|---|---|---|")
    for run in runs:
        median = statistics.median(run["times"])
        print(f"| {run['name']} | {median * 1e3:.2f} | {(median - plain) * 1e3:+.2f} |")


if __name__ == "__main__":
    main()
