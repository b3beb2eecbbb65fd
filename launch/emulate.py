"""An emulated multi-rack cluster on one Linux machine, with real namespaces and ``tc``.

Layout (DESIGN section 6)::

    worker ns  <name>-w<i>   eth0 (10.77.0.<i+1>) --veth-- w<i>  ┐
    background <name>-bg<r>  eth0 (10.77.1.<r+1>) --veth-- b<r>  ├ br<r> (rack bridge)
                                                                 │   │ up<r> --veth-- s<r>
    sink ns    <name>-sink   eth0 (10.77.2.1)     --veth-- k0 ─┐ │   │
                                                  br-spine  <──┴─┴───┘   (all in <name>-fab)

Every device lives inside a namespace this module creates (the bridges and uplinks in
``<name>-fab``), so deleting the namespaces removes every veth, bridge and qdisc, and the
host's own network is never touched. ``tbf`` shapes each worker NIC in both directions
(egress of ``eth0`` in the worker, egress of ``w<i>`` towards it) and each rack uplink in
both directions (``up<r>`` rack to spine, ``s<r>`` spine to rack). Contention is a rate
change or real background ``iperf3`` flows from the rack's background namespace, or from a
worker's own namespace (sharing its NIC), to servers in the sink namespace.

State lives in ``$DSSYNC_STATE_DIR/<name>.json`` (default ``/run/dssync``) so ``down``
finds everything after a crash. A name is 1-12 lowercase letters and digits, starting with a
letter (``check_name``): it goes into paths, namespace and cgroup names, and a name cannot
be a prefix of another cluster's namespaces. ``down`` removes exactly the namespaces of its
own cluster's shape (``<name>-fab``, ``-sink``, ``-w<i>``, ``-bg<r>``) and ``dssync-<name>-w<i>``
cgroups, nothing matched by prefix alone.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dssync.errors import DssyncError

__all__ = [
    "SCENARIOS",
    "Cluster",
    "EmulationError",
    "Episode",
    "check_episodes",
    "check_netem",
    "check_support",
    "cluster",
    "contend",
    "dead_flows",
    "down",
    "format_rate",
    "leftovers",
    "load_state",
    "parse_cpu_limit",
    "parse_episode",
    "parse_flow",
    "parse_rate",
    "run",
    "run_dssync",
    "up",
]

DEFAULT_NAME = "dss"
SUBNET = "10.77"
MASTER_PORT = 29500
IPERF_BASE_PORT = 5201
QUEUE_MS = 5  # tbf queue per shaped link, in ms at its rate
#: Largest GSO segment a host hands its NIC, in bytes. The kernel's default, 64 KiB, lets a
#: ``QUEUE_MS`` tbf queue hold only a dozen segments: with a few flows through it, each drop
#: loses some 45 packets at once, a whole window, and TCP waits out a retransmission timeout
#: (200 ms, doubling). A 1.6 MB send out of a NIC shared with a background flow took 110 ms
#: at the median but 400 ms to 1.8 s one time in four; at 16 KiB every one of 20 took 122 ms,
#: the 1/9 fair share. A switch port's buffer holds packets, not host-side super-segments.
#: The price is CPU: four times the segments through the veths and qdiscs. With 8 ranks on 2
#: cores, ds-sync's static comm time (mnist-wide) rose from 31 to 53 ms, allreduce's from 47
#: to 63 ms.
GSO_MAX_BYTES = 16384
#: TCP streams per background flow: TCP's per-stream fairness leaves k job flows about
#: k/(k + FLOW_STREAMS) of the contended link, so even a whole rack of 4 or 5 workers sending
#: at once keeps only about a third of its uplink: a clear bottleneck, as in the paper's
#: contended scenarios. More streams cost no more CPU (the link's rate caps the bytes). Flows
#: run one way, out of the rack (or out of the worker): traffic of other tasks leaving a rack,
#: which a probe can attribute to that rack's uplink; both ways would also double the CPU
#: that two cores spend on background traffic.
FLOW_STREAMS = 8
#: Minimum TCP retransmission timeout of every emulated host, set on its route (``ip route
#: ... rto_min``). Linux's default, 200 ms, is a wide-area value: at this fabric's
#: sub-millisecond round trips one lost tail segment stalls a collective for 40 times its
#: transfer (the incast problem), which is why clusters that run collectives lower it.
#: With 200 ms, a 100-step allreduce on ``inter-rack`` measured 255-547 ms/iter over five
#: runs, mostly from timeouts (about 30 per 100 iterations); see bench/README.md.
RTO_MIN_MS = 5


class EmulationError(DssyncError):
    """The emulated network could not be built, changed or used."""


# -- rates --------------------------------------------------------------------------------
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(bit|bps|b)?(?:/s)?\s*$", re.IGNORECASE)
_SCALE = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_rate(text: str) -> int:
    """``"1gbit"``, ``"500mbit"``, ``"1G"``, ``"300M"`` -> bits per second."""
    m = _RATE.match(str(text))
    if not m:
        raise ValueError(f"cannot read rate {text!r}; write it like 1gbit, 500mbit or 300M (bits/s)")
    value = float(m.group(1)) * _SCALE[m.group(2).lower()]
    if value < 8e3:
        raise ValueError(f"rate {text!r} is below 8 kbit/s; tc cannot shape that slowly")
    return int(value)


def format_rate(bits_per_s: int) -> str:
    return f"{bits_per_s // 1000}kbit"


# -- the cluster description -----------------------------------------------------------------
@dataclass
class Cluster:
    name: str
    rack_sizes: list[int]
    nic_bps: int
    uplink_bps: int
    nic_override: dict[int, int] = field(default_factory=dict)  # rank -> bits/s
    uplink_override: dict[int, int] = field(default_factory=dict)  # rack -> bits/s
    flows: list[dict] = field(default_factory=list)  # {"kind", "index", "port", "pid"}
    cpu_limit: dict[int, float] = field(default_factory=dict)  # rank -> cores its processes may use

    @property
    def world_size(self) -> int:
        return sum(self.rack_sizes)

    @property
    def fabric(self) -> str:
        return f"{self.name}-fab"

    def worker_ns(self, rank: int) -> str:
        return f"{self.name}-w{rank}"

    def bg_ns(self, rack: int) -> str:
        return f"{self.name}-bg{rack}"

    @property
    def sink_ns(self) -> str:
        return f"{self.name}-sink"

    @staticmethod
    def worker_addr(rank: int) -> str:
        return f"{SUBNET}.0.{rank + 1}"  # up() allows at most 250 workers

    @staticmethod
    def bg_addr(rack: int) -> str:
        return f"{SUBNET}.1.{rack + 1}"

    SINK_ADDR = f"{SUBNET}.2.1"

    def rack_of(self, rank: int) -> int:
        edges = list(itertools.accumulate(self.rack_sizes))
        return next(r for r, edge in enumerate(edges) if rank < edge)

    def namespaces(self) -> list[str]:
        return ([self.fabric, self.sink_ns] + [self.worker_ns(r) for r in range(self.world_size)]
                + [self.bg_ns(r) for r in range(len(self.rack_sizes))])


SCENARIOS: dict[str, dict] = {
    # DESIGN section 6, mirroring the paper's section V-A.5 on one machine.
    "static": {"rack_sizes": [4, 4], "nic": "1gbit", "uplink": "1gbit", "flows": []},
    "inter-rack": {"rack_sizes": [4, 4], "nic": "1gbit", "uplink": "1gbit", "flows": [("rack", 0)]},
    "inter-rack+nic": {"rack_sizes": [5, 3], "nic": "1gbit", "uplink": "1gbit", "flows": [("rank", 4)]},
    # Three racks, the first one's uplink shared with background flows: Fig. 5 beyond two racks.
    "three-rack": {"rack_sizes": [3, 3, 3], "nic": "1gbit", "uplink": "1gbit", "flows": [("rack", 0)]},
}


# -- plumbing --------------------------------------------------------------------------------
def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise EmulationError(f"`{' '.join(argv)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def _ip(ns: str, *args: str) -> None:
    _sh("ip", "-n", ns, *args)


def _tc(ns: str, *args: str) -> None:
    _sh("ip", "netns", "exec", ns, "tc", *args)


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
    result = _sh("ip", "netns", "add", probe, check=False)
    if result.returncode != 0:
        raise EmulationError(f"this kernel or container cannot create network namespaces: "
                             f"{result.stderr.strip()}")
    _sh("ip", "netns", "del", probe, check=False)


NAME_PATTERN = re.compile(r"[a-z][a-z0-9]{0,11}")


def check_name(name: str) -> str:
    """``name`` if it is a safe cluster name, else ``ValueError`` saying what a name may be."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ValueError(f"cluster name {name!r} must be 1-12 lowercase letters and digits, starting with a "
                         "letter (it names network namespaces, cgroups and a state file)")
    return name


