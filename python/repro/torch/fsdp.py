"""FSDP2 (`torch.distributed.fsdp.fully_shard`) parameters as a trace records them.

Each rank holds a shard of every parameter: rows of dimension 0, split as `torch.chunk` splits
them (FSDP2's `Shard(0)` over a one-dimensional mesh). Each rank records its own shard, of the
parameter, its gradient and its update, under the parameter's name, with where it sits in the
whole (format 1.7 `shard`): no rank gathers anything. When recording starts the ranks exchange
their shards' shapes, and a run whose shards do not tile each parameter where chunking puts them
is refused (`check_tiling`); repro checks the tiling again, from the records, at every step, and
compares runs that shard differently on whole parameters assembled from the shards.
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch
import torch.distributed as dist

from repro.writer import WriteError

try:
    from torch.distributed.tensor import DTensor, Shard
except ImportError:  # pragma: no cover (torch before 2.4 has no public DTensor)
    DTensor, Shard = (), ()


def is_sharded(t: torch.Tensor) -> bool:
    """Whether `t` is a DTensor (an FSDP2 parameter or gradient)."""
    return bool(DTensor) and isinstance(t, DTensor)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's block of a sharded tensor: the DTensor's own local tensor (the same object at
    every call, so that an unchanged parameter is known as such and not hashed again)."""
    block = getattr(t, "_local_tensor", None)
    return block if isinstance(block, torch.Tensor) else t.to_local()


def shard_of(t: torch.Tensor, place: tuple[int, int]) -> tuple[torch.Tensor, tuple[list[int], list[int]]]:
    """This rank's block of the sharded `t` whose rows start at `place[0]`, and the record's
    `shard`: (the whole's shape, the block's offset)."""
    whole = list(t.shape)
    return local(t), (whole, [place[0]] + [0] * (len(whole) - 1))


