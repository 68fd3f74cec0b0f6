"""What deterministic mode costs each network (seed 004, section 4 and figure 9): for each network
and each mode (`modes.MODES`), the step time and GPU kernel time of a training step (SGD with
momentum, cross-entropy, one fixed batch of random images and labels), the mode's top kernels,
and whether two runs of the mode are bit-identical, with where they first differ. A network an
op refuses to run deterministically is retried with each of `modes.WORKAROUNDS`, used then in both
modes so that they time the same network; one no workaround fixes is reported as refused.

Each network's result is one JSON file in OUT/cost/, written when the network is done, so an
interrupted study resumes where it stopped (`--restart` measures again)."""

from __future__ import annotations

import gc
import json
import os
from dataclasses import asdict
from typing import Optional

import torch

from . import modes, twins
from .environment import describe_environment, write_json
from .models import Network
from .step import training_step
from .timing import time_steps


def _batch(net: Network, batch: int, device: torch.device, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 3, net.side, net.side, generator=g)
    y = torch.randint(0, net.classes, (batch,), generator=g)
    return x.to(device), y.to(device)


def _fresh(net: Network, seed: int, device: torch.device, workarounds: list, example):
    model = net.build(seed).to(device)
    for name in workarounds:
        modes.WORKAROUNDS[name](model, example)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return model, opt


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def workarounds_for(net: Network, seed: int, device: torch.device, x, y) -> tuple[list, Optional[str], Optional[str]]:
    """Runs one deterministic step: ([], None, None) if it runs; else (the workarounds that made it
    run, the op that refused, None), or ([], that op, its refusal) if none did."""
    modes.apply("deterministic")
    op = message = None
    for tried in [[]] + [[name] for name in modes.WORKAROUNDS]:
        model = net.build(seed).to(device)
        if tried and not modes.WORKAROUNDS[tried[0]](model, x[:1]):
            continue  # changes nothing in this network
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        try:
            training_step(model, opt, x, y)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return tried, op, None
        except RuntimeError as error:
            found = modes.refused_op(error)
            if found is None:
                raise
            op, message = op or found, message or str(error).splitlines()[0]
        finally:
            del model, opt
            _release(device)
    return [], op, message


def measure(net: Network, batch: int, device: torch.device, seed: int, warmup: int, timed: int, profiled: int,
            record_steps: int, traces: str, before: Optional[dict] = None) -> dict:
    """One network's row of the study (see the module's documentation); the modes `before` (an
    earlier row of the same settings) holds are kept, not measured again."""
    x, y = _batch(net, batch, device, seed)
    if before is not None:
        fixes, refused_op, refusal = before["workarounds"], before["refused_op"], before["refusal"]
    else:
        fixes, refused_op, refusal = workarounds_for(net, seed, device, x, y)
    result = {"network": net.name, "side": net.side, "batch": batch, "workarounds": fixes, "refused_op": refused_op,
              "refusal": refusal, "modes": dict(before["modes"]) if before is not None else {}}
    for mode in modes.MODES:
        if mode in result["modes"] or (mode != "default" and refusal is not None):
            continue
        modes.apply(mode)
        model, opt = _fresh(net, seed, device, fixes, x[:1])
        result["parameters"] = sum(p.numel() for p in model.parameters())
        times = time_steps(lambda: training_step(model, opt, x, y), device, warmup, timed, profiled)
        del model, opt
        _release(device)
        runs = []
        for twin in ("a", "b"):
            model, opt = _fresh(net, seed, device, fixes, x[:1])
            out = os.path.join(traces, net.name, f"{mode}-{twin}")
            twins.record(out, {"workload": f"study-cost:{net.name}", "mode": mode, "batch": batch, "seed": seed},
                         model, record_steps, lambda s, i: training_step(model, opt, x, y, s), lambda i: {"x": x, "y": y})
            runs.append(out)
            if twin == "b":
                divergence = twins.compare(runs[0], runs[1], model)
            del model, opt
            _release(device)
        result["modes"][mode] = {**asdict(times), "identical": divergence is None,
                                 "divergence": twins.as_dict(divergence), "traces": runs}
    return result


def run(networks: list, out: str, batch: int, device: torch.device, seed: int, warmup: int, timed: int,
        profiled: int, record_steps: int, restart: bool, log) -> list:
    """The study over `networks` into `out` (see the module's documentation); returns every row."""
    settings = {"study": "cost", "batch": batch, "device": str(device), "seed": seed, "warmup": warmup,
                "timed": timed, "profiled": profiled, "record_steps": record_steps}
    rows_dir = os.path.join(out, "cost")
    os.makedirs(rows_dir, exist_ok=True)
    write_json(os.path.join(out, "study.json"), {**settings, "environment": describe_environment(device)})
    rows = []
    for net in networks:
        path = os.path.join(rows_dir, f"{net.name}.json")
        before = None
        if os.path.exists(path) and not restart:
            with open(path) as f:
                before = json.load(f)
            if before.get("settings") != settings or before.get("side") != net.side:
                before = None
            elif all(m in before["modes"] or before["refusal"] for m in modes.MODES):
                log(f"{net.name}: measured before ({path})")
                rows.append(before)
                continue
        log(f"{net.name}: measuring" + (" the modes it lacks" if before else ""))
        try:
            row = {**measure(net, batch, device, seed, warmup, timed, profiled, record_steps,
                             os.path.join(out, "traces"), before), "settings": settings}
        except RuntimeError as error:
            raise RuntimeError(f"{net.name} at batch {batch}, {net.side}×{net.side}: {error}") from error
        write_json(path, row)
        rows.append(row)
        log(_summary(row))
    return rows


def _summary(row: dict) -> str:
    parts = [row["network"]]
    for mode, m in row["modes"].items():
        kernel = f", kernels {m['kernel_ms']:.1f} ms" if m["kernel_ms"] is not None else ""
        where = "identical" if m["identical"] else f"differ at {m['divergence']['tensor']}"
        parts.append(f"{mode} {m['step_ms']:.1f} ms{kernel}, {where}")
    if row["refusal"]:
        parts.append(f"deterministic refused: {row['refused_op']}")
    return "; ".join(parts)
