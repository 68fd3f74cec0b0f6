"""DistributedDataParallel's gradient all-reduce, recorded on both sides of the sum.

`GradientSums` owns a DDP model's communication hook. It does what DDP does without one: each
rank's gradients are scaled by 1/world size in their bucket (as DDP's reducer scales them while
copying them in), and each bucket is summed over the ranks by one `all_reduce`. As a bucket goes
out it records this rank's share of each of its parameters' gradients, `NAME.grad.local`; after
`backward` each parameter's gradient holds the sum, which `CapturedStep.gradients` records as
`NAME.grad`, a collective (`all_reduce_sum`) of that share (docs/trace-format.md, section 10).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from repro.writer import ALL_REDUCE_SUM, WriteError

# A rank's own contribution to a gradient sum: `NAME.grad.local`, as repro's ranks name it.
LOCAL_SUFFIX = ".local"


def is_ddp(model: torch.nn.Module) -> bool:
    """Whether `model` is wrapped in DistributedDataParallel."""
    return isinstance(model, torch.nn.parallel.DistributedDataParallel)


class GradientSums:
    """A DDP model's gradient all-reduce, recording each rank's share as its bucket is summed."""

    def __init__(self, ddp: torch.nn.parallel.DistributedDataParallel):
        self.step = None  # the StepRecorder of the step being recorded, if any
        self.shared: set[str] = set()  # the gradients whose share this step recorded
        self._names = {id(p): name for name, p in ddp.module.named_parameters()}
        self._group = ddp.process_group
        self._world = dist.get_world_size(self._group)
        try:
            ddp.register_comm_hook(None, self._hook)
        except RuntimeError as e:
            raise WriteError(f"cannot record this DDP model's gradient sums ({e}): repro.torch sums them through a "
                             "communication hook of its own, which DDP allows only once; record the model before "
                             "registering another") from None

    def begin(self, step) -> None:
        """Records the shares of step `step` (a StepRecorder; None: records nothing)."""
        self.step, self.shared = step, set()

    def remove(self) -> None:
        """Nothing to remove: DDP takes one communication hook and cannot drop it; after
        `begin(None)` it sums as DDP does and records nothing."""

    def local_name(self, name: str) -> Optional[str]:
        """`NAME.grad.local` when this step recorded the share of `name`'s gradient, else None
        (a step under `no_sync`, whose gradients stay this rank's own)."""
        return f"{name}.grad{LOCAL_SUFFIX}" if name in self.shared else None

    def _hook(self, state, bucket):  # unannotated: DDP checks annotations, which are text here
        """Scales this rank's gradients in `bucket` (a `dist.GradBucket`), records them as its shares,
        and sums the bucket over the ranks; a future of the sum."""
        buffer = bucket.buffer()
        buffer.mul_(1.0 / self._world)
        s = self.step
        if s is not None:
            names = [self._names[id(p)] for p in bucket.parameters()]
            for name, share in zip(names, bucket.gradients()):
                s.queue(f"{name}.grad{LOCAL_SUFFIX}", share, "gradient", "backward")
                self.shared.add(name)
            s.flush()  # hashed (or copied) before the sum overwrites the bucket
            s.recorder.entering_collective(s.step, ALL_REDUCE_SUM, [f"{n}.grad" for n in names])
        work = dist.all_reduce(buffer, group=self._group, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])
