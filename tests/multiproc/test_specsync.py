"""SpecSync's restart on real processes, the real parameter server and the real scheduler, with
gradients that depend on the parameters they were computed on, against an oracle computed here.

The model is a bowl, ``loss = 0.5 ||w - target_r||^2``, so the gradient rank ``r`` pushes is
``w - target_r`` for the ``w`` it computed on: a restart that recomputed on the parameters it
had before the re-sync pushes a gradient the oracle can tell from the right one. Every rank
records, per attempt at an iteration, the parameters the attempt ran on and when it started and
ended; every shard logs the order in which it applied the pushes (by a recorder around its
update, which applies nothing itself). The oracle replays each shard's pushes in that order
with SGD and momentum, on the gradients it computes itself from the recorded parameters.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch
from ranks import _Sleep
from torch import nn

from dssync.launch import run_ranks
from dssync.ps.framing import shard_bounds

NUMEL = 12
LR = 0.2
MOMENTUM = 0.5
ABORT_TIME_S = 0.15
SLOW_RANK = 2
SLOW_STEPS = 5
SLOW_S, FAST_S = 0.4, 0.02
MAX_FAST_STEPS = 2000
"""The fast ranks push until the slow one is done (a marker file), so every slow iteration
overlaps their pushes whatever the machine's load; this only bounds a run gone wrong."""


def bowl_target(rank: int) -> torch.Tensor:
    """The minimum of rank ``rank``'s loss; the parent recomputes it for the oracle."""
    gen = torch.Generator().manual_seed(104_723 * (rank + 1))
    return 3.0 * torch.randn(NUMEL, generator=gen, dtype=torch.float32)


class _Bowl(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(NUMEL))

    def forward(self, target: torch.Tensor) -> torch.Tensor:
        return 0.5 * ((self.w - target) ** 2).sum()


def bowl_run(comm, marker: str):
    """``specsync`` in the fixed mode (re-sync on one push by another worker within
    ``ABORT_TIME_S``), lr ``LR``, momentum ``MOMENTUM``, unscaled. Rank ``SLOW_RANK`` computes
    for ``SLOW_S`` over ``SLOW_STEPS`` iterations, the others for ``FAST_S`` until it is done.
    Returns every iteration's attempts, this rank's shard's log of applied pushes, the start
    and handed-back parameters and the stats."""
    from dssync.ps.shards import ImmediateShard
    from dssync.strategies import SpecSyncStrategy
    from dssync.strategies.base import StrategyContext
    from dssync.topology import Topology

    applied: list[tuple[int, int, int, float, float]] = []  # version, worker, clock, began, done
    update = ImmediateShard.apply

    def recorded(shard, worker, clock, grad):
        with shard.cond:  # re-entrant: the update takes it again
            began = time.monotonic()
            update(shard, worker, clock, grad)
            applied.append((shard.version, worker, clock, began, time.monotonic()))

    ImmediateShard.apply = recorded

    n = comm.world_size
    slow = comm.rank == SLOW_RANK
    bowl = _Bowl()
    model = nn.Sequential(*[_Sleep((SLOW_S if slow else FAST_S) / 10) for _ in range(10)], bowl)
    config = SpecSyncStrategy.Config(abort_time_s=ABORT_TIME_S, abort_rate=1 / n, scale_lr=False)
    strategy = SpecSyncStrategy(StrategyContext(comm=comm, model=model, topology=Topology.from_rack_sizes([n])),
                                config)
    optimizer = strategy.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM))
    strategy.setup()
    start = bowl.w.detach().clone()
    target = bowl_target(comm.rank)
    iterations = []
    step = 0
    while step < (SLOW_STEPS if slow else MAX_FAST_STEPS) and (slow or not os.path.exists(marker)):
        attempts: list[dict] = []

        def forward_backward(attempts=attempts):
            attempt = {"began": time.monotonic(), "w": bowl.w.detach().clone()}
            attempts.append(attempt)
            try:
                loss = model(target)
                optimizer.zero_grad()
                loss.backward()
            finally:
                attempt["left"] = time.monotonic()  # abandoned (raised) or finished
            attempt["grad"] = bowl.w.grad.detach().clone()
            return loss

        strategy.compute(step, forward_backward)
        iterations.append(attempts)
        strategy.before_step(step)
        optimizer.step()
        strategy.after_step(step)
        step += 1
    if slow:
        open(marker, "w").close()
    final = strategy.final_model()[-1].w.detach().clone()
    stats = strategy.stats()
    strategy.close()  # returns once this shard has heard every worker stop: the log is whole
    return {"start": start, "final": final, "stats": stats, "iterations": iterations, "applied": applied}


