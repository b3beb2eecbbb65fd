"""Flat tensors: the one path by which dssync averages parameters over a group.

Two ways in, one way through:

- ``flatten_parameters`` moves a module's parameters into one buffer per (device, dtype) and
  makes each parameter a view of it, so averaging them is one allreduce of a tensor that
  already exists, with nothing copied in or out (what keeps DS-Sync's group average as cheap
  as a bare allreduce of a pre-flattened buffer);
- ``average_tensors`` averages any list of tensors over a group: tensors of one (device,
  dtype) are packed into one buffer (or used as they are, where the list holds one
  contiguous tensor of that kind, such as ``flatten_parameters``' buffers), every buffer's
  allreduce is started before any is waited for, and the averages are copied back.

``world_average`` is the average over the whole world of a copy of a module (what most
strategies hand back at the end); ``hookless_copy`` is that copy.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from dssync.collectives import Communicator, Group

__all__ = ["average_tensors", "flatten_parameters", "hookless_copy", "world_average"]


@torch.no_grad()
def flatten_parameters(module: nn.Module) -> list[torch.Tensor]:
    """Move ``module``'s parameters into flat buffers and return the buffers.

    Each ``Parameter`` object stays the same (optimizers built before or after keep
    working); only its storage changes, so ``param.data`` is a view of a buffer.
    """
    buffers = []
    for params in _by_kind(list(module.parameters())):
        flat = _pack(params)
        offset = 0
        for p in params:
            p.data = flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        buffers.append(flat)
    return buffers


@torch.no_grad()
def average_tensors(comm: Communicator, tensors: Sequence[torch.Tensor], group: Group | None = None) -> int:
    """Average ``tensors`` in place over ``group`` (the world if ``None``): one allreduce per
    (device, dtype), all in flight at once. Returns the bytes one rank sent into them."""
    kinds = _by_kind(list(tensors))
    flats = [ts[0] if len(ts) == 1 and ts[0].is_contiguous() else _pack(ts) for ts in kinds]
    for work in [comm.allreduce_async_(flat, group, average=True) for flat in flats]:
        work.wait()
    for flat, ts in zip(flats, kinds, strict=True):
        if flat is ts[0]:
            continue
        offset = 0
        for t in ts:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()
    return sum(f.numel() * f.element_size() for f in flats)


def hookless_copy(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` without its hooks: a model to evaluate or hand back must not
    run the training's hooks (overlapped ds-sync's waits, SpecSync's cancellation points),
    which also hold sockets and locks that cannot be copied."""
    memo: dict[int, Any] = {}
    for m in module.modules():
        for key, value in vars(m).items():
            if "hooks" in key and isinstance(value, dict):
                memo[id(value)] = type(value)()
    return copy.deepcopy(module, memo)


@torch.no_grad()
def world_average(comm: Communicator, module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose parameters and floating-point buffers are their average
    over the world (collective; ``module`` is untouched)."""
    averaged = hookless_copy(module)
    tensors = [p.data for p in averaged.parameters()]
    tensors += [b for b in averaged.buffers() if b.is_floating_point()]
    average_tensors(comm, tensors)
    return averaged


def _by_kind(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """``tensors`` by (device, dtype), in the order each kind first appears, each kind's in order."""
    kinds: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
    for t in tensors:
        kinds[(t.device, t.dtype)].append(t)
    return list(kinds.values())


def _pack(tensors: list[torch.Tensor]) -> torch.Tensor:
    """A new buffer holding ``tensors`` (of one device and dtype) one after another."""
    return torch.cat([t.detach().reshape(-1) for t in tensors])
