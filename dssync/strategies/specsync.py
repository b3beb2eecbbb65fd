"""``specsync``: speculative synchronization on the asynchronous parameter server (the speculative synchronization paper).

ASP with a twist: a worker that learns, shortly after starting an iteration, that enough
other workers have pushed since its pull abandons the computation, pulls the fresher
parameters and recomputes the same mini-batch (its gradients from the abandoned work are
discarded; momentum lives on the servers and is untouched). The central scheduler, its
control channel and the adaptive ``ABORT_TIME`` / ``ABORT_RATE`` tuning are in
``dssync.ps.speculation``; the servers are ``asp``'s, unchanged.

Cancellation (a choice the paper leaves open): every leaf module's forward pre-hook, a hook on
the gradient of every leaf module's output, and the end of backward are cancellation points;
a re-sync that arrives before the computation starts is honoured by pulling before it. At
most one restart per iteration. ``abort_time_s = 0`` (the default) is the adaptive mode;
``abort_time_s > 0`` with ``abort_rate`` is the fixed mode (the paper's Cherrypick).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dssync.ps.framing import job_secret
from dssync.ps.speculation import Scheduler, SchedulerClient
from dssync.strategies.asp import ASPStrategy
from dssync.strategies.base import StrategyContext

__all__ = ["SpecSyncStrategy"]


class ResyncError(Exception):
    """Raised at a cancellation point when the scheduler asked this worker to re-sync."""


class SpecSyncStrategy(ASPStrategy):
    name = "specsync"
    compared = False

    @dataclass(frozen=True, kw_only=True)
    class Config(ASPStrategy.Config):
        abort_time_s: float = 0.0
        """ABORT_TIME, the speculation window after an iteration starts (0: adaptive, Algorithm 1)."""
        abort_rate: float = 0.0
        """ABORT_RATE in the fixed mode: re-sync when others' pushes in the window reach rate x m."""
        max_abort_fraction: float = 0.5
        """Adaptive mode: ABORT_TIME at most this fraction of the mean iteration span."""

        def __post_init__(self) -> None:
            if self.abort_time_s < 0 or self.abort_rate < 0:
                raise ValueError("abort_time_s and abort_rate must be 0 or more")
            if self.abort_time_s > 0 and self.abort_rate <= 0:
                raise ValueError("the fixed mode (abort_time_s > 0) needs abort_rate > 0")
            if not 0 < self.max_abort_fraction <= 1:
                raise ValueError(f"max_abort_fraction must be in (0, 1], got {self.max_abort_fraction}")

    config: Config

    def __init__(self, ctx: StrategyContext, config: Config | None = None) -> None:
        super().__init__(ctx, config)
        self.scheduler: Scheduler | None = None
        self.client: SchedulerClient | None = None
        self.aborts = 0
        self.early_resyncs = 0
        self.wasted_s = 0.0
        self._armed = False
        self._hooks: list[Any] = []

    def setup(self) -> None:
        super().setup()
        c = self.config
        secret = job_secret(self.comm)
        if self.comm.rank == 0:
            self.scheduler = Scheduler(self.comm.world_size, abort_time_s=c.abort_time_s, abort_rate=c.abort_rate,
                                       max_fraction=c.max_abort_fraction, timeout_s=self.comm.timeout_s,
                                       secret=secret)
        self.client = SchedulerClient(self.comm, self.scheduler.address if self.scheduler else None,
                                      timeout_s=self.comm.timeout_s, secret=secret)
        # Plain closures, not bound methods: a deep copy of the model (the handed-back one)
        # shares a function but would deep-copy a method's strategy, sockets and all.
        check = self._check

        def check_forward(module: nn.Module, args: Any) -> None:
            check()

        def watch_backward(module: nn.Module, args: Any, output: Any) -> None:
            if isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(lambda grad: check())

        for module in self.model.modules():
            if next(module.children(), None) is None:
                self._hooks.append(module.register_forward_pre_hook(check_forward))
                self._hooks.append(module.register_forward_hook(watch_backward))

    # -- cancellation points ------------------------------------------------------------------
    def _check(self) -> None:
        if self._armed and self.client is not None and self.client.resync.is_set():
            raise ResyncError

    def compute(self, step: int, forward_backward: Callable[[], torch.Tensor]) -> torch.Tensor:
        assert self.client is not None and self.server is not None, "setup() first"
        self.client.begin(step)
        if self.client.resync.is_set():  # came before the computation started: pull first
            self.client.end()
            self.aborts += 1
            self.early_resyncs += 1
            self._resync_pull()
            return forward_backward()
        t0 = time.perf_counter()
        self._armed = True
        try:
            loss = forward_backward()
            self._check()  # the last point: before the gradient leaves
            return loss
        except ResyncError:
            self._armed = False
            self.client.end()
            self.aborts += 1
            self.wasted_s += time.perf_counter() - t0
            self._resync_pull()
            return forward_backward()  # the same mini-batch, once
        finally:
            self._armed = False
            self.client.end()

    def _resync_pull(self) -> None:
        """Out of cycle: the others' pushes since this iteration began (timed as communication)."""
        assert self.server is not None
        t0 = time.perf_counter()
        self.server.pull()
        self._exposed_s += time.perf_counter() - t0

    def _before_step(self, step: int) -> bool:
        communicated = super()._before_step(step)
        assert self.client is not None
        self.client.notify(step + 1)  # pushed; iteration step + 1 starts now
        return communicated

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        if self.client is not None:
            self.client.close()
        super().close()
        if self.scheduler is not None:
            self.scheduler.close()

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"aborts": self.aborts, "aborted_before_start": self.early_resyncs,
                               "wasted_s": round(self.wasted_s, 4)}
        if self.scheduler is not None:
            tunings = [t for t in self.scheduler.tunings if t.abort_time_s > 0]
            out.update(resyncs_sent=sum(self.scheduler.resyncs), notifies=len(self.scheduler.log),
                       epochs_tuned=len(self.scheduler.tunings), epochs_speculating=len(tunings))
            if tunings:
                out.update(abort_time_ms_median=round(1e3 * statistics.median(t.abort_time_s for t in tunings), 3),
                           abort_rate_median=round(statistics.median(t.abort_rate for t in tunings), 4))
            elif self.config.abort_time_s > 0:
                out.update(abort_time_ms=1e3 * self.config.abort_time_s, abort_rate=self.config.abort_rate)
        return out
