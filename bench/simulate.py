"""``dssync simulate``: communication time per iteration of each strategy, without a cluster.

Two models, both in the alpha-beta terms of the paper's Table II (``alpha`` seconds per hop,
a link's bytes per second):

- ``table_ii``: the paper's closed forms for N workers in C racks of G, with an intra-rack
  and an inter-rack per-byte delay;
- ``simulate``: an iteration-level simulation on a concrete topology. What a strategy runs
  in each iteration is its pattern (``dssync.patterns``: collectives, groups, sizes, order),
  data the strategy shares, so the simulator imports neither torch nor a strategy and
  models a strategy at any setting that shapes its pattern. Every collective is
  decomposed into the steps its algorithm takes (ring allreduce: ``2(n-1)`` steps of
  ``S/n`` bytes per member; hierarchical's reduce and broadcast: gloo's algorithms, a ring
  reduce-scatter plus a gather into the root, and a binomial tree of whole-buffer sends;
  a pairwise swap: one step of ``S`` each way; the parameter
  server: every worker sends and receives ``S/N`` to and from every shard). In a step, all
  flows of all groups that run at once share the links they cross: a worker's NIC (each
  direction) and its rack's uplink (each direction). A link of capacity ``B`` carrying ``f``
  of the job's flows gives each ``efficiency * B / f``; with ``k`` background TCP streams
  on it too, a flow first waits ``queue_s`` (the queue the streams keep full), moves its
  share of ``head_bytes`` at that rate, then the rest at ``efficiency * B / (f + w k)``
  (``w``, ``background_weight``, is 1 for TCP's per-stream share); ``dssync bench
  simcheck`` fits all of these on the emulated cluster. A step lasts ``alpha`` plus its
  slowest flow, and a group's collective the sum of its steps. Each rank keeps its own
  clock (``rank_times``): a collective of the whole world lines them up, but a ds-sync group
  starts when its last member arrives and a gossip transfer when both of its ends have, so
  a rank that left a fast group waits, next iteration, for a peer still in a slow one. A
  ring member whose last message is queued behind another job's streams on its uplink
  leaves before it arrives, and while its groups inside its rack keep its NIC busy the
  message waits, and so does its receiver (``rank_times``). A
  gossip transfer sharing its link with ``f - 1`` others ends at ``2 j / (f + 1)`` of the
  fair time, ``j`` its place in a random order (``_gossip_finish``). An iteration's figure
  is the harness's, the longest any rank spent, waits included.

On an emulated cluster one more resource can be shared: the machine itself, whose cores
move every byte through each veth it crosses (a flow inside a rack crosses two, a flow
between racks four). ``Network.host_bps`` caps those veth-bytes per second; a step then
lasts at least its veth-bytes over the cap. It is infinite for a real cluster, and for the
emulated one at the rates ``dssync bench simcheck`` validates at.

Steps of one pattern repeat (every ring step moves the same bytes over the same links), so
each distinct round's durations are computed once, with numpy over all flows, and the
clocks advance by them; 1000 iterations of 16,384 workers take seconds for every strategy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from dssync.bench.links import (
    Network,
    background_streams,
    behind_queue,
    host_time,
    per_flow_times,
    queued_senders,
    step_time,
)
from dssync.patterns import MODELLED, Op, Pattern, pattern, read_spec
from dssync.planning.planner import plan
from dssync.topology import Topology

__all__ = ["STRATEGIES", "Network", "iteration_times", "network_of", "pattern_times", "planned_rounds", "rank_times",
           "ring_round", "simulate", "table_ii", "with_contention"]

#: The strategies the simulator has a pattern of (``dssync.patterns``), in table order.
STRATEGIES = MODELLED


def _ring_groups(net: Network, groups: Sequence[Sequence[int]], size_bytes: float) -> np.ndarray:
    """All ``groups`` ring-allreduce ``size_bytes`` at once; each group's time (0 for a group
    of one)."""
    return _ring_round(net, groups, size_bytes)[0]


def _ring_round(net: Network, groups: Sequence[Sequence[int]], size_bytes: float) -> tuple[np.ndarray, tuple,
                                                                                             np.ndarray]:
    """``_ring_groups``; the ranks that leave their ring with their last message still
    queued behind background streams: ``(senders, receivers, early)``, each such sender, the
    next member of its ring its last message goes to, and how long before the group's end
    the sender leaves (its last message's time less its own last receive's, which comes
    through a clear link); and which ranks' flows fill their NIC (none elsewhere holds them
    to less)."""
    out = np.zeros(len(groups))
    live = [k for k, g in enumerate(groups) if len(g) > 1]
    none = np.zeros(0, dtype=int)
    if not live:
        return out, (none, none, np.zeros(0)), np.zeros(net.world_size, dtype=bool)
    rings = [sorted(groups[k]) for k in live]
    src = np.concatenate([np.asarray(g) for g in rings])
    dst = np.concatenate([np.roll(np.asarray(g), -1) for g in rings])
    sizes = np.concatenate([np.full(len(g), size_bytes / len(g)) for g in rings])
    # Every step of every group's ring uses the same links; groups with fewer steps finish
    # first, but while they run they share links with the others, so each group's step time
    # is its own flows' slowest rate under the common load (a bound, exact when all groups
    # have the same size).
    per_flow = per_flow_times(net, src, dst, sizes)
    host = host_time(net, src, dst, sizes)  # all groups' flows of one step, through one machine
    start = 0
    for k, g in zip(live, rings, strict=True):
        slowest = max(float(per_flow[start : start + len(g)].max()), host)
        out[k] = 2 * (len(g) - 1) * (net.alpha_s + slowest)
        start += len(g)
    own = np.maximum(per_flow, host)
    into = np.empty(net.world_size)
    into[dst] = own  # each member's own last receive
    queued = behind_queue(net, src, dst)
    early = np.maximum(own[queued] - into[src[queued]], 0.0)
    # a member whose flow runs slower than its NIC alone would send it leaves the NIC room
    fills = np.zeros(net.world_size, dtype=bool)
    fills[src] = own <= sizes / (net.efficiency * net.nics()[src]) * (1 + 1e-9)
    return out, (src[queued], dst[queued], early), fills


def ring_round(net: Network, groups: Sequence[Sequence[int]], size_bytes: float) -> float:
    """All ``groups`` ring-allreduce ``size_bytes`` at once; the slowest group's time."""
    return float(_ring_groups(net, groups, size_bytes).max(initial=0.0))


