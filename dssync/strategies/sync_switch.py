"""``sync-switch``: BSP first, then ASP, on one sharded parameter server (seeds 000 and 002).

Sync-Switch trains the first ``switch_at`` of the workload with bulk-synchronous SGD and the
rest asynchronously: early, large steps need fresh gradients; late, small ones tolerate
stale ones, so the run reaches BSP's test accuracy at nearly ASP's speed.

- **BSP phase** on the servers: ``dssync.ps_partial.PartialServer`` with every push and
  every block (``c = k``, ``b = 1``), so a shard applies ``lr`` times the mean of the ``k``
  gradients of an iteration, with the loop's momentum: the paper's PS-BSP, whose batch is
  ``k`` times the worker's and whose rate is the loop's ``lr`` (the user's ``n * eta``).
- **ASP phase**: ``dssync.ps.ParameterServer``, every push applied at once with ``lr / k``
  (``eta``, on the worker's batch ``B``) and the same momentum coefficient, the paper's
  configuration policy (digest section 1.1.4).
- **The switch happens in the process** (the paper checkpoints and restarts, 36-53 s):
  after the last BSP iteration every worker stops, the BSP shards' parameters are already
  every worker's (``b = 1``), each rank hands its shard's momentum to its ASP shard (scaled
  by ``k``: the ASP shard scales by ``lr / k`` where the BSP one scaled the mean by ``lr``,
  so the velocity in parameter units is unchanged), the BSP servers close and the ASP
  servers open. ``stats()`` reports the iteration and the seconds the switch took.

Choice made here: ``switch_at`` is a fraction of the run's iterations (the paper's "percent
of the workload"), rounded to a whole iteration; 0 is pure ASP and 1 pure BSP.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from dssync.errors import DssyncError
from dssync.ps import ParameterServer
from dssync.ps_partial import PartialServer
from dssync.strategies.asp import ASPStrategy
from dssync.strategy import StrategyContext

__all__ = ["SyncSwitchStrategy"]


class SyncSwitchStrategy(ASPStrategy):
    name = "sync-switch"
    settled_snapshots = True  # rounds track which workers are in; evaluations leave them as a whole

    @dataclass(frozen=True, kw_only=True)
    class Config(ASPStrategy.Config):
        switch_at: float = 0.5
        """Fraction of the run's iterations trained with BSP before the switch to ASP."""

        def __post_init__(self) -> None:
            if not 0.0 <= self.switch_at <= 1.0:
                raise ValueError(f"switch_at is a fraction of the workload in [0, 1], got {self.switch_at}")

    config: Config

    def __init__(self, ctx: StrategyContext, config: Config | None = None) -> None:
        super().__init__(ctx, config)
        if ctx.steps is None:
            raise DssyncError("sync-switch switches at a fraction of the run: give the strategy the run's steps "
                              "(StrategyContext.steps)")
        self.switch_step = round(self.config.switch_at * ctx.steps)
        self.phase = "bsp" if self.switch_step > 0 else "asp"
        self.switch_s: float | None = None
        self._loop_lr: float | None = None

    def _server_lr(self, lr: float) -> float:
        self._loop_lr = lr
        return lr if self.phase == "bsp" else lr / self.comm.world_size

    def _make_server(self, settings: dict[str, float]) -> ParameterServer:
        if self.phase == "bsp":
            return PartialServer(self.comm, self._flat, **settings)
        return ParameterServer(self.comm, self._flat, **settings)

    def _after_comm(self, step: int) -> None:
        if self.phase == "bsp" and step + 1 == self.switch_step < (self.ctx.steps or 0):
            self.switch()

    def switch(self) -> None:
        """Hand the BSP shards' state to ASP shards (collective), timed."""
        assert isinstance(self.server, PartialServer) and self._settings is not None, "setup() first"
        t0 = time.perf_counter()
        self.server.set_idle(True)  # no BSP round waits for a worker that is switching
        self.comm.barrier()  # every worker's last BSP round has closed and been read
        momentum = self.server._shard.momentum_buf * self.comm.world_size
        self.server.close()
        self.phase = "asp"
        settings = dict(self._settings, lr=self._server_lr(self._loop_lr))
        self.server = self._make_server(settings)
        self.server._shard.momentum_buf[:] = momentum
        self.comm.barrier()  # no push reaches an ASP shard before its momentum is in place
        self.switch_s = time.perf_counter() - t0

    def stats(self) -> dict[str, object]:
        return {"switch_step": self.switch_step if self.switch_step < (self.ctx.steps or 0) else None,
                "switch_s": self.switch_s, "phase": self.phase}