def _state_dir() -> Path:
    return Path(os.environ.get("DSSYNC_STATE_DIR", "/run/dssync"))


def _state_path(name: str) -> Path:
    return _state_dir() / f"{check_name(name)}.json"


def _save(cluster: Cluster) -> None:
    path = _state_path(cluster.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(cluster), indent=1))
    os.replace(tmp, path)


def load_state(name: str = DEFAULT_NAME) -> Cluster:
    path = _state_path(name)
    if not path.exists():
        raise EmulationError(f"no emulated cluster {name!r} is up; start one with `dssync emulate up`")
    data = json.loads(path.read_text())
    data["nic_override"] = {int(k): v for k, v in data.get("nic_override", {}).items()}
    data["uplink_override"] = {int(k): v for k, v in data.get("uplink_override", {}).items()}
    data["cpu_limit"] = {int(k): v for k, v in data.get("cpu_limit", {}).items()}
    return Cluster(**data)


def _existing(name: str) -> list[str]:
    """The namespaces present that have the shape of cluster ``name``'s own."""
    shape = re.compile(re.escape(check_name(name)) + r"-(fab|sink|w\d+|bg\d+)")
    out = _sh("ip", "netns", "list", check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if shape.fullmatch(n)]


# -- shaping ---------------------------------------------------------------------------------
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


