"""``dssync bench probe-layouts``: the prober on seeded random emulated networks.

``generate(count, seed)`` draws layouts of 2-4 racks of 1-5 workers (at most 9) and, on
each, a random mix of the contention kinds ``dssync emulate contend`` makes: a slower uplink
(a rate), a slower NIC (a rate), background flows across a rack's uplink (``rack:I``, 8 TCP
streams) and through a worker's NIC (``nic:I``, 2 streams), and hosts whose CPU is busy
with other work (``cpu:I``, a busy loop on worker I's host). It leaves out no layout: a
slow uplink may sit on a rack of one or between two racks, a busy uplink on any rack, a
slow or shared NIC anywhere. Every ``KINDS`` entry is featured in 4 of every 20 layouts
(``kinds`` tells which a layout has), the rest of each layout drawn at random.

``score`` compares what a probe reported with what was built. Where two answers cannot be
told apart by any flow of the job, what counts is the network, not the convention: the
same-network rule (``dssync.bench.same_network``: every pattern of the job's flows gets the
same max-min fair rates, within 5 %) decides ``same_network``; ``exact`` is racks equal up to
renumbering and the flagged uplinks and NICs equal to the contended ones; ``right`` is
either. ``flags_right`` is the flags naming the contended links (NICs by rank, uplinks by
the workers behind them) or the whole answer being the same network; ``wrong_confident`` a
wrong answer whose topology says it is confident. A busy CPU is not contention of the
network: it is never to be flagged.
"""

from __future__ import annotations

import contextlib
import random
import re
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dssync.bench.same_network import NIC_FLOW_STREAMS, UPLINK_FLOW_STREAMS

__all__ = ["KINDS", "Layout", "ProbeFailedError", "equivalent", "fair_rates", "failed", "generate", "kinds",
           "probe_layout", "run_layouts", "score", "summarize"]

SLOW_RATES_MBIT = (150, 200, 250, 300, 400)  # against 1 Gbit/s NICs and uplinks
#: The layout kinds ``generate`` features, each in ``BLOCK // len(KINDS)`` of every ``BLOCK``
#: layouts: a rate-limited uplink (oversubscribed by rate: slower than one NIC); a
#: rate-limited NIC in a rack of two; every uplink exactly as fast as a NIC (none
#: rate-limited) beside a rack of one or two, whose uplink then carries what one or two NICs
#: do; racks of unequal sizes with a slow NIC and another job's flows across an uplink at
#: once; a host whose CPU is busy with other work.
KINDS = ("slow_uplink", "slow_nic_in_rack_of_two", "uplinks_at_nic_speed", "unequal_racks_slow_nic_busy_uplink",
         "busy_cpu")
BLOCK = 20


