"""`python -m repro.study cost|noise|render`: the studies' command line (see the package's
documentation and docs/studies.md). Exit codes: 0 done, 2 error."""

from __future__ import annotations

import argparse
import sys

from . import modes


def _networks(text: str, side):
    from .models import figure9, network

    names = figure9() if text == "figure9" else [n for n in text.split(",") if n]
    return [network(n, side) for n in names]


def _device(text):
    import torch

    if text is None:
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    device = torch.device(text)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {text}: this machine's torch sees no CUDA device")
    return device


def _pair(text: str) -> tuple[int, int]:
    parts = text.split(",")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"--examples {text}: expected TRAIN,TEST, two positive counts")
    return int(parts[0]), int(parts[1])


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m repro.study", description=" ".join(__doc__.split()))
    sub = p.add_subparsers(dest="study", required=True)
    cost = sub.add_parser("cost", help="default against deterministic cuDNN: time, kernels, bit-identity")
    cost.add_argument("--models", default="figure9", help="comma-separated networks, or figure9 (default)")
    cost.add_argument("--batch", type=int, default=64)
    cost.add_argument("--side", type=int, help="input side in pixels (default: each network's own)")
    cost.add_argument("--warmup", type=int, default=3)
    cost.add_argument("--timed", type=int, default=10)
    cost.add_argument("--profiled", type=int, default=3)
    cost.add_argument("--record-steps", type=int, default=2, help="steps each of the two recorded runs takes")
    noise = sub.add_parser("noise", help="implementation against algorithmic noise in trained classifiers")
    noise.add_argument("--models", default="resnet18_cifar,small_cnn")
    noise.add_argument("--runs", type=int, default=5)
    noise.add_argument("--epochs", type=int, default=4)
    noise.add_argument("--batch", type=int, default=128)
    noise.add_argument("--lr", type=float, default=0.02)
    noise.add_argument("--examples", default="10000,2000", help="TRAIN,TEST examples")
    noise.add_argument("--data-seed", type=int, default=0)
    for study in (cost, noise):
        study.add_argument("--out", required=True, help="the study's directory (resumed if it holds one)")
        study.add_argument("--device", help="cuda:N or cpu (default: cuda:0 where there is one)")
        study.add_argument("--seed", type=int, default=0)
        study.add_argument("--restart", action="store_true", help="measure again what the directory holds")
    render = sub.add_parser("render", help="the tables and charts of a study directory")
    render.add_argument("out")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    modes.prepare_process()

    def log(line: str) -> None:
        print(f"repro.study: {line}", file=sys.stderr, flush=True)

    from . import report

    try:
        if args.study == "cost":
            from . import cost

            for name in ("batch", "timed", "record_steps"):
                if getattr(args, name) < 1:
                    raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)}: expected at least 1")
            cost.run(_networks(args.models, args.side), args.out, args.batch, _device(args.device), args.seed,
                     args.warmup, args.timed, args.profiled, args.record_steps, args.restart, log)
        elif args.study == "noise":
            from . import noise

            if args.runs < 2:
                raise ValueError(f"--runs {args.runs}: a spread needs at least 2 runs")
            noise.run(_networks(args.models, None), args.out, args.runs, args.epochs, args.batch, args.lr,
                      _pair(args.examples), args.seed, args.data_seed, _device(args.device), args.restart, log)
        for path in report.render(args.out, log):
            log(f"wrote {path}")
    except (ValueError, RuntimeError, OSError) as error:
        log(f"error: {error}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