def _shape_nic(c: Cluster, rank: int, bits_per_s: int | None = None) -> None:
    """Shape worker ``rank``'s NIC at ``bits_per_s`` (default: its rate in ``c``)."""
    rate = c.nic_override.get(rank, c.nic_bps) if bits_per_s is None else bits_per_s
    _shape(c.worker_ns(rank), "eth0", rate)  # worker -> rack
    _shape(c.fabric, f"w{rank}", rate)  # rack -> worker


def _nic_devices(c: Cluster, rank: int) -> list[tuple[str, str]]:
    """(namespace, device) of both directions of worker ``rank``'s NIC."""
    return [(c.worker_ns(rank), "eth0"), (c.fabric, f"w{rank}")]


def _delay_nic(c: Cluster, rank: int, bits_per_s: int, delay: str | None) -> None:
    """Put ``netem`` under both directions' ``tbf`` of worker ``rank``'s NIC (``None``: the
    plain byte FIFO that ``tbf`` holds by default, of the size it picks itself)."""
    for ns, dev in _nic_devices(c, rank):
        if delay is None:
            limit = bits_per_s // 8 * QUEUE_MS // 1000 + _burst(bits_per_s)
            _tc(ns, "qdisc", "replace", "dev", dev, "parent", "1:1", "handle", "10:", "bfifo", "limit", str(limit))
        else:
            # room for the packets in flight over the delay at the NIC's rate, twice over
            packets = max(1000, 2 * int(bits_per_s / 8 / 1514 * _seconds(delay)))
            _tc(ns, "qdisc", "replace", "dev", dev, "parent", "1:1", "handle", "10:", "netem",
                "delay", delay, "limit", str(packets))


def _shape_uplink(c: Cluster, rack: int) -> None:
    rate = c.uplink_override.get(rack, c.uplink_bps)
    _shape(c.fabric, f"up{rack}", rate)  # rack -> spine
    _shape(c.fabric, f"s{rack}", rate)  # spine -> rack


# -- up / down -------------------------------------------------------------------------------
def up(rack_sizes: Sequence[int], *, nic: str = "1gbit", uplink: str = "1gbit",
       name: str = DEFAULT_NAME) -> Cluster:
    """Build the cluster; on any failure remove what was built and raise."""
    check_support()
    if not rack_sizes or min(rack_sizes) < 1:
        raise ValueError(f"rack sizes must be positive, got {list(rack_sizes)}")
    if sum(rack_sizes) > 250:
        raise ValueError(f"at most 250 emulated workers, asked for {sum(rack_sizes)}")
    if _state_path(name).exists() or _existing(name):
        raise EmulationError(f"emulated cluster {name!r} is already up; `dssync emulate down` first")
    c = Cluster(name=name, rack_sizes=list(rack_sizes), nic_bps=parse_rate(nic),
                uplink_bps=parse_rate(uplink))
    _save(c)  # first, so that a crash part-way is still cleaned by `down`
    try:
        _build(c)
    except BaseException:
        down(name)
        raise
    return c


def _attach(c: Cluster, ns: str, fabric_dev: str, bridge: str, addr: str) -> None:
    _sh("ip", "netns", "add", ns)
    _ip(c.fabric, "link", "add", fabric_dev, "type", "veth", "peer", "name", "eth0", "netns", ns)
    _ip(c.fabric, "link", "set", fabric_dev, "master", bridge, "up")
    _ip(ns, "addr", "add", f"{addr}/16", "dev", "eth0")
    _ip(ns, "link", "set", "eth0", "gso_max_size", str(GSO_MAX_BYTES), "up")
    _ip(ns, "route", "replace", f"{SUBNET}.0.0/16", "dev", "eth0", "proto", "kernel", "scope", "link",
        "src", addr, "rto_min", f"{RTO_MIN_MS}ms")
    # A connection idle for one retransmission timeout restarts from the initial window
    # (Linux's default), so a group that meets every few iterations would enter a contended
    # link at 10 packets against established streams. Clusters that run collectives turn it
    # off; so do the emulated hosts (per namespace).
    _sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.tcp_slow_start_after_idle=0")
    _ip(ns, "link", "set", "lo", "up")


