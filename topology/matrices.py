"""What rack fitting (``racks``, ``placement``) and contention classification
(``contention``) share: checks and normalisations of the measured matrices, the thresholds
of the rules, and which ranks sit behind a queue of their own or a slow NIC.

Pure functions on plain arrays (numpy; no torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

DEFAULT_RACK_GAP = 0.5
DEFAULT_SLOW_RATIO = 0.6


def square_matrix(name: str, value: Any, n: int | None = None) -> np.ndarray:
    arr = np.asarray(value, dtype=float)
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1] or (n is not None and arr.shape[0] != n):
        want = "a square matrix" if n is None else f"a {n}x{n} matrix"
        raise ValueError(f"{name} must be {want}, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{name} must hold finite, non-negative numbers; re-run the probe")
    return arr


def nearest_cost(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``cost`` symmetrised, and each rank's smallest cost to any other rank."""
    sym = (cost + cost.T) / 2.0
    return sym, (sym + np.diag(np.full(len(sym), np.inf))).min(axis=1)


def ratio_to_nearest(cost: np.ndarray) -> np.ndarray | None:
    """Symmetrised ``cost`` divided by the typical nearest-neighbour cost (``None``: unusable).

    The scale is the median over ranks of each rank's smallest cost to any other rank: in a
    rack of two or more, a rank's nearest neighbour is a rack-mate, so this is the intra-rack
    level, whatever the absolute numbers (loopback, 1 GbE, InfiniBand).
    """
    sym, nearest = nearest_cost(cost)
    base = float(np.median(nearest))
    if not np.isfinite(base) or base <= 0:
        return None
    out = sym / base
    np.fill_diagonal(out, 0.0)
    return out


