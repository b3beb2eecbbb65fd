"""``dssync bench probe-layouts``: the prober on seeded random emulated networks.

``generate(count, seed)`` draws layouts of 2-4 racks of 1-5 workers (at most 9) and, on
each, a random mix of the contention kinds ``dssync emulate contend`` makes: a slower uplink
(a rate), a slower NIC (a rate), background flows across a rack's uplink (``rack:I``, 8 TCP
streams) and through a worker's NIC (``nic:I``, 2 streams). ``score`` compares what a probe
reported with what was built: racks exact (up to renumbering, which topology.json fixes by
lowest rank anyway), the flagged uplinks and NICs against the contended ones (precision and
recall), and whether a wrong answer was given with high confidence.

Only layouts whose answer a throughput probe can tell are drawn, and the rules say why:
- a rate-limited uplink needs three racks or more: with two, one slow inter-rack link slows
  both racks' traffic alike both ways, and which end is "the" slow uplink is not a fact of
  the network (a background flow, one way only, is drawn there instead);
- uplink contention needs a rack of two or more: a rack of one's uplink and NIC carry the
  same flows, so a slow one is indistinguishable from the other (it is drawn as a NIC);
- a rack whose uplink is contended keeps at least one worker with a clear NIC, and at least
  three workers of the world keep clear NICs (a NIC is slow against the others' median).
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Layout", "equivalent", "fair_rates", "generate", "probe_layout", "run_layouts", "score", "summarize"]

SLOW_RATES_MBIT = (150, 200, 250, 300, 400)  # against 1 Gbit/s NICs and uplinks


@dataclass(frozen=True)
class Layout:
    """One emulated network and the contention put on it."""

    rack_sizes: tuple[int, ...]
    slow_uplinks: dict[int, str] = field(default_factory=dict)  # rack -> rate
    slow_nics: dict[int, str] = field(default_factory=dict)  # rank -> rate
    uplink_flows: tuple[int, ...] = ()  # racks with background flows leaving through their uplink
    nic_flows: tuple[int, ...] = ()  # ranks with a background flow through their NIC

    @property
    def racks(self) -> list[int]:
        return [rack for rack, size in enumerate(self.rack_sizes) for _ in range(size)]

    @property
    def contended_uplinks(self) -> list[int]:
        return sorted({*self.slow_uplinks, *self.uplink_flows})

    @property
    def contended_nics(self) -> list[int]:
        return sorted({*self.slow_nics, *self.nic_flows})

    def describe(self) -> str:
        parts = [",".join(map(str, self.rack_sizes))]
        parts += [f"uplink{r}={rate}" for r, rate in sorted(self.slow_uplinks.items())]
        parts += [f"nic{i}={rate}" for i, rate in sorted(self.slow_nics.items())]
        parts += [f"rack:{r}" for r in self.uplink_flows] + [f"nic:{i}" for i in self.nic_flows]
        return " ".join(parts)


def _draw(rng: random.Random, max_workers: int) -> Layout:
    while True:
        racks = rng.randint(2, 4)
        sizes = [rng.randint(1, 5) for _ in range(racks)]
        if 4 <= sum(sizes) <= max_workers:
            break
    ranks = list(range(sum(sizes)))
    members = [[i for i, r in enumerate(Layout(tuple(sizes)).racks) if r == k] for k in range(racks)]
    big = [r for r in range(racks) if sizes[r] >= 2]
    slow_uplinks: dict[int, str] = {}
    uplink_flows: list[int] = []
    # At most one contended uplink by each mechanism, and never every rack's.
    if big and racks >= 3 and rng.random() < 0.5:
        slow_uplinks[rng.choice(big)] = f"{rng.choice(SLOW_RATES_MBIT)}mbit"
    free = [r for r in big if r not in slow_uplinks]
    if free and len(slow_uplinks) + 1 < racks and rng.random() < 0.5:
        uplink_flows.append(rng.choice(free))
    contended = set(slow_uplinks) | set(uplink_flows)
    slow_nics: dict[int, str] = {}
    nic_flows: list[int] = []
    for _ in range(rng.choice((0, 1, 1, 2))):
        clear = [i for i in ranks if i not in slow_nics and i not in nic_flows]
        # keep a clear NIC in every contended rack, and three clear NICs in the world
        allowed = [i for i in clear if len(clear) > 3 and not any(
            i in members[r] and sum(1 for m in members[r] if m in clear) < 2 for r in contended)]
        if not allowed:
            break
        rank = rng.choice(allowed)
        if rng.random() < 0.6:
            slow_nics[rank] = f"{rng.choice(SLOW_RATES_MBIT)}mbit"
        else:
            nic_flows.append(rank)
    return Layout(tuple(sizes), slow_uplinks, slow_nics, tuple(uplink_flows), tuple(sorted(nic_flows)))


def generate(count: int, seed: int = 0, *, max_workers: int = 9) -> list[Layout]:
    """``count`` layouts drawn from ``seed`` (the same seed gives the same layouts)."""
    if count < 1:
        raise ValueError(f"need at least one layout, got {count}")
    if not 4 <= max_workers <= 250:
        raise ValueError(f"max_workers must lie in 4..250, got {max_workers}")
    rng = random.Random(seed)
    return [_draw(rng, max_workers) for _ in range(count)]


def fair_rates(flows: Sequence[Sequence[Any]], capacity: dict[Any, float]) -> list[float]:
    """Max-min fair rates of ``flows`` (each a list of the links it crosses) by progressive
    filling: the link with the smallest fair share is filled first and its flows frozen. A
    link not in ``capacity`` is unlimited; a flow crossing no limited link gets ``inf``."""
    rates = [float("inf")] * len(flows)
    active = set(range(len(flows)))
    left = dict(capacity)
    while active:
        shares = {}
        for link, cap in left.items():
            users = [f for f in active if link in flows[f]]
            if users:
                shares[link] = (max(cap, 0.0) / len(users), users)
        if not shares:
            break
        share, users = min(shares.values(), key=lambda item: item[0])
        for f in users:
            rates[f] = share
            active.discard(f)
            for link in flows[f]:
                if link in left:
                    left[link] -= share
    return rates


def _network(layout: Layout, racks: Sequence[int]) -> tuple[dict[Any, float], Callable[[int, int], list[Any]], list[list[Any]]]:
    """The layout's links (Gbit/s) with ``racks`` as the racks: capacities, the path of a flow
    between two workers, and the background flows. A rack of ``racks`` spanning several of
    the layout's racks gets the slowest of their uplinks and all of their background."""
    from dssync.launch.emulate import parse_rate

    def rate(text: str) -> float:
        return parse_rate(text) / 1e9

    true = layout.racks
    n = len(true)
    cap: dict[Any, float] = {}
    for i in range(n):
        cap["nic-out", i] = cap["nic-in", i] = rate(layout.slow_nics[i]) if i in layout.slow_nics else 1.0
    for g in set(racks):
        spans = {true[i] for i in range(n) if racks[i] == g}
        up = min(rate(layout.slow_uplinks[r]) if r in layout.slow_uplinks else 1.0 for r in spans)
        cap["up-out", g] = cap["up-in", g] = up

    def path(i: int, j: int) -> list[Any]:
        links: list[Any] = [("nic-out", i), ("nic-in", j)]
        return links + ([("up-out", racks[i]), ("up-in", racks[j])] if racks[i] != racks[j] else [])

    background: list[list[Any]] = []
    for r in layout.uplink_flows:  # from the rack's own traffic host, out through its uplink
        home = max(set(racks), key=lambda g: sum(racks[i] == g and true[i] == r for i in range(n)))
        background += [[("up-out", home)]] * 8
    for i in layout.nic_flows:  # to its rack's traffic host: through its NIC, not the uplink
        background += [[("nic-out", i)]] * 2
    return cap, path, background


