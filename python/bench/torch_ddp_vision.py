"""A torchvision model trained under DistributedDataParallel, one process per GPU, recorded per
rank by repro.torch (or not, with --plain), each step timed: repro on a model it has no example
of. Every rank draws the same global batch of seeded images and labels and trains on its rows.

    torchrun --standalone --nproc_per_node 4 python/bench/torch_ddp_vision.py runs/r18 --model resnet18
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torchvision

from repro.torch import ModelRecorder
from steps import report_step_times, training_step  # beside this file


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", default="runs/vision-ddp")
    p.add_argument("--model", default="resnet18", help="a torchvision.models constructor")
    p.add_argument("--plain", action="store_true", help="train without recording")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=256, help="global batch, split over the ranks")
    return p.parse_args(argv)


def main(argv):
    args = parse(argv)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}")
    torch.cuda.set_device(device)
    torch.manual_seed(0)
    # warn_only: the adaptive average pool's backward has no deterministic CUDA kernel; whether
    # the runs still agree is for repro to say.
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    model = getattr(torchvision.models, args.model)(num_classes=100).to(device)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    run = {"workload": f"torchvision-{args.model}-ddp", "steps": args.steps, "params": {"batch": str(args.batch)}}
    rec = None if args.plain else ModelRecorder.create_or_gated(args.out, run, model)
    data = torch.Generator().manual_seed(1)
    rows = slice(rank * args.batch // world, (rank + 1) * args.batch // world)
    times = []
    for step in range(args.steps):
        x = torch.rand(args.batch, 3, 224, 224, generator=data)[rows].to(device)
        y = torch.randint(0, 100, (args.batch,), generator=data)[rows].to(device)
        torch.cuda.synchronize()
        started = time.perf_counter()
        training_step(model, opt, lambda m: torch.nn.functional.cross_entropy(m(x), y), rec, step, {"x": x, "y": y})
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    report_step_times(rec, rank, times, f"{args.model}, {world} ranks, batch {args.batch}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
