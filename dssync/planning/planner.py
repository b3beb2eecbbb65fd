"""Planning divide-and-shuffle schedules from a topology (paper section III-B).

Pure code: numpy only, no process groups. ``static_plan`` is ``initGroups`` of the
paper (Fig. 4); ``check_static`` states the invariants that plan guarantees, so tests and
the ``dssync plan`` command can verify a schedule against a topology.

Plans are built in the schedule's compact form (``dssync.schedule``): the racks are its
blocks, and a round names only its cross-rack groups and its pairs; each rack's large
intra-rack group is the rest of the rack. So planning costs about ``period x (racks +
named ranks)``, never ``period x ranks``, and the checks look at named ranks only.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from dssync.errors import ScheduleError
from dssync.schedule import Group, Partition, Schedule, connected
from dssync.topology import Topology

__all__ = ["adjusted_plan", "check_adjusted", "check_paced", "check_static", "paced", "plan", "predict_round_ms",
           "static_plan", "with_uplink_probes"]

#: Longest period for which racks of unequal size rotate in their exact least common
#: multiple; beyond it (say racks of 7, 8, 9 and 11 ranks: lcm 5544) the plan uses a
#: bounded rotation of at least this many rounds instead.
DEFAULT_MAX_PERIOD = 64
#: The slowest pace a plan may take: racks exchange at least every this many rounds.
MAX_PACE = 64


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
        length, bounded = _period_length(sizes, max_period)
        if bounded:
            notes.append(f"{_sizes(sizes)}: a bounded period of {length} rounds (exact rotation "
                         f"needs {math.lcm(*sizes)}); representation counts within a rack differ by at most one")
        period = _rotation(racks, length, shifted=False)
        if not connected(topology.world_size, racks, period):
            # Racks of two have a singleton intra-rack group, so when every rack is that
            # small, lock-step rotation pairs the same representatives forever (racks
            # {0,1},{2,3}: only 0-2 and 1-3 ever meet). Shift rack r's rotation by r more
            # each block of rounds, so every pairing occurs and the period mixes.
            period = _rotation(racks, length * max(sizes), shifted=True, block=length)
    return _schedule(period, topology, message_bytes, notes=notes)


def plan(topology: Topology, *, max_period: int = DEFAULT_MAX_PERIOD,
         message_bytes: int | None = None, pace: int = 1) -> Schedule:
    """``adjusted_plan`` for the contention the topology records, ``static_plan`` without any;
    with ``pace`` > 1, ``paced`` by it."""
    if not 1 <= pace <= MAX_PACE:
        raise ScheduleError(f"pace must be 1 (every round) to {MAX_PACE}, got {pace}; a slower pace "
                            "barely mixes the racks and makes the period that many times longer")
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
    return _schedule(period, topology, message_bytes, notes=schedule.notes)


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
    return _schedule(period, topology, message_bytes, notes=(*schedule.notes, note))


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


def _schedule(rounds: Sequence[Sequence[Group]], topology: Topology, message_bytes: int | None, *,
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


def adjusted_plan(
    topology: Topology,
    *,
    slow_uplinks: Sequence[int] = (),
    slow_nics: Sequence[int] = (),
    max_period: int = DEFAULT_MAX_PERIOD,
    message_bytes: int | None = None,
) -> Schedule:
    """``adjustGroups`` of the paper (section III-B.2 and B.3, Fig. 5 and 6), for any number
    of racks, rack sizes, slow uplinks and slow NICs.

    Built on ``static_plan``'s rounds (representatives cross racks, the rest of each rack an
    intra-rack group), then:

    * **Slow NIC of rank i** (Fig. 6): i is never in a group of more than two, and never
      crosses racks while its rack has a worker with a clear NIC. Each round the rack's
      *regular* (clear) workers take the cross-rack roles first, then partner the slow ones,
      one each; the rest of them form the large intra-rack group. All of these rotate, so
      the large group exchanges members with the pairs and the inter-rack groups. The paper
      does this "if there are enough workers in the rack"; where there are not, the plan
      still keeps every slow NIC in a group of at most two and says so in
      ``Schedule.notes``: slow workers without a regular partner pair with each other (an
      odd one sits the round out), and a rack with one clear worker is represented every
      other round so that worker partners a slow one in between. A rack with no clear
      worker is represented by its slow workers in turn, each time in a cross-rack *pair*
      (as if its uplink were slow), the only way it can meet the other racks.
    * **Slow uplink of rack r** (Fig. 5): r's representative is in a cross-rack group of
      exactly two, with a worker of a *regular* rack (one whose uplink is clear), and that
      rack rotates; so r puts one flow on its uplink per round. The regular racks keep
      meeting each other directly: each keeps its representative in the large inter-rack
      group, and a rack that partners a slow one sends a second worker for the pair (when
      it has one to spare). Slow racks beyond the regular ones pair among themselves, and
      with every uplink slow they all do (one left over sits the round out).

    **Representation.** Each rack's regular workers are a queue that advances by the number
    that crossed in the round, so within one period the numbers of rounds any two regular
    workers of a rack spend in cross-rack groups differ by at most one (a slow-NIC rack
    with one clear worker: that worker, every other round). The period is the least common
    multiple of the rotation lengths, repeated until every queue wraps exactly (then they
    cross equally often), up to ``max_period`` rounds; beyond it (say racks of 7, 8, 9 and
    11 ranks) it is the shortest multiple of the longest rotation that is at least
    ``max_period`` rounds, and the bound of one holds. When a period does not mix (rho = 1,
    rotations in lock step), its rotations are shifted against each other block by block
    (see the code); the bound is then one per block, and ``Schedule.notes`` says how many
    blocks. If nothing mixes the plan is refused with a ``ScheduleError``.
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
    multi = len(racks) > 1
    slow_set = set(slow_nics)
    members = [_RackMembers(regular=[i for i in rack if i not in slow_set], slow=[i for i in rack if i in slow_set])
               for rack in racks]
    slow_racks = sorted(set(slow_uplinks) | {r for r, m in enumerate(members) if multi and not m.regular})
    notes = _adjusted_notes(members, slow_racks, multi)
    cycles = [c for m in members for c in (len(m.regular), len(m.slow) * (2 if m.alternate else 1)) if c]
    regular_racks = len(racks) - len(slow_racks)
    if multi and slow_racks:
        cycles.append(max(len(slow_racks), regular_racks))
    length, bounded = _period_length(cycles, max_period)
    if bounded:
        notes.append(f"{_sizes([len(r) for r in racks])}: a bounded period of {length} rounds "
                     f"(exact rotation needs {math.lcm(*cycles)}); crossing counts within a rack differ by at "
                     "most one")
    shape = (len(racks), slow_racks, multi)
    period, heads = _adjusted_rounds(members, shape, length)
    # Repeat the period until every rack's queue of clear workers has gone round a whole
    # number of times: then each of them crosses racks equally often, also when the
    # rotations are shifted block by block below.
    turns = math.lcm(*(len(m.regular) // math.gcd(h, len(m.regular)) for m, h in zip(members, heads, strict=False)
                       if m.regular))
    if not bounded and length * turns <= max(max_period, length):
        length *= turns
        period, _ = _adjusted_rounds(members, shape, length)
    # Rotations of equal length run in lock step and can keep the same ranks apart forever
    # (racks of two, where the intra-rack group is one worker). Then each rotation is
    # shifted by its own offset every period-length block: first the static plan's
    # ``block * index``, then seeded pseudo-random offsets over more blocks; the same
    # seeds on every rank give every rank the same plan.
    columns = 2 * len(racks) + 1
    blocks = max(cycles)
    shift = np.arange(blocks)[:, None] * np.arange(columns)[None, :]
    for attempt in range(33):
        if connected(n, racks, period):
            break
        if attempt:
            blocks = max(cycles) * (1 + (attempt - 1) // 8)
            shift = np.random.default_rng(attempt).integers(0, 2**20, size=(blocks, columns))
        period, _ = _adjusted_rounds(members, shape, length * blocks, block=length, shift=shift)
    if len(period) > length:
        notes.append(f"rotations shifted in {len(period) // length} blocks of {length} rounds to mix; crossing "
                     f"counts within a rack differ by at most one per block")
    if not connected(n, racks, period):
        raise ScheduleError(
            f"no mixing plan keeps slow uplinks {sorted(set(slow_uplinks))} and slow NICs {sorted(slow_set)} "
            f"in groups of two for {_sizes([len(r) for r in racks])}; drop a contention entry"
        )
    return _schedule(period, topology, message_bytes, notes=notes)


@dataclass(frozen=True)
class _RackMembers:
    regular: list[int]  # clear NICs: they cross racks, partner slow ones, form the large group
    slow: list[int]  # slow NICs: in a pair, or alone, every round

    @property
    def alternate(self) -> bool:
        """One clear worker and slow ones: represented every other round, so that worker
        partners a slow one in between (else the slow ones would only ever meet each other)."""
        return len(self.regular) == 1 and bool(self.slow)


def _adjusted_notes(members: list[_RackMembers], paired: list[int], multi: bool) -> list[str]:
    """Why the plan departs from Fig. 5 and 6 as the paper draws them, rack by rack."""
    notes = []
    for r, m in enumerate(members):
        spare = len(m.regular) - (1 if multi else 0)
        if not m.slow or spare >= len(m.slow):
            continue
        if multi and not m.regular:
            notes.append(f"rack {r}: every NIC is slow ({m.slow}); its slow workers represent it in turn, "
                         "each time in a cross-rack pair, and pair with each other inside it")
        elif m.alternate and multi:
            notes.append(f"rack {r}: one clear NIC ({m.regular[0]}) for slow NICs {m.slow}: the rack is "
                         "represented every other round, its clear worker partners a slow one in between, "
                         "and the other slow workers pair with each other or sit the round out")
        else:
            notes.append(f"rack {r}: {len(m.slow)} slow NICs ({m.slow}) and {max(spare, 0)} clear workers to "
                         "partner them: slow workers without a clear partner pair with each other or sit the "
                         "round out")
    if multi and paired and len(paired) == len(members):
        notes.append(f"every uplink is slow or belongs to a rack with no clear NIC (racks {paired}): racks "
                     "meet only in pairs, one left over sits the round out")
    return notes


def _sizes(sizes: Sequence[int]) -> str:
    """Rack sizes for a note: ``racks of [7, 8, 9, 11] workers``, or for many racks how many
    and the range (``1000 racks of 50 to 150 workers``)."""
    if len(sizes) <= 12:
        return f"racks of {list(sizes)} workers"
    low, high = min(sizes), max(sizes)
    return f"{len(sizes)} racks of {low}" + (f" to {high}" if high > low else "") + " workers"


def _period_length(cycles: Sequence[int], max_period: int) -> tuple[int, bool]:
    """``(rounds, bounded)``: the least common multiple of ``cycles`` when it is at most
    ``max(max_period, longest)``; else the shortest multiple of the longest cycle that is at
    least ``max_period``."""
    longest = max(cycles)
    exact = math.lcm(*cycles)
    if exact <= max(max_period, longest):
        return exact, False
    return longest * math.ceil(max_period / longest), True


def _adjusted_rounds(members: list[_RackMembers], shape: tuple[int, list[int], bool], length: int,
                     *, block: int = 1, shift: np.ndarray | None = None) -> tuple[list[tuple[Group, ...]], list[int]]:
    """The rounds of ``adjusted_plan``. Rack ``r``'s regular workers are a queue advanced by
    how many of them crossed racks in the round (by one when none did), its slow workers one
    advanced by one a round (every other round for an alternating rack); the rack pairing
    rotates by one a round. At each ``block`` boundary queue ``c`` jumps by ``shift[b, c]``
    (columns: regular queues, slow queues, the pairing). Returns the rounds and where each
    queue ended (the clear queues: how many crossings the rack made). A round names every
    group but each rack's large one: the regular workers its queue did not reach this round,
    the rest of the rack."""
    n_racks, slow_racks, multi = shape
    head = [0] * (2 * n_racks + 1)
    period: list[tuple[Group, ...]] = []
    for t in range(length):
        if shift is not None and t % block == 0:
            head = [h + int(s) for h, s in zip(head, shift[t // block], strict=True)]
        present = [r for r, m in enumerate(members) if multi and not (m.alternate and t % 2)]
        crossing: dict[int, list[int]] = {}  # rack -> how many workers it sends: 1, or 2 (rep and pair)
        groups: list[tuple[int, ...]] = []
        pairs: list[tuple[int, int]] = []  # (slow rack, partner rack), or (slow rack, slow rack)
        big: list[int] = []  # racks in the large inter-rack group
        if multi:
            slow = [r for r in slow_racks if r in present]
            clear = [r for r in present if r not in slow_racks]
            s, q = len(slow), len(clear)
            if s > q:
                slow = [slow[(head[-1] + j) % s] for j in range(s)]
                pairs = list(zip(slow, clear, strict=False))
                pairs += [(slow[k], slow[k + 1]) for k in range(q, s - 1, 2)]
            elif s:
                partners = [clear[(head[-1] + j) % q] for j in range(q)]
                pairs = list(zip(slow, partners, strict=False))
            big = clear
            for r in [x for pair in pairs for x in pair] + big:
                crossing[r] = 1
            for _, b in pairs:
                if b in big and _can_spare(members[b]):
                    crossing[b] = 2
                elif b in big:
                    big = [x for x in big if x != b]
            if len(big) == 1:  # a large group of one rack crosses nothing: its representative stays home
                crossing[big.pop()] -= 1
        sent: dict[int, list[int]] = {}
        for r, m in enumerate(members):
            # The queue of regular workers from its head: the first ones cross and partner slow
            # workers, the ones it does not reach stay the rack's rest (named by no group).
            first, reached = head[r], 0
            # The queue moves on by as many as crossed, so crossing goes round the rack in turn;
            # a rack that never crosses (one rack alone) still rotates its slow NICs' partners.
            head[r] += crossing.get(r, 0) or (0 if multi else 1)
            lone = [m.slow[(head[n_racks + r] + k) % len(m.slow)] for k in range(len(m.slow))]
            if not m.alternate or t % 2:
                head[n_racks + r] += 1
            out = []
            for _ in range(crossing.get(r, 0)):
                if reached < len(m.regular):
                    out.append(m.regular[(first + reached) % len(m.regular)])
                    reached += 1
                else:
                    out.append(lone.pop(0))
            sent[r] = out
            for w in list(lone):
                if reached < len(m.regular):
                    groups.append((w, m.regular[(first + reached) % len(m.regular)]))
                    reached += 1
                    lone.remove(w)
            groups += [tuple(lone[k:k + 2]) for k in range(0, len(lone), 2)]
        for a, b in pairs:
            groups.append((sent[a].pop(), sent[b].pop()))
        if big:
            groups.append(tuple(sent[r].pop() for r in big))
        if multi:
            head[-1] += 1
        period.append(tuple(tuple(sorted(g)) for g in groups))
    return period, head


def _can_spare(m: _RackMembers) -> bool:
    """Whether a regular rack can send a second worker for a slow rack's pair and still have
    a clear worker for each slow NIC it pairs (at least one)."""
    return len(m.regular) >= 2 + (1 if m.slow else 0)


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


def _rotation(racks: list[list[int]], length: int, *, shifted: bool, block: int = 1) -> list[tuple[Group, ...]]:
    """Each round names its inter-rack group, one representative per rack; the rest of each
    rack is its intra-rack group."""
    return [(tuple(rack[(t + (t // block) * r * shifted) % len(rack)] for r, rack in enumerate(racks)),)
            for t in range(length)]


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
