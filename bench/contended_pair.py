"""A cross-rack pair through a contended uplink, alone and between rack exchanges.

``python -m dssync.bench.contended_pair --json bench/results/contended-pair.json`` (root)
builds the ``inter-rack`` cluster at ``--rate-scale`` of its rates, starts its background
streams and times a 1 MiB allreduce between rank 0 and rank 4 (the first member of each rack:
the pair hierarchical averaging and ds-sync's cross-rack groups send through the contended
uplink, rack 0's egress), each op after a pause of ``--pause-s`` in which nothing of the job
moves, in three modes, interleaved:

- ``alone``: the pause, the pair, then a one-element rack allreduce;
- ``rack-exchange``: every rack first averages 1 MiB among its members, as a hierarchical
  step does before its pair; after the pair each rank goes on to the next step's exchange
  as soon as its own part of the pair has returned;
- ``rack-exchange-drained``: the same, with a world barrier after the pair, so that no rank
  starts the next exchange before the pair's last bytes have arrived.

Then the same on the clear cluster. Per op it keeps both members' times and when each left
the op (so the record shows which member finishes first, and by how much), and rank 0's TCP
retransmissions and retransmission timeouts (Linux counters of its namespace).

The simulator prices a pair from its calibration, the same pair timed back to back, and ends
a group for all members at once; this record shows what that price misses inside a job.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["MODES", "main", "measure", "summarize"]

MODES = ("alone", "rack-exchange", "rack-exchange-drained")
PAIR = (0, 4)
MIB = 1 << 20


def _tcp_counters() -> dict[str, int]:
    """TCP retransmitted segments and retransmission timeouts of this network namespace."""
    out: dict[str, int] = {}
    for path in ("/proc/net/netstat", "/proc/net/snmp"):
        lines = Path(path).read_text().splitlines()
        for head, values in zip(lines[::2], lines[1::2], strict=True):
            prefix = head.split()[0]
            out.update({prefix + k: int(v) for k, v in zip(head.split()[1:], values.split()[1:], strict=True)})
    return {"retrans_segs": out.get("Tcp:RetransSegs", 0), "timeouts": out.get("TcpExt:TCPTimeouts", 0)}


def _worker(out: Path, reps: int, pause_s: float, rounds: int) -> None:
    """One rank's part, under ``emulate.run`` (RANK, WORLD_SIZE, MASTER_* set)."""
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    half = world // 2
    pair = dist.new_group(list(PAIR))
    racks = [dist.new_group(list(range(half))), dist.new_group(list(range(half, world)))]
    mine = racks[rank // half]
    buf = torch.ones(MIB // 4)
    ops: list[dict[str, Any]] = []
    for _ in range(rounds):
        for mode in MODES:
            for _ in range(reps):
                if mode != "alone":
                    dist.all_reduce(torch.ones(MIB // 4), group=mine)
                time.sleep(pause_s)
                before = _tcp_counters()
                t0 = time.perf_counter()
                if rank in PAIR:
                    dist.all_reduce(buf, group=pair)
                t1 = time.perf_counter()
                op = {"mode": mode, "ms": (t1 - t0) * 1e3, "end_s": time.time()}
                op.update({k: v - before[k] for k, v in _tcp_counters().items()})
                ops.append(op)
                if mode == "rack-exchange-drained":
                    dist.barrier()
                else:
                    dist.all_reduce(torch.ones(1), group=mine)  # the rack waits for its pair member
    gathered = [None] * world
    dist.all_gather_object(gathered, ops)
    if rank == 0:
        # both members' times; rank 0's counters (its egress enters the contended uplink);
        # ends on one clock: every namespace shares the machine's
        merged = [{"mode": a["mode"], "ms": max(a["ms"], b["ms"]), "rank0_ms": a["ms"], "rank4_ms": b["ms"],
                   "rank4_ends_after_ms": (b["end_s"] - a["end_s"]) * 1e3,
                   "retrans_segs": a["retrans_segs"], "timeouts": a["timeouts"]}
                  for a, b in zip(gathered[PAIR[0]], gathered[PAIR[1]], strict=True)]
        out.write_text(json.dumps(merged))
    dist.destroy_process_group()


def summarize(ops: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per mode: median and range of the op times (ms, the slower member's), the median of
    how long after rank 0 rank 4 left the op, total retransmissions and timeouts, and the
    median over ``alone``'s median."""
    out: dict[str, dict[str, float]] = {}
    for mode in MODES:
        mine = [o for o in ops if o["mode"] == mode]
        if not mine:
            continue
        ms = [o["ms"] for o in mine]
        out[mode] = {"ops": len(mine), "median_ms": round(statistics.median(ms), 1), "min_ms": round(min(ms), 1),
                     "max_ms": round(max(ms), 1),
                     "rank4_ends_after_ms": round(statistics.median(o["rank4_ends_after_ms"] for o in mine), 1),
                     "retrans_segs": sum(o["retrans_segs"] for o in mine),
                     "timeouts": sum(o["timeouts"] for o in mine)}
    if "alone" in out:
        for row in out.values():
            row["vs_alone"] = round(row["median_ms"] / out["alone"]["median_ms"], 2)
    return out


def measure(*, rate_scale: float = 0.05, reps: int = 6, pause_s: float = 0.3, rounds: int = 2,
            name: str = "cpair", timeout_s: float = 900.0) -> dict[str, Any]:
    """The record: the three modes on the contended ``inter-rack`` cluster, then on it clear."""
    from dssync.bench.simcheck import scaled_rates
    from dssync.launch import emulate

    spec = emulate.SCENARIOS["inter-rack"]
    nic, uplink = scaled_rates("inter-rack", rate_scale)
    record: dict[str, Any] = {"scenario": "inter-rack", "rate_scale": rate_scale, "nic": nic, "uplink": uplink,
                              "pair": list(PAIR), "bytes": MIB, "pause_s": pause_s, "reps": reps, "rounds": rounds}
    settings = ["--reps", str(reps), "--pause-s", str(pause_s), "--rounds", str(rounds)]
    with emulate.cluster(spec["rack_sizes"], nic=nic, uplink=uplink, name=name), \
            tempfile.TemporaryDirectory() as tmp:
        for label, flows in (("contended", spec["flows"]), ("clear", [])):
            emulate.contend(name=name, clear=True)
            if flows:
                emulate.contend(name=name, flows=flows)
            out = Path(tmp) / f"{label}.json"
            rc = emulate.run([sys.executable, "-m", "dssync.bench.contended_pair", "--worker", str(out), *settings],
                             name=name, timeout_s=timeout_s)
            if rc != 0 or not out.exists():
                raise RuntimeError(f"the {label} run failed (exit {rc}); its workers' output is above")
            if flows and emulate.dead_flows(name):
                raise RuntimeError("a background flow ended during the contended run; run it again")
            ops = json.loads(out.read_text())
            record[label] = {"ops": ops, "summary": summarize(ops)}
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dssync.bench.contended_pair", description=__doc__.splitlines()[0])
    p.add_argument("--json", metavar="OUT.json", help="write the record here")
    p.add_argument("--rate-scale", type=float, default=0.05)
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--pause-s", type=float, default=0.3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker is not None:
        _worker(Path(args.worker), args.reps, args.pause_s, args.rounds)
        return 0
    record = measure(rate_scale=args.rate_scale, reps=args.reps, pause_s=args.pause_s, rounds=args.rounds)
    record["command"] = " ".join(["python -m dssync.bench.contended_pair", *(sys.argv[1:] if argv is None else argv)])
    record["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for label in ("contended", "clear"):
        for mode, row in record[label]["summary"].items():
            print(f"{label:>9}  {mode:<22}  median {row['median_ms']:>7.1f} ms  ({row['min_ms']:.0f}-{row['max_ms']:.0f})"
                  f"  x{row['vs_alone']:.2f} of alone  rank 4 ends {row['rank4_ends_after_ms']:>6.0f} ms after rank 0"
                  f"  retrans {row['retrans_segs']:>5}  timeouts {row['timeouts']}")
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
