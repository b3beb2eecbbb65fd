"""Planning divide-and-shuffle schedules from a topology (paper section III-B).

Pure code: numpy only, no process groups. ``static_plan`` is ``initGroups`` of the
paper (Fig. 4); ``check_static`` states the invariants that plan guarantees, so tests and
the ``dssync plan`` command can verify a schedule against a topology.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import scipy.sparse
import scipy.sparse.csgraph

from dssync.errors import ScheduleError
from dssync.schedule import Partition, Schedule
from dssync.topology import Topology

__all__ = ["adjusted_plan", "check_adjusted", "check_paced", "check_static", "paced", "plan", "predict_round_ms",
           "static_plan"]

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
    return _schedule(period, topology, message_bytes)


def plan(topology: Topology, *, max_period: int = DEFAULT_MAX_PERIOD,
         message_bytes: int | None = None, pace: int = 1) -> Schedule:
    """``adjusted_plan`` for the contention the topology records, ``static_plan`` without any;
    with ``pace`` > 1, ``paced`` by it."""
    if pace < 1:
        raise ScheduleError(f"pace must be 1 (every round) or more, got {pace}")
    uplinks, nics = contended(topology)
    if not uplinks and not nics:
        base = static_plan(topology, max_period=max_period, message_bytes=message_bytes)
    else:
        base = adjusted_plan(topology, slow_uplinks=uplinks, slow_nics=nics, max_period=max_period,
                             message_bytes=message_bytes)
    return paced(base, topology, pace, message_bytes=message_bytes) if pace > 1 else base


def paced(schedule: Schedule, topology: Topology, pace: int, *, message_bytes: int | None = None) -> Schedule:
    """``schedule`` with its racks exchanging only every ``pace``-th round (dssync's extension).

    Each round of ``schedule`` is followed by ``pace - 1`` *rack-local* copies of it: every
    group that crosses racks is dissolved and its members join their own rack's largest
    group in that round (or stay alone when the rack has none), while intra-rack groups,
    slow-NIC pairs included, stay as they are. So the period is ``pace`` times longer, holds
    every round of ``schedule`` once, and still mixes.

    Why: the paper keeps a contended uplink down to one flow per rack (Fig. 4, 5), but when
    even that flow gets a fraction of the link (TCP's per-stream share against another job's
    streams), the cross-rack group takes several times as long as the intra-rack ones and
    every round waits for it: its members fall behind and their rack-mates wait for them next
    round. Exchanging across racks every ``pace``-th round spreads that cost over ``pace``
    rounds. On the emulated ``inter-rack`` scenario (mnist-wide, 8 ranks) a pace of 4 cut
    ds-sync's wall time from 17-20 s to 11-12 s per 200 steps at the same accuracy
    (bench/README.md). The price is slower mixing across racks; ``rho`` of the period says
    how much. Pairs around a slow *NIC* are not paced: on the same cluster, a NIC pair that
    ran every fourth round took twice as long each time (85 against 43 ms), because the job's
    idle socket restarts against the other job's established streams on that host.
    """
    if pace < 1:
        raise ScheduleError(f"pace must be 1 (every round) or more, got {pace}")
    if pace == 1:
        return schedule
    period: list[Partition] = []
    for partition in schedule.period:
        period.append(partition)
        period += [_rack_local(partition, topology)] * (pace - 1)
    return _schedule(period, topology, message_bytes)


def _rack_local(partition: Partition, topology: Topology) -> Partition:
    """``partition`` with each cross-rack group's members moved into the largest group of
    their own rack that holds no slow NIC (alone when there is none)."""
    slow = set(contended(topology)[1])
    local = [list(g) for g in partition if len({topology.rack_of(r) for r in g}) == 1]
    loose = [r for g in partition if len({topology.rack_of(r) for r in g}) > 1 for r in g]
    for r in loose:
        homes = [g for g in local if topology.rack_of(g[0]) == topology.rack_of(r) and not slow & set(g)]
        if homes:
            max(homes, key=len).append(r)
        else:
            local.append([r])
    return tuple(tuple(sorted(g)) for g in local)


def contended(topology: Topology) -> tuple[list[int], list[int]]:
    """``(racks with a slow uplink, ranks with a slow NIC)`` from ``topology.contention``."""
    contention = topology.contention or {}
    return (sorted(int(u["rack"]) for u in contention.get("uplinks", [])),
            sorted(int(n["rank"]) for n in contention.get("nics", [])))


def adjusted_plan(
    topology: Topology,
    *,
    slow_uplinks: Sequence[int] = (),
    slow_nics: Sequence[int] = (),
    max_period: int = DEFAULT_MAX_PERIOD,
    message_bytes: int | None = None,
) -> Schedule:
    """``adjustGroups`` of the paper (section III-B.2 and B.3, Fig. 5 and 6).

    Built on ``static_plan``'s rounds (one representative per rack, the rest of each rack an
    intra-rack group), then:

    * **Slow NIC of rank i** (Fig. 6): i is never its rack's representative; every round it
      is in an intra-rack group of exactly two with a *regular* (uncontended) worker of its
      rack, and that partner rotates. The rest of the rack's regular workers form the large
      intra-rack group, from which both the partner and the representative are drawn in
      turn, so the large group exchanges members with the pair and with the inter-rack
      group. Several slow NICs in one rack each get a partner of their own. The paper does
      this "if there are enough workers in the rack": a rack needs one regular worker more
      than it has slow ones (one to represent it); slow workers beyond that, in rank order,
      are planned as regular workers.
    * **Slow uplink of rack r** (Fig. 5): r's representative is every round in an
      inter-rack group of exactly two with the representative of a regular rack (one whose
      uplink is clear), and that regular rack rotates; the other representatives form the
      large inter-rack group. Several slow racks each get a regular partner, distinct
      within a round; when slow racks outnumber regular ones, the slow racks take turns with
      the regular partners and the rest pair up among themselves (any one left over sits
      the round out across racks). With every uplink
      slow there is nothing to keep apart and the inter-rack group stays whole.

    The period is the least common multiple of the rotation lengths (each rack's number of
    regular workers, and the number of regular racks) up to ``max_period`` rounds, else the
    longest of them; when that does not mix (rho = 1), the rotations are shifted against
    each other block by block (see the code), and if nothing mixes the plan is refused
    with a ``ScheduleError``.
    """
    n = topology.world_size
    racks = topology.racks()
    for rack in slow_uplinks:
        if not 0 <= rack < len(racks):
            raise ScheduleError(f"slow uplink of rack {rack}: the topology has racks 0..{len(racks) - 1}")
    for rank in slow_nics:
        if not 0 <= rank < n:
            raise ScheduleError(f"slow NIC of rank {rank}: the topology has ranks 0..{n - 1}")
    if len(racks) == 1 and not slow_nics:
        return static_plan(topology, max_period=max_period, message_bytes=message_bytes)
    slow_set = set(slow_nics)
    paired: list[list[int]] = []  # per rack: slow workers that get a partner
    regular: list[list[int]] = []  # per rack: workers that rotate (represent, partner, large group)
    for rack in racks:
        slow = [i for i in rack if i in slow_set]
        reg = [i for i in rack if i not in slow_set]
        keep = slow[: max(0, len(reg) - (1 if len(racks) > 1 else 0))]
        paired.append(keep)
        regular.append(sorted(reg + [i for i in slow if i not in keep]))
    slow_racks = sorted(set(slow_uplinks))
    regular_racks = [r for r in range(len(racks)) if r not in slow_racks]
    cycles = [len(reg) for reg in regular]
    if slow_racks and regular_racks:
        cycles.append(max(len(slow_racks), len(regular_racks)))
    length = math.lcm(*cycles)
    if length > max(max_period, max(cycles)):
        length = max(cycles)
    period = _adjusted_rounds(racks, regular, paired, slow_racks, regular_racks, length)
    # Rotations of equal length run in lock step and can keep the same ranks apart forever
    # (racks of two, where the intra-rack group is one worker). Then each rotation is
    # shifted by its own offset every period-length block: first the static plan's
    # ``block * index``, then seeded pseudo-random offsets over more blocks; the same
    # seeds on every rank give every rank the same plan.
    blocks = max(cycles)
    shift = np.arange(blocks)[:, None] * np.arange(len(racks) + 1)[None, :]
    for attempt in range(33):
        if _connected(period, n):
            break
        if attempt:
            blocks = max(cycles) * (1 + (attempt - 1) // 8)
            shift = np.random.default_rng(attempt).integers(0, 2**20, size=(blocks, len(racks) + 1))
        period = _adjusted_rounds(racks, regular, paired, slow_racks, regular_racks, length * blocks,
                                  block=length, shift=shift)
    if not _connected(period, n):
        raise ScheduleError(
            f"no mixing plan keeps slow uplinks {slow_racks} and slow NICs {sorted(slow_set)} in "
            f"groups of two for racks {[len(r) for r in racks]}; drop a contention entry"
        )
    return _schedule(period, topology, message_bytes)


def _schedule(period: Sequence[Partition], topology: Topology, message_bytes: int | None) -> Schedule:
    """The ``Schedule`` of ``period``, with ``predicted_comm_ms`` (the mean over the period of
    the slowest group's lower bound) when the topology has bandwidth and a size is given."""
    predicted = None
    if message_bytes is not None and topology.bandwidth_gbps is not None:
        predicted = float(np.mean([predict_round_ms(p, topology, message_bytes) for p in period]))
    return Schedule(world_size=topology.world_size, period=tuple(period), predicted_comm_ms=predicted)


def _adjusted_rounds(racks: list[list[int]], regular: list[list[int]], paired: list[list[int]],
                     slow_racks: list[int], regular_racks: list[int], length: int,
                     *, block: int = 1, shift: np.ndarray | None = None) -> list[Partition]:
    """Round ``t`` rotates rack ``r`` by ``t + shift[t // block, r]`` and the slow-rack
    pairing by ``t + shift[t // block, len(racks)]`` (no shift when ``shift`` is None)."""
    period: list[Partition] = []
    multi = len(racks) > 1
    for t in range(length):
        groups: list[tuple[int, ...]] = []
        reps: dict[int, int] = {}
        for r, reg in enumerate(regular):
            offset = t + (0 if shift is None else int(shift[t // block, r]))
            order = [reg[(offset + k) % len(reg)] for k in range(len(reg))] if reg else []
            if multi and order:
                reps[r] = order.pop(0)
            for slow in paired[r]:
                groups.append((slow, order.pop(0)))
            if order:
                groups.append(tuple(sorted(order)))
        if slow_racks and regular_racks:
            # The more numerous side rotates past the other: each slow rack meets every
            # regular rack in turn (or, with more slow racks, each regular rack every slow one).
            offset = t + (0 if shift is None else int(shift[t // block, len(racks)]))
            s, q = len(slow_racks), len(regular_racks)
            slow = [slow_racks[(offset + j) % s] for j in range(s)] if s > q else list(slow_racks)
            partners = [regular_racks[(offset + j) % q] for j in range(q)] if s <= q else list(regular_racks)
            for u, p in zip(slow, partners, strict=False):
                groups.append((reps.pop(u), reps.pop(p)))
            left = [reps.pop(u) for u in slow[q:]]
            groups += [tuple(left[k:k + 2]) for k in range(0, len(left), 2)]
        if reps:
            groups.append(tuple(sorted(reps.values())))
        period.append(tuple(tuple(sorted(g)) for g in groups))
    return period


def check_adjusted(schedule: Schedule, topology: Topology, *, slow_uplinks: Sequence[int] = (),
                   slow_nics: Sequence[int] = ()) -> None:
    """Raise ``ScheduleError`` unless every contended representative and every contended
    NIC is in a group of exactly two in every round: a slow rack's members meet other racks
    only in pairs, and a slow worker only in a pair inside its own rack."""
    slow_nic_set = set(slow_nics)
    for t, partition in enumerate(schedule.period):
        for group in partition:
            crossing = len({topology.rack_of(r) for r in group}) > 1
            for r in group:
                if r in slow_nic_set and (len(group) > 2 or crossing):
                    raise ScheduleError(f"round {t}: rank {r} has a slow NIC but is in {list(group)}; "
                                        "it must be in a pair inside its rack")
                if crossing and topology.rack_of(r) in slow_uplinks and len(group) > 2:
                    raise ScheduleError(f"round {t}: rack {topology.rack_of(r)}'s uplink is slow but its "
                                        f"representative {r} is in {list(group)}, not a pair")


def check_paced(schedule: Schedule, topology: Topology, pace: int) -> Schedule:
    """Raise ``ScheduleError`` unless ``schedule`` is a plan ``paced`` by ``pace``: its length a
    multiple of ``pace``, and no group crossing racks outside rounds ``0, pace, 2 pace, ...``.
    Returns the plan of those rounds, for ``check_static`` or ``check_adjusted``."""
    if pace < 1 or len(schedule.period) % pace:
        raise ScheduleError(f"a plan paced by {pace} has a multiple of {pace} rounds; this one has "
                            f"{len(schedule.period)}")
    for t, partition in enumerate(schedule.period):
        crossing = [list(g) for g in partition if len({topology.rack_of(r) for r in g}) > 1]
        if t % pace and crossing:
            raise ScheduleError(f"round {t}: groups {crossing} cross racks, but with pace {pace} racks "
                                f"exchange only in rounds that are multiples of {pace}")
    return Schedule(world_size=schedule.world_size, period=schedule.period[::pace])


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
