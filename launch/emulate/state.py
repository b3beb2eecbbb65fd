"""The emulated cluster's network model and its state: names, addresses, rates, the state file.

Layout::

    worker ns  <name>-w<i>   eth0 (10.77.0.<i+1>) --veth-- w<i>  ┐
    background <name>-bg<r>  eth0 (10.77.1.<r+1>) --veth-- b<r>  ├ br<r> (rack bridge)
                                                                 │   │ up<r> --veth-- s<r>
    sink ns    <name>-sink   eth0 (10.77.2.1)     --veth-- k0 ─┐ │   │
                                                  br-spine  <──┴─┴───┘   (all in <name>-fab)

Every device lives inside a namespace this package creates (the bridges and uplinks in
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

import bisect
import itertools
import json
import os
import re
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dssync.errors import DssyncError

DEFAULT_NAME = "dss"
SUBNET = "10.77"
MASTER_PORT = 29500
IPERF_BASE_PORT = 5201
QUEUE_MS = 5  # tbf queue per shaped link, in ms at its rate
#: Largest GSO segment a host hands its NIC, in bytes. The kernel's default, 64 KiB, lets a
#: ``QUEUE_MS`` tbf queue hold only a dozen segments: with a few flows through it, each drop
#: loses a whole window at once and TCP waits out a retransmission timeout (200 ms,
#: doubling), so a send out of a NIC shared with a background flow now and then takes many
#: times its fair share. A switch port's buffer holds packets, not host-side super-segments.
#: The price is CPU: four times the segments through the veths and qdiscs, which on two
#: cores shows in every job's communication time on the emulated cluster.
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


# -- delays ----------------------------------------------------------------------------------
_DELAY = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$")
_DELAY_SCALE = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def delay_seconds(delay: str) -> float:
    m = _DELAY.match(delay)
    if not m:
        raise ValueError(f"cannot read delay {delay!r}; write it like 30ms, 500us or 0.1s")
    return float(m.group(1)) * _DELAY_SCALE[m.group(2)]


# -- the cluster description -----------------------------------------------------------------
@dataclass
class Cluster:
    name: str
    rack_sizes: list[int]
    nic_bps: int
    uplink_bps: int
    nic_override: dict[int, int] = field(default_factory=dict)  # rank -> bits/s
    uplink_override: dict[int, int] = field(default_factory=dict)  # rack -> bits/s
    flows: list[dict] = field(default_factory=list)  # {"kind", "index", "streams", "port", "pids"}; kind cpu: a busy loop
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
    # Mirroring the paper's section V-A.5 on one machine.
    "static": {"rack_sizes": [4, 4], "nic": "1gbit", "uplink": "1gbit", "flows": []},
    "inter-rack": {"rack_sizes": [4, 4], "nic": "1gbit", "uplink": "1gbit", "flows": [("rack", 0)]},
    "inter-rack+nic": {"rack_sizes": [5, 3], "nic": "1gbit", "uplink": "1gbit", "flows": [("rank", 4)]},
    # Three racks, the first one's uplink shared with background flows: Fig. 5 beyond two racks.
    "three-rack": {"rack_sizes": [3, 3, 3], "nic": "1gbit", "uplink": "1gbit", "flows": [("rack", 0)]},
    # Four racks of unequal size, rack 2's uplink shared with another job's flows and worker
    # 9's NIC (in rack 3) with another job's flow inside its rack: both kinds of bottleneck at once.
    "four-rack": {"rack_sizes": [3, 2, 3, 4], "nic": "1gbit", "uplink": "1gbit",
                  "flows": [("rack", 2), ("nic", 9)]},
    # inter-rack+nic's two bottlenecks, each of a kind whose share holds still, for validating
    # the simulator: rack 0's uplink shared with another job's flows from a host of its own
    # (not a worker), and worker 4's NIC rate-limited to a quarter (``nics``: rank -> rate, at
    # the scenario's scale) instead of another job's flows starting on worker 4's own host.
    "inter-rack+slow-nic": {"rack_sizes": [5, 3], "nic": "1gbit", "uplink": "1gbit", "flows": [("rack", 0)],
                            "nics": {4: "250mbit"}},
    # The same racks with both bottlenecks rate limits (``uplinks``: rack -> rate): nothing in
    # it changes with time, so repeated jobs must agree; the simulator's rates and per-rank
    # clocks are checked on two bottlenecks at once, without another job's TCP streams.
    "slow-uplink+slow-nic": {"rack_sizes": [5, 3], "nic": "1gbit", "uplink": "1gbit", "flows": [],
                             "nics": {4: "250mbit"}, "uplinks": {0: "500mbit"}},
}


def scenario_contention(spec: dict) -> tuple[list[int], list[int]]:
    """``(racks whose uplink, ranks whose NIC)`` a scenario's background flows contend: its
    ground truth, what a probe or the online regrouping should flag and nothing else.
    ``rack:I`` crosses rack I's uplink, ``rank:I`` worker I's NIC and its rack's uplink,
    ``nic:I`` worker I's NIC only; ``cpu:I`` is no traffic. A rate-limited NIC (``nics``)
    or uplink (``uplinks``) is a slow one too."""
    edges = list(itertools.accumulate(spec["rack_sizes"]))
    flows = spec["flows"]
    uplinks = {i for kind, i in flows if kind == "rack"} | \
        {bisect.bisect_right(edges, i) for kind, i in flows if kind == "rank"} | \
        set(spec.get("uplinks", {}))  # the worker's rack; a rate-limited uplink
    return sorted(uplinks), sorted({i for kind, i in flows if kind in ("rank", "nic")} | set(spec.get("nics", {})))


# -- plumbing --------------------------------------------------------------------------------
def run_command(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise EmulationError(f"`{' '.join(argv)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def netns_ip(ns: str, *args: str) -> None:
    run_command("ip", "-n", ns, *args)


# -- names and the state file ----------------------------------------------------------------
NAME_PATTERN = re.compile(r"[a-z][a-z0-9]{0,11}")


def check_name(name: str) -> str:
    """``name`` if it is a safe cluster name, else ``ValueError`` saying what a name may be."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ValueError(f"cluster name {name!r} must be 1-12 lowercase letters and digits, starting with a "
                         "letter (it names network namespaces, cgroups and a state file)")
    return name


