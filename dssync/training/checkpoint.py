"""Checkpoints of ``dssync train``: stop a run at iteration ``k``, resume it, and reach the
parameters a run that never stopped reaches.

A checkpoint is a folder ``step{k}/`` with one ``rank{r}.pt`` per rank (``torch.save``: the
model, the optimizer, the learning-rate scheduler, the strategy's own state, torch's random
state) inside the ``--checkpoint`` folder, and ``latest.json``, written by rank 0 once every
rank has saved: the step, the world size and the settings the run must keep. The data order
needs nothing saved: the batches are a function of the seed and the iteration
(``Task.batches(start=k)``). A folder is complete before ``latest.json`` names it, and the
previous one is removed only after, so a run killed while saving resumes from the one before.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from dssync._jsonfile import write_json
from dssync.collectives import Communicator
from dssync.errors import DssyncError

__all__ = ["CheckpointError", "check", "load", "save"]

#: The settings a resumed run must share with the run that wrote the checkpoint.
KEPT = ("strategy", "task", "seed", "batch_size", "lr", "momentum", "steps", "model_mb", "lr_schedule",
        "warmup_steps", "strategy_options", "backend")


class CheckpointError(DssyncError, ValueError):
    """A checkpoint folder that cannot be resumed from, and why."""


def save(folder: str | os.PathLike[str], comm: Communicator, step: int, state: dict[str, Any],
         settings: dict[str, Any]) -> Path:
    """Write this rank's ``state`` for iteration ``step`` (collective); return the step folder."""
    root = Path(folder)
    target = root / f"step{step}"
    if comm.rank == 0:
        shutil.rmtree(target, ignore_errors=True)  # a partial one from a run killed while saving
        target.mkdir(parents=True)
    comm.barrier()
    tmp = target / f"rank{comm.rank}.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, target / f"rank{comm.rank}.pt")
    comm.barrier()
    if comm.rank == 0:
        latest = root / "latest.json"
        previous = _read_latest(latest) if latest.exists() else None
        write_json(latest, {"version": 1, "step": step, "world_size": comm.world_size, "folder": target.name,
                            "settings": {k: settings.get(k) for k in KEPT}})
        if previous is not None and previous.get("folder") not in (None, target.name):
            shutil.rmtree(root / previous["folder"], ignore_errors=True)
    comm.barrier()
    return target


def check(folder: str | os.PathLike[str], settings: dict[str, Any]) -> dict[str, Any] | None:
    """The index (``latest.json``) of the latest checkpoint in ``folder``, or ``None`` when
    there is none; an unreadable index or settings that differ from ``settings`` are an error."""
    latest = Path(folder) / "latest.json"
    if not latest.exists():
        return None
    meta = _read_latest(latest)
    differ = {k: (meta["settings"].get(k), settings.get(k)) for k in KEPT
              if _canonical(meta["settings"].get(k)) != _canonical(settings.get(k))}
    if differ:
        listed = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in differ.items())
        raise CheckpointError(f"{latest}: the checkpoint was written by a run with other settings ({listed}); "
                              "resume with the same ones, or give another --checkpoint folder")
    return meta


def load(folder: str | os.PathLike[str], comm: Communicator, settings: dict[str, Any]) -> tuple[int, int, dict[str, Any]] | None:
    """``(step, world size it was written at, this rank's state)`` of the latest checkpoint in
    ``folder`` (``check``), or ``None`` when there is none. At another world size, rank ``r``
    reads the state of rank ``r`` modulo the old world size."""
    meta = check(folder, settings)
    if meta is None:
        return None
    source = Path(folder) / meta["folder"] / f"rank{comm.rank % meta['world_size']}.pt"
    try:
        state = torch.load(source, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, EOFError) as exc:
        raise CheckpointError(f"rank {comm.rank}: cannot read checkpoint {source}: {exc}") from None
    return int(meta["step"]), int(meta["world_size"]), state


def _read_latest(path: Path) -> dict[str, Any]:
    try:
        meta = json.loads(path.read_text())
        if not isinstance(meta, dict) or meta.get("version") != 1:
            raise ValueError("not a version 1 object")
        int(meta["step"]), int(meta["world_size"]), str(meta["folder"]), dict(meta["settings"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"checkpoint index {path} is unreadable ({exc}); remove the folder to start afresh") from None
    return meta


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)