def _build(c: Cluster) -> None:
    _sh("ip", "netns", "add", c.fabric)
    _ip(c.fabric, "link", "set", "lo", "up")
    _ip(c.fabric, "link", "add", "br-spine", "type", "bridge")
    _ip(c.fabric, "link", "set", "br-spine", "up")
    rank = 0
    for rack, size in enumerate(c.rack_sizes):
        bridge = f"br{rack}"
        _ip(c.fabric, "link", "add", bridge, "type", "bridge")
        _ip(c.fabric, "link", "set", bridge, "up")
        _ip(c.fabric, "link", "add", f"up{rack}", "type", "veth", "peer", "name", f"s{rack}")
        _ip(c.fabric, "link", "set", f"up{rack}", "master", bridge, "up")
        _ip(c.fabric, "link", "set", f"s{rack}", "master", "br-spine", "up")
        _shape_uplink(c, rack)
        for _ in range(size):
            _attach(c, c.worker_ns(rank), f"w{rank}", bridge, c.worker_addr(rank))
            _shape_nic(c, rank)
            rank += 1
        _attach(c, c.bg_ns(rack), f"b{rack}", bridge, c.bg_addr(rack))
    _attach(c, c.sink_ns, "k0", "br-spine", c.SINK_ADDR)


def down(name: str = DEFAULT_NAME) -> list[str]:
    """Stop background flows and delete every namespace of the cluster; return their names."""
    state = _state_path(name)
    names = set(_existing(name))
    if state.exists():
        try:
            c = load_state(name)
            names.update(n for n in c.namespaces() if n in _existing(name))
        except (EmulationError, ValueError, TypeError, json.JSONDecodeError):
            pass  # a torn state file: the namespace sweep below still finds everything
    for ns in sorted(names):
        pids = _sh("ip", "netns", "pids", ns, check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(
            _sh("ip", "netns", "pids", ns, check=False).stdout.strip() for ns in names):
        time.sleep(0.05)  # killed processes still hold their namespace until reaped
    for ns in sorted(names):
        _sh("ip", "netns", "del", ns, check=False)
    _sweep_cpu_cgroups(name)
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


def leftovers(name: str = DEFAULT_NAME) -> list[str]:
    """Namespaces of cluster ``name`` still present (empty after ``down``)."""
    return _existing(name)


# -- CPU limits (compute stragglers) ---------------------------------------------------------
CGROUP_ROOT = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000


def _cpu_cgroup(name: str, rank: int) -> Path:
    """The cgroup that holds worker ``rank``'s processes: under the unified hierarchy
    (cgroup v2, ``cpu.max``) or the v1 ``cpu`` controller (``cpu.cfs_quota_us``)."""
    base = CGROUP_ROOT if (CGROUP_ROOT / "cgroup.controllers").exists() else CGROUP_ROOT / "cpu"
    return base / f"dssync-{name}-w{rank}"


def _limit_cpu(c: Cluster, rank: int, cores: float | None) -> None:
    """Cap worker ``rank``'s processes at ``cores`` cores (``None``: remove the cap)."""
    group = _cpu_cgroup(c.name, rank)
    if cores is None:
        with contextlib.suppress(OSError):
            group.rmdir()
        return
    if not cores > 0:
        raise ValueError(f"a CPU limit is a positive number of cores, got {cores}")
    _set_cpu_quota(c, rank, cores)


def _set_cpu_quota(c: Cluster, rank: int, cores: float | None) -> None:
    """Make worker ``rank``'s cgroup if it is missing and cap it at ``cores`` cores (``None``:
    the cgroup stays, uncapped, so that processes in it keep their place)."""
    group = _cpu_cgroup(c.name, rank)
    try:
        group.mkdir(exist_ok=True)
        quota = None if cores is None else max(1000, round(cores * CPU_PERIOD_US))
        if (group / "cpu.max").exists():
            (group / "cpu.max").write_text(f"{quota or 'max'} {CPU_PERIOD_US}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota or -1))
    except OSError as exc:
        raise EmulationError(f"cannot limit worker {rank}'s CPU through {group}: {exc.strerror or exc} "
                             "(needs root and a cgroup cpu controller)") from None


def _sweep_cpu_cgroups(name: str) -> None:
    """Remove the cluster's CPU cgroups (their processes are gone by now)."""
    shape = re.compile(re.escape(check_name(name)) + r"-w\d+")
    for group in _cpu_cgroup(name, 0).parent.glob(f"dssync-{name}-w*"):
        if shape.fullmatch(group.name.removeprefix("dssync-")):
            with contextlib.suppress(OSError):
                group.rmdir()


# -- contention ------------------------------------------------------------------------------
def contend(*, name: str = DEFAULT_NAME, rack: int | None = None, uplink: str | None = None,
            rank: int | None = None, nic: str | None = None,
            flows: Sequence[tuple[str, int]] = (), streams: int = FLOW_STREAMS,
            cpu: dict[int, float] | None = None, clear: bool = False) -> Cluster:
    """Lower an uplink or NIC rate, start background flows of ``streams`` TCP streams each,
    cap workers' CPU (``cpu``: rank -> cores, a compute straggler; it applies to what
    ``run`` starts from then on), or ``clear`` all of it."""
    if streams < 1:
        raise ValueError(f"a background flow needs at least one stream, got {streams}")
    c = load_state(name)
    if clear:
        for flow in c.flows:
            _kill_flow(flow)
        for i in c.cpu_limit:
            _limit_cpu(c, i, None)
        c.flows, c.nic_override, c.uplink_override, c.cpu_limit = [], {}, {}, {}
        for r in range(len(c.rack_sizes)):
            _shape_uplink(c, r)
        for i in range(c.world_size):
            _shape_nic(c, i)
    if uplink is not None:
        if rack is None or not 0 <= rack < len(c.rack_sizes):
            raise ValueError(f"--uplink needs --rack in 0..{len(c.rack_sizes) - 1}, got {rack}")
        c.uplink_override[rack] = parse_rate(uplink)
        _shape_uplink(c, rack)
    if nic is not None:
        if rank is None or not 0 <= rank < c.world_size:
            raise ValueError(f"--nic needs --rank in 0..{c.world_size - 1}, got {rank}")
        c.nic_override[rank] = parse_rate(nic)
        _shape_nic(c, rank)
    for i, cores in (cpu or {}).items():
        if not 0 <= i < c.world_size:
            raise ValueError(f"CPU limit for rank {i}: ranks are 0..{c.world_size - 1}")
        _limit_cpu(c, i, cores)
        c.cpu_limit[i] = cores
        _save(c)  # at once, so that `down` finds the cgroup even if a later step fails
    for kind, index in flows:
        c.flows.append(_start_flow(c, kind, index, streams))
    _save(c)
    return c


def parse_cpu_limit(text: str) -> tuple[int, float]:
    """``4:0.25``: worker 4's processes may use a quarter of one core."""
    m = re.fullmatch(r"(\d+):(\d*\.?\d+)", text.strip())
    if not m or not float(m.group(2)) > 0:
        raise ValueError(f"cannot read CPU limit {text!r}; write RANK:CORES with CORES > 0, e.g. 4:0.25")
    return int(m.group(1)), float(m.group(2))


def parse_flow(text: str) -> tuple[str, int]:
    """``rack:0`` (across rack 0's uplink), ``rank:4`` (through worker 4's NIC and its rack's
    uplink) or ``nic:4`` (through worker 4's NIC only, to a host in its own rack)."""
    m = re.fullmatch(r"(rack|rank|nic):(\d+)", text.strip())
    if not m:
        raise ValueError(f"cannot read flow {text!r}; write rack:I (across rack I's uplink), "
                         "rank:I (through worker I's NIC and its rack's uplink) or nic:I (through "
                         "worker I's NIC only)")
    return m.group(1), int(m.group(2))


def _start_flow(c: Cluster, kind: str, index: int, streams: int) -> dict:
    if shutil.which("iperf3") is None:
        raise EmulationError("background flows need iperf3; install it (apt-get install iperf3)")
    if kind == "rack" and not 0 <= index < len(c.rack_sizes):
        raise ValueError(f"flow rack:{index}: racks are 0..{len(c.rack_sizes) - 1}")
    if kind in ("rank", "nic") and not 0 <= index < c.world_size:
        raise ValueError(f"flow {kind}:{index}: ranks are 0..{c.world_size - 1}")
    port = IPERF_BASE_PORT + len(c.flows)
    # rack and rank flows leave the rack for the sink on the spine; a nic flow stays in the
    # worker's rack, ending at that rack's background host.
    sink_ns, sink_addr = ((c.bg_ns(c.rack_of(index)), c.bg_addr(c.rack_of(index))) if kind == "nic"
                          else (c.sink_ns, c.SINK_ADDR))
    server = subprocess.Popen(["ip", "netns", "exec", sink_ns, "iperf3", "-s", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    source_ns = c.bg_ns(index) if kind == "rack" else c.worker_ns(index)
    deadline = time.monotonic() + 10
    while True:  # the server needs a moment to listen
        client = subprocess.Popen(
            ["ip", "netns", "exec", source_ns, "iperf3", "-c", sink_addr, "-p", str(port),
             "-t", "86400", "-P", str(streams), "-i", "0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        time.sleep(0.5)
        if client.poll() is None:
            break
        if time.monotonic() > deadline:
            server.kill()
            raise EmulationError(f"background flow {kind}:{index} did not start: "
                                 f"{client.stderr.read().decode().strip()}")
    return {"kind": kind, "index": index, "streams": streams, "port": port,
            "pids": [server.pid, client.pid]}


def dead_flows(name: str = DEFAULT_NAME) -> list[str]:
    """The background flows of cluster ``name`` whose iperf3 client or server is no longer
    running (``kind:index``): a benchmark checks this between jobs, so that a job measured
    after a flow ended is not reported as contended."""
    return [f"{f['kind']}:{f['index']}" for f in load_state(name).flows if not all(_running(p) for p in f["pids"])]


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _kill_flow(flow: dict) -> None:
    for pid in flow.get("pids", []):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


# -- straggler episodes ----------------------------------------------------------------------
_DELAY = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$")
_DELAY_SCALE = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
#: An episode starts and lasts less than this many seconds (a year): a timer past the float
#: range, or past what a thread's wait takes, would end the thread that runs the episodes.
MAX_EPISODE_S = 365 * 86400.0
_EPISODE = re.compile(r"(\d+):(cpu|nic|delay)=([^@\s]+)@(\d*\.?\d+)s?\+(\d*\.?\d+)s?")
_EPISODE_EXAMPLE = "e.g. 1:cpu=0.1@5+20, 3:nic=100mbit@0+30 or 2:delay=30ms@10+60"


def _seconds(delay: str) -> float:
    m = _DELAY.match(delay)
    if not m:
        raise ValueError(f"cannot read delay {delay!r}; write it like 30ms, 500us or 0.1s")
    return float(m.group(1)) * _DELAY_SCALE[m.group(2)]


@dataclass(frozen=True)
class Episode:
    """A transient straggler: worker ``rank`` capped at ``cpu`` cores, or its NIC shaped at
    ``nic`` (both directions), or ``delay`` added to its NIC (each direction, ``netem``), from
    ``start_s`` to ``start_s + duration_s`` seconds after ``run`` launches the job. Exactly one
    of ``cpu``, ``nic`` and ``delay`` is set. ``str()`` gives the ``parse_episode`` form."""

    rank: int
    start_s: float
    duration_s: float
    cpu: float | None = None
    nic: str | None = None
    delay: str | None = None

    def __post_init__(self) -> None:
        kinds = [k for k in ("cpu", "nic", "delay") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(f"an episode changes exactly one of cpu, nic and delay, got {kinds or 'none'}; "
                             f"{_EPISODE_EXAMPLE}")
        if self.rank < 0:
            raise ValueError(f"an episode's rank is 0 or more, got {self.rank}")
        if not (0 <= self.start_s < MAX_EPISODE_S and 0 < self.duration_s < MAX_EPISODE_S):
            raise ValueError(f"an episode starts at 0 s or later and lasts more than 0 s, got start "
                             f"{self.start_s} s, duration {self.duration_s} s")
        if self.cpu is not None and not 0 < self.cpu < float("inf"):
            raise ValueError(f"a CPU episode caps at a positive number of cores, got {self.cpu}")
        if self.nic is not None:
            parse_rate(self.nic)
        if self.delay is not None:
            _seconds(self.delay)

    @property
    def kind(self) -> str:
        return "cpu" if self.cpu is not None else "nic" if self.nic is not None else "delay"

    @property
    def value(self) -> float | str:
        return getattr(self, self.kind)

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s

    def __str__(self) -> str:
        return f"{self.rank}:{self.kind}={self.value}@{self.start_s!r}+{self.duration_s!r}"


def parse_episode(text: str) -> Episode:
    """``RANK:KIND=VALUE@START+DURATION``, KIND one of ``cpu`` (cores), ``nic`` (a rate) and
    ``delay`` (``30ms``), START and DURATION in seconds: ``1:cpu=0.1@5+20`` caps worker 1 at
    a tenth of a core from 5 s to 25 s after the job starts."""
    m = _EPISODE.fullmatch(str(text).strip())
    if not m:
        raise ValueError(f"cannot read episode {text!r}; write RANK:KIND=VALUE@START+DURATION with KIND "
                         f"cpu (cores), nic (a rate) or delay (ms), times in seconds: {_EPISODE_EXAMPLE}")
    rank, kind, value, start, duration = m.groups()
    if kind == "cpu":
        try:
            cores = float(value)
        except ValueError:
            raise ValueError(f"cannot read episode {text!r}: cpu={value} is not a number of cores; "
                             f"{_EPISODE_EXAMPLE}") from None
        return Episode(int(rank), float(start), float(duration), cpu=cores)
    try:
        return Episode(int(rank), float(start), float(duration), **{kind: value})
    except ValueError as exc:
        raise ValueError(f"cannot read episode {text!r}: {exc}") from None


def check_netem() -> None:
    """Raise ``EmulationError`` unless this kernel has the ``netem`` qdisc (``delay`` episodes)."""
    probe = f"dss-netem-{os.getpid()}"
    made = _sh("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        raise EmulationError(f"cannot make a namespace to look for sch_netem: {made.stderr.strip()}")
    try:
        result = _sh("ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", "netem",
                     "delay", "1ms", check=False)
    finally:
        _sh("ip", "netns", "del", probe, check=False)
    if result.returncode != 0:
        raise EmulationError(
            "delay episodes need the netem qdisc, the kernel module sch_netem, which this kernel lacks "
            f"(tc: {result.stderr.strip() or result.stdout.strip()}); load it with `modprobe sch_netem` "
            "(on Ubuntu it ships in linux-modules-extra-$(uname -r)) or leave out the delay episodes")


def check_episodes(c: Cluster, episodes: Sequence[Episode]) -> None:
    """Raise before anything runs if an episode names no worker of ``c`` or needs netem here."""
    for e in episodes:
        if not 0 <= e.rank < c.world_size:
            raise ValueError(f"episode {e}: cluster {c.name!r} has workers 0..{c.world_size - 1}")
    if any(e.delay is not None for e in episodes):
        check_netem()


class _Episodes:
    """Applies episodes at their times after ``start`` from a daemon thread; ``stop`` undoes
    what is still on. Each change sets a worker's CPU or NIC to what the episodes still on ask
    for (the latest begun wins), or else to what the cluster's state says (``contend``)."""

    def __init__(self, c: Cluster, episodes: Sequence[Episode], write: Callable[[str], None]) -> None:
        self.c, self.write = c, write
        # (time, begins, index, episode), an end before a start at the same time
        self.events = sorted([(e.start_s, 1, i, e) for i, e in enumerate(episodes)]
                             + [(e.end_s, 0, i, e) for i, e in enumerate(episodes)], key=lambda ev: ev[:3])
        self.cpu_ranks = sorted({e.rank for e in episodes if e.kind == "cpu"})
        self.on: list[Episode] = []
        self.delayed: set[int] = set()  # ranks with netem under their NIC's tbf
        self.t0 = 0.0
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="dssync-episodes")

    def prepare(self) -> None:
        """Make the cgroup of every worker with a CPU episode, capped at the worker's static
        limit or not at all, so that its processes start inside it."""
        for rank in self.cpu_ranks:
            _set_cpu_quota(self.c, rank, self.c.cpu_limit.get(rank))

    def start(self) -> None:
        """Apply what begins at 0 s now, the rest from the thread."""
        self.t0 = time.monotonic()
        self.advance(0.0)
        if self.events:
            self.thread.start()

    def _loop(self) -> None:
        while self.events and not self.halt.is_set():
            self.halt.wait(max(0.0, self.events[0][0] - (time.monotonic() - self.t0)))
            if not self.halt.is_set():
                self.advance(time.monotonic() - self.t0)

    def advance(self, now: float) -> None:
        while self.events and self.events[0][0] <= now and not self.halt.is_set():
            _, begins, _, e = self.events.pop(0)
            if begins:
                self.on.append(e)
            elif e in self.on:
                self.on.remove(e)
            self._set(e, now, bool(begins))

    def stop(self) -> None:
        """Stop the thread, then undo every episode still on."""
        self.halt.set()
        if self.thread.is_alive():
            self.thread.join()
        self.events = []
        undo = {(e.rank, e.kind): e for e in self.on}
        self.on = []
        for e in undo.values():
            self._set(e, time.monotonic() - self.t0, False)

    def _set(self, e: Episode, now: float, begins: bool) -> None:
        """Set worker ``e.rank``'s ``e.kind`` to what the episodes on now ask for; say so."""
        rank, kind = e.rank, e.kind
        mine = [x for x in self.on if (x.rank, x.kind) == (rank, kind)]
        try:
            static = load_state(self.c.name)  # `contend` may have changed it since the job began
        except (EmulationError, ValueError, TypeError, json.JSONDecodeError):
            static = self.c
        try:
            if kind == "cpu":
                cores = mine[-1].cpu if mine else static.cpu_limit.get(rank)
                _set_cpu_quota(self.c, rank, cores)
                restored = "" if cores is None else f" to {cores} cores"
            else:
                nic = [x.nic for x in self.on if (x.rank, x.kind) == (rank, "nic")]
                delay = [x.delay for x in self.on if (x.rank, x.kind) == (rank, "delay")]
                rate = parse_rate(nic[-1]) if nic else static.nic_override.get(rank, static.nic_bps)
                _shape_nic(self.c, rank, rate)
                if delay or rank in self.delayed:
                    _delay_nic(self.c, rank, rate, delay[-1] if delay else None)
                    (self.delayed.add if delay else self.delayed.discard)(rank)
                restored = f" to {rate / 1e6:g} Mbit/s" if kind == "nic" else ""
        except (EmulationError, OSError, ValueError) as exc:
            self.write(f"[episode] worker {rank}: cannot {'apply' if begins else 'undo'} {e}: {exc}\n")
            return
        what = (f"{mine[-1].value}" + (" cores" if kind == "cpu" else "")) if mine else "restored" + restored
        when = f"at {now:.1f} s" + (f", for {e.duration_s:g} s" if begins else "")
        self.write(f"[episode] worker {rank}: {kind} {what} ({when})\n")


# -- run -------------------------------------------------------------------------------------
def run_dssync(name: str, args: Sequence[str], out: Path, *, timeout_s: float,
               episodes: Sequence[Episode] = ()) -> Any:
    """``dssync emulate run --name NAME [--episode SPEC ...] -- dssync ARGS...`` as a
    subprocess; the JSON that rank 0 wrote to ``out``. A failing job raises with the tail of
    its output."""
    dssync = str(Path(sys.executable).with_name("dssync"))
    episode_args = [a for e in episodes for a in ("--episode", str(e))]
    proc = subprocess.run([dssync, "emulate", "run", "--name", name, "--timeout", str(timeout_s), *episode_args, "--",
                           dssync, *args], capture_output=True, text=True, timeout=timeout_s + 60)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
        raise EmulationError(f"dssync {' '.join(args)} failed (exit {proc.returncode}):\n{tail}")
    return json.loads(Path(out).read_text())


#: Seconds the other workers of a job get to end after one has failed, before they are killed.
FAILED_GRACE_S = 10.0


def run(command: Sequence[str], *, name: str = DEFAULT_NAME, timeout_s: float | None = None,
        out=None, episodes: Sequence[Episode] = ()) -> int:
    """Run ``command`` once per worker in its namespace; stream ``[w<i>]``-prefixed output.

    Once a copy has failed (a non-zero exit), the others have ``FAILED_GRACE_S`` to end, then
    are killed, whatever they are doing (stopped, hung), and the first failure's code is the
    result. Each copy dies with this process.

    Each copy gets RANK, WORLD_SIZE, LOCAL_RANK (0: one worker per emulated host),
    MASTER_ADDR (worker 0), MASTER_PORT, GLOO_SOCKET_IFNAME=eth0 and DSSYNC_HOST. Returns
    the worst exit code (a signal counts as 128 + its number); past ``timeout_s`` every copy
    is killed and the result is 124.

    ``episodes`` (transient stragglers) take effect at their times after launch, each change
    written to ``out`` as an ``[episode]`` line; however the job ends, what is still on is
    undone before ``run`` returns. A worker with a CPU episode runs in its CPU cgroup from
    the start (uncapped until the episode, unless ``contend`` capped it).
    """
    if not command:
        raise ValueError("nothing to run: give the command after `--`")
    c = load_state(name)
    check_episodes(c, episodes)
    out = out or sys.stdout
    lock = threading.Lock()

    def write(text: str) -> None:
        with lock:
            out.write(text)
            out.flush()

    stragglers = _Episodes(c, episodes, write)
    stragglers.prepare()
    in_cgroup = set(c.cpu_limit) | set(stragglers.cpu_ranks)
    procs: list[subprocess.Popen] = []
    threads: list[threading.Thread] = []

    def pump(rank: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            write(f"[w{rank}] {line}")

    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    timed_out = False
    try:
        stragglers.start()
        for rank in range(c.world_size):
            env = {"RANK": str(rank), "WORLD_SIZE": str(c.world_size), "LOCAL_RANK": "0",
                   "MASTER_ADDR": c.worker_addr(0), "MASTER_PORT": str(MASTER_PORT),
                   "GLOO_SOCKET_IFNAME": "eth0", "DSSYNC_HOST": f"w{rank}"}
            # The namespaces have no resolver; c10d would warn about it on every connection.
            env.setdefault("TORCH_CPP_LOG_LEVEL", os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR"))
            argv = ["ip", "netns", "exec", c.worker_ns(rank), "env",
                    *(f"{k}={v}" for k, v in env.items()), *command]
            if rank in in_cgroup:  # joins the worker's cgroup, then becomes the command (which
                # inherits it); outside the namespace, whose own /sys has no cgroup mount
                argv = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(_cpu_cgroup(c.name, rank)),
                        *argv]
            # The worker dies with this process, even killed by SIGKILL (util-linux's setpriv
            # sets PR_SET_PDEATHSIG, which every exec after it keeps).
            argv = ["setpriv", "--pdeathsig", "KILL", *argv]
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True, bufsize=1, start_new_session=True))
            threads.append(threading.Thread(target=pump, args=(rank, procs[-1]), daemon=True))
            threads[-1].start()
        failed_at, gave_up = None, False
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            if deadline is not None and now > deadline:
                timed_out = True
                break
            if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
                failed_at = now  # the job has failed: the others get FAILED_GRACE_S to say why
                first = next(p.returncode for p in procs if p.returncode not in (None, 0))
            if failed_at is not None and now > failed_at + FAILED_GRACE_S:
                gave_up = True  # a worker that hangs or is stopped does not keep the job alive
                break
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        stragglers.stop()
        for t in threads:
            t.join(timeout=5)
    if timed_out:
        return 124
    if gave_up:  # the first failure is the job's, not the kills that followed it
        return first if first >= 0 else 128 - first
    codes = [p.returncode if p.returncode >= 0 else 128 - p.returncode for p in procs]
    return max(codes)
