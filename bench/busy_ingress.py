"""The probe's own streams into and out of a rack whose uplink another job loads, against the
same paths clear, at several ack windows and stream lengths, with iperf3 beside them.

``python -m dssync.bench.busy_ingress --json bench/results/busy-ingress.json`` (root) builds
two racks of two at 1 Gbit/s, and times single streams between rank 2 (rack 1) and rank 0
(rack 0) with the probe's timed-stream protocol (``dssync.probing.measure.timed_stream``: a
message, the receiver's ack, at most ``window`` messages unacked), first with the cluster
clear, then with another job's streams leaving rack 0 (``emulate contend --flows rack:0``).
"into" is 2->0: its data enters rack 0 on the free direction of the uplink and only its acks
leave through the loaded one; "out" is 0->2, sharing the loaded direction. Settings are
interleaved within each repeat, so that a background flow's drift does not land on one
setting. A stream on a TCP connection opened for it (``fresh``: no protocol but TCP's, timed
by the receiver) runs at each stream length, and iperf3 (``-t 1``) times the same two paths,
once a repeat. The record names the TCP
congestion control the ranks' connections used (the namespaces take the machine's default).

Why it matters: the telling rounds run no flow into or out of a rack whose uplink the pairs
flag (``dssync.topology.telling.design``), so a rack that shows only through such an uplink
stays unsure. This record is what that rests on: whether a longer stream or a larger
window would make a flow into a busy rack measure what its path allows, as iperf3's does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["SETTINGS", "main", "measure", "summarize"]

#: (ack window in messages, stream seconds) for each stream timed
SETTINGS = ((2, 0.25), (8, 0.25), (2, 1.0), (8, 1.0))
DIRECTIONS = {"into": (2, 0), "out": (0, 2)}


class _FreshStreams:
    """Timed streams each on a TCP connection of its own, opened for it: the sender writes
    0.5 MiB chunks for the stream's length and closes; the receiver times the bytes from the
    first to the last. A fresh connection learns its path as it is now; the probe's streams
    ride the process group's connections, open since start-up."""

    CHUNK = 1 << 19

    def __init__(self, comm: Any) -> None:
        import os
        import socket

        from dssync.collectives.sockets import interface_address

        self.comm = comm
        addr = interface_address(os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
        self.server = socket.create_server((addr, 0))
        self.server.settimeout(60.0)
        self.peers = comm.allgather_object(self.server.getsockname()[:2])

    def run(self, src: int, dst: int, seconds: float) -> float:
        """Gbit/s of one stream from ``src`` to ``dst``, on every rank."""
        import socket

        value = None
        self.comm.barrier()
        if self.comm.rank == dst:
            conn, _ = self.server.accept()
            with conn:
                conn.settimeout(60.0)
                got, first, last = 0, None, None
                while chunk := conn.recv(self.CHUNK):
                    now = time.perf_counter()
                    first = now if first is None else first
                    got, last = got + len(chunk), now
            value = got * 8 / (last - first) / 1e9 if first is not None and last > first else 0.0
        elif self.comm.rank == src:
            payload = bytes(self.CHUNK)
            with socket.create_connection(self.peers[dst], timeout=60.0) as conn:
                end = time.perf_counter() + seconds
                while time.perf_counter() < end:
                    conn.sendall(payload)
        return float(next(v for v in self.comm.allgather_object(value) if v is not None))

    def close(self) -> None:
        self.server.close()


def _worker(comm: Any, out: str, reps: int) -> None:
    """One rank's part, run by ``run_ranks`` under ``emulate.run``."""
    from dssync.probing import measure as m
    from dssync.probing.phases import concurrent_phase

    link = m.Link(comm)
    iperf = m.Iperf3(comm, m.ProbeConfig(iperf_seconds=1), base_port=5381)
    fresh = _FreshStreams(comm)
    comm.barrier()
    rows: list[dict[str, Any]] = []
    try:
        for rep in range(reps):
            for window, seconds in SETTINGS:
                m.WINDOW = window
                cfg = m.ProbeConfig(bandwidth_seconds=seconds)
                for direction, flow in DIRECTIONS.items():
                    rates, _ = concurrent_phase(comm, link, [flow], cfg, f"{direction} stream")
                    rows.append({"rep": rep, "tool": "probe", "window": window, "seconds": seconds,
                                 "direction": direction, "gbps": round(float(rates[flow]), 4)})
            for seconds in sorted({s for _, s in SETTINGS}):
                for direction, flow in DIRECTIONS.items():
                    rows.append({"rep": rep, "tool": "fresh", "window": None, "seconds": seconds,
                                 "direction": direction, "gbps": round(fresh.run(*flow, seconds), 4)})
            for direction, (src, _dst) in DIRECTIONS.items():
                comm.barrier()
                # rank 2 runs the client both ways: -R has rank 0's server send to it
                value = iperf.client(0, reverse=src == 0) if comm.rank == 2 else None
                got = [v for v in comm.allgather_object(value) if v is not None][0]
                rows.append({"rep": rep, "tool": "iperf3", "window": None, "seconds": 1.0,
                             "direction": direction, "gbps": round(float(got), 4)})
    finally:
        m.WINDOW = 2
        iperf.close()
        fresh.close()
    # the TCP congestion control the ranks' connections use (their namespace's default):
    # a long-lived connection's BBR keeps the round trip it once saw at rest
    from dssync.bench.provenance import congestion_control

    controls = comm.allgather_object(congestion_control())
    if comm.rank == 0:
        Path(out).write_text(json.dumps({"rows": rows, "congestion_control": sorted(set(controls))}))


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per tool, window, stream length and direction: the median Gbit/s and the range."""
    keys = sorted({(r["tool"], r["window"] or 0, r["seconds"], r["direction"]) for r in rows})
    out = []
    for tool, window, seconds, direction in keys:
        values = [r["gbps"] for r in rows if (r["tool"], r["window"] or 0, r["seconds"], r["direction"])
                  == (tool, window, seconds, direction)]
        out.append({"tool": tool, "window": window or None, "seconds": seconds, "direction": direction,
                    "median_gbps": round(statistics.median(values), 3), "min_gbps": round(min(values), 3),
                    "max_gbps": round(max(values), 3), "runs": len(values)})
    return out


def measure(*, reps: int = 5, name: str = "dsbing", timeout_s: float = 900.0) -> dict[str, Any]:
    """The record: every setting on the clear cluster, then with rack 0's uplink loaded."""
    from dssync.launch import emulate

    record: dict[str, Any] = {"rack_sizes": [2, 2], "rate": "1gbit", "flows": ["rack:0"], "reps": reps,
                              "settings": [list(s) for s in SETTINGS], "directions": {k: list(v) for k, v in DIRECTIONS.items()}}
    with emulate.cluster([2, 2], name=name), tempfile.TemporaryDirectory() as tmp:
        for label, flows in (("clear", []), ("busy", [("rack", 0)])):
            emulate.contend(name=name, clear=True)
            if flows:
                emulate.contend(name=name, flows=flows)
                time.sleep(1.0)
            out = Path(tmp) / f"{label}.json"
            rc = emulate.run([sys.executable, "-m", "dssync.bench.busy_ingress", "--worker", str(out),
                              "--reps", str(reps)], name=name, timeout_s=timeout_s)
            if rc != 0 or not out.exists():
                raise RuntimeError(f"the {label} run failed (exit {rc}); its workers' output is above")
            if flows and emulate.dead_flows(name):
                raise RuntimeError("a background flow ended during the busy run; run it again")
            got = json.loads(out.read_text())
            record[label] = {"rows": got["rows"], "summary": summarize(got["rows"]),
                             "congestion_control": got["congestion_control"]}
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dssync.bench.busy_ingress", description=__doc__.splitlines()[0])
    p.add_argument("--json", metavar="OUT.json", help="write the record here")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker is not None:
        from dssync.launch import run_ranks

        run_ranks(_worker, args.worker, args.reps, nproc=None, timeout_s=120.0)
        return 0
    from dssync.bench.provenance import stamp

    record = measure(reps=args.reps)
    record = stamp(record)
    record["provenance"]["command"] = " ".join(["python -m dssync.bench.busy_ingress",
                                                *(sys.argv[1:] if argv is None else argv)])
    print(f"{'cluster':>7}  {'tool':<6} {'window':>6} {'s':>5}  {'direction':<5}  median Gbit/s (range)")
    for label in ("clear", "busy"):
        for row in record[label]["summary"]:
            print(f"{label:>7}  {row['tool']:<6} {row['window'] or '-':>6} {row['seconds']:>5}  {row['direction']:<5}  "
                  f"{row['median_gbps']:.3f} ({row['min_gbps']:.3f}-{row['max_gbps']:.3f})")
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
