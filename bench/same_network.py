"""Whether a probe's answer is the same network as the one that was built.

The rule (issue 37): **two answers are the same network when every pattern of the job's own
flows gets the same rates on both.** For every set of concurrent flows between the job's
workers that ``patterns`` lists, the max-min fair rate of each flow on the answer's network
must equal its rate on the true network within ``TOLERANCE`` (5 %). The patterns are every
single flow (each ordered pair), every two flows at once, each rack's members sending to
each other rack and to every worker outside it (all at once, per rack, for the true racks
and the answer's), the ring both ways (rank ``i`` to ``i + 1``, all at once), and each
round of the divide-and-shuffle period ``dssync.planning.plan`` builds for the true racks
and for the answer's (every group of a round runs its ring at once).

This module decides that on its own: it reads the layout that was built and the racks and
flags of the answer, and nothing of the prober (``dssync.probing``) or its inference
(``dssync.topology``'s contention and rack code).

**The link model.** A link is a *set of the job's ordered pairs* that cross it, a capacity,
and the background TCP streams on it; rates are max-min fair, one share per TCP stream
(``max_min_rates``). The true network (``true_network``) is what ``dssync emulate`` builds:
every worker's NIC and every rack's uplink shaped both ways, at the NIC and uplink rates
(1 Gbit/s, ``emulate up``'s defaults) or the lowered rate of a ``slow_uplinks`` or
``slow_nics`` entry; another job's flow across rack ``r``'s uplink is
``UPLINK_FLOW_STREAMS`` streams on the uplink's rack-to-spine direction (``emulate contend
--flows rack:r``, 8 streams from the rack's background host to the spine's sink), one
through worker ``i``'s NIC is ``NIC_FLOW_STREAMS`` streams out of that NIC only (``--flows
nic:i --streams 2``: to its own rack's background host, not through the uplink). A busy
CPU (``busy_cpus``) is not a property of the network and is ignored.

**The answer's links.** An answer (``Answer``) names racks and which uplinks and NICs are
contended, but not *how*: a lower rate or other traffic, which direction, how many streams.
Each direction of each of its links is a set of pairs as well, and links are identified by
the flows they carry, since nothing else about a link is visible to the job's flows:
- an unflagged link is clear: the nominal rate, no background;
- a flagged link that carries the same pairs as a contended link of the true network (in
  either direction) *is* that link: each direction takes every true link carrying exactly
  its pairs, with their rates and background (a direction that no true link matches is
  clear). This is the strict reading, "the answer implies the same bottlenecks": a flag on
  the right link is right whatever kind of contention made it slow. The rate the probe
  recorded for the link (``bandwidth_gbps``) is not used there: it is what one probe flow
  got, a share rather than a capacity, and a link model built from it (say 0.33 Gbit/s
  both ways for a 1 Gbit/s NIC that two streams leave) gets every pattern wrong that puts
  two of the job's flows on the link or one on its other direction, though the answer
  named the right link;
- a flagged link that carries no contended true link's pairs claims a bottleneck the true
  network does not have there. It is modelled at the rate the answer recorded for it
  (``bandwidth_gbps``), both ways, without background; with no recorded rate, at the
  lowest rate that explains every single pair's rate across it (the largest true
  single-flow rate among its pairs), the project's earlier practical reading: a flag that
  no pair's rate contradicts.
So a missed flag leaves a contended link clear, a flag on a link that is in fact clear
slows it to what the probe measured, and racks that move a worker behind another uplink
change which links its flows cross; each changes some pattern's rates by more than 5 %
unless no pattern of the job's flows can tell, and then the answers are the same network:
a rack of one behind an uplink as fast as its NIC is the same as that worker in a rack of
its own or (where its flows cross its only neighbour's uplink anyway) merged with others;
in a two-rack world whose other rack is one worker, the big rack's uplink and that
worker's NIC carry the same pairs, so a flag on either is the same network.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dssync.bench.probe_layouts import Layout

__all__ = ["NIC_FLOW_STREAMS", "TOLERANCE", "UPLINK_FLOW_STREAMS", "Answer", "Difference", "Link", "Network",
           "answer_network", "best_answer", "compare", "max_min_rates", "patterns", "same_network", "through_other_jobs",
           "true_network"]

#: Rates of one flow on the two networks are the same when they differ by at most this
#: fraction of the larger one.
TOLERANCE = 0.05
#: TCP streams of another job's flow across an uplink (``emulate contend --flows rack:I``,
#: ``FLOW_STREAMS``) and through a NIC (``bench probe-layouts`` starts ``nic:I`` with 2).
UPLINK_FLOW_STREAMS = 8
NIC_FLOW_STREAMS = 2
#: ``emulate up``'s default NIC and uplink rates, Gbit/s.
NIC_GBPS = 1.0
UPLINK_GBPS = 1.0

Pair = tuple[int, int]


@dataclass(frozen=True)
class Link:
    """One direction of a link: the job's pairs whose flows cross it, its capacity (Gbit/s)
    and the background TCP streams that cross it and nothing else of the job's."""

    name: str
    pairs: frozenset[Pair]
    gbps: float
    background: int = 0


