"""Data-parallel PyTorch training recorded per rank: a small MLP under DistributedDataParallel
(or FSDP2's `fully_shard` with --fsdp), one process per rank, started by torchrun, srun or
mpirun (gloo on CPUs, NCCL on GPUs). Every rank draws the same global batch and trains on its
rows, as repro's own data-parallel ranks do.

    torchrun --standalone --nproc_per_node 2 python/examples/torch_ddp.py runs/ddp
    repro record --out runs/ddp -- torchrun --standalone --nproc_per_node 2 python/examples/torch_ddp.py
    repro inspect runs/ddp --verify          # each rank, then: did the ranks stay replicas?

--microbatches N accumulates each rank's gradients over N microbatches and sums them over the
ranks after the last (DDP's `no_sync`, FSDP2's `set_requires_gradient_sync`).
"""

import argparse
import contextlib
import os
import sys

import torch
import torch.distributed as dist

from repro.torch import ModelRecorder


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", default="runs/torch-ddp", help="run directory (REPRO_TRACE_DIR wins)")
    p.add_argument("--fsdp", action="store_true", help="shard the parameters with fully_shard instead of DDP")
    p.add_argument("--bf16", action="store_true", help="with --fsdp: compute in bf16, reduce gradients in f32")
    p.add_argument("--reduce-bf16", action="store_true", help="with --bf16: reduce gradients in bf16 too")
    p.add_argument("--misdrawn-rank", type=int, default=None, metavar="R",
                   help="rank R draws its batches from another seed, as a data loader seeded by rank would (a fault "
                        "to find: its rows are not the global batch's)")
    p.add_argument("--microbatches", type=int, default=1,
                   help="split each rank's rows into this many microbatches, their gradients accumulated and "
                        "summed over the ranks after the last (DDP's no_sync, FSDP2's set_requires_gradient_sync)")
    p.add_argument("--dropout", type=float, default=0.0,
                   help="dropout after the first layer, its masks drawn by each rank from its own generator")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=32, help="the global batch, split evenly over the ranks")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--width", type=int, default=16, help="the hidden layer's width")
    return p.parse_args(argv)


def wrapped(model: torch.nn.Module, fsdp: bool, device: torch.device, bf16: bool = False,
            reduce_bf16: bool = False) -> torch.nn.Module:
    """`model` under DDP, or each layer and the whole sharded by FSDP2 (in bf16 mixed precision
    with `bf16`: parameters gathered and computed in bf16, gradients reduced in f32, or in bf16
    with `reduce_bf16`)."""
    if not fsdp:
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    reduce_dtype = torch.bfloat16 if reduce_bf16 else torch.float32
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype) if bf16 else MixedPrecisionPolicy()
    for layer in model:
        if any(True for _ in layer.parameters()):
            fully_shard(layer, mp_policy=policy)
    return fully_shard(model, mp_policy=policy)


def gradient_sync(model: torch.nn.Module, sync: bool):
    """A context in which the backward pass sums gradients over the ranks only when `sync`
    (accumulating a microbatch's otherwise): DDP's `no_sync`, FSDP2's `set_requires_gradient_sync`."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext() if sync else model.no_sync()
    model.set_requires_gradient_sync(sync)
    return contextlib.nullcontext()


def main(argv, after_step=None):
    """Trains and records; `after_step(rank, step)` runs after each step (the tests kill a rank)."""
    args = parse(argv)
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch % world:
        sys.exit(f"the batch ({args.batch}) must be a multiple of the number of ranks ({world})")
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    layers = [torch.nn.Linear(4, args.width), torch.nn.Tanh(), torch.nn.Linear(args.width, 1)]
    if args.dropout:
        layers.insert(1, torch.nn.Dropout(args.dropout))
    model = torch.nn.Sequential(*layers).to(device)
    model = wrapped(model, args.fsdp, device, args.bf16, args.reduce_bf16)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    run = {
        "workload": "torch-mlp-dp",
        "steps": args.steps,
        "params": {
            "lr": str(args.lr),
            "batch": str(args.batch),
            "sharding": "fsdp" if args.fsdp else "ddp",
            "precision": "bf16" if args.bf16 else "f32",
            "width": str(args.width),
            "microbatches": str(args.microbatches),
            "dropout": str(args.dropout),
        },
    }
    rec = ModelRecorder.create_or_gated(args.out, run, model)
    data = torch.Generator().manual_seed(2 if rank == args.misdrawn_rank else 1)
    rows = slice(rank * args.batch // world, (rank + 1) * args.batch // world)
    for step in range(args.steps):
        x_all = torch.rand(args.batch, 4, generator=data)
        x, y = x_all[rows].to(device), x_all.sum(dim=1, keepdim=True).sin()[rows].to(device)
        opt.zero_grad()
        with rec.training_step(step, inputs={"x": x, "y": y}) as s:
            for m, (xm, ym) in enumerate(zip(x.chunk(args.microbatches), y.chunk(args.microbatches))):
                with gradient_sync(model, m == args.microbatches - 1):
                    loss = torch.nn.functional.mse_loss(model(xm).float(), ym) / args.microbatches
                    s.loss(loss, "loss" if m == 0 else f"loss#{m}")
                    loss.backward()
            s.gradients()
            opt.step()
        if after_step is not None:
            after_step(rank, step)
    steps = rec.finish()
    dist.destroy_process_group()
    print(f"rank {rank} recorded {steps} steps", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