def bandwidth_cost(bw: np.ndarray, slow_ratio: float = DEFAULT_SLOW_RATIO,
                    queued: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
    """How many times slower each pair's path is than its endpoints' NICs allow.

    Direction by direction, a flow ``i -> j`` costs ``min(out_i, in_j) / bw[i, j]``, where
    ``out_i`` is ``i``'s best outgoing flow and ``in_j`` is ``j``'s best incoming flow: what
    the two NICs allow, over what the path gave. A pair costs the worse of its two directions,
    because a shared link between racks may be contended one way only (traffic leaving a
    rack). A direction whose sending NIC (or receiving NIC) is itself slow, its best flow below
    ``slow_ratio`` times the median rank's, says nothing about the path (every flow through
    that NIC is slow alike) and is left out, so a rank whose NIC is shared with another job
    still joins its rack through its clear direction (for a ``queued`` rank, the loaded
    direction is left out, see ``slow_ends``). Also returns which pairs had such an
    informative direction (a rank whose NIC is slow both ways sees no path at all).
    """
    bw = bw.copy()
    np.fill_diagonal(bw, 0.0)
    out_best, in_best = bw.max(axis=1), bw.max(axis=0)
    cost = np.full_like(bw, np.nan)
    np.divide(np.minimum.outer(out_best, in_best), bw, out=cost, where=bw > 0)
    blind = np.logical_or.outer(*slow_ends(bw, slow_ratio, queued))
    seen = np.where(blind, np.nan, cost)
    known = ~np.isnan(seen) | ~np.isnan(seen.T)
    with np.errstate(invalid="ignore"):
        pair = np.fmax(seen, seen.T)  # NaN-skipping: the informative direction decides
        pair = np.where(np.isnan(pair), np.fmin(cost, cost.T), pair)  # both blind: the clearer one
    # A pair never measured (0 Gbit/s) says nothing: give it the worst cost seen.
    finite = pair[np.isfinite(pair)]
    pair[~np.isfinite(pair)] = finite.max() if finite.size else 1.0
    np.fill_diagonal(pair, 0.0)
    return pair, known & (bw > 0) & (bw.T > 0)


def renumber_racks(labels: Sequence[int]) -> list[int]:
    """Relabel racks ``0..R-1`` in order of their lowest rank (the topology.json rule)."""
    seen: dict[int, int] = {}
    return [seen.setdefault(int(label), len(seen)) for label in labels]


#: A flow below this fraction of what its two NICs allow was held back by a link between them
#: (an uplink): a rack-mate's flow in a round of disjoint pairs only shares the two NICs.
CROSS_RATIO = 0.5
#: A boundary, or a worker's place, is confident when every worker it separates is at least
#: this many times farther (on average) from the other rack than from its own.
CONFIDENT_MARGIN = 1.25
#: A path is clear (no queue on it) up to this many times the typical nearest-neighbour
#: latency (``clear_latency``).
DELAY_RATIO = 3.0
#: A ping that waited behind a full queue during a blast took at least this many times its
#: idle time (``held``). Recorded on the emulated racks (5 ms tbf queues): waits behind a
#: blast's queue took 6.6 to 41 times their idle time (0.5 to 3.2 ms), while pings that only
#: met a busy host during a blast took at most 4.6 times (0.24 ms); at three times, two
#: such pings placed a worker of a 2,5 layout in the wrong rack with confidence.
WAIT_RATIO = 5.0
#: A blast is sharp (a queue filled at a link its members share) when they sent below this
#: fraction of what their NICs carried alone.
SHARP_RATIO = 0.6
#: A rank's fan (flows to or from every other rank at once) clears its NIC when it carried at
#: least this fraction of what its flows got alone, one bottleneck each: a NIC that bounds its
#: flows carries about its single-flow rate however many there are (1/2 of that sum with two
#: bottlenecks, less with more), a NIC that does not carries all of it.
FAN_RATIO = 0.75


def slow_ends(bw: np.ndarray, slow_ratio: float, queued: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
    """Per rank, whether its best outgoing and its best incoming flow (diagonal zero) are
    below ``slow_ratio`` of the median rank's: its NIC, not the path, bounds that direction.
    A ``queued`` rank (``queued_ranks``) shares its NIC with another job, so its loaded
    direction counts as slow even where one lucky flow of it ran fast (``loaded_direction``)."""
    out_best, in_best = bw.max(axis=1), bw.max(axis=0)
    out_slow, in_slow = out_best < slow_ratio * np.median(out_best), in_best < slow_ratio * np.median(in_best)
    for i in queued:
        if not (out_slow[i] or in_slow[i]):
            (out_slow if loaded_direction(bw, i) == "out" else in_slow)[i] = True
    return out_slow, in_slow


def loaded_direction(bw: np.ndarray, i: int) -> str:
    """The direction of rank ``i``'s NIC that another job's flows load: the one whose median
    flow is slower (``"out"`` or ``"in"``; diagonal zero)."""
    others = np.arange(len(bw)) != i
    return "out" if np.median(bw[i, others]) <= np.median(bw[others, i]) else "in"


def queued_ranks(latency_us: Any) -> list[int]:
    """Ranks behind a standing queue at their own NIC: even their fastest ping to anyone
    waits (above ``clear_latency``). Another job's flows fill that queue, so the rank's NIC
    is contended (paper Fig. 6) however fast one flow of it ran in a lull of that job's."""
    lat = square_matrix("latency_us", latency_us)
    return np.flatnonzero(nearest_cost(lat)[1] > clear_latency(lat)).tolist()


def clear_latency(latency_us: np.ndarray) -> float:
    """One-way µs up to which a path is clear (no queue on it): ``DELAY_RATIO`` times the
    median rank's nearest-neighbour latency."""
    return DELAY_RATIO * float(np.median(nearest_cost(latency_us)[1]))


def ranks_text(ranks: Sequence[int], noun: str = "rank") -> str:
    """``rank 2``, ``ranks 2-3``, ``ranks 0-1, 4`` (``noun`` for another word, e.g. worker):
    runs of consecutive ranks written as ranges."""
    spans: list[list[int]] = []
    for r in sorted(ranks):
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)
    return f"{noun} {text}" if len(ranks) == 1 else f"{noun}s {text}"