@dataclass(frozen=True)
class Network:
    """The links of a network of ``world_size`` workers; ``rates`` gives a pattern's rates."""

    world_size: int
    links: tuple[Link, ...]
    _crossing: dict[Pair, tuple[int, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        crossing: dict[Pair, list[int]] = {}
        for k, link in enumerate(self.links):
            for pair in link.pairs:
                crossing.setdefault(pair, []).append(k)
        object.__setattr__(self, "_crossing", {p: tuple(ks) for p, ks in crossing.items()})

    def rates(self, flows: Sequence[Pair]) -> list[float]:
        """Max-min fair rates (Gbit/s) of ``flows`` all at once, with the links' background."""
        return max_min_rates([self._crossing.get(tuple(f), ()) for f in flows],
                             [link.gbps for link in self.links], [link.background for link in self.links])


def max_min_rates(crossing: Sequence[Sequence[int]], capacity: Sequence[float],
                  background: Sequence[int] = ()) -> list[float]:
    """Max-min fair rates by progressive filling. Flow ``f`` crosses links ``crossing[f]``;
    link ``k`` has ``capacity[k]`` and ``background[k]`` greedy streams that cross it alone.
    Every stream's rate grows alike until a link is full; its streams are frozen there. A
    flow that crosses no link gets ``inf``."""
    n_links = len(capacity)
    bg = list(background) + [0] * (n_links - len(background))
    left = [max(float(c), 0.0) for c in capacity]
    users = [0] * n_links
    for links in crossing:
        for k in links:
            users[k] += 1
    rates = [math.inf] * len(crossing)
    active = set(range(len(crossing)))
    full = [False] * n_links
    while active:
        shares = {k: left[k] / (users[k] + bg[k]) for k in range(n_links) if users[k] and not full[k]}
        if not shares:
            break
        level = min(shares.values())
        tight = {k for k, s in shares.items() if s <= level * (1 + 1e-9) + 1e-15}
        for k in tight:
            full[k] = True
        for f in [f for f in active if any(k in tight for k in crossing[f])]:
            rates[f] = level
            active.discard(f)
            for k in crossing[f]:
                left[k] -= level
                users[k] -= 1
    return rates


# -- the two networks --------------------------------------------------------------------------
def _gbps(rate: str | float | int) -> float:
    if isinstance(rate, int | float):
        return float(rate)
    from dssync.launch.emulate.state import parse_rate

    return parse_rate(rate) / 1e9


def _canonical(racks: Sequence[int]) -> tuple[list[int], dict[int, int]]:
    """Racks renumbered in order of their lowest rank, and the renumbering."""
    renumber: dict[int, int] = {}
    for r in racks:
        renumber.setdefault(int(r), len(renumber))
    return [renumber[int(r)] for r in racks], renumber


_OTHER_WAY = {"nic-out": "nic-in", "nic-in": "nic-out", "up-out": "up-in", "up-in": "up-out"}


def _directions(racks: Sequence[int]) -> dict[tuple[str, int], frozenset[Pair]]:
    """Every link direction of a network with ``racks``, by name, with the pairs crossing it."""
    n = len(racks)
    pairs = [(i, j) for i in range(n) for j in range(n) if i != j]
    out: dict[tuple[str, int], frozenset[Pair]] = {}
    for i in range(n):
        out["nic-out", i] = frozenset(p for p in pairs if p[0] == i)
        out["nic-in", i] = frozenset(p for p in pairs if p[1] == i)
    for g in sorted(set(racks)):
        out["up-out", g] = frozenset(p for p in pairs if racks[p[0]] == g and racks[p[1]] != g)
        out["up-in", g] = frozenset(p for p in pairs if racks[p[0]] != g and racks[p[1]] == g)
    return {name: ps for name, ps in out.items() if ps}


def true_network(layout: Layout, *, nic_gbps: float = NIC_GBPS, uplink_gbps: float = UPLINK_GBPS) -> Network:
    """The network ``layout`` builds (see the module's docstring)."""
    racks = layout.racks
    links = []
    for (kind, index), pairs in _directions(racks).items():
        if kind.startswith("nic"):
            gbps = _gbps(layout.slow_nics[index]) if index in layout.slow_nics else nic_gbps
            background = NIC_FLOW_STREAMS * (kind == "nic-out" and index in layout.nic_flows)
        else:
            gbps = _gbps(layout.slow_uplinks[index]) if index in layout.slow_uplinks else uplink_gbps
            background = UPLINK_FLOW_STREAMS * (kind == "up-out" and index in layout.uplink_flows)
        links.append(Link(f"{kind}{index}", pairs, gbps, int(background)))
    return Network(len(racks), tuple(links))


@dataclass(frozen=True)
class Answer:
    """What a probe reported: each rank's rack, and the flagged uplinks (rack -> the rate
    it recorded, Gbit/s, or ``None``) and NICs (rank -> rate or ``None``). Rack numbers are
    any labels; ``uplinks`` uses the same labels."""

    racks: tuple[int, ...]
    uplinks: Mapping[int, float | None] = field(default_factory=dict)
    nics: Mapping[int, float | None] = field(default_factory=dict)

    @classmethod
    def from_topology(cls, topology: Mapping[str, Any]) -> Answer:
        """From a topology.json dict: ``workers[].rack`` in rank order, and the
        ``contention`` record's ``uplinks[].rack`` and ``nics[].rank`` with their
        ``bandwidth_gbps`` where recorded."""
        workers = sorted(topology["workers"], key=lambda w: w.get("rank", 0))
        contention = topology.get("contention") or {}
        return cls(tuple(int(w["rack"]) for w in workers),
                   {int(u["rack"]): u.get("bandwidth_gbps") for u in contention.get("uplinks", [])},
                   {int(n["rank"]): n.get("bandwidth_gbps") for n in contention.get("nics", [])})

    @classmethod
    def of_layout(cls, layout: Layout) -> Answer:
        """The exact answer: ``layout``'s racks and contended links."""
        return cls(tuple(layout.racks), dict.fromkeys(layout.contended_uplinks), dict.fromkeys(layout.contended_nics))


def _contended(true: Network, nic_gbps: float, uplink_gbps: float) -> set[frozenset[Pair]]:
    """The pairs of each link of ``true`` that is slower than nominal or carries background."""
    nominal = {"nic": nic_gbps, "up-": uplink_gbps}
    return {link.pairs for link in true.links
            if link.background or link.gbps < nominal[link.name[:3]] * (1 - 1e-9)}


def best_answer(layout: Layout, racks: Sequence[int], *, nic_gbps: float = NIC_GBPS,
                uplink_gbps: float = UPLINK_GBPS) -> Answer:
    """``racks`` with the flags that make them nearest the truth: every uplink and NIC one of
    whose directions carries exactly the pairs of a contended link of ``layout`` (no rate
    recorded). Whether *the racks alone* can be the same network is whether this is."""
    true = true_network(layout, nic_gbps=nic_gbps, uplink_gbps=uplink_gbps)
    contended = _contended(true, nic_gbps, uplink_gbps)
    canonical, renumber = _canonical(racks)
    label = {v: k for k, v in renumber.items()}
    uplinks, nics = {}, {}
    for (kind, index), pairs in _directions(canonical).items():
        if pairs in contended:
            if kind.startswith("nic"):
                nics[index] = None
            else:
                uplinks[label[index]] = None
    return Answer(tuple(int(r) for r in racks), uplinks, nics)


def _as_answer(answer: Answer | Mapping[str, Any]) -> Answer:
    return answer if isinstance(answer, Answer) else Answer.from_topology(answer)


def answer_network(layout: Layout, answer: Answer | Mapping[str, Any], *, nic_gbps: float = NIC_GBPS,
                   uplink_gbps: float = UPLINK_GBPS) -> Network:
    """The network ``answer`` describes, its flagged links placed as the module's docstring
    says (the true network is needed for that: a flag on the right link takes its truth)."""
    answer = _as_answer(answer)
    if len(answer.racks) != len(layout.racks):
        raise ValueError(f"the answer has {len(answer.racks)} workers, the layout {len(layout.racks)}")
    true = true_network(layout, nic_gbps=nic_gbps, uplink_gbps=uplink_gbps)
    by_pairs: dict[frozenset[Pair], list[Link]] = {}
    for link in true.links:
        by_pairs.setdefault(link.pairs, []).append(link)
    contended = _contended(true, nic_gbps, uplink_gbps)
    racks, renumber = _canonical(answer.racks)
    directions = _directions(racks)
    flagged: dict[tuple[str, int], float | None] = {}
    for rack, rate in answer.uplinks.items():
        if int(rack) not in renumber:
            raise ValueError(f"the answer flags the uplink of rack {rack}, which none of its workers is in")
        for kind in ("up-out", "up-in"):
            flagged[kind, renumber[int(rack)]] = rate
    for rank, rate in answer.nics.items():
        if not 0 <= int(rank) < len(racks):
            raise ValueError(f"the answer flags the NIC of rank {rank}, of a world of {len(racks)}")
        for kind in ("nic-out", "nic-in"):
            flagged[kind, int(rank)] = rate
    links: list[Link] = []
    taken: set[frozenset[Pair]] = set()  # true links already in, once each
    for (kind, index), pairs in directions.items():
        nominal = nic_gbps if kind.startswith("nic") else uplink_gbps
        name = f"{kind}{index}"
        if (kind, index) not in flagged:
            links.append(Link(name, pairs, nominal))
            continue
        partner = (_OTHER_WAY[kind], index)
        if pairs in contended or directions.get(partner) in contended:  # the flag names a true contended link
            if pairs in by_pairs:
                if pairs not in taken:
                    taken.add(pairs)
                    links += [Link(f"{name}={t.name}", pairs, t.gbps, t.background) for t in by_pairs[pairs]]
            else:
                links.append(Link(name, pairs, nominal))
            continue
        rate = flagged[kind, index]
        if rate is None:  # the lowest rate no single pair's rate contradicts
            rate = max(true.rates([p])[0] for p in pairs)
        links.append(Link(f"{name}~{rate:.3g}", pairs, min(float(rate), nominal)))
    return Network(len(racks), tuple(links))


# -- the patterns ------------------------------------------------------------------------------
def _ring(group: Sequence[int]) -> list[Pair]:
    group = list(group)
    if len(group) < 2:
        return []
    return [(group[k], group[(k + 1) % len(group)]) for k in range(len(group))] if len(group) > 2 else \
        [(group[0], group[1]), (group[1], group[0])]


def _schedule_rounds(racks: Sequence[int], uplinks: Iterable[int], nics: Iterable[int],
                     max_rounds: int) -> list[tuple[tuple[int, ...], ...]]:
    """The partitions of the period dssync's planner builds for ``racks`` with these
    contended uplinks and NICs (at most ``max_rounds``; none where it cannot plan)."""
    from dssync.errors import DssyncError
    from dssync.planning.planner import plan
    from dssync.topology import Topology

    racks, renumber = _canonical(racks)
    topology = Topology.from_dict({
        "version": 1, "workers": [{"rank": i, "rack": r} for i, r in enumerate(racks)],
        "contention": {"uplinks": [{"rack": renumber[int(u)]} for u in sorted(set(uplinks))],
                       "nics": [{"rank": int(i)} for i in sorted(set(nics))]}})
    try:
        schedule = plan(topology)
    except DssyncError:
        return []
    return [schedule.partition_at(t) for t in range(min(schedule.length, max_rounds))]


def patterns(racks_sets: Sequence[Sequence[int]], *, rounds: Sequence[Sequence[Sequence[int]]] = (),
             two_at_once: bool = True) -> list[tuple[str, list[Pair]]]:
    """The flow patterns the rule checks, each ``(name, flows)``: every pair alone, every
    two flows at once (``two_at_once``), for each rack of each of ``racks_sets`` its members
    to each other rack (one flow a member, round robin) and to every worker outside it (all
    pairs), the ring both ways, and each partition of ``rounds`` (every group's ring)."""
    n = len(racks_sets[0])
    pairs = [(i, j) for i in range(n) for j in range(n) if i != j]
    out: list[tuple[str, list[Pair]]] = [(f"flow {i}->{j}", [(i, j)]) for i, j in pairs]
    if two_at_once:
        out += [(f"flows {a[0]}->{a[1]} and {b[0]}->{b[1]}", [a, b]) for k, a in enumerate(pairs) for b in pairs[k + 1:]]
    seen: set[tuple[Pair, ...]] = set()
    for racks in racks_sets:
        members: dict[int, list[int]] = {}
        for i, r in enumerate(racks):
            members.setdefault(r, []).append(i)
        for g, inside in members.items():
            outside = [i for i in range(n) if racks[i] != g]
            candidates = [(f"rack of {inside} to all outside it", [(i, j) for i in inside for j in outside])]
            for h, there in members.items():
                if h != g:
                    m = max(len(inside), len(there))
                    candidates.append((f"rack of {inside} to rack of {there}",
                                       [(inside[k % len(inside)], there[k % len(there)]) for k in range(m)]))
            for name, flows in candidates:
                key = tuple(sorted(flows))
                if flows and key not in seen:
                    seen.add(key)
                    out.append((name, flows))
    if n >= 2:
        out.append(("ring", _ring(range(n))))
        out.append(("ring backwards", _ring(range(n - 1, -1, -1))))
    for partition in rounds:
        flows = [f for group in partition for f in _ring(group)]
        key = tuple(sorted(flows))
        if flows and key not in seen:
            seen.add(key)
            out.append((f"ds round {[list(g) for g in partition if len(g) > 1]}", flows))
    return out


# -- the verdict -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Difference:
    """The first pattern whose rates differ: its name, flows and both networks' rates."""

    pattern: str
    flows: list[Pair]
    true_gbps: list[float]
    answer_gbps: list[float]

    def __str__(self) -> str:
        worst = max(range(len(self.flows)), key=lambda k: _gap(self.true_gbps[k], self.answer_gbps[k]))
        i, j = self.flows[worst]
        return (f"{self.pattern}: flow {i}->{j} gets {self.true_gbps[worst]:.3f} Gbit/s on the network built, "
                f"{self.answer_gbps[worst]:.3f} on the answer's")


def _gap(a: float, b: float) -> float:
    if a == b:
        return 0.0
    if math.isinf(a) or math.isinf(b):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b))


