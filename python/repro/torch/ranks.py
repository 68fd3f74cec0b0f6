"""Which rank of a multi-process run this process is, what the trace header says of it, and where
its stream goes (docs/trace-format.md, section 10; docs/distributed.md).

A process is a rank when torch.distributed's default process group is initialized with more
than one rank. Its stream is `OUT/rank-N`, and its header's `distributed` field holds its rank,
the world size, the process group's backend (`nccl`, `gloo`, ...) and the backend's version
(NCCL's; empty for backends that have none). The launcher's variables (torchrun's `RANK` and
`WORLD_SIZE`, Slurm's, Open MPI's), where set, must agree with the process group.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional

import torch

from repro.writer import WriteError

# The launchers' variables: (launcher, rank, world size), as repro's own ranks read them.
LAUNCHERS = (
    ("torchrun", "RANK", "WORLD_SIZE"),
    ("srun", "SLURM_PROCID", "SLURM_NTASKS"),
    ("mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
)


@dataclass(frozen=True)
class RankPlace:
    """One rank's place in a run: what its trace header's `distributed` field holds."""

    rank: int
    world_size: int
    backend: str
    backend_version: str

    def header(self) -> dict:
        """The header's `distributed` map, keys in the format's order."""
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "backend": self.backend,
            "backend_version": self.backend_version,
        }

    def stream_dir(self, run_dir: str) -> str:
        """This rank's trace in the run directory `run_dir`: `run_dir/rank-N`."""
        return os.path.join(run_dir, f"rank-{self.rank}")


def launcher_place(env: Mapping[str, str] = os.environ) -> Optional[tuple[str, int, int]]:
    """(launcher, rank, world size) as the first launcher whose rank and world size are both set
    says; None when none is. A value that is no rank of its world is an error naming it."""
    for launcher, rank_var, world_var in LAUNCHERS:
        rank, world = env.get(rank_var), env.get(world_var)
        if not rank or not world:
            continue
        try:
            r, w = int(rank), int(world)
        except ValueError:
            raise WriteError(f"{rank_var}={rank}, {world_var}={world}: expected whole numbers") from None
        if not 0 <= r < w:
            raise WriteError(f"{rank_var}={rank} is not a rank of {world_var}={world} ranks")
        return launcher, r, w
    return None


def backend_version(backend: str) -> str:
    """The version of the library that carries the collectives: NCCL's for a process group on
    NCCL, empty for the others (gloo and MPI report none to torch)."""
    if "nccl" not in backend or not torch.cuda.is_available():
        return ""
    version = torch.cuda.nccl.version()
    return ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)


def current_place(env: Mapping[str, str] = os.environ) -> Optional[RankPlace]:
    """This process's place when it is one rank of several (torch.distributed's default process
    group), checked against its launcher's variables; None for a lone process or a world of one.
    A launcher that started several ranks before the process group exists is an error: the
    header records the group's backend, so the recorder comes after `init_process_group`."""
    launched = launcher_place(env)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        if launched is not None and launched[1:] != (rank, world):
            raise WriteError(f"{launched[0]} started this process as rank {launched[1]} of {launched[2]}, but its "
                             f"process group makes it rank {rank} of {world}")
        if world == 1:
            return None
        backend = str(dist.get_backend())
        return RankPlace(rank, world, backend, backend_version(backend))
    if launched is not None and launched[2] > 1:
        raise WriteError(f"{launched[0]} started this process as rank {launched[1]} of {launched[2]}, but "
                         "torch.distributed is not initialized: call torch.distributed.init_process_group before "
                         "creating the recorder (the trace header records its backend)")
    return None


def perturbs_this_rank(place: Optional[RankPlace], env: Mapping[str, str] = os.environ) -> bool:
    """Whether a fault planted with REPRO_PERTURB goes into this process: every rank's, unless
    REPRO_PERTURB_RANK names one (a lone process is rank 0); a rank the run does not have is an
    error (the fault would be planted nowhere)."""
    only = env.get("REPRO_PERTURB_RANK")
    if not only:
        return True
    world_size = place.world_size if place is not None else 1
    try:
        wanted = int(only)
    except ValueError:
        raise WriteError(f"REPRO_PERTURB_RANK={only}: expected a rank") from None
    if not 0 <= wanted < world_size:
        ranks = "rank 0 alone" if world_size == 1 else f"ranks 0 to {world_size - 1}"
        raise WriteError(f"REPRO_PERTURB_RANK={only}: the run has {ranks}, so the fault would be planted nowhere")
    return wanted == (place.rank if place is not None else 0)
