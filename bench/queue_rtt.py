"""Round trips across a rack uplink that another job's streams load, and across it clear.

``python -m dssync.bench.queue_rtt --json bench/results/queue-rtt.json`` (root) builds the
``inter-rack`` cluster at ``--rate-scale`` of its rates and times UDP echoes (one small
datagram, its echo, every 50 ms) between two workers of different racks and two workers of
one rack, first with the cluster clear, then with the scenario's background streams on (they
leave rack 0 through its uplink). A round trip between racks crosses the loaded direction
once, so its rise over the clear one is the queue those streams keep full: the wait every
message through that link sees (``Network.queue_s``), and the clear round trip is the one a
flow has without it (``Network.rtt_s``). The flow model (``bench.flows``) takes both from
here instead of fitting them to the jobs it is checked against.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

__all__ = ["main", "measure"]

PORT = 9977
PAIRS = {"between racks": (0, 4), "inside a rack": (1, 2)}


def _serve(seconds: float) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", PORT))
    s.settimeout(0.5)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            data, peer = s.recvfrom(64)
        except TimeoutError:
            continue
        s.sendto(data, peer)


def _ping(addr: str, count: int) -> list[float]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(1.0)
    out = []
    for i in range(count):
        t = time.perf_counter()
        s.sendto(i.to_bytes(4, "big"), (addr, PORT))
        try:
            while int.from_bytes(s.recvfrom(64)[0], "big") != i:  # a late echo of an earlier one
                pass
            out.append(time.perf_counter() - t)
        except TimeoutError:
            pass
        time.sleep(0.05)
    return out


def _round_trips(c: Any, src: int, dst: int, count: int) -> list[float]:
    """``count`` echoes from worker ``src`` to worker ``dst``, in their namespaces."""
    me = [sys.executable, "-m", "dssync.bench.queue_rtt"]
    server = subprocess.Popen(["ip", "netns", "exec", c.worker_ns(dst), *me, "--serve", str(count * 0.1 + 10)])
    try:
        time.sleep(1.0)
        got = subprocess.run(["ip", "netns", "exec", c.worker_ns(src), *me, "--ping", c.worker_addr(dst),
                              "--count", str(count)], capture_output=True, text=True, check=True, timeout=count + 30)
        return json.loads(got.stdout)
    finally:
        server.kill()
        server.wait()


def measure(*, rate_scale: float = 0.05, count: int = 60, name: str = "dsqrtt") -> dict[str, Any]:
    from dssync.bench.simcheck import scaled_rates
    from dssync.launch import emulate

    spec = emulate.SCENARIOS["inter-rack"]
    nic, uplink = scaled_rates("inter-rack", rate_scale)
    record: dict[str, Any] = {"scenario": "inter-rack", "rate_scale": rate_scale, "nic": nic, "uplink": uplink,
                              "count": count, "pairs": {k: list(v) for k, v in PAIRS.items()}}
    with emulate.cluster(spec["rack_sizes"], nic=nic, uplink=uplink, name=name) as c:
        for label in ("clear", "loaded"):
            if label == "loaded":
                emulate.contend_scenario(spec, name=name, rate_scale=rate_scale)
                time.sleep(2.0)
            for what, (src, dst) in PAIRS.items():
                rtts = _round_trips(c, src, dst, count)
                record.setdefault(label, {})[what] = {"median_ms": 1e3 * statistics.median(rtts),
                                                      "p10_ms": 1e3 * statistics.quantiles(rtts, n=10)[0],
                                                      "p90_ms": 1e3 * statistics.quantiles(rtts, n=10)[-1],
                                                      "answered": len(rtts)}
            if label == "loaded" and emulate.dead_flows(name):
                raise RuntimeError("a background flow ended during the loaded run; run it again")
    between = "between racks"
    record["queue_s"] = (record["loaded"][between]["median_ms"] - record["clear"][between]["median_ms"]) / 1e3
    record["rtt_s"] = record["clear"][between]["median_ms"] / 1e3
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dssync.bench.queue_rtt", description=__doc__.splitlines()[0])
    p.add_argument("--json", metavar="OUT.json")
    p.add_argument("--rate-scale", type=float, default=0.05)
    p.add_argument("--count", type=int, default=60)
    p.add_argument("--serve", type=float, help=argparse.SUPPRESS)
    p.add_argument("--ping", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve is not None:
        _serve(args.serve)
        return 0
    if args.ping is not None:
        print(json.dumps(_ping(args.ping, args.count)))
        return 0
    record = measure(rate_scale=args.rate_scale, count=args.count)
    for label in ("clear", "loaded"):
        for what, r in record[label].items():
            print(f"{label:>6} {what:>14}: round trip median {r['median_ms']:.2f} ms "
                  f"(p10 {r['p10_ms']:.2f}, p90 {r['p90_ms']:.2f}; {r['answered']} of {record['count']})")
    print(f"queue through the loaded uplink {1e3 * record['queue_s']:.1f} ms; clear round trip "
          f"{1e3 * record['rtt_s']:.2f} ms")
    if args.json:
        from dssync.bench.provenance import write_module_record

        write_module_record(args.json, record, "dssync.bench.queue_rtt", argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
