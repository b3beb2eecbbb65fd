"""The ``Schedule``: a period of partitions of the ranks into disjoint groups.

``partition_at(t)`` is the partition used at iteration ``t`` (round ``t`` modulo the schedule's length). A schedule
is pure data: it knows nothing about process groups or tensors, so every invariant can be
checked on a laptop, and a backend can create every group the schedule will ever use once,
in the same order on every rank (``distinct_groups``).

**Representation.** A schedule holds fixed *blocks* (a partition of the ranks: the racks,
for a plan) and, per round, only the groups it *names*; the ranks of a block that a round
does not name form one more group of that round. A plan names its inter-rack groups and its
pairs, and leaves each rack's large intra-rack group implied, so a period of ``P`` rounds
over ``n`` ranks in ``R`` racks costs ``n + P x (named ranks)`` integers, not ``P x n``
(10,000 workers in two racks: a period of 5,000 rounds, 10,000 + 10,000 integers). A
schedule given as whole partitions (``period=``, the version-1 file) is one block whose every
group is named.

**rho** comes from the chain of groups, not of ranks (``_transitions``): after a round every
rank of a group holds the same value, so a period acts on one value per group, and round
``t+1``'s group ``h`` takes ``sum_g |h & g| / |h|`` of round ``t``'s values. The nonzero
eigenvalues of the ``n x n`` product are those of this ``G x G`` chain (``G``: groups of a
round), and the overlaps ``|h & g|`` of two rounds follow from their named ranks and the
block sizes. Cost: ``O(P x (named ranks + R))`` to build the chain, then ``O(G^3)`` for its
eigenvalues (ARPACK on the chain when ``G`` is large). The partition property is checked on
the named ranks alone, and mixing (``connected``) is the connectivity of the same chain.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from dssync._jsonfile import read_versioned, write_json
from dssync.errors import ScheduleError

if TYPE_CHECKING:  # scipy.sparse is imported where it is used: a rank that only reads a schedule never needs it
    import scipy.sparse

__all__ = ["COMPACT_VERSION", "SCHEDULE_VERSION", "Group", "Partition", "Schedule", "averaging_matrix",
           "connected", "mixing_rho"]

#: The version-1 file lists every group of every round.
SCHEDULE_VERSION = 1
#: The version-2 file lists the blocks once and each round's named groups.
COMPACT_VERSION = 2
#: Schedules of up to this many rank entries (rounds x ranks) are written as version 1, so
#: every file a reader of the version-1 contract could read before stays that form; larger ones
#: (which could not be written before) as version 2.
EXPLICIT_MAX = 1 << 20
# rho is a spectral quantity computed in floating point; "mixes" means clearly below one.
_RHO_TOLERANCE = 1e-9
#: Up to this many groups in a round rho comes from the dense chain (exact eigenvalues);
#: above, from ARPACK on the chain applied round by round.
DENSE_GROUPS_MAX = 1024

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
    """Second-largest eigenvalue modulus of W_{T-1} ... W_1 W_0 over one period, from the
    dense ``n x n`` product: the definition, for small worlds and as a reference
    (``Schedule.rho`` computes the same number in about linear time).

    The product is doubly stochastic, so 1 is always an eigenvalue (the consensus
    direction). ``rho < 1`` means repeated periods drive every rank to the global mean,
    and the error shrinks by about ``rho`` per period (paper section IV-B).
    """
    if world_size == 1:
        return 0.0
    product = np.eye(world_size)
    for partition in period:
        product = averaging_matrix(partition, world_size) @ product
    moduli = np.sort(np.abs(np.linalg.eigvals(product)))[::-1]
    return float(min(1.0, moduli[1]))


class _Round:
    """One round's groups, numbered: the named ones first, then each block's rest."""

    def __init__(self, named: Sequence[Group], block_of: np.ndarray, block_sizes: np.ndarray) -> None:
        lengths = [len(g) for g in named]
        ranks = np.fromiter((r for g in named for r in g), dtype=np.int64, count=sum(lengths))
        gid = np.repeat(np.arange(len(named), dtype=np.int64), lengths)
        order = np.argsort(ranks)
        self.ranks, self.gid = ranks[order], gid[order]
        left = block_sizes - np.bincount(block_of[self.ranks], minlength=len(block_sizes))
        has_rest = left > 0
        self.rest_gid = np.full(len(block_sizes), -1, dtype=np.int64)
        self.rest_gid[has_rest] = len(named) + np.arange(int(has_rest.sum()))
        self.sizes = np.concatenate([np.asarray(lengths, dtype=float), left[has_rest].astype(float)])

    def group(self, ranks: np.ndarray, block_of: np.ndarray) -> np.ndarray:
        """The group number of each of ``ranks``."""
        out = self.rest_gid[block_of[ranks]]
        if len(self.ranks):
            at = np.minimum(np.searchsorted(self.ranks, ranks), len(self.ranks) - 1)
            hit = self.ranks[at] == ranks
            out[hit] = self.gid[at[hit]]
        return out


def _transitions(rounds: Sequence[Sequence[Group]], block_of: np.ndarray,
                 block_sizes: np.ndarray) -> Iterator[tuple[_Round, _Round, np.ndarray, np.ndarray, np.ndarray]]:
    """For each round ``t`` (the last one wrapping to the first): ``(round t, round t+1, h,
    g, |h & g|)``, arrays over the pairs of group numbers ``g`` of round ``t`` and ``h`` of
    round ``t+1`` that share ranks. Ranks that neither round names sit in their block's
    rest in both; only the named ones are looked at, so a pair of rounds costs their named
    ranks plus the blocks."""
    built = [_Round(named, block_of, block_sizes) for named in rounds]
    for t, now in enumerate(built):
        nxt = built[(t + 1) % len(built)]
        looked = np.union1d(now.ranks, nxt.ranks)
        rest = block_sizes - np.bincount(block_of[looked], minlength=len(block_sizes))
        both = (now.rest_gid >= 0) & (nxt.rest_gid >= 0) & (rest > 0)
        keys = np.concatenate([nxt.group(looked, block_of) * len(now.sizes) + now.group(looked, block_of),
                               nxt.rest_gid[both] * len(now.sizes) + now.rest_gid[both]])
        weights = np.concatenate([np.ones(len(looked)), rest[both].astype(float)])
        unique, inverse = np.unique(keys, return_inverse=True)
        counts = np.bincount(inverse, weights=weights)
        yield now, nxt, unique // len(now.sizes), unique % len(now.sizes), counts


def _chain(rounds: Sequence[Sequence[Group]], block_of: np.ndarray,
           block_sizes: np.ndarray) -> tuple[list[scipy.sparse.csr_matrix], np.ndarray]:
    """The period as group-to-group averaging steps ``T_t`` (round t's values to round
    t+1's, the last step back to round 0), and round 0's group sizes."""
    import scipy.sparse

    steps, sizes0 = [], None
    for now, nxt, h, g, overlap in _transitions(rounds, block_of, block_sizes):
        sizes0 = now.sizes if sizes0 is None else sizes0
        steps.append(scipy.sparse.csr_matrix((overlap / nxt.sizes[h], (h, g)), shape=(len(nxt.sizes), len(now.sizes))))
    return steps, sizes0


def connected(world_size: int, blocks: Sequence[Sequence[int]], rounds: Sequence[Sequence[Group]]) -> bool:
    """Whether the union of the period's groups connects every rank (exactly when rho < 1:
    each round is an orthogonal projection, so only a vector constant on every group of
    every round keeps its norm). Two ranks are linked when they share a group, and each
    rank links its group of one round to its group of the next, so the ranks are connected
    exactly when the groups of all rounds are, through the overlaps of consecutive rounds."""
    block_of = _block_of(world_size, blocks)
    built = list(_transitions(rounds, block_of, np.asarray([len(b) for b in blocks], dtype=np.int64)))
    offsets = np.cumsum([0] + [len(now.sizes) for now, *_ in built])
    rows = np.concatenate([offsets[t] + g for t, (_, _, _, g, _) in enumerate(built)])
    cols = np.concatenate([offsets[(t + 1) % len(built)] + h for t, (_, _, h, _, _) in enumerate(built)])
    total = int(offsets[-1])
    import scipy.sparse
    import scipy.sparse.csgraph

    graph = scipy.sparse.coo_matrix((np.ones(len(rows)), (rows, cols)), shape=(total, total))
    return scipy.sparse.csgraph.connected_components(graph, directed=False)[0] == 1


def _block_of(world_size: int, blocks: Sequence[Sequence[int]]) -> np.ndarray:
    block_of = np.empty(world_size, dtype=np.int64)
    for b, members in enumerate(blocks):
        block_of[np.asarray(members, dtype=np.int64)] = b
    return block_of


def _chain_rho(steps: list[scipy.sparse.csr_matrix], sizes0: Sequence[int]) -> float:
    """The second-largest eigenvalue modulus of the chain over one period."""
    g0 = len(sizes0)
    if g0 == 1:
        return 0.0
    if g0 <= DENSE_GROUPS_MAX:
        product = np.eye(g0)
        for step in steps:
            product = step @ product
        moduli = np.sort(np.abs(np.linalg.eigvals(product)))[::-1]
        return float(min(1.0, moduli[1]))
    from scipy.sparse.linalg import LinearOperator, eigs

    # Round 0's group sizes weight the consensus direction out: the chain keeps the
    # size-weighted sum of the values (averaging keeps the sum over ranks).
    weights = np.asarray(sizes0, dtype=float) / float(sum(sizes0))

    def apply(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float).reshape(-1)
        x = x - weights @ x
        for step in steps:
            x = step @ x
        return x

    op = LinearOperator((g0, g0), matvec=apply, dtype=float)
    values = eigs(op, k=1, which="LM", return_eigenvectors=False, tol=1e-8, maxiter=10 * g0,
                  v0=np.random.default_rng(0).standard_normal(g0))
    return float(min(1.0, np.abs(values).max()))


def _is_rank(r: Any) -> bool:
    return isinstance(r, int | np.integer) and not isinstance(r, bool)


class Schedule:
    """A validated divide-and-shuffle schedule.

    Give either ``period`` (whole partitions, one per round) or ``blocks`` and ``rounds``
    (each round's named groups; every block's unnamed ranks form one more group).
    Construction normalises (each group sorted, groups ordered by lowest rank) and checks
    the partition property and that the period mixes (``rho < 1``).
    """

    def __init__(self, world_size: int, period: Sequence[Sequence[Sequence[int]]] | None = None,
                 predicted_comm_ms: float | None = None, notes: Sequence[str] = (), *,
                 blocks: Sequence[Sequence[int]] | None = None,
                 rounds: Sequence[Sequence[Sequence[int]]] | None = None) -> None:
        n = world_size
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ScheduleError(f"world_size must be a positive integer, got {n!r}")
        if (period is None) == (rounds is None) or (rounds is None) != (blocks is None):
            raise ScheduleError("give a schedule either its period or its blocks and rounds")
        if period is not None:
            if len(period) == 0:
                raise ScheduleError("the period is empty; it needs at least one partition")
            for t, partition in enumerate(period):
                _check_partition(t, partition, n)
            blocks, rounds = (tuple(range(n)),), period
        else:
            if len(rounds) == 0:
                raise ScheduleError("the period is empty; it needs at least one round")
            _check_partition(None, blocks, n)
        self.world_size = n
        self.blocks: tuple[Group, ...] = tuple(tuple(sorted(int(r) for r in b)) for b in blocks)
        self._block_of = _block_of(n, self.blocks)
        normalised = []
        for t, named in enumerate(rounds):
            groups = []
            seen: set[int] = set()
            for group in named:
                if len(group) == 0:
                    raise ScheduleError(f"round {t} has an empty group; drop it")
                if not all(_is_rank(r) for r in group):
                    raise ScheduleError(f"round {t}: group {list(group)} must hold integer ranks")
                members = tuple(sorted(int(r) for r in group))
                out = [r for r in members if not 0 <= r < n]
                twice = sorted({r for r in members if r in seen} | {a for a, b in zip(members, members[1:], strict=False) if a == b})
                if out or twice:
                    parts = [f"{k} {v}" for k, v in (("ranks in two groups", twice), ("ranks out of range", out)) if v]
                    raise ScheduleError(f"round {t} is not a partition of ranks 0..{n - 1}: {'; '.join(parts)}")
                seen.update(members)
                groups.append(members)
            normalised.append(tuple(sorted(groups)))
        self.rounds: tuple[tuple[Group, ...], ...] = tuple(normalised)
        self.predicted_comm_ms = predicted_comm_ms
        self.notes: tuple[str, ...] = tuple(notes)
        self._where: dict[int, dict[int, Group]] = {}
        if self.rho >= 1.0 - _RHO_TOLERANCE:
            raise ScheduleError(
                f"the period does not mix (rho = {self.rho:.6f}, must be < 1): some ranks never "
                "exchange information, directly or through others; add a round whose groups "
                "connect them"
            )

    # -- queries -------------------------------------------------------------------------
    @property
    def length(self) -> int:
        """Rounds in the period."""
        return len(self.rounds)

    @cached_property
    def rho(self) -> float:
        if self.world_size == 1:
            return 0.0
        return _chain_rho(*_chain(self.rounds, self._block_of, np.asarray([len(b) for b in self.blocks], dtype=np.int64)))

    @cached_property
    def period(self) -> tuple[Partition, ...]:
        """Every round as a whole partition (``period[t]`` is used at iterations ``t mod
        length``): ``length x world_size`` integers, for small schedules and display."""
        return tuple(self.partition_at(t) for t in range(self.length))

    def rest(self, t: int, block: int) -> Group:
        """The ranks of ``block`` that round ``t`` does not name (a group when not empty).
        Built on each call, not kept: kept for every round, rests would be period x ranks."""
        named = self.named(t % self.length)
        return tuple(r for r in self.blocks[block] if r not in named)

    def named(self, t: int) -> dict[int, Group]:
        """``{rank: its group}`` for the ranks round ``t`` names (kept: named ranks are few)."""
        t %= self.length
        if t not in self._where:
            self._where[t] = {r: g for g in self.rounds[t] for r in g}
        return self._where[t]

    def rest_sizes(self, t: int) -> dict[int, int]:
        """``{block: size}`` of round ``t``'s non-empty rests, from the named ranks alone."""
        named_in = Counter(int(self._block_of[r]) for r in self.named(t))
        return {b: len(block) - named_in.get(b, 0) for b, block in enumerate(self.blocks)
                if len(block) > named_in.get(b, 0)}

    def block_of(self, rank: int) -> int:
        return int(self._block_of[rank])

    def partition_at(self, step: int) -> Partition:
        t = step % self.length
        rests = (self.rest(t, b) for b in range(len(self.blocks)))
        return tuple(sorted([*self.rounds[t], *(g for g in rests if g)]))

    def group_of(self, rank: int, step: int) -> Group:
        if not 0 <= rank < self.world_size:
            raise ScheduleError(f"rank {rank} is not in the schedule (world size {self.world_size})")
        t = step % self.length
        return self.named(t).get(rank) or self.rest(t, int(self._block_of[rank]))

    def distinct_groups(self) -> list[Group]:
        """Every group the schedule uses, in order of first appearance (deterministic)."""
        return list(dict.fromkeys(g for t in range(self.length) for g in self.partition_at(t)))

    def digest(self) -> str:
        """A short hash of the period; ranks compare it to prove they run the same plan. The
        same partitions give the same hash whichever way they were given, up to
        ``EXPLICIT_MAX`` entries; beyond, the hash is of the blocks and named groups."""
        if self.length * self.world_size <= EXPLICIT_MAX:
            blob = json.dumps([[list(g) for g in p] for p in self.period]).encode()
        else:
            blob = json.dumps([[list(b) for b in self.blocks], [[list(g) for g in r] for r in self.rounds]]).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    # -- JSON ----------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "schedule") -> Schedule:
        version = data.get("version")
        if isinstance(version, bool) or version not in (SCHEDULE_VERSION, COMPACT_VERSION):
            raise ScheduleError(
                f'{source}: "version" must be {SCHEDULE_VERSION} or {COMPACT_VERSION}, got {version!r}'
            )
        nested = ("period",) if version == SCHEDULE_VERSION else ("rounds",)
        for key in nested:
            value = data.get(key)
            if not isinstance(value, list) or not all(
                isinstance(p, list) and all(isinstance(g, list) for g in p) for p in value
            ):
                raise ScheduleError(
                    f'{source}: "{key}" must be a list of rounds, each a list of groups of ranks, '
                    'e.g. [[[0, 4], [1, 2, 3], [5, 6, 7]], ...]'
                )
        if version == COMPACT_VERSION:
            blocks = data.get("blocks")
            if not isinstance(blocks, list) or not all(isinstance(b, list) for b in blocks):
                raise ScheduleError(f'{source}: "blocks" must be a list of lists of ranks (the racks), '
                                    'e.g. [[0, 1, 2, 3], [4, 5, 6, 7]]')
        world_size = data.get("world_size")
        predicted = data.get("predicted_comm_ms")
        for key, value in (("predicted_comm_ms", predicted), ("rho", data.get("rho"))):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not math.isfinite(value)):
                raise ScheduleError(f'{source}: "{key}" must be a finite number, got {value!r}')
        notes = data.get("notes", [])
        if not isinstance(notes, list) or not all(isinstance(x, str) for x in notes):
            raise ScheduleError(f'{source}: "notes" must be a list of sentences, got {notes!r}')
        shape: dict[str, Any] = (
            {"period": tuple(tuple(tuple(g) for g in p) for p in data["period"])} if version == SCHEDULE_VERSION
            else {"blocks": tuple(tuple(b) for b in data["blocks"]),
                  "rounds": tuple(tuple(tuple(g) for g in r) for r in data["rounds"])})
        try:
            schedule = cls(world_size=world_size, predicted_comm_ms=None if predicted is None else float(predicted),
                           notes=tuple(notes), **shape)
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
        """Version 1 (every group of every round) up to ``EXPLICIT_MAX`` entries, else
        version 2 (the blocks once, then each round's named groups)."""
        out: dict[str, Any] = {"world_size": self.world_size}
        if self.length * self.world_size <= EXPLICIT_MAX:
            out = {"version": SCHEDULE_VERSION, **out, "period": [[list(g) for g in p] for p in self.period]}
        else:
            out = {"version": COMPACT_VERSION, **out, "blocks": [list(b) for b in self.blocks],
                   "rounds": [[list(g) for g in r] for r in self.rounds]}
        out["rho"] = round(self.rho, 9)
        if self.predicted_comm_ms is not None and math.isfinite(self.predicted_comm_ms):
            out["predicted_comm_ms"] = round(self.predicted_comm_ms, 3)  # (a link of rate 0 predicts none)
        if self.notes:
            out["notes"] = list(self.notes)
        return out

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Schedule:
        data = read_versioned(path, kind="schedule", version=(SCHEDULE_VERSION, COMPACT_VERSION), error=ScheduleError)
        return cls.from_dict(data, source=f"schedule file {path}")

    def save(self, path: str | os.PathLike[str]) -> None:
        write_json(path, self.to_dict())


