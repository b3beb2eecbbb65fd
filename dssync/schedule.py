"""The ``Schedule``: a period of partitions of the ranks into disjoint groups.

``period[t % len(period)]`` is the partition used at iteration ``t`` (DESIGN section 2).
A schedule is pure data: it knows nothing about process groups or tensors, so every
invariant can be checked on a laptop, and a backend can create every group the schedule
will ever use once, in the same order on every rank (``distinct_groups``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import scipy.linalg

from dssync._jsonfile import read_versioned, write_json
from dssync.errors import ScheduleError

__all__ = ["SCHEDULE_VERSION", "Group", "Partition", "Schedule", "averaging_matrix", "mixing_rho"]

SCHEDULE_VERSION = 1
# rho is a spectral quantity computed in floating point; "mixes" means clearly below one.
_RHO_TOLERANCE = 1e-9

Group = tuple[int, ...]
Partition = tuple[Group, ...]


def averaging_matrix(partition: Sequence[Sequence[int]], world_size: int) -> np.ndarray:
    """The doubly stochastic matrix W with W[i, j] = 1/|g| when i and j share group g."""
    w = np.zeros((world_size, world_size))
    for group in partition:
        idx = np.asarray(group)
        w[np.ix_(idx, idx)] = 1.0 / len(group)
    return w


def mixing_rho(period: Sequence[Sequence[Sequence[int]]], world_size: int) -> float:
    """Second-largest eigenvalue modulus of W_{T-1} ... W_1 W_0 over one period.

    The product is doubly stochastic, so 1 is always an eigenvalue (the consensus
    direction). ``rho < 1`` means repeated periods drive every rank to the global mean,
    and the error shrinks by about ``rho`` per period (paper section IV-B).
    """
    if world_size == 1:
        return 0.0
    if world_size > DENSE_RHO_MAX:
        return _mixing_rho_sparse(period, world_size)
    product = np.eye(world_size)
    for partition in period:
        product = averaging_matrix(partition, world_size) @ product
    moduli = np.sort(np.abs(scipy.linalg.eigvals(product)))[::-1]
    return float(min(1.0, moduli[1]))


#: Up to this many ranks rho comes from the dense product (exact); above, from ARPACK on
#: the product applied group by group (O(n) per round instead of O(n^3)).
DENSE_RHO_MAX = 256


def _mixing_rho_sparse(period: Sequence[Sequence[Sequence[int]]], world_size: int) -> float:
    """The same rho without forming the product: the largest eigenvalue modulus of the
    product with the consensus direction removed, ``x -> P x - mean(x)`` (P is doubly
    stochastic, so it maps the mean-free subspace to itself)."""
    from scipy.sparse.linalg import LinearOperator, eigs

    labels = []
    for partition in period:
        label = np.arange(world_size)  # ranks in no group average with themselves only
        for k, group in enumerate(partition):
            label[list(group)] = world_size + k
        _, label = np.unique(label, return_inverse=True)
        labels.append((label, np.bincount(label).astype(float)))

    def apply(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float).reshape(-1)
        x = x - x.mean()
        for label, counts in labels:
            x = (np.bincount(label, weights=x) / counts)[label]
        return x

    op = LinearOperator((world_size, world_size), matvec=apply, dtype=float)
    values = eigs(op, k=1, which="LM", return_eigenvectors=False, tol=1e-8, maxiter=10 * world_size,
                  v0=np.random.default_rng(0).standard_normal(world_size))
    return float(min(1.0, np.abs(values).max()))


@dataclass(frozen=True, eq=False)
class Schedule:
    """A validated divide-and-shuffle schedule.

    Construction normalises the period (each group sorted, groups ordered by lowest rank)
    and checks the partition property and that the period mixes (``rho < 1``).
    """

    world_size: int
    period: tuple[Partition, ...]
    predicted_comm_ms: float | None = None
    #: Why the planner departed from the paper's figures, one sentence each (empty: it did not).
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        n = self.world_size
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ScheduleError(f"world_size must be a positive integer, got {n!r}")
        if len(self.period) == 0:
            raise ScheduleError("the period is empty; it needs at least one partition")
        normalised = []
        for t, partition in enumerate(self.period):
            groups = []
            for group in partition:
                if len(group) == 0:
                    raise ScheduleError(f"round {t} has an empty group; drop it")
                if not all(isinstance(r, int | np.integer) and not isinstance(r, bool) for r in group):
                    raise ScheduleError(f"round {t}: group {list(group)} must hold integer ranks")
                groups.append(tuple(sorted(int(r) for r in group)))
            flat = sorted(r for g in groups for r in g)
            if len(flat) != n or flat != list(range(n)):  # the length first: n may be huge
                seen = set()
                dup = sorted({r for r in flat if r in seen or seen.add(r)})
                present = set(flat)
                missing: Any = sorted(r for r in range(n) if r not in present) if n <= len(flat) + 1000 else \
                    f"{n - sum(1 for r in present if 0 <= r < n)} of {n}"  # n may be huge: count them
                out = sorted(r for r in present if not 0 <= r < n)
                parts = [f"{k} {v}" for k, v in (("missing ranks", missing),
                         ("ranks in two groups", dup), ("ranks out of range", out)) if v]
                raise ScheduleError(
                    f"round {t} is not a partition of ranks 0..{n - 1}: {'; '.join(parts)}"
                )
            normalised.append(tuple(sorted(groups)))
        object.__setattr__(self, "period", tuple(normalised))
        if self.rho >= 1.0 - _RHO_TOLERANCE:
            raise ScheduleError(
                f"the period does not mix (rho = {self.rho:.6f}, must be < 1): some ranks never "
                "exchange information, directly or through others; add a round whose groups "
                "connect them"
            )

    # -- queries -------------------------------------------------------------------------
    @cached_property
    def rho(self) -> float:
        return mixing_rho(self.period, self.world_size)

    def partition_at(self, step: int) -> Partition:
        return self.period[step % len(self.period)]

    def group_of(self, rank: int, step: int) -> Group:
        for group in self.partition_at(step):
            if rank in group:
                return group
        raise ScheduleError(f"rank {rank} is not in the schedule (world size {self.world_size})")

    def distinct_groups(self) -> list[Group]:
        """Every group the schedule uses, in order of first appearance (deterministic)."""
        return list(dict.fromkeys(g for partition in self.period for g in partition))

    def digest(self) -> str:
        """A short hash of the period; ranks compare it to prove they run the same plan."""
        blob = json.dumps([[list(g) for g in p] for p in self.period]).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    # -- JSON ----------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "schedule") -> Schedule:
        if data.get("version") != SCHEDULE_VERSION:
            raise ScheduleError(
                f'{source}: "version" must be {SCHEDULE_VERSION}, got {data.get("version")!r}'
            )
        period = data.get("period")
        if not isinstance(period, list) or not all(
            isinstance(p, list) and all(isinstance(g, list) for g in p) for p in period
        ):
            raise ScheduleError(
                f'{source}: "period" must be a list of rounds, each a list of groups of ranks, '
                'e.g. [[[0, 4], [1, 2, 3], [5, 6, 7]], ...]'
            )
        world_size = data.get("world_size")
        predicted = data.get("predicted_comm_ms")
        for key, value in (("predicted_comm_ms", predicted), ("rho", data.get("rho"))):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not math.isfinite(value)):
                raise ScheduleError(f'{source}: "{key}" must be a finite number, got {value!r}')
        notes = data.get("notes", [])
        if not isinstance(notes, list) or not all(isinstance(x, str) for x in notes):
            raise ScheduleError(f'{source}: "notes" must be a list of sentences, got {notes!r}')
        try:
            schedule = cls(
                world_size=world_size,
                period=tuple(tuple(tuple(g) for g in p) for p in period),
                predicted_comm_ms=None if predicted is None else float(predicted),
                notes=tuple(notes),
            )
        except ScheduleError as exc:
            raise ScheduleError(f"{source}: {exc}") from None
        stated = data.get("rho")
        if stated is not None and abs(float(stated) - schedule.rho) > 1e-6:
            raise ScheduleError(
                f'{source}: "rho" is {stated} but the period gives {schedule.rho:.6f}; '
                'fix it or drop the field'
            )
        return schedule

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "version": SCHEDULE_VERSION,
            "world_size": self.world_size,
            "period": [[list(g) for g in p] for p in self.period],
            "rho": round(self.rho, 9),
        }
        if self.predicted_comm_ms is not None and math.isfinite(self.predicted_comm_ms):
            out["predicted_comm_ms"] = round(self.predicted_comm_ms, 3)  # (a link of rate 0 predicts none)
        if self.notes:
            out["notes"] = list(self.notes)
        return out

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Schedule:
        data = read_versioned(path, kind="schedule", version=SCHEDULE_VERSION, error=ScheduleError)
        return cls.from_dict(data, source=f"schedule file {path}")

    def save(self, path: str | os.PathLike[str]) -> None:
        write_json(path, self.to_dict())
