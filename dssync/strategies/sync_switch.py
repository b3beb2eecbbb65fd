"""``sync-switch``: BSP first, then ASP, on one sharded parameter server (seeds 000 and 002).

Sync-Switch trains the first ``switch_at`` of the workload with bulk-synchronous SGD and the
rest asynchronously: early, large steps need fresh gradients; late, small ones tolerate
stale ones, so the run reaches BSP's test accuracy at nearly ASP's speed.

- **BSP phase** on the servers: ``dssync.ps.partial.PartialServer`` with every push and
  every block (``c = k``, ``b = 1``), so a shard applies ``lr`` times the mean of the ``k``
  gradients of an iteration, with the loop's momentum: the paper's PS-BSP, whose batch is
  ``k`` times the worker's and whose rate is the loop's ``lr`` (the user's ``n * eta``).
- **ASP phase**: ``dssync.ps.ParameterServer``, every push applied at once with ``lr / k``
  (``eta``, on the worker's batch ``B``) and the same momentum coefficient, the paper's
  configuration policy.
- **The switch happens in the process** (the paper checkpoints and restarts, 36-53 s):
  every worker stops and leaves the rounds, all meet (barrier), pull the old servers'
  settled parameters, each rank hands its shard's momentum buffer, unchanged, to its new
  shard, the old servers close and the new ones open. ``stats()`` reports every switch and
  its seconds.

**The learning rates are the paper's.** The paper takes the user's batch ``B`` and rate
``eta`` for one worker and trains BSP on ``nB`` at ``n * eta``, ASP on ``B`` at ``eta``, with
the same momentum ``mu`` (``n`` is the ``k`` workers here). Here the loop's rate ``lr`` is the rate of
one iteration of all ``k`` workers, as for every strategy of the toolkit (``allreduce``
applies it to the mean gradient), so ``eta = lr / k``, and the two updates are the paper's:

- BSP, once an iteration: ``v <- mu * v + mean_i(g_i)``, ``theta <- theta - lr * v``. The
  mean of the ``k`` workers' gradients on their batches ``B`` is the gradient of their
  ``kB`` samples, and ``lr = k * eta``: momentum SGD on ``kB`` at ``k * eta`` (TF's
  ``SyncReplicasOptimizer`` averages the ``k`` gradients the same way before its
  ``MomentumOptimizer`` applies them).
- ASP, once a push: ``v <- mu * v + g_i``, ``theta <- theta - (lr / k) * v``: ``eta`` on ``B``.

Only the number written differs: for the paper's ``eta``, pass ``lr = k * eta``.

**The hand-off keeps each round's movement continuous.** Both servers keep the momentum
buffer in gradient units, as torch's SGD and TF's ``MomentumOptimizer`` do (``v <- mu v + g``,
``theta <- theta - rate * v``). Call a *round* one BSP iteration (one update) or ``k`` ASP
updates (one per worker push). While the buffer holds ``v``, a BSP round moves ``lr * v`` and
an ASP round ``k * (lr / k) * v = lr * v``: the same function of the buffer in both
phases, so the buffer crosses a switch unchanged, in both directions. With every gradient a
constant ``g`` the buffer settles at ``g / (1 - mu)`` in both phases (ASP's ``mu`` per push
makes it settle in about ``1 / (1 - mu)`` pushes rather than rounds, not elsewhere), so every
round moves ``lr * g / (1 - mu)`` on both sides. *Continuous* means that: with every gradient
``g`` and the buffer settled, each of the first rounds after a switch, either way, moves as
far as the last round before it (``tests/unit/test_sync_switch_handoff.py`` holds the real
servers to 5 % and to torch's SGD). The earlier hand-off multiplied the buffer by ``k``
going to ASP (so that one *update* moved as far as one BSP update) and divided it coming
back: at ``mu = 0.9`` and ``k = 8`` the first ASP rounds moved 5.5, 2.9, 1.8 and 1.4 times
the steady round, and the first BSP round after a switch back 0.2 times. Carrying the
buffer unchanged is also what the paper's checkpoint and restart does: TF's checkpoint holds
the momentum slots, and the restart changes the protocol, batch and rate [inference: the
paper does not discuss the slots]. Where a phase has not settled (``g`` changing, or elastic's
rounds of fewer workers, which apply ``lr`` times the sum over ``k``) the rounds after a
switch move as the new phase's update moves from that buffer; nothing is rescaled.

**Transient stragglers** (``policy``). Every ``window`` iterations of
the BSP workload the workers exchange their own throughput, iterations per second of their
own part of an iteration: from holding the new parameters to having sent the gradient (the
waits for others, which BSP makes everyone share, left out; a throttled CPU and a slow NIC
both show), and a worker below the mean minus one standard deviation (population, over the
workers still training, itself included) for ``consecutive`` windows in a row is a
straggler: the paper's rule. ``min_gap`` (0, off, by default) is ours, not the paper's: a
straggler must also be that fraction below the median, because among equally fast workers
the paper's rule alone flags noise; at 0.5 a worker less than 2x slow is never flagged.

- ``greedy``: a straggler in BSP switches everyone to ASP; ``consecutive`` windows without
  one switch back to BSP while BSP work is left. Every switch costs a barrier and two
  server set-ups.
- ``elastic``: a straggler in BSP leaves the rounds (at most ``max_removed`` of the
  workers) and BSP goes on without it: a round then applies ``lr`` times the sum of the
  pushes it got over ``k``, the linear scaling rule for the smaller batch. The removed worker
  skips its iterations (its data of those iterations is not trained on) until the switch
  point, where it pulls the settled parameters and trains ASP with everyone.

Both act only before the switch point: once the run is in its ASP phase for good it is
immune to transient stragglers. The throughput exchange is a collective, so in greedy's ASP
episodes the workers meet every ``window`` iterations.

Choices made here: ``switch_at`` is a fraction of the run's iterations (the paper's
"percent of the workload"), rounded to a whole iteration; 0 is pure ASP and 1 pure BSP. The
BSP work is counted in BSP iterations, so greedy's ASP episodes postpone the switch point.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dssync.errors import DssyncError
from dssync.ps.partial import PartialServer
from dssync.ps.server import ParameterServer, ShardServer
from dssync.strategies.asp import ASPStrategy
from dssync.strategies.base import StrategyContext

__all__ = ["SyncSwitchStrategy", "below_mean_minus_std"]

POLICIES = ("none", "greedy", "elastic")


def below_mean_minus_std(throughput: Sequence[float | None], min_gap: float = 0.0) -> set[int]:
    """The workers whose throughput is below the mean minus one (population) standard
    deviation of the workers that report one (``None``: not training), the paper's rule;
    with ``min_gap > 0`` (ours) also more than ``min_gap`` below the median."""
    known = [t for t in throughput if t is not None]
    if len(known) < 2:
        return set()
    bar = statistics.fmean(known) - statistics.pstdev(known)
    if min_gap > 0:
        bar = min(bar, (1 - min_gap) * statistics.median(known))
    return {w for w, t in enumerate(throughput) if t is not None and t < bar}


class SyncSwitchStrategy(ASPStrategy):
    name = "sync-switch"
    compared = False
    settled_snapshots = True  # rounds track which workers are in; evaluations leave them as a whole

    @dataclass(frozen=True, kw_only=True)
    class Config(ASPStrategy.Config):
        switch_at: float = 0.5
        """Fraction of the run's iterations trained with BSP before the switch to ASP."""
        policy: str = "none"
        """Transient stragglers before the switch point: none, greedy or elastic."""
        window: int = 10
        """Iterations per throughput window of the straggler detector."""
        consecutive: int = 2
        """Windows in a row below mean - std that make a straggler (and, for greedy, windows
        in a row without one that make the cluster straggler-free)."""
        max_removed: float = 0.5
        """Elastic: the largest fraction of the workers that may be out of BSP at once."""
        min_gap: float = 0.0
        """Ours, not the paper's (0: off, the paper's rule alone): a straggler must also be this
        fraction below the median throughput. With equally fast workers the mean-minus-std
        rule alone flags one in about every six windows by noise (8 workers on the 2-core
        machine vary by up to 40 % from window to window), which ``consecutive`` only thins;
        0.5 (the default before) ignores every worker less than 2x slow."""

        def __post_init__(self) -> None:
            if not 0.0 <= self.switch_at <= 1.0:
                raise ValueError(f"switch_at is a fraction of the workload in [0, 1], got {self.switch_at}")
            if self.policy not in POLICIES:
                raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
            if self.window < 1 or self.consecutive < 1:
                raise ValueError(f"window and consecutive must be at least 1, got {self.window}, {self.consecutive}")
            if not 0.0 <= self.min_gap < 1.0:
                raise ValueError(f"min_gap is a fraction in [0, 1), got {self.min_gap}")
            if not 0.0 <= self.max_removed < 1.0:
                raise ValueError(f"max_removed is a fraction in [0, 1), got {self.max_removed}")

    config: Config

    def __init__(self, ctx: StrategyContext, config: Config | None = None) -> None:
        super().__init__(ctx, config)
        if ctx.steps is None:
            raise DssyncError("sync-switch switches at a fraction of the run: give the strategy the run's steps "
                              "(StrategyContext.steps)")
        self.switch_step = round(self.config.switch_at * ctx.steps)
        self.phase = "bsp" if self.switch_step > 0 else "asp"
        self.bsp_done = 0
        self.switches: list[dict[str, Any]] = []
        self.removed: set[int] = set()
        self.detections: list[dict[str, Any]] = []
        self._loop_lr: float | None = None
        self._busy_s = 0.0
        self._busy_iters = 0
        self._ready_at: float | None = None
        self._flagged = [0] * self.comm.world_size
        self._clean = 0

    @property
    def switch_s(self) -> float | None:
        """Seconds of the switch to ASP for good (``None`` before it)."""
        final = [s for s in self.switches if s.get("final")]
        return final[0]["s"] if final else None

    def _server_lr(self, lr: float) -> float:
        self._loop_lr = lr
        return lr if self.phase == "bsp" else lr / self.comm.world_size

    def _make_server(self, settings: dict[str, float]) -> ShardServer:
        if self.phase == "bsp":
            return PartialServer(self.comm, self._flat, **settings)
        return ParameterServer(self.comm, self._flat, **settings)

    @property
    def _out(self) -> bool:
        return self.comm.rank in self.removed

    def _policy_on(self) -> bool:
        return self.config.policy != "none" and self.bsp_done < self.switch_step

    # -- per iteration -------------------------------------------------------------------------
    def compute(self, step: int, forward_backward: Callable[[], torch.Tensor]) -> torch.Tensor | None:
        if self._out:
            return None  # out of BSP until the switch point: this iteration's batch is skipped
        return forward_backward()

    def _before_step(self, step: int) -> bool:
        if self._out:
            return False
        t0 = time.perf_counter()
        pushed = super()._before_step(step)
        # The worker's own time: from holding the new parameters to its gradient sent (its
        # computation, and for a BSP round the push alone, not the wait for the others; an
        # ASP push-and-pull waits for nobody). A throttled CPU or a slow NIC both show here.
        own = self.server.last_send_s if self.server.last_send_s is not None else time.perf_counter() - t0
        if self._ready_at is not None:
            self._busy_s += t0 - self._ready_at + own
            self._busy_iters += 1
        self._ready_at = time.perf_counter()
        return pushed

    def _after_comm(self, step: int) -> None:
        last = step + 1 >= (self.ctx.steps or 0)
        if self.phase == "bsp":
            self.bsp_done += 1
            if self.bsp_done == self.switch_step:
                if not last:
                    self.switch("asp", step + 1, "switch point", final=True)
                return
        if self._policy_on() and (step + 1) % self.config.window == 0 and not last:
            self._detect(step + 1)

    def _detect(self, next_step: int) -> None:
        """Exchange the window's throughput (collective) and act on stragglers."""
        mine = None if self._out or self._busy_s <= 0 else self._busy_iters / self._busy_s
        self._busy_s, self._busy_iters = 0.0, 0
        throughput = self.comm.allgather_object(mine)
        self._ready_at = None  # the exchange waited for the others: not this worker's own time
        below = below_mean_minus_std(throughput, self.config.min_gap)
        self._flagged = [n + 1 if w in below else 0 for w, n in enumerate(self._flagged)]
        self._clean = 0 if below else self._clean + 1
        stragglers = sorted(w for w, n in enumerate(self._flagged) if n >= self.config.consecutive)
        if self.config.policy == "greedy":
            if self.phase == "bsp" and stragglers:
                self._note(next_step, "straggler", stragglers, throughput)
                self.switch("asp", next_step, f"stragglers {stragglers}")
            elif self.phase == "asp" and self._clean >= self.config.consecutive:
                self._note(next_step, "straggler-free", [], throughput)
                self.switch("bsp", next_step, "straggler-free")
        elif self.config.policy == "elastic" and self.phase == "bsp" and stragglers:
            room = int(self.config.max_removed * self.comm.world_size) - len(self.removed)
            newly = [w for w in stragglers if w not in self.removed][:max(0, room)]
            if newly:
                self._note(next_step, "removed", newly, throughput)
                if self.comm.rank in newly:
                    self.server.set_idle(True)  # rounds close without it from now on
                self.removed.update(newly)
                for w in newly:
                    self._flagged[w] = 0

    def _note(self, step: int, event: str, workers: list[int], throughput: list[float | None]) -> None:
        self.detections.append({"step": step, "event": event, "workers": workers,
                                "throughput": [None if t is None else round(t, 2) for t in throughput]})

    def switch(self, to: str, next_step: int, reason: str, *, final: bool = False) -> None:
        """Hand the servers' state to servers of protocol ``to`` (collective), timed."""
        assert self._settings is not None and self.server is not None, "setup() first"
        t0 = time.perf_counter()
        self.server.set_idle(True)  # no BSP round waits for a worker that is switching
        self.comm.barrier()  # every worker's last push has been applied and answered
        self.server.pull()  # the settled parameters, also for workers that were out of the rounds
        k = self.comm.world_size
        # Unchanged: a round moves lr times the buffer in both phases (module docstring).
        momentum = self.server.momentum()
        self.server.close()
        self.phase = to
        if to == "asp":
            self.removed.clear()  # the full cluster trains the ASP phase
        settings = dict(self._settings, lr=self._server_lr(self._loop_lr))
        self.server = self._make_server(settings)
        self.server.set_momentum(momentum)
        self.comm.barrier()  # no push reaches a new shard before its momentum is in place
        self._flagged = [0] * k
        self._clean = 0
        self._ready_at = None
        self.switches.append({"step": next_step, "to": to, "reason": reason, "final": final,
                              "s": time.perf_counter() - t0})

    def final_model(self) -> nn.Module:
        assert self.server is not None, "setup() first"
        self._ready_at = None  # the evaluation's waits are nobody's own time
        self.server.pull_settled(stay_idle=self._out)
        return super()._handed_back()

    def stats(self) -> dict[str, object]:
        final = [s for s in self.switches if s["final"]]
        return {"switch_step": final[0]["step"] if final else None, "switch_s": self.switch_s,
                "phase": self.phase, "bsp_iterations": self.bsp_done,
                "switches": [dict(s, s=round(s["s"], 4)) for s in self.switches],
                "detections": self.detections}
