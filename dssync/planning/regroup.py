"""Contention sensed from ds-sync's own group timings (paper section III-A, steps 3 and 4).

Pure functions: every rank gathers the same records and computes the same answer, so
all ranks switch to the same schedule at the same iteration without another vote.

A record is ``(step, group, seconds)``: how long this rank's group allreduce took, from
its call to its return. A member that arrives early also waits for the others to arrive,
and on a busy machine that wait (a straggler's compute, or a delay carried over from its
previous group) is often larger than the transfer itself: hundreds of ms against a few ms
measured on the emulated cluster. The member that arrives last waits for nothing but the
transfer, so a group's figure is the *shortest* time any member recorded, turned into an
effective bandwidth ``2 (n - 1) / n * bytes / seconds`` (the ring allreduce's lower bound:
each rank sends and receives ``2 (n - 1) / n`` of the bytes) so groups of different sizes compare.

A group is as fast as its slowest link, so the rules judge each link on the groups that
crossed it against the groups that did not, and a group through a link already found slow
is evidence about that link only (``_slow_links``):

* **NIC of rank i**: its intra-rack groups (all members in its rack). It is slow when its
  median group *and* its best group fall below ``slow_ratio`` of the groups it was not in
  (their median; for the best, the best of as many of them, ``best_of``, so a rank the plan
  left five groups is not held to another's best of twenty). A healthy worker has groups
  without a slow rack-mate; a worker whose NIC is shared is slow in every group it joins.
  Of several slow ranks, the one whose best group is slowest is taken first and its groups
  set aside: a rack-mate the plan always put with it then has nothing left against it.
* **Uplink of rack r**: the cross-rack groups that include a member of rack r, judged by
  their best against the best of as many cross-rack groups without rack r, and without the
  groups of a slow NIC. Under the static plan every cross-rack group holds every rack, so
  no uplink can be singled out from timings alone; the probe rounds
  (``planner.with_uplink_probes``) pair one rack apart now and then so that the others meet
  without it (three racks or more; with two, every cross-rack group holds both, and the flag
  stays as the topology gave it). NICs are judged first: while a window changes the NICs,
  it keeps the uplinks as they are.

**Pace** (``cross_rack_pace``, dssync's extension, see ``planner.paced``): when the
cross-rack groups are the slowest groups of the window, by their median against every
rank's median intra-rack group, racks exchange every ``k``-th round, ``k`` the smallest
pace at which the cross-rack group's extra time, spread over ``k`` rounds, is at most one
intra-rack group's time: ``ceil(t_cross / t_intra - 1)``, capped at ``max_pace``.

**Hysteresis.** Every decision needs evidence that persists, and clearing needs more than
setting:

* A link is set slow below ``slow_ratio`` (0.6) of the others and cleared only once it
  measures at least ``CLEAR_RATIO`` (0.8) of them by its *median* group: the plan isolates
  a flagged link, so its typical group is a fair measure, while its best of some twenty
  groups on a link it shares with TCP streams is a lucky moment. Between the two, the flag
  stays as it is.
* A link with fewer than ``MIN_GROUPS`` groups in the window is not judged and keeps its
  flag. The adjusted plan for three racks of three left two ranks one to four intra-rack
  groups a window, and their best of two flagged them slow in every recorded run.
* A paced plan returns to every round only once the racks' link measures clear (above),
  never by the ratio that set the pace: pacing itself lowers that ratio (fewer cross-rack
  groups, larger rack-local ones), and re-asking by it flapped the pace 1, 2, 1, 2 every two
  windows on the emulated three-rack cluster.
* **Two windows in a row** (``settle``): a flag is set when two windows in a row find its
  link slow and cleared when neither does; the pace leaves 1 when two in a row ask for more
  and returns to 1 when two in a row find the link clear. ``Shuffle`` counts the two
  windows from the plan in force (a window of the previous plan measured other groups), and
  changes the flags before the pace: windows that ran the plan for other flags do not
  pace the new one.

The rules were chosen against the recorded timings of ten three-rack runs and against
closed-loop runs on synthetic windows at this machine's noise (tests/unit/test_regroup_traces.py).
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Sequence

from dssync.topology.matrices import DEFAULT_SLOW_RATIO

__all__ = ["CLEAR_RATIO", "DEFAULT_MAX_PACE", "MIN_GROUPS", "Record", "Sensed", "best_of", "cross_rack_pace", "effective_bandwidth", "group_bandwidths",
           "group_times", "sense_contention", "settle"]

Record = tuple[int, tuple[int, ...], float]
#: A flagged link clears only once it measures at least this fraction of the others (it is
#: flagged below ``DEFAULT_SLOW_RATIO``): between the two, the flag stays as it is.
CLEAR_RATIO = 0.8
#: Groups a link needs in a window to be judged in it; fewer keep its flag as it is.
MIN_GROUPS = 5
#: One window's answer, or the plan's assumption: ((slow uplinks, slow NICs), pace).
Sensed = tuple[tuple[list[int], list[int]], int]


def group_times(records: Iterable[Record]) -> dict[tuple[int, tuple[int, ...]], float]:
    """``{(step, group): seconds}`` of the groups of two or more: a group's time is its last
    arrival's, the shortest any member recorded (the others also waited for it)."""
    shortest: dict[tuple[int, tuple[int, ...]], float] = {}
    for step, group, seconds in records:
        if len(group) >= 2:
            key = (int(step), tuple(sorted(group)))
            shortest[key] = min(shortest.get(key, math.inf), float(seconds))
    return shortest