def _reduce_time(net: Network, groups: Sequence[Sequence[int]], size_bytes: float) -> float:
    """Every group reduces ``size_bytes`` to its first rank at once, as gloo's ``reduce``
    does it: a ring reduce-scatter (half an allreduce's steps), then every other member
    sends its ``1/n`` share to the root at once, which receives them all through its NIC."""
    groups = [list(g) for g in groups if len(g) > 1]
    if not groups:
        return 0.0
    scatter = ring_round(net, groups, size_bytes) / 2
    src = np.array([r for g in groups for r in g[1:]])
    dst = np.array([g[0] for g in groups for _ in g[1:]])
    shares = np.array([size_bytes / len(g) for g in groups for _ in g[1:]])
    return scatter + step_time(net, src, dst, shares)


def _broadcast_time(net: Network, groups: Sequence[Sequence[int]], size_bytes: float) -> float:
    """Every group broadcasts ``size_bytes`` from its first rank at once, as gloo's
    ``broadcast`` does it: a binomial tree of whole-buffer sends in which a rank, once it
    holds the data, posts all its sends together (the root all ``ceil(log2 n)`` of them),
    so they share its NIC. Level by level: the ranks that received in the last level send."""
    total, holders = 0.0, [[0] for _ in groups]  # per group: virtual ranks that just received
    while any(holders):
        src, dst, nxt = [], [], []
        for g, fresh in zip(groups, holders, strict=True):
            n, dim = len(g), (len(g) - 1).bit_length()
            got = []
            for v in fresh:
                low = v.bit_length()  # a rank sends along the bits above the one it received on
                for i in range(low, dim):
                    if v + (1 << i) < n:
                        src.append(g[v])
                        dst.append(g[v + (1 << i)])
                        got.append(v + (1 << i))
            nxt.append(got)
        if src:
            total += step_time(net, np.array(src), np.array(dst), np.full(len(src), size_bytes))
        holders = nxt
    return total


