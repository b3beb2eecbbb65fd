"""Contention on the emulated cluster: lowered rates, background ``iperf3`` flows, busy
loops on workers' hosts (other work on their CPU) and CPU caps of workers (compute
stragglers), set by ``contend`` and kept in the cluster's state."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .shaping import shape_nic, shape_uplink
from .state import (
    DEFAULT_NAME,
    FLOW_STREAMS,
    IPERF_BASE_PORT,
    Cluster,
    EmulationError,
    check_name,
    format_rate,
    load_state,
    parse_rate,
    save_state,
)

#: In the command line of every busy loop ``cpu:I`` starts, so that ending it ends nothing else.
BUSY_LOOP_MARK = "dssync emulate busy loop"


# -- CPU limits (compute stragglers) ---------------------------------------------------------
CGROUP_ROOT = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000


def cpu_cgroup(name: str, rank: int) -> Path:
    """The cgroup that holds worker ``rank``'s processes: under the unified hierarchy
    (cgroup v2, ``cpu.max``) or the v1 ``cpu`` controller (``cpu.cfs_quota_us``)."""
    base = CGROUP_ROOT if (CGROUP_ROOT / "cgroup.controllers").exists() else CGROUP_ROOT / "cpu"
    return base / f"dssync-{name}-w{rank}"


def _limit_cpu(c: Cluster, rank: int, cores: float | None) -> None:
    """Cap worker ``rank``'s processes at ``cores`` cores (``None``: remove the cap)."""
    group = cpu_cgroup(c.name, rank)
    if cores is None:
        with contextlib.suppress(OSError):
            group.rmdir()
        return
    if not cores > 0:
        raise ValueError(f"a CPU limit is a positive number of cores, got {cores}")
    set_cpu_quota(c, rank, cores)


def set_cpu_quota(c: Cluster, rank: int, cores: float | None) -> None:
    """Make worker ``rank``'s cgroup if it is missing and cap it at ``cores`` cores (``None``:
    the cgroup stays, uncapped, so that processes in it keep their place)."""
    group = cpu_cgroup(c.name, rank)
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


def sweep_cpu_cgroups(name: str) -> None:
    """Remove the cluster's CPU cgroups (their processes are gone by now)."""
    shape = re.compile(re.escape(check_name(name)) + r"-w\d+")
    for group in cpu_cgroup(name, 0).parent.glob(f"dssync-{name}-w*"):
        if shape.fullmatch(group.name.removeprefix("dssync-")):
            with contextlib.suppress(OSError):
                group.rmdir()


# -- contention ------------------------------------------------------------------------------
def contend(*, name: str = DEFAULT_NAME, rack: int | None = None, uplink: str | None = None,
            rank: int | None = None, nic: str | None = None,
            flows: Sequence[tuple[str, int]] = (), streams: int = FLOW_STREAMS,
            cpu: dict[int, float] | None = None, clear: bool = False) -> Cluster:
    """Lower an uplink or NIC rate, start background flows of ``streams`` TCP streams each
    (a ``cpu`` flow is a busy loop on the worker's host instead: no streams),
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
            shape_uplink(c, r)
        for i in range(c.world_size):
            shape_nic(c, i)
    if uplink is not None:
        if rack is None or not 0 <= rack < len(c.rack_sizes):
            raise ValueError(f"--uplink needs --rack in 0..{len(c.rack_sizes) - 1}, got {rack}")
        c.uplink_override[rack] = parse_rate(uplink)
        shape_uplink(c, rack)
    if nic is not None:
        if rank is None or not 0 <= rank < c.world_size:
            raise ValueError(f"--nic needs --rank in 0..{c.world_size - 1}, got {rank}")
        c.nic_override[rank] = parse_rate(nic)
        shape_nic(c, rank)
    for i, cores in (cpu or {}).items():
        if not 0 <= i < c.world_size:
            raise ValueError(f"CPU limit for rank {i}: ranks are 0..{c.world_size - 1}")
        _limit_cpu(c, i, cores)
        c.cpu_limit[i] = cores
        save_state(c)  # at once, so that `down` finds the cgroup even if a later step fails
    for kind, index in flows:
        c.flows.append(_start_flow(c, kind, index, streams))
    save_state(c)
    return c


def parse_cpu_limit(text: str) -> tuple[int, float]:
    """``4:0.25``: worker 4's processes may use a quarter of one core."""
    m = re.fullmatch(r"(\d+):(\d*\.?\d+)", text.strip())
    if not m or not float(m.group(2)) > 0:
        raise ValueError(f"cannot read CPU limit {text!r}; write RANK:CORES with CORES > 0, e.g. 4:0.25")
    return int(m.group(1)), float(m.group(2))


