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

from repro_writer import WriteError

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
                             "mesh: repro_torch records FSDP2 parameters sharded by rows over one mesh dimension")
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
