"""A finished study directory as Markdown tables (`cost.md`, `noise.md`) and SVG charts
(`cost.svg`, `noise.svg`; drawn with matplotlib where it is installed), from the JSON the studies
wrote, so the pages can be remade without rerunning anything."""

from __future__ import annotations

import json
import os
from typing import Optional

from . import published
from .modes import MODES
from .models import MEDIUM_KERNELS, figure9
from .noise import VARIANTS


def render(out: str, log) -> list[str]:
    """Writes every page `out` has results for; returns the paths written."""
    written = []
    rows_dir = os.path.join(out, "cost")
    if os.path.isdir(rows_dir):
        rows = []
        for name in sorted(os.listdir(rows_dir)):
            if name.endswith(".json"):
                with open(os.path.join(rows_dir, name)) as f:
                    rows.append(json.load(f))
        rows.sort(key=_figure_order)
        written.append(_write(os.path.join(out, "cost.md"), cost_page(rows, _environment(out))))
        written += _chart(os.path.join(out, "cost.svg"), lambda path: cost_chart(rows, path), log)
    noise_path = os.path.join(out, "noise.json")
    if os.path.exists(noise_path):
        with open(noise_path) as f:
            noise = json.load(f)
        written.append(_write(os.path.join(out, "noise.md"), noise_page(noise, _environment(out))))
        written += _chart(os.path.join(out, "noise.svg"), lambda path: noise_chart(noise, path), log)
    return written


def _environment(out: str) -> dict:
    try:
        with open(os.path.join(out, "study.json")) as f:
            return json.load(f).get("environment", {})
    except (OSError, ValueError):
        return {}


def _figure_order(row: dict):
    """Figure 9's order (its networks, then the medium CNN by kernel size), then other networks by name."""
    order = figure9()
    name = row["network"]
    return (order.index(name), "") if name in order else (len(order), name)


def _write(path: str, text: str) -> str:
    with open(path, "w") as f:
        f.write(text)
    return path


def _chart(path: str, draw, log) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("svg")
        matplotlib.rcParams["svg.hashsalt"] = "repro"  # the same ids in every drawing
        matplotlib.rcParams["svg.fonttype"] = "none"
    except ImportError:
        log(f"no matplotlib here: {path} not drawn (pip install matplotlib, then `python -m repro.study render`)")
        return []
    draw(path)
    return [path]


def _ms(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.1f}"


def _where(mode: Optional[dict]) -> str:
    if mode is None:
        return ""
    if mode["identical"]:
        return "identical"
    d = mode["divergence"]
    module = f"`{d['module']}` ({d['module_type']})" if d["module"] else f"`{d['tensor']}`"
    op = f", {d['op']}" if d["op"] else ""
    return f"step {d['step']}, {module}, {d['phase']}{op}"


def _environment_line(env: dict) -> str:
    parts = [f"{k} {env[k]}" for k in ("gpu", "driver", "torch", "cuda", "cudnn", "torchvision") if env.get(k)]
    return ", ".join(parts) if parts else "environment not recorded"


def ratio(row: dict, mode: str, key: str) -> Optional[float]:
    """`mode`'s `key` (step_ms or kernel_ms) over the default mode's, where both were measured."""
    default, other = row["modes"].get("default"), row["modes"].get(mode)
    if not default or not other or not default.get(key) or not other.get(key):
        return None
    return other[key] / default[key]