def parse_flow(text: str) -> tuple[str, int]:
    """``rack:0`` (across rack 0's uplink), ``rank:4`` (through worker 4's NIC and its rack's
    uplink), ``nic:4`` (through worker 4's NIC only, to a host in its own rack) or ``cpu:4``
    (no traffic: a busy loop on worker 4's host, other work on its CPU)."""
    m = re.fullmatch(r"(rack|rank|nic|cpu):(\d+)", text.strip())
    if not m:
        raise ValueError(f"cannot read flow {text!r}; write rack:I (across rack I's uplink), "
                         "rank:I (through worker I's NIC and its rack's uplink), nic:I (through "
                         "worker I's NIC only) or cpu:I (a busy loop on worker I's host)")
    return m.group(1), int(m.group(2))


def busy_loop_argv(c: Cluster, rank: int) -> list[str]:
    """The command of a ``cpu:rank`` flow: one process spinning in worker ``rank``'s
    namespace, as other work on a real host's CPU would (on the emulated cluster every
    worker shares the machine's cores, so it competes with all of them). It is not in the
    worker's CPU cgroup: a ``--cpu`` cap is the worker's own share, not its host's."""
    return ["ip", "netns", "exec", c.worker_ns(rank), sys.executable, "-c",
            f"while True: pass  # {BUSY_LOOP_MARK} {c.name} {rank}"]


def _start_busy_loop(c: Cluster, rank: int) -> dict:
    proc = subprocess.Popen(busy_loop_argv(c, rank), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    time.sleep(0.2)
    if proc.poll() is not None:
        raise EmulationError(f"busy loop cpu:{rank} did not start: {proc.stderr.read().decode().strip()}")
    return {"kind": "cpu", "index": rank, "streams": 0, "port": None, "pids": [proc.pid]}


def _start_flow(c: Cluster, kind: str, index: int, streams: int) -> dict:
    if kind == "rack" and not 0 <= index < len(c.rack_sizes):
        raise ValueError(f"flow rack:{index}: racks are 0..{len(c.rack_sizes) - 1}")
    if kind in ("rank", "nic", "cpu") and not 0 <= index < c.world_size:
        raise ValueError(f"flow {kind}:{index}: ranks are 0..{c.world_size - 1}")
    if kind == "cpu":
        return _start_busy_loop(c, index)
    if shutil.which("iperf3") is None:
        raise EmulationError("background flows need iperf3; install it (apt-get install iperf3)")
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


def contend_scenario(spec: dict, *, name: str = DEFAULT_NAME, rate_scale: float = 1.0) -> None:
    """Put a scenario's contention (``SCENARIOS``) on cluster ``name``: its rate-limited NICs
    and uplinks (``nics``, ``uplinks``, times ``rate_scale`` as the cluster's own rates are), then
    its background flows. A scenario that contends nothing changes nothing."""
    for rank, rate in sorted(spec.get("nics", {}).items()):
        contend(name=name, rank=int(rank), nic=format_rate(round(parse_rate(rate) * rate_scale)))
    for rack, rate in sorted(spec.get("uplinks", {}).items()):
        contend(name=name, rack=int(rack), uplink=format_rate(round(parse_rate(rate) * rate_scale)))
    if spec["flows"]:
        contend(name=name, flows=spec["flows"])


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
    """End a background flow's process groups: only those led by an iperf3 that this package
    started, or by a busy loop whose command line carries ``BUSY_LOOP_MARK`` (the state
    file's pids are checked, so a stale or edited one ends nothing else)."""
    for pid in flow.get("pids", []):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            argv0 = cmdline.split(b"\0")[0]
            ours = (BUSY_LOOP_MARK.encode() in cmdline if flow.get("kind") == "cpu"
                    else os.path.basename(argv0) in (b"iperf3", b"ip"))
            if ours and os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
        except (OSError, ProcessLookupError, PermissionError):
            pass
