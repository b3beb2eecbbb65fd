"""``dssync bench allreduce``: allreduce bandwidth in the conventions of NVIDIA's nccl-tests.

For each size (bytes; ``count`` float32 elements), ``warmup`` untimed ops, then ``iters``
timed ops back to back after a barrier; ``time`` is the mean per op, in microseconds, of the
slowest rank of the slowest group; ``algbw = size / time`` and
``busbw = algbw * 2 (n - 1) / n`` with ``n`` that group's size, the figure that compares
with a link's bandwidth whatever the group size (nccl-tests' ``all_reduce_perf``). Groups:
the whole world, the racks (all at once), or the groups of a schedule, all groups of a round
at once, iteration ``t`` using round ``t mod period``, as ds-sync runs them. Every size is
then checked once against the oracle (each rank contributes ``rank + 1``), and the elements
that came out wrong are counted (``#wrong``).
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

from dssync.collectives import Communicator

__all__ = ["allreduce_rank", "format_table", "parse_size", "size_sweep"]

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """``"64"``, ``"1K"``, ``"256M"``, ``"1G"`` -> bytes (binary units, as nccl-tests)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)B?\s*", text.upper())
    if not m:
        raise ValueError(f"a size looks like 1024, 1K, 256M or 1G, got {text!r}")
    return int(m.group(1)) * _UNITS[m.group(2)]


def size_sweep(spec: str, factor: int = 2) -> list[int]:
    """``"1K:64M"`` with ``factor`` 2 -> 1K, 2K, ..., 64M (nccl-tests ``-b -e -f``); ``"4M"`` -> [4M]."""
    lo_text, _, hi_text = spec.partition(":")
    lo = parse_size(lo_text)
    hi = parse_size(hi_text) if hi_text else lo
    if factor < 2:
        raise ValueError(f"the size factor must be at least 2, got {factor}")
    if lo < 4 or hi < lo:
        raise ValueError(f"sizes must run from at least 4 bytes upward, got {spec!r}")
    sizes, size = [], lo
    while size <= hi:
        sizes.append(size - size % 4)
        size *= factor
    return sizes


def allreduce_rank(comm: Communicator, sizes: Sequence[int], rounds: Sequence[Sequence[Sequence[int]]],
                   warmup: int, iters: int) -> dict[str, Any] | None:
    """One rank's part: time every size on the groups of ``rounds``; rank 0 gets the rows."""
    all_groups = {tuple(sorted(g)) for r in rounds for g in r}
    comm.register_groups(sorted(all_groups))
    mine = [next((tuple(sorted(g)) for g in r if comm.rank in g), (comm.rank,)) for r in rounds]
    rows = []
    for size in sizes:
        count = size // 4
        buf = torch.ones(count, dtype=torch.float32)
        for t in range(warmup):
            _op(comm, buf, mine[t % len(mine)])
        comm.barrier()
        t0 = time.perf_counter()
        for t in range(iters):
            _op(comm, buf, mine[t % len(mine)])
        elapsed = (time.perf_counter() - t0) / iters
        # Correctness: each rank contributes rank + 1; the sum over the group is the oracle.
        group = mine[0]
        buf.fill_(comm.rank + 1)
        _op(comm, buf, group)
        want = float(sum(r + 1 for r in group))
        wrong = int((buf != want).sum()) if len(group) > 1 else 0
        rows.append({"size": size, "count": count, "time_s": elapsed, "wrong": wrong, "group": list(group)})
    gathered = comm.allgather_object(rows)
    if comm.rank != 0:
        return None
    return summarize(gathered)


def _op(comm: Communicator, buf: torch.Tensor, group: tuple[int, ...]) -> None:
    if len(group) > 1:
        comm.allreduce_(buf, group)


def summarize(gathered: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Per size: the slowest rank's time and the bandwidths of its group (nccl-tests units)."""
    out = []
    for per_rank in zip(*gathered, strict=True):
        slowest = max(per_rank, key=lambda r: r["time_s"])
        n = len(slowest["group"])
        algbw = slowest["size"] / slowest["time_s"] / 1e9 if n > 1 else 0.0
        out.append({
            "size": slowest["size"], "count": slowest["count"], "type": "float", "redop": "sum",
            "time_us": slowest["time_s"] * 1e6, "algbw_gbs": algbw, "busbw_gbs": algbw * 2 * (n - 1) / n,
            "group_size": n, "wrong": sum(r["wrong"] for r in per_rank),
        })
    return {"rows": out, "avg_busbw_gbs": statistics.fmean(r["busbw_gbs"] for r in out)}


def format_table(record: dict[str, Any], title: str) -> str:
    """The nccl-tests text table."""
    lines = [f"# {title}",
             f"#{'size':>12}  {'count':>12}  {'type':>6}  {'redop':>6}  {'time':>10}  {'algbw':>7}  {'busbw':>7}  {'#wrong':>6}",
             f"#{'(B)':>12}  {'(elements)':>12}  {'':>6}  {'':>6}  {'(us)':>10}  {'(GB/s)':>7}  {'(GB/s)':>7}  {'':>6}"]
    for r in record["rows"]:
        lines.append(f" {r['size']:>12}  {r['count']:>12}  {r['type']:>6}  {r['redop']:>6}  {r['time_us']:>10.1f}  "
                     f"{r['algbw_gbs']:>7.3f}  {r['busbw_gbs']:>7.3f}  {r['wrong']:>6}")
    lines.append(f"# Avg bus bandwidth    : {record['avg_busbw_gbs']:.4f}")
    return "\n".join(lines)
