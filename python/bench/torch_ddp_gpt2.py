"""transformers' GPT-2 (124M) trained under DistributedDataParallel, one process per GPU, recorded
per rank by repro.torch (or not, with --plain), and each step timed. For the GPU table of
docs/results/pytorch-ddp-h200x2.md:

    torchrun --standalone --nproc_per_node 2 python/bench/torch_ddp_gpt2.py runs/gpt2-ddp --steps 10
    torchrun --standalone --nproc_per_node 2 python/bench/torch_ddp_gpt2.py --plain --steps 10

The model is built from GPT2Config() with seeded weights (no download), dropout off; every rank
draws the same global batch of token ids and trains on its rows. Prints, from rank 0, the median
time of a step after the first two (the step synchronized with the GPU), and of the host's part
of it (until the step's last call returns, before waiting for the GPU). With --parts, the
recorded run also times the recorder's own calls (`torch_profile.timers`) and prints them a step;
--without modules (no module outputs) or shares (no FSDP2 shares) leaves a part out, to weigh it.
Falls back to gloo on the CPU, to try it.
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel

from repro.torch import ModelRecorder
from steps import report_step_times, training_step  # beside this file
from torch_profile import timers  # beside this file


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", default="runs/gpt2-ddp")
    p.add_argument("--plain", action="store_true", help="train without recording")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=8, help="global batch, split over the ranks")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--layers", type=int, default=12, help="fewer for a try on the CPU")
    p.add_argument("--fsdp", action="store_true", help="shard with FSDP2's fully_shard (each block, then the whole)")
    p.add_argument("--bf16", action="store_true", help="with --fsdp: bf16 parameters and compute, f32 reduction")
    p.add_argument("--parts", action="store_true", help="time the recorder's own calls, by call")
    p.add_argument("--without", choices=("modules", "shares"), help="record without module outputs, or FSDP2 shares")
    return p.parse_args(argv)


def sync(cuda: bool) -> None:
    """Waits for the GPU's work (nothing to wait for on the CPU)."""
    if cuda:
        torch.cuda.synchronize()


def main(argv):
    args = parse(argv)
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    config = GPT2Config(n_positions=args.context, n_layer=args.layers, resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, use_cache=False)
    model = GPT2LMHeadModel._from_config(config, attn_implementation="eager").to(device)
    if args.fsdp:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        dtype = torch.bfloat16 if args.bf16 else None
        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if args.bf16 else None)
        for block in model.transformer.h:
            fully_shard(block, mp_policy=policy)
        model = fully_shard(model, mp_policy=policy)
    else:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    params = {"batch": str(args.batch), "context": str(args.context), "lr": "1e-4"}
    if args.fsdp:
        params["sharding"] = "fsdp-bf16" if args.bf16 else "fsdp"
    run = {"workload": "gpt2-124m-ddp", "steps": args.steps, "params": params}
    if args.without == "shares":  # a bench's switch, not the recorder's: the hooks do nothing
        import repro.torch.fsdp

        repro.torch.fsdp.GradientShares._share_hook = lambda self, name, dtype: (lambda gathered: None)
    rec = None if args.plain else ModelRecorder.create_or_gated(args.out, run, model,
                                                                 modules="none" if args.without == "modules" else "all")
    spent = timers() if args.parts and rec is not None else None
    data = torch.Generator().manual_seed(1)
    rows = slice(rank * args.batch // world, (rank + 1) * args.batch // world)
    times, host = [], []
    for step in range(args.steps):
        ids = torch.randint(0, config.vocab_size, (args.batch, args.context), generator=data)[rows].to(device)
        sync(cuda)
        if step == 2 and spent is not None:
            spent.clear()
        started = time.perf_counter()
        training_step(model, opt, lambda m: m(input_ids=ids, labels=ids).loss, rec, step, {"input_ids": ids})
        host.append(time.perf_counter() - started)
        sync(cuda)
        times.append(time.perf_counter() - started)
    report_step_times(rec, rank, times, f"{world} ranks, batch {args.batch} x {args.context}")
    if rank == 0:
        print(f"host's part: median {statistics.median(host[2:]) * 1e3:.1f} ms", file=sys.stderr)
        if spent is not None:
            steps = len(times) - 2
            print("recorder's calls a step: " + ", ".join(f"{k} {v / steps * 1e3:.1f} ms" for k, v in sorted(spent.items())),
                  file=sys.stderr)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