@dataclass(frozen=True)
class Layout:
    """One emulated network and the contention put on it."""

    rack_sizes: tuple[int, ...]
    slow_uplinks: dict[int, str] = field(default_factory=dict)  # rack -> rate
    slow_nics: dict[int, str] = field(default_factory=dict)  # rank -> rate
    uplink_flows: tuple[int, ...] = ()  # racks with background flows leaving through their uplink
    nic_flows: tuple[int, ...] = ()  # ranks with a background flow through their NIC
    busy_cpus: tuple[int, ...] = ()  # ranks whose host runs a busy loop (not a network property)

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> Layout:
        """The layout a record's ``spec`` (``asdict`` through JSON) describes."""
        return cls(rack_sizes=tuple(spec["rack_sizes"]),
                   slow_uplinks={int(k): v for k, v in spec.get("slow_uplinks", {}).items()},
                   slow_nics={int(k): v for k, v in spec.get("slow_nics", {}).items()},
                   uplink_flows=tuple(spec.get("uplink_flows", ())), nic_flows=tuple(spec.get("nic_flows", ())),
                   busy_cpus=tuple(spec.get("busy_cpus", ())))

    @classmethod
    def parse(cls, text: str) -> Layout:
        """The layout ``describe`` writes as ``text`` (``2,2 uplink1=400mbit nic3=200mbit
        rack:0 nic:2 cpu:1``): rack sizes first, then each slower link, background flow and
        busy host; ``ValueError`` naming the part it cannot read, or a rack or rank the
        sizes do not have."""
        from dssync.launch.emulate import parse_rate

        parts = text.split()
        if not parts or not re.fullmatch(r"[1-9]\d*(,[1-9]\d*)*", parts[0]):
            raise ValueError(f"cannot read layout {text!r}: it starts with the rack sizes, e.g. '2,2 rack:0'")
        sizes = tuple(int(x) for x in parts[0].split(","))
        n = sum(sizes)
        fields: dict[str, Any] = {"slow_uplinks": {}, "slow_nics": {}, "uplink_flows": [], "nic_flows": [],
                                  "busy_cpus": []}
        for part in parts[1:]:
            m = re.fullmatch(r"(uplink|nic)(\d+)=(\S+)|(rack|nic|cpu):(\d+)", part)
            if not m:
                raise ValueError(f"cannot read {part!r} of layout {text!r}; write uplinkR=RATE, nicI=RATE, "
                                 "rack:R, nic:I or cpu:I")
            kind, index = (m.group(1), int(m.group(2))) if m.group(1) else (m.group(4), int(m.group(5)))
            limit = len(sizes) if kind in ("uplink", "rack") else n
            if index >= limit:
                raise ValueError(f"{part!r} of layout {text!r}: {'racks' if limit == len(sizes) else 'ranks'} "
                                 f"are 0..{limit - 1}")
            if m.group(1):
                try:  # a rate emulate cannot build is an error here, not at build time
                    parse_rate(m.group(3))
                except ValueError as error:
                    raise ValueError(f"{part!r} of layout {text!r}: {error}") from error
                fields["slow_uplinks" if kind == "uplink" else "slow_nics"][index] = m.group(3)
            else:
                fields[{"rack": "uplink_flows", "nic": "nic_flows", "cpu": "busy_cpus"}[kind]].append(index)
        return cls(rack_sizes=sizes, **{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})

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
        parts += [f"cpu:{i}" for i in self.busy_cpus]
        return " ".join(parts)


def kinds(layout: Layout) -> list[str]:
    """The ``KINDS`` that ``layout`` is an instance of."""
    sizes, racks = layout.rack_sizes, layout.racks
    has = {
        "slow_uplink": bool(layout.slow_uplinks),
        "slow_nic_in_rack_of_two": any(sizes[racks[i]] == 2 for i in layout.slow_nics),
        "uplinks_at_nic_speed": not layout.slow_uplinks and min(sizes) <= 2,
        "unequal_racks_slow_nic_busy_uplink": len(set(sizes)) > 1 and bool(layout.slow_nics) and bool(layout.uplink_flows),
        "busy_cpu": bool(layout.busy_cpus),
    }
    return [k for k in KINDS if has[k]]


def _sizes(rng: random.Random, max_workers: int, feature: str, min_workers: int = 4) -> list[int]:
    """Rack sizes, 2-4 racks of 1-5 workers, ``min_workers`` to ``max_workers`` in all, shaped
    for ``feature``."""
    fits = {"slow_nic_in_rack_of_two": lambda s: 2 in s, "uplinks_at_nic_speed": lambda s: min(s) <= 2,
            "unequal_racks_slow_nic_busy_uplink": lambda s: len(set(s)) > 1}.get(feature, lambda s: True)
    while True:
        sizes = [rng.randint(1, 5) for _ in range(rng.randint(2, 4))]
        if min_workers <= sum(sizes) <= max_workers and fits(sizes):
            return sizes


