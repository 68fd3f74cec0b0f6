"""The PyTorch recorder's own host work per recorded tensor, on the CPU, with no GPU: what a
recorded step costs the host besides the program, which is what the CNNs of many small modules
pay on a GPU (docs/results/pytorch-recorder-cost-h100.md).

The model trains on the CPU at a tiny input, and every tensor goes the GPU path (queued, flushed
in batches, its hash read back, the record written) through a stand-in for the GPU hashing
library that hashes nothing, so that the time measured is the recorder's and the writer's
Python. Each part's time is measured around the recorder's own calls (timers add about a
microsecond each), not as the difference of two step times: the program's own time varies more
than the recorder's.

    python python/bench/torch_host_cost.py [--parameters-only] [--fine-tune] [MODEL ...]

MODEL: torchvision classification models by name (default resnet50, densenet121,
mobilenet_v3_large; needs torchvision). With REPRO_CUDA_HASH_LIB set (the CPU build of the
library will do: `cargo build --release -p repro-cuda-hash`), the writer packs each step's
records through it, as a recorder that finds the library does. Prints one markdown row per model. --parameters-only:
no module outputs recorded (`Recorder(modules="none")`, as for a model compiled by
torch.compile): the inputs, parameters, loss, gradients and updates alone. --fine-tune: every
parameter frozen but the last two (the classifier's), as when fine-tuning.
"""

import contextlib
import gc
import os
import sys
import tempfile
import time

import torch

from repro.torch import DeviceHasher, ModelRecorder, Recorder, model, recorder
from repro.torch.cuda_hash import CUDA_HASH_LIB_ENV
from repro.writer import NativeRecords
from repro.trace import Trace
from steps import training_step  # beside this file


class NullLibrary:
    """The GPU hashing library's C functions, doing nothing: every hash reads as zeros."""

    def __init__(self):
        self.tickets = 0

    def repro_cuda_hasher_new(self, index):
        return 1

    def repro_cuda_hasher_new_kind(self, index, data_hash):
        return 1

    def repro_cuda_hasher_push_many(self, handle, addresses, lengths, keeps, n):
        first, self.tickets = self.tickets, self.tickets + n
        return first

    def repro_cuda_hasher_flush(self, handle):
        return 0

    def repro_cuda_hasher_start_read(self, handle, n):
        n._obj.value, self.tickets = self.tickets, 0
        return 1

    def repro_cuda_read_finish(self, read, hashes, n, values, kept):
        return 0

    def repro_cuda_hasher_free(self, handle):
        pass

    def repro_cuda_last_error(self):
        return b"the null library failed"


class HostHasher(DeviceHasher):
    def _on_legacy_stream(self):
        return True


def timed_parts(spent: dict) -> None:
    """Times the recorder's entry points from now on, adding seconds to `spent` by part: the
    module hooks; the loss and the gradients; the step's start and end (inputs and parameters
    queued, updates, flushes, the last step's hashes read and its record written), with the
    writer's share of it on its own. Together the first three are all the recorder's work."""

    def add(label, started):
        spent[label] = spent.get(label, 0.0) + time.perf_counter() - started

    make_hook = model.ModelRecorder._hook

    def timed_make_hook(self, module_name):
        hook = make_hook(self, module_name)

        def timed_hook(*args):
            started = time.perf_counter()
            try:
                return hook(*args)
            finally:
                add("hooks", started)

        return timed_hook

    def timed_call(function, label):
        def call(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                add(label, started)

        return call

    captured = model.ModelRecorder._captured

    @contextlib.contextmanager
    def timed_captured(self, *args, **kwargs):
        manager = captured(self, *args, **kwargs)
        started = time.perf_counter()
        value = manager.__enter__()
        add("start and end", started)
        try:
            yield value
        finally:
            started = time.perf_counter()
            manager.__exit__(None, None, None)
            add("start and end", started)

    model.ModelRecorder._hook = timed_make_hook
    model.ModelRecorder._captured = timed_captured
    model.CapturedStep.loss = timed_call(model.CapturedStep.loss, "loss and gradients")
    model.CapturedStep.gradients = timed_call(model.CapturedStep.gradients, "loss and gradients")
    recorder.TraceWriter.write_laid_out = timed_call(recorder.TraceWriter.write_laid_out, "of which the writer")


PARTS = ("hooks", "loss and gradients", "start and end", "of which the writer")


def measure(name: str, spent: dict, steps: int = 30, modules: bool = True, fine_tune: bool = False) -> None:
    import torchvision

    torch.manual_seed(0)
    net = torchvision.models.get_model(name, num_classes=10)
    images, labels = torch.randn(2, 3, 64, 64), torch.randint(0, 10, (2,))
    if fine_tune:
        for p in list(net.parameters())[:-2]:
            p.requires_grad_(False)
    opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=1e-3, momentum=0.9)

    def loss_of(m):
        return torch.nn.functional.cross_entropy(m(images), labels)

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t")
        rec = ModelRecorder(Recorder(path, {"workload": name}, capture="none", modules="all" if modules else "none",
                                     place=None), net)
        if os.environ.get(CUDA_HASH_LIB_ENV):  # its records packed as a recorder finding it would
            rec.recorder._writer.use_native_records(NativeRecords(os.environ[CUDA_HASH_LIB_ENV]))
        hasher = HostHasher("", 0, lib=NullLibrary())
        rec.recorder.hashers[0] = hasher
        rec.recorder.hasher_for = lambda t: hasher
        for i in range(3):  # the first step watches for outputs changed in place
            training_step(net, opt, loss_of, rec, i)
        spent.clear()
        collections = _collections()
        for i in range(3, 3 + steps):
            training_step(net, opt, loss_of, rec, i)
        gc_ms, full = collections()
        rec.finish()
        with Trace(path) as trace:
            records = len(list(trace.steps())[-1].tensors)
    per_step = {k: v / steps * 1e3 for k, v in spent.items()}
    total = sum(per_step.get(k, 0.0) for k in PARTS[:3])
    parts = " | ".join(f"{per_step.get(k, 0.0):.1f}" for k in PARTS)
    print(f"| {name} | {records} | {parts} | {total:.1f} | {total / records * 1e3:.1f} | {gc_ms / steps:.1f} | "
          f"{full} |", flush=True)


def _collections():
    """Starts counting Python's garbage collections; the function returned stops, and says the
    milliseconds they took and how many were full (generation 2). The recorder's parts above
    include the collections that ran inside them: what lives until a step is written is what
    they walk."""
    spent, full, started = [0.0], [0], [0.0]

    def callback(phase, info):
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            spent[0] += time.perf_counter() - started[0]
            full[0] += info["generation"] == 2

    gc.callbacks.append(callback)

    def stop():
        gc.callbacks.remove(callback)
        return spent[0] * 1e3, full[0]

    return stop


def main() -> None:
    modules, fine_tune = "--parameters-only" not in sys.argv[1:], "--fine-tune" in sys.argv[1:]
    names = [a for a in sys.argv[1:] if not a.startswith("--")] or ["resnet50", "densenet121", "mobilenet_v3_large"]
    torch.set_num_threads(1)
    spent: dict = {}
    timed_parts(spent)
    print("| model | records a step | " + " | ".join(f"{k} (ms)" for k in PARTS) + " | recorder (ms) | per record (us) "
          "| garbage collection, all of the step (ms) | full collections |")
    print("|---|---|" + "---|" * (len(PARTS) + 4))
    for name in names:
        measure(name, spent, modules=modules, fine_tune=fine_tune)


if __name__ == "__main__":
    main()
