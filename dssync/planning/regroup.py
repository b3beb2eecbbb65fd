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

The rules are the prober's, applied to groups instead of pairs:

* **NIC of rank i**: its best intra-rack group of the window (a group whose members are all
  in its rack). A healthy worker has at least one group that did not include a slow
  rack-mate; a worker whose NIC is shared is slow in every group it joins. Slow means
  below ``slow_ratio`` times the median of the other workers' best.
* **Uplink of rack r**: the best of the cross-rack groups that include a member of rack r,
  slow by the same rule against the other racks. Under the static plan every cross-rack
  group holds every rack, so all racks score alike and no uplink can be singled out from
  timings alone: a slow uplink is then known only from the topology (``dssync probe``), and
  is confirmed or cleared online once the adjusted plan pairs that rack apart: the other
  racks' representatives then meet in a group without it (three racks or more; with two,
  every cross-rack group holds both, and the flag stays as the topology gave it).

**Pace** (``cross_rack_pace``, dssync's extension, see ``planner.paced``): when the
cross-rack groups are the slowest groups of the window, by their median against every
rank's median intra-rack group, racks exchange every ``k``-th round, ``k`` the smallest
pace at which the cross-rack group's extra time, spread over ``k`` rounds, is at most one
intra-rack group's time: ``ceil(t_cross / t_intra - 1)``, capped at ``max_pace``.

**Two windows in a row** (``settle``): one window's answer changes nothing by itself. A flag
is set when two windows in a row find its link slow and cleared when two in a row find it
clear; the pace leaves 1 when two windows in a row ask for more (to the smaller of the two)
and returns to 1 when two in a row ask for 1. On the emulated cluster (eight ranks and the
background flows' iperf3 sharing two cores) a clear worker descheduled through a whole
window came out slow, and its flag hid the slow cross-rack group that the same window
should have paced; the plan then switched twice for nothing. A contention that persists
costs one window more before the plan reacts; one that flickers costs nothing.

Contention that goes away shows as fast groups again, so the next windows' answers drop
it and the plan relaxes. A NIC the plan already isolates is judged by its *median* group of
the window, not its best: once paired apart, it is in a group of its own every round, so
its typical group is a fair measure and no other member's wait hides in it. Its best of
some twenty pairs, on a link it shares with TCP streams, is a lucky moment; judging by it
cleared the flag after one window on the emulated cluster, and the plan flapped between
the two every window.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

from dssync.topology.contention import slow_keys
from dssync.topology.matrices import DEFAULT_SLOW_RATIO

__all__ = ["Record", "Sensed", "cross_rack_pace", "group_bandwidths", "sense_contention", "settle"]

Record = tuple[int, tuple[int, ...], float]
#: One window's answer, or the plan's assumption: ((slow uplinks, slow NICs), pace).
Sensed = tuple[tuple[list[int], list[int]], int]


def group_bandwidths(records: Iterable[Record], nbytes: int) -> dict[tuple[int, tuple[int, ...]], float]:
    """``{(step, group): effective bytes/s}``, the group's time being its last arrival's."""
    shortest: dict[tuple[int, tuple[int, ...]], float] = {}
    for step, group, seconds in records:
        key = (int(step), tuple(sorted(group)))
        shortest[key] = min(shortest.get(key, float("inf")), float(seconds))
    out = {}
    for (step, group), seconds in shortest.items():
        n = len(group)
        if n >= 2 and seconds > 0:
            out[step, group] = 2 * (n - 1) / n * nbytes / seconds
    return out


def sense_contention(records: Iterable[Record], racks: Sequence[int], nbytes: int, *,
                     current: tuple[Sequence[int], Sequence[int]] = ((), ()),
                     slow_ratio: float = DEFAULT_SLOW_RATIO) -> tuple[list[int], list[int]]:
    """``(racks with a slow uplink, ranks with a slow NIC)`` from one window of records.

    ``current`` is what the plan assumes now; a flag the window cannot judge (a rank with
    no intra-rack group in it, a rack that was in every cross-rack group) is kept as is.
    """
    bandwidth = group_bandwidths(records, nbytes)
    best_intra: dict[int, float] = {}
    all_intra: dict[int, list[float]] = {}
    best_cross: dict[int, float] = {}
    crossing: list[set[int]] = []  # the racks of each cross-rack group
    for (_, group), bw in bandwidth.items():
        in_racks = {racks[r] for r in group}
        if len(in_racks) == 1:
            for r in group:
                best_intra[r] = max(best_intra.get(r, 0.0), bw)
                all_intra.setdefault(r, []).append(bw)
        else:
            crossing.append(in_racks)
            for rack in in_racks:
                best_cross[rack] = max(best_cross.get(rack, 0.0), bw)
    for i in current[1]:
        if i in all_intra:
            best_intra[i] = statistics.median(all_intra[i])
    nics = set(slow_keys(best_intra, slow_ratio)) if len(best_intra) > 2 else set()
    nics |= {i for i in current[1] if i not in best_intra}
    uplinks = set(slow_keys(best_cross, slow_ratio)) if len(best_cross) > 1 else set()
    uplinks |= {r for r in current[0] if all(r in seen for seen in crossing)}
    return sorted(uplinks), sorted(nics)


def cross_rack_pace(records: Iterable[Record], racks: Sequence[int], *, current: int = 1,
                    max_pace: int = 4) -> int:
    """How many rounds apart the racks should exchange, from one window of records.

    ``t_cross`` is the median time of the window's cross-rack groups, ``t_intra`` that of its
    intra-rack groups (each group's time its last arrival's, as in ``group_bandwidths``).
    The cross-rack groups pace the job only if they are slower than every rank's median
    intra-rack group (a slow NIC's pair can be slower still; then pacing the racks gains
    nothing). Then the pace is ``ceil(t_cross / t_intra - 1)`` within ``[1, max_pace]``.

    Once paced, the cross-rack group runs less often and often faster, so the ratio drops:
    a pace above 1 is kept until the window asks for 1, when the cross-rack groups
    are no longer the slowest or no slower than twice the intra-rack ones, so the plan does
    not flap between paces. A window without both kinds of groups keeps ``current``.
    """
    shortest: dict[tuple[int, tuple[int, ...]], float] = {}
    for step, group, seconds in records:
        key = (int(step), tuple(sorted(group)))
        shortest[key] = min(shortest.get(key, float("inf")), float(seconds))
    cross, intra, by_rank = [], [], {}
    for (_, group), seconds in shortest.items():
        if len(group) < 2:
            continue
        if len({racks[r] for r in group}) > 1:
            cross.append(seconds)
        else:
            intra.append(seconds)
            for r in group:
                by_rank.setdefault(r, []).append(seconds)
    if max_pace <= 1:
        return 1
    if not cross or not intra:
        return min(current, max_pace)
    t_cross, t_intra = statistics.median(cross), statistics.median(intra)
    bottleneck = t_cross > max(statistics.median(v) for v in by_rank.values())
    target = 1
    if bottleneck and t_intra > 0:
        target = max(1, min(max_pace, math.ceil(t_cross / t_intra - 1 - 1e-9)))
    if current > 1 and target > 1:
        return current
    return target


def settle(in_force: Sensed, before: Sensed | None, now: Sensed) -> Sensed:
    """What the plan assumes after this window: ``in_force`` changed only where the window
    ``before`` this one and this one (``now``) agree on the change.

    A flag not in force is set when both windows have it; a flag in force is cleared when
    neither has it. The pace leaves 1 when both windows ask for more (the smaller of their
    two paces) and goes back to 1 when both ask for 1. ``before`` is ``None`` at the first
    window of a run: nothing changes yet.
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