def equivalent(layout: Layout, found: Sequence[int], ratio: float = 0.6) -> bool:
    """Whether ``found`` racks predict what ``layout``'s own racks do for every flow of every
    pattern a probe could send: each single flow, each two flows at once, and each rack's
    egress blast of either partition (max-min fair rates, background flows included), to
    within ``ratio``. Racks that no such pattern tells apart are not a fact of the network:
    a rack of one behind an uplink as fast as its NIC, say, acts like a host on the spine."""
    true = layout.racks
    n = len(true)
    nets = [_network(layout, true), _network(layout, found)]
    pairs = [(i, j) for i in range(n) for j in range(n) if i != j]
    patterns: list[list[tuple[int, int]]] = [[p] for p in pairs]
    patterns += [[a, b] for k, a in enumerate(pairs) for b in pairs[k + 1:] if a[0] != b[0] and a[1] != b[1]]
    for racks in (true, found):
        for g in set(racks):
            inside = [i for i in range(n) if racks[i] == g]
            outside = [i for i in range(n) if racks[i] != g]
            if inside and outside:
                patterns.append([(inside[k % len(inside)], outside[k % len(outside)])
                                 for k in range(max(len(inside), len(outside)))])
    for flows in patterns:
        got = []
        for cap, path, background in nets:
            got.append(fair_rates([path(i, j) for i, j in flows] + background, cap)[:len(flows)])
        if any(min(a, b) < ratio * max(a, b) for a, b in zip(*got, strict=True)):
            return False
    return True


def _same_partition(found: Sequence[int], truth: Sequence[int]) -> bool:
    return len(found) == len(truth) and len(set(zip(found, truth, strict=True))) == len(set(found)) == len(set(truth))