def chunk_rows(rows: int, world: int) -> list[tuple[int, int]]:
    """(first row, number of rows) of each rank's chunk of `rows` rows over `world` ranks, as
    `torch.chunk` splits them: chunks of ceil(rows / world), the last ones shorter or empty."""
    size = -(-rows // world)
    return [(min(r * size, rows), min((r + 1) * size, rows) - min(r * size, rows)) for r in range(world)]


def tiling_error(name: str, whole_shape: list[int], shard_shapes: list[list[int]]) -> Optional[str]:
    """What keeps the shards of `name` (each rank's shape, in rank order) from tiling the whole
    parameter of `whole_shape`: each must hold the rows chunking gives its rank, starting where
    the shards before it end (so together they cover every row once); None when they tile it."""
    if not whole_shape:
        return f"`{name}` is a scalar: it has no rows to shard"
    expected = chunk_rows(whole_shape[0], len(shard_shapes))
    at = 0
    for rank, (shape, (first, rows)) in enumerate(zip(shard_shapes, expected)):
        if list(shape[1:]) != list(whole_shape[1:]):
            return f"rank {rank}'s shard of `{name}` is {list(shape)}: not rows of {list(whole_shape)}"
        if (at, shape[0]) != (first, rows):
            return (f"rank {rank}'s shard of `{name}` holds rows {at} to {at + shape[0]} of {whole_shape[0]}, where "
                    f"chunking over {len(shard_shapes)} ranks puts rows {first} to {first + rows}")
        at += shape[0]
    return None


def check_tiling(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, tuple[int, int]]:
    """Checks, with every rank, that each sharded parameter's shards tile it; returns this rank's
    (first row, rows) of each. Every rank calls it at the same point. A parameter sharded other
    than by rows over a one-dimensional mesh is refused."""
    mine = []
    for name, p in named:
        if not is_sharded(p):
            continue
        if p.device_mesh.ndim != 1 or list(p.placements) != [Shard(0)]:
            raise WriteError(f"`{name}` is sharded as {list(p.placements)} over a {p.device_mesh.ndim}-dimensional "
                             "mesh: repro.torch records FSDP2 parameters sharded by rows over one mesh dimension")
        mine.append((name, list(p.shape), list(p.to_local().shape)))
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    rank = dist.get_rank()
    places = {}
    for i, (name, whole_shape, _) in enumerate(mine):
        shards = [theirs[i][2] for theirs in everyone]
        error = tiling_error(name, whole_shape, shards)
        if error is not None:
            raise WriteError(f"the FSDP shards do not tile their parameter: {error}")
        places[name] = chunk_rows(whole_shape[0], len(shards))[rank]
    return places


class GradientShares:
    """FSDP2's gradient reduce-scatter, recorded on both sides of the sum. FSDP2 gathers each
    parameter whole for the backward pass; autograd accumulates this rank's gradient into that
    whole, which FSDP2 then casts to its reduce dtype, scales by 1/world size and reduce-scatters:
    each rank gets its rows of the sum over the ranks. As a whole gradient is accumulated, this
    records the share it contributes, `NAME.grad.local` (the gradient in the sharded parameter's
    dtype, times 1/world size); `CapturedStep.gradients` then records this rank's rows of the sum
    as `NAME.grad`, a reduce-scatter of that share (format 1.8, docs/trace-format.md section 10.2).

    The scaling is exact for world sizes that are powers of two, so the share is what FSDP2 sums.
    Parameters whose gradients FSDP2 reduces in another dtype than their own (mixed precision
    with a bf16 reduce dtype for f32 parameters) record no share: the sum is rounded in a dtype
    the trace does not hold. A parameter whose gradient accumulates twice in a step (gradient
    accumulation without synchronization) records each as `NAME.grad.local#N` and its sum
    without a share: no one recorded share is what was reduced."""

    def __init__(self, model: torch.nn.Module, named_parameters: list):
        self.step = None  # the StepRecorder of the step being recorded, if any
        self._shared: dict[str, int] = {}  # how many shares of each gradient this step recorded
        self._world = dist.get_world_size()
        self._names = {id(p): name for name, p in named_parameters}
        self._hooked: set[int] = set()  # the gathered parameters hooked, by id
        self._handles = [model.register_forward_hook(lambda *_: self._hook_gathered(model))]

    def begin(self, step) -> None:
        """Records the shares of step `step` (a StepRecorder; None: records nothing)."""
        self.step, self._shared = step, {}

    def local_name(self, name: str) -> Optional[str]:
        """`NAME.grad.local` when this step recorded one share of `name`'s gradient, else None."""
        return f"{name}.grad.local" if self._shared.get(name) == 1 else None

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()

    def _hook_gathered(self, model: torch.nn.Module) -> None:
        """After a forward pass (FSDP2 has gathered every parameter by then, once), hooks the
        gathered parameter of each sharded one not hooked yet."""
        for fsdp_param in _fsdp_params(model):
            gathered = getattr(fsdp_param, "_unsharded_param", None)
            name = self._names.get(id(getattr(fsdp_param, "sharded_param", None)))
            if gathered is None or name is None or id(gathered) in self._hooked:
                continue
            self._hooked.add(id(gathered))
            dtype = fsdp_param.sharded_param.dtype
            reduced_in = (getattr(fsdp_param, "reduce_dtype", None) or getattr(fsdp_param, "param_dtype", None)
                          or dtype)
            if reduced_in != dtype:
                continue
            self._handles.append(gathered.register_post_accumulate_grad_hook(self._share_hook(name, dtype)))

    def _share_hook(self, name: str, dtype: torch.dtype):
        def hook(gathered: torch.Tensor) -> None:
            s = self.step
            if s is None or gathered.grad is None:
                return
            count = self._shared.get(name, 0)
            self._shared[name] = count + 1
            share = gathered.grad.to(dtype) * (1.0 / self._world)
            local = f"{name}.grad.local" if count == 0 else f"{name}.grad.local#{count}"
            s.queue_held(local, share, "gradient", "backward")

        return hook


def _fsdp_params(model: torch.nn.Module) -> Iterable:
    """Every FSDPParam of the FSDP2 modules in `model` (torch's internals, read where present:
    one parameter group a module, or several)."""
    for m in model.modules():
        state = m._get_fsdp_state() if hasattr(m, "_get_fsdp_state") else None
        if state is None:
            continue
        groups = getattr(state, "_fsdp_param_groups", None)
        if groups is None:
            group = getattr(state, "_fsdp_param_group", None)
            groups = [group] if group is not None else []
        for group in groups:
            yield from getattr(group, "fsdp_params", ())
