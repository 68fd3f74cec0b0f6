"""Whether the flush policies record the same hashes on real models: records a few deterministic
training steps of a model (the same seed, inputs and deterministic algorithms each time) once
under each flush policy (`FlushOptions.mode`), hashes only, into OUT/MODEL-POLICY; `repro diff` of those
traces must then say IDENTICAL. A policy that read an output after the program had changed it in
place would record another hash (or stop with an error, which this prints).

    python python/bench/torch_flush_check.py OUT [--steps N] [--batch N] MODEL ...

MODEL: a torchvision classification model at batch 16 (or --batch N), or gpt2 (transformers,
2 x 256). At a batch of 64 a flush holds enough outputs to measure the memory they keep
(`repro.torch.flushes`), and the steps after the second flush as that measure says.
"""

import argparse
import os
import subprocess
import sys

import torch

from repro.torch import ModelRecorder, Recorder
from repro.torch.options import FlushOptions
from steps import training_step  # beside this file

# `module` twice: whether the program itself is deterministic, the control for the others.
POLICIES = ("module", "module-again", "batched")


def build(name: str, batch: int):
    torch.manual_seed(0)
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        model = GPT2LMHeadModel(GPT2Config(n_layer=4)).cuda()
        ids = torch.randint(0, 50257, (2, 256), device="cuda")
        return model, lambda m: m(ids, labels=ids).loss
    import torchvision

    model = torchvision.models.get_model(name).cuda()
    images = torch.randn(batch, 3, 224, 224, device="cuda")
    labels = torch.randint(0, 1000, (batch,), device="cuda")
    return model, lambda m: torch.nn.functional.cross_entropy(m(images), labels)


def record(name: str, policy: str, path: str, steps: int, batch: int) -> None:
    model, loss_of = build(name, batch)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rec = ModelRecorder(Recorder(path, {"workload": name, "steps": steps}, capture="none", modules="all",
                                 replace=True, device=torch.device("cuda"), device_hashing=True,
                                 flush=FlushOptions(mode=policy.removesuffix("-again"))), model)
    for step in range(steps):
        training_step(model, opt, loss_of, rec, step)
    rec.finish()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("models", nargs="+")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16, help="images a step (torchvision models)")
    args = parser.parse_args()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)
    repro = os.environ.get("REPRO_BIN", "repro")
    failed = 0
    for name in args.models:
        paths = {p: os.path.join(args.out, f"{name}-{p}") for p in POLICIES}
        try:
            for policy, path in paths.items():
                record(name, policy, path, args.steps, args.batch)
        except Exception as e:  # a policy that stopped: what it said
            print(f"{name}: recording failed: {type(e).__name__}: {e}")
            failed += 1
            continue
        for policy in POLICIES[1:]:
            diff = subprocess.run([repro, "diff", paths["module"], paths[policy]], capture_output=True, text=True)
            said = [line.strip() for line in diff.stdout.splitlines()
                    if line.lstrip().startswith(("IDENTICAL", "DIVERGED", "WITHIN", "root cause"))]
            print(f"{name}: module against {policy}: exit {diff.returncode}: {' / '.join(said[:3]) or diff.stderr.strip()}")
            failed += diff.returncode != 0
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
