"""The SimGrid replay's point-to-point transfers of each collective (``bench.simgrid_check``),
checked on random groups: every send has its receive, and each collective moves what its
algorithm moves. No SimGrid needed: this is the replay's bookkeeping only."""

from collections import Counter

import numpy as np
import pytest

from dssync.bench.simgrid_check import _transfers
from dssync.patterns import Op


def _groups(rng: np.random.Generator) -> tuple[tuple[int, ...], ...]:
    ranks = rng.permutation(int(rng.integers(2, 12))).tolist()
    cuts = sorted(set(rng.integers(1, len(ranks), size=int(rng.integers(0, 3))).tolist()))
    return tuple(tuple(ranks[a:b]) for a, b in zip([0, *cuts], [*cuts, len(ranks)], strict=True))


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("kind", ["allreduce", "reduce", "broadcast"])
def test_every_send_has_its_receive_and_each_collective_moves_its_bytes(kind, seed):
    rng = np.random.default_rng(seed)
    groups = _groups(rng)
    op = Op(kind, groups, 840.0)
    world = sorted(r for g in groups for r in g)
    sends = Counter((r, peer, size) for r in world for k, peer, size in _transfers(op, r) if k == "send")
    recvs = Counter((peer, r, size) for r in world for k, peer, size in _transfers(op, r) if k == "recv")
    assert sends == recvs
    for g in groups:
        n = len(g)
        sent = sum(size * count for (src, _, size), count in sends.items() if src in g)
        want = {"allreduce": 2 * (n - 1) * 840.0, "reduce": (n - 1) * 840.0 + (n - 1) * 840.0 / n,
                "broadcast": (n - 1) * 840.0}[kind] if n > 1 else 0.0
        assert sent == pytest.approx(want)
    if kind == "broadcast":  # a tree: every member but the root receives once
        for g in groups:
            got = Counter(dst for (src, dst, _), c in sends.items() if dst in g for _ in range(c))
            assert got == Counter(g[1:])


def test_a_gossip_step_sends_one_way_and_receives_from_the_other():
    op = Op("send", ((0, 1), (1, 2), (2, 0)), 5.0)
    assert _transfers(op, 1) == [("send", 2, 5.0), ("recv", 0, 5.0)]