def _draw(rng: random.Random, max_workers: int, feature: str, min_workers: int = 4) -> Layout:
    """One layout with ``feature`` (one of ``KINDS``) and a random mix of the others."""
    sizes = _sizes(rng, max_workers, feature, min_workers)
    racks = Layout(tuple(sizes)).racks
    ranks = list(range(len(racks)))

    def rate() -> str:
        return f"{rng.choice(SLOW_RATES_MBIT)}mbit"

    slow_uplinks: dict[int, str] = {}
    if feature == "slow_uplink" or (feature != "uplinks_at_nic_speed" and rng.random() < 0.3):
        slow_uplinks[rng.randrange(len(sizes))] = rate()
    uplink_flows = [rng.randrange(len(sizes))] if feature == "unequal_racks_slow_nic_busy_uplink" or rng.random() < 0.35 else []
    slow_nics: dict[int, str] = {}
    nic_flows: list[int] = []
    if feature == "slow_nic_in_rack_of_two":
        slow_nics[rng.choice([i for i in ranks if sizes[racks[i]] == 2])] = rate()
    elif feature == "unequal_racks_slow_nic_busy_uplink":
        slow_nics[rng.choice(ranks)] = rate()
    for _ in range(rng.choice((0, 1, 1, 2))):
        if len(slow_nics) + len(nic_flows) >= max(1, len(ranks) // 3):
            break  # a slow NIC is slow against the others: most of them stay clear
        rank = rng.choice([i for i in ranks if i not in slow_nics and i not in nic_flows])
        if rng.random() < 0.6:
            slow_nics[rank] = rate()
        else:
            nic_flows.append(rank)
    busy: list[int] = []
    if feature == "busy_cpu" or rng.random() < 0.15:
        busy = rng.sample(ranks, 2 if rng.random() < 0.3 else 1)
    return Layout(tuple(sizes), slow_uplinks, slow_nics, tuple(uplink_flows), tuple(sorted(nic_flows)),
                  tuple(sorted(busy)))


def generate(count: int, seed: int = 0, *, max_workers: int = 9, min_workers: int = 4) -> list[Layout]:
    """``count`` layouts drawn from ``seed`` (the same seed gives the same layouts). Each
    block of ``BLOCK`` layouts features every one of ``KINDS`` ``BLOCK // len(KINDS)`` times,
    in a random order; the rest of each layout is drawn at random, no kind left out."""
    if count < 1:
        raise ValueError(f"need at least one layout, got {count}")
    if not 4 <= max_workers <= 20:
        raise ValueError(f"max_workers must lie in 4..20 (at most 4 racks of 5), got {max_workers}")
    if not 4 <= min_workers <= max_workers:
        raise ValueError(f"min_workers must lie in 4..max_workers ({max_workers}), got {min_workers}")
    rng = random.Random(seed)
    features: list[str] = []
    while len(features) < count:
        block = [k for k in KINDS for _ in range(BLOCK // len(KINDS))]
        rng.shuffle(block)
        features += block
    return [_draw(rng, max_workers, feature, min_workers) for feature in features[:count]]


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
    """The older, racks-only check, kept for its callers (``score`` now uses
    ``dssync.bench.same_network``, which judges the flags too and holds rates to 5 %).
    Whether ``found`` racks predict what ``layout``'s own racks do for every flow of every
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
    """What the probe got right on ``layout``, from the topology.json it wrote (the fields
    are described in bench/README.md's probe-layouts section)."""
    from dssync.bench.same_network import (
        Answer,
        best_answer,
        compare,
        same_network,
        through_other_jobs,
    )

    answer = Answer.from_topology(topology)
    found = list(answer.racks)
    racks_exact = _same_partition(found, layout.racks)
    # Uplink flags are judged per rack of the layout: the rack whose uplink was flagged is the
    # rack the flagged rack's members belong to (only meaningful when the racks are exact).
    flagged_up = sorted({layout.racks[i] for u in answer.uplinks
                         for i, r in enumerate(found) if r == u}) if racks_exact else None
    flagged_nic = sorted(answer.nics)
    want_up, want_nic = layout.contended_uplinks, layout.contended_nics
    uplinks_exact, nics_exact = flagged_up == want_up, flagged_nic == want_nic
    exact = racks_exact and uplinks_exact and nics_exact
    difference = compare(layout, answer)
    same = difference is None
    racks_same = racks_exact or same or same_network(layout, best_answer(layout, found))
    # On racks that are not the same partition, an uplink is named by the workers behind it:
    # the flags name the contended links when they name the contended racks' workers and NICs.
    behind = {frozenset(i for i, r in enumerate(found) if r == u) for u in answer.uplinks}
    want_behind = {frozenset(i for i, r in enumerate(layout.racks) if r == u) for u in want_up}
    flags_named = behind == want_behind and flagged_nic == want_nic
    conf = topology.get("confidence", {})
    confident = bool(conf.get("confident", True))
    right = exact or same
    tell = None if racks_same else flows_tell(layout, topology)
    # wrong, but only on patterns through another job's flows, whose rates no probe reads as
    # the max-min model has them (``same_network.through_other_jobs``)
    only_there = not right and compare(layout, answer, skip=through_other_jobs(layout)) is None
    return {
        "layout": layout.describe(), "spec": asdict(layout), "kinds": kinds(layout), "racks_found": found,
        "exact": exact, "same_network": same, "right": right,
        "flags_right": flags_named or same, "wrong_confident": (not right) and confident,
        "difference": None if same else str(difference),
        "wrong_only_through_other_jobs": only_there,
        "racks_exact": racks_exact, "racks_same_network": racks_same, "racks_equivalent": racks_same,
        "unplaced": conf.get("unplaced", []),
        "confident": confident,
        "wrong_with_confidence": (not racks_exact) and confident,
        "telling_wrong_with_confidence": (not racks_same) and confident,
        "uplinks_found": flagged_up, "uplinks_true": want_up, "uplinks_exact": uplinks_exact,
        "nics_found": flagged_nic, "nics_true": want_nic, "nics_exact": nics_exact,
        "flags_equivalent": racks_same and flags_named,
        "flags_true_positive": len(set(flagged_up or []) & set(want_up)) + len(set(flagged_nic) & set(want_nic)),
        "flags_reported": len(flagged_up or []) + len(flagged_nic),
        "flags_true": len(want_up) + len(want_nic),
        "probe_seconds": topology["probe"]["seconds"],
        "whole_seconds": topology.get("whole_seconds"),
        "world_size": len(found),
        # racks not the same network: would the pairs' own flows have told (``flows_tell``)?
        "flows_tell": tell,
    }


def failed(layout: Layout, error: str) -> dict[str, Any]:
    """The row of ``layout`` whose probe failed (``error``: why): not right, no flag right,
    claiming nothing (so not wrong and confident), and no seconds."""
    want_up, want_nic = layout.contended_uplinks, layout.contended_nics
    return {
        "layout": layout.describe(), "spec": asdict(layout), "kinds": kinds(layout), "failed": error,
        "racks_found": None, "exact": False, "same_network": False, "right": False, "flags_right": False,
        "wrong_confident": False, "difference": None, "wrong_only_through_other_jobs": False, "racks_exact": False,
        "racks_same_network": False,
        "racks_equivalent": False, "unplaced": [], "confident": False, "wrong_with_confidence": False,
        "telling_wrong_with_confidence": False, "uplinks_found": None, "uplinks_true": want_up,
        "uplinks_exact": False, "nics_found": None, "nics_true": want_nic, "nics_exact": False,
        "flags_equivalent": False, "flags_true_positive": 0, "flags_reported": 0,
        "flags_true": len(want_up) + len(want_nic), "probe_seconds": None, "whole_seconds": None,
        "world_size": len(layout.racks), "flows_tell": None,
    }


def flows_tell(layout: Layout, topology: dict[str, Any]) -> str | None:
    """Whether the pairs phase's own flows (``confidence.pair_rates``) tell the racks that
    were built from the ones found: ``"missed"`` where the built racks explain them better
    by ``MIN_GAIN`` (the replay's search did not reach them), ``"faintly"`` by ``DOUBT``,
    ``"no"`` not even that (no round put two flows where the two answers differ). None where
    the topology keeps no rates."""
    import numpy as np

    from dssync.topology.replay import DOUBT, MIN_GAIN, concurrent_flows, misfit

    passes = topology.get("confidence", {}).get("pair_rates")
    if not passes:
        return None
    observed = concurrent_flows([(p["rounds"], np.asarray(p["gbps"], dtype=float)) for p in passes])
    found = [w["rack"] for w in topology["workers"]]
    gap = misfit(found, observed) - misfit(layout.racks, observed)
    return "missed" if gap >= MIN_GAIN else "faintly" if gap >= DOUBT else "no"


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counts over ``rows`` of ``score`` (rows of records written before a field existed
    count it from the fields they have)."""
    tp = sum(r["flags_true_positive"] for r in rows)
    reported = sum(r["flags_reported"] for r in rows)
    true = sum(r["flags_true"] for r in rows)
    seconds = [r["probe_seconds"] for r in rows if r.get("probe_seconds") is not None]
    whole = [r["whole_seconds"] for r in rows if r.get("whole_seconds") is not None]

    def flags_exact(r: dict[str, Any]) -> bool:
        return bool(r["uplinks_exact"]) and bool(r["nics_exact"])

    def exact(r: dict[str, Any]) -> bool:
        return r.get("exact", r["racks_exact"] and flags_exact(r))

    return {
        "layouts": len(rows),
        "failed": sum(bool(r.get("failed")) for r in rows),
        "right": sum(r.get("right", exact(r)) for r in rows),
        "exact": sum(exact(r) for r in rows),
        "same_network": sum(r.get("same_network", exact(r)) for r in rows),
        "flags_right": sum(r.get("flags_right", flags_exact(r)) for r in rows),
        "wrong_confident": sum(r.get("wrong_confident", not exact(r) and r["confident"]) for r in rows),
        "wrong_only_through_other_jobs": sum(r.get("wrong_only_through_other_jobs", False) for r in rows),
        "racks_exact": sum(r["racks_exact"] for r in rows),
        "racks_same_network": sum(r.get("racks_same_network", r["racks_exact"]) for r in rows),
        "racks_equivalent": sum(r.get("racks_equivalent", r["racks_exact"]) for r in rows),
        "flags_exact": sum(flags_exact(r) for r in rows),
        "flags_equivalent": sum(r.get("flags_equivalent", flags_exact(r)) for r in rows),
        "wrong_with_confidence": sum(r["wrong_with_confidence"] for r in rows),
        "telling_wrong_with_confidence": sum(r.get("telling_wrong_with_confidence", r["wrong_with_confidence"])
                                             for r in rows),
        "flag_precision": tp / reported if reported else 1.0,
        "flag_recall": tp / true if true else 1.0,
        # wrong racks by whether the pairs' flows told them from the built ones
        **{f"racks_wrong_flows_{k}": sum(r.get("flows_tell") == k for r in rows) for k in ("missed", "faintly", "no")},
        **({"probe_seconds_median": statistics.median(seconds), "probe_seconds_max": max(seconds)} if seconds else {}),
        **({"whole_seconds_median": statistics.median(whole), "whole_seconds_max": max(whole)} if whole else {}),
    }


class ProbeFailedError(RuntimeError):
    """The probe itself failed on a layout (a worker's error, its timeout, no topology
    written), not the emulated cluster around it."""


@contextlib.contextmanager
def built(layout: Layout, *, name: str, rate_scale: float = 1.0) -> Iterator[None]:
    """``layout`` built as emulated cluster ``name``, its contention on, every rate (NICs,
    uplinks, the slower ones) at ``rate_scale`` of its value: the layout's ratios, which
    decide its racks and flags, stay as drawn. The cluster is removed however this ends."""
    from dssync.launch import emulate

    if not 0 < rate_scale <= 1:
        raise ValueError(f"rate_scale must be in (0, 1], got {rate_scale}")

    def scaled(rate: str) -> str:
        return emulate.format_rate(round(emulate.parse_rate(rate) * rate_scale))

    with emulate.cluster(list(layout.rack_sizes), nic=scaled("1gbit"), uplink=scaled("1gbit"), name=name):
        for rack, rate in layout.slow_uplinks.items():
            emulate.contend(name=name, rack=rack, uplink=scaled(rate))
        for rank, rate in layout.slow_nics.items():
            emulate.contend(name=name, rank=rank, nic=scaled(rate))
        if layout.uplink_flows:
            emulate.contend(name=name, flows=[("rack", r) for r in layout.uplink_flows], streams=UPLINK_FLOW_STREAMS)
        if layout.nic_flows:
            emulate.contend(name=name, flows=[("nic", i) for i in layout.nic_flows], streams=NIC_FLOW_STREAMS)
        if layout.busy_cpus:  # last: the flows above start on idle cores
            emulate.contend(name=name, flows=[("cpu", i) for i in layout.busy_cpus])
        yield


def probe_built(*, name: str, probe_args: Sequence[str] = (), timeout_s: float = 300.0) -> dict[str, Any]:
    """Run ``dssync emulate run -- dssync probe`` on the built cluster ``name`` and return the
    topology.json it wrote, with ``whole_seconds``: the wall time of that whole command as a
    user waits for it (start-up, rendezvous, every phase, the file written)."""
    from dssync.launch import emulate

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "topology.json"
        started = time.perf_counter()
        try:
            topology = emulate.run_dssync(name, ["probe", *probe_args, "--out", str(out)], out, timeout_s=timeout_s)
        except (emulate.EmulationError, subprocess.TimeoutExpired, OSError, ValueError) as error:
            raise ProbeFailedError(str(error)) from error
        topology["whole_seconds"] = round(time.perf_counter() - started, 2)
        return topology


def probe_layout(layout: Layout, *, name: str, probe_args: Sequence[str] = (),
                 timeout_s: float = 300.0, rate_scale: float = 1.0) -> dict[str, Any]:
    """Build ``layout`` (``built``), probe it once (``probe_built``), and remove it."""
    with built(layout, name=name, rate_scale=rate_scale):
        return probe_built(name=name, probe_args=probe_args, timeout_s=timeout_s)


def rescore(record: dict[str, Any]) -> dict[str, Any]:
    """A probe-layouts record's rows and summary scored again by today's rules, from the
    layouts and the raw topologies it holds (the measurement itself is not repeated)."""
    rows = [row if topology is None else score(Layout.from_spec(row["spec"]), topology)
            for row, topology in zip(record["rows"], record["topologies"], strict=True)]
    return {"rows": rows, "summary": summarize(rows), "topologies": record["topologies"],
            "wall_seconds": record.get("wall_seconds")}


def run_layouts(layouts: Sequence[Layout], *, name: str = "pbl", probe_args: Sequence[str] = (),
                rate_scale: float = 1.0, report: Callable[[dict[str, Any]], None] | None = None,
                built_once: bool = False) -> dict[str, Any]:
    """Probe every layout in turn; the scored rows, the summary and the raw topologies. A
    layout whose probe failed (``ProbeFailedError``) is a ``failed`` row (not right) with no
    topology, and the others are still probed: one worker's crash is a finding of the sweep,
    not the end of it. ``built_once`` (every layout the same): build it once and probe it
    again and again, its contention running throughout, as a user probes a cluster that
    stays up, instead of building it anew for each probe."""
    rows, raw = [], []
    started = time.time()
    if built_once and any(lay != layouts[0] for lay in layouts):
        raise ValueError("built_once probes one layout again and again; these are several")

    def probe(layout: Layout) -> dict[str, Any]:
        if built_once:
            return probe_built(name=name, probe_args=probe_args)
        return probe_layout(layout, name=name, probe_args=probe_args, rate_scale=rate_scale)

    with built(layouts[0], name=name, rate_scale=rate_scale) if built_once and layouts else contextlib.nullcontext():
        for layout in layouts:
            try:
                topology = probe(layout)
            except ProbeFailedError as error:
                topology, row = None, failed(layout, str(error))
            else:
                row = score(layout, topology)
            rows.append(row)
            raw.append(topology)
            if report is not None:
                report(row)
    return {"rows": rows, "summary": summarize(rows), "topologies": raw,
            "wall_seconds": round(time.time() - started, 1)}