def score(layout: Layout, topology: dict[str, Any]) -> dict[str, Any]:
    """What the probe got right on ``layout``, from the topology.json it wrote."""
    found = [w["rack"] for w in topology["workers"]]
    racks_exact = _same_partition(found, layout.racks)
    racks_equivalent = racks_exact or equivalent(layout, found)
    # Uplink flags are judged per rack of the layout: the rack whose uplink was flagged is the
    # rack the flagged rack's members belong to (only meaningful when the racks are exact).
    flagged_up = sorted({layout.racks[i] for u in topology["contention"]["uplinks"]
                         for i, r in enumerate(found) if r == u["rack"]}) if racks_exact else None
    flagged_nic = sorted(n["rank"] for n in topology["contention"]["nics"])
    want_up, want_nic = layout.contended_uplinks, layout.contended_nics
    # On racks that are the same network but not the same partition, an uplink is named by
    # the workers behind it: the flags are right when they name the contended links' workers.
    behind = {frozenset(i for i, r in enumerate(found) if r == u["rack"]) for u in topology["contention"]["uplinks"]}
    want_behind = {frozenset(i for i, r in enumerate(layout.racks) if r == u) for u in want_up}
    conf = topology.get("confidence", {})
    return {
        "layout": layout.describe(), "spec": asdict(layout), "racks_found": found,
        "racks_exact": racks_exact, "racks_equivalent": racks_equivalent,
        "unplaced": conf.get("unplaced", []),
        "confident": bool(conf.get("confident", True)),
        "wrong_with_confidence": (not racks_exact) and bool(conf.get("confident", True)),
        "telling_wrong_with_confidence": (not racks_equivalent) and bool(conf.get("confident", True)),
        "uplinks_found": flagged_up, "uplinks_true": want_up, "uplinks_exact": flagged_up == want_up,
        "nics_found": flagged_nic, "nics_true": want_nic, "nics_exact": flagged_nic == want_nic,
        "flags_equivalent": racks_equivalent and behind == want_behind and flagged_nic == want_nic,
        "flags_true_positive": len(set(flagged_up or []) & set(want_up)) + len(set(flagged_nic) & set(want_nic)),
        "flags_reported": len(flagged_up or []) + len(flagged_nic),
        "flags_true": len(want_up) + len(want_nic),
        "probe_seconds": topology["probe"]["seconds"],
        "world_size": len(found),
    }


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    tp = sum(r["flags_true_positive"] for r in rows)
    reported = sum(r["flags_reported"] for r in rows)
    true = sum(r["flags_true"] for r in rows)
    seconds = [r["probe_seconds"] for r in rows]
    return {
        "layouts": len(rows),
        "racks_exact": sum(r["racks_exact"] for r in rows),
        "racks_equivalent": sum(r.get("racks_equivalent", r["racks_exact"]) for r in rows),
        "flags_exact": sum(bool(r["uplinks_exact"]) and r["nics_exact"] for r in rows),
        "flags_equivalent": sum(r.get("flags_equivalent", bool(r["uplinks_exact"]) and r["nics_exact"]) for r in rows),
        "wrong_with_confidence": sum(r["wrong_with_confidence"] for r in rows),
        "telling_wrong_with_confidence": sum(r.get("telling_wrong_with_confidence", r["wrong_with_confidence"])
                                             for r in rows),
        "flag_precision": tp / reported if reported else 1.0,
        "flag_recall": tp / true if true else 1.0,
        "probe_seconds_median": statistics.median(seconds),
        "probe_seconds_max": max(seconds),
    }


def probe_layout(layout: Layout, *, name: str, probe_args: Sequence[str] = (),
                 timeout_s: float = 300.0) -> dict[str, Any]:
    """Build ``layout``, put its contention on, run ``dssync probe`` on every worker, and
    return the topology.json it wrote; the cluster is removed however this ends."""
    from dssync.launch import emulate

    with emulate.cluster(list(layout.rack_sizes), name=name), tempfile.TemporaryDirectory() as tmp:
        for rack, rate in layout.slow_uplinks.items():
            emulate.contend(name=name, rack=rack, uplink=rate)
        for rank, rate in layout.slow_nics.items():
            emulate.contend(name=name, rank=rank, nic=rate)
        if layout.uplink_flows:
            emulate.contend(name=name, flows=[("rack", r) for r in layout.uplink_flows])
        if layout.nic_flows:
            emulate.contend(name=name, flows=[("nic", i) for i in layout.nic_flows], streams=2)
        out = Path(tmp) / "topology.json"
        return emulate.run_dssync(name, ["probe", *probe_args, "--out", str(out)], out, timeout_s=timeout_s)


def run_layouts(layouts: Sequence[Layout], *, name: str = "pbl", probe_args: Sequence[str] = (),
                report: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Probe every layout in turn; the scored rows, the summary and the raw topologies."""
    rows, raw = [], []
    started = time.time()
    for layout in layouts:
        topology = probe_layout(layout, name=name, probe_args=probe_args)
        row = score(layout, topology)
        rows.append(row)
        raw.append(topology)
        if report is not None:
            report(row)
    return {"rows": rows, "summary": summarize(rows), "topologies": raw,
            "wall_seconds": round(time.time() - started, 1)}
