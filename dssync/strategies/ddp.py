"""``ddp``: torch's own ``DistributedDataParallel``, the data parallelism users run today.

The model is wrapped in ``torch.nn.parallel.DistributedDataParallel`` and the loop's
forward and backward go through the wrapper (``training_module()``), so gradients are
averaged by DDP's reducer: its buckets (``bucket_cap_mb``, 25 MB by default, and a first
bucket of 1 MB), filled in backward order, each allreduced as soon as it is ready, while the
rest of backward still runs. The optimizer step is the loop's own. It is the reference of
every ratio and target in ``dssync bench compare`` (time to accuracy is measured against it).

Communication is timed the way the DS-Sync paper's evaluation (section V-A.2) defines it, from the first bucket's
allreduce being started to the last one's completion, through a communication hook that is
torch's ``allreduce_hook`` (the same arithmetic as DDP without a hook: divide by the world
size, then sum) with a timestamp on either side. The hook runs in C++ futures; its Python
part is one call per bucket.

Needs ``torch.distributed`` (``--backend torch``): gloo for CPU models, NCCL for CUDA ones.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from dssync.errors import DssyncError
from dssync.strategies.base import Strategy, StrategyContext

__all__ = ["DDPStrategy", "require_torch_distributed"]


def require_torch_distributed(strategy: str, comm: Any) -> None:
    """An error that says to use ``--backend torch`` unless ``comm`` runs on torch.distributed."""
    from dssync.collectives.torch_dist import TorchCommunicator

    if not isinstance(comm, TorchCommunicator):
        raise DssyncError(f"{strategy} runs on torch.distributed process groups; use --backend torch "
                          f"(this job's communicator is {type(comm).__name__})")


class DDPStrategy(Strategy):
    name = "ddp"
    devices = ("cpu", "cuda")
    resumable = True  # nothing carried between iterations beyond the model and optimizer

    @dataclass(frozen=True, kw_only=True)
    class Config(Strategy.Config):
        bucket_cap_mb: float = 25.0
        """DDP's bucket size (its default); the first bucket is 1 MB whatever this is."""
        gradient_as_bucket_view: bool = False
        """DDP's option: gradients are views into the buckets (saves a copy)."""

        def __post_init__(self) -> None:
            if not self.bucket_cap_mb > 0:
                raise ValueError(f"bucket_cap_mb must be positive, got {self.bucket_cap_mb}")

    config: Config

    def __init__(self, ctx: StrategyContext, config: Config | None = None) -> None:
        super().__init__(ctx, config)
        require_torch_distributed(self.name, self.comm)
        self.ddp: DistributedDataParallel | None = None
        self._lock = threading.Lock()  # completions arrive on the backend's threads
        self._first_s: float | None = None
        self._last_s = 0.0

    def setup(self) -> None:
        # DDP's constructor is collective: it checks the ranks' parameter shapes and
        # broadcasts rank 0's parameters and buffers, the common start every strategy has.
        on_cuda = next(self.model.parameters()).is_cuda
        device_ids = [next(self.model.parameters()).device] if on_cuda else None
        self.ddp = DistributedDataParallel(
            self.model, device_ids=device_ids, bucket_cap_mb=self.config.bucket_cap_mb,
            gradient_as_bucket_view=self.config.gradient_as_bucket_view)
        self.ddp.register_comm_hook(None, self._timed_allreduce)

    def training_module(self) -> nn.Module:
        if self.ddp is None:
            raise DssyncError("ddp wraps the model in setup(): call strategy.setup() first")
        return self.ddp

    def _timed_allreduce(self, state, bucket):  # noqa: ANN001, ANN202 - DDP checks the hook's annotations
        """torch's ``allreduce_hook``, timed (unannotated: DDP rejects any annotation other than
        its own types, which postponed annotations turn into strings)."""
        with self._lock:
            if self._first_s is None:
                self._first_s = time.perf_counter()

        def done(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            with self._lock:
                self._last_s = max(self._last_s, time.perf_counter())
            return fut.value()

        return allreduce_hook(state, bucket).then(done)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._prime = True

    def compute(self, step: int, forward_backward: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The loop's forward and backward; the first after a resume runs once before, as a
        throwaway. DDP lays its buckets out in parameter order for the first backward and then,
        for good, in the order gradients became ready; gloo sums an element in an order that
        depends on where it sits in the bucket. The run that never stopped had that layout at
        this iteration, so the resumed one learns it first (the random state is restored, the
        gradients cleared) and takes its real step with it, to the last bit."""
        if getattr(self, "_prime", False):
            self._prime = False
            devices = [torch.cuda.current_device()] if next(self.model.parameters()).is_cuda else []
            with torch.random.fork_rng(devices=devices):
                forward_backward()
            for p in self.model.parameters():
                p.grad = None
            with self._lock:
                self._first_s, self._last_s = None, 0.0
        return forward_backward()

    def _before_step(self, step: int) -> bool:
        # backward() has returned, so DDP has waited for every bucket: the iteration's
        # communication is over. It overlapped backward, so it is charged as it happened.
        with self._lock:
            if self._first_s is not None:
                self._exposed_s += max(0.0, self._last_s - self._first_s)
            self._first_s, self._last_s = None, 0.0
        return False
