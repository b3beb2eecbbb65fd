"""The static divide-and-shuffle plan, ``initGroups`` of the paper (section III-B, Fig. 4),
and the pieces every plan is built from: the schedule in compact form, the rotation of
unequal racks, the predicted time of a round."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dssync.errors import ScheduleError
from dssync.planning.schedule import Group, Partition, Schedule, connected
from dssync.topology import Topology

__all__ = ["DEFAULT_MAX_PERIOD", "predict_round_ms", "static_plan"]

#: Longest period for which racks of unequal size rotate in their exact least common
#: multiple; beyond it (say racks of 7, 8, 9 and 11 ranks: lcm 5544) the plan uses a
#: bounded rotation of at least this many rounds instead.
DEFAULT_MAX_PERIOD = 64


def static_plan(
    topology: Topology,
    *,
    max_period: int = DEFAULT_MAX_PERIOD,
    message_bytes: int | None = None,
) -> Schedule:
    """The static divide-and-shuffle plan, ``initGroups`` of paper Fig. 4.

    Each round, every rack sends one *representative* to the single inter-rack group and
    the rest of the rack forms an intra-rack group, so the job puts exactly one flow on
    each rack uplink. Representatives rotate: rack ``r`` with members ``m_0 < m_1 < ...``
    is represented by ``m_{t mod |r|}`` in round ``t``.

    Racks of unequal size rotate independently. The period is the least common multiple
    of the rack sizes, so every worker is representative equally often, when that is at
    most ``max(max_period, largest rack)`` rounds; otherwise (racks of 7, 8, 9 and 11: lcm
    5544) it is a *bounded rotation*, the shortest multiple of the largest rack that is at
    least ``max_period`` rounds, in which the numbers of times any two workers of a rack
    represent it differ by at most one (a rack of 7 in 66 rounds: 9 or 10 times each), and
    ``Schedule.notes`` says so.

    When every rack has at most two workers, lock-step rotation can leave ranks that
    never meet; the plan then shifts each rack's rotation block by block (period
    ``length * largest rack``) so that it mixes.

    A single rack has no uplink to protect: the plan is one group of all ranks.
    ``message_bytes`` with a topology that carries bandwidth measurements fills in
    ``predicted_comm_ms`` (the mean over the period of the slowest group's lower bound).
    """
    racks = topology.racks()
    notes: list[str] = []
    if len(racks) == 1:
        period: list[tuple[Group, ...]] = [()]  # the rack is the one group
    else:
        sizes = [len(r) for r in racks]
        length, bounded = period_length(sizes, max_period)
        if bounded:
            notes.append(f"{describe_rack_sizes(sizes)}: a bounded period of {length} rounds (exact rotation "
                         f"needs {math.lcm(*sizes)}); representation counts within a rack differ by at most one")
        period = _rotation(racks, length, shifted=False)
        if not connected(topology.world_size, racks, period):
            # Racks of two have a singleton intra-rack group, so when every rack is that
            # small, lock-step rotation pairs the same representatives forever (racks
            # {0,1},{2,3}: only 0-2 and 1-3 ever meet). Shift rack r's rotation by r more
            # each block of rounds, so every pairing occurs and the period mixes.
            period = _rotation(racks, length * max(sizes), shifted=True, block=length)
    return schedule_of_rounds(period, topology, message_bytes, notes=notes)


def schedule_of_rounds(rounds: Sequence[Sequence[Group]], topology: Topology, message_bytes: int | None, *,
                       notes: Sequence[str] = ()) -> Schedule:
    """The ``Schedule`` of ``rounds`` (each round's named groups; the rest of each rack is
    one group), with ``predicted_comm_ms`` (the mean over the period of the slowest group's
    lower bound) when the topology has bandwidth and a size is given."""
    schedule = Schedule(world_size=topology.world_size, blocks=topology.racks(), rounds=tuple(rounds),
                        notes=tuple(notes))
    if message_bytes is not None and topology.bandwidth_gbps is not None:
        schedule.predicted_comm_ms = float(np.mean([predict_round_ms(schedule.partition_at(t), topology, message_bytes)
                                                    for t in range(schedule.length)]))
    return schedule


def predict_round_ms(partition: Partition, topology: Topology, message_bytes: int) -> float:
    """Lower bound on a round's time: its slowest group's ring allreduce.

    A group of ``n`` ranks whose slowest link carries ``B`` bytes/s needs at least
    ``2(n-1)/n * S/B`` seconds for ``S`` bytes, plus ``2(n-1)`` latency hops.
    """
    if topology.bandwidth_gbps is None:
        raise ScheduleError("predicting a round's time needs a topology with bandwidth_gbps")
    worst = 0.0
    for group in partition:
        n = len(group)
        if n < 2:
            continue
        idx = np.asarray(group)
        bw = topology.bandwidth_gbps[np.ix_(idx, idx)]
        slowest_gbps = float(np.min(bw[~np.eye(n, dtype=bool)]))
        if slowest_gbps <= 0:
            return math.inf
        seconds = 2 * (n - 1) / n * message_bytes * 8 / (slowest_gbps * 1e9)
        if topology.latency_us is not None:
            seconds += 2 * (n - 1) * float(np.max(topology.latency_us[np.ix_(idx, idx)])) * 1e-6
        worst = max(worst, seconds * 1e3)
    return worst


def describe_rack_sizes(sizes: Sequence[int]) -> str:
    """Rack sizes for a note: ``racks of [7, 8, 9, 11] workers``, or for many racks how many
    and the range (``1000 racks of 50 to 150 workers``)."""
    if len(sizes) <= 12:
        return f"racks of {list(sizes)} workers"
    low, high = min(sizes), max(sizes)
    return f"{len(sizes)} racks of {low}" + (f" to {high}" if high > low else "") + " workers"


def period_length(cycles: Sequence[int], max_period: int) -> tuple[int, bool]:
    """``(rounds, bounded)``: the least common multiple of ``cycles`` when it is at most
    ``max(max_period, longest)``; else the shortest multiple of the longest cycle that is at
    least ``max_period``."""
    longest = max(cycles)
    exact = math.lcm(*cycles)
    if exact <= max(max_period, longest):
        return exact, False
    return longest * math.ceil(max_period / longest), True


def _rotation(racks: list[list[int]], length: int, *, shifted: bool, block: int = 1) -> list[tuple[Group, ...]]:
    """Each round names its inter-rack group, one representative per rack; the rest of each
    rack is its intra-rack group."""
    return [(tuple(rack[(t + (t // block) * r * shifted) % len(rack)] for r, rack in enumerate(racks)),)
            for t in range(length)]