def rank_times(net: Network, strategy: str, size_bytes: float, iterations: int) -> np.ndarray:
    """Communication seconds of each rank in each iteration, ``(iterations, world_size)``:
    the harness's per-rank figure, from the rank's first communication call to the end
    of its last, waits for peers included.

    ``strategy`` is a name of ``dssync.patterns.MODELLED``, with the settings that shape its
    communication (``ds-sync:world_first=0.25``, ``torch-hier:rack_period=2:world_period=8``);
    unset ones are at the strategy's defaults. Its pattern (``dssync.patterns.pattern``)
    says which collectives each iteration runs, among which groups, in which order.

    Every rank keeps its own clock. A collective starts when the last member of its group
    arrives and all members leave together: a collective of the whole world (allreduce,
    ddp, diloco's outer step, torch-hier's world average) lines every rank up, ds-sync's
    groups and torch-hier's racks line up their own members only, hierarchical's leaders
    line up the leaders and each rack its own. A gossip transfer ``i -> i + 2^k`` starts
    when both ends are there, and a rank is done when its send and its receive are. The
    parameter server's workers wait for nobody. A rank that left a fast group early
    therefore waits, next iteration, for a group-mate still in a slow one, and that wait is
    communication time. Every rank computes for the same time between iterations, which
    shifts every clock alike, so compute does not appear.

    One exception to leaving together: a ring member whose last message waits in the queue
    that background streams keep full on its rack's uplink leaves once its own last receive
    is done, and the message's receiver, before its next op, waits for the rest of it. The
    rest moves while the sender is idle and stops while the sender's NIC is busy with groups
    inside its rack (``_Spells``): behind a long queue, a flow loses its NIC to flows with a
    short round trip. That is how a cross-rack pair member of ds-sync or hierarchical
    averaging holds up its partner (``bench/results/contended-pair.json``).
    """
    racks = [list(r) for r in net.topology().racks()]
    period = planned_rounds(net) if read_spec(strategy)[0] == "ds-sync" else ()
    return pattern_times(net, pattern(strategy, racks, size_bytes, steps=iterations, plan_period=period), iterations)


def pattern_times(net: Network, pat: Pattern, iterations: int) -> np.ndarray:
    """``rank_times`` of a pattern: each rank's communication seconds in each of the first
    ``iterations`` of ``pat``.

    Where a message is held behind a queue (``_Spells``), its arrival depends on what its
    sender does after it, later in the run: each pass prices the holds on the senders' busy
    spells of the pass before (the first on none), until two passes agree."""
    priced: dict[Op, _Priced] = {}  # each distinct op priced once, on first use
    can_hold = queued_senders(net)
    before = _Spells.of([]), np.zeros(0)
    for _ in range(PASSES):
        out, spells, lefts = _one_pass(net, pat, iterations, priced, before, can_hold)
        if not lefts.size or (lefts.shape == before[1].shape and np.allclose(lefts, before[1], rtol=0, atol=1e-9)):
            break
        before = spells, lefts
    return out


#: At most this many passes over a pattern with held messages (``pattern_times``).
PASSES = 8


