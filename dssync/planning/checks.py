"""The invariants every plan guarantees, stated as checks that tests and ``dssync plan`` run
against a schedule and its topology."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence

from dssync.errors import ScheduleError
from dssync.planning.schedule import Schedule
from dssync.topology import Topology

__all__ = ["check_adjusted", "check_paced", "check_static"]


def _rounds(schedule: Schedule, topology: Topology,
            watch: Sequence[int] = ()) -> Iterator[list[tuple[Sequence[int], int, set[int]]]]:
    """Each round's groups as ``(members, size, racks they span)``. A named group comes
    whole; the rest of a block that lies in one rack (a plan's rack) brings as members only
    its ranks in ``watch``, so a check over a period costs its named ranks and racks, not
    period x ranks; the rest of any other block comes whole."""
    rack_of_block: list[int | None] = []
    for block in schedule.blocks:
        racks = {topology.rack_of(r) for r in block}
        rack_of_block.append(racks.pop() if len(racks) == 1 else None)
    watched: dict[int, list[int]] = {}
    for r in watch:
        watched.setdefault(schedule.block_of(r), []).append(r)
    for t in range(schedule.length):
        named = schedule.named(t)
        groups = [(g, len(g), {topology.rack_of(r) for r in g}) for g in schedule.rounds[t]]
        for b, size in schedule.rest_sizes(t).items():
            if rack_of_block[b] is not None:
                groups.append(([r for r in watched.get(b, ()) if r not in named], size, {rack_of_block[b]}))
            else:
                rest = schedule.rest(t, b)
                groups.append((rest, size, {topology.rack_of(r) for r in rest}))
        yield groups


def check_adjusted(schedule: Schedule, topology: Topology, *, slow_uplinks: Sequence[int] = (),
                   slow_nics: Sequence[int] = ()) -> None:
    """Raise ``ScheduleError`` unless the plan keeps every contended link to one small flow.

    In every round: a slow NIC is in a group of at most two, inside its rack unless every
    NIC of its rack is slow; a rack with a slow uplink (or with no clear NIC) has at most one
    member in groups that cross racks, and that group is a pair.
    """
    slow_nic_set = set(slow_nics)
    racks = topology.racks()
    all_slow = {r for r, rack in enumerate(racks) if set(rack) <= slow_nic_set}
    narrow = set(slow_uplinks) | (all_slow if len(racks) > 1 else set())
    for t, partition in enumerate(_rounds(schedule, topology, watch=sorted(slow_nic_set))):
        flows = dict.fromkeys(narrow, 0)
        for group, size, in_racks in partition:
            crossing = len(in_racks) > 1
            if crossing and not isinstance(group, tuple):
                group = schedule.rest(t, schedule.block_of(group[0]))  # (a rest spans racks only off a plan)
            for r in group:
                rack = topology.rack_of(r)
                if r in slow_nic_set and (size > 2 or (crossing and rack not in all_slow)):
                    raise ScheduleError(f"round {t}: rank {r} has a slow NIC but is in {list(group)}; "
                                        "it must be in a pair inside its rack")
                if crossing and rack in narrow:
                    flows[rack] += 1
                    if size > 2:
                        why = "uplink is slow" if rack in slow_uplinks else "NICs are all slow"
                        raise ScheduleError(f"round {t}: rack {rack}'s {why} but its representative {r} is in "
                                            f"{list(group)}, not a pair")
        crowded = sorted(rack for rack, k in flows.items() if k > 1)
        if crowded:
            raise ScheduleError(f"round {t}: racks {crowded} put more than one flow on their slow uplinks")


def check_paced(schedule: Schedule, topology: Topology, pace: int) -> Schedule:
    """Raise ``ScheduleError`` unless ``schedule`` is a plan ``paced`` by ``pace``: its length a
    multiple of ``pace``, and no group crossing racks outside rounds ``0, pace, 2 pace, ...``.
    Returns the plan of those rounds, for ``check_static`` or ``check_adjusted``."""
    if pace < 1 or schedule.length % pace:
        raise ScheduleError(f"a plan paced by {pace} has a multiple of {pace} rounds; this one has "
                            f"{schedule.length}")
    if pace == 1:
        return schedule
    for t, partition in enumerate(_rounds(schedule, topology)):
        crossing = [list(g) for g, _, spans in partition if len(spans) > 1]
        if t % pace and crossing:
            raise ScheduleError(f"round {t}: groups {crossing} cross racks, but with pace {pace} racks "
                                f"exchange only in rounds that are multiples of {pace}")
    return Schedule(world_size=schedule.world_size, blocks=schedule.blocks, rounds=schedule.rounds[::pace])


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
    for t, partition in enumerate(_rounds(schedule, topology)):
        crossing = [g for g, _, spans in partition if len(spans) > 1]
        if len(crossing) != 1:
            raise ScheduleError(
                f"round {t} has {len(crossing)} groups that cross racks; the static plan has "
                "exactly one"
            )
        counts = Counter(topology.rack_of(r) for r in crossing[0])
        if len(counts) != len(racks) or any(c != 1 for c in counts.values()):
            per_rack = [counts.get(rack, 0) for rack in range(len(racks))]
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
