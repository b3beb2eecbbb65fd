"""The built-in prober against iperf3, path by path, on one emulated network.

Both backends measure the same network one pair at a time (``dssync probe --isolated``), so
each figure is what a path gives a single flow, with nothing shared. In the normal,
concurrent rounds, pairs of a round share uplinks, and how TCP splits a shared link among
flows that start together differs from run to run (iperf3's fresh connections more than
gloo's warm ones): that spread is TCP's, not the backend's, and is reported apart.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from dssync.launch import emulate

__all__ = ["compare_backends"]


def _probe(name: str, out: Path, *extra: str, timeout_s: float) -> dict[str, Any]:
    return emulate.run_dssync(name, ["probe", *extra, "--out", str(out)], out, timeout_s=timeout_s)


def compare_backends(rack_sizes: list[int], *, nic: str, uplink: str, slow_nics: dict[int, str],
                     seconds: int, isolated: bool = True, name: str = "pbk",
                     timeout_s: float = 600.0) -> dict[str, Any]:
    """Build the network, probe it with both backends, return both matrices and the ratios."""
    mode = ["--isolated"] if isolated else []
    with emulate.cluster(rack_sizes, nic=nic, uplink=uplink, name=name), \
            tempfile.TemporaryDirectory() as tmp:
        for rank, rate in slow_nics.items():
            emulate.contend(name=name, rank=rank, nic=rate)
        builtin = _probe(name, Path(tmp) / "builtin.json", *mode, "--bandwidth-seconds", str(seconds),
                         timeout_s=timeout_s)
        iperf = _probe(name, Path(tmp) / "iperf3.json", *mode, "--backend", "iperf3",
                       "--iperf-seconds", str(seconds), timeout_s=timeout_s)
    b, i = np.asarray(builtin["bandwidth_gbps"]), np.asarray(iperf["bandwidth_gbps"])
    n = len(b)
    pairs = [(s, d) for s in range(n) for d in range(n) if s != d]
    rows = [{"src": s, "dst": d, "builtin_gbps": round(float(b[s, d]), 4),
             "iperf3_gbps": round(float(i[s, d]), 4),
             "diff": round(float(b[s, d] / i[s, d] - 1), 4) if i[s, d] > 0 else None} for s, d in pairs]
    diffs = [abs(r["diff"]) for r in rows if r["diff"] is not None]
    return {"rack_sizes": rack_sizes, "nic": nic, "uplink": uplink,
            "slow_nics": {str(k): v for k, v in slow_nics.items()}, "seconds": seconds,
            "isolated": isolated, "rows": rows, "max_abs_diff": max(diffs), "median_abs_diff": float(np.median(diffs)),
            "probe_seconds": {"builtin": builtin["probe"]["seconds"], "iperf3": iperf["probe"]["seconds"]}}
