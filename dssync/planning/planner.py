"""Planning divide-and-shuffle schedules from a topology (paper section III-B).

Pure code: numpy only, no process groups. ``static_plan`` is ``initGroups`` of the
paper (Fig. 4); ``check_static`` states the invariants that plan guarantees, so tests and
the ``dssync plan`` command can verify a schedule against a topology.

Plans are built in the schedule's compact form (``dssync.planning.schedule``): the racks are its
blocks, and a round names only its cross-rack groups and its pairs; each rack's large
intra-rack group is the rest of the rack. So planning costs about ``period x (racks +
named ranks)``, never ``period x ranks``, and the checks look at named ranks only.
"""

from __future__ import annotations

import math

from dssync.errors import ScheduleError
from dssync.planning.adjusted import adjusted_plan
from dssync.planning.checks import check_adjusted, check_paced, check_static
from dssync.planning.schedule import Group, Schedule
from dssync.planning.static import (
    DEFAULT_MAX_PERIOD,
    predict_round_ms,
    schedule_of_rounds,
    static_plan,
)
from dssync.topology import Topology

__all__ = ["DEFAULT_MAX_PERIOD", "adjusted_plan", "check_adjusted", "check_paced", "check_static", "contended", "paced",
           "PLAN_KINDS", "base_plan", "plan", "predict_round_ms", "static_plan", "time_to_mix", "with_uplink_probes"]

#: The slowest pace a plan may take: racks exchange at least every this many rounds.
MAX_PACE = 64


#: What ``plan`` may build where the topology records contention: ``auto`` picks the faster
#: mixing of the two (``time_to_mix``), ``adjusted`` always builds the paper's plan.
PLAN_KINDS = ("auto", "adjusted")


def plan(topology: Topology, *, max_period: int = DEFAULT_MAX_PERIOD,
         message_bytes: int | None = None, pace: int = 1, kind: str = "auto") -> Schedule:
    """The divide-and-shuffle plan for ``topology``: ``static_plan`` without contention; with
    it, ``adjusted_plan`` or ``static_plan``, whichever mixes sooner around the slow links
    (``base_plan``); with ``pace`` > 1, ``paced`` by it."""
    if not 1 <= pace <= MAX_PACE:
        raise ScheduleError(f"pace must be 1 (every round) to {MAX_PACE}, got {pace}; a slower pace "
                            "barely mixes the racks and makes the period that many times longer")
    _, base = base_plan(topology, max_period=max_period, message_bytes=message_bytes, kind=kind)
    return paced(base, topology, pace, message_bytes=message_bytes) if pace > 1 else base


def base_plan(topology: Topology, *, max_period: int = DEFAULT_MAX_PERIOD, message_bytes: int | None = None,
              kind: str = "auto") -> tuple[str, Schedule]:
    """``("static" | "adjusted", schedule)``: the plan ``plan`` paces.

    Without contention it is the static plan. With it, the adjusted plan keeps each slow link
    in a group of two, so the slowest group moves less (a ring of ``n`` moves ``2(n-1)/n`` of
    the model over each link, a pair one model), but it mixes more slowly, and at small racks
    much more slowly: racks of 3, 3 and 3 with one slow uplink mix 0.94 a round adjusted
    against 0.50 static, so the adjusted plan needs about 16 rounds where the static one needs
    1.4 to shrink the ranks' disagreement by the same factor, for a slowest group only 25 %
    lighter. On the emulated cluster that plan's runs reached ``ddp``'s accuracy in 3 seeds of
    5, the static plan's in 5 of 5. So with ``kind="auto"`` each plan is scored by
    ``time_to_mix`` and the adjusted one is built unless the static one scores lower; with
    one rack the static plan is the world's allreduce, not a divide-and-shuffle plan, and the
    adjusted one is kept. ``kind="adjusted"`` always builds the paper's plan.
    """
    if kind not in PLAN_KINDS:
        raise ScheduleError(f"plan kind must be one of {', '.join(PLAN_KINDS)}, got {kind!r}")
    uplinks, nics = contended(topology)
    if not uplinks and not nics:
        return "static", static_plan(topology, max_period=max_period, message_bytes=message_bytes)
    adjusted = adjusted_plan(topology, slow_uplinks=uplinks, slow_nics=nics, max_period=max_period,
                             message_bytes=message_bytes)
    if kind == "adjusted" or topology.num_racks == 1:
        return "adjusted", adjusted
    static = static_plan(topology, max_period=max_period, message_bytes=message_bytes)
    kept, other = time_to_mix(static, topology), time_to_mix(adjusted, topology)
    if kept >= other:
        return "adjusted", adjusted
    note = (f"the static plan, not the adjusted one: around slow uplinks {uplinks} and NICs {nics} it mixes in "
            f"{kept:.2f} slow-link transfers against the adjusted plan's {other:.2f} (planner.time_to_mix)")
    static.notes = (*static.notes, note)
    return "static", static


