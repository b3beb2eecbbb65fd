"""Contention classification: slow NICs (paper Fig. 6) and slow rack uplinks (Fig. 5)
from the pairwise flows, the concurrent aggregates and the fans of the probe
(``classify_contention``, ``nic_suspects``, ``fan_clears``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dssync.topology.matrices import DEFAULT_SLOW_RATIO, FAN_RATIO, loaded_direction, square_matrix


def _nic_estimates(bw: np.ndarray, hosts: Sequence[str] | None, queued: Sequence[int] = (),
                   racks: Sequence[int] | None = None) -> dict[int, tuple[float, float]]:
    """Per rank, its best outgoing and best incoming flow through its NIC: what the NIC
    carried at least, each way. Flows between ranks of one host never touch a NIC (loopback
    measures the CPU) and are left out; a rank with none off its host either way is not judged.

    A ``queued`` rank with two rack-mates or more (``racks``) counts, in its loaded direction
    (``loaded_direction``), the median of its flows with those mates that are not queued themselves,
    not its best flow: a rack-mate's flow crosses only the two NICs, so where another job's
    flows hold this one, most of those flows are slow, and the best ran in a lull of theirs.
    (With one rack-mate, that mate may be the queued one: a rank of a rack of two whose mate's
    NIC and uplink both hold another job's queue waits on every ping too, with a clear NIC.)
    A queued mate does not speak for this rank's NIC: its own NIC holds the flow back, and a
    median taken over a clear mate's fast flow and a queued mate's slow one flags a clear
    NIC."""
    through_nic = bw.copy()
    np.fill_diagonal(through_nic, 0.0)
    if hosts is not None:
        same_host = np.equal.outer(np.asarray(hosts, dtype=object), np.asarray(hosts, dtype=object))
        through_nic[same_host] = 0.0
    best = {i: (float(through_nic[i].max()), float(through_nic[:, i].max()))
            for i in range(bw.shape[0]) if through_nic[i].any() and through_nic[:, i].any()}
    for i in queued if racks is not None else ():
        mates = [j for j in range(len(racks)) if racks[j] == racks[i] and j != i]
        clear = [j for j in mates if j not in queued]
        if i in best and len(mates) >= 2 and clear:
            out, into = best[i]
            if loaded_direction(bw, i) == "out":
                best[i] = (min(out, float(np.median(through_nic[i, clear]))), into)
            else:
                best[i] = (out, min(into, float(np.median(through_nic[clear, i]))))
    return best


def nic_suspects(bandwidth_gbps: Any, hosts: Sequence[str] | None = None,
                 slow_ratio: float = DEFAULT_SLOW_RATIO, queued: Sequence[int] = (),
                 racks: Sequence[int] | None = None) -> dict[int, list[str]]:
    """Ranks whose NIC the pairwise flows call slow, and the directions (``"out"``, ``"in"``)
    in which their best flow is below ``slow_ratio`` of the other ranks' median estimate.

    Pairs alone cannot tell a slow NIC from a healthy one whose every peer sits behind a slow
    link of its own (a rack of one beside a slow uplink and a slow NIC): both see only slow
    flows. ``fan_clears`` tells them apart from a fan of flows in those directions.
    """
    best = _nic_estimates(square_matrix("bandwidth_gbps", bandwidth_gbps), hosts, queued, racks)
    worse = {i: min(pair) for i, pair in best.items()}
    if len(worse) <= 2:
        return {}
    out: dict[int, list[str]] = {}
    for i in slow_keys(worse, slow_ratio):
        level = slow_ratio * float(np.median([v for k, v in worse.items() if k != i]))
        out[i] = [d for d, v in zip(("out", "in"), best[i], strict=True) if v < level]
    return out


def fan_clears(bandwidth_gbps: Any, racks: Sequence[int], rank: int, direction: str,
               rates: dict[int, float], ratio: float = FAN_RATIO) -> bool:
    """Whether a fan of ``rank`` (its flows to every peer in ``rates`` at once, or from them
    for ``direction == "in"``, ``{peer: Gbit/s}``) shows that its NIC does not bound its flows.

    What the flows would carry if only their paths bound them: per other rack the best single
    flow to it (its members share an uplink), per rack-mate its own single flow (each is
    bounded by its own NIC). The NIC is clear when the fan carried at least ``ratio`` of that
    sum and there were at least two such bottlenecks (with one, the sum says nothing about the
    NIC). A NIC shared with another job's streams also carries more with more flows (TCP
    shares per flow), so ``dssync probe`` runs a fan only for a rank with a clear ping (no
    standing queue at its NIC).
    """
    carried = fan_fraction(bandwidth_gbps, racks, rank, direction, rates)
    return carried is not None and carried >= ratio


def fan_fraction(bandwidth_gbps: Any, racks: Sequence[int], rank: int, direction: str,
                 rates: dict[int, float]) -> float | None:
    """What a fan carried over what its flows would carry if only their paths bound them
    (``fan_clears``); None with fewer than two bottlenecks, where the sum says nothing."""
    bw = square_matrix("bandwidth_gbps", bandwidth_gbps)
    single = bw[rank] if direction == "out" else bw[:, rank]
    alone: dict[Any, float] = {}
    for peer in rates:
        key = ("mate", peer) if racks[peer] == racks[rank] else ("rack", racks[peer])
        alone[key] = max(alone.get(key, 0.0), float(single[peer]))
    if len(alone) < 2 or sum(alone.values()) <= 0:
        return None
    return float(sum(rates.values())) / sum(alone.values())


def _ratios(values: dict[int, float]) -> dict[int, float]:
    """Each key's value over the median of the other keys' values (others at a median of 0,
    as a blast whose flows all failed, leave a value far above); nothing for one key."""
    if len(values) < 2:
        return {}
    out = {}
    for k, v in values.items():
        others = float(np.median([w for j, w in values.items() if j != k]))
        out[k] = v / others if others > 0 else (float("inf") if v > 0 else 1.0)
    return out


def slow_keys(values: dict[int, float], ratio: float = DEFAULT_SLOW_RATIO) -> list[int]:
    """Keys whose value is below ``ratio`` times the median of the *other* keys' values."""
    return [k for k, r in _ratios(values).items() if r < ratio]


