"""Fitting racks: clustering the clear ranks on their latency and bandwidth matrices
(``fit_racks``, ``infer_racks``), with how sure each boundary is, and the blind ranks
handed to ``placement``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from itertools import combinations
from typing import Any

import numpy as np

from dssync.topology.matrices import (
    DEFAULT_RACK_GAP,
    DEFAULT_SLOW_RATIO,
    bandwidth_cost,
    clear_latency,
    queued_ranks,
    ratio_to_nearest,
    slow_ends,
    square_matrix,
)
from dssync.topology.placement import (
    RackFit,
    place_by_latency,
    rack_behind_queue,
    rule_out,
    rule_out_by_queue,
)


def blind_ranks(bandwidth_gbps: Any, slow_ratio: float = DEFAULT_SLOW_RATIO) -> list[int]:
    """Ranks whose best flow is slow both ways (below ``slow_ratio`` of the median rank's)."""
    bw = square_matrix("bandwidth_gbps", bandwidth_gbps).copy()
    np.fill_diagonal(bw, 0.0)
    out_slow, in_slow = slow_ends(bw, slow_ratio)
    return np.flatnonzero(out_slow & in_slow).tolist()


def infer_racks(
    latency_us: Any,
    bandwidth_gbps: Any | None = None,
    hosts: Sequence[str] | None = None,
    *,
    gap: float = DEFAULT_RACK_GAP,
) -> list[int]:
    """The rack of every rank, racks numbered ``0..R-1`` in order of their lowest rank
    (``fit_racks(...).racks()``: a blind rank that the pairs alone cannot place is a rack of
    its own)."""
    return fit_racks(latency_us, bandwidth_gbps, hosts, gap=gap).racks()


def fit_racks(
    latency_us: Any,
    bandwidth_gbps: Any | None = None,
    hosts: Sequence[str] | None = None,
    *,
    gap: float = DEFAULT_RACK_GAP,
    slow_ratio: float = DEFAULT_SLOW_RATIO,
) -> RackFit:
    """Racks from pairwise latency and bandwidth, with how sure each boundary is.

    Rule: for each metric, each pair gets a distance that says how many times worse than a
    typical rack-mate it is, ``latency / L0`` or ``c / C0``, where ``c`` is the pair's
    bandwidth cost, how many times slower its path is than its two NICs allow, in its worse
    direction (``bandwidth_cost``: directions through a slow NIC are left out, so a NIC
    shared with another job, which slows all of a rank's flows alike, is no rack boundary),
    and ``L0``, ``C0`` are the median over ranks of each rank's smallest (nearest-neighbour)
    latency and cost. Each pair's distance is then raised to how differently the two ranks
    see the others (``_with_profile``), so that one cross-rack flow that had an uplink to
    itself cannot join two racks. Ranks are clustered by average linkage
    (``scipy.cluster.hierarchy``) and two clusters are one rack while their average distance
    is at most ``1 + gap`` (relative to the typical nearest-neighbour cost; the default 0.5
    splits racks whose cross traffic is 1.5x worse: two flows sharing an uplink already halve
    it). A metric is used only when its own clustering separates cleanly (the 10th percentile
    of distances between its clusters above the 90th percentile within them), so a metric
    that is only noise is ignored; when both separate, bandwidth decides, because under load
    latency measures queues (a saturated NIC or uplink adds milliseconds to every round trip
    through it) more than racks. Latency decides when bandwidth shows no structure (racks that
    differ only in distance). A uniform matrix, loopback included, gives one rack.

    Bandwidth clusters only the clear ranks; a *blind* rank (slow NIC both ways,
    ``blind_ranks``) is placed apart (``RackFit``): a group is ruled out when one of its flows
    with a member ran below ``CROSS_RATIO`` of what both NICs allow, and a blind rank with one
    group left, every other group ruled out, is placed there. Others wait for the probe's
    placement phase (``place_blind``).

    Each clear rank's *margin* is how many times farther (average distance) it is from the
    nearest other rack than from its own (a rack of one: than a typical rack-mate, 1);
    a boundary is as sure as the least sure rank it separates (``CONFIDENT_MARGIN``).

    ``hosts`` (hostname per rank) is a hint: ranks on the same host are one machine and so
    one rack; it merges clusters, it never splits them (a two-rank world, or a matrix with
    no structure, can only be told apart by it).
    """
    if gap <= 0:
        raise ValueError(f"gap must be positive (a relative margin such as 1.0), got {gap}")
    lat = square_matrix("latency_us", latency_us)
    n = lat.shape[0]
    if hosts is not None and len(hosts) != n:
        raise ValueError(f"hosts names {len(hosts)} ranks but latency_us has {n}; give one host per rank")
    if n < 2:
        return RackFit(n=n, groups=[list(range(n))] if n else [])
    bw = None if bandwidth_gbps is None else square_matrix("bandwidth_gbps", bandwidth_gbps, n)
    blind = blind_ranks(bw, slow_ratio) if bw is not None and n > 2 else []
    clear = [i for i in range(n) if i not in blind]
    if len(clear) < 2:  # nothing clear to cluster on: bandwidth says nothing
        blind, clear = [], list(range(n))
    # A rank whose pings to everyone wait sits behind a queue of its own (its NIC shared with
    # another job's flows): that is no rack boundary, so latency clusters the others only.
    clear_us = clear_latency(lat)
    queued = queued_ranks(lat)
    lat_ranks = [i for i in range(n) if i not in queued] if n - len(queued) >= 2 else list(range(n))
    lat_sub = np.ix_(lat_ranks, lat_ranks)
    choices: list[tuple[str, list[int], np.ndarray | None]] = [
        ("latency", lat_ranks, _with_profile(ratio_to_nearest(lat[lat_sub]), np.ones((len(lat_ranks),) * 2, dtype=bool),
                                             gap))]
    held_back: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # bandwidth ratio, known pairs, steady ranks
    if bw is not None:
        cost, known = bandwidth_cost(bw, slow_ratio, queued)
        sub = np.ix_(clear, clear)
        out_slow, in_slow = slow_ends(np.where(np.eye(n, dtype=bool), 0.0, bw), slow_ratio, queued)
        ratio = ratio_to_nearest(cost[sub])
        if ratio is not None:
            held_back = (ratio, known[sub], ~(out_slow | in_slow)[clear])
        choices.append(("bandwidth", clear, _with_profile(ratio, known[sub], gap)))

    def clusters(metric: str, dist: np.ndarray) -> list[int]:
        labels = _cluster(dist, gap)
        if metric != "bandwidth" or held_back is None:
            return labels
        ratio, known_sub, steady = held_back
        return _merge_unseparated(labels, ratio, known_sub, steady, gap, dist)

    # A metric speaks only if its clusters are clearly apart: on a busy host, ping-pong
    # latency can be pure scheduling noise (hundreds of µs on some pairs), and taking the
    # worse of a noisy metric and a clean one would split racks at random. Bandwidth also
    # speaks when its flows show every boundary (``_evidenced``), lucky cross-rack pairs or not.
    labelled = [(c, clusters(c[0], c[2])) for c in choices if c[2] is not None]
    informative = [(c, labels) for c, labels in labelled if _separated(c[2], labels)
                   or (c[0] == "bandwidth" and held_back is not None and _evidenced(labels, *held_back[:2], gap))]
    if informative:
        (metric, ranks, dist), labels = informative[-1]  # bandwidth first
    else:
        metric, ranks, dist, labels = "none", clear, None, [0] * len(clear)
    # One rack because no metric separated cleanly, although one clustered the ranks apart:
    # a guess, said to be one (the probe then measures every pair again).
    split_unseparated = metric == "none" and any(len(set(found)) > 1 for _, found in labelled)
    if metric == "latency" and bw is not None and not _far_apart(lat, ranks, labels, clear, clear_us):
        # Bandwidth saw one rack of clear ranks. Latency may split those only by a gap no busy
        # host or half-drained queue makes: on a 3,1 layout whose rack 0 carried another job's
        # flows, pings of 80 against 130 us split its three workers, and on a 4,1 layout one
        # round trip of 1.9 ms (192 us the other way) split four rack-mates three ways.
        metric, ranks, dist, labels = "bandwidth", clear, None, [0] * len(clear)
        # ... unless bandwidth clustered them apart too, unseparated: then one rack is a guess
        # (3,2,4 on a busy host: rack-mates' flows at up to 2.8x the nearest cost, the racks'
        # cross flows at 5-13x, and neither metric's clusters clean)
        split_unseparated = any(c[0] == "bandwidth" and len(set(found)) > 1 for c, found in labelled)
    if metric == "latency":
        blind = [i for i in range(n) if i not in ranks]  # latency does not see NIC rates, only queues
    groups_by_label: dict[int, list[int]] = {}
    for rank, label in zip(ranks, labels, strict=True):
        groups_by_label.setdefault(label, []).append(rank)
    groups = list(groups_by_label.values())
    if hosts is not None:
        groups = _merge_groups_by_host(groups, hosts)
    fit = RackFit(n=n, groups=sorted(groups, key=min), blind=blind, metric=metric,
                  split_unseparated=split_unseparated)
    if dist is not None and len(fit.groups) > 1:
        fit.margins = _margins(dist, ranks, fit.groups)
    if bw is not None and blind:
        rule_out(fit, bw, hosts)
        rule_out_by_queue(fit, lat, clear_us)
        rack_behind_queue(fit, bw, lat, clear_us)
        by_latency = [(c[1], labels) for c, labels in informative if c[0] == "latency"]
        if metric == "bandwidth" and by_latency:
            place_by_latency(fit, dict(zip(*by_latency[0], strict=True)), lat, clear_us)
    return fit


#: Above this many clusters (ranks, for the search over ranks) the fewest-racks search is
#: skipped: it is exact, and in the worst case grows like the partitions of its units.
MERGE_SEARCH_GROUPS = 12


def _fewest_racks(units: list[list[int]], ratio: np.ndarray, known: np.ndarray, gap: float,
                  prefer: list[int] | None = None) -> list[list[int]]:
    """The fewest racks, each a union of whole ``units`` (lists of rank indices), that keep
    together no pair held back (a ``ratio`` above ``1 + gap``) or never measured through
    clear NICs (``known``); among those, the one that agrees best with ``prefer`` (a label
    per rank: fewest units joined that it keeps apart, and kept apart that it joins), then
    whose joined pairs ran fastest. Exact branch and bound: a unit joins a rack only if it
    fits every unit there."""
    m = len(units)
    between = [[ratio[np.ix_(units[a], units[b])] for b in range(m)] for a in range(m)]
    fits = [[a != b and bool(known[np.ix_(units[a], units[b])].all()) and float(between[a][b].max()) <= 1.0 + gap
             for b in range(m)] for a in range(m)]
    agree = [[0.0 if prefer is None else (1.0 if prefer[units[a][0]] != prefer[units[b][0]] else -1.0)
              for b in range(m)] for a in range(m)]
    weight = [[agree[a][b] + 1e-3 * float(between[a][b].mean()) for b in range(m)] for a in range(m)]
    best: list[Any] = [m + 1, float("inf"), [[u] for u in range(m)]]

    def search(k: int, sets: list[list[int]], score: float) -> None:
        # joining never lowers the score without ``prefer``; with it, only the count prunes
        if len(sets) > best[0] or (prefer is None and len(sets) == best[0] and score >= best[1]):
            return
        if k == m:
            if len(sets) < best[0] or score < best[1]:
                best[:] = [len(sets), score, [list(s) for s in sets]]
            return
        for s in sets:
            if all(fits[k][g] for g in s):
                s.append(k)
                search(k + 1, sets, score + sum(weight[k][g] for g in s[:-1]))
                s.pop()
        sets.append([k])
        search(k + 1, sets, score)
        sets.pop()

    if any(any(row) for row in fits):
        search(0, [], 0.0)
    return [sorted(i for u in s for i in units[u]) for s in best[2]]


def _labels(groups: list[list[int]], n: int) -> list[int]:
    out = [0] * n
    for label, members in enumerate(groups):
        for i in members:
            out[i] = label
    return out


def _merge_unseparated(labels: list[int], ratio: np.ndarray, known: np.ndarray, steady: np.ndarray,
                       gap: float, dist: np.ndarray | None = None) -> list[int]:
    """Clusters (``labels``, one per rank of ``ratio``) joined into the fewest racks that keep
    together no pair whose flow was held back; where the ranks fit a partition that the flows
    evidence (``_evidenced``) in fewer racks, or in as many while the clusters keep such a
    pair, that partition. Where a cluster keeps a held-back pair of two ``steady`` ranks
    (NICs clear both ways), the fewest racks that keep every held-back pair apart.

    In a round of disjoint pairs a rack-mate's flow shares only its two NICs, so a pair whose
    path ran more than ``1 + gap`` times slower than both NICs allow (``ratio``: its bandwidth
    cost over the typical nearest-neighbour cost) crossed a link some other flow of its round used: the two are in
    different racks. A fast flow proves nothing (a cross-rack pair alone on its uplink in its
    round runs at full speed), and with few ranks two such lucky flows outvote a rack-mate's
    in ``_with_profile`` and split a rack (2,3 with another job on a NIC: one rack of three
    came out as three), or one lucky flow pulls a rank into the wrong rack on average
    linkage. So clusters merge when every pair between them was measured through clear NICs
    (``known``) and none was held back (``_fewest_racks``). A held-back pair inside a cluster
    is not always a boundary: a NIC shared with another job's flow one way holds back some
    of its rack-mates' flows that way too, and then no partition is evidenced and the
    clusters stand; between two ranks whose NICs are clear both ways it is (1,3,5: rank 0's
    flows to ranks 1 and 2 had the uplinks to themselves, its flow to rank 3 ran at 0.61 of
    both NICs, and linkage put it in their rack), but only where the racks that keep every
    such pair apart are themselves a structure (``_evidenced``, or ``_separated`` on ``dist``):
    on a busy host one flow inside a rack now and then runs just past ``1 + gap`` (3,2,4 with
    another job's flows on rack 2's uplink: a rack-mate pair at 1.53, another at 2.17), and
    splitting off its ends left five racks that no metric separated, so the fit fell back to
    one rack. Exact searches over up to ``MERGE_SEARCH_GROUPS`` clusters, and ranks.
    """
    keys = sorted(set(labels))
    if len(keys) > MERGE_SEARCH_GROUPS:
        return labels
    n = len(labels)
    merged = _labels(_fewest_racks([[i for i in range(n) if labels[i] == key] for key in keys], ratio, known, gap), n)
    if n <= MERGE_SEARCH_GROUPS:
        by_rank = _labels(_fewest_racks([[i] for i in range(n)], ratio, known, gap, merged), n)
        fewer = len(set(by_rank)) < len(set(merged)) or (
            len(set(by_rank)) == len(set(merged)) and not _evidenced(merged, ratio, known, gap))
        if fewer and _evidenced(by_rank, ratio, known, gap):
            return by_rank
        lab = np.asarray(merged)
        inside = np.equal.outer(lab, lab) & np.logical_and.outer(steady, steady) & known
        if np.any(ratio[inside] > 1.0 + gap) and (
                _evidenced(by_rank, ratio, known, gap) or (dist is not None and _separated(dist, by_rank))):
            return by_rank  # a held-back flow between two ranks whose NICs are clear both ways
    return merged


def _evidenced(labels: list[int], ratio: np.ndarray, known: np.ndarray, gap: float) -> bool:
    """Whether the flows show every boundary of ``labels`` and none inside: two racks or
    more, no pair inside a rack held back (above ``1 + gap`` of the typical nearest cost,
    see ``_merge_unseparated``), and between every two racks most pairs held back. Lucky
    cross-rack pairs (alone on their uplinks in their round) are a minority of their
    boundary's pairs and do not hide it, as they do ``_separated``'s percentiles."""
    lab = np.asarray(labels)
    if len(set(labels)) < 2:
        return False
    same = np.equal.outer(lab, lab) & ~np.eye(len(lab), dtype=bool)
    if np.any(ratio[same & known] > 1.0 + gap):
        return False
    for a, b in combinations(sorted(set(labels)), 2):
        pairs = np.ix_(lab == a, lab == b)
        cross = ratio[pairs][known[pairs]]
        if cross.size == 0 or float(np.median(cross)) <= 1.0 + gap:
            return False
    return True


def _far_apart(lat: np.ndarray, ranks: list[int], labels: list[int], among: list[int], clear_us: float) -> bool:
    """Whether the latency clusters ``labels`` (of ``ranks``) keep every two of the ``among``
    ranks they separate more than ``clear_us`` apart, in both directions."""
    label = dict(zip(ranks, labels, strict=True))
    both = np.minimum(lat, lat.T)
    cross = [both[i, k] for i in among for k in among if i < k and label.get(i) != label.get(k)]
    return bool(cross) and min(cross) > clear_us


def _margins(dist: np.ndarray, ranks: list[int], groups: list[list[int]]) -> dict[int, float]:
    """Each clustered rank's mean distance to the nearest other group over that to its own."""
    where = {r: k for k, r in enumerate(ranks)}
    out = {}
    for g, members in enumerate(groups):
        for i in members:
            row = dist[where[i]]
            own = [row[where[k]] for k in members if k != i]
            far = min(float(np.mean([row[where[k]] for k in other])) for h, other in enumerate(groups) if h != g)
            out[i] = far / max(float(np.mean(own)) if own else 1.0, 1e-9)
    return out


def _merge_groups_by_host(groups: list[list[int]], hosts: Sequence[str]) -> list[list[int]]:
    """Groups joined wherever two of their ranks share a host (never split)."""
    # scipy is imported where it is used: a rank that never clusters does not pay for it.
    from scipy.cluster.hierarchy import DisjointSet

    ranks = [i for members in groups for i in members]
    union = DisjointSet(ranks)
    for members in groups:
        for i in members[1:]:
            union.merge(members[0], i)
    first: dict[str, int] = {}
    for i in ranks:
        union.merge(first.setdefault(hosts[i], i), i)
    return [sorted(subset) for subset in union.subsets()]


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
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

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