def effective_bandwidth(members: int, seconds: float, nbytes: float = 1.0) -> float:
    """A ring allreduce's bytes per second on each link: ``2(n-1)/n`` of the payload in ``seconds``."""
    return 2 * (members - 1) / members * nbytes / seconds if seconds > 0 else math.inf


def group_bandwidths(records: Iterable[Record], nbytes: int) -> dict[tuple[int, tuple[int, ...]], float]:
    """``{(step, group): effective bytes/s}`` (``effective_bandwidth`` of ``group_times``)."""
    return {(step, group): effective_bandwidth(len(group), seconds, nbytes)
            for (step, group), seconds in group_times(records).items() if seconds > 0}


def sense_contention(records: Iterable[Record], racks: Sequence[int], nbytes: int, *,
                     current: tuple[Sequence[int], Sequence[int]] = ((), ()),
                     slow_ratio: float = DEFAULT_SLOW_RATIO, clear_ratio: float = CLEAR_RATIO,
                     min_groups: int = MIN_GROUPS) -> tuple[list[int], list[int]]:
    """``(racks with a slow uplink, ranks with a slow NIC)`` from one window of records.

    ``current`` is what the plan assumes now. A link not flagged is slow below
    ``slow_ratio`` of the others; a flagged one stays slow until it measures at least
    ``clear_ratio`` of them (``_flagged``). A group with a flagged NIC is evidence about
    that NIC only. A link the window cannot judge keeps its flag as it is: a rank with
    fewer than ``min_groups`` intra-rack groups of such evidence in the window, a rack with
    fewer than ``min_groups`` cross-rack groups, or a rack that was in every cross-rack group.
    """
    held_nics, held_uplinks = set(current[1]), set(current[0])
    bandwidth = group_bandwidths(records, nbytes)
    intra = [(set(group), bw) for (_, group), bw in bandwidth.items() if len({racks[r] for r in group}) == 1]
    nics = _slow_links(intra, held_nics, slow_ratio, clear_ratio, min_groups, by_best=False)
    if nics != held_nics:
        return sorted(held_uplinks), sorted(nics)  # NICs first: their groups would blur the uplinks'
    crossing = [{racks[r] for r in group} for (_, group) in bandwidth if len({racks[r] for r in group}) > 1]
    hidden = {rack for rack in set(racks) if crossing and all(rack in seen for seen in crossing)}
    cross = [(seen - hidden, bw) for (_, group), bw in bandwidth.items()
             if len(seen := {racks[r] for r in group}) > 1 and not nics.intersection(group)]
    uplinks = _slow_links(cross, held_uplinks, slow_ratio, clear_ratio, min_groups, by_best=True)
    return sorted(uplinks), sorted(nics)


