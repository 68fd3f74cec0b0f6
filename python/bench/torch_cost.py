"""What recording costs a PyTorch program: for each model, a plain training step against the same
step recorded by `repro.torch.ModelRecorder` with hashes only (inputs, parameters, every module's
output, the loss, gradients and updates, each step), under each flush policy asked for, and
against PyTorch's own DebugMode logging a `hash_tensor` of every op's output. Prints one markdown
row per model and variant: the step (the mean of the timed steps, the GPU drained around them),
its ratio to the plain step measured in the same process, the peak of PyTorch's allocations, the
device memory in use at step ends (every allocator: repro's hashing buffers too), each with its
growth over plain, the growth of the device memory outside PyTorch's caching allocator (repro's
hashing buffers, CUDA's own), and, for repro.torch, the tensors, bytes and flushes a step hashes.

    python python/bench/torch_cost.py [--batch N] [--steps N] [--variants V,...] [--compile] [--pairs N] MODEL ...

MODEL: resnet50, densenet121, efficientnet_b0, mobilenet_v3_large, convnext_tiny, vit_b_16 (any
torchvision classification model by its name, at 224 x 224 with SGD and momentum), gpt2
(transformers' 124M GPT-2 in f32 at batch x 1024 with AdamW), llama-1b (a Llama shape of 1.1B
parameters, TinyLlama's, in bf16 autocast at batch x 1024 with AdamW). V: plain (always first),
hooks (the plain step with an empty forward hook on every module: the least any recorder of
module outputs costs), steps (the capture ladder's default: module outputs at the first step
alone, so every timed step records the `steps` level: inputs, parameters, buffers, loss,
gradients, updates), steps-xxh3 (the same with the data hash xxh3-1k), batched, module
(module outputs at every step, under that flush policy: `FlushOptions.mode`), xxh3 (batched,
with the data hash xxh3-1k: docs/trace-format.md, section 5.5), ops (every aten op's output:
the `ops` level at every timed step, what one step of it costs), debug (DebugMode), full (every step's values kept,
`capture="all"`: its row gives the payload a step and the rate it adds to the plain step, written
under REPRO_BENCH_DIR, default the temporary folder). `cudnn.benchmark` is on, as in
the issue that asked for this table. With `--compile`, each model runs compiled by `torch.compile`
(plain and recorded alike; the recorder then records no module outputs, as it says). Needs CUDA and repro's GPU hashing library
(REPRO_CUDA_HASH_LIB). With `--pairs N`, each recorded variant's row is followed by N pairs
of steps, a plain one and then a recorded one, each timed alone: the median of their ratios, and
their spread, which a host whose speed drifts between calls leaves far steadier than the ratio
of two runs of steps.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time

import torch

from repro.torch import DeviceHasher, ModelRecorder, Recorder, cuda_hash_library_path
from repro.torch.options import FlushOptions
from steps import training_step  # beside this file

VARIANTS = ("plain", "hooks", "steps", "steps-xxh3", "batched", "xxh3", "module", "ops", "debug", "full")


def vision(name: str, batch: int):
    import torchvision

    model = torchvision.models.get_model(name).cuda()
    images = torch.randn(batch, 3, 224, 224, device="cuda")
    labels = torch.randint(0, 1000, (batch,), device="cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def loss(m):
        return torch.nn.functional.cross_entropy(m(images), labels)

    return model, opt, loss, f"{name}, batch {batch}"


def language(name: str, batch: int):
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config()
        model, autocast, what = GPT2LMHeadModel(config).cuda(), False, f"GPT-2 (124M), f32, {batch} x 1024"
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                             num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
        model, autocast, what = LlamaForCausalLM(config).cuda(), True, f"Llama shape (1.1B), bf16 autocast, {batch} x 1024"
    ids = torch.randint(0, config.vocab_size, (batch, 1024), device="cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def loss(m):
        with torch.autocast("cuda", dtype=torch.bfloat16) if autocast else contextlib.nullcontext():
            return m(ids, labels=ids).loss

    return model, opt, loss, what


def timed(step, warmup: int, steps: int) -> tuple[float, int, int, int]:
    """Seconds per step over `steps` after `warmup` untimed ones; the peak of PyTorch's
    allocations during them; the most device memory in use (by every allocator, repro's
    hashing buffers included) at the end of a step, from a second pass of as many steps; and
    the most of it outside PyTorch's caching allocator (its reserve subtracted: CUDA's own, and
    repro's hashing library's)."""
    for i in range(warmup):
        step(i)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    for i in range(steps):
        step(warmup + i)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - started) / steps
    in_use = outside = 0
    for i in range(steps):
        step(warmup + steps + i)
        free, total = torch.cuda.mem_get_info()
        in_use = max(in_use, total - free)
        outside = max(outside, total - free - torch.cuda.memory_reserved())
    return seconds, torch.cuda.max_memory_allocated(), in_use, outside


class Counts:
    """Tensors, bytes and flushes a recorded step hashes on the GPU (counted by wrapping the
    hasher's methods for one step)."""

    def __init__(self):
        self.tensors = self.bytes = self.flushes = 0

    @contextlib.contextmanager
    def counting(self):
        # (queue_many: where the package measured has it, as an older one measured against may not)
        queue, queue_many, flush = DeviceHasher.queue, getattr(DeviceHasher, "queue_many", None), DeviceHasher.flush
        counts = self  # (a tensor `queue_now` reads is counted by the `queue` it calls)

        def counted_queue(self, *args, **kwargs):
            queue(self, *args, **kwargs)
            counts.tensors += 1
            counts.bytes += self._lengths[-1]

        def counted_queue_many(self, owner, indices, addresses, lengths, *args):
            queue_many(self, owner, indices, addresses, lengths, *args)
            counts.tensors += len(lengths)
            counts.bytes += sum(lengths)

        def counted_flush(self, *args, **kwargs):
            counts.flushes += bool(self.queued)
            return flush(self, *args, **kwargs)

        DeviceHasher.queue, DeviceHasher.flush = counted_queue, counted_flush
        if queue_many is not None:
            DeviceHasher.queue_many = counted_queue_many
        try:
            yield self
        finally:
            DeviceHasher.queue, DeviceHasher.flush = queue, flush
            if queue_many is not None:
                DeviceHasher.queue_many = queue_many


def paired(plain, recorded, first: int, pairs: int) -> tuple[list[float], list[float]]:
    """`pairs` pairs of steps, a plain one and then a recorded one (numbered from `first`), each
    timed alone with the GPU drained around it: each recorded step's seconds, and its ratio to
    the plain step just before it. A host whose speed drifts over seconds drifts under both."""
    seconds, ratios = [], []
    for i in range(pairs):
        torch.cuda.synchronize()
        started = time.perf_counter()
        plain(0)
        torch.cuda.synchronize()
        middle = time.perf_counter()
        recorded(first + i)
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - middle)
        ratios.append(seconds[-1] / (middle - started))
    return seconds, ratios