def time_to_mix(schedule: Schedule, topology: Topology) -> float:
    """How long ``schedule`` takes to shrink the ranks' disagreement by a factor ``e``, in
    units of one model's transfer over a slow link, when the slow links set the pace: the
    mean over the period of each round's slowest group through a flagged link (its ring
    moves ``2(n-1)/n`` models over that link; a round with none costs nothing), divided by
    ``-ln`` of the period's rho per round. Ranks wait for their group and groups reshuffle
    every round, so a slow group in every round holds back every round, whichever ranks it
    holds. Compute and clear links are left out: they cost every plan the same per round,
    which can only favour the plan that mixes faster per round."""
    uplinks, nics = (set(x) for x in contended(topology))
    nics_of = {b: [r for r in block if r in nics] for b, block in enumerate(schedule.blocks)}

    def ring(n: int) -> float:
        return 2 * (n - 1) / n

    total = 0.0
    for t in range(schedule.length):  # the compact form: named groups, then each rack's rest
        slowest = 0.0
        for group in schedule.rounds[t]:
            racks = {schedule.block_of(r) for r in group}
            if len(group) > 1 and (any(r in nics for r in group) or (len(racks) > 1 and racks & uplinks)):
                slowest = max(slowest, ring(len(group)))
        named = schedule.named(t)
        for b, size in schedule.rest_sizes(t).items():
            if size > 1 and any(r not in named for r in nics_of[b]):
                slowest = max(slowest, ring(size))
        total += slowest
    if total == 0 or schedule.rho < 1e-12:  # one period averages exactly, up to rounding
        return 0.0
    return total / schedule.length / -math.log(schedule.rho ** (1 / schedule.length))


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
    rounds (bench/README.md: ds-sync's ``inter-rack`` comparisons, where regrouping paces
    the racks). The price is slower mixing across racks; ``rho`` of the period says how
    much. Pairs around a slow *NIC* are not paced: a NIC pair that runs only every few
    rounds takes longer each time, because the job's idle socket restarts against the
    other job's established streams on that host.
    """
    if not 1 <= pace <= MAX_PACE:
        raise ScheduleError(f"pace must be 1 (every round) to {MAX_PACE}, got {pace}; a slower pace "
                            "barely mixes the racks and makes the period that many times longer")
    if pace == 1:
        return schedule
    _racks_are_blocks(schedule, topology)
    period: list[tuple[Group, ...]] = []
    for t, named in enumerate(schedule.rounds):
        period.append(named)
        period += [_rack_local(schedule, t, topology)] * (pace - 1)
    return schedule_of_rounds(period, topology, message_bytes, notes=schedule.notes)


#: ``with_uplink_probes`` puts a probe round after at most this many rounds of the plan.
PROBE_EVERY = 8


def with_uplink_probes(schedule: Schedule, topology: Topology, *, message_bytes: int | None = None) -> Schedule:
    """``schedule`` with *probe rounds*, so that timings alone can tell which rack's uplink is
    slow (dssync's addition, for ``--adjust-every``).

    In a plan where every cross-rack group holds every rack whose uplink is not flagged, a
    slow uplink slows all of them alike and no rack can be singled out. A probe round pairs
    one such rack (the *suspect*) apart as if its uplink were slow: the round of
    ``adjusted_plan``, with the suspect added to the flagged racks, that pairs it with the
    next rack after it. The racks take turns, one probe round after every ``PROBE_EVERY``
    rounds of the plan (after every period when it is shorter). A slow rack's every
    cross-rack group is then slow, while every other rack is, in some probe round, in a group
    without it (its own pair with its neighbour, or the large group while the slow one is
    paired apart). With fewer than three racks, or fewer than two unflagged ones, there is
    nothing to tell apart and ``schedule`` comes back as it is."""
    racks = topology.racks()
    uplinks, nics = contended(topology)
    suspects = [r for r in range(len(racks)) if r not in uplinks]
    if len(racks) < 3 or len(suspects) < 2:
        return schedule
    probes = []
    for i, r in enumerate(suspects):
        after = {q: k for k, q in enumerate(suspects[i + 1:] + suspects[:i])}

        def partner(partition: tuple[Group, ...], r: int = r, after: dict[int, int] = after) -> int:
            pair = next((g for g in partition if len({topology.rack_of(x) for x in g}) > 1
                         and any(topology.rack_of(x) == r for x in g)), ())
            return min((after.get(topology.rack_of(x), len(after)) for x in pair if topology.rack_of(x) != r),
                       default=len(after))

        probes.append(min(adjusted_plan(topology, slow_uplinks=[*uplinks, r], slow_nics=nics).rounds, key=partner))
    _racks_are_blocks(schedule, topology)
    every = min(schedule.length, PROBE_EVERY)
    base = math.lcm(schedule.length, every * len(probes))
    period: list[tuple[Group, ...]] = []
    for t in range(base):
        period.append(schedule.rounds[t % schedule.length])
        if (t + 1) % every == 0:
            period.append(probes[(t // every) % len(probes)])
    note = (f"a probe round after every {every} rounds pairs racks {suspects} apart in turn, so that a slow "
            "uplink shows in the timings")
    return schedule_of_rounds(period, topology, message_bytes, notes=(*schedule.notes, note))


def _rack_local(schedule: Schedule, t: int, topology: Topology) -> tuple[Group, ...]:
    """Round ``t``'s named groups with each cross-rack group's members moved into the
    largest group of their own rack that holds no slow NIC (the first of them by lowest
    rank; alone when there is none). A rack's rest holds no named rank, so joining it means
    being named no more; the rest's size and lowest rank come from the named ranks."""
    slow = set(contended(topology)[1])
    named = schedule.rounds[t]
    local = [list(g) for g in named if len({topology.rack_of(r) for r in g}) == 1]
    loose = [r for g in named if len({topology.rack_of(r) for r in g}) > 1 for r in g]
    rests: dict[int, list[int]] = {}  # rack -> [size, lowest rank] of its rest, if it has one
    for r in loose:
        rack = topology.rack_of(r)
        if rack not in rests:
            rest = schedule.rest(t, rack)
            rests[rack] = [len(rest), rest[0]] if rest and not slow & set(rest) else [0, -1]
        homes = [(len(g), -g[0], k) for k, g in enumerate(local)
                 if topology.rack_of(g[0]) == rack and not slow & set(g)]
        if rests[rack][0]:
            homes.append((rests[rack][0], -rests[rack][1], -1))
        if not homes:
            local.append([r])
            continue
        k = max(homes)[2]
        if k < 0:
            rests[rack][0] += 1
            rests[rack][1] = min(rests[rack][1], r)
        else:
            local[k].append(r)
    return tuple(tuple(sorted(g)) for g in local)


def _racks_are_blocks(schedule: Schedule, topology: Topology) -> None:
    if list(schedule.blocks) != [tuple(r) for r in topology.racks()]:
        raise ScheduleError("this takes a plan of dssync's planner (its blocks are the topology's racks)")


def contended(topology: Topology) -> tuple[list[int], list[int]]:
    """``(racks with a slow uplink, ranks with a slow NIC)`` from ``topology.contention``."""
    contention = topology.contention or {}
    return (sorted(int(u["rack"]) for u in contention.get("uplinks", [])),
            sorted(int(n["rank"]) for n in contention.get("nics", [])))
