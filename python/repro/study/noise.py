"""Implementation noise against algorithmic noise in trained classifiers (seeds 000 and 004): each
network is trained `runs` times in each variant, every run from a fresh model,

| variant | seeds (weights, order, augmentation) | mode |
|---|---|---|
| control | the same in every run | deterministic |
| algo | run i uses seed + i | deterministic |
| impl | the same in every run | default |
| algo+impl | run i uses seed + i | default |

and each variant reports, over its runs, test accuracy (mean, sample standard deviation, min,
max), churn (the share of test examples two runs predict differently, averaged over pairs) and
the L2 distance between two runs' normalized weights (‖w₁/‖w₁‖ − w₂/‖w₂‖‖ over every trainable
parameter, averaged over pairs). The first two runs of `impl` are recorded by `repro.torch`, and
`repro diff` says at which step and tensor they first part.

Each finished run is saved under OUT/noise/runs/ (its result, then its weights), so a study that
stops resumes with the runs it lacks."""

from __future__ import annotations

import itertools
import json
import os
import statistics

import torch

from repro.torch import ModelRecorder, Recorder

from . import modes, twins
from .data import augment, synthetic_cifar
from .environment import describe_environment, write_json
from .models import Network
from .step import training_step

VARIANTS = {"control": (False, "deterministic"), "algo": (True, "deterministic"), "impl": (False, "default"),
            "algo+impl": (True, "default")}


def train(net: Network, data, seed: int, mode: str, epochs: int, batch: int, lr: float, device: torch.device,
          trace: str | None = None) -> tuple[torch.nn.Module, int]:
    """Trains a fresh `net` from `seed` (its weights, shuffling and augmentation each from their own
    generator) in `mode`, recording every step into `trace` if given; returns (model, steps)."""
    modes.apply(mode)
    (xs, ys), _ = data
    model = net.build(seed).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    order = torch.Generator().manual_seed(1_000_003 * seed + 1)
    shifts = torch.Generator().manual_seed(1_000_003 * seed + 2)
    xs, ys = xs.to(device), ys.to(device)
    rec = None
    if trace is not None:
        rec = ModelRecorder(Recorder(trace, {"workload": f"study-noise:{net.name}", "seed": seed,
                                                         "mode": mode}, capture="none", modules="all",
                                                 replace=True, device=device), model)
    step = 0
    model.train()
    try:
        for _ in range(epochs):
            permutation = torch.randperm(len(ys), generator=order).to(device)
            for first in range(0, len(ys) - batch + 1, batch):
                picked = permutation[first:first + batch]
                x, y = augment(xs[picked], shifts), ys[picked]
                if rec is None:
                    training_step(model, opt, x, y)
                else:
                    with rec.training_step(step, inputs={"x": x, "y": y}) as s:
                        training_step(model, opt, x, y, s)
                step += 1
    finally:
        if rec is not None:
            rec.finish()
    return model, step


@torch.no_grad()
def predictions(model: torch.nn.Module, x: torch.Tensor, device: torch.device, batch: int = 500) -> torch.Tensor:
    model.eval()
    return torch.cat([model(x[i:i + batch].to(device)).argmax(1).cpu() for i in range(0, len(x), batch)])


def normalized_weights(model: torch.nn.Module) -> torch.Tensor:
    w = torch.cat([p.detach().double().flatten().cpu() for p in model.parameters() if p.requires_grad])
    return w / w.norm()


def summarize(results: list[dict], weights: list[torch.Tensor]) -> dict:
    """A variant's numbers over its runs (see the module's documentation)."""
    accuracy = [r["accuracy"] for r in results]
    pairs = list(itertools.combinations(range(len(results)), 2))
    churn = [sum(a != b for a, b in zip(results[i]["predictions"], results[j]["predictions"])) /
             len(results[i]["predictions"]) for i, j in pairs]
    l2 = [float((weights[i] - weights[j]).norm()) for i, j in pairs]
    return {"runs": len(results), "accuracy_mean": statistics.fmean(accuracy),
            "accuracy_sd": statistics.stdev(accuracy) if len(accuracy) > 1 else 0.0,
            "accuracy_min": min(accuracy), "accuracy_max": max(accuracy),
            "churn": statistics.fmean(churn) if churn else 0.0, "l2": statistics.fmean(l2) if l2 else 0.0,
            "identical_runs": sum(c == 0 and d == 0 for c, d in zip(churn, l2)), "pairs": len(pairs)}


def run(networks: list, out: str, runs: int, epochs: int, batch: int, lr: float, examples: tuple[int, int],
        seed: int, data_seed: int, device: torch.device, restart: bool, log) -> dict:
    """The study (see the module's documentation); returns {network: {variant: numbers}}."""
    settings = {"study": "noise", "runs": runs, "epochs": epochs, "batch": batch, "lr": lr,
                "examples": list(examples), "seed": seed, "data_seed": data_seed, "device": str(device)}
    os.makedirs(out, exist_ok=True)
    write_json(os.path.join(out, "study.json"), {**settings, "environment": describe_environment(device)})
    data = synthetic_cifar(*examples, seed=data_seed)
    test_x, test_y = data[1]
    report = {}
    for net in networks:
        report[net.name] = {}
        for variant, (vary_seed, mode) in VARIANTS.items():
            results, weights = [], []
            for i in range(runs):
                run_seed = seed + i if vary_seed else seed
                saved = os.path.join(out, "noise", "runs", net.name, variant, f"run-{i}")
                os.makedirs(os.path.dirname(saved), exist_ok=True)
                result = _load(saved, settings) if not restart else None
                if result is None:
                    trace = os.path.join(out, "traces", net.name, f"impl-{i}") if variant == "impl" and i < 2 else None
                    model, steps = train(net, data, run_seed, mode, epochs, batch, lr, device, trace)
                    guessed = predictions(model, test_x, device)
                    result = {"settings": settings, "seed": run_seed, "mode": mode, "steps": steps,
                              "accuracy": float((guessed == test_y).double().mean()),
                              "predictions": guessed.tolist()}
                    torch.save(normalized_weights(model), f"{saved}.weights.pt")
                    write_json(f"{saved}.json", result)
                    del model
                    log(f"{net.name} {variant} run {i}: accuracy {result['accuracy']:.4f} after {steps} steps")
                results.append(result)
                weights.append(torch.load(f"{saved}.weights.pt"))
            numbers = summarize(results, weights)
            if variant == "impl" and runs >= 2:
                first = os.path.join(out, "traces", net.name, "impl-0")
                second = os.path.join(out, "traces", net.name, "impl-1")
                if os.path.exists(first) and os.path.exists(second):
                    divergence = twins.compare(first, second, net.build(seed))
                    numbers["first_divergence"] = twins.as_dict(divergence)
            report[net.name][variant] = numbers
            log(f"{net.name} {variant}: sd {numbers['accuracy_sd']:.4f}, churn {numbers['churn']:.4f}, "
                f"l2 {numbers['l2']:.4f}")
    write_json(os.path.join(out, "noise.json"), {"settings": settings, "networks": report})
    return report


def _load(saved: str, settings: dict):
    """A finished run's result, if it was run with these settings and its weights were saved."""
    try:
        with open(f"{saved}.json") as f:
            result = json.load(f)
    except (OSError, ValueError):
        return None
    if result.get("settings") != settings or not os.path.exists(f"{saved}.weights.pt"):
        return None
    return result