def _one_pass(net: Network, pat: Pattern, iterations: int, priced: dict[Op, _Priced], before: tuple,
              can_hold: np.ndarray) -> tuple[np.ndarray, _Spells, np.ndarray]:
    """Each rank's communication seconds per iteration; the busy spells of the ``can_hold``
    ranks; when the sender of each held message left it, in the order they were held.

    ``before`` is the last pass's spells and leaving times. The same messages are held in
    every pass, in the same order, so a message's arrival is taken from the last pass's
    timeline of its sender, shifted by how much later the sender left it in this one."""
    out = np.zeros((iterations, net.world_size))
    clock = np.zeros(net.world_size)
    held = _Held.none()  # last messages still queued: sender, receiver, when the sender left, seconds to go
    spans: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    lefts: list[np.ndarray] = []
    hold_any = bool(can_hold.any())
    spells, left_before = before
    holds = 0
    for t in range(iterations):
        ops = pat.iteration(t)
        if not ops:
            continue
        after = clock
        for op in ops:
            if op not in priced:
                priced[op] = _priced(net, op, len(priced))
            finish, args, group, inside, live, busy, leavers = priced[op]
            due = (group[held.receiver] >= 0) | (op.kind == "send")
            if due.any():  # a receiver starts its next op once the message has arrived
                m = held.where(due)
                held = held.where(~due)
                if m.index.max(initial=-1) < left_before.size:
                    then = left_before[m.index]
                    arrival = spells.arrival(m.sender, then, m.rest) + (m.left - then)
                else:
                    arrival = m.left + m.rest
                after = after.copy()
                np.maximum.at(after, m.receiver, arrival)
            done = finish(after, *args)
            spelled = np.flatnonzero(can_hold & (group >= 0) & inside[np.maximum(group, 0)]) \
                if inside.size and hold_any else ()
            if len(spelled):  # the sender's NIC is busy with its own bytes of a group inside its rack
                members, offsets = live
                begin = np.maximum.reduceat(after[members], offsets)[group[spelled]]
                spans.append((spelled, begin, np.minimum(done[spelled], begin + busy[spelled])))
            sender, receiver, early = leavers
            if sender.size:
                done = done.copy()
                left = done[sender] - early
                done[sender] = left
                held = held.plus(_Held(sender, receiver, left, early, np.arange(holds, holds + sender.size)))
                lefts.append(left)
                holds += sender.size
            after = done
        out[t] = after - clock
        clock = after
    return out, _Spells.of(spans), np.concatenate(lefts) if lefts else np.zeros(0)


class _Held(NamedTuple):
    """Messages their senders left behind in a queue: sender, receiver, when the sender left,
    the seconds of the message still to arrive at that moment, and which message it is."""

    sender: np.ndarray
    receiver: np.ndarray
    left: np.ndarray
    rest: np.ndarray
    index: np.ndarray  # the order in which the messages were held, from the run's start

    @classmethod
    def none(cls) -> _Held:
        return cls(np.zeros(0, dtype=int), np.zeros(0, dtype=int), np.zeros(0), np.zeros(0), np.zeros(0, dtype=int))

    def where(self, keep: np.ndarray) -> _Held:
        return _Held(*(a[keep] for a in self))

    def plus(self, other: _Held) -> _Held:
        return _Held(*(np.concatenate([a, b]) for a, b in zip(self, other, strict=True)))


