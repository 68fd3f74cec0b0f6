"""Recording PyTorch runs into repro traces, so `repro diff` compares them with candle runs and
with each other (docs/pytorch.md).

`ModelRecorder` records a `torch.nn.Module` with no per-op code, at three levels (the capture
ladder, docs/pytorch.md). `steps`, at every step: the inputs by the names given, the parameters
by their `state_dict` names, the buffers, the loss, the gradients (`NAME.grad`) and the updated
parameters (`NAME.updated`). `modules`, at the steps its policy names (by default the first
recorded): every module's output by its module path (forward hooks, in call order: a
topological order of the module graph, recorded as the graph's nodes), as repro's own capture
names them. `ops`, at the steps its policy names (by default none): every aten op's output,
forward and backward, named `{module path}/{op}#{k}` (a `TorchDispatchMode`, `ops.OpOutputs`).
A module's output records, as its `source`, the line of the program's code that called the
module (the first frame on the stack outside torch and this package); an op's output the
program's innermost line on the stack.

    with ModelRecorder.create_or_gated("runs/torch", {"workload": "mine", "steps": 10}, model) as rec:
        for step in range(10):
            with rec.training_step(step, inputs={"x": x, "y": y}) as s:
                loss = loss_fn(model(x), y)
                s.loss(loss)
                loss.backward()
                s.gradients()
                opt.step()

The `with` block removes the recorder's hooks and finishes the trace when it ends; when it ends
by an exception, the trace is finished as stopped by it (`repro diff` then reads it as
unfinished, with its steps so far). `rec.finish()` does the same without a block.

Run under `repro record -- python train.py` or `repro gate -- python train.py`, it records where
repro says, through the same environment contract as repro's library (docs/capture.md):
REPRO_TRACE_DIR, REPRO_CAPTURE, REPRO_MODULES and REPRO_OPS (the levels' step policies),
REPRO_REPLACE and REPRO_PERTURB, and REPRO_DATA_HASH (`repro
record --data-hash`: `xxh3-1k` records a trace of format 2.0, whose tensors' data hashes a GPU
computes at about twice BLAKE3's rate; docs/trace-format.md section 5.5). REPRO_AGAINST is compared
after the run by the repro command, not while recording. REPRO_PERTURB adds a constant to a
module's output in the autograd graph, so gradients flow through the moved element as through a
real fault; the header keeps it as the run setting `perturb`, and a fault planted nowhere (a
misspelt name, a step never recorded) is an error naming what it could reach.

The run settings (the dict with the workload's name) are kept whole in the header: `steps`, and
every other key (beside `workload` or in a nested `params`) as text, a non-string value as its
JSON; one that JSON cannot write is refused by name. A module output's `source` names its file
from its project's root, whatever the working directory (docs/pytorch.md).

The trace's header records the program's determinism switches as they are when the recorder is
created (`determinism_switches`), in its environment beside the numerics variables
(CUBLAS_WORKSPACE_CONFIG among them): `repro diff` lists those that differ between two runs, and a
failing gate against a baseline names them as likely causes. Set them before creating the
recorder; `finish` warns about any changed since.

CUDA tensors are hashed on their GPU by repro's own kernels (`librepro_cuda_hash.so`, built by
`make cuda`; found through REPRO_CUDA_HASH_LIB, which repro sets for the programs it runs, or
beside the `repro` on PATH): only 32 bytes a tensor reach the host, except at the steps that keep
full values and for tensors small enough to be stored inline. Without the library, and for CPU
tensors, values are copied to the host and hashed there. Either way the hash is the canonical one
of section 5 of docs/trace-format.md (little-endian, row-major bytes), with the trace's data
hash; `bool` tensors are recorded as `U8`.

Under torchrun, srun or mpirun, with torch.distributed's process group initialized before the
recorder is created, each rank records into `OUT/rank-N` with its place in the header (rank,
world size, backend and its version), as repro's own data-parallel ranks do
(docs/distributed.md): a DDP model with both sides of each gradient sum, an FSDP2 model by its
whole parameters. REPRO_PERTURB_RANK=N plants REPRO_PERTURB's fault in rank N alone.

The package has one module per concern: `tensors` (canonical bytes), `cuda_hash` (hashing on the
GPU), `perturb` (planted faults), `switches` (the header's environment), `recorder` (`Recorder`,
`StepRecorder`), `model` (`ModelRecorder`), `ops` (the `ops` level's dispatch mode), `sources`
(a record's program line), `ranks` (a rank's place and stream), `ddp` (DDP's gradient sums) and
`fsdp` (FSDP2's shards). Everything a program used from the single module
that came before it is here at the top.
"""

from .cuda_hash import CUDA_HASH_LIB, CUDA_HASH_LIB_ENV, DeviceHasher, DeviceRead, cuda_hash_library_path
from .model import CapturedStep, ModelRecorder
from .options import FlushOptions, RecordOptions
from .perturb import Perturbation
from .ranks import RankPlace, current_place
from .recorder import Recorder, StepRecorder
from .switches import determinism_switches
from .tensors import canonical, canonical_on_device, record_of

__all__ = [
    "CUDA_HASH_LIB",
    "CUDA_HASH_LIB_ENV",
    "CapturedStep",
    "DeviceHasher",
    "DeviceRead",
    "FlushOptions",
    "ModelRecorder",
    "Perturbation",
    "RankPlace",
    "RecordOptions",
    "Recorder",
    "StepRecorder",
    "canonical",
    "canonical_on_device",
    "cuda_hash_library_path",
    "current_place",
    "determinism_switches",
    "record_of",
]
