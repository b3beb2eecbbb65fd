"""Planning divide-and-shuffle schedules from a topology (paper section III-B).

Pure code: numpy only, no process groups. ``static_plan`` is ``initGroups`` of the
paper (Fig. 4); ``check_static`` states the invariants that plan guarantees, so tests and
the ``dssync plan`` command can verify a schedule against a topology.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse
import scipy.sparse.csgraph

from dssync.errors import ScheduleError
from dssync.schedule import Partition, Schedule
from dssync.topology import Topology

__all__ = ["check_static", "predict_round_ms", "static_plan"]

#: Longest period for which racks of unequal size rotate in their exact least common
#: multiple; beyond it (say racks of 7, 8, 9 and 11 ranks: lcm 5544) the plan uses a
#: bounded rotation of ``max(rack sizes)`` rounds instead.
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
    most ``max(max_period, largest rack)`` rounds; otherwise it is a *bounded rotation*
    of ``largest rack`` rounds, in which every worker still represents its rack at least
    once per period (smaller racks wrap around early).

    When every rack has at most two workers, lock-step rotation can leave ranks that
    never meet; the plan then shifts each rack's rotation block by block (period
    ``length * largest rack``) so that it mixes.

    A single rack has no uplink to protect: the plan is one group of all ranks.
    ``message_bytes`` with a topology that carries bandwidth measurements fills in
    ``predicted_comm_ms`` (the mean over the period of the slowest group's lower bound).
    """
    racks = topology.racks()
    if len(racks) == 1:
        period: list[Partition] = [(tuple(racks[0]),)]
    else:
        sizes = [len(r) for r in racks]
        length = math.lcm(*sizes)
        if length > max(max_period, max(sizes)):
            length = max(sizes)
        period = _rotation(racks, length, shifted=False)
        if not _connected(period, topology.world_size):
            # Racks of two have a singleton intra-rack group, so when every rack is that
            # small, lock-step rotation pairs the same representatives forever (racks
            # {0,1},{2,3}: only 0-2 and 1-3 ever meet). Shift rack r's rotation by r more
            # each block of rounds, so every pairing occurs and the period mixes.
            period = _rotation(racks, length * max(sizes), shifted=True, block=length)
    predicted = None
    if message_bytes is not None and topology.bandwidth_gbps is not None:
        predicted = float(np.mean([predict_round_ms(p, topology, message_bytes) for p in period]))
    return Schedule(world_size=topology.world_size, period=tuple(period), predicted_comm_ms=predicted)


def _rotation(racks: list[list[int]], length: int, *, shifted: bool, block: int = 1) -> list[Partition]:
    period: list[Partition] = []
    for t in range(length):
        reps = [rack[(t + (t // block) * r * shifted) % len(rack)] for r, rack in enumerate(racks)]
        groups = [tuple(reps)]
        groups += [tuple(m for m in rack if m != rep) for rack, rep in zip(racks, reps, strict=True)
                   if len(rack) > 1]
        period.append(tuple(groups))
    return period


def _connected(period: list[Partition], world_size: int) -> bool:
    """Whether the union of the period's groups connects every rank (then rho < 1)."""
    rows, cols = [], []
    for partition in period:
        for group in partition:
            rows += [group[0]] * len(group)
            cols += list(group)
    graph = scipy.sparse.coo_matrix((np.ones(len(rows)), (rows, cols)), shape=(world_size, world_size))
    return scipy.sparse.csgraph.connected_components(graph, directed=False)[0] == 1


def predict_round_ms(partition: Partition, topology: Topology, message_bytes: int) -> float:
    """Lower bound on a round's time: its slowest group's ring allreduce (DESIGN section 7).

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


def check_static(schedule: Schedule, topology: Topology) -> None:
    """Raise ``ScheduleError`` unless ``schedule`` keeps the static plan's invariants.

    With two or more racks: each round has exactly one group that crosses racks, holding
    exactly one representative of every rack; every worker of every rack represents it
    at least once in the period. (``Schedule`` itself already guarantees the partition
    property and ``rho < 1``.)
    """
    if schedule.world_size != topology.world_size:
        raise ScheduleError(
            f"schedule is for {schedule.world_size} ranks but the topology has "
            f"{topology.world_size}"
        )
    racks = topology.racks()
    if len(racks) == 1:
        return
    represented: list[set[int]] = [set() for _ in racks]
    for t, partition in enumerate(schedule.period):
        crossing = [g for g in partition if len({topology.rack_of(r) for r in g}) > 1]
        if len(crossing) != 1:
            raise ScheduleError(
                f"round {t} has {len(crossing)} groups that cross racks; the static plan has "
                "exactly one"
            )
        per_rack = [sum(topology.rack_of(r) == rack for r in crossing[0]) for rack in range(len(racks))]
        if any(c != 1 for c in per_rack):
            raise ScheduleError(
                f"round {t}: the inter-rack group {list(crossing[0])} must hold one "
                f"representative per rack, holds {per_rack} per rack"
            )
        for r in crossing[0]:
            represented[topology.rack_of(r)].add(r)
    for rack, members in enumerate(racks):
        missing = sorted(set(members) - represented[rack])
        if missing:
            raise ScheduleError(
                f"rack {rack}: ranks {missing} never represent their rack within the period"
            )