@dataclass(frozen=True)
class _Spells:
    """The spells in which ranks' NICs are busy with a group inside their rack, and when a
    message a rank left queued behind its uplink arrives.

    Behind a queue that background streams keep full, a flow's round trip is long, and TCP
    shares a link in inverse proportion to the round trip: while its sender sends to its
    rack-mates, the message all but stops (the flow model's sharing, ``bench/flows.py``), and
    it moves on whenever the sender's NIC is idle, waiting for a group or computing. So its
    rest arrives once the sender has been idle that long after leaving."""

    rank: np.ndarray  # the spells, by rank and then start
    end: np.ndarray
    start_key: np.ndarray  # rank * scale + start
    idle_key: np.ndarray  # rank * scale + the rank's idle time before the spell
    through: np.ndarray  # the rank's busy time to the end of the spell
    scale: float

    @classmethod
    def of(cls, spans: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> _Spells:
        if not spans:
            empty = np.zeros(0)
            return cls(np.zeros(0, dtype=int), empty, empty, empty, empty, 1.0)
        rank, start, end = (np.concatenate(a) for a in zip(*spans, strict=True))
        order = np.lexsort((start, rank))
        rank, start, end = rank[order], start[order], end[order]
        length = end - start
        through = np.cumsum(length)
        first = np.r_[0, np.flatnonzero(np.diff(rank)) + 1]
        through -= np.repeat(through[first] - length[first], np.diff(np.r_[first, rank.size]))
        scale = 4 * float(end.max()) + 1  # above any time a pass asks about (``arrival`` checks)
        return cls(rank, end, rank * scale + start, rank * scale + start - (through - length), through, scale)

    def arrival(self, sender: np.ndarray, left: np.ndarray, rest: np.ndarray) -> np.ndarray:
        """When each message arrives: after ``rest`` seconds of ``sender``'s idle time from ``left``."""
        if not self.rank.size or float((left + rest).max()) >= self.scale:
            return left + rest
        first = np.searchsorted(self.rank, sender, side="left")
        j = np.searchsorted(self.start_key, sender * self.scale + left, side="left")
        busy = np.where(j > first, self.through[j - 1] - np.maximum(self.end[j - 1] - left, 0.0), 0.0)
        idle = left - busy + rest  # the sender's idle time by the arrival
        # the sender's spells that start before it has been idle that long lie wholly before the arrival
        k = np.searchsorted(self.idle_key, sender * self.scale + idle, side="left")
        return idle + np.where(k > first, self.through[k - 1], 0.0)


class _Priced(NamedTuple):
    """An op as the model runs it (``_priced``)."""

    finish: Any  # the finish rule, ``_group_finish`` or ``_gossip_finish`` ...
    args: tuple  # ... and its arguments: what the op's groups cost when they run at once
    group: np.ndarray  # each rank's group; -1 for none, or a group of one
    inside: np.ndarray  # whether each group lies inside one rack
    live: tuple  # the groups' members, and where each group starts among them
    busy: np.ndarray  # seconds each rank's NIC is full with its own bytes of the op
    leavers: tuple  # the ranks that leave with a message still queued (``_ring_round``)


def _priced(net: Network, op: Op, index: int) -> _Priced:
    """``op`` priced on ``net`` (``_Priced``); ``index`` seeds a gossip round's order."""
    groups = [list(g) for g in op.groups]
    group = np.full(net.world_size, -1)
    racks = net.rack_of()
    live = [g for g in groups if len(g) > 1] if op.kind != "send" else []
    for k, g in enumerate(live):
        group[g] = k
    inside = np.array([len(set(racks[g])) == 1 for g in live], dtype=bool)
    members = (np.concatenate([np.asarray(g, dtype=int) for g in live]) if live else np.zeros(0, dtype=int),
               np.cumsum([0] + [len(g) for g in live[:-1]]))
    leavers: tuple = (np.zeros(0, dtype=int), np.zeros(0, dtype=int), np.zeros(0))
    fills = np.ones(net.world_size, dtype=bool)  # whether a rank's flows fill its NIC
    if op.kind == "allreduce":
        durations, leavers, fills = _ring_round(net, groups, op.nbytes)
        rule: tuple = (_group_finish, _as_round(groups, durations))
    elif op.kind == "reduce":
        rule = _group_finish, _as_round(groups, np.full(len(groups), _reduce_time(net, groups, op.nbytes)))
    elif op.kind == "broadcast":
        rule = _group_finish, _as_round(groups, np.full(len(groups), _broadcast_time(net, groups, op.nbytes)))
    elif op.kind == "push-pull":  # every worker pushes to and pulls from every shard
        together = any(len(g) > 1 for g in groups)  # a synchronous round: every push, then every reply, at once
        rule = _group_finish, _as_round(groups, np.full(len(groups), 2 * _all_to_all_time(net, op.nbytes,
                                                                                           together=together)))
    elif op.kind == "send":
        src = np.array([g[0] for g in groups], dtype=int)
        dst = np.array([g[1] for g in groups], dtype=int)
        sender = np.empty(net.world_size, dtype=int)
        sender[dst] = src  # every rank receives from one
        sizes = np.full(src.size, op.nbytes)
        flow = np.maximum(per_flow_times(net, src, dst, sizes), host_time(net, src, dst, sizes))
        link, sharing = _binding_links(net, src, dst)
        rule = _gossip_finish, (dst, sender, flow, link, sharing, np.random.default_rng(index), net.alpha_s)
    else:
        raise ValueError(f"the simulator cannot price a {op.kind!r} collective")
    # a ring member's NIC is full only while its flow runs at the NIC's rate
    busy = np.where(fills, _sent_bytes(op, net.world_size) / (net.efficiency * net.nics()), 0.0)
    return _Priced(*rule, group, inside, members, busy, leavers)


def _sent_bytes(op: Op, world_size: int) -> np.ndarray:
    """Bytes each rank sends in ``op``, by the algorithms ``_priced`` prices."""
    out = np.zeros(world_size)
    size = op.nbytes
    for g in op.groups:
        n = len(g)
        if op.kind == "send":
            out[g[0]] += size
        elif n < 2:
            continue
        elif op.kind == "allreduce":
            out[list(g)] += 2 * (n - 1) * size / n
        elif op.kind == "push-pull":  # its pushes, and its shard's replies
            out[list(g)] += 2 * (world_size - 1) * size / world_size
        elif op.kind == "reduce":  # a ring reduce-scatter, then every other member's share into the root
            out[list(g)] += (n - 1) * size / n
            out[list(g[1:])] += size / n
        elif op.kind == "broadcast":  # a binomial tree: virtual rank v sends along the bits above its own
            dim = (n - 1).bit_length()
            for v in range(n):
                out[g[v]] += size * sum(v + (1 << i) < n for i in range(v.bit_length(), dim))
    return out


def _as_round(groups: Sequence[Sequence[int]], durations: Sequence[float] | np.ndarray) -> tuple:
    """``groups`` (disjoint) that run at once, each for its duration: ``_group_finish``'s round."""
    members = np.concatenate([np.asarray(g, dtype=int) for g in groups])
    offsets = np.cumsum([0] + [len(g) for g in groups[:-1]])
    return members, offsets, np.repeat(np.asarray(durations, dtype=float), [len(g) for g in groups])


def _binding_links(net: Network, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each flow, the link with the smallest share (an id: NIC out, NIC in, uplink out,
    uplink in) and how many of these flows cross it."""
    n, racks = net.world_size, net.rack_of()
    rs, rd = racks[src], racks[dst]
    cross = rs != rd
    ids = np.stack([src, n + dst, np.where(cross, 2 * n + rs, -1), np.where(cross, 2 * n + len(net.rack_sizes) + rd, -1)])
    count = np.bincount(ids[ids >= 0], minlength=2 * n + 2 * len(net.rack_sizes)).astype(float)
    bg_nic, bg_up = background_streams(net)
    bg = np.concatenate([bg_nic, np.zeros(n), bg_up, np.zeros(len(net.rack_sizes))])
    caps = np.concatenate([net.nics(), net.nics(), net.uplinks(), net.uplinks()])
    weight = np.concatenate([np.full(n, net.local_weight), np.full(n, 0.0), np.full(2 * len(net.rack_sizes),
                                                                                  net.background_weight)])
    share = np.where(ids >= 0, caps[ids] / (count[ids] + weight[ids] * bg[ids]), np.inf)
    link = ids[np.argmin(share, axis=0), np.arange(src.size)]
    return link, count[link]


def _all_to_all_time(net: Network, size_bytes: float, *, together: bool = False) -> float:
    """Seconds for every worker to send ``size_bytes / n`` to every other worker at once (one
    direction of the parameter server's exchange), in closed form: a NIC carries ``n - 1`` of
    the job's flows each way, rack ``r``'s uplink ``G_r (n - G_r)``, and the slowest flow sits
    on the link with the smallest share (with background streams: behind their queue, its
    head alone, the rest at its weighted share). ``together``: the flows start at one moment
    (a synchronous round waits for every push before any reply), and the ``f`` of them
    through a link end one after another, the last at ``2 f / (f + 1)`` of the fair time,
    the rule gossip's exchanges showed (``_gossip_finish``); the round waits for its last.
    An asynchronous worker's pushes meet the others' at every stage of theirs instead."""
    n = net.world_size
    if n < 2:
        return 0.0
    sizes = np.asarray(net.rack_sizes, dtype=float)
    bg_nic, bg_up = background_streams(net)
    crossing = sizes * (n - sizes)
    live = crossing > 0
    share = size_bytes / n

    def last(flows: float) -> float:  # the last of ``flows`` that started together, over the fair time
        return 2 * flows / (flows + 1) if together else 1.0
    # the slowest flow on a link without background streams ...
    nics, ups = net.nics(), net.uplinks()
    seconds = last(n - 1) * share * (n - 1) / (net.efficiency * float(nics.min()))
    if live.any():
        seconds = max(seconds, max(last(f) * share * f / (net.efficiency * float(b))
                                   for f, b in zip(crossing[live], ups[live], strict=True)))
    # ... and on each link with them (a NIC, an uplink), as per_flow_times prices it
    for bps, flows, k in [(nics[i], n - 1, net.local_weight * bg_nic[i]) for i in np.flatnonzero(bg_nic)] + \
            [(ups[r], crossing[r], net.background_weight * bg_up[r]) for r in np.flatnonzero(live & (bg_up > 0))]:
        head = min(share, net.head_bytes / flows)
        seconds = max(seconds, net.queue_s + last(flows) * (head * flows + (share - head) * (flows + k))
                      / (net.efficiency * bps))
    if np.isfinite(net.host_bps):
        intra = float((sizes * (sizes - 1)).sum())
        veth_bytes = share * (2 * intra + 4 * (n * (n - 1) - intra))
        background = len(net.uplink_out_streams) * net.uplink_bps + len(net.nic_out_streams) * min(net.nic_bps, net.uplink_bps)
        seconds = max(seconds, veth_bytes / max(net.host_bps - 3 * background, 0.1 * net.host_bps))
    return net.alpha_s + seconds


def _group_finish(clock: np.ndarray, members: np.ndarray, offsets: np.ndarray, durations: np.ndarray) -> np.ndarray:
    """When each rank leaves its group: the group's last arrival plus the group's time."""
    start = np.maximum.reduceat(clock[members], offsets)
    finish = clock.copy()
    finish[members] = np.repeat(start, np.diff(np.append(offsets, members.size))) + durations
    return finish


def _gossip_finish(clock: np.ndarray, dst: np.ndarray, src: np.ndarray, flow: np.ndarray, link: np.ndarray,
                   sharing: np.ndarray, rng: np.random.Generator, alpha_s: float) -> np.ndarray:
    """When each rank is done: its send to ``dst`` and its receive from ``src`` both ended;
    a transfer starts when both of its ends are there. The ``f`` transfers that share their
    binding link do not end together, as fair sharing would have them: TCP flows through one
    drop-tail queue end one after another, in an order that changes from round to round (a
    random one here), the ``j``-th of them after ``2 j / (f + 1)`` of the fair time, so that
    they take the fair time on average and the last one ``2 f / (f + 1)`` of it (what gossip's
    exchanges on the emulated cluster show, bench/README.md)."""
    key = rng.random(link.size)
    order = np.lexsort((key, link))
    first = np.r_[0, np.flatnonzero(np.diff(link[order])) + 1]
    position = np.empty(link.size)
    position[order] = np.arange(link.size) - np.repeat(first, np.diff(np.r_[first, link.size]))
    sent = np.maximum(clock, clock[dst]) + alpha_s + flow * 2 * (position + 1) / (sharing + 1)
    return np.maximum(sent, sent[src])


def iteration_times(net: Network, strategy: str, size_bytes: float, iterations: int) -> np.ndarray:
    """Communication seconds of each of ``iterations`` iterations of ``strategy``: the
    max-rank figure, the longest any rank spent (``rank_times``)."""
    return rank_times(net, strategy, size_bytes, iterations).max(axis=1)


def network_of(scenario: str, *, rate_scale: float = 1.0, rack_sizes: Sequence[int] | None = None,
               nic_bps: float | None = None, uplink_bps: float | None = None, alpha_s: float = 0.0,
               **model: Any) -> Network:
    """The model of an emulated scenario (``dssync.launch.emulate.SCENARIOS``): its racks (or
    ``rack_sizes``), its NIC and uplink rates times ``rate_scale`` (or ``nic_bps`` and
    ``uplink_bps``, bytes/s; its rate-limited NICs and uplinks keep their ratio to them), its
    background streams at the ranks and racks it names (``ValueError`` where the layout has no
    such rank or rack); ``alpha_s`` (0 here, a fitted value in ``dssync bench simcheck``) and
    ``model``, the other ``Network`` settings."""
    from dssync.launch import emulate

    if not rate_scale > 0:
        raise ValueError(f"rate_scale must be positive, got {rate_scale}")
    spec = emulate.SCENARIOS[scenario]
    sizes = tuple(spec["rack_sizes"] if rack_sizes is None else rack_sizes)
    nominal_nic, nominal_up = (emulate.parse_rate(spec[k]) / 8 for k in ("nic", "uplink"))
    nic = nominal_nic * rate_scale if nic_bps is None else nic_bps
    up = nominal_up * rate_scale if uplink_bps is None else uplink_bps
    named = [("rack" if kind == "rack" else "rank", i) for kind, i in spec["flows"]]
    named += [("rank", int(i)) for i in spec.get("nics", {})] + [("rack", int(r)) for r in spec.get("uplinks", {})]
    for what, i in named:
        if not 0 <= i < (len(sizes) if what == "rack" else sum(sizes)):
            raise ValueError(f"scenario {scenario} names {what} {i}; the layout {list(sizes)} has no such {what}")
    uplink_bg: dict[int, int] = {}
    nic_bg: dict[int, int] = {}
    for kind, index in spec["flows"]:
        streams = uplink_bg if kind == "rack" else nic_bg
        streams[index] = streams.get(index, 0) + emulate.FLOW_STREAMS
    slow = {int(i): emulate.parse_rate(rate) / 8 * nic / nominal_nic for i, rate in spec.get("nics", {}).items()}
    slow_up = {int(r): emulate.parse_rate(rate) / 8 * up / nominal_up for r, rate in spec.get("uplinks", {}).items()}
    return Network(sizes, nic_bps=nic, uplink_bps=up, uplink_out_streams=uplink_bg, nic_out_streams=nic_bg,
                   slow_nics=slow, slow_uplinks=slow_up, alpha_s=alpha_s, **model)


def planned_rounds(net: Network) -> tuple:
    """ds-sync's rounds on ``net``: the planner's period for the topology a probe would find."""
    return plan(with_contention(net)).period


def with_contention(net: Network) -> Topology:
    """The topology ds-sync would probe: racks plus the contended uplinks and NICs."""
    base = net.topology()
    uplinks = sorted(set(net.uplink_out_streams) | set(net.slow_uplinks)
                     | ({int(net.rack_of()[i]) for i in net.nic_out_streams} if net.nic_crosses_uplink else set()))
    contention = {"uplinks": [{"rack": r} for r in uplinks],
                  "nics": [{"rank": i} for i in sorted(set(net.nic_out_streams) | set(net.slow_nics))]}
    data = base.to_dict()
    data["contention"] = contention
    return Topology.from_dict(data)


def simulate(net: Network, strategies: Sequence[str], *, size_bytes: float, iterations: int = 1000,
             compute_ms: float = 0.0) -> dict[str, Any]:
    """Per strategy: median and mean over ``iterations`` of the harness's communication figure (the
    longest any rank spent), ``per_rank_ms``, what one rank spends on average, and
    ``wall_ms``, an iteration's wall time: ``compute_ms`` plus the communication of the rank
    that finishes last, per iteration (the job ends with its last rank)."""
    out = {}
    for s in strategies:
        ranks = rank_times(net, s, size_bytes, iterations)
        times = ranks.max(axis=1)
        out[s] = {"median_ms": 1e3 * float(np.median(times)), "mean_ms": 1e3 * float(np.mean(times)),
                  "per_rank_ms": 1e3 * float(ranks.mean()), "total_s": float(times.sum()),
                  "wall_ms": compute_ms + 1e3 * float(ranks.sum(axis=0).max()) / iterations}
    return out


def table_ii(*, workers: int, racks: int, size_bytes: float, alpha_s: float, beta1_s: float, beta2_s: float,
             layers: int = 1) -> dict[str, float]:
    """The paper's Table II (seconds per iteration), with ``G = workers / racks`` per rack."""
    n, c, g, s, lat = workers, racks, workers / racks, size_bytes, layers * alpha_s
    return {
        "ps": 2 * (n - 1) * lat + 2 * ((c - 1) * g * s * beta2_s + (g - 1) * s * beta1_s),
        "ring": 2 * (n - 1) * lat + 2 * (n - 1) * s * beta2_s / n,
        "hierarchical": 2 * (g + c - 2) * lat + 2 * (g - 1) * s * beta1_s / g + 2 * (c - 1) * s * beta2_s / c,
        "gossip": 2 * lat + 4 * s * beta2_s,
        "DS-Sync": max(2 * lat + 2 * s * beta2_s, 2 * (g - 1) * lat + 2 * (g - 2) * s * beta1_s / max(g - 1, 1)),
    }
