"""Flat parameter storage: a module's parameters become views into one contiguous buffer.

Averaging the parameters of a group is then a single allreduce of one tensor with no
copies in and out, which is what keeps DS-Sync's averaging as cheap as a bare allreduce
of a pre-flattened buffer. One buffer is made per (device, dtype).
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn

__all__ = ["flatten_parameters"]


@torch.no_grad()
def flatten_parameters(module: nn.Module) -> list[torch.Tensor]:
    """Move ``module``'s parameters into flat buffers and return the buffers.

    Each ``Parameter`` object stays the same (optimizers built before or after keep
    working); only its storage changes, so ``param.data`` is a view of a buffer.
    """
    by_kind: dict[tuple[torch.device, torch.dtype], list[nn.Parameter]] = defaultdict(list)
    for p in module.parameters():
        by_kind[(p.device, p.dtype)].append(p)
    buffers = []
    for (device, dtype), params in by_kind.items():
        flat = torch.empty(sum(p.numel() for p in params), device=device, dtype=dtype)
        offset = 0
        for p in params:
            n = p.numel()
            flat[offset : offset + n].copy_(p.reshape(-1))
            p.data = flat[offset : offset + n].view_as(p)
            offset += n
        buffers.append(flat)
    return buffers
