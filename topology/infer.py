"""Infer racks and classify contention from measured latency and bandwidth matrices.

Pure functions on plain arrays (numpy, scipy; no torch), so they are tested exhaustively on
synthetic matrices. ``dssync probe`` feeds them what it measured; the planner consumes
their result through ``topology.json`` (DESIGN section 2; the two contention kinds are
the paper's Fig. 5, a slow rack uplink, and Fig. 6, a slow end-host NIC).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform

__all__ = ["DEFAULT_SLOW_RATIO", "classify_contention", "infer_racks", "renumber_racks", "slow_keys"]

DEFAULT_RACK_GAP = 0.5
DEFAULT_SLOW_RATIO = 0.6


def _square(name: str, value: Any, n: int | None = None) -> np.ndarray:
    arr = np.asarray(value, dtype=float)
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1] or (n is not None and arr.shape[0] != n):
        want = "a square matrix" if n is None else f"a {n}x{n} matrix"
        raise ValueError(f"{name} must be {want}, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{name} must hold finite, non-negative numbers; re-run the probe")
    return arr


def _ratio_to_nearest(cost: np.ndarray) -> np.ndarray | None:
    """Symmetrised ``cost`` divided by the typical nearest-neighbour cost (``None``: unusable).

    The scale is the median over ranks of each rank's smallest cost to any other rank: in a
    rack of two or more, a rank's nearest neighbour is a rack-mate, so this is the intra-rack
    level, whatever the absolute numbers (loopback, 1 GbE, InfiniBand).
    """
    sym = (cost + cost.T) / 2.0
    off = sym + np.diag(np.full(len(sym), np.inf))
    base = float(np.median(off.min(axis=1)))
    if not np.isfinite(base) or base <= 0:
        return None
    out = sym / base
    np.fill_diagonal(out, 0.0)
    return out


def _bandwidth_cost(bw: np.ndarray, slow_ratio: float = DEFAULT_SLOW_RATIO) -> tuple[np.ndarray, np.ndarray]:
    """How many times slower each pair's path is than its endpoints' NICs allow.

    Direction by direction, a flow ``i -> j`` costs ``min(out_i, in_j) / bw[i, j]``, where
    ``out_i`` is ``i``'s best outgoing flow and ``in_j`` is ``j``'s best incoming flow: what
    the two NICs allow, over what the path gave. A pair costs the worse of its two directions,
    because a shared link between racks may be contended one way only (traffic leaving a
    rack). A direction whose sending NIC (or receiving NIC) is itself slow, its best flow below
    ``slow_ratio`` times the median rank's, says nothing about the path (every flow through
    that NIC is slow alike) and is left out, so a rank whose NIC is shared with another job
    still joins its rack through its clear direction. Also returns which pairs had such an
    informative direction (a rank whose NIC is slow both ways sees no path at all).
    """
    bw = bw.copy()
    np.fill_diagonal(bw, 0.0)
    out_best, in_best = bw.max(axis=1), bw.max(axis=0)
    cost = np.full_like(bw, np.nan)
    np.divide(np.minimum.outer(out_best, in_best), bw, out=cost, where=bw > 0)
    blind = np.logical_or.outer(out_best < slow_ratio * np.median(out_best),
                                in_best < slow_ratio * np.median(in_best))
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


def infer_racks(
    latency_us: Any,
    bandwidth_gbps: Any | None = None,
    hosts: Sequence[str] | None = None,
    *,
    gap: float = DEFAULT_RACK_GAP,
) -> list[int]:
    """The rack of every rank, racks numbered ``0..R-1`` in order of their lowest rank.

    Rule: for each metric, each pair gets a distance that says how many times worse than a
    typical rack-mate it is, ``latency / L0`` or ``c / C0``, where ``c`` is the pair's
    bandwidth cost, how many times slower its path is than its two NICs allow, in its worse
    direction (``_bandwidth_cost``: directions through a slow NIC are left out, so a NIC
    shared with another job, which slows all of a rank's flows alike, is no rack boundary),
    and ``L0``, ``C0`` are the median over ranks of each
    rank's smallest (nearest-neighbour) latency and cost. Each pair's distance is then raised
    to how differently the two ranks see the others (``_with_profile``), so that one cross-rack
    flow that had an uplink to itself cannot join two racks. Ranks are clustered by average
    linkage (``scipy.cluster.hierarchy``) and two clusters are one rack while their average
    distance is at most ``1 + gap`` (relative to the typical nearest-neighbour
    cost; the default 0.5 splits racks whose cross traffic is 1.5x worse: two flows
    sharing an uplink already halve it). A metric is used only when its own clustering
    separates cleanly (the 10th percentile of distances between its clusters above the 90th percentile within them),
    so a metric that is only noise is ignored; when both separate, bandwidth decides,
    because under load latency measures queues (a saturated NIC or uplink adds
    milliseconds to every round trip through it) more than racks. Latency decides when
    bandwidth shows no structure (racks that differ only in distance). Average linkage keeps
    one noisy pair from splitting a rack or merging two. A uniform matrix, loopback
    included, gives one rack.

    ``hosts`` (hostname per rank) is a hint: ranks on the same host are one machine and so
    one rack; it merges clusters, it never splits them (a two-rank world, or a matrix with
    no structure, can only be told apart by it).
    """
    if gap <= 0:
        raise ValueError(f"gap must be positive (a relative margin such as 1.0), got {gap}")
    lat = _square("latency_us", latency_us)
    n = lat.shape[0]
    if hosts is not None and len(hosts) != n:
        raise ValueError(f"hosts names {len(hosts)} ranks but latency_us has {n}; give one host per rank")
    if n < 2:
        return [0] * n
    ratios = [_with_profile(_ratio_to_nearest(lat), np.ones_like(lat, dtype=bool), gap)]
    if bandwidth_gbps is not None:
        cost, known = _bandwidth_cost(_square("bandwidth_gbps", bandwidth_gbps, n))
        ratios.append(_with_profile(_ratio_to_nearest(cost), known, gap))
    # A metric speaks only if its clusters are clearly apart: on a busy host, ping-pong
    # latency can be pure scheduling noise (hundreds of µs on some pairs), and taking the
    # worse of a noisy metric and a clean one would split racks at random.
    informative = [r for r in ratios if r is not None and _separated(r, _cluster(r, gap))]
    # Bandwidth first: under load, latency measures queues (a saturated NIC or uplink adds
    # milliseconds to every round trip through it) more than it measures racks.
    labels = _cluster(informative[-1], gap) if informative else [0] * n
    if hosts is not None:
        labels = _merge_by_host(labels, hosts)
    return renumber_racks(labels)


def _with_profile(ratio: np.ndarray | None, known: np.ndarray, gap: float) -> np.ndarray | None:
    """``ratio`` raised, pair by pair, to how differently the two ranks see everyone else.

    One pair's figure can mislead: a flow between two racks that happened to have their
    uplink to itself in its round runs at full speed, like a rack-mate's. Rack-mates also
    agree about third parties (both near, or both far), so a pair's profile distance is the
    median over the other ranks ``k`` of ``max(c_ik, c_jk) / min(c_ik, c_jk)``, with costs
    clipped to ``[1, 1 + 2 gap]`` (beyond a clear rack boundary, how far does not matter),
    and the pair's distance is the larger of its own ratio and that median. The median
    needs most third parties to disagree, so it only speaks when the two ranks' racks hold
    most of the world, and then it outvotes one lucky measurement. Only third parties that
    both ranks measured informatively (``known``) vote.
    """
    if ratio is None:
        return None
    n = len(ratio)
    clipped = np.clip(ratio, 1.0, 1.0 + 2.0 * gap)
    np.fill_diagonal(clipped, 1.0)
    out = ratio.copy()
    if n < 3:
        return out
    for i in range(n):
        spread = np.maximum(clipped[i], clipped) / np.minimum(clipped[i], clipped)  # [j, k]
        spread[~(known[i] & known)] = np.nan  # k unseen by i or by j
        spread[:, i] = np.nan
        np.fill_diagonal(spread, np.nan)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # no voter: the pair's own ratio
            out[i] = np.fmax(ratio[i], np.nanmedian(spread, axis=1))
    out = np.maximum(out, out.T)
    np.fill_diagonal(out, 0.0)
    return out


def _cluster(dist: np.ndarray, gap: float) -> list[int]:
    tree = linkage(squareform(dist, checks=False), method="average")
    return [int(x) for x in fcluster(tree, t=1.0 + gap, criterion="distance")]


def _separated(dist: np.ndarray, labels: list[int]) -> bool:
    """Whether ``labels`` splits ``dist`` cleanly: more than one cluster, and the 10th
    percentile of distances between clusters above the 90th percentile within them (racks
    are a structure of the whole matrix, not of a few outlying pairs)."""
    lab = np.asarray(labels)
    if len(set(labels)) < 2:
        return False
    same = np.equal.outer(lab, lab)
    off = ~np.eye(len(lab), dtype=bool)
    within, between = dist[same & off], dist[~same]
    if within.size == 0:
        return True  # every rank alone, each one apart from all others
    return float(np.percentile(between, 10)) > float(np.percentile(within, 90))


def _merge_by_host(labels: list[int], hosts: Sequence[str]) -> list[int]:
    parent = {label: label for label in labels}

    def find(x: int) -> int:
        while parent[x] != x:
            x = parent[x]
        return x

    first: dict[str, int] = {}
    for label, host in zip(labels, hosts, strict=True):
        other = first.setdefault(host, label)
        a, b = find(label), find(other)
        if a != b:
            parent[max(a, b)] = min(a, b)
    return [find(label) for label in labels]


def slow_keys(values: dict[int, float], ratio: float = DEFAULT_SLOW_RATIO) -> list[int]:
    """Keys whose value is below ``ratio`` times the median of the *other* keys' values."""
    out = []
    for key, value in values.items():
        others = [v for k, v in values.items() if k != key]
        if others and value < ratio * float(np.median(others)):
            out.append(key)
    return out


def classify_contention(
    bandwidth_gbps: Any,
    racks: Sequence[int],
    uplink_gbps_by_rack: Sequence[float] | None = None,
    *,
    hosts: Sequence[str] | None = None,
    slow_ratio: float = DEFAULT_SLOW_RATIO,
) -> dict[str, list[dict[str, float]]]:
    """Slow NICs (paper Fig. 6) and slow rack uplinks (Fig. 5), in the topology.json form.

    ``{"uplinks": [{"rack": r, "bandwidth_gbps": x}], "nics": [{"rank": i, "bandwidth_gbps": y}]}``;
    both lists are empty when nothing stands out.

    NIC of rank ``i``: its capacity estimate is its *best* flow in its *worse* direction,
    ``min(max_j bw[i, j], max_j bw[j, i])``. A healthy rank has at least one fast flow (a
    rack-mate, or any peer whose path is clear), so a rank whose every flow, rack-mates
    included, is slow has a contended NIC; a slow peer or a slow uplink does not lower the
    best flow. Slow means below ``slow_ratio`` (0.6) times the median of the other ranks'
    estimates: a contending flow of equal weight halves a NIC's share (0.5 < 0.6), while
    measurement noise of a few ten percent stays above it. With ``hosts``, flows between
    ranks of one host are left out (they never leave the machine), and a rank with no flow
    off its host is not judged: local ranks on loopback measure the CPU, not a NIC. At least
    three judged ranks are needed for a median of "the others" to mean anything.

    Uplink of rack ``r``, judged on its *egress*: for each other rack ``s``, the median
    pairwise flow from ``r`` to ``s`` (flows touching a slow NIC left out), then the best
    over destinations, since one clear destination means ``r``'s own uplink is clear while
    a slow destination's ingress slows only its own column. Slow by the same 0.6 rule,
    against the median of the other racks (with two racks, the other rack). Egress, because
    a cross-rack flow leaves through its rack's uplink and enters through another's, and
    traffic of other tasks leaving a rack is what a probe can pin on one uplink; with two
    racks, an uplink slowed equally both ways slows both racks' figures alike and is not
    told apart. Pairwise egress below ``slow_ratio`` of the others' is slow on its own. The
    concurrent aggregates alone are not trusted: a rack that sends slowly all at once while
    its pairwise flows run at its NICs' rate is held back by its own NICs or the CPU, not by
    its uplink. The figure reported for a
    slow uplink is ``uplink_gbps_by_rack[r]`` when given (what the rack gets when all of it
    sends across at once, as ``dssync probe`` measures), else the pairwise figure. The
    aggregate also decides when the rack's pairwise egress is held back, below ``slow_ratio``
    of its own members' NIC estimates (the rack's NICs carry more than its cross-rack flows
    got): then the rack is slow when its aggregate is below ``slow_ratio`` of the others'.
    With two racks the other rack's pairwise egress is the contended uplink's *ingress*, and
    a single flow in it is held back too, by its ACKs queueing behind the background traffic
    and its window growing over the longer round trip: on the emulated ``inter-rack``
    scenario, pairwise egress measured 0.11 against the other rack's 0.18 Gbit/s (ratios
    0.5 to 0.8 run to run), both far below the NICs' 0.95, while the aggregates, four flows
    at once, read 0.11 to 0.33 against 0.56 to 0.90. Without contention pairwise flows can be
    held back as well (on ``static`` the cross-rack pairs of a round share the uplink and got
    0.2 to 0.5 Gbit/s); there the aggregates agree (0.91 and 0.92) and nothing is flagged. With
    ``hosts``, a rack that shares a host with another rack is not judged (its cross-rack
    flows need not leave the machine).
    """
    if not 0 < slow_ratio < 1:
        raise ValueError(f"slow_ratio must lie in (0, 1), got {slow_ratio}; 0.6 is the default")
    bw = _square("bandwidth_gbps", bandwidth_gbps)
    n = bw.shape[0]
    if len(racks) != n:
        raise ValueError(f"racks names {len(racks)} ranks but bandwidth_gbps has {n}; give one rack per rank")
    if hosts is not None and len(hosts) != n:
        raise ValueError(f"hosts names {len(hosts)} ranks but bandwidth_gbps has {n}; give one host per rank")
    rack_ids = sorted(set(racks))
    if uplink_gbps_by_rack is not None and len(uplink_gbps_by_rack) != len(rack_ids):
        raise ValueError(
            f"uplink_gbps_by_rack has {len(uplink_gbps_by_rack)} entries for {len(rack_ids)} racks; "
            "give one aggregate per rack"
        )
    off = bw.copy()
    np.fill_diagonal(off, 0.0)
    # Flows between ranks of one host never touch its NIC (loopback measures the CPU).
    through_nic = off.copy()
    if hosts is not None:
        same_host = np.equal.outer(np.asarray(hosts, dtype=object), np.asarray(hosts, dtype=object))
        through_nic[same_host] = 0.0
    nic_gbps = {i: float(min(through_nic[i].max(), through_nic[:, i].max()))
                for i in range(n) if through_nic[i].any() and through_nic[:, i].any()}
    slow_nics = slow_keys(nic_gbps, slow_ratio) if len(nic_gbps) > 2 else []

    members = {r: [i for i in range(n) if racks[i] == r] for r in rack_ids}
    clear = [i for i in range(n) if i not in slow_nics]
    uplink: dict[int, float] = {}
    for r in rack_ids:
        best = []
        for s in rack_ids:
            flows = [off[i, j] for i in members[r] for j in members[s]
                     if s != r and i in clear and j in clear]
            if flows:
                best.append(float(np.median(flows)))
        if best:
            uplink[r] = max(best)
    if hosts is not None:
        # A rack sharing a host with another rack has no uplink between them to judge.
        host_racks: dict[str, set[int]] = {}
        for host, rack in zip(hosts, racks, strict=True):
            host_racks.setdefault(host, set()).add(rack)
        shared = set().union(*(rs for rs in host_racks.values() if len(rs) > 1))
        uplink = {r: v for r, v in uplink.items() if r not in shared}
    slow_uplinks = slow_keys(uplink, slow_ratio) if len(uplink) > 1 else []
    if uplink_gbps_by_rack is not None and len(uplink) > 1:
        # The aggregate decides when the rack's pairwise egress is itself held back: below
        # slow_ratio of what the rack's own NICs carry (so neither its NICs nor the CPU are
        # what slows the rack when it sends all at once).
        nic_level = {r: float(np.median([nic_gbps[i] for i in members[r] if i in clear and i in nic_gbps]
                                        or [np.nan])) for r in uplink}
        held_back = {r for r in uplink if uplink[r] < slow_ratio * nic_level[r]}
        aggregate = {r: float(uplink_gbps_by_rack[r]) for r in uplink}
        slow_uplinks = sorted(set(slow_uplinks) | (held_back & set(slow_keys(aggregate, slow_ratio))))
    report = ({r: float(uplink_gbps_by_rack[r]) for r in rack_ids} if uplink_gbps_by_rack is not None
              else uplink)
    return {
        "uplinks": [{"rack": r, "bandwidth_gbps": round(report[r], 4)} for r in slow_uplinks],
        "nics": [{"rank": i, "bandwidth_gbps": round(nic_gbps[i], 4)} for i in slow_nics],
    }