def cost_page(rows: list[dict], env: dict) -> str:
    deterministic = [m for m in MODES if m != "default"]
    lines = ["# What deterministic mode costs (seed 004, figure 9)", "",
             f"Measured by `python -m repro.study cost` on {_environment_line(env)}.", "",
             "Step is the median wall time of a training step; kernels, the GPU's time in kernels a step (torch "
             "profiler), the measure seed 004 used. Each deterministic mode's ratio is over `default`. "
             "`deterministic-nofill` is `deterministic` without PyTorch's NaN fill of new tensors. Seed 004's "
             "column gives its published kernel-time ratios where its text states them (P100 / V100 / T4).", "",
             "| network | parameters | default step | " + " | ".join(f"{m} step" for m in deterministic) +
             " | default kernels | " + " | ".join(f"{m} kernels" for m in deterministic) +
             " | seed 004 | two runs: " + " | two runs: ".join(MODES) + " | notes |",
             "|" + "---|" * (4 + 3 * len(MODES))]
    for row in rows:
        present = row["modes"]
        notes = []
        if row["workarounds"]:
            notes.append(f"`{row['refused_op']}` refused; ran with {', '.join(row['workarounds'])}")
        if row["refusal"]:
            notes.append(f"deterministic mode refused: `{row['refused_op']}`")
        cells = [row["network"], f"{row.get('parameters', 0) / 1e6:.1f}M"]
        for key in ("step_ms", "kernel_ms"):
            for mode in MODES:
                m = present.get(mode)
                value = m.get(key) if m else None
                cell = "" if value is None else f"{value:.1f} ms"
                r = ratio(row, mode, key) if mode != "default" else None
                cells.append(cell + (f" ({r:.2f}x)" if r is not None else ""))
        cells.append(_published(row["network"]))
        cells += [_where(present.get(mode)) for mode in MODES]
        cells.append("; ".join(notes))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Top kernels", ""]
    for row in rows:
        for mode, m in row["modes"].items():
            if not m["top_kernels"]:
                continue
            lines.append(f"**{row['network']}, {mode}** ({_ms(m['kernel_ms'])} ms of kernels a step)")
            lines.append("")
            lines.append("| kernel | ms a step | share |")
            lines.append("|---|---|---|")
            for name, ms, share in m["top_kernels"][:5]:
                short = name if len(name) <= 90 else name[:87] + "..."
                lines.append(f"| `{short.replace('|', '/')}` | {ms:.2f} | {share:.0%} |")
            lines.append("")
    return "\n".join(lines) + "\n"


def _published(network: str) -> str:
    if network.startswith("medium_cnn_k"):
        k = int(network[len("medium_cnn_k"):])
        if k in (1, 7):
            return " / ".join(f"{published.MEDIUM_CNN[gpu][0 if k == 1 else 1]:.2f}x" for gpu in published.GPUS)
        return ""
    key = "mobilenet" if network.startswith("mobilenet") else network
    values = [published.NETWORKS.get((key, gpu)) for gpu in published.GPUS]
    return " / ".join("–" if v is None else f"{v:.2f}x" for v in values) if any(values) else ""


def cost_chart(rows: list[dict], path: str) -> None:
    import matplotlib.pyplot as plt

    networks = [r for r in rows if not r["network"].startswith("medium_cnn_k")]
    medium = {int(r["network"][len("medium_cnn_k"):]): r for r in rows if r["network"].startswith("medium_cnn_k")}
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [max(len(networks), 1), 7]})
    names = [r["network"] for r in networks]
    width = 0.4
    for j, (mode, color) in enumerate((("deterministic", "#4c72b0"), ("deterministic-nofill", "#8fb0e0"))):
        left.bar([i + (j - 0.5) * width for i in range(len(names))],
                 [ratio(r, mode, "kernel_ms") or 0 for r in networks], width, color=color, label=f"this GPU, {mode}")
    for gpu, (low, high) in published.NETWORK_RANGES.items():
        left.axhspan(low, high, alpha=0.08, color={"P100": "red", "V100": "green", "T4": "orange"}[gpu],
                     label=f"seed 004, {gpu}: {low:.2f}x to {high:.2f}x")
    for (network, gpu), value in published.NETWORKS.items():
        for i, name in enumerate(names):
            if name == network or (network == "mobilenet" and name.startswith("mobilenet")):
                left.plot(i, value, marker="D", color="green", label=f"seed 004, {gpu}")
    left.set_xticks(range(len(names)), names, rotation=40, ha="right")
    left.set_ylabel("deterministic / default kernel time")
    left.axhline(1.0, color="black", linewidth=0.6)
    left.set_title("networks (shaded: seed 004's ranges)")
    handles, labels = left.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    left.legend(unique.values(), unique.keys(), fontsize=8)
    kernels = sorted(medium)
    for j, (mode, color) in enumerate((("deterministic", "#4c72b0"), ("deterministic-nofill", "#8fb0e0"))):
        right.bar([k + (j - 0.5) * width for k in kernels], [ratio(medium[k], mode, "kernel_ms") or 0 for k in kernels],
                  width, color=color, label=f"this GPU, {mode}")
    for gpu, (at1, at7) in published.MEDIUM_CNN.items():
        right.plot([1, 7], [at1, at7], marker="o", linestyle=":", label=f"seed 004, {gpu} (1×1 and 7×7)")
    right.set_xticks(list(MEDIUM_KERNELS), [f"{k}×{k}" for k in MEDIUM_KERNELS])
    right.axhline(1.0, color="black", linewidth=0.6)
    right.set_title("medium CNN by kernel size")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, metadata={"Date": None})
    plt.close(fig)