def classify_contention(
    bandwidth_gbps: Any,
    racks: Sequence[int],
    uplink_gbps_by_rack: Sequence[float] | None = None,
    *,
    hosts: Sequence[str] | None = None,
    slow_ratio: float = DEFAULT_SLOW_RATIO,
    fans: dict[int, dict[str, dict[int, float]]] | None = None,
    queued: Sequence[int] = (),
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
    three judged ranks are needed for a median of "the others" to mean anything. ``fans``
    (``{rank: {direction: {peer: Gbit/s}}}``, flows at once in each direction in which the
    rank looked slow, see ``nic_suspects``) clear a rank whose every peer sat behind a slow
    link of its own: its fans carried what those links allow (``fan_clears``). A ``queued``
    rank (``queued_ranks``: even its fastest ping waits) with two rack-mates or more is
    judged in its loaded direction by its median flow with them (``_nic_estimates``).

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
    its uplink. A rack of one's pairwise egress is one flow; a fan out of its member (see
    ``fans``) is what its uplink carried at once and counts when larger. The figure reported
    for a slow uplink is ``uplink_gbps_by_rack[r]`` when given (what the rack gets when all of
    it sends across at once, as ``dssync probe`` measures; NaN for a rack that had no blast),
    else the pairwise figure. The
    aggregate also decides when the rack's pairwise egress is held back, below ``slow_ratio``
    of its own members' NIC estimates (the rack's NICs carry more than its cross-rack flows
    got): then the rack is slow when its aggregate is below ``slow_ratio`` of the others'.
    With two racks the other rack's pairwise egress is the contended uplink's *ingress*, and
    a single flow in it is held back too, by its ACKs queueing behind the background traffic
    and its window growing over the longer round trip, so both racks' pairwise egress falls
    far below the NICs' while only the contended rack's aggregate does. Without contention
    pairwise flows can be held back as well (the cross-rack pairs of a round share the
    uplink); there the aggregates agree and nothing is flagged. With
    ``hosts``, a rack that shares a host with another rack is not judged (its cross-rack
    flows need not leave the machine). Racks slowed alike: where no rack stands out and
    every rack's aggregate is below ``slow_ratio`` of what one NIC sends (or its clear
    members' NICs, if less; a NIC's way out, since an aggregate is a rack's egress and a
    NIC's way in can be held back by the uplinks its peers send through), every uplink is
    flagged: between two racks one uplink rate-limited both
    ways slows every cross flow whichever rack's it is, so flagging both is the same network,
    and flagging neither would call a slow network clear. ``unsure_flags`` says which flags
    are too close to call.
    """
    j = _judge(bandwidth_gbps, racks, uplink_gbps_by_rack, hosts=hosts, slow_ratio=slow_ratio, fans=fans,
               queued=queued)
    return {
        "uplinks": [{"rack": r, "bandwidth_gbps": round(j.report[r], 4)} for r in j.slow_uplinks],
        "nics": [{"rank": i, "bandwidth_gbps": round(j.nic_gbps[i], 4)} for i in j.slow_nics],
    }


@dataclass
class _Judgement:
    """What ``classify_contention`` weighed: the NIC estimates, the uplinks' pairwise egress,
    aggregates and NIC levels, and what it flagged."""

    slow_ratio: float
    members: dict[int, list[int]]
    nic_gbps: dict[int, float]
    slow_nics: list[int]
    fan_cleared: set[int]
    uplink: dict[int, float]
    aggregate: dict[int, float]
    nic_level: dict[int, float]
    slow_uplinks: list[int]
    report: dict[int, float]
    absolute: dict[int, float]
    alike: bool


def _judge(bandwidth_gbps: Any, racks: Sequence[int], uplink_gbps_by_rack: Sequence[float] | None = None, *,
           hosts: Sequence[str] | None = None, slow_ratio: float = DEFAULT_SLOW_RATIO,
           fans: dict[int, dict[str, dict[int, float]]] | None = None, queued: Sequence[int] = ()) -> _Judgement:
    if not 0 < slow_ratio < 1:
        raise ValueError(f"slow_ratio must lie in (0, 1), got {slow_ratio}; 0.6 is the default")
    bw = square_matrix("bandwidth_gbps", bandwidth_gbps)
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
    best = _nic_estimates(bw, hosts, queued, racks)
    nic_gbps = {i: min(pair) for i, pair in best.items()}
    sends = {i: out for i, (out, _) in best.items()}  # what each NIC sent at least
    slow_nics = slow_keys(nic_gbps, slow_ratio) if len(nic_gbps) > 2 else []
    # a fan in every slow direction carried what the paths allow: not the NIC
    fan_cleared = {i for i, directions in (fans or {}).items()
                   if directions and all(fan_clears(bw, racks, i, d, rates) for d, rates in directions.items())}
    slow_nics = [i for i in slow_nics if i not in fan_cleared]
    # A cleared NIC carried its fan at once: that, not its best single flow (held back by
    # whatever its peers sit behind), is what it carries at least. A rank beside a slow-NIC
    # rack-mate and behind a slow uplink has no fast single flow, and the estimate would
    # excuse its rack's low aggregate as its NIC's.
    for i in fan_cleared:
        if i in best:
            out, into = best[i]
            fanned = {d: float(sum(rates.values())) for d, rates in fans[i].items()}
            nic_gbps[i] = min(max(out, fanned.get("out", 0.0)), max(into, fanned.get("in", 0.0)))
            sends[i] = max(out, fanned.get("out", 0.0))

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
    for i, directions in (fans or {}).items():
        # a rack of one's uplink carries exactly its member's flows: a fan out of a clear
        # member is what the uplink carried at once, more than any single flow shows
        if i not in slow_nics and "out" in directions and len(members[racks[i]]) == 1:
            uplink[racks[i]] = max(uplink.get(racks[i], 0.0), float(sum(directions["out"].values())))
    if hosts is not None:
        # A rack sharing a host with another rack has no uplink between them to judge.
        host_racks: dict[str, set[int]] = {}
        for host, rack in zip(hosts, racks, strict=True):
            host_racks.setdefault(host, set()).add(rack)
        shared = set().union(*(rs for rs in host_racks.values() if len(rs) > 1))
        uplink = {r: v for r, v in uplink.items() if r not in shared}
    slow_uplinks = slow_keys(uplink, slow_ratio) if len(uplink) > 1 else []
    # An uplink's figures are its rack's egress, so the NICs they are held against are what
    # the members' NICs send: a NIC's worse direction may be its way in, held back by the
    # uplinks its peers send through (on 2,2 with rack 0 behind a 400 Mbit/s uplink, rank 1
    # took in 0.3 Gbit/s at best, 0.5 from a fan, and sent 0.9 to its rack-mate, and its
    # rack's 0.41 Gbit/s blast looked like most of what its NIC carried).
    nic_level = {r: float(np.median([sends[i] for i in members[r] if i in clear and i in sends]
                                    or [np.nan])) for r in uplink}
    aggregate: dict[int, float] = {}
    if uplink_gbps_by_rack is not None and len(uplink) > 1:
        # The aggregate decides when the rack's pairwise egress is itself held back: below
        # slow_ratio of what the rack's own NICs carry (so neither its NICs nor the CPU are
        # what slows the rack when it sends all at once).
        held_back = {r for r in uplink if uplink[r] < slow_ratio * nic_level[r]}
        aggregate = {r: float(uplink_gbps_by_rack[r]) for r in uplink if np.isfinite(uplink_gbps_by_rack[r])}
        slow_uplinks = sorted(set(slow_uplinks) | (held_back & set(slow_keys(aggregate, slow_ratio))))
    # Each rack's aggregate against what one NIC sends (or its clear members' NICs, if
    # less): an uplink as fast as a NIC carries at least that when its rack sends at once.
    one_nic = float(np.median(list(sends.values()))) if sends else float("nan")
    absolute = {r: a / min(one_nic, sum(sends.get(i, 0.0) for i in members[r] if i in clear))
                for r, a in aggregate.items() if any(i in clear and i in sends for i in members[r])}
    # Every rack slow alike: none stands out from the others, yet each carried less than
    # 0.6 of a NIC. Where one link slows every cross flow (an uplink rate-limited both ways
    # between two racks), the racks cannot tell whose it is, and flagging all of them is
    # the same network (every flow of the job still meets the one slow rate).
    alike = (bool(absolute) and set(absolute) == set(uplink) and not slow_uplinks
             and all(v < slow_ratio for v in absolute.values()))
    if alike:
        slow_uplinks = sorted(uplink)
    # a rack whose blast had no flows (NaN) reports its pairwise figure
    report = dict(uplink)
    if uplink_gbps_by_rack is not None:
        report.update({r: float(uplink_gbps_by_rack[r]) for r in rack_ids if np.isfinite(uplink_gbps_by_rack[r])})
    return _Judgement(slow_ratio=slow_ratio, members=members, nic_gbps=nic_gbps, slow_nics=slow_nics,
                      fan_cleared=fan_cleared, uplink=uplink, aggregate=aggregate, nic_level=nic_level,
                      slow_uplinks=slow_uplinks, report=report, absolute=absolute, alike=alike)


#: A flag's measured ratio (what a NIC or uplink carried against the others, see
#: ``classify_contention``) within this factor of the 0.6 rule either way is too close to
#: call: on two cores a clear uplink's aggregate once read 0.36 against a busy one's 0.18
#: (ratio 0.49) and a busy one's 0.7 of a clear one's in another run.
UNSURE_FACTOR = 0.75


def unsure_flags(bandwidth_gbps: Any, racks: Sequence[int], uplink_gbps_by_rack: Sequence[float] | None = None,
                 **kwargs: Any) -> dict[str, list[int]]:
    """The uplinks (by rack) and NICs (by rank) whose flag ``classify_contention`` (same
    arguments) cannot be sure of: ``{"uplinks": [...], "nics": [...]}``.

    A flag is decided by a ratio against ``slow_ratio``; one that falls within
    ``UNSURE_FACTOR`` of it either way (0.45 to 0.8 for 0.6) is a coin toss on a noisy host:
    a busy CPU only ever lowers a rate, and two passes do not always lift it. An uplink
    whose pairwise egress is held back below its NICs is decided by its aggregate, else by
    its pairwise egress. An uplink left unflagged whose aggregate (all its members sending
    across at once) stayed at or below ``1 / UNSURE_FACTOR`` times ``slow_ratio`` of one
    NIC, or of its members' NICs if less, carried less (or nearly) than its NICs allow:
    either it is slow, or every rack it sent to is. Racks flagged together as slow alike
    (``classify_contention``), or nearly so, are sure only when each rack's aggregate is
    above ``1 / UNSURE_FACTOR`` times ``slow_ratio`` of the others' and under
    ``UNSURE_FACTOR`` times ``slow_ratio`` of a NIC. A NIC a fan cleared is sure; a flagged
    NIC with rack-mates, none of them clear, and no fan run is not (every flow of it crosses
    a mate's slow NIC or its uplink)."""
    j = _judge(bandwidth_gbps, racks, uplink_gbps_by_rack, **kwargs)
    s = j.slow_ratio
    low, high = UNSURE_FACTOR * s, s / UNSURE_FACTOR

    def close(ratio: float | None) -> bool:
        return ratio is not None and low <= ratio <= high

    nic_ratio = _ratios(j.nic_gbps) if len(j.nic_gbps) > 2 else {}
    nics = sorted(i for i, r in nic_ratio.items() if close(r) and i not in j.fan_cleared)
    # A flagged NIC whose fan came within UNSURE_FACTOR of clearing it: a busy host only
    # ever holds a fan back, so a fan that nearly carried what the paths allow may have been
    # a clear NIC's (a NIC that bounds its flows carries 1/2 of that sum with two
    # bottlenecks, less with more; a clear one all of it).
    fans = kwargs.get("fans") or {}
    for i in j.slow_nics:
        fractions = [fan_fraction(bandwidth_gbps, racks, i, d, rates) for d, rates in fans.get(i, {}).items()]
        if any(f is not None and UNSURE_FACTOR * FAN_RATIO <= f < FAN_RATIO for f in fractions):
            nics = sorted({*nics, i})
    # A flagged NIC none of whose rack-mates is clear, with no fan run: its pairs cannot tell
    # it from its mates' NICs and its uplink, since every flow of it crosses one of them (on
    # 5,2 with rack 1 behind a busy 200 Mbit/s uplink and rank 6 behind a 250 Mbit/s NIC,
    # rank 5's flows got 0.24 Gbit/s at best, all with rank 6, and its fan was not run for
    # the uplink's queue: its clear NIC was flagged, confidently, and the uplink was not).
    for i in j.slow_nics:
        mates = [k for k in j.members.get(racks[i], []) if k != i]
        if mates and all(k in j.slow_nics for k in mates) and i not in fans:
            nics = sorted({*nics, i})
    pairwise, aggregate = _ratios(j.uplink), _ratios(j.aggregate)
    if j.alike or (j.absolute and set(j.absolute) == set(j.uplink) and all(v < high for v in j.absolute.values())
                   and all(v >= s for v in aggregate.values())):
        # all slow alike, or near it: sure only when no rack stands out at all and every
        # rack is far below its NICs
        sure = (j.alike and all(v > high for v in aggregate.values())
                and all(v < low for v in j.absolute.values()))
        return {"uplinks": [] if sure else sorted(j.uplink), "nics": nics}
    uplinks = []
    for r in j.uplink:
        held_back = j.uplink[r] < s * j.nic_level[r]
        if r in aggregate and held_back:  # sure either way, or unsure (conflicting evidence included)
            p, a = pairwise.get(r, 1.0), aggregate[r]
            unsure = not (p < low or a < low) and not (p >= s and a > high)
        else:
            unsure = close(pairwise.get(r))
        if r not in j.slow_uplinks:  # at or near less than its NICs allow
            unsure |= j.absolute.get(r, 1.0) <= high
        if unsure:
            uplinks.append(r)
    return {"uplinks": sorted(uplinks), "nics": nics}
