"""Where this process stands: started by a launcher (one rank of a world) or on its own.

Launchers announce the rank in the environment: torchrun and ``dssync emulate run`` set
``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` (with ``MASTER_ADDR``/``MASTER_PORT``); Open MPI's
mpirun sets ``OMPI_COMM_WORLD_*``; MPICH's Hydra ``PMI_RANK``/``PMI_SIZE`` (and
``MPI_LOCALRANKID``); Horovod's launcher ``HOROVOD_*``. Where several are set (horovodrun
over mpirun sets both) they must agree, or the error names the variables that disagree.
``torch.distributed`` also needs ``MASTER_ADDR``/``MASTER_PORT``; MPI and Horovod do not.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from dssync.errors import DssyncError

__all__ = ["LaunchEnv", "from_environ"]


@dataclass(frozen=True, slots=True)
class LaunchEnv:
    rank: int
    world_size: int
    local_rank: int
    launcher: str
    init_method: str | None
    """``env://`` when ``MASTER_ADDR``/``MASTER_PORT`` are set, else ``None``."""

    def library(self) -> str:
        """The collective library this launch gives a rendezvous for, for commands that work
        on any (``dssync probe``): ``torch`` when ``MASTER_ADDR``/``MASTER_PORT`` are set, else
        the launcher's own (mpirun, mpiexec: ``mpi``; horovodrun: ``horovod``)."""
        if self.init_method is not None:
            return "torch"
        return {"horovodrun": "horovod", "mpirun": "mpi", "mpich": "mpi"}.get(self.launcher, "torch")

    def torch_init_method(self) -> str:
        """Where ``torch.distributed`` meets; an error when the launcher gave no rendezvous."""
        if self.init_method is None:
            raise DssyncError(
                f"started by {self.launcher} (rank {self.rank} of {self.world_size}) but MASTER_ADDR/MASTER_PORT "
                "are not set, which --backend torch needs; export them to the address and a free port of "
                "rank 0's host (e.g. mpirun -x MASTER_ADDR=host0 -x MASTER_PORT=29500), or use --backend mpi "
                "or horovod"
            )
        return self.init_method


# Most specific first: horovodrun --mpi sets Open MPI's variables and Horovod's.
_KEYS = (
    ("horovodrun", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK"),
    ("mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
)


def from_environ(environ: Mapping[str, str] | None = None) -> LaunchEnv | None:
    """The launcher's view of this rank, or ``None`` when no launcher started us."""
    env = os.environ if environ is None else environ
    seen: list[tuple[str, str, str, int, int, int]] = []
    for launcher, rank_key, size_key, local_key in _KEYS:
        if (rank_key in env) != (size_key in env):
            have, lack = (rank_key, size_key) if rank_key in env else (size_key, rank_key)
            raise DssyncError(f"{launcher} environment is incomplete: {have} is set but {lack} is not")
        if rank_key not in env:
            continue
        try:
            rank, size = int(env[rank_key]), int(env[size_key])
            local = int(env.get(local_key, rank))
        except ValueError:
            raise DssyncError(
                f"{launcher} environment is malformed: {rank_key}={env[rank_key]!r}, "
                f"{size_key}={env[size_key]!r}; both must be integers"
            ) from None
        if not 0 <= rank < size:
            raise DssyncError(f"{launcher} environment gives rank {rank} outside a world of {size}")
        seen.append((launcher, rank_key, size_key, rank, size, local))
    if not seen:
        return None
    launcher, rank_key, size_key, rank, size, local = seen[0]
    for other, o_rank_key, o_size_key, o_rank, o_size, _ in seen[1:]:
        if (o_rank, o_size) != (rank, size):
            raise DssyncError(
                f"launcher environments disagree: {rank_key}={rank} {size_key}={size} ({launcher}) but "
                f"{o_rank_key}={o_rank} {o_size_key}={o_size} ({other}); unset the stale ones"
            )
    init_method = None
    if "MASTER_ADDR" in env or "MASTER_PORT" in env:
        if "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
            raise DssyncError("MASTER_ADDR and MASTER_PORT go together; only one of them is set")
        if not env["MASTER_PORT"].isdigit() or not 0 < int(env["MASTER_PORT"]) < 65536:
            raise DssyncError(
                f"MASTER_PORT={env['MASTER_PORT']!r} is not a port ranks can connect to; "
                "give the launcher a fixed port (or torchrun --standalone)"
            )
        init_method = "env://"
    return LaunchEnv(rank, size, local, launcher, init_method)
