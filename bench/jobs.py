"""A benchmark's training job on an emulated cluster, started from its ``TrainConfig``.

The job runs as a user's would (``dssync emulate run -- dssync train``), with every setting
carried to the ranks as the config's JSON (``dssync train --config``), never rebuilt from
command-line strings."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dssync._jsonfile import write_json
from dssync.launch import emulate
from dssync.training.loop import TrainConfig

__all__ = ["train_on_cluster"]


def train_on_cluster(name: str, config: TrainConfig, out: Path, *, timeout_s: float,
                     episodes: Sequence[emulate.Episode] = ()) -> dict[str, Any]:
    """Train ``config`` on the emulated cluster ``name`` (``episodes``: transient stragglers
    during the run); the run's ``train --json`` record, which rank 0 writes to ``out``."""
    out = Path(out)
    job = out.with_name(out.stem + ".job.json")
    write_json(job, config.to_dict())
    return emulate.run_dssync(name, ["train", "--no-progress", "--config", str(job), "--json", str(out)], out,
                              timeout_s=timeout_s, episodes=episodes)