def _slow_links(evidence: list[tuple[set[int], float]], held: set[int], slow_ratio: float, clear_ratio: float,
                min_groups: int, *, by_best: bool) -> set[int]:
    """The slow links by the window's groups, each ``(the links it crossed, bandwidth)``.

    A group is as fast as its slowest link, so a group through a slow link is evidence
    about that link only: a rack-mate the plan pairs with a slow NIC looks slow too. Each
    link is judged on its groups against the groups it was not in (``_scores``), both
    without the groups of the links already found slow. The links already flagged
    (``held``) are judged first; a held link clears only once it measures clear. A link
    not held is slow when both its typical and its best group are (unless ``by_best``,
    when its best alone is the measure): on this machine's noise either one alone now and
    then found a clear rank slow two windows running. Then, of the rest that are slow, the
    one whose best group is slowest is flagged (of links whose
    groups are mostly the same, as a paced plan's rack-local rounds put a slow NIC with
    the same mates every time, the slow one is the one never fast), its groups are set
    aside in turn, and the rest are judged again, until none is slow. A link with fewer
    than ``min_groups`` groups, or fewer groups it was not in, is not judged (a held one
    keeps its flag).
    """
    explained, found = set(held), set()
    kept: set[int] | None = None
    while True:
        scores = _scores(evidence, explained, held, min_groups, by_best=by_best)
        if kept is None:
            kept = {k for k in held if k not in scores or scores[k] < clear_ratio}
        best = scores if by_best else _scores(evidence, explained, set(), min_groups, by_best=True)
        slow = [k for k, score in scores.items()
                if k not in held | found and score < slow_ratio and best.get(k, 0.0) < slow_ratio]
        if not slow:
            return kept | found
        found.add(min(slow, key=lambda k: (best.get(k, 0.0), scores[k], k)))
        explained |= found


def _scores(evidence: list[tuple[set[int], float]], explained: set[int], held: set[int], min_groups: int, *,
            by_best: bool) -> dict[int, float]:
    """Each link's bandwidth over that of the groups it was not in, leaving out the groups
    of the ``explained`` (slow) links but a link's own; a link with fewer than
    ``min_groups`` groups of its own is not scored, nor one with fewer than three others
    where their median is the measure (one suffices for their best).

    A held (flagged) link, and any link unless ``by_best``, is scored by its median group
    against the others' median: the typical group is a fair measure once a slow link's
    groups are set aside, and a busy link's best of some twenty groups is a lucky moment
    (judging a flagged NIC by its best cleared it after one window on the emulated cluster,
    and the plan flapped). ``by_best`` (uplinks, whose fast groups are the probe rounds'
    few by design) scores a link not held by its best group against the best of as many of
    the others' groups (``best_of``), so a link with five groups in a window is not held to
    the best of another's twenty.
    """
    mine: dict[int, list[float]] = {}
    for links, bw in evidence:
        for k in links:
            if not (explained - {k}) & links:
                mine.setdefault(k, []).append(bw)
    out = {}
    for k, own in mine.items():
        others = [bw for links, bw in evidence if k not in links and not explained & links]
        typical = k in held or not by_best
        if len(own) < min_groups or len(others) < (3 if typical else 1):
            continue
        if typical:
            reach, value = statistics.median(others), statistics.median(own)
        else:
            reach, value = best_of(others, len(own)), max(own)
        out[k] = value / reach if reach > 0 else math.inf
    return out


def best_of(values: Sequence[float], m: int) -> float:
    """The median best of ``m`` of ``values`` drawn at random without replacement (the best
    of all when ``m`` is as many or more): the smallest value that is at least the draw's
    best with probability one half, the ``i``-th smallest of ``n`` being so with
    probability ``C(i, m) / C(n, m)``."""
    ordered, n = sorted(values), len(values)
    if m >= n:
        return ordered[-1]
    total = math.comb(n, m)  # the chance grows with i: bisect, a window holds thousands of groups
    return ordered[bisect.bisect_left(range(1, n + 1), True, key=lambda i: 2 * math.comb(i, m) >= total)]


#: The slowest pace regrouping sets unless told otherwise: racks exchange at least every
#: other round. On the emulated three-rack cluster (racks of three, one busy uplink) runs
#: paced up to 4 reached ``ddp``'s accuracy in 2 seeds of 5, up to 2 in 3 of 5 and sooner,
#: and every round in 3 of 5, later (bench/README.md, three racks): a pace of 4 mixes 0.90
#: a round there, 2 mixes 0.82, every round 0.50.
DEFAULT_MAX_PACE = 2


