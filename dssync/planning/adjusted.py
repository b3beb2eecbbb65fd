"""The adjusted plan (paper section III-B, Fig. 5 and 6): slow uplinks and slow NICs kept in
the smallest groups, the rest of each rack averaging as before."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dssync.errors import ScheduleError
from dssync.planning.schedule import Group, Schedule, connected
from dssync.planning.static import (
    DEFAULT_MAX_PERIOD,
    describe_rack_sizes,
    period_length,
    schedule_of_rounds,
    static_plan,
)
from dssync.topology import Topology

__all__ = ["adjusted_plan"]


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
    length, bounded = period_length(cycles, max_period)
    if bounded:
        notes.append(f"{describe_rack_sizes([len(r) for r in racks])}: a bounded period of {length} rounds "
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
            f"in groups of two for {describe_rack_sizes([len(r) for r in racks])}; drop a contention entry"
        )
    return schedule_of_rounds(period, topology, message_bytes, notes=notes)


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
