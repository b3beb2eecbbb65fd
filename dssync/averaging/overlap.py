"""Layer-wise overlapped group averaging (the DS-Sync paper's layer-wise mode), as hooks on a
model whose parameters are views of flat buffers (``flatten_parameters``).

As soon as backward has produced all of a bucket's gradients, a hook applies the bucket's
local update (one optimizer per parameter, with the loop's optimizer's settings and its
scheduler's learning rate) and starts the bucket's group allreduce without waiting; the
bucket's layers wait for it in their forward pre-hook of the next iteration. Communication
of the last layers then overlaps the backward pass of the first ones and the forward pass of
the next iteration. Consecutive layers share one bucket until it holds ``bucket_mb`` (filled
in backward order, as DDP fills its buckets), so a model of many small layers does not pay
one allreduce's latency per layer; ``bucket_mb=0`` is one allreduce per layer. A bucket is
one span of a flat buffer, so its allreduce copies nothing. Every parameter must receive a
gradient every iteration.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dssync.averaging.shuffle import Shuffle
from dssync.collectives import Communicator
from dssync.errors import DssyncError

__all__ = ["OverlapReducer"]


@dataclass(eq=False)
class Bucket:
    """Consecutive modules whose parameters are averaged by one allreduce, and that
    allreduce while it is in flight."""

    modules: list[nn.Module]
    params: list[nn.Parameter]
    view: torch.Tensor
    ready: int = 0
    work: Any = None


class OverlapReducer:
    """The hooks of overlapped averaging on ``model`` (whose parameters are views of ``flats``),
    averaging within ``shuffle``'s group of the iteration whose backward runs (``step``).

    ``wrap(optimizer)`` takes the loop's optimizer's settings (call it before ``install()``);
    ``on_wait(seconds)`` is told of every wait for an allreduce in forward; ``landed(step)`` is
    told once per iteration, when every layer holds iteration ``step``'s average (after the next
    forward, or ``flush()``): what after-step mode has right after its average."""

    def __init__(self, model: nn.Module, flats: list[torch.Tensor], comm: Communicator, shuffle: Shuffle, *,
                 bucket_mb: float, on_wait: Callable[[float], None], landed: Callable[[int], None]) -> None:
        self.model = model
        self.flats = flats
        self.comm = comm
        self.shuffle = shuffle
        self.bucket_mb = bucket_mb
        self.on_wait = on_wait
        self.landed = landed
        self.step = 0  # the iteration whose backward is running
        self._landing = False  # the previous iteration's averages are in flight
        self.buckets: list[Bucket] = []
        self.param_optimizers: dict[nn.Parameter, torch.optim.Optimizer] = {}
        # the loop's optimizer and each parameter's group index in it: by index, because
        # Optimizer.load_state_dict (a resume) replaces the group dicts a scheduler then sets
        self._loop_optimizer: torch.optim.Optimizer | None = None
        self._loop_groups: dict[nn.Parameter, int] = {}

    def wrap(self, optimizer: torch.optim.Optimizer) -> None:
        """One optimizer per parameter, with ``optimizer``'s settings for its group."""
        self._loop_optimizer = optimizer
        for index, group in enumerate(optimizer.param_groups):
            settings = {k: v for k, v in group.items() if k not in ("params", "initial_lr")}
            for p in group["params"]:
                self.param_optimizers[p] = type(optimizer)([p], **settings)
                self._loop_groups[p] = index

    def install(self) -> None:
        """Fill the buckets and register the hooks."""
        if not self.param_optimizers:
            raise DssyncError("overlapped ds-sync steps inside backward: pass the optimizer through "
                              "strategy.wrap_optimizer() before setup()")
        layers = [(m, ps) for m in self.model.modules()
                  if (ps := [p for p in m.parameters(recurse=False) if p.requires_grad])]
        cap = self.bucket_mb * 1e6
        # Backward produces gradients roughly from the last layer to the first: fill buckets
        # in that order, as DDP does, so the first bucket is ready early.
        for module, params in reversed(layers):
            if _contiguous_view(params, self.flats) is None:
                raise DssyncError(f"overlapped ds-sync needs each layer's parameters side by side in one "
                                  f"dtype; {type(module).__name__} mixes dtypes")
            last = self.buckets[-1] if self.buckets else None
            joined = None if last is None or last.view.nbytes >= cap else \
                _contiguous_view(last.params + params, self.flats)
            if joined is None:
                self.buckets.append(Bucket([module], params, _contiguous_view(params, self.flats)))
            else:
                last.modules.append(module)
                last.params.extend(params)
                last.view = joined
        for bucket in self.buckets:
            for p in bucket.params:
                p.register_post_accumulate_grad_hook(functools.partial(self._on_grad, bucket))
            for module in bucket.modules:
                module.register_forward_pre_hook(functools.partial(self._wait, bucket))
        self.model.register_forward_hook(lambda module, args, output: self._landed())

    @torch.no_grad()
    def _on_grad(self, bucket: Bucket, param: nn.Parameter) -> None:
        optimizer = self.param_optimizers[param]
        # follows the loop's scheduler
        optimizer.param_groups[0]["lr"] = self._loop_optimizer.param_groups[self._loop_groups[param]]["lr"]
        optimizer.step()
        param.grad = None
        bucket.ready += 1
        if bucket.ready < len(bucket.params):
            return
        bucket.ready = 0
        group = self.shuffle.group(self.step)
        if len(group) > 1:
            bucket.work = self.comm.allreduce_async_(bucket.view, group, average=True)

    def _wait(self, bucket: Bucket, module: nn.Module | None = None, args: Any = None) -> None:
        if bucket.work is not None:
            t0 = time.perf_counter()
            bucket.work.wait()
            self.on_wait(time.perf_counter() - t0)
            bucket.work = None

    def _landed(self) -> None:
        # every layer has waited for its average (a forward ran, or flush())
        if self._landing:
            self._landing = False
            self.landed(self.step - 1)

    def flush(self) -> None:
        """Wait for every bucket's allreduce, then tell ``landed``."""
        for bucket in self.buckets:
            self._wait(bucket)
        self._landed()

    def finish(self, step: int) -> None:
        """Iteration ``step``'s backward is over: check that every bucket started, and count on."""
        partial = [bucket for bucket in self.buckets if bucket.ready]
        if partial:
            names = [type(m).__name__ for bucket in partial for m in bucket.modules]
            raise DssyncError(
                f"rank {self.comm.rank}: overlapped ds-sync got gradients for only some parameters "
                f"of {names} at iteration {step}; every parameter must get a gradient every "
                "iteration in this mode (use the after-step mode)"
            )
        self.step = step + 1
        self._landing = True


def _contiguous_view(params: list[nn.Parameter], flats: list[torch.Tensor]) -> torch.Tensor | None:
    """The span of the flat buffer that holds exactly ``params``, if they sit side by side."""
    for flat in flats:
        base, size = flat.data_ptr(), flat.element_size()
        if all(p.dtype == flat.dtype and base <= p.data_ptr() < base + flat.numel() * size for p in params):
            starts = sorted((p.data_ptr() - base) // size for p in params)
            start, stop = starts[0], max((p.data_ptr() - base) // size + p.numel() for p in params)
            if stop - start == sum(p.numel() for p in params):
                return flat[start:stop]
    return None