def _replay(start: np.ndarray, log: list[tuple[int, int, int, float, float]],
            grads: dict[tuple[int, int], np.ndarray]) -> list[np.ndarray]:
    """The shard's parameters after each of its updates: SGD with momentum as torch documents
    it (``b = g`` at the first step, then ``b = m b + g``; ``w -= lr b``), written out here in
    torch's float32 arithmetic, the pushes in the order the shard applied them."""
    w, buf = torch.from_numpy(start.copy()), None
    states = [w.numpy().copy()]
    for _, worker, clock, _, _ in log:
        g = torch.from_numpy(grads[(worker, clock)])
        buf = g.clone() if buf is None else buf.mul_(MOMENTUM).add_(g)
        w.add_(buf, alpha=-LR)
        states.append(w.numpy().copy())
    return states


def test_specsync_restart_recomputes_on_parameters_pulled_after_the_resync(tmp_path):
    """The oracle: (1) every shard applied every push exactly once; (2) every pushed gradient is
    ``w - target_r`` on the parameters of the iteration's last attempt, and replaying the
    shards' logs with those gradients gives the handed-back parameters bit for bit; (3) every
    attempt ran on parameters some version of every shard held, no older than this worker's
    own last push and no newer than the attempt; (4) a restart ran on a version holding every
    update a shard applied before the abandoned attempt ended, so after a pull that followed
    the re-sync. Restarts must happen (at least 2 of the slow rank's), and at least one of them
    must be one where the abandoned attempt's parameters fail (4): a restart on stale parameters
    cannot pass."""
    n = 3
    out = run_ranks(bowl_run, str(tmp_path / "slow-done"), nproc=n, timeout_s=60, job_timeout_s=120)
    bounds = shard_bounds(NUMEL, n)
    start = out[0]["start"].numpy()
    targets = [bowl_target(r).numpy() for r in range(n)]

    # (2, first half) the oracle's gradients, from the parameters each pushed gradient was computed on
    grads = {}
    for r, o in enumerate(out):
        for clock, attempts in enumerate(o["iterations"]):
            assert 1 <= len(attempts) <= 2, (r, clock, len(attempts))  # at most one restart
            last = attempts[-1]
            grads[(r, clock)] = last["w"].numpy() - targets[r]
            np.testing.assert_array_equal(last["grad"].numpy(), grads[(r, clock)])

    # (1) no push lost or doubled, and (2) the replay gives the handed-back parameters
    states, positions = [], []
    for s, (a, b) in enumerate(bounds):
        log = out[s]["applied"]
        assert [v for v, *_ in log] == list(range(1, len(log) + 1))
        assert sorted((w, c) for _, w, c, _, _ in log) == sorted(grads), f"shard {s}"
        states.append(_replay(start[a:b], log, {k: g[a:b] for k, g in grads.items()}))
        positions.append({(w, c): v for v, w, c, _, _ in log})
        for o in out:
            np.testing.assert_array_equal(o["final"].numpy()[a:b], states[s][-1])

    def versions(w: torch.Tensor) -> list[int]:
        """Per shard, the first version whose parameters are ``w``'s (it must be one)."""
        found = []
        for s, (a, b) in enumerate(bounds):
            match = [v for v, x in enumerate(states[s]) if np.array_equal(x, w.numpy()[a:b])]
            assert match, f"shard {s}: parameters {w[a:b]} were never the server's"
            found.append(match[0])
        return found

    def applied_before(t: float) -> list[int]:
        return [sum(done < t for *_, done in out[s]["applied"]) for s in range(n)]

    restarts, telling = [0] * n, 0
    for r, o in enumerate(out):
        for clock, attempts in enumerate(o["iterations"]):
            seen = [versions(att["w"]) for att in attempts]
            # (3) a consistent snapshot: its own last push in, nothing applied after it began
            for att, vs in zip(attempts, seen, strict=True):
                for s in range(n):
                    assert vs[s] <= sum(began < att["began"] for _, _, _, began, _ in out[s]["applied"])
                    if clock:
                        assert vs[s] >= positions[s][(r, clock - 1)], (r, clock, s)
            if len(attempts) == 2:
                restarts[r] += 1
                need = applied_before(attempts[0]["left"])
                # (4) the recomputation's parameters were pulled after the abandoned attempt
                assert all(v >= k for v, k in zip(seen[1], need, strict=True)), (r, clock, seen, need)
                telling += any(v < k for v, k in zip(seen[0], need, strict=True))
    stats = [o["stats"] for o in out]
    assert restarts == [s["aborts"] - s["aborted_before_start"] for s in stats], (restarts, stats)
    assert restarts[SLOW_RANK] >= 2, (restarts, stats)  # iterations 1..4 each overlap the fast pushes
    assert telling >= 1, (restarts, telling)
