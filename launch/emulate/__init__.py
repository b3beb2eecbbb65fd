"""An emulated multi-rack cluster on one Linux machine, with real network namespaces and ``tc``,
to run and measure jobs under controlled contention (the layout is in ``state``)."""

from __future__ import annotations

# The concerns, one submodule each (state at the bottom; shaping and contention on it;
# episodes, build and jobs on those), and every name of the single module they were
# split from that callers and tests use: its __all__, its public constants, and
# ``attach_worker``, ``cpu_cgroup`` and ``Episodes``. A monkeypatch must go to the submodule
# that looks the name up (``emulate.build.attach_worker``), not to this package.
from . import build as build
from . import contention as contention
from . import episodes as episodes
from . import jobs as jobs
from . import shaping as shaping
from . import state as state
from .build import attach_worker as attach_worker
from .build import cluster, down, up
from .contention import CGROUP_ROOT as CGROUP_ROOT
from .contention import CPU_PERIOD_US as CPU_PERIOD_US
from .contention import contend, contend_scenario, dead_flows, parse_cpu_limit, parse_flow
from .contention import cpu_cgroup as cpu_cgroup
from .episodes import MAX_EPISODE_S as MAX_EPISODE_S
from .episodes import Episode, check_episodes, parse_episode
from .episodes import Episodes as Episodes
from .jobs import FAILED_GRACE_S as FAILED_GRACE_S
from .jobs import run, run_dssync
from .shaping import check_netem, check_support
from .state import DEFAULT_NAME as DEFAULT_NAME
from .state import FLOW_STREAMS as FLOW_STREAMS
from .state import GSO_MAX_BYTES as GSO_MAX_BYTES
from .state import IPERF_BASE_PORT as IPERF_BASE_PORT
from .state import MASTER_PORT as MASTER_PORT
from .state import NAME_PATTERN as NAME_PATTERN
from .state import QUEUE_MS as QUEUE_MS
from .state import RTO_MIN_MS as RTO_MIN_MS
from .state import (
    SCENARIOS,
    Cluster,
    EmulationError,
    format_rate,
    leftovers,
    load_state,
    parse_rate,
    scenario_contention,
)
from .state import SUBNET as SUBNET
from .state import check_name as check_name

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
    "contend_scenario",
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
    "scenario_contention",
    "up",
]