def noise_page(noise: dict, env: dict) -> str:
    s = noise["settings"]
    lines = ["# Implementation against algorithmic noise (seeds 000 and 004)", "",
             f"Measured by `python -m repro.study noise` on {_environment_line(env)}: {s['runs']} runs a variant, "
             f"{s['epochs']} epochs of {s['examples'][0]} synthetic CIFAR-shaped examples, batch {s['batch']}, "
             f"tested on {s['examples'][1]}.", "",
             "| network | variant | accuracy (mean) | accuracy sd | min | max | churn | L2 (normalized w) | "
             "identical pairs | first difference of two runs |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for network, variants in noise["networks"].items():
        for variant in VARIANTS:
            v = variants.get(variant)
            if v is None:
                continue
            first = ""
            if "first_divergence" in v:
                d = v["first_divergence"]
                first = "none (identical)" if d is None else _where({"identical": False, "divergence": d})
            lines.append(f"| {network} | {variant} | {v['accuracy_mean']:.4f} | {v['accuracy_sd']:.4f} | "
                         f"{v['accuracy_min']:.4f} | {v['accuracy_max']:.4f} | {v['churn']:.4f} | {v['l2']:.4f} | "
                         f"{v['identical_runs']} of {v['pairs']} | {first} |")
    lines += ["", "Implementation noise against algorithmic noise (`impl` over `algo`), and the share of the "
              "total spread of accuracy the implementation alone makes (`impl` over `algo+impl`):", "",
              "| network | accuracy sd | churn | L2 | sd(impl) / sd(algo+impl) |", "|---|---|---|---|---|"]
    for network, v in noise["networks"].items():
        if not all(k in v for k in VARIANTS):
            continue
        lines.append(f"| {network} | {_over(v['impl']['accuracy_sd'], v['algo']['accuracy_sd'])} | "
                     f"{_over(v['impl']['churn'], v['algo']['churn'])} | {_over(v['impl']['l2'], v['algo']['l2'])} | "
                     f"{_over(v['impl']['accuracy_sd'], v['algo+impl']['accuracy_sd'])} |")
    return "\n".join(lines) + "\n"


def _over(a: float, b: float) -> str:
    return "–" if b == 0 else f"{a / b:.2f}"


def noise_chart(noise: dict, path: str) -> None:
    import matplotlib.pyplot as plt

    networks = list(noise["networks"])
    metrics = (("accuracy_sd", "accuracy sd"), ("churn", "churn"), ("l2", "L2 of normalized weights"))
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    width = 0.8 / len(VARIANTS)
    for ax, (key, title) in zip(axes, metrics):
        for j, variant in enumerate(VARIANTS):
            values = [noise["networks"][n].get(variant, {}).get(key, 0) for n in networks]
            ax.bar([i + j * width for i in range(len(networks))], values, width, label=variant)
        ax.set_xticks([i + width * (len(VARIANTS) - 1) / 2 for i in range(len(networks))], networks)
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, metadata={"Date": None})
    plt.close(fig)
