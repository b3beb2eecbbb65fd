"""Overlapped (layer-wise) against after-step ds-sync, side by side on one emulated network.

One cluster is built; the two modes then train the same task from the same seed in
alternating order (after, overlap, overlap, after, ...), each run a real
``dssync emulate run -- dssync train`` job, so slow drift of the machine falls on both
alike. The figure is the ratio of the median wall time per iteration (evaluation
excluded), overlapped over after-step: below 1, overlap is faster.

On a machine with fewer cores than emulated workers, ranks share cores, so a rank computes
several times slower than it would alone while the emulated links keep their real rates:
the network looks that many times faster, relative to compute, than the same rates would
on real hosts. Overlap can only hide communication behind computation when ranks wait on
the network with the CPU idle, so slower links (or a compute-heavier batch) are where it
shows; the record keeps the rates it ran at.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from dssync.bench.jobs import train_on_cluster
from dssync.launch import emulate
from dssync.topology import Topology
from dssync.training.loop import TrainConfig

__all__ = ["compare_overlap"]


def compare_overlap(rack_sizes: Sequence[int], *, nic: str, uplink: str, flows: Sequence[tuple[str, int]] = (),
                    task: str = "mnist-cnn", steps: int = 40, batch_size: int = 128, bucket_mb: float = 1.0,
                    reps: int = 3, name: str = "ovl", timeout_s: float = 900.0,
                    progress: Any = None) -> dict[str, Any]:
    """Run both modes ``reps`` times each, alternating, and return every run and the ratio."""
    if reps < 1 or steps < 1 or batch_size < 1:
        raise ValueError(f"reps, steps and batch size must be positive, got {reps}, {steps}, {batch_size}")
    if bucket_mb < 0:
        raise ValueError(f"bucket_mb must be 0 (one allreduce per layer) or positive, got {bucket_mb}")
    from dssync.strategies import DSSyncStrategy

    after_step = TrainConfig(strategy=DSSyncStrategy.name, task=task, steps=steps, batch_size=batch_size,
                             eval_every=steps, topology=Topology.from_rack_sizes(list(rack_sizes)), probe_first=True)
    overlap = replace(after_step, strategy_options={"overlap": True, "bucket_mb": bucket_mb})
    runs: list[dict[str, Any]] = []
    with emulate.cluster(list(rack_sizes), nic=nic, uplink=uplink, name=name), \
            tempfile.TemporaryDirectory() as tmp:
        if flows:
            emulate.contend(name=name, flows=list(flows))
        for rep in range(reps):
            order = ("after-step", "overlap") if rep % 2 == 0 else ("overlap", "after-step")
            for mode in order:
                rec = train_on_cluster(name, overlap if mode == "overlap" else after_step,
                                       Path(tmp) / f"{mode}-{rep}.json", timeout_s=timeout_s)
                runs.append({"mode": mode, "rep": rep, "wall_s": rec["wall_s"],
                             "ms_per_iter": 1e3 * rec["wall_s"] / steps,
                             "exposed_comm_ms_per_iter": rec["comm_ms_per_iter"],
                             "final_accuracy": rec["final_accuracy"]})
                if progress is not None:
                    progress(runs[-1])
    med = {m: statistics.median(r["ms_per_iter"] for r in runs if r["mode"] == m) for m in ("after-step", "overlap")}
    acc = {m: statistics.median(r["final_accuracy"] for r in runs if r["mode"] == m) for m in ("after-step", "overlap")}
    return {
        "network": {"rack_sizes": list(rack_sizes), "nic": nic, "uplink": uplink,
                    "flows": [f"{kind}:{idx}" for kind, idx in flows]},
        "task": task, "steps": steps, "batch_size": batch_size, "bucket_mb": bucket_mb, "reps": reps,
        "runs": runs,
        "median_ms_per_iter": med,
        "median_final_accuracy": acc,
        "ratio": med["overlap"] / med["after-step"],
        "accuracy_diff_pp": 100 * (acc["overlap"] - acc["after-step"]),
    }
