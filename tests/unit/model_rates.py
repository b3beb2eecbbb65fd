"""The pairs phase's flows as the bench's own link model of the emulated network rates them
(``dssync.bench.same_network``, which knows nothing of the prober): the oracle of the replay
and telling tests."""

from __future__ import annotations

import numpy as np

from dssync.bench.probe_layouts import Layout
from dssync.bench.same_network import true_network
from dssync.probing.phases import round_robin_rounds


def measured(layout: Layout, seed: int, passes: int = 3) -> list:
    """The pairs phase's passes on ``layout`` as the bench's link model rates them, each rate
    slowed by a random 0-15 % (a busy host never speeds a flow up)."""
    net, n = true_network(layout), sum(layout.rack_sizes)
    rng = np.random.default_rng(seed)
    out = []
    for k in range(passes):
        rounds = round_robin_rounds(n, relabel=k)
        bw = np.zeros((n, n))
        for pairs in rounds:
            for flows in ([(a, b) for a, b in pairs], [(b, a) for a, b in pairs]):
                for f, rate in zip(flows, net.rates(flows), strict=True):
                    bw[f] = rate * rng.uniform(0.85, 1.0)
        out.append((rounds, bw))
    return out
