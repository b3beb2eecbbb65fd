"""The ``RackFit`` record and the placement of *blind* ranks (a NIC slow both ways) that
the clustering of ``racks`` leaves out: their candidate groups, ruled out by their flows
and by queues their pings wait in, and the placement phase's verdicts from the pings the
probe sends during its egress blasts (``place_blind``, ``held``, ``filled``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.sparse.csgraph import connected_components

from dssync.topology.matrices import (
    CONFIDENT_MARGIN,
    CROSS_RATIO,
    WAIT_RATIO,
    clear_latency,
    nearest_cost,
    queued_ranks,
    renumber_racks,
    square_matrix,
)


@dataclass
class RackFit:
    """What the measurements say about the racks, before and after the placement phase.

    ``groups`` are the racks of the *clear* ranks (those with at least one direction whose
    NIC is not itself the bottleneck), clustered on their paths. A *blind* rank's NIC is
    slow both ways, so every flow of it is slow alike and its paths show nothing; it is not a
    rack of its own and not a member of whichever rack looks closest: ``candidates`` lists the
    groups its flows did not rule out (a flow well below what both NICs allow crossed an
    uplink), and ``placed`` what the placement phase decided (``place_blind``). A blind rank
    with no decision is ``unplaced`` and gets a rack of its own in ``racks()``: that never puts
    a cross-rack flow where the plan thinks there is none.
    """

    n: int
    groups: list[list[int]]
    blind: list[int] = field(default_factory=list)
    candidates: dict[int, list[int]] = field(default_factory=dict)  # blind rank -> group indices
    placed: dict[int, int | None] = field(default_factory=dict)  # blind rank -> group index, None: alone
    evidence: dict[int, str] = field(default_factory=dict)
    margins: dict[int, float] = field(default_factory=dict)  # clear rank -> separation from the next group
    metric: str = "none"
    #: blind ranks placed only because every other group was ruled out: a rack of their own
    #: was never ruled out, so the probe's pings test them again, and until then they are unsure
    tentative: set[int] = field(default_factory=set)
    #: no metric separated cleanly, yet one of them clustered the ranks into several racks:
    #: the single rack written is a fallback, not a finding, and every rank is unsure
    split_unseparated: bool = False
    #: ranks whose rack-mates change when the probe's racks are fitted with one pass over the pairs left out
    #: (``dssync.probing.probe.settle_racks``): unsure, whatever their margins
    unsettled: set[int] = field(default_factory=set)
    #: ranks that another place explains the pairs phase's concurrent flows nearly as well
    #: or better (``dssync.topology.replay``): unsure, whatever their margins
    unexplained: set[int] = field(default_factory=set)
    #: blind ranks latency placed in a group though their pings to another group waited: the
    #: latency clusters may be that group's queue alone, which a rack of their own waits for
    #: as well (``place_by_latency``): unsure until the telling rounds place them
    queue_placed: set[int] = field(default_factory=set)
    #: clear ranks taken out of a group whose other members' pings to them wait in a queue
    #: (``split_across_queues``): on a rack of their own, unsure
    queue_split: set[int] = field(default_factory=set)

    @property
    def unplaced(self) -> list[int]:
        return sorted(j for j in self.blind if j not in self.placed)

    def racks(self) -> list[int]:
        labels = [-1] * self.n
        for g, members in enumerate(self.groups):
            for i in members:
                labels[i] = g
        fresh = len(self.groups)
        for j in self.blind:
            where = self.placed.get(j)
            if where is None:
                labels[j] = fresh
                fresh += 1
            else:
                labels[j] = where
        return renumber_racks(labels)

    def confidence(self) -> dict[str, Any]:
        """The ``confidence`` record of topology.json (racks numbered as in ``racks()``)."""
        racks = self.racks()
        by_group = {g: racks[members[0]] for g, members in enumerate(self.groups) if members}
        boundaries = []
        for a in range(len(self.groups)):
            for b in range(a + 1, len(self.groups)):
                ranks = [i for i in self.groups[a] + self.groups[b] if i in self.margins]
                sep = min((self.margins[i] for i in ranks), default=float("inf"))
                boundaries.append({"racks": [by_group[a], by_group[b]],
                                   "separation": round(sep, 3) if np.isfinite(sep) else None,
                                   "confident": bool(sep >= CONFIDENT_MARGIN)})
        unsure = sorted({i for i, m in self.margins.items() if m < CONFIDENT_MARGIN and len(self.groups) > 1}
                        | self.tentative | self.unsettled | self.unexplained | self.queue_placed | self.queue_split
                        | (set(range(self.n)) if self.split_unseparated else set()))
        return {
            "metric": self.metric,
            "threshold": CONFIDENT_MARGIN,
            "boundaries": boundaries,
            "placed": [{"rank": j, "rack": racks[j], "how": self.evidence.get(j, "")}
                       for j in sorted(self.placed)],
            "unplaced": self.unplaced,
            "unsure": unsure,
            "one_rack_guess": self.split_unseparated,
            "unsettled": sorted(self.unsettled),
            "unexplained": sorted(self.unexplained),
            "queue_placed": sorted(self.queue_placed),
            "queue_split": sorted(self.queue_split),
            "confident": not self.unplaced and not unsure,
        }


def rule_out_by_queue(fit: RackFit, lat: np.ndarray, clear_us: float) -> None:
    """A blind rank's candidate groups narrowed by queues that other traffic keeps full.

    A slow NIC does not slow a small message, so a blind rank's pings still show its paths.
    If its pings to some member of one group are clear (latency at most ``clear_us``) and to
    every member of another group wait, a full queue sits on its paths to the second group
    and none on its paths to the first (the fastest ping counts, because a busy host only
    ever delays one, and a member whose own NIC is queued does not speak for its rack). Its
    NIC is then not queued (the clear pings pass it), and a rack-mate's path crosses nothing
    else, so it is not in the second group. (Whether it is in the first, or on a rack of its own with the queue at the
    second group's uplink, pings at rest cannot say; the blasts' pings do.)
    """
    if len(fit.groups) < 2:
        return
    sym = nearest_cost(lat)[0]
    for j in fit.blind:
        if j in fit.placed or not fit.candidates.get(j):
            continue
        typical = [float(min(sym[j, k] for k in members)) for members in fit.groups]
        if any(t <= clear_us for t in typical):
            waits = [g for g, t in enumerate(typical) if t > clear_us]
            fit.candidates[j] = [g for g in fit.candidates[j] if g not in waits]
            if waits:
                fit.evidence[j] = "latency: its pings to group(s) " + ", ".join(map(str, waits)) + " wait in a queue"


def rack_behind_queue(fit: RackFit, bw: np.ndarray, lat: np.ndarray, clear_us: float) -> None:
    """Blind ranks placed behind a standing queue their pings and flows show.

    Ranks whose pings to each other are clear (at most ``clear_us``), and to every other
    rank wait, share a side of a queue: an island of clear pings, which no round trip
    leaves without waiting. Which side the queue sits on, pings cannot say (a round trip
    crosses it either way), but the flows can: another job's streams out of a rack leave
    its own flows out below half of what they get in (``CROSS_RATIO``, the median over the
    ranks outside each way: now and then one flow meets a lull in that job's streams),
    where a queue on the far side slows them in. So where some rank of the island sends out
    at below half of what it takes in, the queue is the island's uplink and the island is
    one rack: its blind ranks join the one group in it, or, where it holds no group, are a
    rack of their own. (A rack of two behind another job's streams, one of them behind a
    slow NIC: both blind, the pairs left each a rack of its own, and the pings between them
    are as clear as inside any rack.) An island holding part of a group, or several, is
    left alone; ranks behind a queue at their own NIC wait to each other too. A pair's ping
    is its faster leader's (a busy host only ever delays one).
    """
    sym = np.minimum(lat, lat.T)
    near = sym <= clear_us
    np.fill_diagonal(near, False)
    count, island = connected_components(near, directed=False)
    unplaced = set(fit.unplaced)
    for c in range(count):
        members = [i for i in range(fit.n) if island[i] == c]
        homeless = sorted(unplaced & set(members))
        outside = [k for k in range(fit.n) if island[k] != c]
        if len(members) < 2 or not homeless or not outside:
            continue
        groups = [g for g, grp in enumerate(fit.groups) if set(grp) & set(members)]
        if len(groups) > 1 or any(not set(fit.groups[g]) <= set(members) for g in groups):
            continue
        if not any(np.median(bw[i, outside]) < CROSS_RATIO * np.median(bw[outside, i]) for i in members):
            continue
        if not groups:
            fit.groups.append(homeless)
            groups = [len(fit.groups) - 1]
        for j in homeless:
            fit.placed[j] = groups[0]
            fit.evidence[j] = ("its pings wait to every rank but ranks "
                               + ", ".join(str(m) for m in members if m != j)
                               + ", which send out below half of what they take in: one rack behind its uplink's queue")


def place_behind_standing_queue(fit: RackFit, latency_us: Any, clear_us: float, slow_groups: Sequence[int]) -> RackFit:
    """Place a blind rank behind its rack's standing queue: another job's flows that keep
    group ``g``'s uplink busy (``slow_groups``: the flows found that uplink slow) hold every
    round trip between a member of ``g`` and the rest of the world, whichever way they go.
    A blind rank whose pings to ``g`` are clear (at most ``clear_us`` one way) while its
    pings to every other group wait, as ``g``'s members' pings to every other group do,
    reaches ``g`` without crossing that queue: it is in ``g``. (Outside, its pings to ``g``
    would wait; a queue at its own NIC would hold them all.) The blasts cannot place it: its
    ping out of ``g`` waits at rest already, and a group of two has no member to spare."""
    if len(fit.groups) < 2:
        return fit
    sym = nearest_cost(square_matrix("latency_us", latency_us, fit.n))[0]
    for j in fit.blind:
        if j in fit.placed and j not in fit.tentative:
            continue
        clear_to = [g for g, members in enumerate(fit.groups) if min(sym[j, k] for k in members) <= clear_us]
        if len(clear_to) != 1 or clear_to[0] not in slow_groups or clear_to[0] not in fit.candidates.get(j, []):
            continue
        g = clear_to[0]
        others = [k for h, members in enumerate(fit.groups) if h != g for k in members]
        if all(sym[i, k] > clear_us for i in fit.groups[g] for k in others):
            fit.placed[j] = g
            fit.tentative.discard(j)
            fit.evidence[j] = (f"its pings reach group {g} clear and wait to every other group, as its members' "
                               "do behind their uplink's standing queue")
    return fit


def place_by_latency(fit: RackFit, lat_labels: dict[int, int], lat: np.ndarray | None = None,
                      clear_us: float = float("inf")) -> None:
    """Where latency separates racks the same way bandwidth does on the clear ranks, it
    places the blind ranks too (a slow NIC does not slow a small message). ``lat_labels``:
    the latency cluster of each rank it clustered (not those behind a queue of their own).
    With one group of clear ranks there is no boundary for latency to agree on, and a blind
    rank's clear pings to the group say nothing: an outsider's are as clear where no queue
    sits between (1,3,1 with another job leaving rack 1, whose queue had drained while the
    pings ran: the rack of one came out inside rack 1).

    A blind rank placed in a group whose pings (``lat``, one-way µs) to another group wait
    (above ``clear_us`` every time) is ``queue_placed``, unsure: latency that parts two
    groups is a queue between them, which the rank's pings cross as they would from a rack
    of its own. On the emulated racks, whose hops add no delay of their own, every latency
    placement of the recorded sweeps came with such a wait; on a 1,2,2 with rack 1's uplink
    busy, the rack of one (its NIC at 0.4 Gbit/s) was placed with rack 2 and written
    confident."""
    if len(fit.groups) < 2:
        return
    label_of = {}
    for g, members in enumerate(fit.groups):
        labels = {lat_labels.get(i) for i in members}
        if len(labels) != 1 or None in labels or labels & set(label_of):
            return  # latency disagrees with bandwidth: it does not speak for the blind ranks
        label_of[labels.pop()] = g
    for j in fit.blind:
        if j not in fit.placed and j in lat_labels:
            fit.placed[j] = label_of.get(lat_labels[j])
            fit.evidence[j] = "latency" if fit.placed[j] is not None else "latency: apart from every rack"
            if lat is not None and fit.placed[j] is not None and any(min(max(lat[j, k], lat[k, j]) for k in members) > clear_us
                                       for g, members in enumerate(fit.groups) if g != fit.placed[j]):
                fit.queue_placed.add(j)
                fit.evidence[j] += ": its pings to another rack waited, as from a rack of its own"


def rule_out(fit: RackFit, bw: np.ndarray, hosts: Sequence[str] | None) -> None:
    """Candidates of each blind rank; place those that the pairs leave one group for."""
    off = bw.copy()
    np.fill_diagonal(off, 0.0)
    out_best, in_best = off.max(axis=1), off.max(axis=0)

    def crossed(a: int, b: int) -> bool:
        """A flow between ``a`` and ``b`` ran below CROSS_RATIO of what both NICs allow."""
        return any(min(out_best[s], in_best[d]) > 0 and off[s, d] < CROSS_RATIO * min(out_best[s], in_best[d])
                   for s, d in ((a, b), (b, a)))

    for j in fit.blind:
        host_mate = next(((g, k) for g, members in enumerate(fit.groups) for k in members
                          if hosts is not None and hosts[j] == hosts[k]), None)
        if host_mate is not None:
            fit.placed[j] = host_mate[0]  # one host, one rack
            fit.evidence[j] = f"same host as rank {host_mate[1]}"
            continue
        left = [g for g, members in enumerate(fit.groups) if not any(crossed(j, k) for k in members)]
        fit.candidates[j] = left
        if len(left) == 1 and len(fit.groups) > 1:
            fit.placed[j] = left[0]
            fit.tentative.add(j)
            fit.evidence[j] = "its flows to every other rack crossed an uplink"
    # Blind ranks whose flows crossed an uplink to every clear rack sit in racks of blind ranks
    # only: those whose flows to each other crossed nothing are one rack.
    homeless = [j for j in fit.blind if j not in fit.placed and not fit.candidates.get(j) and len(fit.groups) > 0]
    while homeless:
        j = homeless.pop(0)
        mates = [k for k in homeless if not crossed(j, k)]
        mates = [k for k in mates if all(not crossed(k, m) for m in mates if m != k)]
        if not mates:
            continue  # alone, as far as the pairs tell: the placement phase may still say so
        fit.groups.append(sorted([j, *mates]))
        for k in [j, *mates]:
            fit.placed[k] = len(fit.groups) - 1
            fit.evidence[k] = "its flows crossed an uplink to every rack but that of ranks " + ", ".join(
                str(m) for m in [j, *mates] if m != k)
            if k in homeless:
                homeless.remove(k)


def reassess_blind(fit: RackFit, bandwidth_gbps: Any, latency_us: Any, hosts: Sequence[str] | None) -> RackFit:
    """The blind ranks worked out again on ``fit.groups`` after its clear ranks moved (the
    replay's racks): their candidates and what the pairs alone placed (``rule_out``,
    ``rule_out_by_queue``) named the groups before the move. Blind ranks leave the groups
    they were placed in; what placed them is judged again on the new groups, and the
    blasts' pings place the rest as before."""
    blind = set(fit.blind)
    fit.groups = [g for g in ([i for i in members if i not in blind] for members in fit.groups) if g]
    for j in blind:
        fit.placed.pop(j, None)
        fit.candidates.pop(j, None)
        fit.evidence.pop(j, None)
    fit.tentative -= blind
    lat, bw = np.asarray(latency_us, dtype=float), square_matrix("bandwidth_gbps", bandwidth_gbps)
    clear_us = clear_latency(lat)
    rule_out(fit, bw, hosts)
    rule_out_by_queue(fit, lat, clear_us)
    rack_behind_queue(fit, bw, lat, clear_us)
    return fit


def held(ping: tuple[float, float] | None, clear_us: float, full: bool) -> bool | None:
    """Whether a ping ``(during, idle)`` waited behind a blast's queue (µs one way): it was
    clear at rest (at most ``clear_us``) and not during the blast (above both ``clear_us``
    and ``WAIT_RATIO`` times its idle time). ``None`` when the ping cannot tell: none was
    sent, it was behind a queue of other traffic at rest already, or the blast's queue was
    not known to be ``full`` (then a wait may be another queue's: another job's flows
    across an uplink now and then drain its queue, so one fast ping at rest proves little,
    and a blast that its receivers hold back fills no queue at its own uplink)."""
    if ping is None or not full or not 0 < ping[1] <= clear_us:
        return None
    return bool(ping[0] > max(clear_us, WAIT_RATIO * ping[1]))


def filled(spare: tuple[float, float], clear_us: float, uplink_slow: bool) -> bool:
    """Whether a blast's queue was full, from its spare member's ping out ``(during, idle)``
    (µs one way): it waited (``held``). A ping behind a queue at rest already cannot say
    whether the blast filled one: the queue is the group's own uplink's, full blast or not,
    when the pairs found that uplink slow (``uplink_slow``: another job's flows leave the
    rack), and may be the far side's otherwise (the echo's rack's), which tells nothing."""
    verdict = held(spare, clear_us, True)
    return verdict if verdict is not None else spare[0] > clear_us and uplink_slow


def place_blind(fit: RackFit, delays: dict[int, dict[int, dict[str, tuple[float, float]]]],
                full: dict[int, bool], clear_us: float = float("inf")) -> RackFit:
    """Decide the blind ranks from the queues of the probe's egress blasts (``dssync.probing.probe``).

    During the blast of group ``g`` its clear members send across at once, so a queue fills
    at ``g``'s uplink, the link they all share (``full[g]``: it did). Every undecided blind
    rank meanwhile pings, with small messages, a quiet rank outside ``g`` (``"out"``) and,
    where ``g`` has a member to spare, a quiet member of ``g`` (``"in"``): ``delays[j][g][k]``
    is ``(one-way µs during the blast, its lower quartile; one-way µs between the same ranks
    at rest, the fastest)``. A round trip crosses ``g``'s uplink queue outwards exactly when one
    end is in ``g`` and the other is not: so a ping to the outside waits (``WAIT_RATIO``
    times its idle time or more; on the emulated racks 1 to 2.5 ms against 0.15 to 0.3 ms)
    if ``j`` is in ``g``, and a ping to the inside waits if it is not. A slow NIC does not
    slow a small message, so this sees the path of a rank whose flows cannot. What a ping
    can and cannot tell is ``held``'s rule; where the two pings of a group disagree, the
    group says nothing.

    ``j`` is placed in the one candidate group whose pings say it is a member; on a rack of
    its own when every candidate's pings say it is not, unless another blind
    rank also came out alone (two such could share a rack that no blast tests). Anything
    else stays unplaced.
    """
    alone = []
    for j in fit.blind:
        if (j in fit.placed and j not in fit.tentative) or not delays.get(j):
            continue
        verdicts: dict[int, bool | None] = {}
        for g in fit.candidates.get(j, []):
            pings = delays[j].get(g, {})
            out = held(pings.get("out"), clear_us, full.get(g, False))
            inside = held(pings.get("in"), clear_us, full.get(g, False))
            says = {v for v in (out, None if inside is None else not inside) if v is not None}
            verdicts[g] = says.pop() if len(says) == 1 else None
        inside_of = [g for g, v in verdicts.items() if v is True]
        if len(inside_of) == 1:
            fit.placed[j] = inside_of[0]
            fit.tentative.discard(j)
            fit.evidence[j] = f"its pings crossed group {inside_of[0]}'s uplink queue as a member's do"
        elif verdicts and all(v is False for v in verdicts.values()):
            alone.append(j)
    if len(alone) == 1:
        fit.placed[alone[0]] = None
        fit.tentative.discard(alone[0])
        fit.evidence[alone[0]] = "its pings crossed every rack's uplink queue as an outsider's do"
    # A placement the flows made only by ruling out every other group, which the pings did
    # not confirm, is withdrawn: a rack of its own was never ruled out, and an unplaced rank
    # (a rack of its own, unsure) puts no cross-rack flow where the plan thinks there is none.
    for j in sorted(fit.tentative):
        if fit.placed.get(j) is not None:
            del fit.placed[j]
            fit.tentative.discard(j)
            fit.evidence[j] = ("its flows ruled out every rack but one, its pings did not confirm that one, "
                               "and a rack of its own was never ruled out")
    return fit


def split_across_queues(fit: RackFit, latency_us: Any) -> set[int]:
    """Ranks taken out of a rack that a queue parts from its other members; the ranks moved.

    A round trip between two rack-mates crosses their NICs and the rack's switch, no
    uplink. A queue of other traffic on it (a ping ``WAIT_RATIO`` times the clear latency
    or more, the two directions' mean) is then at one of their NICs, and a rank behind a
    queue at its own NIC waits to everyone (``queued_ranks``, left out here). So where the
    members of a rack of three or more fall into parts whose pings to each other wait, and
    one part (two ranks or more, the largest) pings clear within, the others are behind an
    uplink queue from it. Each such part whose every rank also pings two or more ranks
    outside the rack clear (no queue of its own, which a lull of the other job's can hide
    from one ping) becomes a rack of its own, and its ranks are unsure (``queue_split``).
    The flows can join them: on a 1,4,2 with another job on rack 2's uplink, the rack of
    one's flows into rack 2 got 0.5-0.7 Gbit/s and its flows to rack 1 0.13 (behind a 150
    Mbit/s uplink), and the probe wrote it into rack 2, confident, while its pings to rack 2
    waited 2.2-2.7 ms against 55-90 us between rack 2's two workers. A blind rank (its NIC
    slow both ways) moves as a clear one does: a slow NIC does not slow a small message."""
    lat = square_matrix("latency_us", latency_us)
    sym = nearest_cost(lat)[0]
    clear_us = clear_latency(lat)
    queued = set(queued_ranks(lat))
    racks = fit.racks()
    moved: set[int] = set()
    for g in range(len(fit.groups)):
        if not fit.groups[g]:
            continue
        rack = racks[fit.groups[g][0]]
        ranks = [i for i in range(fit.n) if racks[i] == rack and i not in queued]
        if len(ranks) < 3:
            continue
        count, label = connected_components(sym[np.ix_(ranks, ranks)] < WAIT_RATIO * clear_us, directed=False)
        sizes = np.bincount(label)
        if count == 1 or sizes.max() < 2 or (sizes == sizes.max()).sum() > 1:
            continue
        outside = [k for k in range(fit.n) if racks[k] != rack and k not in queued]
        parts = [[ranks[a] for a in np.flatnonzero(label == part)] for part in range(count)]
        kept = parts.pop(int(np.argmax(sizes)))
        apart = [part for part in parts if all(sum(sym[i, k] <= clear_us for k in outside) >= 2 for i in part)]
        if not apart:
            continue
        kept += [i for part in parts if part not in apart for i in part]
        # the rack's other ranks (queued ones) stay where they were; of the new racks, the one
        # with the group's clear ranks keeps its index
        split = sorted([kept, *apart], key=lambda part: not set(part) & set(fit.groups[g]))
        for index, part in enumerate(split):
            h = g if index == 0 else len(fit.groups)
            clear = [i for i in part if i not in fit.blind]
            if index == 0:
                fit.groups[g] = sorted([*(clear or part), *(i for i in fit.groups[g] if i in queued)])
            elif clear or len(part) > 1:
                fit.groups.append(sorted(clear or part))
            for j in part:
                if j in fit.blind:
                    fit.placed[j] = None if not clear and len(part) == 1 else h
                    fit.evidence[j] = "its pings to its rack-mates waited in an uplink's queue"
                    fit.tentative.discard(j)
        moved |= {i for part in apart for i in part}
    fit.queue_split |= moved
    return moved
