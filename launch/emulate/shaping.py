"""Link shaping of the emulated cluster: ``tbf`` on every NIC and uplink, ``netem`` delays,
and the checks that this host can build namespaces and has ``netem``."""

from __future__ import annotations

import os
import shutil
import sys

from .state import QUEUE_MS, Cluster, EmulationError, delay_seconds, format_rate, run_command


# -- shaping ---------------------------------------------------------------------------------
def _tc(ns: str, *args: str) -> None:
    run_command("ip", "netns", "exec", ns, "tc", *args)


def _shape(ns: str, dev: str, bits_per_s: int) -> None:
    """``tbf`` on ``dev``'s egress; burst covers a 64 KiB GSO segment and about 2 ms.

    The queue holds at most ``QUEUE_MS`` of traffic, a shallow switch buffer: a deep one
    (tens of ms) would delay the ACKs that cross a contended link the other way, and slow
    the clear direction as much as the contended one. Its handle is ``1:``, so that a delay
    episode's ``netem`` can take the place of its FIFO (``parent 1:1``).
    """
    _tc(ns, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "tbf", "rate", format_rate(bits_per_s),
        "burst", str(_burst(bits_per_s)), "latency", f"{QUEUE_MS}ms")


def _burst(bits_per_s: int) -> int:
    return max(65536 + 1514, bits_per_s // 8 // 500)


def shape_nic(c: Cluster, rank: int, bits_per_s: int | None = None) -> None:
    """Shape worker ``rank``'s NIC at ``bits_per_s`` (default: its rate in ``c``)."""
    rate = c.nic_override.get(rank, c.nic_bps) if bits_per_s is None else bits_per_s
    _shape(c.worker_ns(rank), "eth0", rate)  # worker -> rack
    _shape(c.fabric, f"w{rank}", rate)  # rack -> worker


def _nic_devices(c: Cluster, rank: int) -> list[tuple[str, str]]:
    """(namespace, device) of both directions of worker ``rank``'s NIC."""
    return [(c.worker_ns(rank), "eth0"), (c.fabric, f"w{rank}")]


def delay_nic(c: Cluster, rank: int, bits_per_s: int, delay: str | None) -> None:
    """Put ``netem`` under both directions' ``tbf`` of worker ``rank``'s NIC (``None``: the
    plain byte FIFO that ``tbf`` holds by default, of the size it picks itself)."""
    for ns, dev in _nic_devices(c, rank):
        if delay is None:
            limit = bits_per_s // 8 * QUEUE_MS // 1000 + _burst(bits_per_s)
            _tc(ns, "qdisc", "replace", "dev", dev, "parent", "1:1", "handle", "10:", "bfifo", "limit", str(limit))
        else:
            # room for the packets in flight over the delay at the NIC's rate, twice over
            packets = max(1000, 2 * int(bits_per_s / 8 / 1514 * delay_seconds(delay)))
            _tc(ns, "qdisc", "replace", "dev", dev, "parent", "1:1", "handle", "10:", "netem",
                "delay", delay, "limit", str(packets))


def shape_uplink(c: Cluster, rack: int) -> None:
    rate = c.uplink_override.get(rack, c.uplink_bps)
    _shape(c.fabric, f"up{rack}", rate)  # rack -> spine
    _shape(c.fabric, f"s{rack}", rate)  # spine -> rack


# -- what this host supports -----------------------------------------------------------------
def check_support() -> None:
    """Raise ``EmulationError`` with what to do when namespaces cannot be made here."""
    if sys.platform != "linux":
        raise EmulationError("the emulated cluster needs Linux network namespaces")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise EmulationError(f"`{tool}` is missing; install iproute2 (apt-get install iproute2)")
    if os.geteuid() != 0:
        raise EmulationError(
            "the emulated cluster creates network namespaces and needs root (CAP_NET_ADMIN); "
            "run it as root or with sudo"
        )
    probe = f"dss-check-{os.getpid()}"
    result = run_command("ip", "netns", "add", probe, check=False)
    if result.returncode != 0:
        raise EmulationError(f"this kernel or container cannot create network namespaces: "
                             f"{result.stderr.strip()}")
    run_command("ip", "netns", "del", probe, check=False)


def check_netem() -> None:
    """Raise ``EmulationError`` unless this kernel has the ``netem`` qdisc (``delay`` episodes)."""
    probe = f"dss-netem-{os.getpid()}"
    made = run_command("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        raise EmulationError(f"cannot make a namespace to look for sch_netem: {made.stderr.strip()}")
    try:
        result = run_command("ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", "netem",
                     "delay", "1ms", check=False)
    finally:
        run_command("ip", "netns", "del", probe, check=False)
    if result.returncode != 0:
        raise EmulationError(
            "delay episodes need the netem qdisc, the kernel module sch_netem, which this kernel lacks "
            f"(tc: {result.stderr.strip() or result.stdout.strip()}); load it with `modprobe sch_netem` "
            "(on Ubuntu it ships in linux-modules-extra-$(uname -r)) or leave out the delay episodes")