def measure(build, name: str, batch: int, variants: list[str], warmup: int, steps: int, compiled: bool,
            pairs: int = 0) -> None:
    model, opt, loss_of, what = build(name, batch)
    if compiled:
        model, what = torch.compile(model), f"{what}, torch.compile"
    plain_s = plain_peak = plain_in_use = plain_outside = None

    def plain(_):
        training_step(model, opt, loss_of)

    for variant in variants:
        extra = ""
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # each variant's memory in use starts from what is allocated
        if variant == "plain":
            seconds, peak, in_use, outside = timed(plain, warmup, steps)
            plain_s, plain_peak, plain_in_use, plain_outside = seconds, peak, in_use, outside
        elif variant == "hooks":
            # An empty forward hook on every module: what any recorder of module outputs pays.
            hooks = [m.register_forward_hook(lambda *_: None) for n, m in model.named_modules() if n]
            seconds, peak, in_use, outside = timed(plain, warmup, steps)
            for hook in hooks:
                hook.remove()
        elif variant == "debug":
            from torch.utils._debug_mode import DebugMode

            def debug(_):
                with DebugMode(), DebugMode.log_tensor_hashes(hash_fn="hash_tensor"):
                    plain(0)

            seconds, peak, in_use, outside = timed(debug, 1, max(2, steps // 4))
        elif variant in ("steps", "steps-xxh3", "ops"):
            levels = {"modules": "none", "ops": "all"} if variant == "ops" else {}  # else: the default levels
            with tempfile.TemporaryDirectory(dir=os.environ.get("REPRO_BENCH_DIR")) as d:
                recorder = Recorder(f"{d}/t", {"workload": name, "steps": warmup + 2 * steps + 1}, capture="none",
                                    device=torch.device("cuda"), device_hashing=True,
                                    data_hash="xxh3-1k" if variant == "steps-xxh3" else "blake3",
                                    flush=FlushOptions(mode="batched"), **levels)
                rec = ModelRecorder(recorder, model)

                def recorded(i):
                    training_step(model, opt, loss_of, rec, i)

                if variant == "ops":
                    seconds, peak, in_use, outside = timed(recorded, 1, max(2, steps // 4))
                else:
                    seconds, peak, in_use, outside = timed(recorded, warmup, steps)
                with Counts().counting() as counts:
                    recorded(warmup + 2 * steps)
                if pairs and variant != "ops":
                    pair_seconds, ratios = paired(plain, recorded, warmup + 2 * steps + 1, pairs)
                rec.finish()
            extra = f"{counts.tensors} | {counts.bytes / 1e9:.2f} GB | {counts.flushes}"
        else:
            # `full`: every step's values kept (the batched flushes for the steps that keep none);
            # `xxh3`: the batched flushes, hashing with the data hash xxh3-1k.
            flush = FlushOptions(mode="batched" if variant in ("full", "xxh3") else variant)
            with tempfile.TemporaryDirectory(dir=os.environ.get("REPRO_BENCH_DIR")) as d:
                recorder = Recorder(f"{d}/t", {"workload": name, "steps": warmup + 2 * steps + 1},
                                    capture="all" if variant == "full" else "none", modules="all",
                                    device=torch.device("cuda"), device_hashing=True,
                                    data_hash="xxh3-1k" if variant == "xxh3" else "blake3", flush=flush)
                rec = ModelRecorder(recorder, model)

                def recorded(i):
                    training_step(model, opt, loss_of, rec, i)

                seconds, peak, in_use, outside = timed(recorded, warmup, steps)
                with Counts().counting() as counts:
                    recorded(warmup + 2 * steps)
                if pairs:
                    pair_seconds, ratios = paired(plain, recorded, warmup + 2 * steps + 1, pairs)
                rec.finish()
                payloads = [e.stat().st_size for e in os.scandir(f"{d}/t/tensors")] if variant == "full" else []
            extra = f"{counts.tensors} | {counts.bytes / 1e9:.2f} GB | {counts.flushes}"
            if payloads:
                kept = statistics.median(payloads)
                rate = kept / (seconds - plain_s) / 1e9 if plain_s and seconds > plain_s else float("nan")
                extra = (f"- | {kept / 1e9:.2f} GB kept, at {rate:.2f} GB/s beyond the plain step | -")
        ratio = f"{seconds / plain_s:.2f}x" if plain_s else "-"
        growth = f"{(peak / plain_peak - 1) * 100:+.1f}%" if plain_peak else "-"
        device_growth = f"{(in_use / plain_in_use - 1) * 100:+.1f}%" if plain_in_use else "-"
        outside_growth = f"{(outside - plain_outside) / 2**20:+,.0f} MiB" if plain_outside is not None else "-"
        print(f"| {what} | {variant} | {seconds * 1e3:.1f} ms | {ratio} | {peak / 2**20:,.0f} MiB | {growth} | "
              f"{in_use / 2**20:,.0f} MiB | {device_growth} | {outside_growth} | {extra or '- | - | -'} |", flush=True)
        if pairs and variant not in ("plain", "hooks", "debug", "ops"):
            print(f"| {what} | {variant}, {pairs} pairs | {statistics.median(pair_seconds) * 1e3:.1f} ms | "
                  f"{statistics.median(ratios):.2f}x ({min(ratios):.2f} to {max(ratios):.2f}) | - | - | - | - | - | - | - | - |",
                  flush=True)
    del model, opt
    torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (the recorder watches its first)")
    parser.add_argument("--variants", default="plain,steps,batched,module,debug")
    parser.add_argument("--header", action="store_true", help="print the table's header first")
    parser.add_argument("--compile", action="store_true", help="run each model compiled by torch.compile")
    parser.add_argument("--pairs", type=int, default=0,
                        help="then N pairs of a plain and a recorded step, each timed alone: the median ratio of the pairs")
    args = parser.parse_args()
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}: expected {', '.join(VARIANTS)}")
    if "plain" in variants:
        variants = ["plain"] + [v for v in variants if v != "plain"]
    if not torch.cuda.is_available() or cuda_hash_library_path() is None:
        raise SystemExit("torch_cost.py needs a CUDA GPU and repro's GPU hashing library (REPRO_CUDA_HASH_LIB)")
    torch.backends.cudnn.benchmark = True
    if args.header:
        print("| model | variant | step | x plain | PyTorch's peak | over plain | device memory in use | over plain "
              "| outside PyTorch's allocator, over plain | tensors a step | bytes a step | flushes a step |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models:
        torch.manual_seed(0)
        build = language if name in ("gpt2", "llama-1b") else vision
        measure(build, name, args.batch, variants, args.warmup, args.steps, args.compile, args.pairs)


if __name__ == "__main__":
    main()
