"""The ``Topology`` model: who sits in which rack, and what the links between them measure.

The JSON form (``topology.json``, ``"version": 1``) is a stable contract: other tools read and write it.
A hand-written topology with only ``workers`` is valid input for the planner; the
latency and bandwidth matrices, the contention record and the probe record are optional.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dssync._jsonfile import read_versioned, write_json
from dssync.errors import TopologyError

__all__ = ["TOPOLOGY_VERSION", "Topology", "Worker"]

TOPOLOGY_VERSION = 1


@dataclass(frozen=True, slots=True)
class Worker:
    rank: int
    host: str
    rack: int


@dataclass(frozen=True, eq=False)
class Topology:
    """Racks, workers and (optionally) measured pairwise latency and bandwidth.

    Racks are numbered ``0..R-1`` in order of their lowest rank; ``__post_init__`` checks
    that and every other invariant, so an object that exists is valid.
    """

    workers: tuple[Worker, ...]
    latency_us: np.ndarray | None = None
    bandwidth_gbps: np.ndarray | None = None
    contention: Mapping[str, Any] = field(default_factory=dict)
    probe: Mapping[str, Any] | None = None
    #: How well the probe's measurements separate each inferred rack boundary, and the workers
    #: it could not place (``dssync.topology.racks``); absent from hand-written topologies.
    confidence: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        n = len(self.workers)
        if n == 0:
            raise TopologyError("topology has no workers; list at least one in \"workers\"")
        ranks = sorted(w.rank for w in self.workers)
        if ranks != list(range(n)):
            counts = Counter(ranks)
            missing = [r for r in range(n) if r not in counts]
            dup = sorted(r for r, k in counts.items() if k > 1)
            out = sorted(r for r in counts if not 0 <= r < n)
            parts = [f"{what} {_few(v)}" for what, v in
                     (("missing ranks", missing), ("duplicated ranks", dup), ("ranks out of range", out)) if v]
            raise TopologyError(
                f"topology workers must hold ranks 0..{n - 1} exactly once: {', '.join(parts)}"
            )
        object.__setattr__(self, "workers", tuple(sorted(self.workers, key=lambda w: w.rank)))
        # Racks must be 0..R-1, numbered in order of their lowest rank: each new rack met in
        # rank order is the next number (one pass, a set of the racks seen).
        seen: set[int] = set()
        order: list[int] = []
        for w in self.workers:
            if w.rack not in seen:
                seen.add(w.rack)
                order.append(w.rack)
        if order != list(range(len(order))):
            wrong = next(k for k, rack in enumerate(order) if rack != k)
            raise TopologyError(
                f"racks must be numbered 0..R-1 in order of their lowest rank; found racks in "
                f"rank order {_few(order, start=wrong)} (the {_ordinal(wrong + 1)} rack met should be "
                f"{wrong}, it is {order[wrong]}; renumber them)"
            )
        members: list[list[int]] = [[] for _ in order]
        for w in self.workers:
            members[w.rack].append(w.rank)
        object.__setattr__(self, "_members", tuple(tuple(m) for m in members))
        for name in ("latency_us", "bandwidth_gbps"):
            value = getattr(self, name)
            if value is None:
                continue
            arr = np.asarray(value, dtype=float)
            if arr.shape != (n, n):
                raise TopologyError(f"{name} must be a {n}x{n} matrix, got shape {arr.shape}")
            if not np.all(np.isfinite(arr)) or np.any(arr < 0):
                raise TopologyError(f"{name} must hold finite, non-negative numbers")
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)

    # -- views ---------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return len(self.workers)

    @property
    def num_racks(self) -> int:
        return len(self._members)

    def racks(self) -> list[list[int]]:
        """Ranks of each rack, rack by rack, each list sorted."""
        return [list(m) for m in self._members]

    def rack_of(self, rank: int) -> int:
        return self.workers[rank].rack

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_rack_sizes(cls, sizes: Sequence[int]) -> Topology:
        """A logical topology: consecutive ranks fill rack 0, then rack 1, and so on."""
        if not sizes or any(int(s) < 1 for s in sizes):
            raise TopologyError(f"rack sizes must be positive integers, got {list(sizes)}")
        workers, rank = [], 0
        for rack, size in enumerate(sizes):
            for _ in range(int(size)):
                workers.append(Worker(rank=rank, host=f"w{rank}", rack=rack))
                rank += 1
        return cls(workers=tuple(workers))

    @classmethod
    def even(cls, world_size: int, num_racks: int) -> Topology:
        """``world_size`` ranks split into ``num_racks`` racks as evenly as possible."""
        if not 1 <= num_racks <= world_size:
            raise TopologyError(
                f"cannot split {world_size} ranks into {num_racks} racks; use 1..{world_size}"
            )
        base, extra = divmod(world_size, num_racks)
        return cls.from_rack_sizes([base + (1 if r < extra else 0) for r in range(num_racks)])

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "topology") -> Topology:
        if data.get("version") != TOPOLOGY_VERSION:
            raise TopologyError(
                f'{source}: "version" must be {TOPOLOGY_VERSION}, got {data.get("version")!r}'
            )
        raw = data.get("workers")
        if not isinstance(raw, list):
            raise TopologyError(f'{source}: "workers" must be a list of {{rank, host, rack}}')
        workers = []
        for i, w in enumerate(raw):
            if not isinstance(w, dict) or not {"rank", "rack"} <= w.keys():
                raise TopologyError(
                    f'{source}: workers[{i}] must be an object with "rank" and "rack" '
                    f'(and optionally "host"), got {w!r}'
                )
            if not all(isinstance(w[k], int) and not isinstance(w[k], bool) for k in ("rank", "rack")):
                raise TopologyError(f"{source}: workers[{i}] rank and rack must be integers, got {w!r}")
            workers.append(Worker(rank=w["rank"], host=str(w.get("host", f"w{w['rank']}")), rack=w["rack"]))
        declared = data.get("world_size", len(workers))
        if declared != len(workers):
            raise TopologyError(
                f'{source}: "world_size" is {declared!r} but {len(workers)} workers are listed'
            )
        contention = data.get("contention")
        contention = {} if contention is None else contention
        if not isinstance(contention, dict):
            raise TopologyError(f'{source}: "contention" must be an object')
        racks = {w.rack for w in workers}
        for key, field_, valid in (("uplinks", "rack", racks), ("nics", "rank", range(len(workers)))):
            entries = contention.get(key, [])
            if not isinstance(entries, list):
                raise TopologyError(f'{source}: contention "{key}" must be a list of {{"{field_}": ...}} objects')
            for i, entry in enumerate(entries):
                value = entry.get(field_) if isinstance(entry, dict) else None
                if not isinstance(value, int) or isinstance(value, bool) or value not in valid:
                    raise TopologyError(f'{source}: contention {key}[{i}] must be an object with an integer '
                                        f'"{field_}" of this topology, got {entry!r}')
        confidence = data.get("confidence")
        if confidence is not None and not isinstance(confidence, dict):
            raise TopologyError(f'{source}: "confidence" must be an object')
        try:
            return cls(
                workers=tuple(workers),
                latency_us=_matrix(data.get("latency_us"), "latency_us", source),
                bandwidth_gbps=_matrix(data.get("bandwidth_gbps"), "bandwidth_gbps", source),
                contention=contention,
                probe=data.get("probe"),
                confidence=confidence,
            )
        except TopologyError as exc:
            raise TopologyError(f"{source}: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "version": TOPOLOGY_VERSION,
            "world_size": self.world_size,
            "workers": [{"rank": w.rank, "host": w.host, "rack": w.rack} for w in self.workers],
        }
        if self.latency_us is not None:
            out["latency_us"] = np.round(self.latency_us, 3).tolist()
        if self.bandwidth_gbps is not None:
            out["bandwidth_gbps"] = np.round(self.bandwidth_gbps, 4).tolist()
        if self.contention:
            out["contention"] = dict(self.contention)
        if self.probe is not None:
            out["probe"] = dict(self.probe)
        if self.confidence is not None:
            out["confidence"] = dict(self.confidence)
        return out

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Topology:
        data = read_versioned(path, kind="topology", version=TOPOLOGY_VERSION, error=TopologyError)
        return cls.from_dict(data, source=f"topology file {path}")

    def save(self, path: str | os.PathLike[str]) -> None:
        write_json(path, self.to_dict())


def _few(values: Sequence[int], start: int = 0, shown: int = 10) -> str:
    """``values`` for a one-line message: ``shown`` of them from ``start``, and how many more."""
    part = list(values[start:start + shown])
    more = len(values) - start - len(part)
    head = "[... " if start else "["
    return head + ", ".join(map(str, part)) + (f", ... {more} more]" if more > 0 else "]")


def _ordinal(k: int) -> str:
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def _matrix(value: Any, name: str, source: str) -> np.ndarray | None:
    if value is None:
        return None
    try:
        return np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise TopologyError(f"{source}: {name} must be a square matrix of numbers") from None