def _state_dir() -> Path:
    return Path(os.environ.get("DSSYNC_STATE_DIR", "/run/dssync"))


def state_path(name: str) -> Path:
    return _state_dir() / f"{check_name(name)}.json"


def save_state(cluster: Cluster) -> None:
    path = state_path(cluster.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(cluster), indent=1))
    os.replace(tmp, path)


def load_state(name: str = DEFAULT_NAME) -> Cluster:
    path = state_path(name)
    if not path.exists():
        raise EmulationError(f"no emulated cluster {name!r} is up; start one with `dssync emulate up`")
    try:
        data = json.loads(path.read_text())
        if data.get("name") != name:  # the name goes into namespace and cgroup paths
            raise ValueError(f"it names the cluster {data.get('name')!r}")
        data["nic_override"] = {int(k): v for k, v in data.get("nic_override", {}).items()}
        data["uplink_override"] = {int(k): v for k, v in data.get("uplink_override", {}).items()}
        data["cpu_limit"] = {int(k): v for k, v in data.get("cpu_limit", {}).items()}
        for flow in data.get("flows", []):
            if not all(isinstance(p, int) and not isinstance(p, bool) and p > 1 for p in flow.get("pids", [])):
                raise ValueError(f"flow {flow.get('kind')}:{flow.get('index')} has pids {flow.get('pids')!r}")
        return Cluster(**data)
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise EmulationError(f"the state file {path} of cluster {name!r} is damaged ({exc}); "
                             f"`dssync emulate down --name {name}` removes the cluster") from None


def existing_namespaces(name: str) -> list[str]:
    """The namespaces present that have the shape of cluster ``name``'s own."""
    shape = re.compile(re.escape(check_name(name)) + r"-(fab|sink|w\d+|bg\d+)")
    out = run_command("ip", "netns", "list", check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if shape.fullmatch(n)]


def leftovers(name: str = DEFAULT_NAME) -> list[str]:
    """Namespaces of cluster ``name`` still present (empty after ``down``)."""
    return existing_namespaces(name)