def cross_rack_pace(records: Iterable[Record], racks: Sequence[int], *, current: int = 1,
                    max_pace: int = DEFAULT_MAX_PACE, clear_ratio: float = CLEAR_RATIO, slow_racks: Sequence[int] = ()) -> int:
    """How many rounds apart the racks should exchange, from one window of records.

    ``t_cross`` is the median time of the window's cross-rack groups, ``t_intra`` that of its
    intra-rack groups (each group's time its last arrival's, as in ``group_bandwidths``).
    At every round (``current`` 1), the cross-rack groups pace the job only if they are
    slower than every rank's median intra-rack group (a slow NIC's pair can be slower still;
    then pacing the racks gains nothing). Then the pace is ``ceil(t_cross / t_intra - 1)``
    within ``[1, max_pace]``.

    Once paced, the windows measure another plan: its cross-rack groups run less often and
    its rack-local rounds hold larger groups, so ``t_cross / t_intra`` drops although the
    link is as slow as before, and asking again by the same rule flapped between paces 1 and
    2 every two windows on the emulated cluster. So a paced plan returns to every round only
    once the racks' link measures clear: the cross-rack groups' median effective bandwidth
    (``group_bandwidths``, comparable across group sizes) at least ``clear_ratio`` of the
    intra-rack groups'; where the plan flags slow uplinks (``slow_racks``), the cross-rack
    groups through them, since those set the round (the others cross clear uplinks). Until then it keeps its pace: stepping down by the same biased
    ratio would drift to 2 whatever the link. A window without both kinds of groups keeps
    ``current``.
    """
    cross, intra, by_rank = [], [], {}
    for (_, group), seconds in group_times(records).items():
        if len({racks[r] for r in group}) > 1:
            cross.append((len(group), seconds, bool({racks[r] for r in group} & set(slow_racks))))
        else:
            intra.append((len(group), seconds))
            for r in group:
                by_rank.setdefault(r, []).append(seconds)
    if max_pace <= 1:
        return 1
    if not cross or not intra:
        return min(current, max_pace)
    if current > 1:
        slowest = [(n, t) for n, t, through_slow in cross if through_slow] or [(n, t) for n, t, _ in cross]
        return 1 if _rate(slowest) >= clear_ratio * _rate(intra) else min(current, max_pace)
    t_cross, t_intra = statistics.median(t for _, t, _ in cross), statistics.median(t for _, t in intra)
    if t_intra <= 0 or t_cross <= max(statistics.median(v) for v in by_rank.values()):
        return 1  # the cross-rack groups are not the bottleneck
    return max(1, min(max_pace, math.ceil(t_cross / t_intra - 1 - 1e-9)))


def _rate(groups: list[tuple[int, float]]) -> float:
    """The median effective bandwidth, per byte, of ``(members, seconds)`` groups."""
    return statistics.median(effective_bandwidth(n, t) for n, t in groups)


def settle(in_force: Sensed, before: Sensed | None, now: Sensed) -> Sensed:
    """What the plan assumes after this window: ``in_force`` changed only where the window
    ``before`` this one and this one (``now``) agree on the change.

    A flag not in force is set when both windows have it; a flag in force is cleared when
    neither has it. The pace leaves 1 when both windows ask for more (the smaller of their
    two paces) and goes back to 1 when both ask for 1. ``before`` is ``None`` at the first
    window of a plan: nothing changes yet.
    """
    if before is None:
        return in_force

    def flags(kind: int) -> list[int]:
        held, prev, cur = set(in_force[0][kind]), set(before[0][kind]), set(now[0][kind])
        return sorted({f for f in held if f in prev or f in cur} | (prev & cur))

    pace, prev_pace, cur_pace = in_force[1], before[1], now[1]
    if pace == 1 and prev_pace > 1 and cur_pace > 1:
        pace = min(prev_pace, cur_pace)
    elif pace > 1 and prev_pace == 1 and cur_pace == 1:
        pace = 1
    return (flags(0), flags(1)), pace