def through_other_jobs(layout: Layout) -> Callable[[Pair], bool]:
    """Whether a flow of the job crosses a link that another job's flows load on the network
    ``layout`` builds: an uplink with another job's streams, either way across it, or a NIC
    with them, either way through it. Either way, because a TCP flow's acks come back the
    other way: into a rack whose uplink another job's streams leave, the job's own streams got
    0.31-0.42 Gbit/s where the model gives that direction clear (1 Gbit/s; a fresh iperf3
    connection got 0.92; ``bench/results/busy-ingress.json``). No probe reads such a link's
    rates as the max-min model has them; ``score`` counts apart the wrong answers that differ
    from the network built only there."""
    racks = layout.racks
    busy_racks, busy_nics = set(layout.uplink_flows), set(layout.nic_flows)

    def crosses(flow: Pair) -> bool:
        i, j = flow
        return (racks[i] != racks[j] and (racks[i] in busy_racks or racks[j] in busy_racks)) \
            or i in busy_nics or j in busy_nics

    return crosses


def compare(layout: Layout, answer: Answer | Mapping[str, Any], *, tolerance: float = TOLERANCE,
            two_at_once: bool = True, max_rounds: int = 16, nic_gbps: float = NIC_GBPS,
            uplink_gbps: float = UPLINK_GBPS, skip: Callable[[Pair], bool] | None = None) -> Difference | None:
    """``None`` when ``answer`` is the same network as ``layout`` (every pattern's every
    flow within ``tolerance``), else the first pattern that tells them apart. ``skip``: the
    patterns with a flow it holds true for are not compared (``through_other_jobs``)."""
    answer = _as_answer(answer)
    true = true_network(layout, nic_gbps=nic_gbps, uplink_gbps=uplink_gbps)
    found = answer_network(layout, answer, nic_gbps=nic_gbps, uplink_gbps=uplink_gbps)
    rounds = (_schedule_rounds(layout.racks, layout.contended_uplinks, layout.contended_nics, max_rounds)
              + _schedule_rounds(answer.racks, answer.uplinks, answer.nics, max_rounds))
    for name, flows in patterns([layout.racks, list(answer.racks)], rounds=rounds, two_at_once=two_at_once):
        if skip is not None and any(skip(f) for f in flows):
            continue
        a, b = true.rates(flows), found.rates(flows)
        if any(_gap(x, y) > tolerance for x, y in zip(a, b, strict=True)):
            return Difference(name, flows, a, b)
    return None


def same_network(layout: Layout, answer: Answer | Mapping[str, Any], **kwargs: Any) -> bool:
    """Whether ``answer`` (an ``Answer`` or a topology.json dict) is the same network as the
    one ``layout`` builds: ``compare`` finds no pattern that tells them apart."""
    return compare(layout, answer, **kwargs) is None
