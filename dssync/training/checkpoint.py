"""Checkpoints of ``dssync train``: stop a run at iteration ``k``, resume it, and reach the
parameters a run that never stopped reaches.

A checkpoint is a folder ``step{k}/`` with one ``rank{r}.pt`` per rank (``torch.save``: the
model, the optimizer, the learning-rate scheduler, the strategy's own state, torch's random
state) inside the ``--checkpoint`` folder, and ``latest.json``, written by rank 0 once every
rank has saved: the step, the world size and the settings the run must keep. The data order
needs nothing saved: the batches are a function of the seed and the iteration
(``Task.batches(start=k)``). A folder is complete before ``latest.json`` names it, and the
previous one is removed only after, so a run killed while saving resumes from the one before.

The folder is shared storage that other jobs and people can write to, so reading it back runs
nothing and removes nothing outside it (docs/checkpoints.md):

- a rank file holds tensors and plain data only (dicts, lists, numbers, strings) and is read
  with ``torch.load(weights_only=True)``: a file that needs any other object is refused with a
  one-line error naming it, before anything in it runs;
- ``latest.json``'s ``folder`` must be ``step<k>`` with ``k`` its ``step``: a direct child of
  the checkpoint folder, checked before any rank reads a file, and never a link;
- removal touches only direct children named ``step<k>`` that are real folders, never a link
  and never what one points to.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from dssync._jsonfile import is_whole, read_versioned, sync_folder, write_json
from dssync.collectives import Communicator
from dssync.errors import DssyncError

__all__ = ["CheckpointError", "check", "load", "read_state", "save", "step_name", "together"]

T = TypeVar("T")

#: The settings a resumed run must share with the run that wrote the checkpoint.
KEPT = ("strategy", "task", "seed", "batch_size", "lr", "momentum", "steps", "model_mb", "lr_schedule",
        "warmup_steps", "strategy_options", "backend")


class CheckpointError(DssyncError, ValueError):
    """A checkpoint folder that cannot be resumed from, and why."""


def save(folder: str | os.PathLike[str], comm: Communicator, step: int, state: dict[str, Any],
         settings: dict[str, Any]) -> Path:
    """Write this rank's ``state`` for iteration ``step`` (collective); return the step folder.

    Each rank file is written beside its place, flushed to the disk and renamed into it; rank 0
    names the folder in ``latest.json`` only once every rank has done so, and removes the older
    step folders only after that."""
    root = Path(folder)
    target = root / step_name(step)

    def prepare() -> None:
        _remove(target)  # a partial one from a run killed while saving
        if target.is_symlink() or target.exists():
            raise CheckpointError(f"rank 0: {target} is in the way of the checkpoint of step {step} and is not a "
                                  "folder dssync wrote (a link or a file); move it, or give another --checkpoint folder")
        target.mkdir(parents=True)

    def write() -> None:
        tmp = target / f"rank{comm.rank}.pt.tmp"
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target / f"rank{comm.rank}.pt")

    def commit() -> None:
        sync_folder(target)
        write_json(root / "latest.json", {"version": 1, "step": step, "world_size": comm.world_size,
                                          "folder": target.name, "settings": {k: settings.get(k) for k in KEPT}},
                   durable=True)
        for old in root.iterdir():
            if old.name != target.name and STEP_FOLDER.fullmatch(old.name):
                _remove(old)

    together(comm, prepare if comm.rank == 0 else None)
    together(comm, write)
    together(comm, commit if comm.rank == 0 else None)
    return target


def together(comm: Communicator, part: Callable[[], T] | None) -> T | None:
    """Run ``part`` (on the ranks that have one) and return its result, once every rank has
    learnt whether it failed anywhere (collective): on a failure every rank raises the first
    failing rank's one-line message, so that no rank waits for a peer that left and the job
    ends with the cause."""
    problem, result = None, None
    if part is not None:
        try:
            result = part()
        except (OSError, DssyncError) as exc:
            problem = str(exc) if isinstance(exc, DssyncError) else f"rank {comm.rank}: checkpoint: {exc}"
    problem = next((p for p in comm.allgather_object(problem) if p is not None), None)
    if problem is not None:
        raise CheckpointError(problem)
    return result


def step_name(step: int) -> str:
    """The name of the folder that holds the checkpoint of iteration ``step``."""
    return f"step{step}"


#: The names of step folders: the only children of a checkpoint folder that dssync removes.
STEP_FOLDER = re.compile(r"step(0|[1-9][0-9]*)")


def _remove(path: Path) -> None:
    """Remove the step folder ``path`` if it is a real folder: a link (or any other kind of
    file) in its place is left alone, so removal never reaches outside the checkpoint folder."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path, ignore_errors=True)  # unlinks the links inside, never follows them


def check(folder: str | os.PathLike[str], settings: dict[str, Any]) -> dict[str, Any] | None:
    """The index (``latest.json``) of the latest checkpoint in ``folder``, or ``None`` when
    there is none; an unreadable index, one whose step folder is not its own ``step<k>``
    child, or settings that differ from ``settings`` are an error."""
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
    return int(meta["step"]), int(meta["world_size"]), read_state(source, who=f"rank {comm.rank}")


def read_state(path: str | os.PathLike[str], *, who: str = "dssync") -> dict[str, Any]:
    """The state dict in the rank file ``path``, read with ``torch.load(weights_only=True)``:
    tensors and plain data only, so that nothing in the file runs. A file that is missing, not
    a regular file, damaged, or needs any other object is a one-line ``CheckpointError``."""
    path = Path(path)
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            raise CheckpointError(f"{who}: checkpoint {path} is not a regular file (a link or other kind); "
                                  "dssync reads only the files it wrote")
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL (\S+)", str(exc))
        what = f" ({found.group(1)})" if found else ""
        raise CheckpointError(f"{who}: checkpoint {path} holds an object other than tensors and plain data{what}; "
                              "refused without running anything in it") from None
    except FileNotFoundError:
        raise CheckpointError(f"{who}: checkpoint {path} does not exist: the folder is incomplete") from None
    except (OSError, RuntimeError, EOFError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{who}: checkpoint {path} is damaged: not a whole file written by torch.save "
                              f"({reason})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{who}: checkpoint {path} holds a {type(state).__name__}, not a rank's state")
    return state


def _read_latest(path: Path) -> dict[str, Any]:
    meta = read_versioned(path, kind="checkpoint index", version=1, error=CheckpointError)
    try:
        step, world_size, folder = meta["step"], meta["world_size"], meta["folder"]
        if not (is_whole(step) and is_whole(world_size)) \
                or step < 0 or world_size < 1:
            raise ValueError(f"step {step!r} and world_size {world_size!r} must be whole numbers, step 0 or more "
                             "and world_size 1 or more")
        if not isinstance(meta["settings"], dict):
            raise ValueError("settings must be an object")
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"checkpoint index {path} is unreadable ({exc}); remove the folder to start afresh") from None
    expected = step_name(step)
    if folder != expected:
        raise CheckpointError(f"checkpoint index {path} names the folder {folder!r} for step {step}; dssync reads and "
                              f"removes only its own {expected!r} inside {path.parent}, so nothing was read or removed")
    child = path.parent / expected
    if child.is_symlink() or not child.is_dir():
        kind = "a link" if child.is_symlink() else "missing" if not child.exists() else "not a folder"
        raise CheckpointError(f"checkpoint index {path} names {child}, which is {kind}; dssync reads only the step "
                              "folders it wrote, so nothing was read or removed")
    return meta


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)
