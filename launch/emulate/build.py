"""Building and tearing down the emulated cluster: ``up``, ``down`` and the ``cluster``
context manager."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from .contention import sweep_cpu_cgroups
from .shaping import check_support, shape_nic, shape_uplink
from .state import (
    DEFAULT_NAME,
    GSO_MAX_BYTES,
    RTO_MIN_MS,
    SUBNET,
    Cluster,
    EmulationError,
    existing_namespaces,
    load_state,
    netns_ip,
    parse_rate,
    run_command,
    save_state,
    state_path,
)


# -- up / down -------------------------------------------------------------------------------
def up(rack_sizes: Sequence[int], *, nic: str = "1gbit", uplink: str = "1gbit",
       name: str = DEFAULT_NAME) -> Cluster:
    """Build the cluster; on any failure remove what was built and raise."""
    check_support()
    if not rack_sizes or min(rack_sizes) < 1:
        raise ValueError(f"rack sizes must be positive, got {list(rack_sizes)}")
    if sum(rack_sizes) > 250:
        raise ValueError(f"at most 250 emulated workers, asked for {sum(rack_sizes)}")
    if state_path(name).exists() or existing_namespaces(name):
        raise EmulationError(f"emulated cluster {name!r} is already up; `dssync emulate down` first")
    c = Cluster(name=name, rack_sizes=list(rack_sizes), nic_bps=parse_rate(nic),
                uplink_bps=parse_rate(uplink))
    save_state(c)  # first, so that a crash part-way is still cleaned by `down`
    try:
        _build(c)
    except BaseException:
        down(name)
        raise
    return c


#: Per-namespace files ``ip netns exec`` mounts over /etc (iproute2's convention).
NETNS_ETC = Path("/etc/netns")


def _hosts_file(ns: str, addr: str) -> None:
    """The host name resolves to the namespace's own address inside it, as a real host's
    does: the namespaces share one host name, and a library that binds to whatever it
    resolves to (Horovod's gloo for process sets) would otherwise bind to loopback."""
    (NETNS_ETC / ns).mkdir(parents=True, exist_ok=True)
    (NETNS_ETC / ns / "hosts").write_text(f"127.0.0.1 localhost\n{addr} {socket.gethostname()}\n")


def attach_worker(c: Cluster, ns: str, fabric_dev: str, bridge: str, addr: str) -> None:
    run_command("ip", "netns", "add", ns)
    _hosts_file(ns, addr)
    netns_ip(c.fabric, "link", "add", fabric_dev, "type", "veth", "peer", "name", "eth0", "netns", ns)
    netns_ip(c.fabric, "link", "set", fabric_dev, "master", bridge, "up")
    netns_ip(ns, "addr", "add", f"{addr}/16", "dev", "eth0")
    netns_ip(ns, "link", "set", "eth0", "gso_max_size", str(GSO_MAX_BYTES), "up")
    netns_ip(ns, "route", "replace", f"{SUBNET}.0.0/16", "dev", "eth0", "proto", "kernel", "scope", "link",
        "src", addr, "rto_min", f"{RTO_MIN_MS}ms")
    # A connection idle for one retransmission timeout restarts from the initial window
    # (Linux's default), so a group that meets every few iterations would enter a contended
    # link at 10 packets against established streams. Clusters that run collectives turn it
    # off; so do the emulated hosts (per namespace).
    run_command("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.tcp_slow_start_after_idle=0")
    netns_ip(ns, "link", "set", "lo", "up")


def _build(c: Cluster) -> None:
    run_command("ip", "netns", "add", c.fabric)
    netns_ip(c.fabric, "link", "set", "lo", "up")
    netns_ip(c.fabric, "link", "add", "br-spine", "type", "bridge")
    netns_ip(c.fabric, "link", "set", "br-spine", "up")
    rank = 0
    for rack, size in enumerate(c.rack_sizes):
        bridge = f"br{rack}"
        netns_ip(c.fabric, "link", "add", bridge, "type", "bridge")
        netns_ip(c.fabric, "link", "set", bridge, "up")
        netns_ip(c.fabric, "link", "add", f"up{rack}", "type", "veth", "peer", "name", f"s{rack}")
        netns_ip(c.fabric, "link", "set", f"up{rack}", "master", bridge, "up")
        netns_ip(c.fabric, "link", "set", f"s{rack}", "master", "br-spine", "up")
        shape_uplink(c, rack)
        for _ in range(size):
            attach_worker(c, c.worker_ns(rank), f"w{rank}", bridge, c.worker_addr(rank))
            shape_nic(c, rank)
            rank += 1
        attach_worker(c, c.bg_ns(rack), f"b{rack}", bridge, c.bg_addr(rack))
    attach_worker(c, c.sink_ns, "k0", "br-spine", c.SINK_ADDR)


def down(name: str = DEFAULT_NAME) -> list[str]:
    """Stop background flows and delete every namespace of the cluster; return their names."""
    state = state_path(name)
    names = set(existing_namespaces(name))
    if state.exists():
        try:
            c = load_state(name)
            names.update(n for n in c.namespaces() if n in existing_namespaces(name))
        except (EmulationError, ValueError, TypeError, json.JSONDecodeError):
            pass  # a torn state file: the namespace sweep below still finds everything
    for ns in sorted(names):
        pids = run_command("ip", "netns", "pids", ns, check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(
            run_command("ip", "netns", "pids", ns, check=False).stdout.strip() for ns in names):
        time.sleep(0.05)  # killed processes still hold their namespace until reaped
    for ns in sorted(names):
        run_command("ip", "netns", "del", ns, check=False)
        shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
    sweep_cpu_cgroups(name)
    state.unlink(missing_ok=True)
    return sorted(names)


@contextlib.contextmanager
def cluster(rack_sizes: Sequence[int], **kwargs) -> Iterator[Cluster]:
    """``up`` for the duration of a ``with`` block; ``down`` however the block ends."""
    c = up(rack_sizes, **kwargs)
    try:
        yield c
    finally:
        down(c.name)