def _check_partition(t: int | None, partition: Sequence[Sequence[int]], n: int) -> None:
    """Raise ``ScheduleError`` unless ``partition`` holds every rank of ``0..n-1`` once
    (``t``: the round, ``None`` for the blocks)."""
    where = "the blocks" if t is None else f"round {t}"
    for group in partition:
        if len(group) == 0:
            raise ScheduleError(f"{where} hold an empty block; drop it" if t is None
                                else f"round {t} has an empty group; drop it")
        if not all(_is_rank(r) for r in group):
            raise ScheduleError(f"{where}: group {list(group)} must hold integer ranks")
    flat = sorted(int(r) for g in partition for r in g)
    if len(flat) != n or flat != list(range(n)):  # the length first: n may be huge
        seen: set[int] = set()
        dup = sorted({r for r in flat if r in seen or seen.add(r)})
        present = set(flat)
        missing: Any = sorted(r for r in range(n) if r not in present) if n <= len(flat) + 1000 else \
            f"{n - sum(1 for r in present if 0 <= r < n)} of {n}"  # n may be huge: count them
        out = sorted(r for r in present if not 0 <= r < n)
        parts = [f"{k} {v}" for k, v in (("missing ranks", missing),
                 ("ranks in two groups", dup), ("ranks out of range", out)) if v]
        verb = "are" if t is None else "is"
        raise ScheduleError(f"{where} {verb} not a partition of ranks 0..{n - 1}: {'; '.join(parts)}")
