"""Where this process stands: started by a launcher (one rank of a world) or on its own.

Launchers announce the rank in the environment: torchrun and ``dssync emulate run`` set
``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` with ``MASTER_ADDR``/``MASTER_PORT``; Open MPI's
mpirun sets ``OMPI_COMM_WORLD_*``; Horovod's gloo launcher sets ``HOROVOD_*``.
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
    init_method: str


_KEYS = (
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("horovodrun", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK"),
)


def from_environ(environ: Mapping[str, str] | None = None) -> LaunchEnv | None:
    """The launcher's view of this rank, or ``None`` when no launcher started us."""
    env = os.environ if environ is None else environ
    for launcher, rank_key, size_key, local_key in _KEYS:
        if rank_key in env and size_key in env:
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
            if "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
                raise DssyncError(
                    f"started by {launcher} (rank {rank} of {size}) but MASTER_ADDR/MASTER_PORT "
                    "are not set; export them to the address and a free port of rank 0's host"
                )
            if not env["MASTER_PORT"].isdigit() or not 0 < int(env["MASTER_PORT"]) < 65536:
                raise DssyncError(
                    f"MASTER_PORT={env['MASTER_PORT']!r} is not a port ranks can connect to; "
                    "give the launcher a fixed port (or torchrun --standalone)"
                )
            return LaunchEnv(rank, size, local, launcher, "env://")
    return None
